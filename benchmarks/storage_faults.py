"""Fault-free against faulty storage: time for every row exactly once, Stream and RayStream.

Both runs read the same parquet shards on the loopback S3 server through a
:class:`ingest.testing.FaultProxy` (the fault-free run through a proxy that injects
nothing, so the proxy's own cost is in both). The faulty run gets 10% ``503 SlowDown`` and 5%
bodies dropped mid-way (change with ``--slow-down`` and ``--drop``). Each run checks every
row exactly once per epoch and prints faults injected, retries, rows lost and repeated, and
its time against the fault-free one (goal: at most 2x). Measured in one run; these machines
are noisy.

    .venv/bin/python benchmarks/storage_faults.py [--shards 16] [--rows 50000] [--epochs 2]
        [--slow-down 0.1] [--drop 0.05] [--coalesce-mb 1] [--no-ray]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import ingest
from ingest.testing import FaultProxy, Faults, LoopbackS3, write_dataset

BATCH = 1000
Result = tuple[list[Counter[int]], dict[str, int]]
"""Per-id counts of each epoch, and the stream's stats."""


def options(s3: LoopbackS3, proxy: FaultProxy) -> dict[str, Any]:
    return s3.storage_options(endpoint=proxy.endpoint)


def run_stream(url: str, storage_options: dict[str, Any], epochs: int, read: Any) -> Result:
    stream = ingest.Stream(
        url, columns=["id"], batch_size=BATCH, storage_options=storage_options, read=read
    )
    try:
        counts = []
        for _ in range(epochs):
            seen: Counter[int] = Counter()
            for batch in stream:
                seen.update(batch["id"].tolist())
            counts.append(seen)
        return counts, stream.stats
    finally:
        stream.close()


def run_ray(url: str, storage_options: dict[str, Any], epochs: int, read: Any) -> Result:
    import ray

    @ray.remote(num_cpus=0)
    def consume(it: Any) -> list[list[int]]:
        return [[i for b in it for i in b["id"].tolist()] for _ in range(epochs)]

    with ingest.RayStream(
        url,
        world_size=2,
        columns=["id"],
        batch_size=BATCH,
        storage_options=storage_options,
        read=read,
    ) as stream:
        ranks = ray.get([consume.remote(stream.rank_iterator(r)) for r in range(2)])
        stats = stream.stats()
    return [Counter(i for rank in ranks for i in rank[e]) for e in range(epochs)], stats


def measure(
    s3: LoopbackS3, url: str, faults: Faults, runner: Any, epochs: int, args: Any
) -> dict[str, Any]:
    total = args.shards * args.rows
    read = ingest.ReadOptions(coalesce_bytes=int(args.coalesce_mb * (1 << 20)))
    with FaultProxy(s3.endpoint, faults) as proxy:
        start = time.perf_counter()
        counts, stats = runner(url, options(s3, proxy), epochs, read)
        seconds = time.perf_counter() - start
        injected = proxy.counts()
    lost = sum(total - len(c) for c in counts)
    repeated = sum(sum(n - 1 for n in c.values() if n > 1) for c in counts)
    return {
        "seconds": seconds,
        "requests": injected["requests"],
        "faults": injected["slow_down"] + injected["drop"],
        "retries": stats.get("retries", 0),
        "lost": lost,
        "repeated": repeated,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--rows", type=int, default=50_000, help="rows per shard")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--slow-down", type=float, default=0.10, help="share of 503s")
    parser.add_argument("--drop", type=float, default=0.05, help="share of dropped bodies")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--coalesce-mb",
        type=float,
        default=1.0,
        help="parquet bytes per range request (small: more requests, as on large data)",
    )
    parser.add_argument("--no-ray", action="store_true", help="measure Stream only")
    args = parser.parse_args(argv)
    faulty = Faults(slow_down=args.slow_down, drop=args.drop, seed=args.seed)
    if (args.shards * args.rows) % (2 * BATCH):
        parser.error(f"shards x rows must be a multiple of {2 * BATCH} (no carried remainder)")
    with LoopbackS3() as s3:
        url = s3.create_bucket("storage-faults-bench") + "/data"
        write_dataset(s3.filesystem(), url, "parquet", args.shards, args.rows)
        runners: list[tuple[str, Any]] = [("Stream", run_stream)]
        if not args.no_ray:
            import ray

            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
            runners.append(("RayStream x2", run_ray))
        print(
            f"{args.shards} shards x {args.rows:,} rows, {args.epochs} epochs; faulty: "
            f"{args.slow_down:.0%} 503 SlowDown, {args.drop:.0%} bodies dropped"
        )
        print(
            f"{'stream':<13} {'storage':<8} {'seconds':>8} {'requests':>9} {'faults':>7} "
            f"{'retries':>8} {'lost':>5} {'repeated':>9} {'x fault-free':>13}"
        )
        for name, runner in runners:
            measure(s3, url, Faults(), runner, 1, args)  # warm: imports, footers, actors
            clean = measure(s3, url, Faults(), runner, args.epochs, args)
            bad = measure(s3, url, faulty, runner, args.epochs, args)
            for label, r in (("clean", clean), ("faulty", bad)):
                ratio = r["seconds"] / clean["seconds"]
                print(
                    f"{name:<13} {label:<8} {r['seconds']:>8.2f} {r['requests']:>9} "
                    f"{r['faults']:>7} {r['retries']:>8} {r['lost']:>5} {r['repeated']:>9} "
                    f"{ratio:>12.2f}x"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
