"""Skips: rows a state leaves out on request (after a loss spike), kept as consumed. Pure.

A skip is an edit of a state before a resume (``ingest.skip``): the rows named (by URL and
row range, or the rows some steps consumed, from the run's provenance log) are added to the
epoch's consumed rows, so no rank reads them again at any world size, and the skip is
recorded in the state's quarantine list (a record with :data:`SKIPPED` as its reason, no
URL, the first step skipped and the number of rows), so it stays listed, counted apart from
errors, through every later state of the epoch. A row that the epoch before carried in may
be read twice in an epoch (its carried copy and its own): a skip leaves out both. A row
whose tokens were in flight (a packing stream's ``pack.tokens``) is consumed whole.

Rows of a later epoch than the state's (the spike came after an epoch's end the state did
not reach) cannot be consumed yet: that epoch starts from every row again. The state keeps
them apart (:class:`ingest.core.state.SkipAhead`, ``progress.skip_ahead``, by URL), every
later state of its epoch keeps them, and the book consumes them, with the skip's record,
when it plans that epoch (:func:`consume_ahead`), at whatever world size. The rest of the
state's own epoch is untouched, so its saved positions still hold. Rows of an earlier epoch
than the state's were delivered before the state was saved: refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ingest.core.errors import StateError
from ingest.core.intervals import IntervalSet
from ingest.core.quarantine import SKIPPED, Quarantined, is_skip
from ingest.core.state import Consumed, SkipAhead, StreamState


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
        StateError: For rows of an earlier epoch, or of a shard the state does not list.
    """
    progress = state.progress
    epoch = progress.epoch
    now: list[SkipRows] = []
    later: dict[int, dict[str, IntervalSet]] = {}
    for r in rows:
        if r.epoch is None or r.epoch == epoch:
            now.append(r)
        elif r.epoch > epoch:
            later.setdefault(r.epoch, {}).setdefault(r.url, IntervalSet()).add(r.start, r.stop)
        else:
            raise StateError(
                f"rows [{r.start}, {r.stop}) of {r.url} were consumed in epoch {r.epoch}, "
                f"before the state's epoch {epoch}: they were delivered before the state was "
                f"saved. Skip them from a state saved in epoch {r.epoch}"
            )
    state, added = _skip_now(state, now, what)
    if later:
        ahead = [SkipAhead(e, what, sets) for e, sets in sorted(later.items())]
        progress = replace(state.progress, ahead=[*state.progress.ahead, *ahead])
        state = replace(state, progress=progress)
        added += sum(a.count() for a in ahead)
    return state, added


def _skip_now(state: StreamState, rows: Iterable[SkipRows], what: str) -> tuple[StreamState, int]:
    """:func:`apply_skip` of rows of the state's own epoch."""
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
        shard = index.get(r.url)
        if shard is None:
            raise StateError(
                f"{r.url} is not a shard of the state's listing ({len(index)} shards); pass "
                "a URL as the stream listed it (the provenance log's url column)"
            )
        held = state.shards[shard].rows
        if held is not None and r.stop > held:
            raise StateError(
                f"rows [{r.start}, {r.stop}) of {r.url}: the shard holds {held} rows (the "
                f"state's listing); pass a range within [0, {held})"
            )
        mine = consumed.of(shard)
        before = mine.count
        mine.add(r.start, r.stop)
        added += mine.count - before
        skipped.setdefault(shard, IntervalSet()).add(r.start, r.stop)
        if shard in carry:
            for a, b in _overlap(carry[shard], r.start, r.stop):
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


def _overlap(carry: IntervalSet, start: int, stop: int) -> list[tuple[int, int]]:
    """The parts of ``[start, stop)`` that the carried spans hold."""
    out = []
    for a, b in carry:
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            out.append((lo, hi))
    return out


def consume_ahead(
    ahead: Sequence[SkipAhead],
    epoch: int,
    urls: Sequence[str],
    carry: Iterable[tuple[int, int, int]],
    main: Consumed,
    carried: Consumed,
) -> list[Quarantined]:
    """Consume the skips of ``epoch`` in ``ahead`` as the book plans it; the skips' records.

    Args:
        ahead: A loaded state's skips of later epochs.
        epoch: The epoch planned.
        urls: Its listing's shard URLs (the indices of ``main``).
        carry: ``(shard, start, stop)`` spans carried into it from the epoch before: a row
            skipped leaves out its carried copy too, as :func:`apply_skip` does.
        main: Its consumed rows, added to in place.
        carried: Its carried rows consumed, added to in place.
    """
    index = {u: i for i, u in enumerate(urls)}
    spans: dict[int, IntervalSet] = {}
    for shard, start, stop in carry:
        spans.setdefault(shard, IntervalSet()).add(start, stop)
    records = []
    for a in ahead:
        if a.epoch != epoch:
            continue
        added = 0
        for url, rows in a.rows.items():
            at = index.get(url)
            if at is None:  # gone from this epoch's listing: nothing of it to deliver
                continue
            # new sets in place of the old (a set's change would leave the cached
            # completion of ``main`` stale)
            mine = main.sets.get(at, IntervalSet()).copy()
            before = mine.count
            mine.update(rows)
            added += mine.count - before
            main.add_sets({at: mine})
            if at in spans:
                theirs = carried.sets.get(at, IntervalSet()).copy()
                for start, stop in rows:
                    for lo, hi in _overlap(spans[at], start, stop):
                        theirs.add(lo, hi)
                carried.add_sets({at: theirs})
        records.append(Quarantined(f"{SKIPPED}: {a.what}", epoch, 0, rows=added))
    return records


__all__ = ["SKIPPED", "SkipRows", "apply_skip", "consume_ahead", "is_skip"]
