"""The coordinator's part of packing across Ray ranks (see :mod:`ingest.distributed.rank_pack`).

Pure bookkeeping around the coordinator's book, run under its lock:

- **Equal output steps.** Each rank reports how many batches it has made in the epoch (handed
  out, and full ones ready) and whether its feed ended (:meth:`PackedRanks.made`). A rank
  hands out batch ``k`` only when every rank has made ``k + 1``; the epoch ends at the fewest
  batches a rank whose feed ended made, once every other rank has made as many.
- **Documents cut.** A document handed out in part keeps its offset: a loaded state's, and
  the ones a rank carries into the next epoch when the epoch ended before it handed them out
  whole. A rank starts each epoch with them (:meth:`PackedRanks.offsets`).
- **States.** Every rank sends the documents in flight it handed out (``(packed row, offset)``
  by its epoch's listing) with its state call at output step ``k``; the state is the book's
  snapshot of the read steps acked, with all of them (:meth:`PackedRanks.state`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ingest.core.assign import CARRY
from ingest.core.book import EpochBook
from ingest.core.ledger import packed_row, unpacked_row
from ingest.core.snapshot import state_with_tokens
from ingest.core.state import StreamState
from ingest.engine.pack import merged

log = logging.getLogger(__name__)

Cut = dict[tuple[int, str, int], int]
"""``(segment, shard URL, row) -> tokens handed out`` of documents cut."""


class PackedRanks:
    """See the module docstring; one per coordinator session."""

    def __init__(self, world_size: int, start: StreamState | None = None) -> None:
        self.world_size = world_size
        self._made: dict[int, dict[int, tuple[int, bool]]] = {}
        self._cut: dict[int, Cut] = {}
        if start is not None and start.progress.tokens:
            self._cut[start.progress.epoch] = {
                (segment, start.shards[shard].url, row): offset
                for segment, shard, row, offset in start.progress.tokens
            }
        self._surplus: dict[int, Cut] = {}
        """The ranks' documents cut and carried, by epoch, until every rank ended it."""
        self._entries: dict[int, tuple[int, list[tuple[int, int]]]] = {}
        """Each rank's documents in flight, by its epoch's listing, as it last sent them."""
        self._first: dict[int, int] = {
            start.progress.epoch if start is not None else 0: (
                start.progress.batches or 0 if start is not None else 0
            )
        }
        """Per epoch, the step of its first batch in this session (every rank's batches
        since the run began: a loaded state's ``pack.steps``, then each epoch's count)."""
        self._known = start is None or start.progress.batches is not None
        """Whether the steps count from the run's start (see
        :class:`ingest.engine.pack.StepCount`)."""
        self._final: dict[int, int] = {}
        """Per epoch, its batches on every rank in this session, once known."""
        self._handed: dict[int, int] = {}
        """Per rank, its batches of its epoch as its loop last left (the driver's state)."""
        self.states: dict[tuple[int, int], dict[str, Any]] = {}
        """States made at ``(epoch, output step)``, for the ranks that ask after the first."""
        self.asked: dict[tuple[int, int], set[int]] = {}

    def made(self, rank: int, epoch: int, count: int, ended: bool) -> tuple[int, int | None]:
        """``rank`` made ``count`` batches of ``epoch`` (``ended``: its feed ended, so it
        makes no more). Returns the fewest batches any rank made, and the epoch's batch
        count once it is known (None before)."""
        reports = self._made.setdefault(epoch, {})
        before = reports.get(rank, (0, False))
        reports[rank] = (max(count, before[0]), ended or before[1])
        counts = [reports.get(r, (0, False)) for r in range(self.world_size)]
        low = min(c for c, _ in counts)
        ends = [c for c, e in counts if e]
        final = min(ends) if ends and low >= min(ends) else None
        if final is not None:
            self._final[epoch] = final
        return low, final

    def first_step(self, epoch: int) -> int:
        """The step of ``epoch``'s first batch (see :class:`ingest.engine.pack.StepCount`):
        the epochs before it in this session ended on every rank, so their counts are known.
        """
        return self._first_step(epoch)

    def saved_first_step(self, epoch: int) -> int | None:
        """:meth:`first_step`, None where the steps do not count from the run's start."""
        return self._first_step(epoch) if self._known else None

    def _first_step(self, epoch: int) -> int:
        known = max((e for e in self._first if e <= epoch), default=None)
        if known is None:  # pragma: no cover - a session starts at its first epoch
            return 0
        step = self._first[known]
        for e in range(known, epoch):
            step += self._final.get(e, 0)
        self._first[epoch] = step
        return step

    @staticmethod
    def waits(book: EpochBook[Any], epoch: int) -> bool:
        """Whether ``epoch`` waits for a rank to close the epoch before it (in this run): its
        plan takes the documents the ranks carry from there."""
        return epoch - 1 >= book.first_epoch and not book.acks.all_ended(epoch - 1)

    def busy(self, rank: int, epoch: int) -> bool:
        """Whether ``rank`` made batches of ``epoch`` already (in this session)."""
        return self._made.get(epoch, {}).get(rank, (0, False))[0] > 0

    def offsets(self, book: EpochBook[Any], epoch: int) -> dict[int, int]:
        """The documents cut that ``epoch`` starts with, by its listing's packed rows."""
        cut = self._cut.get(epoch)
        if not cut:
            return {}
        by_url = {s.url: n for n, s in enumerate(book.plan(epoch).listing.shards)}
        return {
            packed_row(segment, by_url[url], row): offset
            for (segment, url, row), offset in cut.items()
            if url in by_url
        }

    def entries(
        self, rank: int, epoch: int, entries: Sequence[tuple[int, int]], handed: int = 0
    ) -> None:
        """``rank``'s documents in flight in ``epoch`` (see the module docstring), and its
        batches of it handed out."""
        self._entries[rank] = (epoch, list(entries))
        self._handed[rank] = handed

    def closed(
        self,
        book: EpochBook[Any],
        rank: int,
        epoch: int,
        cut: Sequence[tuple[int, int]],
    ) -> None:
        """``rank`` ended ``epoch``; ``cut``: its documents carried into the next epoch after
        part of them was handed out. Once every rank ended it, the book takes the offsets of
        the copies the epoch's remainder holds (those, and the loaded ones no rank read), and
        the next epoch's carried rows start at their copies' (:mod:`ingest.core.carry`)."""
        self._entries.pop(rank, None)
        self._handed.pop(rank, None)
        urls = [s.url for s in book.plan(epoch).listing.shards]
        mine = self._surplus.setdefault(epoch, {})
        for key, offset in cut:
            segment, shard, row = unpacked_row(key)
            mine[(segment, urls[shard], row)] = offset
        if not book.acks.all_ended(epoch):
            return
        surplus = self._surplus.pop(epoch)
        loaded = self._cut.pop(epoch, {})
        if book.config.remainder != "carry":
            return
        index = {url: n for n, url in enumerate(urls)}
        noted: dict[tuple[int, int, int], int] = {}
        for (segment, url, row), offset in [*loaded.items(), *surplus.items()]:
            if url in index:
                copy = (segment, index[url], row)
                noted[copy] = max(noted.get(copy, 0), offset)
        out = book.plan(epoch).cut_at_end(noted)
        if out.owed:
            log.info(
                "epoch %d: %d rows were left over together with their copies carried into "
                "it; epoch %d carries one copy of each and owes the other, to carry out at "
                "its end (distributed.owed in its states)",
                epoch,
                len(out.owed),
                epoch + 1,
            )
        nxt = self._cut.setdefault(epoch + 1, {})
        for (shard, row), offset in out.offsets.items():
            nxt[(CARRY, urls[shard], row)] = offset

    def state(self, book: EpochBook[Any], handed: int | None = None) -> StreamState:
        """The book's state after every read step acked, with the documents in flight (each
        rank's as last sent, and the cut ones of the state's epoch not read again yet), and
        the batches handed out: ``handed`` of the state's epoch on every rank; None: as
        many as the rank furthest on when the loops left (the driver's state)."""
        base = book.snapshot_acked()
        epoch = base.progress.epoch
        if handed is None:
            handed = max(self._handed.values(), default=0)
        batches = self.first_step(epoch) + handed if self._known else None
        by_url = {s.url: n for n, s in enumerate(base.shards)}
        cut = list(self._cut.get(epoch, {}).items())
        for got, entries in self._entries.values():
            if got == epoch:
                urls = [s.url for s in book.plan(epoch).listing.shards]
                for key, offset in entries:
                    segment, shard, row = unpacked_row(key)
                    cut.append(((segment, urls[shard], row), offset))
        tokens = merged(
            (segment, by_url[url], row, offset)
            for (segment, url, row), offset in cut
            if url in by_url and not base.consumed_whole(segment, by_url[url], row)
        )
        return state_with_tokens(base, tokens, batches)


__all__ = ["PackedRanks"]
