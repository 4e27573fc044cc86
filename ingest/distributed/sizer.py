"""The reader pool on the driver: its actors, and the sizer that grows and shrinks it.

:class:`Readers` holds a stream's reader actors in order; rank ``r``'s feed lives on reader
``r % len(readers)`` (:mod:`ingest.distributed.directory`). With
``ReaderPool(autoscale=Autoscale(...))``, a :class:`PoolSizer` thread of the driver measures
every ``interval_s`` and grows or shrinks the pool by one reader (the rules, and when the
first decision comes: :mod:`ingest.core.sizing`). A resize, in order:

1. **Growing**: a new reader is started and waited for (up to ``start_timeout_s``: on a
   cluster with the Ray autoscaler, a reader that finds no free CPU makes it add a node).
2. **Every reader is told the new pool** (``connect``): decode work spreads over the new
   list from the next batch on, and each reader's share of the object-store budget follows
   the size. Then the coordinator's directory is set (``set_readers``).
3. **Feeds whose home changed are moved**: the old home drops the rank's feed, so the
   rank's next take there fails with ``FeedLostError``; the rank asks the directory where
   its feed lives now and adopts it there after the last batch it handed out (the path a
   reader's death takes: ``RankIterator`` recovers its feed). The batches
   the old feed had made but the rank had not handed out are read again: nothing the rank
   acked, nothing it handed out, is read twice. Moving costs the new feed a fresh read of
   the rank's open shards, so the pool resizes at most once per interval.
4. **Shrinking**: the last reader (the newest) is retired once no peer sends it work: the
   feeds it still hosts are dropped (their ranks move), the decodes under way there end, its
   store counts join the stream's, and it is killed. A decode lost with it anyway is read
   again by its rank (an ``ObjectLostError`` recovered as a reader's death).

Decisions, with what was measured and why, go to the log (``ingest.distributed.sizer``, at
INFO for a resize) and to :attr:`PoolSizer.history`; the pool's size and resizes to the
metrics (``ingest_pool_size``, ``ingest_pool_resizes_total``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from ingest.core.sizing import Autoscale, Decision, Measure, decide, due, period
from ingest.distributed.pool import ReaderPool

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the sizer looks for the ranks' first report (rows flowing)."""


@dataclass(frozen=True, slots=True)
class PoolTick:
    """One decision of the sizer.

    Attributes:
        at_s: Seconds since the pool started, when the figures were taken (a resize then
            takes longer: a new reader starts).
        size: Readers over the interval.
        to: Readers after the decision.
        wait_share: The ranks' wait share over the interval.
        load: Readers' worth of work done over the interval (see :mod:`ingest.core.sizing`).
        rows_per_s: Rows the ranks got per second over the interval, all ranks together.
        reason: Why (the decision's words).
    """

    at_s: float
    size: int
    to: int
    wait_share: float
    load: float
    rows_per_s: float
    reason: str


class Readers:
    """A stream's reader actors, in order, on the driver.

    Args:
        make: Starts one reader actor.
        pool: The pool's settings.
        world_size: The stream's ranks.
        coordinator: The stream's coordinator (its directory is kept in step).
        timeout_s: Longest wait for any reader or coordinator call.
    """

    def __init__(
        self,
        make: Callable[[], Any],
        pool: ReaderPool,
        world_size: int,
        coordinator: Any,
        timeout_s: float,
    ) -> None:
        self.make, self.pool, self.world_size = make, pool, world_size
        self._coordinator, self.timeout_s = coordinator, timeout_s
        self._lock = threading.Lock()
        self._actors: list[Any] = [make() for _ in range(pool.size(world_size))]
        self._gone: dict[str, int] = {}
        """Store counts of the readers retired (``RayStream.stats()`` adds them)."""
        self._connect(wait=False)

    def __getstate__(self) -> dict[str, Any]:
        # A stream sent to a task carries its pool as it is (its ranks ask the coordinator's
        # directory where their feeds live, whatever this copy says).
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def actors(self) -> list[Any]:
        """The readers now, in order."""
        with self._lock:
            return list(self._actors)

    def of(self, rank: int) -> Any:
        """The reader that hosts ``rank``'s feed now."""
        with self._lock:
            return self._actors[rank % len(self._actors)]

    def _connect(self, *, wait: bool) -> None:
        actors = self.actors
        budget = max(self.pool.object_store_bytes // len(actors), 1)
        refs = [a.connect.remote(actors, budget) for a in actors]
        refs.append(self._coordinator.set_readers.remote(actors))
        if wait:
            ray.get(refs, timeout=self.timeout_s)

    def _move(self, before: list[Any], after: list[Any]) -> None:
        """Drop each rank's feed where its home was, if its home changed."""
        refs = []
        for rank in range(self.world_size):
            old, new = before[rank % len(before)], after[rank % len(after)]
            if old._actor_id != new._actor_id:
                refs.append(old.drop.remote(rank))
        ray.get(refs, timeout=self.timeout_s)

    def add(self, actor: Any) -> None:
        """Join a started reader to the pool (see the module docstring)."""
        with self._lock:
            before = list(self._actors)
            self._actors.append(actor)
        self._connect(wait=True)
        self._move(before, self.actors)

    def remove(self) -> None:
        """Retire the newest reader (see the module docstring)."""
        with self._lock:
            before = list(self._actors)
            gone = self._actors.pop()
        try:  # out of the list, it is killed whatever fails here (nothing else would)
            self._connect(wait=True)  # from here no peer sends it a decode
            self._move(before, self.actors)
            counts = ray.get(gone.retire.remote(self.timeout_s / 2), timeout=self.timeout_s)
            for key, value in counts.items():
                self._gone[key] = self._gone.get(key, 0) + int(value)
        finally:
            ray.kill(gone)

    @property
    def gone(self) -> dict[str, int]:
        """The store counts of the readers retired so far, summed."""
        return dict(self._gone)

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor)


