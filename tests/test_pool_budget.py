"""Byte bounds on ready batches (issue 17, "Smaller"): the reader pool's
``object_store_bytes`` and a DataLoader worker's read-ahead (``ReadOptions.prefetch_bytes``)
hold what they say with batches of large rows, and every row still arrives once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest

SHARDS, ROWS, ROW_BYTES, BATCH = 4, 16, 256 << 10, 4
"""16 MiB of 256 KiB rows: each batch of 4 rows is a little over 1 MiB."""
MIB = 1 << 20


@pytest.fixture(scope="module")
def large_rows(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("large-rows")
    rng = np.random.default_rng(0)
    for n in range(SHARDS):
        blobs = [rng.bytes(ROW_BYTES) for _ in range(ROWS)]
        table = pa.table({"id": pa.array(range(n * ROWS, (n + 1) * ROWS)), "data": blobs})
        pq.write_table(table, root / f"part-{n}.parquet", row_group_size=2, use_dictionary=False)
    return str(root)


class CountBatches:
    """A transform that leaves the batch as it is and appends a line to ``path`` for each:
    how many batches a worker's feed made, seen from the main process."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, table: pa.Table) -> pa.Table:
        if table.num_rows:
            with self.path.open("a") as out:
                out.write(".\n")
        return table


def settled_count(path: Path, quiet_s: float = 1.5, most_s: float = 30.0) -> int:
    """Lines in ``path`` once none came for ``quiet_s`` (the read-ahead is full)."""
    deadline = time.monotonic() + most_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(path.read_text().splitlines()) if path.exists() else 0
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.1)
    return last


def test_a_dataloader_workers_read_ahead_holds_prefetch_bytes(
    large_rows: str, tmp_path: Path
) -> None:
    """A worker reads ahead ``prefetch=8`` batches but at most ``prefetch_bytes=1 MiB``
    (one batch, as one item always goes): while the loop holds its first batch, the worker's
    feed has made it, one in torch's pipe (prefetch_factor=1), one read ahead and one
    waiting for room: 4 batches, not 1 + 1 + 8 + 1."""
    made = tmp_path / "made"
    stream = ingest.Stream(
        large_rows,
        batch_size=BATCH,
        transform=CountBatches(made),
        read=ingest.ReadOptions(prefetch=8, prefetch_bytes=MIB),
    )
    loader = ingest.DataLoader(stream, num_workers=1, prefetch_factor=1, timeout=60)
    loop = iter(loader)
    first = next(loop)
    ahead = settled_count(made) - 1
    assert ahead <= 3, f"the worker made {ahead} batches ahead of the loop, over 1 MiB"
    seen = Counter(int(i) for b in [first, *loop] for i in b["id"].tolist())
    assert seen == Counter(range(SHARDS * ROWS))
