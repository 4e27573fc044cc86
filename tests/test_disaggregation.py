"""The reader pool runs only on the ingest nodes, trainers only on the trainer node.

A 4-node ``ray.cluster_utils.Cluster`` on this machine (a head, two ingest CPU nodes, a
trainer node), in its own process (the session's local Ray is a different cluster): 4 ranks,
every row once, no read or decode on the trainer node, the pool's ready batches within its
object-store budget, nothing spilled.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.own_process import minimal_env

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.system


def test_ingest_and_training_run_on_their_own_nodes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "disaggregation_run.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=minimal_env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    ingest_nodes, trainer_node = set(found["ingest_nodes"]), found["trainer_node"]
    # 4 readers of 1 CPU on two 2-CPU ingest nodes: the pool spans both, never the trainer's.
    assert set(found["reader_nodes"]) == ingest_nodes
    ids = []
    for rank in found["ranks"]:
        assert rank["worker_node"] == trainer_node
        assert set(rank["read_nodes"]) <= ingest_nodes, "no read on the trainer node"
        assert set(rank["decode_nodes"]) <= ingest_nodes, "no decode on the trainer node"
        assert rank["ids"], "every rank got data"
        ids += rank["ids"]
    assert len(ids) == len(set(ids)) == 2400
    assert 0 < found["peak_ready_bytes"] <= found["budget"]
    assert "Spilled" not in found["memory_summary"], found["memory_summary"]
