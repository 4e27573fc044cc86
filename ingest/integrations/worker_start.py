"""How an ``ingest.DataLoader``'s worker processes start: the start method chosen where the
caller named none (``forkserver`` beside Ray's threads, where the workers can get the
stream), the stream refused where the workers could not get it, and the forkserver's
preloaded modules."""

from __future__ import annotations

import multiprocessing
import multiprocessing.reduction
import pickle
import sys
import types
import warnings
from typing import Any, Literal

from ingest.core.errors import ConfigError
from ingest.integrations.shared_slots import start_method

RayProcess = Literal["worker", "driver"]
"""Where Ray runs beside this process's code: a Ray worker (a task's, an actor's), or a driver
that initialized Ray (a script, a notebook)."""


def ray_process() -> RayProcess | None:
    """``"worker"`` in a Ray worker process (a task's or an actor's: a Ray Train worker's
    training loop), ``"driver"`` in a process that initialized Ray itself, None where Ray is
    not imported or not initialized."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    # (the runtime context's worker: Ray's own check of a worker's mode, as in its methods)
    worker = getattr(ray.get_runtime_context(), "worker", None)
    return "worker" if getattr(worker, "mode", None) == ray.WORKER_MODE else "driver"


def main_runs_again(main: types.ModuleType) -> bool:
    """Whether a worker started by forkserver or spawn runs this ``__main__`` again (as
    ``__mp_main__``), as multiprocessing prepares it: a script run by its path (``python
    train.py``) or a module by its name (``python -m train``), whose top level runs again in
    each worker unless a ``__name__`` guard stops it; not a package's ``__main__`` (``python
    -m pytest``: multiprocessing skips it), a notebook, a REPL or ``python -c`` (no file).

    (``multiprocessing.spawn.get_preparation_data`` and ``_fixup_main_from_name``: the rule
    is theirs; they are private, so it is written here.)"""
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return not (name == "__main__" or name.endswith(".__main__"))
    return getattr(main, "__file__", None) is not None


class _MainRefused(multiprocessing.reduction.ForkingPickler):
    """Pickles as a worker's start does, and refuses anything that names ``__main__`` (a
    notebook's function or class, pickled by name: a forkserver's worker has another
    ``__main__`` and could not find it)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
            raise pickle.PicklingError(f"{obj.__qualname__} is defined in __main__")
        return NotImplemented


def worker_start(
    num_workers: int,
    kwargs: dict[str, Any],
    sent: Any,
    *,
    ray: RayProcess | None,
    main: types.ModuleType | None = None,
    default: str | None = None,
) -> dict[str, Any]:
    """``kwargs`` with the start method of the loader's workers where the caller named none:
    ``forkserver`` beside Ray's threads (``ray``: :func:`ray_process`) where the default is
    fork and the workers can get the stream; else as they are.

    Ray runs its core worker's threads (gRPC, its event loops) in a Ray worker and in a
    driver that initialized it. A child forked beside them inherits their memory mid-change
    without the threads, and may crash: forked workers of this project's tests died twice of
    SIGABRT (``double free or corruption``) in a process with the session's Ray up; Ray's
    advice for torch DataLoaders in Ray Train is ``forkserver`` or ``spawn``. The workers then
    get the stream by pickling (``sent``), and each prepares its ``__main__`` as
    multiprocessing does:

    - In a Ray worker, ``__main__`` is Ray's worker script: no user code runs again. A stream
      that cannot be pickled (a lambda or a local function as the transform) forks as before,
      with a warning that says so.
    - In a driver, only where ``__main__`` would not run again in each worker
      (:func:`main_runs_again`: a notebook, a REPL, ``python -c``, ``python -m pkg``; not a
      script, whose top level would run again, ``ray.init`` and all, without a ``__name__``
      guard) and where the stream names nothing of ``__main__`` (a notebook's function: the
      workers could not find it). Else the workers fork, silently (the user did nothing
      wrong); a guarded script passes ``multiprocessing_context="forkserver"``.

    The forkserver starts once per process (about two seconds; it imports torch and ingest
    for its workers: :func:`preload_forkserver`), and the workers are kept across epochs;
    they send their batches through the same shared-memory rings as forked workers
    (:mod:`ingest.integrations.shared_slots`: the rings' memory file is passed to them as
    they start): a warm epoch of ``benchmarks/dataloader.py --forkserver`` at 0.91-1.03x the
    rows/s of forked workers.

    ``main``: the ``__main__`` module (default: this process's). ``default``: the start
    method the workers would get (the one set, or the platform's)."""
    if not num_workers or kwargs.get("multiprocessing_context") is not None or ray is None:
        return kwargs
    if default is None:
        default = start_method(None)
    if default != "fork" or "forkserver" not in multiprocessing.get_all_start_methods():
        return kwargs
    if ray == "driver" and main_runs_again(sys.modules["__main__"] if main is None else main):
        return kwargs
    if not _sendable(sent, ray):
        return kwargs
    return {**kwargs, "multiprocessing_context": multiprocessing.get_context("forkserver")}


