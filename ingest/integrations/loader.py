"""A torch ``DataLoader`` over a :class:`ingest.Stream`, its workers reading disjoint shares.

Each worker process is a rank of the engine: every ``iter(loader)`` starts from the stream's
state, the main process lists the source once and plans the epoch for ``num_workers`` ranks,
and each worker plans the same epoch from the same state and listing and reads its rank's
share (rows split without duplicates, each worker with its own fsspec filesystems, made
after the fork or spawn). Every batch carries where its rows came from; the main process
takes that off and hands the batch out through that worker's rank loop
(:meth:`ingest.engine.loop.RankLoop.hand_out`, which acks it), so
:meth:`DataLoader.state_dict` covers every batch handed out by any worker, at any moment,
and loads with any worker count (or into a ``Stream`` or a ``RayStream``).

Workers are never persistent: each epoch starts them from the state. ``batch_size`` is the
stream's; the ``DataLoader`` does no batching or collation of its own.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch.utils.data

from ingest.core.book import EpochBook
from ingest.core.errors import ConfigError, IngestError
from ingest.core.ledger import Closed, Rows, Runs
from ingest.core.quarantine import Quarantined
from ingest.core.snapshot import state_with_tokens
from ingest.core.state import Cursor, StreamState
from ingest.engine.convert import Batch, to_torch
from ingest.engine.feed import Feed, Ready, Tail
from ingest.engine.loop import BookLink, RankLoop
from ingest.engine.pack import ORIGIN, Pack, PackedRank, merged
from ingest.engine.spec import StreamSpec
from ingest.engine.stream import Stream
from ingest.integrations.mixed_loader import MixedLoader, Nothing
from ingest.planner.catalog import Listing

KEY = "__ingest__"
"""The batch entry that carries a batch's provenance from a worker to the main process."""


@dataclass(frozen=True, slots=True)
class _Came:
    """Where a worker's batch came from (taken off in the main process)."""

    rank: int
    step: int
    runs: Runs | Rows
    rows: int
    cursor: Cursor
    quarantined: tuple[Quarantined, ...]
    arrays: tuple[str, ...] = ()
    """Tensors sent as numpy arrays (see :meth:`_Shares.__iter__`), made tensors again."""
    closed: Closed | None = None
    table: pa.Table | None = None
    """A packing stream's read step: its token ids and each row's origin, packed in the
    main process (:class:`ingest.engine.pack.PackedRank`)."""

    @classmethod
    def of(
        cls, rank: int, item: Ready, *, arrays: tuple[str, ...] = (), table: pa.Table | None = None
    ) -> _Came:
        """Where ``item``, a batch of ``rank``'s feed, came from."""
        return cls(
            rank,
            item.step,
            item.runs,
            item.rows,
            item.cursor,
            item.quarantined,
            arrays,
            item.closed,
            table,
        )


@dataclass(frozen=True, slots=True)
class _Failed:
    """A worker's read failed with this error, sent as it is: torch would re-raise it in the
    main process as a RuntimeError of its message (it rebuilds errors from a message alone),
    so ``except ingest.ShardError`` would not catch it."""

    error: IngestError


@dataclass(frozen=True, slots=True)
class _Ended:
    """A worker's feed ended: what the book needs when row counts were unknown."""

    rank: int
    steps: int
    leftover: Runs
    learned: dict[int, int]
    quarantined: tuple[Quarantined, ...]


