"""The coordinator's logic, without Ray: epoch plans, per-rank shares, snapshots, restore.

An :class:`EpochBook` lists the source once per epoch (footers and shard indexes cached),
plans the epoch, cuts what is left of it into equal shares for the ranks
(:func:`ingest.assign.split`), takes the ranks' acks (:class:`ingest.ledger.Ledger`) and
turns them into a :class:`ingest.state.StreamState` consistent across ranks at a step.

Steps are global: epoch ``e`` runs steps ``first_step .. first_step + steps - 1`` on every
rank. The remainder of an epoch (fewer rows than one step on every rank) is carried into the
next epoch's first steps, or dropped and counted with ``drop_remainder``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.assign import CARRY, Assignment, Span, remaining, split
from ingest.catalog import Catalog, Listing
from ingest.errors import ConfigError, StateError
from ingest.formats.base import ReadOptions
from ingest.intervals import IntervalSet
from ingest.ledger import Ledger, StepRecord
from ingest.plan import epoch_units
from ingest.sources import Source
from ingest.state import Progress, StreamState, match_listing


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSpec:
    """What a distributed stream reads and how it batches it. Picklable.

    Attributes:
        urls: Source URLs, globs or directories.
        storage_options: fsspec options (never saved in the state).
        format: Format name for every shard, or None to infer from extensions.
        columns: Columns to read, or None for all.
        batch_size: Rows per batch on every rank.
        shuffle_seed: Seed for shard, block and in-block row order; None keeps listing order.
        read: How shards are read.
        drop_remainder: Drop (and count) the rows that cannot fill a step on every rank
            instead of carrying them into the next epoch.
    """

    urls: tuple[str, ...]
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    format: str | None = None
    columns: tuple[str, ...] | None = None
    batch_size: int = 1024
    shuffle_seed: int | None = None
    read: ReadOptions = field(default_factory=ReadOptions)
    drop_remainder: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be >= 1")
        if self.columns is not None and not self.columns:
            raise ConfigError("columns=[] selects nothing; pass None for all columns")


@dataclass(frozen=True, slots=True)
class RankPlan:
    """What one rank reads in one epoch: its spans, in order, and its step numbers."""

    epoch: int
    rank: int
    world_size: int
    first_step: int
    steps: int
    spans: tuple[Span, ...]
    listing: Listing


@dataclass(slots=True)
class _Epoch:
    epoch: int
    first_step: int
    listing: Listing
    carry: tuple[Span, ...]
    assignment: Assignment
    main: Progress
    carried: Progress
    delivered: int
    dropped: int
    based: int = 0
    """Steps before this one are folded into ``main``, ``carried`` and ``delivered``."""

    @property
    def end_step(self) -> int:
        return self.first_step + self.assignment.steps


class EpochBook:
    """Plans epochs for ``world_size`` ranks and keeps their acks.

    Args:
        spec: The stream.
        world_size: Number of ranks.
        progress: Show progress bars while listing and indexing.
    """

    def __init__(self, spec: StreamSpec, world_size: int, *, progress: bool = False) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size={world_size} must be >= 1")
        self.spec = spec
        self.world_size = world_size
        self.source = Source(spec.urls, storage_options=spec.storage_options, format=spec.format)
        self.catalog = Catalog(self.source, spec.read, spec.columns)
        self._progress = progress
        self._epochs: dict[int, _Epoch] = {}
        self._start: StreamState | None = None
        self._start_listing: Listing | None = None
        self._start_epoch = 0
        self._start_step = 0
        self.ledger = Ledger(world_size, 0)

    # -- planning --------------------------------------------------------------------------

    def scan(self) -> Listing:
        """One listing of the source, with row counts and seek points for every shard."""
        return self.catalog.scan(progress=self._progress, index=True)

    @property
    def first_epoch(self) -> int:
        return self._start_epoch

    def plan(self, epoch: int) -> _Epoch:
        """The plan of ``epoch`` (made on first use; lists the source once per epoch)."""
        if epoch < self._start_epoch:
            raise StateError(
                f"epoch {epoch} was before the restored state "
                f"(epoch {self._start_epoch}); it cannot be planned again"
            )
        got = self._epochs.get(epoch)
        if got is None:
            got = self._epochs[epoch] = self._make(epoch)
        return got

    def _make(self, epoch: int) -> _Epoch:
        spec = self.spec
        if epoch == self._start_epoch:
            start = self._start
            listing = self._start_listing or self.scan()
            if start is None:
                carry: tuple[Span, ...] = ()
                main, carried, delivered, dropped = Progress(), Progress(), 0, 0
            else:
                carry = _remap(start.carry, start, listing)
                main, carried = start.progress, start.carry_progress
                delivered, dropped = start.delivered, start.dropped
            first_step = self._start_step
        else:
            prev = self.plan(epoch - 1)
            listing = self.scan()
            dropped = prev.dropped
            if spec.drop_remainder:
                carry = ()
                dropped += prev.assignment.remainder_rows
            else:
                by_url = {s.url: n for n, s in enumerate(listing.shards)}
                carry = tuple(
                    Span(by_url[prev.listing.shards[s.shard].url], s.start, s.stop, CARRY)
                    for s in prev.assignment.remainder
                )
            main, carried, delivered = Progress(), Progress(), 0
            first_step = prev.end_step
        rows = [i.rows or 0 for i in listing.infos]
        units = epoch_units(listing.plan_shards(), spec.shuffle_seed, epoch)
        spans = [
            Span(s.shard, a, b, CARRY)
            for s in carry
            for a, b in carried.consumed.get(s.shard, IntervalSet()).gaps(s.start, s.stop)
        ]
        spans += remaining(units, rows, main.consumed)
        assignment = split(spans, self.world_size, spec.batch_size)
        return _Epoch(
            epoch,
            first_step,
            listing,
            carry,
            assignment,
            main.copy(),
            carried.copy(),
            delivered,
            dropped,
            first_step,
        )

    def rank_plan(self, rank: int, epoch: int) -> RankPlan:
        """What ``rank`` reads in ``epoch``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside world_size {self.world_size}")
        e = self.plan(epoch)
        return RankPlan(
            epoch,
            rank,
            self.world_size,
            e.first_step,
            e.assignment.steps,
            e.assignment.ranks[rank],
            e.listing,
        )

    # -- acks and snapshots ----------------------------------------------------------------

    def ack(self, rank: int, records: Sequence[StepRecord]) -> None:
        self.ledger.ack(rank, records)

    def snapshot(self, step: int) -> StreamState:
        """The state after ``step`` (every rank's batches up to and including it).

        Raises:
            StateError: If a rank has not acked ``step`` yet, or the step was never planned.
        """
        if not self.ledger.ready(step):
            raise StateError(
                f"not every rank has acked step {step} yet; flush the rank "
                "iterators (RankIterator.state_dict) before the snapshot"
            )
        nxt = step + 1
        if not self._epochs and nxt == self._start_step:
            return self._state_in(self.plan(self._start_epoch), step)
        for e in sorted(self._epochs.values(), key=lambda x: x.epoch):
            if e.first_step <= nxt < e.end_step:
                return self._state_in(e, step)
            if nxt == e.end_step:
                return self._state_after(e, step)
        raise StateError(f"step {step} is outside every planned epoch")

    def _state_in(self, e: _Epoch, step: int) -> StreamState:
        main, carried = e.main.copy(), e.carried.copy()
        for segment, shard, start, stop in self.ledger.runs(e.based, step):
            (carried if segment == CARRY else main).of(shard).add(start, stop)
        done = max(step + 1 - e.based, 0)
        delivered = e.delivered + done * self.spec.batch_size * self.world_size
        return StreamState(
            list(self.spec.urls),
            e.listing.records(),
            self.spec.shuffle_seed,
            e.epoch,
            self.world_size,
            main,
            delivered,
            None,
            step + 1,
            [(s.shard, s.start, s.stop) for s in e.carry],
            carried,
            e.dropped,
        )

    def _state_after(self, e: _Epoch, step: int) -> StreamState:
        carry: list[tuple[int, int, int]] = []
        dropped = e.dropped
        if self.spec.drop_remainder:
            dropped += e.assignment.remainder_rows
        else:
            carry = [(s.shard, s.start, s.stop) for s in e.assignment.remainder]
        return StreamState(
            list(self.spec.urls),
            e.listing.records(),
            self.spec.shuffle_seed,
            e.epoch + 1,
            self.world_size,
            Progress(),
            0,
            None,
            step + 1,
            carry,
            Progress(),
            dropped,
        )

    def fold(self, step: int) -> None:
        """Keep the acks of steps ``<= step`` in the epochs' base progress and forget them."""
        for e in self._epochs.values():
            last = min(step, e.end_step - 1)
            if last < e.based:
                continue
            for segment, shard, start, stop in self.ledger.runs(e.based, last):
                (e.carried if segment == CARRY else e.main).of(shard).add(start, stop)
            e.delivered += (last + 1 - e.based) * self.spec.batch_size * self.world_size
            e.based = last + 1
        self.ledger.fold(step)

    # -- restore ---------------------------------------------------------------------------

    def load(self, state: StreamState) -> None:
        """Restore from ``state``; its world size may differ from this book's.

        Raises:
            StateError: If the seed differs or the state's shards are gone or changed.
        """
        if state.seed != self.spec.shuffle_seed:
            raise StateError(
                f"the state was saved with shuffle_seed={state.seed}, this stream "
                f"has shuffle_seed={self.spec.shuffle_seed}; use the same seed"
            )
        listing = self.scan()
        match_listing(state.shards, listing.records())
        if state.started:
            listing = listing.subset([s.url for s in state.shards])
        self._epochs.clear()
        self._start = state
        self._start_listing = listing
        self._start_epoch = state.epoch
        self._start_step = state.step
        self.ledger = Ledger(self.world_size, state.step)


def _remap(
    carry: Sequence[tuple[int, int, int]], state: StreamState, listing: Listing
) -> tuple[Span, ...]:
    by_url = {s.url: n for n, s in enumerate(listing.shards)}
    return tuple(Span(by_url[state.shards[i].url], a, b, CARRY) for i, a, b in carry)


__all__ = ["EpochBook", "RankPlan", "StreamSpec"]
