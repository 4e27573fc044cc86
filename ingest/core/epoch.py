"""One epoch's plan, without Ray or I/O: what an epoch reads, cut into the ranks' shares.

A book (:class:`ingest.core.book.EpochBook`) plans each epoch from a listing with its
:class:`EpochPlans`: the listing's shards in the seeded order of the epoch
(:func:`ingest.core.plan.epoch_units`), less the rows consumed (a resumed epoch, a followed
round) and with the rows the epoch before carried in first, cut into equal shares for the
ranks (:func:`ingest.core.assign.split`). A :class:`PlannedEpoch` also keeps the epoch's
progress as folded so far (:meth:`PlannedEpoch.fold`) and the listing part of its states,
made once. :meth:`EpochPlans.round_after` says what the next epoch starts with,
:meth:`EpochPlans.same_order` whether a loaded state resumes in its original order, and
:meth:`EpochPlans.check_positions` whether its saved positions fit the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal

import numpy as np
import numpy.typing as npt

from ingest.core.acks import Acks
from ingest.core.assign import (
    CARRY,
    TO_END,
    Assignment,
    Span,
    Spans,
    cycle_collection_paused,
    remaining,
    row_spans,
    split,
)
from ingest.core.carry import Carried, Copy, carried_out
from ingest.core.errors import SourceError, StateError
from ingest.core.intervals import IntervalSet
from ingest.core.ledger import Run, Runs, as_runs
from ingest.core.listing import L, Listed, ListedShard, consumed_before
from ingest.core.plan import epoch_units
from ingest.core.positions import check_positions
from ingest.core.progress import add_runs, all_of, remap, shard_table
from ingest.core.share import FeedPlan
from ingest.core.state import (
    Consumed,
    Cursor,
    DatasetState,
    ShardRecord,
    StreamState,
    changed_shards,
)
from ingest.core.validate import COUNT, check_numbers, check_remainder

Remainder = Literal["carry", "drop"]


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
class PlannedEpoch(Generic[L]):
    """One epoch as planned: its listing, the ranks' shares, and its progress folded so far."""

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
    owed: tuple[Copy, ...] = ()
    """Copies of rows due again that the epoch carries out at its end (:mod:`ingest.core.carry`)."""
    cut: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """Offsets of the remainder's copies cut before, noted by the packing ranks at its end."""

    def carried_out(self) -> Carried:
        """What the next epoch takes of this one's remainder and owed copies (an epoch with
        no step: every copy, :func:`~ingest.core.carry.carried_out`'s ``whole``)."""
        whole = self.steps == 0
        return carried_out(self.assignment.remainder, self.owed, self.cut, whole=whole)

    def left_over(self, rows: npt.NDArray[np.int64]) -> None:
        """Add ``rows`` (packed rows, by the epoch's listing) to its remainder: a packing rank
        ended the epoch before it handed them out (:mod:`ingest.distributed.rank_pack`); kept
        in the rows' order, not the closing ranks' (that varies by run). A row's two copies
        may both be there: the next epoch carries one and owes the other
        (:mod:`ingest.core.carry`)."""
        if len(rows):
            spans = sorted(
                [*self.assignment.remainder, *row_spans(rows)],
                key=lambda s: (s.segment, s.shard, s.start),
            )
            self.assignment = replace(self.assignment, remainder=tuple(spans))

    def cut_at_end(self, cut: Mapping[tuple[int, int, int], int]) -> Carried:
        """Note the offsets of the remainder's copies cut before (``(segment, shard, row) ->
        offset``, the largest kept); returns what the next epoch takes, its carried rows'
        offsets by this epoch's listing."""
        for key, offset in cut.items():
            self.cut[key] = max(self.cut.get(key, 0), offset)
        return self.carried_out()

    @property
    def end_step(self) -> int | None:
        return None if self.steps is None else self.first_step + self.steps

    def fold(self, last: int, acks: Acks, batch_size: int) -> None:
        """Keep the acks of this epoch's steps ``based..last`` in its base progress."""
        if self.merged is not None and self.merged[:2] == (self.based, last):
            # What the snapshot at ``last`` merged (sets are replaced, never changed).
            self.main, self.carried = self.merged[2].shallow(), self.merged[3].shallow()
        else:
            with cycle_collection_paused():
                runs = acks.ledger.runs_by_rank(self.based, last)
                add_runs(runs, self.carried, self.main, self.counts)
        self.merged = None
        self.delivered += (last + 1 - self.based) * batch_size * acks.world_size
        self.delivered -= acks.missing(self.based, last)
        self.based = last + 1

    def share(
        self,
        rank: int,
        next_step: int,
        cursor: Cursor | None,
        skip: tuple[dict[int, IntervalSet], dict[int, IntervalSet]] | None = None,
    ) -> FeedPlan[L]:
        """What ``rank`` reads of this epoch from ``next_step`` on, its lanes at ``cursor``,
        leaving out the rows of ``skip`` (None: :attr:`skip`)."""
        end = self.end_step
        return FeedPlan(
            self.epoch,
            rank,
            next_step,
            None if end is None else end - next_step,
            self.assignment.ranks[rank],
            self.skip if skip is None else skip,
            cursor,
            self.listing,
            self.window,
        )


