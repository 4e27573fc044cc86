"""Saved positions checked against the shares they resume. Pure.

A state's ``position`` (:class:`ingest.core.state.PositionState`) says where each rank's
reading order stood; its layout is checked where it is parsed. Whether it fits the plan it
resumes is checked here, where the book has made that plan again
(:meth:`ingest.core.book.EpochBook.load`): a position that does not fit would skip rows that
were never delivered, or read rows twice, so it is refused with the field, its value, the rule
and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.core.assign import CARRY, MAIN, TO_END, Span, Spans, deal_lanes
from ingest.core.errors import StateError
from ingest.core.intervals import IntervalSet
from ingest.core.keyed import covered
from ingest.core.state import FIX, refuse


def check_positions(
    shares: Sequence[Sequence[Span]],
    cursors: Sequence[Mapping[str, Any]],
    *,
    lanes: int,
    window: int,
    skip: tuple[Mapping[int, IntervalSet], Mapping[int, IntervalSet]],
    rows_left: int | None,
    urls: Sequence[str],
) -> None:
    """Refuse saved positions that do not fit the shares they resume (an edited state).

    A position (:data:`ingest.core.state.Cursor`) says where each lane of a rank stood when its
    window ``w`` began: ``w`` windows of ``window // lanes`` rows into every lane that had
    them, each lane at ``[span, row, ...]`` of its spans. Every row before those places was
    consumed (its windows were cut into batches), and the rows of the share not consumed are
    what the rank still reads. A position that breaks this would skip rows that were never
    delivered, or read rows twice.

    Args:
        shares: Each rank's spans in reading order (the epoch's original shares).
        cursors: Each rank's saved position.
        lanes: Lanes wanted (1 without a shuffle).
        window: Rows per shuffle window.
        skip: The rows consumed, per segment (``CARRY``, ``MAIN``) and shard.
        rows_left: Rows each rank still reads (None: row counts unknown).
        urls: The URL of each shard index (for messages).

    Raises:
        StateError: Naming the rank's field, its value, the rule and the fix.
    """
    for rank, (spans, cursor) in enumerate(zip(shares, cursors, strict=True)):
        arr = Spans.of(spans)
        finite = arr.stop < TO_END  # spans of shards whose row count is known
        before = _lane_positions(rank, arr, finite, cursor, lanes, window, urls)
        _check_consumed(rank, before, skip, urls)
        if rows_left is None or not bool(finite.all()):
            continue
        left = int(arr.lengths.sum()) - sum(
            int(_consumed(arr.take(np.flatnonzero(arr.segment == segment)), skip).sum())
            for segment in (CARRY, MAIN)
        )
        if left != rows_left:
            raise StateError(
                f"position.ranks[{rank}]: rank {rank} has {left} rows of its share not "
                f"consumed, but progress.step leaves it {rows_left} rows to read: the state "
                f"was edited or corrupted; {FIX}"
            )


def _lane_positions(
    rank: int,
    spans: Spans,
    finite: npt.NDArray[np.bool_],
    cursor: Mapping[str, Any],
    lanes: int,
    window: int,
    urls: Sequence[str],
) -> Spans:
    """Check one rank's position against its spans; return the rows before it."""
    dealt = deal_lanes(spans, lanes)
    per_lane = max(1, window // len(dealt))
    at = f"position.ranks[{rank}]"
    w, saved = cursor["window"], cursor["lanes"]
    if len(saved) != len(dealt):
        raise StateError(
            f"{at}.lanes holds {len(saved)} lane(s), but rank {rank}'s share is read in "
            f"{len(dealt)} (shuffle_lanes={lanes}, {len(spans)} span(s) in the share): the "
            f"state was edited or saved with other settings; {FIX}"
        )
    whole: list[npt.NDArray[np.int64]] = []  # spans wholly before the position
    cuts: list[tuple[int, int]] = []  # (span, row): the span's rows before ``row``
    standing: dict[int, int] = {}  # lane -> rows into it, where known
    lengths = spans.lengths
    for n, (lane, entry) in enumerate(zip(dealt, saved, strict=True)):
        index = np.asarray(lane, dtype=np.int64)
        if entry is None:  # the lane had ended
            total = int(lengths[index].sum())
            if bool(finite[index].all()) and total > w * per_lane:
                raise refuse(
                    f"{at}.lanes[{n}]",
                    entry,
                    f"lane {n} holds {total} rows, more than the {w * per_lane} of windows "
                    f"0 to {w - 1}: it cannot have ended",
                )
            whole.append(index)
            continue
        k, row = entry[0], entry[1]
        if k >= len(lane):
            raise refuse(f"{at}.lanes[{n}]", entry, f"lane {n} reads {len(lane)} span(s), fewer")
        span = spans[lane[k]]
        if not span.start <= row <= span.stop:
            raise refuse(
                f"{at}.lanes[{n}]",
                entry,
                f"row {row} is outside span {k} of lane {n}: rows {span.start} to "
                f"{span.stop} of {urls[span.shard]}",
            )
        whole.append(index[:k])
        cuts.append((lane[k], row))
        if bool(finite[index[:k]].all()):
            standing[n] = int(lengths[index[:k]].sum()) + row - span.start
    wrong = [n for n, rows in standing.items() if rows != w * per_lane]
    if wrong and len(wrong) == len(standing):
        raise refuse(
            f"{at}.window",
            w,
            f"its lanes stand {sorted(set(standing.values()))} rows into their spans, while "
            f"window {w} begins {w * per_lane} rows into every lane ({per_lane} rows per lane "
            "and window)",
        )
    if wrong:
        n = wrong[0]
        raise refuse(
            f"{at}.lanes[{n}]",
            saved[n],
            f"it stands {standing[n]} rows into lane {n}, while window {w} begins "
            f"{w * per_lane} rows into every lane ({per_lane} rows per lane and window)",
        )
    return _with_cuts(spans, np.concatenate([*whole, np.zeros(0, np.int64)]), cuts, finite)


def _with_cuts(
    spans: Spans,
    whole: npt.NDArray[np.int64],
    cuts: Sequence[tuple[int, int]],
    finite: npt.NDArray[np.bool_],
) -> Spans:
    """The whole spans at ``whole`` (of known length), then each cut span's rows before its
    cut."""
    at = np.asarray([i for i, _ in cuts], dtype=np.int64)
    cut = spans.take(at)
    cut = Spans(cut.shard, cut.start, np.asarray([r for _, r in cuts], np.int64), cut.segment)
    return Spans.concat([spans.take(whole[finite[whole]]), cut])


def _consumed(
    spans: Spans, skip: tuple[Mapping[int, IntervalSet], Mapping[int, IntervalSet]]
) -> npt.NDArray[np.int64]:
    """Rows of each span (of one segment) that ``skip`` holds."""
    if not len(spans):
        return np.zeros(0, dtype=np.int64)
    return covered(skip[int(spans.segment[0])], spans.shard, spans.start, spans.stop)


def _check_consumed(
    rank: int,
    before: Spans,
    skip: tuple[Mapping[int, IntervalSet], Mapping[int, IntervalSet]],
    urls: Sequence[str],
) -> None:
    """Refuse rows before a rank's position that were not consumed."""
    for segment in (CARRY, MAIN):
        mine = before.take(np.flatnonzero(before.segment == segment))
        got = _consumed(mine, skip)
        missing = np.flatnonzero(got < mine.lengths)
        if len(missing):
            n = int(missing[0])
            raise StateError(
                f"position.ranks[{rank}]: rows {mine.start[n]} to {mine.stop[n]} of "
                f"{urls[int(mine.shard[n])]} come before its lanes' places, but are not "
                f"consumed (progress.consumed holds {int(got[n])} of them): the state was "
                f"edited or corrupted; {FIX}"
            )
