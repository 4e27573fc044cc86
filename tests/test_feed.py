"""The feed on its own: each batch's runs, the window permutation, resume inside a window."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ingest.core.assign import CARRY, MAIN, Span
from ingest.core.book import EpochBook
from ingest.core.ledger import Ledger, StepRecord, _entries, pack_base, runs_of, runs_of_entry
from ingest.core.plan import _GOLDEN, hash64, permutation, permutations
from ingest.core.state import StreamState
from ingest.engine.feed import Feed, Ready, Tail
from ingest.engine.options import Shuffle
from ingest.engine.spec import StreamSpec
from ingest.engine.window import Origin
from ingest.formats.base import ReadOptions, RowBatch
from ingest.planner.catalog import Listing
from ingest.testing import Store, make_table, write_dataset

SHARDS, ROWS = 6, 700


@pytest.fixture
def url(local: Store) -> str:
    write_dataset(local.fs, local.url("d"), "parquet", SHARDS, ROWS, row_group_rows=128)
    return local.url("d")


def make_spec(url: str, seed: int | None, window: int, lanes: int, batch: int) -> StreamSpec:
    return StreamSpec(
        urls=(url,),
        columns=("id",),
        batch_size=batch,
        read=ReadOptions(prefetch=0, batch_rows=100),
        shuffle=Shuffle(seed=seed, window=window, lanes=lanes),
    )


def merged_runs(rows: list[tuple[int, int, int]]) -> list[list[int]]:
    """``(segment, shard, row)`` triples as sorted runs of consecutive rows, plainly."""
    out: list[list[int]] = []
    for segment, shard, row in sorted(rows):
        if out and out[-1][:2] == [segment, shard] and out[-1][3] == row:
            out[-1][3] += 1
        else:
            out.append([segment, shard, row, row + 1])
    return out


def rows_of(book: EpochBook[Listing], epoch: int, ids: list[int]) -> list[tuple[int, int, int]]:
    """The ``(MAIN, shard, row)`` of each id (shard ``n`` holds ids ``n * ROWS ..``)."""
    urls = [s.url for s in book.plan(epoch).listing.shards]
    index = {int(u.rsplit("-", 1)[1].split(".")[0]): i for i, u in enumerate(urls)}
    return [(MAIN, index[i // ROWS], i % ROWS) for i in ids]


def run(book: EpochBook[Listing], spec: StreamSpec, rank: int) -> list[Ready | Tail]:
    return list(Feed(book.rank_plan(rank, 0), spec.feed_config(), spec.source()))


@pytest.mark.parametrize("seed", [None, 0])
@pytest.mark.parametrize(
    ("window", "lanes", "batch"),
    [(1024, 4, 128), (300, 3, 128), (1000, 6, 97)],
    ids=["aligned", "batches-straddle-windows", "uneven"],
)
@pytest.mark.parametrize("world_size", [1, 2])
def test_runs_describe_exactly_the_rows_of_each_batch(
    url: str, seed: int | None, window: int, lanes: int, batch: int, world_size: int
) -> None:
    spec = make_spec(url, seed, window, lanes, batch)
    book = spec.book(world_size)
    delivered: list[int] = []
    for rank in range(world_size):
        items = run(book, spec, rank)
        for item in items[:-1]:
            assert isinstance(item, Ready)
            ids = item.table.column("id").to_pylist()
            assert len(ids) == batch
            assert runs_of_entry(item.runs).tolist() == merged_runs(rows_of(book, 0, ids))
            delivered += ids
        tail = items[-1]
        assert isinstance(tail, Tail)
        assert tail.steps == len(items) - 1
        assert not len(tail.leftover)  # row counts known: the plan holds back the remainder
    remainder = book.plan(0).assignment.remainder_rows
    assert len(delivered) == len(set(delivered)) == SHARDS * ROWS - remainder


@pytest.mark.parametrize(("window", "batch", "stop_after"), [(1024, 128, 5), (300, 128, 3)])
def test_resume_inside_a_window_continues_with_the_same_batches(
    url: str, window: int, batch: int, stop_after: int
) -> None:
    """Stopped after a batch that leaves part of its window unread: the restored feed
    rebuilds that window without the consumed rows and yields the rest unchanged."""
    spec = make_spec(url, 5, window, 3, batch)
    book = spec.book(1)
    full = [i for i in run(book, spec, 0) if isinstance(i, Ready)]
    head = full[:stop_after]
    book.ack(0, [StepRecord(i.step, i.runs) for i in head], head[-1].cursor)
    state = json.loads(json.dumps(book.snapshot(head[-1].step).to_json()))
    restored = spec.book(1)
    restored.load(StreamState.from_json(state))
    plan = restored.rank_plan(0, 0)
    assert any(plan.skip), "the cursor's window holds consumed rows"
    rest = [i for i in Feed(plan, spec.feed_config(), spec.source()) if isinstance(i, Ready)]
    assert [i.step for i in rest] == [i.step for i in full[stop_after:]]
    for got, want in zip(rest, full[stop_after:], strict=True):
        assert got.table.column("id").to_pylist() == want.table.column("id").to_pylist()
        assert runs_of_entry(got.runs).tolist() == runs_of_entry(want.runs).tolist()


@pytest.mark.parametrize("seed", [None, 5])
@pytest.mark.parametrize(
    ("window_bytes", "prefetch_bytes"),
    [(4, None), (None, 1), (4, 1)],
    ids=["gathered-per-batch", "read-ahead-of-one-item", "both"],
)
def test_byte_bounds_that_do_not_change_the_order_keep_every_batch(
    url: str, seed: int | None, window_bytes: int | None, prefetch_bytes: int | None
) -> None:
    """Gathering each batch from the window's record batches (windows of large rows) and a
    read-ahead bounded in bytes (``prefetch_bytes``: one record batch ahead here) give the
    very batches, runs and cursors of one gather per window and a read-ahead in batches."""
    spec = make_spec(url, seed, 300, 3, 128)
    book = spec.book(1)
    want = run(book, spec, 0)
    read = dataclasses.replace(spec.read, prefetch=2, prefetch_bytes=prefetch_bytes)
    config = dataclasses.replace(spec.feed_config(), window_bytes=window_bytes, read=read)
    got = list(Feed(book.rank_plan(0, 0), config, spec.source()))
    assert len(got) == len(want)
    for a, b in zip(got[:-1], want[:-1], strict=True):
        assert isinstance(a, Ready) and isinstance(b, Ready)
        assert a.table.equals(b.table)
        assert np.array_equal(a.runs, b.runs)
        assert a.cursor == b.cursor
        assert (a.closed is None) == (b.closed is None)


def row_set(parts: tuple[np.ndarray, ...]) -> set[tuple[int, int, int]]:
    return {(s, h, r) for p in parts for s, h, a, b in p.tolist() for r in range(a, b)}


def without_windows(records: list[StepRecord]) -> list[StepRecord]:
    return [dataclasses.replace(r, closed=None) for r in records]


@pytest.mark.parametrize("seed", [None, 0])
@pytest.mark.parametrize(
    ("window", "lanes", "batch"),
    [(1024, 4, 128), (300, 3, 128), (1000, 6, 97), (128, 2, 300)],
    ids=["aligned", "batches-straddle-windows", "uneven", "batches-span-windows"],
)
def test_a_fold_by_windows_holds_the_rows_of_every_step(
    url: str, seed: int | None, window: int, lanes: int, batch: int
) -> None:
    """The rows of steps ``first..last`` merged from the windows the steps finished
    (:class:`ingest.core.ledger.Closed`) hold every row of those steps, and besides them only
    rows of the steps before (folded already): for every range. From the first step they
    equal the rows merged from every step's own rows. On a window's edge the fold sorts no
    packed row."""
    spec = make_spec(url, seed, window, lanes, batch)
    book = spec.book(2)
    per_rank = [[i for i in run(book, spec, rank) if isinstance(i, Ready)] for rank in (0, 1)]
    windowed, plain = Ledger(2, 0), Ledger(2, 0)
    for rank, items in enumerate(per_rank):
        records = [StepRecord(i.step, i.runs, closed=i.closed) for i in items]
        assert all(r.closed is not None for r in records)
        windowed.ack(rank, records)
        plain.ack(rank, without_windows(records))
    steps = min(len(items) for items in per_rank)
    assert steps > 3
    for first in range(steps):
        for last in range(first, steps):
            got = row_set(windowed.runs_by_rank(first, last))
            assert row_set(plain.runs_by_rank(first, last)) <= got, (first, last)
            assert got <= row_set(plain.runs_by_rank(0, last)), (first, last)
            if first == 0:
                got_runs = [g.tolist() for g in windowed.runs_by_rank(first, last)]
                assert got_runs == [w.tolist() for w in plain.runs_by_rank(first, last)]
    on_edge = [
        s for s in range(steps) if all(len(c[s].runs) and not c[s].open for c in windowed._closed)
    ]
    for s in range(steps):
        assert windowed.edge(0, s) == max([e for e in on_edge if e <= s], default=s)
    if seed is None and window % batch == 0:  # one lane: windows end on the same steps
        per_window = window // batch
        assert on_edge == [s for s in range(steps) if (s + 1) % per_window == 0]
    for last in on_edge:
        for rank in (0, 1):
            parts = _entries(windowed._records[rank], windowed._closed[rank], 0, last)
            assert all(p.ndim == 2 for p in parts), "a packed row left to sort on an edge"


@pytest.mark.parametrize(("window", "batch", "stop_after"), [(1024, 128, 5), (300, 128, 3)])
def test_a_fold_by_windows_after_a_resume_inside_a_window(
    url: str, window: int, batch: int, stop_after: int
) -> None:
    """A window rebuilt on resume leaves out rows consumed before; its runs still hold them.
    Added to the progress again they change nothing: every state after the resume equals
    the one made from every step's own rows."""
    spec = make_spec(url, 5, window, 3, batch)
    book = spec.book(1)
    full = [i for i in run(book, spec, 0) if isinstance(i, Ready)]
    head = full[:stop_after]
    book.ack(0, [StepRecord(i.step, i.runs) for i in head], head[-1].cursor)
    state = StreamState.from_json(json.loads(json.dumps(book.snapshot(head[-1].step).to_json())))
    books = [spec.book(1), spec.book(1)]
    for b in books:
        b.load(state)
    rest = [i for i in Feed(books[0].rank_plan(0, 0), spec.feed_config(), spec.source())]
    records = [StepRecord(i.step, i.runs, closed=i.closed) for i in rest if isinstance(i, Ready)]
    books[0].ack(0, records)
    books[1].ack(0, without_windows(records))
    for record in records:
        got, want = (b.snapshot(record.step).to_json() for b in books)
        assert got == want, record.step
    total = books[0].snapshot(records[-2].step).progress  # the last: the epoch's end
    assert total.delivered == total.consumed.count() == (len(full) - 1) * batch


