"""A deriving feed's batches (:meth:`ingest.engine.derived.reading.Deriving.gather`): the
outputs of a batch's rows, gathered by their refs from the copies read, in batch order, equal
to what the chain run on the batch makes; a batch that is one run of a copy's rows (every
batch of a stream that does not shuffle) is a view of the copy, not a copy of its ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ingest.engine.derived import DerivedConfig
from ingest.engine.derived.reading import REF, Deriving
from ingest.engine.stage import Staged
from ingest.formats.base import ReadContext, ReadOptions, RowBatch, ShardInfo
from ingest.storage.sources import Shard, Source

ROWS = 400
"""Input rows of the unit: row ``i`` makes ``i % 3`` outputs of ``1 + i % 50`` ids each."""


def made() -> Staged:
    """What a chain made of the unit: a filter and a split in one, with parts."""
    counts = np.arange(ROWS) % 3
    origin = np.repeat(np.arange(ROWS, dtype=np.int64), counts)
    k = np.arange(len(origin)) - np.repeat(np.cumsum(counts) - counts, counts)
    ids = [list(range(i, i + 1 + i % 50)) for i in origin.tolist()]
    table = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "k": k})
    part = np.stack([k * 10, k * 10 + 10], axis=1).astype(np.int64)
    return Staged(table, origin, part)


def _no_read(run: list[int], ranges: list[tuple[int, int | None]]) -> Iterator[Any]:
    raise AssertionError(f"spans {run} were read: the copy should have served them")


@pytest.fixture
def deriving(tmp_path: Path) -> tuple[Deriving, np.ndarray]:
    """A deriving feed that read the unit's copy; the refs of the unit's rows."""
    deriving = Deriving(
        DerivedConfig(url=(tmp_path / "derived").as_uri()),
        fn=lambda table: table,
        fingerprint="gather test",
        columns=None,
    )
    shard = Shard(url="file:///data/a.parquet", size=1000, version="1", format="parquet")
    ctx = ReadContext(
        Source("file:///data"), shard, ShardInfo(rows=None), ReadOptions(), None, "", None
    )
    assert deriving.store.put(deriving.key(ctx, 0, None), made(), ROWS)
    first, _end = deriving.reads(ctx, 0, [0], [(0, None)], [True], _no_read)
    assert isinstance(first, tuple) and isinstance(first[1], RowBatch)
    piece = first[1]
    return deriving, piece.data.column(REF).to_numpy()


def expected(rows: np.ndarray) -> Staged:
    """The outputs of input rows ``rows`` of the unit, in that order (origins: positions)."""
    whole = made()
    out = [np.flatnonzero(whole.origin == r) for r in rows.tolist()]
    taken = np.concatenate(out).astype(np.int64)
    origin = np.repeat(np.arange(len(rows), dtype=np.int64), [len(o) for o in out])
    assert whole.part is not None
    return Staged(whole.table.take(taken), origin, whole.part[taken])


def assert_same(got: Staged | None, want: Staged) -> None:
    assert got is not None
    assert got.table.equals(want.table)
    np.testing.assert_array_equal(got.origin, want.origin)
    assert got.part is not None and want.part is not None
    np.testing.assert_array_equal(got.part, want.part)


def test_a_run_of_a_copys_rows_is_gathered_without_copying_its_ids(
    deriving: tuple[Deriving, np.ndarray],
) -> None:
    feed, refs = deriving
    batch = refs[101:301]
    ids_bytes = expected(np.arange(101, 301)).table.column("input_ids").nbytes
    before = pa.total_allocated_bytes()
    got = feed.gather(batch)
    grown = pa.total_allocated_bytes() - before
    assert_same(got.staged, expected(np.arange(101, 301)))
    assert got.raw is None
    # A take allocates the batch's ids again; a slice only the origins' and parts' arrays
    # (numpy's, not Arrow's pool).
    assert grown < ids_bytes // 10, f"{grown} bytes allocated for {ids_bytes} bytes of ids"


def test_shuffled_rows_are_gathered_in_batch_order(deriving: tuple[Deriving, np.ndarray]) -> None:
    feed, refs = deriving
    order = np.random.default_rng(3).permutation(ROWS)[:150]
    got = feed.gather(refs[order])
    assert_same(got.staged, expected(order))


def test_a_unit_goes_once_every_row_was_gathered(deriving: tuple[Deriving, np.ndarray]) -> None:
    feed, refs = deriving
    for batch in np.array_split(refs, 4):
        assert feed.held_units == 1
        feed.gather(batch)
        feed.release(batch)
    assert feed.held_units == 0
