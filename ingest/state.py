"""Stream state: small, plain, versioned JSON in named parts. Pure; no Ray, no I/O.

Layout, one part per concern, each validated by its own class::

    {"version": 2,
     "dataset": {"sources": [...], "digest": "sha256...",            # DatasetState
                 "shards": [[url, size, version, rows or null], ...]},
     "progress": {"epoch": 2, "first_step": 96, "step": 120,          # ProgressState
                  "delivered": 123456, "dropped": 0,
                  "consumed": {"done": [[0, 40]],                     # shards fully consumed
                               "partial": {"41": [[0, 512], ...]},    # rows of the others
                               "rows": {"41": 9000}}},                # counts learnt by reading
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
(:meth:`ingest.intervals.IntervalSet.encode`).

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
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ingest.errors import StateError
from ingest.intervals import IntervalSet, stack

STATE_VERSION = 3
"""The newest version this ingest writes; it reads :data:`READ_VERSIONS`."""
READ_VERSIONS = (2, 3)
MAX_STATE_BYTES = 256 << 20
"""States larger than this are refused before parsing (a state is O(shards))."""
PACK_FROM_SHARDS = 10_000
"""Listings of this many shards or more are written packed (version 3)."""


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


def packed_digest(shards: Sequence[ShardRecord]) -> str:
    """sha256 over every shard's ``(url, size, version)`` (version 3; faster than
    :func:`digest`): the UTF-8 URLs and versions, each column after its lengths, and the
    sizes, as little-endian int64."""
    h = hashlib.sha256()
    for column in ([s.url.encode() for s in shards], [s.version.encode() for s in shards]):
        h.update(np.asarray([len(b) for b in column], dtype="<i8").tobytes())
        h.update(b"".join(column))
    h.update(np.asarray([s.size for s in shards], dtype="<i8").tobytes())
    return h.hexdigest()


def digest(shards: Sequence[ShardRecord]) -> str:
    """sha256 over (url, size, version) of each shard, in order."""
    h = hashlib.sha256()
    for s in shards:
        h.update(json.dumps([s.url, s.size, s.version]).encode())
    return h.hexdigest()


@dataclass(slots=True)
class Progress:
    """What one epoch has consumed: an interval set per shard index."""

    consumed: dict[int, IntervalSet] = field(default_factory=dict)
    rows: dict[int, int] = field(default_factory=dict)
    """Row counts learnt by reading shards whose listing gave none."""

    def rows_of(self, index: int, shards: Sequence[ShardRecord]) -> int | None:
        known = shards[index].rows
        return known if known is not None else self.rows.get(index)

    def of(self, index: int) -> IntervalSet:
        got = self.consumed.get(index)
        if got is None:
            got = self.consumed[index] = IntervalSet()
        return got

    def is_done(self, index: int, shards: Sequence[ShardRecord]) -> bool:
        rows = self.rows_of(index, shards)
        if rows is None:
            return False
        got = self.consumed.get(index)
        return rows == 0 or (got is not None and got.covers(0, rows))

    def count(self) -> int:
        return sum(s.count for s in self.consumed.values())

    def copy(self) -> Progress:
        return Progress({k: v.copy() for k, v in self.consumed.items()}, dict(self.rows))

    def to_json(
        self,
        shards: Sequence[ShardRecord],
        *,
        packed: bool = False,
        empty: Collection[int] | None = None,
    ) -> dict[str, Any]:
        """The JSON form; ``packed`` writes ``done`` and ``partial`` as bitmaps when shorter.

        Args:
            shards: The shards the indices refer to.
            packed: Write the version 3 form.
            empty: The indices of the shards listed with 0 rows (done without a row
                consumed), if the caller knows them; else they are found in ``shards``.
        """
        zero = set(empty) if empty is not None else {i for i, s in enumerate(shards) if s.rows == 0}
        zero.update(i for i, n in self.rows.items() if n == 0 and shards[i].rows is None)
        done = IntervalSet()
        done_starts: list[int] = []
        partial: dict[int, IntervalSet] = {}
        # Only shards with consumed rows, or none to consume, can be done or partial.
        for index in zero.union(k for k, v in self.consumed.items() if v):
            if self.is_done(index, shards):
                done_starts.append(index)
            else:
                partial[index] = self.consumed[index]
        done.add_many(done_starts, [i + 1 for i in done_starts])
        return {
            "done": done.encode() if packed else done.to_json(),
            "partial": (
                {"packed": _pack_sets(partial)}
                if packed
                else {str(k): v.to_json() for k, v in sorted(partial.items())}
            ),
            "rows": {str(k): v for k, v in sorted(self.rows.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> Progress:
        out = cls()
        for k, v in data.get("rows", {}).items():
            out.rows[_index(k, shards)] = _int(v, f"progress.rows[{k}]")
        try:
            done = IntervalSet.from_json(data.get("done", []))
        except ValueError as e:
            raise StateError(f"progress.done: {e}") from None
        for first, stop in done:
            for index in range(_index(first, shards), _index(stop - 1, shards) + 1):
                rows = out.rows_of(index, shards)
                if rows is None:
                    raise StateError(
                        f"progress.done names shard {index} "
                        f"({shards[index].url}) but its row count is unknown"
                    )
                out.consumed[index] = IntervalSet([(0, rows)])
        partial = data.get("partial", {})
        if isinstance(partial, Mapping) and "packed" in partial:
            partial = _unpack_sets(partial["packed"], "progress.consumed.partial.packed")
        for k, v in partial.items():
            try:
                got = v if isinstance(v, IntervalSet) else IntervalSet.from_json(v)
                out.of(_index(k, shards)).update(got)
            except ValueError as e:
                raise StateError(f"progress.partial[{k}]: {e}") from None
        return out


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
        return cls(
            packed_digest(shards),
            _size_hashes([s.size for s in shards]),
            _version_hashes([s.version for s in shards]),
        )


@dataclass(slots=True)
class DatasetState:
    """What was listed: the source URLs and every shard's identity (the fingerprint).

    A state read from the packed form (version 3) keeps each shard's URL and row count; its
    sizes and versions are in ``fingerprint`` (the records say 0 and ""). Its JSON is made
    once and kept (a listing of a million shards takes a second to write): change
    ``shards`` only through a new object.
    """

    sources: list[str]
    shards: list[ShardRecord]
    fingerprint: PackedFingerprint | None = None
    _json: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _empty: frozenset[int] | None = field(default=None, repr=False, compare=False)

    @property
    def empty(self) -> frozenset[int]:
        """Indices of the shards listed with 0 rows (kept, like the JSON)."""
        if self._empty is None:
            self._empty = frozenset(i for i, s in enumerate(self.shards) if s.rows == 0)
        return self._empty

    @property
    def packed(self) -> bool:
        """Whether the JSON is the packed form (version 3)."""
        return self.fingerprint is not None or len(self.shards) >= PACK_FROM_SHARDS

    def to_json(self) -> dict[str, Any]:
        if self._json is None:
            if self.packed:
                if self.fingerprint is None:
                    self.fingerprint = PackedFingerprint.of(self.shards)
                self._json = {
                    "sources": list(self.sources),
                    "digest": self.fingerprint.digest,
                    "packed": _pack(self.shards, self.fingerprint),
                }
            else:
                self._json = {
                    "sources": list(self.sources),
                    "digest": digest(self.shards),
                    "shards": [s.to_json() for s in self.shards],
                }
        return dict(self._json)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int = STATE_VERSION) -> DatasetState:
        sources = [str(s) for s in _list(data.get("sources", []), "dataset.sources")]
        if version >= 3 and "packed" in data:
            shards, fingerprint = _unpack(data["packed"], data.get("digest"))
            return cls(sources, shards, fingerprint)
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
        return cls(sources, shards)


@dataclass(slots=True)
class ProgressState:
    """How far the epoch got: its steps, its counts and the rows consumed per shard."""

    epoch: int = 0
    first_step: int = 0
    step: int = 0
    delivered: int = 0
    dropped: int = 0
    consumed: Progress = field(default_factory=Progress)

    def to_json(self, dataset: DatasetState) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "first_step": self.first_step,
            "step": self.step,
            "delivered": self.delivered,
            "dropped": self.dropped,
            "consumed": self.consumed.to_json(
                dataset.shards, packed=dataset.packed, empty=dataset.empty
            ),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> ProgressState:
        out = cls(
            epoch=_int(data["epoch"], "progress.epoch"),
            first_step=_int(data.get("first_step", 0), "progress.first_step"),
            step=_int(data.get("step", 0), "progress.step"),
            delivered=_int(data.get("delivered", 0), "progress.delivered"),
            dropped=_int(data.get("dropped", 0), "progress.dropped"),
            consumed=Progress.from_json(data.get("consumed", {}), shards),
        )
        if out.first_step > out.step:
            raise StateError(
                f"progress.first_step {out.first_step} is after progress.step {out.step}; "
                "the state was edited: save it again"
            )
        _check_bounds(out.consumed, shards, "progress.consumed")
        return out


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
"""Where one rank's reading order stood; its layout belongs to :mod:`ingest.feed`."""


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
            if cursor is not None and not isinstance(cursor, dict):
                raise StateError(f"position.ranks[{n}] is {cursor!r}, not an object or null")
        return cls(
            seed,
            _int(data.get("batch_size", 0), "position.batch_size"),
            _int(shuffle.get("window", 0), "position.shuffle.window"),
            _int(shuffle.get("lanes", 0), "position.shuffle.lanes"),
            list(ranks),
        )


