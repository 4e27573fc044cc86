"""ingest.Stream against a plain pyarrow loop over the same parquet files on loopback S3.

Prints one table, measured in one run (ratios are what to compare; these machines are
noisy): steady rows/s and MB/s of an epoch, and the first-batch time of a fresh stream
against one resumed at 90% of the epoch (both include listing and footer reads).

    .venv/bin/python benchmarks/stream_vs_pyarrow.py [--shards 8] [--rows 100000] [--repeat 3]

With ``--local`` the files are on local disk (in the page cache after the first epoch) and
the three readers take turns, epoch by epoch, ``--repeat`` times (default 7): whole epochs,
listing included, as rows/s and CPU microseconds per row (this process's threads, which
other work on the machine disturbs less than the wall clock), and their ratios to the
pyarrow loop. Its defaults are 32 shards of 16,384 rows in row groups of 4,096.

    .venv/bin/python benchmarks/stream_vs_pyarrow.py --local [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
import torch

import ingest
from ingest.testing import LoopbackS3, write_dataset

# The loops make tensors over Arrow's read-only buffers, as ingest.engine.convert does (and
# says so once in the same way): torch's warning about it is not a result.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

COLUMNS = ["id", "tokens"]
ROW_BYTES = 8 + 16 * 4  # id int64 + 16 int32 tokens, as delivered to the consumer
BATCH = 1024


def _tensors(pf: pq.ParquetFile) -> Iterator[int]:
    """The peer's batches of one file as the tensors a loader makes; yields their rows."""
    for rb in pf.iter_batches(batch_size=BATCH, columns=COLUMNS):
        ids = torch.from_numpy(rb.column(0).to_numpy())
        tokens = rb.column(1)
        flat = tokens.values.slice(tokens.offset * 16, len(tokens) * 16)
        torch.from_numpy(flat.to_numpy()).reshape(len(tokens), 16)
        yield len(ids)


def pyarrow_loop(s3: LoopbackS3, url: str) -> Iterator[int]:
    """The peer: list with s3fs, open each file, iterate pyarrow batches, make tensors."""
    fs = s3.filesystem()
    for path in sorted(fs.glob(url)):
        with fs.open(path, "rb") as f:
            yield from _tensors(pq.ParquetFile(f))


def stream_epoch(s3: LoopbackS3 | None, url: str, seed: int | None, total: int) -> Iterator[int]:
    """The first epoch of a new stream. Its rows that cannot fill a batch are carried into
    the next epoch (``remainder="carry"``): the epoch delivers ``total // BATCH`` full
    batches, and its state must carry exactly the ``total % BATCH`` rows left."""
    stream = ingest.Stream(
        url,
        columns=COLUMNS,
        batch_size=BATCH,
        shuffle_seed=seed,
        storage_options=None if s3 is None else s3.storage_options(),
    )
    delivered = 0
    for batch in stream:
        delivered += len(batch["id"])
        yield len(batch["id"])
    spans = stream.state_dict()["distributed"]["carry"]["spans"]
    stream.close()
    carried = sum(stop - start for _, start, stop in spans)
    if (delivered, carried) != (total - total % BATCH, total % BATCH):
        raise SystemExit(
            f"ingest.Stream delivered {delivered} rows and carried {carried} into the next "
            f"epoch; expected {total - total % BATCH} delivered in full batches of {BATCH} "
            f"and {total % BATCH} carried, {total} in all"
        )


def first_batch_s(s3: LoopbackS3, url: str, state: dict[str, Any] | None) -> float:
    start = time.perf_counter()
    stream = ingest.Stream(
        url, columns=COLUMNS, batch_size=BATCH, shuffle_seed=0, storage_options=s3.storage_options()
    )
    if state is not None:
        stream.load_state_dict(state)
    next(iter(stream))
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed


def state_at(s3: LoopbackS3, url: str, fraction: float, total: int) -> dict[str, Any]:
    stream = ingest.Stream(
        url, columns=COLUMNS, batch_size=BATCH, shuffle_seed=0, storage_options=s3.storage_options()
    )
    seen = 0
    for batch in stream:
        seen += len(batch["id"])
        if seen >= fraction * total:
            break
    state = stream.state_dict()
    stream.close()
    return state


def timed(make: Callable[[], Iterator[int]], repeat: int) -> dict[str, float]:
    """Medians over ``repeat`` epochs: first-batch seconds (listing included) and steady
    rows/s after the first batch. Each epoch must deliver the same row count."""
    first, steady, rows = [], [], []
    for _ in range(repeat):
        start = time.perf_counter()
        it = make()
        n = next(it)
        t_first = time.perf_counter()
        rest = sum(it)
        end = time.perf_counter()
        first.append(t_first - start)
        steady.append(rest / (end - t_first))
        rows.append(n + rest)
    if len(set(rows)) != 1:
        raise SystemExit(f"epochs delivered different row counts: {rows}")
    return {
        "first_batch_s": statistics.median(first),
        "rows_s": statistics.median(steady),
        "rows": rows[0],
    }


def local_pyarrow_loop(paths: list[str]) -> Iterator[int]:
    """The peer on local disk: open each file by path, iterate pyarrow batches, make tensors."""
    for path in paths:
        yield from _tensors(pq.ParquetFile(path))


def epoch_cost(make: Callable[[], Iterator[int]]) -> tuple[int, float, float]:
    """One whole epoch (listing included): rows, rows/s and CPU microseconds per row."""
    start, cpu = time.perf_counter(), time.process_time()
    rows = sum(make())
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return rows, rows / wall, cpu / rows * 1e6


