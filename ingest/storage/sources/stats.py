"""What a source asked of its stores and of the node's shard cache: :class:`IOStats`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class IOStats:
    """Counts of what a stream asked of its stores, and of its node-local cache. Thread-safe.

    ``retries`` counts attempts made again after a transient fault (:class:`RetryPolicy`).
    ``cache_*`` count shard opens served from the node's shard cache (``cache_hits``, the
    bytes they held in ``cache_hit_bytes``), opens that fetched the shard into it
    (``cache_misses``, ``cache_fetched_bytes``), copies evicted to make room
    (``cache_evicted_bytes``) and opens that read from the store because the shard could not
    be cached (``cache_bypassed``): see :mod:`ingest.storage.cache`.

    ``derived_*`` count the derived cache (``derived=``, :mod:`ingest.engine.derived`):
    units read from their copies (``derived_hits``, their bytes ``derived_bytes_read``),
    units with no copy to read (``derived_misses``), copies written (``derived_writes``,
    ``derived_bytes_written``), the microseconds the stages took over the units derived now
    (``derived_stage_us``), and those they took when the copies read were made
    (``derived_saved_us``: the stage time the hits saved).
    """

    listings: int = 0
    opens: int = 0
    reads: int = 0
    bytes_read: int = 0
    retries: int = 0
    cache_hits: int = 0
    cache_hit_bytes: int = 0
    cache_misses: int = 0
    cache_fetched_bytes: int = 0
    cache_evicted_bytes: int = 0
    cache_bypassed: int = 0
    derived_hits: int = 0
    derived_misses: int = 0
    derived_writes: int = 0
    derived_bytes_read: int = 0
    derived_bytes_written: int = 0
    derived_stage_us: int = 0
    derived_saved_us: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to the named counts (``listings=1``, ``bytes_read=n``, ...)."""
        with self._lock:
            for name, n in counts.items():
                if name.startswith("_") or not hasattr(self, name):
                    raise TypeError(f"IOStats has no count {name!r}")
                setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name[0] != "_"}

    def growth(self, since: dict[str, int]) -> dict[str, int]:
        """The counts that grew since ``since`` (an :meth:`as_dict` of these counts), by how
        much: what a DataLoader worker sends of its reads to the main process's stream."""
        now = self.as_dict()
        return {name: n - since.get(name, 0) for name, n in now.items() if n != since.get(name, 0)}
