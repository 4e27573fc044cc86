"""RayStream: the distributed stream's handle on the driver."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import ray

from ingest.core.errors import ConfigError, IngestError, NoShardsError
from ingest.core.quarantine import Quarantined, summary
from ingest.distributed.coordinator import Coordinator, CoordinatorLostError
from ingest.distributed.index_tasks import ray_indexer
from ingest.distributed.pool import Reader, ReaderPool, check_fits, wait_started
from ingest.distributed.rank import (
    RankIterator,
    RankOptions,
    flush_loops,
    stop_loops,
    unwrap,
)
from ingest.distributed.sizer import PoolSizer, Readers
from ingest.engine.mix import Mix
from ingest.engine.options import StreamKeywords, StreamOptions
from ingest.engine.spec import StreamSpec
from ingest.planner.index import IndexConfig

if TYPE_CHECKING:  # typing.Unpack is 3.11's
    from typing_extensions import Unpack

    from ingest.distributed.ray_mix import MixedRankIterator, MixedRayStream
    from ingest.storage.sources import URLs


class RayStream:
    """A stream read by a pool of CPU reader actors and consumed by ``world_size`` ranks.

    The same engine as :class:`ingest.Stream` (same planner, shuffle, batches and state),
    with a coordinator actor that lists the source once per epoch, cuts the epoch into equal
    shares (the same number of full batches on every rank), collects what each rank consumed
    and produces states consistent across ranks; and one reader pool per stream
    (:class:`ReaderPool`) that reads and decodes for every rank. Each rank iterates
    :meth:`rank_iterator` inside any Ray worker (a Ray Train worker, a task, an actor).
    The pool starts, and the first epoch is planned, when the stream is created.

    Args:
        source: URL, glob or directory, or a list of them (any fsspec protocol); or an
            :class:`ingest.Mix` of named sources with weights: each source is a stream of its
            own with these options (its coordinator and reader pool), and every rank draws
            its batches' sequences (or rows) from them alike (:mod:`ingest.distributed.ray_mix`).
        format: Format name for every shard; None infers it from extensions.
        columns: Columns to read; None reads all. A shard that lacks one is an error
            naming it and the columns the shard has (:class:`ingest.ShardError`).
        batch_size: Rows per batch on every rank.
        shuffle: The order on each rank: ``ingest.Shuffle(seed, window, bytes, lanes)``
            (see :class:`ingest.Shuffle`); the default reads in listing order.
        shuffle_seed, shuffle_window, shuffle_bytes, shuffle_lanes: The same settings as
            keywords, as earlier releases took them; not together with ``shuffle``.
        remainder: ``"carry"`` the rows that cannot fill a step on every rank into the next
            epoch, or ``"drop"`` them; counted either way.
        world_size: Number of ranks.
        readers: The reader pool: its size, CPUs, placement and object-store budget.
        storage_options: fsspec options for the store; never saved in the state.
        read: How shards are read, and what bad data does: with
            ``ReadOptions(on_error="skip")`` what cannot be read is quarantined (see
            :mod:`ingest.core.quarantine`, :meth:`quarantined`); every rank still takes the same
            steps, and a batch that lost rows to it is short (or empty).
        transform: Run on every batch in the reader pool: a function over an Arrow table,
            or a class constructed once per reader actor. It keeps one row per input row, or
            is an :class:`ingest.Stage` (:mod:`ingest.engine.stage`); a list of them runs in
            order, each on what the one before made.
        index: Where the persistent shard index lives (default: the user's cache directory;
            an fsspec URL shares it across a cluster; None: in memory only). With several
            ranks, shards without footer row counts are indexed once, by Ray tasks on the
            pool's nodes, and later jobs read none of them to plan.
        name: Name of the coordinator actor (default: a fresh unique name); the ``stream``
            tag of its metrics (:mod:`ingest.distributed.metrics`).
        timeout_s: Longest wait for the coordinator and the pool.
        follow: Read a dataset written while the stream runs, in rounds of new shards
            (:mod:`ingest.storage.follow`); ``timeout_s`` must exceed its ``idle_timeout_s`` (a rank
            waits for the round's first batch while the round waits for new shards).
        progress: Show progress bars while footers are read and shards indexed at start.
        pack: Pack the documents' token ids into sequences, as :class:`ingest.Stream` does
            (``ingest.Pack(seq_len=...)``; ``batch_size`` is then sequences per batch). The
            readers tokenize (the ``transform``); each rank packs its read steps in its own
            process, and every rank takes the same number of batches: see
            :mod:`ingest.distributed.rank_pack` for how an epoch ends.
        derived: Keep what ``transform`` made of each unit read whole, as
            :class:`ingest.Stream` does: the reader that hosts a rank's feed derives the units
            it reads (or reads their copies) instead of handing each batch to the pool's
            actors in turn.
        provenance: Keep which rows each rank's step consumed, as :class:`ingest.Stream`
            does; the coordinator writes it, so the URL must be writable from its node.
    """

    def __new__(cls, source: Any = None, **kwargs: Any) -> RayStream:
        """A stream over an :class:`ingest.Mix` is a :class:`~ingest.distributed.ray_mix.
        MixedRayStream` (the same members over a stream per source); any other source,
        this class. (``source`` may be missing: an unpickled stream, on a rank.)"""
        if isinstance(source, Mix) and cls is RayStream:
            from ingest.distributed.ray_mix import MixedRayStream  # it builds on this module

            return super().__new__(MixedRayStream)
        return super().__new__(cls)

    def __init__(
        self,
        source: URLs | Mix,
        *,
        world_size: int = 1,
        readers: ReaderPool | None = None,
        index: IndexConfig | None = IndexConfig(),  # noqa: B008 - frozen, compared by value
        name: str | None = None,
        timeout_s: float = 300.0,
        **options: Unpack[StreamKeywords],
    ) -> None:
        self._start(
            source,
            StreamOptions.of("RayStream", options),
            world_size,
            readers,
            index,
            name,
            timeout_s,
        )

    @classmethod
    def of(
        cls,
        source: URLs | Mix,
        options: StreamOptions,
        *,
        world_size: int,
        readers: ReaderPool | None,
        index: IndexConfig | None,
        name: str | None,
        timeout_s: float,
    ) -> RayStream:
        """The stream of ``source`` with ``options`` (what the shared keywords make) and
        the Ray settings, each given (their defaults are the constructor's alone)."""
        stream = cls.__new__(cls, source)
        stream._start(source, options, world_size, readers, index, name, timeout_s)
        return stream

    def _start(
        self,
        source: URLs | Mix,
        options: StreamOptions,
        world_size: int,
        readers: ReaderPool | None,
        index: IndexConfig | None,
        name: str | None,
        timeout_s: float,
    ) -> None:
        pack, transform, follow = options.pack, options.transform, options.follow
        self._settle(options, world_size, name, timeout_s)
        self.mixed: MixedRayStream | None = None
        """Over an :class:`ingest.Mix`: the stream itself (a :class:`~ingest.distributed.
        ray_mix.MixedRayStream`: the sources' streams); else None."""
        if isinstance(source, Mix):  # a subclass's _start takes it (see __new__)
            raise ConfigError(
                f"{type(self).__name__} reads URLs: read a Mix with ingest.RayStream(mix)"
            )
        self.spec = StreamSpec.of(source, index=index, **options.spec_options())
        if follow is not None and timeout_s <= follow.idle_timeout_s + follow.poll_s:
            raise ConfigError(
                f"timeout_s={timeout_s} must exceed Follow(idle_timeout_s="
                f"{follow.idle_timeout_s}) + poll_s ({follow.poll_s}): a rank waits for a "
                "round's first batch while the round waits for new shards"
            )
        self.transform = transform
        if not ray.is_initialized():
            ray.init()
        # num_cpus=None is sized from the cluster's CPUs (ingest.core.sizing.reader_cpus); a
        # pool the cluster's nodes cannot hold is refused here, naming the resource.
        cluster: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        self.pool = (readers or ReaderPool()).on(cluster)
        check_fits(self.pool, self.pool.size(world_size))
        placement = {
            "resources": self.pool.resources,
            "label_selector": self.pool.label_selector,
        }
        try:
            self.coordinator = Coordinator.options(
                name=self.name, **self.pool.coordinator_options()
            ).remote(self.spec, world_size, placement, timeout_s, pack is not None)
        except ray.exceptions.ActorAlreadyExistsError:  # a name another actor holds
            if name is None:
                raise
            raise ConfigError(
                f"RayStream name={name!r} is held by a stream that runs already (its "
                "coordinator, in this Ray): shut that one down first (stream.shutdown(); a "
                "notebook cell run again makes the new stream before the old one is let go), "
                "give this one another name, or leave name= out"
            ) from None
        # Start the pool and plan the first epoch now, while the trainers start; the source
        # is listed here while the actors' processes start. (What makes a reader names no
        # `self`: the finalizer below holds the pool, and through it would hold the stream.)
        pool, name, spec, packs = self.pool, self.name, self.spec, pack is not None
        self._pool = Readers(
            lambda: Reader.options(**pool.actor_options()).remote(
                name, spec, transform, pool, timeout_s, packs
            ),
            self.pool,
            world_size,
            self.coordinator,
            timeout_s,
        )
        self.sizer: PoolSizer | None = None
        """With ``ReaderPool(autoscale=...)``, what sizes the pool (its ``history``)."""
        if self.pool.autoscale is not None:
            self.sizer = PoolSizer(self._pool, self.coordinator, self.pool.autoscale, self.name)
        # A stream let go without shutdown() (a notebook's cell run again) stops its actors:
        # their handles on each other (readers and coordinator) kept them alive, each
        # reader's CPU held, until the driver's end. A copy sent to a task has no finalizer
        # (see __getstate__); an iterator keeps its stream (RankIterator.owner). Not at the
        # interpreter's exit: Ray stops the driver's actors then, and may be shut down first.
        self._finalizer = weakref.finalize(self, _release, self._pool, self.coordinator, self.sizer)
        self._finalizer.atexit = False
        self._warmed = False
        """Whether the ranks' feeds were started (:meth:`_warm`)."""
        # The source is listed here while the actors' processes start; a bad URL fails here.
        # Shards without row counts are indexed by Ray tasks on the pool's nodes (once: the
        # index persists, see StreamSpec.index).
        held = self.pool.size(world_size)
        indexer = ray_indexer(
            resources=self.pool.resources,
            label_selector=self.pool.label_selector,
            beside={k: v * held for k, v in self.pool.asks().items()},
            timeout_s=timeout_s,  # (the indexer's own 600 s, silently, whatever the stream's)
        )
        try:
            listing = self.spec.catalog(indexer).scan(
                progress=options.progress, index=world_size > 1
            )
            # The coordinator plans the first epoch while the readers' processes start (they
            # took 1.3-2.5 s on 2 busy cores, benchmarks/resume.py), not after.
            self.coordinator.prepare.remote(listing)
            wait_started(self.pool, self._pool.actors)  # or say which resource is missing
        except BaseException as e:
            if follow is not None and isinstance(e, NoShardsError):
                # Followed: the coordinator's first round waits for a first shard.
                self.coordinator.prepare.remote(None, plan=False)
                return
            self.shutdown()  # no actor outlives a stream that could not start
            raise

    def _settle(
        self, options: StreamOptions, world_size: int, name: str | None, timeout_s: float
    ) -> None:
        """Check and keep what every RayStream has, over a mixture too."""
        transform = options.transform
        if isinstance(world_size, bool) or world_size < 1:
            raise ConfigError(f"world_size={world_size} must be >= 1")
        if transform is not None and not callable(transform):
            raise ConfigError(
                f"transform={transform!r} is neither a function nor a class; pass a function "
                "over a pyarrow Table, or a class whose instances are one"
            )
        self.options = options
        """The settings this stream was made with (those it shares with ``Stream``)."""
        self.pack = options.pack
        self.batch_size = options.batch_size
        """Rows per batch on every rank (sequences, with ``pack``)."""
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.name = name or f"ingest-coordinator-{uuid.uuid4().hex[:12]}"
        self.loaded_state: dict[str, Any] | None = None
        """The state given to :meth:`load_state_dict`, if any: where a worker group starts
        when there is no checkpoint yet, also on a coordinator restarted since."""
        self._shut_down = False
        """Whether :meth:`shutdown` ran: the actors are gone, and a call says so."""

    def _running(self) -> None:
        """Raise if :meth:`shutdown` ran (a call would meet dead actors: a coordinator said
        lost, a reader's start retried on them)."""
        if self._shut_down:
            raise IngestError(
                f"this RayStream was shut down (stream.shutdown(), or the end of its `with` "
                f"block): its coordinator and readers ({self.name}) are gone. Make a new "
                "RayStream, and load the last state into it to go on"
            )

    def _get(self, ref: Any, timeout_s: float | None = None) -> Any:
        try:
            return ray.get(ref, timeout=timeout_s or self.timeout_s)
        except Exception as e:
            raise unwrap(e) from None

    def _warm(self) -> None:
        """Start every rank's feed in the coordinator's session now, before the ranks ask
        (their first batch comes sooner), once what they will be served is settled: at the
        first rank iterator or when the stream is sent to the ranks, unless a loaded state
        warmed them. Warming at construction read each rank's first shard for the fresh
        plan, then again for a state loaded right after (``test_resume_seek``)."""
        if self._warmed:
            return
        self._warmed = True
        for rank in range(self.world_size):
            self._reader(rank).warm.remote(rank, None, 0)

    def __getstate__(self) -> dict[str, Any]:
        # Sent to the ranks (a TorchTrainer's config): what they are served is settled.
        self._warm()
        # A copy sent to a task never sizes the pool (the driver's sizer alone does), nor
        # stops the actors when it is let go (the driver's stream alone does).
        return {**self.__dict__, "sizer": None, "_finalizer": None}

    @property
    def readers(self) -> list[Any]:
        """The pool's reader actors now, in order (rank ``r``'s feed on ``r % len``)."""
        return self._pool.actors

    def _reader(self, rank: int) -> Any:
        return self._pool.of(rank)

    def rank_iterator(
        self, rank: int, *, options: RankOptions | None = None
    ) -> RankIterator | MixedRankIterator:
        """The iterator of ``rank`` (0 <= rank < world_size); picklable."""
        self._running()
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside world_size {self.world_size}")
        self._warm()
        return self._iterator(rank, options, None)

    def _iterator(
        self, rank: int, options: RankOptions | None, session: int | None
    ) -> RankIterator:
        """Rank ``rank``'s iterator; ``session``: the coordinator session it joined (None:
        the current one)."""
        return RankIterator(
            self.coordinator,
            self._reader(rank),
            rank,
            options or RankOptions(timeout_s=self.timeout_s),
            session=session,
            stream=self.name,
            pack=self.pack,
            pack_batch=self.batch_size,
            owner=self,
        )

    def joined(
        self,
        rank: int,
        world_size: int,
        state: Mapping[str, Any] | None,
        *,
        options: RankOptions | None = None,
    ) -> RankIterator | MixedRankIterator:
        """The iterator of ``rank`` in a worker group of ``world_size`` (a Ray Train run's,
        :func:`ingest.train.rank_iterator`), the coordinator joined from ``state`` (the last
        checkpoint's; None: the state loaded on the driver, or a fresh start). The group's
        world size may differ from the stream's."""
        self._running()
        ref = self.coordinator.join.remote(
            rank, world_size, None if state is None else dict(state), self.loaded_state
        )
        try:
            session = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayActorError as e:  # killed for good (ray.kill, no restart)
            raise CoordinatorLostError(e) from None
        except Exception as e:
            raise unwrap(e) from None
        return self._iterator(rank, options, session)

    def reader_for(self, rank: int) -> Any:
        """The reader actor that hosts ``rank``'s feed (ranks of any world size)."""
        self._running()
        return self._reader(rank)

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """The state after ``step`` on every rank; None: after the last step all ranks acked.

        It covers every batch the ranks' iterators handed out up to that step (an iterator
        left early sends its acks as it returns; the open loops of this process send theirs
        first). Over a Mix, states are taken on the ranks.
        """
        self._running()
        flush_loops(self.name)
        ref = self.coordinator.state_dict.remote(step, self.timeout_s)
        try:
            return ray.get(ref, timeout=self.timeout_s + 30)  # type: ignore[no-any-return]
        except ray.exceptions.RayActorError as e:  # dead, or restarting: what it held is lost
            raise CoordinatorLostError(e) from None
        except Exception as e:
            raise unwrap(e) from None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after ``state``, which may come from another world size, pool size or a
        single-process :class:`ingest.Stream`. Load before any rank iterates."""
        self._running()
        deadline = time.monotonic() + self.timeout_s
        while True:  # a coordinator that is restarting takes the state once it is back
            try:
                session = self._get(self.coordinator.load_state_dict.remote(dict(state)))
                break
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.loaded_state = dict(state)
        stop_loops(self.name)  # (a loop of a rank iterator of this process still running)
        first = self._get(self.coordinator.first_epoch.remote())
        self._warmed = True
        for rank in range(self.world_size):
            self._reader(rank).warm.remote(rank, session, first)

    def stats(self) -> dict[str, int]:
        """Requests and bytes the pool sent to the store, summed over its readers, and the
        quarantines (``quarantined``, ``rows_skipped``) the ranks acked; over a Mix, summed
        over its sources."""
        self._running()
        out: dict[str, int] = {}
        for part in [*self._get([r.stats.remote() for r in self.readers]), self._pool.gone]:
            for key, value in part.items():
                out[key] = out.get(key, 0) + int(value)
        return {**out, **summary(self.quarantined())}

    def quarantined(self) -> list[Quarantined]:
        """What ``ReadOptions(on_error="skip")`` skipped and the ranks acked: shard URL, rows
        and reason, oldest first (also in the state; see :mod:`ingest.core.quarantine`)."""
        self._running()
        got: list[Quarantined] = self._get(self.coordinator.quarantined.remote())
        return got

    def shutdown(self) -> None:
        """Stop the reader pool and the coordinator actor (every source's, over a Mix),
        after the coordinator wrote what its provenance log holds (``provenance=``). Once:
        a second call does nothing."""
        if self._shut_down:
            return
        self._shut_down = True
        finalizer = getattr(self, "_finalizer", None)  # None: a copy sent to a task
        if finalizer is not None:
            finalizer.detach()
        if self.sizer is not None:
            self.sizer.stop()
        if self.spec.provenance is not None:
            try:
                self._get(self.coordinator.flush_log.remote())
            except Exception as e:  # told, not raised: the stream stops all the same (a
                # coordinator lost, or a log that cannot be written)
                warnings.warn(f"the provenance log was not written whole: {e}", stacklevel=2)
        self._pool.kill()
        ray.kill(self.coordinator)

    def __iter__(self) -> Iterator[Any]:
        # Without it, `for batch in stream` said only "'RayStream' object is not iterable".
        raise TypeError(
            "a RayStream serves its ranks, each through its own iterator: iterate "
            "stream.rank_iterator(rank) (in a notebook, rank 0 of world_size=1), or hand the "
            "stream to Ray Train (ingest.train.rank_iterator in the train loop); a one-process "
            "stream is ingest.Stream"
        )

    def __enter__(self) -> RayStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _release(readers: Readers, coordinator: Any, sizer: PoolSizer | None) -> None:
    """Stop the actors of a stream let go without :meth:`RayStream.shutdown` (its
    finalizer's call). It waits on nothing and takes no lock in the thread it runs in: a
    collection may run it in any thread, one that holds the pool's lock among them (its
    sizer's, resizing), which would wait on itself; a thread of its own kills the actors."""
    if not ray.is_initialized():
        return
    if sizer is not None:
        sizer.stop(wait=False)

    def kill() -> None:
        with contextlib.suppress(Exception):  # a Ray going down takes the actors with it
            readers.kill()
            ray.kill(coordinator)

    threading.Thread(target=kill, name="ingest-release", daemon=True).start()
