"""What a running job's data side is doing, exported with ``ray.util.metrics``.

They appear in the Ray dashboard's metrics view and on every node's Prometheus endpoint
(Prometheus adds the ``ray_`` prefix). Every metric carries ``stream`` (the coordinator's
name, ``RayStream(name=...)``); per-rank ones also carry ``rank``.

=============================== ======= =======================================================
name                            kind    what
=============================== ======= =======================================================
``ingest_rows_total``           counter rows delivered to the rank (rows/s: its rate)
``ingest_batches_total``        counter batches delivered to the rank
``ingest_data_wait_share``      gauge   share of the rank's time spent waiting for its next
                                        batch, over the last report interval (0: the data side
                                        keeps up; near 1: training waits for data)
``ingest_queue_depth``          gauge   ready batches a reader holds for the rank
``ingest_bytes_read_total``     counter bytes read from the store by the readers (bytes/s)
``ingest_requests_total``       counter listings, opens and reads sent to the store
``ingest_retries_total``        counter requests sent again after a transient fault
``ingest_cache_hits_total``     counter shard opens served by the node's shard cache
``ingest_cache_misses_total``   counter shard opens that fetched into the shard cache
``ingest_derived_hits_total``   counter units read from their derived copies (``derived=``)
``ingest_derived_misses_total`` counter units with no derived copy (their stages ran)
``ingest_rows_skipped_on_request`` gauge rows the stream's epoch leaves out on request
                                        (``ingest.skip``), set as a state is loaded
``ingest_pool_size``            gauge   reader actors in the stream's pool (reported by the
                                        first of them)
``ingest_pool_resizes_total``   counter the pool's resizes (``direction``: ``grow`` or
                                        ``shrink``; :mod:`ingest.core.sizing`)
=============================== ======= =======================================================

``cluster/grafana/ingest.json`` is a Grafana dashboard over them (every panel's query names
metrics of this table: ``tests/test_dashboard.py``).

Reports are made at most every :data:`REPORT_EVERY_S` per process, so the cost per batch is
a clock read. Outside Ray (a ``Stream`` in a notebook) nothing is exported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

REPORT_EVERY_S = 1.0

_lock = threading.Lock()
_made: dict[str, Any] = {}

_KINDS = {
    "ingest_rows_total": ("counter", "rows delivered to the rank", ("stream", "rank")),
    "ingest_batches_total": ("counter", "batches delivered to the rank", ("stream", "rank")),
    "ingest_data_wait_share": (
        "gauge",
        "share of the rank's time spent waiting for its next batch",
        ("stream", "rank"),
    ),
    "ingest_queue_depth": (
        "gauge",
        "ready batches a reader holds for the rank",
        ("stream", "rank"),
    ),
    "ingest_bytes_read_total": ("counter", "bytes read from the store", ("stream",)),
    "ingest_requests_total": ("counter", "listings, opens and reads sent", ("stream",)),
    "ingest_retries_total": ("counter", "requests sent again after a fault", ("stream",)),
    "ingest_cache_hits_total": ("counter", "opens served by the shard cache", ("stream",)),
    "ingest_cache_misses_total": ("counter", "opens that fetched into the cache", ("stream",)),
    "ingest_derived_hits_total": ("counter", "units read from derived copies", ("stream",)),
    "ingest_derived_misses_total": ("counter", "units with no derived copy", ("stream",)),
    "ingest_rows_skipped_on_request": (
        "gauge",
        "rows the epoch leaves out on request (ingest.skip)",
        ("stream",),
    ),
    "ingest_pool_size": ("gauge", "reader actors in the stream's pool", ("stream",)),
    "ingest_pool_resizes_total": (
        "counter",
        "the reader pool's resizes",
        ("stream", "direction"),
    ),
}
NAMES = tuple(_KINDS)
KINDS = {name: kind for name, (kind, _, _) in _KINDS.items()}
"""``name -> "counter" or "gauge"``."""


def _metric(name: str) -> Any:
    with _lock:
        got = _made.get(name)
        if got is None:
            from ray.util import metrics

            kind, description, tags = _KINDS[name]
            cls = metrics.Counter if kind == "counter" else metrics.Gauge
            got = _made[name] = cls(name, description=description, tag_keys=tags)
        return got


def _exporting() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


class RankMeter:
    """The per-rank metrics, fed by the rank iterator as it hands out batches."""

    def __init__(
        self,
        stream: str,
        rank: int,
        on_report: Callable[[float, float, int], None] | None = None,
    ) -> None:
        self.tags = {"stream": stream, "rank": str(rank)}
        self._on_report = on_report
        """Also given each report's seconds waited, seconds spanned and rows (the reader
        pool sizes itself on them: :mod:`ingest.distributed.sizer`)."""
        self._rows = 0
        self._batches = 0
        self._waited = 0.0
        self._since = time.monotonic()

    def batch(self, rows: int, waited_s: float) -> None:
        """A batch handed out, after ``waited_s`` seconds of waiting for it."""
        self._rows += rows
        self._batches += 1
        self._waited += waited_s
        now = time.monotonic()
        if now - self._since >= REPORT_EVERY_S:
            self.report(now)

    def report(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        span = now - self._since
        if _exporting() and (self._batches or span > 0):
            # Ray's Counter.inc refuses 0: an epoch with no batch (a followed dataset's empty
            # round), or only empty ones (quarantined), raised in the rank's loop.
            if self._rows:
                _metric("ingest_rows_total").inc(self._rows, tags=self.tags)
            if self._batches:
                _metric("ingest_batches_total").inc(self._batches, tags=self.tags)
            share = min(1.0, self._waited / span) if span > 0 else 0.0
            _metric("ingest_data_wait_share").set(share, tags=self.tags)
        if self._on_report is not None and span > 0:
            self._on_report(self._waited, span, self._rows)
        self._rows, self._batches, self._waited, self._since = 0, 0, 0.0, now


class StoreMeter:
    """A reader's store counts, exported as the growth of :class:`ingest.IOStats`."""

    _FROM: ClassVar[dict[str, tuple[str, ...]]] = {
        "ingest_bytes_read_total": ("bytes_read",),
        "ingest_requests_total": ("listings", "opens", "reads"),
        "ingest_retries_total": ("retries",),
        "ingest_cache_hits_total": ("cache_hits",),
        "ingest_cache_misses_total": ("cache_misses",),
        "ingest_derived_hits_total": ("derived_hits",),
        "ingest_derived_misses_total": ("derived_misses",),
    }

    def __init__(self, stream: str) -> None:
        self.tags = {"stream": stream}
        self._last: dict[str, int] = {}
        self._since = 0.0

    def due(self) -> bool:
        """Whether a report is due (every :data:`REPORT_EVERY_S`, under Ray): the caller
        gathers the counts only then, not on every call of its hot path."""
        return time.monotonic() - self._since >= REPORT_EVERY_S and _exporting()

    def report(
        self, stats: Mapping[str, int], depths: Mapping[int, int], pool: int | None = None
    ) -> None:
        """Export what grew since the last report, the ready batches held per rank, and the
        pool's size (``pool``: given by one reader of the pool only, so that a sum over the
        readers is the size)."""
        self._since = time.monotonic()
        if pool is not None:
            _metric("ingest_pool_size").set(pool, tags=self.tags)
        for name, keys in self._FROM.items():
            total = sum(int(stats.get(k, 0)) for k in keys)
            grew = total - self._last.get(name, 0)
            self._last[name] = total
            if grew > 0:
                _metric(name).inc(grew, tags=self.tags)
        for rank, depth in depths.items():
            _metric("ingest_queue_depth").set(depth, tags={**self.tags, "rank": str(rank)})

    def moved(self, rank: int) -> None:
        """``rank``'s feed left this reader: its queue depth here is 0 (a gauge left at its
        last value would count the rank's batches twice in a sum over the readers)."""
        if _exporting():
            _metric("ingest_queue_depth").set(0, tags={**self.tags, "rank": str(rank)})

    def resized(self, size: int, grew: bool) -> None:
        """The pool is now ``size`` readers, one more (``grew``) or one fewer."""
        if _exporting():
            _metric("ingest_pool_size").set(size, tags=self.tags)
            direction = "grow" if grew else "shrink"
            _metric("ingest_pool_resizes_total").inc(1, tags={**self.tags, "direction": direction})


def skipped_on_request(stream: str, rows: int) -> None:
    """The stream's epoch leaves ``rows`` out on request (a loaded state's skips)."""
    if _exporting():
        _metric("ingest_rows_skipped_on_request").set(rows, tags={"stream": stream})


__all__ = ["KINDS", "NAMES", "REPORT_EVERY_S", "RankMeter", "StoreMeter", "skipped_on_request"]
