"""A feed's lanes: each reads its spans shard by shard through the formats.

The rank's spans are grouped by shard and the groups dealt round-robin to the lanes
(:func:`make_lanes`, the dealing of :func:`ingest.core.assign.deal_lanes`). A lane opens each
of its shards once and reads the spans of that shard in order (:class:`LaneReader`), in a
:class:`~ingest.engine.prefetch.Prefetcher` thread within its share of
``ReadOptions.prefetch_bytes`` when ``ReadOptions.prefetch`` is above 0. A node's cached copy
that fails to read is dropped and read once more from a fresh fetch. Under
``on_error="skip"`` what cannot be read becomes holes (:class:`~ingest.engine.window.Hole`)
and quarantine records. The feed (:mod:`ingest.engine.feed`) takes rows from the lanes into
its windows with :meth:`LaneReader.take`.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from ingest.core.assign import MAIN, TO_END, Span
from ingest.core.errors import IngestError, ShardError, StoreError
from ingest.core.plan import unit_of
from ingest.core.quarantine import Quarantine, skippable
from ingest.core.share import FeedPlan
from ingest.engine.derived.reading import Deriving
from ingest.engine.derived.reading import Read as DerivedRead
from ingest.engine.prefetch import Prefetcher
from ingest.engine.window import (
    Hole,
    Lane,
    Piece,
    SpanEnd,
    head_of,
    piece_at,
    piece_rows,
    read_bytes,
    read_whole,
    rest_of,
)
from ingest.formats import open_reader
from ingest.formats.base import BadRows, Gathered, ReadContext, ReadOptions, RowBatch, Seek
from ingest.planner.catalog import Listing
from ingest.storage.sources import Source

Read = tuple[int, Piece] | SpanEnd
"""What a lane's reader yields: ``(lane span index, piece)``, or the end of a span read to
the end of its shard (the shard's row count, learnt)."""

_BUNDLE_READS = 256
_BUNDLE_BYTES = 256 << 10
"""A lane's thread hands its small reads of one shard over in bundles of up to this many
reads or bytes. The rest of a window after a resume is hundreds of spans a few rows long,
each its own piece: one queue handoff each between the lane's thread and the feed's took 2
of the 3.4 s to a resumed first batch (6,164 pieces, the two threads taking the GIL in
turn). A read of more than :data:`_ALONE_BYTES` (a record batch of a fresh epoch) goes
alone, so that the lane's byte bound, which always lets one item through, is overshot by
one bundle at most. A bundle ends with its shard: one that went on into the next shards held
back the rows read until dozens of small shards were opened (a shuffled first batch over
1,000 JSON Lines shards of 100 rows waited for 983 of them), and ``prefetch`` bundles ahead
were that many times more shards."""
_ALONE_BYTES = 64 << 10


def bundled(shards: Iterator[Iterator[Read]]) -> Iterator[list[Read]]:
    """The reads of each of ``shards`` (a shard's reads each) in lists: up to
    :data:`_BUNDLE_READS` small reads or :data:`_BUNDLE_BYTES` of one shard together, a read
    of more than :data:`_ALONE_BYTES` on its own; a shard's last list before the next shard
    is opened."""
    for reads in shards:
        bundle: list[Read] = []
        size = 0
        with _closing(reads):
            for read in reads:
                n = read_bytes(read)
                if n > _ALONE_BYTES:
                    if bundle:
                        yield bundle
                        bundle, size = [], 0
                    yield [read]
                    continue
                bundle.append(read)
                size += n
                if size >= _BUNDLE_BYTES or len(bundle) >= _BUNDLE_READS:
                    yield bundle
                    bundle, size = [], 0
        if bundle:
            yield bundle


def flat(shards: Iterator[Iterator[Read]]) -> Iterator[Read]:
    """The reads of each of ``shards`` one after another (a lane read in the feed's
    thread)."""
    for reads in shards:
        with _closing(reads):
            yield from reads


@contextlib.contextmanager
def _closing(reads: Iterator[Read]) -> Iterator[None]:
    """Closes ``reads`` (a shard's, open) on leaving: a lane closed mid-shard closes it."""
    try:
        yield
    finally:
        close = getattr(reads, "close", None)
        if close is not None:
            close()


class Unbundled:
    """A lane's reads one at a time again, from its thread's bundles (:func:`bundled`)."""

    def __init__(self, bundles: Prefetcher[list[Read]]) -> None:
        self._bundles = bundles
        self._reads: deque[Read] = deque()

    def __iter__(self) -> Unbundled:
        return self

    def __next__(self) -> Read:
        while not self._reads:
            self._reads.extend(next(self._bundles))
        return self._reads.popleft()

    @property
    def held_bytes(self) -> int:
        """Bytes read ahead: in the thread's queue and taken from it, not handed out yet."""
        return self._bundles.held_bytes + sum(map(read_bytes, self._reads))

    def close(self) -> None:
        self._bundles.close()
        self._reads.clear()


def make_lanes(plan: FeedPlan[Listing], count: int) -> list[Lane]:
    """The lanes of ``plan``'s spans: up to ``count`` of them (1 without a shuffle), each
    placed where the plan's cursor says, or at its first span.

    Raises:
        IngestError: If the cursor was saved with another number of lanes.
    """
    spans = plan.spans
    groups: list[list[int]] = []
    for n, span in enumerate(spans):
        if groups and spans[groups[-1][-1]].shard == span.shard:
            groups[-1].append(n)
        else:
            groups.append([n])
    count = max(1, min(count, len(groups)))
    lanes = [Lane([]) for _ in range(count)]
    for g, group in enumerate(groups):
        lanes[g % count].spans.extend(group)
    cursor = plan.cursor
    saved = cursor.get("lanes") if cursor else None
    if saved is not None and len(saved) != count:
        raise IngestError(
            f"the saved position of rank {plan.rank} has {len(saved)} lane(s), this "
            f"plan has {count}; resume with the shuffle settings the state was saved with"
        )
    for n, lane in enumerate(lanes):
        if saved is None:
            lane.at = (0, spans[lane.spans[0]].start, None) if lane.spans else None
        elif saved[n] is None:
            lane.at = None
        else:
            k, row, seek_row, seek_cursor = saved[n]
            seek = None if seek_row is None else (int(seek_row), int(seek_cursor))
            lane.at = (int(k), int(row), seek)
    return lanes


def unit_rest(plan: FeedPlan[Listing], lane: Sequence[int]) -> int | None:
    """The rows of the rest of a unit that ``lane`` (indices into ``plan.spans``) begins
    with, if the unit was consumed in part inside it; else None.

    A share cut anew from a state taken inside shuffle windows (another world size, another
    transport) begins each lane with what the windows left of their units: a few hundred
    rows, hundreds of spans between the rows consumed. Two spans or more of one unit at the
    head of a lane are such a rest: a share cut from the whole epoch has one span per unit
    (cut at most at a share's ends), and a share that resumes in the original order keeps
    its spans whole (the rows consumed are left out by ``skip``). A rest that lies in one
    row group and the lane's next unit lie in two: :meth:`ingest.engine.feed.Feed._first`
    gives the first window the rest alone, so that a resume's first batch decodes no more
    row groups than a fresh one's (issue 32: 16 against 8, 1.16x a fresh first batch)."""
    if len(lane) < 2:
        return None
    spans, infos = plan.spans, plan.listing.infos
    first = spans[lane[0]]
    if first.segment != MAIN:
        return None
    info = infos[first.shard]
    start, stop = unit_of(info.rows, info.blocks, first.start)
    end = TO_END if stop is None else stop
    rows = count = 0
    for k in lane:
        span = spans[k]
        if span.shard != first.shard or span.segment != MAIN:
            break
        if span.start < start or span.stop > end:
            break
        rows += span.stop - span.start
        count += 1
    return rows if count > 1 else None


@dataclass(frozen=True, slots=True)
class _Failed:
    """A span of a run that failed to read under ``on_error="skip"``: the error, the span's
    index in the run, and the spans of the run that had failed before it."""

    error: Exception
    at: int
    failures: int


_FAILED_SPANS = 8
"""Spans of one run that may fail under ``on_error="skip"`` before the rest of the run is
quarantined without being tried (a shard broken through fails each span in turn)."""


class LaneReader:
    """Reads the lanes of one feed: opens their shards, retries a damaged cached copy, turns
    what cannot be read into holes, and hands out rows a window at a time (:meth:`take`).

    Args:
        plan: The rank's share (its spans and listing).
        source: Opens shards.
        read: Read options (prefetch, timeouts, ``on_error``).
        columns: Columns to read, or None.
        quarantine: Where the feed records what ``on_error="skip"`` skipped.
        lane_bytes: Each lane's share of ``ReadOptions.prefetch_bytes`` (None: no bound).
    """

    def __init__(
        self,
        plan: FeedPlan[Listing],
        source: Source,
        read: ReadOptions,
        columns: tuple[str, ...] | None,
        quarantine: Quarantine,
        lane_bytes: int | None,
    ) -> None:
        self.plan = plan
        self.source = source
        self.read = read
        self.columns = columns
        self.quarantine = quarantine
        self.lane_bytes = lane_bytes
        self.learned: dict[int, int] = {}
        """Row counts of shards read to their end (those the listing did not know)."""
        self._skip = read.on_error == "skip"
        self.depth = read.prefetch
        """Record batches each lane reads ahead in its own thread (0: in the caller's)."""
        self.deriving: Deriving | None = None
        """The feed's derived cache, if it has one (set by the feed)."""

    def take(self, lane: Lane, want: int) -> list[tuple[Span, Piece]]:
        """Up to ``want`` rows (holes included) from ``lane``, advancing its position."""
        out: list[tuple[Span, Piece]] = []
        spans = self.plan.spans
        while want > 0 and lane.at is not None:
            if lane.pending is None:
                if lane.reader is None:
                    lane.reader = self._open(lane)
                item = next(lane.reader, None)
                if item is None:
                    lane.at = None
                    break
                if isinstance(item, SpanEnd):
                    self.learned[item.shard] = item.rows
                    continue
                lane.pending = item
            k, batch = lane.pending
            size = piece_rows(batch)
            n = min(want, size)
            out.append((spans[lane.spans[k]], head_of(batch, n)))
            want -= n
            if n == size:
                lane.pending = None
                lane.at = (*piece_at(batch, k), batch.seek)
            else:
                rest = rest_of(batch, n)
                k = int(rest.spans[0]) if isinstance(rest, Gathered) else k
                lane.pending = (k, rest)
                lane.at = (k, rest.row, batch.seek)
        return out

    def start(self, lanes: Sequence[Lane]) -> None:
        """Open the lanes not open yet, side by side, while their first reads fit the
        read-ahead budget: each one's thread starts reading now. A window takes from each
        lane in turn, and a lane was opened when taken, after the last one's first read
        came: over a store 50 ms away, a first window of 20 small shards on 16 lanes sent
        its 21 requests one after another (2.1 s to the first batch; 0.3 s side by side).

        A read is held while it is decoded, and twice over (its pages as read and
        decompressed): lanes read side by side only while three times their first reads'
        bytes (a row group, or a whole shard where its blocks are not known) add up to at
        most ``ReadOptions.prefetch_bytes`` (None: every lane), so large row groups are
        still decoded one lane at a time, within docs/reference.md#memory; the first lane
        opens whatever its size (a window takes it first). The others open when taken, as
        before. Without read-ahead threads (``depth`` 0) every lane opens when taken."""
        if not self.depth:
            return
        budget = self.read.prefetch_bytes
        spent = 0
        for lane in lanes:
            if lane.reader is not None or lane.pending is not None or lane.at is None:
                continue
            cost = 3 * self._first_read_bytes(lane)
            if budget is not None and spent and spent + cost > budget:
                return
            lane.reader = self._open(lane)
            spent += cost

    def _first_read_bytes(self, lane: Lane) -> int:
        """About the bytes of ``lane``'s next read: its shard's size over its blocks."""
        assert lane.at is not None
        shard = self.plan.spans[lane.spans[lane.at[0]]].shard
        listing = self.plan.listing
        blocks = listing.infos[shard].blocks
        return listing.shards[shard].size // max(1, len(blocks or ()))

    def _open(self, lane: Lane) -> Iterator[Read]:
        assert lane.at is not None
        k, row, seek = lane.at
        depth = self.depth
        if not depth:
            return flat(self._read_lane(lane.spans, k, row, seek))
        return Unbundled(
            Prefetcher(
                lambda: bundled(self._read_lane(lane.spans, k, row, seek)),
                depth,
                self.read.timeout_s,
                f"shards of {self.source.urls[0]}",
                max_bytes=self.lane_bytes,
                size=lambda bundle: sum(map(read_bytes, bundle)),
            )
        )

    def _read_lane(
        self, lane: list[int], k: int, row: int, seek: Seek | None
    ) -> Iterator[Iterator[Read]]:
        """Batches of the lane's spans from span ``k``, row ``row``, a shard's at a time (an
        iterator of each shard's reads, the shard opened once).

        With a derived cache (:attr:`deriving`), each span read whole (from its first row,
        no seek) comes from its copy or becomes one, and every row is handed out as a ref
        (:mod:`ingest.engine.derived.reading`)."""
        spans = self.plan.spans
        while k < len(lane):
            shard = spans[lane[k]].shard
            run: list[int] = []
            while k < len(lane) and spans[lane[k]].shard == shard:
                run.append(k)
                k += 1
            ranges: list[tuple[int, int | None]] = [
                (
                    spans[lane[j]].start,
                    None if spans[lane[j]].stop == TO_END else spans[lane[j]].stop,
                )
                for j in run
            ]
            first = ranges[0]
            whole = [True] * len(run)
            whole[0] = row <= first[0] and seek is None
            ranges[0] = (max(first[0], row), first[1])
            ctx = self.plan.listing.context(shard, self.source, self.read, self.columns)
            if self.deriving is None:
                # The rows of many spans in one batch come gathered (one piece), where they
                # are all of one segment: a piece's origin is that of its first span.
                segment = spans[lane[run[0]]].segment
                together = all(spans[lane[j]].segment == segment for j in run)
                yield self._read_ranges(ctx, shard, run, ranges, seek, together)
            else:
                read = functools.partial(self._read_some, ctx, shard, run[0], seek)
                yield self.deriving.reads(ctx, shard, run, ranges, whole, read)
            row, seek = 0, None

    def _read_some(
        self,
        ctx: ReadContext,
        shard: int,
        first: int,
        seek: Seek | None,
        run: list[int],
        ranges: list[tuple[int, int | None]],
    ) -> Iterator[DerivedRead]:
        """:meth:`_read_ranges` of the ranges of a run a derived cache did not have; the
        run's ``seek`` goes with its ``first`` span only. Each span's rows come apart (not
        gathered): the cache keeps a span's outputs by its rows."""
        first_seek = seek if run[:1] == [first] else None
        reads = self._read_ranges(ctx, shard, run, ranges, first_seek, together=False)
        return cast(Iterator[DerivedRead], reads)

    def _read_ranges(
        self,
        ctx: ReadContext,
        shard: int,
        run: list[int],
        ranges: list[tuple[int, int | None]],
        seek: Seek | None,
        together: bool,
        failures: int = 0,
    ) -> Iterator[Read]:
        """Batches of one shard's ``ranges`` (lane spans ``run``), the shard opened once;
        what cannot be read as holes under ``on_error="skip"``: a span from where it
        failed, the others read on (``failures``: spans of the run that failed already; past
        :data:`_FAILED_SPANS`, the rest of the run is given up). ``together``: the rows of
        several spans in one batch come as one :class:`~ingest.formats.base.Gathered` (after
        a failure, read again one by one: :meth:`_failed`)."""
        last = [start for start, _ in ranges]
        at = 0
        try:
            for index, batch in self._read_run(ctx, ranges, seek, last, together):
                at = index
                if isinstance(batch, Gathered):
                    for i, end in batch.ends():
                        last[i] = end
                    yield run[index], batch.renumbered(run)
                    continue
                if isinstance(batch, BadRows):  # on_error="skip": just these rows
                    n = int(batch.data.num_rows)
                    self.quarantine.add(
                        batch.error or ValueError("unreadable rows"),
                        url=ctx.shard.url,
                        start=batch.row,
                        stop=batch.stop,
                        rows=n,
                    )
                    yield run[index], Hole(batch.row, n)
                elif batch.data.num_rows:
                    yield run[index], batch
                last[index] = batch.stop
        except Exception as e:
            if not (self._skip and skippable(e)):
                raise
            failed = _Failed(e, at, failures)
            yield from self._failed(failed, ctx, shard, run, ranges, last, together)
            return
        for index, (_, stop) in enumerate(ranges):
            if stop is None:
                yield SpanEnd(run[index], shard, last[index])

    def _failed(
        self,
        failed: _Failed,
        ctx: ReadContext,
        shard: int,
        run: list[int],
        ranges: list[tuple[int, int | None]],
        last: list[int],
        together: bool,
    ) -> Iterator[Read]:
        """The run's reads after ``failed`` (:meth:`_read_ranges`): the span being read loses
        its rows from where the error came, and the run's other spans (its shuffled blocks,
        which may lie in good row groups) are read, the shard opened again; they were all
        quarantined, good row groups with them. Spans read together (a batch of several) are
        read again one by one from where each got to, so that the one that fails is known.
        An error that names no row (the shard vanished, its footer is unreadable), or past
        :data:`_FAILED_SPANS`, loses the rest of the run with it."""
        url, at = ctx.shard.url, failed.at
        local = getattr(failed.error, "row", None) is not None  # (a vanished shard: none)
        if not local or failed.failures >= _FAILED_SPANS:
            yield from self._holes(failed.error, url, shard, run, ranges, last, at)
            return
        if together:
            todo = [i for i in range(len(ranges)) if not read_whole(ranges[i], last[i])]
            spans = [(last[i], ranges[i][1]) for i in todo]
            runs = [run[i] for i in todo]
            yield from self._read_ranges(ctx, shard, runs, spans, None, False, failed.failures + 1)
            return
        yield from self._holes(failed.error, url, shard, run[: at + 1], ranges[: at + 1], last, at)
        if at + 1 < len(ranges):
            rest = (run[at + 1 :], ranges[at + 1 :])
            yield from self._read_ranges(ctx, shard, *rest, None, together, failed.failures + 1)

    def _read_run(
        self,
        ctx: ReadContext,
        ranges: list[tuple[int, int | None]],
        seek: Seek | None,
        last: list[int],
        together: bool,
    ) -> Iterator[tuple[int, RowBatch | Gathered]]:
        """``(index in ranges, batch)`` of one shard's ranges, read in order.

        A node's cached copy of the shard that fails to read (a :class:`ShardError`, or bad
        rows under ``on_error="skip"``) may be damaged rather than the shard: the copy is
        dropped and the ranges are read again once from a fresh fetch, from where ``last``
        (kept by the caller) says each one got to; a second failure is the shard's.
        """
        again = False
        at = 0
        todo = list(range(len(ranges)))
        while True:
            with open_reader(ctx) as reader:
                spans = [(last[i], ranges[i][1]) for i in todo]
                read = reader.read_gathered if together else reader.read_spans
                try:
                    for j, batch in read(spans, seek):
                        at = todo[j]
                        damaged = isinstance(batch, BadRows)
                        if damaged and not again and self.source.drop_cached(ctx.shard):
                            break
                        yield at, batch.renumbered(todo) if isinstance(batch, Gathered) else batch
                    else:
                        return
                except ShardError as e:
                    if again or isinstance(e, StoreError) or not self.source.drop_cached(ctx.shard):
                        raise
            again, seek = True, None
            todo = [i for i in range(at, len(ranges)) if not read_whole(ranges[i], last[i])]

    def _holes(
        self,
        error: Exception,
        url: str,
        shard: int,
        run: Sequence[int],
        ranges: list[tuple[int, int | None]],
        last: list[int],
        at: int,
    ) -> Iterator[Read]:
        """Quarantine the rows of ``ranges`` not read when ``error`` stopped the shard: one
        record per stretch of consecutive rows, one hole per span."""
        out: list[Read] = []
        lost: list[tuple[int, int | None]] = []
        for index in range(at, len(ranges)):
            start, stop = last[index], ranges[index][1]
            if stop is not None and start >= stop:
                continue  # read whole: the error came after it
            lost.append((start, stop))
            if stop is None:  # rows to the end are unknown: the shard ends here for us
                out.append(SpanEnd(run[index], shard, start))
            else:
                out.append((run[index], Hole(start, stop - start)))
        stretches: list[list[int | None]] = []  # the spans are in shuffled block order
        for start, stop in sorted(lost, key=lambda r: r[0]):
            if stretches and stretches[-1][1] == start:
                stretches[-1][1] = stop
            else:
                stretches.append([start, stop])
        for first, end in stretches:
            assert first is not None
            rows = None if end is None else end - first
            self.quarantine.add(error, url=url, start=first, stop=end, rows=rows)
        yield from out


__all__ = ["LaneReader", "Read", "Unbundled", "bundled", "make_lanes", "unit_rest"]
