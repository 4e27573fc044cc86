"""The ack ledger: what each rank consumed, step by step. Pure.

Ranks report the rows of each batch they handed to the training loop, tagged with the
global step of that batch, a few batches per message. A snapshot for step S holds exactly
the rows of steps <= S of every rank, whatever ranks consumed beyond S, so a checkpoint
saved at step S resumes at step S + 1 on every rank.

A shuffled batch's rows are scattered (about one run per row), so merging them means
sorting an integer per row: 20,000 acks of 1,024 rows a second on one core. Batches are cut
from shuffle windows in order, and the batch that finishes a window says so with the
window's rows as a few runs (:class:`Closed`); a fold then merges whole windows from those
runs and sorts only the rows of a window still open at its step, none on a window's edge
(:meth:`Ledger.edge`, where the coordinator folds).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingest.core.intervals import union
from ingest.core.quarantine import Quarantined

Run = tuple[int, int, int, int]
"""``(segment, shard, start, stop)``: rows of a shard consumed by one batch; segments are
:data:`ingest.core.assign.CARRY` and :data:`ingest.core.assign.MAIN`."""

Runs = npt.NDArray[np.int64]
"""Runs as an ``(n, 4)`` int64 array, one :data:`Run` per row. A shuffled batch has about
one run per row, so runs travel and fold as arrays, never as Python tuples."""

_NO_RUNS: Runs = np.zeros((0, 4), dtype=np.int64)


def as_runs(runs: Runs | Iterable[Run]) -> Runs:
    """``runs`` as an ``(n, 4)`` int64 array."""
    arr = np.asarray(runs if isinstance(runs, np.ndarray) else list(runs), dtype=np.int64)
    return arr.reshape(-1, 4) if arr.size else _NO_RUNS


@dataclass(frozen=True, slots=True)
class Closed:
    """The shuffle windows one step finished, for a fold that need not sort their rows.

    A feed cuts batches from consecutive windows. Once a step has taken a window's last
    position, the rows of the steps up to it that came from that window are exactly the
    window's rows, a few runs (one per piece the lanes read), so a fold up to such a step
    adds those runs instead of sorting a packed integer per row. Only the rows of a window
    still open at the fold's step are sorted: at most a window per rank, none when the fold
    falls on a window's edge (:meth:`Ledger.edge`).

    A window's runs may include rows consumed before the window was read (a resume leaves
    them out of the window's positions): they are in the progress already, and adding
    them again changes nothing.
    """

    runs: Runs
    """Every row of the windows whose last position this step took (none: empty)."""
    open: int
    """The step's last ``open`` packed rows are of a window still open after it; the rows
    before them are all in ``runs`` (or in windows an earlier step finished)."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """The rows one rank consumed at one step.

    ``rows`` is the number delivered when the batch held quarantined rows (-1: a full
    batch), and ``quarantined`` the quarantines recorded since the step before
    (``ReadOptions(on_error="skip")``).
    """

    step: int
    runs: Runs | Rows | tuple[Run, ...]
    """The rows as runs, or as packed rows (1-d; see :func:`pack_rows`)."""
    rows: int = -1
    quarantined: tuple[Quarantined, ...] = ()
    closed: Closed | None = None
    """The windows the step finished, when ``runs`` are packed rows (None: not known, and
    a fold sorts the step's rows)."""


class Ledger:
    """Per-rank step records since the last fold.

    The runs of a shuffled batch are about a row each. Each ack message is packed as it
    arrives, in one numpy pass over its records: every row becomes one integer
    ``(segment, shard, row)`` (:func:`pack_rows`), so that a fold, which may have to answer a
    snapshot while the ranks wait, only sorts them. Runs that do not pack (long runs, rows or
    shards beyond the packed range) are kept as they came.

    Args:
        world_size: Number of ranks that ack.
        first_step: The step the ranks start at; steps before it are already folded.
    """

    def __init__(self, world_size: int, first_step: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        self.world_size = world_size
        self._records: list[dict[int, Runs | Rows]] = [{} for _ in range(world_size)]
        self._closed: list[dict[int, Closed]] = [{} for _ in range(world_size)]
        """Per rank, the :class:`Closed` of the steps that carry one."""
        self._acked = [first_step - 1] * world_size
        self._merged: tuple[int, int, tuple[Runs, ...]] | None = None
        """The last answer of :meth:`runs_by_rank`."""

    def ack(self, rank: int, records: Iterable[StepRecord]) -> None:
        """Record steps of ``rank``, each once, in any order (messages may overtake).

        Raises:
            ValueError: On an unknown rank, or a step recorded twice (a replay).
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size {self.world_size}")
        mine = self._records[rank]
        records = list(records)
        steps = [record.step for record in records]
        seen: set[int] = set()
        for step in steps:
            if step <= self._acked[rank] or step in mine or step in seen:
                raise ValueError(
                    f"rank {rank} acked step {step} twice; each step's rows are consumed once"
                )
            seen.add(step)
        closed = self._closed[rank]
        for record, entry in zip(records, pack_rows([r.runs for r in records]), strict=True):
            mine[record.step] = entry
            if record.closed is not None and entry.ndim == 1:
                closed[record.step] = record.closed
        if self._merged is not None and steps and min(steps) <= self._merged[1]:
            self._merged = None
        while self._acked[rank] + 1 in mine:
            self._acked[rank] += 1

    def has(self, rank: int, step: int) -> bool:
        """Whether ``rank`` acked ``step`` (folded steps included)."""
        return step <= self._acked[rank] or step in self._records[rank]

    def acked(self, rank: int) -> int:
        """The last step up to which ``rank`` acked every step (``first_step - 1`` before)."""
        return self._acked[rank]

    def ready(self, step: int) -> bool:
        """Whether every rank acked ``step``."""
        return min(self._acked) >= step

    def runs(self, first: int, last: int) -> Runs:
        """Rows of steps ``first..last`` of every rank that are not folded yet.

        Returns:
            :meth:`runs_by_rank` one after the other (read-only).
        """
        parts = self.runs_by_rank(first, last)
        if not parts:
            return _NO_RUNS
        merged = parts[0] if len(parts) == 1 else np.concatenate(parts)
        merged.setflags(write=False)
        return merged

    def runs_by_rank(self, first: int, last: int) -> tuple[Runs, ...]:
        """Rows of steps ``first..last`` that are not folded yet, one array per rank that
        acked any, each merged (:func:`merge_runs`: sorted, disjoint runs, one per stretch
        of consecutive rows).

        The acked runs of a shuffled window are about one row each; merged, the window's
        rows are a few runs per shard. Each rank is merged on its own, in arrays that fit
        in the cache; ranks read distinct rows (shards cut between two shares aside), so
        the caller adds rank after rank. Read-only: the answer is kept until the next ack or
        fold, for the same question (a snapshot asks, then the fold asks again).
        """
        if self._merged is not None and self._merged[:2] == (first, last):
            return self._merged[2]
        parts = []
        for per_rank, closed in zip(self._records, self._closed, strict=True):
            merged = _merge_entries(_entries(per_rank, closed, first, last))
            if len(merged):
                merged.setflags(write=False)
                parts.append(merged)
        self._merged = (first, last, tuple(parts))
        return self._merged[2]

    def edge(self, first: int, last: int) -> int:
        """The last step of ``first..last`` that finished a window of every rank with no
        row of an open window (:class:`Closed`), or ``last`` when there is none.

        A fold up to such a step merges every rank's rows as window runs, with no sort: the
        steady fold of a stream whose windows are whole batches, as every rank's are.
        """
        common: set[int] | None = None
        for closed in self._closed:
            edges = {s for s, c in closed.items() if first <= s <= last and not c.open}
            common = edges if common is None else common & edges
            if not common:
                return last
        return max(common) if common else last

    def due(self, folded: int, every: int) -> int | None:
        """The step to fold up to next, once every rank acked ``every`` steps past
        ``folded`` (the last step folded): the last window edge (:meth:`edge`) of those
        steps, or the last of them when none is one. None: not yet."""
        low = min(self._acked)
        return None if low - folded < every else self.edge(folded + 1, low)

    def fold(self, step: int) -> None:
        """Forget steps ``<= step``: the caller has kept what it needs of them."""
        if not self.ready(step):
            raise ValueError(f"cannot fold step {step}: not every rank acked it")
        for per_rank, closed in zip(self._records, self._closed, strict=True):
            for s in [s for s in per_rank if s <= step]:
                del per_rank[s]
                closed.pop(s, None)
        self._merged = None


Rows = npt.NDArray[np.int64]
"""The rows of one step as packed integers (:func:`pack_rows`), one per row, in no order."""

_ROW_BITS = 31
_ROW_MASK = (1 << _ROW_BITS) - 1
_SEGMENT_SHIFT = 2 * _ROW_BITS
"""Packed row: ``segment << 62 | shard << 31 | row``; shards and rows below 2**31 - 1."""
_PACK_FROM_RUNS = 256
"""Messages of fewer runs are kept as they came (a few long runs: nothing to gain)."""


def packed_row(segment: int, shard: int, row: int) -> int:
    """One row as a packed row (``segment << 62 | shard << 31 | row``), as the feed's
    provenance gives it."""
    return segment << _SEGMENT_SHIFT | shard << _ROW_BITS | row


def unpacked_row(value: int) -> tuple[int, int, int]:
    """``(segment, shard, row)`` of a packed row (:func:`packed_row`)."""
    return value >> _SEGMENT_SHIFT, (value >> _ROW_BITS) & _ROW_MASK, value & _ROW_MASK


def pack_base(
    segments: npt.NDArray[np.int64],
    shards: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    last_row: int,
) -> Rows | None:
    """Per piece of rows, what its row's *key* adds to for the packed row, if they pack.

    A piece is rows ``key + offsets[p]`` of ``(segments[p], shards[p])`` (the feed's window
    keys); its packed rows are ``base[p] + key``: one gather and one add per row, instead of
    a sort into runs that :func:`pack_rows` expands again. None when a segment is not 0 or
    1, or a shard or a row (``last_row``: the largest) reaches ``2**31 - 1``.
    """
    if not len(shards):
        return np.zeros(0, dtype=np.int64)
    if (
        int(segments.min()) < 0
        or int(segments.max()) > 1
        or int(shards.min()) < 0
        or int(shards.max()) >= _ROW_MASK
        or last_row >= _ROW_MASK
    ):
        return None
    return (segments << _SEGMENT_SHIFT) + (shards << _ROW_BITS) + offsets


def runs_of_entry(entry: Runs | Rows | Sequence[Run]) -> Runs:
    """The rows of a step's entry (runs, or packed rows) as merged runs."""
    if isinstance(entry, np.ndarray) and entry.ndim == 1:
        return _runs_of_rows(np.sort(entry))
    return merge_runs(as_runs(entry))


def pack_rows(steps: Sequence[Runs | Rows | Sequence[Run]]) -> list[Runs | Rows]:
    """Each step's runs as packed rows (a 1-d array), when they pack; else as runs (2-d).

    All steps are packed in one pass over their runs together. They pack when they hold
    :data:`_PACK_FROM_RUNS` runs or more, of at most two rows each on average (a shuffled
    batch: about one), their segments are 0 or 1, and shards and rows stay below
    ``2**31 - 1``; then consecutive rows of one shard are consecutive integers. A step given
    as packed rows already (1-d, from the feed: :func:`pack_base`) is kept as it is.
    """
    given = [s for s in steps if isinstance(s, np.ndarray) and s.ndim == 1]
    if given:
        packed = iter(
            pack_rows([s for s in steps if not (isinstance(s, np.ndarray) and s.ndim == 1)])
        )
        return [s if isinstance(s, np.ndarray) and s.ndim == 1 else next(packed) for s in steps]
    arrays = [as_runs(runs) for runs in steps]
    if sum(len(a) for a in arrays) < _PACK_FROM_RUNS:
        return list(arrays)
    arr = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    columns = np.ascontiguousarray(arr.T)  # segment, shard, start, stop: each contiguous
    segment, shard, start, stop = columns
    low, high = columns.min(axis=1).tolist(), columns.max(axis=1).tolist()
    lengths = stop - start
    shortest, longest = int(lengths.min()), int(lengths.max())
    single = shortest == longest == 1
    total = len(arr) if single else int(lengths.sum())
    if (
        total > 2 * len(arr)
        or min(shortest, low[0], low[1], low[2]) < 0
        or high[0] > 1
        or max(high[1], high[3]) >= _ROW_MASK
    ):
        return list(arrays)
    rows = shard << _ROW_BITS
    if high[0]:
        rows |= segment << _SEGMENT_SHIFT
    rows += start
    ends = np.cumsum([len(a) for a in arrays])[:-1]  # where each step's runs begin
    if not single:  # runs of more (or no) rows: one value per row
        firsts = np.cumsum(lengths) - lengths
        rows = np.repeat(rows - firsts, lengths)
        rows += np.arange(total, dtype=np.int64)
        ends = np.append(firsts, total)[ends]
    return list(np.split(rows, ends))


def _entries(
    records: dict[int, Runs | Rows], closed: dict[int, Closed], first: int, last: int
) -> list[Runs | Rows]:
    """The rows of one rank's steps ``first..last``, as few as cover them: the runs of the
    windows they finished, then the packed rows of the window still open (see
    :class:`Closed`). Every step's own rows when a step in the range carries no
    :class:`Closed`."""
    steps = sorted(s for s in records if first <= s <= last)
    known = all(s in closed for s in steps)
    edges = [s for s in steps if len(closed[s].runs)] if known else []
    if not edges:
        return [records[s] for s in steps if len(records[s])]
    edge = edges[-1]
    out: list[Runs | Rows] = [closed[s].runs for s in edges]
    still = closed[edge].open
    if still:
        out.append(records[edge][len(records[edge]) - still :])
    out.extend(records[s] for s in steps if s > edge and len(records[s]))
    return out


def _merge_entries(entries: Sequence[Runs | Rows]) -> Runs:
    """The rows of ``entries`` (packed rows and runs) merged as :func:`merge_runs` does."""
    if not entries:
        return _NO_RUNS
    rows = [e for e in entries if e.ndim == 1]
    runs = [e for e in entries if e.ndim == 2]
    parts = []
    if rows:
        values = np.concatenate(rows) if len(rows) > 1 else rows[0].copy()
        values.sort()
        parts.append(_runs_of_rows(values))
    if runs:
        parts.append(merge_runs(np.concatenate(runs) if len(runs) > 1 else runs[0]))
    return merge_runs(np.concatenate(parts)) if len(parts) > 1 else parts[0]


def _runs_of_rows(values: Rows) -> Runs:
    """Runs of sorted packed rows: one per stretch of consecutive rows of a shard."""
    if not len(values):
        return _NO_RUNS
    # A new run wherever a row does not follow the one before (repeats stay in).
    heads = np.flatnonzero(values[1:] - values[:-1] > 1) + 1
    starts = values[np.concatenate(([0], heads))]
    stops = values[np.concatenate((heads - 1, [len(values) - 1]))]
    out = np.empty((len(starts), 4), dtype=np.int64)
    out[:, 0] = starts >> _SEGMENT_SHIFT
    out[:, 1] = (starts >> _ROW_BITS) & _ROW_MASK
    out[:, 2] = starts & _ROW_MASK
    out[:, 3] = (stops & _ROW_MASK) + 1
    return out


def merge_runs(runs: Runs | Iterable[Run]) -> Runs:
    """The rows of ``runs`` as sorted, disjoint, non-touching runs.

    Sorted by ``(segment, shard, start)``; overlapping and touching runs of one segment and
    shard become one; empty runs go. With ``(segment, shard, row)`` packed into one int64
    (always, unless rows reach beyond 2**40 or so), this is two value sorts, much faster
    than sorting the runs themselves; one sort of the rows when runs are about a row each
    (a shuffled batch).
    """
    arr = as_runs(runs)
    if not len(arr):
        return _NO_RUNS
    segment, shard, start, stop = np.ascontiguousarray(arr.T)  # columns, each contiguous
    lengths = stop - start
    if int(lengths.min()) <= 0:
        keep = lengths > 0
        segment, shard, start, stop, lengths = (
            c[keep] for c in (segment, shard, start, stop, lengths)
        )
        if not len(lengths):
            return _NO_RUNS
    low_segment, high_segment = int(segment.min()), int(segment.max())
    one_segment = low_segment == high_segment
    row_bits = int(stop.max()).bit_length()
    shard_bits = int(shard.max()).bit_length()
    segment_bits = 0 if one_segment else high_segment.bit_length()
    if (
        min(low_segment, int(shard.min()), int(start.min())) < 0
        or segment_bits + shard_bits + row_bits > 63
    ):
        order = np.lexsort((start, shard, segment))
        return _merge_sorted(np.stack((segment, shard, start, stop), axis=1)[order])
    # Fresh arrays of (segment, shard, start) and (segment, shard, stop) packed, sorted in
    # place: the fewest passes over runs that may number tens of millions. Rows stay below
    # 2**row_bits - 1, so consecutive packed values never span two shards.
    lo = shard << row_bits
    if not one_segment:
        lo |= segment << (shard_bits + row_bits)
    total = int(lengths.sum())
    if total <= 2 * len(lengths):
        # About a row per run (a shuffled batch): every row packed, one sort.
        lo += start
        if total > len(lengths):
            lo = np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)
            lo += np.arange(total, dtype=np.int64)
        lo.sort()
        # A new run wherever a row does not follow the one before (repeats stay in).
        heads = np.flatnonzero(lo[1:] - lo[:-1] > 1) + 1
        starts = lo[np.concatenate(([0], heads))]
        stops = lo[np.concatenate((heads - 1, [len(lo) - 1]))] + 1
    else:
        hi = lo + stop
        lo += start
        starts, stops = union(lo, hi, in_place=True)
    key = starts >> row_bits
    out = np.empty((len(starts), 4), dtype=np.int64)
    out[:, 0] = low_segment if one_segment else key >> shard_bits
    out[:, 1] = key & ((1 << shard_bits) - 1)
    base = key << row_bits
    out[:, 2] = starts - base
    out[:, 3] = stops - base
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
