"""A torch ``DataLoader`` over a :class:`ingest.Stream`, its workers reading disjoint shares.

Each worker process is a rank of the engine: every ``iter(loader)`` starts from the stream's
state, the main process lists the source once and plans the epoch for ``num_workers`` ranks,
and each worker plans the same epoch from the same state and listing and reads its rank's
share (rows split without duplicates, each worker with its own fsspec filesystems, made
after the fork or spawn). Every batch carries where its rows came from; the main process
takes that off and hands the batch out through that worker's rank loop
(:meth:`ingest.engine.loop.RankLoop.hand_out`, which acks it), so
:meth:`DataLoader.state_dict` covers every batch handed out by any worker, at any moment,
and loads with any worker count (or into a ``Stream`` or a ``RayStream``). What a worker
sends, and how this process takes it (its small batches a few to a torch item, through a
ring of shared slots, handed out in torch's order), is :mod:`ingest.integrations.worker_items`.

The workers are kept across epochs (torch's persistent workers): an epoch's start costs no
process start, and each worker keeps its planner (and so its fsspec filesystems). The workers
never list: each has a queue, made before it started, on which the main process sends it every
epoch's order (:class:`_Order`: the state to start from and the epoch's listing) right before
torch tells the workers to begin the epoch; a loop left early, or a state loaded, leaves the
workers' read-ahead behind (torch drops what they send of it). An epoch that ends whole plans
the next one at once, from the state it ended on, and sends it as an early order: each worker
opens its share's feed and reads its first window while the caller is between epochs; the next
loop starts it with a go (:class:`_Go`) if the stream's state is still that one, or sends a new
order (a state loaded since). The workers stop when the loader goes, on
:meth:`DataLoader.close`, and at the interpreter's exit; ``persistent_workers=False`` stops them
at each epoch's end instead. ``batch_size`` is the stream's; the ``DataLoader`` does no batching
or collation of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import multiprocessing
import multiprocessing.context
import multiprocessing.util
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch.utils.data

from ingest.core.book import EpochBook
from ingest.core.errors import ConfigError, IngestError, SupersededError
from ingest.core.snapshot import state_with_tokens
from ingest.core.state import StreamState
from ingest.engine import interrupts
from ingest.engine.convert import Batch, placed
from ingest.engine.feed import Feed
from ingest.engine.grouping import Grouping
from ingest.engine.loop import BookLink, RankLoop
from ingest.engine.pack import StepCount, merged
from ingest.engine.rank_node import RankNode, rank_node
from ingest.engine.spec import StreamSpec
from ingest.engine.stream import Stream
from ingest.integrations.shared_slots import SlotRing, worker_rings
from ingest.integrations.worker_items import (
    KEY,
    Ended,
    Failed,
    IOSent,
    in_turn,
    ring_slots,
    with_tensors,
    worker_sends,
)
from ingest.integrations.worker_start import (
    checked_init,
    checked_sendable,
    preload_forkserver,
    ray_process,
    worker_start,
)
from ingest.planner.catalog import Listing
from ingest.planner.planner import Planner

ORDER_WAIT_S = 120.0
"""Seconds a worker waits for its epoch's order: the main process sends it before it tells
the workers to start the epoch, so it is there at once unless the main process is gone."""
LISTENER_JOIN_S = 10.0
"""Seconds an exiting worker waits for its listener (:meth:`_Shares._listen`) to end."""
SLOT_BYTES = 64 << 20
"""Bytes of each slot of a worker's ring (:class:`SlotRing`): a batch's tensors larger than
that go by the pipe. Only the pages written are backed by memory."""


@dataclass(frozen=True, slots=True)
class _Order:
    """An epoch for the workers, from the main process: what each plans its share from."""

    number: int
    """The order's count among those sent to these workers (from 0)."""
    ranks: int
    start: dict[str, Any] | None
    """The state to start from (JSON); None: the stream's first epoch."""
    listing: Listing
    """The epoch's listing, made by the main process (the workers never list)."""
    early: bool = False
    """Planned as the epoch before ended: a worker opens its feed at once, and reads it on a
    :class:`_Go` of this number (a state loaded since: a new order comes instead)."""


@dataclass(frozen=True, slots=True)
class _Go:
    number: int
    """Read this early order (the epoch begins on the state it was planned for)."""


