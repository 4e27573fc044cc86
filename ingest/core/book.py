"""The coordinator's logic, without Ray or I/O: epoch plans, per-rank shares, snapshots,
restore.

An :class:`EpochBook` asks its lister (:class:`ingest.planner.Planner`) for one listing per
epoch (:mod:`ingest.core.listing`: the book reads only row counts and fingerprints), plans
the epoch, cuts what is left of it into equal shares for the ranks
(:func:`ingest.core.assign.split`), takes the ranks' acks (:class:`ingest.core.ledger.Ledger`) and
turns them into a :class:`ingest.core.state.StreamState` consistent across ranks at a step. The
single-process :class:`ingest.Stream` is a book with one rank; :class:`ingest.RayStream`
wraps one in its coordinator actor.

Steps are global: epoch ``e`` runs steps ``first_step .. first_step + steps - 1`` on every
rank. The remainder of an epoch (fewer rows than one step on every rank) is carried into the
next epoch's first steps (``remainder="carry"``), or dropped and counted (``"drop"``). With
one rank, shards whose row count is unknown (JSONL, CSV, tar without an index) are read
without a count and the remainder is settled when the epoch's reading ends; with more ranks
every count must be known so that ranks take equal steps, and unindexed shards are indexed.

Restore. With the world size, batch size and shuffle settings of the state, every rank gets
its original share back with the consumed rows left out and its saved cursor, so the rest of
the epoch is exactly the uninterrupted run's; the cursors are checked against those shares
when the state is loaded. Otherwise, and for a state saved after an elastic restore in the
same epoch (its shares were cut from the rest of the epoch, which the state does not keep),
the rows still to deliver are shared out again among the ranks there are now (elastic).

At scale. A snapshot merges the acked runs rank by rank (each rank's rows sorted on their
own, then added to the interval sets in one pass per rank), keeps which shards are done
beside the progress so that the state's JSON is written from the shards touched since the
last fold, and takes the listing part of the state as made once, when the epoch was planned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal

import numpy as np
import numpy.typing as npt

from ingest.core.assign import (
    CARRY,
    MAIN,
    TO_END,
    Assignment,
    Span,
    Spans,
    cycle_collection_paused,
    remaining,
    split,
)
from ingest.core.errors import ConfigError, StateError
from ingest.core.intervals import IntervalSet
from ingest.core.ledger import Ledger, Run, Runs, StepRecord, as_runs
from ingest.core.listing import L, Listed, Lister, consumed_before
from ingest.core.plan import epoch_units
from ingest.core.positions import check_positions
from ingest.core.progress import add_runs, all_of, remap, shard_table
from ingest.core.quarantine import Quarantined, check_bound, merge
from ingest.core.share import FeedPlan
from ingest.core.state import (
    Consumed,
    Cursor,
    DatasetState,
    DistributedState,
    PositionState,
    ProgressState,
    StreamState,
    match_listing,
)
from ingest.core.validate import COUNT, check_numbers, check_remainder

Remainder = Literal["carry", "drop"]

FOLD_EVERY = 64
"""Steps every rank acks between two folds of the acks into the consumed intervals
(:meth:`EpochBook.fold_due`): the ledger holds at most about this many steps per rank.
Without a fold the acks of a job that never takes a state pile up (and, on Ray, pin their
messages in the object store); folding below the lowest acked step never changes a later
state."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BookConfig:
    """How a book cuts and orders epochs; the same for every rank of a stream.

    Attributes:
        sources: The stream's source URLs as every state records them (credentials and
            query values redacted).
        batch_size: Rows per batch on every rank.
        seed: Shuffle seed (shard, block and row order); None keeps listing order.
        lanes: Shards read side by side into each shuffle window.
        remainder: The rows of an epoch that cannot fill one more step on every rank:
            ``"carry"`` them into the next epoch's first steps, or ``"drop"`` them.
        max_errors: Most quarantines per rank and epoch (``ReadOptions.max_errors``).
        follows: Each epoch is a round over the shards that appeared since the last
            (:mod:`ingest.storage.follow`); otherwise every epoch reads the whole listing.
    """

    sources: tuple[str, ...]
    batch_size: int
    seed: int | None
    lanes: int
    remainder: Remainder = "carry"
    max_errors: int = 100
    follows: bool = False

    def __post_init__(self) -> None:
        check_numbers(self, "BookConfig", batch_size=COUNT, lanes=COUNT)
        check_remainder(self.remainder)


