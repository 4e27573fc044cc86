"""Who reads what: the rows still to deliver, cut into equal shares for the ranks. Pure.

Every rank of a data-parallel group must take the same number of steps per epoch, or the
collectives of the ranks that run out first hang. The rows still to deliver are taken in
plan order and cut into ``world_size`` consecutive shares of ``steps * batch_size`` rows;
the rows that cannot fill a step on every rank (fewer than ``world_size * batch_size``) are
the remainder, carried into the next epoch or dropped, and counted either way.

Both steps run in numpy on :class:`Spans`, spans kept as arrays: an epoch of a million
shards has millions of spans. The saved positions that resume a share are checked against it
in :mod:`ingest.core.positions`.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

import numpy as np
import numpy.typing as npt

from ingest.core.intervals import IntervalSet, stack
from ingest.core.ledger import unpacked_row
from ingest.core.plan import Unit, Units

CARRY, MAIN = 0, 1
"""Segments: rows carried in from the previous epoch, and the epoch's own rows. A row can be
in both (read at the end of one epoch and again in the next), so each has its own ledger."""

TO_END = 1 << 62
"""``Span.stop`` of a span that runs to the end of a shard whose row count is unknown."""

_MAX_COORD = 1 << 62
"""Bound of ``shard * width + row`` for the vectorised subtraction of consumed rows."""


class Span(NamedTuple):
    """Rows ``[start, stop)`` of shard ``shard`` (an index into the epoch's listing).

    A named tuple rather than a dataclass: an epoch's shares hold millions of spans, and a
    tuple is made in less than half the time. Like any tuple it equals a plain tuple of the
    same values.
    """

    shard: int
    start: int
    stop: int
    segment: int = MAIN

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def cut(self, start: int, stop: int) -> Span:
        return Span(self.shard, start, stop, self.segment)


@dataclass(frozen=True, slots=True, eq=False)
class Spans(Sequence[Span]):
    """Spans in order, kept as four int64 arrays of equal length.

    A sequence of :class:`Span`; equal to another sequence with the same spans.
    """

    shard: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    stop: npt.NDArray[np.int64]
    segment: npt.NDArray[np.int64]

    __hash__ = None  # type: ignore[assignment]  # holds mutable arrays

    @classmethod
    def of(cls, spans: Iterable[Span]) -> Spans:
        """The spans of ``spans`` as arrays."""
        if isinstance(spans, Spans):
            return spans
        listed = spans if isinstance(spans, Sequence) else list(spans)
        # One pass over the spans' fields, ten times faster than an array of tuples.
        fields = itertools.chain.from_iterable(listed)
        rows = np.fromiter(fields, dtype=np.int64, count=4 * len(listed)).reshape(-1, 4)
        rows = np.ascontiguousarray(rows.T)
        return cls(rows[0], rows[1], rows[2], rows[3])

    @classmethod
    def concat(cls, parts: Sequence[Spans]) -> Spans:
        """``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.of(())
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Rows of each span."""
        return self.stop - self.start

    def take(self, indices: npt.NDArray[np.int64]) -> Spans:
        """The spans at ``indices``, in that order."""
        return Spans(*(getattr(self, f)[indices] for f in _FIELDS))

    def to_list(self) -> list[Span]:
        """The spans as :class:`Span` objects, made in bulk."""
        # tuple.__new__ on zipped columns makes each Span in C, without NamedTuple.__new__.
        columns = (getattr(self, f).tolist() for f in _FIELDS)
        with cycle_collection_paused():
            return list(map(tuple.__new__, itertools.repeat(Span), zip(*columns, strict=True)))

    def __len__(self) -> int:
        return len(self.shard)

    @overload
    def __getitem__(self, index: int) -> Span: ...

    @overload
    def __getitem__(self, index: slice) -> Spans: ...

    def __getitem__(self, index: int | slice) -> Span | Spans:
        if isinstance(index, slice):
            return Spans(*(getattr(self, f)[index] for f in _FIELDS))
        return Span(
            int(self.shard[index]),
            int(self.start[index]),
            int(self.stop[index]),
            int(self.segment[index]),
        )

    def __iter__(self) -> Iterator[Span]:
        return iter(self.to_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Spans):
            return all(np.array_equal(getattr(self, f), getattr(other, f)) for f in _FIELDS)
        if isinstance(other, Sequence):
            return self.to_list() == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Spans({len(self)} spans)"


_FIELDS = ("shard", "start", "stop", "segment")


@contextlib.contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while millions of objects are made.

    Every few hundred new objects start a collection, and the young objects are scanned
    again and again: making the four million spans of a million-shard epoch took 3.5 s with
    the collector on and 1.3 s with it paused (it still scans them once, later). Spans, shard
    records, interval sets and the bytes of a packed listing form no cycles, so nothing is
    left uncollected; the collector resumes (if it was on) as soon as they are made.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(frozen=True, slots=True)
class Assignment:
    """The shares of one epoch (or of what is left of it)."""

    ranks: tuple[tuple[Span, ...], ...]
    steps: int
    remainder: tuple[Span, ...]

    @property
    def remainder_rows(self) -> int:
        return sum(s.rows for s in self.remainder)


def row_spans(rows: npt.NDArray[np.int64]) -> list[Span]:
    """Packed rows (:func:`ingest.core.ledger.packed_row`) as spans, runs of rows merged."""
    spans: list[Span] = []
    for value in np.unique(rows).tolist():
        segment, shard, row = unpacked_row(value)
        last = spans[-1] if spans else None
        if last is not None and (last.segment, last.shard, last.stop) == (segment, shard, row):
            spans[-1] = last._replace(stop=row + 1)
        else:
            spans.append(Span(shard, row, row + 1, segment))
    return spans


def deal_lanes(spans: Sequence[Span], lanes: int) -> list[list[int]]:
    """The indices of ``spans`` that each lane reads, in order, as a rank's feed deals them.

    Consecutive spans of one shard form a group (a shard is opened once); the groups are
    dealt round-robin to ``lanes`` lanes, or to as many as there are groups (one at least).

    Args:
        spans: A rank's share in reading order.
        lanes: Lanes wanted (1 without a shuffle).
    """
    shard = Spans.of(spans).shard
    if not len(shard):
        return [[]]
    group = np.cumsum(np.concatenate(([True], shard[1:] != shard[:-1]))) - 1
    count = max(1, min(lanes, int(group[-1]) + 1))
    lane = group % count
    order = np.argsort(lane, kind="stable")
    bounds = np.searchsorted(lane[order], np.arange(count + 1)).tolist()
    return [order[a:b].tolist() for a, b in itertools.pairwise(bounds)]


def remaining(
    units: Iterable[Unit], rows: Sequence[int], consumed: Mapping[int, IntervalSet]
) -> Spans:
    """The rows of ``units`` not in ``consumed``, in plan order (segment :data:`MAIN`).

    Args:
        units: The epoch's units in plan order (:class:`ingest.core.plan.Units` is fastest).
        rows: Row count of every shard (all known: the coordinator indexes shards first).
        consumed: Consumed rows per shard index.
    """
    if isinstance(units, Units):
        got = _remaining_arrays(units, rows, consumed)
        if got is not None:
            return got
    return Spans.of(_remaining_scalar(units, rows, consumed))


def _remaining_scalar(
    units: Iterable[Unit], rows: Sequence[int], consumed: Mapping[int, IntervalSet]
) -> list[Span]:
    out: list[Span] = []
    empty = IntervalSet()
    for unit in units:
        stop = rows[unit.shard] if unit.stop is None else unit.stop
        for start, end in consumed.get(unit.shard, empty).gaps(unit.start, stop):
            out.append(Span(unit.shard, start, end))
    return out


def _remaining_arrays(
    units: Units, rows: Sequence[int], consumed: Mapping[int, IntervalSet]
) -> Spans | None:
    """:func:`remaining` in numpy; None when rows are too large for it (unknown counts)."""
    shard, start, stop = units.shard, units.start, units.stop
    open_ended = np.flatnonzero(stop < 0)
    if len(open_ended):
        stop = stop.copy()
        stop[open_ended] = [rows[i] for i in shard[open_ended].tolist()]
    touched = [(k, v) for k, v in consumed.items() if v]
    if not touched:
        keep = start < stop
        return _spans(shard[keep], start[keep], stop[keep])
    c_shard, c_start, c_stop = stack(touched)
    # One coordinate for every (shard, row), so one sorted search finds each unit's overlaps.
    width = max(int(stop.max(initial=0)), int(c_stop.max())) + 1
    if (max(int(shard.max(initial=0)), int(c_shard.max())) + 1) * width >= _MAX_COORD:
        return None
    order = np.argsort(c_shard, kind="stable")  # sets are sorted inside; shards may not be
    base = c_shard[order] * width
    c_lo, c_hi = base + c_start[order], base + c_stop[order]
    a = shard * width + start
    b = np.maximum(shard * width + stop, a)
    first = np.searchsorted(c_hi, a, side="right")
    overlaps = np.maximum(np.searchsorted(c_lo, b, side="left") - first, 0)
    # Unit u gives overlaps[u] + 1 candidate gaps: before, between and after its overlaps.
    pieces = overlaps + 1
    unit = np.repeat(np.arange(len(a)), pieces)
    j = np.arange(len(unit)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    last = len(c_lo) - 1
    left = np.where(j == 0, a[unit], c_hi[np.clip(first[unit] + j - 1, 0, last)])
    right = np.where(j == overlaps[unit], b[unit], c_lo[np.clip(first[unit] + j, 0, last)])
    left, right = np.maximum(left, a[unit]), np.minimum(right, b[unit])
    keep = right > left
    unit, left, right = unit[keep], left[keep], right[keep]
    offset = shard[unit] * width
    return _spans(shard[unit], left - offset, right - offset)


def _spans(
    shard: npt.NDArray[np.int64], start: npt.NDArray[np.int64], stop: npt.NDArray[np.int64]
) -> Spans:
    return Spans(shard, start, stop, np.full(len(shard), MAIN, dtype=np.int64))


def split(spans: Sequence[Span], world_size: int, batch_size: int) -> Assignment:
    """Cut ``spans`` into ``world_size`` consecutive shares of equal whole steps.

    Rank ``r`` gets rows ``[r * share, (r + 1) * share)`` of the spans laid end to end
    (``share = steps * batch_size``); the rows after the last share are the remainder. A
    span that crosses a share's end is cut in two; the others are kept as they are.

    Raises:
        ValueError: If ``world_size`` or ``batch_size`` is below 1, or a span ends before
            it starts.
    """
    if world_size < 1 or batch_size < 1:
        raise ValueError(f"world_size={world_size} and batch_size={batch_size} must be >= 1")
    if isinstance(spans, Spans):
        lengths = spans.lengths
    else:
        lengths = np.fromiter((s.stop - s.start for s in spans), np.int64, len(spans))
    if len(lengths) and lengths.min() < 0:
        bad = spans[int(np.argmin(lengths))]
        raise ValueError(f"span {bad} ends before it starts; a span is rows [start, stop)")
    steps = int(lengths.sum()) // (world_size * batch_size)
    share = steps * batch_size
    nonempty = np.flatnonzero(lengths)
    if isinstance(spans, Spans):
        kept = (spans if len(nonempty) == len(spans) else spans.take(nonempty)).to_list()
    elif len(nonempty) == len(spans):
        kept = list(spans)
    else:
        kept = [spans[i] for i in nonempty.tolist()]
    ends = np.cumsum(lengths[nonempty])
    begins = ends - lengths[nonempty]
    ranks = tuple(
        _rows_between(kept, begins, ends, r * share, (r + 1) * share) for r in range(world_size)
    )
    tail = int(ends[-1]) if len(ends) else 0
    remainder = _rows_between(kept, begins, ends, world_size * share, tail)
    return Assignment(ranks, steps, remainder)


def _rows_between(
    spans: list[Span],
    begins: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    lo: int,
    hi: int,
) -> tuple[Span, ...]:
    """Rows ``[lo, hi)`` of ``spans`` laid end to end (``begins``/``ends``: their offsets)."""
    if lo >= hi:
        return ()
    i = int(np.searchsorted(ends, lo, side="right"))
    j = int(np.searchsorted(begins, hi, side="left"))
    out = spans[i:j]
    if not out:
        return ()
    head, tail = int(begins[i]), int(ends[j - 1])
    if head < lo or tail > hi:
        first, last = out[0], out[-1]
        if len(out) == 1:
            out[0] = first.cut(first.start + max(lo - head, 0), first.stop - max(tail - hi, 0))
        else:
            out[0] = first.cut(first.start + max(lo - head, 0), first.stop)
            out[-1] = last.cut(last.start, last.stop - max(tail - hi, 0))
    return tuple(out)
