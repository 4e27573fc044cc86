"""Byte bounds on ready batches (issue 17, "Smaller"): the reader pool's
``object_store_bytes`` and a DataLoader worker's read-ahead (``ReadOptions.prefetch_bytes``)
hold what they say with batches of large rows, and every row still arrives once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import ingest
from ingest.testing import write_large_rows

SHARDS, ROWS, ROW_BYTES, BATCH = 4, 16, 256 << 10, 4
"""16 MiB of 256 KiB rows: each batch of 4 rows is a little over 1 MiB."""
MIB = 1 << 20


@pytest.fixture(scope="module")
def large_rows(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("large-rows"))
    write_large_rows(root, SHARDS, ROWS, ROW_BYTES)
    return root


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


# -- the reader pool's object_store_bytes ----------------------------------------------------


def _decode_slowly(table: pa.Table) -> pa.Table:
    """A transform that takes a while, as decoding does: a feed holds its batch meanwhile."""
    time.sleep(0.3)
    return table


def _drain_rank(it: Any) -> list[int]:
    return [int(v) for batch in it for v in batch["id"].tolist()]


def held_once_settled(stream: ingest.RayStream, most_s: float = 60.0) -> dict[str, int]:
    """The pool's stats once its feeds have read ahead as far as they may."""
    deadline = time.monotonic() + most_s
    while stream.stats()["peak_queued_bytes"] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    return stream.stats()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize(("budget", "held"), [(MIB, 1), (9 * MIB, 2)])
def test_two_ranks_on_one_reader_hold_their_batches_within_the_budget(
    large_rows: str, budget: int, held: int
) -> None:
    """The issue's case: object_store_bytes=1 MiB, 4 MiB batches, 2 ranks' feeds in one
    reader. A batch over the budget goes alone: the reader holds one, never one per feed;
    9 MiB holds two of the four batches, never three."""
    import ray

    drain = ray.remote(num_cpus=0)(_drain_rank)
    pool = ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.5, object_store_bytes=budget)
    batch = 16
    with ingest.RayStream(
        large_rows,
        batch_size=batch,
        world_size=2,
        readers=pool,
        transform=_decode_slowly,
        timeout_s=60,
    ) as stream:
        its = [stream.rank_iterator(r) for r in range(2)]  # the feeds start (warm)
        settled = held_once_settled(stream)
        ranks = ray.get([drain.remote(it) for it in its], timeout=240)
        after = stream.stats()
    one_batch = batch * ROW_BYTES
    peak = settled["peak_queued_bytes"]
    assert held * one_batch <= peak < held * (one_batch + (64 << 10)), (
        f"the reader held {peak} bytes of 4 MiB batches within a budget of {budget}"
    )
    assert after["peak_queued_bytes"] == peak
    assert after["queued_bytes"] == 0, "bytes of batches taken are still counted"
    assert Counter(i for r in ranks for i in r) == Counter(range(SHARDS * ROWS))
    assert [len(r) for r in ranks] == [SHARDS * ROWS // 2] * 2