@dataclass(slots=True)
class StreamState:
    """The resumable state of a stream: its four parts, convertible to and from JSON."""

    dataset: DatasetState
    progress: ProgressState = field(default_factory=ProgressState)
    distributed: DistributedState = field(default_factory=DistributedState)
    position: PositionState = field(default_factory=PositionState)

    @property
    def shards(self) -> list[ShardRecord]:
        return self.dataset.shards

    @property
    def seed(self) -> int | None:
        return self.position.seed

    @property
    def started(self) -> bool:
        """Whether any row of this epoch was consumed (else the epoch may re-list)."""
        p = self.progress
        return bool(
            p.step > p.first_step
            or p.delivered
            or p.consumed.count()
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
    def from_json(cls, data: object) -> StreamState:
        """Parse and check a state produced by :meth:`to_json`.

        Raises:
            StateError: On an unknown version or a malformed or edited state.
        """
        if isinstance(data, (str, bytes)):
            if len(data) > MAX_STATE_BYTES:
                raise StateError(
                    f"the state is {len(data)} bytes, above the {MAX_STATE_BYTES} byte limit; "
                    "a stream state is O(shards): this is not one"
                )
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
            return cls(
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


def match_listing(
    saved: DatasetState | Sequence[ShardRecord], listed: Sequence[ShardRecord]
) -> None:
    """Check that every saved shard is in ``listed``, unchanged. New shards are fine.

    Sizes are compared, and versions where both sides have one. A packed state (its sizes
    and versions kept as a digest and hashes) is checked against the digest first.

    Raises:
        StateError: Naming the shards that are missing or changed, and what changed.
    """
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


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(f"{what} must be a non-negative integer, got {value!r}")
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
    for index, rows in progress.consumed.items():
        known = progress.rows_of(index, shards)
        if known is None or not rows:
            continue
        last = max(stop for _, stop in rows)
        if last > known:
            raise StateError(
                f"{what} of shard {index} ({shards[index].url}) reaches row {last}, "
                f"but the shard has {known} rows; the state was edited or belongs to "
                "other data: save it again"
            )


# -- the packed listing (version 3) ----------------------------------------------------------

_PACKED_FIELDS = ("count", "prefix", "urls", "rows", "size_hashes", "version_hashes", "sha256")
_CHUNK = 1 << 16
"""URLs front-coded per numpy pass (bounds the memory of one pass)."""


def _size_hashes(sizes: Sequence[int]) -> npt.NDArray[np.uint8]:
    """8 bits of splitmix64 of each size."""
    with np.errstate(over="ignore"):
        z = np.asarray(sizes, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((z ^ (z >> np.uint64(31))) >> np.uint64(56)).astype(np.uint8)


def _version_hashes(versions: Sequence[str]) -> npt.NDArray[np.uint16]:
    """16 bits of the CRC-32 of each version, never 0; 0 where there is no version."""
    crc = zlib.crc32
    out = np.asarray([crc(v.encode()) | 1 if v else 0 for v in versions], dtype=np.uint32)
    hashes = (out >> np.uint32(16)).astype(np.uint16)
    hashes[(hashes == 0) & (out != 0)] = 1
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


def _front_coded(suffixes: list[bytes]) -> bytes:
    """``shared`` (bytes in common with the previous), ``lengths`` and the rest of each."""
    shared = np.zeros(len(suffixes), dtype=np.int64)
    lengths = np.asarray([len(s) for s in suffixes], dtype=np.int64)
    for a in range(1, len(suffixes), _CHUNK):
        chunk = suffixes[a - 1 : a + _CHUNK]
        width = int(lengths[a - 1 : a + _CHUNK].max())
        if width == 0:
            continue
        m = np.frombuffer(b"".join(s.ljust(width, b"\0") for s in chunk), dtype=np.uint8)
        m = m.reshape(len(chunk), width)
        same = np.concatenate((m[1:] == m[:-1], np.zeros((len(chunk) - 1, 1), bool)), axis=1)
        lens = lengths[a - 1 : a + _CHUNK]
        shared[a : a + len(chunk) - 1] = np.minimum(
            np.argmin(same, axis=1), np.minimum(lens[1:], lens[:-1])
        )
    rest = b"".join([s[k:] for s, k in zip(suffixes, shared.tolist(), strict=True)])
    return _shuffled(shared, "<u4") + _shuffled(lengths - shared, "<u4") + rest


def _pack(shards: Sequence[ShardRecord], fingerprint: PackedFingerprint) -> dict[str, Any]:
    urls = [s.url for s in shards]
    prefix = _common_prefix(min(urls), max(urls)) if urls else ""
    columns = {
        "urls": _front_coded([u[len(prefix) :].encode() for u in urls]),
        "rows": _shuffled(
            np.asarray([-1 if s.rows is None else s.rows for s in shards], dtype=np.int64), "<i8"
        ),
        "size_hashes": fingerprint.size_hashes.tobytes(),
        "version_hashes": _shuffled(fingerprint.version_hashes, "<u2"),
    }
    out: dict[str, Any] = {"count": len(shards), "prefix": prefix}
    for name, raw in columns.items():
        out[name] = base64.b64encode(zlib.compress(raw, 6)).decode()
    out["sha256"] = _packed_sha256(len(shards), prefix, columns)
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


def _pack_sets(sets: Mapping[int, IntervalSet]) -> dict[str, str]:
    """Interval sets as one bitmap: each set's rows from its first to its last, byte-aligned.

    The rows of a half-consumed shuffle window take about a bit each; consumed prefixes and
    untouched stretches are runs of equal bytes that zlib all but removes.
    """
    keys = np.asarray(sorted(sets), dtype=np.int64)
    key, lo, hi = stack((int(k), sets[int(k)]) for k in keys)
    heads = np.searchsorted(key, keys, side="left")
    tails = np.searchsorted(key, keys, side="right") - 1
    first, last = lo[heads], hi[tails]
    nbytes = (last - first + 7) // 8
    base = np.concatenate(([0], np.cumsum(nbytes)[:-1])) * 8
    where = np.searchsorted(keys, key)
    offset = base[where] - first[where]
    edges = np.zeros(int(nbytes.sum()) * 8 + 1, dtype=np.int8)
    # Starts are distinct, and so are stops; a stop may meet the next set's start (then 0).
    edges[lo + offset] = 1
    edges[hi + offset] -= 1
    bits = np.packbits(np.cumsum(edges[:-1]) > 0, bitorder="little").tobytes()
    columns = {
        "shards": _shuffled(np.diff(keys, prepend=0), "<u4"),
        "from": _shuffled(first, "<i8"),
        "to": _shuffled(last - first, "<i8"),
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
