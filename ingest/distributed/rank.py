"""The rank iterator: the thin torch side inside each training worker.

It takes ready batches of its rank from the stream's reader pool (one call per few batches,
the next call in flight while the loop trains) and runs the rank's loop
(:meth:`ingest.engine.loop.RankLoop.batches`) over them: each is wrapped as torch tensors
(zero-copy), and what the loop consumed is acked to the coordinator a few batches per
message. It never parses, decodes or plans; what is its own is taking the rank over
(leases), fetching, and going on after a reader is lost.

Which batches a state covers: a batch counts as consumed once the iterator has handed it to
the loop. ``state_dict()`` (on every rank at the same step) covers every batch handed out up
to that step; an iterator left early (``break``, an exception, ``close()``) sends its held
acks before it returns, so a state taken on the driver afterwards covers every batch its
loop received, and a new loop over the same iterator continues right after them. A state
taken on the driver while loops of this process are open has them send what they hold
first (:func:`flush_loops`; a loop in another thread, between two of its batches).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import ray

from ingest.core.errors import IngestError, StateError, StreamTimeoutError, SupersededError
from ingest.core.ledger import StepRecord
from ingest.core.provenance import BatchPieces
from ingest.core.quarantine import Quarantined
from ingest.core.state import Cursor
from ingest.core.validate import COUNT, SECONDS, check_numbers
from ingest.distributed.coordinator import CoordinatorLostError
from ingest.distributed.metrics import RankMeter
from ingest.distributed.rank_driver import rank_driver
from ingest.distributed.rank_feed import End, FeedLostError, Item, TransformFailed
from ingest.distributed.rank_link import RankDriver
from ingest.distributed.unwrap import unwrap
from ingest.engine import interrupts
from ingest.engine.grouping import Grouping
from ingest.engine.loop import REMOTE_ACK_EVERY, Ending, RankLoop

if TYPE_CHECKING:
    import torch

    from ingest.engine.convert import Batch


def _import_torch_meanwhile() -> None:
    """Import torch (1-2 s) on a thread while the rank joins and its first batch comes.

    torch is imported where batches become tensors, not with this module: a driver that
    makes a :class:`ingest.RayStream` never needs it, and a fresh rank process overlaps it
    with its first calls to the coordinator and the reader.

    Not a daemon: a process that ends while the import goes on (a rank that got no batch)
    waits for it to finish. Cut short at exit, a half-imported torch printed three
    "Exception ignored" tracebacks from its finalizers.
    """
    if "torch" not in sys.modules:
        threading.Thread(
            target=importlib.import_module,
            args=("ingest.engine.convert",),
            name="ingest-import-torch",
            daemon=False,
        ).start()


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOptions:
    """How a rank iterator delivers batches.

    Attributes:
        fetch_batches: Ready batches asked for per call to the reader pool; the next call
            is in flight while the loop consumes these. Each call costs the rank and the
            reader CPU, and its result is one object in Ray's object store (CPU of the
            raylet), whatever the number of batches in it, so a take carries many: takes of
            16 rather than 4 cut the CPU of a warm 2-rank ``ingest bench`` epoch by a fifth
            to a third. A reader holds at most ``ReaderPool.prefetch_batches`` ready batches
            for its rank, within its byte budget: a take of large batches carries fewer.
        ack_every: Batches per ack message to the coordinator
            (:data:`ingest.engine.loop.REMOTE_ACK_EVERY`, 64, where a ``Stream`` or a
            ``DataLoader`` records every :data:`~ingest.engine.loop.ACK_EVERY` in its own
            process).
        pin_memory: Pin tensors (where torch has an accelerator to pin for) for fast
            host-to-device copies.
        device: Move tensors to this device (``"cuda"``, ``"cuda:1"``, a ``torch.device``
            such as ``ray.train.torch.get_device()``) before yielding.
        timeout_s: Longest wait for the coordinator, the pool or a snapshot.

    ``pin_memory`` and ``device`` apply to every kind of batch (plain, packed, a mixture's)
    as it leaves the rank (:func:`ingest.engine.convert.placed`).
    """

    fetch_batches: int = 16
    ack_every: int = REMOTE_ACK_EVERY
    pin_memory: bool = False
    device: str | torch.device | None = None
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        check_numbers(self, "RankOptions", fetch_batches=COUNT, ack_every=COUNT, timeout_s=SECONDS)


@dataclass  # not slotted: the process's live iterators are held weakly (_take_over)
class RankIterator:
    """Batches of one rank, epoch after epoch; picklable, iterate it in any Ray worker.

    Created by :meth:`ingest.RayStream.rank_iterator` or :func:`ingest.train.rank_iterator`.

    One iterator of a rank delivers at a time. Each ``for`` loop starts by taking the rank
    over at the coordinator (:meth:`ingest.distributed.coordinator._Coordinator.claim`): a
    loop of the same iterator goes on with the batches it holds; a new iterator of the rank,
    or a copy sent to another task (a copy carries no batch: it is a new iterator), goes on
    right after the last batch the rank acked, and the batches an older iterator had
    fetched but not handed out are read again for it. An older iterator of the same process
    sends its acks first; one still in a loop then stops with :class:`ingest.SupersededError`.
    """

    coordinator: Any
    reader: Any
    rank: int
    options: RankOptions = field(default_factory=RankOptions)
    session: int | None = None
    """The coordinator session this iterator belongs to (set on first use)."""
    epoch: int | None = None
    _held: deque[Item | End] = field(default_factory=deque)
    _inflight: Any = None
    _acks: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)
    """Ack messages sent and not yet answered, oldest first, with their arguments."""
    stream: str = ""
    """The stream's name (its coordinator's), the ``stream`` tag of its metrics."""
    _meter: RankMeter | None = None
    lease: int = 0
    """This iterator's lease of the rank (0: none yet; see :meth:`_take_over`)."""
    _superseded: bool = False
    """A newer iterator of the rank in this process took it over while this one's loop ran."""
    _replaced: bool = False
    """A state was loaded into the stream on this process's driver while this one's loop ran
    (:func:`stop_loops`)."""
    _interrupted: bool = False
    """A Ctrl-C ended the last loop while it took a batch (before it handed it out): the
    items it had taken from the reader, or the answer it waited for, may be lost, so the
    next loop has the reader go on after the last batch handed out (:meth:`_recover`)."""
    pack: Grouping | None = None
    """The stream's grouping (``pack=``: :mod:`ingest.distributed.rank_pack`), or None."""
    pack_batch: int = 0
    """Sequences (or rows) per batch, with ``pack``."""
    owner: Any = field(default=None, repr=False, compare=False)
    """The :class:`ingest.RayStream` this iterator was made from in this process, kept
    while the iterator is: a stream let go stops its actors (its finalizer). A copy sent
    to a task carries none."""

    _loop: RankLoop = field(init=False, repr=False)
    """The rank's loop: the batches this iterator handed out and their acks
    (:mod:`ingest.engine.loop`). It keeps empty steps: every rank has the same steps."""
    _waited_s: float = field(default=0.0, init=False, repr=False)
    """How long the last item took to come (:meth:`_items`), for the rank's metrics."""
    _driver: RankDriver = field(init=False, repr=False)
    """What happens between the feed's read steps and the loop, across loops
    (:mod:`ingest.distributed.rank_link`)."""
    _open: int | None = field(default=None, init=False, repr=False, compare=False)
    """The epoch of this iterator's loop while one is open (:func:`flush_loops`)."""
    _stepping: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )
    """Held while the loop makes a batch (one ``next()``): a state taken on the driver
    (:func:`flush_loops`) sees a loop of another thread between two batches."""

    def __post_init__(self) -> None:
        # The links reach this iterator through a weak proxy: with strong references, the
        # iterator and its loop were a cycle, freed at the collector's next full pass, and
        # with them their stream (``owner``) and its actors' CPUs (a notebook's cell run
        # again: one stream held per run until then).
        me = weakref.proxy(self)
        self._loop = RankLoop(
            self.rank, _CoordinatorLink(me), ack_every=self.options.ack_every, keep_empty=True
        )
        self._driver = rank_driver(self.pack, self.pack_batch, _IteratorLink(me))

    @property
    def step(self) -> int:
        """The step of the last batch yielded (-1 before any), equal on every rank at the
        same batch: the global step, or with ``pack`` the rank's batches since the run
        began less one (:class:`ingest.engine.pack.StepCount`)."""
        return self._driver.step

    @property
    def counts(self) -> dict[str, int]:
        """What this iterator's batches held beyond rows: with ``pack``, the real
        ``tokens`` and the ``padding_tokens`` handed out (for a tokens/s log); empty
        otherwise."""
        return self._driver.counts()

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy is a new iterator of the rank: the batches, acks and lease held here stay
        # with this one (a copy that carried them would hand out batches this one holds).
        args = (self.coordinator, self.reader, self.rank, self.options, self.session)
        new = functools.partial(
            _new_iterator, stream=self.stream, pack=self.pack, pack_batch=self.pack_batch
        )
        return (new, args)

    def _get(self, ref: Any) -> Any:
        try:
            return ray.get(ref, timeout=self.options.timeout_s)
        except Exception as e:
            raise unwrap(e) from None

    def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Call the coordinator's ``method`` and wait for its answer (see :meth:`_answer`)."""
        ref = getattr(self.coordinator, method).remote(*args)
        return self._answer(ref, method, args, timeout_s=timeout_s)

    def _answer(
        self,
        ref: Any,
        method: str,
        args: tuple[Any, ...],
        *,
        actor: Any = None,
        timeout_s: float | None = None,
        **resend: Any,
    ) -> Any:
        """The answer of a call to the coordinator (or ``actor``); the coordinator's death
        is said as such, with how to resume.

        An actor unreachable for a moment (``ActorUnavailableError``: a connection reset
        when a node left the cluster) is asked again, with backoff, until the call's
        timeout: the call may or may not have run, and every coordinator call and every
        reader call but ``take`` is safe to send twice (an ack is resent with ``resend``:
        ``again=True``).
        """
        of_coordinator = actor is None
        actor = self.coordinator if actor is None else actor
        deadline = time.monotonic() + (self.options.timeout_s if timeout_s is None else timeout_s)
        delay = 0.2
        while True:
            try:
                return ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0))
            except ray.exceptions.ActorUnavailableError as e:
                if time.monotonic() + delay >= deadline:
                    raise CoordinatorLostError(e) if of_coordinator else unwrap(e) from None
                time.sleep(delay)
                delay = min(2 * delay, 2.0)
                ref = getattr(actor, method).remote(*args, **resend)
            except ray.exceptions.RayActorError as e:
                raise CoordinatorLostError(e) if of_coordinator else unwrap(e) from None
            except Exception as e:
                raise unwrap(e) from None

    def _session(self) -> int:
        if self.session is None:
            self.session = int(self._call("session"))
        return self.session

    def upcoming_epoch(self) -> int:
        """The epoch the next ``for`` loop over this iterator runs."""
        if self.epoch is None:
            self.epoch = int(self._call("upcoming_epoch", self.rank))
        return self.epoch

    def _fetch(self, epoch: int) -> Any:
        wait_s = min(self.options.timeout_s, 5.0)
        return self.reader.take.remote(
            self.rank, self._session(), epoch, self.options.fetch_batches, wait_s, self.lease
        )

    def _take_over(self) -> int:
        """Take the rank over for a loop (see the class docstring); returns its epoch."""
        key = (self.stream or str(id(self.coordinator)), self.rank)
        with _LIVE_LOCK:
            got = _LIVE.get(key)
            other = got() if got is not None else None
            _LIVE[key] = weakref.ref(self)
        if other is not None and other is not self:
            with contextlib.suppress(IngestError):
                other.flush()  # its loop's acks: this loop goes on after its last batch
            other._superseded = True
        self.flush()
        claim = self._call(
            "claim", self.rank, self._session(), self.lease, self._loop.step, self.epoch
        )
        self.lease, self.epoch, self._superseded = claim.lease, claim.epoch, False
        self._replaced = False
        if not claim.kept:
            self._held.clear()
            self._inflight = None
            self._loop.restart(claim.step, claim.cursor)
            self._adopt(claim.epoch)
        elif self._interrupted:
            self._recover(claim.epoch)
        self._interrupted = False
        return int(claim.epoch)

    def _adopt(self, epoch: int) -> None:
        """Have the reader that hosts the rank's feed now (the pool may have resized:
        :mod:`ingest.distributed.directory`) serve this iterator from its next step (see
        :meth:`ingest.distributed.pool._Reader.adopt`)."""
        home = self._call("reader_of", self.rank)
        if home is not None and home._actor_id != self.reader._actor_id:
            self.reader = home
        cursor = self._loop.cursor
        next_step = self._loop.step + 1 if cursor is not None else None
        args = (self.rank, self._session(), epoch, self.lease, next_step, cursor)
        try:
            self._answer(self.reader.adopt.remote(*args), "adopt", args, actor=self.reader)
        except ray.exceptions.ActorDiedError as e:  # never restarted: no feed of the rank
            raise IngestError(
                f"the reader actor that hosts rank {self.rank}'s feed was killed for good "
                f"({str(e).splitlines()[-1].strip()}): Ray restarts a reader whose process "
                "dies or that ray.kill(reader, no_restart=False) ends, never one killed with "
                "ray.kill(reader) (no_restart=True, Ray's default) or stream.shutdown(). "
                "Resume from the last state on a new ingest.RayStream"
            ) from None

    def _recover(self, epoch: int) -> None:
        """The reader that held this rank's feed died, or a take's answer (batches it handed
        out) was lost: the feed goes on after the last batch this loop handed out.

        Batches it had made but this rank had not consumed are read again, from the rank's
        cursor, leaving out every acked row.
        """
        self._held.clear()
        self._inflight = None
        self.flush()
        self._adopt(epoch)

    def _take(self, ref: Any, epoch: int) -> list[Item | End]:
        try:
            got: list[Item | End] = ray.get(ref, timeout=self.options.timeout_s)
            return got
        except FeedLostError:  # a restarted reader, or an epoch not started there
            self._recover(epoch)
            return []
        except ray.exceptions.ActorUnavailableError:  # its answer (batches) may be lost
            self._recover(epoch)
            return []
        except ray.exceptions.RayTaskError as e:  # raised in the reader, not its death
            raise unwrap(e) from None
        except ray.exceptions.RayActorError:
            self._recover(epoch)
            return []
        except Exception as e:
            raise unwrap(e) from None

    def _next(self, epoch: int) -> Item | End:
        deadline = time.monotonic() + self.options.timeout_s
        while not self._held:
            ref = self._inflight if self._inflight is not None else self._fetch(epoch)
            self._inflight = None
            self._held.extend(self._take(ref, epoch))
            if not self._held and time.monotonic() > deadline:
                raise StreamTimeoutError(
                    f"rank {self.rank} got no batch for {self.options.timeout_s:.0f} s from "
                    "the reader pool; the readers may wait for CPUs that training workers "
                    "hold (give the cluster more CPUs, or lower ReaderPool.num_cpus), or the "
                    "store stalled. Raise RankOptions.timeout_s for very slow stores"
                )
        item = self._held.popleft()
        if self._inflight is None and isinstance(item, Item) and not self._held:
            self._inflight = self._fetch(epoch)
        return item

    def __iter__(self) -> Iterator[Batch]:
        # A Ctrl-C (the main thread's SIGINT) while a batch is handed out is held until
        # the loop returns it; one while the loop waits or reads is raised at once, and the
        # next loop reads again what it was taking (ingest.engine.interrupts).
        return _Loop(self._batches(), self._stepping)

    def _batches(self) -> Iterator[Batch]:
        _import_torch_meanwhile()
        driver = self._driver
        try:
            epoch = driver.begin()
        except KeyboardInterrupt:  # in a claim or an adopt: the next loop adopts again
            self._interrupted = True
            raise
        got = driver.batches(epoch)
        done = False
        self._open = epoch
        if self._meter is None:
            # Not a method of this iterator: the meter it holds would hold it (a cycle,
            # freed at the collector's next full pass, and with it the stream's actors).
            report = functools.partial(_waited_report, self.coordinator, self.rank)
            self._meter = RankMeter(self.stream, self.rank, report)
        meter = self._meter
        try:
            for batch in got:
                meter.batch(len(next(iter(batch.values()), ())), self._waited_s)
                yield self._placed(batch)
            # The end reached: a new iterator of the rank runs the next epoch, even after an
            # epoch with no step (EpochBook.upcoming_epoch).
            meter.report()
            done = True
            self.epoch = epoch + 1
        except KeyboardInterrupt:
            self._interrupted = True
            raise
        finally:
            self._open = None
            # Left early: the acks of every batch handed out reach the coordinator (an error
            # here would hide the one that left the loop, if any). Not once Ray is shut down
            # (a generator closed at interpreter exit, after Ray's own exit hook): any call
            # then would start a new local Ray, and the process would never end (issue 31).
            try:
                up = not done and ray.is_initialized()
            except (AttributeError, TypeError):  # interpreter exit: this module's globals
                up = False  # are gone ('NoneType' object has no attribute ...)
            if up:
                with contextlib.suppress(Exception):
                    self.flush()
                    driver.left(epoch)  # for a state taken on the driver

    def _items(self, epoch: int) -> Iterator[Item | End]:
        """The rank's items of ``epoch`` from its reader, up to its :class:`End`, each batch's
        table in hand (fetched from the actor that decoded it; a failed transform's empty
        step, with its quarantine); ``_waited_s``: how long the last one took to come, its
        table fetched (a batch another reader decodes comes as a reference at once, then
        the wait is for its decode)."""
        asked = time.monotonic()
        while True:
            item = self._next(epoch)
            if self._replaced:  # what it read ahead is of the session the state replaced
                raise SupersededError(
                    f"a state was loaded into the stream (load_state_dict) while this loop of "
                    f"rank {self.rank} ran: its batches read ahead are of the session the "
                    "state replaced; take a new iterator (stream.rank_iterator), which goes "
                    "on from the state"
                )
            if self._superseded:  # a newer iterator of this process took the rank over
                raise SupersededError.of_rank(self.rank)
            if isinstance(item, End):
                self._waited_s = time.monotonic() - asked
                yield item
                return
            if self._driver.skip(item):
                continue
            table = item.batch
            if isinstance(table, ray.ObjectRef):  # decoded by another actor of the pool
                try:
                    table = self._get(table)
                except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
                    self._recover(epoch)  # the reader that owned the batch died with it
                    continue
                item = replace(item, batch=table)
            if isinstance(table, TransformFailed):  # on_error="skip": the step is empty
                failed = Quarantined(
                    table.reason, epoch, self.rank, step=item.step, rows=table.rows
                )
                item = replace(
                    item, batch=table.empty, rows=0, quarantined=(*item.quarantined, failed)
                )
            self._waited_s = time.monotonic() - asked
            yield item
            asked = time.monotonic()

    def _placed(self, batch: Batch) -> Batch:
        """``batch`` as it leaves the rank, any kind (plain or packed): pinned and on the
        device of :class:`RankOptions`."""
        from ingest.engine.convert import placed

        return placed(batch, self.options.pin_memory, self.options.device)

    def flush(self) -> None:
        """Send the acks held back, and wait until the coordinator has every ack sent.

        Raises:
            IngestError: If Ray is shut down in this process (a call would start a new one).
        """
        if not ray.is_initialized():
            raise IngestError(
                f"rank {self.rank}'s acks cannot reach the coordinator: Ray is shut down in "
                "this process. Take states and leave loops before ray.shutdown()"
            )
        self._loop.flush()
        self._drain_acks()

    def flush_open_loop(self) -> None:
        """For a state taken on the driver (:func:`flush_loops`): an open loop of this
        iterator sends its acks and what its driver holds (a packing rank's documents in
        flight), then goes on.

        Raises:
            StateError: If a loop of another thread does not finish its batch within
                ``RankOptions.timeout_s``.
        """
        if not self._stepping.acquire(timeout=self.options.timeout_s):
            raise StateError(
                f"rank {self.rank}'s loop in another thread of this process did not finish "
                f"its batch within {self.options.timeout_s:.0f} s, so a state taken on the "
                "driver cannot cover its batches: take states on the ranks "
                "(it.state_dict() at the same step on every rank)"
            )
        try:
            epoch = self._open
            if epoch is None or self._superseded or self._replaced:
                return
            self.flush()
            self._driver.left(epoch)
        finally:
            self._stepping.release()

    def _drain_acks(self) -> None:
        sent, self._acks = self._acks, []
        for ref, args in sent:
            self._answer(ref, "ack", args, again=True)

    def _send_acks(
        self, records: list[StepRecord], cursor: Cursor | None, pieces: Sequence[BatchPieces] = ()
    ) -> None:
        """Send an ack message without waiting for its answer (see :class:`_CoordinatorLink`).

        A message goes unanswered for a while, but never more than two do: a coordinator
        that died stops the loop within a few messages (its error says how to resume), not
        at the end of the epoch with every ack since lost.
        """
        args = (self.rank, records, self._session(), cursor, self.lease, list(pieces))
        self._acks.append((self.coordinator.ack.remote(*args), args))
        ready, _ = ray.wait([ref for ref, _ in self._acks], num_returns=len(self._acks), timeout=0)
        done = set(ready)
        for ref, args in [a for a in self._acks if a[0] in done]:
            self._answer(ref, "ack", args, again=True)
        self._acks = [a for a in self._acks if a[0] not in done]
        while len(self._acks) > 2:
            ref, args = self._acks.pop(0)
            self._answer(ref, "ack", args, again=True)

    def state_dict(self) -> dict[str, Any]:
        """Flush, then the stream state after this rank's last batch (same on every rank).

        Every rank must call it at the same step: the snapshot waits until all ranks acked
        that step (up to ``RankOptions.timeout_s``).
        """
        return self._driver.state()