class PoolSizer:
    """A driver thread that sizes a stream's pool (see the module docstring).

    Args:
        readers: The pool.
        coordinator: The stream's coordinator (the ranks' wait reports).
        settings: The sizing rules.
        name: The stream's name (for the log and the thread).
    """

    def __init__(self, readers: Readers, coordinator: Any, settings: Autoscale, name: str) -> None:
        self.readers, self._coordinator = readers, coordinator
        self.settings, self.name = settings, name
        self.history: list[PoolTick] = []
        """Every decision so far, oldest first."""
        self._started = self._last = time.monotonic()
        self._grew_at = float("-inf")
        self._settling = False
        self._flowing = False
        """The ranks have reported: rows flow (see :func:`ingest.core.sizing.due`)."""
        self.flowing_at_s: float | None = None
        """Seconds since the pool started when the ranks first reported (rows flowed)."""
        self._decision: Decision | None = None
        """The last decision since rows started flowing (when the next is due)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"ingest-sizer-{name}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._until_next()):
            try:
                self._step()
            except Exception as e:  # a reader or the coordinator was slow: next interval
                log.warning("reader pool of %s: no decision this interval: %r", self.name, e)
                self._last = time.monotonic()

    def _until_next(self) -> float:
        """Seconds until the next look: every ``POLL_S`` until rows flow, then on a fixed
        beat from the last figures taken (a slow decision does not push the next back)."""
        if not self._flowing:
            return POLL_S
        wait = period(self._decision, self.settings)
        return max(0.05, self._last + wait - time.monotonic())

    def _step(self) -> None:
        if not ray.is_initialized():  # shut down (the driver's exit): a call would start Ray
            self._stop.set()
            return
        if not self._flowing:
            timeout = self.readers.timeout_s
            _, span, _ = ray.get(self._coordinator.take_waits.remote(), timeout=timeout)
            if span > 0:  # the ranks' first report: its figures are the feeds' start-up
                self._flowing = True
                self.flowing_at_s = round(time.monotonic() - self._started, 3)
                self._measure()  # dropped: the first decision judges rows flowing only
            return
        if due(time.monotonic() - self._last, self._flowing, self._decision, self.settings):
            self._decision = self._tick()

    def _measure(self) -> tuple[Measure, float]:
        """The interval's figures, and rows per second."""
        timeout = self.readers.timeout_s
        waited, span, rows = ray.get(self._coordinator.take_waits.remote(), timeout=timeout)
        loads = ray.get([r.load.remote() for r in self.readers.actors], timeout=timeout)
        now = time.monotonic()
        dt, self._last = max(now - self._last, 1e-3), now
        load = sum(min(1.0, max(busy, cpu) / dt) for busy, cpu in loads)
        return Measure(waited, span, load), rows / dt

    def _tick(self) -> Decision:
        measure, rows_per_s = self._measure()
        at_s = round(time.monotonic() - self._started, 3)  # decided now; a resize takes longer
        size = len(self.readers.actors)
        pool = self.readers.pool
        since_grow = time.monotonic() - self._grew_at
        decision = decide(size, pool.min_size, pool.max_size, measure, self.settings, since_grow)
        if self._settling:  # the interval after a resize holds moved feeds' first reads
            self._settling = False
            decision = Decision(size, f"{measure.said(size)}; settling after a resize")
        elif decision.size > size and not self._grow():
            decision = Decision(size, f"{decision.reason}; no reader could start")
        elif decision.size < size:
            self.readers.remove()
        if decision.size != size:
            log.info(
                "reader pool of %s: %d -> %d readers: %s", self.name, size, decision.size,
                decision.reason,
            )  # fmt: skip
            self._measure()  # the next interval measures the new size only
            self._settling = True
        self.history.append(
            PoolTick(
                at_s,
                size,
                decision.size,
                measure.wait_share,
                measure.load,
                rows_per_s,
                decision.reason,
            )
        )
        return decision

    def _grow(self) -> bool:
        """Start a reader and join it to the pool; False if it did not start in time."""
        actor = self.readers.make()
        ping = actor.ping.remote()
        deadline = time.monotonic() + self.settings.start_timeout_s
        while not ray.wait([ping], timeout=1.0)[0]:
            if self._stop.is_set() or time.monotonic() > deadline:
                ray.kill(actor)
                log.warning(
                    "reader pool of %s: a new reader did not start within %.0f s (no free "
                    "CPU? see ReaderPool.num_cpus and the cluster's autoscaler)",
                    self.name,
                    self.settings.start_timeout_s,
                )
                return False
        try:
            ray.get(ping, timeout=self.readers.timeout_s)
        except Exception:  # it could not start: nothing holds it, the next decision may retry
            ray.kill(actor)
            raise
        self.readers.add(actor)
        self._grew_at = time.monotonic()
        return True

    def stop(self, wait: bool = True) -> None:
        """Stop deciding (a resize under way ends first, up to the readers' timeout, waited
        for unless ``wait`` is False)."""
        self._stop.set()
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.readers.timeout_s)


__all__ = ["PoolSizer", "PoolTick", "Readers"]
