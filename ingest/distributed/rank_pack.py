"""A Ray rank that packs documents into sequences: equal steps on every rank, exact by token.

The readers tokenize (the stream's transform, each row keeping its input row in
:data:`ingest.engine.pack.ORIGIN`) and cut the rank's share into read steps of
``Pack.read_rows`` documents, as any stream's batches. The rank packs them in its own
process (a :class:`~ingest.engine.pack.PackedRank`: a few microseconds a document) and acks a
read step to the coordinator once all its documents were handed out whole.

**Equal steps.** Equal shares of documents make different numbers of sequences. A rank hands
out its batch ``k`` only when every rank has made ``k + 1`` batches (handed out, or full and
ready), and it asks the coordinator (``agree``) only when ``k`` reaches the last answer; it
reports all it has made, packing the read steps it already holds first, so one answer covers
many batches. The epoch ends at the fewest batches that a rank whose feed ended made (only
full batches count: every batch has ``batch_size`` sequences), once every rank has made as
many.

**The surplus.** A rank past that count hands out none of its other sequences. It reads the
rest of its share (the feed must reach its end), and in one call to the coordinator it acks
its read steps not acked yet with their documents done only, and gives the documents not
handed out to the epoch's remainder: the next epoch carries them in first (or, with
``remainder="drop"``, drops and counts them), a document cut keeping its offset. The next
epoch starts on a rank only once every rank closed this one (``node_start``). A row carried
into the epoch that falls in the surplus again, while its own copy of the epoch does too, is
carried once and its other copy owed, with its offset (:mod:`ingest.core.carry`).

**States.** At batch ``k`` every rank sends the documents in flight it handed out (in part,
or whole in a read step not acked) as its part of the state (``node_state``); the
coordinator answers, once all asked, the book's snapshot of the read steps acked (no
cursors: a resume shares the rest anew at any world size) with those documents' offsets (the
state's ``pack`` part).

**A reader lost.** The rank's packing keeps what it holds; its feed restarts after its last
read step acked, and the read steps it packed already, read again, are left out.

**The iterator.** :class:`PackedDriver` is the rank's driver
(:class:`~ingest.distributed.rank_link.RankDriver`): it reaches its rank iterator only
through an :class:`~ingest.distributed.rank_link.IteratorLink` (the coordinator's calls,
taking the rank over, the feed's items and the acks), and the coordinator through its three
generic calls for a rank's node: ``node_start``, ``agree`` and ``node_state``.

**One iterator per epoch.** A rank's packing lives in its iterator's process, so another
iterator cannot take a rank over in the middle of an epoch (it is refused, naming the fix);
a new loop over the same iterator goes on where the last one left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ingest.core.errors import IngestError, StreamTimeoutError
from ingest.distributed.rank_feed import End, Item
from ingest.distributed.rank_link import IteratorLink
from ingest.engine.grouping import Grouping
from ingest.engine.pack import PackedRank

if TYPE_CHECKING:
    from ingest.engine.convert import Batch


class PackedDriver:
    """One Ray rank's packing across its loops (see the module docstring)."""

    def __init__(self, packing: PackedRank, it: IteratorLink) -> None:
        self.packing = packing
        self._it = it
        self.epoch: int | None = None
        """The epoch being packed (None: none started, or the last one closed)."""
        self.fed = -1
        """The last read step packed (or read for the surplus)."""
        self.allowed = 0
        """Batches every rank has made (the coordinator's last answer)."""
        self.final: int | None = None
        """The epoch's batches on every rank, once known."""
        self.ended: End | None = None
        """The feed's end, once taken."""
        self.unread: list[Item] = []

    @classmethod
    def of(cls, pack: Grouping, batch_size: int, it: IteratorLink) -> PackedDriver:
        """A rank's packing over its iterator's loop, no epoch started."""
        return cls(PackedRank(pack, batch_size, it.loop, None), it)

    @property
    def step(self) -> int:
        """The step of the last batch handed out (equal on every rank): the rank's batches
        since the run began, less one (:class:`ingest.engine.pack.StepCount`); -1: none."""
        return self.packing.step

    def _start(self, epoch: int, offsets: dict[int, int], first: int | None, logs: bool) -> None:
        self.packing.load_offsets(offsets, first, logs)
        self.epoch, self.fed, self.allowed, self.final, self.ended = epoch, -1, 0, None, None
        self.unread = []

    def begin(self) -> int:
        it = self._it
        deadline = time.monotonic() + it.timeout_s
        delay = 0.01
        while True:  # the epoch before must be closed on every rank
            got = it.call("node_start", it.rank, it.session())
            if got is not None:
                break
            if time.monotonic() > deadline:
                raise StreamTimeoutError(
                    f"rank {it.rank} waited {it.timeout_s:.0f} s for the other ranks to "
                    "end the epoch before; every rank must loop over its iterator to the end"
                )
            time.sleep(delay)
            delay = min(2 * delay, 0.2)
        epoch, offsets, busy, first, logs = got
        taken = it.take_over()
        if taken != epoch:  # pragma: no cover - node_start and claim read the same book
            raise IngestError(f"rank {it.rank}: epoch {taken} claimed, {epoch} expected")
        if self.epoch != epoch:
            if busy:
                raise IngestError(
                    f"rank {it.rank} made batches of epoch {epoch} in another iterator: a "
                    "packing rank's documents in flight live in the iterator that packed "
                    "them, so a new iterator cannot go on in the middle of an epoch. Loop "
                    "over the same iterator again, or resume from the last state "
                    "(load_state_dict)"
                )
            self._start(epoch, offsets, first, logs)
        return int(epoch)

    def batches(self, epoch: int) -> Iterator[Batch]:
        """The rank's batches of ``epoch``, equal in number on every rank, then its end."""
        it = self._it
        items = it.items(epoch)
        packing = self.packing
        ahead = 2 * it.fetch_batches
        delay = 0.002
        deadline = time.monotonic() + it.timeout_s
        while True:
            k = packing.handed
            if self.final is not None and k >= self.final:
                self._close(epoch, items)
                return
            if k < self.allowed and packing.ready:
                delay = 0.002
                deadline = time.monotonic() + it.timeout_s
                yield packing.next_batch()
                continue
            if not packing.ready and self.ended is None:
                self._pull(next(items))
                continue
            while self.ended is None and it.holds_items() and packing.ready < ahead:
                self._pull(next(items))  # held already: more made, fewer questions
            low, final = it.call(
                "agree", it.rank, epoch, it.session(), k + packing.ready, self.ended is not None
            )
            self.allowed, self.final = low, final
            if k < low or final is not None:
                continue
            if time.monotonic() > deadline:
                raise StreamTimeoutError(
                    f"rank {it.rank} waited {it.timeout_s:.0f} s for the other ranks to "
                    f"make batch {k} of epoch {epoch} (they made {low}); every rank must loop "
                    "over its iterator"
                )
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def _pull(self, item: Item | End) -> None:
        if isinstance(item, End):
            self.ended = item
            self.packing.close_all()
        else:
            self.packing.add(item)
            self.fed = item.step

    def _close(self, epoch: int, items: Iterator[Item | End]) -> None:
        """The epoch's last batch was handed out: the rest of the share read, the surplus
        carried, the epoch closed at the coordinator (one call)."""
        it = self._it
        while self.ended is None:
            item = next(items)
            if isinstance(item, End):
                self.ended = item
            else:
                self.unread.append(item)
                self.fed = item.step
        records, carry, cut = self.packing.surplus(self.unread)
        end = self.ended
        it.flush()
        it.call(
            "close_epoch",
            epoch,
            end.steps,
            end.leftover,
            end.learned,
            it.session(),
            end.quarantined,
            it.rank,
            records,
            carry,
            cut,
        )
        last = max([it.loop.step, *(r.step for r in records)])
        it.loop.restart(last)
        self.epoch, self.unread = None, []

    def _entries(self) -> list[tuple[int, int]]:
        """The rank's documents in flight (see the module docstring)."""
        return self.packing.in_flight() if self.epoch is not None else []

    def skip(self, item: Item) -> bool:
        if item.step <= self.fed:
            return True
        if self.fed >= 0 and item.step != self.fed + 1:
            raise IngestError(
                f"rank {self._it.rank} got read step {item.step} after {self.fed}: its "
                "reader's feed did not continue where it was. Resume from the last checkpoint"
            )
        return False

    def left(self, epoch: int) -> None:
        it = self._it
        handed = self.packing.handed if self.epoch is not None else 0
        it.call("node_state", it.rank, it.session(), epoch, self._entries(), None, 0.0, handed)

    def counts(self) -> dict[str, int]:
        return self.packing.counts()

    def state(self) -> dict[str, Any]:
        it = self._it
        it.flush()
        if self.epoch is None:
            epoch, step, held = it.upcoming_epoch(), -1, []
        else:
            epoch, step, held = self.epoch, self.packing.handed, self._entries()
        timeout = it.timeout_s
        return it.call(  # type: ignore[no-any-return]
            "node_state",
            it.rank,
            it.session(),
            epoch,
            held,
            step,
            timeout,
            timeout_s=timeout + 30,
        )


__all__ = ["PackedDriver"]