class _CoordinatorLink:
    """A Ray rank's link to its book (:class:`ingest.engine.loop.RankLink`): the coordinator
    actor. Acks go without waiting (:meth:`RankIterator._send_acks`); the end of an epoch
    waits for every ack sent first (a threaded actor may run calls out of order), so a
    coordinator lost there is the loop's error."""

    def __init__(self, it: RankIterator) -> None:
        self._it = it

    def ack(
        self,
        rank: int,
        records: list[StepRecord],
        cursor: Cursor | None,
        pieces: Sequence[BatchPieces] = (),
    ) -> None:
        self._it._send_acks(records, cursor, pieces)

    def end(self, rank: int, epoch: int, ending: Ending) -> None:
        it = self._it
        it._drain_acks()
        it._call(
            "close_epoch",
            epoch,
            ending.steps,
            ending.leftover,
            ending.learned,
            it._session(),
            ending.quarantined,
            rank,
        )


class _IteratorLink:
    """A rank driver's link to its iterator (:class:`ingest.distributed.rank_link.IteratorLink`,
    see there): the iterator's own calls, under public names for the driver."""

    def __init__(self, it: RankIterator) -> None:
        self._it = it

    @property
    def rank(self) -> int:
        return self._it.rank

    @property
    def timeout_s(self) -> float:
        return self._it.options.timeout_s

    @property
    def fetch_batches(self) -> int:
        return self._it.options.fetch_batches

    @property
    def loop(self) -> RankLoop:
        return self._it._loop

    def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        return self._it._call(method, *args, timeout_s=timeout_s)

    def session(self) -> int:
        return self._it._session()

    def take_over(self) -> int:
        return self._it._take_over()

    def items(self, epoch: int) -> Iterator[Item | End]:
        return self._it._items(epoch)

    def holds_items(self) -> bool:
        return bool(self._it._held)

    def flush(self) -> None:
        self._it.flush()

    def upcoming_epoch(self) -> int:
        return self._it.upcoming_epoch()


