"""ingest.DataLoader keeps its worker processes across epochs (issue 32, item 2).

The main process sends each worker the next epoch's state and listing through a queue made
before the workers started; the workers never list. Checked here: the batches of two epochs
come from the same two worker processes (each batch carries the pid that read it), every row
comes once per epoch, a state taken in the second epoch resumes exactly, a state loaded
between epochs restarts the workers' reading from it, and the workers stop at once when the
loader goes (or ``close()``), and never hold up the interpreter's exit.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import ingest
from ingest.testing import write_dataset

SHARDS, ROWS, BATCH = 6, 500, 25
TOTAL = SHARDS * ROWS


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> str:
    import fsspec

    root = f"file://{tmp_path_factory.mktemp('workers')}/d"
    write_dataset(fsspec.filesystem("file"), root, "parquet", SHARDS, ROWS, row_group_rows=100)
    return root


def with_pid(table: pa.Table) -> pa.Table:
    """The transform each worker runs: every row says which process read it."""
    return table.append_column("pid", pa.array([os.getpid()] * len(table), pa.int64()))


def stream_of(url: str, **kwargs: Any) -> ingest.Stream:
    return ingest.Stream(
        url, columns=["id"], batch_size=BATCH, shuffle_seed=3, transform=with_pid, **kwargs
    )


def ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"].tolist()]


def pids(batches: Any) -> set[int]:
    return {int(p) for b in batches for p in b["pid"].tolist()}


def workers_of(loader: ingest.DataLoader, before: set[Any]) -> set[Any]:
    return set(multiprocessing.active_children()) - before


def test_a_transform_spawned_workers_cannot_get_is_refused_naming_it(data: str) -> None:
    """Spawned workers (macOS's default) get the stream's transform by pickling: a lambda
    or a local function cannot be. Refused as the loader is made, naming the transform and
    the fix; torch's worker start raised a bare "Can't pickle local object" at the first
    loop."""
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, transform=lambda t: t)
    with pytest.raises(ingest.ConfigError, match=r"spawn.*<lambda>.*top level.*'fork'"):
        ingest.DataLoader(stream, num_workers=2, multiprocessing_context="spawn")
    forked = ingest.DataLoader(stream, num_workers=2, multiprocessing_context="fork")
    assert len(ids(forked)) == TOTAL
    forked.close()


def test_an_epoch_without_a_batch_says_why_on_workers_too(data: str) -> None:
    """A batch larger than one worker's share of the dataset: the epoch hands out nothing,
    and the main process says why (each worker is a rank), as a Stream does."""
    stream = ingest.Stream(data, columns=["id"], batch_size=TOTAL)
    loader = ingest.DataLoader(stream, num_workers=2)
    with pytest.warns(UserWarning, match=rf"epoch 0 gave no batch: the dataset \({TOTAL:,} rows"):
        assert ids(loader) == []
    loader.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_epochs_run_on_the_same_workers_every_row_once(data: str, context: str) -> None:
    loader = ingest.DataLoader(
        stream_of(data), num_workers=2, multiprocessing_context=context, timeout=120
    )
    first = list(loader)
    second = list(loader)
    assert len(pids(first)) == 2 and os.getpid() not in pids(first)
    assert pids(second) == pids(first), "epoch 2 ran on epoch 1's worker processes"
    a, b = ids(first), ids(second)
    assert len(a) == len(set(a)) and len(b) == len(set(b)), "every row once per epoch"
    both = Counter(a + b)
    # The rows that could not fill a step on both workers in epoch 1 come first in epoch 2.
    assert set(both) == set(range(TOTAL)) and set(both.values()) <= {1, 2}
    assert TOTAL - len(a) < 2 * BATCH
    loader.close()


def test_a_state_mid_epoch_two_resumes_exactly(data: str) -> None:
    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    first = list(loader)
    head = []
    for k, batch in enumerate(loader):
        head.append(batch)
        if k == 9:  # not at a step both workers finished: one is a step ahead
            state = loader.state_dict()
            break
    assert pids(head) == pids(first), "the same workers"
    assert state["progress"]["epoch"] == 1
    # A new process: a new loader (another worker count) from the state alone.
    resumed = ingest.DataLoader(stream_of(data), num_workers=3)
    resumed.load_state_dict(state)
    rest = ids(resumed)
    this = Counter(ids(head) + rest)
    assert max(this.values()) == 1, "no row twice in epoch 2"
    assert set(ids(first)) | set(this) == set(range(TOTAL)), "no row lost"
    # The loader that took the state goes on, on its same workers, from the same point.
    went_on = list(loader)
    assert pids(went_on) == pids(first)
    assert not set(ids(head)) & set(ids(went_on))
    assert sorted(ids(went_on)) == sorted(ids(epoch_from(data, state)))
    nxt = list(loader)  # epoch 3, on the same workers, every row once
    assert pids(nxt) == pids(first) and len(ids(nxt)) == len(set(ids(nxt)))


def epoch_from(data: str, state: dict[str, Any]) -> list[Any]:
    """The rest of the epoch ``state`` is in, read by a new loader of two workers."""
    resumed = ingest.DataLoader(stream_of(data), num_workers=2)
    resumed.load_state_dict(state)
    return list(resumed)


def test_a_state_loaded_between_epochs_restarts_the_same_workers_from_it(data: str) -> None:
    loader = ingest.DataLoader(stream_of(data), num_workers=2)
    first = list(loader)
    start = ingest.DataLoader(stream_of(data)).state_dict()  # the first epoch's start
    loader.load_state_dict(start)
    again = list(loader)
    assert pids(again) == pids(first)
    assert ids(again) == ids(first), "the same epoch again, in the same order"
    # And a state loaded mid-epoch, while the workers read ahead of it.
    it = iter(loader)
    head = ids([next(it) for _ in range(5)])
    state = loader.state_dict()
    next(it)  # read but then abandoned: the loaded state does not count it
    loader.load_state_dict(state)
    with pytest.raises(ingest.SupersededError):  # the ended loop hands out nothing more
        next(it)
    rest = list(loader)
    assert pids(rest) == pids(first)
    assert len(set(head + ids(rest))) == len(head + ids(rest)), "no row twice"
    assert sorted(ids(rest)) == sorted(ids(epoch_from(data, state))), "as a new loader's"


def test_deleting_the_loader_stops_its_workers_at_once(data: str) -> None:
    """The loader holds its workers between epochs; when it goes (no garbage collection
    needed) or ``close()`` is called, they stop."""
    before = set(multiprocessing.active_children())
    gc.disable()
    try:
        loader = ingest.DataLoader(stream_of(data), num_workers=2)
        for n, _ in enumerate(loader):
            if n == 3:
                break
        workers = workers_of(loader, before)
        assert len(workers) == 2
        assert all(w.is_alive() for w in workers), "kept for the next loop"
        del loader
        assert not any(w.is_alive() for w in workers), "the workers stopped with their loader"
        closed = ingest.DataLoader(stream_of(data), num_workers=2)
        list(closed)
        workers = workers_of(closed, before)
        assert len(workers) == 2 and all(w.is_alive() for w in workers)
        closed.close()
        assert not any(w.is_alive() for w in workers), "close() stopped them"
        assert len(ids(closed)) > TOTAL - 2 * BATCH, "and the next loop starts new ones"
        closed.close()
    finally:
        gc.enable()


SCRIPT = """
import ingest, sys
loader = ingest.DataLoader(
    ingest.Stream(sys.argv[1], columns=["id"], batch_size=25, shuffle_seed=3),
    num_workers=2, multiprocessing_context=sys.argv[2],
)
list(loader)
for n, batch in enumerate(loader):
    if n == 2:
        break  # left mid-epoch, the loader still held: the interpreter exits
print("done", flush=True)
"""


def test_an_abandoned_loop_does_not_hold_up_the_exit(data: str) -> None:
    # Fork only: a spawned worker imports torch, over a minute on a busy 2-core runner (the
    # spawn start is covered by test_two_epochs_run_on_the_same_workers_every_row_once).
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), data, "fork"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "done"


def test_a_mixtures_loader_keeps_and_closes_every_sources_workers(tmp_path: Any) -> None:
    """Over an ``ingest.Mix`` each source's loader keeps its own workers across loops, and
    the mixture's ``close()`` stops them all."""
    import fsspec

    urls = {}
    for name in ("a", "b"):
        urls[name] = f"file://{tmp_path}/{name}"
        write_dataset(fsspec.filesystem("file"), urls[name], "parquet", 2, 200)
    mix = ingest.Mix(urls)
    loader = ingest.DataLoader(
        ingest.Stream(mix, columns=["id"], batch_size=BATCH, shuffle_seed=3), num_workers=2
    )
    before = set(multiprocessing.active_children())
    head = [b for _, b in zip(range(3), loader, strict=False)]
    workers = workers_of(loader, before)
    assert len(workers) == 4, "two per source"
    more = [b for _, b in zip(range(3), loader, strict=False)]
    assert workers_of(loader, before) == workers, "the next loop, on the same workers"
    assert [len(b["id"]) for b in head + more] == [BATCH] * 6
    loader.close()
    assert not any(w.is_alive() for w in workers), "close() stopped every source's workers"


_FROZEN_IN: dict[int, int] = {}
"""Each worker process's frozen objects, by its pid, counted at its first batch."""


def with_frozen(table: pa.Table) -> pa.Table:
    """The transform each worker runs: every row says how many objects its process's
    garbage collector leaves alone (``gc.freeze``), counted once in each process:
    ``gc.get_freeze_count`` walks every frozen object (0.1 s for 6 million), which in a
    full suite's pytest process took this test 25-30 s when counted at every batch."""
    pid = os.getpid()
    if pid not in _FROZEN_IN:
        _FROZEN_IN[pid] = gc.get_freeze_count()
    return table.append_column("frozen", pa.array([_FROZEN_IN[pid]] * len(table)))


def test_forked_workers_never_collect_the_main_processs_objects(data: str) -> None:
    """A forked worker's first full collection walked every object it inherited, writing
    to each page it touched (copy on write): 0.3-1.5 s of the first batch after a resume,
    in each worker at once (issue 32). The main process freezes its objects across the
    fork (``gc.freeze``), as Python's documentation advises, and only the workers keep
    them frozen."""
    gc.collect()
    held = [object() for _ in range(50_000)]  # objects the main process holds at the fork
    stream = ingest.Stream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=3, transform=with_frozen
    )
    loader = ingest.DataLoader(stream, num_workers=2, multiprocessing_context="fork")
    try:
        frozen = {int(n) for b in loader for n in b["frozen"].tolist()}
    finally:
        loader.close()
    assert min(frozen) >= len(held), frozen
    assert gc.get_freeze_count() == 0, "the main process's objects are collected as before"