@dataclass(frozen=True, slots=True)
class _Early:
    """The early order sent as an epoch ended, and what it was planned from."""

    number: int
    state: dict[str, Any]
    book: EpochBook[Listing]
    start: StreamState
    epoch: int
    listing: Listing


@dataclass(slots=True)
class _Opened:
    """In a worker: a feed opened for an order, read ahead in its own threads."""

    order: _Order
    items: Iterator[Any]
    stack: contextlib.ExitStack
    error: BaseException | None = None


class _Shares(torch.utils.data.IterableDataset[Batch]):
    """What the DataLoader's workers iterate: their rank's share of each epoch, by order."""

    def __init__(self, spec: StreamSpec, transform: Any, pack: Grouping | None) -> None:
        self.spec = spec
        self.transform = transform
        self.pack = pack
        self.order: _Order | None = None
        """The epoch to read with no worker processes (``num_workers=0``)."""
        self.queues: list[Any] = []
        """Each worker's queue of orders, made before the workers start."""
        self.rings: list[SlotRing] = []
        """Each worker's ring of shared slots for its batches' tensors, made before the
        workers start (none: they send by the pipe)."""
        self._taken = 0
        """In a worker: the number of the next order it takes."""
        self._listener: threading.Thread | None = None
        """In a worker, between epochs: the thread that takes the next message and, if it is
        an early order, opens its feed (:attr:`_early`)."""
        self._early: _Opened | None = None
        self._held: Any = None
        """A message the listener took that was not an early order (for :meth:`_receive`)."""
        self._exiting: Any = None
        """In a worker: the finalizer that stops the listener as the process exits."""
        self._planner: tuple[int, Planner] | None = None
        """The planner made in this process (its pid), kept across epochs: never one made
        before a fork (fsspec's filesystems are not fork-safe)."""
        self._io: IOSent | None = None
        """What of that planner's source's counts this process sent the main one."""

    def __getstate__(self) -> dict[str, Any]:
        # spawn, forkserver: the worker makes its own planner; the rings go to it only as
        # it starts (their memory's descriptor passed with the start), never elsewhere
        starting = multiprocessing.context.get_spawning_popen() is not None
        gone: dict[str, Any] = {"_planner": None, "_io": None, "_listener": None}
        gone.update(_early=None, _exiting=None, rings=self.rings if starting else [])
        return {**self.__dict__, **gone}

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        rank = 0 if info is None else info.id
        ring = self.rings[rank] if info is not None and self.rings else None
        if ring is not None:
            ring.begin()  # the main process takes none of what this worker sent before
        order = self.order if info is None else self._receive(rank)
        if isinstance(order, Failed):
            yield {KEY: order}
            return
        assert order is not None, "the main process sets the order before it iterates"
        opened = self._early_for(order) or self._opened(order, rank)
        io = self._io_here()
        ended = False
        try:
            if opened.error is not None:
                raise opened.error
            worker = worker_sends(rank, opened.items, self.pack, ring, info is not None, io)
            for out in worker:
                ended = isinstance(out[KEY], Ended) and info is not None
                yield out
        finally:
            opened.stack.close()
            if ended:  # the next epoch's order may come early: its feed is opened at once
                with contextlib.suppress(RuntimeError):  # no new thread: the worker is exiting
                    self._listen(rank)

    def _opened(self, order: _Order, rank: int) -> _Opened:
        """``order``'s feed for ``rank``, opened (its lanes start reading on the first item)."""
        planner = self._planner_here()
        book = self.spec.book(order.ranks, planner)
        if order.start is not None:
            book.load(StreamState.from_json(order.start), order.listing)
        else:
            book.adopt(order.listing)
        epoch = book.upcoming_epoch(rank)
        feed = Feed(
            book.rank_plan(rank, epoch), self.spec.feed_config(), planner.source, self.transform
        )
        stack = contextlib.ExitStack()
        items = stack.enter_context(feed.ahead(self.spec.urls[0]))
        return _Opened(order, _failing_as_item(items), stack)

    def _listen(self, rank: int) -> None:
        """After this worker's share of an epoch: a thread takes the next message; an early
        order's feed it opens and reads to its first item, while the caller goes on."""

        def listen() -> None:
            message = self._message(rank, time.monotonic() + ORDER_WAIT_S)
            if not (isinstance(message, _Order) and message.early):
                self._held = message if message is not None else Failed(_no_order(rank))
                return
            self._taken = message.number + 1
            opened = None
            try:
                opened = self._opened(message, rank)
                first = next(opened.items)  # its first window read
                opened.items = itertools.chain([first], opened.items)
            except BaseException as e:  # raised where the order is read (if it is)
                opened = opened or _Opened(message, iter(()), contextlib.ExitStack())
                opened.error = e
            self._early = opened

        if self._exiting is None:  # once per worker process: see _drop_early
            self._exiting = multiprocessing.util.Finalize(None, self._drop_early, exitpriority=10)
        self._listener = threading.Thread(target=listen, name="ingest-next-epoch", daemon=True)
        self._listener.start()

    def _drop_early(self) -> None:
        """As the worker exits: the listener ended and the early feed closed (left reading,
        its threads were cut down inside pyarrow by the interpreter's exit: SIGABRT)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.join(LISTENER_JOIN_S)
        early, self._early = self._early, None
        if early is not None:
            early.stack.close()

    def _early_for(self, order: _Order) -> _Opened | None:
        """The feed the listener opened for ``order``, if it is the one it opened."""
        early, self._early = self._early, None
        if early is not None and early.order is order:
            return early
        if early is not None:
            early.stack.close()
        return None

    def _planner_here(self) -> Planner:
        pid = os.getpid()
        if self._planner is None or self._planner[0] != pid:
            planner = self.spec.planner()
            self._planner, self._io = (pid, planner), IOSent(planner.source.stats)
        return self._planner[1]

    def _io_here(self) -> IOSent:
        """What this process's planner's source counted and sent (made with the planner)."""
        self._planner_here()
        assert self._io is not None
        return self._io

    def _receive(self, rank: int) -> _Order | Failed:
        """In worker ``rank``: the order of the epoch torch just began (older ones passed
        over); an early order once a :class:`_Go` of its number follows it."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.join()
        candidate = self._early.order if self._early is not None else None
        waited_until = time.monotonic() + ORDER_WAIT_S
        while True:
            message, self._held = self._held, None
            if message is None:
                message = self._message(rank, waited_until)
            if message is None or isinstance(message, Failed):
                return message or Failed(_no_order(rank))
            if isinstance(message, _Go):
                if candidate is not None and candidate.number == message.number:
                    return candidate
                continue  # a go for an order this worker passed over
            if message.number < self._taken:
                continue
            self._taken = message.number + 1
            if message.early:
                candidate = message
                continue
            return message  # type: ignore[no-any-return]

    def _message(self, rank: int, waited_until: float) -> Any:
        """The next message from the main process (None: the loader is closing; a
        :class:`Failed` once ``waited_until`` has passed)."""
        while time.monotonic() < waited_until:
            try:
                return self.queues[rank].get(timeout=1.0)
            except queue.Empty:
                continue
        return Failed(_no_order(rank))


