"""The state's ``progress``, ``distributed`` and ``position`` parts, each checked by its own
class as it is read. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.core.errors import StateError
from ingest.core.intervals import IntervalSet
from ingest.core.quarantine import Quarantined
from ingest.core.state.checks import checked_index, checked_int, checked_list, refuse
from ingest.core.state.consumed import Consumed, check_bounds
from ingest.core.state.dataset import DatasetState
from ingest.core.state.shards import ShardRecord


@dataclass(frozen=True, slots=True)
class SkipAhead:
    """Rows a skip leaves out of a later epoch than the state's (``ingest.skip`` of steps
    the run reached after the state was saved, :mod:`ingest.core.skipping`): the book
    consumes them, with the skip's record, when it plans ``epoch``. By URL, since that
    epoch is listed anew (a followed dataset may list shards the state does not)."""

    epoch: int
    what: str
    """What was asked, for the skip's record (``steps 70..73``)."""
    rows: Mapping[str, IntervalSet]

    def count(self) -> int:
        return sum(s.count for s in self.rows.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "what": self.what,
            "rows": {url: s.encode() for url, s in sorted(self.rows.items())},
        }

    @classmethod
    def from_json(cls, data: Any, what: str, after: int) -> SkipAhead:
        """``data`` checked (``what``: where it was read); its epoch must be ``after`` or
        later (the state's epoch: a state at an epoch's start may hold that epoch's)."""
        if not isinstance(data, dict) or set(data) != {"epoch", "what", "rows"}:
            raise refuse(what, data, "it must be {'epoch': e, 'what': text, 'rows': {url: rows}}")
        epoch = checked_int(data["epoch"], f"{what}.epoch")
        if epoch < after or not isinstance(data["what"], str):
            raise refuse(what, data, f"its epoch must be at least the state's ({after})")
        rows = data["rows"]
        if not isinstance(rows, dict) or not all(isinstance(u, str) for u in rows):
            raise refuse(what, data, "its rows must map URLs to row intervals")
        try:
            sets = {url: IntervalSet.from_json(r) for url, r in rows.items()}
        except ValueError as e:
            raise refuse(what, data, str(e)) from None
        return cls(epoch, data["what"], sets)


@dataclass(slots=True)
class ProgressState:
    """How far the epoch got: its steps, its counts and the rows consumed per shard."""

    epoch: int = 0
    first_step: int = 0
    step: int = 0
    delivered: int = 0
    dropped: int = 0
    consumed: Consumed = field(default_factory=Consumed)
    quarantined: list[Quarantined] = field(default_factory=list)
    """Rows skipped in this epoch under ``on_error="skip"`` (they are in ``consumed``)."""
    tokens: list[tuple[int, int, int, int]] = field(default_factory=list)
    """``(segment, shard, row, offset)``: rows whose tokens ``[0, offset)`` reached a step and
    the rest not (a document packed into sequences, :mod:`ingest.engine.pack`); such a row is
    not in ``consumed``, and a resume reads it again from ``offset``. Sorted; version 5."""
    batches: int | None = None
    """A packing stream's batches handed out since the run began (``pack.steps``): the steps
    its provenance log numbers (:mod:`ingest.core.provenance`), which go on from here after a
    resume. None: not a packing stream's state, or one saved before they were kept."""
    ahead: list[SkipAhead] = field(default_factory=list)
    """Skips of later epochs (``skip_ahead``), kept until the book plans their epoch."""

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
        if self.ahead:
            out["skip_ahead"] = [a.to_json() for a in self.ahead]
        return out  # ``tokens`` is the pack node's part of the state (version 7)

    @classmethod
    def from_json(
        cls,
        data: Mapping[str, Any],
        shards: Sequence[ShardRecord],
        tokens: tuple[Any, str] | None = None,
        batches: int | None = None,
    ) -> ProgressState:
        """The progress part; ``tokens``: the rows consumed in part and the field they were
        read from (version 7: ``pack.tokens``); None: ``progress.tokens`` (versions 5, 6)."""
        given, field_ = (data.get("tokens", []), "progress.tokens") if tokens is None else tokens
        epoch = checked_int(data["epoch"], "progress.epoch")
        out = cls(
            epoch=epoch,
            first_step=checked_int(data.get("first_step", 0), "progress.first_step"),
            step=checked_int(data.get("step", 0), "progress.step"),
            delivered=checked_int(data.get("delivered", 0), "progress.delivered"),
            dropped=checked_int(data.get("dropped", 0), "progress.dropped"),
            consumed=Consumed.from_json(data.get("consumed", {}), shards),
            quarantined=_quarantined(data.get("quarantined", [])),
            tokens=_tokens(given, shards, field_),
            batches=batches,
            ahead=[
                SkipAhead.from_json(a, f"progress.skip_ahead[{n}]", epoch)
                for n, a in enumerate(checked_list(data.get("skip_ahead", []), "skip_ahead"))
            ],
        )
        if out.first_step > out.step:
            raise StateError(
                f"progress.first_step {out.first_step} is after progress.step {out.step}; "
                "the state was edited: save it again"
            )
        check_bounds(out.consumed, shards, "progress.consumed")
        return out


