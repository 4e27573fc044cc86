"""Provenance: which rows each rank's step consumed, kept beside a run's states. Pure.

A state says what an epoch consumed, not which step consumed what; a rank's acks do, step by
step (:class:`~ingest.core.ledger.StepRecord`), and the book forgets them at each fold. A
stream given ``provenance=URL`` keeps them first: its book hands every rank's acked steps to
a :class:`StepLog` (:mod:`ingest.engine.provenance` writes them at the URL), so that a step
can be looked up long after, whatever the transport and the world size.

Why a log and not a recomputation from the states: a step's rows are a pure function of the
plan only while every unit's row count is known and no stage drops rows; a JSONL shard's row
count is learnt by reading, and a filter's survivors by running it. A log holds what the
ranks were handed: about 3.5 bytes a row of a shuffled batch after compression
(``benchmarks/provenance.py``).

*Packing.* With ``pack=``, a step is a batch of sequences (the user's step), not a read
step: the rank's pack node logs each batch's pieces (:data:`BatchPieces`: which tokens of
which row went into which sequence) through its loop, with the read steps it acks, and the
book passes them on in place of the read steps. The steps count the batches handed out
since the run began (:class:`ingest.engine.pack.StepCount`), and a state keeps the count
(``pack.steps``) for the attempt that loads it.

*Attempts.* A run that stops and resumes from an earlier state hands out the steps after
that state again (at another world size, other rows). Each book is one attempt, starting at
the step of the state it loaded (0 for a fresh run). For a step, the attempt that counts is
the one started last among those that start at or before it (:func:`authoritative`): a
resume supersedes whatever earlier attempts did from its first step on, including steps it
has not reached yet (they were handed out by an attempt that was then rolled back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ingest.core.ledger import Rows, Run, Runs, unpacked_row

StepRows = npt.NDArray[np.int64]
"""A step's rows as ``(shard, start, stop)`` runs, ``(n, 3)`` int64, in the order the batch
held them where the rank told it (packed rows), else sorted by shard and row; for a packing
stream's batch, its pieces (:func:`step_pieces`)."""
BatchPieces = tuple[int, int, npt.NDArray[np.int64]]
"""A packing rank's batch for the log: its step (the rank's batches since the run began),
the read step its last document came in (whose epoch it is of), and its pieces
``(sequence, shard, row, token start, token stop)``."""
PIECE_WIDTH = 6
"""Columns of a packed batch's :data:`StepRows`: ``(shard, row, row + 1, sequence, token
start, token stop)``."""


class StepLog(Protocol):
    """What a book tells a provenance log (:class:`ingest.engine.provenance.ProvenanceWriter`)."""

    def start(self, first_step: int, world_size: int) -> None:
        """An attempt begins at ``first_step`` (a fresh book: 0; a loaded state: its step)."""
        ...

    def record(
        self, rank: int, epoch: int, urls: Sequence[str], steps: Sequence[tuple[int, StepRows]]
    ) -> None:
        """``rank`` was handed ``steps`` (``(step, rows)``) of ``epoch``, whose listing's
        shard ``i`` is ``urls[i]``."""
        ...

    def flush(self, *, wait: bool = True) -> None:
        """Write what is held; ``wait``: before returning (a state taken after this covers
        every step logged), else behind the caller (a fold, on the training loop's path)."""
        ...


def step_rows(entry: Runs | Rows | Sequence[Run]) -> StepRows:
    """The rows of one acked step (packed rows, or ``(segment, shard, start, stop)`` runs)
    as ``(shard, start, stop)`` runs, consecutive rows of a shard merged, order kept.

    The segment is left out: it tells which ledger a row is counted in (carried in from the
    epoch before, or the epoch's own), not which row it is.
    """
    if isinstance(entry, np.ndarray) and entry.ndim == 1:
        if not len(entry):
            return np.zeros((0, 3), dtype=np.int64)
        _, shard, row = unpacked_row(entry.astype(np.int64))  # type: ignore[arg-type]
        return _merged(np.asarray(shard, dtype=np.int64), np.asarray(row, dtype=np.int64))
    runs = np.asarray(entry if isinstance(entry, np.ndarray) else list(entry), dtype=np.int64)
    if not runs.size:
        return np.zeros((0, 3), dtype=np.int64)
    return np.ascontiguousarray(runs.reshape(-1, 4)[:, 1:])


def step_pieces(pieces: npt.NDArray[np.int64]) -> StepRows:
    """A packed batch's pieces, ``(sequence, shard, row, token start, token stop)`` as
    ``Pack(provenance=True)`` gives them, as the rows its log keeps (:data:`PIECE_WIDTH`)."""
    p = np.asarray(pieces, dtype=np.int64).reshape(-1, 5)
    return np.stack([p[:, 1], p[:, 2], p[:, 2] + 1, p[:, 0], p[:, 3], p[:, 4]], axis=1)


def _merged(shard: npt.NDArray[np.int64], row: npt.NDArray[np.int64]) -> StepRows:
    """Rows in order to runs: a run goes on while the next row is the same shard's next."""
    cut = np.nonzero((np.diff(row) != 1) | (np.diff(shard) != 0))[0] + 1
    starts = np.concatenate(([0], cut))
    stops = np.concatenate((cut, [len(row)]))
    return np.stack([shard[starts], row[starts], row[stops - 1] + 1], axis=1)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One book's part of a run: it handed out steps from ``first_step`` on.

    Attributes:
        name: Unique among the log's attempts (its start time and a random part).
        first_step: The first step it handed out (the loaded state's step; 0 fresh).
        started_ns: When it started (``time.time_ns()`` where its book lives).
        world_size: Its ranks.
    """

    name: str
    first_step: int
    started_ns: int
    world_size: int


def authoritative(attempts: Sequence[Attempt], step: int) -> Attempt | None:
    """The attempt whose record of ``step`` is the run's: the last started of those whose
    first step is at or before ``step`` (see the module docstring). None: no attempt
    reached that far back."""
    eligible = [a for a in attempts if a.first_step <= step]
    if not eligible:
        return None
    return max(eligible, key=lambda a: (a.started_ns, a.name))


__all__ = [
    "PIECE_WIDTH",
    "Attempt",
    "BatchPieces",
    "StepLog",
    "StepRows",
    "authoritative",
    "step_pieces",
    "step_rows",
]
