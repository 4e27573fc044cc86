"""ingest.DataLoader: a Stream read by torch DataLoader worker processes (issue 10, part 1).

Every check is exactly once: per epoch every row once (the rows that cannot fill a step on
every worker are carried into the next epoch), and across a stop, a state and a resume with
another worker count, every row once in all.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from typing import Any

import pytest
import torch

import ingest
from ingest.integrations.shared_slots import SlotRing
from ingest.testing import write_dataset

SHARDS, ROWS, BATCH = 6, 500, 25
TOTAL = SHARDS * ROWS


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> str:
    import fsspec

    root = f"file://{tmp_path_factory.mktemp('loader')}/d"
    write_dataset(fsspec.filesystem("file"), root, "parquet", SHARDS, ROWS, row_group_rows=100)
    return root


STARTS = ["fork", "forkserver"] if "forkserver" in multiprocessing.get_all_start_methods() else []


def stream_of(url: str, **kwargs: Any) -> ingest.Stream:
    return ingest.Stream(url, columns=["id"], batch_size=BATCH, shuffle_seed=3, **kwargs)


def ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"].tolist()]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_plain_dataloader_gets_the_clear_error_with_the_fix(data: str) -> None:
    dataset: Any = stream_of(data)
    loader: Any = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    with pytest.raises(TypeError, match=r"ingest.DataLoader\(stream, num_workers=N\)"):
        next(iter(loader))


def test_a_loader_has_no_length_and_says_why(data: str) -> None:
    """len(loader) (a progress bar, a schedule) is a TypeError, as libraries that ask expect
    of a loader without one, saying why and what to do; it named the private _Shares."""
    loader = ingest.DataLoader(stream_of(data))
    with pytest.raises(TypeError, match=r"an ingest.DataLoader has no length: .*max_steps"):
        len(loader)


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_workers_read_disjoint_shares_every_row_once_per_epoch(data: str, workers: int) -> None:
    loader = ingest.DataLoader(stream_of(data), num_workers=workers)
    first = ids(loader)
    ranks = max(1, workers)
    assert len(first) == len(set(first)) and TOTAL - len(first) < ranks * BATCH
    second = ids(loader)
    both = Counter(first + second)
    # Rows carried from epoch 0 come first in epoch 1; none is lost or given three times.
    assert set(both) == set(range(TOTAL)) and set(both.values()) <= {1, 2}
    assert sum(1 for n in both.values() if n == 1) < ranks * BATCH
    assert all(len(b["id"]) == BATCH for b in loader)


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1), (2, 0)])
def test_a_state_taken_mid_epoch_resumes_with_another_worker_count(
    data: str, before: int, after: int
) -> None:
    loader = ingest.DataLoader(stream_of(data), num_workers=before)
    seen: list[int] = []
    for k, batch in enumerate(loader):
        seen += batch["id"].tolist()
        if k == 22:  # not a multiple of the workers: one worker is a step ahead
            state = loader.state_dict()
            break
    assert state["progress"]["delivered"] == len(seen)
    # A new process: a new stream and loader from the state alone.
    resumed = ingest.DataLoader(stream_of(data), num_workers=after)
    resumed.load_state_dict(state)
    rest = ids(resumed)
    counts = Counter(seen + rest)
    assert max(counts.values()) == 1, "no row twice"
    assert TOTAL - len(counts) < max(before, after, 1) * BATCH


def id_lists(batches: Any) -> list[list[int]]:
    return [[int(i) for i in b["id"].tolist()] for b in batches]


@pytest.mark.parametrize(("workers", "k"), [(2, 8), (3, 21)])
def test_a_state_resumed_at_the_same_worker_count_gives_the_uninterrupted_batches(
    data: str, workers: int, k: int
) -> None:
    """The README's promise (a cursor): a restore with the same seed, world size (here the
    workers) and shuffle settings yields the uninterrupted run's batches, this epoch and the
    next, from a state taken where every worker stands at the same step (k batches, a
    multiple of the workers). The loader's state went through its stream's book of one rank,
    which kept the rows consumed but not each worker's place: the rest was shared out again,
    in other batches, and rows that then filled no step on every worker were carried into
    the next epoch."""
    whole = ingest.DataLoader(stream_of(data), num_workers=workers)
    epochs = [id_lists(whole), id_lists(whole)]
    loader = ingest.DataLoader(stream_of(data), num_workers=workers)
    head: list[list[int]] = []
    for batch in loader:
        head.append([int(i) for i in batch["id"].tolist()])
        if len(head) == k:
            break
    state = loader.state_dict()
    resumed = ingest.DataLoader(stream_of(data), num_workers=workers)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state, "a state loaded is the state saved again"
    assert head + id_lists(resumed) == epochs[0]
    assert id_lists(resumed) == epochs[1]
    # The loop left early goes on the same way.
    assert head + id_lists(loader) == epochs[0]


def test_a_loop_left_early_goes_on_after_its_last_batch(data: str) -> None:
    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    head = []
    for k, batch in enumerate(loader):
        head += batch["id"].tolist()
        if k == 6:
            break
    rest = ids(loader)
    both = head + rest
    assert len(both) == len(set(both)) and TOTAL - len(both) < 2 * BATCH
    state = ingest.DataLoader(stream_of(data)).state_dict()
    assert state["progress"]["epoch"] == 0


@pytest.mark.parametrize("context", STARTS)
def test_batches_kept_stay_as_they_came_through_the_workers_shared_slots(
    data: str, context: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers write their batches' tensors into shared slots, copied out in this process
    (ingest.integrations.shared_slots), whether they forked or started by forkserver (as a
    loader's in a Ray worker do): a batch kept for ever is a copy, not a view of a slot its
    worker writes again, and a loop left early (its batches in slots dropped) leaves the next
    loop's batches whole."""
    read = Counter[str]()
    viewed = SlotRing.viewed

    def counted(ring: SlotRing, placed: Any) -> Any:
        read["batches"] += 1
        return viewed(ring, placed)

    monkeypatch.setattr(SlotRing, "viewed", counted)  # in this process: where slots are read
    stream = ingest.Stream(data, columns=["id", "tokens"], batch_size=BATCH, shuffle_seed=3)
    loader = ingest.DataLoader(
        stream, num_workers=2, prefetch_factor=1, multiprocessing_context=context, timeout=120
    )  # 9 slots a worker
    kept: list[dict[str, Any]] = []
    for k, batch in enumerate(loader):
        kept.append(batch)
        if k == 9:
            break
    kept += list(loader)
    assert len(loader._workers.rings) == 2, "a ring per worker"
    loader.close()
    # Each worker's ring has a slot for every batch torch lets it have in flight: none went
    # by the pipe (the ones the early exit dropped were read from no slot).
    assert read["batches"] >= len(kept), f"{context} workers send through their rings"
    for batch in kept:
        want = (batch["id"][:, None] * 31 + torch.arange(16)) % 50_000
        assert torch.equal(batch["tokens"], want.to(torch.int32))
    seen = ids(kept)
    assert len(seen) == len(set(seen)) and TOTAL - len(seen) < 2 * BATCH


