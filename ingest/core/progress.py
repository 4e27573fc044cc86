"""A book's progress, made and moved: acked runs added to the consumed rows (a fold),
every row of some shards consumed (the rounds of a followed dataset), and consumed rows
carried from a state's shard indices to a listing's. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.core.assign import CARRY
from ingest.core.errors import StateError, redact
from ingest.core.intervals import IntervalSet
from ingest.core.keyed import merge_into
from ingest.core.ledger import Run, Runs, as_runs
from ingest.core.listing import Listed
from ingest.core.state import Consumed, Intervals, ShardTable, StreamState


def add_runs(
    parts: Iterable[Runs | Sequence[Run]],
    carried: Consumed,
    main: Consumed,
    counts: npt.NDArray[np.int64] | None = None,
) -> None:
    """Add acked runs to the progress of their segment.

    ``parts``: the runs, in parts (one per rank: :meth:`ingest.core.ledger.Ledger.runs_by_rank`).
    Parts are merged a group at a time, in one numpy pass each
    (:func:`ingest.core.keyed.merge_into`): parts joined up to :data:`GROUP_RUNS` runs, so
    every sort stays small while a thousand ranks' few runs each (a fold on a window's
    edge) are not a thousand passes. A shard's interval set
    is replaced, never changed in place, so a snapshot may share the sets of the book's
    progress (:meth:`ingest.core.state.Consumed.shallow`) and stay as it was. ``counts`` (row
    counts per shard, -1: unknown) keeps the progress's completion up to date.
    """
    both = (carried, main)
    new: tuple[dict[int, IntervalSet], dict[int, IntervalSet]] = ({}, {})
    made: tuple[list[Intervals], list[Intervals]] = ([], [])
    for arr in grouped(parts):
        in_carry = arr[:, 0] == CARRY
        pieces = ((0, arr[in_carry]), (1, arr[~in_carry])) if in_carry.any() else ((1, arr),)
        for n, mine in pieces:
            if len(mine):
                sofar = Layered(new[n], both[n].sets)
                got = merge_into(sofar, mine[:, 1], mine[:, 2], mine[:, 3])
                new[n].update(got.sets)
                made[n].append((got.key, got.start, got.stop))
    for progress, sets, arrays in zip(both, new, made, strict=True):
        if sets:
            progress.add_sets(sets, counts, arrays)


GROUP_RUNS = 1 << 12
"""Runs merged in one pass by :func:`add_runs` (parts joined up to this many)."""


def grouped(parts: Iterable[Runs | Sequence[Run]]) -> Iterator[Runs]:
    """``parts`` as runs, consecutive parts joined while they hold fewer than
    :data:`GROUP_RUNS` runs together."""
    held: list[Runs] = []
    count = 0
    for part in parts:
        arr = as_runs(part)
        if held and count + len(arr) > GROUP_RUNS:
            yield held[0] if len(held) == 1 else np.concatenate(held)
            held, count = [], 0
        held.append(arr)
        count += len(arr)
    if held:
        yield held[0] if len(held) == 1 else np.concatenate(held)


def all_of(listing: Listed, indices: Iterable[int], learnt: Mapping[str, int]) -> Consumed:
    """A :class:`Consumed` with every row of the shards ``indices`` of ``listing`` in it.

    Raises:
        StateError: If one has no row count (neither listed nor learnt by reading).
    """
    out = Consumed()
    for n in indices:
        rows = listing.infos[n].rows
        if rows is None:
            rows = learnt.get(listing.shards[n].url)
        if rows is None:
            raise StateError(
                f"{redact(listing.shards[n].url)} has no row count: following a dataset "
                "needs one per shard (parquet and Arrow files have one; index the others: "
                "`ingest index URL`)"
            )
        if rows:
            out.sets[n] = IntervalSet.span(0, rows)
        if listing.infos[n].rows is None:
            out.rows[n] = rows
    return out


def shard_table(listing: Listed, counts: npt.NDArray[np.int64]) -> ShardTable:
    """The shards of ``listing`` as the state records them, by column."""
    shards = listing.shards
    return ShardTable(
        [s.url for s in shards],
        np.fromiter((s.size for s in shards), np.int64, len(shards)),
        [s.rows_version for s in shards],
        counts,
    )


class Layered(Mapping[int, IntervalSet]):
    """``top`` over ``base``: the sets made so far in a fold over the progress's own."""

    def __init__(self, top: Mapping[int, IntervalSet], base: Mapping[int, IntervalSet]) -> None:
        self.top, self.base = top, base

    def get(self, key: int, default: Any = None) -> Any:
        got = self.top.get(key)
        return got if got is not None else self.base.get(key, default)

    def __getitem__(self, key: int) -> IntervalSet:
        got = self.get(key)
        if got is None:
            raise KeyError(key)
        return got  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[int]:
        return iter(set(self.top).union(self.base))

    def __len__(self) -> int:
        return len(set(self.top).union(self.base))


def remap(progress: Consumed, state: StreamState, by_url: Mapping[str, int]) -> Consumed:
    """``progress`` (indexed by the state's shards) indexed by the listing's shards."""
    out = Consumed()
    for index, rows in progress.sets.items():
        out.sets[by_url[state.shards[index].url]] = rows.copy()
    for index, count in progress.rows.items():
        out.rows[by_url[state.shards[index].url]] = count
    return out


__all__ = ["GROUP_RUNS", "Layered", "add_runs", "all_of", "grouped", "remap", "shard_table"]
