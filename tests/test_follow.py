"""Follow mode (ingest.storage.follow): a dataset written while the stream reads it, in
rounds of new shards with equal steps per rank, every row once, across restores and world sizes."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any

import pytest
import ray

import ingest
from ingest.core.book import EpochBook
from ingest.core.errors import SourceError
from ingest.core.state import StreamState
from ingest.engine.options import Shuffle
from ingest.engine.spec import StreamSpec
from ingest.planner.catalog import Catalog, Listing
from ingest.testing import Store, encode, make_table
from tests.test_epochs import batches_of, ids

ROWS, BATCH = 1000, 64
FOLLOW = ingest.Follow(poll_s=0.02, idle_timeout_s=0.3)


def write(store: Store, n: int, rows: int = ROWS, where: str = "d") -> None:
    # Row ids of shard n are n*ROWS.. (tests.test_epochs.ids reads n from the name).
    store.write(f"{where}/part-{n:05d}.parquet", encode(make_table(n * ROWS, rows), "parquet"))


def spec(store: Store, follow: ingest.Follow = FOLLOW) -> StreamSpec:
    return StreamSpec(
        urls=(store.url("d") + "/",), batch_size=BATCH, follow=follow, shuffle=Shuffle(seed=3)
    )


def run_round(book: EpochBook[Listing], epoch: int) -> tuple[list[int], list[int]]:
    """Every rank consumes its share of the round; its ids, and the steps per rank."""
    delivered, steps = [], []
    for rank in range(book.world_size):
        plan = book.rank_plan(rank, epoch)
        records = batches_of(plan, BATCH)
        book.ack(rank, records)
        steps.append(len(records))
        delivered += ids([s.url for s in plan.listing.shards], [x for r in records for x in r.runs])
    return delivered, steps


def test_each_round_reads_the_new_shards_with_equal_steps(local: Store) -> None:
    write(local, 0)
    write(local, 1)
    book = spec(local).book(3)
    first, steps = run_round(book, 0)
    assert len(set(steps)) == 1 and len(first) == len(set(first))
    assert set(first) <= set(range(2 * ROWS))
    write(local, 2)
    write(local, 3, rows=500)
    second, steps = run_round(book, 1)
    assert len(set(steps)) == 1, "equal steps per rank in every round"
    assert not set(first) & set(second), "a round reads no row of the rounds before"
    left = book.plan(1).assignment.remainder_rows
    assert len(first) + len(second) + left == 3 * ROWS + 500
    assert set(second) <= set(range(3 * ROWS + 500)) and len(second) == len(set(second))


def test_a_round_waits_for_a_full_step_then_holds_what_there_is(local: Store) -> None:
    write(local, 0)
    planner = spec(local).planner()
    book = spec(local).book(2, planner)
    run_round(book, 0)
    listed = []
    scan = planner.scan

    def counting(**kwargs: Any) -> Any:
        listed.append(time.monotonic())
        return scan(**kwargs)

    planner.scan = counting  # type: ignore[method-assign]
    start = time.monotonic()
    plan = book.plan(1)
    waited = time.monotonic() - start
    assert 0.3 <= waited < 5 and len(listed) >= 5, "listed every poll_s until the idle timeout"
    assert plan.steps == 0, "nothing new: the round holds no step (the loop over it ends)"


def test_a_restore_at_a_round_s_end_reads_only_newer_shards(local: Store) -> None:
    write(local, 0)
    write(local, 1)
    book = spec(local).book(2)
    first, _ = run_round(book, 0)
    state = book.snapshot(book.plan(0).end_step - 1)  # type: ignore[operator]
    write(local, 2)
    resumed = spec(local).book(3)  # another world size
    resumed.load(StreamState.from_json(json.loads(json.dumps(state.to_json()))))
    second, steps = run_round(resumed, 1)
    assert len(set(steps)) == 1 and not set(first) & set(second)
    left = resumed.plan(1).assignment.remainder_rows
    assert len(first) + len(second) + left == 3 * ROWS


def test_a_restore_mid_round_reads_each_row_once(local: Store) -> None:
    write(local, 0)
    book = spec(local).book(2)
    first, _ = run_round(book, 0)
    write(local, 1)
    write(local, 2)
    partial = []
    for rank in range(2):
        plan = book.rank_plan(rank, 1)
        records = batches_of(plan, BATCH)[:4]
        book.ack(rank, records)
        partial += ids([s.url for s in plan.listing.shards], [x for r in records for x in r.runs])
    state = book.snapshot(book.plan(1).first_step + 3)
    write(local, 3)  # appears after the state: the next round reads it
    resumed = spec(local).book(1)
    resumed.load(StreamState.from_json(json.loads(json.dumps(state.to_json()))))
    rest, _ = run_round(resumed, 1)
    third, _ = run_round(resumed, 2)
    got = first + partial + rest + third
    assert len(got) == len(set(got))
    assert len(got) + resumed.plan(2).assignment.remainder_rows == 4 * ROWS


def test_a_shard_a_round_read_that_changed_or_vanished_is_refused(local: Store) -> None:
    write(local, 0)
    write(local, 1)
    book = spec(local).book(1)
    run_round(book, 0)
    write(local, 1, rows=900)  # rewritten in place
    write(local, 2)
    with pytest.raises(SourceError, match=r"part-00001\.parquet.*changed since a round read it"):
        book.plan(1)
    local.fs.rm(local.url("d/part-00001.parquet"))
    with pytest.raises(SourceError, match=r"part-00001\.parquet.*vanished"):
        book.plan(1)


def test_a_manifest_names_the_only_shards_a_round_reads(local: Store) -> None:
    manifest = local.url("d/_MANIFEST")
    follow = ingest.Follow(poll_s=0.02, idle_timeout_s=0.2, manifest=manifest)
    write(local, 0)
    write(local, 1)  # written, not yet in the manifest (half written, say)
    local.write("d/_MANIFEST", b"part-00000.parquet\n")
    book = spec(local, follow).book(1)
    first, _ = run_round(book, 0)
    assert set(first) <= set(range(ROWS))
    local.write("d/_MANIFEST", b"part-00000.parquet\npart-00001.parquet\n")
    second, _ = run_round(book, 1)
    assert set(second) <= set(range(2 * ROWS)) and not set(first) & set(second)
    assert len(first) + len(second) + book.plan(1).assignment.remainder_rows == 2 * ROWS


MANIFEST_LINES = [
    "part-00000.parquet",  # relative to the manifest's directory
    "./part-00001.parquet",
    "sub/../part-00002.parquet",
    "{root}/part-00003.parquet",  # absolute: a path on the manifest's store
    "file://{root}/part-00004.parquet",  # a URL
]


@pytest.mark.parametrize("as_url", [False, True])
def test_a_manifest_names_shards_by_url_absolute_or_relative_path(
    local: Store, as_url: bool
) -> None:
    """Issue 17: a manifest given as a plain path read 0 rows every round, with no error;
    lines like ``./p0.parquet`` were skipped silently."""
    root = local.url("d").removeprefix("file://")
    for n in range(6):
        write(local, n)  # part-00005 is not in the manifest
    local.write("d/_MANIFEST", "\n".join(MANIFEST_LINES).format(root=root).encode() + b"\n")
    manifest = local.url("d/_MANIFEST") if as_url else f"{root}/_MANIFEST"
    follow = ingest.Follow(poll_s=0.02, idle_timeout_s=0.2, manifest=manifest)
    book = spec(local, follow).book(1)
    first, _ = run_round(book, 0)
    assert len(book.plan(0).listing.shards) == 5
    assert len(first) + book.plan(0).assignment.remainder_rows == 5 * ROWS
    assert set(first) <= set(range(5 * ROWS)) and len(first) == len(set(first))


def test_a_manifest_on_s3_names_shards_the_same_ways(s3_store: Store) -> None:
    bucket_path = s3_store.url("d").removeprefix("s3:/")  # /bucket/prefix/d
    for n in range(4):
        write(s3_store, n)
    lines = ["./part-00000.parquet", f"{bucket_path}/part-00001.parquet", "x/../part-00002.parquet"]
    s3_store.write("d/_MANIFEST", "\n".join(lines).encode())
    follow = ingest.Follow(poll_s=0.02, idle_timeout_s=0.2, manifest=s3_store.url("d/_MANIFEST"))
    spec_ = StreamSpec(
        urls=(s3_store.url("d") + "/",),
        batch_size=BATCH,
        follow=follow,
        storage_options=s3_store.storage_options,
    )
    book = spec_.book(1)
    assert [s.url.rsplit("/", 1)[1] for s in book.plan(0).listing.shards] == [
        f"part-0000{n}.parquet" for n in range(3)
    ]


def test_a_manifest_line_that_names_no_listed_shard_is_an_error(local: Store) -> None:
    for n in range(2):
        write(local, n)
    write(local, 2, where="elsewhere")  # exists, but the source does not list it
    manifest = local.url("d/_MANIFEST")
    follow = ingest.Follow(poll_s=0.02, idle_timeout_s=0.2, manifest=manifest)
    for line in ["part-00007.parquet", "../elsewhere/part-00002.parquet"]:
        local.write("d/_MANIFEST", f"# finished shards\npart-00000.parquet\n{line}\n".encode())
        named = rf"_MANIFEST: line 3 \({re.escape(repr(line))}\) names .*{re.escape(line[-18:])}"
        with pytest.raises(SourceError, match=rf"{named}, a shard the source .* does not list"):
            spec(local, follow).book(1).plan(0)
    local.write("d/_MANIFEST", b"part-00000.parquet\npart-00001.parquet\n")  # fixed
    first, _ = run_round(spec(local, follow).book(1), 0)
    assert len(first) > ROWS


def test_a_stream_follows_shards_written_while_it_reads(s3_store: Store) -> None:
    write(s3_store, 0)
    follow = ingest.Follow(poll_s=0.05, idle_timeout_s=3.0)
    stream = ingest.Stream(
        s3_store.url("d") + "/",
        batch_size=BATCH,
        shuffle_seed=1,
        follow=follow,
        storage_options=s3_store.storage_options,
    )

    def write_more() -> None:
        for n in range(1, 6):
            write(s3_store, n)

    writer = threading.Thread(target=write_more)
    got: list[int] = []
    rounds = 0
    writer.start()
    while True:
        before = len(got)
        got += [int(i) for b in stream for i in b["id"].tolist()]
        rounds += 1
        if len(got) == before:  # a round with nothing new: the writer is done
            break
    writer.join()
    assert rounds >= 2 and len(got) == len(set(got))
    assert 6 * ROWS - len(got) < BATCH, "every row once, but the last round's remainder"


def test_a_dataloader_follows_shards_written_while_it_reads(local: Store) -> None:
    # The DataLoader's workers are the ranks of one followed stream: each epoch of the
    # loader is a round, every worker takes the round's equal steps, every row once.
    write(local, 0)
    stream = ingest.Stream(
        local.url("d") + "/",
        batch_size=BATCH,
        shuffle_seed=1,
        follow=ingest.Follow(poll_s=0.05, idle_timeout_s=3.0),
    )
    loader = ingest.DataLoader(stream, num_workers=2)
    got: list[int] = []
    rounds = 0
    for n in range(1, 4):
        got += [int(i) for b in loader for i in b["id"].tolist()]
        rounds += 1
        write(local, n)
    got += [int(i) for b in loader for i in b["id"].tolist()]
    assert len(got) == len(set(got))
    assert 4 * ROWS - len(got) < 2 * BATCH, "every row once, but the last round's remainder"
    state = StreamState.from_json(json.loads(json.dumps(stream.state_dict())))
    assert state.progress.epoch == rounds + 1


def test_a_stream_waits_for_the_first_shard_of_an_empty_source(local: Store) -> None:
    # A followed source that lists nothing yet (a trainer started before the data) failed at
    # once with "matches no data files": the first round waits for a shard, as a later
    # round waits for new ones, up to idle_timeout_s.
    stream = ingest.Stream(
        local.url("later") + "/",
        batch_size=BATCH,
        shuffle_seed=1,
        follow=ingest.Follow(poll_s=0.05, idle_timeout_s=10.0),
    )

    def arrive() -> None:
        # Whole, as a writer that follow mode serves makes a shard appear: written apart,
        # then renamed into the source (polled every 50 ms, a file being written is listed
        # empty, which is an error: a write that failed).
        write(local, 0, where="later-tmp")
        os.rename(
            local.url("later-tmp").removeprefix("file://"),
            local.url("later").removeprefix("file://"),
        )

    timer = threading.Timer(0.5, arrive)
    timer.start()
    got = [int(i) for b in stream for i in b["id"].tolist()]
    timer.join()
    assert len(got) == len(set(got)) and ROWS - len(got) < BATCH


def test_a_source_still_empty_at_the_idle_timeout_is_a_clear_error(local: Store) -> None:
    stream = ingest.Stream(
        local.url("never") + "/",
        batch_size=BATCH,
        follow=ingest.Follow(poll_s=0.05, idle_timeout_s=0.3),
    )
    started = time.monotonic()
    with pytest.raises(ingest.NoShardsError, match=r"no data files after waiting 0\.3 s for"):
        next(iter(stream))
    assert 0.3 <= time.monotonic() - started < 10


@ray.remote(num_cpus=0)
def _round(it: Any) -> list[int]:
    return [int(i) for b in it for i in b["id"].tolist()]


@pytest.mark.usefixtures("ray_session")
def test_ranks_follow_shards_written_while_they_read(s3_store: Store) -> None:
    write(s3_store, 0)
    follow = ingest.Follow(poll_s=0.1, idle_timeout_s=4.0)
    with ingest.RayStream(
        s3_store.url("d") + "/",
        world_size=2,
        batch_size=BATCH,
        shuffle_seed=2,
        follow=follow,
        storage_options=s3_store.storage_options,
        timeout_s=60,
    ) as rs:
        its = [rs.rank_iterator(r) for r in range(2)]
        got: list[int] = []
        written = 1
        for _ in range(8):
            if written < 5:
                write(s3_store, written)  # between and during rounds
                written += 1
            per_rank = ray.get([_round.remote(it) for it in its], timeout=120)
            assert len(per_rank[0]) == len(per_rank[1]), "equal steps per rank"
            got += per_rank[0] + per_rank[1]
            if written == 5 and not per_rank[0]:
                break
            its = [rs.rank_iterator(r) for r in range(2)]  # the next round
        state = rs.state_dict()
    assert len(got) == len(set(got)) and 5 * ROWS - len(got) < 2 * BATCH
    assert state["progress"]["epoch"] >= 2


@pytest.mark.usefixtures("ray_session")
def test_ranks_wait_for_the_first_shard_of_an_empty_source(s3_store: Store) -> None:
    follow = ingest.Follow(poll_s=0.05, idle_timeout_s=20.0)
    with ingest.RayStream(
        s3_store.url("ranks-later") + "/",
        batch_size=BATCH,
        shuffle_seed=2,
        world_size=2,
        follow=follow,
        timeout_s=60,
        storage_options=s3_store.storage_options,
    ) as stream:
        refs = [_round.remote(stream.rank_iterator(r)) for r in range(2)]
        time.sleep(1.0)
        # One shard of both shards' rows: written as two, the ranks (polling every 50 ms)
        # once listed the first before the second landed and planned their round on it
        # alone (896 rows, a full suite on a busy machine), as Follow says a round may.
        write(s3_store, 0, rows=2 * ROWS, where="ranks-later")
        got = [i for r in ray.get(refs, timeout=120) for i in r]
    assert len(got) == len(set(got)) and 2 * ROWS - len(got) < 2 * BATCH


def write_jsonl(store: Store, n: int, rows: int) -> None:
    store.write(f"d/part-{n:05d}.jsonl", encode(make_table(n * ROWS, rows), "jsonl"))


@pytest.mark.parametrize("workers", [None, 0, 2])
def test_a_round_of_small_json_lines_shards_waits_for_a_step(
    local: Store, workers: int | None
) -> None:
    # A JSON Lines shard has no row count until it is read: a round counted a new one as
    # "a full step" whatever it held, so a shard of a few rows began a round of no step at
    # once, and the README's loop over a followed dataset (a round that hands out nothing
    # ends it) stopped following while the writer still wrote.
    step = BATCH * (2 if workers == 2 else 1)  # rows of a step of every rank
    write_jsonl(local, 0, step)
    stream = ingest.Stream(
        local.url("d") + "/",
        batch_size=BATCH,
        shuffle_seed=1,
        follow=ingest.Follow(poll_s=0.05, idle_timeout_s=3.0),
    )
    loop: Any = stream if workers is None else ingest.DataLoader(stream, num_workers=workers)
    got = [int(i) for b in loop for i in b["id"].tolist()]
    assert sorted(got) == list(range(step))

    def write_more() -> None:  # a writer of small shards: a step of rows after the third
        for n in range(1, 4):
            time.sleep(0.2)
            write_jsonl(local, n, step // 3 + 1)

    writer = threading.Thread(target=write_more)
    writer.start()
    try:
        second = [int(i) for b in loop for i in b["id"].tolist()]
    finally:
        writer.join()
    assert len(second) == step and len(set(second)) == step
    assert set(second) <= {n * ROWS + r for n in range(1, 4) for r in range(step // 3 + 1)}


@pytest.mark.parametrize(("rows", "counted"), [(BATCH, [1]), (BATCH // 3 + 1, [1, 2])])
def test_a_round_counts_as_few_new_shards_as_tell_it_holds_a_step(
    local: Store, monkeypatch: pytest.MonkeyPatch, rows: int, counted: list[int]
) -> None:
    # Counting a JSON Lines shard reads it whole (and the round reads it again): of 8 new
    # shards, as many are counted as it takes to know that the round holds a step.
    calls: list[int] = []
    count = Catalog.count

    def spy(self: Catalog, listing: Listing, shards: Any, progress: bool = False) -> Listing:
        calls.append(len(shards))
        return count(self, listing, shards, progress)

    monkeypatch.setattr(Catalog, "count", spy)
    write_jsonl(local, 0, BATCH)
    stream = ingest.Stream(local.url("d") + "/", batch_size=BATCH, follow=FOLLOW)
    assert len([b for b in stream]) == 1 and calls == []
    for n in range(1, 9):
        write_jsonl(local, n, rows)
    got = [int(i) for b in stream for i in b["id"].tolist()]
    assert calls == counted
    assert len(got) == len(set(got)) == 8 * rows // BATCH * BATCH
