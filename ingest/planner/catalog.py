"""The catalog: one listing of a source plus what each shard's footer tells.

:meth:`Catalog.scan` lists the source once and inspects new shards concurrently (parquet and
Arrow footers); a shard already inspected with the same size and version is not read again,
so the listing of the next epoch costs only the listing itself. The catalog also settles
the stream's schema: the explicit one, or that of the first shard that holds a record.

Shards whose footer has no row count are indexed (read once for rows and seek points) only
when a scan asks for it: from this catalog's memory, else from its persistent
:class:`~ingest.planner.index.IndexStore`, else by its indexer (threads here, or Ray tasks), whose
results go back to the store as they arrive.

Under ``ReadOptions(on_error="skip")`` a shard that cannot be opened, counted or typed while
the listing is made (its footer gone or corrupt, an empty file, its schema not inferable or
not the stream's, its indexing failing) is quarantined as reading it would be: it stays in
the listing with no rows and the error (:attr:`ShardInfo.unread
<ingest.formats.base.ShardInfo.unread>`), rank 0's feed records it whole, and every other
shard is planned as usual. A bad line among those the schema is inferred from is left out of
the inference (the format's business); read, it is quarantined alone. A store that does not
answer (:class:`~ingest.core.errors.StoreError`) is never skipped, here as anywhere.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import cast

import pyarrow as pa
from fsspec.utils import get_protocol
from tqdm.auto import tqdm

from ingest.core.errors import ConfigError, IngestError, ShardError, SourceError, redact
from ingest.core.plan import PlanShard
from ingest.core.quarantine import skippable
from ingest.core.state import ShardRecord
from ingest.formats import FORMAT_RESOLVER, get_format, read_as, without_incidental
from ingest.formats import folder as folders
from ingest.formats.base import (
    DECLARED,
    EMPTY,
    TABLE_LOG,
    ReadContext,
    ReadOptions,
    ShardInfo,
    check_columns,
    check_names,
    check_schema,
    declares,
)
from ingest.formats.conform import widened_schema
from ingest.formats.deleted_rows import with_deletions
from ingest.formats.partitions import (
    partition_keys,
    with_partition_fields,
    without_partition_fields,
)
from ingest.planner.index import Indexer, IndexStore, IndexStoreError, local_indexer
from ingest.planner.index.footers import keep_footers, stored_footers
from ingest.storage.sources import Shard, Source
from ingest.storage.sources.deletion_vectors import VECTOR_FIX, VectorError
from ingest.storage.sources.delta import TableVersion
from ingest.storage.sources.options import requests_at_once

_INDEX_THREADS = 16
"""Shards indexed at once in this process (each read whole, its rows counted)."""
_SAVE_EVERY = 64  # indexes built per write to the store


@dataclass(frozen=True, slots=True)
class Listing:
    """The shards of one listing, their inspection, and the stream schema."""

    shards: tuple[Shard, ...]
    infos: tuple[ShardInfo, ...]
    schema: pa.Schema | None
    schema_origin: str
    classes: tuple[str, ...] = ()
    """Folder datasets: the sorted class names, the ``label`` indices' meaning."""
    partition_keys: tuple[str, ...] = ()
    """The hive partition columns of the stream, the last fields of :attr:`schema`
    (:mod:`ingest.formats.partitions`); none under ``ReadOptions(partitioning=None)``."""
    tables: tuple[tuple[str, int], ...] = ()
    """The Delta tables listed, each root's URL with a version read, sorted (in a state's
    ``dataset``: a resume reads the rest of its epoch at them)."""
    kept: tuple[str, ...] = ()
    """URLs of shards :meth:`joined` from other versions of the tables, which rows carried
    into the epoch are in (:meth:`ingest.core.listing.Listed.kept`)."""

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats its shards are read as, sorted
        (:meth:`ingest.core.listing.Listed.formats`)."""
        return tuple(sorted({s.format for s in self.shards}))

    def records(self) -> list[ShardRecord]:
        return [
            ShardRecord(s.url, s.size, s.rows_version, i.rows)
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

    def unread(self) -> list[tuple[int, Exception]]:
        """``(shard index, error)`` of the shards quarantined while this listing was made
        (``on_error="skip"``): planned with no rows, recorded whole by rank 0's feed."""
        return [(n, i.unread) for n, i in enumerate(self.infos) if i.unread is not None]

    def subset(self, urls: Sequence[str]) -> Listing:
        """The shards named by ``urls``, in that order (all must be present)."""
        where = {s.url: n for n, s in enumerate(self.shards)}
        picked = [where[u] for u in urls]
        return Listing(
            tuple(self.shards[n] for n in picked),
            tuple(self.infos[n] for n in picked),
            self.schema,
            self.schema_origin,
            self.classes,
            self.partition_keys,
            self.tables,
            tuple(u for u in self.kept if u in where),
        )

    def joined(self, other: Listing, urls: Sequence[str]) -> Listing:
        """This listing with the shards ``urls`` of ``other`` (a listing of other versions
        of its Delta tables: files a compaction replaced, which rows carried into this
        epoch are in) among its own, in URL order, and ``other``'s versions beside its own;
        its schema is this listing's."""
        theirs = other.subset(urls)
        pairs = sorted(
            zip(self.shards + theirs.shards, self.infos + theirs.infos, strict=True),
            key=lambda pair: pair[0].url,
        )
        return replace(
            self,
            shards=tuple(s for s, _ in pairs),
            infos=tuple(i for _, i in pairs),
            tables=tuple(sorted(set(self.tables) | set(other.tables))),
            kept=tuple(sorted({*self.kept, *urls})),
        )

    def context(
        self, index: int, source: Source, options: ReadOptions, columns: Sequence[str] | None
    ) -> ReadContext:
        """What a reader of shard ``index`` needs: the files' part of the schema and of
        ``columns``, and the partition columns its batches get after them."""
        keys = self.partition_keys
        files, added, order = columns, keys, None
        if keys and columns is not None:  # columns= may name partition columns
            files = [c for c in columns if c not in keys]
            added = tuple(c for c in columns if c in keys)
            order = tuple(columns)
        if options.schema is None and self.schema is not None and declares(self.schema_origin):
            options = replace(options, schema=self.schema)  # a Delta table's: as if declared
        return ReadContext(
            source,
            self.shards[index],
            self.infos[index],
            options,
            without_partition_fields(self.schema, keys),
            self.schema_origin,
            files,
            added,
            order,
        )


