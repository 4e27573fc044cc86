"""Memory held by a Stream of large rows, and the MB/s of its first and second epochs.

Issue 17 (finding 10): memory was bounded in rows only, so a window of 16,384 rows of
1 MiB images could hold 16 GiB. Each case runs in a fresh process on data generated under
``--root`` (default ``/tmp/ingest-memory``, never the repository):

1. 512 MiB of 1 MiB rows (8 Parquet shards of 64 rows, one row group each, as
   ``pyarrow.parquet.write_table`` writes them by default): the process's peak resident
   memory gained by taking one batch of 8 rows, shuffled with the default settings,
   unshuffled, and with ``shuffle_window=16``; beside it Arrow's peak allocation and the
   stream's ``stats["peak_bytes_held"]``.
2. 1 GiB of 256 KiB rows (8 shards of 512 rows): MB/s delivered by the first epoch (files
   in the page cache, process cold) and the second, batches of 32 rows, shuffled.

Issue 31 (finding 13): pyarrow kept a row group's pages (as read and decompressed, twice
the row group) until its reader was asked for more, and a lane's read-ahead thread decoded
its next row group while the item it held filled its budget. Arrow's peak for case 1 went
704 -> 641 MiB shuffled and 512 -> 449 MiB unshuffled (2,072 -> 641 MiB with
``ReadOptions(prefetch=0)``); tests/test_memory.py checks the bound.

    .venv/bin/python benchmarks/memory.py [--root /tmp/ingest-memory] [--case NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20


def _write(root: Path, name: str, shards: int, rows: int, row_bytes: int) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / name
    if folder.exists() and len(list(folder.glob("*.parquet"))) == shards:
        return str(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(shards):
        blobs = [os.urandom(row_bytes) for _ in range(rows)]
        table = pa.table({"id": pa.array(range(n * rows, (n + 1) * rows)), "data": blobs})
        pq.write_table(table, folder / f"part-{n:05d}.parquet")
    return str(folder)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one_batch(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """Peak memory gained by taking one batch of 8 rows (run in a fresh process)."""
    import pyarrow as pa

    import ingest

    stream = ingest.Stream(url, batch_size=8, **options)
    stream.listing()  # the footers: not part of what the batch costs
    before = _rss()
    batch = next(iter(stream))
    assert len(batch["id"]) == 8
    out = {
        "peak_rss_gain_mib": (_peak_rss() - before) / MIB,
        "arrow_peak_mib": pa.default_memory_pool().max_memory() / MIB,
        "peak_bytes_held_mib": stream.stats.get("peak_bytes_held", -1) / MIB,
    }
    stream.close()
    return out


def epochs(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """MB/s of the first two epochs (run in a fresh process)."""
    import ingest

    stream = ingest.Stream(url, batch_size=32, shuffle_seed=0, **options)
    rates = []
    for _ in range(2):
        start, size = time.perf_counter(), 0
        for batch in stream:
            size += sum(len(b) for b in batch["data"])
        rates.append(size / MIB / (time.perf_counter() - start))
    out = {
        "first_epoch_mb_s": rates[0],
        "second_epoch_mb_s": rates[1],
        "peak_rss_mib": _peak_rss() / MIB,
        "peak_bytes_held_mib": stream.stats.get("peak_bytes_held", -1) / MIB,
    }
    stream.close()
    return out


CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "shuffled": ("one_batch", "big", {"shuffle_seed": 0}),
    "unshuffled": ("one_batch", "big", {}),
    "window16": ("one_batch", "big", {"shuffle_seed": 0, "shuffle_window": 16}),
    "epochs": ("epochs", "mid", {}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/tmp/ingest-memory")
    parser.add_argument("--case", choices=sorted(CASES), help="run one case in this process")
    parser.add_argument("--options", default="{}", help="JSON: more Stream arguments")
    args = parser.parse_args()
    root = Path(args.root)
    big = _write(root, "big", 8, 64, MIB)
    mid = _write(root, "mid", 8, 512, 256 << 10)
    if args.case:
        kind, data, options = CASES[args.case]
        options = {**options, **json.loads(args.options)}
        url = big if data == "big" else mid
        got = one_batch(url, options) if kind == "one_batch" else epochs(url, options)
        print(json.dumps(got))
        return 0
    for name in CASES:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--root",
                str(root),
                "--case",
                name,
                "--options",
                args.options,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        got = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name:12s}", "  ".join(f"{k} {v:8.1f}" for k, v in got.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
