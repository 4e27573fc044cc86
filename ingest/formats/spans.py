"""Many spans of one shard read as a few ranges, and the batches cut back into the spans. Pure.

A rank stopped inside a shuffle window consumed a random part of the window's rows (the
window's permutation decides which), so the rest of each shard it read is hundreds of
spans a few rows long, a few rows apart. Read one by one, each is an open, a seek and, in
Parquet, a decode of its whole row group: a resume inside a window took 8,191 read items
and 26-45 s for 16,384 rows (issue 32), against 0.7 s for a fresh epoch. Spans in
increasing row order with at most :data:`GAP_ROWS` rows between them are read as one range
here (:func:`coalesce`), and each batch of a range is cut into the spans it holds
(:func:`cut`): the rows between them are read and dropped. The gaps inside a window are a
few rows each, and the range never reaches past the part of the shard the window read, so
a resume reads what the window read, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar


class _Rows(Protocol):
    """A batch of a shard's rows (:class:`ingest.formats.base.RowBatch`, a dataclass)."""

    @property
    def row(self) -> int: ...

    @property
    def stop(self) -> int: ...

    @property
    def data(self) -> Any: ...

    def slice(self, offset: int, length: int) -> Any:
        """Rows ``[offset, offset + length)`` of the batch, as a batch of the same type."""
        ...


B = TypeVar("B", bound=_Rows)

GAP_ROWS = 1024
"""Spans at most this many rows apart are read as one range (the rows between them are
read and dropped). A window's gaps are a few rows each; a stretch consumed whole (a window
cut into batches before the state was taken) is longer and is skipped by a seek."""


@dataclass(frozen=True, slots=True)
class Range:
    """Rows ``[start, stop)`` (``stop`` None: to the end) read for the spans ``members``
    (indices into the spans given to :func:`coalesce`, in increasing row order)."""

    start: int
    stop: int | None
    members: tuple[int, ...]


def coalesce(spans: Sequence[tuple[int, int | None]], gap: int = GAP_ROWS) -> list[Range]:
    """``spans`` (in the order given) as ranges: each run of consecutive spans whose rows
    increase with at most ``gap`` rows between one and the next becomes one range."""
    out: list[Range] = []
    start = stop = None
    members: list[int] = []
    for index, (a, b) in enumerate(spans):
        if members and stop is not None and stop <= a <= stop + gap:
            members.append(index)
            stop = b
            continue
        if members:
            assert start is not None
            out.append(Range(start, stop, tuple(members)))
        start, stop, members = a, b, [index]
    if members:
        assert start is not None
        out.append(Range(start, stop, tuple(members)))
    return out


@dataclass(frozen=True, slots=True)
class Parts:
    """Parts of one batch that belong to several spans, cut by :func:`cut_together` and not
    sliced: ``parts[i] = (index of the span, first row, row after the last)``, in row order."""

    batch: Any
    parts: tuple[tuple[int, int, int], ...]


def _cut(
    read: Iterable[tuple[int, B]],
    ranges: Sequence[Range],
    spans: Sequence[tuple[int, int | None]],
) -> Iterator[tuple[B, list[tuple[int, int, int]]]]:
    """Each batch of ``read`` with its parts: ``(index of the span, first row, row after
    the last)`` for every span it holds rows of, in row order."""
    at = [0] * len(ranges)  # per range: its first member not read to its end yet
    for n, batch in read:
        members = ranges[n].members
        m = at[n]
        row, end = batch.row, batch.stop
        while m < len(members):
            stop = spans[members[m]][1]
            if stop is None or stop > row:
                break
            m += 1
        at[n] = m
        parts: list[tuple[int, int, int]] = []
        for index in members[m:]:
            start, stop = spans[index]
            if start >= end:
                break
            lo, hi = max(start, row), end if stop is None else min(stop, end)
            if hi > lo:
                parts.append((index, lo, hi))
        yield batch, parts


def cut(
    read: Iterable[tuple[int, B]],
    ranges: Sequence[Range],
    spans: Sequence[tuple[int, int | None]],
) -> Iterator[tuple[int, B]]:
    """The batches ``read`` gives for ``ranges`` (``(index of the range, batch)``, each
    range's batches in row order) as ``(index of the span, batch)``: each batch cut to the
    spans it holds, the rows between them dropped. A batch is handed on as it is (a
    :class:`~ingest.formats.base.BadRows` stays one) when it lies in one span whole."""
    for batch, parts in _cut(read, ranges, spans):
        yield from sliced(batch, parts)


def cut_together(
    read: Iterable[tuple[int, B]],
    ranges: Sequence[Range],
    spans: Sequence[tuple[int, int | None]],
) -> Iterator[tuple[int, B] | Parts]:
    """:func:`cut`, but a batch that holds rows of several spans comes whole with its parts
    (:class:`Parts`), for the caller to gather in one take: the rest of a window after a
    resume is hundreds of one-row spans per batch, and a slice (and a piece downstream) per
    span cost more than the read (issue 32)."""
    for batch, parts in _cut(read, ranges, spans):
        if len(parts) > 1:
            yield Parts(batch, tuple(parts))
        else:
            yield from sliced(batch, parts)


def sliced(batch: B, parts: Sequence[tuple[int, int, int]]) -> Iterator[tuple[int, B]]:
    """``(index of the span, rows)`` of each of ``batch``'s ``parts`` (``(span, first row,
    row after the last)``): the batch itself for a part that is all of it, else a slice."""
    row, end = batch.row, batch.stop
    for index, lo, hi in parts:
        if (lo, hi) == (row, end):
            yield index, batch
        else:
            yield index, batch.slice(lo - row, hi - lo)


__all__ = ["GAP_ROWS", "Parts", "Range", "coalesce", "cut", "cut_together", "sliced"]
