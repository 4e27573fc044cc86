"""RayStream with 2 ranks against plain Ray Data, on the same parquet files on loopback S3.

Readers, each feeding 2 consumer tasks that turn batches into torch tensors:

- ``ingest.RayStream``, provenance tracking on (the default: acks, exactly-once state);
- the same pipeline with tracking off (``RankOptions(track=False)``), to price tracking;
- ``ray.data.read_parquet(...).streaming_split(2, equal=True)`` + ``iter_torch_batches``.

After one unmeasured warm-up epoch (Ray starts its worker processes), each runs
``--epochs`` epochs; the table gives the median rows/s of the epochs after the first and the
first epoch's first-batch seconds. Ratios from one run are what to compare.

    .venv/bin/python benchmarks/ray_stream.py [--shards 8] [--rows 50000] [--epochs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray

import ingest
from ingest.testing import LoopbackS3, write_dataset

COLUMNS = ["id", "tokens"]
BATCH = 1024
RANKS = 2


@ray.remote(num_cpus=0)
def consume(batches_of: Any, epochs: int) -> list[dict[str, float]]:
    """A rank: iterate ``epochs`` epochs; per epoch rows, seconds and first-batch seconds."""
    out = []
    for epoch in range(epochs):
        start = time.perf_counter()
        first = None
        rows = 0
        for batch in batches_of(epoch):
            if first is None:
                first = time.perf_counter() - start
            rows += len(batch["id"])
        out.append(
            {"rows": rows, "seconds": time.perf_counter() - start, "first_batch_s": first or 0.0}
        )
    return out


class _Ingest:
    def __init__(self, it: Any) -> None:
        self.it = it

    def __call__(self, epoch: int) -> Any:
        return iter(self.it)


class _RayData:
    def __init__(self, it: Any) -> None:
        self.it = it

    def __call__(self, epoch: int) -> Any:
        return self.it.iter_torch_batches(batch_size=BATCH)


def measure(make_ranks: Any, epochs: int) -> dict[str, float]:
    ranks = make_ranks()
    results = ray.get([consume.remote(r, epochs) for r in ranks], timeout=1800)
    per_epoch = []
    for e in range(epochs):
        rows = sum(r[e]["rows"] for r in results)
        seconds = max(r[e]["seconds"] for r in results)
        per_epoch.append(rows / seconds)
    warm = per_epoch[1:] or per_epoch
    return {
        "rows_s": statistics.median(warm),
        "first_epoch_rows_s": per_epoch[0],
        "first_batch_s": max(r[0]["first_batch_s"] for r in results),
        "rows_per_epoch": sum(r[-1]["rows"] for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--row-group", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", default="bench-out/ray_stream.json")
    args = parser.parse_args()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    with LoopbackS3() as s3:
        s3.create_bucket("bench")
        paths = write_dataset(
            s3.filesystem(),
            "bench/train",
            "parquet",
            args.shards,
            args.rows,
            row_group_rows=args.row_group,
        )
        options = s3.storage_options()

        def ingest_ranks(track: bool) -> Any:
            def make() -> list[Any]:
                stream = ingest.RayStream(
                    "s3://bench/train/",
                    columns=COLUMNS,
                    batch_size=BATCH,
                    world_size=RANKS,
                    storage_options=options,
                )
                rank_options = ingest.RankOptions(track=track)
                return [
                    _Ingest(stream.rank_iterator(r, options=rank_options)) for r in range(RANKS)
                ]

            return make

        def ray_data_ranks() -> list[Any]:
            fs = pafs.S3FileSystem(
                access_key=s3.key,
                secret_key=s3.secret,
                scheme="http",
                endpoint_override=s3.endpoint.removeprefix("http://"),
                region="us-east-1",
            )
            ds = ray.data.read_parquet(paths, filesystem=fs, columns=COLUMNS)
            return [_RayData(it) for it in ds.streaming_split(RANKS, equal=True)]

        measure(ingest_ranks(True), 1)  # warm-up, not reported: starts Ray's worker processes
        runs = {
            "ingest.RayStream (tracking on)": measure(ingest_ranks(True), args.epochs),
            "ingest.RayStream (tracking off)": measure(ingest_ranks(False), args.epochs),
            "ray.data.read_parquet + streaming_split": measure(ray_data_ranks, args.epochs),
        }
    ray.shutdown()
    on = runs["ingest.RayStream (tracking on)"]["rows_s"]
    off = runs["ingest.RayStream (tracking off)"]["rows_s"]
    peer = runs["ray.data.read_parquet + streaming_split"]["rows_s"]
    print(
        f"{args.shards * args.rows:,} rows in {args.shards} parquet shards on loopback S3, "
        f"{RANKS} ranks, batch {BATCH}, columns {COLUMNS}, {args.epochs} epochs"
    )
    print(f"{'reader':<42} {'first batch s':>13} {'rows/s (warm)':>14} {'rows/epoch':>11}")
    for name, run in runs.items():
        print(
            f"{name:<42} {run['first_batch_s']:>13.2f} {run['rows_s']:>14,.0f} "
            f"{run['rows_per_epoch']:>11,}"
        )
    print(
        f"tracking overhead: {(off - on) / off:+.1%} (goal <= 5%); "
        f"ingest vs Ray Data streaming_split: {on / peer:.2f}x (goal >= 1.0x)"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {"runs": runs, "tracking_overhead": (off - on) / off, "vs_ray_data": on / peer},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
