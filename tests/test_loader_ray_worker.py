"""An ``ingest.DataLoader`` made in a Ray worker process (a Ray Train worker's training loop,
a task, an actor) starts its worker processes by ``forkserver``, not by fork.

A Ray worker runs Ray's core worker threads (gRPC, its event loops); a child forked beside
them inherits their memory mid-change, without the threads, and may crash (a forked
DataLoader worker of this suite's own died of ``double free or corruption`` once, in a
process with the session's Ray up). Ray's advice for torch DataLoaders in Ray Train is
``forkserver`` or ``spawn``. In a Ray worker, ``__main__`` is Ray's own worker script, so the
forkserver's import of it runs no user code. A driver with Ray initialized starts them by
``forkserver`` too where its ``__main__`` would not run again in them (a notebook, a REPL,
``python -c``, a package's ``__main__``: no script of the user's) and the stream names
nothing of ``__main__`` (a notebook's function, which the workers could not find); else
(a script, which each worker would run again) it keeps torch's default, silently. A stream
that cannot be pickled (a lambda as the transform) still forks, in a Ray worker with a
warning that says why and what to change. A context the caller names is kept.
"""

from __future__ import annotations

import multiprocessing
import sys
import types
import warnings
from typing import Any

import pyarrow as pa
import pytest
import ray

import ingest
from ingest.integrations.shared_slots import SlotRing
from ingest.integrations.worker_start import worker_start
from ingest.testing import write_dataset

SHARDS, ROWS, BATCH = 4, 200, 25
TOTAL = SHARDS * ROWS
FORKS = multiprocessing.get_all_start_methods()[0] == "fork"


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> str:
    import fsspec

    root = f"file://{tmp_path_factory.mktemp('ray_worker_loader')}/d"
    write_dataset(fsspec.filesystem("file"), root, "parquet", SHARDS, ROWS, row_group_rows=50)
    return root


def plus_one(table: pa.Table) -> pa.Table:
    """A transform at a module's top level: the forkserver's workers import it."""
    return table.append_column("next", pa.compute.add(table.column("id"), 1))


@ray.remote(num_cpus=0)
def read_in_a_ray_worker(url: str, lambda_transform: bool) -> tuple[str, list[int], list[str], int]:
    """An epoch of a 2-worker loader made in this Ray worker: its workers' start method, the
    ids it handed out, the warnings it gave and the batches it read from its workers' rings
    of shared slots (not by the pipe)."""
    transform = (lambda t: t) if lambda_transform else plus_one
    stream = ingest.Stream(
        url, columns=["id"], batch_size=BATCH, shuffle_seed=1, transform=transform
    )
    slotted = [0]
    viewed = SlotRing.viewed

    def counted(ring: SlotRing, placed: Any) -> Any:
        slotted[0] += 1
        return viewed(ring, placed)

    SlotRing.viewed = counted  # type: ignore[method-assign,assignment]  # put back below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = ingest.DataLoader(stream, num_workers=2)
    try:
        ids = [int(i) for b in loader for i in b["id"].tolist()]
        context = loader.multiprocessing_context  # None: torch's default
        method = (context or multiprocessing).get_start_method()
        return method, ids, [str(w.message) for w in caught], slotted[0]
    finally:
        SlotRing.viewed = viewed  # type: ignore[method-assign]
        loader.close()


@pytest.mark.skipif(not FORKS, reason="workers fork by default only where fork is the default")
@pytest.mark.usefixtures("ray_session")
def test_a_loader_in_a_ray_worker_starts_its_workers_by_forkserver(data: str) -> None:
    method, ids, caught, slotted = ray.get(read_in_a_ray_worker.remote(data, False), timeout=240)
    assert method == "forkserver"
    assert sorted(ids) == list(range(TOTAL))
    assert not caught
    assert slotted == TOTAL // BATCH, "every batch came through the workers' shared slots"


@pytest.mark.skipif(not FORKS, reason="workers fork by default only where fork is the default")
@pytest.mark.usefixtures("ray_session")
def test_a_stream_forkserver_cannot_send_forks_with_a_warning(data: str) -> None:
    method, ids, caught, slotted = ray.get(read_in_a_ray_worker.remote(data, True), timeout=240)
    assert method == "fork"
    assert sorted(ids) == list(range(TOTAL))
    assert slotted == TOTAL // BATCH
    (message,) = caught
    assert "Ray worker" in message and "forkserver" in message and "lambda" in message


