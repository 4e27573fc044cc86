"""The catalog: one listing of a source plus what each shard's footer tells.

:meth:`Catalog.scan` lists the source once and inspects new shards concurrently (parquet and
Arrow footers); a shard already inspected with the same size and version is not read again,
so the listing of the next epoch costs only the listing itself. The catalog also settles
the stream's schema: the explicit one, or that of the first non-empty shard.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from tqdm.auto import tqdm

from ingest.formats import get_format
from ingest.formats.base import EMPTY, ReadContext, ReadOptions, ShardInfo, check_schema
from ingest.plan import PlanShard
from ingest.sources import Shard, Source
from ingest.state import ShardRecord

_INSPECT_THREADS = 16


@dataclass(frozen=True, slots=True)
class Listing:
    """The shards of one listing, their inspection, and the stream schema."""

    shards: tuple[Shard, ...]
    infos: tuple[ShardInfo, ...]
    schema: pa.Schema | None
    schema_origin: str

    def records(self) -> list[ShardRecord]:
        return [
            ShardRecord(s.url, s.size, s.version, i.rows)
            for s, i in zip(self.shards, self.infos, strict=True)
        ]

    def plan_shards(self) -> list[PlanShard]:
        return [
            PlanShard(s.url, i.rows, i.blocks) for s, i in zip(self.shards, self.infos, strict=True)
        ]

    @property
    def rows(self) -> int | None:
        """Total rows, or None if some shard's count is unknown."""
        counts = [i.rows for i in self.infos]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def subset(self, urls: Sequence[str]) -> Listing:
        """The shards named by ``urls``, in that order (all must be present)."""
        where = {s.url: n for n, s in enumerate(self.shards)}
        picked = [where[u] for u in urls]
        return Listing(
            tuple(self.shards[n] for n in picked),
            tuple(self.infos[n] for n in picked),
            self.schema,
            self.schema_origin,
        )

    def context(
        self, index: int, source: Source, options: ReadOptions, columns: Sequence[str] | None
    ) -> ReadContext:
        return ReadContext(
            source,
            self.shards[index],
            self.infos[index],
            options,
            self.schema,
            self.schema_origin,
            columns,
        )


class Catalog:
    """Lists a source and inspects its shards, caching inspections across listings."""

    def __init__(self, source: Source, options: ReadOptions, columns: Sequence[str] | None) -> None:
        self.source = source
        self.options = options
        self.columns = columns
        self._cache: dict[tuple[str, int, str], ShardInfo] = {}
        self._index_cache: dict[tuple[str, int, str, str], ShardInfo] = {}
        self._lock = threading.Lock()

    def inspect(self, shard: Shard) -> ShardInfo:
        """The shard's inspection, from the cache when size and version are unchanged."""
        key = (shard.url, shard.size, shard.version)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        info = (
            EMPTY
            if shard.size == 0
            else get_format(shard.format).inspect(self.source, shard, self.options)
        )
        with self._lock:
            self._cache[key] = info
        return info

    def remember(self, listing: Listing) -> None:
        """Keep the inspections of a listing made elsewhere (another process, same source)."""
        with self._lock:
            for shard, info in zip(listing.shards, listing.infos, strict=True):
                key = (shard.url, shard.size, shard.version)
                if info.rows is not None and info.rows and info.seeks:
                    self._index_cache[(*key, "index")] = info
                self._cache.setdefault(key, info)

    def scan(self, *, progress: bool = False, schema: bool = True, index: bool = False) -> Listing:
        """List the source once and inspect every shard.

        Args:
            progress: Show a progress bar (stderr) while footers are read.
            schema: Settle the stream schema and check every footer against it; without it
                the listing has no schema (listing tools need none).
            index: Give every shard a row count and seek points, reading once (cached) the
                shards whose footer has no row count. Needs ``schema``.

        Raises:
            SourceError: If the source cannot be listed or matches nothing.
            ShardError: If a footer cannot be read, or shard schemas disagree.
        """
        shards = self.source.list_shards()
        infos: list[ShardInfo]
        todo = sum(1 for s in shards if (s.url, s.size, s.version) not in self._cache)
        with tqdm(
            total=len(shards),
            desc="reading footers",
            unit="shard",
            disable=not progress or todo == 0,
            leave=False,
        ) as bar:

            def one(shard: Shard) -> ShardInfo:
                info = self.inspect(shard)
                bar.update(1)
                return info

            if todo > 1:
                with ThreadPoolExecutor(min(_INSPECT_THREADS, todo)) as pool:
                    infos = list(pool.map(one, shards))
            else:
                infos = [one(s) for s in shards]
        if not schema:
            return Listing(tuple(shards), tuple(infos), None, "")
        stream_schema, origin = self._schema(shards, infos)
        if stream_schema is not None:
            for shard, info in zip(shards, infos, strict=True):
                if info.schema is not None and info.rows:
                    check_schema(shard.url, info.schema, stream_schema, origin, self.columns)
        listing = Listing(tuple(shards), tuple(infos), stream_schema, origin)
        return self._index(listing, progress) if index else listing

    def _index(self, listing: Listing, progress: bool) -> Listing:
        todo = [n for n, i in enumerate(listing.infos) if i.rows is None]
        if not todo:
            return listing
        infos = list(listing.infos)
        with tqdm(
            total=len(todo), desc="indexing shards", unit="shard", disable=not progress, leave=False
        ) as bar:

            def one(n: int) -> ShardInfo:
                shard = listing.shards[n]
                key = (shard.url, shard.size, shard.version, "index")
                with self._lock:
                    cached = self._index_cache.get(key)
                if cached is None:
                    ctx = listing.context(n, self.source, self.options, None)
                    cached = get_format(shard.format).index(ctx)
                    with self._lock:
                        self._index_cache[key] = cached
                bar.update(1)
                return cached

            with ThreadPoolExecutor(min(_INSPECT_THREADS, len(todo))) as pool:
                for n, info in zip(todo, pool.map(one, todo), strict=True):
                    infos[n] = info
        return Listing(listing.shards, tuple(infos), listing.schema, listing.schema_origin)

    def _schema(
        self, shards: Sequence[Shard], infos: Sequence[ShardInfo]
    ) -> tuple[pa.Schema | None, str]:
        if self.options.schema is not None:
            return self.options.schema, "ReadOptions.schema"
        for shard, info in zip(shards, infos, strict=True):
            if shard.size == 0 or info.rows == 0:
                continue
            fmt = get_format(shard.format)
            return fmt.infer_schema(self.source, shard, info, self.options), shard.url
        return None, ""
