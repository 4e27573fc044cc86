"""Index shards in Ray tasks on the ingest nodes, not in the coordinator's process.

:func:`ray_indexer` makes an :data:`~ingest.planner.index.Indexer` for
:class:`~ingest.planner.catalog.Catalog`: the shards the persistent index lacks are cut into groups
(by default sized by bytes, and enough of them to keep the cluster's CPUs busy: see
:func:`ray_indexer`), one Ray task reads each group (placed like the readers, by
``resources`` and ``label_selector``), at most ``max_tasks_in_flight`` run at once, and the
results come back in shard order as their tasks finish, so the catalog stores each one at
once. A task that fails raises the :class:`~ingest.core.errors.ShardError` of the shard it could
not read; a task that does not finish within ``timeout_s`` raises
:class:`~ingest.core.errors.StreamTimeoutError`, never a hang.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray

from ingest.core.errors import ConfigError, StreamTimeoutError, redact
from ingest.core.sizing import shortfall, task_cpus
from ingest.distributed.unwrap import unwrap
from ingest.formats.base import ReadContext, Seek, ShardInfo
from ingest.planner.index import index_shard


@dataclass(frozen=True, slots=True)
class _Indexed:
    """What a task sends back per shard: the index and the I/O it took."""

    rows: int | None
    blocks: tuple[int, ...] | None
    seeks: tuple[Seek, ...]
    io: dict[str, int]


@ray.remote
def _index_group(contexts: list[ReadContext]) -> tuple[str, list[_Indexed]]:
    """Index ``contexts`` one after the other; returns (node id, results)."""
    out = []
    for ctx in contexts:
        before = ctx.source.stats.as_dict()
        info = index_shard(ctx)
        after = ctx.source.stats.as_dict()
        io = {name: after[name] - before[name] for name in after}
        out.append(_Indexed(info.rows, info.blocks, info.seeks, io))
    return ray.get_runtime_context().get_node_id(), out


class RayIndexer:
    """An :data:`~ingest.planner.index.Indexer` whose reads run in Ray tasks.

    Use :func:`ray_indexer`.

    Attributes:
        tasks: Tasks that finished, over every call.
        nodes: Ids of the Ray nodes those tasks ran on.
    """

    def __init__(
        self,
        *,
        resources: dict[str, float] | None,
        label_selector: dict[str, str] | None,
        num_cpus: float | None,
        shards_per_task: int | None,
        bytes_per_task: int,
        timeout_s: float,
        max_tasks_in_flight: int,
        beside: dict[str, float] | None = None,
    ) -> None:
        if num_cpus is not None and not num_cpus > 0:
            raise ConfigError(f"ray_indexer num_cpus={num_cpus} must be > 0, or None")
        if shards_per_task is not None and shards_per_task < 1:
            raise ConfigError(f"ray_indexer shards_per_task={shards_per_task} must be >= 1")
        if bytes_per_task < 1:
            raise ConfigError(f"ray_indexer bytes_per_task={bytes_per_task} must be >= 1")
        if timeout_s <= 0:
            raise ConfigError(f"ray_indexer timeout_s={timeout_s} must be > 0")
        if max_tasks_in_flight < 1:
            raise ConfigError(f"ray_indexer max_tasks_in_flight={max_tasks_in_flight} must be >= 1")
        self.resources = dict(resources or {})
        self.label_selector = dict(label_selector or {})
        self.num_cpus = num_cpus
        self.shards_per_task = shards_per_task
        self.bytes_per_task = bytes_per_task
        self.timeout_s = timeout_s
        self.max_tasks_in_flight = max_tasks_in_flight
        self.beside = dict(beside or {})
        self.tasks = 0
        self.nodes: set[str] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"ray_indexer(resources={self.resources}, label_selector={self.label_selector}, "
            f"num_cpus={self.num_cpus}, shards_per_task={self.shards_per_task})"
        )

    def _cpus(self) -> float:
        if self.num_cpus is not None:
            return self.num_cpus
        return task_cpus(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]

    def _check_fits(self, cpus: float) -> None:
        """Refuse tasks that cannot run beside what ``beside`` holds (the stream's reader
        pool, which keeps its reservation while the tasks run): they would wait for ever."""
        if not self.beside:
            return
        asks = {"CPU": cpus, **self.resources}
        both = {k: asks.get(k, 0.0) + self.beside.get(k, 0.0) for k in {*asks, *self.beside}}
        short = shortfall(
            both,
            1,
            ray.cluster_resources(),  # type: ignore[no-untyped-call]
            ray.available_resources(),  # type: ignore[no-untyped-call]
        )
        if short is not None:
            raise ConfigError(
                f"an index task ({asks}) cannot run beside the reader pool ({self.beside}): "
                f"{short}; lower ReaderPool(num_cpus=...) (None sizes it from the cluster) or "
                "give Ray more CPUs (ray.init(num_cpus=N))"
            )

    def _options(self, cpus: float) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": cpus}
        if self.resources:
            options["resources"] = self.resources
        if self.label_selector:
            options["label_selector"] = self.label_selector
        return options

    def __call__(self, contexts: Sequence[ReadContext]) -> Iterator[ShardInfo]:
        """Index ``contexts`` in Ray tasks; yields their :class:`ShardInfo`, in order.

        Raises:
            ShardError: The error of a shard a task could not read.
            StreamTimeoutError: If a task does not finish within ``timeout_s``.
        """
        cpus = self._cpus()
        self._check_fits(cpus)
        task = _index_group.options(**self._options(cpus))
        step = self.shards_per_task or self._group_size(contexts)
        groups = [list(contexts[i : i + step]) for i in range(0, len(contexts), step)]
        upcoming = iter(groups)
        running: deque[tuple[list[ReadContext], Any]] = deque()

        def submit() -> None:
            group = next(upcoming, None)
            if group is not None:
                running.append((group, task.remote(group)))

        try:
            for _ in range(self.max_tasks_in_flight):
                submit()
            while running:
                group, ref = running[0]
                node, results = self._get(group, ref)
                running.popleft()
                submit()
                with self._lock:
                    self.tasks += 1
                    self.nodes.add(node)
                for ctx, got in zip(group, results, strict=True):
                    ctx.source.stats.add(**got.io)
                    yield replace(ctx.info, rows=got.rows, blocks=got.blocks, seeks=got.seeks)
        finally:
            # The tasks still running are left to finish (at most max_tasks_in_flight groups)
            # and their results dropped, never ray.cancel()ed: a cancel racing the task's end
            # aborts the calling process in Ray 2.60 ("Check failed: it !=
            # submissible_tasks_.end() Tried to complete task that was not pending",
            # ray-project/ray#54846). It killed the test run's driver, without a word, when a
            # bad shard failed one group while another finished.
            running.clear()

    def _group_size(self, contexts: Sequence[ReadContext]) -> int:
        """Shards per task: groups of about ``bytes_per_task`` bytes, and at least two tasks
        per CPU of the cluster while there are shards for them.

        A task costs a scheduling round and a store client in a worker (tens of ms), a small
        shard a request (about 5 ms on loopback S3): four shards a task made indexing 1,000
        small JSONL shards take 74 s, 125 a task 22 s.
        """
        total = sum(ctx.shard.size for ctx in contexts)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]
        groups = max(-(-total // self.bytes_per_task), min(len(contexts), 2 * cpus), 1)
        return max(1, -(-len(contexts) // groups))

    def _get(self, group: list[ReadContext], ref: Any) -> tuple[str, list[_Indexed]]:
        try:
            node, results = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise StreamTimeoutError(
                f"indexing {len(group)} shard(s) from {redact(group[0].shard.url)} in a Ray "
                f"task did not finish within {self.timeout_s:.0f} s; check that nodes with "
                f"resources {self.resources or '{}'} and labels {self.label_selector or '{}'} "
                f"have free CPUs (`ray status`), or raise timeout_s"
            ) from None
        except Exception as e:
            raise unwrap(e) from None
        return str(node), list(results)


def ray_indexer(
    *,
    resources: dict[str, float] | None = None,
    label_selector: dict[str, str] | None = None,
    num_cpus: float | None = None,
    shards_per_task: int | None = None,
    bytes_per_task: int = 256 << 20,
    timeout_s: float = 600.0,
    max_tasks_in_flight: int = 64,
    beside: dict[str, float] | None = None,
) -> RayIndexer:
    """An :data:`~ingest.planner.index.Indexer` that reads shards in Ray tasks, for ``Catalog``.

    Call it where Ray is initialised (the driver or the coordinator actor).

    Args:
        resources: Custom resources every task asks for (``{"ingest": 0.001}`` keeps them on
            the ingest nodes, like the readers).
        label_selector: Node labels every task must match.
        num_cpus: CPUs per task. None: one, or an eighth of a cluster of fewer than 8 CPUs
            (:func:`ingest.core.sizing.task_cpus`: 0.25 on a 2-CPU ``ray.init``). Indexing
            is mostly reads; a whole CPU per task left none for the tasks beside a reader
            pool on a 2-CPU laptop (issue 31: ``RayStream`` waited 600 s).
        shards_per_task: Shards one task indexes, one after the other: more amortise the task
            start-up, fewer spread a small dataset over more nodes. None: groups of about
            ``bytes_per_task`` bytes, but at least two tasks per CPU of the cluster.
        bytes_per_task: Bytes one task reads, with ``shards_per_task=None``.
        timeout_s: Longest wait for one task, the next in line.
        max_tasks_in_flight: Tasks submitted at once; more wait in this process.
        beside: Resources held for as long as the tasks run (a ``RayStream``'s reader
            pool, all readers together): tasks that cannot run beside them on the cluster
            are refused at once with a :class:`~ingest.core.errors.ConfigError` rather than
            left waiting ``timeout_s``.

    Returns:
        The indexer; its ``tasks`` and ``nodes`` tell where it ran.

    Raises:
        ConfigError: If a number is out of range.
    """
    return RayIndexer(
        resources=resources,
        label_selector=label_selector,
        num_cpus=num_cpus,
        shards_per_task=shards_per_task,
        bytes_per_task=bytes_per_task,
        timeout_s=timeout_s,
        max_tasks_in_flight=max_tasks_in_flight,
        beside=beside,
    )


__all__ = ["RayIndexer", "ray_indexer"]
