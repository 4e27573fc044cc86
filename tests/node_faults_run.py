"""Run by test_node_faults.py in its own process: a node removed mid-epoch (issue 8, fault 2).

A ``ray.cluster_utils.Cluster`` on this machine: a head, "ingest" CPU nodes and "trainer"
nodes, two of the kind that loses a node (one to move to) and one of the other. A
TorchTrainer with 2 workers and ``FailureConfig`` counts every row id it receives (summed
across ranks like DDP gradients) and saves the counts with the stream state in every
checkpoint. When rank 0 reaches step ``KILL_STEP`` of epoch 0, the
driver removes one node, chosen by ``sys.argv[2]``:

- ``reader``: an ingest node with a reader actor but not the coordinator. The readers move
  to the remaining ingest node and each rank resumes after its last acked batch; the worker
  group is not restarted.
- ``coordinator``: the ingest node of the coordinator. Ray restarts it on the other ingest
  node; the ranks fail with CoordinatorLostError and Ray Train restarts the group from the
  latest checkpoint.
- ``trainer``: the trainer node of the workers. Ray Train restarts the group on the spare.

Prints one JSON line: the node removed, the final counts per id, the events the ranks wrote
and the seconds from the removal to the first batch after it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import ray
from ray.cluster_utils import Cluster

import ingest
from ingest.testing import write_dataset
from tests.train_jobs import harness

SHARDS, ROWS, BATCH, EPOCHS, RANKS = 8, 300, 50, 2, 2
TOTAL = SHARDS * ROWS  # 24 steps of 2 x 50 rows per epoch
KILL_STEP = 7
CHECKPOINT_EVERY = 3


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


def start_cluster(which: str) -> tuple[Cluster, dict[str, Any], dict[str, Any]]:
    """A head, ingest nodes and trainer nodes; node deaths noticed within seconds.

    Two nodes of the kind that loses one (``which``), so that one is left to move to, and
    one of the other kind: each node costs seconds to start on a small machine.
    """
    nodes = {"reader": (2, 1), "coordinator": (2, 1), "trainer": (1, 2)}
    ingest_count, trainer_count = nodes[which]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    system = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": system}
    )
    ingest_nodes = {
        n.node_id: n
        for n in (
            cluster.add_node(num_cpus=2, resources={harness.INGEST_RESOURCE: 100})
            for _ in range(ingest_count)
        )
    }
    trainer_nodes = {
        n.node_id: n
        for n in (
            cluster.add_node(num_cpus=2, resources={harness.TRAINER_RESOURCE: 2})
            for _ in range(trainer_count)
        )
    }
    cluster.wait_for_nodes()
    # RAY_ADDRESS: Ray Train's helper actors call ray.init() and would otherwise join the
    # newest Ray instance on this machine, which may be another test's.
    # RAY_TRAIN_HEALTH_CHECK_INTERVAL_S: how often the Ray Train controller polls its workers
    # (default 2 s). A worker's ray.train.report waits for the poll that takes the previous
    # report, so each checkpoint cost ~1.8 s; the poll also notices failures and the end.
    env = {
        "PYTHONPATH": root,
        "RAY_ADDRESS": cluster.address,
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    }
    ray.init(address=cluster.address, runtime_env={"env_vars": env})
    return cluster, ingest_nodes, trainer_nodes


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


def main() -> int:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    work, which = Path(sys.argv[1]), sys.argv[2]
    data = str(work / "data")
    events = work / "events"
    events.mkdir(parents=True)
    write_dataset(fsspec.filesystem("file"), data, "parquet", SHARDS, ROWS, row_group_rows=50)
    cluster, ingest_nodes, trainer_nodes = start_cluster(which)
    found: dict[str, Any] = {"which": which, "epochs": EPOCHS}
    found.update(ingest_nodes=sorted(ingest_nodes), trainer_nodes=sorted(trainer_nodes))
    try:
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
                cluster.remove_node(
                    ingest_nodes.get(node) or trainer_nodes[node], allow_graceful=False
                )
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
        assert result.checkpoint is not None
        import torch

        with result.checkpoint.as_directory() as directory:
            found["counts"] = torch.load(os.path.join(directory, "counts.pt")).tolist()
            state = json.loads(Path(directory, ingest.train.STATE_FILE).read_text())
        found["final_epoch"] = state["progress"]["epoch"]
        found["events"] = log = read_events(events)
        found["removed"] = removed
        found["recover_s"] = recover_s(log, removed)
        print(json.dumps(found))
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
