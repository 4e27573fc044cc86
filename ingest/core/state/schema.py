"""Stream state: small, plain, versioned JSON in named parts. Pure; no Ray, opens no file.

Layout, one part per concern, each validated by its own class::

    {"version": 2,
     "dataset": {"sources": [...], "digest": "sha256...",            # DatasetState
                 "shards": [[url, size, version, rows or null], ...]},
     "progress": {"epoch": 2, "first_step": 96, "step": 120,          # ProgressState
                  "delivered": 123456, "dropped": 0,
                  "consumed": {"done": [[0, 40]],                     # shards fully consumed
                               "partial": {"41": [[0, 512], ...]},    # rows of the others
                               "rows": {"41": 9000}},                 # counts learnt by reading
                  "quarantined": [{"url": ..., "start": 500,          # on_error="skip" only:
                                   "stop": 1000, "reason": ...}]},    # rows skipped, consumed
     "distributed": {"world_size": 4,                                 # DistributedState
                     "carry": {"spans": [[3, 0, 17]], "consumed": {}}},
     "position": {"seed": 0, "batch_size": 1024,                      # PositionState
                  "shuffle": {"window": 16384, "lanes": 16},
                  "ranks": [cursor or null, ...]}}

``progress.step`` is the next global step; ``first_step`` the step the epoch began at.
``distributed.carry`` holds the rows carried in from the previous epoch (equal steps per
rank). ``position`` says where each rank's reading order stood: with the same seed, shuffle
and world size a restored stream continues with exactly the batches of the uninterrupted
run; without it the rest of the epoch is shared out again. Exactly-once rests on
``progress`` and ``carry`` alone, never on the position.

A set of consumed rows (``partial``, ``carry.consumed``) is ``[[start, stop], ...]`` or,
when shorter, a bitmap ``{"from": a, "to": b, "bits": base64}``
(:meth:`ingest.core.intervals.IntervalSet.encode`).

Version 3: a listing of :data:`PACK_FROM_SHARDS` shards or more is packed, so that a million
shards take a few MB, not a hundred (the state of a smaller one stays version 2, readable by
the releases before)::

     "dataset": {"sources": [...], "digest": "sha256...",
                 "packed": {"count": 1000000, "prefix": "s3://bucket/train/",
                            "urls": z, "rows": z, "size_hashes": z, "version_hashes": z,
                            "sha256": "..."}},
     "progress": {..., "consumed": {"done": intervals or bitmap of shard indices,
                                    "partial": {"packed": {"shards": z, "from": z,
                                                           "to": z, "bits": z}}, ...}}

Each ``z`` is a column, zlib-compressed and base64-encoded (integers little-endian, byte
planes apart). In ``dataset.packed``: the URLs after ``prefix`` front-coded (bytes shared
with the previous URL, then the rest), the row counts (-1: unknown), an 8-bit hash of each
size and a 16-bit hash of each version (0: no version). ``packed.sha256`` covers ``count``,
``prefix`` and every column, so an edited column is refused. ``digest`` covers the full
``(url, size, version)`` of every shard (:func:`packed_digest`) and is checked against the
listing on restore (:func:`match_listing`): a shard changed in place is always refused, and
the hashes name it (a size change escapes being named once in 256, a version change once in
65,536; then the message says that some shard changed). In ``partial.packed``: the shard
indices (as differences), and for each set its first row, its extent and its rows as bits
(one bitmap per set, byte-aligned, in ``bits``).

Shard indices refer to the shards of the state itself, so a dataset that grew (new shards
only) still resolves every saved index. The size is O(shards + ranks x lanes).

Validation. A state is checked before it is used: JSON text larger than ``max_bytes``
(:data:`MAX_STATE_BYTES` by default) before it is parsed (:meth:`StreamState.from_json`,
:meth:`StreamState.read` for a file), and JSON nested deeper than Python's recursion limit
(a state nests a few levels); then the version, every count and offset (integers
from 0 to :data:`MAX_OFFSET`), intervals against their shard's row count, a learnt row count
against the listing's, each saved position's layout, and ``progress.step`` against the rows
consumed (:meth:`StreamState.check_counts`). Where it is loaded, the listing is checked
against ``dataset`` (:func:`match_listing`) and the saved positions against the plan they
resume (:func:`ingest.core.positions.check_positions`). Each refusal names the field, its value, the
rule and the fix (:data:`FIX`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import sys
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, NamedTuple, overload

import numpy as np
import numpy.typing as npt

from ingest.core.errors import StateError
from ingest.core.intervals import MAX_ROW, IntervalSet, stack
from ingest.core.keyed import set_bounds
from ingest.core.quarantine import Quarantined, check_saved

STATE_VERSION = 3
"""The newest version this ingest writes; it reads :data:`READ_VERSIONS`."""
READ_VERSIONS = (2, 3)
MAX_STATE_BYTES = 256 << 20
"""States larger than this are refused before parsing (a state is O(shards))."""
PACK_FROM_SHARDS = 10_000
"""Listings of this many shards or more are written packed (version 3)."""
MAX_OFFSET = MAX_ROW
"""The largest count, size or offset a state may hold (row offsets are packed with shard
indices into 64-bit integers)."""


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


def packed_digest(shards: Sequence[ShardRecord]) -> str:
    """sha256 over every shard's ``(url, size, version)`` (version 3; faster than
    :func:`digest`): the UTF-8 URLs and versions, each column after its lengths, and the
    sizes, as little-endian int64."""
    return _Columns.of(shards).digest()


class _Columns(NamedTuple):
    """A listing by column, for the packed form."""

    urls: Sequence[str]
    sizes: npt.NDArray[np.int64]
    versions: Sequence[str]

    @classmethod
    def of(cls, shards: Sequence[ShardRecord]) -> _Columns:
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
            text, lengths = _utf8(column)
            h.update(lengths.astype("<i8").tobytes())
            h.update(text)
        h.update(self.sizes.astype("<i8").tobytes())
        return h.hexdigest()


def _utf8(values: Sequence[str]) -> tuple[bytes, npt.NDArray[np.int64]]:
    """The UTF-8 bytes of ``values`` one after the other, and the length of each in bytes."""
    joined = "".join(values)
    if joined.isascii():  # as URLs and etags nearly always are: one encode for all
        return joined.encode("ascii"), np.fromiter(map(len, values), np.int64, len(values))
    encoded = [v.encode() for v in values]
    return b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(encoded))


def digest(shards: Sequence[ShardRecord]) -> str:
    """sha256 over (url, size, version) of each shard, in order."""
    h = hashlib.sha256()
    for s in shards:
        h.update(json.dumps([s.url, s.size, s.version]).encode())
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Completion:
    """Which shards of a :class:`Progress` are done, and which are consumed in part.

    The coordinator keeps one beside its progress and updates it with the shards each fold
    touches (:meth:`Progress.add_sets`), so that a snapshot's JSON costs what changed since
    the last one, not a pass over every consumed shard (half a million sets half-way through
    an epoch of a million shards). It holds for the sets it was made with: sets are replaced,
    never changed in place.
    """

    done: npt.NDArray[np.bool_]
    """One entry per shard: every row consumed (read-only)."""
    partial: frozenset[int]
    """Shards with some rows consumed, not all (or all of a shard whose count is unknown)."""
    sets: int
    """``len(consumed)`` it was made for (a cheap check that no set was added past it)."""

    @classmethod
    def of(cls, consumed: Mapping[int, IntervalSet], counts: npt.NDArray[np.int64]) -> Completion:
        """The completion of every set of ``consumed``; ``counts``: rows per shard (-1: unknown)."""
        empty = cls(np.zeros(len(counts), dtype=bool), frozenset(), 0)
        return empty.updated([stack(consumed.items())], counts, len(consumed))

    def updated(
        self, parts: Iterable[Intervals], counts: npt.NDArray[np.int64], sets: int
    ) -> Completion:
        """This completion with new sets in place of the old ones of their shards.

        Args:
            parts: The new sets' intervals, set after set (:func:`ingest.core.intervals.stack`),
                part after part; a shard's set in a later part replaces the one before.
            counts: Every shard's row count (-1: unknown).
            sets: ``len(consumed)`` with the new sets in.
        """
        done = self.done.copy()
        partial = set(self.partial)
        for key, lo, hi in parts:
            heads, _ = set_bounds(key)
            keys = key[heads]
            rows = counts[keys]
            # A set covers its shard when its first interval runs from row 0 to the count.
            whole = (lo[heads] == 0) & (hi[heads] >= rows) & (rows >= 0)
            done[keys] = whole
            partial.difference_update(keys[whole].tolist())
            partial.update(keys[~whole].tolist())
        done.setflags(write=False)
        return Completion(done, frozenset(partial), sets)


Intervals = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""``(key, start, stop)``: keyed sets' intervals, set after set
(:func:`ingest.core.intervals.stack`)."""


