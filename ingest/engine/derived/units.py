"""Running a stage chain over units to keep their derived copies: the jobs (a shard's units,
each with its key), what became of each unit, and the :data:`Deriver` that runs them
(:func:`local_deriver` in threads here; :func:`ingest.distributed.prepare_tasks.ray_deriver`
in Ray tasks). What :func:`ingest.engine.derived.prepare.prepare` plans and reports on.

A unit is derived as a stream's lane derives a span it reads whole (:mod:`.reading`): its rows
as the format gives them, the chain over all of them at once, the outputs kept row-aligned.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.engine.derived.codec import encode
from ingest.engine.derived.keys import DerivedKey, DerivedWarning, chain_fingerprint
from ingest.engine.derived.store import DerivedConfig, DerivedStore, frame
from ingest.engine.transform import Transform, build_transform, parallel_batches, staged
from ingest.formats import open_reader
from ingest.formats.base import BadRows, ReadContext

Outcome = Literal["derived", "present", "unkept", "failed"]


@dataclass(frozen=True, slots=True)
class UnitJob:
    """One unit to derive: rows ``[start, stop)`` of a shard (``stop`` None: to its end),
    kept under ``key``."""

    start: int
    stop: int | None
    key: DerivedKey


@dataclass(frozen=True, slots=True)
class ShardJob:
    """The units of one shard, read in one opening of it."""

    ctx: ReadContext
    units: tuple[UnitJob, ...]


@dataclass(frozen=True, slots=True)
class UnitDone:
    """What became of one unit: ``derived`` (its copy written now), ``present`` (a copy was
    there: nothing read), ``unkept`` (derived, not written: another writer got there first,
    or a node's directory had no room), ``failed`` (``error`` says why)."""

    url: str
    start: int
    stop: int | None
    outcome: Outcome
    rows: int = 0
    bytes_written: int = 0
    error: str = ""

    def where(self) -> str:
        return f"{self.url} rows [{self.start}, {'end' if self.stop is None else self.stop})"


class Derivation:
    """What each unit runs and where its copy goes: the transform as given (built once where
    it runs: a class per task, as a reader actor builds it), its chain's fingerprint, the
    store. Picklable: the built chain stays in the process that built it.

    Raises:
        ConfigError: From :meth:`build`, if the chain built here has another fingerprint
            than the one the units' keys were made with.
    """

    def __init__(
        self,
        transform: Transform,
        fingerprint: str,
        config: DerivedConfig,
        built: Callable[[pa.Table], Any] | None = None,
    ) -> None:
        self.transform = transform
        self.fingerprint = fingerprint
        self.config = config
        self._built = built
        """The chain built in this process (``built``: by the caller, its fingerprint found)."""

    def __getstate__(self) -> dict[str, Any]:
        return {"transform": self.transform, "fingerprint": self.fingerprint, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.transform = state["transform"]
        self.fingerprint = state["fingerprint"]
        self.config = state["config"]
        self._built = None

    def build(self) -> Callable[[pa.Table], Any]:
        """The chain, built here once, its fingerprint checked against the keys'."""
        if self._built is None:
            fn = build_transform(self.transform)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DerivedWarning)
                found = None if fn is None else chain_fingerprint(fn)
            if fn is None or found != self.fingerprint:
                raise ConfigError(
                    f"the transform built in this process has fingerprint {found!r}, the one "
                    f"the units were keyed with {self.fingerprint!r}: it builds something else "
                    "here (another tokenizer file, another version of its code); make every "
                    "node build the same chain"
                )
            self._built = fn
        return self._built


Deriver = Callable[[Derivation, Sequence[ShardJob]], Iterator[list[UnitDone]]]
"""Derives shard jobs: yields each one's units' outcomes as the job finishes (any order).
A unit that fails is an outcome; an error of the store or of the chain's build raises."""


def derive_shard(
    job: ShardJob,
    fn: Callable[[pa.Table], Any],
    store: DerivedStore,
    running: threading.Semaphore | None = None,
) -> list[UnitDone]:
    """Derive the units of ``job`` that have no copy yet, reading the shard once for them.

    As a stream's lane does for a unit it reads whole: its rows as the format gives them
    (``job.ctx``: the stream's columns and read options), the chain over all of them at
    once, the outputs kept row-aligned. ``running`` bounds the chains run at once (the
    chain's ``parallel_batches``).

    Raises:
        DerivedStoreError: If the store cannot be read or written.
    """
    ctx = job.ctx
    done: dict[UnitJob, UnitDone] = {}
    todo = []
    for u in job.units:
        if not store.has(u.key):  # a look: a rerun downloads no copy
            todo.append(u)
        else:
            done[u] = UnitDone(ctx.shard.url, u.start, u.stop, "present")
    for j, got in _read(ctx, todo):  # a unit's rows at a time, derived as they are read
        u = todo[j]
        if isinstance(got, str):
            done[u] = _failed(ctx, u, got)
        else:
            done[u] = _derive(ctx, u, got, fn, store, running)
    return [done[u] for u in job.units]


def _read(
    ctx: ReadContext, units: Sequence[UnitJob]
) -> Iterator[tuple[int, list[pa.RecordBatch] | str]]:
    """Each of ``units`` (by index) as its rows are read, the shard opened once; after an
    error, why for each unit not read whole (those read before it are kept)."""
    if not units:
        return
    at, rows = 0, list[pa.RecordBatch]()
    try:
        with open_reader(ctx) as reader:
            for j, batch in reader.read_spans([(u.start, u.stop) for u in units], None):
                if isinstance(batch, BadRows):  # on_error="skip": a stream quarantines them
                    raise ValueError(f"rows [{batch.row}, {batch.stop}) do not read: {batch.error}")
                while at < j:
                    yield at, rows
                    at, rows = at + 1, []
                if batch.data.num_rows:
                    rows.append(batch.data)
    except Exception as e:
        why = f"reading the shard: {type(e).__name__}: {e}"
        yield from ((j, why) for j in range(at, len(units)))
        return
    while at < len(units):
        yield at, rows
        at, rows = at + 1, []


def _derive(
    ctx: ReadContext,
    unit: UnitJob,
    batches: list[pa.RecordBatch],
    fn: Callable[[pa.Table], Any],
    store: DerivedStore,
    running: threading.Semaphore | None,
) -> UnitDone:
    if not batches:  # a stream keeps no copy of a unit without rows either
        return _failed(ctx, unit, "it has no rows")
    table = pa.Table.from_batches(batches)
    try:
        if running is None:
            made = staged(fn, table)
        else:
            with running:
                made = staged(fn, table)
    except Exception as e:
        return _failed(ctx, unit, f"the chain raised {type(e).__name__}: {e}")
    payload = encode(made, table.num_rows)
    written = store.put_bytes(unit.key, payload)
    size = len(frame(unit.key.name(), b"")) + len(payload) if written else 0
    outcome: Outcome = "derived" if written else "unkept"
    return UnitDone(ctx.shard.url, unit.start, unit.stop, outcome, table.num_rows, size)


def _failed(ctx: ReadContext, unit: UnitJob, error: str) -> UnitDone:
    return UnitDone(ctx.shard.url, unit.start, unit.stop, "failed", error=error)


def local_deriver(workers: int = 4) -> Deriver:
    """A :data:`Deriver` that derives ``workers`` shards at once in threads of this process,
    running at most the chain's ``parallel_batches`` chains at once.

    Raises:
        ConfigError: If ``workers`` is below 1.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"prepare workers={workers!r} must be an int >= 1")

    def run(derivation: Derivation, jobs: Sequence[ShardJob]) -> Iterator[list[UnitDone]]:
        fn = derivation.build()
        store = DerivedStore(derivation.config)
        running = threading.Semaphore(parallel_batches(fn))
        if workers == 1 or len(jobs) <= 1:
            yield from (derive_shard(job, fn, store, running) for job in jobs)
            return
        pool = ThreadPoolExecutor(min(workers, len(jobs)))
        pending: set[Future[list[UnitDone]]] = set()
        try:
            for job in jobs:  # at most `workers` shards read and held at once
                pending.add(pool.submit(derive_shard, job, fn, store, running))
                if len(pending) >= workers:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    yield from (f.result() for f in finished)
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (f.result() for f in finished)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return run


__all__ = [
    "Derivation",
    "Deriver",
    "Outcome",
    "ShardJob",
    "UnitDone",
    "UnitJob",
    "derive_shard",
    "local_deriver",
]
