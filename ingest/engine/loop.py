"""One rank's loop, whatever carries its batches. No Ray, no torch.

A rank's loop, under every transport (:class:`ingest.Stream` in one process,
:class:`ingest.DataLoader` with torch worker processes as ranks, a Ray rank iterator fed by
the reader pool), is the same sequence: its feed reads the rank's share of the epoch's plan
(:meth:`ingest.core.book.EpochBook.rank_plan`) into batches that carry their provenance
(:class:`BatchItem`), then one :class:`Ending`; each batch is converted, and only then
recorded as handed out (a :class:`~ingest.core.ledger.StepRecord`), so that a batch that
failed to convert is read again; a batch whose rows were all quarantined is recorded but
not handed out, unless the rank keeps equal steps (Ray); every :data:`ACK_EVERY` batches
the held records go to the book in one message, which folds them into its consumed
intervals every :data:`~ingest.core.book.FOLD_EVERY` steps
(:meth:`~ingest.core.book.EpochBook.fold_due`); at the ending the rank sends what it holds
and reports the end of its epoch (:meth:`~ingest.core.book.EpochBook.finish`); a state is
the book's snapshot after the acks held are sent.

:class:`RankLoop` is that loop, once: :meth:`RankLoop.batches` runs one rank's items of an
epoch, :meth:`RankLoop.hand_out` is its step for one batch (the DataLoader's main process,
whose workers' items come interleaved, calls it and :meth:`RankLoop.end` per item). A
transport supplies only the rank's plan, where its items come from, the conversion, and a
:class:`RankLink` to the book: :class:`BookLink` in the process, the coordinator actor over
Ray (:mod:`ingest.distributed.rank`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

from ingest.core.book import EpochBook
from ingest.core.ledger import Closed, Rows, Run, Runs, StepRecord
from ingest.core.provenance import BatchPieces
from ingest.core.quarantine import Quarantined
from ingest.core.state import Cursor
from ingest.engine.interrupts import commit

ACK_EVERY = 16
"""Batches whose acks go to the book together: one pass packs them all (one call per batch
cost a third of a one-process loop's own time on a shuffled stream). A state, a rewind and
the end of the epoch send what is held first, so a state still covers every batch handed
out."""
REMOTE_ACK_EVERY = 64
"""Batches per ack message when the book is in another process (a Ray rank's coordinator,
``RankOptions.ack_every``): a message there is a remote call and, with more than a few
batches' records, an object in Ray's object store, so a quarter of the messages cut the
coordinator's and the raylet's CPU per warm ``ingest bench`` epoch by a third (08956b3). A
rank whose coordinator died stops within three messages."""


class BatchItem(Protocol):
    """A batch as a rank's loop receives it, with where its rows came from
    (:class:`ingest.engine.feed.Ready` and its transports' copies); the batch itself is
    what the transport's conversion takes from it."""

    @property
    def step(self) -> int: ...
    @property
    def runs(self) -> Runs | Rows: ...
    @property
    def cursor(self) -> Cursor: ...
    @property
    def rows(self) -> int:
        """Rows delivered; 0: every row quarantined; -1: a full batch."""
        ...

    @property
    def quarantined(self) -> tuple[Quarantined, ...]: ...
    @property
    def closed(self) -> Closed | None: ...


class Ending(Protocol):
    """The end of a rank's feed (:class:`ingest.engine.feed.Tail` and its transports' copies):
    batches yielded, rows left over, row counts learnt, the last quarantines."""

    @property
    def steps(self) -> int: ...
    @property
    def leftover(self) -> Runs | Sequence[Run]: ...
    @property
    def learned(self) -> Mapping[int, int]: ...
    @property
    def quarantined(self) -> tuple[Quarantined, ...]: ...


ItemT = TypeVar("ItemT", bound=BatchItem)
EndingT = TypeVar("EndingT", bound=Ending)
BatchT = TypeVar("BatchT")


class RankLink(Protocol):
    """How a rank's loop reaches its book."""

    def ack(
        self,
        rank: int,
        records: list[StepRecord],
        cursor: Cursor | None,
        pieces: Sequence[BatchPieces] = (),
    ) -> None:
        """Record ``rank``'s handed-out batches; ``cursor``: its position after the last;
        ``pieces``: a packing rank's batches for the provenance log
        (:meth:`ingest.core.book.EpochBook.ack`)."""
        ...

    def end(self, rank: int, epoch: int, ending: Ending) -> None:
        """``rank``'s loop reached the end of ``epoch``."""
        ...


class BookLink:
    """A rank's link to a book in its own process."""

    def __init__(self, book: EpochBook[Any]) -> None:
        self.book = book

    def ack(
        self,
        rank: int,
        records: list[StepRecord],
        cursor: Cursor | None,
        pieces: Sequence[BatchPieces] = (),
    ) -> None:
        self.book.ack(rank, records, cursor, pieces=pieces)
        self.book.fold_due()

    def end(self, rank: int, epoch: int, ending: Ending) -> None:
        self.book.finish(
            rank, epoch, ending.steps, ending.leftover, ending.learned, ending.quarantined
        )


class RankLoop:
    """One rank's loop: the batches it hands out, recorded and sent to its book in messages.

    Args:
        rank: The rank.
        link: Its book, in the process or over Ray.
        ack_every: Batches per ack message.
        keep_empty: Hand out a batch whose rows were all quarantined (an empty step), as
            ranks whose steps must stay equal do (Ray); False: record it and leave it out.
        on_quarantined: Told the quarantines each batch and each ending brings (where they
            are logged); None: nothing is told.
    """

    def __init__(
        self,
        rank: int,
        link: RankLink,
        *,
        ack_every: int = ACK_EVERY,
        keep_empty: bool = False,
        on_quarantined: Callable[[Sequence[Quarantined]], None] | None = None,
    ) -> None:
        self.rank = rank
        self.link = link
        self.ack_every = ack_every
        self.keep_empty = keep_empty
        self.on_quarantined = on_quarantined
        self.step = -1
        """The step of the last batch handed out (-1: none yet)."""
        self.cursor: Cursor | None = None
        """The rank's position after that batch (None: none in this epoch yet, or it ended)."""
        self._held: list[StepRecord] = []
        self._pieces: list[BatchPieces] = []
        """A packing rank's batches for the provenance log, sent with the next message."""

    def batches(
        self,
        epoch: int,
        items: Iterable[ItemT | EndingT],
        convert: Callable[[ItemT], BatchT],
        ending: type[EndingT],
    ) -> Iterator[tuple[ItemT, BatchT]]:
        """Hand out the rank's ``items`` of ``epoch`` up to the first ``ending``, which ends it.

        Args:
            epoch: The epoch the items are of.
            items: Batches, then an ending (items after it are not taken).
            convert: Makes a batch to hand out of an item (to torch tensors).
            ending: The class of the item that ends the epoch.

        Yields:
            Each batch handed out, with the item it came from (see :meth:`hand_out`).
        """
        for item in items:
            if isinstance(item, ending):
                self.end(epoch, item)
                return
            batch_item = cast(ItemT, item)  # not the ending (a type checker cannot tell)
            batch = self.hand_out(batch_item, convert)
            if batch is not None:
                yield batch_item, batch

    def hand_out(self, item: ItemT, convert: Callable[[ItemT], BatchT]) -> BatchT | None:
        """Convert ``item``, then record it as handed out; None: leave it out (every row
        quarantined, unless :attr:`keep_empty`).

        The record is held and sent with the others when :attr:`ack_every` are held. A
        conversion that raises records nothing: the batch is read again.
        """
        batch = convert(item)
        commit()  # recorded from here: a Ctrl-C waits for the loop's return
        self._held.append(
            StepRecord(item.step, item.runs, item.rows, item.quarantined, item.closed)
        )
        self.step, self.cursor = item.step, item.cursor
        if len(self._held) >= self.ack_every:
            self.flush()
        self._tell(item.quarantined)
        if item.rows == 0 and not self.keep_empty:
            return None
        return batch

    def log_batch(self, batch: BatchPieces) -> None:
        """A packing rank handed out a batch: its pieces go to the book's provenance log
        with the next message (sent once :attr:`ack_every` are held, as records are)."""
        self._pieces.append(batch)
        if len(self._pieces) >= self.ack_every:
            self.flush()

    def flush(self) -> None:
        """Send the held records to the book (before a state, a rewind, an epoch's end)."""
        if self._held or self._pieces:
            commit()
            held, self._held = self._held, []
            pieces, self._pieces = self._pieces, []
            self.link.ack(self.rank, held, self.cursor, pieces)

    def restart(self, step: int, cursor: Cursor | None = None) -> None:
        """Go on after ``step`` (a loaded state's last, or the rank's last acked when another
        iterator took it over) at ``cursor``, forgetting the records held: the position they
        were of is replaced."""
        self._held, self._pieces = [], []
        self.step, self.cursor = step, cursor

    def end(self, epoch: int, ending: Ending) -> None:
        """The rank's feed reached the end of ``epoch``: its last acks, then the end; the
        next batch handed out starts the next epoch (no cursor until then)."""
        commit()
        self.flush()
        self.link.end(self.rank, epoch, ending)
        self.cursor = None
        self._tell(ending.quarantined)

    def _tell(self, quarantined: Sequence[Quarantined]) -> None:
        if quarantined and self.on_quarantined is not None:
            self.on_quarantined(quarantined)


__all__ = [
    "ACK_EVERY",
    "REMOTE_ACK_EVERY",
    "BatchItem",
    "BookLink",
    "Ending",
    "RankLink",
    "RankLoop",
]