@dataclass(frozen=True, slots=True)
class EpochPlans(Generic[L]):
    """How a book's epochs are planned for its ranks: the book's config, its world size and
    the rows per shuffle window of a listing (:meth:`ingest.core.listing.Lister.window_rows`)."""

    config: BookConfig
    world_size: int
    window_rows: Callable[[L], int]

    def plan(
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
    ) -> PlannedEpoch[L]:
        """The plan of ``epoch`` from ``listing`` (see the module docstring); ``based``: the
        step its progress is folded up to; ``cursors``: the ranks' saved positions it resumes
        from, if any."""
        config, world_size = self.config, self.world_size
        counts = np.fromiter(
            (-1 if i.rows is None else i.rows for i in listing.infos), np.int64, len(listing.infos)
        )
        counts.setflags(write=False)
        rows = np.where(counts < 0, TO_END, counts).tolist()
        units = epoch_units(listing.plan_shards(), config.seed, epoch)
        carried_spans = [
            Span(s.shard, a, b, CARRY)
            for s in carry
            for a, b in carried.sets.get(s.shard, IntervalSet()).gaps(s.start, s.stop)
        ]
        # Millions of spans: kept as arrays until the ranks' shares are cut.
        spans = remaining(units, rows, main.sets)
        if carried_spans:
            spans = Spans.concat([Spans.of(carried_spans), spans])
        if bool((spans.stop == TO_END).any()):
            if world_size > 1:
                raise StateError(
                    "some shards have no row count; several ranks need them all (index the "
                    "shards: `ingest index URL`)"
                )
            assignment = Assignment((tuple(spans),), 0, ())
            steps = None
        else:
            assignment = split(spans, world_size, config.batch_size)
            steps = assignment.steps + (based - first_step)
        with cycle_collection_paused():
            dataset = DatasetState(
                list(config.sources),
                shard_table(listing, counts),
                classes=listing.classes,
                tables=listing.tables,
                formats=listing.formats,
            )
            # The listing part of every state of the epoch, made once (a second for a million
            # shards: here rather than in the first snapshot).
            dataset.to_json()
        return PlannedEpoch(
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
            self.window_rows(listing),
        )

    def round_after(
        self, prev: PlannedEpoch[L], listing: L
    ) -> tuple[L, tuple[Span, ...], Consumed, tuple[Copy, ...]]:
        """What the epoch after ``prev`` starts with in ``listing``: the listing it reads,
        the rows ``prev`` carries into it, (following a dataset) the shards earlier rounds
        consumed, and the copies of rows it owes (:mod:`ingest.core.carry`).

        Rows carried from files of a Delta table that its newest version no longer holds (a
        compaction between the epochs) are read from them: ``listing`` joined with them
        (:meth:`~ingest.core.listing.Listed.joined`), their own rows consumed."""
        carry: tuple[Span, ...] = ()
        owed: tuple[Copy, ...] = ()
        main = Consumed()
        if self.config.remainder == "carry":
            out = prev.carried_out()
            by_url = {s.url: n for n, s in enumerate(listing.shards)}
            urls = [s.url for s in prev.listing.shards]
            held = {s.shard for s in out.spans} | {shard for shard, _, _ in out.owed}
            gone = [urls[shard] for shard in sorted(held) if urls[shard] not in by_url]
            if gone and self.config.follows:
                consumed_before(prev.listing.shards, listing.shards)  # says what vanished
            if gone and listing.tables and prev.listing.tables:
                listing = listing.joined(prev.listing, gone)
                by_url = {s.url: n for n, s in enumerate(listing.shards)}
                main = kept_consumed(listing, learnt(prev))
                gone = []
            if gone:
                raise SourceError(
                    gone[0],
                    f"holds rows epoch {prev.epoch} carries into the next (rows that did not "
                    "fill a step), and the next epoch's listing no longer holds it: removed "
                    "or replaced since (a Delta table's compaction or overwrite)",
                    "pass remainder='drop' (the rows that fill no step are dropped, and "
                    "counted), or rewrite the data between runs",
                )
            if not self.config.follows:  # a round: every shard read is checked below
                again = [(n, by_url[urls[n]]) for n in sorted(held) if urls[n] in by_url]
                _check_unchanged(prev, listing, again)
            carry = tuple(s._replace(shard=by_url[urls[s.shard]]) for s in out.spans)
            owed = _moved(out.owed, urls, by_url)
        if self.config.follows:
            # A round: the shards the rounds before read are consumed (they only grow).
            done = consumed_before(prev.listing.shards, listing.shards)
            main = all_of(listing, done, learnt(prev))
        return listing, carry, main, owed

    def has_a_step(self, listing: Listed, main: Consumed, carry: Sequence[Span]) -> bool:
        """Whether a round of a followed dataset has a full step of rows to read: rows of shards
        not consumed yet (unknown counts: as many as it takes, see :meth:`uncounted`) and
        carried rows."""
        fresh = sum(
            TO_END if i.rows is None else i.rows
            for n, i in enumerate(listing.infos)
            if n not in main.sets
        ) + sum(s.stop - s.start for s in carry)
        return fresh >= self.world_size * self.config.batch_size

    def uncounted(self, listing: Listed, main: Consumed, carry: Sequence[Span]) -> list[int]:
        """The shards of a round whose row counts must be known to tell whether it has a full
        step (:meth:`has_a_step`): those not consumed yet with no count (a JSON Lines or CSV
        shard, until read), when the rows known fall short of a step; else none. Without
        their counts a shard of three rows made a round of no step, and the round that hands
        out nothing ends a loop that follows."""
        need = self.world_size * self.config.batch_size
        unknown, known = [], sum(s.stop - s.start for s in carry)
        for n, i in enumerate(listing.infos):
            if n in main.sets:
                continue
            if i.rows is None:
                unknown.append(n)
            else:
                known += i.rows
        return unknown if known < need else []

    def same_order(self, state: StreamState, listing: L) -> bool:
        """Whether ``state`` resumes on ``listing`` in the original order (else the rest is
        shared anew).

        Only a state whose shares are the whole epoch's can: one whose every step since the
        epoch began consumed a batch on each of the same ranks. After an elastic restore the
        shares were cut from the rest of the epoch, which the state does not keep apart.
        """
        pos, p, config, world_size = state.position, state.progress, self.config, self.world_size
        return (
            state.distributed.world_size == world_size
            and pos.batch_size == config.batch_size
            and pos.window == self.window_rows(listing)
            and pos.lanes == config.lanes
            and len(pos.ranks) == world_size
            and all(c is not None for c in pos.ranks)
            and state.consumed_rows() == (p.step - p.first_step) * world_size * pos.batch_size
        )

    def check_positions(self, e: PlannedEpoch[Any]) -> None:
        """Refuse saved positions that do not fit the epoch's shares (see
        :func:`ingest.core.positions.check_positions`)."""
        if not e.cursors or e.opened <= e.first_step:
            return
        config, end = self.config, e.end_step
        check_positions(
            e.assignment.ranks,
            [c for c in e.cursors if c is not None],
            lanes=config.lanes if config.seed is not None else 1,
            window=e.window,
            skip=e.skip,
            rows_left=None if end is None else (end - e.opened) * config.batch_size,
            urls=[s.url for s in e.listing.shards],
        )