def test_runs_of_carried_and_adjacent_pieces() -> None:
    """Pieces of one shard that touch merge into one run; the same rows in the carried
    segment stay apart; a batch is any subset of the window."""
    data = pa.record_batch({"x": pa.array(np.zeros(50, dtype=np.int64))})
    pieces = [
        (Span(3, 0, 100, MAIN), RowBatch(20, data.slice(0, 10))),
        (Span(3, 0, 100, CARRY), RowBatch(20, data.slice(0, 10))),
        (Span(1, 0, 100, MAIN), RowBatch(0, data.slice(0, 7))),
        (Span(3, 0, 100, MAIN), RowBatch(10, data.slice(0, 10))),
        (Span(3, 0, 100, MAIN), RowBatch(31, data.slice(0, 5))),
        (Span(1, 0, 100, MAIN), RowBatch(7, data.slice(0, 0))),
        (Span(2, 0, 100, MAIN), RowBatch(0, data.slice(0, 4))),
    ]
    origin, keys = Origin.of(pieces)
    located = origin.locate(keys)
    triples = [
        (span.segment, span.shard, batch.row + i)
        for span, batch in pieces
        for i in range(batch.data.num_rows)
    ]
    assert list(zip(*(c.tolist() for c in located), strict=True)) == triples
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 20, len(keys)):
        for _ in range(20):
            pick = rng.choice(len(keys), size=size, replace=False)
            segments, shards, rows = (c[pick] for c in located)
            want = runs_of(segments.astype(np.int8), shards.astype(np.int32), rows)
            assert origin.runs(keys[pick]).tolist() == want.tolist()
            assert want.tolist() == merged_runs([triples[i] for i in pick])
            packed = origin.packed(keys[pick])
            assert packed is not None and runs_of_entry(packed).tolist() == want.tolist()


