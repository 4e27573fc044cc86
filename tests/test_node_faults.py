"""A node is removed mid-epoch (issue 8, faults 1 and 2), each in its own multi-node
``ray.cluster_utils.Cluster`` (see node_faults_run.py): an ingest node running readers, the
ingest node of the coordinator, the trainer node. Each ends with the per-id count of the
final checkpoint: every row exactly once per epoch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.system


def run(tmp_path: Path, which: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "node_faults_run.py"), str(tmp_path), which],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-5000:]
    # The Ray processes of the cluster may print after the result line.
    line = next(x for x in out.stdout.splitlines() if x.startswith('{"which"'))
    found: dict = json.loads(line)  # type: ignore[type-arg]
    found["stderr_tail"] = out.stderr[-4000:]  # for the messages of failed checks
    assert found["removed"], "the node was removed mid-epoch"
    assert found["counts"] == [found["epochs"]] * len(found["counts"]), "every row once per epoch"
    assert found["final_epoch"] == found["epochs"]
    print(f"{which} node removed: first batch {found['recover_s']:.1f} s after")
    return found


def starts(found: dict) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in found["events"] if e["kind"] == "start"]


def test_an_ingest_node_removed_moves_the_pool(tmp_path: Path) -> None:
    found = run(tmp_path, "reader")
    gone = found["removed"]["node"]
    assert gone in found["reader_nodes"] and gone != found["coordinator_node"]
    assert gone not in found["reader_nodes_after"], "the readers moved"
    assert set(found["reader_nodes_after"]) <= set(found["ingest_nodes"])
    # The worker group went on: no error, each rank started once.
    errors = [e for e in found["events"] if e["kind"] == "error"]
    assert not errors, (errors, found["stderr_tail"])
    assert len(starts(found)) == 2, (starts(found), found["stderr_tail"])


def test_the_coordinators_node_removed(tmp_path: Path) -> None:
    found = run(tmp_path, "coordinator")
    assert found["removed"]["node"] == found["coordinator_node"]
    assert found["coordinator_node_after"] in set(found["ingest_nodes"]) - {
        found["coordinator_node"]
    }
    errors = [e for e in found["events"] if e["kind"] == "error"]
    assert errors and {e["type"] for e in errors} <= {"CoordinatorLostError"}, errors
    restored = [e for e in starts(found) if e["restored"]]
    assert len(restored) == 2, "Ray Train restarted the group from the checkpoint"


def test_the_trainer_node_removed(tmp_path: Path) -> None:
    found = run(tmp_path, "trainer")
    gone = found["removed"]["node"]
    assert gone in found["trainer_nodes"]
    later = [e for e in starts(found) if e["t"] > found["removed"]["t"]]
    assert len(later) == 2 and all(e["node"] != gone for e in later), later
    assert all(e["restored"] for e in later)
