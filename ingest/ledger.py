"""The ack ledger: what each rank consumed, step by step. Pure.

Ranks report the rows of each batch they handed to the training loop, tagged with the
global step of that batch, a few batches per message. A snapshot for step S holds exactly
the rows of steps <= S of every rank, whatever ranks consumed beyond S, so a checkpoint
saved at step S resumes at step S + 1 on every rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingest.intervals import union

Run = tuple[int, int, int, int]
"""``(segment, shard, start, stop)``: rows of a shard consumed by one batch; segments are
:data:`ingest.assign.CARRY` and :data:`ingest.assign.MAIN`."""

Runs = npt.NDArray[np.int64]
"""Runs as an ``(n, 4)`` int64 array, one :data:`Run` per row. A shuffled batch has about
one run per row, so runs travel and fold as arrays, never as Python tuples."""

_NO_RUNS: Runs = np.zeros((0, 4), dtype=np.int64)


def as_runs(runs: Runs | Iterable[Run]) -> Runs:
    """``runs`` as an ``(n, 4)`` int64 array."""
    arr = np.asarray(runs if isinstance(runs, np.ndarray) else list(runs), dtype=np.int64)
    return arr.reshape(-1, 4) if arr.size else _NO_RUNS


@dataclass(frozen=True, slots=True)
class StepRecord:
    """The rows one rank consumed at one step."""

    step: int
    runs: Runs | tuple[Run, ...]


class Ledger:
    """Per-rank step records since the last fold.

    Args:
        world_size: Number of ranks that ack.
        first_step: The step the ranks start at; steps before it are already folded.
    """

    def __init__(self, world_size: int, first_step: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        self.world_size = world_size
        self._records: list[dict[int, Runs]] = [{} for _ in range(world_size)]
        self._acked = [first_step - 1] * world_size
        self._merged: tuple[int, int, Runs] | None = None
        """The last answer of :meth:`runs` (a snapshot asks, then the fold asks again)."""

    def ack(self, rank: int, records: Iterable[StepRecord]) -> None:
        """Record steps of ``rank``, each once, in any order (messages may overtake).

        Raises:
            ValueError: On an unknown rank, or a step recorded twice (a replay).
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size {self.world_size}")
        mine = self._records[rank]
        for record in records:
            if record.step <= self._acked[rank] or record.step in mine:
                raise ValueError(
                    f"rank {rank} acked step {record.step} twice; each step's "
                    "rows are consumed once"
                )
            mine[record.step] = as_runs(record.runs)
            if self._merged is not None and record.step <= self._merged[1]:
                self._merged = None
        while self._acked[rank] + 1 in mine:
            self._acked[rank] += 1

    def acked(self, rank: int) -> int:
        """The last step up to which ``rank`` acked every step (``first_step - 1`` before)."""
        return self._acked[rank]

    def ready(self, step: int) -> bool:
        """Whether every rank acked ``step``."""
        return min(self._acked) >= step

    def runs(self, first: int, last: int) -> Runs:
        """Rows of steps ``first..last`` of every rank that are not folded yet, merged.

        Returns:
            The rows as :func:`merge_runs` gives them: sorted, disjoint runs, one per
            stretch of consecutive rows (the acked runs of a shuffled window are about one
            row each; merged, the window's rows are a few runs per shard). Read-only: the
            answer is kept until the next ack or fold, for the same question.
        """
        if self._merged is not None and self._merged[:2] == (first, last):
            return self._merged[2]
        parts = [
            runs
            for per_rank in self._records
            for s, runs in per_rank.items()
            if first <= s <= last and len(runs)
        ]
        merged = merge_runs(np.concatenate(parts)) if parts else _NO_RUNS
        merged.setflags(write=False)
        self._merged = (first, last, merged)
        return merged

    def fold(self, step: int) -> None:
        """Forget steps ``<= step``: the caller has kept what it needs of them."""
        if not self.ready(step):
            raise ValueError(f"cannot fold step {step}: not every rank acked it")
        for per_rank in self._records:
            for s in [s for s in per_rank if s <= step]:
                del per_rank[s]
        self._merged = None


def merge_runs(runs: Runs | Iterable[Run]) -> Runs:
    """The rows of ``runs`` as sorted, disjoint, non-touching runs.

    Sorted by ``(segment, shard, start)``; overlapping and touching runs of one segment and
    shard become one; empty runs go. With ``(segment, shard, row)`` packed into one int64
    (always, unless rows reach beyond 2**40 or so), this is two value sorts, much faster
    than sorting the runs themselves.
    """
    arr = as_runs(runs)
    nonempty = arr[:, 3] > arr[:, 2]
    if not nonempty.all():
        arr = arr[nonempty]
    if not len(arr):
        return _NO_RUNS
    segment, shard, start, stop = (arr[:, i] for i in range(4))
    row_bits = int(stop.max()).bit_length()
    shard_bits = int(shard.max()).bit_length()
    packable = (
        int(segment.min()) >= 0
        and int(shard.min()) >= 0
        and int(start.min()) >= 0
        and int(segment.max()).bit_length() + shard_bits + row_bits <= 63
    )
    if not packable:
        return _merge_sorted(arr[np.lexsort((start, shard, segment))])
    # Two fresh arrays, (segment, shard, start) and (segment, shard, stop) packed, sorted in
    # place: the fewest passes over runs that may number tens of millions.
    lo = shard << row_bits
    if int(segment.max()):
        lo |= segment << (shard_bits + row_bits)
    hi = lo + stop
    lo += start
    starts, stops = union(lo, hi, in_place=True)
    key = starts >> row_bits
    out = np.empty((len(starts), 4), dtype=np.int64)
    out[:, 0] = key >> shard_bits
    out[:, 1] = key & ((1 << shard_bits) - 1)
    out[:, 2] = starts - (key << row_bits)
    out[:, 3] = stops - (key << row_bits)
    return out


def _merge_sorted(arr: Runs) -> Runs:
    """Merge non-empty runs sorted by (segment, shard, start)."""
    out: list[list[int]] = []
    for segment, shard, start, stop in arr.tolist():
        if out and out[-1][0] == segment and out[-1][1] == shard and start <= out[-1][3]:
            out[-1][3] = max(out[-1][3], stop)
        else:
            out.append([segment, shard, start, stop])
    return np.asarray(out, dtype=np.int64).reshape(-1, 4)


def runs_of(
    segments: npt.NDArray[np.int8], shards: npt.NDArray[np.int32], rows: npt.NDArray[np.int64]
) -> Runs:
    """Compact ``(segment, shard, start, stop)`` runs covering the given rows of a batch."""
    if len(rows) == 0:
        return _NO_RUNS
    order = np.lexsort((rows, shards, segments))
    seg, sh, rw = segments[order], shards[order], rows[order]
    breaks = np.nonzero((np.diff(rw) != 1) | (np.diff(sh) != 0) | (np.diff(seg) != 0))[0] + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(rw)]))
    return np.stack(
        [seg[starts].astype(np.int64), sh[starts].astype(np.int64), rw[starts], rw[stops - 1] + 1],
        axis=1,
    )