def _tokens(
    data: Any, shards: Sequence[ShardRecord], field_: str
) -> list[tuple[int, int, int, int]]:
    """``pack.tokens`` (``progress.tokens`` before version 7) checked: each ``[segment,
    shard, row, offset]`` names a row of a listed shard once, with an offset past its first
    token."""
    out: list[tuple[int, int, int, int]] = []
    for n, entry in enumerate(checked_list(data, field_)):
        what = f"{field_}[{n}]"
        if not isinstance(entry, list) or len(entry) != 4:
            raise refuse(what, entry, "it must be [segment, shard, row, offset]")
        segment = checked_int(entry[0], f"{what} segment")
        shard = checked_index(entry[1], shards)
        row = checked_int(entry[2], f"{what} row")
        offset = checked_int(entry[3], f"{what} offset")
        rows = shards[shard].rows
        if segment > 1 or offset < 1 or (rows is not None and row >= rows):
            raise refuse(
                what,
                entry,
                f"its segment must be 0 or 1, its offset at least 1, and its row below the "
                f"{rows} rows of {shards[shard].url}",
            )
        out.append((segment, shard, row, offset))
    if len({t[:3] for t in out}) != len(out) or out != sorted(out):
        raise refuse(field_, data, "each row must appear once, in sorted order")
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
    carry_consumed: Consumed = field(default_factory=Consumed)
    owed: list[tuple[int, int, int]] = field(default_factory=list)
    """``(shard, row, offset)``: copies of rows due again beyond the carried ones, carried out
    at the epoch's end (:mod:`ingest.core.carry`); sorted; version 6."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "world_size": self.world_size,
            "carry": {
                "spans": [list(s) for s in self.carry],
                "consumed": {
                    str(k): v.encode()  # the shorter form: pairs, or a bitmap
                    for k, v in sorted(self.carry_consumed.sets.items())
                    if v
                },
            },
        }
        if self.owed:
            out["owed"] = [list(o) for o in self.owed]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> DistributedState:
        world_size = checked_int(data.get("world_size", 1), "distributed.world_size")
        if world_size < 1:
            raise StateError("distributed.world_size must be >= 1")
        carry = data.get("carry") or {}
        spans = []
        for entry in checked_list(carry.get("spans", []), "distributed.carry.spans"):
            if not isinstance(entry, list) or len(entry) != 3:
                raise StateError(f"distributed.carry span {entry!r} is not [shard, start, stop]")
            shard = checked_index(entry[0], shards)
            start = checked_int(entry[1], "carry start")
            stop = checked_int(entry[2], "carry stop")
            rows = shards[shard].rows
            if stop < start or (rows is not None and stop > rows):
                raise StateError(
                    f"distributed.carry span [{start}, {stop}) of {shards[shard].url} is "
                    f"outside its {rows} rows; the state was edited: save it again"
                )
            spans.append((shard, start, stop))
        consumed = Consumed.from_json({"partial": carry.get("consumed", {})}, shards)
        check_bounds(consumed, shards, "distributed.carry.consumed")
        return cls(world_size, spans, consumed, _owed(data.get("owed", []), shards))


def _owed(data: Any, shards: Sequence[ShardRecord]) -> list[tuple[int, int, int]]:
    """``distributed.owed`` checked: each ``[shard, row, offset]`` names a row of a listed
    shard; sorted (a row may be owed more than once)."""
    out = []
    for n, entry in enumerate(checked_list(data, "distributed.owed")):
        what = f"distributed.owed[{n}]"
        if not isinstance(entry, list) or len(entry) != 3:
            raise refuse(what, entry, "it must be [shard, row, offset]")
        shard = checked_index(entry[0], shards)
        row, offset = checked_int(entry[1], f"{what} row"), checked_int(entry[2], f"{what} offset")
        rows = shards[shard].rows
        if rows is not None and row >= rows:
            raise refuse(what, entry, f"its row must be below the shard's {rows} rows")
        out.append((shard, row, offset))
    if out != sorted(out):
        raise refuse("distributed.owed", data, "it must be in sorted order")
    return out


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
        ranks = checked_list(data.get("ranks", []), "position.ranks")
        for n, cursor in enumerate(ranks):
            if cursor is not None:
                _check_cursor(cursor, f"position.ranks[{n}]")
        return cls(
            seed,
            checked_int(data.get("batch_size", 0), "position.batch_size"),
            checked_int(shuffle.get("window", 0), "position.shuffle.window"),
            checked_int(shuffle.get("lanes", 0), "position.shuffle.lanes"),
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
    checked_int(cursor["window"], f"{what}.window")
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
            if value is not None or name in ("span", "row"):  # (only the seek pair is null)
                checked_int(value, f"{where} {name}")
