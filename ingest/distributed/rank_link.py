"""What a Ray rank's driver needs of its rank iterator, and what the iterator needs of it.

A :class:`~ingest.distributed.rank.RankIterator` owns the Ray side of a rank: the calls to
the coordinator, taking the rank over, fetching read steps from the reader pool, acks. What
happens between the feed's read steps and the user's loop is its driver's
(:class:`RankDriver`), built in one place from the stream's ``pack``
(:func:`ingest.distributed.rank_driver.rank_driver`): a plain rank hands each read step out as
a batch (:class:`~ingest.distributed.rank_driver.PlainDriver`); a rank with a grouping
(``pack=``) regroups their documents, its ranks agreeing on a number of steps through the
coordinator (:class:`~ingest.distributed.rank_pack.PackedDriver`). The iterator drives either
the same way; a driver reaches the iterator only through an :class:`IteratorLink`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ingest.distributed.rank_feed import End, Item
from ingest.engine.loop import RankLoop

if TYPE_CHECKING:
    from ingest.engine.convert import Batch


class IteratorLink(Protocol):
    """What a rank's driver needs of its rank iterator
    (:class:`~ingest.distributed.rank.RankIterator`), which hands its driver one."""

    @property
    def rank(self) -> int:
        """The rank."""
        ...

    @property
    def timeout_s(self) -> float:
        """The longest wait for the coordinator or the other ranks
        (:attr:`~ingest.distributed.rank.RankOptions.timeout_s`)."""
        ...

    @property
    def fetch_batches(self) -> int:
        """Ready batches asked of the reader pool per call
        (:attr:`~ingest.distributed.rank.RankOptions.fetch_batches`)."""
        ...

    @property
    def loop(self) -> RankLoop:
        """The rank's loop: the read steps handed out and their acks."""
        ...

    def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Call the coordinator's ``method`` and wait for its answer (the coordinator's
        death is said as such, with how to resume)."""
        ...

    def session(self) -> int:
        """The coordinator session the iterator belongs to."""
        ...

    def take_over(self) -> int:
        """Take the rank over for a loop at the coordinator; returns its epoch."""
        ...

    def items(self, epoch: int) -> Iterator[Item | End]:
        """The rank's read steps of ``epoch`` from its reader, up to its :class:`End`
        (a lost reader's feed goes on after the last read step acked; the driver's
        :meth:`RankDriver.skip` leaves out what it had already)."""
        ...

    def holds_items(self) -> bool:
        """Whether read steps fetched already wait to be taken (taking one asks nothing)."""
        ...

    def flush(self) -> None:
        """Send the acks held back, and wait until the coordinator has every ack sent."""
        ...

    def upcoming_epoch(self) -> int:
        """The epoch the iterator's next loop runs."""
        ...


class RankDriver(Protocol):
    """A rank's read steps in, its batches out, its part of the state (see the module
    docstring); one per rank iterator, across its loops."""

    @property
    def step(self) -> int:
        """The step of the last batch handed out (-1 before any), equal on every rank at
        the same batch."""
        ...

    def begin(self) -> int:
        """Take the rank over for a loop; returns its epoch (started, or gone on with)."""
        ...

    def batches(self, epoch: int) -> Iterator[Batch]:
        """The rank's batches of ``epoch`` (the rest of them, for a loop that goes on), then
        the epoch's end told to the coordinator."""
        ...

    def skip(self, item: Item) -> bool:
        """Whether the feed's ``item`` is one this rank has had already (a lost reader's
        feed restarted after its last read step acked).

        Raises:
            IngestError: If the feed skipped a read step.
        """
        ...

    def left(self, epoch: int) -> None:
        """The loop over ``epoch`` left before its end (its acks sent): what the rank holds
        beyond them goes to the coordinator, for a state taken on the driver."""
        ...

    def state(self) -> dict[str, Any]:
        """The state after the rank's last batch, the same on every rank: every rank calls
        it at the same batch."""
        ...

    def counts(self) -> dict[str, int]:
        """What the batches handed out held beyond rows (``tokens`` and ``padding_tokens``
        with ``pack``; none for a plain rank)."""
        ...


__all__ = ["IteratorLink", "RankDriver"]
