"""The consumer every contender feeds, and the rank process it runs in.

Each rank of each contender runs in a :class:`RankActor`: a Ray actor process that reserves
no CPU (the trainer's place; readers and decoders run wherever the contender puts them).
The actor opens the contender's :class:`RankSource` there, and :func:`consume` runs one
epoch: it touches every tensor of every batch (a sum), counts rows and tensor bytes, keeps
a copy of each batch's ids (to check exactly-once across ranks) and, on labeled data, the
label entropy of each full batch. CPU seconds are those of the rank process (all its
threads, not its child processes), from ``getrusage``; the consumer's own share (the loop
body's thread CPU time) is kept apart, so the loader's CPU in the rank is the rest.
"""

from __future__ import annotations

import importlib
import os
import resource
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import ray
import torch

from ingest.tools.bench.contenders import Loader, RankSource
from ingest.tools.bench.quality import batch_entropy


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochSpec:
    """What the consumer does with one epoch.

    Attributes:
        batch_size: Rows in a full batch.
        id_column: The column of unique row ids.
        label_column: The column whose per-batch entropy is measured; None skips it.
        labels: Distinct labels in ``label_column``.
        checkpoint_after: Take the loader's state after this many batches; None: never.
    """

    batch_size: int
    id_column: str = "id"
    label_column: str | None = None
    labels: int = 0
    checkpoint_after: int | None = None


@dataclass(slots=True, kw_only=True)
class EpochRecord:
    """What one rank saw in one epoch (times are ``time.time()`` of this machine)."""

    rank: int
    started_at: float
    first_batch_at: float | None
    ended_at: float
    rows: int
    batches: int
    tensor_bytes: int
    cpu_s: float
    consumer_cpu_s: float
    ids: npt.NDArray[np.int64]
    entropies: list[float] = field(default_factory=list)
    state: Any = None
    state_error: str | None = None


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rows(value: Any) -> int:
    return int(value.shape[0]) if isinstance(value, torch.Tensor) else len(value)


def consume(loader: Loader, rank: int, spec: EpochSpec, started_at: float) -> EpochRecord:
    """Run one epoch of ``loader`` through the consumer.

    Args:
        loader: The rank's loader, opened.
        rank: This rank.
        spec: What to measure.
        started_at: When the epoch began (before the loader was opened, if it was now).

    Returns:
        The epoch's record.
    """
    cpu0 = cpu_seconds()
    first: float | None = None
    rows = batches = nbytes = 0
    ids: list[npt.NDArray[np.int64]] = []
    entropies: list[float] = []
    state: Any = None
    state_error: str | None = None
    consumer_cpu = 0.0
    for batch in loader.epoch():
        if first is None:
            first = time.time()
        body = time.thread_time()
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.sum()  # touch every element, as a training step would
                nbytes += value.element_size() * value.nelement()
        n = _rows(batch[spec.id_column])
        rows += n
        batches += 1
        ids.append(np.array(batch[spec.id_column], dtype=np.int64, copy=True))
        if spec.label_column is not None and n == spec.batch_size:
            labels = np.asarray(batch[spec.label_column], dtype=np.int64)
            entropies.append(batch_entropy(labels, spec.labels))
        consumer_cpu += time.thread_time() - body
        if spec.checkpoint_after == batches:
            try:
                state = loader.state_dict()
            except Exception as e:
                state_error = f"{type(e).__name__}: {e}"
    return EpochRecord(
        rank=rank,
        started_at=started_at,
        first_batch_at=first,
        ended_at=time.time(),
        rows=rows,
        batches=batches,
        tensor_bytes=nbytes,
        cpu_s=cpu_seconds() - cpu0,
        consumer_cpu_s=consumer_cpu,
        ids=np.concatenate(ids) if ids else np.empty(0, dtype=np.int64),
        entropies=entropies,
        state=state,
        state_error=state_error,
    )


def error_line(error: BaseException) -> str:
    """``error`` as one line: its type and message, without frames.

    Errors that carry a traceback of another process in their message (torch DataLoader
    workers, Ray tasks) keep their first line and the last line of that traceback.
    """
    text = "".join(traceback.format_exception_only(type(error), error)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return text
    return f"{lines[0]} ... {lines[-1]}"


class _RankActor:
    """One rank's process: opens the contender's loader and consumes its epochs."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.loader: Loader | None = None

    def warm(self, modules: tuple[str, ...], temp_dir: str) -> int:
        """Import the contender's modules before any timing starts; returns the pid.

        This process and its children make their temporary files in ``temp_dir``, which the
        run removes after its rank processes ended: a peer leaves files there (Mosaic its
        file locks; LitData's loader workers, stopped by torch's ``terminate`` when they do
        not exit within 5 s, their ``pymp-*`` directories). The ranks of one run share it, as
        Mosaic's ranks share their locks there.
        """
        os.environ["TMPDIR"] = temp_dir  # for the children (a spawned worker starts anew)
        tempfile.tempdir = temp_dir
        for name in modules:
            importlib.import_module(name)
        return os.getpid()

    def run_epoch(self, source: RankSource | None, spec: EpochSpec) -> EpochRecord:
        """Open ``source`` (if given: the first epoch) and consume one epoch."""
        started = time.time()
        cpu0 = cpu_seconds()
        if source is not None:
            self.close()
            self.loader = source.open()
        if self.loader is None:
            raise RuntimeError(f"rank {self.rank} has no loader; send a source first")
        opened_cpu = cpu_seconds() - cpu0
        record = consume(self.loader, self.rank, spec, started)
        record.cpu_s += opened_cpu
        return record

    def peak_rss_bytes(self) -> int:
        """This process's peak resident memory so far."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def close(self) -> None:
        """Close the loader, if any."""
        if self.loader is not None:
            loader, self.loader = self.loader, None
            loader.close()

    def exit(self) -> None:
        """Close, then end this process as an interpreter ends, its exit handlers run: Mosaic
        unlinks its shared memory in one (``ray.kill`` runs none: every run left its
        segments in ``/dev/shm``). The caller sees the actor die (``RayActorError``)."""
        self.close()
        ray.actor.exit_actor()  # type: ignore[no-untyped-call]


# The actor class; ray.remote on a class is opaque to type checkers, hence Any.
RankActor: Any = ray.remote(num_cpus=0)(_RankActor)
