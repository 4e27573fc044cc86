"""Sets of row offsets stored as sorted, disjoint, half-open intervals.

The consumed rows of a shard are one :class:`IntervalSet`. A shard read in order is one
interval; a shard whose window was cut into batches only in part holds about one interval
per two rows of its piece of the window until the rest is consumed: :meth:`IntervalSet.encode`
writes such a set as a bitmap, and :meth:`IntervalSet.add_many` merges thousands of acked
runs at once. A set keeps its intervals in two read-only numpy arrays, so sets go to and
from the coordinator's merges and the state's columns without a Python integer per
interval (:func:`stack`, :func:`unstack`; the sets of many shards are merged and counted at
once in :mod:`ingest.core.keyed`). Pure Python and numpy, no Ray.
"""

from __future__ import annotations

import base64
import bisect
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

MAX_ROW = 1 << 62
"""The largest row offset a set holds (offsets are packed with keys into 64-bit integers)."""


class IntervalSet:
    """A set of non-negative integers kept as sorted disjoint ``[start, stop)`` intervals.

    The intervals live in two read-only int64 arrays that a change replaces, never edits:
    a copy shares them, and a set of a million intervals goes to and from numpy (merges,
    bitmaps, the state's packed columns) without a Python integer per interval.
    """

    __slots__ = ("_starts", "_stops")
    __hash__ = None  # type: ignore[assignment]  # mutable

    def __init__(self, intervals: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: npt.NDArray[np.int64] = _EMPTY
        self._stops: npt.NDArray[np.int64] = _EMPTY
        pairs = list(intervals)
        if pairs:
            arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
            self.add_many(arr[:, 0], arr[:, 1])

    @classmethod
    def span(cls, start: int, stop: int) -> IntervalSet:
        """The set of ``[start, stop)`` (empty when ``start == stop``).

        Raises:
            ValueError: If ``start`` is negative or ``stop < start``.
        """
        _check_range(start, stop)
        if start == stop:
            return cls()
        return _set_of(_frozen([start]), _frozen([stop]))

    def add(self, start: int, stop: int) -> None:
        """Add ``[start, stop)``, merging with touching or overlapping intervals.

        Raises:
            ValueError: If ``start`` is negative or ``stop < start``.
        """
        _check_range(start, stop)
        if start == stop:
            return
        starts, stops = self._starts, self._stops
        # First interval whose stop reaches start, last whose start is at or before stop.
        lo = bisect.bisect_left(stops, start)
        hi = bisect.bisect_right(starts, stop)
        if lo < hi:
            start = min(start, int(starts[lo]))
            stop = max(stop, int(stops[hi - 1]))
        self._starts = _frozen(np.concatenate((starts[:lo], [start], starts[hi:])))
        self._stops = _frozen(np.concatenate((stops[:lo], [stop], stops[hi:])))

    def add_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Add many single rows at once (any order, duplicates allowed)."""
        values = np.asarray(rows, dtype=np.int64)
        self.add_many(values, values + 1)

    def add_many(self, starts: npt.ArrayLike, stops: npt.ArrayLike) -> None:
        """Add every ``[starts[i], stops[i])`` at once (any order, overlaps allowed).

        Raises:
            ValueError: If a start is negative or a stop is before its start.
        """
        lo = np.asarray(starts, dtype=np.int64).ravel()
        hi = np.asarray(stops, dtype=np.int64).ravel()
        if lo.shape != hi.shape:
            raise ValueError(f"{len(lo)} starts and {len(hi)} stops: need one stop per start")
        bad = np.flatnonzero((lo < 0) | (hi < lo))
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"interval [{lo[i]}, {hi[i]}) is not a valid row range; need 0 <= start <= stop"
            )
        nonempty = hi > lo
        if not nonempty.all():
            lo, hi = lo[nonempty], hi[nonempty]
        if not len(lo):
            return
        merged_starts, merged_stops = union(
            np.concatenate((self._starts, lo)), np.concatenate((self._stops, hi)), in_place=True
        )
        self._starts, self._stops = _frozen(merged_starts), _frozen(merged_stops)

    def update(self, other: IntervalSet) -> None:
        """Add every interval of ``other``."""
        if not len(self._starts):
            self._starts, self._stops = other._starts, other._stops
        elif len(other._starts):
            self.add_many(other._starts, other._stops)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int | np.integer):
            return False
        i = bisect.bisect_right(self._starts, int(value)) - 1
        return bool(i >= 0 and int(value) < self._stops[i])

    def contains_many(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Vectorised membership test: one bool per entry of ``rows``."""
        if not len(self._starts):
            return np.zeros(len(rows), dtype=bool)
        i = np.searchsorted(self._starts, rows, side="right") - 1
        return (i >= 0) & (rows < self._stops[np.maximum(i, 0)])

    def covers(self, start: int, stop: int) -> bool:
        """Whether every row of ``[start, stop)`` is in the set."""
        if start >= stop:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return bool(i >= 0 and self._stops[i] >= stop)

    def first_missing(self, start: int = 0) -> int:
        """The smallest row ``>= start`` that is not in the set."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and self._stops[i] > start:
            return int(self._stops[i])
        return start

    def gaps(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The intervals of ``[start, stop)`` that are not in the set, in order."""
        if start >= stop:
            return []
        # The intervals that overlap [start, stop): the first whose stop is past start, up
        # to the last whose start is before stop.
        lo = bisect.bisect_right(self._stops, start)
        hi = bisect.bisect_left(self._starts, stop)
        out: list[tuple[int, int]] = []
        cursor = start
        for s, e in zip(self._starts[lo:hi].tolist(), self._stops[lo:hi].tolist(), strict=True):
            if s > cursor:
                out.append((cursor, s))
            cursor = e
        if cursor < stop:
            out.append((cursor, stop))
        return out

    def __len__(self) -> int:
        """Number of intervals (not rows); see :attr:`count` for rows."""
        return len(self._starts)

    @property
    def count(self) -> int:
        """Number of rows in the set."""
        return int((self._stops - self._starts).sum())

    @property
    def last(self) -> int:
        """The row after the set's last row (0 for an empty set)."""
        return int(self._stops[-1]) if len(self._stops) else 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts.tolist(), self._stops.tolist(), strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return np.array_equal(self._starts, other._starts) and np.array_equal(
            self._stops, other._stops
        )

    def __repr__(self) -> str:
        return f"IntervalSet({list(self)})"

    def copy(self) -> IntervalSet:
        """A set of the same rows (it shares the read-only arrays; a change replaces them)."""
        return _set_of(self._starts, self._stops)

    def to_json(self) -> list[list[int]]:
        return [[s, e] for s, e in self]

    def encode(self) -> list[list[int]] | dict[str, Any]:
        """The shorter JSON form: :meth:`to_json`'s pairs, or a bitmap of the rows.

        The bitmap form is ``{"from": a, "to": b, "bits": base64}``: bit ``i`` (little-endian
        within each byte) is row ``a + i`` of ``[a, b)``. A set of many short intervals,
        such as the rows of a half-consumed shuffle window, takes about one sixth of a byte
        per row this way, against some 8 to 16 bytes per interval as pairs.
        """
        if len(self._starts) < _MIN_BITMAP_INTERVALS:
            return self.to_json()
        starts, stops = self._starts, self._stops
        first, last = int(starts[0]), int(stops[-1])
        as_pairs = int(_digits(starts).sum() + _digits(stops).sum()) + 6 * len(starts)
        if (last - first + 7) // 8 * 4 // 3 + 40 >= as_pairs:
            return self.to_json()
        # Canonical intervals never touch: every start and stop is a distinct edge.
        edges = np.zeros(last - first + 1, dtype=np.int8)
        edges[starts - first] = 1
        edges[stops - first] = -1
        packed = np.packbits(np.cumsum(edges[:-1]) > 0, bitorder="little")
        return {"from": first, "to": last, "bits": base64.b64encode(packed.tobytes()).decode()}

    @classmethod
    def from_json(cls, data: object) -> IntervalSet:
        """Build from ``[[start, stop], ...]`` or the bitmap form of :meth:`encode`.

        Raises:
            ValueError: If ``data`` is neither a list of ``[start, stop]`` integer pairs nor
                a well-formed bitmap.
        """
        if isinstance(data, dict):
            return cls._from_bitmap(data)
        if not isinstance(data, list):
            raise ValueError(f"intervals must be a list of [start, stop] pairs, got {data!r}")
        for pair in data:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
            ):
                raise ValueError(f"interval {pair!r} is not a [start, stop] pair of integers")
            _check_range(pair[0], pair[1])
        out = cls()
        if len(data) == 1:
            return cls.span(data[0][0], data[0][1])
        if data:
            arr = np.asarray(data, dtype=np.int64)
            out.add_many(arr[:, 0], arr[:, 1])
        return out

    @classmethod
    def _from_bitmap(cls, data: dict[str, Any]) -> IntervalSet:
        first, last, bits = data.get("from"), data.get("to"), data.get("bits")
        if (
            set(data) != {"from", "to", "bits"}
            or not isinstance(first, int)
            or not isinstance(last, int)
            or isinstance(first, bool)
            or isinstance(last, bool)
            or not isinstance(bits, str)
            or not 0 <= first <= last
        ):
            raise ValueError(
                f"interval bitmap {data!r} is not {{'from': a, 'to': b, 'bits': base64}} "
                "with 0 <= a <= b"
            )
        try:
            raw = base64.b64decode(bits, validate=True)
        except ValueError:
            raise ValueError(
                f"interval bitmap from {first} to {last}: bits are not base64"
            ) from None
        if len(raw) != (last - first + 7) // 8:
            raise ValueError(
                f"interval bitmap from {first} to {last} needs {(last - first + 7) // 8} bytes "
                f"of bits, got {len(raw)}"
            )
        member = np.unpackbits(
            np.frombuffer(raw, dtype=np.uint8), count=last - first, bitorder="little"
        )
        return cls.of_mask(member, first)

    @classmethod
    def of_mask(cls, member: npt.NDArray[Any], first: int = 0) -> IntervalSet:
        """The rows ``first + i`` for every ``i`` where ``member[i]`` is true (or 1)."""
        edges = np.diff(member.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        return _set_of(
            _frozen(np.flatnonzero(edges == 1) + first),
            _frozen(np.flatnonzero(edges == -1) + first),
        )


_EMPTY: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
_EMPTY.setflags(write=False)


def _frozen(values: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """``values`` as a read-only int64 array (a set's arrays are shared, never edited)."""
    arr = np.asarray(values, dtype=np.int64)
    arr.setflags(write=False)
    return arr


def _check_range(start: int, stop: int) -> None:
    if start < 0 or stop < start or stop > MAX_ROW:
        raise ValueError(
            f"interval [{start}, {stop}) is not a valid row range; need "
            f"0 <= start <= stop <= {MAX_ROW}"
        )


def runs(rows: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """Sorted, merged ``[start, stop)`` runs that cover exactly the given rows."""
    if len(rows) == 0:
        return []
    values = np.unique(rows)
    breaks = np.nonzero(np.diff(values) != 1)[0] + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(values)]))
    return [(int(values[s]), int(values[e - 1]) + 1) for s, e in zip(starts, stops, strict=True)]


