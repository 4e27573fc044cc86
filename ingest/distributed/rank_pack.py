"""A Ray rank that packs documents into sequences: equal steps on every rank, exact by token.

The readers tokenize (the stream's transform, each row keeping its input row in
:data:`ingest.engine.pack.ORIGIN`) and cut the rank's share into read steps of
``Pack.read_rows`` documents, as any stream's batches. The rank packs them in its own
process (a :class:`~ingest.engine.pack.PackedRank`: a few microseconds a document) and acks a
read step to the coordinator once all its documents were handed out whole.

**Equal steps.** Equal shares of documents make different numbers of sequences. A rank hands
out its batch ``k`` only when every rank has made ``k + 1`` batches (handed out, or full and
ready), and it asks the coordinator (``made``) only when ``k`` reaches the last answer; it
reports all it has made, packing the read steps it already holds first, so one answer covers
many batches. The epoch ends at the fewest batches that a rank whose feed ended made (only
full batches count: every batch has ``batch_size`` sequences), once every rank has made as
many.

**The surplus.** A rank past that count hands out none of its other sequences. It reads the
rest of its share (the feed must reach its end), and in one call to the coordinator it acks
its read steps not acked yet with their documents done only, and gives the documents not
handed out to the epoch's remainder: the next epoch carries them in first (or, with
``remainder="drop"``, drops and counts them), a document cut keeping its offset. The next
epoch starts on a rank only once every rank closed this one (``pack_start``). A row carried
into the epoch that falls in the surplus again, while its own copy of the epoch does too, is
carried once and its other copy owed, with its offset (:mod:`ingest.core.carry`).

**States.** At batch ``k`` every rank sends the documents in flight it handed out (in part,
or whole in a read step not acked) with its state call; the coordinator answers, once all
asked, the book's snapshot of the read steps acked (no cursors: a resume shares the rest
anew at any world size) with those documents' offsets (the state's ``pack.tokens``).

**A reader lost.** The rank's packing keeps what it holds; its feed restarts after its last
read step acked, and the read steps it packed already, read again, are left out.

**The iterator.** The packing reaches its rank iterator only through an
:class:`IteratorLink` (:class:`~ingest.distributed.rank.RankIterator` hands it one): the
coordinator's calls, taking the rank over, the feed's items and the acks.

**One iterator per epoch.** A rank's packing lives in its iterator's process, so another
iterator cannot take a rank over in the middle of an epoch (it is refused, naming the fix);
a new loop over the same iterator goes on where the last one left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ingest.core.errors import IngestError, StreamTimeoutError
from ingest.distributed.rank_feed import End, Item
from ingest.engine.grouping import Grouping
from ingest.engine.loop import RankLoop
from ingest.engine.pack import PackedRank

if TYPE_CHECKING:
    from ingest.engine.convert import Batch


class IteratorLink(Protocol):
    """What a packing rank needs of its rank iterator
    (:class:`~ingest.distributed.rank.RankIterator`), which hands its packing one."""

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
        (a lost reader's feed goes on after the last read step acked)."""
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


@dataclass
class RankPacking:
    """One Ray rank's packing across its loops (see the module docstring)."""

    packing: PackedRank
    epoch: int | None = None
    """The epoch being packed (None: none started, or the last one closed)."""
    fed: int = -1
    """The last read step packed (or read for the surplus)."""
    allowed: int = 0
    """Batches every rank has made (the coordinator's last answer)."""
    final: int | None = None
    """The epoch's batches on every rank, once known."""
    ended: End | None = None
    """The feed's end, once taken."""
    unread: list[Item] = field(default_factory=list)

    @classmethod
    def of(cls, pack: Grouping, batch_size: int, it: IteratorLink) -> RankPacking:
        """A rank's packing over its iterator's loop, no epoch started."""
        return cls(PackedRank(pack, batch_size, it.loop, None))

    def start(self, epoch: int, offsets: dict[int, int]) -> None:
        self.packing.load_offsets(offsets)
        self.epoch, self.fed, self.allowed, self.final, self.ended = epoch, -1, 0, None, None
        self.unread = []


