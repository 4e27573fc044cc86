"""The coordinator's logic without Ray: ranks are simulated by walking their spans."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from ingest.core.assign import CARRY, MAIN, Span, split
from ingest.core.book import EpochBook
from ingest.core.errors import StateError
from ingest.core.ledger import Ledger, StepRecord, runs_of_entry
from ingest.core.share import FeedPlan
from ingest.core.state import StreamState
from ingest.engine.feed import Feed, Tail
from ingest.engine.options import Shuffle
from ingest.engine.spec import StreamSpec
from ingest.planner.catalog import Listing
from ingest.testing import Store, write_dataset

SHARDS, ROWS, BATCH = 5, 1000, 64
TOTAL = SHARDS * ROWS


def batches_of(plan: FeedPlan[Listing], batch_size: int) -> list[StepRecord]:
    """The step records a rank would ack: consecutive runs of ``batch_size`` rows."""
    records, runs, filled, step = [], [], 0, plan.next_step
    for span in plan.spans:
        start = span.start
        while start < span.stop:
            take = min(batch_size - filled, span.stop - start)
            runs.append((span.segment, span.shard, start, start + take))
            start += take
            filled += take
            if filled == batch_size:
                records.append(StepRecord(step, tuple(runs)))
                runs, filled, step = [], 0, step + 1
    assert not runs, "a rank's share is whole steps"
    return records


def ids(plan_listing_urls: list[str], runs: list[tuple[int, int, int, int]]) -> list[int]:
    """Global row ids (shard n holds ids n*ROWS ..) of runs."""
    out: list[int] = []
    for _, shard, start, stop in runs:
        n = int(plan_listing_urls[shard].rsplit("-", 1)[1].split(".")[0])
        out += range(n * ROWS + start, n * ROWS + stop)
    return out


@pytest.fixture
def spec(local: Store) -> StreamSpec:
    write_dataset(local.fs, local.url("d"), "parquet", SHARDS, ROWS, row_group_rows=300)
    return StreamSpec(urls=(local.url("d"),), batch_size=BATCH, shuffle=Shuffle(seed=3))


def run_epoch(book: EpochBook[Listing], epoch: int, stop_after: int | None = None) -> list[int]:
    """Every rank consumes its share of ``epoch`` (up to ``stop_after`` steps); returns ids."""
    delivered = []
    for rank in range(book.world_size):
        plan = book.rank_plan(rank, epoch)
        records = batches_of(plan, BATCH)
        assert len(records) == plan.steps
        if stop_after is not None:
            records = [r for r in records if r.step < plan.next_step + stop_after]
        book.ack(rank, records)
        urls = [s.url for s in plan.listing.shards]
        delivered += ids(urls, [run for r in records for run in r.runs])
    return delivered


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_equal_steps_and_every_row_once(spec: StreamSpec, world_size: int) -> None:
    book = spec.book(world_size)
    steps = {book.rank_plan(r, 0).steps for r in range(world_size)}
    assert len(steps) == 1
    delivered = run_epoch(book, 0)
    remainder = book.plan(0).assignment.remainder_rows
    assert remainder < world_size * BATCH
    assert len(delivered) == len(set(delivered)) == TOTAL - remainder
    # The remainder is carried: epoch 1 delivers it first, then its own rows.
    epoch1 = book.rank_plan(0, 1)
    assert epoch1.next_step == steps.pop()
    assert epoch1.spans[0].segment == (CARRY if remainder else MAIN)


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 3), (1, 4), (3, 3)])
def test_snapshot_and_elastic_restore_deliver_exactly_once(
    spec: StreamSpec, before: int, after: int
) -> None:
    book = spec.book(before)
    first = run_epoch(book, 0, stop_after=5)
    state = json.loads(json.dumps(book.snapshot(5 - 1).to_json()))
    assert state["distributed"]["world_size"] == before and state["progress"]["step"] == 5
    resumed = spec.book(after)
    resumed.load(StreamState.from_json(state))
    assert resumed.first_epoch == 0
    rest = run_epoch(resumed, 0)
    remainder = resumed.plan(0).assignment.remainder_rows
    assert Counter(first + rest) == Counter(set(first + rest))
    assert len(first) + len(rest) + remainder == TOTAL
    # Next epoch: the carried rows, then every row again.
    carried = {i for i in range(TOTAL)} - set(first + rest)
    epoch1 = run_epoch(resumed, 1)
    assert carried <= set(epoch1)


def test_snapshot_waits_for_every_rank(spec: StreamSpec) -> None:
    book = spec.book(2)
    plan = book.rank_plan(0, 0)
    book.ack(0, batches_of(plan, BATCH)[:3])
    with pytest.raises(StateError, match="not every rank has acked step 2"):
        book.snapshot(2)


def test_snapshot_at_the_epoch_end_starts_the_next_with_the_carry(spec: StreamSpec) -> None:
    book = spec.book(3)
    run_epoch(book, 0)
    end = book.plan(0).end_step
    assert end is not None
    state = book.snapshot(end - 1)
    assert state.progress.epoch == 1 and state.progress.step == end
    assert (
        sum(b - a for _, a, b in state.distributed.carry) == book.plan(0).assignment.remainder_rows
    )
    restored = spec.book(2)
    restored.load(state)
    carried = [s for s in restored.rank_plan(0, 1).spans if s.segment == CARRY]
    assert sum(s.rows for s in carried) == min(
        state_rows(state), restored.plan(1).assignment.steps * BATCH
    )


def state_rows(state: StreamState) -> int:
    return sum(b - a for _, a, b in state.distributed.carry)


def test_folding_keeps_later_snapshots_exact(spec: StreamSpec) -> None:
    book = spec.book(2)
    run_epoch(book, 0, stop_after=10)
    early = book.snapshot(3)
    book.fold(3)
    late = book.snapshot(9)
    unfolded = spec.book(2)
    run_epoch(unfolded, 0, stop_after=10)
    assert late.to_json() == unfolded.snapshot(9).to_json()
    assert early.progress.consumed.count() == 4 * 2 * BATCH
    # The fold after a snapshot keeps the snapshot's merge; the snapshot stays as it was.
    book.fold(9)
    assert late.to_json() == unfolded.snapshot(9).to_json()
    assert book.snapshot(9).to_json() == late.to_json()
    assert early.progress.consumed.count() == 4 * 2 * BATCH
    with pytest.raises(StateError, match="step 5 was folded already"):
        book.snapshot(5)


def test_remainder_drop_counts_what_it_drops(local: Store) -> None:
    write_dataset(local.fs, local.url("d"), "parquet", SHARDS, ROWS, row_group_rows=300)
    spec = StreamSpec(urls=(local.url("d"),), batch_size=BATCH, remainder="drop")
    book = spec.book(3)
    run_epoch(book, 0)
    remainder = book.plan(0).assignment.remainder_rows
    assert remainder > 0
    end = book.plan(0).end_step
    assert end is not None
    state = book.snapshot(end - 1)
    assert state.progress.dropped == remainder and state.distributed.carry == []


def test_split_is_exact_and_equal() -> None:
    spans = [Span(0, 0, 100), Span(1, 10, 50), Span(2, 0, 7)]
    got = split(spans, 3, 16)
    assert got.steps == 147 // 48
    assert [sum(s.rows for s in r) for r in got.ranks] == [48, 48, 48]
    covered = [(s.shard, i) for r in got.ranks for s in r for i in range(s.start, s.stop)]
    covered += [(s.shard, i) for s in got.remainder for i in range(s.start, s.stop)]
    assert sorted(covered) == sorted((s.shard, i) for s in spans for i in range(s.start, s.stop))


def test_ledger_refuses_out_of_order_steps() -> None:
    ledger = Ledger(2, 10)
    ledger.ack(0, [StepRecord(10, ((1, 0, 0, 5),))])
    with pytest.raises(ValueError, match="acked step 10 twice"):
        ledger.ack(0, [StepRecord(10, ())])
    ledger.ack(0, [StepRecord(12, ())])  # overtook step 11: kept, not yet contiguous
    assert ledger.acked(0) == 10
    ledger.ack(0, [StepRecord(11, ())])
    assert ledger.acked(0) == 12
    assert not ledger.ready(10)
    ledger.ack(1, [StepRecord(10, ())])
    assert ledger.ready(10) and ledger.runs(10, 10).tolist() == [[1, 0, 0, 5]]


def test_runs_of_a_shuffled_batch() -> None:
    import numpy as np

    from ingest.core.ledger import runs_of

    seg = np.array([1, 1, 0, 1, 1, 1], dtype=np.int8)
    shard = np.array([2, 2, 2, 0, 2, 2], dtype=np.int32)
    row = np.array([5, 3, 9, 7, 4, 8], dtype=np.int64)
    assert runs_of(seg, shard, row).tolist() == [
        [0, 2, 9, 10],
        [1, 0, 7, 8],
        [1, 2, 3, 6],
        [1, 2, 8, 9],
    ]


def test_acked_runs_are_merged_exactly() -> None:
    import random

    from ingest.core.intervals import IntervalSet
    from ingest.core.progress import add_runs
    from ingest.core.state import Consumed

    rng = random.Random(0)
    runs = []
    for _ in range(500):
        segment, shard, start = rng.randint(0, 1), rng.randint(0, 3), rng.randint(0, 300)
        runs.append((segment, shard, start, start + rng.randint(1, 20)))
    carried, main = Consumed(), Consumed()
    add_runs([runs[:200], runs[200:]], carried, main)  # in two parts, as two ranks
    expected: dict[tuple[int, int], IntervalSet] = {}
    for segment, shard, start, stop in runs:
        expected.setdefault((segment, shard), IntervalSet()).add(start, stop)
    for (segment, shard), rows in expected.items():
        assert (carried if segment == CARRY else main).of(shard) == rows


def feed_epoch(
    book: EpochBook[Listing], spec: StreamSpec, epoch: int, steps: int | None = None
) -> list[int]:
    """Every rank reads its share through a real :class:`ingest.engine.feed.Feed` (shuffled
    windows, cursors), acking up to ``steps`` batches in messages of 16 (as ranks do: the
    ledger packs such messages into rows); returns the ids delivered."""
    delivered: list[int] = []
    for rank in range(book.world_size):
        plan = book.rank_plan(rank, epoch)
        feed = Feed(plan, spec.feed_config(), spec.source())
        urls = [s.url for s in plan.listing.shards]
        pending: list[StepRecord] = []
        cursor = None
        try:
            for item in feed:
                if isinstance(item, Tail) or (
                    steps is not None and item.step >= plan.next_step + steps
                ):
                    break
                pending.append(StepRecord(item.step, item.runs))
                cursor = item.cursor
                if len(pending) == 16:
                    book.ack(rank, pending, cursor)
                    pending = []
                delivered += ids(urls, runs_of_entry(item.runs).tolist())
        finally:
            feed.close()
        if pending:
            book.ack(rank, pending, cursor)
    return delivered


def test_a_state_saved_after_an_elastic_restore_resumes_exactly_once(local: Store) -> None:
    """After an elastic restore the ranks' shares are cut from the rest of the epoch, not
    from all of it: a state saved then, restored with the same world size, shares the rest
    out anew (it planned the whole epoch from its cursors, and read too few rows)."""
    write_dataset(local.fs, local.url("d"), "parquet", 7, ROWS, row_group_rows=300)
    spec = StreamSpec(
        urls=(local.url("d"),), batch_size=BATCH, shuffle=Shuffle(seed=3, window=256, lanes=4)
    )
    book = spec.book(4)
    delivered = feed_epoch(book, spec, 0, steps=5)
    elastic = spec.book(2)
    elastic.load(StreamState.from_json(book.snapshot(4).to_json()))
    delivered += feed_epoch(elastic, spec, 0, steps=3)
    state = StreamState.from_json(json.loads(json.dumps(elastic.snapshot(7).to_json())))
    assert all(c is not None for c in state.position.ranks)
    resumed = spec.book(2)
    resumed.load(state)
    delivered += feed_epoch(resumed, spec, 0)
    remainder = resumed.plan(0).assignment.remainder_rows
    assert len(delivered) == len(set(delivered)) == 7 * ROWS - remainder


@pytest.fixture
def shuffled(local: Store) -> StreamSpec:
    write_dataset(local.fs, local.url("d"), "parquet", 7, ROWS, row_group_rows=300)
    return StreamSpec(
        urls=(local.url("d"),), batch_size=BATCH, shuffle=Shuffle(seed=3, window=256, lanes=4)
    )


def test_saved_positions_resume_the_same_order_exactly_once(shuffled: StreamSpec) -> None:
    book = shuffled.book(3)
    delivered = feed_epoch(book, shuffled, 0, steps=6)
    state = StreamState.from_json(json.loads(json.dumps(book.snapshot(5).to_json())))
    resumed = shuffled.book(3)
    resumed.load(state)  # the positions fit the plan
    rest = feed_epoch(resumed, shuffled, 0)
    uninterrupted = shuffled.book(3)
    everything = feed_epoch(uninterrupted, shuffled, 0)
    assert delivered + rest != everything  # ranks interleave differently, but:
    assert sorted(delivered + rest) == sorted(everything)
    assert len(set(delivered + rest)) == len(delivered + rest)


def test_an_edited_position_of_one_rank_is_refused(shuffled: StreamSpec) -> None:
    book = shuffled.book(3)
    feed_epoch(book, shuffled, 0, steps=6)
    data = json.loads(json.dumps(book.snapshot(5).to_json()))
    data["position"]["ranks"][2]["window"] += 1
    resumed = shuffled.book(3)
    with pytest.raises(StateError, match=r"position\.ranks\[2\]\.window is \d+, but its lanes"):
        resumed.load(StreamState.from_json(data))


def test_a_rank_s_upcoming_epoch_is_the_first_it_has_not_finished(spec: StreamSpec) -> None:
    book = spec.book(2)
    assert [book.upcoming_epoch(r) for r in range(2)] == [0, 0]
    plan = book.rank_plan(0, 0)
    records = batches_of(plan, BATCH)
    book.ack(0, records[:3])
    assert book.upcoming_epoch(0) == 0, "a loop left early goes on in its epoch"
    book.ack(0, records[3:])
    assert [book.upcoming_epoch(r) for r in range(2)] == [1, 0]


@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 1), (2, 4)])
def test_a_snapshot_of_unequal_acks_counts_every_acked_batch(
    spec: StreamSpec, before: int, after: int
) -> None:
    # DataLoader workers (ranks) hand out batches one after another: some are a step ahead.
    book = spec.book(before)
    acked: list[int] = []
    for rank in range(before):
        plan = book.rank_plan(rank, 0)
        take = 4 if rank == 0 else 3
        records = batches_of(plan, BATCH)[:take]
        book.ack(rank, records)
        acked += ids([s.url for s in plan.listing.shards], [x for r in records for x in r.runs])
    state = book.snapshot_acked()
    assert state.progress.step == plan.next_step + 3 and state.progress.delivered == len(acked)
    assert state.position.ranks == [None] * before, "the rest is shared anew"
    resumed = spec.book(after)
    resumed.load(StreamState.from_json(json.loads(json.dumps(state.to_json()))))
    rest = run_epoch(resumed, 0)
    remainder = resumed.plan(0).assignment.remainder_rows
    assert not set(acked) & set(rest) and len(rest) == len(set(rest))
    assert len(acked) + len(rest) + remainder == TOTAL
    # Equal acks: the same state as a snapshot at that step.
    even = spec.book(2)
    for rank in range(2):
        even.ack(rank, batches_of(even.rank_plan(rank, 0), BATCH)[:2])
    assert even.snapshot_acked().to_json() == even.snapshot(1).to_json()


def test_a_resent_ack_counts_nothing_twice(spec: StreamSpec) -> None:
    # A coordinator unreachable for a moment may or may not have run an ack: the rank sends
    # it again with again=True. Without it the same steps are a replay, and refused.
    book = spec.book(1)
    plan = book.rank_plan(0, 0)
    records = batches_of(plan, BATCH)
    book.ack(0, records[:3])
    with pytest.raises(ValueError, match="acked step 1 twice"):
        book.ack(0, records[1:4])
    book.ack(0, records[1:4], again=True)  # steps 1-2 ran before, 3 did not
    book.ack(0, records[1:4], again=True)  # nothing new
    book.fold(3)
    book.ack(0, records[:4], again=True)  # folded steps are known too
    state = book.snapshot(3)
    assert state.progress.delivered == 4 * BATCH
    resumed = spec.book(1)
    resumed.load(StreamState.from_json(json.loads(json.dumps(state.to_json()))))
    rest = run_epoch(resumed, 0)
    done = ids([s.url for s in plan.listing.shards], [x for r in records[:4] for x in r.runs])
    remainder = resumed.plan(0).assignment.remainder_rows
    assert len(done + rest) == len(set(done + rest))
    assert len(done + rest) + remainder == SHARDS * ROWS


def test_carry_over_adds_to_the_remainder_before_the_next_epoch_only(spec: StreamSpec) -> None:
    """What a packing rank did not hand out joins the epoch's remainder (carried next)."""
    import numpy as np

    from ingest.core.ledger import packed_row

    book = spec.book(2)
    e = book.plan(0)
    before = e.assignment.remainder_rows
    rows = np.array([packed_row(MAIN, 0, 1), packed_row(MAIN, 0, 2), packed_row(CARRY, 0, 5)])
    book.carry_over(0, rows)
    assert e.assignment.remainder_rows == before + 3
    book.plan(1)
    with pytest.raises(StateError, match="planned before every rank closed"):
        book.carry_over(0, rows)