def test_workers_send_their_small_batches_a_few_to_a_torch_item(
    data: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch's main process pays for each item a worker sends: the workers bundle their small
    batches (ingest.integrations.worker_items), and the loop hands out the same batches in
    the same order, epoch after epoch, as when each batch is an item of its own."""
    from ingest.integrations import loader as loader_module
    from ingest.integrations import worker_items

    items: list[int] = []

    def counted(received: Any, *args: Any) -> Any:
        def count() -> Any:
            for item in received:
                bundle = item[worker_items.KEY]
                items.append(len(getattr(bundle, "batches", [item])))
                yield item

        return worker_items.in_turn(count(), *args)

    def epochs() -> list[list[int]]:
        stream = ingest.Stream(data, columns=["id", "text"], batch_size=BATCH, shuffle_seed=3)
        # forked, so that they see the patch below (with the session's Ray up in this
        # process, the workers would start by forkserver and import the module afresh)
        loader = ingest.DataLoader(stream, num_workers=2, multiprocessing_context="fork")
        out = []
        for _ in range(2):
            got = list(loader)
            assert all(isinstance(b["text"][0], str) for b in got)
            out.append(ids(got))
        loader.close()
        return out

    monkeypatch.setattr(loader_module, "in_turn", counted)
    bundled = epochs()
    batches = sum(len(e) for e in bundled) // BATCH
    assert len(items) <= batches / 3 + 8, "most items carry a few batches"
    assert max(items) == worker_items.BUNDLE_BATCHES
    monkeypatch.setattr(worker_items, "BUNDLE_BATCHES", 1)  # the workers fork after this
    items.clear()
    assert epochs() == bundled
    assert set(items) == {1}


def test_a_loop_left_early_keeps_its_workers_for_the_next_loop(data: str) -> None:
    """A ``break`` leaves the workers to the loader (issue 32: they are kept across loops and
    epochs); the next loop goes on with them, right after the last batch handed out. They
    stop when the loader goes (tests/test_loader_workers.py)."""
    import gc

    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    before = set(multiprocessing.active_children())
    gc.disable()
    try:
        head = []
        for n, batch in enumerate(loader):
            head += batch["id"].tolist()
            if n == 1:
                workers = set(multiprocessing.active_children()) - before
                break
        assert len(workers) == 2
        assert all(w.is_alive() for w in workers), "kept for the next loop"
        rest = ids(loader)
        assert set(multiprocessing.active_children()) - before == workers, "the same workers"
        both = head + rest
        assert len(both) == len(set(both)) and TOTAL - len(both) < 2 * BATCH
    finally:
        gc.enable()


def test_a_state_loaded_ends_the_running_loop_its_workers_kept(data: str) -> None:
    """``load_state_dict`` while a loop runs ends that loop, as a new ``iter`` does: it hands
    out no batch the loaded state does not count, and the next loop begins the workers on the
    loaded state (torch drops what they read ahead for the old one)."""

    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    before = set(multiprocessing.active_children())
    it = iter(loader)
    first = ids([next(it), next(it)])
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 2
    loader.load_state_dict(loader.state_dict())
    assert all(w.is_alive() for w in workers), "the workers are kept"
    with pytest.raises(ingest.SupersededError):  # the ended loop hands out nothing more
        next(it)
    rest = ids(loader)
    assert sorted(first + rest) == list(range(TOTAL))
    assert set(multiprocessing.active_children()) - before == workers, "the same workers"


def test_a_loop_ended_by_a_newer_one_or_a_state_loaded_says_so(data: str) -> None:
    """As a Stream's loop (README, Epochs): a loop that a newer ``iter(loader)`` or
    ``load_state_dict`` ended raises ingest.SupersededError if asked for another batch. It
    ended quietly, as if the epoch were over: a training loop went on to its next epoch."""
    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    old = iter(loader)
    head = ids([next(old), next(old)])
    new = iter(loader)
    with pytest.raises(ingest.SupersededError, match=r"newer loop over this ingest.DataLoader"):
        next(old)
    head += ids([next(new)])
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(ingest.SupersededError):
        next(new)
    both = Counter(head + ids(loader))
    assert max(both.values()) == 1 and TOTAL - len(both) < 2 * BATCH


def test_the_stream_of_a_running_loader_stands_where_the_loader_stands(data: str) -> None:
    """The loader's stream is one place to read from (one loop at a time; the DataLoader
    docstring: the stream's state advances with the loader's). During a loader's loop the
    stream stood at the loop's start: its state (0 delivered) resumed into the loader's
    batches again, and a loop over it handed them out again. Now its state is the loader's,
    a loop over it takes over from the loader's last batch (the loader's loop then says so),
    and a state loaded into it ends the loader's loop, whose next one starts there."""
    stream = stream_of(data)
    loader = ingest.DataLoader(stream, num_workers=2)
    loop = iter(loader)
    head = ids([next(loop) for _ in range(4)])
    state = stream.state_dict()
    assert state == loader.state_dict()
    assert state["progress"]["delivered"] == len(head)
    rest = ids(stream)
    with pytest.raises(ingest.SupersededError):
        next(loop)
    both = Counter(head + rest)
    assert max(both.values()) == 1 and TOTAL - len(both) < 2 * BATCH
    resumed = stream_of(data)
    resumed.load_state_dict(state)
    assert Counter(head + ids(resumed)) == both
    loop = iter(loader)  # the next epoch
    next(loop)
    stream.load_state_dict(state)
    with pytest.raises(ingest.SupersededError):
        next(loop)
    assert loader.state_dict() == state
    assert Counter(head + ids(loader)) == both


