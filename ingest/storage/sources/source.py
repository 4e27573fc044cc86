"""The :class:`Source`: its filesystems, one per protocol, with the source's timeouts and
credentials; its listing (:mod:`~ingest.storage.sources.listing`); and the files it opens
for the format readers, from the store or the node's shard cache, every read retried and
counted."""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

import fsspec
from fsspec.core import url_to_fs
from fsspec.utils import get_protocol

from ingest.core.errors import ConfigError, SourceError, StoreError, redact
from ingest.storage import hub
from ingest.storage.cache import CacheOptions, ShardCache
from ingest.storage.sources.cached import open_cached
from ingest.storage.sources.delta import TableVersion
from ingest.storage.sources.faults import ShortBodyError, is_not_found, is_transient
from ingest.storage.sources.files import (
    CountingFile,
    as_listed,
    is_local,
    listed_etag,
    range_ignored,
    with_listed_details,
)
from ingest.storage.sources.http_versions import ListedVersions, listed_versions, watch
from ingest.storage.sources.hubfs import expired, hub_cdn, hub_http, located, signed
from ingest.storage.sources.known_parts import KnownParts
from ingest.storage.sources.listing import list_url, warn_unversioned
from ingest.storage.sources.options import (
    SECRET_OPTION_NAMES,
    check_endpoint,
    fs_options,
    option_secrets,
    requests_at_once,
    s3_userinfo,
    strip_userinfo,
    url_secrets,
)
from ingest.storage.sources.retry import GaveUpError, RetryPolicy, attempt, store_error
from ingest.storage.sources.shard import FormatResolver, ListingStore, Shard
from ingest.storage.sources.stats import IOStats

_LOCAL_PROTOCOLS = frozenset({"file", "local"})


URLs = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
"""One URL or several; a local path may be a :class:`pathlib.Path`."""


def as_urls(urls: URLs) -> tuple[str, ...]:
    """``urls`` as a tuple of strings (paths as their strings).

    Raises:
        ConfigError: Naming a value that is neither a string nor a path.
    """
    many: Iterable[object] = [urls]
    if isinstance(urls, Iterable) and not isinstance(urls, str | os.PathLike):
        many = urls  # a list, a tuple, a generator...
    out = []
    for url in many:
        if isinstance(url, os.PathLike):
            url = os.fspath(url)
        if not isinstance(url, str):
            raise ConfigError(
                f"source URL {url!r} ({type(url).__name__}) is not a string or a path; pass "
                "a URL ('s3://bucket/train/*.parquet'), a local path, or a list of them"
            )
        if not url.strip() or _SCHEME_ALONE.fullmatch(url.strip()):
            # fsspec reads "" and "file://" as the working directory: a training on
            # whatever lies there, where a variable meant to hold the URL was unset
            raise ConfigError(
                f"source URL {url!r} names nothing: pass a URL ('s3://bucket/train/'), a "
                "local path ('.' for the working directory), or a list of them (is the "
                "variable meant to hold it unset?)"
            )
        out.append(url)
    return tuple(out)


def _names_versions(fs: Any) -> bool:
    """Whether ``fs`` reads ranges of one version of an object (the source's S3
    filesystem, unless its store has no ``If-Match``: ``local_expiry_check``)."""
    return bool(getattr(fs, "reads_a_version", False)) and not fs.local_expiry_check