class Catalog:
    """Lists a source and inspects its shards, caching inspections across listings.

    Args:
        source: What to list.
        options: How shards are read.
        columns: Columns the stream keeps (schema checks compare only these).
        index_store: Persistent index looked up before any shard is read to index it, and
            given every index built here, so later jobs read none. None: indexes live in
            this object only.
        indexer: Builds the indexes the store lacks, e.g.
            :func:`ingest.distributed.index_tasks.ray_indexer` to read in Ray tasks on the
            ingest nodes. None: threads of this process.
    """

    def __init__(
        self,
        source: Source,
        options: ReadOptions,
        columns: Sequence[str] | None,
        *,
        index_store: IndexStore | None = None,
        indexer: Indexer | None = None,
    ) -> None:
        self.source = source
        self.options = options
        self.columns = columns
        self.index_store = index_store
        self._indexer = indexer
        self._cache: dict[tuple[str, int, str], ShardInfo] = {}
        self._index_cache: dict[tuple[str, int, str, str], ShardInfo] = {}
        """Indexes built or loaded by this catalog, by (url, size, version, format)."""
        self._schemas: dict[tuple[str, int, str, str], pa.Schema] = {}
        """Schemas inferred by parsing a shard's first block (JSONL, CSV), by its URL, size,
        version and format: a stream lists its source every epoch, and parsing a block again
        cost 12% of a warm epoch's CPU over a tokenized JSONL corpus (issue 34)."""
        self._vectors: dict[tuple[str, int, str, str], ShardInfo] = {}
        """The inspections of shards with deleted rows (a Delta file's deletion vector), by
        URL, size, version and vector: each vector read once."""
        self._lock = threading.Lock()

    def inspect(self, shard: Shard) -> ShardInfo:
        """The shard's inspection, from the cache when size and version are unchanged."""
        key = (shard.url, shard.size, shard.version)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        fmt = get_format(shard.format)
        if shard.size == 0 and not fmt.empty_is_valid:
            raise ShardError(
                shard.url,
                f"is empty (0 bytes): not a {fmt.name} file, perhaps a write that failed",
                "remove the file or write it again",
                byte=0,
            )
        if shard.size == 0:
            info = EMPTY
        else:  # not kept under the listed version's name where the file changed meanwhile
            info = self.source.read_as_listed(
                shard, lambda: fmt.inspect(self.source, shard, self.options)
            )
        with self._lock:
            self._cache[key] = info
        return info

    def remember(self, listing: Listing) -> None:
        """Keep the inspections of a listing made elsewhere (another process, same source)."""
        with self._lock:
            for shard, info in zip(listing.shards, listing.infos, strict=True):
                if info.unread is not None:  # inspected again next time
                    continue
                key = (shard.url, shard.size, shard.version)
                if info.deletions is not None:  # the file's own inspection is the one kept
                    self._vectors.setdefault(_vector_key(shard), info)
                    info = info.deletions.physical
                if info.rows is not None and info.rows and info.seeks:
                    self._index_cache[_index_key(shard)] = info
                self._cache.setdefault(key, info)

    def scan(
        self,
        *,
        progress: bool = False,
        schema: bool = True,
        index: bool = False,
        at: Mapping[str, Sequence[int]] | None = None,
        since: Mapping[str, int] | None = None,
        commits: Mapping[str, str] | None = None,
    ) -> Listing:
        """List the source once and inspect every shard.

        Args:
            progress: Show a progress bar (stderr) while footers are read.
            schema: Settle the stream schema and check every footer against it; without it
                the listing has no schema (listing tools need none).
            index: Give every shard a row count and seek points. Shards whose footer has no
                row count are looked up in this catalog's memory, then in its index store;
                only the rest are read, by the indexer, and stored. Needs ``schema``.
            at: Delta tables' versions by their roots' URLs (a state's): those tables' files
                are those of these versions, the others' their newest.
            since: Followed Delta tables' first versions by their roots' URLs: their files
                are those of that version and those appended since.
            commits: Hub repositories' commits by their ``hf://`` URLs (a state's): their
                files are those of these commits.

        Raises:
            SourceError: If the source cannot be listed or matches nothing.
            ShardError: If a footer or a shard being indexed cannot be read, or shard
                schemas disagree.
            IndexStoreError: If the index store cannot be read or written.
        """
        listed = self.source.list_shards(
            FORMAT_RESOLVER, listings=self.index_store, at=at, since=since, commits=commits
        )
        shards, classes = folders.group(without_incidental(listed))
        tables = tuple(sorted((u, v) for u, t in self._tables().items() for v in t.versions))
        shards = self._as_read(shards)
        known = self._recall_footers(shards)
        vacuumed = self._vacuumed()
        with self._lock:
            reads = [
                n
                for n, s in enumerate(shards)
                if s.size > 0
                and (s.url, s.size, s.version) not in self._cache
                and get_format(s.format).inspect_reads
                and s.url not in vacuumed
            ]
        found: list[ShardInfo | None] = [None] * len(shards)
        threaded = set(reads)
        for n, shard in enumerate(shards):  # the inspections that read nothing: in line, first
            if shard.url in vacuumed:
                found[n] = _vacuumed_info(shard, vacuumed[shard.url])
            elif n not in threaded:
                found[n] = self._inspect_or_unread(shard)
        with tqdm(
            total=len(reads),
            desc="reading footers",
            unit="shard",
            disable=not progress or not reads,
            leave=False,
        ) as bar:

            def one(n: int) -> None:
                found[n] = self._inspect_or_unread(shards[n])
                bar.update(1)

            self._side_by_side(one, reads)
        infos = cast(list[ShardInfo], found)  # every one set above
        if self.index_store is not None:  # footers read just now, for the next job
            read = [(s, i) for s, i in zip(shards, infos, strict=True) if s.url not in vacuumed]
            keep_footers(self.index_store, read, known)

        def kept(n: int) -> None:  # a Delta file's deletion vector: a read, as a footer's
            infos[n] = self._kept_rows(shards[n], infos[n])

        self._side_by_side(kept, [n for n, s in enumerate(shards) if s.deletions is not None])
        if not schema:
            return Listing(tuple(shards), tuple(infos), None, "", classes, tables=tables)
        listing = replace(self._settled(shards, infos, classes), tables=tables)
        return self._index(listing, progress) if index else listing

    def count(self, listing: Listing, shards: Sequence[int], progress: bool = False) -> Listing:
        """``listing`` with row counts for ``shards`` (indices), as :meth:`scan` ``index``
        gives every shard: from this catalog's memory, its index store, else by reading."""
        return self._index(listing, progress, shards)

    def _side_by_side(self, call: Callable[[int], None], items: Sequence[int]) -> None:
        """``call`` of each of ``items``, reads of the source at once: a store's are waited
        for (requests_at_once); local ones are parsed, not waited for: as many as CPUs (16
        threads cost 10 ms of CPU more than 2 for 32 local shards' footers on 2 cores, and
        took longer)."""
        threads = min(requests_at_once(self.source.urls), len(items))
        protocols = {get_protocol(url) for url in self.source.urls}
        if protocols <= {"file", "local", "memory"}:
            threads = min(threads, os.cpu_count() or 1)
        if threads > 1:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(call, items))
        else:
            for n in items:
                call(n)

    def _kept_rows(self, shard: Shard, info: ShardInfo) -> ShardInfo:
        """``info`` of a shard with deleted rows (a Delta file's deletion vector) counting
        the rows it keeps (:mod:`ingest.formats.deleted_rows`); else ``info``."""
        vector = shard.deletions
        if vector is None or info.unread is not None:
            return info
        key = _vector_key(shard)
        with self._lock:
            known = self._vectors.get(key)
        if known is not None:
            return known
        data = None
        if vector.path is not None:
            start, stop = vector.span()
            what = f"the deletion vector of {shard.url}"
            data = self.source.read_bytes(vector.path, start, stop, what)
        try:
            rows = vector.rows(data)
        except VectorError as bad:
            raise SourceError(
                vector.path or shard.url,
                f"the deletion vector of {shard.url} cannot be read: {bad}",
                VECTOR_FIX,
            ) from None
        kept = with_deletions(shard.url, info, rows)
        with self._lock:
            return self._vectors.setdefault(key, kept)

    def _tables(self) -> Mapping[str, TableVersion]:
        """The Delta tables the source's last listing found (a stand-in source has none)."""
        tables: Mapping[str, TableVersion] = getattr(self.source, "tables", {})
        return tables

    def _vacuumed(self) -> dict[str, int | None]:
        """The files of followed Delta tables that a compaction removed and a VACUUM
        deleted since a round listed them, with their row counts from the log."""
        return {url: rows for t in self._tables().values() for url, rows in t.vacuumed.items()}

    def _as_read(self, shards: list[Shard]) -> list[Shard]:
        """``shards`` as the stream's options read them: the hive partitions it reads (none
        under ``ReadOptions(partitioning=None)``, so that derived copies are keyed without
        them), and the format that reads each (CSV with another ``delimiter`` is a variant
        of its own, :func:`ingest.formats.read_as`)."""
        out = []
        for s in shards:
            fmt = read_as(s.format, self.options)
            partition = s.partition if self.options.partitioning is not None else ()
            if fmt != s.format or partition != s.partition:
                s = replace(s, format=fmt, partition=partition)
            out.append(s)
        return out

    def _settled(
        self, shards: list[Shard], infos: list[ShardInfo], classes: tuple[str, ...]
    ) -> Listing:
        """The listing with the stream's schema: the files' (every footer checked against
        it), then the partition columns."""
        keys = partition_keys(shards)
        for shard, info in zip(shards, infos, strict=True):
            if info.schema is not None:  # (before a schema of two columns x is taken or widened)
                check_names(shard.url, info.schema.names)
        stream_schema, origin = self._schema(shards, infos, self._file_columns(keys))
        if stream_schema is not None:
            declared = stream_schema if declares(origin) else None
            if declared is None:
                stream_schema = self._widened(stream_schema, infos, keys)
            else:  # a declared schema may type the partition columns: not the files'
                stream_schema = without_partition_fields(stream_schema, keys) or stream_schema
            self._check_schemas(shards, infos, stream_schema, origin, keys)
            if keys:
                stream_schema = with_partition_fields(stream_schema, keys, shards, origin, declared)
        return Listing(tuple(shards), tuple(infos), stream_schema, origin, classes, keys)

    def _widened(self, schema: pa.Schema, infos: list[ShardInfo], keys: Sequence[str]) -> pa.Schema:
        """The first shard's ``schema`` with each column's type widened to hold every
        footer's (:func:`ingest.formats.conform.widened`: a column all null in the first
        shard takes the others' type, ``int32`` beside ``int64`` is read as ``int64``);
        a footer some column of which no type holds with the stream's widens nothing and is
        refused (:meth:`_check_schemas`). Only the columns read count. Followed, a later
        round's shard may widen a column from that round on."""
        columns = self._file_columns(keys)
        for info in infos:
            if info.schema is not None and info.rows and not info.schema.equals(schema):
                schema = widened_schema(schema, info.schema, columns) or schema
        return schema

    def _file_columns(self, keys: Sequence[str]) -> Sequence[str] | None:
        """The columns read from the files (the stream's ``columns`` less the partition
        keys, which no file holds), None: all."""
        if self.columns is not None and keys:
            return [c for c in self.columns if c not in keys]
        return self.columns

    def _inspect_or_unread(self, shard: Shard) -> ShardInfo:
        """:meth:`inspect`, or the error as an unread shard's (see :meth:`_unread`)."""
        try:
            return self.inspect(shard)
        except Exception as e:
            return self._unread(e)

    def _check_schemas(
        self,
        shards: Sequence[Shard],
        infos: list[ShardInfo],
        schema: pa.Schema,
        origin: str,
        keys: Sequence[str],
    ) -> None:
        """Check every footer's schema against the stream's (a shard that differs is marked
        unread in ``infos`` under ``on_error="skip"``); ``keys``: the partition columns,
        which no file holds."""
        columns = self._file_columns(keys)
        # A declared schema's columns that no footer holds, where every shard has a footer:
        # only then are the footers' columns gathered (not on every listing).
        gather = origin == DECLARED and all(i.schema is not None for i in infos if i.rows)
        held: set[str] = set()
        for n, (shard, info) in enumerate(zip(shards, infos, strict=True)):
            if info.schema is not None and info.rows:
                if gather:
                    held.update(info.schema.names)
                try:
                    check_schema(shard.url, info.schema, schema, origin, columns)
                except Exception as e:
                    infos[n] = self._unread(e)
        nowhere = [f.name for f in schema if f.name not in held] if held else []
        if nowhere:
            raise ConfigError(
                f"{redact(self.source.urls[0])}: column {nowhere[0]!r} of ReadOptions(schema=...) "
                f"is in no shard's footer (they hold {sorted(held)[:10]}): check its name "
                "(a column a shard lacks reads as nulls, so a misspelt one would be all nulls)"
            )

    def _unread(self, error: Exception) -> ShardInfo:
        """The inspection of a shard that ``error`` stopped while listing: under
        ``on_error="skip"`` (and a data error) no rows and the error, to be quarantined;
        else the error is raised."""
        if self.options.on_error != "skip" or not skippable(error):
            raise error
        return ShardInfo(rows=0, unread=error)

    def _recall_footers(self, shards: Sequence[Shard]) -> set[tuple[str, int, str]]:
        """Take the footers the index store keeps of shards not inspected yet (a restarted
        job reads none again: :mod:`ingest.planner.index.footers`); the keys known now."""
        with self._lock:
            fresh = [s for s in shards if (s.url, s.size, s.version) not in self._cache]
        stored = stored_footers(self.index_store, fresh) if self.index_store and fresh else {}
        with self._lock:
            self._cache.update(stored)
            return set(self._cache)

    def _index(
        self, listing: Listing, progress: bool, shards: Sequence[int] | None = None
    ) -> Listing:
        """``listing`` with a row count for each of ``shards`` (None: every shard)."""
        if shards is None:
            shards = range(len(listing.infos))
        todo = [n for n in shards if listing.infos[n].rows is None]
        if not todo:
            return listing
        infos = list(listing.infos)
        with self._lock:
            for n in todo:
                cached = self._index_cache.get(_index_key(listing.shards[n]))
                if cached is not None:
                    infos[n] = cached
        todo = [n for n in todo if infos[n].rows is None]
        if todo and self.index_store is not None:
            stored = self.index_store.get_many([listing.shards[n] for n in todo])
            for n, got in zip(todo, stored, strict=True):
                if got is not None:
                    infos[n] = self._keep(
                        listing.shards[n],
                        replace(infos[n], rows=got.rows, blocks=got.blocks, seeks=got.seeks),
                    )
            todo = [n for n in todo if infos[n].rows is None]
        if todo:
            self._build(listing, todo, infos, progress)
        return replace(listing, infos=tuple(infos))

    def _build(
        self, listing: Listing, todo: list[int], infos: list[ShardInfo], progress: bool
    ) -> None:
        """Index the shards ``todo`` with the indexer, saving them to the store as they come.

        What was built before an error is saved too, so a re-run resumes after it.
        """
        indexer = self._indexer or local_indexer(min(_INDEX_THREADS, len(todo)))
        unsaved: list[tuple[Shard, ShardInfo]] = []
        with tqdm(
            total=len(todo), desc="indexing shards", unit="shard", disable=not progress, leave=False
        ) as bar:
            while todo:  # again after a shard quarantined (on_error="skip"), from the next
                contexts = [listing.context(n, self.source, self.options, None) for n in todo]
                results = iter(indexer(contexts))
                done = 0
                try:
                    for n in todo:
                        try:
                            info = next(results, None)
                        except Exception as e:
                            infos[n] = self._unread(e)
                            done += 1
                            bar.update(1)
                            break
                        if info is None or info.rows is None:
                            raise ValueError(
                                f"indexer {indexer!r} gave no row count for "
                                f"{redact(listing.shards[n].url)}; an Indexer must yield one "
                                "ShardInfo with rows set per ReadContext, in order"
                            )
                        infos[n] = self._keep(listing.shards[n], info)
                        unsaved.append((listing.shards[n], info))
                        done += 1
                        bar.update(1)
                        if len(unsaved) >= _SAVE_EVERY:
                            self._save(unsaved)
                except BaseException:
                    with contextlib.suppress(IngestError):
                        self._save(unsaved)
                    raise
                finally:
                    close = getattr(results, "close", None)
                    if close is not None:
                        close()
                todo = todo[done:]
        self._save(unsaved)

    def _keep(self, shard: Shard, info: ShardInfo) -> ShardInfo:
        with self._lock:
            self._index_cache[_index_key(shard)] = info
        return info

    def _save(self, unsaved: list[tuple[Shard, ShardInfo]]) -> None:
        if self.index_store is not None and unsaved:
            self.index_store.put_many(unsaved)
        unsaved.clear()

    def _table_schema(self, shards: Sequence[Shard]) -> tuple[pa.Schema, str] | None:
        """The schema of the one Delta table whose files the listing holds, as its log
        declares it (a column added by a later write is in it: the files written before
        read it as nulls), with its origin; None where the listing is not one table's."""
        tables = self._tables()
        if len(tables) != 1 or self.options.partitioning is None:
            return None  # partitioning=None: the files' columns alone, as inferred
        ((root, table),) = tables.items()
        schema = table.schema
        if schema is None or not all(s.url.startswith(f"{root}/") for s in shards):
            return None
        return schema, f"{TABLE_LOG}{root}"

    def shard_schema(self, shard: Shard, info: ShardInfo) -> tuple[pa.Schema | None, str]:
        """The schema of one shard on its own, and where it came from."""
        if self.options.schema is not None:
            return self.options.schema, DECLARED
        if shard.size == 0 or info.rows == 0:
            return None, ""
        return get_format(shard.format).infer_schema(self.source, shard, info, self.options), (
            shard.url
        )

    def _schema(
        self, shards: Sequence[Shard], infos: list[ShardInfo], columns: Sequence[str] | None
    ) -> tuple[pa.Schema | None, str]:
        """The stream schema: the explicit one, or that of the first non-empty shard whose
        schema can be inferred and holds the ``columns`` read (those that cannot are marked
        unread in ``infos`` under ``on_error="skip"``; those without records, a CSV file of
        its header alone, are passed over); None where no shard holds a record.

        A shard that lacks a column read is refused here, naming it
        (:func:`~ingest.formats.base.check_columns`): taken as the stream's, its missing
        column was typed null, and the next shard, which has it, was blamed for a type
        nobody wrote (or a JSON Lines stream read on without the column)."""
        if self.options.schema is not None:
            return self.options.schema, DECLARED
        table = self._table_schema(shards)
        if table is not None:
            return table
        for n, (shard, info) in enumerate(zip(shards, infos, strict=True)):
            if shard.size == 0 or info.rows == 0:
                continue
            key = _index_key(shard)
            known = self._schemas.get(key)
            if known is not None:
                return known, shard.url
            try:
                inferred = self._inferred(shard, info)
                if inferred is not None:
                    check_names(shard.url, inferred.names)
                    check_columns(shard.url, columns, inferred.names, typed=True)
            except IndexStoreError:
                raise
            except Exception as e:
                infos[n] = self._unread(e)
                continue
            if inferred is None:  # no records to infer types from: the next shard's
                continue
            self._schemas[key] = inferred
            return inferred, shard.url
        return None, ""

    def _inferred(self, shard: Shard, info: ShardInfo) -> pa.Schema | None:
        """``shard``'s schema inferred from its bytes, or as the shard index kept it where
        its format keeps one (``Format.schema_key``): a restarted job then sends no request
        for it (50 ms away, a JSON Lines stream's first batch: 0.41 against 0.31 s)."""
        fmt = get_format(shard.format)
        if self.index_store is None or (key := fmt.schema_key(self.options)) is None:
            return fmt.infer_schema(self.source, shard, info, self.options)
        key = f"{key} pyarrow {pa.__version__}"  # another pyarrow may infer other types
        kept = self.index_store.get_schema(shard, key)
        if kept is not None:
            fmt.kept_schema(shard, kept, self.options)
            return kept
        inferred = fmt.infer_schema(self.source, shard, info, self.options)
        if inferred is not None:
            self.index_store.put_schema(shard, key, inferred)
        return inferred


def _vacuumed_info(shard: Shard, rows: int | None) -> ShardInfo:
    """A followed Delta table's file gone since a round listed it (a compaction removed it,
    a VACUUM deleted it): its row count from the log, its footer not read (the rounds
    before read its rows; one that did not fails to open it, naming it)."""
    if rows is None:
        raise SourceError(
            shard.url,
            "was removed by a compaction and deleted by a VACUUM while the stream followed "
            "its Delta table, and the table's log holds no row count for it (numRecords), "
            "so the rounds that read it cannot be planned again",
            "start a new stream without the state, or keep files longer than a stream "
            "follows the table (delta.deletedFileRetentionDuration)",
        )
    return ShardInfo(rows=rows)


def _index_key(shard: Shard) -> tuple[str, int, str, str]:
    return (shard.url, shard.size, shard.version, shard.format)


def _vector_key(shard: Shard) -> tuple[str, int, str, str]:
    """A shard with deleted rows, by its file and its deletion vector."""
    assert shard.deletions is not None
    return (shard.url, shard.size, shard.version, shard.deletions.unique_id)