def _no_order(rank: int) -> IngestError:
    return IngestError(
        f"ingest.DataLoader worker {rank} got no epoch to read from its main process "
        f"in {ORDER_WAIT_S:.0f} s (the loader was closed, or its process is stuck); "
        "iterate the loader again"
    )


class DataLoader(torch.utils.data.DataLoader[Batch]):
    """A torch ``DataLoader`` whose worker processes read disjoint shares of a ``Stream``.

    Example::

        stream = ingest.Stream("s3://bucket/train/", batch_size=1024, shuffle_seed=0)
        loader = ingest.DataLoader(stream, num_workers=4, pin_memory=True)
        for epoch in range(3):
            for batch in loader:  # one epoch; batches of the stream's batch_size
                ...
            torch.save({"data": loader.state_dict(), ...}, "ckpt.pt")
        loader.load_state_dict(torch.load("ckpt.pt")["data"])  # any num_workers

    Args:
        stream: The stream to read. Its state advances with the loader's, and a state loaded
            into it (``stream.load_state_dict``) is where the loader's next epoch starts.
        num_workers: Worker processes, each reading one rank's share (0: in this process).
        **kwargs: Passed to ``torch.utils.data.DataLoader`` (``pin_memory``,
            ``prefetch_factor``, ``multiprocessing_context``, ``timeout`` with workers, ...);
            not ``batch_size``, ``shuffle``, ``sampler``, ``collate_fn`` or ``drop_last``: the
            stream batches and shuffles (``remainder="drop"`` drops the rows that fill no
            step). ``persistent_workers`` (default True): keep the workers across epochs
            (until the loader goes, or :meth:`close`); False stops them at each epoch's end.
            Without ``multiprocessing_context``, the workers start as torch starts them
            (fork on Linux), but by ``forkserver`` beside Ray's threads: in a Ray worker
            process, and in a driver with Ray initialized that runs no script of its own (a
            notebook; see :func:`worker_start`).

    With ``num_workers`` ranks, an epoch has equal steps per worker: the rows that cannot
    fill a step on every worker are carried into the next epoch, as on a ``RayStream``.
    Over a stream of an :class:`ingest.Mix`, each source has a loader of its own with
    ``num_workers`` workers, and this process draws from them as the stream does
    (:mod:`ingest.integrations.mixed_loader`).
    """

    def __new__(cls, stream: Any = None, **kwargs: Any) -> DataLoader:
        """A loader over a stream of an :class:`ingest.Mix` is a
        :class:`~ingest.integrations.mixed_loader.MixedLoader` (a loader per source, the same
        members); over any other stream, this class."""
        if cls is DataLoader and getattr(stream, "mixed", None) is not None:
            from ingest.integrations.mixed_loader import MixedLoader  # it builds on this

            return super().__new__(MixedLoader)
        return super().__new__(cls)

    def __init__(self, stream: Stream, *, num_workers: int = 0, **kwargs: Any) -> None:
        keep = checked_keywords(num_workers, kwargs)
        self.stream = stream
        self._shares = _Shares(stream.spec, stream.parts.transform, stream.pack)
        started = worker_start(num_workers, kwargs, self._shares, ray=ray_process())
        # A start method worker_start chose came with the stream pickled already:
        # checked_sendable below would pickle it again.
        chosen = started.get("multiprocessing_context") is not kwargs.get("multiprocessing_context")
        kwargs = started
        self._keep = bool(keep)
        """Keep the workers across epochs (``persistent_workers``, default True)."""
        self._workers = _Workers()
        weakref.finalize(self, self._workers.close)  # the workers stop when the loader goes
        self._next: _Early | None = None
        """The next epoch, planned at the end of the last and sent to the workers early."""
        self._book: EpochBook[Listing] | None = None
        self._ranks: dict[int, RankLoop] = {}
        """Each worker's (rank's) loop: its batches handed out and their acks
        (:mod:`ingest.engine.loop`)."""
        self._nodes: dict[int, RankNode] = {}
        """Each worker's node over its loop, in this process: its read steps as batches, or
        regrouped with ``pack`` (the workers read, decode and tokenize; see
        :mod:`ingest.engine.rank_node`)."""
        self._running: weakref.ref[_Running] | None = None
        """The loop last started, held weakly, so that a loop the caller drops (a ``break``)
        is closed at once. The loop refers to this loader: held strongly, the two made a
        cycle, which only the cyclic garbage collector frees."""
        super().__init__(
            self._shares,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_as_is,
            # torch keeps its iterator's workers between epochs; this loader holds that
            # iterator (_Workers) and stops it at each epoch's end when not `keep`.
            persistent_workers=num_workers > 0,
            **kwargs,
        )
        if not chosen:
            checked_sendable(self._shares, num_workers, self.multiprocessing_context)
        checked_init(self.worker_init_fn, num_workers, self.multiprocessing_context)
        if num_workers:
            preload_forkserver(self.multiprocessing_context)

    def __len__(self) -> int:
        # A TypeError, as torch's loaders without a length raise: libraries that ask
        # (progress bars, trainers) catch it and go on without one.
        raise TypeError(
            "an ingest.DataLoader has no length: an epoch's batch count is known only once "
            "its shards are read (rows of JSONL or CSV shards, rows carried from the epoch "
            "before); count steps in the loop, and give a trainer its length in steps "
            "(transformers' TrainingArguments(max_steps=N), Lightning's max_steps)"
        )

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        with interrupts.deferred():  # a Ctrl-C in the last loop's end: at its end
            self._stop(superseded=True)
            loop = _Running(self._loop())  # a Ctrl-C loses no batch
            self._running = weakref.ref(loop)
        return loop

    def close(self) -> None:
        """Stop the worker processes now (the next loop starts new ones); the stream goes
        on right after the last batch handed out."""
        self._stop(superseded=False)
        self._next = None
        self._workers.close()

    def held_state(self) -> dict[str, Any] | None:
        """The state after this loader's last batch while its loop runs over the stream
        (:meth:`ingest.Stream.lend`: the stream's own ``state_dict`` is this), else None."""
        if self._book is None:
            return None
        with interrupts.deferred():  # its acks are sent whole (ingest.engine.interrupts)
            return self._state().to_json()

    def give_back(self) -> None:
        """The stream is iterated or loaded with a state while this loader's loop runs: the
        loop ends (it says so if asked again), the stream goes on after its last batch."""
        self._stop(superseded=True)

    def _loop(self) -> Iterator[Batch]:
        ranks = max(1, self.num_workers)
        stream = self.stream
        stream.lend(self)  # until this loop ends, the stream stands where it stands
        stream.close()
        state = stream.state_dict()
        early, self._next = self._next, None
        if early is not None and early.state == state and self._workers.iterator is not None:
            # planned at the last epoch's end, and sent to these workers
            book, start, epoch, listing = early.book, early.start, early.epoch, early.listing
            order: _Order | _Go = _Go(early.number)
        else:
            book, start, started, epoch, listing = self._planned(state, ranks)
            order = _Order(0, ranks, start.to_json() if started else None, listing)
        link = BookLink(book)
        self._ranks = {rank: RankLoop(rank, link) for rank in range(ranks)}
        self._nodes = self._rank_nodes(book, start, listing)
        self._book = book
        ended, delivered = 0, start.progress.delivered
        stream.count_lent(delivered)
        io = stream.parts.planner.source.stats  # the workers' reads, counted in the stream
        # Every kind of batch, as it leaves its rank (ingest.engine.convert.placed).
        place = functools.partial(placed, pin_memory=self.pin_memory, device=None)
        shares = self._shares  # its rings are made as the workers start (_begin)
        for out in in_turn(self._drawn(order), ranks, lambda rank: shares.rings[rank]):
            came = out.pop(KEY)
            if isinstance(came, Failed):
                raise came.error
            if came.io:
                io.add(**dict(came.io))
            node = self._nodes[came.rank]
            if isinstance(came, Ended):
                made = node.finish(epoch, came)
                ended += 1
            else:
                made = node.feed(came, functools.partial(with_tensors, out))
            counts = node.counts()
            for rows, batch in made:
                delivered += rows
                counts, before = node.counts(), counts
                stream.count_lent(delivered, {k: n - before.get(k, 0) for k, n in counts.items()})
                yield place(batch)
        if ended != ranks:
            raise ConfigError(f"only {ended} of {ranks} DataLoader workers ended their share")
        # The epoch is done: the stream goes on from the next one, planned now, so that the
        # workers read its first window while this loop's caller goes on.
        stream.release(self)
        stream.load_state_dict(self._state(), listing=listing)
        stream.count_lent(delivered)  # its stats count the epoch done, as a Stream's do
        self._book = None
        if not self._keep:
            self._workers.close()
        elif self._workers.iterator is not None and stream.spec.follow is None:
            # (following a growing dataset, the next round's listing waits for new shards:
            # it is made when the caller asks for that round, as before)
            self._send_early(ranks)

    def _planned(
        self, state: dict[str, Any], ranks: int
    ) -> tuple[EpochBook[Listing], StreamState, bool, int, Listing]:
        """The book of an epoch that starts from ``state`` (the stream's JSON), whether the
        stream had started, the epoch and its listing (made here, once, for every worker)."""
        start, stream = StreamState.from_json(state), self.stream
        # The stream's planner: footers read in earlier epochs are not read again.
        book = stream.spec.book(ranks, stream.parts.planner, packs=stream.pack is not None)
        started = start.started or start.progress.epoch > 0 or bool(start.progress.tokens)
        if started:
            book.load(start)
        epoch = book.upcoming_epoch(0)
        return book, start, started, epoch, book.plan(epoch).listing

    def _send_early(self, ranks: int) -> None:
        """Plan the next epoch from the stream's state and send it as an early order."""
        state = self.stream.state_dict()
        try:
            book, start, started, epoch, listing = self._planned(state, ranks)
        except IngestError:  # planned again when the next loop begins, which raises it then
            return
        order = _Order(0, ranks, start.to_json() if started else None, listing, early=True)
        number = self._workers.send(order)
        self._next = _Early(number, state, book, start, epoch, listing)

    def _drawn(self, order: _Order | _Go) -> Iterator[Batch]:
        """What the workers send for ``order``'s epoch; if torch's iterator fails (a worker
        died, its ``timeout``), the workers are stopped: the next loop starts new ones."""
        try:
            batches = self._begin(order)
            while True:
                try:
                    out = next(batches)
                except StopIteration:
                    return
                yield out
        except GeneratorExit:
            raise
        except BaseException:
            self._workers.close()
            raise

    def _begin(self, order: _Order | _Go) -> Iterator[Batch]:
        """Torch's iterator over the workers, begun on ``order``'s epoch: its workers kept
        from the last epoch (sent the order first), or started."""
        if self.num_workers == 0:
            assert isinstance(order, _Order), "no early order without workers"
            self._shares.order = order
            return super().__iter__()
        workers = self._workers
        if workers.iterator is None:  # the queues travel with the dataset to the workers
            assert isinstance(order, _Order), "no early order before the workers start"
            context = self.multiprocessing_context or torch.multiprocessing
            workers.queues = [context.Queue() for _ in range(self.num_workers)]
            self._shares.queues = workers.queues
            slots = ring_slots(self.prefetch_factor)
            workers.rings = worker_rings(context, self.num_workers, slots, SLOT_BYTES)
            self._shares.rings = workers.rings
            workers.sent = 0
            workers.send(order)
            # The workers fork with this process's objects frozen (gc.freeze, as Python's
            # docs advise before a fork): their collector never walks what they inherit.
            # It did, at a worker's first full collection, writing to every page it touched
            # (copy on write): 0.3-1.5 s of the first batch after a resume, in each worker
            # at once. This process's own collection goes on as before (unfreeze). A
            # process that froze objects itself manages its collector across forks: its
            # freeze is left as it is (unfreeze would undo it).
            freeze = gc.get_freeze_count() == 0
            if freeze:
                gc.freeze()
            try:
                workers.iterator = self._get_iterator()
            finally:
                if freeze:
                    gc.unfreeze()
        else:
            for ring in workers.rings:  # what torch drops of the last loop: no wait for it
                ring.abandon()
            workers.send(order)
            workers.iterator._reset(self)  # what torch's own persistent __iter__ does
        return workers.iterator  # type: ignore[no-any-return]

    def _rank_nodes(
        self, book: EpochBook[Listing], start: StreamState, listing: Listing
    ) -> dict[int, RankNode]:
        """Each worker's node, going on from ``start`` (its documents in flight, with ``pack``)."""
        urls, out = [s.url for s in listing.shards], {}
        pack, size, steps = self.stream.pack, self.stream.batch_size, StepCount()
        for rank, loop in self._ranks.items():  # one count of batches: the loader's
            node = out[rank] = rank_node(pack, size, loop, book, steps)
            node.load(start)
            node.begin(urls)
        return out

    def _flush(self) -> None:
        """Send every rank's held acks to the book (one call per rank for many batches)."""
        if self._book is not None:
            for rank in self._ranks.values():
                rank.flush()

    def _stop(self, *, superseded: bool) -> None:
        """End a loop left early; the stream goes on right after its last batch."""
        self._end_loop(superseded=superseded)
        if self._book is not None:
            self.stream.load_state_dict(self._state())
            self._book = None

    def _end_loop(self, *, superseded: bool) -> None:
        """Close the running loop, if any (``superseded``: it says so if asked again): what
        its workers read ahead is dropped when the next loop begins (with
        ``persistent_workers=False``, they stop now). The stream is given back."""
        self.stream.release(self)
        ref, self._running = self._running, None
        running = ref() if ref is not None else None
        if running is not None:
            with contextlib.suppress(Exception):
                running.stop(superseded=superseded)
        if not self._keep:
            self._workers.close()

    def _state(self) -> StreamState:
        """The book's state after every batch handed out; with packing, the documents the
        workers' packings handed out in part or beyond their read steps acked."""
        assert self._book is not None
        self._flush()
        state, nodes = self._book.snapshot_acked(), list(self._nodes.values())
        tokens = merged(t for node in nodes for t in node.entries(state))
        return state_with_tokens(state, tokens, nodes[0].batches() if nodes else None)

    def state_dict(self) -> dict[str, Any]:
        """The state after every batch this loader handed out (all workers); plain JSON."""
        if self._book is None:
            return self.stream.state_dict()
        with interrupts.deferred():  # its acks are sent whole (ingest.engine.interrupts)
            return self._state().to_json()

    def load_state_dict(self, state: Mapping[str, Any] | str) -> None:
        """Start the next epoch exactly after ``state`` (from any loader, Stream or
        RayStream, any worker count or world size)."""
        with interrupts.deferred():
            self._end_loop(superseded=True)  # its state is replaced: not saved into the stream
            kept = self._book, self._ranks, self._nodes
            self._book, self._ranks, self._nodes = None, {}, {}
            try:
                self.stream.load_state_dict(state)
            except BaseException:  # refused: the next loop goes on where the last one was
                self._book, self._ranks, self._nodes = kept
                raise


