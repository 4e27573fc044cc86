"""Who reads what: the rows still to deliver, cut into equal shares for the ranks. Pure.

Every rank of a data-parallel group must take the same number of steps per epoch, or the
collectives of the ranks that run out first hang. The rows still to deliver are taken in
plan order and cut into ``world_size`` consecutive shares of ``steps * batch_size`` rows;
the rows that cannot fill a step on every rank (fewer than ``world_size * batch_size``) are
the remainder, carried into the next epoch or dropped, and counted either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ingest.intervals import IntervalSet
from ingest.plan import Unit

CARRY, MAIN = 0, 1
"""Segments: rows carried in from the previous epoch, and the epoch's own rows. A row can be
in both (read at the end of one epoch and again in the next), so each has its own ledger."""


@dataclass(frozen=True, slots=True)
class Span:
    """Rows ``[start, stop)`` of shard ``shard`` (an index into the epoch's listing)."""

    shard: int
    start: int
    stop: int
    segment: int = MAIN

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def cut(self, start: int, stop: int) -> Span:
        return Span(self.shard, start, stop, self.segment)


@dataclass(frozen=True, slots=True)
class Assignment:
    """The shares of one epoch (or of what is left of it)."""

    ranks: tuple[tuple[Span, ...], ...]
    steps: int
    remainder: tuple[Span, ...]

    @property
    def remainder_rows(self) -> int:
        return sum(s.rows for s in self.remainder)


def remaining(
    units: Iterable[Unit], rows: Sequence[int], consumed: dict[int, IntervalSet]
) -> list[Span]:
    """The rows of ``units`` not in ``consumed``, in plan order.

    Args:
        units: The epoch's units in plan order.
        rows: Row count of every shard (all known: the coordinator indexes shards first).
        consumed: Consumed rows per shard index.
    """
    out: list[Span] = []
    empty = IntervalSet()
    for unit in units:
        stop = rows[unit.shard] if unit.stop is None else unit.stop
        for start, end in consumed.get(unit.shard, empty).gaps(unit.start, stop):
            out.append(Span(unit.shard, start, end))
    return out


def split(spans: Sequence[Span], world_size: int, batch_size: int) -> Assignment:
    """Cut ``spans`` into ``world_size`` consecutive shares of equal whole steps.

    Raises:
        ValueError: If ``world_size`` or ``batch_size`` is below 1.
    """
    if world_size < 1 or batch_size < 1:
        raise ValueError(f"world_size={world_size} and batch_size={batch_size} must be >= 1")
    total = sum(s.rows for s in spans)
    steps = total // (world_size * batch_size)
    share = steps * batch_size
    ranks: list[list[Span]] = [[] for _ in range(world_size)]
    remainder: list[Span] = []
    rank, room = 0, share
    for span in spans:
        start = span.start
        while start < span.stop:
            if rank == world_size or (room == 0 and rank == world_size - 1):
                remainder.append(span.cut(start, span.stop))
                break
            if room == 0:
                rank, room = rank + 1, share
                continue
            take = min(room, span.stop - start)
            ranks[rank].append(span.cut(start, start + take))
            start += take
            room -= take
    return Assignment(tuple(tuple(r) for r in ranks), steps, tuple(remainder))
