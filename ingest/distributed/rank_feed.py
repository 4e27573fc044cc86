"""One rank's feed inside a reader actor, and what it hands the rank.

A :class:`RankFeed` runs the engine's :class:`~ingest.engine.feed.Feed` for one rank in a
thread of its reader actor (:mod:`ingest.distributed.pool`), a bounded number of ready
batches ahead of the rank, within the reader's byte budget; the rank takes them a few per
call as :class:`Item` and, at the epoch's end, an :class:`End`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import ray

from ingest.core.ledger import Closed, Rows, Runs
from ingest.core.quarantine import Quarantined
from ingest.core.state import Cursor
from ingest.engine.feed import Feed, Ready, Tail
from ingest.engine.prefetch import in_order
from ingest.engine.spec import StreamSpec
from ingest.storage.sources import Source

WAIT_S = 5.0
"""Longest wait on a condition before it is checked again (every wait has a timeout)."""
ENDED = -2
"""``RankFeed.at`` once the feed handed out its :class:`End`."""


class FeedHost(Protocol):
    """What a rank's feed needs of the reader actor it runs in (``ingest.distributed.pool``)."""

    spec: StreamSpec
    source: Source
    timeout_s: float
    coordinator: Any

    @property
    def depth(self) -> int:
        """Ready batches a feed holds for its rank, at most."""
        ...

    def wait_for_budget(self, nbytes: int, stopped: Any) -> bool: ...
    def release(self, nbytes: int) -> None: ...
    def decoded(self, table: pa.Table) -> Any: ...

    @property
    def feed_transform(self) -> Callable[[pa.Table], Any] | None:
        """The transform the feed runs itself: with ``derived=``, on the units it reads whole
        (kept as copies) and on the rest of its batches; None: the pool decodes each batch
        (:meth:`decoded`)."""
        ...

    @property
    def parallel_batches(self) -> int:
        """Batches a feed may decode at once (its transform's ``parallel_batches``)."""
        ...


@dataclass(frozen=True, slots=True)
class Item:
    """A ready batch as a rank receives it (an :class:`ingest.engine.loop.BatchItem`).

    ``batch`` is the Arrow table itself when the feed's own actor made it (it travels in the
    ``take`` call's result, a few batches per object), or an object ref when another actor
    of the pool decoded it.
    """

    step: int
    runs: Runs | Rows
    cursor: Cursor
    batch: Any
    nbytes: int
    rows: int = -1
    quarantined: tuple[Quarantined, ...] = ()
    """See :class:`ingest.engine.feed.Ready`."""
    closed: Closed | None = None

    @property
    def table(self) -> Any:
        """The batch (a packing rank's read step: :mod:`ingest.distributed.rank_pack`)."""
        return self.batch


@dataclass(frozen=True, slots=True)
class End:
    """The end of a rank's epoch (an :class:`ingest.engine.loop.Ending`); see
    :class:`ingest.engine.feed.Tail`."""

    epoch: int
    steps: int
    leftover: Runs
    learned: dict[int, int]
    quarantined: tuple[Quarantined, ...] = ()


@dataclass(frozen=True, slots=True)
class TransformFailed:
    """What a batch decodes to when its transform raised under ``on_error="skip"``: the
    rank quarantines the batch's rows and delivers ``empty`` at its step."""

    reason: str
    rows: int
    empty: Any


class FeedLostError(Exception):
    """This reader holds no feed for the rank's session and epoch: a restarted reader's new
    process, or an epoch the rank has not started here. The rank resumes or starts it."""


