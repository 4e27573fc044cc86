"""Seconds per epoch: a one-process ``Stream`` against ``ingest.DataLoader`` with workers.

Parquet shards on the loopback S3 server, shuffled, read column ``id`` and a payload column.
Each loader runs ``--epochs`` epochs (the first one warm-up: listing, imports, worker start
is in each later epoch too, as the workers restart per epoch) and prints the median seconds
of the rest, rows/s, and its ratio to the ``Stream``; every epoch is checked for every row
once (the carried remainder aside). Measured in one run; these machines are noisy (2 cores
here: workers compete with the main process and the S3 server).

    .venv/bin/python benchmarks/dataloader.py [--shards 16] [--rows 50000] [--epochs 4]
        [--workers 0 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import ingest
from ingest.testing import LoopbackS3, write_dataset

BATCH = 1000


def epoch(loader: Any, total: int, ranks: int) -> float:
    start = time.perf_counter()
    seen = [i for b in loader for i in b["id"].tolist()]
    seconds = time.perf_counter() - start
    if len(seen) != len(set(seen)) or total - len(seen) >= 2 * ranks * BATCH:
        raise SystemExit(f"not every row once: {len(seen)} rows, {len(set(seen))} distinct")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--rows", type=int, default=50_000, help="rows per shard")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    total = args.shards * args.rows
    with LoopbackS3() as s3:
        url = s3.create_bucket("dataloader-bench") + "/data"
        write_dataset(s3.filesystem(), url, "parquet", args.shards, args.rows)
        print(f"{args.shards} shards x {args.rows:,} rows, batch {BATCH}, shuffled")
        print(f"{'loader':<28} {'s/epoch':>8} {'rows/s':>10} {'x Stream':>9}")

        def stream() -> ingest.Stream:
            return ingest.Stream(
                url + "/",
                batch_size=BATCH,
                shuffle_seed=0,
                storage_options=s3.storage_options(),
            )

        base = None
        runs: list[tuple[str, Any, int]] = [("Stream (one process)", stream(), 1)]
        for n in args.workers:
            runs.append((f"ingest.DataLoader({n} workers)", None, n))
        for name, loader, n in runs:
            if loader is None:
                loader = ingest.DataLoader(stream(), num_workers=n)
            times = [epoch(loader, total, max(1, n)) for _ in range(args.epochs)][1:]
            median = statistics.median(times)
            base = base or median
            print(f"{name:<28} {median:>8.2f} {total / median:>10,.0f} {median / base:>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