def rows_of_runs(first: npt.ArrayLike, counts: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """The rows ``first[i] .. first[i] + counts[i] - 1`` of each run ``i``, one run after the
    other (the inverse of :func:`runs` for runs in any order), in one pass: no array a run."""
    first = np.asarray(first, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    out = np.repeat(first - (np.cumsum(counts) - counts), counts)
    out += np.arange(len(out), dtype=np.int64)
    return out


_MIN_BITMAP_INTERVALS = 16
"""Sets of fewer intervals are always written as pairs (short, and readable)."""


_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


def _digits(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Decimal digits of each non-negative value."""
    return np.searchsorted(_POWERS_OF_TEN, values, side="right").astype(np.int64) + 1


def union(
    starts: npt.NDArray[np.int64],
    stops: npt.NDArray[np.int64],
    *,
    in_place: bool = False,
    runs: bool = False,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The union of non-empty ``[starts[i], stops[i])`` as sorted, disjoint, non-touching
    intervals.

    Sorting the starts and the stops each on their own is enough: with both sorted, the
    ``k``-th start opens a new interval exactly when it lies after the ``k-1``-th stop.

    Args:
        starts: First row of each interval.
        stops: Row after the last of each interval (each above its start).
        in_place: Sort ``starts`` and ``stops`` themselves rather than copies.
        runs: The intervals are a few sorted runs one after the other (new sets after old
            ones): a merge sort takes them in a few linear passes, four times faster here.
    """
    kind: Literal["stable", "quicksort"] = "stable" if runs else "quicksort"
    if in_place:
        starts.sort(kind=kind)
        stops.sort(kind=kind)
        lo, hi = starts, stops
    else:
        lo, hi = np.sort(starts, kind=kind), np.sort(stops, kind=kind)
    opens = np.flatnonzero(lo[1:] > hi[:-1]) + 1
    first = np.concatenate(([0], opens)) if len(lo) else opens
    last = np.concatenate((opens - 1, [len(hi) - 1])) if len(hi) else opens
    return lo[first], hi[last]


def stack(
    sets: Iterable[tuple[int, IntervalSet]],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The intervals of keyed sets as three arrays ``(key, start, stop)``, set after set."""
    items = [(key, rows) for key, rows in sets if len(rows._starts)]
    if not items:
        return _EMPTY.copy(), _EMPTY.copy(), _EMPTY.copy()
    lengths = np.fromiter((len(rows._starts) for _, rows in items), np.int64, len(items))
    keys = np.fromiter((key for key, _ in items), np.int64, len(items))
    return (
        np.repeat(keys, lengths),
        np.concatenate([rows._starts for _, rows in items]),
        np.concatenate([rows._stops for _, rows in items]),
    )


def unstack(
    key: npt.NDArray[np.int64], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> dict[int, IntervalSet]:
    """The sets of :func:`stack`'s arrays: one set per run of equal keys, holding that
    run's intervals as given (``key`` sorted; each run's intervals sorted, disjoint and not
    touching, as :func:`union` leaves them; not checked).

    The sets are views of two pairs of arrays made for this call: one of the sets of one
    interval (a shard read to its end, or from its start), one of the longer sets. So a set
    kept for the rest of the epoch holds on to the arrays of its own kind alone.
    """
    if not len(key):
        return {}
    heads = np.concatenate(([0], np.flatnonzero(key[1:] != key[:-1]) + 1))
    sizes = np.diff(heads, append=len(key))
    single = sizes == 1
    parts = []
    for part in (single, ~single):
        at = np.repeat(part, sizes)
        parts.append((_frozen(lo[at]), _frozen(hi[at])))
    out: dict[int, IntervalSet] = {}
    taken = [0, 0]  # intervals of each part given out so far
    for k, alone, size in zip(key[heads].tolist(), single.tolist(), sizes.tolist(), strict=True):
        p = 0 if alone else 1
        a = taken[p]
        taken[p] = b = a + size
        starts, stops = parts[p]
        out[k] = _set_of(starts[a:b], stops[a:b])
    return out


def _set_of(starts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64]) -> IntervalSet:
    """A set of intervals already sorted, disjoint and not touching (read-only arrays)."""
    out = IntervalSet.__new__(IntervalSet)
    out._starts, out._stops = starts, stops
    return out