class _Running(interrupts.Guarded[Batch]):
    """A loader's loop. Ended by a newer loop, a state loaded or a loop over its stream, it
    raises :class:`ingest.SupersededError` if asked for another batch, as a Stream's loop
    does (it ended quietly, as if its epoch were over); ended by ``close()``, it ends."""

    def __init__(self, items: Iterator[Batch]) -> None:
        super().__init__(items)
        self._superseded = False

    def _acquire(self) -> None:
        if self._superseded:
            raise SupersededError(
                "a newer loop over this ingest.DataLoader (iter(loader) again, "
                "load_state_dict, or a loop over its stream) took over from this one, after "
                "its last batch; iterate the newest loop only"
            )

    def stop(self, *, superseded: bool) -> None:
        """End the loop (its generator closes); ``superseded``: say so when next asked."""
        self._superseded = superseded
        self.close()


def checked_keywords(num_workers: int, kwargs: dict[str, Any]) -> bool:
    """Refuse what an ``ingest.DataLoader`` does not take; takes ``persistent_workers`` out of
    ``kwargs`` and returns it (default True)."""
    for name in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn"):
        if name in kwargs:
            raise ConfigError(
                f"ingest.DataLoader takes no {name}=: the stream batches and shuffles "
                "(set batch_size, shuffle_seed on the Stream)"
            )
    if kwargs.get("drop_last"):
        raise ConfigError(
            "ingest.DataLoader takes no drop_last=: the stream makes the batches, each whole "
            "(the rows that fill no step go on into the next epoch); to drop them, pass "
            "remainder='drop' to the Stream"
        )
    kwargs.pop("drop_last", None)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(
            f"num_workers={num_workers!r} must be an integer >= 0: the worker processes "
            "(0: the stream is read in this process)"
        )
    timeout = kwargs.get("timeout", 0)
    if not num_workers and timeout:
        raise ConfigError(
            f"timeout={timeout!r} is how long to wait for a batch from the worker processes, "
            "and num_workers=0 starts none: pass num_workers >= 1, or leave timeout out"
        )
    return bool(kwargs.pop("persistent_workers", True))


