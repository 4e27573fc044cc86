"""Skips: rows a state leaves out on request (after a loss spike), kept as consumed. Pure.

A skip is an edit of a state before a resume (``ingest.skip``): the rows named (by URL and
row range, or the rows some steps consumed, from the run's provenance log) are added to the
epoch's consumed rows, so no rank reads them again at any world size, and the skip is
recorded in the state's quarantine list (a record with :data:`SKIPPED` as its reason, no
URL, the first step skipped and the number of rows), so it stays listed, counted apart from
errors, through every later state of the epoch. A row that the epoch before carried in may
be read twice in an epoch (its carried copy and its own): a skip leaves out both. A row
whose tokens were in flight (a packing stream's ``pack.tokens``) is consumed whole.

Rows of another epoch than the state's are refused: a state holds one epoch's progress, and
the next epoch's plan starts from every row again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ingest.core.errors import StateError
from ingest.core.intervals import IntervalSet
from ingest.core.quarantine import SKIPPED, Quarantined, is_skip
from ingest.core.state import StreamState


@dataclass(frozen=True, slots=True)
class SkipRows:
    """Rows ``[start, stop)`` of the shard at ``url`` to leave out, consumed in ``epoch``
    (None: the state's)."""

    url: str
    start: int
    stop: int
    epoch: int | None = None


def apply_skip(state: StreamState, rows: Iterable[SkipRows], what: str) -> tuple[StreamState, int]:
    """``state`` with ``rows`` consumed and one record of the skip (``what``: what was
    asked, for the record); and the number of rows it newly left out.

    Raises:
        StateError: For rows of another epoch, or of a shard the state does not list.
    """
    progress, dist = state.progress, state.distributed
    epoch = progress.epoch
    index = {s.url: i for i, s in enumerate(state.shards)}
    # a local shard is listed as file://PATH; its bare path names it too
    index.update({u.removeprefix("file://"): i for u, i in list(index.items())})
    consumed, carried = progress.consumed.copy(), dist.carry_consumed.copy()
    carry: dict[int, IntervalSet] = {}
    for carried_shard, start, stop in dist.carry:
        carry.setdefault(carried_shard, IntervalSet()).add(start, stop)
    added = 0
    skipped: dict[int, IntervalSet] = {}
    for r in rows:
        if r.epoch is not None and r.epoch != epoch:
            raise StateError(
                f"rows [{r.start}, {r.stop}) of {r.url} were consumed in epoch {r.epoch}, and "
                f"the state is in epoch {epoch}: a state holds one epoch's progress. Skip "
                f"them from a state saved in epoch {r.epoch}"
            )
        shard = index.get(r.url)
        if shard is None:
            raise StateError(
                f"{r.url} is not a shard of the state's listing ({len(index)} shards); pass "
                "a URL as the stream listed it (the provenance log's url column)"
            )
        mine = consumed.of(shard)
        before = mine.count
        mine.add(r.start, r.stop)
        added += mine.count - before
        skipped.setdefault(shard, IntervalSet()).add(r.start, r.stop)
        if shard in carry:
            for a, b in _overlap(carry[shard], r):
                carried.of(shard).add(a, b)
    if not skipped:
        return state, 0
    tokens = [t for t in progress.tokens if not (t[1] in skipped and t[2] in skipped[t[1]])]
    record = Quarantined(f"{SKIPPED}: {what}", epoch, 0, rows=added)
    new_progress = replace(
        progress,
        consumed=consumed,
        tokens=tokens,
        quarantined=[*progress.quarantined, record],
    )
    new_dist = replace(dist, carry_consumed=carried)
    # The cursors go: a rank's cursor replays its window leaving out what its saved
    # positions knew as consumed; without them the rest is shared anew from the consumed
    # rows alone, as after a world-size change.
    position = replace(state.position, ranks=[None] * len(state.position.ranks))
    return replace(state, progress=new_progress, distributed=new_dist, position=position), added


def _overlap(carry: IntervalSet, r: SkipRows) -> list[tuple[int, int]]:
    """The parts of ``[r.start, r.stop)`` that the carried spans hold."""
    out = []
    for a, b in carry:
        lo, hi = max(a, r.start), min(b, r.stop)
        if lo < hi:
            out.append((lo, hi))
    return out


__all__ = ["SKIPPED", "SkipRows", "apply_skip", "is_skip"]