def test_a_freeze_of_the_callers_own_is_left_as_it_is(data: str) -> None:
    """A process that froze its objects itself (a server's own fork discipline) keeps them
    frozen: the loader does not unfreeze what it did not freeze."""
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        assert mine > 0
        loader = ingest.DataLoader(stream_of(data), num_workers=1)
        try:
            assert ids(loader)
        finally:
            loader.close()
        # Still frozen (unfrozen, it would be 0); a few of those objects were freed since.
        assert gc.get_freeze_count() > mine // 2
    finally:
        gc.unfreeze()


def with_texts(table: pa.Table) -> pa.Table:
    """Text and binary columns of every kind a worker writes into its ring as buffers (each
    row's values a function of its id), and a nullable one, which goes as Python objects."""
    keys = [int(i) for i in table.column("id").to_pylist()]
    texts = ["" if i % 7 == 0 else f"é{i}" * (i % 5) for i in keys]
    return (
        table.append_column("text", pa.array(texts, pa.string()))
        .append_column("big", pa.array(texts, pa.large_string()))
        .append_column("raw", pa.array([t.encode() for t in texts], pa.binary()))
        .append_column(
            "maybe",
            pa.array(
                [None if i % 3 == 0 else t for i, t in zip(keys, texts, strict=True)], pa.string()
            ),
        )
    )


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_text_columns_come_through_the_workers_as_the_stream_gives_them(
    data: str, context: str
) -> None:
    """Workers (forked or spawned) write a string or binary column's offsets and bytes into
    their ring, and the main process decodes them: the batches hold the same values, of the
    same Python types, in the same column order, as a one-process Stream's, for a whole
    epoch and across the epoch boundary."""

    def stream() -> ingest.Stream:
        return ingest.Stream(
            data, columns=["id"], batch_size=BATCH, shuffle_seed=3, transform=with_texts
        )

    def rows(batches: Any) -> dict[int, tuple[Any, ...]]:
        out = {}
        for b in batches:
            assert list(b) == ["id", "text", "big", "raw", "maybe"]
            for n, i in enumerate(b["id"].tolist()):
                out[i] = (b["text"][n], b["big"][n], b["raw"][n], b["maybe"][n])
        return out

    want = rows(stream())
    loader = ingest.DataLoader(stream(), num_workers=2, multiprocessing_context=context)
    try:
        for _ in range(2):
            got = rows(loader)
            assert got.keys() <= want.keys() and len(got) > TOTAL - 2 * 2 * BATCH
            assert {i: want[i] for i in got} == got
            assert all(type(v[2]) is bytes and type(v[0]) is str for v in got.values())
    finally:
        loader.close()


