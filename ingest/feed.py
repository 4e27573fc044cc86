"""The feed: one rank's share of an epoch -> shuffled, full batches with their provenance.

This is the one engine behind :class:`ingest.Stream` (in-process, one rank) and
:class:`ingest.RayStream` (in the reader pool's actors, one feed per rank). It knows no Ray.

Reading order. The rank's spans (its share, from :mod:`ingest.assign`) are grouped by shard
and dealt round-robin to ``lanes`` lanes; each lane reads its shards front to back through
the formats (one open per shard, seeks, coalesced ranges). A *window* takes
``window // lanes`` rows from every lane that still has rows, so one window holds rows of up
to ``lanes`` shards of different parts of the epoch plan; with a seed its rows are permuted
by a key of (seed, epoch, rank, window index). Batches are cut from consecutive windows.
Memory is about ``window + lanes x ReadOptions.batch_rows x (1 + ReadOptions.prefetch)``
rows. Without a seed there is one lane and no permutation: listing order.

Resume. Every batch carries a *cursor*: where each lane stood at the start of the oldest
window that still had rows not yet cut into batches. A feed started from that cursor rebuilds
that window, leaves out the rows already consumed (the ``skip`` sets) and continues with
exactly the batches of the uninterrupted run. Exactly-once rests on the consumed rows alone.

Provenance never travels with the rows: each batch's rows are described by compact runs
``(segment, shard, start, stop)`` kept beside the table, for the rank to ack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest._prefetch import Prefetcher
from ingest.assign import CARRY, Span
from ingest.catalog import Listing
from ingest.errors import IngestError
from ingest.formats import get_format
from ingest.formats.base import ReadOptions, RowBatch, Seek
from ingest.intervals import IntervalSet
from ingest.ledger import Runs, as_runs, runs_of
from ingest.plan import permutation
from ingest.sources import Source

TO_END = 1 << 62
"""``Span.stop`` of a span that runs to the end of a shard whose row count is unknown."""

Cursor = dict[str, Any]
"""``{"window": w, "lanes": [[span, row, seek_row, seek_cursor] or null per lane]}``."""


@dataclass(frozen=True, slots=True)
class FeedPlan:
    """What one feed reads: a rank's share of one epoch and where to start in it.

    Attributes:
        epoch: The epoch (part of the shuffle keys).
        rank: The rank (part of the shuffle keys).
        next_step: Global step number of the first batch this feed yields.
        steps: Batches this feed yields, or None when row counts are unknown (one rank).
        spans: The rank's share in reading order.
        skip: Rows already consumed, per segment (``CARRY``, ``MAIN``) and shard: left out.
        cursor: Where to start (from a state), or None for the beginning of the share.
        listing: The epoch's listing (``Span.shard`` indexes it).
    """

    epoch: int
    rank: int
    next_step: int
    steps: int | None
    spans: tuple[Span, ...]
    skip: tuple[Mapping[int, IntervalSet], Mapping[int, IntervalSet]]
    cursor: Cursor | None
    listing: Listing


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedConfig:
    """How a feed reads and batches; the same for every rank of a stream.

    Attributes:
        batch_size: Rows per batch.
        seed: Shuffle seed; None reads in listing order with one lane.
        window: Rows per shuffle window.
        lanes: Shards read side by side to fill a window.
        columns: Columns to read, or None.
        read: Read options.
    """

    batch_size: int
    seed: int | None
    window: int
    lanes: int
    columns: tuple[str, ...] | None
    read: ReadOptions


@dataclass(frozen=True, slots=True)
class Ready:
    """One full batch: its global step, its rows, where they came from, the cursor after it."""

    step: int
    table: Any
    """The rows as an Arrow table, or whatever the transform returned for them."""
    runs: Runs
    cursor: Cursor


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of a feed: batches yielded, rows left over (fewer than a batch), rows learnt.

    ``leftover`` is only ever non-empty when row counts were unknown at planning time.
    """

    steps: int
    leftover: Runs
    learned: dict[int, int]


@dataclass(frozen=True, slots=True)
class _SpanEnd:
    span: int
    shard: int
    rows: int


@dataclass(slots=True)
class _Lane:
    """A lane: its spans in order, where it stands, and the rows it read but did not give."""

    spans: list[int]
    reader: Iterator[tuple[int, RowBatch] | _SpanEnd] | None = None
    at: tuple[int, int, Seek | None] | None = None  # (lane span index, row, seek); None: done
    pending: tuple[int, RowBatch] | None = None

    def cursor(self) -> list[int | None] | None:
        if self.at is None:
            return None
        k, row, seek = self.at
        return [k, row, None if seek is None else seek[0], None if seek is None else seek[1]]