def test_rows_beyond_the_packed_range_are_acked_as_runs() -> None:
    """Shards or rows past 2**31 - 1 do not pack: the batch's provenance stays runs."""
    data = make_table(0, 10).to_batches()[0]
    big = (1 << 31) - 1
    for span, row in [(Span(big, 0, big + 20, MAIN), 0), (Span(2, big, big + 20, MAIN), big)]:
        origin, keys = Origin.of([(span, RowBatch(row, data))])
        assert origin.packed(keys) is None
        assert origin.runs(keys).tolist() == [[MAIN, span.shard, row, row + 10]]
    one = np.array([0], dtype=np.int64)
    assert pack_base(one + 2, one, one, 5) is None  # a segment that is not 0 or 1


def splitmix_keys(n: int, base: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) * _GOLDEN + np.uint64(base)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def reference_permutation(n: int, base: int) -> list[int]:
    """The window order as first written: a stable argsort of the splitmix64 keys."""
    order: list[int] = np.argsort(splitmix_keys(n, base), kind="stable").tolist()
    return order


def test_window_permutations_keep_their_values() -> None:
    # Pinned from the first implementation (a stable argsort of the whole keys).
    assert permutation(12, "window", 0, 0, 0, 0).tolist() == [4, 11, 2, 3, 9, 1, 7, 0, 8, 6, 5, 10]
    assert permutation(12, "window", 7, 3, 1, 5).tolist() == [0, 9, 3, 2, 1, 7, 11, 6, 4, 8, 10, 5]
    bases = np.array([1, 2**63 + 5], dtype=np.uint64)
    assert permutations(6, bases).tolist() == [[0, 5, 4, 1, 2, 3], [2, 4, 3, 0, 1, 5]]
    for n in (0, 1, 2, 3, 1000, 16_384, 16_385):
        for key in range(3):
            base = hash64("window", n, key)
            assert permutation(n, "window", n, key).tolist() == reference_permutation(n, base)


