"""The coordinator's logic, without Ray or I/O: epoch plans, shares, snapshots, restore.

An :class:`EpochBook` asks its lister (:class:`ingest.planner.Planner`) for one listing per
epoch (:mod:`ingest.core.listing`: it reads only row counts and fingerprints), plans the
epoch and cuts it into equal shares for the ranks (:mod:`ingest.core.epoch`), keeps the
ranks' acks (:mod:`ingest.core.acks`) and turns both into a state consistent across ranks at
a step (:mod:`ingest.core.snapshot`). :class:`ingest.Stream` is a book with one rank;
:class:`ingest.RayStream` wraps one in its coordinator actor.

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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Generic

import numpy as np
import numpy.typing as npt

from ingest.core.acks import Acks
from ingest.core.assign import MAIN, Span
from ingest.core.carry import Copy
from ingest.core.epoch import (
    BookConfig,
    EpochPlans,
    PlannedEpoch,
    Remainder,
    kept_consumed,
    needed_shards,
    owed_in,
    resumed_in,
    settle,
)
from ingest.core.errors import ConfigError, StateError
from ingest.core.ledger import Ledger, Run, Runs, StepRecord
from ingest.core.listing import L, Lister
from ingest.core.progress import add_runs
from ingest.core.provenance import BatchPieces, StepLog, step_pieces, step_rows
from ingest.core.quarantine import Quarantined
from ingest.core.share import FeedPlan
from ingest.core.skipping import consume_ahead
from ingest.core.snapshot import state_acked, state_after, state_in
from ingest.core.state import (
    Consumed,
    Cursor,
    SkipAhead,
    StreamState,
    hub_commits,
    match_kinds,
    match_listing,
    match_needed,
    moved_from,
    versions_of,
)

FOLD_EVERY = 64
"""Steps every rank acks between two folds of the acks into the consumed intervals
(:meth:`EpochBook.fold_due`): the ledger holds at most about this many steps per rank.
Without a fold the acks of a job that never takes a state pile up (and, on Ray, pin their
messages in the object store); folding below the lowest acked step never changes a later
state."""


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
        self.world_size = world_size
        self.lister = lister
        self.plans = EpochPlans(config, world_size, lister.window_rows)
        self._epochs: dict[int, PlannedEpoch[L]] = {}
        self._start: StreamState | None = None
        self._start_listing: L | None = None
        self._handed = False
        """The start listing was made by the caller (see :meth:`_make_first`)."""
        self._since: dict[str, int] = {}
        """Following: each Delta table's first version (its first round's), by its root's
        URL: every round lists the table from it (:meth:`_list`)."""
        self._start_epoch = 0
        self._start_step = 0
        self._in_order = False
        """Whether the loaded state resumes in its original order (``plans.same_order``)."""
        self.acks = self._new_acks(0)
        self.log: StepLog | None = None
        """Where every rank's acked steps are kept before a fold forgets them (a stream's
        ``provenance=``: :mod:`ingest.core.provenance`); None: nowhere."""
        self._urls: dict[int, list[str]] = {}
        """Per epoch, its listing's shard URLs, for :attr:`log`."""
        self.logs_batches = False
        """The stream packs (``pack=``): its steps are the batches its ranks' nodes made of
        the read steps, which they log with their acks (:meth:`ack`'s ``pieces``); the read
        steps acked are not logged."""
        self._logged: dict[int, int] = {}
        """Per rank, the last batch whose pieces :attr:`log` was told (a resend's are not)."""
        self._ahead: list[SkipAhead] = []
        """The loaded state's skips of later epochs, consumed as their epochs are planned
        (:func:`ingest.core.skipping.consume_ahead`) and kept in the states before."""

    def _new_acks(self, first_step: int, quarantined: Iterable[Quarantined] = ()) -> Acks:
        config = self.config
        return Acks(
            self.world_size,
            first_step,
            batch_size=config.batch_size,
            max_errors=config.max_errors,
            quarantined=quarantined,
        )

    @property
    def begun(self) -> bool:
        """Whether an epoch was planned or a state loaded: a book that has neither lists its
        source to give a state (:meth:`snapshot` plans its first epoch)."""
        return bool(self._epochs) or self._start is not None

    @property
    def ledger(self) -> Ledger:
        """The ranks' acked steps (:attr:`acks`)."""
        return self.acks.ledger

    # -- planning --------------------------------------------------------------------------

    def adopt(self, listing: L) -> None:
        """Plan the first epoch from ``listing``, made by the caller (e.g. while this book's
        actor started); unless a state was loaded or an epoch was planned already."""
        self.lister.remember(listing)
        if self._start is None and not self._epochs and self._start_listing is None:
            self._start_listing = listing

    def _listing_for(self, state: StreamState, listing: L | None) -> L:
        """The listing ``state``'s epoch reads (``listing``, or a new one), checked against
        the state.

        A Delta table (:mod:`ingest.storage.sources.delta`) is read at the version the
        state was saved at until the state's epoch ends: a compaction (OPTIMIZE) or an
        overwrite since then replaced the files the state's positions point into, though
        they stay on the store until VACUUM. A state taken between epochs reads the newest
        version: of the shards it was saved on, only those it carries rows from are needed,
        and those the newest version no longer holds are joined to it from the state's
        (:meth:`~ingest.core.listing.Listed.joined`). A followed table only grows: it is
        read at its newest, from the version its first round listed (:meth:`_list`).

        A Hugging Face Hub branch a commit was pushed to since the state was saved is read
        alike: the rest of the state's epoch at the state's commit (the Hub keeps its files
        as they were), the next epoch at the new one.
        """
        saved = state.dataset.tables
        commits = hub_commits(s.url for s in state.dataset.shards)
        if self.config.follows:
            since = _first_versions(saved)
            if listing is None or _first_versions(listing.tables) != since:
                listing = self._list(since=since)
            match_listing(state.dataset, listing.records(), listing.classes, listing.formats)
            return listing
        pinned = versions_of(saved)
        if not pinned:
            listing = self._list() if listing is None else listing
            if not _moved(commits, listing):
                match_listing(state.dataset, listing.records(), listing.classes, listing.formats)
                return listing
        if state.started:
            if listing is None or listing.tables != saved or _moved(commits, listing):
                listing = self._list(at=pinned, commits=commits)
            match_listing(state.dataset, listing.records(), listing.classes, listing.formats)
            return listing
        listing = self._list() if listing is None else listing
        needed = needed_shards(state)
        have = {s.url for s in listing.shards}
        missing = [u for u in (state.shards[n].url for n in needed) if u not in have]
        if missing:  # rows carried from files a compaction (or a push) replaced: read there
            older = self._list(at=pinned, commits=commits)
            held = {s.url for s in older.shards}
            listing = listing.joined(older, [u for u in missing if u in held])
        where = [f"the Delta table(s) {sorted(pinned)}"] if pinned else []
        where += [f"the Hub repositories {sorted(commits)}"] if commits else []
        match_kinds(state.dataset, listing.classes, listing.formats)
        match_needed(state.dataset, needed, listing.records(), " and ".join(where))
        return listing

    def _list(
        self,
        wanted: Callable[[L], bool] | None = None,
        *,
        first: bool = False,
        at: Mapping[str, Sequence[int]] | None = None,
        since: Mapping[str, int] | None = None,
        commits: Mapping[str, str] | None = None,
    ) -> L:
        """A listing from the lister (``at``: Delta tables' versions to list them at);
        several ranks need every shard's row count. Following, each Delta table is listed
        from its first round's version (``since``, else the book's: see
        :func:`ingest.storage.sources.delta.snapshot`), so that a compaction between rounds
        is read through; a table not followed yet (the first round) at its newest."""
        if self.config.follows and since is None:
            since = self._since
        return self.lister.listing(
            wanted,
            first=first,
            counted=self.world_size > 1,
            at=at,
            since=since,
            commits=commits,
        )

    def _counted(self, listing: L, main: Consumed, carry: Sequence[Span]) -> L:
        """``listing`` (a followed round's) with the row counts of as many of its new shards
        as it takes to tell whether it holds a step of rows (:meth:`EpochPlans.uncounted`):
        1, then 2, 4, ... at a time, so a round of many new shards reads few of them twice."""
        take = 1
        while unknown := self.plans.uncounted(listing, main, carry):
            listing = self.lister.counted(listing, unknown[:take])
            take *= 2
        return listing

    def _followed(self, listing: L) -> L:
        """``listing``, a followed round's: each Delta table it holds that the book did not
        follow yet is followed from the version listed (the first round's)."""
        if self.config.follows:
            for url, version in _first_versions(listing.tables).items():
                self._since.setdefault(url, version)
        return listing

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
            reached = self.acks.reached_end(rank, epoch)
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
        self.acks.end(rank, epoch)
        if self.log is not None and self.acks.all_ended(epoch):
            self.log.flush()  # an epoch's last steps are logged when its loops end

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
        got = self.acks.cursor(rank)
        if got is None or got[0] != acked:
            raise StateError(
                f"rank {rank} acked every step up to {acked}, but its last position is for "
                f"step {None if got is None else got[0]}: acks of the rank are still on their "
                "way; flush its iterator before another one takes the rank over"
            )
        return epoch, acked + 1, got[1]

    def plan(self, epoch: int) -> PlannedEpoch[L]:
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

    def listed_rows(self, epoch: int, learned: Mapping[int, int]) -> int | None:
        """Rows of ``epoch``'s listing, the counts ``learned`` by reading (shard index ->
        rows) filled in; None while a shard's count is unknown."""
        counts = self.plan(epoch).counts.copy()
        for shard, n in learned.items():
            counts[shard] = n
        return int(counts.sum()) if (counts >= 0).all() else None

    def _make(self, epoch: int) -> PlannedEpoch[L]:
        if epoch == self._start_epoch:
            return self._make_first(epoch)
        prev = self.plan(epoch - 1)
        if prev.steps is None:
            raise StateError(
                f"epoch {epoch} cannot be planned before epoch {epoch - 1} has been read to "
                "its end (its row counts are learnt by reading)"
            )

        last: tuple[L, tuple[L, tuple[Span, ...], Consumed, tuple[Copy, ...]]] | None = None

        def wanted(listing: L) -> bool:  # a followed round: a full step of new rows
            nonlocal last
            if epoch in self._epochs:
                return True
            round_listing, carry, main, owed = self.plans.round_after(prev, listing)
            round_listing = self._counted(round_listing, main, carry)
            last = (listing, (round_listing, carry, main, owed))
            return self.plans.has_a_step(round_listing, main, carry)

        listing = self._list(wanted if self.config.follows else None)
        made = last[1] if last is not None and last[0] is listing else None
        listing, carry, main, owed = made or self.plans.round_after(prev, listing)
        self._followed(listing)
        carried = self._skip_ahead(epoch, listing, carry, main, Consumed())
        drop = self.config.remainder == "drop"
        dropped = prev.dropped + (prev.assignment.remainder_rows + len(prev.owed) if drop else 0)
        first = prev.first_step + prev.steps
        planned = self.plans.plan(
            epoch, first, listing, carry, main, carried, 0, dropped, first, None
        )
        planned.owed = owed
        return planned

    def _make_first(self, epoch: int) -> PlannedEpoch[L]:
        start = self._start
        step = self._start_step
        if start is None:
            listing = self._start_listing
            if listing is None:
                listing = self._list(first=True)
            self._followed(listing)
            return self.plans.plan(
                epoch, step, listing, (), Consumed(), Consumed(), 0, 0, step, None
            )

        last: tuple[L, L] | None = None  # the last listing ``wanted`` saw, with the counts

        def wanted(listing: L) -> bool:  # a followed round loaded at its start
            nonlocal last
            match_listing(start.dataset, listing.records(), listing.classes, listing.formats)
            carry, main, _ = resumed_in(start, listing)
            last = (listing, self._counted(listing, main, carry))
            return self.plans.has_a_step(last[1], main, carry)

        # A followed round loaded at its start (a DataLoader's every epoch, a stream resumed
        # between rounds) waits for new rows like a round planned after another; not when the
        # caller handed the listing (a DataLoader worker plans what its main process did).
        waits = self.config.follows and not start.started and not self._handed
        listing = self._start_listing
        if listing is not None and waits and not wanted(listing):
            listing = None  # list again, and wait
        if listing is None:  # listed again while a round waits: the state must fit it
            listing = self._list(wanted if waits else None, first=True)
            match_listing(start.dataset, listing.records(), listing.classes, listing.formats)
        if last is not None and last[0] is listing:
            listing = last[1]
        carry, main, carried = resumed_in(start, listing)
        if listing.kept and not start.started:  # joined from another version: carried rows
            kept = kept_consumed(listing, {})
            main.add_sets(kept.sets)
            main.rows.update(kept.rows)
        carried = self._skip_ahead(epoch, listing, carry, main, carried)
        p = start.progress
        if self._in_order:
            planned = self.plans.plan(
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
            planned.skip = (dict(carried.sets), dict(main.sets))
        else:
            planned = self.plans.plan(
                epoch, step, listing, carry, main, carried, p.delivered, p.dropped, step, None
            )
        planned.owed = owed_in(start, listing)
        planned.dataset = planned.dataset.with_counts_of(start.dataset)
        return planned

    def _skip_ahead(
        self, epoch: int, listing: L, carry: Sequence[Span], main: Consumed, carried: Consumed
    ) -> Consumed:
        """Consume the loaded state's skips of ``epoch`` in ``main`` (in place) and in a copy
        of ``carried``, returned; their records kept with the quarantines."""
        if not any(a.epoch == epoch for a in self._ahead):
            return carried
        carried = carried.copy()
        records = consume_ahead(
            self._ahead,
            epoch,
            [s.url for s in listing.shards],
            [(s.shard, s.start, s.stop) for s in carry],
            main,
            carried,
        )
        self.acks.note_quarantined(records)
        return carried

    def _with_ahead(self, state: StreamState, *, at_start: bool = False) -> StreamState:
        """``state`` with the skips of the epochs it has not planned: those after its epoch,
        and its epoch's own when it is the state at that epoch's start (``at_start``:
        :func:`state_after`'s, whose consumed rows are none yet)."""
        e = state.progress.epoch
        kept = [a for a in self._ahead if a.epoch > e or (at_start and a.epoch == e)]
        if not kept:
            return state
        return replace(state, progress=replace(state.progress, ahead=kept))

    def rank_plan(self, rank: int, epoch: int) -> FeedPlan[L]:
        """What ``rank`` reads in ``epoch``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside world_size {self.world_size}")
        e = self.plan(epoch)
        cursor = e.cursors[rank] if e.cursors and e.opened > e.first_step else None
        return e.share(rank, e.opened, cursor)

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
        return e.share(rank, next_step, cursor, (dict(carried.sets), dict(main.sets)))

    def close(
        self, epoch: int, steps: int, leftover: Runs | Sequence[Run], learned: Mapping[int, int]
    ) -> None:
        """Settle ``epoch`` when its row counts were unknown and its one rank read it all
        (:func:`ingest.core.epoch.settle`)."""
        settle(self.plan(epoch), steps, leftover, learned)

    def carry_over(self, epoch: int, rows: npt.NDArray[np.int64]) -> None:
        """Add ``rows`` to ``epoch``'s remainder (:meth:`PlannedEpoch.left_over`).

        Raises:
            StateError: If the next epoch is planned already (it would miss them).
        """
        if len(rows) and epoch + 1 in self._epochs:
            raise StateError(
                f"epoch {epoch + 1} was planned before every rank closed epoch {epoch}: the "
                f"{len(rows)} rows a rank carries from it would be lost"
            )
        self.plan(epoch).left_over(rows)

    # -- acks and snapshots ----------------------------------------------------------------

    def ack(
        self,
        rank: int,
        records: Sequence[StepRecord],
        cursor: Cursor | None = None,
        *,
        again: bool = False,
        pieces: Sequence[BatchPieces] = (),
    ) -> None:
        """Record ``rank``'s consumed steps; ``cursor`` is its position after the last.

        ``again``: the message is a resend of one whose answer was lost (the coordinator was
        unreachable for a moment, so it may or may not have run it). Its steps already
        recorded are left out, with their rows and quarantines, instead of refused as a
        replay: a resend counts nothing twice.

        ``pieces``: with ``pack``, the batches the rank's node handed out since its last
        message, for :attr:`log` (see :attr:`logs_batches`).
        """
        recorded = self.acks.ack(rank, records, cursor, again=again)
        if self.log is None:
            return
        if self.logs_batches:
            if pieces:
                self._log_pieces(rank, pieces)
        elif recorded:
            self._log(rank, recorded)

    def _log_pieces(self, rank: int, batches: Sequence[BatchPieces]) -> None:
        """Tell :attr:`log` a packing rank's batches (those a resend brings again left out)."""
        last = self._logged.get(rank, -1)
        by_epoch: dict[int, list[tuple[int, npt.NDArray[np.int64]]]] = {}
        for step, read_step, pieces in batches:
            if step <= last:
                continue
            last = step
            e = self._epoch_holding(read_step, read_step)
            by_epoch.setdefault(e.epoch, []).append((step, step_pieces(pieces)))
            if e.epoch not in self._urls:
                self._urls[e.epoch] = [s.url for s in e.listing.shards]
        self._logged[rank] = last
        assert self.log is not None
        for epoch, steps in by_epoch.items():
            self.log.record(rank, epoch, self._urls[epoch], steps)

    def _log(self, rank: int, records: Sequence[StepRecord]) -> None:
        """Tell :attr:`log` the steps ``rank`` acked, epoch by epoch."""
        by_epoch: dict[int, list[tuple[int, npt.NDArray[np.int64]]]] = {}
        for r in records:
            e = self._epoch_holding(r.step, r.step)
            by_epoch.setdefault(e.epoch, []).append((r.step, step_rows(r.runs)))
            if e.epoch not in self._urls:
                self._urls[e.epoch] = [s.url for s in e.listing.shards]
        assert self.log is not None
        for epoch, steps in by_epoch.items():
            self.log.record(rank, epoch, self._urls[epoch], steps)

    def note_quarantined(self, records: Iterable[Quarantined], step: int = -1) -> None:
        """Keep quarantine records (``step``: the step acked with them; -1: none).

        Raises:
            IngestError: If a rank's quarantines in an epoch pass ``ReadOptions.max_errors``
                (a feed counts its own; a rank's transform failures are counted here).
        """
        self.acks.note_quarantined(records, step)

    def quarantined(self) -> list[Quarantined]:
        """Every quarantine this book knows of, oldest first (``on_error="skip"``)."""
        return self.acks.quarantined()

    def snapshot(self, step: int, rank: int | None = None) -> StreamState:
        """The state after ``step`` (every rank's batches up to and including it).

        Steps do not tell whether an epoch with no step is over: ``rank``, the rank that
        asks, says it. Each rank of a Ray stream asks for the state at the same step, at the
        same point of its loop, but not at the same moment: the epochs with no step whose
        end ``rank`` reached count as over (every rank asking there reached them too), so
        every rank gets the same state whenever the others reach them. None (the driver's
        call): those whose end every rank reached.

        Raises:
            StateError: If a rank has not acked ``step`` yet, or the step was never planned.
        """
        acks = self.acks
        if self.log is not None:  # a state saved is covered by the log
            self.log.flush()

        def over(epoch: int) -> bool:
            return acks.all_ended(epoch) if rank is None else acks.reached_end(rank, epoch)

        if not self.ledger.ready(step):
            raise StateError(
                f"not every rank has acked step {step} yet; flush the rank "
                "iterators (RankIterator.state_dict) before the snapshot"
            )
        e, after = self._epoch_at(step + 1, over)
        if after:
            return self._with_ahead(state_after(self.config, acks, e, step), at_start=True)
        return self._with_ahead(state_in(self.config, acks, e, step))

    def _epoch_at(self, nxt: int, over: Callable[[int], bool]) -> tuple[PlannedEpoch[L], bool]:
        """The epoch a state before step ``nxt`` is in, and whether it is the state after
        that epoch's end (:meth:`snapshot`; ``over``: whether an epoch with no step is over).

        Raises:
            StateError: If no epoch planned holds step ``nxt`` or ends before it.
        """
        if not self._epochs and nxt == self._start_step:
            return self.plan(self._start_epoch), False
        for e in sorted(self._epochs.values(), key=lambda x: x.epoch):
            end = e.end_step
            if e.first_step <= nxt and (end is None or nxt < end):
                return e, False
            if nxt == end:
                # An epoch with no step is over when every rank reached its end (steps do
                # not tell), and so are those with no step right after it.
                if end == e.first_step and not over(e.epoch):
                    return e, False
                while (f := self._epochs.get(e.epoch + 1)) is not None and (
                    f.first_step == f.end_step == nxt and over(f.epoch)
                ):
                    e = f
                return e, True
        raise StateError(f"step {nxt - 1} is outside every planned epoch")

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
        if self.log is not None:
            self.log.flush()
        step = min(self.ledger.acked(r) for r in range(self.world_size))
        top = max(self.ledger.acked(r) for r in range(self.world_size))
        if top == step:
            return self.snapshot(step)
        e = self._epoch_holding(step + 1, top)
        return self._with_ahead(state_acked(self.config, self.acks, e, step, top))

    def _epoch_holding(self, first: int, last: int) -> PlannedEpoch[L]:
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

    def fold_due(self) -> int | None:
        """Fold once every rank acked :data:`FOLD_EVERY` steps past the last fold, up to the
        last window edge of those steps where there is one (nothing to sort there); returns
        the step folded up to, or None when no fold was due."""
        at = self.ledger.due(self.acks.folded, FOLD_EVERY)
        if at is not None:
            self.fold(at)
        return at

    def fold(self, step: int) -> None:
        """Keep the acks of steps ``<= step`` in the epochs' base progress and forget them."""
        for e in self._epochs.values():
            end = e.end_step
            last = step if end is None else min(step, end - 1)
            if last >= e.based:
                e.fold(last, self.acks, self.config.batch_size)
        self.acks.forget(step)
        if self.log is not None:
            self.log.flush(wait=False)  # written behind the loop

    # -- restore ---------------------------------------------------------------------------

    def load(
        self, state: StreamState, listing: L | None = None, *, listed_here: bool = False
    ) -> None:
        """Restore from ``state``; its world size may differ from this book's.

        Args:
            state: The state.
            listing: A listing of the source made this epoch (None: list now).
            listed_here: ``listing`` came from this stream's own lister (the coordinator's
                start listing), not from a caller that planned with it (a
                DataLoader's main process): a followed round loaded at its start may wait
                for new shards and list again, as after a listing of its own.

        Raises:
            StateError: If the seed differs or the state's shards are gone or changed.
        """
        if state.seed != self.config.seed:
            raise StateError(
                f"the state was saved with shuffle_seed={state.seed}, this stream "
                f"has shuffle_seed={self.config.seed}; create the stream with the "
                "same seed to resume it"
            )
        handed = listing is not None and not listed_here
        listing = self._listing_for(state, listing)
        if state.started:
            # The rest of an epoch reads the shards it started with; new ones join next epoch.
            listing = listing.subset([s.url for s in state.shards])
        before = dict(self.__dict__)  # every field, put back if the state does not fit
        self._epochs = {}
        self._start = state
        self._start_listing = listing
        self._handed = handed
        self._since = _first_versions(state.dataset.tables) if self.config.follows else {}
        self._start_epoch = state.progress.epoch
        self._start_step = state.progress.step
        self._ahead = list(state.progress.ahead)
        # a skip of the state's epoch planned at its start changes the epoch's shares, and
        # so do shards joined from another version (their rows consumed at its start)
        self._in_order = (
            self.plans.same_order(state, listing)
            and not listing.kept
            and not any(a.epoch == state.progress.epoch for a in self._ahead)
        )
        self.acks = self._new_acks(state.progress.step, state.progress.quarantined)
        if self._in_order and state.progress.step > state.progress.first_step:
            try:  # the saved positions resume the plan: they must fit it
                self.plans.check_positions(self.plan(self._start_epoch))
            except StateError:
                self.__dict__.update(before)
                raise
        self._urls, self._logged = {}, {}
        if self.log is not None:  # a new attempt: it supersedes the steps from here on
            # (a packing stream's steps are its batches; a state saved before they were
            # kept has none: its log starts again at 0)
            batches = state.progress.batches or 0
            first = batches if self.logs_batches else state.progress.step
            self.log.start(first, self.world_size)


def _moved(commits: Mapping[str, str], listing: L) -> bool:
    """Whether ``listing`` holds a Hub repository of ``commits`` (a state's) at another
    commit (:func:`ingest.core.state.moved_from`)."""
    return moved_from(commits, (s.url for s in listing.shards))


def _first_versions(tables: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Each Delta table's first version among ``tables`` (a listing's or a state's ``(root
    URL, version)`` pairs): a followed table's first round's."""
    return {url: versions[0] for url, versions in versions_of(tables).items()}


__all__ = ["FOLD_EVERY", "MAIN", "BookConfig", "EpochBook", "Remainder"]