def resumed_in(start: StreamState, listing: Listed) -> tuple[tuple[Span, ...], Consumed, Consumed]:
    """What a loaded ``start`` says of ``listing``: the rows carried into its epoch, the rows
    consumed, and the carried rows consumed, by the listing's shard indices."""
    by_url = {s.url: n for n, s in enumerate(listing.shards)}
    carry = tuple(
        Span(by_url[start.shards[i].url], a, b, CARRY) for i, a, b in start.distributed.carry
    )
    main = remap(start.progress.consumed, start, by_url)
    carried = remap(start.distributed.carry_consumed, start, by_url)
    return carry, main, carried


def kept_consumed(listing: Listed, learnt: Mapping[str, int]) -> Consumed:
    """Every row of the shards ``listing`` joined from other versions (:attr:`Listed.kept`):
    the epoch reads only rows carried into it from them."""
    kept = set(listing.kept)
    return all_of(listing, [n for n, s in enumerate(listing.shards) if s.url in kept], learnt)


def needed_shards(start: StreamState) -> list[int]:
    """The indices of ``start``'s shards its rows point into: carried or owed into its
    epoch, or consumed (a followed round's earlier shards), sorted. :func:`resumed_in` and
    :func:`owed_in` find these in a listing."""
    d, p = start.distributed, start.progress
    at = {i for i, _, _ in d.carry} | {i for i, _, _ in d.owed}
    for consumed in (d.carry_consumed, p.consumed):
        at |= set(consumed.sets) | set(consumed.rows)
    return sorted(at)


