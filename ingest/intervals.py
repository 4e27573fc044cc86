"""Sets of row offsets stored as sorted, disjoint, half-open intervals.

The consumed rows of a shard are one :class:`IntervalSet`. A shard read in order is one
interval; a shard whose window was cut into batches only in part holds about one interval
per two rows of its piece of the window until the rest is consumed: :meth:`IntervalSet.encode`
writes such a set as a bitmap, and :meth:`IntervalSet.add_many` merges thousands of acked
runs at once. Pure Python and numpy, no Ray.
"""

from __future__ import annotations

import base64
import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

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
        if not nonempty.any():
            return
        lo = np.concatenate((np.asarray(self._starts, dtype=np.int64), lo[nonempty]))
        hi = np.concatenate((np.asarray(self._stops, dtype=np.int64), hi[nonempty]))
        merged_starts, merged_stops = union(lo, hi)
        self._starts, self._stops = merged_starts.tolist(), merged_stops.tolist()

    def update(self, other: IntervalSet) -> None:
        """Add every interval of ``other``."""
        if len(other._starts) > 8:
            self.add_many(other._starts, other._stops)
            return
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

    def encode(self) -> list[list[int]] | dict[str, Any]:
        """The shorter JSON form: :meth:`to_json`'s pairs, or a bitmap of the rows.

        The bitmap form is ``{"from": a, "to": b, "bits": base64}``: bit ``i`` (little-endian
        within each byte) is row ``a + i`` of ``[a, b)``. A set of many short intervals,
        such as the rows of a half-consumed shuffle window, takes about one sixth of a byte
        per row this way, against some 8 to 16 bytes per interval as pairs.
        """
        if len(self._starts) < _MIN_BITMAP_INTERVALS:
            return self.to_json()
        first, last = self._starts[0], self._stops[-1]
        starts = np.asarray(self._starts, dtype=np.int64)
        stops = np.asarray(self._stops, dtype=np.int64)
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
        ).astype(bool)
        edges = np.diff(np.concatenate(([False], member, [False])).astype(np.int8))
        out = cls()
        out._starts = (np.flatnonzero(edges == 1) + first).tolist()
        out._stops = (np.flatnonzero(edges == -1) + first).tolist()
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


_MIN_BITMAP_INTERVALS = 16
"""Sets of fewer intervals are always written as pairs (short, and readable)."""


_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)


def _digits(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Decimal digits of each non-negative value."""
    return np.searchsorted(_POWERS_OF_TEN, values, side="right").astype(np.int64) + 1


def union(
    starts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64], *, in_place: bool = False
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The union of non-empty ``[starts[i], stops[i])`` as sorted, disjoint, non-touching
    intervals.

    Sorting the starts and the stops each on their own is enough: with both sorted, the
    ``k``-th start opens a new interval exactly when it lies after the ``k-1``-th stop.

    Args:
        starts: First row of each interval.
        stops: Row after the last of each interval (each above its start).
        in_place: Sort ``starts`` and ``stops`` themselves rather than copies.
    """
    if in_place:
        starts.sort()
        stops.sort()
        lo, hi = starts, stops
    else:
        lo, hi = np.sort(starts), np.sort(stops)
    opens = np.flatnonzero(lo[1:] > hi[:-1]) + 1
    first = np.concatenate(([0], opens)) if len(lo) else opens
    last = np.concatenate((opens - 1, [len(hi) - 1])) if len(hi) else opens
    return lo[first], hi[last]


def stack(
    sets: Iterable[tuple[int, IntervalSet]],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The intervals of keyed sets as three arrays ``(key, start, stop)``, set after set."""
    keys: list[int] = []
    starts: list[int] = []
    stops: list[int] = []
    for key, rows in sets:
        keys.extend([key] * len(rows._starts))
        starts.extend(rows._starts)
        stops.extend(rows._stops)
    return (
        np.asarray(keys, dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        np.asarray(stops, dtype=np.int64),
    )


def union_into(
    sets: Mapping[int, IntervalSet],
    keys: npt.ArrayLike,
    starts: npt.ArrayLike,
    stops: npt.ArrayLike,
) -> dict[int, IntervalSet]:
    """For every key of ``keys``: a new set, ``sets[key]`` (if any) with the given intervals.

    The intervals ``[starts[i], stops[i])`` of key ``keys[i]`` may come in any order. The
    sets of ``sets`` are not changed: the caller puts the answer in their place, so a shallow
    copy of ``sets`` taken before keeps the old ones. All keys are merged in one numpy sort
    of the packed ``(key, row)`` values, not one call per key: a snapshot of a thousand ranks
    adds the rows of tens of thousands of shards at once.

    Raises:
        ValueError: If a key or a start is negative, or a stop is before its start.
    """
    key = np.asarray(keys, dtype=np.int64).ravel()
    lo = np.asarray(starts, dtype=np.int64).ravel()
    hi = np.asarray(stops, dtype=np.int64).ravel()
    if not len(key) == len(lo) == len(hi):
        raise ValueError(f"{len(key)} keys, {len(lo)} starts and {len(hi)} stops: need as many")
    bad = np.flatnonzero((key < 0) | (lo < 0) | (hi < lo))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"interval [{lo[i]}, {hi[i]}) of key {key[i]} is not a valid row range; "
            "need 0 <= start <= stop and a key >= 0"
        )
    nonempty = hi > lo
    key, lo, hi = key[nonempty], lo[nonempty], hi[nonempty]
    if len(key) and bool((key[1:] >= key[:-1]).all()):  # sorted: runs from the ledger are
        touched = key[np.concatenate(([0], np.flatnonzero(np.diff(key)) + 1))].tolist()
    else:
        touched = np.unique(key).tolist()
    old = stack((k, sets[k]) for k in touched if k in sets)
    key = np.concatenate((key, old[0]))
    lo = np.concatenate((lo, old[1]))
    hi = np.concatenate((hi, old[2]))
    if not len(key):
        return {}
    row_bits = int(hi.max()).bit_length()
    if int(key.max()).bit_length() + row_bits <= 63:
        packed = key << row_bits
        first, last = union(packed + lo, packed + hi)
        key = first >> row_bits
        lo, hi = first - (key << row_bits), last - (key << row_bits)
        return _sets_of(key, lo, hi)
    # Rows too large to pack with the keys (counts unknown): one key at a time.
    order = np.argsort(key, kind="stable")
    key, lo, hi = key[order], lo[order], hi[order]
    out: dict[int, IntervalSet] = {}
    for k, group in _sets_of(key, lo, hi).items():
        merged = union(np.asarray(group._starts), np.asarray(group._stops))
        out[k] = _set_of(merged[0].tolist(), merged[1].tolist())
    return out


def _set_of(starts: list[int], stops: list[int]) -> IntervalSet:
    """A set from intervals already sorted, disjoint and not touching."""
    out = IntervalSet()
    out._starts, out._stops = starts, stops
    return out


def _sets_of(
    key: npt.NDArray[np.int64], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> dict[int, IntervalSet]:
    """One set per run of equal keys (``key`` sorted), holding that run's intervals as given."""
    heads = [0, *(np.flatnonzero(np.diff(key)) + 1).tolist(), len(key)]
    keys, starts, stops = key.tolist(), lo.tolist(), hi.tolist()
    return {keys[a]: _set_of(starts[a:b], stops[a:b]) for a, b in itertools.pairwise(heads)}