def _sendable(sent: Any, ray: RayProcess) -> bool:
    """Whether workers started by forkserver can get ``sent``: pickled, and from a driver
    naming nothing of ``__main__``. Where they cannot, a Ray worker says so (a driver's
    notebook did nothing wrong)."""
    pickler = _MainRefused if ray == "driver" else multiprocessing.reduction.ForkingPickler
    try:
        pickler.dumps(sent)
    except Exception as e:
        if ray == "driver":
            return False
        warnings.warn(
            "ingest.DataLoader is made in a Ray worker process, where workers forked beside "
            "Ray's threads can crash; they would start by forkserver, which sends them the "
            f"stream by pickling, and the stream cannot be pickled ({type(e).__name__}: {e}), "
            "so they fork. Define the transform at the top level of a module the workers can "
            "import (not a lambda, a function inside another, or one of the driver's script, "
            "which Ray sends by value), or pass multiprocessing_context= to choose",
            RuntimeWarning,
            stacklevel=4,
        )
        return False
    return True


def checked_init(worker_init_fn: Any, num_workers: int, context: Any) -> None:
    """Refuse a ``worker_init_fn`` that workers started by spawn or forkserver cannot get
    (a lambda, a local function): torch failed at the first loop ("Can't pickle")."""
    if not num_workers or worker_init_fn is None or start_method(context) == "fork":
        return
    try:
        multiprocessing.reduction.ForkingPickler.dumps(worker_init_fn)
    except Exception as e:
        raise ConfigError(
            f"ingest.DataLoader's workers start by {start_method(context)}: they get "
            f"worker_init_fn={worker_init_fn!r} by pickling, and it cannot be pickled "
            f"({type(e).__name__}: {e}). Define it at a module's top level (not a lambda "
            "or a function inside another), or pass multiprocessing_context='fork' (Linux)"
        ) from None


def checked_sendable(shares: Any, num_workers: int, context: Any) -> None:
    """Refuse a stream that workers started by spawn or forkserver (macOS's default, and
    ``multiprocessing_context="spawn"``) cannot get: they get it by pickling, where a forked
    worker inherits it. A lambda or a local function as the transform cannot be pickled,
    and torch's worker start said only "Can't pickle local object", at the first loop."""
    if not num_workers:
        return
    method = start_method(context)
    if method == "fork":
        return
    dumps = multiprocessing.reduction.ForkingPickler.dumps
    try:
        dumps(shares)
    except Exception as e:
        failed, what = e, "the stream"
        try:
            dumps(shares.transform)
        except Exception:
            what = f"its transform {shares.transform!r}"
        raise ConfigError(
            f"ingest.DataLoader's workers start by {method}: they get the stream by pickling, "
            f"and {what} cannot be pickled ({type(failed).__name__}: {failed}). Define the "
            "transform at a module's top level (not a lambda or a function inside another), "
            "or pass multiprocessing_context='fork' (Linux)"
        ) from None


PRELOADED = "ingest.integrations.loader"
"""The module a forkserver that starts a loader's workers imports as it starts."""


def preload_forkserver(context: Any) -> None:
    """Where ``context`` starts processes by forkserver: the forkserver, when it starts,
    imports this module (torch, pyarrow, ingest) besides what it preloads already (the
    caller's list is kept), so the loader's workers fork from it with them imported.

    Else each worker imports them after it forks, as it unpickles its dataset: 1.5 s of CPU a
    worker, and its own copy of their memory (a worker's private memory 173 MiB, against 33
    MiB forked from a server that imported them; 4 workers' first batch on 2 cores 2.8 s
    against 1.4 s). Importing them starts no thread, so the server forks as safely as
    before. A forkserver already running (started by this process before) keeps what it
    started with."""
    if start_method(context) != "forkserver":
        return
    import multiprocessing.forkserver

    # The forkserver's preload list has a setter only: read where the setter keeps it.
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    modules = list(getattr(server, "_preload_modules", None) or ["__main__"])
    if PRELOADED not in modules:
        multiprocessing.forkserver.set_forkserver_preload([*modules, PRELOADED])


__all__ = [
    "PRELOADED",
    "RayProcess",
    "checked_sendable",
    "main_runs_again",
    "preload_forkserver",
    "ray_process",
    "worker_start",
]
