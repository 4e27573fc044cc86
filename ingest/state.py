"""Stream state: small, plain, versioned JSON. Pure; no Ray, no I/O.

Layout (version 1)::

    {"version": 1,
     "dataset": {"sources": [...], "digest": "sha256...",
                 "shards": [[url, size, version, rows or null], ...]},
     "seed": 0, "epoch": 2, "world_size": 1,
     "progress": {"done": [[0, 40]],                  # shard indices fully consumed
                  "partial": {"41": [[0, 512], ...]},  # consumed rows of other shards
                  "rows": {"41": 9000}},               # row counts learnt by reading
     "delivered": 123456,
     "step": 120,                                      # next global step (distributed)
     "carry": {"spans": [[3, 0, 17]], "consumed": {}}, # rows carried in from the last epoch
     "dropped": 0,                                     # rows dropped by drop_remainder
     "resume": {...}}                                  # reader position hint, or null

Shard indices refer to ``dataset.shards`` of the state itself, so a dataset that grew (new
shards only) still resolves every saved index. Its size is O(shards + shuffle window).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.errors import StateError
from ingest.intervals import IntervalSet

STATE_VERSION = 1


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
class StreamState:
    """The resumable state of a stream, convertible to and from JSON."""

    sources: list[str]
    shards: list[ShardRecord]
    seed: int | None
    epoch: int
    world_size: int
    progress: Progress
    delivered: int = 0
    resume: dict[str, Any] | None = None
    step: int = 0
    carry: list[tuple[int, int, int]] = field(default_factory=list)
    """Spans ``(shard, start, stop)`` carried in from the previous epoch (equal steps)."""
    carry_progress: Progress = field(default_factory=Progress)
    dropped: int = 0

    @property
    def started(self) -> bool:
        """Whether any row of this epoch was consumed (else the epoch may re-list)."""
        return bool(
            self.delivered or self.progress.count() or self.carry_progress.count() or self.resume
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "dataset": {
                "sources": list(self.sources),
                "digest": digest(self.shards),
                "shards": [s.to_json() for s in self.shards],
            },
            "seed": self.seed,
            "epoch": self.epoch,
            "world_size": self.world_size,
            "progress": self.progress.to_json(self.shards),
            "delivered": self.delivered,
            "step": self.step,
            "carry": {
                "spans": [list(s) for s in self.carry],
                "consumed": {
                    str(k): v.to_json()
                    for k, v in sorted(self.carry_progress.consumed.items())
                    if v
                },
            },
            "dropped": self.dropped,
            "resume": self.resume,
        }

    @classmethod
    def from_json(cls, data: object) -> StreamState:
        """Parse and check a state produced by :meth:`to_json`.

        Raises:
            StateError: On an unknown version or a malformed state.
        """
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
            dataset = data["dataset"]
            shards = [
                ShardRecord(
                    str(u),
                    _int(s, "shard size"),
                    str(v),
                    None if r is None else _int(r, "shard rows"),
                )
                for u, s, v, r in dataset["shards"]
            ]
            if dataset.get("digest") not in (None, digest(shards)):
                raise StateError(
                    "dataset.digest does not match dataset.shards: the state was "
                    "edited or corrupted; save it again"
                )
            seed = data["seed"]
            if seed is not None and not isinstance(seed, int):
                raise StateError(f"seed must be an integer or null, got {seed!r}")
            carry = data.get("carry") or {}
            spans = [
                (_index(a, shards), _int(b, "carry start"), _int(c, "carry stop"))
                for a, b, c in carry.get("spans", [])
            ]
            carry_progress = Progress.from_json({"partial": carry.get("consumed", {})}, shards)
            return cls(
                sources=[str(s) for s in dataset.get("sources", [])],
                shards=shards,
                seed=seed,
                epoch=_int(data["epoch"], "epoch"),
                world_size=_int(data.get("world_size", 1), "world_size"),
                progress=Progress.from_json(data.get("progress", {}), shards),
                delivered=_int(data.get("delivered", 0), "delivered"),
                resume=data.get("resume"),
                step=_int(data.get("step", 0), "step"),
                carry=spans,
                carry_progress=carry_progress,
                dropped=_int(data.get("dropped", 0), "dropped"),
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
