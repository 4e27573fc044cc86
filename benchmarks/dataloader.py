"""Rows/s of a warm epoch: a one-process ``Stream`` against ``ingest.DataLoader`` with workers.

Parquet shards on the loopback S3 server, shuffled, every column read (``id``, 16 int32
``tokens``, a float ``score``, a short ``text``: the text goes from the workers through
their shared-memory rings as Arrow buffers). Each loader runs ``--epochs`` epochs: the first
is the cold one (listing, footers, imports, the workers' start), printed apart; the rest are
warm (the loader keeps its workers across epochs, and at an epoch's end sends them the next
one, whose first window they read while the caller checks the last: issue 32), and the
median of their seconds gives rows/s and its ratio to the ``Stream``'s rows/s (above 1.0x:
faster than the ``Stream``). ``--restarting`` also runs each worker count with
``persistent_workers=False``, whose workers stop at every epoch's end (as every
``ingest.DataLoader`` did before issue 32). ``--forkserver`` also runs each worker count
with its workers started by ``forkserver``, as a loader made in a Ray worker starts them
(:func:`ingest.integrations.worker_start.worker_start`): the forkserver's start is in the cold
epoch; their batches come through the same shared-memory rings as forked workers' (the
rings' memory file passed to them as they start). Every epoch is checked for every row once (the
carried remainder aside). Measured in one run; these machines are noisy (2 cores here:
workers compete with the main process and the S3 server): run it several times.

    .venv/bin/python benchmarks/dataloader.py [--shards 16] [--rows 50000] [--epochs 4]
        [--workers 0 1 2] [--restarting] [--forkserver]
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
    parser.add_argument(
        "--restarting", action="store_true", help="also persistent_workers=False (per epoch)"
    )
    parser.add_argument(
        "--forkserver", action="store_true", help="also workers started by forkserver"
    )
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be >= 2: the first is the cold one")
    total = args.shards * args.rows
    with LoopbackS3() as s3:
        url = s3.create_bucket("dataloader-bench") + "/data"
        write_dataset(s3.filesystem(), url, "parquet", args.shards, args.rows)
        print(f"{args.shards} shards x {args.rows:,} rows, batch {BATCH}, shuffled")
        print(f"{'loader':<56} {'cold s':>7} {'warm s':>7} {'warm rows/s':>12} {'x Stream':>9}")

        def stream() -> ingest.Stream:
            return ingest.Stream(
                url + "/",
                batch_size=BATCH,
                shuffle_seed=0,
                storage_options=s3.storage_options(),
            )

        base = None
        runs: list[tuple[str, Any, int, dict[str, Any]]] = [
            ("Stream (one process)", stream(), 1, {})
        ]
        for n in args.workers:
            runs.append((f"ingest.DataLoader({n} workers)", None, n, {}))
            if n > 0 and args.restarting:
                name = f"ingest.DataLoader({n} workers, persistent_workers=False)"
                runs.append((name, None, n, {"persistent_workers": False}))
            if n > 0 and args.forkserver:
                name = f"ingest.DataLoader({n} workers, forkserver)"
                runs.append((name, None, n, {"multiprocessing_context": "forkserver"}))
        for name, loader, n, kwargs in runs:
            if loader is None:
                loader = ingest.DataLoader(stream(), num_workers=n, **kwargs)
            cold, *times = [epoch(loader, total, max(1, n)) for _ in range(args.epochs)]
            if hasattr(loader, "close"):
                loader.close()
            rate = total / statistics.median(times)
            base = base or rate
            print(
                f"{name:<56} {cold:>7.2f} {statistics.median(times):>7.2f} {rate:>12,.0f} "
                f"{rate / base:>8.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
