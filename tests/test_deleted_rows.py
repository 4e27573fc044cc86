"""A shard with deleted rows read as the rows it keeps (:mod:`ingest.formats.deleted_rows`):
for any deleted rows and any spans of kept rows, the reader hands out exactly the kept rows
of each span, in order, numbered as kept rows; the counts and row groups the plan sees are
the kept rows'. A real Parquet file of several row groups, read by its format's reader."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.core.errors import SourceError
from ingest.formats import open_reader
from ingest.formats.base import ReadContext, ReadOptions, ShardInfo
from ingest.formats.deleted_rows import with_deletions
from ingest.planner.catalog import Catalog
from ingest.storage.sources import Source

ROWS, GROUP = 200, 32


@pytest.fixture(scope="module")
def parquet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Source, ShardInfo, ReadContext]:
    path = tmp_path_factory.mktemp("deleted") / "a.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS, dtype=np.int64)}), path, row_group_size=GROUP)
    source = Source([str(path)])
    listing = Catalog(source, ReadOptions(), None).scan(schema=False)
    (shard,), (info,) = listing.shards, listing.infos
    ctx = ReadContext(source, shard, info, ReadOptions(batch_rows=16), None, "", None)
    return source, info, ctx


def _spans(kept: int) -> st.SearchStrategy[list[tuple[int, int | None]]]:
    """Increasing spans of kept rows (the last may run to the end)."""
    cuts = st.lists(st.integers(0, kept), min_size=2, max_size=12, unique=True).map(sorted)

    def pairs(points: list[int]) -> list[tuple[int, int | None]]:
        spans: list[tuple[int, int | None]] = list(zip(points[::2], points[1::2], strict=False))
        return [s for s in spans if s[1] is not None and s[1] > s[0]]

    return cuts.map(pairs)


@settings(max_examples=60)
@given(data=st.data())
def test_each_span_reads_exactly_its_kept_rows(
    parquet: tuple[Source, ShardInfo, ReadContext], data: st.DataObject
) -> None:
    _, info, ctx = parquet
    deleted = data.draw(st.sets(st.integers(0, ROWS - 1), max_size=ROWS), label="deleted")
    kept = np.array([r for r in range(ROWS) if r not in deleted], np.int64)
    logical = with_deletions(ctx.shard.url, info, np.array(sorted(deleted), np.int64))
    assert logical.rows == len(kept)
    # Each row group starts at its first kept row (emptied ones where the next one starts).
    assert logical.blocks == tuple(
        sorted({int(np.searchsorted(kept, g)) for g in range(0, ROWS, GROUP)})
    )
    spans = data.draw(_spans(len(kept)), label="spans")
    if data.draw(st.booleans(), label="to the end") and spans:
        spans[-1] = (spans[-1][0], None)
    with open_reader(replace(ctx, info=logical)) as reader:
        got: dict[int, list[int]] = {n: [] for n in range(len(spans))}
        for n, batch in reader.read_spans(spans, None):
            ids = batch.data.column("id").to_pylist()
            assert ids == kept[batch.row : batch.stop].tolist(), "numbered as kept rows"
            got[n] += ids
    for n, (start, stop) in enumerate(spans):
        assert got[n] == kept[start:stop].tolist()


def test_a_row_the_file_does_not_hold_is_refused(
    parquet: tuple[Source, ShardInfo, ReadContext],
) -> None:
    _, info, ctx = parquet
    with pytest.raises(SourceError, match=rf"deletes row {ROWS}, and the file holds {ROWS}"):
        with_deletions(ctx.shard.url, info, np.array([3, ROWS], np.int64))
    every = with_deletions(ctx.shard.url, info, np.arange(ROWS, dtype=np.int64))
    assert every.rows == 0
    with open_reader(replace(ctx, info=every)) as reader:
        assert list(reader.read(0, None, None)) == []
