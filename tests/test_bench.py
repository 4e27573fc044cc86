"""`ingest bench`: a tiny run of the harness with the cheap contenders, end to end."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from ray import cloudpickle

from ingest.tools.bench import main
from ingest.tools.bench.contenders import CONTENDERS, Entry
from ingest.tools.bench.quality import batch_entropy, uniform_entropy
from ingest.tools.bench.report import FIGURES

SHARDS, ROWS = 4, 2048


@pytest.mark.usefixtures("ray_session")
def test_smoke_run_reports_every_figure(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(
        CONTENDERS,
        "absent",
        Entry(
            name="absent",
            title="absent peer",
            target="ingest_bench_absent:Peer",
            modules=("ingest_bench_absent_module",),
            install="pip install ingest-bench-absent",
        ),
    )
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    argv = [
        *("--contenders", "stream,torch,absent", "--shards", str(SHARDS)),
        *("--rows", str(ROWS), "--row-group", "512", "--batch-size", "256"),
        *("--ranks", "2", "--workers", "1", "--epochs", "2", "--labels", "2"),
        *("--json", str(out), "--plot", str(plot), "--no-progress"),
    ]
    assert main(argv) == 0

    doc = json.loads(out.read_text())
    by_name = {c["name"]: c for c in doc["contenders"]}
    assert [c["name"] for c in doc["contenders"]] == ["stream", "torch", "absent"]
    for name in ("stream", "torch"):
        report = by_name[name]
        assert report["status"] == "ok", report["reason"]
        assert set(report["figures"]) == {f.key for f in FIGURES}
        for key, value in report["figures"].items():
            if value is None:
                assert report["notes"][key], f"{name}: {key} is n/a without a reason"
        assert report["figures"]["rows_delivered"] == SHARDS * ROWS
        assert [e["rows"] for e in report["epochs"]] == [SHARDS * ROWS] * 2
        assert report["figures"]["exactly_once"] is True
        assert report["figures"]["epoch1_requests"] > 0
        assert 0 < report["figures"]["shuffle_quality"] <= 1.05
        figures = report["figures"]
        assert 0 <= figures["loader_cpu_s_per_mrows"] < figures["rank_cpu_s_per_mrows"]
    assert by_name["stream"]["ranks"] == 1
    assert by_name["torch"]["ranks"] == 2
    assert by_name["stream"]["figures"]["resume_first_batch_s"] > 0
    # Resumed at 45% and run to the epoch's end: the rest of the rows, each once.
    assert by_name["stream"]["figures"]["resume_exactly_once"] is True
    assert by_name["torch"]["figures"]["resume_exactly_once"] is None
    # Both read the Parquet shards as they are: nothing to convert.
    for name in ("stream", "torch"):
        assert by_name[name]["figures"]["convert_s"] == 0
    assert by_name["torch"]["figures"]["resume_first_batch_s"] is None
    assert "no position" in by_name["torch"]["notes"]["resume_first_batch_s"]
    assert by_name["absent"]["status"] == "skipped"
    assert "pip install ingest-bench-absent" in by_name["absent"]["reason"]

    printed = capsys.readouterr().out
    assert "ingest.Stream (1 process)" in printed and "torch DataLoader + fsspec" in printed
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Hanging:
    """A contender whose ranks' loaders never hand out a batch (a peer's worker deadlocked)."""

    ranks, resume_unsupported = 1, "it hangs"

    def __init__(self, config: object) -> None:
        pass

    def start(self, data: object) -> list[_HangingSource]:
        return [_HangingSource()]

    resume = start

    def stop(self) -> None:
        pass


class _HangingSource:
    def open(self) -> _HangingSource:
        return self

    def epoch(self) -> Iterator[dict[str, object]]:
        time.sleep(3600)
        yield {}

    def close(self) -> None:
        pass


@pytest.mark.usefixtures("ray_session")
def test_a_contender_that_hangs_fails_after_the_timeout_and_the_bench_goes_on(
    tmp_path, capsys, monkeypatch
):
    """Every wait on the rank processes has a bound (--timeout-s): a loader that never
    hands out a batch fails its contender, naming the phase and the bound, and the next
    contender runs; the bench waited on the epoch for ever before."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks import no tests
    monkeypatch.setitem(
        CONTENDERS,
        "hangs",
        Entry(name="hangs", title="hangs", target=f"{__name__}:_Hanging", modules=()),
    )
    out = tmp_path / "bench.json"
    argv = [
        *("--contenders", "hangs,stream", "--shards", "2", "--rows", "512"),
        *("--row-group", "256", "--batch-size", "128", "--epochs", "1", "--labels", "2"),
        # The bound holds for stream's phases too: its rank processes' start (torch
        # imported) takes seconds on a busy machine.
        *("--timeout-s", "20", "--json", str(out), "--no-progress"),
    ]
    start = time.monotonic()
    assert main(argv) == 1  # one contender failed
    assert time.monotonic() - start < 180
    by_name = {c["name"]: c for c in json.loads(out.read_text())["contenders"]}
    assert by_name["hangs"]["status"] == "failed"
    assert "epoch 1" in by_name["hangs"]["reason"] and "20 s" in by_name["hangs"]["reason"]
    assert "--timeout-s" in by_name["hangs"]["reason"], by_name["hangs"]["reason"]
    assert by_name["stream"]["status"] == "ok", by_name["stream"]["reason"]