@dataclass(slots=True)
class Progress:
    """What one epoch has consumed: an interval set per shard index."""

    consumed: dict[int, IntervalSet] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)
    """Row counts learnt by reading shards whose listing gave none."""
    completion: Completion | None = field(default=None, repr=False, compare=False)
    """Kept by :meth:`add_sets` when the caller gives the row counts; None: found anew."""

    def rows_of(self, index: int, shards: Sequence[ShardRecord]) -> int | None:
        known = shards[index].rows
        return known if known is not None else self.rows.get(index)

    def of(self, index: int) -> IntervalSet:
        got = self.consumed.get(index)
        if got is None:
            got = self.consumed[index] = IntervalSet()
        return got

    def count(self) -> int:
        _, lo, hi = stack(self.consumed.items())
        return int((hi - lo).sum())

    def copy(self) -> Progress:
        return Progress(
            {k: v.copy() for k, v in self.consumed.items()}, dict(self.rows), self.completion
        )

    def shallow(self) -> Progress:
        """A copy that shares the interval sets (for a caller that replaces sets, never
        changes them: :meth:`add_sets`)."""
        return Progress(dict(self.consumed), dict(self.rows), self.completion)

    def add_sets(
        self,
        new: Mapping[int, IntervalSet],
        counts: npt.NDArray[np.int64] | None = None,
        parts: Sequence[Intervals] | None = None,
    ) -> None:
        """Put the sets of ``new`` in place of the sets of their shards.

        Args:
            new: The new sets (each holds the old set's rows and more).
            counts: Every shard's row count (-1: unknown). Given, the completion is kept up
                to date with the shards of ``new`` alone (made from all sets the first
                time); None drops it.
            parts: The intervals of ``new`` as arrays, if the caller has them
                (:class:`ingest.core.keyed.Merged`), in the order the sets were made.
        """
        self.consumed.update(new)
        if counts is None:
            self.completion = None
        elif self.completion is None or len(self.completion.done) != len(counts):
            self.completion = Completion.of(self.consumed, counts)
        else:
            got = parts if parts is not None else [stack(new.items())]
            self.completion = self.completion.updated(got, counts, len(self.consumed))

    def counts(self, listed: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Every shard's row count (-1: unknown): ``listed``, with the learnt ones filled in."""
        if not self.rows:
            return listed
        out = listed.copy()
        learnt = np.fromiter(self.rows, np.int64, len(self.rows))
        values = np.fromiter(self.rows.values(), np.int64, len(self.rows))
        unknown = out[learnt] < 0
        out[learnt[unknown]] = values[unknown]
        return out

    def completed(self, listed: npt.NDArray[np.int64]) -> Completion:
        """Which shards are done and which partial; ``listed``: the listing's row counts."""
        got = self.completion
        if (
            got is not None
            and got.sets == len(self.consumed)
            and not self.rows
            and len(got.done) == len(listed)
        ):
            return got
        return Completion.of(self.consumed, self.counts(listed))

    def to_json(
        self,
        shards: Sequence[ShardRecord],
        *,
        packed: bool = False,
        listed: npt.NDArray[np.int64] | None = None,
    ) -> dict[str, Any]:
        """The JSON form; ``packed`` writes ``done`` and ``partial`` as bitmaps when shorter.

        Args:
            shards: The shards the indices refer to.
            packed: Write the version 3 form.
            listed: Every shard's row count in the listing (-1: unknown), if the caller
                keeps it (:attr:`DatasetState.counts`); else read from ``shards``.
        """
        if listed is None:
            listed = row_counts(shards)
        completion = self.completed(listed)
        # Shards with no row to consume are done too (listed, or learnt, with 0 rows).
        done_mask = completion.done | (self.counts(listed) == 0)
        done = IntervalSet.of_mask(done_mask)
        partial = sorted(k for k in completion.partial if not done_mask[k])
        if packed:
            sets = stack((k, self.consumed[k]) for k in partial)
            partial_json: dict[str, Any] = {"packed": _pack_sets(*sets)}
        else:
            partial_json = {str(k): self.consumed[k].to_json() for k in partial}
        return {
            "done": done.encode() if packed else done.to_json(),
            "partial": partial_json,
            "rows": {str(k): v for k, v in sorted(self.rows.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> Progress:
        out = cls()
        for k, v in data.get("rows", {}).items():
            index = _index(k, shards)
            out.rows[index] = _int(v, f"progress.rows[{k}]")
            listed = shards[index].rows
            if listed is not None and listed != v:
                raise refuse(
                    f"progress.rows[{k}]",
                    v,
                    f"the listing the state records gives {shards[index].url} {listed} rows "
                    "(a count is learnt only for a shard listed without one)",
                )
        try:
            done = IntervalSet.from_json(data.get("done", []))
        except ValueError as e:
            raise StateError(
                f"progress.done: {e}; the state was edited or corrupted; {FIX}"
            ) from None
        for first, stop in done:
            for index in range(_index(first, shards), _index(stop - 1, shards) + 1):
                rows = out.rows_of(index, shards)
                if rows is None:
                    raise StateError(
                        f"progress.done names shard {index} "
                        f"({shards[index].url}) but its row count is unknown"
                    )
                out.consumed[index] = IntervalSet.span(0, rows)
        partial = data.get("partial", {})
        if isinstance(partial, Mapping) and "packed" in partial:
            partial = _unpack_sets(partial["packed"], "progress.consumed.partial.packed")
        for k, v in partial.items():
            try:
                got = v if isinstance(v, IntervalSet) else IntervalSet.from_json(v)
                out.of(_index(k, shards)).update(got)
            except ValueError as e:
                raise StateError(
                    f"progress.partial[{k}]: {e}; the state was edited or corrupted; {FIX}"
                ) from None
        return out


def row_counts(shards: Sequence[ShardRecord]) -> npt.NDArray[np.int64]:
    """Every shard's row count as an array, -1 where it is unknown."""
    return np.fromiter(
        (-1 if s.rows is None else s.rows for s in shards), dtype=np.int64, count=len(shards)
    )


@dataclass(frozen=True, slots=True)
class PackedFingerprint:
    """The identity of a packed listing: the full digest and short hashes per shard.

    A packed state keeps neither sizes nor versions (a million etags alone take 32 MB):
    ``digest`` tells exactly whether a listing holds the same shards, and the hashes name
    the ones that changed (:func:`match_listing`).
    """

    digest: str
    size_hashes: npt.NDArray[np.uint8]
    version_hashes: npt.NDArray[np.uint16]
    """0 where the shard had no version (such versions are never compared)."""

    @classmethod
    def of(cls, shards: Sequence[ShardRecord]) -> PackedFingerprint:
        return cls.of_columns(_Columns.of(shards))

    @classmethod
    def of_columns(cls, columns: _Columns) -> PackedFingerprint:
        return cls(columns.digest(), _size_hashes(columns.sizes), _version_hashes(columns.versions))


@dataclass(slots=True)
class DatasetState:
    """What was listed: the source URLs and every shard's identity (the fingerprint).

    A state read from the packed form (version 3) keeps each shard's URL and row count; its
    sizes and versions are in ``fingerprint`` (the records say 0 and ""). Its JSON is made
    once and kept (a listing of a million shards takes a second to write): change
    ``shards`` only through a new object.
    """

    sources: list[str]
    shards: Sequence[ShardRecord]
    """A list, or a :class:`ShardTable` (a listing's columns)."""
    fingerprint: PackedFingerprint | None = None
    classes: tuple[str, ...] = ()
    """Folder datasets: the class names the ``label`` indices stand for (``"classes"`` in
    the JSON, absent when empty)."""
    _json: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _counts: npt.NDArray[np.int64] | None = field(default=None, repr=False, compare=False)

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        """Every shard's row count, -1 where unknown (read-only; kept, like the JSON)."""
        if self._counts is None and isinstance(self.shards, ShardTable):
            self._counts = self.shards.counts
        if self._counts is None:
            counts = row_counts(self.shards)
            counts.setflags(write=False)
            self._counts = counts
        return self._counts

    @property
    def packed(self) -> bool:
        """Whether the JSON is the packed form (version 3)."""
        return self.fingerprint is not None or len(self.shards) >= PACK_FROM_SHARDS

    def to_json(self) -> dict[str, Any]:
        if self._json is None:
            made: dict[str, Any]
            if self.packed:
                columns = _Columns.of(self.shards)
                if self.fingerprint is None:
                    self.fingerprint = PackedFingerprint.of_columns(columns)
                made = {
                    "digest": self.fingerprint.digest,
                    "packed": _pack(columns.urls, self.counts, self.fingerprint),
                }
            else:
                made = {
                    "digest": digest(self.shards),
                    "shards": [s.to_json() for s in self.shards],
                }
            self._json = {"sources": list(self.sources), **made}
            if self.classes:
                self._json["classes"] = list(self.classes)
        return dict(self._json)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int = STATE_VERSION) -> DatasetState:
        sources = [str(s) for s in _list(data.get("sources", []), "dataset.sources")]
        classes = tuple(_classes(data.get("classes", [])))
        if version >= 3 and "packed" in data:
            shards, fingerprint = _unpack(data["packed"], data.get("digest"))
            return cls(sources, shards, fingerprint, classes)
        shards = []
        for n, entry in enumerate(_list(data["shards"], "dataset.shards")):
            if not isinstance(entry, list) or len(entry) != 4:
                raise StateError(
                    f"dataset.shards[{n}] is {entry!r}, not [url, size, version, rows]"
                )
            url, size, version_, rows = entry
            shards.append(
                ShardRecord(
                    str(url),
                    _int(size, f"dataset.shards[{n}] size"),
                    str(version_),
                    None if rows is None else _int(rows, f"dataset.shards[{n}] rows"),
                )
            )
        if data.get("digest") not in (None, digest(shards)):
            raise StateError(
                "dataset.digest does not match dataset.shards: the state was "
                "edited or corrupted; save it again"
            )
        return cls(sources, shards, None, classes)


@dataclass(slots=True)
class ProgressState:
    """How far the epoch got: its steps, its counts and the rows consumed per shard."""

    epoch: int = 0
    first_step: int = 0
    step: int = 0
    delivered: int = 0
    dropped: int = 0
    consumed: Progress = field(default_factory=Progress)
    quarantined: list[Quarantined] = field(default_factory=list)
    """Rows skipped in this epoch under ``on_error="skip"`` (they are in ``consumed``)."""

    def to_json(self, dataset: DatasetState) -> dict[str, Any]:
        out = {
            "epoch": self.epoch,
            "first_step": self.first_step,
            "step": self.step,
            "delivered": self.delivered,
            "dropped": self.dropped,
            "consumed": self.consumed.to_json(
                dataset.shards, packed=dataset.packed, listed=dataset.counts
            ),
        }
        if self.quarantined:
            out["quarantined"] = [q.to_json() for q in self.quarantined]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> ProgressState:
        out = cls(
            epoch=_int(data["epoch"], "progress.epoch"),
            first_step=_int(data.get("first_step", 0), "progress.first_step"),
            step=_int(data.get("step", 0), "progress.step"),
            delivered=_int(data.get("delivered", 0), "progress.delivered"),
            dropped=_int(data.get("dropped", 0), "progress.dropped"),
            consumed=Progress.from_json(data.get("consumed", {}), shards),
            quarantined=_quarantined(data.get("quarantined", [])),
        )
        if out.first_step > out.step:
            raise StateError(
                f"progress.first_step {out.first_step} is after progress.step {out.step}; "
                "the state was edited: save it again"
            )
        _check_bounds(out.consumed, shards, "progress.consumed")
        return out


def _quarantined(data: Any) -> list[Quarantined]:
    if not isinstance(data, list):
        raise StateError("progress.quarantined is not a list; the state was edited")
    return [Quarantined.from_json(q, f"progress.quarantined[{i}]") for i, q in enumerate(data)]


@dataclass(slots=True)
class DistributedState:
    """The world size at save and the rows carried in from the previous epoch."""

    world_size: int = 1
    carry: list[tuple[int, int, int]] = field(default_factory=list)
    """Spans ``(shard, start, stop)`` carried in from the previous epoch (equal steps)."""
    carry_consumed: Progress = field(default_factory=Progress)

    def to_json(self, *, packed: bool = False) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "carry": {
                "spans": [list(s) for s in self.carry],
                "consumed": {
                    str(k): v.encode() if packed else v.to_json()
                    for k, v in sorted(self.carry_consumed.consumed.items())
                    if v
                },
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> DistributedState:
        world_size = _int(data.get("world_size", 1), "distributed.world_size")
        if world_size < 1:
            raise StateError("distributed.world_size must be >= 1")
        carry = data.get("carry") or {}
        spans = []
        for entry in _list(carry.get("spans", []), "distributed.carry.spans"):
            if not isinstance(entry, list) or len(entry) != 3:
                raise StateError(f"distributed.carry span {entry!r} is not [shard, start, stop]")
            shard = _index(entry[0], shards)
            start = _int(entry[1], "carry start")
            stop = _int(entry[2], "carry stop")
            rows = shards[shard].rows
            if stop < start or (rows is not None and stop > rows):
                raise StateError(
                    f"distributed.carry span [{start}, {stop}) of {shards[shard].url} is "
                    f"outside its {rows} rows; the state was edited: save it again"
                )
            spans.append((shard, start, stop))
        consumed = Progress.from_json({"partial": carry.get("consumed", {})}, shards)
        _check_bounds(consumed, shards, "distributed.carry.consumed")
        return cls(world_size, spans, consumed)


Cursor = dict[str, Any]
"""Where one rank's reading order stood; its layout belongs to :mod:`ingest.engine.feed`."""


@dataclass(slots=True)
class PositionState:
    """The reading order: seed, batch and shuffle settings, and each rank's cursor."""

    seed: int | None = None
    batch_size: int = 0
    window: int = 0
    lanes: int = 0
    ranks: list[Cursor | None] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle": {"window": self.window, "lanes": self.lanes},
            "ranks": list(self.ranks),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PositionState:
        seed = data.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise StateError(f"position.seed must be an integer or null, got {seed!r}")
        shuffle = data.get("shuffle") or {}
        ranks = _list(data.get("ranks", []), "position.ranks")
        for n, cursor in enumerate(ranks):
            if cursor is not None:
                _check_cursor(cursor, f"position.ranks[{n}]")
        return cls(
            seed,
            _int(data.get("batch_size", 0), "position.batch_size"),
            _int(shuffle.get("window", 0), "position.shuffle.window"),
            _int(shuffle.get("lanes", 0), "position.shuffle.lanes"),
            list(ranks),
        )


def _check_cursor(cursor: object, what: str) -> None:
    """Refuse a cursor that is not ``{"window": w, "lanes": [lane or null, ...]}``, each lane
    ``[span, row, seek_row, seek_cursor]`` of integers >= 0 (the seek pair may be null).

    Whether it fits the plan it resumes is checked where the plan is made
    (:meth:`ingest.core.book.EpochBook.load`).
    """
    if not isinstance(cursor, dict) or "window" not in cursor or "lanes" not in cursor:
        raise refuse(what, cursor, 'a position is {"window": w, "lanes": [...]} or null')
    _int(cursor["window"], f"{what}.window")
    lanes = cursor["lanes"]
    if not isinstance(lanes, list):
        raise refuse(f"{what}.lanes", lanes, "it must be a list with one entry per lane")
    for n, lane in enumerate(lanes):
        if lane is None:
            continue
        where = f"{what}.lanes[{n}]"
        if not isinstance(lane, list) or len(lane) != 4:
            raise refuse(where, lane, "a lane is [span, row, seek_row, seek_cursor] or null")
        if (lane[2] is None) != (lane[3] is None):
            raise refuse(where, lane, "its seek_row and seek_cursor are both null or both set")
        for name, value in zip(("span", "row", "seek_row", "seek_cursor"), lane, strict=True):
            if value is not None:
                _int(value, f"{where} {name}")


@dataclass(slots=True)
class StreamState:
    """The resumable state of a stream: its four parts, convertible to and from JSON."""

    dataset: DatasetState
    progress: ProgressState = field(default_factory=ProgressState)
    distributed: DistributedState = field(default_factory=DistributedState)
    position: PositionState = field(default_factory=PositionState)

    @property
    def shards(self) -> Sequence[ShardRecord]:
        return self.dataset.shards

    @property
    def seed(self) -> int | None:
        return self.position.seed

    @property
    def started(self) -> bool:
        """Whether any row of this epoch was consumed (else the epoch may re-list).

        Rows in ``progress.consumed`` with no step, delivery or quarantine since the epoch
        began are not the epoch's own: a followed dataset's rounds start with the shards of
        the rounds before consumed (:mod:`ingest.storage.follow`), and the round lists again.
        """
        p = self.progress
        return bool(
            p.step > p.first_step
            or p.delivered
            or p.quarantined
            or self.distributed.carry_consumed.count()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 3 if self.dataset.packed else 2,
            "dataset": self.dataset.to_json(),
            "progress": self.progress.to_json(self.dataset),
            "distributed": self.distributed.to_json(packed=self.dataset.packed),
            "position": self.position.to_json(),
        }

    @classmethod
    def from_json(cls, data: object, *, max_bytes: int = MAX_STATE_BYTES) -> StreamState:
        """Parse and check a state produced by :meth:`to_json`.

        Args:
            data: The state: its JSON object, or its JSON text (``str`` or ``bytes``).
            max_bytes: JSON text larger than this is refused before it is parsed.

        Raises:
            StateError: On an unknown version, a state too large or nested too deep, or a
                malformed, edited or inconsistent one.
        """
        try:
            return cls._parse(data, max_bytes)
        except RecursionError:
            # JSON nested thousands of levels deep (json.loads, or a repr of a value while
            # a message is written): a stream state nests a few levels, never that many.
            raise StateError(
                f"the state is nested too deep to be a stream state (more than "
                f"{sys.getrecursionlimit()} levels; a state nests fewer than 10); {FIX}"
            ) from None

    @classmethod
    def _parse(cls, data: object, max_bytes: int) -> StreamState:
        if isinstance(data, (str, bytes)):
            _check_size(data, max_bytes, "the state")
            try:
                data = json.loads(data)
            except ValueError as e:
                raise StateError(
                    f"the state is not JSON ({e}); pass what state_dict() returned"
                ) from None
        if not isinstance(data, Mapping):
            raise StateError(f"a stream state is a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise StateError(
                f"state version {version!r} is not supported (this ingest reads "
                f"versions {', '.join(map(str, READ_VERSIONS))}); resume with the ingest "
                "release that wrote it, or start without the state"
            )
        try:
            dataset = DatasetState.from_json(data["dataset"], version)
            state = cls(
                dataset,
                ProgressState.from_json(data["progress"], dataset.shards),
                DistributedState.from_json(data.get("distributed") or {}, dataset.shards),
                PositionState.from_json(data.get("position") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, StateError):
                raise
            raise StateError(
                f"state is malformed ({type(e).__name__}: {e}); pass the dict "
                "that state_dict() returned, unchanged"
            ) from None
        state.check_counts()
        state.check_quarantined()
        return state

    @classmethod
    def read(cls, file: BinaryIO, *, max_bytes: int = MAX_STATE_BYTES) -> StreamState:
        """Read a state saved as JSON from ``file`` (opened for reading bytes by the caller).

        At most ``max_bytes + 1`` bytes are read: a larger file is refused before it is
        parsed, whatever it holds.

        Raises:
            StateError: As :meth:`from_json`, naming the file when it is too large.
        """
        text = file.read(max_bytes + 1)
        if len(text) > max_bytes:
            try:
                size = str(os.fstat(file.fileno()).st_size)
            except (AttributeError, OSError, io.UnsupportedOperation):
                size = f"more than {max_bytes}"
            raise _too_large(
                f"the state file {getattr(file, 'name', '')}".rstrip(), size, max_bytes
            )
        return cls.from_json(text, max_bytes=max_bytes)

    def check_counts(self) -> None:
        """Refuse a step count that the rows consumed cannot account for (an edited state).

        Each step since ``progress.first_step`` consumed a batch on every rank (more rows
        when the epoch was resumed on other ranks since it began), in ``progress.consumed``
        or ``distributed.carry.consumed``.

        Raises:
            StateError: Naming ``progress.step``, its value and the rows consumed.
        """
        p = self.progress
        world, batch = self.distributed.world_size, self.position.batch_size
        steps = (p.step - p.first_step) * world * batch
        if not steps:
            return
        consumed = self.consumed_rows()
        if consumed < steps:
            raise refuse(
                "progress.step",
                p.step,
                f"progress.consumed and distributed.carry.consumed hold {consumed} rows, "
                f"fewer than the {steps} of steps {p.first_step} to {p.step - 1} "
                f"({world} rank(s) x {batch} rows)",
            )

    def check_quarantined(self) -> None:
        """Refuse quarantine records that disagree with the rest of the state
        (:func:`ingest.core.quarantine.check_saved`).

        Raises:
            StateError: Naming the record and what it disagrees with.
        """
        p = self.progress
        if not p.quarantined:
            return
        urls = {q.url for q in p.quarantined}
        shards = self.shards
        check_saved(
            p.quarantined,
            "progress.quarantined",
            epoch=p.epoch,
            steps=range(p.first_step, p.step),
            batch_size=self.position.batch_size,
            rows_of={
                s.url: p.consumed.rows_of(i, shards) for i, s in enumerate(shards) if s.url in urls
            },
        )

    def consumed_rows(self) -> int:
        """Rows consumed in the epoch (its own and the ones carried in)."""
        return self.progress.consumed.count() + self.distributed.carry_consumed.count()


def _check_size(data: str | bytes, max_bytes: int, what: str) -> None:
    """Refuse JSON text of more than ``max_bytes`` bytes (UTF-8), before it is parsed."""
    if len(data) > max_bytes:
        raise _too_large(
            what, f"at least {len(data)}" if isinstance(data, str) else str(len(data)), max_bytes
        )
    if isinstance(data, str) and not data.isascii() and len(data.encode()) > max_bytes:
        raise _too_large(what, str(len(data.encode())), max_bytes)


def _too_large(what: str, size: str, max_bytes: int) -> StateError:
    return StateError(
        f"{what} is {size} bytes, above the {max_bytes} byte limit (max_bytes): a stream "
        "state is O(shards), a few MB for a million shards. Pass the state that "
        "state_dict() returned, or raise max_bytes if it is one"
    )


def _classes(value: Any) -> list[str]:
    names = _list(value, "dataset.classes")
    if not all(isinstance(n, str) for n in names) or names != sorted(set(names)):
        raise StateError(
            f"dataset.classes is {names[:5]!r}...: not a sorted list of distinct class names; "
            f"the state was edited or corrupted; {FIX}"
        )
    return names


def match_listing(
    saved: DatasetState | Sequence[ShardRecord],
    listed: Sequence[ShardRecord],
    classes: Sequence[str] = (),
) -> None:
    """Check that every saved shard is in ``listed``, unchanged. New shards are fine.

    Sizes are compared, and versions where both sides have one. A packed state (its sizes
    and versions kept as a digest and hashes) is checked against the digest first. A folder
    dataset's class list (``classes``, the listing's) must be the state's.

    Raises:
        StateError: Naming the shards that are missing or changed, and what changed, or the
            classes added or gone.
    """
    if isinstance(saved, DatasetState) and tuple(saved.classes) != tuple(classes):
        gone = sorted(set(saved.classes) - set(classes))
        added = sorted(set(classes) - set(saved.classes))
        raise StateError(
            f"the folder dataset's classes changed since the state was saved (gone: "
            f"{gone[:5]}, added: {added[:5]}; {len(saved.classes)} -> {len(classes)}): its "
            "label indices would name other classes. Restore the class directories, or "
            "start without the state"
        )
    fingerprint = saved.fingerprint if isinstance(saved, DatasetState) else None
    shards = saved.shards if isinstance(saved, DatasetState) else saved
    by_url = {s.url: s for s in listed}
    missing = [s.url for s in shards if s.url not in by_url]
    if fingerprint is None:
        changed = _changed(shards, by_url)
    elif not missing and packed_digest([by_url[s.url] for s in shards]) == fingerprint.digest:
        return
    else:
        changed = _changed_hashed(shards, fingerprint, by_url)
    if not missing and not changed:
        if fingerprint is None or _some_version_unknown(shards, fingerprint, by_url):
            return
        raise StateError(
            f"the dataset changed since the state was saved: the digest of its "
            f"{len(shards)} shards is not the state's, so some shard was rewritten in place "
            "(its size or version changed), but the short hashes a packed state keeps per "
            "shard do not tell which. A state resumes only on the same shards; restore "
            "them or start the epoch without the state"
        )
    if len(missing) == len(shards):
        raise StateError(
            f"the state belongs to another dataset: none of its {len(shards)} shards (e.g. "
            f"{shards[0].url if shards else '-'}) is in this listing of {len(listed)} shards "
            f"(e.g. {listed[0].url if listed else '-'}); load a state saved by this stream"
        )
    parts = []
    if missing:
        parts.append(f"{len(missing)} shard(s) gone: {', '.join(missing[:5])}")
    if changed:
        parts.append(f"{len(changed)} shard(s) changed: {', '.join(changed[:5])}")
    raise StateError(
        f"the dataset changed since the state was saved: {'; '.join(parts)}. "
        "A state resumes only on the same shards (new shards may be added); "
        "restore them or start the epoch without the state"
    )


def _changed(shards: Sequence[ShardRecord], by_url: Mapping[str, ShardRecord]) -> list[str]:
    changed = []
    for s in shards:
        now = by_url.get(s.url)
        if now is None:
            continue
        what = []
        if now.size != s.size:
            what.append(f"size {s.size} -> {now.size}")
        if s.version and now.version and now.version != s.version:
            what.append(f"version {s.version!r} -> {now.version!r}")
        if what:
            changed.append(f"{s.url} ({', '.join(what)})")
    return changed


def _changed_hashed(
    shards: Sequence[ShardRecord],
    fingerprint: PackedFingerprint,
    by_url: Mapping[str, ShardRecord],
) -> list[str]:
    """The shards whose size or version hash differs (a packed state keeps no more)."""
    found = [(n, by_url[s.url]) for n, s in enumerate(shards) if s.url in by_url]
    if not found:
        return []
    at = np.asarray([n for n, _ in found], dtype=np.int64)
    sizes = _size_hashes([now.size for _, now in found])
    versions = _version_hashes([now.version for _, now in found])
    saved_versions = fingerprint.version_hashes[at]
    size_differs = sizes != fingerprint.size_hashes[at]
    version_differs = (saved_versions != 0) & (versions != 0) & (versions != saved_versions)
    changed = []
    for k in np.flatnonzero(size_differs | version_differs).tolist():
        now = found[k][1]
        what = [f"size now {now.size}"] if size_differs[k] else []
        if version_differs[k]:
            what.append(f"version now {now.version!r}")
        changed.append(f"{now.url} ({', '.join(what)}, not as saved)")
    return changed


def _some_version_unknown(
    shards: Sequence[ShardRecord],
    fingerprint: PackedFingerprint,
    by_url: Mapping[str, ShardRecord],
) -> bool:
    """Whether a shard's version is unknown on one side only (so the digests may differ)."""
    now_unknown = np.asarray([by_url[s.url].version == "" for s in shards], dtype=bool)
    return bool(((fingerprint.version_hashes == 0) != now_unknown).any())


FIX = "pass the state as state_dict() returned it, unchanged, or start without it"
"""The fix every refusal of an edited or corrupted state ends with."""


def refuse(field: str, value: object, rule: str) -> StateError:
    """The error for ``field`` holding ``value`` against ``rule``, with the fix."""
    return StateError(f"{field} is {value!r}, but {rule}: the state was edited or corrupted; {FIX}")


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OFFSET:
        raise refuse(what, value, f"it must be an integer from 0 to {MAX_OFFSET}")
    return value


def _index(key: object, shards: Sequence[ShardRecord]) -> int:
    try:
        index = int(str(key))
    except ValueError:
        raise StateError(f"shard index {key!r} is not an integer") from None
    if not 0 <= index < len(shards):
        raise StateError(f"shard index {index} is out of range for {len(shards)} shards")
    return index


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise StateError(f"{what} must be a JSON list, got {type(value).__name__}")
    return value


def _check_bounds(progress: Progress, shards: Sequence[ShardRecord], what: str) -> None:
    """Refuse consumed rows beyond a shard's known row count (an edited state)."""
    key, _, hi = stack(progress.consumed.items())
    heads, tails = set_bounds(key)
    if not len(heads):
        return
    known = progress.counts(row_counts(shards))[key[heads]]
    last = hi[tails - 1]
    beyond = np.flatnonzero((known >= 0) & (last > known))
    if len(beyond):
        n = int(beyond[0])
        index = int(key[heads[n]])
        raise StateError(
            f"{what} of shard {index} ({shards[index].url}) reaches row {int(last[n])}, "
            f"but the shard has {int(known[n])} rows; the state was edited or belongs to "
            "other data: save it again"
        )


# -- the packed listing (version 3) ----------------------------------------------------------

_PACKED_FIELDS = ("count", "prefix", "urls", "rows", "size_hashes", "version_hashes", "sha256")
_CHUNK = 1 << 16
"""URLs front-coded per numpy pass (bounds the memory of one pass)."""


def _size_hashes(sizes: Sequence[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """8 bits of splitmix64 of each size."""
    with np.errstate(over="ignore"):
        z = np.asarray(sizes, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((z ^ (z >> np.uint64(31))) >> np.uint64(56)).astype(np.uint8)


def _version_hashes(versions: Sequence[str]) -> npt.NDArray[np.uint16]:
    """16 bits of the CRC-32 of each version, never 0; 0 where there is no version."""
    crc = np.fromiter(map(zlib.crc32, map(str.encode, versions)), np.uint32, len(versions))
    crc |= np.uint32(1)
    hashes = (crc >> np.uint32(16)).astype(np.uint16)
    hashes[hashes == 0] = 1
    hashes[np.fromiter(map(len, versions), np.int64, len(versions)) == 0] = 0
    return hashes


def _shuffled(values: npt.NDArray[Any], dtype: str) -> bytes:
    """Little-endian ``values`` with byte ``k`` of every value together (compresses better)."""
    raw = np.ascontiguousarray(values, dtype=dtype)
    width = raw.dtype.itemsize
    return np.ascontiguousarray(raw.view(np.uint8).reshape(len(raw), width).T).tobytes()


def _unshuffled(raw: bytes, dtype: str, count: int) -> npt.NDArray[Any]:
    width = np.dtype(dtype).itemsize
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(width, count)
    return np.ascontiguousarray(planes.T).view(dtype).ravel()


def _front_coded(text: bytes, lengths: npt.NDArray[np.int64], skip: int = 0) -> bytes:
    """Strings front-coded: ``shared`` (bytes in common with the previous string), the
    ``lengths`` of the rest, and the rest of each.

    Args:
        text: The strings one after the other (:func:`_utf8`).
        lengths: The length of each string in bytes.
        skip: Bytes at the start of every string that are left out (a common prefix).
    """
    buf = np.frombuffer(text, dtype=np.uint8)
    lengths = lengths - skip
    starts = np.cumsum(lengths + skip) - lengths
    shared = np.zeros(len(lengths), dtype=np.int64)
    columns = np.arange(int(lengths.max(initial=0)), dtype=np.int64)
    for a in range(1, len(lengths), _CHUNK):
        lens = lengths[a - 1 : a + _CHUNK]
        # Each string of the chunk padded with zeros to the longest: one row per string.
        inside = columns[: int(lens.max())] < lens[:, None]
        at = np.where(inside, starts[a - 1 : a + _CHUNK, None] + columns[: inside.shape[1]], 0)
        m = np.where(inside, buf[at], 0)
        same = np.concatenate((m[1:] == m[:-1], np.zeros((len(m) - 1, 1), bool)), axis=1)
        shared[a : a + len(m) - 1] = np.minimum(
            np.argmin(same, axis=1), np.minimum(lens[1:], lens[:-1])
        )
    rest = lengths - shared
    total = int(rest.sum())
    at = np.repeat(starts + shared - (np.cumsum(rest) - rest), rest) + np.arange(total)
    return _shuffled(shared, "<u4") + _shuffled(rest, "<u4") + buf[at].tobytes()


def _pack(
    urls: Sequence[str], rows: npt.NDArray[np.int64], fingerprint: PackedFingerprint
) -> dict[str, Any]:
    prefix = _common_prefix(min(urls), max(urls)) if urls else ""
    text, lengths = _utf8(urls)
    columns = {
        "urls": _front_coded(text, lengths, len(prefix.encode())),
        "rows": _shuffled(rows, "<i8"),
        "size_hashes": fingerprint.size_hashes.tobytes(),
        "version_hashes": _shuffled(fingerprint.version_hashes, "<u2"),
    }
    out: dict[str, Any] = {"count": len(urls), "prefix": prefix}
    for name, raw in columns.items():
        out[name] = base64.b64encode(zlib.compress(raw, 6)).decode()
    out["sha256"] = _packed_sha256(len(urls), prefix, columns)
    return out


def _common_prefix(a: str, b: str) -> str:
    """The characters ``a`` and ``b`` begin with (of the least and greatest URL: of all)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _packed_sha256(count: int, prefix: str, columns: Mapping[str, bytes]) -> str:
    h = hashlib.sha256(json.dumps([count, prefix]).encode())
    for name in _PACKED_FIELDS[2:-1]:
        h.update(len(columns[name]).to_bytes(8, "little"))
        h.update(columns[name])
    return h.hexdigest()


def _inflated(data: Mapping[str, Any], name: str, limit: int) -> bytes:
    """Column ``name`` of ``dataset.packed``, decoded, at most ``limit`` bytes."""
    text = data[name]
    fix = "the state was edited or truncated: save it again"
    if not isinstance(text, str):
        raise StateError(f"dataset.packed.{name} must be a base64 string; {fix}")
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(text, validate=True), limit + 1)
    except (binascii.Error, ValueError, zlib.error) as e:
        raise StateError(
            f"dataset.packed.{name} is not zlib-compressed base64 ({e}); {fix}"
        ) from None
    if len(raw) > limit or not inflate.eof:
        raise StateError(
            f"dataset.packed.{name} holds more than the {limit} bytes its "
            f"{data['count']} shards need, or is cut short; {fix}"
        )
    return raw


def _unpack(data: object, expected: object) -> tuple[list[ShardRecord], PackedFingerprint]:
    """The shards and fingerprint of a ``dataset.packed`` object, checked."""
    if not isinstance(data, Mapping) or sorted(data) != sorted(_PACKED_FIELDS):
        got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise StateError(
            f"dataset.packed must be an object with the fields {list(_PACKED_FIELDS)}, "
            f"got {got}; pass the state unchanged"
        )
    count = _int(data["count"], "dataset.packed.count")
    prefix = data["prefix"]
    if not isinstance(prefix, str):
        raise StateError(f"dataset.packed.prefix must be a string, got {prefix!r}")
    if not isinstance(expected, str):
        raise StateError(f"dataset.digest must be a sha256 string, got {expected!r}")
    columns = {
        "urls": _inflated(data, "urls", MAX_STATE_BYTES * 4),
        "rows": _inflated(data, "rows", 8 * count),
        "size_hashes": _inflated(data, "size_hashes", count),
        "version_hashes": _inflated(data, "version_hashes", 2 * count),
    }
    if _packed_sha256(count, prefix, columns) != data["sha256"]:
        raise StateError(
            "dataset.packed does not match its sha256: the state was edited or corrupted; "
            "save it again"
        )
    for name, width in (("rows", 8), ("size_hashes", 1), ("version_hashes", 2)):
        if len(columns[name]) != width * count:
            raise StateError(
                f"dataset.packed.{name} holds {len(columns[name])} bytes, not the "
                f"{width * count} of {count} shards; save the state again"
            )
    rows = _unshuffled(columns["rows"], "<i8", count)
    if count and int(rows.min()) < -1:
        raise StateError("dataset.packed.rows holds a negative row count; save the state again")
    urls = _front_decoded(columns["urls"], count, prefix)
    shards = [
        ShardRecord(url, 0, "", None if n < 0 else n)
        for url, n in zip(urls, rows.tolist(), strict=True)
    ]
    fingerprint = PackedFingerprint(
        expected,
        np.frombuffer(columns["size_hashes"], dtype=np.uint8).copy(),
        _unshuffled(columns["version_hashes"], "<u2", count),
    )
    return shards, fingerprint


def _front_decoded(raw: bytes, count: int, prefix: str) -> list[str]:
    """The URLs of :func:`_front_coded` bytes, ``prefix`` put back."""
    head = 8 * count
    if len(raw) < head:
        raise StateError(
            f"dataset.packed.urls holds {len(raw)} bytes, fewer than {count} shards need; "
            "save the state again"
        )
    shared = _unshuffled(raw[: 4 * count], "<u4", count).tolist()
    lengths = _unshuffled(raw[4 * count : head], "<u4", count).tolist()
    if sum(lengths) != len(raw) - head:
        raise StateError(
            "dataset.packed.urls: its lengths do not add up to its text; save the state again"
        )
    out = []
    previous, at = b"", head
    for n, (keep, length) in enumerate(zip(shared, lengths, strict=True)):
        if keep > len(previous):
            raise StateError(
                f"dataset.packed.urls: URL {n} shares {keep} bytes with a URL of "
                f"{len(previous)}; save the state again"
            )
        previous = previous[:keep] + raw[at : at + length]
        at += length
        try:
            out.append(prefix + previous.decode())
        except UnicodeDecodeError:
            raise StateError(
                f"dataset.packed.urls: URL {n} is not UTF-8; save the state again"
            ) from None
    return out


_SET_FIELDS = ("shards", "from", "to", "bits")


def _pack_sets(
    key: npt.NDArray[np.int64], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> dict[str, str]:
    """Interval sets as one bitmap: each set's rows from its first to its last, byte-aligned.

    ``key``, ``lo``, ``hi``: the sets' intervals, set after set in the order of their keys
    (:func:`ingest.core.intervals.stack`). The rows of a half-consumed shuffle window take about
    a bit each; consumed prefixes and untouched stretches are runs of equal bytes that zlib
    all but removes.
    """
    heads, tails = set_bounds(key)
    keys = key[heads]
    first, last = lo[heads], hi[tails - 1]
    extent = last - first
    # Each set's bits: its intervals (ones) and the gaps between them (zeros), then zeros to
    # its byte's end; all sets' bits written in one pass.
    gaps = np.empty(len(lo), dtype=np.int64)
    gaps[:-1] = lo[1:] - hi[:-1]
    gaps[tails - 1] = -extent % 8
    lengths = np.empty(2 * len(lo), dtype=np.int64)
    lengths[0::2] = hi - lo
    lengths[1::2] = gaps
    ones = np.zeros(2 * len(lo), dtype=bool)
    ones[0::2] = True
    bits = np.packbits(np.repeat(ones, lengths), bitorder="little").tobytes()
    columns = {
        "shards": _shuffled(np.diff(keys, prepend=0), "<u4"),
        "from": _shuffled(first, "<i8"),
        "to": _shuffled(extent, "<i8"),
        "bits": bits,
    }
    return {k: base64.b64encode(zlib.compress(v, 6)).decode() for k, v in columns.items()}


def _unpack_sets(data: object, what: str) -> dict[str, IntervalSet]:
    """The sets of :func:`_pack_sets`, keyed by shard index as a string (checked later)."""
    fix = "the state was edited or truncated: save it again"
    if not isinstance(data, Mapping) or sorted(data) != sorted(_SET_FIELDS):
        raise StateError(f"{what} must be an object with the fields {list(_SET_FIELDS)}; {fix}")
    raw: dict[str, bytes] = {}
    for name in _SET_FIELDS:
        text = data[name]
        try:
            if not isinstance(text, str):
                raise ValueError("not a string")
            inflate = zlib.decompressobj()
            raw[name] = inflate.decompress(base64.b64decode(text, validate=True), MAX_STATE_BYTES)
            if not inflate.eof:
                raise ValueError("cut short or too long")
        except (binascii.Error, ValueError, zlib.error) as e:
            raise StateError(f"{what}.{name} is not zlib-compressed base64 ({e}); {fix}") from None
    count = len(raw["shards"]) // 4
    if len(raw["shards"]) != 4 * count or {len(raw["from"]), len(raw["to"])} != {8 * count}:
        raise StateError(f"{what}: its columns are not of one length; {fix}")
    keys = np.cumsum(_unshuffled(raw["shards"], "<u4", count).astype(np.int64))
    first = _unshuffled(raw["from"], "<i8", count)
    spans = _unshuffled(raw["to"], "<i8", count)
    if count and (int(first.min()) < 0 or int(spans.min()) < 0):
        raise StateError(f"{what}: a set begins or ends below row 0; {fix}")
    nbytes = (spans + 7) // 8
    if int(nbytes.sum()) != len(raw["bits"]):
        raise StateError(
            f"{what}.bits holds {len(raw['bits'])} bytes, not the {int(nbytes.sum())} its "
            f"{count} sets need; {fix}"
        )
    bits = np.frombuffer(raw["bits"], dtype=np.uint8)
    out: dict[str, IntervalSet] = {}
    at = 0
    for k, a, n, b in zip(
        keys.tolist(), first.tolist(), spans.tolist(), nbytes.tolist(), strict=True
    ):
        member = np.unpackbits(bits[at : at + b], count=n, bitorder="little").astype(np.int8)
        at += b
        edges = np.diff(member, prepend=0, append=0)
        rows = IntervalSet()
        rows.add_many(np.flatnonzero(edges == 1) + a, np.flatnonzero(edges == -1) + a)
        out[str(k)] = rows
    return out
