"""Skips: rows a state leaves out on request (after a loss spike), kept as consumed. Pure.

A skip is an edit of a state before a resume (``ingest.skip``): the rows named (by URL and
row range, or the rows some steps consumed, from the run's provenance log) are added to the
epoch's consumed rows, so no rank reads them again at any world size, and the skip is
recorded in the state's quarantine list (a record with :data:`SKIPPED` as its reason, no
URL, the first step skipped and the number of rows), so it stays listed, counted apart from
errors, through every later state of the epoch. A row that the epoch before carried in may
be read twice in an epoch (its carried copy and its own): a skip leaves out both. A row
whose tokens were in flight (a packing stream's ``pack.tokens``) is consumed whole.

A range is checked against its shard's row count when the state knows it (the listing's, or
one learnt by reading the shard): past it, refused. A JSON Lines or CSV shard is listed
without one until it is read to its end; the rows named of such a shard are left out as
named (rows past its end are none: nothing is read differently), but the record counts them
only where a run read them (the provenance log's rows, which name their epoch): rows named by
hand are listed as not counted, so no count exceeds what the shard holds. A skip that leaves
out nothing new (steps the state passed) changes nothing and records nothing.

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

from ingest.core.errors import ConfigError, StateError, redact
from ingest.core.intervals import MAX_ROW, IntervalSet
from ingest.core.quarantine import SKIPPED, Quarantined, is_skip
from ingest.core.state import Consumed, SkipAhead, StreamState


@dataclass(frozen=True, slots=True)
class SkipRows:
    """Rows ``[start, stop)`` of the shard at ``url`` to leave out, consumed in ``epoch``
    (None: the state's, rows named by hand; given: the provenance log's, rows a run read)."""

    url: str
    start: int
    stop: int
    epoch: int | None = None


def apply_skip(state: StreamState, rows: Iterable[SkipRows], what: str) -> tuple[StreamState, int]:
    """``state`` with ``rows`` consumed and one record of the skip (``what``: what was
    asked, for the record); and the number of rows it newly left out.

    Raises:
        ConfigError: For a range that is none (``start < 0``, ``stop <= start``).
        StateError: For rows of an earlier epoch, of a shard the state does not list, or
            past the row count the state knows of their shard.
    """
    progress = state.progress
    epoch = progress.epoch
    now: list[SkipRows] = []
    later: dict[int, dict[str, IntervalSet]] = {}
    for r in rows:
        _check_range(r)
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


def _check_range(r: SkipRows) -> None:
    """Refuse a range that names no rows (the command line refuses it as its argument)."""
    least = r.start + 1 if r.epoch is None else r.start  # a log's run of no rows: none
    if not 0 <= r.start <= least <= r.stop <= MAX_ROW:
        raise ConfigError(
            f"rows [{r.start}, {r.stop}) of {redact(r.url)}: not a row range (need "
            f"0 <= start < stop <= {MAX_ROW}, stop the row after the last); pass "
            "(url, start, stop) as ingest.which names them, e.g. (url, 40, 45) for rows 40..44"
        )


def _skip_now(state: StreamState, rows: Iterable[SkipRows], what: str) -> tuple[StreamState, int]:
    """:func:`apply_skip` of rows of the state's own epoch."""
    progress, dist = state.progress, state.distributed
    epoch = progress.epoch
    consumed, carried = progress.consumed.copy(), dist.carry_consumed.copy()
    carry: dict[int, IntervalSet] = {}
    for carried_shard, start, stop in dist.carry:
        carry.setdefault(carried_shard, IntervalSet()).add(start, stop)
    index = {s.url: i for i, s in enumerate(state.shards)}
    # a local shard is listed as file://PATH; its bare path names it too
    index.update({u.removeprefix("file://"): i for u, i in list(index.items())})
    added = grew = 0
    uncounted: set[int] = set()
    skipped: dict[int, IntervalSet] = {}
    for r in rows:
        shard, held = _shard_of(state, index, r)
        mine = consumed.of(shard)
        before = mine.count
        mine.add(r.start, r.stop)
        grew += mine.count - before
        if r.epoch is None and held is None:
            uncounted.add(shard)  # named by hand, the shard's end unknown: not counted
        else:
            added += mine.count - before
        skipped.setdefault(shard, IntervalSet()).add(r.start, r.stop)
        for a, b in _overlap(carry.get(shard, IntervalSet()), r.start, r.stop):
            theirs = carried.of(shard)
            before = theirs.count
            theirs.add(a, b)
            grew += theirs.count - before
    tokens = [t for t in progress.tokens if not (t[1] in skipped and t[2] in skipped[t[1]])]
    if not grew and len(tokens) == len(progress.tokens):  # all consumed already: no change
        return state, 0
    reason = f"{SKIPPED}: {what}"
    if uncounted:
        reason += (
            f" (+ rows named of {len(uncounted)} shard(s) of unknown row count: left out, "
            "not counted)"
        )
    record = Quarantined(reason, epoch, 0, rows=added)
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


def _shard_of(state: StreamState, index: dict[str, int], r: SkipRows) -> tuple[int, int | None]:
    """The index of ``r``'s shard in the state's listing (``index``: by URL, and by bare
    path), and its rows where the state knows them.

    Raises:
        StateError: If the listing holds no such shard, or ``r`` passes its known end.
    """
    shard = index.get(r.url)
    if shard is None:  # the listing's count, not the index's (bare paths counted again)
        raise StateError(
            f"{redact(r.url)} is not a shard of the state's listing ({len(state.shards)} "
            "shards); pass a URL as the stream listed it (the provenance log's url column)"
        )
    held = state.progress.consumed.rows_of(shard, state.shards)
    if held is not None and r.stop > held:
        listed = state.shards[shard].rows is not None
        how = "the state's listing" if listed else "learnt by reading it"
        raise StateError(
            f"rows [{r.start}, {r.stop}) of {redact(r.url)}: the shard holds {held} rows "
            f"({how}); pass a range within [0, {held})"
        )
    return shard, held


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
