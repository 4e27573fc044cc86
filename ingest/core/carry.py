"""What an epoch carries into the next one: every copy of a row it did not hand out. Pure.

An epoch holds a row at most twice: its own copy (segment :data:`~ingest.core.assign.MAIN`)
and the copy the epoch before carried in (:data:`~ingest.core.assign.CARRY`). A packing
epoch may end before it hands out either (:mod:`ingest.distributed.rank_pack`), and then both
are due again. The next epoch carries a row once: its carried rows are a set, consumed as a
set (``distributed.carry``). Every other copy is *owed*: the state keeps it
(``distributed.owed``) with the tokens of it handed out already, and the next epoch carries it
out at its own end, beside its remainder, where it may be carried or owed again. Nothing is
dropped, and nothing is delivered twice.

Which copy is carried: the epoch's own if it is left over, else the one carried in, else the
oldest owed one. A copy's offset (tokens handed out) always travels with that copy.

An epoch with no step (fewer rows, with those carried in, than one step on every rank)
hands out nothing: the next epoch carries every copy of it, a row as often as it is due, so
that the copies add up to a step (owing them would leave each epoch at most two copies of a
row, and a dataset smaller than a step would never fill one). Those copies lead the next
epoch's first step, where its carried rows are consumed as a set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ingest.core.assign import CARRY, Span

Copy = tuple[int, int, int]
"""``(shard, row, offset)``: a copy of a row due again, its tokens ``[0, offset)`` handed
out already (0: none, or not a packed stream)."""

Cut = Mapping[tuple[int, int, int], int]
"""``(segment, shard, row) -> offset`` of the remainder's copies cut before (a packed
stream's documents handed out in part)."""


@dataclass(frozen=True, slots=True)
class Carried:
    """An epoch's rows not handed out, as the next epoch takes them."""

    spans: tuple[Span, ...] = ()
    """Every row once (segment ``CARRY``), in shard and row order, runs merged (after an
    epoch with no step: every copy, in layers of one copy of each row, each so ordered)."""
    offsets: dict[tuple[int, int], int] = field(default_factory=dict)
    """``(shard, row) -> offset`` of the carried copies cut before (offsets above 0)."""
    owed: tuple[Copy, ...] = ()
    """The other copies, sorted, for the next epoch to carry out at its end."""

    @property
    def rows(self) -> int:
        """Copies in all (carried and owed)."""
        return sum(s.stop - s.start for s in self.spans) + len(self.owed)


def carried_out(
    remainder: Sequence[Span],
    owed: Sequence[Copy] = (),
    cut: Cut | None = None,
    *,
    whole: bool = False,
) -> Carried:
    """What the next epoch takes of an epoch's ``remainder`` (copies by segment, a row's two
    copies possibly both there), the copies it ``owed`` and the offsets of those ``cut``;
    ``whole``: the epoch had no step, so every copy is carried (see the module docstring)."""
    cut = cut or {}
    copies: dict[tuple[int, int], list[int]] = {}
    # The epoch's own copy first (MAIN sorts after CARRY), then the carried-in one, then owed.
    for s in sorted(remainder, key=lambda s: (-s.segment, s.shard, s.start)):
        for row in range(s.start, s.stop):
            copies.setdefault((s.shard, row), []).append(cut.get((s.segment, s.shard, row), 0))
    for shard, row, offset in owed:
        copies.setdefault((shard, row), []).append(offset)
    layers: list[list[Span]] = [[]]
    offsets: dict[tuple[int, int], int] = {}
    extra: list[Copy] = []
    for (shard, row), found in sorted(copies.items()):
        if top := max(found) if whole else found[0]:
            offsets[shard, row] = top
        for n, offset in enumerate(found):
            if n and not whole:
                extra.append((shard, row, offset))
                continue
            if n == len(layers):
                layers.append([])
            spans = layers[n]  # the n-th copy of each row: a set of rows, runs merged
            last = spans[-1] if spans else None
            if last is not None and (last.shard, last.stop) == (shard, row):
                spans[-1] = last._replace(stop=row + 1)
            else:
                spans.append(Span(shard, row, row + 1, CARRY))
    return Carried(tuple(s for spans in layers for s in spans), offsets, tuple(sorted(extra)))


__all__ = ["Carried", "Copy", "Cut", "carried_out"]
