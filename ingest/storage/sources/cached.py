"""A source's shards through the node's shard cache (:mod:`ingest.storage.cache`): opened
from the node's copy, fetched whole into it on a miss, counted in the source's stats."""

from __future__ import annotations

import os
import posixpath
from typing import IO, TYPE_CHECKING, Any

from fsspec.callbacks import TqdmCallback

from ingest.storage.cache import CacheEvent
from ingest.storage.cache.files import DISK_FULL
from ingest.storage.sources.faults import ChangedError
from ingest.storage.sources.files import CountingFile, listed_etag
from ingest.storage.sources.retry import GaveUpError, attempt
from ingest.storage.sources.shard import Shard

if TYPE_CHECKING:
    from ingest.storage.sources.source import Source


def open_cached(source: Source, shard: Shard, *, fetch: bool) -> CountingFile | None:
    """The shard from the node's cache (fetched whole into it on a miss if ``fetch``),
    or None."""
    if not source.caches(shard):
        if fetch:
            source.count_past_cache(shard)
        return None
    cache = source.node_cache()

    def held() -> IO[bytes] | None:
        event = CacheEvent()
        f = cache.open(
            shard.url,
            shard.size,
            shard.version,
            (lambda to: fetch_whole(source, shard, to)) if fetch else None,
            event,
        )
        if f is None:
            source.stats.add(cache_bypassed=int(fetch))
            return None
        if event.hit:
            source.stats.add(cache_hits=1, cache_hit_bytes=shard.size)
        else:
            source.stats.add(cache_misses=1, cache_fetched_bytes=event.fetched_bytes)
        source.stats.add(cache_evicted_bytes=event.evicted_bytes)
        return f

    first = held()
    if first is None:
        return None

    def reopen() -> IO[bytes]:
        again = held()
        if again is None:
            raise OSError(f"the cached copy of {source.scrub(shard.url)} went away")
        return again

    # Reads of the copy are local: what the fetch sent is what was counted.
    return CountingFile(first, reopen, None, shard.size, shard.url, source.scrub, None)


def fetch_whole(source: Source, shard: Shard, to: str) -> None:
    """The whole shard into the local file ``to``: one request, retried as a whole."""
    kwargs: dict[str, Any] = {}
    if source.cache is not None and source.cache.progress:
        name = posixpath.basename(shard.url.split("?", 1)[0])
        bar = {"desc": f"caching {name}", "unit": "B", "leave": False}
        kwargs["callback"] = TqdmCallback(tqdm_kwargs={**bar, "unit_scale": True})

    def get() -> None:
        fs, path = source.fs_path(shard)  # within the retries: a Hub file asks where it is
        source.stats.add(opens=1, reads=1)
        fs.get_file(path, to, **kwargs)
        etag = listed_etag(shard)
        if etag is not None and getattr(fs, "reads_a_version", False):
            # An S3 object: the copy is kept under the listed ETag only if the object still
            # is that version once fetched (s3fs's whole-object GET names no version; one
            # HEAD a miss, counted as the listing's are). It kept an object overwritten since
            # the listing under the old version's name, read in its place once the old bytes
            # were written back.
            fs.invalidate_cache(path)
            source.stats.add(listings=1)
            now = fs.info(path).get("ETag")
            if now != etag:
                raise ChangedError(
                    f"the object is ETag {now} once fetched, where the listing saw {etag}"
                )

    try:
        attempt(get, source.policy(shard.url), source.stats)
    except GaveUpError as gave_up:
        last = gave_up.last
        if isinstance(last, OSError) and last.errno in DISK_FULL:
            raise last from None  # the cache's disk, not the store: it reads from the store
        raise source.read_error(
            shard,
            gave_up,
            "cannot be fetched into the shard cache",
            "check the store and the network",
        ) from None
    source.stats.add(bytes_read=os.path.getsize(to))