class RankFeed:
    """One rank's feed in a reader actor: a thread filling a bounded queue of items."""

    def __init__(
        self,
        reader: FeedHost,
        rank: int,
        session: int,
        epoch: int,
        resume: tuple[int, Cursor | None] | None = None,
    ) -> None:
        self.rank, self.session, self.epoch = rank, session, epoch
        self._resume = resume
        self.lease = 0
        """The lease of the rank's iterator this feed serves (the reader's ``adopt``)."""
        self.at: int | None = None if resume is None else resume[0]
        """The step of the next batch to hand out; None: the share's first (none handed)."""
        self._reader = reader
        self._decodes = True
        """Whether the pool decodes each batch (no ``derived=``: the feed runs no transform)."""
        self._queue: deque[Item | End | BaseException] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._moved = False
        self.queued_bytes = 0
        """Bytes of this feed's batches held within the reader's budget: queued, and the one
        being decoded (reserved by :meth:`_reserve`, released by :meth:`take` and
        :meth:`stop`)."""
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"ingest-feed-rank{rank}"
        )
        self._thread.start()

    def _room(self) -> bool:
        """Wait until the queue has room for one more item; False: the feed stopped."""
        with self._cond:
            while not self._stop and len(self._queue) >= self._reader.depth:
                self._cond.wait(WAIT_S)
            return not self._stop

    def _reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` of the reader's budget for a batch about to be decoded and queued
        (waiting for room first, so that a full queue holds no budget it cannot use);
        False: the feed stopped, and nothing is held."""
        if not self._room() or not self._reader.wait_for_budget(nbytes, lambda: self._stop):
            return False
        with self._cond:  # stop() releases what the feed holds, under the same lock
            if self._stop:
                self._reader.release(nbytes)
                return False
            self.queued_bytes += nbytes
            return True

    def _put(self, item: Item | End | BaseException) -> bool:
        with self._cond:
            while not self._stop and len(self._queue) >= self._reader.depth:
                self._cond.wait(WAIT_S)
            if self._stop:
                return False
            self._queue.append(item)
            self._cond.notify_all()
            return True

    def _run(self) -> None:
        reader = self._reader
        try:
            coordinator = reader.coordinator
            if self._resume is None:
                ref = coordinator.rank_plan.remote(self.rank, self.epoch, self.session)
            else:
                next_step, cursor = self._resume
                ref = coordinator.rank_resume.remote(
                    self.rank, self.epoch, next_step, cursor, self.session
                )
            try:
                plan = ray.get(ref, timeout=reader.timeout_s)
            except ray.exceptions.RayActorError as e:
                from ingest.distributed.coordinator import CoordinatorLostError

                raise CoordinatorLostError(e) from None
            transform = reader.feed_transform
            self._decodes = transform is None
            feed = Feed(plan, reader.spec.feed_config(), reader.source, transform)
            try:
                # Batches are decoded in order, up to the transform's parallel_batches at once.
                decoded = in_order(
                    self._decode, self._reserved(feed), reader.parallel_batches, "decode"
                )
                for got in decoded:
                    if isinstance(got, End):
                        self._put(got)
                        return
                    if isinstance(got, tuple):  # the decode raised: its bytes go back
                        self._unreserve(got[1])
                        raise got[0]
                    if not self._put(got):
                        return
                    if self._stop:
                        return
            finally:
                feed.close()
        except BaseException as e:  # forwarded to the rank, which re-raises it
            self._put(e)

    def _reserved(self, feed: Feed) -> Iterator[tuple[Ready, int] | End]:
        """The feed's batches, each with its bytes reserved in the reader's budget, then its
        end; stops early when the feed is stopped."""
        for out in feed:
            if self._stop:
                return
            if isinstance(out, Tail):
                yield End(self.epoch, out.steps, out.leftover, out.learned, out.quarantined)
                return
            nbytes = int(out.table.nbytes)
            if not self._reserve(nbytes):
                return
            yield out, nbytes

    def _decode(self, got: tuple[Ready, int] | End) -> Item | End | tuple[BaseException, int]:
        """A batch decoded (in a thread of :func:`in_order`), or what its decode raised."""
        if isinstance(got, End):
            return got
        ready, nbytes = got
        try:
            return self._item(ready, nbytes)
        except BaseException as e:
            return e, nbytes

    def _unreserve(self, nbytes: int) -> None:
        with self._cond:
            if not self._stop:  # else stop() released it
                self.queued_bytes -= nbytes
                self._reader.release(nbytes)

    def _item(self, ready: Ready, nbytes: int) -> Item:
        batch = self._reader.decoded(ready.table) if self._decodes else ready.table
        return Item(
            ready.step,
            ready.runs,
            ready.cursor,
            batch,
            nbytes,
            ready.rows,
            ready.quarantined,
            ready.closed,
        )

    def take(self, most: int, wait_s: float) -> list[Item | End]:
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._queue:
                if self._moved:
                    raise FeedLostError(f"the feed of rank {self.rank} moved to another reader")
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(min(left, WAIT_S))
            out: list[Item | End] = []
            taken = 0
            while self._queue and len(out) < most:
                item = self._queue.popleft()
                if isinstance(item, BaseException):
                    if out:
                        self._queue.appendleft(item)
                        break
                    raise item
                if isinstance(item, Item):
                    taken += item.nbytes
                    self.at = item.step + 1
                else:
                    self.at = ENDED
                out.append(item)
            self.queued_bytes -= taken
            self._reader.release(taken)
            self._cond.notify_all()
            return out

    @property
    def depth(self) -> int:
        """Ready batches held for the rank now (counted under the lock that guards the queue:
        the feed's thread puts and the rank's takes pop while the reader counts)."""
        with self._cond:
            return sum(isinstance(item, Item) for item in self._queue)

    def drop(self) -> None:
        """Stop, and fail the rank's takes here with :class:`FeedLostError`: the feed moved
        to another reader (a take waiting now fails at once, not after its wait)."""
        with self._cond:
            self._moved = True
        self.stop()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._queue.clear()
            self._reader.release(self.queued_bytes)
            self.queued_bytes = 0
            self._cond.notify_all()


__all__ = [
    "ENDED",
    "WAIT_S",
    "End",
    "FeedHost",
    "FeedLostError",
    "Item",
    "RankFeed",
    "TransformFailed",
]
