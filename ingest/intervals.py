"""Sets of row offsets stored as sorted, disjoint, half-open intervals.

The consumed rows of a shard are one :class:`IntervalSet`. A shard read in order is one
interval; a shard delivered through a shuffle window is a few dozen at most. Pure Python and
numpy, no Ray.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt


class IntervalSet:
    """A set of non-negative integers kept as sorted disjoint ``[start, stop)`` intervals."""

    __slots__ = ("_starts", "_stops")
    __hash__ = None  # type: ignore[assignment]  # mutable

    def __init__(self, intervals: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []
        for start, stop in intervals:
            self.add(start, stop)

    def add(self, start: int, stop: int) -> None:
        """Add ``[start, stop)``, merging with touching or overlapping intervals.

        Raises:
            ValueError: If ``start`` is negative or ``stop < start``.
        """
        if start < 0 or stop < start:
            raise ValueError(
                f"interval [{start}, {stop}) is not a valid row range; need 0 <= start <= stop"
            )
        if start == stop:
            return
        # First interval whose stop reaches start, last whose start is at or before stop.
        lo = bisect.bisect_left(self._stops, start)
        hi = bisect.bisect_right(self._starts, stop)
        if lo < hi:
            start = min(start, self._starts[lo])
            stop = max(stop, self._stops[hi - 1])
        self._starts[lo:hi] = [start]
        self._stops[lo:hi] = [stop]

    def add_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Add many single rows at once (any order, duplicates allowed)."""
        for start, stop in runs(rows):
            self.add(start, stop)

    def update(self, other: IntervalSet) -> None:
        """Add every interval of ``other``."""
        for start, stop in other:
            self.add(start, stop)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int | np.integer):
            return False
        i = bisect.bisect_right(self._starts, int(value)) - 1
        return i >= 0 and int(value) < self._stops[i]

    def contains_many(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Vectorised membership test: one bool per entry of ``rows``."""
        if not self._starts:
            return np.zeros(len(rows), dtype=bool)
        starts = np.asarray(self._starts, dtype=np.int64)
        stops = np.asarray(self._stops, dtype=np.int64)
        i = np.searchsorted(starts, rows, side="right") - 1
        return (i >= 0) & (rows < stops[np.maximum(i, 0)])

    def covers(self, start: int, stop: int) -> bool:
        """Whether every row of ``[start, stop)`` is in the set."""
        if start >= stop:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._stops[i] >= stop

    def first_missing(self, start: int = 0) -> int:
        """The smallest row ``>= start`` that is not in the set."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and self._stops[i] > start:
            return self._stops[i]
        return start

    def gaps(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The intervals of ``[start, stop)`` that are not in the set, in order."""
        out: list[tuple[int, int]] = []
        cursor = start
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while cursor < stop and i < len(self._starts):
            s, e = self._starts[i], self._stops[i]
            if e <= cursor:
                i += 1
                continue
            if s >= stop:
                break
            if s > cursor:
                out.append((cursor, s))
            cursor = max(cursor, e)
            i += 1
        if cursor < stop:
            out.append((cursor, stop))
        return out

    def __len__(self) -> int:
        """Number of intervals (not rows); see :attr:`count` for rows."""
        return len(self._starts)

    @property
    def count(self) -> int:
        """Number of rows in the set."""
        return sum(e - s for s, e in zip(self._starts, self._stops, strict=True))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._stops, strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self._starts == other._starts and self._stops == other._stops

    def __repr__(self) -> str:
        return f"IntervalSet({list(self)})"

    def copy(self) -> IntervalSet:
        out = IntervalSet()
        out._starts = list(self._starts)
        out._stops = list(self._stops)
        return out

    def to_json(self) -> list[list[int]]:
        return [[s, e] for s, e in self]

    @classmethod
    def from_json(cls, data: object) -> IntervalSet:
        """Build from ``[[start, stop], ...]``.

        Raises:
            ValueError: If ``data`` is not a list of ``[start, stop]`` integer pairs.
        """
        if not isinstance(data, list):
            raise ValueError(f"intervals must be a list of [start, stop] pairs, got {data!r}")
        out = cls()
        for pair in data:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(v, int) for v in pair)
            ):
                raise ValueError(f"interval {pair!r} is not a [start, stop] pair of integers")
            out.add(pair[0], pair[1])
        return out


def runs(rows: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """Sorted, merged ``[start, stop)`` runs that cover exactly the given rows."""
    if len(rows) == 0:
        return []
    values = np.unique(rows)
    breaks = np.nonzero(np.diff(values) != 1)[0] + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(values)]))
    return [(int(values[s]), int(values[e - 1]) + 1) for s, e in zip(starts, stops, strict=True)]
