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
  fewer would each be busy at most ``idle_load`` of the time; never within
  ``shrink_after_s`` of the last growth (the waits a growth removed are not yet a sign that
  the pool is too large).
- **Hold** otherwise, and when no rank reported in the interval (nothing is training: no
  figure to judge by).
"""

from __future__ import annotations

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
            share of the time.
        shrink_after_s: No shrinking within this long after the pool grew.
        start_timeout_s: Longest wait for a new reader to start (for example while the Ray
            autoscaler adds a node for it); past it, the reader is given up and the pool
            may try again at its next decision.
    """

    target_wait: float = 0.05
    interval_s: float = 5.0
    busy_load: float = 0.5
    idle_load: float = 0.5
    shrink_after_s: float = 60.0
    start_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.target_wait < 1:
            raise ConfigError(f"Autoscale target_wait={self.target_wait} must be in (0, 1)")
        if self.interval_s <= 0:
            raise ConfigError(f"Autoscale interval_s={self.interval_s} must be > 0")
        for name in ("busy_load", "idle_load"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ConfigError(f"Autoscale {name}={value} must be in [0, 1]")
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
    """The pool's next size, and why (for the log)."""

    size: int
    reason: str


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
    if wait > settings.target_wait:
        if size >= high:
            said += f"; at max_size {high}"
        elif load < settings.busy_load * size:
            said += ": the ranks wait on something else than the readers"
        else:
            return Decision(size + 1, f"{said} (target {settings.target_wait:.0%})")
    elif wait < settings.target_wait / 2 and size > low:
        if since_grow_s < settings.shrink_after_s:
            said += f"; grew {since_grow_s:.0f} s ago"
        elif load <= settings.idle_load * (size - 1):
            fewer = f"{size - 1} reader" + ("s suffice" if size > 2 else " suffices")
            return Decision(size - 1, f"{said}: {fewer}")
    return Decision(size, said)


__all__ = ["Autoscale", "Decision", "Measure", "decide"]
