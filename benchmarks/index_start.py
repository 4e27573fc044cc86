"""No full pass before the first batch (issue 7, item 4): a RayStream over many JSONL shards.

JSONL has no row counts in a footer, so a stream of several ranks indexes each shard once
(Ray tasks on the pool's nodes) into the persistent shard index before it plans; a later job
finds every shard there. On a fresh local Ray and the loopback S3 server, 2 ranks:

1. seconds from ``RayStream(...)`` to the first batch on every rank, for ``--shards``
   shards of ``--rows`` rows and for one shard of the same rows, each with an empty index
   [goal: many <= 3x one];
2. the same many shards again, a second job with the index the first one wrote: its first
   batch, and what planning asked the index and the store (shards found, shards read to
   index them: goal 0).

    .venv/bin/python benchmarks/index_start.py [--shards 1000] [--rows 100]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import ray

import ingest
from ingest.distributed.index_tasks import ray_indexer
from ingest.planner.catalog import Catalog
from ingest.planner.index import IndexConfig, IndexStore
from ingest.storage.sources import Source
from ingest.testing import LoopbackS3, write_dataset


@ray.remote(num_cpus=0)
def first_batch(it: Any) -> float:
    """The wall-clock time (``time.time``) at which the rank's first batch arrived."""
    for _batch in it:
        return time.time()
    return 0.0


def first_batch_s(url: str, storage_options: dict[str, Any], index_dir: str) -> float:
    """Seconds from ``RayStream(...)`` to the first batch on both ranks."""
    start = time.time()
    stream = ingest.RayStream(
        url,
        batch_size=256,
        shuffle_seed=0,
        world_size=2,
        storage_options=storage_options,
        index=IndexConfig(location=index_dir),
    )
    try:
        got = ray.get([first_batch.remote(stream.rank_iterator(r)) for r in range(2)], timeout=600)
    finally:
        stream.shutdown()
    return max(got) - start


def planning_cost(url: str, storage_options: dict[str, Any], index_dir: str) -> dict[str, int]:
    """What a job's planning asks the index and the store, as the RayStream constructor
    plans (the same catalog, the Ray indexer, ``index=True``)."""
    store = IndexStore(IndexConfig(location=index_dir))
    source = Source(url, storage_options=storage_options)
    catalog = Catalog(source, ingest.ReadOptions(), None, index_store=store, indexer=ray_indexer())
    listing = catalog.scan(index=True)
    return {
        "shards": len(listing.shards),
        "found_in_index": store.stats.hits,
        "read_to_index": store.stats.misses,
        "store_opens": source.stats.opens,
        "store_bytes_read": source.stats.bytes_read,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    args = parser.parse_args()
    out: dict[str, Any] = {"shards": args.shards, "rows_per_shard": args.rows}
    with LoopbackS3() as s3:
        s3.create_bucket("bench")
        fs = s3.filesystem()
        options = s3.storage_options()
        started = time.perf_counter()
        write_dataset(fs, "s3://bench/one", "jsonl", 1, args.shards * args.rows)
        write_dataset(fs, "s3://bench/many", "jsonl", args.shards, args.rows)
        print(f"wrote 1 + {args.shards:,} JSONL shards in {time.perf_counter() - started:.1f} s")
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            with tempfile.TemporaryDirectory(prefix="ingest-index-") as tmp:
                # Ray's worker processes start once, for every case alike.
                first_batch_s("s3://bench/one", options, f"{tmp}/warmup")
                out["one_s"] = first_batch_s("s3://bench/one", options, f"{tmp}/one")
                out["many_s"] = first_batch_s("s3://bench/many", options, f"{tmp}/many")
                out["many_again_s"] = first_batch_s("s3://bench/many", options, f"{tmp}/many")
                out["again_planning"] = planning_cost("s3://bench/many", options, f"{tmp}/many")
        finally:
            ray.shutdown()
    ratio = out["many_s"] / out["one_s"]
    plan = out["again_planning"]
    print(
        f"first batch, empty index: 1 shard {out['one_s']:.2f} s, {args.shards:,} shards "
        f"{out['many_s']:.2f} s: {ratio:.2f}x (goal <= 3x: {'met' if ratio <= 3 else 'NOT met'})"
    )
    print(
        f"second job on the {args.shards:,} shards: first batch {out['many_again_s']:.2f} s; "
        f"planning found {plan['found_in_index']:,} of {plan['shards']:,} shards in the index, "
        f"read {plan['read_to_index']} to index them (goal 0: "
        f"{'met' if plan['read_to_index'] == 0 else 'NOT met'}), opened {plan['store_opens']}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
