"""The reader pool: one CPU service per stream that reads, shuffles, batches and decodes.

A :class:`RayStream` starts ``ReaderPool.size(world_size)`` reader actors on CPU nodes (placed
by ``resources`` / ``label_selector``, apart from the trainers). Each rank's feed
(:class:`ingest.engine.feed.Feed`, the same engine a single-process :class:`ingest.Stream` runs)
lives in one reader actor (rank ``r`` on actor ``r % size``) and runs ahead of the rank by a
bounded number of ready batches, held within the pool's byte budget until the rank takes
them (a few per call, in the call's result in the object store).
With a transform, each batch is decoded by the actors of the pool in turn (``decode``), so
decoding scales with the pool even for one rank. The training process only fetches ready
Arrow tables and wraps them as tensors; it changes no process-wide setting.

Why long-lived actors fed by the coordinator rather than one Ray Data execution per epoch:
a rank must receive a deterministic, exactly-once share with equal steps, which Ray Data's
``streaming_split`` does not give (its split is dynamic), so the previous design ran one
execution per rank: N streaming executors per stream, each sizing itself as if it owned the
cluster, each changing the worker's ``DataContext``, and 5.5 s of start-up before the first
batch of every epoch (issue 7 measured 11 s to the first batch, 0.5 s on a warm epoch).
Actors start once per stream, plan and read while the trainers start, hold the shuffle
window and the open shards across batches, and keep the per-rank order a pure function of
the plan. Ray's actor restarts and the coordinator's state keep exactly-once when they die.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import ray

from ingest.core.errors import ConfigError, IngestError, StreamTimeoutError, SupersededError
from ingest.core.quarantine import reason_of
from ingest.core.sizing import Autoscale, reader_cpus, shortfall
from ingest.core.state import Cursor
from ingest.distributed.metrics import StoreMeter
from ingest.distributed.rank_feed import (
    WAIT_S,
    End,
    FeedLostError,
    Item,
    RankFeed,
    TransformFailed,
)
from ingest.engine.rank_node import read_transform
from ingest.engine.spec import StreamSpec
from ingest.engine.transform import (
    Transform,
    build_transform,
    output_of_no_rows,
    parallel_batches,
)
from ingest.storage.sources import Source


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderPool:
    """Where and how wide a stream's CPU service runs.

    Attributes:
        min_size: Fewest reader actors.
        max_size: Most reader actors; the pool has ``world_size`` actors within these
            bounds (a rank's feed lives in one actor; decoding uses them all).
        num_cpus: CPUs each reader actor reserves. None (the default): one, or less on a
            small cluster, so that the pool at ``max_size`` reserves at most a quarter of
            the cluster's CPUs (:func:`ingest.core.sizing.reader_cpus`: 0.125 per reader on
            a 2-CPU ``ray.init``, 1 on a cluster of 16 CPUs and more with ``max_size=4``).
            Whole CPUs per reader held every CPU of a 2-CPU laptop, and the index tasks and
            the trainers waited for ever. A reservation is Ray's scheduling token, not a
            limit; on a cluster, set it with ``resources`` to the CPUs a reader's transform
            uses, so that an autoscaler adds nodes as the pool grows.
        resources: Custom resources every reader asks for, e.g. ``{"ingest": 0.001}`` to
            keep them on nodes that declare an ``ingest`` resource (never the trainers').
            The coordinator asks for a sliver of each (0.001) and the same labels: it runs
            on the pool's nodes too.
        label_selector: Node labels the readers must match.
        prefetch_batches: Ready batches each rank's feed keeps ahead of the rank, at most
            (within ``object_store_bytes``): twice ``RankOptions.fetch_batches``, so that a
            take finds a full call's worth while the feed reads on.
        object_store_bytes: Most bytes of ready batches the pool holds in the object store
            at once, all ranks together (a batch's bytes count from when its feed starts
            decoding it until its rank takes it). Each reader holds its ranks' batches
            within an equal share (``object_store_bytes`` // readers); a batch larger than a
            share is held alone in its reader, so with batches that large the pool holds up
            to one batch per reader (``stats()["peak_queued_bytes"]`` says how much).
        spread: Place the readers on as many of the allowed nodes as possible (Ray's
            ``"SPREAD"`` strategy), so that a lost node takes few of them and the rest of
            the pool keeps reading while Ray restarts those on the remaining nodes.
        autoscale: Size the pool while it runs (:class:`ingest.Autoscale`): it starts at
            ``min_size`` readers, adds one while the ranks wait for data on busy readers,
            and removes one when fewer would do; feeds and decode work move between readers
            without losing or repeating a row (:mod:`ingest.distributed.sizer`). None: the
            pool keeps ``size(world_size)`` readers.
        start_timeout_s: Longest wait for the pool's first readers to start once they fit
            the cluster (another job may hold the CPUs for a while). A pool the cluster's
            nodes cannot hold at all (``ray.cluster_resources()``: fewer CPUs, or no node
            with a resource asked) fails at once, naming the resource and the fix; on a
            cluster whose autoscaler starts the pool's nodes on demand, keep ``min_size``
            readers' worth of them up (the launcher's ``min_workers``).
    """

    min_size: int = 1
    max_size: int = 4
    num_cpus: float | None = None
    resources: dict[str, float] | None = None
    label_selector: dict[str, str] | None = None
    prefetch_batches: int = 32
    object_store_bytes: int = 1 << 30
    spread: bool = True
    autoscale: Autoscale | None = None
    start_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_size <= self.max_size:
            raise ConfigError(
                f"ReaderPool(min_size={self.min_size}, max_size={self.max_size}) "
                "needs 1 <= min_size <= max_size"
            )
        if self.num_cpus is not None and not self.num_cpus >= 0:
            raise ConfigError(
                f"ReaderPool num_cpus={self.num_cpus} must be >= 0, or None (sized from the "
                "cluster's CPUs)"
            )
        if not self.start_timeout_s > 0:
            raise ConfigError(f"ReaderPool start_timeout_s={self.start_timeout_s} must be > 0")
        if self.prefetch_batches < 1:
            raise ConfigError(f"ReaderPool prefetch_batches={self.prefetch_batches} must be >= 1")
        if self.object_store_bytes < 1 << 20:
            raise ConfigError(
                f"ReaderPool object_store_bytes={self.object_store_bytes} is below 1 MiB; "
                "give the pool room for a few batches"
            )

    def size(self, world_size: int) -> int:
        """Reader actors for ``world_size`` ranks at the start (``min_size`` when the pool
        sizes itself)."""
        if self.autoscale is not None:
            return self.min_size
        return max(self.min_size, min(self.max_size, world_size))

    def on(self, cluster: dict[str, float]) -> ReaderPool:
        """These settings with ``num_cpus`` set for ``cluster`` (``ray.cluster_resources()``)
        if it is None."""
        if self.num_cpus is not None:
            return self
        return replace(self, num_cpus=reader_cpus(cluster.get("CPU", 0.0), self.max_size))

    def asks(self) -> dict[str, float]:
        """The resources each reader asks Ray for (``num_cpus`` set: see :meth:`on`)."""
        return {"CPU": self.num_cpus or 0.0, **(self.resources or {})}

    def actor_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.num_cpus or 0.0, "max_concurrency": 64}
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.label_selector:
            options["label_selector"] = dict(self.label_selector)
        if self.spread:
            options["scheduling_strategy"] = "SPREAD"
        return options

    def coordinator_options(self) -> dict[str, Any]:
        """Where the stream's coordinator runs: on the pool's nodes, apart from the trainers
        (a sliver of each custom resource, no CPU), so that it is restarted on another of
        them if its node is lost."""
        options: dict[str, Any] = {}
        if self.resources:
            options["resources"] = {k: min(v, 0.001) for k, v in self.resources.items()}
        if self.label_selector:
            options["label_selector"] = dict(self.label_selector)
        return options


_FIX = (
    "lower ReaderPool(num_cpus=...) or max_size (num_cpus=None sizes it from the cluster), "
    "give Ray more CPUs (ray.init(num_cpus=N)), or add nodes with the resources asked"
)


def check_fits(pool: ReaderPool, count: int) -> None:
    """Refuse a pool of ``count`` readers that the cluster's nodes cannot hold at all.

    Raises:
        ConfigError: Naming the resource asked, what the cluster has and the fix.
    """
    short = shortfall(
        pool.asks(),
        count,
        ray.cluster_resources(),  # type: ignore[no-untyped-call]
        ray.available_resources(),  # type: ignore[no-untyped-call]
    )
    if short is not None:
        raise ConfigError(f"the reader pool of {count} reader(s) cannot be placed: {short}; {_FIX}")


def wait_started(pool: ReaderPool, actors: list[Any]) -> None:
    """Wait until ``actors`` (the pool's readers) run, up to ``pool.start_timeout_s``.

    Raises:
        StreamTimeoutError: If some did not start, naming what they ask, what the cluster
            has free and the fix.
    """
    refs = [a.ping.remote() for a in actors]
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=pool.start_timeout_s)
    if pending:
        total: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        free: dict[str, float] = ray.available_resources()  # type: ignore[no-untyped-call]
        held = ", ".join(
            f"{total.get(k, 0.0):g} {k} ({free.get(k, 0.0):g} free)" for k in pool.asks()
        )
        raise StreamTimeoutError(
            f"{len(pending)} of the reader pool's {len(actors)} readers did not start within "
            f"{pool.start_timeout_s:g} s (ReaderPool.start_timeout_s): each asks "
            f"{pool.asks()}, the cluster has {held}; other work holds them (`ray status`): "
            f"{_FIX}, or raise start_timeout_s"
        )
    ray.get(refs, timeout=pool.start_timeout_s)


class _Reader:
    """A reader actor: hosts rank feeds and decodes batches for the pool's feeds.

    Args:
        coordinator: The name of the stream's coordinator actor, looked up here (also after a
            restart). A handle passed in would be a reference the restart depends on; Ray
            warns about those on every actor made (ray-project/ray#53727).
        spec: The stream.
        transform: The user transform (function or class), built once in this actor.
        pool: The pool settings.
        timeout_s: Longest wait for the coordinator.
    """

    def __init__(
        self,
        coordinator: str,
        spec: StreamSpec,
        transform: Transform | None,
        pool: ReaderPool,
        timeout_s: float,
        packs: bool = False,
    ) -> None:
        self.coordinator: Any = ray.get_actor(coordinator)
        self.spec = spec
        self.timeout_s = timeout_s
        self.depth = pool.prefetch_batches
        self.source = Source(
            spec.urls,
            storage_options=spec.storage_options,
            format=spec.format,
            retry=spec.read.retry,
            cache=spec.read.cache,
        )
        self._fn: Callable[[pa.Table], Any] | None = None
        self._unbuilt: ConfigError | None = None
        try:
            self._fn = read_transform(build_transform(transform), regrouped=packs)
        except ConfigError as e:
            # Raised where a batch needs the transform, so that it reaches the rank as
            # itself: raised here, it killed the actor and the rank saw an ActorDiedError.
            self._unbuilt = e
        self._meter = StoreMeter(coordinator)
        self._peers: list[Any] = []
        self._reports_pool = False
        self._turn = 0
        self._budget = pool.object_store_bytes
        self._feeds: dict[int, RankFeed] = {}
        self._lock = threading.Lock()
        # The budget is reserved and released under one lock: a feed that checked the
        # bytes held and added its batch's later let two feeds each see room for one.
        self._budget_cond = threading.Condition()
        self._held_bytes = 0
        self._peak_bytes = 0
        self._decoding = 0
        """Decode calls from peers under way here (:meth:`retire` waits for them)."""
        self._busy_s, self._cpu_s = 0.0, time.process_time()
        # The filesystems (and an S3 client) are made while the actor waits for its first
        # call, not in the first read.
        threading.Thread(target=self.source.open_filesystems, daemon=True).start()

    def connect(self, peers: list[Any], budget: int) -> None:
        """The pool's actors (this one included), and this actor's share of the budget;
        again whenever the pool grows or shrinks (:mod:`ingest.distributed.sizer`)."""
        before = len(self._peers)
        self._peers = peers
        with self._budget_cond:
            self._budget = budget
            self._budget_cond.notify_all()
        me = ray.get_runtime_context().get_actor_id()
        self._reports_pool = bool(peers) and peers[0]._actor_id.hex() == me
        """The pool's first actor reports its size (``ingest_pool_size``) and resizes."""
        if self._reports_pool and before and before != len(peers):
            self._meter.resized(len(peers), len(peers) > before)

    def drop(self, rank: int) -> None:
        """Stop serving ``rank``: its feed moved to another reader of the pool. The rank's
        next take here fails with :class:`FeedLostError`, and the rank adopts its feed on
        the reader that hosts it now, after the last batch it handed out."""
        with self._lock:
            feed = self._feeds.pop(rank, None)
        if feed is not None:
            feed.drop()
            self._meter.moved(rank)

    def load(self) -> tuple[float, float]:
        """Seconds spent in the transform (summed over calls) and CPU seconds of this
        process, since the last call: how busy this reader was (:mod:`ingest.core.sizing`)."""
        with self._lock:
            cpu = time.process_time()
            out = (self._busy_s, cpu - self._cpu_s)
            self._busy_s, self._cpu_s = 0.0, cpu
            return out

    def retire(self, wait_s: float) -> dict[str, int]:
        """Leaving the pool (no peer sends it work any more): stop every feed it still
        hosts, wait up to ``wait_s`` for the decodes under way here to end, and give its
        store counts."""
        with self._lock:
            ranks = list(self._feeds)
        for rank in ranks:
            self.drop(rank)
        deadline = time.monotonic() + wait_s
        while self._decoding and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.source.stats.as_dict()

    def ping(self) -> bool:
        return True

    def node(self) -> str:
        """The id of the node this reader runs on."""
        return str(ray.get_runtime_context().get_node_id())

    @property
    def parallel_batches(self) -> int:
        """Batches one feed decodes at once (the transform's ``parallel_batches``)."""
        return parallel_batches(self._fn)

    def decode(self, table: pa.Table) -> pa.Table:
        """Run the transform on one batch (called by the pool's feeds, in turn)."""
        assert self._fn is not None
        with self._lock:
            self._decoding += 1
        try:
            return self._transform(table)
        finally:
            with self._lock:
                self._decoding -= 1

    def _transform(self, table: pa.Table) -> Any:
        fn = self._fn
        assert fn is not None
        began = time.monotonic()
        try:
            return fn(table)
        except Exception as e:  # quarantined by the rank, which knows the step
            if self.spec.read.on_error != "skip":
                raise
            empty = output_of_no_rows(fn, table)
            return TransformFailed(reason_of(e), int(table.num_rows), empty)
        finally:
            with self._lock:
                self._busy_s += time.monotonic() - began

    @property
    def feed_transform(self) -> Callable[[pa.Table], Any] | None:
        """The transform a rank's feed runs itself, with ``derived=``: the feed keeps what it
        makes of each unit read whole (:mod:`ingest.engine.derived`), so it runs where the
        unit is read, not on the pool's actors in turn; None without ``derived=`` (each
        batch goes to :meth:`decoded`).

        Raises:
            ConfigError: If the transform's class could not be built in this actor.
        """
        if self.spec.derived is None:
            return None
        if self._unbuilt is not None:
            raise self._unbuilt
        return self._fn

    def decoded(self, table: pa.Table) -> Any:
        """The batch decoded, by the pool's actors in turn: a table made here, or a ref.

        A table made here is not ``ray.put`` on its own: one put per batch cost a third of a
        reader's time (measured with py-spy); the batches ride in the ``take`` result.

        Raises:
            ConfigError: If the transform's class could not be built in this actor.
        """
        if self._unbuilt is not None:
            raise self._unbuilt
        if self._fn is None:
            return table
        if len(self._peers) > 1:
            peer = self._peers[self._turn % len(self._peers)]
            self._turn += 1
            return peer.decode.remote(table)
        return self._transform(table)

    def wait_for_budget(self, nbytes: int, stopped: Callable[[], bool]) -> bool:
        """Wait until ``nbytes`` more fit in this actor's share of the budget, then hold
        them (:meth:`release` gives them back). A batch larger than the whole share goes
        alone: when nothing else is held.

        Returns:
            True holding the bytes; False holding nothing if ``stopped()`` (the feed that
            asks stopped) turned true while it waited.

        Raises:
            IngestError: If the share stayed full for ``timeout_s``.
        """
        deadline = time.monotonic() + self.timeout_s
        with self._budget_cond:
            while self._held_bytes and self._held_bytes + nbytes > self._budget:
                if stopped():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise IngestError(
                        f"the reader pool's object-store budget ({self._budget} bytes per "
                        f"reader) stayed full for {self.timeout_s:.0f} s: the ranks stopped "
                        "taking batches; raise ReaderPool.object_store_bytes or check the ranks"
                    )
                self._budget_cond.wait(min(left, WAIT_S))
            self._held_bytes += nbytes
            self._peak_bytes = max(self._peak_bytes, self._held_bytes)
            return True

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` held by :meth:`wait_for_budget` (a batch taken or dropped);
        also wakes the feeds waiting for the budget to see whether they stopped."""
        with self._budget_cond:
            self._held_bytes -= nbytes
            self._budget_cond.notify_all()

    def _feed(self, rank: int, session: int, epoch: int) -> RankFeed:
        with self._lock:
            feed = self._feeds.get(rank)
            if feed is None or (feed.session, feed.epoch) != (session, epoch):
                if feed is not None:
                    feed.stop()
                feed = self._feeds[rank] = RankFeed(self, rank, session, epoch)
            return feed

    def warm(self, rank: int, session: int | None, epoch: int) -> None:
        """Start ``rank``'s feed before the rank asks (the first batch comes sooner); the
        rank's iterator adopts it (:meth:`adopt`).

        ``session``: the rank's; None: the coordinator's session now (a stream just made,
        whose ranks have not asked yet: a fresh stream's first ranks keep that session).
        """
        if session is None:
            try:
                session = int(ray.get(self.coordinator.session.remote(), timeout=self.timeout_s))
            except Exception:  # the rank starts its feed when it asks
                return
        self._feed(rank, session, epoch)

    def adopt(
        self,
        rank: int,
        session: int,
        epoch: int,
        lease: int,
        next_step: int | None,
        cursor: Cursor | None,
    ) -> None:
        """Serve ``rank``'s iterator of ``lease`` from ``next_step`` (None: the share's
        start) of ``epoch``, with ``cursor`` the rank's position before it.

        The feed there is kept when it is where the iterator is (nothing handed out since):
        a feed warmed before the rank asked, or one whose iterator continues. Otherwise (a
        new iterator of the rank, while an older one had taken batches it never handed out;
        a take whose answer was lost; this actor restarted) the feed starts over from
        ``next_step`` and ``cursor``, leaving out every acked row.
        """
        with self._lock:
            feed = self._feeds.get(rank)
            keep = (
                feed is not None
                and (feed.session, feed.epoch) == (session, epoch)
                and feed.at == next_step
            )
            if not keep:
                if feed is not None:
                    feed.stop()
                resume = None if next_step is None else (next_step, cursor)
                feed = self._feeds[rank] = RankFeed(self, rank, session, epoch, resume)
            assert feed is not None
            feed.lease = lease

    # Never retried on a restarted actor, and never making a feed: a new process has none for
    # the rank, and one made from the epoch's start would deliver again (a take sent while
    # the actor restarted reaches the new process: it did, and a rank got steps 0-2 again).
    # The rank resumes the feed after its last batch, or starts the epoch (RankIterator).
    @ray.method(max_task_retries=0)  # type: ignore[misc]
    def take(
        self, rank: int, session: int, epoch: int, most: int, wait_s: float, lease: int = 0
    ) -> list[Item | End]:
        """Up to ``most`` ready items of ``rank``; an empty list if none came in ``wait_s``.

        Raises:
            FeedLostError: If this reader holds no feed of ``rank`` for ``session``,
                ``epoch`` and ``lease`` (see :meth:`adopt`).
            SupersededError: If a newer iterator of the rank adopted the feed.
        """
        with self._lock:
            feed = self._feeds.get(rank)
        if feed is None or (feed.session, feed.epoch) != (session, epoch):
            raise FeedLostError(f"no feed of rank {rank} for session {session}, epoch {epoch}")
        if lease != feed.lease:
            if lease < feed.lease:
                raise SupersededError.of_rank(rank)
            raise FeedLostError(f"the feed of rank {rank} serves lease {feed.lease}, not {lease}")
        out = feed.take(most, wait_s)
        if self._meter.due():  # every feed's depth: the rank taking now may always be one
            pool = len(self._peers) if self._reports_pool else None
            with self._lock:
                feeds = list(self._feeds.items())
            depths = {r: f.depth for r, f in feeds}  # each under its feed's own lock
            self._meter.report(self.source.stats.as_dict(), depths, pool)
        return out

    def stats(self) -> dict[str, int]:
        """Requests and bytes sent to the store; bytes of batches held within this reader's
        budget (being decoded, or ready) now and at most, and its share of the budget."""
        with self._budget_cond:
            held = self._held_bytes
        return {
            **self.source.stats.as_dict(),
            "queued_bytes": held,
            "peak_queued_bytes": self._peak_bytes,
            "budget_bytes": self._budget,
        }


# Restarted when its process dies: decode calls are retried on the new process; a rank whose
# feed lived there resumes it after its last acked batch (RankIterator).
Reader: Any = ray.remote(max_restarts=-1, max_task_retries=-1)(_Reader)

__all__ = ["End", "FeedLostError", "Item", "Reader", "ReaderPool"]