def test_window_permutation_with_keys_that_share_their_high_bits() -> None:
    """Two of these 2**20 keys share their top 44 bits, which the fast sort cannot tell
    apart: the order still follows the whole keys."""
    n, base = 1 << 20, hash64("tie", 3)
    high = np.sort(splitmix_keys(n, base) >> np.uint64(20))
    assert (high[1:] == high[:-1]).any()
    assert permutation(n, "tie", 3).tolist() == reference_permutation(n, base)


def _lane_plan(spans: list[Span], blocks: tuple[int, ...] | None, rows: int | None) -> Any:
    """A plan of ``spans`` over one shard of ``rows`` rows and ``blocks``."""
    from types import SimpleNamespace

    from ingest.core.share import FeedPlan

    listing = SimpleNamespace(infos=[SimpleNamespace(rows=rows, blocks=blocks)])
    return FeedPlan(0, 0, 0, None, tuple(spans), ({}, {}), None, listing)


def test_the_rest_of_a_unit_consumed_in_part_leads_a_lane() -> None:
    """Spans of one row group with rows consumed between them (a re-shared window's rest)
    are a rest; one span per unit (a fresh share, cut at most at its ends), carried rows or
    a unit whose rows are unknown are not."""
    from ingest.engine.lanes import unit_rest

    blocks, rows = (0, 100, 200, 300), 400
    rest = [Span(0, 210, 212), Span(0, 215, 230), Span(0, 290, 300), Span(0, 0, 100)]
    plan = _lane_plan(rest, blocks, rows)
    assert unit_rest(plan, [0, 1, 2, 3]) == 2 + 15 + 10
    assert unit_rest(plan, [3, 0]) is None  # a whole unit first
    assert unit_rest(plan, [2, 3]) is None  # one span of its unit: a share's cut end
    cut = [Span(0, 150, 200), Span(0, 300, 400)]
    assert unit_rest(_lane_plan(cut, blocks, rows), [0, 1]) is None
    carried = [Span(0, 210, 212, CARRY), Span(0, 215, 230, CARRY)]
    assert unit_rest(_lane_plan(carried, blocks, rows), [0, 1]) is None
    # no blocks: the shard is one unit; its rest is every span of it at the lane's head
    whole = [Span(0, 10, 20), Span(0, 30, 400)]
    assert unit_rest(_lane_plan(whole, None, rows), [0, 1]) == 380
    assert unit_rest(_lane_plan([Span(0, 10, 20), Span(0, 30, 1 << 62)], None, None), [0, 1]) == (
        10 + (1 << 62) - 30
    )