class _Workers:
    """The worker processes a loader keeps across epochs: torch's iterator over them, and
    the queue each takes its epochs' orders from (held apart from the loader, so that a
    finalizer of the loader can stop them)."""

    def __init__(self) -> None:
        self.iterator: Any = None
        self.queues: list[Any] = []
        self.rings: list[SlotRing] = []
        self.sent = 0

    def send(self, order: _Order | _Go) -> int:
        """Send ``order`` to every worker, numbered after the ones sent before (a
        :class:`_Go` names the early order it starts); its number."""
        if isinstance(order, _Order):
            order = dataclasses.replace(order, number=self.sent)
            self.sent += 1
        for q in self.queues:
            q.put(order)
        return order.number

    def close(self) -> None:
        """Stop the workers (torch joins each for up to 5 s, then ends it)."""
        iterator, self.iterator = self.iterator, None
        queues, self.queues = self.queues, []
        for q in queues:
            with contextlib.suppress(Exception):
                q.put(None)  # a worker waiting for an order stops waiting
        if iterator is not None:
            iterator._shutdown_workers()
        for q in queues:
            q.cancel_join_thread()
            q.close()
        rings, self.rings = self.rings, []
        for ring in rings:
            ring.close()


def _as_is(batch: Any) -> Any:
    return batch


def _failing_as_item(
    items: Iterator[Any], failing: type[IngestError] = IngestError
) -> Iterator[Any]:
    """``items``, then a :class:`Failed` if they end with an :class:`IngestError`.
    ``failing`` is bound as the function is made: a loop left open at exit is closed as the
    interpreter clears this module, whose ``IngestError`` may be None by then (a traceback,
    "catching classes that do not inherit from BaseException")."""
    try:
        yield from items
    except failing as e:
        yield Failed(e)


__all__ = ["DataLoader"]
