"""The state as a whole: its version and its four parts, to and from JSON, with the checks
that span parts (steps against rows consumed, quarantine records against the progress).
Pure."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ingest.core.errors import StateError
from ingest.core.quarantine import check_saved
from ingest.core.state.checks import (
    BOOK_PARTS,
    FIX,
    MAX_STATE_BYTES,
    NODE_PARTS,
    READ_VERSIONS,
    STATE_VERSION,
    check_size,
    checked_int,
    refuse,
    too_large,
)
from ingest.core.state.dataset import DatasetState
from ingest.core.state.parts import DistributedState, PositionState, ProgressState
from ingest.core.state.shards import ShardRecord


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
        """The state's JSON (version 7): the book's four parts, and the ``pack`` node's
        when a packing rank handed out documents in part."""
        out: dict[str, Any] = {
            "version": STATE_VERSION,
            "dataset": self.dataset.to_json(),
            "progress": self.progress.to_json(self.dataset),
            "distributed": self.distributed.to_json(),
            "position": self.position.to_json(),
        }
        pack: dict[str, Any] = {}
        if self.progress.tokens:
            pack["tokens"] = [list(t) for t in self.progress.tokens]
        if self.progress.batches is not None:
            pack["steps"] = self.progress.batches
        if pack:
            out["pack"] = pack
        return out

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
            check_size(data, max_bytes, "the state")
            try:
                data = json.loads(data)
            except ValueError as e:
                raise StateError(
                    f"the state is not JSON ({e}); pass what state_dict() returned"
                ) from None
        if not isinstance(data, Mapping):
            raise StateError(f"a stream state is a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if version is None:
            keys = ", ".join(map(repr, list(data)[:8])) or "none"
            raise StateError(
                f"this is not an ingest stream state: it has no 'version' (its keys: {keys}); "
                "pass what state_dict() returned (in a checkpoint: ingest_stream_state.json)"
            )
        if version in (4, STATE_VERSION) and isinstance(data.get("sources"), Mapping):
            raise StateError(
                f"this is the state of a stream over several sources "
                f"({', '.join(map(repr, list(data['sources'])[:5]))}), not of one: load it "
                "into a stream over those sources, or load one source's part "
                "(state['sources'][name]) into that source's stream"
            )
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise StateError(
                f"state version {version!r} is not supported (this ingest reads "
                f"versions {', '.join(map(str, READ_VERSIONS))}); resume with the ingest "
                "release that wrote it, or start without the state"
            )
        # Every state saved holds the four parts, none null; a version 2 state without the
        # two last is read (their defaults), as it was. From version 3 on, a part missing (or
        # null) was deleted.
        parts = BOOK_PARTS if version >= 3 else ("dataset", "progress")
        missing = [part for part in parts if data.get(part) is None]
        if missing:
            raise StateError(
                f"the state is malformed: its {', '.join(map(repr, missing))} part"
                f"{'s are' if len(missing) > 1 else ' is'} missing (a state has "
                f"{', '.join(map(repr, BOOK_PARTS))}): it was edited or corrupted; {FIX}"
            )
        tokens, batches = (None, None) if version < 7 else _node_parts(data)
        try:
            dataset = DatasetState.from_json(data["dataset"], version)
            state = cls(
                dataset,
                ProgressState.from_json(data["progress"], dataset.shards, tokens, batches),
                DistributedState.from_json(data.get("distributed") or {}, dataset.shards),
                PositionState.from_json(data.get("position") or {}),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            # (AttributeError: a part of another JSON kind, a list where an object goes)
            if isinstance(e, StateError):
                raise
            raise StateError(
                f"state is malformed ({type(e).__name__}: {e}); pass the dict "
                "that state_dict() returned, unchanged"
            ) from None
        state.check_counts()
        state.check_quarantined()
        state.check_tokens()
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
            raise too_large(f"the state file {getattr(file, 'name', '')}".rstrip(), size, max_bytes)
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

    def check_tokens(self) -> None:
        """Refuse a row consumed in part (``pack.tokens``) that is also consumed whole.

        Raises:
            StateError: Naming the row and its shard.
        """
        for segment, shard, row, offset in self.progress.tokens:
            if self.consumed_whole(segment, shard, row):
                raise refuse(
                    "pack.tokens",
                    [segment, shard, row, offset],
                    f"row {row} of {self.shards[shard].url} is consumed whole already",
                )

    def consumed_whole(self, segment: int, shard: int, row: int) -> bool:
        """Whether row ``row`` of shard ``shard`` (of ``segment``: carried in, or the epoch's
        own) is among the rows consumed."""
        consumed = self.distributed.carry_consumed if segment == 0 else self.progress.consumed
        done = consumed.sets.get(shard)
        return done is not None and row in done

    def consumed_rows(self) -> int:
        """Rows consumed in the epoch (its own and the ones carried in)."""
        return self.progress.consumed.count() + self.distributed.carry_consumed.count()


def _node_parts(data: Mapping[str, Any]) -> tuple[tuple[Any, str], int | None]:
    """The node parts of a version 7 state (:data:`NODE_PARTS`): ``pack.tokens`` with the
    name it is refused under, and ``pack.steps`` (None: not kept). A part of a node this
    ingest does not have is refused: a state is exact only with every part read (a later
    node's part may hold rows to leave out), so it is never ignored."""
    known = {"version", *BOOK_PARTS, *NODE_PARTS}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise StateError(
            f"the state has part(s) {unknown} that this ingest does not know (it reads "
            f"{sorted(known)}): it was written by a newer ingest, or edited; resume with the "
            "release that wrote it"
        )
    pack = data.get("pack", {})
    if not isinstance(pack, Mapping) or set(pack) - {"tokens", "steps"}:
        raise StateError(
            f"the state's pack part is {pack!r}, not {{'tokens': [...], 'steps': N}}: the "
            f"state was edited or corrupted; {FIX}"
        )
    steps = pack.get("steps")
    batches = None if steps is None else checked_int(steps, "pack.steps")
    progress = data.get("progress")
    if isinstance(progress, Mapping) and "tokens" in progress:
        raise StateError(
            "the state (version 7) has progress.tokens: since version 7 they are pack.tokens; "
            f"the state was edited or corrupted; {FIX}"
        )
    return (pack.get("tokens", []), "pack.tokens"), batches
