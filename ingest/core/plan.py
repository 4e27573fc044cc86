"""The epoch plan: a pure function of (shards, seed, epoch).

A plan is the ordered list of work units one epoch reads. Shard order and the order of blocks
inside a shard (parquet row groups) are seeded permutations; with no seed both are the
listing order. Orders come from a keyed hash (blake2b and splitmix64), not from a library
random generator, so they are the same on every machine and every numpy version, and a
shard keeps its relative place when the dataset grows.

An epoch of a million shards has millions of units, so the plan is computed with numpy and
kept as arrays (:class:`Units`); a :class:`Unit` object is made only when one is asked for.
"""

from __future__ import annotations

import bisect
import hashlib
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True, slots=True)
class PlanShard:
    """What the plan needs to know of one shard.

    Attributes:
        key: A stable identity, the shard URL.
        rows: Row count, or None when the format cannot tell without reading the shard.
        blocks: Row offsets where independently seekable blocks start (parquet row groups),
            or None when the shard can only be read front to back.
    """

    key: str
    rows: int | None
    blocks: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Unit:
    """One work unit: rows ``[start, stop)`` of shard ``shard`` (``stop`` None: to the end)."""

    shard: int
    start: int
    stop: int | None

    def covers_all(self, rows: int | None) -> bool:
        return self.start == 0 and (self.stop is None or self.stop == rows)


@dataclass(frozen=True, slots=True, eq=False)
class Units(Sequence[Unit]):
    """Work units in reading order, kept as three int64 arrays of equal length.

    A sequence of :class:`Unit`; equal to another sequence with the same units.

    Attributes:
        shard: Shard index of each unit.
        start: First row of each unit.
        stop: Row after the last of each unit; -1 for "to the end" (``Unit.stop`` None).
    """

    shard: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    stop: npt.NDArray[np.int64]

    __hash__ = None  # type: ignore[assignment]  # holds mutable arrays

    def __len__(self) -> int:
        return len(self.shard)

    @overload
    def __getitem__(self, index: int) -> Unit: ...

    @overload
    def __getitem__(self, index: slice) -> Units: ...

    def __getitem__(self, index: int | slice) -> Unit | Units:
        if isinstance(index, slice):
            return Units(self.shard[index], self.start[index], self.stop[index])
        stop = int(self.stop[index])
        return Unit(int(self.shard[index]), int(self.start[index]), None if stop < 0 else stop)

    def __iter__(self) -> Iterator[Unit]:
        for shard, start, stop in zip(
            self.shard.tolist(), self.start.tolist(), self.stop.tolist(), strict=True
        ):
            yield Unit(shard, start, None if stop < 0 else stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Units):
            return bool(
                np.array_equal(self.shard, other.shard)
                and np.array_equal(self.start, other.start)
                and np.array_equal(self.stop, other.stop)
            )
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Units({len(self)} units)"


def hash64(*parts: object) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process and on every machine."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def hash64_many(keys: Sequence[str], *prefix: object) -> npt.NDArray[np.uint64]:
    """``hash64(*prefix, key)`` of every key of ``keys``, as a uint64 array."""
    head = "".join(f"{part!s}\x1f" for part in prefix)
    blake = hashlib.blake2b
    digests = b"".join([blake((head + str(k)).encode(), digest_size=8).digest() for k in keys])
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def _splitmix(bases: npt.NDArray[np.uint64], n: int, scratch: npt.NDArray[np.uint64]) -> None:
    """Fill ``scratch`` (shape ``bases.shape + (n,)``) with the splitmix64 keys of ``range(n)``."""
    z, t = scratch, np.empty_like(scratch)
    with np.errstate(over="ignore"):
        np.multiply(np.arange(n, dtype=np.uint64), _GOLDEN, out=z)
        z += bases[..., None]
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 0)):
            np.right_shift(z, np.uint64(shift), out=t)
            z ^= t
            if factor:
                z *= np.uint64(factor)