def test_the_start_method_is_forkserver_in_a_ray_worker_only() -> None:
    """The choice alone (no Ray): forkserver in a Ray worker where the default is fork; the
    caller's context, no Ray, no workers and another default are left as they are."""
    sendable: Any = {"a stream's": "parts"}
    chosen = worker_start(2, {}, sendable, ray="worker", default="fork")
    assert chosen["multiprocessing_context"].get_start_method() == "forkserver"
    assert worker_start(2, {}, sendable, ray=None, default="fork") == {}
    assert worker_start(0, {}, sendable, ray="worker", default="fork") == {}
    assert worker_start(2, {}, sendable, ray="worker", default="spawn") == {}
    named = {"multiprocessing_context": "fork", "pin_memory": True}
    assert worker_start(2, named, sendable, ray="worker", default="fork") == named


def a_main(file: str | None = None, spec: str | None = None) -> types.ModuleType:
    """A ``__main__`` module as Python makes it: a script's has its file, ``python -m``'s its
    module's spec, a notebook's, a REPL's and ``python -c``'s neither."""
    main = types.ModuleType("__main__")
    if file is not None:
        main.__file__ = file
    main.__spec__ = None if spec is None else types.SimpleNamespace(name=spec)  # type: ignore[assignment]
    return main


@pytest.mark.parametrize(
    ("main", "forkserver"),
    [
        (a_main(), True),  # a notebook, a REPL, python -c (an xdist worker)
        (a_main("/venv/lib/python3/site-packages/pytest/__main__.py", "pytest.__main__"), True),
        (a_main("/home/me/train.py"), False),  # python train.py: each worker would run it
        (a_main("/home/me/train.py", "train"), False),  # python -m train: the same
    ],
    ids=["no-file", "package-main", "script", "module"],
)
def test_a_ray_driver_starts_by_forkserver_where_its_main_would_not_run_again(
    main: types.ModuleType, forkserver: bool
) -> None:
    sendable: Any = {"a stream's": "parts"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = worker_start(2, {}, sendable, ray="driver", main=main, default="fork")
    if forkserver:
        assert chosen["multiprocessing_context"].get_start_method() == "forkserver"
    else:
        assert chosen == {}, "a script's top level would run again in each worker"


def test_a_ray_driver_s_stream_that_names_main_keeps_fork_silently(monkeypatch: Any) -> None:
    """A notebook's transform is a function of ``__main__``: it pickles (by name), and a
    worker started by forkserver could not find it (its ``__main__`` is not the notebook's).
    Forked workers have it; no warning, the notebook did nothing wrong."""
    main = a_main()

    def double(table: pa.Table) -> pa.Table:
        return table

    double.__module__, double.__qualname__ = "__main__", "double"
    main.double = double  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", main)
    multiprocessing.reduction.ForkingPickler.dumps({"transform": double})  # it pickles
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sent = {"transform": double}
        assert worker_start(2, {}, sent, ray="driver", main=main, default="fork") == {}
        # a lambda (it cannot be pickled at all): the same, silently
        assert worker_start(2, {}, lambda: None, ray="driver", main=main, default="fork") == {}


def test_an_unpicklable_stream_keeps_fork_in_a_ray_worker_with_a_warning() -> None:
    with pytest.warns(RuntimeWarning, match=r"Ray worker.*forkserver.*top level"):
        chosen = worker_start(2, {}, lambda: None, ray="worker", default="fork")
    assert chosen == {}


@pytest.mark.skipif(not FORKS, reason="workers fork by default only where fork is the default")
@pytest.mark.usefixtures("ray_session")
def test_a_loader_in_a_ray_driver_without_a_script_starts_its_workers_by_forkserver(
    data: str, monkeypatch: Any
) -> None:
    """This process with Ray up, as a notebook's kernel: its ``__main__`` has no file (an
    xdist worker's has none either; ``pytest`` run as a script has one). A forked worker
    of this suite died here (SIGABRT, ``double free or corruption``) twice."""
    monkeypatch.setitem(sys.modules, "__main__", a_main())
    stream = ingest.Stream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=2, transform=plus_one
    )
    loader = ingest.DataLoader(stream, num_workers=2)
    try:
        assert loader.multiprocessing_context.get_start_method() == "forkserver"
        batches = list(loader)
        ids = [int(i) for b in batches for i in b["id"].tolist()]
        assert sorted(ids) == list(range(TOTAL))
        assert all((b["next"] == b["id"] + 1).all() for b in batches)
    finally:
        loader.close()