def local_main(args: argparse.Namespace) -> int:
    """The comparison on local disk, readers in turn (see the module docstring)."""
    shards = args.shards or 32
    rows = args.rows or 16_384
    group = args.row_group or 4_096
    repeat = args.repeat or 7
    total = shards * rows
    with tempfile.TemporaryDirectory() as root:
        fs = fsspec.filesystem("file")
        write_dataset(fs, root, "parquet", shards, rows, row_group_rows=group)
        paths = sorted(fs.glob(f"{root}/*.parquet"))
        readers: dict[str, Callable[[], Iterator[int]]] = {
            "plain pyarrow loop (+torch)": lambda: local_pyarrow_loop(paths),
            "ingest.Stream, listing order": lambda: stream_epoch(None, root, None, total),
            "ingest.Stream, shuffle_seed=0": lambda: stream_epoch(None, root, 0, total),
        }
        for make in readers.values():  # the page cache, imports, first compilations
            sum(make())
        got: dict[str, list[tuple[int, float, float]]] = {name: [] for name in readers}
        for _ in range(repeat):
            for name, make in readers.items():
                got[name].append(epoch_cost(make))
    results = {
        name: {
            "rows": runs[0][0],
            "rows_s": statistics.median(r[1] for r in runs),
            "cpu_us_per_row": statistics.median(r[2] for r in runs),
        }
        for name, runs in got.items()
    }
    peer = results["plain pyarrow loop (+torch)"]
    print(
        f"{total:,} rows in {shards} parquet shards on local disk (row groups of {group}), "
        f"columns {COLUMNS}, batch {BATCH}, median of {repeat} epochs in turn"
    )
    print(f"{'reader':<32} {'rows/s':>11} {'CPU us/row':>10} {'vs pyarrow':>10} {'CPU vs':>7}")
    for name, run in results.items():
        print(
            f"{name:<32} {run['rows_s']:>11,.0f} {run['cpu_us_per_row']:>10.3f} "
            f"{run['rows_s'] / peer['rows_s']:>9.2f}x "
            f"{run['cpu_us_per_row'] / peer['cpu_us_per_row']:>6.2f}x"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"rows": total, "local": True, "readers": results}, indent=2)
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--local", action="store_true", help="local disk, not loopback S3")
    parser.add_argument("--shards", type=int, default=None, help="default 8 (--local: 32)")
    parser.add_argument(
        "--rows", type=int, default=None, help="rows per shard, default 100,000 (--local: 16,384)"
    )
    parser.add_argument(
        "--row-group", type=int, default=None, help="default 10,000 (--local: 4,096)"
    )
    parser.add_argument("--repeat", type=int, default=None, help="default 3 (--local: 7)")
    parser.add_argument("--out", default="bench-out/stream_vs_pyarrow.json")
    args = parser.parse_args()
    if args.local:
        return local_main(args)
    args.shards = args.shards or 8
    args.rows = args.rows or 100_000
    args.row_group = args.row_group or 10_000
    args.repeat = args.repeat or 3
    total = args.shards * args.rows
    with LoopbackS3() as s3:
        s3.create_bucket("bench")
        write_dataset(
            s3.filesystem(),
            "bench/train",
            "parquet",
            args.shards,
            args.rows,
            row_group_rows=args.row_group,
        )
        url = "s3://bench/train/*.parquet"
        runs = {
            "plain pyarrow loop (+torch)": timed(lambda: pyarrow_loop(s3, url), args.repeat),
            "ingest.Stream, listing order": timed(
                lambda: stream_epoch(s3, url, None, total), args.repeat
            ),
            "ingest.Stream, shuffle_seed=0": timed(
                lambda: stream_epoch(s3, url, 0, total), args.repeat
            ),
        }
        # pyarrow yields every row, its last batch short; an ingest epoch yields full batches
        # and carries the rest into the next epoch (checked exactly by stream_epoch).
        expected = {name: total - total % BATCH for name in runs}
        expected["plain pyarrow loop (+torch)"] = total
        for name, run in runs.items():
            if run["rows"] != expected[name]:
                raise SystemExit(f"{name} delivered {run['rows']} rows, expected {expected[name]}")
        state90 = state_at(s3, url, 0.9, total)
        fresh = statistics.median(first_batch_s(s3, url, None) for _ in range(5))
        resumed = statistics.median(first_batch_s(s3, url, state90) for _ in range(5))
    peer = runs["plain pyarrow loop (+torch)"]["rows_s"]
    results = {
        "rows": total,
        "shards": args.shards,
        "row_group": args.row_group,
        "readers": runs,
        "first_batch_s": fresh,
        "first_batch_resumed_90_s": resumed,
        "resume90_vs_fresh": resumed / fresh,
    }
    print(
        f"{total:,} rows in {args.shards} parquet shards on loopback S3, columns {COLUMNS}, "
        f"batch {BATCH}, median of {args.repeat} epochs"
    )
    print(
        f"{'reader':<32} {'first batch s':>13} {'steady rows/s':>14} {'MB/s':>7} {'vs pyarrow':>10}"
    )
    for name, run in runs.items():
        print(
            f"{name:<32} {run['first_batch_s']:>13.3f} {run['rows_s']:>14,.0f} "
            f"{run['rows_s'] * ROW_BYTES / 1e6:>7.1f} {run['rows_s'] / peer:>9.2f}x"
        )
    print(
        f"first batch (shuffle_seed=0, listing included), fresh: {fresh:.3f} s; "
        f"resumed at 90%: {resumed:.3f} s ({resumed / fresh:.2f}x; goal <= 1.5x)"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
