"""Run one contender through the phases of a bench run and turn what it did into figures.

Phases, each on fresh pipelines of the contender, in the same rank processes but for the
resume, which runs in new ones (as a job resumed after a stop does):

0. Conversion, only for a contender that reads its own format (a
   :class:`~ingest.tools.bench.contenders.Converter`): both datasets are written in it with
   its own writer; seconds and CPU of the main dataset's conversion are reported apart, and
   no epoch's clock includes them.
1. ``epochs`` epochs over the main dataset. The clock of the first epoch starts before the
   contender builds anything (listing and start-up are part of its first batch); the
   ranks run each epoch together and the driver waits for all of them (an epoch-end
   barrier, as in data-parallel training). At 45% of epoch 1 (:data:`RESUME_AT`: inside a
   shuffle window, not at a shard's end) each rank takes the contender's state (a
   checkpoint), where it has one.
2. Resume: a new pipeline from those states, in new rank processes (their imports done
   before the clock), run to the end of the epoch; seconds until
   every rank has its first batch, and whether the rows before the checkpoint and the rows
   after the resume hold every id exactly once.
3. Shuffle quality: one epoch over the labeled dataset.

Requests and bytes come from the counting proxy; rank CPU from each rank process; run CPU
from ``psutil`` over every process of the run (see :func:`run_cpu_seconds`).
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import psutil
import ray

from ingest.tools.bench.config import BenchConfig
from ingest.tools.bench.consumer import EpochRecord, EpochSpec, RankActor, error_line
from ingest.tools.bench.contenders import Contender, Converter, Entry
from ingest.tools.bench.data import Dataset
from ingest.tools.bench.proxy import Counters, CountingProxy


class PhaseListener(Protocol):
    """Told when each phase begins and ends (drives the progress bar)."""

    def begin(self, phase: str) -> None:
        """``phase`` starts."""
        ...

    def end(self) -> None:
        """The phase that began last is over."""
        ...


RESUME_AT = 0.45
"""Where in epoch 1 the checkpoint is taken, as a share of each rank's batches."""


def phases(epochs: int) -> int:
    """Phases per contender: the epochs, the resume, the shuffle-quality epoch."""
    return epochs + 2


@dataclass(slots=True, kw_only=True)
class EpochFigures:
    """One epoch of the main dataset, all ranks together."""

    wall_s: float
    rows: int
    tensor_bytes: int
    requests: int
    bytes_read: int
    rank_cpu_s: float
    consumer_cpu_s: float
    run_cpu_s: float
    duplicates: int
    missing: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.wall_s

    @property
    def mb_per_s(self) -> float:
        return self.tensor_bytes / self.wall_s / 1e6


@dataclass(slots=True, kw_only=True)
class Measured:
    """Everything measured for one contender; None where a phase could not run."""

    ranks: int
    first_batch_s: float
    epochs: list[EpochFigures]
    rank_peak_rss_bytes: int
    resume_first_batch_s: float | None = None
    resume_note: str | None = None
    resume_duplicates: int | None = None
    resume_missing: int | None = None
    convert_s: float = 0.0
    convert_cpu_s: float = 0.0
    read_note: str | None = None
    mean_entropy: float | None = None
    quality_duplicates: int = 0
    quality_missing: int = 0


@dataclass(slots=True, kw_only=True)
class _MainRun:
    first_batch_s: float
    epochs: list[EpochFigures]
    states: list[Any]
    state_error: str | None
    seen: list[npt.NDArray[np.int64]]
    """Each rank's ids up to the checkpoint."""


@dataclass(slots=True)
class _Resumed:
    first_batch_s: float | None
    note: str | None = None
    duplicates: int | None = None
    missing: int | None = None


def run_cpu_seconds() -> float:
    """CPU seconds of this process and all its descendants (Ray, its workers, their worker
    processes, the S3 server, the proxy), reaped children included; other processes on the
    machine are left out."""
    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # gone since listed: its parent's children_* times hold it now
        total += t.user + t.system + t.children_user + t.children_system
    return total


