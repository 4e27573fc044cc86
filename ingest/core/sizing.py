"""How a reader pool sizes itself: a pure decision over what the ranks and readers measured.

Every ``Autoscale.interval_s`` the pool's sizer (:mod:`ingest.distributed.sizer`) gathers
two figures over the interval and asks :func:`decide` for the pool's next size:

- **the ranks' wait share**: the share of their time the ranks spent waiting for a batch
  (summed over the ranks that reported: the same figure as the ``ingest_data_wait_share``
  metric);
- **the readers' load**: for each reader, the share of the interval it was busy (its
  decode calls' wall time, or its process's CPU time, whichever is more, at most 1),
  summed over the readers: how many readers' worth of work the pool did.

The rules, one step at a time:

- **Grow** by one reader while the ranks wait more than ``target_wait`` of their time and
  the readers are busy (load at least ``busy_load`` per reader). Ranks that wait on idle
  readers wait on something more readers would not fix (the store, the network, the
  coordinator), so the pool does not grow for them.
- **Shrink** by one reader when the ranks wait under half of ``target_wait`` and one reader
  fewer would each be busy at most ``idle_load`` of the time; or, whatever the ranks wait,
  when one reader fewer would each be busy at most half of ``idle_load`` (readers that idle
  are not what the ranks wait on: on a loaded machine the ranks wait on everything, their
  own CPU and the calls that bring the batches, 6-24% of their time in a CI run whatever the
  pool's size, and a pool of six readers 4% busy held its size while they waited 3-8%);
  never within
  ``shrink_after_s`` of the last growth (the waits a growth removed are not yet a sign that
  the pool is too large).
- **Hold** otherwise, and when no rank reported in the interval (nothing is training: no
  figure to judge by).

When: the first decision comes ``Autoscale.first_interval_s`` after the ranks' first report
(rows flowing), not a whole ``interval_s`` after the pool started, and the figures of that
first report (each rank's wait for its feed's first batch, which no reader added removes)
are left out; so does the next after a decision that held a pool below ``max_size`` whose
readers were busy (the ranks live on the batches made ahead, and wait once those are
taken); later decisions come every ``interval_s``, on a fixed beat (a slow decision does
not push the next one back). :func:`due` is that rule.

What the pool reserves: :func:`reader_cpus` and :func:`task_cpus` give the CPUs a reader
actor and an index task ask Ray for when the user names none, from the cluster's CPUs, and
:func:`shortfall` says which resource a request cannot get from a cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ingest.core.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Autoscale:
    """How a :class:`ingest.ReaderPool` sizes itself between ``min_size`` and ``max_size``.

    Attributes:
        target_wait: The share of their time the ranks may wait for data; the pool grows
            while they wait more.
        interval_s: How often the pool measures and decides (one step per decision).
        busy_load: The pool grows only while its readers are busy at least this share of the
            time, on average.
        idle_load: The pool shrinks when one reader fewer would each be busy at most this
            share of the time while the ranks wait under half of ``target_wait``, or at
            most half of it whatever they wait.
        shrink_after_s: No shrinking within this long after the pool grew.
        start_timeout_s: Longest wait for a new reader to start (for example while the Ray
            autoscaler adds a node for it); past it, the reader is given up and the pool
            may try again at its next decision.
        first_interval_s: The first decision comes this long after the ranks' first
            report (at most ``interval_s``): a pool too small from the start grows within
            seconds of rows flowing, not after whole intervals of start-up.
    """

    target_wait: float = 0.05
    interval_s: float = 5.0
    busy_load: float = 0.5
    idle_load: float = 0.5
    shrink_after_s: float = 60.0
    start_timeout_s: float = 600.0
    first_interval_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.target_wait < 1:
            raise ConfigError(f"Autoscale target_wait={self.target_wait} must be in (0, 1)")
        if self.interval_s <= 0:
            raise ConfigError(f"Autoscale interval_s={self.interval_s} must be > 0")
        for name in ("busy_load", "idle_load"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ConfigError(f"Autoscale {name}={value} must be in [0, 1]")
        if not self.first_interval_s > 0:
            raise ConfigError(f"Autoscale first_interval_s={self.first_interval_s} must be > 0")
        if self.shrink_after_s < 0 or self.start_timeout_s <= 0:
            raise ConfigError(
                f"Autoscale shrink_after_s={self.shrink_after_s} must be >= 0 and "
                f"start_timeout_s={self.start_timeout_s} > 0"
            )


@dataclass(frozen=True, slots=True)
class Measure:
    """What one interval measured.

    Attributes:
        waited_s: Seconds the reporting ranks waited for batches, summed.
        span_s: Seconds those ranks' reports covered, summed (waiting and training).
        load: Readers' worth of work done: each reader's busy share, summed.
    """

    waited_s: float
    span_s: float
    load: float

    @property
    def wait_share(self) -> float:
        """The ranks' wait share (0 when no rank reported)."""
        return min(1.0, self.waited_s / self.span_s) if self.span_s > 0 else 0.0

    def said(self, size: int) -> str:
        """The figures in words, for a pool of ``size`` readers."""
        return (
            f"ranks waited {self.wait_share:.1%} of their time, readers {self.load / size:.0%} busy"
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """The pool's next size, and why (for the log).

    Attributes:
        size: Readers after the decision.
        reason: Why, in words.
        soon: Decide again after ``Autoscale.first_interval_s``, not ``interval_s``: the
            pool held below ``max_size`` with its readers busy, so the ranks' wait may rise
            as soon as the batches made ahead are taken (see :func:`due`).
    """

    size: int
    reason: str
    soon: bool = False


def decide(
    size: int,
    low: int,
    high: int,
    measure: Measure,
    settings: Autoscale,
    since_grow_s: float,
) -> Decision:
    """The pool's next size after an interval that measured ``measure``.

    Args:
        size: Readers now.
        low: ``ReaderPool.min_size``.
        high: ``ReaderPool.max_size``.
        measure: The interval's figures.
        settings: The rules' thresholds.
        since_grow_s: Seconds since the pool last grew (infinite if it never did).
    """
    said = measure.said(size)
    wait, load = measure.wait_share, measure.load
    if measure.span_s <= 0:
        return Decision(size, "no rank reported: nothing to judge by")
    nearly_idle = load <= settings.idle_load * (size - 1) / 2
    if wait > settings.target_wait and not (nearly_idle and size > low):
        if size >= high:
            said += f"; at max_size {high}"
        elif load < settings.busy_load * size:
            said += ": the ranks wait on something else than the readers"
        else:
            return Decision(size + 1, f"{said} (target {settings.target_wait:.0%})")
    elif size > low and (wait < settings.target_wait / 2 or nearly_idle):
        if since_grow_s < settings.shrink_after_s:
            said += f"; grew {since_grow_s:.0f} s ago"
        elif load <= settings.idle_load * (size - 1):
            fewer = f"{size - 1} reader" + ("s suffice" if size > 2 else " suffices")
            return Decision(size - 1, f"{said}: {fewer}")
    return Decision(size, said, soon=size < high and load >= settings.busy_load * size)


def due(held_s: float, flowing: bool, last: Decision | None, settings: Autoscale) -> bool:
    """Whether the figures gathered over the last ``held_s`` seconds are enough to decide.

    Args:
        held_s: Seconds since the figures were last taken (a decision, the end of a
            resize, or the ranks' first report, whose figures are dropped).
        flowing: Whether the ranks have reported since the pool started (rows flow).
        last: The last decision since rows started flowing, or None.
        settings: The intervals (:func:`period`).
    """
    return flowing and held_s >= period(last, settings)


def period(last: Decision | None, settings: Autoscale) -> float:
    """Seconds from ``last``'s figures to the next decision: ``first_interval_s`` (at most
    ``interval_s``) before the first decision and after one that held a busy pool below
    ``max_size`` (:attr:`Decision.soon`); ``interval_s`` after any other."""
    if last is None or last.soon:
        return min(settings.first_interval_s, settings.interval_s)
    return settings.interval_s


def reader_cpus(cluster_cpus: float, max_size: int) -> float:
    """CPUs a reader actor reserves when ``ReaderPool(num_cpus=None)``: one, or less on a
    small cluster, so that the pool at ``max_size`` reserves at most a quarter of the
    cluster's CPUs (a 2-CPU laptop: 0.125 per reader for ``max_size=4``; a cluster of
    16 CPUs and more: 1).

    A reservation is Ray's scheduling token, not a limit: a reader uses what it needs. A
    pool that reserved whole CPUs held every CPU of a 2-CPU ``ray.init`` and left none for
    the index tasks and the trainers (issue 31: the README's blocks hung). On a cluster
    the readers run on CPU nodes of their own (``ReaderPool(resources=...)``), and one CPU
    each is what makes an autoscaler add a node as the pool grows.
    """
    if cluster_cpus <= 0 or max_size < 1:
        return 0.0
    return max(0.01, min(1.0, math.floor(1000 * cluster_cpus / (4 * max_size)) / 1000))


def task_cpus(cluster_cpus: float) -> float:
    """CPUs an index task reserves when ``ray_indexer(num_cpus=None)``: one, or an eighth
    of a cluster of fewer than 8 CPUs (a 2-CPU laptop: 0.25, so that tasks run beside a
    pool that reserved its share)."""
    if cluster_cpus <= 0:
        return 0.0
    return max(0.01, min(1.0, math.floor(1000 * cluster_cpus / 8) / 1000))


def shortfall(
    asked: dict[str, float], count: int, total: dict[str, float], free: dict[str, float]
) -> str | None:
    """Why ``count`` Ray workers asking ``asked`` each cannot all run, in words, or None.

    Args:
        asked: Resources each asks (``{"CPU": 0.25, "ingest": 0.001}``).
        count: How many ask.
        total: The cluster's resources (``ray.cluster_resources()``).
        free: Those not reserved now (``ray.available_resources()``).

    Returns:
        For the first resource the cluster does not hold ``count`` times over: what was
        asked, what the cluster has and what is free; None if every one fits the totals.
    """
    for name, each in sorted(asked.items()):
        need = each * count
        if each > 0 and need > total.get(name, 0.0) + 1e-9:
            return (
                f"{count} x {each:g} {name} asked ({need:g} in all), the cluster has "
                f"{total.get(name, 0.0):g} {name} ({free.get(name, 0.0):g} free)"
            )
    return None


__all__ = [
    "Autoscale",
    "Decision",
    "Measure",
    "decide",
    "due",
    "period",
    "reader_cpus",
    "shortfall",
    "task_cpus",
]
