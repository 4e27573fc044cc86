"""The state of a book at a step, without Ray or I/O: an epoch's progress as folded, plus
the acks of its steps since, the carry, the quarantines and the ranks' positions.

:class:`ingest.core.book.EpochBook` takes its snapshots with these: :func:`state_in` for a
step inside an epoch, :func:`state_after` for its last step (the state is then the next
epoch's, at its start). A snapshot merges the acked runs rank by rank (each rank's rows
sorted on their own, then added to the interval sets in one pass per rank), and takes the
listing part of the state as made once, when the epoch was planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ingest.core.acks import Acks
from ingest.core.assign import cycle_collection_paused
from ingest.core.carry import Copy
from ingest.core.epoch import BookConfig, PlannedEpoch, learnt
from ingest.core.errors import StateError
from ingest.core.progress import add_runs, all_of
from ingest.core.quarantine import Quarantined
from ingest.core.state import (
    Consumed,
    Cursor,
    DatasetState,
    DistributedState,
    PositionState,
    ProgressState,
    StreamState,
)


def _position(
    config: BookConfig, acks: Acks, step: int, restored: list[Cursor | None] | None, window: int
) -> PositionState:
    ranks: list[Cursor | None] = []
    for rank in range(acks.world_size):
        ranks.append(acks.cursor_at(rank, step))
    if restored is not None and all(c is None for c in ranks):
        ranks = list(restored)
    return PositionState(config.seed, config.batch_size, window, config.lanes, ranks)


def state_in(config: BookConfig, acks: Acks, e: PlannedEpoch[Any], step: int) -> StreamState:
    """The state after ``step``, a step of epoch ``e`` (the acks of its steps up to ``step``
    added to its progress; kept in ``e.merged`` for the fold after).

    Raises:
        StateError: If ``step`` was folded already.
    """
    if step + 1 < e.based:
        raise StateError(
            f"step {step} was folded already (acks are kept from step {e.based} on); "
            "take a state at a later step"
        )
    main, carried = e.main.shallow(), e.carried.shallow()
    with cycle_collection_paused():
        add_runs(acks.ledger.runs_by_rank(e.based, step), carried, main, e.counts)
    e.merged = (e.based, step, main, carried)
    done = step + 1 - e.based
    delivered = e.delivered + done * config.batch_size * acks.world_size
    delivered -= acks.missing(e.based, step)
    restored = e.cursors if step + 1 == e.opened else None
    quarantined = _held(acks.quarantined_in(e.epoch, step), e, (main, carried))
    return StreamState(
        e.dataset,
        ProgressState(e.epoch, e.first_step, step + 1, delivered, e.dropped, main, quarantined),
        DistributedState(
            acks.world_size, [(s.shard, s.start, s.stop) for s in e.carry], carried, list(e.owed)
        ),
        _position(config, acks, step, restored, e.window),
    )


def _held(
    records: list[Quarantined], e: PlannedEpoch[Any], consumed: tuple[Consumed, Consumed]
) -> list[Quarantined]:
    """The quarantine ``records`` of which a state of epoch ``e`` holds rows consumed (its
    own or those carried in): a row read ahead of its batch is quarantined before that batch
    is handed out, and a state lists it once its place (a hole) is, so that a resume reads it
    again until then (the docs: a quarantined row is consumed). A record of no shard (a
    transform's) or of a shard to its unknown end is listed as it comes."""
    if not records:
        return records
    index = {s.url: i for i, s in enumerate(e.listing.shards)}
    kept = []
    for q in records:
        i = index.get(q.url) if q.url is not None else None
        if i is None or q.stop is None or any(_holds(c, i, q.start, q.stop) for c in consumed):
            kept.append(q)
    return kept


def _holds(consumed: Consumed, index: int, start: int, stop: int) -> bool:
    """Whether ``consumed`` holds a row of ``[start, stop)`` of shard ``index``."""
    rows = consumed.sets.get(index)
    return rows is not None and rows.gaps(start, stop) != [(start, stop)]


def state_after(config: BookConfig, acks: Acks, e: PlannedEpoch[Any], step: int) -> StreamState:
    """The state after ``step``, the last step of epoch ``e``: the next epoch's, at its start
    (the remainder carried or dropped, counts learnt by reading kept with the listing)."""
    carry: list[tuple[int, int, int]] = []
    owed: list[Copy] = []
    dropped = e.dropped
    if config.remainder == "drop":
        dropped += e.assignment.remainder_rows + len(e.owed)
    else:
        out = e.carried_out()
        carry, owed = [(s.shard, s.start, s.stop) for s in out.spans], list(out.owed)
    dataset = e.dataset
    counted = {i: n for i, n in e.main.rows.items() if e.counts[i] < 0}
    if counted:  # counts learnt by reading: recorded with the listing from now on
        records = e.listing.records()
        for index, rows in counted.items():
            records[index] = records[index]._replace(rows=rows)
        dataset = DatasetState(
            list(config.sources),
            records,
            classes=e.listing.classes,
            tables=e.listing.tables,
            formats=e.listing.formats,
        )
    following = Consumed()
    if config.follows:  # the next round reads none of these shards again
        following = all_of(e.listing, range(len(e.listing.shards)), learnt(e))
    return StreamState(
        dataset,
        ProgressState(e.epoch + 1, step + 1, step + 1, 0, dropped, following),
        DistributedState(acks.world_size, carry, Consumed(), owed),
        _position(config, acks, step, None, e.window),
    )


def state_acked(
    config: BookConfig, acks: Acks, e: PlannedEpoch[Any], step: int, top: int
) -> StreamState:
    """The state after ``step`` in epoch ``e`` with the rows of the steps acked beyond it, up
    to ``top`` by the ranks ahead, also counted as consumed and delivered; no cursors (see
    :meth:`ingest.core.book.EpochBook.snapshot_acked`)."""
    ledger = acks.ledger
    state = state_in(config, acks, e, step)
    main = state.progress.consumed.shallow()
    carried = state.distributed.carry_consumed.shallow()
    with cycle_collection_paused():
        add_runs(ledger.runs_by_rank(step + 1, top), carried, main, e.counts)
    ahead = sum(ledger.acked(r) - step for r in range(acks.world_size))
    delivered = state.progress.delivered + ahead * config.batch_size
    delivered -= acks.missing(step + 1, top)
    return replace(
        state,
        progress=replace(state.progress, consumed=main, delivered=delivered),
        distributed=replace(state.distributed, carry_consumed=carried),
        position=replace(state.position, ranks=[None] * acks.world_size),
    )


def state_with_tokens(
    state: StreamState,
    tokens: Sequence[tuple[int, int, int, int]],
    batches: int | None = None,
) -> StreamState:
    """``state`` (a rank's book at its last step acked) with the rows after it that reached a
    batch in part or whole, ``tokens`` (``(segment, shard, row, offset)``: tokens ``[0,
    offset)`` of the row were handed out; all of them for a row done).

    For a stage that holds rows across steps (packing documents into sequences,
    :mod:`ingest.engine.pack`): its rank acks a step to the book only when every row of it
    was handed out whole, so the book's steps stay whole and a resume reads its steps
    again as the book has them (in the same order, when the settings are the same); the
    rows these tokens name are packed again from their offsets. ``batches``: the stage's
    batches handed out since the run began (``pack.steps``, the steps its provenance log
    numbers); None: kept as ``state`` has them.

    Raises:
        StateError: If a row of ``tokens`` is among the rows consumed.
    """
    kept = state.progress.batches if batches is None else batches
    progress = replace(state.progress, tokens=sorted(tokens), batches=kept)
    out = replace(state, progress=progress)
    out.check_tokens()
    return out


__all__ = ["state_acked", "state_after", "state_in", "state_with_tokens"]