def logged(path: str, table: pa.Table) -> pa.Table:
    """:func:`with_pid`, each batch noted in the file ``path`` as it is read."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return with_pid(table)


def test_the_next_epoch_is_read_while_the_caller_is_between_epochs(
    data: str, tmp_path: Path
) -> None:
    """At an epoch's end the main process plans the next one and sends it to the workers at
    once: they read its first batch while the caller is between epochs (its evaluation, its
    checkpoint), before it iterates again. The epoch then read is every row once, from the
    state the last one ended on; a state loaded between epochs is read from instead (see
    test_a_state_loaded_between_epochs_restarts_the_same_workers_from_it)."""
    log = tmp_path / "reads"
    log.write_text("")
    stream = ingest.Stream(
        data,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=3,
        transform=functools.partial(logged, str(log)),
    )
    loader = ingest.DataLoader(stream, num_workers=2, multiprocessing_context="fork")
    try:
        first = ids(loader)
        read = len(log.read_text().split())
        deadline = time.monotonic() + 60
        while len(log.read_text().split()) == read and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(log.read_text().split()) > read, "no batch read before the next loop"
        second = ids(loader)
    finally:
        loader.close()
    assert len(second) == len(set(second)) and TOTAL - len(second) < 2 * BATCH
    assert set(first) | set(second) == set(range(TOTAL))


PRELOADED = """
import multiprocessing.forkserver, os, sys
import ingest

