"""The epoch plan: a pure function of (shards, seed, epoch).

A plan is the ordered list of work units one epoch reads. Shard order and the order of blocks
inside a shard (parquet row groups) are seeded permutations; with no seed both are the
listing order. Orders come from a keyed hash (blake2b and splitmix64), not from a library
random generator, so they are the same on every machine and every numpy version, and a
shard keeps its relative place when the dataset grows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_MASK64 = (1 << 64) - 1


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


def hash64(*parts: object) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process and on every machine."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def permutation(n: int, *key: object) -> npt.NDArray[np.int64]:
    """A permutation of ``range(n)`` determined by ``key`` alone (splitmix64 sort keys)."""
    base = np.uint64(hash64(*key))
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return np.argsort(z, kind="stable").astype(np.int64)


def shard_order(keys: Sequence[str], seed: int | None, epoch: int) -> list[int]:
    """Indices of ``keys`` in the order the epoch reads them."""
    if seed is None:
        return list(range(len(keys)))
    return sorted(range(len(keys)), key=lambda i: (hash64("shard", seed, epoch, keys[i]), i))


def epoch_units(shards: Sequence[PlanShard], seed: int | None, epoch: int) -> list[Unit]:
    """The work units of one epoch, in reading order.

    Units of one shard are adjacent (a shard is opened once), shards come in
    :func:`shard_order`, and the blocks of a seekable shard come in a seeded order.
    """
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    units: list[Unit] = []
    for index in shard_order([s.key for s in shards], seed, epoch):
        shard = shards[index]
        if shard.rows == 0:
            continue
        if shard.blocks is None or shard.rows is None or len(shard.blocks) <= 1:
            units.append(Unit(index, 0, shard.rows))
            continue
        bounds = [*shard.blocks, shard.rows]
        order: Sequence[int] = range(len(shard.blocks))
        if seed is not None:
            order = permutation(len(shard.blocks), "blocks", seed, epoch, shard.key).tolist()
        units.extend(
            Unit(index, bounds[b], bounds[b + 1]) for b in order if bounds[b + 1] > bounds[b]
        )
    return units
