"""Run by test_disaggregation.py in its own process: a 4-node Ray cluster on one machine.

Nodes: a head (no custom resources), two "ingest" CPU nodes and a "trainer" node. A
TorchTrainer with 4 workers asking for the trainer resource consumes a RayStream whose reader
pool (reading and decoding) asks for the ingest resource, with a small object-store budget.
Prints one JSON line with where things ran, the pool's peak ready bytes and the cluster's
spilled bytes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import fsspec
import ray
from ray._private.internal_api import memory_summary
from ray.cluster_utils import Cluster

import ingest
from ingest.testing import write_dataset
from tests.faults import TagDecodeNode
from tests.train_jobs import harness

BUDGET = 64 << 20


def loop(config: dict[str, Any]) -> None:
    import ray.train

    it, _ = ingest.train.rank_iterator(config["stream"])
    read_nodes, decode_nodes, ids = set(), set(), []
    for batch in it:
        read_nodes.update(batch["read_node"])
        decode_nodes.update(batch["decode_node"])
        ids.extend(batch["id"].tolist())
    rank = ray.train.get_context().get_world_rank()
    Path(config["out"], f"rank{rank}.json").write_text(
        json.dumps(
            {
                "worker_node": ray.get_runtime_context().get_node_id(),
                "read_nodes": sorted(read_nodes),
                "decode_nodes": sorted(decode_nodes),
                "ids": ids,
            }
        )
    )
    ingest.train.report(it, {"rows": len(ids)})


def main() -> int:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    work = Path(sys.argv[1])
    data = str(work / "data")
    write_dataset(fsspec.filesystem("file"), data, "parquet", 8, 300, row_group_rows=100)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ingest_nodes = [
        cluster.add_node(num_cpus=2, resources={harness.INGEST_RESOURCE: 100}) for _ in range(2)
    ]
    trainer_node = cluster.add_node(num_cpus=4, resources={harness.TRAINER_RESOURCE: 4})
    cluster.wait_for_nodes()
    # RAY_ADDRESS: Ray Train's helper actors call ray.init() and would otherwise join the
    # newest Ray instance on this machine, which may be another test's.
    # RAY_TRAIN_HEALTH_CHECK_INTERVAL_S: how often the Ray Train controller polls its workers
    # (default 2 s); the poll takes the ranks' reports and notices the end of the run.
    env = {
        "PYTHONPATH": root,
        "RAY_ADDRESS": cluster.address,
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    }
    ray.init(address=cluster.address, runtime_env={"env_vars": env})
    try:
        readers = ingest.ReaderPool(
            min_size=2,
            max_size=4,
            num_cpus=1,
            resources={harness.INGEST_RESOURCE: 1},
            object_store_bytes=BUDGET,
        )
        with ingest.RayStream(
            data,
            format="tests.faults:NodeTaggingParquet",
            columns=["id"],
            batch_size=50,
            world_size=4,
            readers=readers,
            transform=TagDecodeNode,
        ) as stream:
            TorchTrainer(
                loop,
                train_loop_config={"stream": stream, "out": str(work)},
                scaling_config=ScalingConfig(
                    num_workers=4, resources_per_worker={"CPU": 1, harness.TRAINER_RESOURCE: 1}
                ),
                run_config=RunConfig(name="disagg", storage_path=str(work / "runs")),
            ).fit()
            stats = stream.stats()
            reader_nodes = sorted(set(ray.get([r.node.remote() for r in stream.readers])))
        ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(4)]
        memory = memory_summary(cluster.address, stats_only=True)
        print(
            json.dumps(
                {
                    "ingest_nodes": sorted(n.node_id for n in ingest_nodes),
                    "trainer_node": trainer_node.node_id,
                    "reader_nodes": reader_nodes,
                    "ranks": ranks,
                    "budget": BUDGET,
                    "peak_ready_bytes": stats["peak_queued_bytes"],
                    "memory_summary": memory,
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