@dataclass(slots=True)
class _PlannedEpoch(Generic[L]):
    epoch: int
    first_step: int
    listing: L
    carry: tuple[Span, ...]
    assignment: Assignment
    steps: int | None
    """Steps of the whole epoch; None until reading ends when row counts are unknown."""
    main: Consumed
    carried: Consumed
    delivered: int
    dropped: int
    based: int
    """Steps before this one are folded into ``main``, ``carried`` and ``delivered``."""
    opened: int
    """The step the ranks' feeds start at in this run of the epoch (fixed at planning)."""
    skip: tuple[dict[int, IntervalSet], dict[int, IntervalSet]]
    cursors: list[Cursor | None] | None
    counts: npt.NDArray[np.int64]
    """Every shard's row count in the listing, -1 where unknown."""
    dataset: DatasetState
    """The listing as the state records it, made once (its JSON is kept with it)."""
    window: int = 0
    """Rows per shuffle window in this epoch (:meth:`Lister.window_rows` of its listing)."""
    merged: tuple[int, int, Consumed, Consumed] | None = None
    """``(based, step, main, carried)``: the last snapshot's progress, for the fold after."""

    @property
    def end_step(self) -> int | None:
        return None if self.steps is None else self.first_step + self.steps


class EpochBook(Generic[L]):
    """Plans epochs for ``world_size`` ranks and keeps their acks. No I/O.

    Args:
        config: How epochs are cut and ordered.
        world_size: Number of ranks.
        lister: Makes the listings epochs are planned from (:class:`ingest.planner.Planner`).
    """

    def __init__(self, config: BookConfig, world_size: int, lister: Lister[L]) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size={world_size} must be >= 1")
        self.config = config
        self._sources = list(config.sources)
        self.world_size = world_size
        self.lister = lister
        self._epochs: dict[int, _PlannedEpoch[L]] = {}
        self._start: StreamState | None = None
        self._start_listing: L | None = None
        self._handed = False
        """The start listing was made by the caller (see :meth:`_make_first`)."""
        self._start_epoch = 0
        self._start_step = 0
        self._in_order = False
        """Whether the loaded state resumes in its original order (:meth:`_same_order`)."""
        self._cursors: dict[int, tuple[int, Cursor]] = {}
        self.ledger = Ledger(world_size, 0)
        self._quarantined: list[tuple[int, Quarantined]] = []
        """``(step acked with, record)``; step -1: from the loaded state or an epoch's end."""
        self._short: dict[int, int] = {}
        """Rows missing from the batches of each step that held quarantined rows."""
        self._ended: dict[int, int] = {}
        """The last epoch whose end each rank's loop reached (:meth:`ended`)."""
        self._folded = -1
        """The last step folded (:meth:`fold_due`)."""

    # -- planning --------------------------------------------------------------------------

    def adopt(self, listing: L) -> None:
        """Plan the first epoch from ``listing``, made by the caller (e.g. while this book's
        actor started); unless a state was loaded or an epoch was planned already."""
        self.lister.remember(listing)
        if self._start is None and not self._epochs and self._start_listing is None:
            self._start_listing = listing

    def _list(self, wanted: Callable[[L], bool] | None = None, *, first: bool = False) -> L:
        """A listing from the lister; several ranks need every shard's row count."""
        return self.lister.listing(wanted, first=first, counted=self.world_size > 1)

    @property
    def first_epoch(self) -> int:
        return self._start_epoch

    def upcoming_epoch(self, rank: int) -> int:
        """The epoch a new iterator of ``rank`` runs: the first one the rank has not
        finished (a loop left early goes on in the epoch it left).

        A rank finished an epoch when it acked every step of it, or when it reached the
        epoch's end (:meth:`ended`). An epoch with no step (fewer rows than one step on every
        rank) is finished only by reaching its end: whether it was planned yet when a rank
        asks must not decide which epoch the rank runs, or ranks would part ways.
        """
        acked = self.ledger.acked(rank)
        epoch = self._start_epoch
        while True:
            e = self._epochs.get(epoch)
            if e is None or e.end_step is None:
                return epoch
            reached = epoch <= self._ended.get(rank, -1)
            if not reached and (e.end_step == e.first_step or acked < e.end_step - 1):
                return epoch
            epoch += 1

    def finish(
        self,
        rank: int,
        epoch: int,
        steps: int,
        leftover: Runs | Sequence[Run],
        learned: Mapping[int, int],
        quarantined: Iterable[Quarantined] = (),
    ) -> None:
        """``rank``'s loop reached the end of ``epoch``: its feed yielded ``steps`` batches in
        this run, read ``leftover`` rows after the last full batch and learnt the row counts
        ``learned`` (see :meth:`close`), and recorded ``quarantined`` since its last batch."""
        self.close(epoch, steps, leftover, learned)
        self.note_quarantined(quarantined)
        self.ended(rank, epoch)

    def ended(self, rank: int, epoch: int) -> None:
        """``rank``'s loop reached the end of ``epoch`` (see :meth:`upcoming_epoch`)."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside world_size {self.world_size}")
        self._ended[rank] = max(self._ended.get(rank, -1), epoch)

    def position(self, rank: int) -> tuple[int, int | None, Cursor | None]:
        """Where ``rank``'s next batch comes from: ``(epoch, next_step, cursor)``.

        ``next_step`` and ``cursor`` are None when the rank consumed nothing of the epoch in
        this run (its feed starts at the share's start: :meth:`rank_plan`); otherwise the
        rank's feed resumes at ``next_step`` from ``cursor`` (:meth:`rank_resume`).

        Raises:
            StateError: If the rank's acks are still arriving (the last one's cursor is for
                a later step than every step acked): flush them first.
        """
        epoch = self.upcoming_epoch(rank)
        e = self._epochs.get(epoch)
        acked = self.ledger.acked(rank)
        if e is None or acked < e.opened:
            return epoch, None, None
        got = self._cursors.get(rank)
        if got is None or got[0] != acked:
            raise StateError(
                f"rank {rank} acked every step up to {acked}, but its last position is for "
                f"step {None if got is None else got[0]}: acks of the rank are still on their "
                "way; flush its iterator before another one takes the rank over"
            )
        return epoch, acked + 1, got[1]

    def plan(self, epoch: int) -> _PlannedEpoch[L]:
        """The plan of ``epoch`` (made on first use from a new listing: one per epoch)."""
        if epoch < self._start_epoch:
            raise StateError(
                f"epoch {epoch} was before the restored state "
                f"(epoch {self._start_epoch}); it cannot be planned again"
            )
        got = self._epochs.get(epoch)
        if got is None:
            got = self._make(epoch)
            # A followed round waits for new shards: another caller may have planned it.
            got = self._epochs.setdefault(epoch, got)
        return got

    def _make(self, epoch: int) -> _PlannedEpoch[L]:
        if epoch == self._start_epoch:
            return self._make_first(epoch)
        prev = self.plan(epoch - 1)
        if prev.steps is None:
            raise StateError(
                f"epoch {epoch} cannot be planned before epoch {epoch - 1} has been read to "
                "its end (its row counts are learnt by reading)"
            )

        def wanted(listing: L) -> bool:  # a followed round: a full step of new rows
            if epoch in self._epochs:
                return True
            carry, main = self._round_after(prev, listing)
            return self._has_a_step(listing, main, carry)

        listing = self._list(wanted if self.config.follows else None)
        carry, main = self._round_after(prev, listing)
        dropped = prev.dropped
        if self.config.remainder == "drop":
            dropped += prev.assignment.remainder_rows
        first = prev.first_step + prev.steps
        return self._planned(
            epoch, first, listing, carry, main, Consumed(), 0, dropped, first, None
        )

    def _round_after(self, prev: _PlannedEpoch[L], listing: L) -> tuple[tuple[Span, ...], Consumed]:
        """What the epoch after ``prev`` starts with in ``listing``: the rows ``prev``
        carries into it, and (following a dataset) the shards earlier rounds consumed."""
        carry: tuple[Span, ...] = ()
        if self.config.remainder == "carry":
            by_url = {s.url: n for n, s in enumerate(listing.shards)}
            missing = [
                prev.listing.shards[s.shard].url
                for s in prev.assignment.remainder
                if prev.listing.shards[s.shard].url not in by_url
            ]
            if missing:
                consumed_before(prev.listing.shards, listing.shards)  # says what vanished
            carry = tuple(
                Span(by_url[prev.listing.shards[s.shard].url], s.start, s.stop, CARRY)
                for s in prev.assignment.remainder
            )
        main = Consumed()
        if self.config.follows:
            # A round: the shards the rounds before read are consumed (they only grow).
            done = consumed_before(prev.listing.shards, listing.shards)
            main = all_of(listing, done, _learnt(prev))
        return carry, main

    def _has_a_step(self, listing: Listed, main: Consumed, carry: Sequence[Span]) -> bool:
        """Whether a round of a followed dataset has a full step of rows to read: rows of
        shards not consumed yet (unknown counts: as many as it takes) and carried rows."""
        fresh = sum(
            TO_END if i.rows is None else i.rows
            for n, i in enumerate(listing.infos)
            if n not in main.consumed
        ) + sum(s.stop - s.start for s in carry)
        return fresh >= self.world_size * self.config.batch_size

    def _make_first(self, epoch: int) -> _PlannedEpoch[L]:
        start = self._start
        step = self._start_step
        if start is None:
            listing = self._start_listing
            if listing is None:
                listing = self._list(first=True)
            return self._planned(epoch, step, listing, (), Consumed(), Consumed(), 0, 0, step, None)

        def resumed(listing: L) -> tuple[tuple[Span, ...], Consumed, Consumed]:
            by_url = {s.url: n for n, s in enumerate(listing.shards)}
            carry = tuple(
                Span(by_url[start.shards[i].url], a, b, CARRY)
                for i, a, b in start.distributed.carry
            )
            main = remap(start.progress.consumed, start, by_url)
            carried = remap(start.distributed.carry_consumed, start, by_url)
            return carry, main, carried

        def wanted(listing: L) -> bool:  # a followed round loaded at its start
            match_listing(start.dataset, listing.records(), listing.classes)
            carry, main, _ = resumed(listing)
            return self._has_a_step(listing, main, carry)

        # A followed round loaded at its start (a DataLoader's every epoch, a stream resumed
        # between rounds) waits for new rows like a round planned after another; not when the
        # caller handed the listing (a DataLoader worker plans what its main process did).
        waits = self.config.follows and not start.started and not self._handed
        listing = self._start_listing
        if listing is not None and waits and not wanted(listing):
            listing = None  # list again, and wait
        if listing is None:  # listed again while a round waits: the state must fit it
            listing = self._list(wanted if waits else None, first=True)
            match_listing(start.dataset, listing.records(), listing.classes)
        carry, main, carried = resumed(listing)
        p = start.progress
        if self._in_order:
            planned = self._planned(
                epoch,
                p.first_step,
                listing,
                carry,
                Consumed(),
                Consumed(),
                0,
                p.dropped,
                p.first_step,
                list(start.position.ranks) or None,
            )
            # The original shares, minus what was consumed, from the saved cursors.
            planned.main, planned.carried = main, carried
            planned.delivered, planned.based, planned.opened = p.delivered, p.step, p.step
            planned.skip = (dict(carried.consumed), dict(main.consumed))
            return planned
        planned = self._planned(
            epoch, step, listing, carry, main, carried, p.delivered, p.dropped, step, None
        )
        return planned

    def _same_order(self, state: StreamState, listing: L) -> bool:
        """Whether ``state`` resumes in the original order (else the rest is shared anew).

        Only a state whose shares are the whole epoch's can: one whose every step since the
        epoch began consumed a batch on each of the same ranks. After an elastic restore the
        shares were cut from the rest of the epoch, which the state does not keep apart.
        """
        pos, config, p = state.position, self.config, state.progress
        return (
            state.distributed.world_size == self.world_size
            and pos.batch_size == config.batch_size
            and pos.window == self.lister.window_rows(listing)
            and pos.lanes == config.lanes
            and len(pos.ranks) == self.world_size
            and all(c is not None for c in pos.ranks)
            and state.consumed_rows() == (p.step - p.first_step) * self.world_size * pos.batch_size
        )

    def _planned(
        self,
        epoch: int,
        first_step: int,
        listing: L,
        carry: tuple[Span, ...],
        main: Consumed,
        carried: Consumed,
        delivered: int,
        dropped: int,
        based: int,
        cursors: list[Cursor | None] | None,
    ) -> _PlannedEpoch[L]:
        counts = np.fromiter(
            (-1 if i.rows is None else i.rows for i in listing.infos), np.int64, len(listing.infos)
        )
        counts.setflags(write=False)
        rows = np.where(counts < 0, TO_END, counts).tolist()
        units = epoch_units(listing.plan_shards(), self.config.seed, epoch)
        carried_spans = [
            Span(s.shard, a, b, CARRY)
            for s in carry
            for a, b in carried.consumed.get(s.shard, IntervalSet()).gaps(s.start, s.stop)
        ]
        # Millions of spans: kept as arrays until the ranks' shares are cut.
        spans = remaining(units, rows, main.consumed)
        if carried_spans:
            spans = Spans.concat([Spans.of(carried_spans), spans])
        if bool((spans.stop == TO_END).any()):
            if self.world_size > 1:
                raise StateError(
                    "some shards have no row count; several ranks need them all (index the "
                    "shards: `ingest index URL`)"
                )
            assignment = Assignment((tuple(spans),), 0, ())
            steps = None
        else:
            assignment = split(spans, self.world_size, self.config.batch_size)
            steps = assignment.steps + (based - first_step)
        with cycle_collection_paused():
            dataset = DatasetState(
                self._sources, shard_table(listing, counts), classes=listing.classes
            )
            # The listing part of every state of the epoch, made once (a second for a million
            # shards: here rather than in the first snapshot).
            dataset.to_json()
        return _PlannedEpoch(
            epoch,
            first_step,
            listing,
            carry,
            assignment,
            steps,
            main.copy(),
            carried.copy(),
            delivered,
            dropped,
            based,
            based,
            ({}, {}),
            cursors,
            counts,
            dataset,
            self.lister.window_rows(listing),
        )

    def rank_plan(self, rank: int, epoch: int) -> FeedPlan[L]:
        """What ``rank`` reads in ``epoch``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside world_size {self.world_size}")
        e = self.plan(epoch)
        cursor = e.cursors[rank] if e.cursors and e.opened > e.first_step else None
        end = e.end_step
        return FeedPlan(
            epoch,
            rank,
            e.opened,
            None if end is None else end - e.opened,
            e.assignment.ranks[rank],
            e.skip,
            cursor,
            e.listing,
            e.window,
        )

    def rank_resume(
        self, rank: int, epoch: int, next_step: int, cursor: Cursor | None
    ) -> FeedPlan[L]:
        """``rank``'s plan from ``next_step`` on, after its reader was lost mid-epoch.

        Every batch of the rank before ``next_step`` must have been acked: their rows are
        left out, and ``cursor`` (the one of the batch before ``next_step``) positions the
        rank's lanes.
        """
        plan = self.rank_plan(rank, epoch)
        if next_step == plan.next_step:
            return plan
        if self.ledger.acked(rank) < next_step - 1:
            raise StateError(
                f"rank {rank} resumes at step {next_step} but acked only up to step "
                f"{self.ledger.acked(rank)}; flush its acks first"
            )
        e = self.plan(epoch)
        main, carried = e.main.shallow(), e.carried.shallow()
        add_runs(self.ledger.runs_by_rank(e.based, next_step - 1), carried, main, e.counts)
        end = e.end_step
        return FeedPlan(
            epoch,
            rank,
            next_step,
            None if end is None else end - next_step,
            plan.spans,
            (dict(carried.consumed), dict(main.consumed)),
            cursor,
            e.listing,
            e.window,
        )

    def close(
        self, epoch: int, steps: int, leftover: Runs | Sequence[Run], learned: Mapping[int, int]
    ) -> None:
        """Settle an epoch whose row counts were unknown, when its one rank read it all.

        Args:
            epoch: The epoch.
            steps: Batches the rank's feed yielded in this run.
            leftover: Rows read after the last full batch (the epoch's remainder).
            learned: Row counts learnt by reading, per shard index.
        """
        e = self.plan(epoch)
        if e.steps is not None:
            return
        e.steps = e.opened - e.first_step + steps
        e.main.rows.update(learned)
        remainder = tuple(
            Span(shard, a, b, segment) for segment, shard, a, b in as_runs(leftover).tolist()
        )
        e.assignment = Assignment(e.assignment.ranks, e.steps, remainder)

    # -- acks and snapshots ----------------------------------------------------------------

    def ack(
        self,
        rank: int,
        records: Sequence[StepRecord],
        cursor: Cursor | None = None,
        *,
        again: bool = False,
    ) -> None:
        """Record ``rank``'s consumed steps; ``cursor`` is its position after the last.

        ``again``: the message is a resend of one whose answer was lost (the coordinator was
        unreachable for a moment, so it may or may not have run it). Its steps already
        recorded are left out, with their rows and quarantines, instead of refused as a
        replay: a resend counts nothing twice.
        """
        if again:
            records = [r for r in records if not self.ledger.has(rank, r.step)]
        self.ledger.ack(rank, records)
        if cursor is not None and records:
            self._cursors[rank] = (max(r.step for r in records), cursor)
        for r in records:
            if r.rows >= 0:
                self._short[r.step] = self._short.get(r.step, 0) + self.config.batch_size - r.rows
            if r.quarantined:
                self.note_quarantined(r.quarantined, r.step)

    def note_quarantined(self, records: Iterable[Quarantined], step: int = -1) -> None:
        """Keep quarantine records (``step``: the step acked with them; -1: none).

        Raises:
            IngestError: If a rank's quarantines in an epoch pass ``ReadOptions.max_errors``
                (a feed counts its own; a rank's transform failures are counted here).
        """
        known = [q for _, q in self._quarantined]
        added = merge(known, records)[len(known) :]
        for q in added:
            self._quarantined.append((step, q))
        for epoch, rank in {(q.epoch, q.rank) for q in added}:
            mine = [r for _, r in self._quarantined if (r.epoch, r.rank) == (epoch, rank)]
            check_bound(mine, self.config.max_errors)

    def quarantined(self) -> list[Quarantined]:
        """Every quarantine this book knows of, oldest first (``on_error="skip"``)."""
        return [q for _, q in sorted(self._quarantined, key=lambda sq: sq[1].epoch)]

    def _missing(self, first: int, last: int) -> int:
        """Rows the quarantines took out of the batches of steps ``first..last``."""
        return sum(n for step, n in self._short.items() if first <= step <= last)

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
            end = e.end_step
            if e.first_step <= nxt and (end is None or nxt < end):
                return self._state_in(e, step)
            if nxt == end:
                # An epoch with no step is over when every rank reached its end (steps do
                # not tell), and so are those with no step right after it.
                if end == e.first_step and not self._all_ended(e.epoch):
                    return self._state_in(e, step)
                while (f := self._epochs.get(e.epoch + 1)) is not None and (
                    f.first_step == f.end_step == nxt and self._all_ended(f.epoch)
                ):
                    e = f
                return self._state_after(e, step)
        raise StateError(f"step {step} is outside every planned epoch")

    def _all_ended(self, epoch: int) -> bool:
        return all(self._ended.get(r, -1) >= epoch for r in range(self.world_size))

    def snapshot_acked(self) -> StreamState:
        """The state after every batch any rank acked, when ranks acked unequal steps.

        A torch ``DataLoader`` hands out its workers' batches one after another, so at any
        moment some workers (ranks) are a step ahead. This is :meth:`snapshot` at the last
        step every rank acked, with the rows of the steps acked beyond it also counted as
        consumed (and delivered). Such a state has no cursors: a resume shares the rest of
        the epoch anew, leaving out every consumed row, as after a world-size change.

        The ranks ahead may have started an epoch the others have not (the first batches
        of every epoch, and an epoch's end that the workers straddle): the state is then in
        that epoch, at its first step, with the rows of its steps acked counted.

        Raises:
            StateError: If the steps acked beyond the common one span an epoch's end (some
                rank two epochs ahead), which one ``DataLoader`` epoch never does.
        """
        step = min(self.ledger.acked(r) for r in range(self.world_size))
        top = max(self.ledger.acked(r) for r in range(self.world_size))
        if top == step:
            return self.snapshot(step)
        e = self._epoch_holding(step + 1, top)
        state = self._state_in(e, step)
        main = state.progress.consumed.shallow()
        carried = state.distributed.carry_consumed.shallow()
        with cycle_collection_paused():
            add_runs(self.ledger.runs_by_rank(step + 1, top), carried, main, e.counts)
        ahead = sum(self.ledger.acked(r) - step for r in range(self.world_size))
        delivered = state.progress.delivered + ahead * self.config.batch_size
        delivered -= self._missing(step + 1, top)
        return replace(
            state,
            progress=replace(state.progress, consumed=main, delivered=delivered),
            distributed=replace(state.distributed, carry_consumed=carried),
            position=replace(state.position, ranks=[None] * self.world_size),
        )

    def _epoch_holding(self, first: int, last: int) -> _PlannedEpoch[L]:
        """The planned epoch whose steps include ``first..last``.

        Raises:
            StateError: If no one epoch holds them all.
        """
        for e in self._epochs.values():
            end = e.end_step
            if e.first_step <= first and (end is None or last < end):
                return e
        raise StateError(
            f"ranks acked up to steps {first - 1} and {last}, more than an epoch apart; take "
            "the state when every rank is within one epoch (one DataLoader loop)"
        )

    def _position(
        self, step: int, restored: list[Cursor | None] | None, window: int
    ) -> PositionState:
        config = self.config
        ranks: list[Cursor | None] = []
        for rank in range(self.world_size):
            got = self._cursors.get(rank)
            ranks.append(got[1] if got is not None and got[0] == step else None)
        if restored is not None and all(c is None for c in ranks):
            ranks = list(restored)
        return PositionState(config.seed, config.batch_size, window, config.lanes, ranks)

    def _state_in(self, e: _PlannedEpoch[L], step: int) -> StreamState:
        if step + 1 < e.based:
            raise StateError(
                f"step {step} was folded already (acks are kept from step {e.based} on); "
                "take a state at a later step"
            )
        main, carried = e.main.shallow(), e.carried.shallow()
        with cycle_collection_paused():
            add_runs(self.ledger.runs_by_rank(e.based, step), carried, main, e.counts)
        e.merged = (e.based, step, main, carried)
        done = step + 1 - e.based
        delivered = e.delivered + done * self.config.batch_size * self.world_size
        delivered -= self._missing(e.based, step)
        restored = e.cursors if step + 1 == e.opened else None
        quarantined = [q for s, q in self._quarantined if q.epoch == e.epoch and s <= step]
        return StreamState(
            e.dataset,
            ProgressState(e.epoch, e.first_step, step + 1, delivered, e.dropped, main, quarantined),
            DistributedState(
                self.world_size, [(s.shard, s.start, s.stop) for s in e.carry], carried
            ),
            self._position(step, restored, e.window),
        )

    def _state_after(self, e: _PlannedEpoch[L], step: int) -> StreamState:
        carry: list[tuple[int, int, int]] = []
        dropped = e.dropped
        if self.config.remainder == "drop":
            dropped += e.assignment.remainder_rows
        else:
            carry = [(s.shard, s.start, s.stop) for s in e.assignment.remainder]
        dataset = e.dataset
        learnt = {i: n for i, n in e.main.rows.items() if e.counts[i] < 0}
        if learnt:  # counts learnt by reading: recorded with the listing from now on
            records = e.listing.records()
            for index, rows in learnt.items():
                records[index] = records[index]._replace(rows=rows)
            dataset = DatasetState(self._sources, records, classes=e.listing.classes)
        following = Consumed()
        if self.config.follows:  # the next round reads none of these shards again
            following = all_of(e.listing, range(len(e.listing.shards)), _learnt(e))
        return StreamState(
            dataset,
            ProgressState(e.epoch + 1, step + 1, step + 1, 0, dropped, following),
            DistributedState(self.world_size, carry, Consumed()),
            self._position(step, None, e.window),
        )

    def fold_due(self) -> int | None:
        """Fold once every rank acked :data:`FOLD_EVERY` steps past the last fold, up to the
        last window edge of those steps where there is one (nothing to sort there); returns
        the step folded up to, or None when no fold was due."""
        at = self.ledger.due(self._folded, FOLD_EVERY)
        if at is not None:
            self.fold(at)
        return at

    def fold(self, step: int) -> None:
        """Keep the acks of steps ``<= step`` in the epochs' base progress and forget them."""
        for e in self._epochs.values():
            end = e.end_step
            last = step if end is None else min(step, end - 1)
            if last < e.based:
                continue
            if e.merged is not None and e.merged[:2] == (e.based, last):
                # What the snapshot at ``last`` merged (sets are replaced, never changed).
                e.main, e.carried = e.merged[2].shallow(), e.merged[3].shallow()
            else:
                with cycle_collection_paused():
                    runs = self.ledger.runs_by_rank(e.based, last)
                    add_runs(runs, e.carried, e.main, e.counts)
            e.merged = None
            e.delivered += (last + 1 - e.based) * self.config.batch_size * self.world_size
            e.delivered -= self._missing(e.based, last)
            e.based = last + 1
        self.ledger.fold(step)
        self._folded = max(self._folded, step)
        for s in [s for s in self._short if s <= step]:
            del self._short[s]

    # -- restore ---------------------------------------------------------------------------

    def load(self, state: StreamState, listing: L | None = None) -> None:
        """Restore from ``state``; its world size may differ from this book's.

        Args:
            state: The state.
            listing: A listing of the source made this epoch (None: list now).

        Raises:
            StateError: If the seed differs or the state's shards are gone or changed.
        """
        if state.seed != self.config.seed:
            raise StateError(
                f"the state was saved with shuffle_seed={state.seed}, this stream "
                f"has shuffle_seed={self.config.seed}; create the stream with the "
                "same seed to resume it"
            )
        handed = listing is not None
        if listing is None:
            listing = self._list()
        match_listing(state.dataset, listing.records(), listing.classes)
        if state.started:
            # The rest of an epoch reads the shards it started with; new ones join next epoch.
            listing = listing.subset([s.url for s in state.shards])
        before = (self._epochs, self._start, self._start_listing, self._start_epoch)
        before_rest = (self._start_step, self._in_order, self.ledger, self._cursors, self._folded)
        before_quarantined = (self._quarantined, self._short)
        self._epochs = {}
        self._cursors = {}
        self._quarantined = [(-1, q) for q in state.progress.quarantined]
        self._short = {}
        self._ended = {}
        self._start = state
        self._start_listing = listing
        self._handed = handed
        self._start_epoch = state.progress.epoch
        self._start_step = state.progress.step
        self._in_order = self._same_order(state, listing)
        self.ledger = Ledger(self.world_size, state.progress.step)
        self._folded = state.progress.step - 1
        if self._in_order and state.progress.step > state.progress.first_step:
            try:  # the saved positions resume the plan: they must fit it
                self._check_positions(self.plan(self._start_epoch))
            except StateError:
                self._epochs, self._start, self._start_listing, self._start_epoch = before
                self._start_step, self._in_order, self.ledger, self._cursors, self._folded = (
                    before_rest
                )
                self._quarantined, self._short = before_quarantined
                raise

    def _check_positions(self, e: _PlannedEpoch[L]) -> None:
        """Refuse saved positions that do not fit the epoch's shares (see
        :func:`ingest.core.positions.check_positions`)."""
        if not e.cursors or e.opened <= e.first_step:
            return
        end = e.end_step
        check_positions(
            e.assignment.ranks,
            [c for c in e.cursors if c is not None],
            lanes=self.config.lanes if self.config.seed is not None else 1,
            window=e.window,
            skip=e.skip,
            rows_left=None if end is None else (end - e.opened) * self.config.batch_size,
            urls=[s.url for s in e.listing.shards],
        )


def _learnt(e: _PlannedEpoch[Any]) -> dict[str, int]:
    """Row counts learnt by reading ``e``'s shards, by URL (indices differ across listings)."""
    return {e.listing.shards[i].url: n for i, n in e.main.rows.items()}


__all__ = ["FOLD_EVERY", "MAIN", "BookConfig", "EpochBook", "Remainder"]
