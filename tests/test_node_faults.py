"""A node is removed mid-epoch (issue 8, faults 1 and 2): an ingest node running readers, the
ingest node of the coordinator, the trainer node. The three faults run one after the other
on one multi-node ``ray.cluster_utils.Cluster`` in one process (see node_faults_run.py),
started once for the module by :func:`shared_run` (one cluster instead of three: minutes
less); each test checks its own fault's findings. Each ends with the per-id count of the
final checkpoint: every row exactly once per epoch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.own_process import minimal_env

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 1500
"""The shared run's limit: three faults, each 1-2 minutes on a busy 2-core machine."""
FAULT_OF = {
    "test_an_ingest_node_removed_moves_the_pool": "reader",
    "test_the_coordinators_node_removed": "coordinator",
    "test_the_trainer_node_removed": "trainer",
}
"""Which fault each test checks; the shared run runs only those of the selected tests."""
FAULTS = list(FAULT_OF.values())
"""Every fault, in the order the shared run runs them (node_faults_run.FAULTS)."""
STDERR_MARK = "=== fault {} ==="
"""The line node_faults_run writes to stderr as each fault starts (it imports this one; this
module does not import it: its imports, Ray's cluster tools and torch, take seconds)."""
Found = dict[str, Any]
"""What the shared run found for one fault (node_faults_run.run_fault)."""

# The module's first test waits for the shared run in its setup.
pytestmark = [pytest.mark.system, pytest.mark.timeout(RUN_TIMEOUT_S + 120)]


@pytest.fixture(scope="module")
def shared_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Found]:
    """Run the selected tests' faults on one cluster; what each fault found, by fault.

    A fault whose run raised is ``{"which": ..., "failed": <traceback>}``; a fault that the
    run did not reach (it died or timed out) is ``{"which": ..., "missing": <why>}``.
    """
    names = {getattr(item, "originalname", item.name) for item in request.session.items}
    faults = [f for f in FAULTS if f in {FAULT_OF[n] for n in names & FAULT_OF.keys()}]
    work = tmp_path_factory.mktemp("node-faults")
    stdout, stderr = work / "stdout.txt", work / "stderr.txt"
    with stdout.open("w") as out, stderr.open("w") as err:
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "tests" / "node_faults_run.py"),
                    str(work),
                    ",".join(faults),
                ],
                stdout=out,
                stderr=err,
                timeout=RUN_TIMEOUT_S,
                cwd=ROOT,
                env=minimal_env(),
                check=False,
            )
            ended = f"the shared run exited with status {done.returncode}"
        except subprocess.TimeoutExpired:
            ended = f"the shared run was killed after {RUN_TIMEOUT_S} s"
    return collect(work, faults, ended)


def collect(work: Path, faults: list[str], ended: str) -> dict[str, Found]:
    """What the shared run in ``work`` found for each of ``faults``, by fault.

    Args:
        work: The run's folder: ``results/<fault>.json`` and ``stderr.txt``.
        faults: The faults it was asked to run.
        ended: How the run ended, for the faults it wrote no result for.

    Returns:
        Each fault's result (``missing``: why there is none), with ``stderr_tail``: its own
        part of the shared stderr (:data:`STDERR_MARK`), or the whole stderr's tail
        when the fault did not start.
    """
    log = (work / "stderr.txt").read_text(errors="replace")
    found: dict[str, Found] = {}
    for fault in faults:
        path = work / "results" / f"{fault}.json"
        if path.exists():
            found[fault] = json.loads(path.read_text())
        else:
            found[fault] = {"which": fault, "missing": f"{ended} before this fault ended"}
        _, mark, own = log.partition(STDERR_MARK.format(fault))
        later = [own.find(STDERR_MARK.format(f)) for f in faults]
        own = own[: min([i for i in later if i >= 0], default=len(own))]
        found[fault]["stderr_tail"] = (own if mark else log)[-4000:]
    return found


def run(shared_run: dict[str, Found], which: str) -> Found:
    """The findings of fault ``which`` after the checks every fault shares."""
    found = shared_run[which]
    assert "missing" not in found, (found["missing"], found["stderr_tail"])
    assert "failed" not in found, (found["failed"], found["stderr_tail"])
    assert found["removed"], "the node was removed mid-epoch"
    assert found["counts"] == [found["epochs"]] * len(found["counts"]), "every row once per epoch"
    assert found["final_epoch"] == found["epochs"]
    print(f"{which} node removed: first batch {found['recover_s']:.1f} s after")
    return found


def starts(found: Found) -> list[dict[str, Any]]:
    return [e for e in found["events"] if e["kind"] == "start"]


def test_an_ingest_node_removed_moves_the_pool(shared_run: dict[str, Found]) -> None:
    found = run(shared_run, "reader")
    gone = found["removed"]["node"]
    assert gone in found["reader_nodes"] and gone != found["coordinator_node"]
    assert gone not in found["reader_nodes_after"], "the readers moved"
    assert set(found["reader_nodes_after"]) <= set(found["ingest_nodes"])
    # The worker group went on: no error, each rank started once.
    errors = [e for e in found["events"] if e["kind"] == "error"]
    assert not errors, (errors, found["stderr_tail"])
    assert len(starts(found)) == 2, (starts(found), found["stderr_tail"])


def test_the_coordinators_node_removed(shared_run: dict[str, Found]) -> None:
    found = run(shared_run, "coordinator")
    assert found["removed"]["node"] == found["coordinator_node"]
    assert found["coordinator_node_after"] in set(found["ingest_nodes"]) - {
        found["coordinator_node"]
    }
    errors = [e for e in found["events"] if e["kind"] == "error"]
    assert errors and {e["type"] for e in errors} <= {"CoordinatorLostError"}, errors
    restored = [e for e in starts(found) if e["restored"]]
    assert len(restored) == 2, "Ray Train restarted the group from the checkpoint"


def test_the_trainer_node_removed(shared_run: dict[str, Found]) -> None:
    found = run(shared_run, "trainer")
    gone = found["removed"]["node"]
    assert gone in found["trainer_nodes"]
    later = [e for e in starts(found) if e["t"] > found["removed"]["t"]]
    assert len(later) == 2 and all(e["node"] != gone for e in later), later
    assert all(e["restored"] for e in later)


def test_a_fault_that_failed_or_was_not_reached_fails_only_its_own_test(tmp_path: Path) -> None:
    """The shared run's findings: each fault's own result, traceback or reason, and its own
    part of the shared stderr (no cluster: the files the run writes, written here)."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "reader.json").write_text(
        json.dumps({"which": "reader", "failed": "Traceback ...\nRuntimeError: boom"})
    )
    (tmp_path / "results" / "coordinator.json").write_text(json.dumps({"which": "coordinator"}))
    (tmp_path / "stderr.txt").write_text(
        "cluster up\n"
        + "".join(f"{STDERR_MARK.format(f)}\n{f} says hello\n" for f in FAULTS[:2])
        + "killed\n"
    )
    found = collect(tmp_path, list(FAULTS), "the shared run exited with status -9")
    with pytest.raises(AssertionError, match="RuntimeError: boom"):
        run(found, "reader")
    with pytest.raises(AssertionError, match="exited with status -9 before this fault ended"):
        run(found, "trainer")
    assert found["reader"]["stderr_tail"] == "\nreader says hello\n"
    assert found["coordinator"]["stderr_tail"] == "\ncoordinator says hello\nkilled\n"
    assert "cluster up" in found["trainer"]["stderr_tail"], "not started: the whole tail"
