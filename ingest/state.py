"""Stream state: small, plain, versioned JSON in named parts. Pure; no Ray, no I/O.

Layout (version 2), one part per concern, each validated by its own class::

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

Shard indices refer to ``dataset.shards`` of the state itself, so a dataset that grew (new
shards only) still resolves every saved index. The size is O(shards + ranks x lanes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.errors import StateError
from ingest.intervals import IntervalSet

STATE_VERSION = 2
MAX_STATE_BYTES = 256 << 20
"""States larger than this are refused before parsing (a state is O(shards))."""


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """A shard as the state remembers it: enough to tell whether it changed."""

    url: str
    size: int
    version: str
    rows: int | None

    def to_json(self) -> list[Any]:
        return [self.url, self.size, self.version, self.rows]


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
        return rows == 0 or self.of(index).covers(0, rows)

    def count(self) -> int:
        return sum(s.count for s in self.consumed.values())

    def copy(self) -> Progress:
        return Progress({k: v.copy() for k, v in self.consumed.items()}, dict(self.rows))

    def to_json(self, shards: Sequence[ShardRecord]) -> dict[str, Any]:
        done: list[list[int]] = []
        partial: dict[str, list[list[int]]] = {}
        for index in range(len(shards)):
            if self.is_done(index, shards):
                if done and done[-1][1] == index:
                    done[-1][1] = index + 1
                else:
                    done.append([index, index + 1])
            elif self.consumed.get(index):
                partial[str(index)] = self.consumed[index].to_json()
        return {
            "done": done,
            "partial": partial,
            "rows": {str(k): v for k, v in sorted(self.rows.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> Progress:
        out = cls()
        for k, v in data.get("rows", {}).items():
            out.rows[_index(k, shards)] = _int(v, f"progress.rows[{k}]")
        for pair in data.get("done", []):
            if not isinstance(pair, list) or len(pair) != 2:
                raise StateError(f"progress.done entry {pair!r} is not a [first, stop) pair")
            for index in range(_index(pair[0], shards), _index(pair[1] - 1, shards) + 1):
                rows = out.rows_of(index, shards)
                if rows is None:
                    raise StateError(
                        f"progress.done names shard {index} "
                        f"({shards[index].url}) but its row count is unknown"
                    )
                out.of(index).add(0, rows)
        for k, v in data.get("partial", {}).items():
            try:
                out.of(_index(k, shards)).update(IntervalSet.from_json(v))
            except ValueError as e:
                raise StateError(f"progress.partial[{k}]: {e}") from None
        return out


@dataclass(slots=True)
class DatasetState:
    """What was listed: the source URLs and every shard's identity (the fingerprint)."""

    sources: list[str]
    shards: list[ShardRecord]

    def to_json(self) -> dict[str, Any]:
        return {
            "sources": list(self.sources),
            "digest": digest(self.shards),
            "shards": [s.to_json() for s in self.shards],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetState:
        shards = []
        for n, entry in enumerate(_list(data["shards"], "dataset.shards")):
            if not isinstance(entry, list) or len(entry) != 4:
                raise StateError(
                    f"dataset.shards[{n}] is {entry!r}, not [url, size, version, rows]"
                )
            url, size, version, rows = entry
            shards.append(
                ShardRecord(
                    str(url),
                    _int(size, f"dataset.shards[{n}] size"),
                    str(version),
                    None if rows is None else _int(rows, f"dataset.shards[{n}] rows"),
                )
            )
        if data.get("digest") not in (None, digest(shards)):
            raise StateError(
                "dataset.digest does not match dataset.shards: the state was "
                "edited or corrupted; save it again"
            )
        return cls([str(s) for s in data.get("sources", [])], shards)


@dataclass(slots=True)
class ProgressState:
    """How far the epoch got: its steps, its counts and the rows consumed per shard."""

    epoch: int = 0
    first_step: int = 0
    step: int = 0
    delivered: int = 0
    dropped: int = 0
    consumed: Progress = field(default_factory=Progress)

    def to_json(self, shards: Sequence[ShardRecord]) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "first_step": self.first_step,
            "step": self.step,
            "delivered": self.delivered,
            "dropped": self.dropped,
            "consumed": self.consumed.to_json(shards),
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

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "carry": {
                "spans": [list(s) for s in self.carry],
                "consumed": {
                    str(k): v.to_json()
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
            "version": STATE_VERSION,
            "dataset": self.dataset.to_json(),
            "progress": self.progress.to_json(self.dataset.shards),
            "distributed": self.distributed.to_json(),
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
        if version != STATE_VERSION:
            raise StateError(
                f"state version {version!r} is not supported (this ingest reads "
                f"version {STATE_VERSION}); resume with the ingest release that "
                "wrote it, or start without the state"
            )
        try:
            dataset = DatasetState.from_json(data["dataset"])
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


def match_listing(saved: Sequence[ShardRecord], listed: Sequence[ShardRecord]) -> None:
    """Check that every saved shard is in ``listed``, unchanged. New shards are fine.

    Raises:
        StateError: Naming the shards that are missing or changed, and what changed.
    """
    by_url = {s.url: s for s in listed}
    missing = [s.url for s in saved if s.url not in by_url]
    changed = []
    for s in saved:
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
    if not missing and not changed:
        return
    if len(missing) == len(saved):
        raise StateError(
            f"the state belongs to another dataset: none of its {len(saved)} shards (e.g. "
            f"{saved[0].url if saved else '-'}) is in this listing of {len(listed)} shards "
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
