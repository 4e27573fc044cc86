"""Run by test_disaggregation.py in its own process: a 3-node Ray cluster on one machine.

Nodes: a head (no custom resources), an "ingest" node and a "trainer" node. A TorchTrainer
with 2 workers asking for the trainer resource consumes a RayStream whose read tasks and
decode actors ask for the ingest resource. Prints one JSON line with where things ran.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import fsspec
import ray
from ray.cluster_utils import Cluster

import ingest
from ingest.testing import write_dataset
from tests.faults import TagDecodeNode
from train.common import INGEST_RESOURCE, TRAINER_RESOURCE


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
    write_dataset(fsspec.filesystem("file"), data, "parquet", 4, 300, row_group_rows=100)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ingest_node = cluster.add_node(num_cpus=4, resources={INGEST_RESOURCE: 100})
    trainer_node = cluster.add_node(num_cpus=4, resources={TRAINER_RESOURCE: 4})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": root}})
    try:
        readers = ingest.ReaderPool(
            min_size=1, max_size=2, num_cpus=1, resources={INGEST_RESOURCE: 1}
        )
        with ingest.RayStream(
            data,
            format="tests.faults:NodeTaggingParquet",
            columns=["id"],
            batch_size=50,
            world_size=2,
            readers=readers,
            transform=TagDecodeNode,
        ) as stream:
            TorchTrainer(
                loop,
                train_loop_config={"stream": stream, "out": str(work)},
                scaling_config=ScalingConfig(
                    num_workers=2, resources_per_worker={"CPU": 1, TRAINER_RESOURCE: 1}
                ),
                run_config=RunConfig(name="disagg", storage_path=str(work / "runs")),
            ).fit()
        ranks = [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]
        print(
            json.dumps(
                {
                    "ingest_node": ingest_node.node_id,
                    "trainer_node": trainer_node.node_id,
                    "ranks": ranks,
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