class _Shares(torch.utils.data.IterableDataset[Batch]):
    """What the DataLoader's workers iterate: their rank's share of one epoch."""

    def __init__(self, spec: StreamSpec, transform: Any, pack: Pack | None) -> None:
        self.spec = spec
        self.transform = transform
        self.pack = pack
        self.ranks = 1
        self.start: dict[str, Any] | None = None
        self.listing: Listing | None = None

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        rank = 0 if info is None else info.id
        planner = self.spec.planner()
        book = self.spec.book(self.ranks, planner)
        if self.start is not None:
            book.load(StreamState.from_json(self.start), self.listing)
        elif self.listing is not None:
            book.adopt(self.listing)
        epoch = book.upcoming_epoch(rank)
        feed = Feed(
            book.rank_plan(rank, epoch), self.spec.feed_config(), planner.source, self.transform
        )
        with feed.ahead(self.spec.urls[0]) as items:
            for item in _failing_as_item(items):
                if isinstance(item, _Failed):
                    yield {KEY: item}
                    return
                if isinstance(item, Tail):
                    end = _Ended(rank, item.steps, item.leftover, item.learned, item.quarantined)
                    yield {KEY: end}
                    return
                assert isinstance(item, Ready)
                if self.pack is not None:  # packed in the main process
                    columns = [self.pack.column, ORIGIN]
                    table = item.table.select([c for c in columns if c in item.table.column_names])
                    yield {KEY: _Came.of(rank, item, table=table)}
                    continue
                batch = to_torch(item.table)
                arrays: tuple[str, ...] = ()
                if info is not None:
                    # Sent by value through the worker's pipe, not as torch's shared-memory
                    # tensors: those cost a socket handshake per tensor (over half the time
                    # of an epoch of small batches), and the process-wide sharing strategy
                    # is the user's to set.
                    arrays = tuple(k for k, v in batch.items() if isinstance(v, torch.Tensor))
                    batch = {k: v.numpy() if k in arrays else v for k, v in batch.items()}
                came = _Came.of(rank, item, arrays=arrays)
                yield {**batch, KEY: came}


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
            ``prefetch_factor``, ``multiprocessing_context``, ``timeout``, ...); not
            ``batch_size``, ``shuffle``, ``sampler`` or ``collate_fn``: the stream batches and
            shuffles.

    With ``num_workers`` ranks, an epoch has equal steps per worker: the rows that cannot
    fill a step on every worker are carried into the next epoch, as on a ``RayStream``.
    Over a stream of an :class:`ingest.Mix`, each source has a loader of its own with
    ``num_workers`` workers, and this process draws from them as the stream does
    (:mod:`ingest.integrations.mixed_loader`).
    """

    def __init__(self, stream: Stream, *, num_workers: int = 0, **kwargs: Any) -> None:
        for name in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn"):
            if name in kwargs:
                raise ConfigError(
                    f"ingest.DataLoader takes no {name}=: the stream batches and shuffles "
                    "(set batch_size, shuffle_seed on the Stream)"
                )
        if kwargs.get("persistent_workers"):
            raise ConfigError(
                "ingest.DataLoader(persistent_workers=True) is not supported: each epoch "
                "starts its workers from the stream's state"
            )
        if num_workers < 0:
            raise ConfigError(f"num_workers={num_workers} must be >= 0")
        self.stream = stream
        self._mix: MixedLoader | None = None
        """Over an ingest.Mix: a loader per source (:mod:`ingest.integrations.mixed_loader`)."""
        if stream.mixed is not None:
            self._mix = MixedLoader(
                stream.mixed, lambda part: DataLoader(part, num_workers=num_workers, **kwargs)
            )
            super().__init__(Nothing(), batch_size=None)
            return
        self._shares = _Shares(stream.spec, stream.parts.transform, stream.pack)
        self._book: EpochBook[Listing] | None = None
        self._ranks: dict[int, RankLoop] = {}
        """Each worker's (rank's) loop: its batches handed out and their acks
        (:mod:`ingest.engine.loop`)."""
        self._packs: dict[int, PackedRank] = {}
        """With a packing stream: each worker's packing, in this process (the workers read,
        decode and tokenize; see :mod:`ingest.engine.pack`)."""
        self._running: weakref.ref[Iterator[Batch]] | None = None
        """The loop last started, held weakly, so that a loop the caller drops (a ``break``)
        is closed at once and shuts its workers down. The loop refers to this loader: held
        strongly, the two made a cycle, and a loop left early kept its workers until the
        cyclic garbage collector came. That collector runs the index queues' finalizers (each
        feeder thread is told to stop) before torch's shutdown puts its stop messages behind
        them, so every worker ran out torch's 5 s join timeout: 10 s for a loader of two
        workers, over 70 s in a test where one collection found several loaders."""
        super().__init__(
            self._shares,
            batch_size=None,
            num_workers=num_workers,
            collate_fn=_as_is,
            **kwargs,
        )

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        if self._mix is not None:
            return iter(self._mix)
        self._stop()
        loop = self._loop()
        self._running = weakref.ref(loop)
        return loop

    def _loop(self) -> Iterator[Batch]:
        ranks = max(1, self.num_workers)
        stream = self.stream
        stream.close()
        start = StreamState.from_json(stream.state_dict())
        # The stream's planner: footers read in earlier epochs are not read again.
        book = stream.spec.book(ranks, stream.parts.planner)
        link = BookLink(book)
        self._ranks = {rank: RankLoop(rank, link) for rank in range(ranks)}
        started = start.started or start.progress.epoch > 0 or bool(start.progress.tokens)
        if started:
            book.load(start)
        epoch = book.upcoming_epoch(0)
        listing = book.plan(epoch).listing  # one listing, made here, for every worker
        self._packs = self._packings(book, start, listing)
        self._book = book
        self._shares.ranks = ranks
        self._shares.start = start.to_json() if started else None
        self._shares.listing = listing
        ended = 0
        pin = self.pin_memory and torch.cuda.is_available()
        for out in super().__iter__():
            came = out.pop(KEY)
            if isinstance(came, _Failed):
                raise came.error
            if came.rank in self._packs:
                yield from self._packed(epoch, came)
                ended += isinstance(came, _Ended)
                continue
            rank = self._ranks[came.rank]
            if isinstance(came, _Ended):
                rank.end(epoch, came)
                ended += 1
                continue
            batch = rank.hand_out(came, functools.partial(_tensors, out, pin=pin))
            if batch is not None:
                yield batch
        if ended != ranks:
            raise ConfigError(f"only {ended} of {ranks} DataLoader workers ended their share")
        # The epoch is done: the stream goes on from the next one (listed when it starts).
        stream.load_state_dict(self._state(), listing=listing)
        self._book = None

    def _packings(
        self, book: EpochBook[Listing], start: StreamState, listing: Listing
    ) -> dict[int, PackedRank]:
        """With a packing stream, each worker's packing, from ``start``'s cut documents."""
        pack = self.stream.pack
        if pack is None:
            return {}
        urls = [s.url for s in listing.shards]
        out = {}
        for rank, loop in self._ranks.items():
            packed = out[rank] = PackedRank(pack, self.stream.batch_size, loop, book)
            packed.load(start)
            packed.begin(urls)
        return out

    def _packed(self, epoch: int, came: _Came | _Ended) -> Iterator[Batch]:
        """A packing worker's read step packed, or its end: the batches they make."""
        packed = self._packs[came.rank]
        if isinstance(came, _Ended):
            yield from packed.finish(epoch, came)
        else:
            yield from packed.feed(came)

    def _flush(self) -> None:
        """Send every rank's held acks to the book (one call per rank for many batches)."""
        if self._book is not None:
            for rank in self._ranks.values():
                rank.flush()

    def _stop(self) -> None:
        """End a loop left early; the stream goes on right after its last batch."""
        self._end_loop()
        if self._book is not None:
            self.stream.load_state_dict(self._state())
            self._book = None

    def _end_loop(self) -> None:
        """Close the running loop, if any: its workers stop now, not at a collection."""
        ref, self._running = self._running, None
        running = ref() if ref is not None else None
        if running is not None:
            close = getattr(running, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()  # shuts its workers down

    def _state(self) -> StreamState:
        """The book's state after every batch handed out; with packing, the documents the
        workers' packings handed out in part or beyond their read steps acked."""
        assert self._book is not None
        self._flush()
        state = self._book.snapshot_acked()
        if self._packs:
            tokens = merged(t for p in self._packs.values() for t in p.entries(state))
            if tokens:
                state = state_with_tokens(state, tokens)
        return state

    def state_dict(self) -> dict[str, Any]:
        """The state after every batch this loader handed out (all workers); plain JSON."""
        if self._mix is not None:
            return self._mix.state_dict()
        if self._book is None:
            return self.stream.state_dict()
        return self._state().to_json()

    def load_state_dict(self, state: Mapping[str, Any] | str) -> None:
        """Start the next epoch exactly after ``state`` (from any loader, Stream or
        RayStream, any worker count or world size)."""
        if self._mix is not None:
            return self._mix.load_state_dict(state)
        self._end_loop()  # its state is replaced: not saved into the stream first
        self._book, self._ranks, self._packs = None, {}, {}
        self.stream.load_state_dict(state)


def _tensors(batch: Batch, came: _Came, *, pin: bool) -> Batch:
    """``batch`` with the arrays a worker sent (``came.arrays``) made tensors again."""
    for name in came.arrays:
        tensor = torch.from_numpy(batch[name])
        batch[name] = tensor.pin_memory() if pin else tensor
    return batch


def _as_is(batch: Any) -> Any:
    return batch


def _failing_as_item(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, then a :class:`_Failed` if they end with an :class:`IngestError`."""
    try:
        yield from items
    except IngestError as e:
        yield _Failed(e)


__all__ = ["DataLoader"]
