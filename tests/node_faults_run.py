"""Run by test_node_faults.py in its own process: nodes removed mid-epoch (issue 8, fault 2).

One ``ray.cluster_utils.Cluster`` on this machine (a head, "ingest" CPU nodes and "trainer"
nodes) for every fault named in ``sys.argv[2]`` (comma-separated, in this order: ``reader``,
``coordinator``, ``trainer``), run one after the other. Before each fault, nodes are added
until it has two of the kind that loses one (one to move to) and one of the other, as when
each fault had a cluster of its own: each node costs seconds to start on a small machine, and
so did each cluster. Each fault has its own dataset, ``RayStream`` (coordinator and readers),
``TorchTrainer`` run and events. A TorchTrainer with 2 workers and ``FailureConfig`` counts
every row id it receives (summed across ranks like DDP gradients) and saves the counts with
the stream state in every checkpoint. When rank 0 reaches step ``KILL_STEP`` of epoch 0, the
driver removes one node:

- ``reader``: an ingest node with a reader actor but not the coordinator. The readers move
  to the remaining ingest node and each rank resumes after its last acked batch; the worker
  group is not restarted.
- ``coordinator``: the ingest node of the coordinator. Ray restarts it on the other ingest
  node; the ranks fail with CoordinatorLostError and Ray Train restarts the group from the
  latest checkpoint.
- ``trainer``: the trainer node of the workers. Ray Train restarts the group on the spare.

Writes ``<work>/results/<fault>.json`` when a fault ends: the nodes alive at its start, the
node removed, the final counts per id, the events the ranks wrote and the seconds from the
removal to the first batch after it; or ``{"which": ..., "failed": <traceback>}`` when its
run raised, and the next fault still runs. Each fault's output on stderr starts with a line
``=== fault <name> ===``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import ray
from ray.cluster_utils import Cluster

import ingest
from ingest.testing import write_dataset
from tests.test_node_faults import STDERR_MARK
from tests.train_jobs import harness

SHARDS, ROWS, BATCH, EPOCHS, RANKS = 8, 300, 50, 2, 2
TOTAL = SHARDS * ROWS  # 24 steps of 2 x 50 rows per epoch
KILL_STEP = 7
CHECKPOINT_EVERY = 3
FAULTS = ("reader", "coordinator", "trainer")
"""The faults, in the order they run on the shared cluster."""
NEEDS = {"reader": (2, 1), "coordinator": (2, 1), "trainer": (1, 2)}
"""Ingest and trainer nodes each fault needs alive when it starts."""


def loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    events = Path(config["events"])
    it, checkpoint = ingest.train.rank_iterator(config["stream"])
    counts = torch.zeros(TOTAL, dtype=torch.int64)
    if checkpoint:
        with checkpoint.as_directory() as directory:
            counts = torch.load(os.path.join(directory, "counts.pt"))
    context = ray.train.get_context()
    rank = context.get_world_rank()
    node = ray.get_runtime_context().get_node_id()

    def save(directory: str) -> None:
        torch.save(counts, os.path.join(directory, "counts.pt"))

    def note(kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "rank": rank, "node": node, "t": time.time(), **fields})
        with open(events / f"rank{rank}.jsonl", "a") as f:
            f.write(line + "\n")

    note("start", restored=checkpoint is not None)
    try:
        while it.upcoming_epoch() < EPOCHS:
            for batch in it:
                note("batch", epoch=it.upcoming_epoch(), step=it.step)
                delta = torch.zeros(TOTAL, dtype=torch.int64)
                delta.index_add_(0, batch["id"], torch.ones(len(batch["id"]), dtype=torch.int64))
                try:
                    dist.all_reduce(delta)
                except RuntimeError as e:
                    # A peer rank failed first (its own error is noted): torch says so here.
                    note("peer_lost", type=type(e).__name__, message=str(e)[:500])
                    raise PeerLostError from e
                counts += delta
                if it.step % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
                    ingest.train.report(it, {"step": it.step}, save=save)
                time.sleep(0.1)  # a training step: the removal lands mid-epoch
        ingest.train.report(it, {"step": it.step}, save=save)
    except PeerLostError:
        raise
    except Exception as e:
        note("error", type=type(e).__name__, message=str(e)[:500])
        raise


class PeerLostError(RuntimeError):
    """This rank's collective failed because a peer rank failed first."""


def actor_node(handle: Any) -> str:
    """The node the actor's process runs on, as the process itself says.

    Not ray.util.state.get_actor's node_id: in one full-suite run it named another node than
    the coordinator's, so the test removed the coordinator's node while meaning to spare it
    (the worker logs show the coordinator on the removed node, restarted 1 s later).
    """
    return str(
        ray.get(
            handle.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()),
            timeout=60,
        )
    )