def _sort_keys(bases: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.int64]:
    """Per base (last axis added), the order of ``range(n)`` by splitmix64 sort keys.

    The keys of one base are distinct (``i * _GOLDEN + base`` is one-to-one, and so is each
    splitmix64 step), so every sort gives the same order. Sorting values beats an argsort
    several times over: each key keeps its high bits and carries its index in the low
    ``bits``. Where two keys of one base share their high bits (odds about
    ``n**2 / 2**(65 - bits)``: once in millions of windows), the whole keys are argsorted.
    """
    keys = np.empty((*bases.shape, n), dtype=np.uint64)
    _splitmix(bases, n, keys)
    bits = max(1, (n - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    keys &= ~low
    keys |= np.arange(n, dtype=np.uint64)
    keys.sort(axis=-1)
    if n > 1:
        tie = np.bitwise_xor(keys[..., 1:], keys[..., :-1])
        if (tie <= low).any():
            _splitmix(bases, n, keys)
            return np.argsort(keys, axis=-1).astype(np.int64)
    keys &= low
    return keys.view(np.int64)


def permutation(n: int, *key: object) -> npt.NDArray[np.int64]:
    """A permutation of ``range(n)`` determined by ``key`` alone (splitmix64 sort keys)."""
    return _sort_keys(np.asarray(hash64(*key), dtype=np.uint64), n)


def permutations(n: int, bases: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """One permutation of ``range(n)`` per base, as the rows of an ``(len(bases), n)`` array.

    Row ``i`` is ``permutation(n, *key)`` when ``bases[i] == hash64(*key)``.
    """
    return _sort_keys(np.asarray(bases, dtype=np.uint64), n)


def shard_order(keys: Sequence[str], seed: int | None, epoch: int) -> list[int]:
    """Indices of ``keys`` in the order the epoch reads them."""
    order: list[int] = _shard_order(keys, seed, epoch).tolist()
    return order


def _shard_order(keys: Sequence[str], seed: int | None, epoch: int) -> npt.NDArray[np.int64]:
    if seed is None:
        return np.arange(len(keys), dtype=np.int64)
    # A stable sort by hash is a sort by (hash, index).
    return np.argsort(hash64_many(keys, "shard", seed, epoch), kind="stable").astype(np.int64)


@dataclass(frozen=True, slots=True)
class _Blocks:
    """The units of the shards with one block count, one row per shard, in read order."""

    shards: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    stops: npt.NDArray[np.int64]
    keep: npt.NDArray[np.bool_]
    """Units that hold rows (a block may be empty)."""


def unit_of(rows: int | None, blocks: Sequence[int] | None, row: int) -> tuple[int, int | None]:
    """Rows ``[start, stop)`` of the unit of :func:`epoch_units` that holds ``row`` of a shard
    of ``rows`` rows (None: unknown; ``stop`` None then) and ``blocks``: its block, or the
    whole shard where it is one unit (an unknown count, no blocks or a single block)."""
    if rows is None or not blocks or len(blocks) <= 1:
        return 0, rows
    at = bisect.bisect_right(blocks, row) - 1
    return int(blocks[max(at, 0)]), int(blocks[at + 1]) if at + 1 < len(blocks) else rows


def epoch_units(shards: Sequence[PlanShard], seed: int | None, epoch: int) -> Units:
    """The work units of one epoch, in reading order.

    Units of one shard are adjacent (a shard is opened once), shards come in
    :func:`shard_order`, and the blocks of a seekable shard come in a seeded order
    (``permutation(len(blocks), "blocks", seed, epoch, key)``). A shard with no rows has no
    unit; one with an unknown count, no blocks or a single block is one unit from row 0.

    Raises:
        ValueError: If ``epoch`` is negative.
    """
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    n = len(shards)
    keys = list(map(operator.attrgetter("key"), shards))
    counted = list(map(operator.attrgetter("rows"), shards))
    rows = np.fromiter((-1 if r is None else r for r in counted), np.int64, n)
    blocks = np.fromiter(
        (0 if b is None else len(b) for b in map(operator.attrgetter("blocks"), shards)),
        np.int64,
        n,
    )
    blocks[rows < 0] = 0  # an unknown count is one unit, whatever the blocks
    counts = np.zeros(n, dtype=np.int64)
    single = (rows != 0) & (blocks <= 1)
    counts[single] = 1
    # Shards of k > 1 blocks, k at a time: (shards, k) arrays of unit bounds in read order.
    multi = (rows > 0) & (blocks > 1)
    groups: list[_Blocks] = []
    for k in np.unique(blocks[multi]).tolist():
        idx = np.flatnonzero(multi & (blocks == k))
        bounds = np.empty((len(idx), k + 1), dtype=np.int64)
        bounds[:, :k] = np.array([shards[i].blocks for i in idx.tolist()], dtype=np.int64)
        bounds[:, k] = rows[idx]
        if seed is None:
            order = np.broadcast_to(np.arange(k, dtype=np.int64), (len(idx), k))
        else:
            picked = [keys[i] for i in idx.tolist()]
            order = permutations(k, hash64_many(picked, "blocks", seed, epoch))
        starts = np.take_along_axis(bounds, order, axis=1)
        stops = np.take_along_axis(bounds, order + 1, axis=1)
        keep = stops > starts
        counts[idx] = keep.sum(axis=1)
        groups.append(_Blocks(idx, starts, stops, keep))
    # Where each shard's first unit goes: shards in reading order, their units adjacent.
    reading = _shard_order(keys, seed, epoch)
    first = np.empty(n, dtype=np.int64)
    ordered = counts[reading]
    first[reading] = np.cumsum(ordered) - ordered
    total = int(counts.sum())
    shard = np.empty(total, dtype=np.int64)
    start = np.empty(total, dtype=np.int64)
    stop = np.empty(total, dtype=np.int64)
    idx = np.flatnonzero(single)
    at = first[idx]
    shard[at], start[at], stop[at] = idx, 0, rows[idx]
    for g in groups:
        at = (first[g.shards][:, None] + np.cumsum(g.keep, axis=1) - 1)[g.keep]
        shard[at] = np.broadcast_to(g.shards[:, None], g.keep.shape)[g.keep]
        start[at], stop[at] = g.starts[g.keep], g.stops[g.keep]
    return Units(shard, start, stop)
