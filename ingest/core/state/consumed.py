"""The rows an epoch consumed: an interval set per shard index, the row counts learnt by
reading, and which shards are done, as the state's ``progress.consumed`` and
``distributed.carry.consumed`` hold them. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.core.errors import StateError
from ingest.core.intervals import IntervalSet, stack
from ingest.core.keyed import set_bounds
from ingest.core.state.checks import FIX, checked_index, checked_int, refuse
from ingest.core.state.packed import pack_sets, unpack_sets
from ingest.core.state.shards import ShardRecord, row_counts

Intervals = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
"""``(key, start, stop)``: keyed sets' intervals, set after set
(:func:`ingest.core.intervals.stack`)."""


PACK_FROM_INTERVALS = 64
"""Partially consumed sets of more intervals than this, in all, are written as one
compressed bitmap (``partial.packed``), whatever the size of the listing. A rank stopped
inside a shuffle window consumed a random part of the window's rows: about one interval
per two rows, 8 to 16 bytes each as pairs (47-87 KB for one window of 16,384 rows, issue
32), against a bit per row of the window's extent, and consumed prefixes that zlib all but
removes (2-3 KB per rank). Fewer intervals stay readable pairs."""


@dataclass(frozen=True, slots=True)
class Completion:
    """Which shards of a :class:`Consumed` are done, and which are consumed in part.

    The coordinator keeps one beside its progress and updates it with the shards each fold
    touches (:meth:`Consumed.add_sets`), so that a snapshot's JSON costs what changed since
    the last one, not a pass over every consumed shard (half a million sets half-way through
    an epoch of a million shards). It holds for the sets it was made with: sets are replaced,
    never changed in place.
    """

    done: npt.NDArray[np.bool_]
    """One entry per shard: every row consumed (read-only)."""
    partial: frozenset[int]
    """Shards with some rows consumed, not all (or all of a shard whose count is unknown)."""
    sets: int
    """``len(consumed)`` it was made for (a cheap check that no set was added past it)."""

    @classmethod
    def of(cls, consumed: Mapping[int, IntervalSet], counts: npt.NDArray[np.int64]) -> Completion:
        """The completion of every set of ``consumed``; ``counts``: rows per shard (-1: unknown)."""
        empty = cls(np.zeros(len(counts), dtype=bool), frozenset(), 0)
        return empty.updated([stack(consumed.items())], counts, len(consumed))

    def updated(
        self, parts: Iterable[Intervals], counts: npt.NDArray[np.int64], sets: int
    ) -> Completion:
        """This completion with new sets in place of the old ones of their shards.

        Args:
            parts: The new sets' intervals, set after set (:func:`ingest.core.intervals.stack`),
                part after part; a shard's set in a later part replaces the one before.
            counts: Every shard's row count (-1: unknown).
            sets: ``len(consumed)`` with the new sets in.
        """
        done = self.done.copy()
        partial = set(self.partial)
        for key, lo, hi in parts:
            heads, _ = set_bounds(key)
            keys = key[heads]
            rows = counts[keys]
            # A set covers its shard when its first interval runs from row 0 to the count.
            whole = (lo[heads] == 0) & (hi[heads] >= rows) & (rows >= 0)
            done[keys] = whole
            partial.difference_update(keys[whole].tolist())
            partial.update(keys[~whole].tolist())
        done.setflags(write=False)
        return Completion(done, frozenset(partial), sets)


@dataclass(slots=True)
class Consumed:
    """The rows one epoch has consumed: an interval set per shard index (the state's
    ``progress.consumed``, and ``distributed.carry.consumed`` for the rows carried in)."""

    sets: dict[int, IntervalSet] = field(default_factory=dict)
    """The rows consumed of each shard, by its index in the listing."""
    rows: dict[int, int] = field(default_factory=dict)
    """Row counts learnt by reading shards whose listing gave none."""
    completion: Completion | None = field(default=None, repr=False, compare=False)
    """Kept by :meth:`add_sets` when the caller gives the row counts; None: found anew."""

    def rows_of(self, index: int, shards: Sequence[ShardRecord]) -> int | None:
        known = shards[index].rows
        return known if known is not None else self.rows.get(index)

    def of(self, index: int) -> IntervalSet:
        got = self.sets.get(index)
        if got is None:
            got = self.sets[index] = IntervalSet()
        return got

    def count(self) -> int:
        _, lo, hi = stack(self.sets.items())
        return int((hi - lo).sum())

    def copy(self) -> Consumed:
        return Consumed(
            {k: v.copy() for k, v in self.sets.items()}, dict(self.rows), self.completion
        )

    def shallow(self) -> Consumed:
        """A copy that shares the interval sets (for a caller that replaces sets, never
        changes them: :meth:`add_sets`)."""
        return Consumed(dict(self.sets), dict(self.rows), self.completion)

    def add_sets(
        self,
        new: Mapping[int, IntervalSet],
        counts: npt.NDArray[np.int64] | None = None,
        parts: Sequence[Intervals] | None = None,
    ) -> None:
        """Put the sets of ``new`` in place of the sets of their shards.

        Args:
            new: The new sets (each holds the old set's rows and more).
            counts: Every shard's row count (-1: unknown). Given, the completion is kept up
                to date with the shards of ``new`` alone (made from all sets the first
                time); None drops it.
            parts: The intervals of ``new`` as arrays, if the caller has them
                (:class:`ingest.core.keyed.Merged`), in the order the sets were made.
        """
        self.sets.update(new)
        if counts is None:
            self.completion = None
        elif self.completion is None or len(self.completion.done) != len(counts):
            self.completion = Completion.of(self.sets, counts)
        else:
            got = parts if parts is not None else [stack(new.items())]
            self.completion = self.completion.updated(got, counts, len(self.sets))

    def counts(self, listed: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Every shard's row count (-1: unknown): ``listed``, with the learnt ones filled in."""
        if not self.rows:
            return listed
        out = listed.copy()
        learnt = np.fromiter(self.rows, np.int64, len(self.rows))
        values = np.fromiter(self.rows.values(), np.int64, len(self.rows))
        unknown = out[learnt] < 0
        out[learnt[unknown]] = values[unknown]
        return out

    def completed(self, listed: npt.NDArray[np.int64]) -> Completion:
        """Which shards are done and which partial; ``listed``: the listing's row counts."""
        got = self.completion
        if (
            got is not None
            and got.sets == len(self.sets)
            and not self.rows
            and len(got.done) == len(listed)
        ):
            return got
        return Completion.of(self.sets, self.counts(listed))

    def to_json(
        self,
        shards: Sequence[ShardRecord],
        *,
        packed: bool = False,
        listed: npt.NDArray[np.int64] | None = None,
    ) -> dict[str, Any]:
        """The JSON form; ``packed`` writes ``done`` and ``partial`` as bitmaps when shorter.

        Args:
            shards: The shards the indices refer to.
            packed: Write the version 3 form.
            listed: Every shard's row count in the listing (-1: unknown), if the caller
                keeps it (:attr:`ingest.core.state.dataset.DatasetState.counts`); else read
                from ``shards``.
        """
        if listed is None:
            listed = row_counts(shards)
        completion = self.completed(listed)
        # Shards with no row to consume are done too (listed, or learnt, with 0 rows).
        done_mask = completion.done | (self.counts(listed) == 0)
        done = IntervalSet.of_mask(done_mask)
        partial = sorted(k for k in completion.partial if not done_mask[k])
        sets = stack((k, self.sets[k]) for k in partial)
        if packed or len(sets[0]) > PACK_FROM_INTERVALS:
            partial_json: dict[str, Any] = {"packed": pack_sets(*sets)}
        else:
            partial_json = {str(k): self.sets[k].to_json() for k in partial}
        return {
            "done": done.encode() if packed else done.to_json(),
            "partial": partial_json,
            "rows": {str(k): v for k, v in sorted(self.rows.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], shards: Sequence[ShardRecord]) -> Consumed:
        out = cls()
        for k, v in data.get("rows", {}).items():
            index = checked_index(k, shards)
            out.rows[index] = checked_int(v, f"progress.rows[{k}]")
            listed = shards[index].rows
            if listed is not None and listed != v:
                raise refuse(
                    f"progress.rows[{k}]",
                    v,
                    f"the listing the state records gives {shards[index].url} {listed} rows "
                    "(a count is learnt only for a shard listed without one)",
                )
        try:
            done = IntervalSet.from_json(data.get("done", []))
        except ValueError as e:
            raise StateError(
                f"progress.done: {e}; the state was edited or corrupted; {FIX}"
            ) from None
        for first, stop in done:
            for index in range(checked_index(first, shards), checked_index(stop - 1, shards) + 1):
                rows = out.rows_of(index, shards)
                if rows is None:
                    raise StateError(
                        f"progress.done names shard {index} "
                        f"({shards[index].url}) but its row count is unknown"
                    )
                out.sets[index] = IntervalSet.span(0, rows)
        for k, v in _partial_sets(data.get("partial", {})).items():
            try:
                got = v if isinstance(v, IntervalSet) else IntervalSet.from_json(v)
                out.of(checked_index(k, shards)).update(got)
            except ValueError as e:
                raise StateError(
                    f"progress.partial[{k}]: {e}; the state was edited or corrupted; {FIX}"
                ) from None
        return out


def _partial_sets(partial: Any) -> Mapping[str, Any]:
    """The sets of ``partial`` by shard: the packed ones unpacked."""
    if isinstance(partial, Mapping) and "packed" in partial:
        if len(partial) > 1:
            raise refuse(
                "progress.consumed.partial",
                sorted(partial),
                "it holds either the packed sets or sets by shard, not both",
            )
        return unpack_sets(partial["packed"], "progress.consumed.partial.packed")
    return partial  # type: ignore[no-any-return]


def check_bounds(progress: Consumed, shards: Sequence[ShardRecord], what: str) -> None:
    """Refuse consumed rows beyond a shard's known row count (an edited state)."""
    key, _, hi = stack(progress.sets.items())
    heads, tails = set_bounds(key)
    if not len(heads):
        return
    known = progress.counts(row_counts(shards))[key[heads]]
    last = hi[tails - 1]
    beyond = np.flatnonzero((known >= 0) & (last > known))
    if len(beyond):
        n = int(beyond[0])
        index = int(key[heads[n]])
        raise StateError(
            f"{what} of shard {index} ({shards[index].url}) reaches row {int(last[n])}, "
            f"but the shard has {int(known[n])} rows; the state was edited or belongs to "
            "other data: save it again"
        )
