"""``benchmarks/derived_cache.py`` at a tiny size runs end to end and reports what it promises.

The benchmark measures issue 34's goals for the derived cache; its timing goals are its own to
print (at this size fixed costs rule, so they are not checked here). What does not depend on
timing is: every epoch of every stream exactly once, token by token; epoch 1 tokenizes every
document and writes the copies, epoch 2 and the second job read them and tokenize nothing;
the cache's objects are listed; the closing table names every goal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "derived_cache.py"
DOCS = 100
GOALS = {
    "epoch 2 / epoch 1 tokens/s",
    "epoch 2 / pre-tokenized Parquet",
    "second job's tokenizer CPU s",
    "cache bytes a token",
    "every epoch exactly once",
}


@pytest.mark.timeout(120)
def test_a_tiny_run_reports_every_goal_and_reads_the_copies(tmp_path: Path) -> None:
    out = tmp_path / "derived.json"
    argv = ["--docs", str(DOCS), "--batch", "50", "--repeat", "1", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["goals"]) == GOALS
    assert all(got == "ok" for got in doc["exactly_once"].values()), doc["exactly_once"]
    assert len(doc["exactly_once"]) == 6  # five streams' epochs in the round, the second job
    assert doc["goals"]["every epoch exactly once"]["met"] is True

    (epochs,) = doc["rounds"]
    first, second = epochs["derived epoch 1"], epochs["derived epoch 2"]
    assert first["tokenized_docs"] == DOCS
    assert first["derived"]["derived_writes"] == doc["cache"]["copies"] > 0
    assert second["tokenized_docs"] == second["tokenizer_calls"] == 0
    assert second["derived"]["derived_hits"] == doc["cache"]["copies"]
    assert epochs["no cache"]["tokenized_docs"] == DOCS
    for figures in epochs.values():
        assert figures["tokens"] == doc["tokens"]
        assert figures["wall_s"] > 0 and figures["cpu_s"] > 0

    job = doc["second_job"]
    assert (job["tokenizer_calls"], job["tokenized_docs"], job["tokenizer_cpu_s"]) == (0, 0, 0.0)
    assert doc["goals"]["second job's tokenizer CPU s"]["met"] is True
    assert 0 < doc["cache"]["bytes"] < doc["cache"]["text_bytes"]
    assert "goals (issue 34)" in done.stdout


def test_the_exactness_check_finds_a_changed_a_lost_and_a_repeated_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check the goals table reports: a right epoch passes; a token changed, a piece
    lost and a piece handed out twice are each named."""
    import torch

    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from derived_cache import exactly_once

    docs = [[np.array([5, 6, 7]), np.array([8, 9])], [np.array([1, 2, 3, 4])]]

    def batch(ids: list[list[int]], pieces: list[tuple[int, ...]]) -> tuple[Any, Any]:
        return torch.tensor(ids), torch.tensor(pieces)

    # Two sequences of 4: [5 6 7 | 8] and [9 | 1 2 3], then [4 pad pad pad].
    right = [
        batch([[5, 6, 7, 8], [9, 1, 2, 3]],
              [(0, 0, 0, 0, 3), (0, 0, 1, 0, 1), (1, 0, 1, 1, 2), (1, 1, 0, 0, 3)]),
        batch([[4, 0, 0, 0]], [(0, 1, 0, 3, 4)]),
    ]  # fmt: skip
    assert exactly_once(right, docs) == "ok"
    changed = [batch([[5, 6, 0, 8], [9, 1, 2, 3]], right[0][1].tolist()), right[1]]
    assert "shard 0 row 0 tokens [0, 3) differ" in exactly_once(changed, docs)
    assert "shard 1 row 0 (4 tokens) was handed out as [(0, 3)]" in exactly_once(right[:1], docs)
    assert "as [(0, 3), (3, 4), (3, 4)]" in exactly_once([*right, right[1]], docs)