def _waited_report(coordinator: Any, rank: int, waited_s: float, span_s: float, rows: int) -> None:
    """A rank's wait, to the pool's sizer through the coordinator (not waited for: a lost
    report is one interval's figure less)."""
    coordinator.waited.remote(rank, waited_s, span_s, rows)


_LIVE: dict[tuple[str, int], weakref.ref[RankIterator]] = {}
"""The iterator of each (stream, rank) that last took the rank over in this process."""
_LIVE_LOCK = threading.Lock()


class _Loop(interrupts.Guarded["Batch"]):
    """A rank iterator's loop: each ``next()`` holds the iterator's step lock (see
    :meth:`RankIterator.flush_open_loop`)."""

    def __init__(self, items: Iterator[Batch], stepping: threading.Lock) -> None:
        super().__init__(items)
        self._stepping = stepping

    def _acquire(self) -> None:
        self._stepping.acquire()

    def _release(self) -> None:
        self._stepping.release()


def flush_loops(stream: str) -> None:
    """A state is taken on the driver of ``stream``: the open loops of its rank iterators in
    this process send their acks and what they hold, so that it covers every batch they
    handed out (:meth:`RankIterator.flush_open_loop`); the loops go on."""
    with _LIVE_LOCK:
        live = [ref() for (name, _), ref in _LIVE.items() if name == stream]
    for it in live:
        if it is not None:
            it.flush_open_loop()


def stop_loops(stream: str) -> None:
    """A state was loaded into ``stream`` on the driver: the loops of its rank iterators in
    this process stop at their next batch (:class:`ingest.SupersededError`), where they
    handed out what their readers had read ahead for the session the state replaced (the
    rest of an epoch, again), then failed with the coordinator's stale session."""
    with _LIVE_LOCK:
        live = [ref() for (name, _), ref in _LIVE.items() if name == stream]
    for it in live:
        if it is not None:
            it._replaced = True


def _new_iterator(
    coordinator: Any,
    reader: Any,
    rank: int,
    options: RankOptions,
    session: int | None,
    *,
    stream: str,
    pack: Grouping | None,
    pack_batch: int,
) -> RankIterator:
    return RankIterator(
        coordinator, reader, rank, options, session, stream=stream, pack=pack, pack_batch=pack_batch
    )


__all__ = ["RankIterator", "RankOptions", "unwrap"]