def test_every_lane_starts_reading_at_once(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window takes rows from each lane in turn, and a lane was opened when first taken:
    its thread began reading then, and the window waited for its first read before the
    next lane's thread began. Over a store 50 ms away, a first window of 20 shards on 16
    lanes sent its 21 requests one after another (2.1 s to the first batch, the whole epoch
    of rows fitting one window). Now every lane is opened as the window begins, and their
    first reads go side by side (0.3 s): here each lane's first read waits until every
    lane's has begun (a barrier; one after another, the first waits alone and fails), and
    the epoch still has every row once."""
    import threading
    from collections import Counter

    import pyarrow.parquet as pq

    import ingest
    from ingest.engine.lanes import LaneReader

    for k in range(4):
        table = pa.table({"id": list(range(k * 50, k * 50 + 50))})
        pq.write_table(table, tmp_path / f"{k}.parquet")
    barrier = threading.Barrier(4, timeout=20)
    read_ranges = LaneReader._read_ranges
    first: set[int] = set()

    def side_by_side(self: LaneReader, ctx: Any, shard: int, *args: Any) -> Any:
        if shard not in first:
            first.add(shard)
            barrier.wait()  # every lane's first read has begun
        yield from read_ranges(self, ctx, shard, *args)

    monkeypatch.setattr(LaneReader, "_read_ranges", side_by_side)
    stream = ingest.Stream(str(tmp_path), batch_size=16, shuffle_seed=0, shuffle_lanes=4)
    ids = Counter(i for batch in stream for i in batch["id"].tolist())
    assert len(first) == 4
    carried = 200 % 16
    assert len(ids) == 200 - carried and set(ids.values()) == {1}


@pytest.mark.parametrize(("fit", "opened"), [(2, 2), (0, 1), (None, 4)])
def test_lanes_start_side_by_side_within_the_read_ahead_budget(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, fit: int | None, opened: int
) -> None:
    """Lanes read side by side hold their first reads at once, each decoded (twice over)
    at once: a first window of 8 lanes of 64 MiB row groups peaked at 1.5 GiB where one
    lane at a time held 0.6 (``test_memory``). So lanes start together only while three
    times their first reads' bytes fit ``ReadOptions.prefetch_bytes``: here a budget of
    ``fit`` lanes opens that many as the first window begins (the first lane whatever its
    size; no budget: all), the others when taken, and the rows are the same."""
    import pyarrow.parquet as pq

    import ingest
    from ingest.engine.lanes import LaneReader

    for k in range(4):
        pq.write_table(
            pa.table({"id": list(range(k * 50, k * 50 + 50))}), tmp_path / f"{k}.parquet"
        )
    sizes = {p.stat().st_size for p in tmp_path.iterdir()}
    budget = None if fit is None else 3 * max(sizes) * fit + 1
    started: list[int] = []
    start = LaneReader.start

    def counted(self: LaneReader, lanes: Any) -> None:
        start(self, lanes)
        started.append(sum(lane.reader is not None for lane in lanes))

    monkeypatch.setattr(LaneReader, "start", counted)
    read = ingest.ReadOptions(prefetch_bytes=budget)
    stream = ingest.Stream(str(tmp_path), batch_size=16, shuffle_seed=0, shuffle_lanes=4, read=read)
    ids = sorted(i for batch in stream for i in batch["id"].tolist())
    assert started[0] == opened
    monkeypatch.setattr(LaneReader, "start", start)
    alone = ingest.Stream(str(tmp_path), batch_size=16, shuffle_seed=0, shuffle_lanes=4, read=read)
    assert ids == sorted(i for batch in alone for i in batch["id"].tolist())