@dataclass(slots=True)
class _Window:
    index: int
    start: Cursor
    end: Cursor
    table: pa.Table
    segments: npt.NDArray[np.int8]
    shards: npt.NDArray[np.int32]
    rows: npt.NDArray[np.int64]
    taken: int = 0

    @property
    def size(self) -> int:
        return len(self.rows)


class Feed:
    """Iterate a rank's batches of one epoch: :class:`Ready` items, then one :class:`Tail`.

    Args:
        plan: The rank's share and start.
        config: Batching and shuffle settings.
        source: Opens shards and counts requests.
        transform: Applied to each batch's table before it is handed out (or None).
    """

    def __init__(
        self,
        plan: FeedPlan,
        config: FeedConfig,
        source: Source,
        transform: Callable[[pa.Table], Any] | None = None,
    ) -> None:
        self.plan = plan
        self.config = config
        self.source = source
        self.transform = transform
        self._learned: dict[int, int] = {}
        self._lanes = self._make_lanes()

    def _make_lanes(self) -> list[_Lane]:
        spans = self.plan.spans
        groups: list[list[int]] = []
        for n, span in enumerate(spans):
            if groups and spans[groups[-1][-1]].shard == span.shard:
                groups[-1].append(n)
            else:
                groups.append([n])
        count = 1 if self.config.seed is None else max(1, min(self.config.lanes, len(groups)))
        lanes = [_Lane([]) for _ in range(count)]
        for g, group in enumerate(groups):
            lanes[g % count].spans.extend(group)
        cursor = self.plan.cursor
        saved = cursor.get("lanes") if cursor else None
        if saved is not None and len(saved) != count:
            raise IngestError(
                f"the saved position of rank {self.plan.rank} has {len(saved)} lane(s), this "
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

    # -- reading a lane --------------------------------------------------------------------

    def _read_lane(
        self, lane: list[int], k: int, row: int, seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch] | _SpanEnd]:
        """Batches of the lane's spans from span ``k``, row ``row``; the shard opened once."""
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
            ranges[0] = (max(first[0], row), first[1])
            ctx = self.plan.listing.context(
                shard, self.source, self.config.read, self.config.columns
            )
            last = [start for start, _ in ranges]
            with get_format(ctx.shard.format).open(ctx) as reader:
                for index, batch in reader.read_spans(ranges, seek):
                    if batch.data.num_rows:
                        yield run[index], batch
                    last[index] = batch.stop
            for index, (_, stop) in enumerate(ranges):
                if stop is None:
                    yield _SpanEnd(run[index], shard, last[index])
            row, seek = 0, None

    def _open(self, lane: _Lane) -> Iterator[tuple[int, RowBatch] | _SpanEnd]:
        assert lane.at is not None
        k, row, seek = lane.at
        depth = self.config.read.prefetch
        if not depth:
            return self._read_lane(lane.spans, k, row, seek)
        return Prefetcher(
            lambda: self._read_lane(lane.spans, k, row, seek),
            depth,
            self.config.read.timeout_s,
            f"shards of {self.source.urls[0]}",
        )

    def _take(self, lane: _Lane, want: int) -> list[tuple[Span, RowBatch]]:
        """Up to ``want`` rows from ``lane``, advancing its position."""
        out: list[tuple[Span, RowBatch]] = []
        spans = self.plan.spans
        while want > 0 and lane.at is not None:
            if lane.pending is None:
                if lane.reader is None:
                    lane.reader = self._open(lane)
                item = next(lane.reader, None)
                if item is None:
                    lane.at = None
                    break
                if isinstance(item, _SpanEnd):
                    self._learned[item.shard] = item.rows
                    continue
                lane.pending = item
            k, batch = lane.pending
            n = min(want, batch.data.num_rows)
            head = RowBatch(batch.row, batch.data.slice(0, n), batch.seek)
            out.append((spans[lane.spans[k]], head))
            want -= n
            if n == batch.data.num_rows:
                lane.pending = None
                lane.at = (k, batch.stop, batch.seek)
            else:
                rest = RowBatch(batch.row + n, batch.data.slice(n), batch.seek)
                lane.pending = (k, rest)
                lane.at = (k, rest.row, batch.seek)
        return out

    # -- windows and batches ---------------------------------------------------------------

    def _cursor(self, window: int) -> Cursor:
        return {"window": window, "lanes": [lane.cursor() for lane in self._lanes]}

    def _windows(self) -> Iterator[_Window]:
        config = self.config
        index = int(self.plan.cursor["window"]) if self.plan.cursor else 0
        per_lane = max(1, config.window // len(self._lanes))
        while any(lane.at is not None for lane in self._lanes):
            start = self._cursor(index)
            pieces: list[tuple[Span, RowBatch]] = []
            for lane in self._lanes:
                pieces.extend(self._take(lane, per_lane))
            if not pieces:
                break
            yield self._window(index, start, self._cursor(index + 1), pieces)
            index += 1

    def _window(
        self, index: int, start: Cursor, end: Cursor, pieces: list[tuple[Span, RowBatch]]
    ) -> _Window:
        table = pa.Table.from_batches([b.data.replace_schema_metadata(None) for _, b in pieces])
        sizes = [b.data.num_rows for _, b in pieces]
        segments = np.repeat(np.array([s.segment for s, _ in pieces], dtype=np.int8), sizes)
        shards = np.repeat(np.array([s.shard for s, _ in pieces], dtype=np.int32), sizes)
        rows = np.concatenate([np.arange(b.row, b.stop, dtype=np.int64) for _, b in pieces])
        if self.config.seed is not None:
            order = permutation(
                len(rows), "window", self.config.seed, self.plan.epoch, self.plan.rank, index
            )
            table, segments, shards, rows = (
                table.take(order),
                segments[order],
                shards[order],
                rows[order],
            )
        keep = self._unconsumed(segments, shards, rows)
        if keep is not None:
            table, segments, shards, rows = (
                table.take(keep),
                segments[keep],
                shards[keep],
                rows[keep],
            )
        return _Window(index, start, end, table, segments, shards, rows)

    def _unconsumed(
        self,
        segments: npt.NDArray[np.int8],
        shards: npt.NDArray[np.int32],
        rows: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64] | None:
        """Indices of the rows not consumed yet, or None when all are to deliver."""
        skip_carry, skip_main = self.plan.skip
        if not skip_carry and not skip_main:
            return None
        seen = np.zeros(len(rows), dtype=bool)
        for segment, skip in ((CARRY, skip_carry), (1 - CARRY, skip_main)):
            if not skip:
                continue
            in_segment = segments == segment
            for shard in np.unique(shards[in_segment]).tolist():
                done = skip.get(shard)
                if done:
                    mask = in_segment & (shards == shard)
                    seen[mask] = done.contains_many(rows[mask])
        if not seen.any():
            return None
        return np.nonzero(~seen)[0]

    def __iter__(self) -> Iterator[Ready | Tail]:
        size = self.config.batch_size
        step = self.plan.next_step
        held: list[tuple[_Window, int, int]] = []  # (window, start, stop) of rows not yet cut
        held_rows = 0
        try:
            for window in self._windows():
                if window.size:
                    held.append((window, 0, window.size))
                    held_rows += window.size
                while held_rows >= size:
                    yield self._cut(held, size, step)
                    held_rows -= size
                    step += 1
            leftover = self._runs(held)
            steps = step - self.plan.next_step
            if self.plan.steps is not None and (steps != self.plan.steps or len(leftover)):
                raise IngestError(
                    f"rank {self.plan.rank} read {steps} full batches and "
                    f"{int((leftover[:, 3] - leftover[:, 2]).sum())} more rows in epoch "
                    f"{self.plan.epoch}, "
                    f"planned {self.plan.steps} batches exactly; a shard changed while it was "
                    "read (its row count differs from the listing). Restart the epoch"
                )
            yield Tail(steps, leftover, dict(self._learned))
        finally:
            self.close()

    def _cut(self, held: list[tuple[_Window, int, int]], size: int, step: int) -> Ready:
        parts: list[pa.Table] = []
        runs: list[tuple[npt.NDArray[Any], ...]] = []
        need = size
        while need:
            window, lo, hi = held[0]
            n = min(need, hi - lo)
            parts.append(window.table.slice(lo, n))
            runs.append(
                (window.segments[lo : lo + n], window.shards[lo : lo + n], window.rows[lo : lo + n])
            )
            need -= n
            if lo + n == hi:
                held.pop(0)
            else:
                held[0] = (window, lo + n, hi)
        cursor = held[0][0].start if held else window.end
        table: Any = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        table = table.combine_chunks()
        if self.transform is not None:
            table = self.transform(table)
        seg = np.concatenate([r[0] for r in runs])
        sh = np.concatenate([r[1] for r in runs])
        rw = np.concatenate([r[2] for r in runs])
        return Ready(step, table, runs_of(seg, sh, rw), cursor)

    @staticmethod
    def _runs(held: Sequence[tuple[_Window, int, int]]) -> Runs:
        if not held:
            return as_runs(())
        seg = np.concatenate([w.segments[lo:hi] for w, lo, hi in held])
        sh = np.concatenate([w.shards[lo:hi] for w, lo, hi in held])
        rw = np.concatenate([w.rows[lo:hi] for w, lo, hi in held])
        return runs_of(seg, sh, rw)

    def close(self) -> None:
        """Stop the lanes' reader threads."""
        for lane in self._lanes:
            if lane.reader is not None:
                with contextlib.suppress(Exception):
                    close = getattr(lane.reader, "close", None)
                    if close is not None:
                        close()
                lane.reader = None


__all__ = ["TO_END", "Cursor", "Feed", "FeedConfig", "FeedPlan", "Ready", "Tail"]