def begin(it: IteratorLink, run: RankPacking) -> int:
    """Take the rank over for a loop; returns its epoch (started, or gone on with)."""
    deadline = time.monotonic() + it.timeout_s
    delay = 0.01
    while True:  # the epoch before must be closed on every rank
        got = it.call("pack_start", it.rank, it.session())
        if got is not None:
            break
        if time.monotonic() > deadline:
            raise StreamTimeoutError(
                f"rank {it.rank} waited {it.timeout_s:.0f} s for the other ranks to "
                "end the epoch before; every rank must loop over its iterator to the end"
            )
        time.sleep(delay)
        delay = min(2 * delay, 0.2)
    epoch, offsets, busy = got
    taken = it.take_over()
    if taken != epoch:  # pragma: no cover - pack_start and claim read the same book
        raise IngestError(f"rank {it.rank}: epoch {taken} claimed, {epoch} expected")
    if run.epoch != epoch:
        if busy:
            raise IngestError(
                f"rank {it.rank} made batches of epoch {epoch} in another iterator: a packing "
                "rank's documents in flight live in the iterator that packed them, so a "
                "new iterator cannot go on in the middle of an epoch. Loop over the same "
                "iterator again, or resume from the last state (load_state_dict)"
            )
        run.start(epoch, offsets)
    return int(epoch)


def batches(it: IteratorLink, run: RankPacking, epoch: int) -> Iterator[Batch]:
    """The rank's batches of ``epoch``, equal in number on every rank, then its end."""
    items = it.items(epoch)
    packing = run.packing
    ahead = 2 * it.fetch_batches
    delay = 0.002
    deadline = time.monotonic() + it.timeout_s
    while True:
        k = packing.handed
        if run.final is not None and k >= run.final:
            _close(it, run, epoch, items)
            return
        if k < run.allowed and packing.ready:
            delay = 0.002
            deadline = time.monotonic() + it.timeout_s
            yield packing.next_batch()
            continue
        if not packing.ready and run.ended is None:
            _pull(run, next(items))
            continue
        while run.ended is None and it.holds_items() and packing.ready < ahead:
            _pull(run, next(items))  # held already: more made, fewer questions
        low, final = it.call(
            "made", it.rank, epoch, it.session(), k + packing.ready, run.ended is not None
        )
        run.allowed, run.final = low, final
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


def _pull(run: RankPacking, item: Item | End) -> None:
    if isinstance(item, End):
        run.ended = item
        run.packing.close_all()
    else:
        run.packing.add(item)
        run.fed = item.step


def _close(it: IteratorLink, run: RankPacking, epoch: int, items: Iterator[Item | End]) -> None:
    """The epoch's last batch was handed out: the rest of the share read, the surplus
    carried, the epoch closed at the coordinator (one call)."""
    while run.ended is None:
        item = next(items)
        if isinstance(item, End):
            run.ended = item
        else:
            run.unread.append(item)
            run.fed = item.step
    records, carry, cut = run.packing.surplus(run.unread)
    end = run.ended
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
    run.epoch, run.unread = None, []


def entries(run: RankPacking) -> list[tuple[int, int]]:
    """The rank's documents in flight (see the module docstring)."""
    return run.packing.in_flight() if run.epoch is not None else []


def skip(run: RankPacking, item: Item | End) -> bool:
    """Whether ``item`` is a read step packed already (a lost reader's feed restarted after
    its last read step acked: :meth:`IteratorLink.items`).

    Raises:
        IngestError: If the feed skipped a read step.
    """
    if isinstance(item, End):
        return False
    if item.step <= run.fed:
        return True
    if run.fed >= 0 and item.step != run.fed + 1:
        raise IngestError(
            f"rank {run.packing.rank.rank} got read step {item.step} after {run.fed}: its "
            "reader's feed did not continue where it was. Resume from the last checkpoint"
        )
    return False


def state(it: IteratorLink, run: RankPacking | None) -> dict[str, Any]:
    """The state after the rank's last batch, the same on every rank (see the module
    docstring): every rank calls it at the same batch."""
    it.flush()
    if run is None or run.epoch is None:
        epoch, step, held = it.upcoming_epoch(), -1, []
    else:
        epoch, step, held = run.epoch, run.packing.handed, entries(run)
    timeout = it.timeout_s
    return it.call(  # type: ignore[no-any-return]
        "pack_state",
        it.rank,
        it.session(),
        epoch,
        step,
        held,
        timeout,
        timeout_s=timeout + 30,
    )


__all__ = ["IteratorLink", "RankPacking", "batches", "begin", "entries", "skip", "state"]