_SCHEME_ALONE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""A URL that is a scheme and nothing else (``file://``, ``s3://``)."""


class Source:
    """One or more fsspec URLs (files, directories or globs) with their storage options.

    Credentials in a URL never leave it: ``s3://KEY:SECRET@bucket/...`` gives its key and
    secret to the S3 filesystem (unless ``storage_options`` name them) and its shards are
    listed as ``s3://bucket/...``; an HTTP URL with a user or a query (a token, a signature)
    is listed with them shown as ``***`` and opened with the URL as given. A query is not
    a glob: only ``*``, ``?`` and ``[`` before it are.

    Args:
        urls: A URL or a list of them, any fsspec protocol (``s3://``, ``gs://``, ``hf://``,
            ``https://``, ``file://`` or a plain path).
        storage_options: Passed to the fsspec filesystem of each protocol. Never logged.
        format: A format name to read every shard with, checked and applied by the
            :class:`FormatResolver` at listing; None: the resolver tells it per file from
            the file's name.
        retry: How listings, opens and reads retry transient store faults, and the
            timeouts of S3 and HTTP requests (default: :class:`RetryPolicy`'s).
        cache: Keep whole shards of remote stores in a node-local directory under a byte
            bound (:mod:`ingest.storage.cache`); None reads every time from the store.

    Raises:
        ConfigError: If two ``s3://`` URLs carry different credentials, or an
            ``endpoint_url`` (or ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``) has no
            scheme.
    """

    def __init__(
        self,
        urls: URLs,
        *,
        storage_options: Mapping[str, Any] | None = None,
        format: str | None = None,
        retry: RetryPolicy | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        self.urls = as_urls(urls)
        if not self.urls:
            raise ConfigError("a Source needs at least one URL; got an empty list")
        self.format = format
        self.retry = retry or RetryPolicy()
        self.cache = cache
        self._shard_cache: ShardCache | None = None
        self._options = dict(storage_options or {})
        self._secrets = url_secrets(self.urls) + option_secrets(self._options)
        self._userinfo = s3_userinfo(self.urls)
        check_endpoint(self.urls, self._options, os.environ)
        # Listed URL (secrets shown as ***) -> the URL to open, for URLs whose secrets are
        # part of the request (HTTP user or query).
        self._hidden = {redact(u): u for u in self.urls if redact(u) != u}
        self._filesystems: dict[str, fsspec.AbstractFileSystem] = {}
        self._fs_lock = threading.Lock()
        self._delta_commits: dict[str, dict[int, bytes]] = {}
        self.hub_locations: dict[str, tuple[str | None, float]] = {}
        """Where Hub resolve URLs redirect, and until when (:func:`~ingest.storage.sources.
        hubfs.located`)."""
        self.hub_lock = threading.Lock()
        self.stats = IOStats()
        self.tables: dict[str, TableVersion] = {}
        """The Delta tables the last listing found (their roots' URLs), each with the
        version listed and its schema (:mod:`ingest.storage.sources.delta`): the stream's
        schema where it lists one; a state records the versions."""

    @property
    def storage_options(self) -> dict[str, Any]:
        """A copy of the storage options (they hold credentials: never log them)."""
        return dict(self._options)

    def add_secret(self, value: str) -> None:
        """Scrub ``value`` from every message too (:meth:`scrub`): a credential that comes
        from elsewhere than the storage options or the URLs, such as the environment."""
        if value not in self._secrets:
            self._secrets = (*self._secrets, value)

    def hide(self, shown: str, real: str) -> None:
        """Open the listed URL ``shown`` (its secrets shown as ``***``) as ``real``."""
        self._hidden[shown] = real

    # -- filesystems ---------------------------------------------------------------------

    def filesystem(self, url: str) -> fsspec.AbstractFileSystem:
        """The (cached) fsspec filesystem for ``url``'s protocol."""
        protocol = get_protocol(url)
        with self._fs_lock:
            fs = self._filesystems.get(protocol)
            if fs is None:
                options = fs_options(protocol, self._options, self.retry, self._userinfo)
                try:
                    if protocol in ("s3", "s3a"):  # one attempt per call, see .s3
                        from ingest.storage.sources.s3 import s3_filesystem

                        fs = s3_filesystem(strip_userinfo(url), options)
                    elif protocol in ("gs", "gcs") and options.get("endpoint_url"):
                        # gcsfs's default filesystem first asks a bucket's storage layout
                        # over gRPC, which an emulator or a private endpoint does not serve
                        # (a 60 s wait per bucket); its core filesystem asks nothing more.
                        # On Google's own endpoint (no endpoint_url), gcsfs's default.
                        from gcsfs.core import GCSFileSystem

                        fs = GCSFileSystem(**options)
                    elif protocol in ("http", "https"):  # each GET checks the version listed
                        listed = ListedVersions()
                        client = options["client_kwargs"]
                        traces = [*client.get("trace_configs", ()), listed.trace_config()]
                        options["client_kwargs"] = {**client, "trace_configs": traces}
                        fs = watch(url_to_fs(url, **options)[0], listed)
                    else:
                        fs, _ = url_to_fs(strip_userinfo(url), **options)
                except (ImportError, ValueError) as e:
                    raise SourceError(
                        url,
                        f"no filesystem for protocol {protocol!r}: {self.scrub(str(e))}",
                        "install the fsspec backend it names, or check the URL scheme",
                    ) from None
                self._filesystems[protocol] = fs
            return fs

    def open_filesystems(self) -> None:
        """Make the filesystem of every URL's protocol now (and an S3 client: botocore's
        models, s3fs's session), sending no request; a process that will read or list
        later calls it in a background thread while it has nothing else to do. Importing
        s3fs and botocore and building the client took 0.3-0.5 s of a reader's first read
        and 0.25 s of a coordinator's listing under its lock (``benchmarks/resume.py``). A
        filesystem that cannot be made here is made again, and its error raised, by the
        call that needs it."""
        for url in self.urls:
            try:
                fs = self.filesystem(url)
                if get_protocol(url) in ("s3", "s3a"):
                    fs.connect()  # s3fs's session and client: no request
            except Exception:  # the call that needs it raises it again, naming its URL
                continue

    def shared_filesystem(
        self, name: str, make: Callable[[], fsspec.AbstractFileSystem]
    ) -> fsspec.AbstractFileSystem:
        """The source's filesystem kept under ``name``, made with ``make`` the first time
        (outside the source's lock: two threads may make one, the first kept wins)."""
        with self._fs_lock:
            fs = self._filesystems.get(name)
        if fs is not None:
            return fs
        made = make()
        with self._fs_lock:
            return self._filesystems.setdefault(name, made)

    def policy(self, url: str) -> RetryPolicy | None:
        """The retry policy for ``url``: none for local files."""
        return None if get_protocol(url) in _LOCAL_PROTOCOLS else self.retry

    def scrub(self, text: str) -> str:
        """Remove secret storage-option values and URL credentials from ``text``."""
        for name in SECRET_OPTION_NAMES:
            value = self._options.get(name)
            if isinstance(value, str) and len(value) >= 4:
                text = text.replace(value, "***")
        text = redact(text)
        for value in self._secrets:
            text = text.replace(value, "***")
        return text

    # -- listing -------------------------------------------------------------------------

    def list_shards(
        self,
        formats: FormatResolver,
        listings: ListingStore | None = None,
        at: Mapping[str, Sequence[int]] | None = None,
        since: Mapping[str, int] | None = None,
        commits: Mapping[str, str] | None = None,
    ) -> list[Shard]:
        """List every URL once and return the shards, sorted by URL, without duplicates.

        Shard URLs hold no credentials (see the class docstring). An ``hf://`` URL is
        pinned to the commit its revision names now (:mod:`ingest.storage.hub`).

        Args:
            formats: Tells which listed files are data and the format of each (the format
                registry: :data:`ingest.formats.FORMAT_RESOLVER`).
            listings: Where listings at a commit are kept across jobs (the shard index);
                one found there is not listed again.
            at: Delta tables' versions, by their roots' URLs (a state's): those tables'
                files are those of these versions (the rest of a resumed epoch reads the
                files it was saved on, though a compaction since replaced them).
            since: Followed Delta tables' first versions, by their roots' URLs: those
                tables' files are those of that version and those appended since
                (:func:`ingest.storage.sources.delta.snapshot`).
            commits: Hub repositories' commits by their URLs (``hf://datasets/<org>/<name>``;
                a state's): an ``hf://`` URL of one is listed at its commit, not at the one
                its revision names now (the rest of a resumed epoch reads the files it was
                saved on, though commits were pushed since).

        Raises:
            SourceError: If a URL matches nothing, its bucket does not exist, the
                credentials are refused or the store cannot be reached within the
                :class:`RetryPolicy` deadline; or a Delta table's log no longer holds the
                version ``at`` pins, or a file of it.
            ConfigError: If :attr:`format` names no format, or a file named explicitly has
                no known format.
        """
        # A listing is of the store now: s3fs and gcsfs keep directory listings, and a
        # shard written since the last listing would be listed but refused by open().
        for fs in {id(fs): fs for fs in map(self.filesystem, self.urls)}.values():
            fs.invalidate_cache()

        def one(url: str) -> tuple[list[Shard], dict[str, TableVersion]]:
            tables: dict[str, TableVersion] = {}
            return list_url(self, url, formats, listings, tables, at, since, commits), tables

        found: dict[str, Shard] = {}
        tables: dict[str, TableVersion] = {}
        for shards, more in _side_by_side(one, self.urls):
            tables.update(more)
            for shard in shards:
                found.setdefault(shard.url, shard)
        self.tables = tables
        gone = {u for t in tables.values() for u in t.vacuumed}  # listed from a Delta log
        warn_unversioned(self.urls, found.values(), gone)
        return [found[u] for u in sorted(found)]

    # -- opening -------------------------------------------------------------------------

    def delta_commits(self, table: str) -> dict[int, bytes]:
        """The commits of the followed Delta table at root URL ``table`` read so far, by
        version (a commit file is never rewritten): each round reads only the new ones."""
        with self._fs_lock:
            return self._delta_commits.setdefault(table, {})

    def fs_path(self, shard: Shard) -> tuple[fsspec.AbstractFileSystem, str]:
        """The filesystem that reads ``shard`` from its store, and its path there: for a Hub
        file the Hub's resolve URL, or the CDN URL it redirects to (asked the first time,
        a request: call it where a failed request is retried)."""
        if self._on_hub(shard):  # plain range requests at the commit (ingest.storage.hub)
            url = self._hub_url(shard)
            cdn = located(self, url)  # where the Hub redirects it: asked once
            return (hub_http(self), url) if cdn is None else (hub_cdn(self), cdn)
        real = self._hidden.get(shard.url, shard.url)
        fs = self.filesystem(real)
        path = fs._strip_protocol(real)
        listed = listed_versions(fs)
        if listed is not None and not shard.members:  # see ingest.storage.sources.http_versions
            listed.expect(path, shard.version, shard.size)
        return fs, path

    def _hub_url(self, shard: Shard) -> str:
        """A Hub shard's resolve URL at its commit (:mod:`ingest.storage.hub`)."""
        real = self._hidden.get(shard.url, shard.url)
        return hub.parse(real).resolve_url(hub.endpoint_of(self._options))

    def _signed(self, shard: Shard, raw: IO[bytes]) -> IO[bytes]:
        """``raw``, a file of ``shard`` just opened: where it is read at a signed CDN URL (a
        Hub file), one whose reads ask for a new URL once it expired (:func:`signed`)."""
        return signed(raw, self, self._hub_url(shard)) if self._on_hub(shard) else raw

    def _on_hub(self, shard: Shard) -> bool:
        return bool(get_protocol(self._hidden.get(shard.url, shard.url)) == "hf")

    def open(
        self, shard: Shard, *, block_size: int | None = None, part: bool = False
    ) -> CountingFile:
        """Open ``shard`` for reading; every read call is counted in :attr:`stats`.

        ``block_size`` None opens without a read-ahead cache, for readers that ask for exact
        ranges themselves (parquet pre-buffering, Arrow IPC); otherwise reads go through a
        read-ahead buffer of that many bytes. Reads are retried under :attr:`retry`.

        With a shard cache (``cache``), the shard is read from the node's copy, fetched
        whole first on a miss; ``part=True`` (a footer read at listing) reads the copy if
        there is one and never fetches the whole shard for it.

        Raises:
            SourceError: If the shard is gone.
            StoreError: If the store still fails at the retry deadline.
        """
        cached = open_cached(self, shard, fetch=not part)
        if cached is not None:
            return cached
        kwargs: dict[str, Any] = {"size": shard.size}
        if block_size is None:
            kwargs["cache_type"] = "none"
        else:
            kwargs.update(cache_type="readahead", block_size=block_size)

        def reopen() -> IO[bytes]:  # where: a Hub file's signed URL may be a new one
            self.stats.add(opens=1)
            return self._file(shard, **kwargs)

        def whole() -> bytes:  # for a server that ignores Range (small shards only)
            fs, path = self.fs_path(shard)
            return bytes(fs.cat_file(path))

        return self._counting(shard, reopen, self.stats, whole)

    def _file(self, shard: Shard, **kwargs: Any) -> IO[bytes]:
        """``shard`` opened on its store with fsspec's ``kwargs``, told what the listing saw
        of it (its ETag: no HEAD before the first read), at its signed URL where it is a Hub
        file's (asked for again once it expired)."""
        fs, path = self.fs_path(shard)
        raw = with_listed_details(fs.open(path, "rb", **kwargs), path, shard)
        return self._signed(shard, raw)

    def _counting(
        self,
        shard: Shard,
        reopen: Callable[[], IO[bytes]],
        stats: IOStats | None,
        whole: Callable[[], bytes] | None = None,
    ) -> CountingFile:
        policy = self.policy(shard.url)
        try:
            raw = attempt(reopen, policy, self.stats)
        except GaveUpError as gave_up:
            raise self.read_error(
                shard,
                gave_up,
                "cannot be opened",
                "check the credentials, the store and the network",
            ) from None
        return CountingFile(
            raw,
            reopen,
            stats,
            shard.size,
            shard.url,
            self.scrub,
            policy,
            self.endpoint(shard),
            whole,
        )

    def read_bytes(self, url: str, start: int, stop: int, what: str) -> bytes:
        """Bytes ``[start, stop)`` of ``url``, a file that is no shard (a Delta deletion
        vector's): one request, retried, counted.

        Raises:
            SourceError: If the file is gone or short (``what``: what it is, for the
                message), or the store still fails at the retry deadline.
        """
        fs = self.filesystem(url)
        path = fs._strip_protocol(strip_userinfo(url))

        def read() -> bytes:
            return bytes(fs.cat_file(path, start=start, end=stop))

        try:
            data = attempt(read, self.policy(url), self.stats)
        except GaveUpError as gave_up:
            if is_not_found(gave_up.last):
                raise SourceError(
                    url,
                    f"is not on the store, and it holds {what}",
                    "restore the file (VACUUM removes files a version still names when its "
                    "retention is shorter than a reader's lag), or read a newer version",
                ) from None
            raise store_error(
                url,
                f"cannot read {what} (bytes {start} to {stop})",
                gave_up,
                "check that the file is on the store (the table's writer wrote it) and that "
                "the credentials may read it",
                endpoint=self.endpoint(url),
                scrub=self.scrub,
                byte=start,
            ) from None
        self.stats.add(opens=1, reads=1, bytes_read=len(data))
        if len(data) != stop - start:
            raise SourceError(
                url,
                f"holds {len(data)} bytes from byte {start}: {what} is {stop - start}",
                "check that the file is whole (the table's writer wrote it)",
            )
        return data

    def read_error(
        self, shard: Shard, gave_up: GaveUpError, what: str, fix: str, byte: int = 0
    ) -> SourceError | StoreError:
        """The error of a shard read that still failed at the retry deadline (see
        :func:`store_error`)."""
        return store_error(
            shard.url,
            what,
            gave_up,
            fix,
            endpoint=self.endpoint(shard),
            scrub=self.scrub,
            byte=byte,
        )

    def endpoint(self, shard: Shard | str) -> str:
        """Where the requests for a shard (or a URL) go, for messages: credentials hidden."""
        url = shard.url if isinstance(shard, Shard) else shard
        real = self._hidden.get(url, url)
        protocol = get_protocol(real)
        client = self._options.get("client_kwargs")
        configured = client.get("endpoint_url") if isinstance(client, Mapping) else None
        if protocol == "hf":
            where = hub.endpoint_of(self._options)
        elif protocol in ("http", "https"):
            parts = urlsplit(real)
            where = f"{parts.scheme}://{parts.netloc}"
        else:
            where = configured or self._options.get("endpoint_url") or f"{protocol}:// (default)"
        return self.scrub(str(where))

    def local_path(self, shard: Shard) -> str | None:
        """The shard's path when it is a file on this machine's disks, read in place (not a
        remote shard's cached copy); None otherwise.

        A format may read such a file natively (pyarrow's own file, which calls no Python
        per read) instead of through :meth:`open`. It then counts its opens, reads and bytes
        in :attr:`stats` itself, and a file that cannot be opened, or whose size is no longer
        the listed one, is opened with :meth:`open` instead, which names the error."""
        if self.caches(shard) or shard.members or self._on_hub(shard):
            return None
        fs, path = self.fs_path(shard)
        return path if is_local(fs) else None

    def read_as_listed(self, shard: Shard, read: Callable[[], T]) -> T:
        """``read()``, something read of ``shard`` (its inspection, its index), refused
        where ``shard`` is a local file no longer as listed once it is read (see
        :func:`~ingest.storage.sources.files.as_listed`): else it is kept under the listed
        version's name. A remote shard's reads name the version listed themselves.

        Raises:
            SourceError: Naming the file, its listed and present size and modification time.
        """
        path = self.local_path(shard)
        return read() if path is None else as_listed(shard, path, read)

    def fetches_ranges(self, shard: Shard) -> bool:
        """Whether the shard's store serves many byte ranges concurrently (async fsspec),
        and the shard is not one for the node's cache (whose copy :meth:`open` reads)."""
        if self.caches(shard):
            return False
        if self._on_hub(shard):
            return True  # aiohttp's, at the Hub or its CDN (fs_path would ask which)
        return bool(getattr(self.fs_path(shard)[0], "async_impl", False))

    # -- the node-local shard cache --------------------------------------------------------

    def caches(self, shard: Shard) -> bool:
        """Whether ``shard`` is read through the node's shard cache (a remote shard within
        the cache's bound, with a cache)."""
        if self.cache is None or shard.size > self.cache.max_bytes:
            return False
        return self._remote(shard)

    def count_past_cache(self, shard: Shard) -> None:
        """Count an open of ``shard`` read from its store because it is larger than the
        cache's bound (``cache_bypassed``, as one the cache cannot make room for)."""
        if self.cache is not None and shard.size > self.cache.max_bytes and self._remote(shard):
            self.stats.add(cache_bypassed=1)

    def _remote(self, shard: Shard) -> bool:
        """Whether ``shard`` is not on this machine's disks (a cache may hold a copy)."""
        return get_protocol(self._hidden.get(shard.url, shard.url)) not in _LOCAL_PROTOCOLS

    def node_cache(self) -> ShardCache:
        """The node's shard cache (:mod:`ingest.storage.cache`), opened on first use; only
        with a ``cache``."""
        assert self.cache is not None
        with self._fs_lock:
            if self._shard_cache is None:
                self._shard_cache = ShardCache(self.cache)
            return self._shard_cache

    def drop_cached(self, shard: Shard) -> bool:
        """Delete the node's cached copy of ``shard``, one that failed to read, so that the
        next :meth:`open` fetches it again (see :mod:`ingest.storage.cache`). Whether there was
        one."""
        return self.caches(shard) and self.node_cache().drop(shard.url, shard.size, shard.version)

    # -- reading ranges ----------------------------------------------------------------------

    def fetch_ranges(
        self,
        shard: Shard,
        starts: list[int],
        ends: list[int],
        known: Mapping[tuple[int, int], bytes] | None = None,
    ) -> CountingFile:
        """Fetch byte ranges concurrently and open the shard with exactly those bytes known,
        and ``known``'s (``{(start, end): bytes}``, read before: not fetched again).

        Any other read is fetched, one request each (:class:`KnownParts`: fsspec's
        ``parts`` cache zero-fills them). Uses fsspec's ``cat_ranges``. Ranges that fail or
        come back short are fetched again under :attr:`retry` (one deadline for the call).

        Raises:
            StoreError: If a range still fails at the retry deadline, naming the range.
        """
        ends = [min(e, shard.size) for e in ends]
        blobs: dict[int, bytes] = {}
        sent = received = 0

        def missing() -> list[int]:
            nonlocal sent, received
            todo = [n for n in range(len(starts)) if n not in blobs]
            sent += len(todo)
            got = self._cat_ranges(shard, [starts[n] for n in todo], [ends[n] for n in todo])
            failed: BaseException | None = None
            for n, blob in zip(todo, got, strict=True):
                if not isinstance(blob, BaseException):
                    received += len(blob)
                    blob = self._ranged(shard, blob, starts[n], ends[n])
                if isinstance(blob, BaseException):
                    failed = _worst(failed, blob)
                elif len(blob) != ends[n] - starts[n]:
                    failed = _worst(failed, ShortBodyError(_short(starts[n], ends[n], len(blob))))
                else:
                    blobs[n] = blob
            if failed is not None:
                raise failed
            return todo

        try:
            attempt(missing, self.policy(shard.url), self.stats)
        except GaveUpError as gave_up:
            n = next(n for n in range(len(starts)) if n not in blobs)
            raise self.read_error(
                shard,
                gave_up,
                f"range read of bytes [{starts[n]}, {ends[n]}) failed",
                "check the store and the network; the deadline, timeouts and backoff are "
                "set with ReadOptions(retry=ingest.RetryPolicy(...))",
                byte=starts[n],
            ) from None
        self.stats.add(reads=sent, bytes_read=received)
        parts = {**(known or {}), **{(starts[n], ends[n]): blobs[n] for n in range(len(starts))}}

        def missed(received: int) -> None:
            self.stats.add(reads=1, bytes_read=received)

        def reopen() -> IO[bytes]:  # the parts anew: fsspec's cache takes them from its dict
            options = {"data": dict(parts), "on_miss": missed}
            return self._file(
                shard, size=shard.size, cache_type=KnownParts.name, cache_options=options
            )

        # Reads inside the ranges are served from memory (the fetch above is what was sent);
        # the cache counts the others, each one request (``missed``).
        return self._counting(shard, reopen, None)

    def _cat_ranges(self, shard: Shard, starts: list[int], ends: list[int]) -> list[Any]:
        """Each range's bytes, or the error that failed it (fsspec's ``cat_ranges``); a Hub
        file's ranges at its signed URL, asked for again (:func:`located`) where it expired
        since the last call (:func:`expired`: a transient error)."""
        try:
            fs, path = self.fs_path(shard)
            # An S3 object's ranges name the version listed (see with_listed_details).
            etag = listed_etag(shard) if _names_versions(fs) else None
            options = {} if etag is None else {"if_match": etag}
            got: list[Any] = fs.cat_ranges([path] * len(starts), starts, ends, **options)
        except Exception as e:
            got = [e] * len(starts)
        if not self._on_hub(shard):
            return got
        url = self._hub_url(shard)
        return [expired(self, url, g) if isinstance(g, BaseException) else g for g in got]

    def _ranged(self, shard: Shard, blob: bytes, start: int, end: int) -> bytes:
        """The bytes ``[start, end)`` of a response to their range request: ``blob``, or its
        slice where the server ignored the range and sent the whole file (a small shard;
        see :func:`~ingest.storage.sources.files.range_ignored`).

        Raises:
            StoreError: At once, for a larger shard whose server ignores ``Range``.
        """
        if len(blob) <= end - start or len(blob) != shard.size:
            return blob
        said = range_ignored(shard.url, self.endpoint(shard), shard.size, start, end)
        if isinstance(said, StoreError):
            raise said
        warnings.warn(said, stacklevel=6)
        return blob[start:end]

    def __getstate__(self) -> dict[str, Any]:
        skip = (
            "_filesystems",
            "_fs_lock",
            "stats",
            "_shard_cache",
            "_delta_commits",
            "hub_locations",
            "hub_lock",
        )
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stats = IOStats()
        self._filesystems = {}
        self._fs_lock = threading.Lock()
        self._shard_cache = None
        self._delta_commits = {}
        self.hub_locations = {}
        self.hub_lock = threading.Lock()


def _short(start: int, end: int, got: int) -> str:
    return f"the response to bytes [{start}, {end}) held {got} of {end - start} bytes"


def _worst(kept: BaseException | None, new: BaseException) -> BaseException:
    """The error to act on among a call's failures: a permanent one wins."""
    return new if kept is None or not is_transient(new) else kept


T = TypeVar("T")


def _side_by_side(list_one: Callable[[str], T], urls: Sequence[str]) -> list[T]:
    """``list_one`` of every URL, in their order, up to :func:`requests_at_once` at once:
    a list of shard URLs (``data_files=[...]``, an index file's lines) is a request each,
    and one after another 64 of them on a store 50 ms away took 3.7 s at every listing
    (0.1 s for the directory that holds them). The first URL's error in order is raised,
    once the URLs listing then have answered."""
    if len(urls) < 2:
        return [list_one(url) for url in urls]
    threads = min(requests_at_once(urls), len(urls))
    with ThreadPoolExecutor(threads, thread_name_prefix="ingest-listing") as pool:
        return list(pool.map(list_one, urls))