def owed_in(start: StreamState, listing: Listed) -> tuple[Copy, ...]:
    """The copies of rows a loaded ``start`` owes (:mod:`ingest.core.carry`), by ``listing``'s
    shard indices."""
    by_url = {s.url: n for n, s in enumerate(listing.shards)}
    return _moved(start.distributed.owed, [s.url for s in start.shards], by_url)


def _check_unchanged(
    prev: PlannedEpoch[Any], listing: Listed, held: Sequence[tuple[int, int]]
) -> None:
    """Refuse the epoch after ``prev`` where a shard ``prev`` carries rows of into it
    (``held``: its index in ``prev``'s listing and in ``listing``, each) is listed otherwise than
    ``prev`` read it: its rows are numbered otherwise now (a file rewritten in place; a Delta
    file's deletion vector a DELETE replaced), so the carried rows' positions would read
    other rows. Said before the epoch's first batch."""
    before = [_record(prev.listing.shards[n]) for n, _ in held]
    changed = changed_shards(before, [_record(listing.shards[n]) for _, n in held])
    if changed:
        raise SourceError(
            changed[0].split(" ", 1)[0],
            f"holds rows epoch {prev.epoch} carries into the next (rows that did not fill a "
            f"step), and it changed since epoch {prev.epoch} listed it ({changed[0]}): the "
            "rows at those positions are others now (a file rewritten in place, or a Delta "
            "file's deletion vector replaced by a DELETE, UPDATE or MERGE)",
            "pass remainder='drop' (the rows that fill no step are dropped, and counted), or "
            "change the data between runs",
        )


def _record(shard: ListedShard) -> ShardRecord:
    """What tells ``shard`` changed (:func:`changed_shards` compares no row counts)."""
    return ShardRecord(shard.url, shard.size, shard.rows_version, None)


def _moved(
    owed: Iterable[Copy], urls: Sequence[str], by_url: Mapping[str, int]
) -> tuple[Copy, ...]:
    """Copies owed by the shard indices of ``urls``, by those of ``by_url``, sorted."""
    return tuple(sorted((by_url[urls[i]], row, offset) for i, row, offset in owed))


def settle(
    e: PlannedEpoch[Any], steps: int, leftover: Runs | Sequence[Run], learned: Mapping[int, int]
) -> None:
    """Settle epoch ``e`` whose row counts were unknown, when its one rank read it all.

    Args:
        e: The epoch.
        steps: Batches the rank's feed yielded in this run.
        leftover: Rows read after the last full batch (the epoch's remainder).
        learned: Row counts learnt by reading, per shard index.
    """
    if e.steps is not None:
        return
    e.steps = e.opened - e.first_step + steps
    e.main.rows.update(learned)
    remainder = tuple(
        Span(shard, a, b, segment) for segment, shard, a, b in as_runs(leftover).tolist()
    )
    e.assignment = Assignment(e.assignment.ranks, e.steps, remainder)


def learnt(e: PlannedEpoch[Any]) -> dict[str, int]:
    """Row counts learnt by reading ``e``'s shards, by URL (indices differ across listings)."""
    return {e.listing.shards[i].url: n for i, n in e.main.rows.items()}


__all__ = [
    "BookConfig",
    "EpochPlans",
    "PlannedEpoch",
    "Remainder",
    "kept_consumed",
    "learnt",
    "needed_shards",
    "owed_in",
    "resumed_in",
    "settle",
]