def conversion_cpu_seconds() -> float:
    """CPU seconds of this process, the children it has reaped (LitData's ``optimize``
    workers) and its live children's own (the S3 server, the proxy, Ray's head processes).

    Unlike :func:`run_cpu_seconds` this leaves out what processes further down reaped, so
    the rank processes of the contender before, ending in the background as Ray reaps them,
    neither add their lifetime nor, gone from the tree, take their CPU away.
    """
    self_usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = self_usage.ru_utime + self_usage.ru_stime + children.ru_utime + children.ru_stime
    for proc in psutil.Process().children(recursive=False):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def _shown(states: Sequence[Any], most: int = 4000) -> str:
    """The ranks' states as one line, cut at ``most`` characters."""
    text = repr(list(states))
    return text if len(text) <= most else text[:most] + "..."


def _check_ids(records: Sequence[EpochRecord], total: int) -> tuple[int, int]:
    """Duplicated and missing ids over all ranks of one epoch (ids are 0..total-1)."""
    return _check(np.concatenate([r.ids for r in records]), total)


def _check(ids: npt.NDArray[np.int64], total: int) -> tuple[int, int]:
    """Duplicated and missing ids among ``ids`` (ids are 0..total-1)."""
    unique = np.unique(ids)
    inside = int(np.count_nonzero((unique >= 0) & (unique < total)))
    return len(ids) - len(unique), total - inside


EXIT_WAIT_S = 60.0
"""How long the rank processes get to close their loaders and run their exit handlers."""


def _stop(actors: Sequence[Any], wait_s: float = EXIT_WAIT_S) -> None:
    """End the rank processes: each closes its loader and exits with its exit handlers run
    (``RankActor.exit``); one still there after ``wait_s`` (a loader that does not close)
    is killed."""
    exits = [actor.exit.remote() for actor in actors]
    if wait_s > 0:
        ray.wait(exits, num_returns=len(exits), timeout=wait_s)
    for actor in actors:
        ray.kill(actor)  # a no-op for an actor that exited