class _HangsOnResume:
    """A contender whose epochs run but whose resumed loader never hands out a batch."""

    ranks, resume_unsupported = 1, None

    def __init__(self, config: object) -> None:
        pass

    def start(self, data: Any) -> list[_ListSource]:
        return [_ListSource(data.rows, data.labels or 1)]

    def resume(self, data: object, states: object) -> list[_HangingSource]:
        return [_HangingSource()]

    def stop(self) -> None:
        pass


class _ListSource:
    """Every id once, in order, in batches of 128 (labels ``id % labels``)."""

    def __init__(self, rows: int, labels: int) -> None:
        self.rows, self.labels, self.batches = rows, labels, 0

    def open(self) -> _ListSource:
        return self

    def epoch(self) -> Iterator[dict[str, object]]:
        for start in range(0, self.rows, 128):
            ids = torch.arange(start, min(start + 128, self.rows))
            self.batches += 1
            yield {"id": ids, "label": ids % self.labels}

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def close(self) -> None:
        pass


@pytest.mark.usefixtures("ray_session")
def test_a_contender_whose_resume_hangs_keeps_its_other_figures(tmp_path, monkeypatch):
    """A resume that hangs fails the resume alone: the rank processes stuck in it are
    replaced, so the shuffle-quality phase runs on new ones (it queued behind the stuck
    call before, waited a second --timeout-s and failed the contender, its figures lost)."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks import no tests
    monkeypatch.setitem(
        CONTENDERS,
        "hangs-on-resume",
        Entry(
            name="hangs-on-resume",
            title="hangs on resume",
            target=f"{__name__}:_HangsOnResume",
            modules=(),
        ),
    )
    out = tmp_path / "bench.json"
    argv = [
        *("--contenders", "hangs-on-resume", "--shards", "2", "--rows", "512"),
        *("--row-group", "256", "--batch-size", "128", "--epochs", "1", "--labels", "2"),
        *("--timeout-s", "15", "--json", str(out), "--no-progress"),
    ]
    start = time.monotonic()
    assert main(argv) == 0
    assert time.monotonic() - start < 120
    (report,) = json.loads(out.read_text())["contenders"]
    assert report["status"] == "ok", report["reason"]
    figures, notes = report["figures"], report["notes"]
    assert figures["resume_first_batch_s"] is None
    assert "resume at 45%" in notes["resume_first_batch_s"], notes
    assert "15 s" in notes["resume_first_batch_s"], notes
    assert 0 < figures["shuffle_quality"] <= 1.05


class _RestartsOnResume(_HangsOnResume):
    """A contender whose resumed loader ignores its state: the epoch again from its start."""

    def resume(self, data: Any, states: object) -> list[_ListSource]:  # type: ignore[override]
        return [_ListSource(data.rows, data.labels or 1)]


@pytest.mark.usefixtures("ray_session")
def test_a_resume_that_delivers_rows_again_is_reported_with_its_evidence(tmp_path, monkeypatch):
    """The bench's own check of a resume: the ids before the checkpoint and after the resume
    are counted, and a resume that replays rows is reported as not exactly once, with the
    counts and the states loaded (what test_bench_peers leans on for the peers)."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks import no tests
    monkeypatch.setitem(
        CONTENDERS,
        "restarts",
        Entry(
            name="restarts", title="restarts", target=f"{__name__}:_RestartsOnResume", modules=()
        ),
    )
    out = tmp_path / "bench.json"
    argv = [
        *("--contenders", "restarts", "--shards", "2", "--rows", "512"),
        *("--row-group", "256", "--batch-size", "128", "--epochs", "1", "--labels", "2"),
        *("--timeout-s", "60", "--json", str(out), "--no-progress"),
    ]
    assert main(argv) == 0
    (report,) = json.loads(out.read_text())["contenders"]
    assert report["status"] == "ok", report["reason"]
    figures, notes = report["figures"], report["notes"]
    assert figures["exactly_once"] is True  # its epochs are right; its resume is not
    assert figures["resume_exactly_once"] is False, notes
    # 2 shards of 512 rows, 8 batches of 128, the checkpoint after 3 (45%): their 384 ids
    # come again, none is missed.
    assert "384 duplicated, 0 missing ids" in notes["resume_exactly_once"], notes
    assert "{'batches': 3}" in notes["resume_exactly_once"], notes


def test_unknown_contender_lists_the_valid_ones(capsys):
    assert main(["--contenders", "stream,nope", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "unknown contender 'nope'" in err and "raystream" in err


def test_batch_entropy_and_uniform_reference():
    assert batch_entropy(np.array([0, 0, 1, 1]), 2) == pytest.approx(math.log(2))
    assert batch_entropy(np.array([3, 3, 3]), 4) == 0.0
    # 64 shards of 4 labels, batches of 256: a uniform shuffle is close to ln 4.
    value = uniform_entropy([s % 4 for s in range(64)], 1024, 256)
    assert math.log(4) * 0.98 < value < math.log(4)
