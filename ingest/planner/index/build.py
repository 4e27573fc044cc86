"""Building the entries an index lacks: an :data:`Indexer` reads shards once for their row
counts and seek points; :func:`local_indexer` does it in threads of this process
(:func:`ingest.distributed.index_tasks.ray_indexer` in Ray tasks)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from ingest.core.errors import ConfigError
from ingest.formats import get_format
from ingest.formats.base import ReadContext, ShardInfo
from ingest.planner.index.store import IO_THREADS

Indexer = Callable[[Sequence[ReadContext]], Iterable[ShardInfo]]
"""Indexes shards: one :class:`ShardInfo` with ``rows`` and ``seeks`` per context, in order.

Results may be yielded as they are ready; the catalog stores each one as it arrives."""


def index_shard(ctx: ReadContext) -> ShardInfo:
    """Read ``ctx.shard`` once: its row count and seek points (``Format.index``), of the
    version listed (a local file changed as it was read is refused, not indexed under the
    listed version's name: :meth:`~ingest.storage.sources.Source.read_as_listed`)."""
    return ctx.source.read_as_listed(ctx.shard, lambda: get_format(ctx.shard.format).index(ctx))


def local_indexer(workers: int = IO_THREADS) -> Indexer:
    """An :data:`Indexer` that reads shards in ``workers`` threads of this process.

    Raises:
        ConfigError: If ``workers`` is below 1.
    """
    if workers < 1:
        raise ConfigError(f"index workers={workers} must be >= 1")

    def run(contexts: Sequence[ReadContext]) -> Iterator[ShardInfo]:
        if len(contexts) <= 1 or workers == 1:
            yield from (index_shard(c) for c in contexts)
            return
        pool = ThreadPoolExecutor(min(workers, len(contexts)))
        try:
            yield from pool.map(index_shard, contexts)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return run