def test_a_row_left_over_with_its_carried_copy_is_carried_once_and_owed_once(
    spec: StreamSpec,
) -> None:
    """Both copies of a row left over by a packing epoch (the one carried in and its own):
    the next epoch carries it once and owes the other copy, each with its own offset; the
    state keeps the owed copy (version 6, through JSON and another world size), and the
    epoch after carries it out at its end. No copy is dropped."""
    import numpy as np

    from ingest.core.ledger import packed_row

    book = spec.book(2)
    run_epoch(book, 0)
    book.carry_over(0, np.array([packed_row(MAIN, 0, 7)]))
    url = book.plan(0).listing.shards[0].url
    run_epoch(book, 1)
    shard = next(n for n, s in enumerate(book.plan(1).listing.shards) if s.url == url)
    assert any(s.shard == shard and s.start <= 7 < s.stop for s in book.plan(1).carry)
    before = book.plan(1).assignment.remainder_rows
    book.carry_over(1, np.array([packed_row(CARRY, shard, 7), packed_row(MAIN, shard, 7)]))
    e = book.plan(1)
    assert e.assignment.remainder_rows == before + 2, "both copies"
    spans = [(s.segment, s.shard, s.start) for s in e.assignment.remainder]
    assert spans == sorted(spans), "in the rows' order, whichever rank closes first"
    out = book.plan(1).cut_at_end({(CARRY, shard, 7): 5, (MAIN, shard, 7): 3})
    assert out.offsets[shard, 7] == 3, "the epoch's own copy is carried, with its offset"
    assert out.owed == ((shard, 7, 5),), "the other owed, with its own"
    end = e.end_step
    assert end is not None
    state = StreamState.from_json(json.loads(json.dumps(book.snapshot(end - 1).to_json())))
    assert state.to_json()["version"] == 7
    assert state.progress.epoch == 2 and state.progress.dropped == e.dropped == 0
    assert state.distributed.owed == [(shard, 7, 5)], "the carried-in copy, with its offset"
    carried = [(i, r) for i, a, b in state.distributed.carry for r in range(a, b)]
    assert len(carried) == len(set(carried)) and (shard, 7) in carried
    assert len(carried) + 1 == e.assignment.remainder_rows, "every copy, once"

    resumed = spec.book(3)
    resumed.load(state)
    e2 = resumed.plan(2)
    (owed,) = e2.owed
    assert resumed.plan(2).listing.shards[owed[0]].url == url and owed[1:] == (7, 5)
    run_epoch(resumed, 2, stop_after=1)
    mid = json.loads(json.dumps(resumed.snapshot(e2.first_step).to_json()))
    assert mid["distributed"]["owed"] == [list(owed)], "a state mid-epoch keeps it"
    again = spec.book(2)
    again.load(StreamState.from_json(mid))
    run_epoch(again, 2)
    e2 = again.plan(2)
    after = e2.carried_out()
    copies = [(s.shard, r) for s in after.spans for r in range(s.start, s.stop)]
    copies += [(i, r) for i, r, _ in after.owed]
    left = [(s.shard, r) for s in e2.assignment.remainder for r in range(s.start, s.stop)]
    assert Counter(copies) == Counter([*left, owed[:2]]), "the owed copy is carried out"
    assert (owed[0], 7, 5) in after.owed or after.offsets.get(owed[:2]) == 5, "with its offset"