class _Run:
    """One contender's phases, on its own rank actors."""

    def __init__(
        self, contender: Contender, entry: Entry, config: BenchConfig, proxy: CountingProxy
    ) -> None:
        self.contender = contender
        self.entry = entry
        self.config = config
        self.proxy = proxy
        self.temp_dir = tempfile.mkdtemp(prefix="ingest-bench-ranks-")
        """The rank processes' temporary directory (``RankActor.warm``), removed by
        :meth:`kill`."""
        self.hung = False
        """Whether a phase ran past ``config.timeout_s``: the rank processes are killed
        without being asked to close (the call would queue behind the one that hangs)."""
        self.actors: list[Any] = []
        try:
            self._start()
        except BaseException:
            self.kill()  # the processes that started, and the directory
            raise

    def _start(self) -> None:
        """New rank processes (:attr:`actors`, killed by :meth:`kill` if they do not start),
        the contender's modules imported (before any clock)."""
        self.actors = [RankActor.remote(rank) for rank in range(self.contender.ranks)]
        self._get([a.warm.remote(self.entry.modules, self.temp_dir) for a in self.actors], "start")

    def _get(self, refs: list[Any], phase: str) -> list[Any]:
        """The rank processes' answers to ``refs``, waited for ``config.timeout_s`` at most.

        Raises:
            TimeoutError: Naming the phase and the bound, if an answer is missing then.
        """
        try:
            answers: list[Any] = ray.get(refs, timeout=self.config.timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.hung = True
            raise TimeoutError(
                f"{phase}: the rank processes did not answer within {self.config.timeout_s:g} "
                "s (a loader that hangs: they are killed); raise --timeout-s for larger data"
            ) from None
        return answers

    def _restart(self) -> None:
        """Replace the rank processes with new ones, as a job resumed after a stop runs in
        processes of its own (and after a phase that hung, whose processes are killed at once).

        A resumed pipeline built in the processes that ran the checkpointed one shares with
        it what a peer keeps per process and releases only at exit or when collected: the
        torch worker processes of the closed loader, Mosaic's shared memory handles (its
        epoch counter and resume slot; unlinked at exit), LitData's rank variables in the
        environment. One run of ``test_bench_peers`` in several saw a peer's resume deliver
        266 ids twice and miss 266 of 1,024: the right count after the 448 seen, in an order
        unrelated to the checkpointed one (an unrelated order overlaps the 448 by 252 ids on
        average), as a resume that replays another epoch's order would. Reading the peers'
        code found no such path within one pipeline; from new processes nothing the first
        pipeline held can reach the resumed one, and a violation names the states loaded
        (the report's note) so that the next one says which. The next one, from new
        processes, was Mosaic's: 84 ids twice and 84 missed, from states alike on both ranks
        and right for the checkpoint (``epoch`` 0, ``sample_in_epoch`` 448); its cause is not
        found, and the bench reports it as the peer's figure.
        """
        old, self.actors = self.actors, []
        _stop(old, 0.0 if self.hung else EXIT_WAIT_S)
        self.hung = False
        self._start()

    def _epoch(
        self, sources: Sequence[Any] | None, spec: EpochSpec, phase: str
    ) -> list[EpochRecord]:
        refs = [
            actor.run_epoch.remote(None if sources is None else sources[rank], spec)
            for rank, actor in enumerate(self.actors)
        ]
        records: list[EpochRecord] = self._get(refs, phase)
        return records

    def _close_loaders(self) -> None:
        if not self.hung:
            self._get([a.close.remote() for a in self.actors], "closing the loaders")

    def close(self) -> None:
        """Close every rank's loader and the contender's driver side."""
        self._close_loaders()
        self.contender.stop()

    @contextlib.contextmanager
    def closing(self) -> Iterator[None]:
        """Close when the block ends; an error while closing never hides one raised in it."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.close()
            raise
        self.close()

    def main(self, data: Dataset, progress: PhaseListener) -> _MainRun:
        """The epochs over ``data``, with a checkpoint half-way through the first."""
        per_rank = data.rows // (self.contender.ranks * self.config.batch_size)
        checkpoint: int | None = None
        if self.contender.resume_unsupported is None:
            checkpoint = max(int(per_rank * RESUME_AT), 1)
        figures: list[EpochFigures] = []
        states: list[Any] = []
        state_error: str | None = None
        seen: list[npt.NDArray[np.int64]] = []
        counters = self.proxy.counters()
        cpu = run_cpu_seconds()
        start = time.time()
        sources: list[Any] | None = self.contender.start(data)
        first_batch_s = 0.0
        for epoch in range(self.config.epochs):
            if epoch:
                progress.begin(f"epoch {epoch + 1}")
            spec = EpochSpec(
                batch_size=self.config.batch_size,
                checkpoint_after=checkpoint if epoch == 0 else None,
            )
            records = self._epoch(sources, spec, f"epoch {epoch + 1}")
            sources = None
            end = max(r.ended_at for r in records)
            now_counters, now_cpu = self.proxy.counters(), run_cpu_seconds()
            used: Counters = now_counters - counters
            duplicates, missing = _check_ids(records, data.rows)
            if epoch == 0:
                firsts = [r.first_batch_at for r in records]
                if any(f is None for f in firsts):
                    raise RuntimeError("a rank received no batch in the first epoch")
                first_batch_s = max(f for f in firsts if f is not None) - start
                states = [r.state for r in records]
                state_error = next((r.state_error for r in records if r.state_error), None)
                seen = [r.ids[: (checkpoint or 0) * self.config.batch_size] for r in records]
            figures.append(
                EpochFigures(
                    wall_s=end - start,
                    rows=sum(r.rows for r in records),
                    tensor_bytes=sum(r.tensor_bytes for r in records),
                    requests=used.requests,
                    bytes_read=used.bytes_read,
                    rank_cpu_s=sum(r.cpu_s for r in records),
                    consumer_cpu_s=sum(r.consumer_cpu_s for r in records),
                    run_cpu_s=now_cpu - cpu,
                    duplicates=duplicates,
                    missing=missing,
                )
            )
            counters, cpu, start = now_counters, now_cpu, time.time()
            progress.end()
        return _MainRun(
            first_batch_s=first_batch_s,
            epochs=figures,
            states=states,
            state_error=state_error,
            seen=seen,
        )

    def peak_rss(self) -> int:
        """The largest peak resident memory of the rank processes."""
        peaks: list[int] = self._get([a.peak_rss_bytes.remote() for a in self.actors], "memory")
        return max(peaks)

    def resume(self, data: Dataset, main: _MainRun) -> _Resumed:
        """A pipeline resumed from the checkpoint, run to the end of the epoch: seconds from
        building it to the first batch on every rank and the ids it got wrong, or the
        reason it could not be measured."""
        states = main.states
        if self.contender.resume_unsupported is not None:
            return _Resumed(None, self.contender.resume_unsupported)
        if main.state_error is not None:
            return _Resumed(None, f"state_dict() at the checkpoint failed: {main.state_error}")
        if any(s is None for s in states):
            return _Resumed(None, "no checkpoint was taken in epoch 1 (epoch too short)")
        self._restart()  # before the clock: the imports are the warm-up's
        start = time.time()
        try:
            sources = self.contender.resume(data, states)
            spec = EpochSpec(batch_size=self.config.batch_size)
            records = self._epoch(sources, spec, f"resume at {RESUME_AT:.0%}")
        except Exception as e:
            return _Resumed(None, f"resuming from its state_dict() failed: {error_line(e)}")
        finally:
            with contextlib.suppress(Exception):
                self._close_loaders()
            self.contender.stop()
            if self.hung:  # the next phase would queue behind the call that hangs
                self._restart()
        firsts = [r.first_batch_at for r in records]
        if any(f is None for f in firsts):
            return _Resumed(None, "a rank received no batch after resuming")
        ids = np.concatenate([*main.seen, *(r.ids for r in records)])
        duplicates, missing = _check(ids, data.rows)
        first = max(f for f in firsts if f is not None) - start
        note = None
        if duplicates or missing:  # what the next look needs: the states the ranks loaded
            rows = [int(r.ids.size) for r in records]
            note = f"rows after the resume per rank {rows}; the states loaded: {_shown(states)}"
        return _Resumed(first, note, duplicates=duplicates, missing=missing)

    def quality(self, data: Dataset) -> tuple[float, int, int]:
        """Mean full-batch label entropy over ``data``, duplicates and missing ids."""
        spec = EpochSpec(
            batch_size=self.config.batch_size, label_column="label", labels=data.labels or 0
        )
        with self.closing():
            records = self._epoch(self.contender.start(data), spec, "shuffle quality")
        entropies = [e for r in records for e in r.entropies]
        if not entropies:
            raise RuntimeError("no full batch in the shuffle-quality epoch")
        duplicates, missing = _check_ids(records, data.rows)
        return float(np.mean(entropies)), duplicates, missing

    def kill(self) -> None:
        """End the rank processes, then remove what they left in their temporary directory."""
        _stop(self.actors, 0.0 if self.hung else EXIT_WAIT_S)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def measure(
    entry: Entry,
    config: BenchConfig,
    proxy: CountingProxy,
    datasets: tuple[Dataset, Dataset],
    progress: PhaseListener,
) -> Measured:
    """Run ``entry`` through every phase (see the module docstring).

    Args:
        entry: The contender.
        config: The run's settings.
        proxy: The counting proxy every contender reads through.
        datasets: The main and the labeled dataset.
        progress: Told as each phase begins and ends.

    Returns:
        What was measured.
    """
    main, labeled = datasets
    contender = entry.build(config)
    convert_s = convert_cpu_s = 0.0
    read_note: str | None = None
    if isinstance(contender, Converter):
        read_note = contender.read_note
        progress.begin("converting")
        cpu, start = conversion_cpu_seconds(), time.perf_counter()
        contender.convert(main)
        convert_s = time.perf_counter() - start
        convert_cpu_s = conversion_cpu_seconds() - cpu
        contender.convert(labeled)
    run = _Run(contender, entry, config, proxy)
    try:
        progress.begin("epoch 1")
        with run.closing():
            done = run.main(main, progress)
            rss = run.peak_rss()
        measured = Measured(
            ranks=contender.ranks,
            first_batch_s=done.first_batch_s,
            epochs=done.epochs,
            rank_peak_rss_bytes=rss,
            convert_s=convert_s,
            convert_cpu_s=convert_cpu_s,
            read_note=read_note,
        )
        progress.begin(f"resume at {RESUME_AT:.0%}")
        try:
            resumed = run.resume(main, done)
            measured.resume_first_batch_s = resumed.first_batch_s
            measured.resume_note = resumed.note
            measured.resume_duplicates = resumed.duplicates
            measured.resume_missing = resumed.missing
        except Exception as e:
            measured.resume_note = f"resume failed: {error_line(e)}"
        progress.end()
        progress.begin("shuffle quality")
        entropy, duplicates, missing = run.quality(labeled)
        measured.mean_entropy = entropy
        measured.quality_duplicates, measured.quality_missing = duplicates, missing
        progress.end()
        return measured
    finally:
        run.kill()
        contender.stop()
