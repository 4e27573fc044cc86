"""Interval sets keyed by shard index, handled all at once in numpy.

A fold of the acks adds the rows of tens of thousands of shards to their sets
(:func:`merge_into`), a resume counts the rows of millions of spans that the sets hold
(:func:`covered`), and the state's columns walk the sets through the arrays of
:func:`ingest.core.intervals.stack` (:func:`set_bounds`): one numpy pass each, not one call
per shard. Pure Python and numpy, no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ingest.core.intervals import IntervalSet, stack, union, unstack


def covered(
    sets: Mapping[int, IntervalSet],
    keys: npt.ArrayLike,
    starts: npt.ArrayLike,
    stops: npt.ArrayLike,
) -> npt.NDArray[np.int64]:
    """For each range ``[starts[i], stops[i])``: how many of its rows ``sets[keys[i]]`` holds.

    All ranges at once: the sets' intervals laid end to end in ``(key, row)`` order, a running
    count of their rows, and two sorted searches per range.

    Raises:
        ValueError: If a key or a start is negative, a stop is before its start, or rows
            reach beyond what packs with the keys into 64 bits.
    """
    key = np.asarray(keys, dtype=np.int64).ravel()
    a = np.asarray(starts, dtype=np.int64).ravel()
    b = np.asarray(stops, dtype=np.int64).ravel()
    if len(key) and (int(key.min()) < 0 or int(a.min()) < 0 or bool((b < a).any())):
        raise ValueError("ranges need keys >= 0 and 0 <= start <= stop")
    s_key, lo, hi = stack((k, got) for k in _distinct(key) if (got := sets.get(k)) is not None)
    if not len(s_key):
        return np.zeros(len(key), dtype=np.int64)
    row_bits = max(int(hi.max()), int(b.max())).bit_length()
    if max(int(key.max()), int(s_key.max())).bit_length() + row_bits > 63:
        raise ValueError(f"rows up to {max(int(hi.max()), int(b.max()))} are too large to count")
    base = s_key << row_bits
    lo, hi = lo + base, hi + base
    before = np.concatenate(([0], np.cumsum(hi - lo)))  # rows of the intervals before each

    def below(x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Rows of all sets below packed ``x``."""
        j = np.searchsorted(lo, x, side="right")  # intervals that start at or before x
        past = np.where(j > 0, np.maximum(hi[np.maximum(j - 1, 0)] - x, 0), 0)
        return before[j] - past  # type: ignore[no-any-return]

    packed = key << row_bits
    return below(packed + b) - below(packed + a)


class Merged(NamedTuple):
    """New interval sets, and their intervals as arrays."""

    sets: dict[int, IntervalSet]
    key: npt.NDArray[np.int64]
    """The key of each interval: set after set, keys ascending."""
    start: npt.NDArray[np.int64]
    stop: npt.NDArray[np.int64]


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
    return merge_into(sets, keys, starts, stops).sets


def merge_into(
    sets: Mapping[int, IntervalSet],
    keys: npt.ArrayLike,
    starts: npt.ArrayLike,
    stops: npt.ArrayLike,
) -> Merged:
    """:func:`union_into`, with the new sets' intervals as arrays too (no pass over the sets).

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
    if not nonempty.all():
        key, lo, hi = key[nonempty], lo[nonempty], hi[nonempty]
    old = stack((k, got) for k in _distinct(key) if (got := sets.get(k)) is not None)
    given_sorted = bool(
        (key[1:] >= key[:-1]).all() and (lo[1:] >= lo[:-1])[key[1:] == key[:-1]].all()
    )
    key = np.concatenate((key, old[0]))
    lo = np.concatenate((lo, old[1]))
    hi = np.concatenate((hi, old[2]))
    if not len(key):
        return Merged({}, key, lo, hi)
    row_bits = int(hi.max()).bit_length()
    if int(key.max()).bit_length() + row_bits <= 63:
        packed = key << row_bits
        lo += packed
        hi += packed
        # Runs of one rank (merged, so sorted) and then the old sets (in key order): two
        # sorted runs when the given intervals were sorted.
        first, last = union(lo, hi, in_place=True, runs=given_sorted)
        key = first >> row_bits
        packed = key << row_bits
        first -= packed
        last -= packed
        return Merged(unstack(key, first, last), key, first, last)
    # Rows too large to pack with the keys (counts unknown): one key at a time.
    order = np.argsort(key, kind="stable")
    key, lo, hi = key[order], lo[order], hi[order]
    heads, tails = set_bounds(key)
    out: dict[int, IntervalSet] = {}
    for a, b in zip(heads.tolist(), tails.tolist(), strict=True):
        rows = out[int(key[a])] = IntervalSet()
        rows.add_many(lo[a:b], hi[a:b])
    return Merged(out, *stack(out.items()))


def _distinct(key: npt.NDArray[np.int64]) -> list[int]:
    """The distinct values of ``key`` (non-negative), in order, without sorting ``key``."""
    if not len(key):
        return []
    if bool((key[1:] >= key[:-1]).all()):  # sorted, as the runs of one rank are
        heads = np.concatenate(([0], np.flatnonzero(key[1:] != key[:-1]) + 1))
        return key[heads].tolist()  # type: ignore[no-any-return]
    top = int(key.max())
    if top >= 4 * len(key) + 1024:
        return np.unique(key).tolist()  # type: ignore[no-any-return]
    seen = np.zeros(top + 1, dtype=bool)
    seen[key] = True
    return np.flatnonzero(seen).tolist()  # type: ignore[no-any-return]


def set_bounds(
    key: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """First and after-last index of each set in :func:`ingest.core.intervals.stack`'s arrays."""
    bounds = np.flatnonzero(key[1:] != key[:-1]) + 1
    if not len(key):
        return bounds, bounds
    return np.concatenate(([0], bounds)), np.concatenate((bounds, [len(key)]))
