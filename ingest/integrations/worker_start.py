"""How an ``ingest.DataLoader``'s worker processes start: the start method chosen where the
caller named none (``forkserver`` in a Ray worker process), the stream refused where the
workers could not get it, and the forkserver's preloaded modules."""

from __future__ import annotations

import multiprocessing
import multiprocessing.reduction
import sys
import warnings
from typing import Any

from ingest.core.errors import ConfigError
from ingest.integrations.shared_slots import start_method


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a task's or an actor's: a Ray Train worker's
    training loop), not a driver; False where Ray is not imported or not initialized."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    # (the runtime context's worker: Ray's own check of a worker's mode, as in its methods)
    worker = getattr(ray.get_runtime_context(), "worker", None)
    return worker is not None and getattr(worker, "mode", None) == ray.WORKER_MODE


def worker_start(
    num_workers: int,
    kwargs: dict[str, Any],
    sent: Any,
    *,
    in_ray_worker: bool,
    default: str | None = None,
) -> dict[str, Any]:
    """``kwargs`` with the start method of the loader's workers where the caller named none:
    ``forkserver`` in a Ray worker process where the default is fork; else as they are.

    A Ray worker runs Ray's core worker threads (gRPC, its event loops). A child forked beside
    them inherits their memory mid-change without the threads, and may crash: a forked worker
    of this project's tests died of ``double free or corruption`` in a process with Ray up;
    Ray's advice for torch DataLoaders in Ray Train is ``forkserver`` or ``spawn``. In a Ray
    worker, ``__main__`` is Ray's worker script, so the forkserver's import of it runs no user
    code (in a driver it would run a script's top level again, or miss a notebook's functions:
    a driver keeps torch's default). The workers then get the stream by pickling (``sent``):
    where it cannot be pickled (a lambda or a local function as the transform) they fork as
    before, with a warning that says so. The forkserver starts once per process (about two
    seconds; it imports torch and ingest for its workers: :func:`preload_forkserver`), and
    the workers are kept across epochs; they send their batches through the
    same shared-memory rings as forked workers (:mod:`ingest.integrations.shared_slots`: the
    rings' memory file is passed to them as they start): a warm epoch of
    ``benchmarks/dataloader.py --forkserver`` at 0.91-1.03x the rows/s of forked
    workers.

    ``default``: the start method the workers would get (the one set, or the platform's)."""
    if not num_workers or kwargs.get("multiprocessing_context") is not None or not in_ray_worker:
        return kwargs
    if default is None:
        default = start_method(None)
    if default != "fork" or "forkserver" not in multiprocessing.get_all_start_methods():
        return kwargs
    try:
        multiprocessing.reduction.ForkingPickler.dumps(sent)
    except Exception as e:
        warnings.warn(
            "ingest.DataLoader is made in a Ray worker process, where workers forked beside "
            "Ray's threads can crash; they would start by forkserver, which sends them the "
            f"stream by pickling, and the stream cannot be pickled ({type(e).__name__}: {e}), "
            "so they fork. Define the transform at the top level of a module the workers can "
            "import (not a lambda, a function inside another, or one of the driver's script, "
            "which Ray sends by value), or pass multiprocessing_context= to choose",
            RuntimeWarning,
            stacklevel=3,
        )
        return kwargs
    return {**kwargs, "multiprocessing_context": multiprocessing.get_context("forkserver")}


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


__all__ = ["PRELOADED", "checked_sendable", "in_ray_worker", "preload_forkserver", "worker_start"]
