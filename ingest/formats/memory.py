"""Arrow's allocator, made fork-safe once ingest reads.

pyarrow 26 allocates with its bundled mimalloc by default, which takes no lock around a
``fork()``: a process that forks while one of its threads is inside mimalloc leaves the child
holding that lock, and the child's first Arrow allocation waits forever. ingest's read-ahead
and lane threads allocate Arrow buffers all the time, and an :class:`ingest.DataLoader` forks
its workers (torch's default start on Linux), so its workers hung now and then, at their
first ``iter_batches`` (``mi_page_map_set_range_prim`` -> ``pthread_mutex_lock``; 7 hangs in
about 150 runs of ``test_loader_workers``'s abandoned-loop script under load, none in 75
with jemalloc). jemalloc and glibc's malloc take their locks around a fork, so either is
safe.

:func:`use_fork_safe_allocator` runs when ``ingest.formats`` is first imported (every read
goes through it): if Arrow's default pool is mimalloc and the user did not choose it
(``ARROW_DEFAULT_MEMORY_POOL``, Arrow's own setting, is unset), Arrow's default pool becomes
jemalloc (the system allocator where pyarrow has no jemalloc). Buffers allocated before
stay with the pool that made them. Set ``ARROW_DEFAULT_MEMORY_POOL`` to keep another choice.
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa

_log = logging.getLogger(__name__)


def use_fork_safe_allocator() -> str:
    """Make Arrow's default pool fork-safe unless the user chose one; its backend's name."""
    pool = pa.default_memory_pool()
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or pool.backend_name != "mimalloc":
        return str(pool.backend_name)
    try:
        safe = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        safe = pa.system_memory_pool()
    pa.set_memory_pool(safe)
    _log.debug(
        "Arrow allocates with %s, not mimalloc: mimalloc is not fork-safe (see "
        "ingest.formats.memory); set ARROW_DEFAULT_MEMORY_POOL to choose",
        safe.backend_name,
    )
    return str(safe.backend_name)


__all__ = ["use_fork_safe_allocator"]
