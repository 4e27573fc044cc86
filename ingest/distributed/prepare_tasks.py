"""Derive units in Ray tasks on the ingest nodes (``ingest prepare --ray``).

:func:`ray_deriver` makes a :data:`~ingest.engine.derived.units.Deriver`: the shards are cut
into groups (of about ``bytes_per_task`` bytes, and at least two per CPU of the cluster while
there are shards for them), one Ray task derives each group (placed like the index tasks and
the readers, by ``resources`` and ``label_selector``), at most ``max_tasks_in_flight`` run at
once, and the outcomes come back as tasks finish. Each task builds the chain once and checks
its fingerprint against the keys'. A task that does not finish within ``timeout_s`` of the
last one raises :class:`~ingest.core.errors.StreamTimeoutError`, never a hang.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import ray

from ingest.core.errors import ConfigError, StreamTimeoutError, redact
from ingest.distributed.unwrap import unwrap
from ingest.engine.derived.store import DerivedStore
from ingest.engine.derived.units import Derivation, ShardJob, UnitDone, derive_shard


@ray.remote
def _derive_group(derivation: Derivation, jobs: list[ShardJob]) -> list[list[UnitDone]]:
    """Derive ``jobs`` one after the other with the chain built here once."""
    fn = derivation.build()
    store = DerivedStore(derivation.config)
    return [derive_shard(job, fn, store) for job in jobs]


class RayDeriver:
    """A :data:`~ingest.engine.derived.units.Deriver` whose units run in Ray tasks.

    Use :func:`ray_deriver`.

    Attributes:
        tasks: Tasks that finished, over every call.
    """

    def __init__(
        self,
        *,
        resources: dict[str, float] | None,
        label_selector: dict[str, str] | None,
        num_cpus: float,
        bytes_per_task: int,
        timeout_s: float,
        max_tasks_in_flight: int,
    ) -> None:
        if not num_cpus > 0:
            raise ConfigError(f"ray_deriver num_cpus={num_cpus} must be > 0")
        if bytes_per_task < 1:
            raise ConfigError(f"ray_deriver bytes_per_task={bytes_per_task} must be >= 1")
        if not timeout_s > 0:
            raise ConfigError(f"ray_deriver timeout_s={timeout_s} must be > 0")
        if max_tasks_in_flight < 1:
            raise ConfigError(f"ray_deriver max_tasks_in_flight={max_tasks_in_flight} must be >= 1")
        self.resources = dict(resources or {})
        self.label_selector = dict(label_selector or {})
        self.num_cpus = num_cpus
        self.bytes_per_task = bytes_per_task
        self.timeout_s = timeout_s
        self.max_tasks_in_flight = max_tasks_in_flight
        self.tasks = 0

    def __repr__(self) -> str:
        return (
            f"ray_deriver(resources={self.resources}, label_selector={self.label_selector}, "
            f"num_cpus={self.num_cpus}, max_tasks_in_flight={self.max_tasks_in_flight})"
        )

    def __call__(
        self, derivation: Derivation, jobs: Sequence[ShardJob]
    ) -> Iterator[list[UnitDone]]:
        """Derive ``jobs`` in Ray tasks; yields each job's outcomes as its task finishes.

        Raises:
            ConfigError: If a node's directory is the store (each node would fill its own),
                or a task built a chain with another fingerprint.
            DerivedStoreError: If a task could not read or write the store.
            StreamTimeoutError: If no task finishes within ``timeout_s``.
        """
        if derivation.config.local is not None:
            raise ConfigError(
                "ray_deriver with DerivedConfig(local=...): each task would fill the directory "
                "of the node it ran on, not the nodes that read; give a URL every node reads "
                "(DerivedConfig(url=...)), or prepare on each node without Ray"
            )
        options: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.resources:
            options["resources"] = self.resources
        if self.label_selector:
            options["label_selector"] = self.label_selector
        task = _derive_group.options(**options)
        cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
        upcoming = iter(groups([j.ctx.shard.size for j in jobs], self.bytes_per_task, 2 * cpus))
        running: dict[Any, list[ShardJob]] = {}
        shipped = ray.put(derivation)  # once, not with every task

        def submit() -> None:
            picked = next(upcoming, None)
            if picked is not None:
                group = [jobs[i] for i in picked]
                running[task.remote(shipped, group)] = group

        try:
            for _ in range(self.max_tasks_in_flight):
                submit()
            while running:
                ready, _ = ray.wait(list(running), num_returns=1, timeout=self.timeout_s)
                if not ready:
                    raise self._late(next(iter(running.values())))
                running.pop(ready[0])
                try:
                    results = ray.get(ready[0], timeout=self.timeout_s)
                except Exception as e:
                    raise unwrap(e) from None
                self.tasks += 1
                submit()
                yield from results
        finally:
            # Tasks still running finish on their own, their results dropped: never
            # ray.cancel()ed (a cancel racing a task's end aborts the driver in Ray 2.60,
            # ray-project/ray#54846; see ingest.distributed.index_tasks).
            running.clear()

    def _late(self, group: list[ShardJob]) -> StreamTimeoutError:
        return StreamTimeoutError(
            f"deriving {len(group)} shard(s) from {redact(group[0].ctx.shard.url)} in Ray "
            f"tasks: none finished within {self.timeout_s:.0f} s; check that nodes with "
            f"resources {self.resources or '{}'} and labels {self.label_selector or '{}'} have "
            f"{self.num_cpus} free CPU(s) (`ray status`), or raise timeout_s"
        )


def groups(sizes: Sequence[int], bytes_per_task: int, at_least: int) -> list[list[int]]:
    """Indices of ``sizes`` in consecutive groups of about ``bytes_per_task`` bytes, and at
    least ``at_least`` groups while there are items for them (one item a group at most)."""
    if not sizes:
        return []
    count = max(-(-sum(sizes) // bytes_per_task), min(len(sizes), at_least), 1)
    step = max(1, -(-len(sizes) // count))
    return [list(range(i, min(i + step, len(sizes)))) for i in range(0, len(sizes), step)]


def ray_deriver(
    *,
    resources: dict[str, float] | None = None,
    label_selector: dict[str, str] | None = None,
    num_cpus: float = 1.0,
    bytes_per_task: int = 256 << 20,
    timeout_s: float = 600.0,
    max_tasks_in_flight: int = 16,
) -> RayDeriver:
    """A :data:`~ingest.engine.derived.units.Deriver` that derives units in Ray tasks, for
    :func:`ingest.engine.derived.prepare.prepare`. Call it where Ray is initialised.

    Args:
        resources: Custom resources every task asks for (``{"ingest": 0.001}`` keeps them on
            the ingest nodes, like the readers).
        label_selector: Node labels every task must match.
        num_cpus: CPUs per task: a stage chain (a tokenizer) is CPU work, one a task.
        bytes_per_task: Bytes of shards one task derives, about.
        timeout_s: Longest wait for the next task to finish.
        max_tasks_in_flight: Tasks submitted at once (each holds one unit's rows at a time);
            more wait in this process.

    Returns:
        The deriver; its ``tasks`` counts the tasks that finished.

    Raises:
        ConfigError: If a number is out of range.
    """
    return RayDeriver(
        resources=resources,
        label_selector=label_selector,
        num_cpus=num_cpus,
        bytes_per_task=bytes_per_task,
        timeout_s=timeout_s,
        max_tasks_in_flight=max_tasks_in_flight,
    )


__all__ = ["RayDeriver", "groups", "ray_deriver"]