@pytest.mark.parametrize("workers", ["2", 2.0, True, -1])
def test_a_worker_count_that_is_not_a_count_is_refused_naming_it(data: str, workers: Any) -> None:
    """It was a bare TypeError ('<' not supported between 'str' and 'int') for a string."""
    with pytest.raises(ingest.ConfigError, match=r"num_workers=.* must be an integer >= 0"):
        ingest.DataLoader(stream_of(data), num_workers=workers)


def test_the_state_loads_into_a_stream(data: str) -> None:
    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    it = iter(loader)
    seen = ids(next(it) for _ in range(5))
    state = loader.state_dict()
    stream = stream_of(data)
    stream.load_state_dict(state)
    rest = ids(stream)
    assert not set(seen) & set(rest) and TOTAL - len(seen) - len(rest) < 2 * BATCH


def test_options_that_belong_to_the_stream_are_refused(data: str) -> None:
    with pytest.raises(ingest.ConfigError, match="batch_size"):
        ingest.DataLoader(stream_of(data), batch_size=4)
    # Found by a probe: torch's own "batch_size=None option ... mutually exclusive with
    # drop_last", naming a batch_size the user never passed.
    with pytest.raises(ingest.ConfigError, match=r"no drop_last=.*remainder='drop'"):
        ingest.DataLoader(stream_of(data), num_workers=2, drop_last=True)