def server_has(pid: int, library: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return library in f.read()

if __name__ == "__main__":
    multiprocessing.forkserver.set_forkserver_preload(["json"])  # the caller's own, kept
    stream = ingest.Stream(sys.argv[1], columns=["id"], batch_size=25, shuffle_seed=3)
    loader = ingest.DataLoader(stream, num_workers=2, multiprocessing_context="forkserver")
    rows = sum(len(b["id"]) for b in loader)
    workers = loader._workers.iterator._workers
    # a worker's parent (its stat's 4th field, after the name): the forkserver
    stats = [open(f"/proc/{w.pid}/stat").read() for w in workers]
    (server,) = {int(stat.rsplit(")", 1)[1].split()[1]) for stat in stats}
    print(rows, server != os.getpid(), server_has(server, "libtorch_cpu"),
          sorted(multiprocessing.forkserver._forkserver._preload_modules))
    loader.close()
"""


@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver here"
)
def test_forkserver_workers_fork_from_a_server_that_imported_torch_and_ingest(data: str) -> None:
    """The forkserver imports the loader's module (torch, pyarrow, ingest) once as it
    starts; its workers fork from it with them imported: no import each (1.5 s of CPU a
    worker), and their pages shared with the server (a worker's private memory 173 MiB
    -> 33 MiB). A preload the caller set is kept. A fresh process: a forkserver already
    running (started by another test) keeps the modules it started with."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PRELOADED), data],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows, apart, has_torch, preload = done.stdout.strip().split(" ", 3)
    assert int(rows) > TOTAL - 2 * 2 * BATCH and apart == "True"
    assert has_torch == "True", "the forkserver imported torch before its workers forked"
    assert preload == "['ingest.integrations.loader', 'json']"