def read_events(events: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(events.glob("rank*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(out, key=lambda e: e["t"])


class Nodes:
    """The shared cluster: a head, and the ingest and trainer nodes alive now, by node id.

    Node deaths are noticed within seconds (a health check a second, dead after three).
    """

    def __init__(self) -> None:
        system = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": system}
        )
        self.ingest: dict[str, Any] = {}
        self.trainer: dict[str, Any] = {}

    def provide(self, which: str) -> None:
        """Add nodes until fault ``which`` has the ingest and trainer nodes it needs."""
        ingest_count, trainer_count = NEEDS[which]
        while len(self.ingest) < ingest_count:
            node = self.cluster.add_node(num_cpus=2, resources={harness.INGEST_RESOURCE: 100})
            self.ingest[node.node_id] = node
        while len(self.trainer) < trainer_count:
            node = self.cluster.add_node(num_cpus=2, resources={harness.TRAINER_RESOURCE: 2})
            self.trainer[node.node_id] = node
        # Also waits until the nodes removed so far are seen dead.
        self.cluster.wait_for_nodes(timeout=120)

    def remove(self, node_id: str) -> None:
        """Kill the processes of an ingest or trainer node at once (no graceful shutdown)."""
        node = self.ingest.pop(node_id, None) or self.trainer.pop(node_id)
        self.cluster.remove_node(node, allow_graceful=False)

    def connect(self) -> None:
        """Connect this driver to the cluster."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # RAY_ADDRESS: Ray Train's helper actors call ray.init() and would otherwise join the
        # newest Ray instance on this machine, which may be another test's.
        # RAY_TRAIN_HEALTH_CHECK_INTERVAL_S: how often the Ray Train controller polls its
        # workers (default 2 s). A worker's ray.train.report waits for the poll that takes the
        # previous report, so each checkpoint cost ~1.8 s; the poll also notices failures and
        # the end.
        env = {
            "PYTHONPATH": root,
            "RAY_ADDRESS": self.cluster.address,
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
        }
        ray.init(address=self.cluster.address, runtime_env={"env_vars": env})


def remove_when_due(events: Path, pick: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """Wait for rank batch events at step KILL_STEP of epoch 0, then remove ``pick(event)``."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        due = [
            e
            for e in read_events(events)
            if e["kind"] == "batch" and e["epoch"] == 0 and e["step"] >= KILL_STEP
        ]
        if due:
            removed = pick(due[0])
            return {"node": removed, "t": time.time(), "at_step": due[0]["step"]}
        time.sleep(0.05)
    return {}


def recover_s(log: list[dict[str, Any]], removed: dict[str, Any]) -> float | None:
    """Seconds to the first batch after the removal, or after the group's restart if any."""
    t0 = removed.get("t", 1e18)
    since = max([t0] + [e["t"] for e in log if e["kind"] == "start" and e["t"] > t0])
    after = [e["t"] for e in log if e["kind"] == "batch" and e["t"] > since]
    return (after[0] - t0) if after else None


def run_fault(nodes: Nodes, which: str, work: Path) -> dict[str, Any]:
    """Run one fault on the shared cluster, in ``work``; what its test checks."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    data = str(work / "data")
    events = work / "events"
    events.mkdir(parents=True)
    write_dataset(fsspec.filesystem("file"), data, "parquet", SHARDS, ROWS, row_group_rows=50)
    found: dict[str, Any] = {"which": which, "epochs": EPOCHS}
    found.update(ingest_nodes=sorted(nodes.ingest), trainer_nodes=sorted(nodes.trainer))
    readers = ingest.ReaderPool(
        min_size=2, max_size=2, num_cpus=1, resources={harness.INGEST_RESOURCE: 1}
    )
    with ingest.RayStream(
        data,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=0,
        world_size=RANKS,
        readers=readers,
        timeout_s=120,
    ) as stream:
        found["reader_nodes"] = ray.get([r.node.remote() for r in stream.readers], timeout=120)
        found["coordinator_node"] = actor_node(stream.coordinator)

        def pick(event: dict[str, Any]) -> str:
            if which == "reader":
                node = next(n for n in found["reader_nodes"] if n != found["coordinator_node"])
            elif which == "coordinator":
                node = found["coordinator_node"]
            else:
                node = event["node"]
            nodes.remove(node)
            return str(node)

        removed: dict[str, Any] = {}
        remover = threading.Thread(
            target=lambda: removed.update(remove_when_due(events, pick)), daemon=True
        )
        remover.start()
        result = TorchTrainer(
            loop,
            train_loop_config={"stream": stream, "events": str(events)},
            scaling_config=ScalingConfig(
                num_workers=RANKS, resources_per_worker={"CPU": 1, harness.TRAINER_RESOURCE: 1}
            ),
            run_config=RunConfig(
                name=f"node-{which}",
                storage_path=str(work / "runs"),
                failure_config=FailureConfig(max_failures=3),
            ),
        ).fit()
        remover.join(timeout=10)
        found["reader_nodes_after"] = ray.get(
            [r.node.remote() for r in stream.readers], timeout=120
        )
        found["coordinator_node_after"] = actor_node(stream.coordinator)
    if result.checkpoint is None:
        raise RuntimeError(f"the {which} fault's run finished without a checkpoint")
    import torch

    with result.checkpoint.as_directory() as directory:
        found["counts"] = torch.load(os.path.join(directory, "counts.pt")).tolist()
        state = json.loads(Path(directory, ingest.train.STATE_FILE).read_text())
    found["final_epoch"] = state["progress"]["epoch"]
    found["events"] = log = read_events(events)
    found["removed"] = removed
    found["recover_s"] = recover_s(log, removed)
    return found


def main() -> int:
    work, named = Path(sys.argv[1]), sys.argv[2].split(",")
    if any(f not in FAULTS for f in named):
        raise SystemExit(
            f"faults {sys.argv[2]!r}: name some of {', '.join(FAULTS)}, comma-separated"
        )
    faults = sorted(set(named), key=FAULTS.index)
    results = work / "results"
    results.mkdir(parents=True, exist_ok=True)
    nodes = Nodes()
    try:
        nodes.provide(faults[0])
        nodes.connect()
        for which in faults:
            print(STDERR_MARK.format(which), file=sys.stderr, flush=True)
            try:
                nodes.provide(which)
                found = run_fault(nodes, which, work / which)
            except Exception:
                # Recorded for this fault's test; the next fault still runs.
                found = {"which": which, "failed": traceback.format_exc()}
                print(found["failed"], file=sys.stderr, flush=True)
            (results / f"{which}.json").write_text(json.dumps(found))
    finally:
        ray.shutdown()
        nodes.cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
