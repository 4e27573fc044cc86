"""The shards a state remembers: one record per shard, or the listing's columns, and the
digests that tell whether a listing holds the same shards. Pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt


class ShardRecord(NamedTuple):
    """A shard as the state remembers it: enough to tell whether it changed.

    A named tuple, not a dataclass: a listing of a million shards makes a million of them
    at every epoch, five times faster this way.
    """

    url: str
    size: int
    version: str
    rows: int | None

    def to_json(self) -> list[Any]:
        return [self.url, self.size, self.version, self.rows]


class ShardTable(Sequence[ShardRecord]):
    """Shards by column: what the state records of a listing, without a :class:`ShardRecord`
    per shard until one is asked for (a million of them take a second to make, and the
    packed form needs only the columns).

    Args:
        urls: Every shard's URL.
        sizes: Every shard's size in bytes.
        versions: Every shard's version ("" when the store gives none).
        counts: Every shard's row count, -1 where unknown.
    """

    __slots__ = ("counts", "sizes", "urls", "versions")

    def __init__(
        self,
        urls: Sequence[str],
        sizes: npt.NDArray[np.int64],
        versions: Sequence[str],
        counts: npt.NDArray[np.int64],
    ) -> None:
        if not len(urls) == len(sizes) == len(versions) == len(counts):
            raise ValueError(
                f"{len(urls)} urls, {len(sizes)} sizes, {len(versions)} versions and "
                f"{len(counts)} counts: need one of each per shard"
            )
        self.urls, self.sizes, self.versions, self.counts = urls, sizes, versions, counts

    def __len__(self) -> int:
        return len(self.urls)

    @overload
    def __getitem__(self, index: int) -> ShardRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[ShardRecord]: ...

    def __getitem__(self, index: int | slice) -> ShardRecord | list[ShardRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        rows = int(self.counts[index])
        return ShardRecord(
            self.urls[index],
            int(self.sizes[index]),
            self.versions[index],
            None if rows < 0 else rows,
        )

    def __iter__(self) -> Iterator[ShardRecord]:
        rows = [None if n < 0 else n for n in self.counts.tolist()]
        return map(ShardRecord, self.urls, self.sizes.tolist(), self.versions, rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def row_counts(shards: Sequence[ShardRecord]) -> npt.NDArray[np.int64]:
    """Every shard's row count as an array, -1 where it is unknown."""
    return np.fromiter(
        (-1 if s.rows is None else s.rows for s in shards), dtype=np.int64, count=len(shards)
    )


def digest(shards: Sequence[ShardRecord]) -> str:
    """sha256 over (url, size, version) of each shard, in order."""
    h = hashlib.sha256()
    for s in shards:
        h.update(json.dumps([s.url, s.size, s.version]).encode())
    return h.hexdigest()


def packed_digest(shards: Sequence[ShardRecord]) -> str:
    """sha256 over every shard's ``(url, size, version)`` (version 3; faster than
    :func:`digest`): the UTF-8 URLs and versions, each column after its lengths, and the
    sizes, as little-endian int64."""
    return ShardColumns.of(shards).digest()


class ShardColumns(NamedTuple):
    """A listing by column, for the packed form."""

    urls: Sequence[str]
    sizes: npt.NDArray[np.int64]
    versions: Sequence[str]

    @classmethod
    def of(cls, shards: Sequence[ShardRecord]) -> ShardColumns:
        if isinstance(shards, ShardTable):
            return cls(shards.urls, shards.sizes, shards.versions)
        if not shards:
            return cls((), np.zeros(0, dtype=np.int64), ())
        urls, sizes, versions, _ = zip(*shards, strict=True)
        return cls(urls, np.fromiter(sizes, np.int64, len(sizes)), versions)

    def digest(self) -> str:
        """:func:`packed_digest` of these columns."""
        h = hashlib.sha256()
        for column in (self.urls, self.versions):
            text, lengths = utf8_joined(column)
            h.update(lengths.astype("<i8").tobytes())
            h.update(text)
        h.update(self.sizes.astype("<i8").tobytes())
        return h.hexdigest()


def utf8_joined(values: Sequence[str]) -> tuple[bytes, npt.NDArray[np.int64]]:
    """The UTF-8 bytes of ``values`` one after the other, and the length of each in bytes."""
    joined = "".join(values)
    if joined.isascii():  # as URLs and etags nearly always are: one encode for all
        return joined.encode("ascii"), np.fromiter(map(len, values), np.int64, len(values))
    encoded = [v.encode() for v in values]
    return b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(encoded))
