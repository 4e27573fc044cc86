"""The node-local shard cache against none: requests and time of epoch 1 and epoch 2.

Parquet shards on the loopback S3 server, reached through a :class:`ingest.testing.FaultProxy`
that adds ``--latency-ms`` (default 20 ms) to every request, as a store far away would. A
``Stream`` reads two epochs with the cache off, then with it on (a new, empty directory,
bound above the data). Each epoch checks every row exactly once and prints the requests the
proxy saw, seconds and rows/s. Goals (issue 9): with the cache, epoch 2 sends at most 5% of
epoch 1's requests and runs at least 1.5x faster than epoch 1. Measured in one run; these
machines are noisy.

    .venv/bin/python benchmarks/shard_cache.py [--shards 24] [--rows 40000] [--latency-ms 20]
        [--coalesce-mb 1] [--ray]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import ingest
from ingest.testing import FaultProxy, Faults, LoopbackS3, write_dataset

BATCH = 1000


def epochs_of(stream: Any, ranks: int, epochs: int) -> list[tuple[list[Counter[int]], float]]:
    """Per epoch: per-id counts and seconds (a Stream, or a RayStream's ranks)."""
    out = []
    for _ in range(epochs):
        start = time.perf_counter()
        if ranks == 1:
            counts = Counter(i for b in stream for i in b["id"].tolist())
        else:
            import ray

            @ray.remote(num_cpus=0)
            def consume(it: Any) -> list[int]:
                return [i for b in it for i in b["id"].tolist()]

            got = ray.get([consume.remote(stream.rank_iterator(r)) for r in range(ranks)])
            counts = Counter(i for ids in got for i in ids)
        out.append(([counts], time.perf_counter() - start))
    return out


def run(url: str, options: dict[str, Any], read: Any, ranks: int, proxy: FaultProxy) -> list[Any]:
    """Two epochs; per epoch: counts, seconds, requests the proxy saw, the stream's stats
    (cumulative: ``hits`` and ``misses`` in the table count from the stream's start)."""
    rows = []
    kwargs = {"columns": ["id"], "batch_size": BATCH, "storage_options": options, "read": read}
    before = proxy.counts()["requests"]
    if ranks == 1:
        stream: Any = ingest.Stream(url, **kwargs)
    else:
        stream = ingest.RayStream(url, world_size=ranks, **kwargs)
    try:
        for _ in range(2):
            before = proxy.counts()["requests"]
            for counts, seconds in epochs_of(stream, ranks, 1):
                stats = stream.stats() if ranks > 1 else stream.stats
                rows.append((counts, seconds, proxy.counts()["requests"] - before, stats))
    finally:
        stream.close() if ranks == 1 else stream.shutdown()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--rows", type=int, default=40_000, help="rows per shard")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to each request")
    parser.add_argument(
        "--coalesce-mb",
        type=float,
        default=1.0,
        help="parquet bytes per range request without the cache (small: many requests)",
    )
    parser.add_argument("--ray", action="store_true", help="a RayStream of 2 ranks as well")
    args = parser.parse_args(argv)
    total = args.shards * args.rows
    if total % (2 * BATCH):
        parser.error(f"shards x rows must be a multiple of {2 * BATCH} (no carried remainder)")
    failed = False
    with LoopbackS3() as s3, tempfile.TemporaryDirectory(prefix="ingest-cache-bench-") as tmp:
        url = s3.create_bucket("shard-cache-bench") + "/data"
        paths = write_dataset(s3.filesystem(), url, "parquet", args.shards, args.rows)
        size = sum(s3.filesystem().size(p) for p in paths)
        print(
            f"{args.shards} shards x {args.rows:,} rows ({size / 2**20:.1f} MiB), "
            f"{args.latency_ms:.0f} ms added to every request"
        )
        print(
            f"{'stream':<13} {'cache':<6} {'epoch':>5} {'requests':>9} {'seconds':>8} "
            f"{'rows/s':>10} {'hits':>5} {'misses':>7} {'lost':>5} {'repeated':>9}"
        )
        runs = [("Stream", 1)]
        if args.ray:
            import ray

            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
            runs.append(("RayStream x2", 2))
        faults = Faults(latency_s=args.latency_ms / 1000)
        for name, ranks in runs:
            for label in ("off", "on"):
                cache = ingest.CacheOptions(f"{tmp}/{name}-{label}", max_bytes=2 * size)
                read = ingest.ReadOptions(
                    coalesce_bytes=int(args.coalesce_mb * (1 << 20)),
                    cache=cache if label == "on" else None,
                )
                with FaultProxy(s3.endpoint, faults) as proxy:
                    options = s3.storage_options(endpoint=proxy.endpoint)
                    # The trailing slash names a directory: one listing request per epoch.
                    epochs = run(url + "/", options, read, ranks, proxy)
                for n, (counts, seconds, requests, stats) in enumerate(epochs):
                    seen = counts[0]
                    lost = total - len(seen)
                    repeated = sum(c - 1 for c in seen.values() if c > 1)
                    failed |= bool(lost or repeated)
                    print(
                        f"{name:<13} {label:<6} {n + 1:>5} {requests:>9} {seconds:>8.2f} "
                        f"{total / seconds:>10,.0f} {stats['cache_hits']:>5} "
                        f"{stats['cache_misses']:>7} {lost:>5} {repeated:>9}"
                    )
                if label == "on":
                    (_, t1, r1, _), (_, t2, r2, _) = epochs
                    share, speed = r2 / max(r1, 1), t1 / t2
                    ok = share <= 0.05 and speed >= 1.5
                    print(
                        f"{name}: with the cache, epoch 2 sent {share:.1%} of epoch 1's "
                        f"requests (goal <= 5%) and ran {speed:.2f}x faster (goal >= 1.5x): "
                        f"{'met' if ok else 'NOT met'}"
                    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