def test_a_rank_s_snapshot_counts_the_epochs_with_no_step_it_reached_the_end_of(
    spec: StreamSpec,
) -> None:
    """Issue 31, finding 12, without Ray: steps do not tell whether an epoch with no step is
    over. The state a rank asks for after one counts it over once that rank reached its end,
    whatever the other ranks did, so every rank asking at that point gets the same state; the
    driver's (no rank) once every rank did."""
    book = dataclasses.replace(spec, batch_size=2000).book(3)
    assert book.plan(0).steps == 0, "3 ranks of 2,000 rows over 5,000: no step"
    ending = Tail(0, Feed._runs([]), {})
    book.finish(0, 0, ending.steps, ending.leftover, ending.learned)
    assert book.snapshot(-1, rank=0).progress.epoch == 1, "rank 0 reached the end"
    assert book.snapshot(-1, rank=1).progress.epoch == 0, "rank 1 did not yet"
    assert book.snapshot(-1).progress.epoch == 0, "the driver's: not every rank did"
    for rank in (1, 2):
        book.finish(rank, 0, ending.steps, ending.leftover, ending.learned)
    got = [book.snapshot(-1, rank=r).to_json() for r in range(3)]
    assert got[0] == got[1] == got[2] == book.snapshot(-1).to_json()
    assert got[0]["progress"]["epoch"] == 1
