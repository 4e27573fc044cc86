"""Spans of one shard read as ranges and cut back (:mod:`ingest.formats.spans`). Pure."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.formats.base import BadRows, Gathered, RowBatch
from ingest.formats.spans import GAP_ROWS, Parts, Range, coalesce, cut, cut_together


def batches_of(start: int, stop: int, size: int) -> list[RowBatch]:
    return [
        RowBatch(a, pa.record_batch({"id": list(range(a, min(a + size, stop)))}))
        for a in range(start, stop, size)
    ]


def test_spans_a_few_rows_apart_are_one_range_and_a_seek_starts_another() -> None:
    spans: list[tuple[int, int | None]] = [(10, 12), (15, 16), (16, 20), (3000, 3001), (5, 9)]
    assert coalesce(spans) == [
        Range(10, 20, (0, 1, 2)),
        Range(3000, 3001, (3,)),
        Range(5, 9, (4,)),  # rows before the last: another range, in the order asked
    ]
    assert coalesce([(0, 4), (4 + GAP_ROWS + 1, None)]) == [
        Range(0, 4, (0,)),
        Range(4 + GAP_ROWS + 1, None, (1,)),
    ]
    assert coalesce([(0, 4), (4 + GAP_ROWS, None)]) == [Range(0, None, (0, 1))]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), min_size=1, max_size=30),
    st.integers(1, 64),
    st.booleans(),
)
def test_cut_gives_each_span_its_rows_in_order(
    steps: list[tuple[int, int]], size: int, to_end: bool
) -> None:
    spans: list[tuple[int, int | None]] = []
    at = 0
    for gap, rows in steps:
        spans.append((at + gap, at + gap + rows))
        at += gap + rows
    end = at + 17
    if to_end:
        spans[-1] = (spans[-1][0], None)
    ranges = coalesce(spans, gap=8)
    read = [
        (n, b)
        for n, r in enumerate(ranges)
        for b in batches_of(r.start, end if r.stop is None else r.stop, size)
    ]
    got: dict[int, list[int]] = {}
    for index, batch in cut(read, ranges, spans):
        assert batch.data.column("id").to_pylist() == list(range(batch.row, batch.stop))
        got.setdefault(index, []).extend(range(batch.row, batch.stop))
    want = {i: list(range(a, end if b is None else b)) for i, (a, b) in enumerate(spans)}
    assert got == want
    # Cut together, each batch's rows of several spans gathered: the same rows per span.
    together: dict[int, list[int]] = {}
    for item in cut_together(read, ranges, spans):
        if isinstance(item, Parts):
            assert len(item.parts) > 1
            g = Gathered.of(item.batch, item.parts)
            assert g.data.column("id").to_pylist() == g.rows.tolist()
            assert list(g.ends()) == [(i, hi) for i, _, hi in item.parts]
            for index, row in zip(g.spans.tolist(), g.rows.tolist(), strict=True):
                together.setdefault(index, []).append(row)
        else:
            index, batch = item
            together.setdefault(index, []).extend(range(batch.row, batch.stop))
    assert together == want


def test_a_gathered_piece_slices_and_renumbers_its_spans() -> None:
    batch = RowBatch(100, pa.record_batch({"id": list(range(100, 110))}), (96, 7))
    g = Gathered.of(batch, [(3, 100, 101), (4, 103, 106), (7, 109, 110)])
    assert g.rows.tolist() == [100, 103, 104, 105, 109]
    assert (g.row, g.stop, g.seek) == (100, 110, (96, 7))
    assert g.share == batch.nbytes * 5 // 10
    head, rest = g.slice(0, 2), g.slice(2, 3)
    assert (head.rows.tolist(), head.spans.tolist()) == ([100, 103], [3, 4])
    assert rest.data.column("id").to_pylist() == [104, 105, 109]
    assert list(rest.ends()) == [(4, 106), (7, 110)]
    renumbered = g.renumbered([0, 0, 0, 10, 11, 0, 0, 12])
    assert renumbered.spans.tolist() == [10, 11, 11, 11, 12]


def test_a_batch_of_bad_rows_stays_one_when_cut() -> None:
    error = ValueError("bad line")
    bad = BadRows(4, pa.record_batch({"id": [None] * 6}), None, error)
    ranges = coalesce([(0, 2), (5, 7)])
    out = list(cut([(0, bad)], ranges, [(0, 2), (5, 7)]))
    assert [(i, type(b).__name__, b.row, b.stop) for i, b in out] == [(1, "BadRows", 5, 7)]
    assert out[0][1].error is error


def test_bad_rows_of_several_spans_are_not_gathered() -> None:
    """A batch of bad rows (nulls, one per row) that holds rows of several spans comes as
    one :class:`BadRows` per span, as :func:`cut` gives it: the feed quarantines each span's
    rows, and a gathered piece would carry rows of data."""
    from collections.abc import Iterator

    from ingest.formats.base import Seek, ShardReader

    error = ValueError("bad block")

    class Bad(ShardReader):
        def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
            assert stop is not None
            yield BadRows(start, pa.record_batch({"id": [None] * (stop - start)}), None, error)

    out = list(Bad(None).read_gathered([(0, 2), (3, 5), (9, 10)], None))  # type: ignore[arg-type]
    assert [(i, type(b).__name__, b.row, b.stop) for i, b in out] == [
        (0, "BadRows", 0, 2),
        (1, "BadRows", 3, 5),
        (2, "BadRows", 9, 10),
    ]
    assert all(isinstance(b, BadRows) and b.error is error for _, b in out)
