"""What every rank does with the batches it hands out, whatever carries them. No Ray, no torch.

A rank's loop, under every transport (:class:`ingest.Stream` in one process,
:class:`ingest.DataLoader` with torch worker processes as ranks, a Ray rank iterator fed by
the reader pool), is the same sequence: its feed reads the rank's share of the epoch's plan
(:meth:`ingest.core.book.EpochBook.rank_plan`) into batches that carry their provenance; as
each batch is handed out, its rows are recorded (a :class:`~ingest.core.ledger.StepRecord`)
and held; every :data:`ACK_EVERY` batches the held records go to the book in one message,
which folds them into its consumed intervals every :data:`~ingest.core.book.FOLD_EVERY`
steps (:meth:`~ingest.core.book.EpochBook.fold_due`); at the feed's end the rank reports
the end of its epoch (:meth:`~ingest.core.book.EpochBook.finish`); a state is the book's
snapshot after the acks held are sent. :class:`RankLoop` is that bookkeeping, once; a
:class:`RankLink` is how it reaches the book: :class:`BookLink` in the process, the
coordinator actor over Ray (:mod:`ingest.distributed.rank`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ingest.core.book import EpochBook
from ingest.core.ledger import Closed, Rows, Run, Runs, StepRecord
from ingest.core.quarantine import Quarantined
from ingest.core.state import Cursor

ACK_EVERY = 16
"""Batches whose acks go to the book together: one pass packs them all (one call per batch
cost a third of a one-process loop's own time on a shuffled stream). A state, a rewind and
the end of the epoch send what is held first, so a state still covers every batch handed
out."""


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


class RankLink(Protocol):
    """How a rank's loop reaches its book."""

    def ack(self, rank: int, records: list[StepRecord], cursor: Cursor | None) -> None:
        """Record ``rank``'s handed-out batches; ``cursor``: its position after the last."""
        ...

    def end(self, rank: int, epoch: int, ending: Ending) -> None:
        """``rank``'s loop reached the end of ``epoch``."""
        ...


class BookLink:
    """A rank's link to a book in its own process."""

    def __init__(self, book: EpochBook[Any]) -> None:
        self.book = book

    def ack(self, rank: int, records: list[StepRecord], cursor: Cursor | None) -> None:
        self.book.ack(rank, records, cursor)
        self.book.fold_due()

    def end(self, rank: int, epoch: int, ending: Ending) -> None:
        self.book.finish(
            rank, epoch, ending.steps, ending.leftover, ending.learned, ending.quarantined
        )


class RankLoop:
    """One rank's record of the batches it handed out, sent to its book in messages.

    Args:
        rank: The rank.
        link: Its book, in the process or over Ray.
        ack_every: Batches per ack message.
    """

    def __init__(self, rank: int, link: RankLink, *, ack_every: int = ACK_EVERY) -> None:
        self.rank = rank
        self.link = link
        self.ack_every = ack_every
        self.step = -1
        """The step of the last batch handed out (-1: none yet)."""
        self.cursor: Cursor | None = None
        """The rank's position after that batch."""
        self._held: list[StepRecord] = []

    def handed(
        self,
        step: int,
        runs: Runs | Rows,
        cursor: Cursor,
        *,
        rows: int = -1,
        quarantined: tuple[Quarantined, ...] = (),
        closed: Closed | None = None,
    ) -> None:
        """A batch is handed out: hold its record, and send the held ones when
        :attr:`ack_every` are held. Call it only once the batch is ready to go (converted):
        a batch that failed before is read again."""
        self._held.append(StepRecord(step, runs, rows, quarantined, closed))
        self.step, self.cursor = step, cursor
        if len(self._held) >= self.ack_every:
            self.flush()

    def flush(self) -> None:
        """Send the held records to the book (before a state, a rewind, an epoch's end)."""
        if self._held:
            held, self._held = self._held, []
            self.link.ack(self.rank, held, self.cursor)

    def restart(self, step: int, cursor: Cursor | None = None) -> None:
        """Go on after ``step`` (a loaded state's last, or the rank's last acked when another
        iterator took it over) at ``cursor``, forgetting the records held: the position they
        were of is replaced."""
        self._held = []
        self.step, self.cursor = step, cursor

    def end(self, epoch: int, ending: Ending) -> None:
        """The rank's feed reached the end of ``epoch``: its last acks, then the end."""
        self.flush()
        self.link.end(self.rank, epoch, ending)


__all__ = ["ACK_EVERY", "BookLink", "Ending", "RankLink", "RankLoop"]