def test_options_that_need_workers_are_refused_without_them(data: str) -> None:
    # Found by a probe: timeout= without workers was taken, then the first loop failed
    # with torch's "AssertionError: _SingleProcessDataLoaderIter requires timeout == 0".
    with pytest.raises(ingest.ConfigError, match=r"timeout=30 .* worker processes.*num_workers"):
        ingest.DataLoader(stream_of(data), num_workers=0, timeout=30)


def test_a_worker_init_fn_that_spawned_workers_cannot_get_is_refused(data: str) -> None:
    # Found by a probe: a lambda worker_init_fn under spawn was taken, then the first loop
    # failed with "PicklingError: Can't pickle <function <lambda>>" (a lambda transform
    # was refused when the loader was made).
    with pytest.raises(ingest.ConfigError, match=r"spawn.*worker_init_fn.*cannot be pickled"):
        ingest.DataLoader(
            stream_of(data),
            num_workers=2,
            multiprocessing_context="spawn",
            worker_init_fn=lambda worker: None,
        )


def test_a_loader_left_in_its_first_epoch_at_exit_says_nothing(data: str) -> None:
    # Found by a probe: next(iter(loader)) at a script's top level, then exit, printed
    # "Exception ignored in: <generator object _failing_as_item ...> TypeError: catching
    # classes that do not inherit from BaseException is not allowed" (module teardown).
    import subprocess
    import sys

    code = (
        "import sys, ingest\n"
        "s = ingest.Stream(sys.argv[1], columns=['id'], batch_size=10)\n"
        "loader = ingest.DataLoader(s, num_workers=0)\n"
        "it = iter(loader)\n"
        "print(len(next(it)['id']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, data],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert out.returncode == 0 and out.stdout == "10\n", out.stderr
    assert out.stderr == "", out.stderr


def test_persistent_workers_false_stops_the_workers_at_each_epochs_end(data: str) -> None:
    """Kept by default (persistent_workers=True is accepted, issue 32); False stops them at
    each epoch's end, as torch's own ``DataLoader`` does, and each epoch starts new ones."""

    before = set(multiprocessing.active_children())
    kept = ingest.DataLoader(stream_of(data), num_workers=2, persistent_workers=True)
    assert TOTAL - len(ids(kept)) < 2 * BATCH
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    kept.close()
    assert not any(w.is_alive() for w in workers)
    loader = ingest.DataLoader(stream_of(data), num_workers=2, persistent_workers=False)
    first = ids(loader)
    assert set(multiprocessing.active_children()) == before, "stopped at the epoch's end"
    both = Counter(first + ids(loader))
    assert set(both) == set(range(TOTAL)) and set(both.values()) <= {1, 2}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_read_s3_after_fork_or_spawn(s3_store: Any, context: str) -> None:
    write_dataset(s3_store.fs, s3_store.url("d"), "jsonl", 4, 300)
    stream = ingest.Stream(
        s3_store.url("d"),
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=1,
        storage_options=s3_store.storage_options,
    )
    stream.listing()  # the main process used its S3 filesystem before the workers start
    loader = ingest.DataLoader(stream, num_workers=2, multiprocessing_context=context, timeout=120)
    got = ids(loader)
    assert len(got) == len(set(got)) and 1200 - len(got) < 2 * BATCH


@pytest.mark.parametrize("workers", [0, 2])
def test_a_bad_shard_in_a_worker_reaches_the_loop_as_the_clear_error(
    tmp_path: Any, workers: int
) -> None:
    from ingest.testing import encode, make_table

    for n in range(4):
        data = bytearray(encode(make_table(n * 500, 500), "parquet", row_group_rows=100))
        if n == 3:
            data[200:4000] = b"\x00" * 3800  # corrupt pages, footer intact: found by a worker
        (tmp_path / f"part-{n}.parquet").write_bytes(bytes(data))
    stream = ingest.Stream(f"file://{tmp_path}", columns=["id"], batch_size=BATCH)
    loader = ingest.DataLoader(stream, num_workers=workers)
    with pytest.raises(ingest.ShardError, match=r"part-3\.parquet"):
        ids(loader)


@pytest.mark.parametrize("epoch", [0, 1])
@pytest.mark.parametrize(("workers", "k"), [(2, 0), (3, 0), (3, 1), (2, 2)])
def test_a_state_at_an_epochs_first_batches_resumes_exactly(
    data: str, epoch: int, workers: int, k: int
) -> None:
    """A state taken after batch ``k`` of an epoch, while some workers have not handed out
    a batch of it yet (the ranks acked steps on both sides of the epoch's start)."""
    loader = ingest.DataLoader(stream_of(data), num_workers=workers)
    done = ids(loader) if epoch == 1 else []
    head: list[int] = []
    for n, batch in enumerate(loader):
        head += batch["id"].tolist()
        if n == k:
            state = loader.state_dict()
            break
    assert state["progress"]["epoch"] == epoch
    assert state["progress"]["delivered"] == len(head)
    resumed = ingest.DataLoader(stream_of(data), num_workers=1)
    resumed.load_state_dict(state)
    rest = ids(resumed)
    this = Counter(head + rest)
    assert max(this.values()) == 1, "no row twice in the epoch"
    both = Counter(done + head + rest)
    assert TOTAL - len(both) < workers * BATCH and set(both.values()) <= {1, 2}
    if epoch == 1:
        assert set(both) == set(range(TOTAL)), "epoch 0's carried rows come in epoch 1"


@pytest.mark.parametrize("k", [0, 1])
def test_a_loop_left_at_an_epochs_first_batches_goes_on(data: str, k: int) -> None:
    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    head: list[int] = []
    for n, batch in enumerate(loader):
        head += batch["id"].tolist()
        if n == k:
            break
    rest = ids(loader)
    both = head + rest
    assert len(both) == len(set(both)) and TOTAL - len(both) < 2 * BATCH


def test_a_dataloader_round_with_nothing_new_waits_for_the_next_shard(local: Any) -> None:
    # Issue 17 item 6: every loader epoch plans from the stream's state as a first epoch, and
    # a first epoch never waited for new rows: a round with nothing new returned at once
    # (0 rows), so the README's `if n == 0: break` loop ended and missed the shard written a
    # second later. It waits up to idle_timeout_s, as a Stream's round does.
    import threading

    from ingest.testing import encode, make_table

    def write(n: int) -> None:
        local.write(f"f/part-{n:05d}.parquet", encode(make_table(n * 100, 100), "parquet"))

    write(0)
    stream = ingest.Stream(
        local.url("f") + "/",
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=1,
        follow=ingest.Follow(poll_s=0.05, idle_timeout_s=20.0),
    )
    loader = ingest.DataLoader(stream, num_workers=2)
    first = ids(loader)
    timer = threading.Timer(1.0, write, args=(1,))
    timer.start()
    second = ids(loader)
    timer.join()
    assert second, "the round waited for the shard written after it started"
    got = first + second
    assert len(got) == len(set(got)) and 200 - len(got) < 2 * BATCH


def test_a_state_saved_again_before_any_batch_keeps_the_row_counts_it_knew(
    tmp_path: Any,
) -> None:
    """Row counts of unindexed JSONL shards are known to a state taken with two workers
    (several ranks count them); a Stream that loaded it and was saved again before its
    first batch wrote them as unknown, so the next load at two workers counted every shard
    again (a whole read of the dataset). The counts it knew are kept."""
    import fsspec

    root = f"file://{tmp_path}/j"
    write_dataset(fsspec.filesystem("file"), root, "jsonl", 3, 200)
    loader = ingest.DataLoader(stream_of(root), num_workers=2)
    try:
        for n, _ in enumerate(loader, 1):
            if n == 5:
                break
        state = loader.state_dict()
    finally:
        loader.close()
    counts = [shard[3] for shard in state["dataset"]["shards"]]
    assert counts == [200, 200, 200]
    again = stream_of(root)
    again.load_state_dict(state)
    saved = again.state_dict()
    assert [shard[3] for shard in saved["dataset"]["shards"]] == counts
    rest = ingest.DataLoader(stream_of(root), num_workers=2)
    try:
        rest.load_state_dict(saved)
        got = Counter(ids(rest))
    finally:
        rest.close()
    assert max(got.values()) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_the_streams_stats_count_what_the_loaders_workers_read_and_handed_out(
    data: str, workers: int
) -> None:
    """``stream.stats`` under a DataLoader: the workers' requests and bytes (in their own
    processes, with their own sources) and the rows the loader handed out. They counted
    none: a run that read 6 shards said 0 opens, 0 bytes and 0 rows delivered."""
    alone = stream_of(data)
    assert len(ids(alone)) == TOTAL
    footers = alone.stats["bytes_read"]
    assert len(ids(alone)) == TOTAL
    read_alone = alone.stats["bytes_read"] - footers  # an epoch's, its footers read before
    stream = stream_of(data)
    loader = ingest.DataLoader(stream, num_workers=workers)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    assert stream.stats["rows_delivered"] == 5 * BATCH
    list(batches)
    first = stream.stats
    assert first["rows_delivered"] == TOTAL
    assert first["opens"] >= SHARDS and first["reads"] >= SHARDS
    assert read_alone <= first["bytes_read"] < 3 * read_alone
    assert len(ids(loader)) == TOTAL
    second = stream.stats
    assert second["rows_delivered"] == TOTAL
    assert second["opens"] >= first["opens"] + SHARDS
    assert second["bytes_read"] >= first["bytes_read"] + read_alone
