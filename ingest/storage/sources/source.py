"""Sources: fsspec URLs and globs -> one listing of shards.

A :class:`Source` lists its URLs once per call of :meth:`Source.list_shards` (the stream
calls it once per epoch), opens shards for the format readers, and counts what it asks of
the store (:class:`IOStats`). It never reads data itself, and it knows no formats: which
listed files are data, and which format reads each, is asked of a :class:`FormatResolver`
that the caller hands to :meth:`Source.list_shards` (the format registry is one). Formats
import sources, never the other way round.
"""

from __future__ import annotations

import email.utils
import errno
import os
import posixpath
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from glob import has_magic
from typing import IO, Any, NoReturn, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import fsspec
from fsspec.callbacks import TqdmCallback
from fsspec.core import url_to_fs
from fsspec.utils import get_protocol

from ingest.core.errors import ConfigError, NoShardsError, SourceError, StoreError, redact
from ingest.storage import hub
from ingest.storage.cache import CacheEvent, CacheOptions, ShardCache

_T = TypeVar("_T")
# Statuses worth another attempt: throttling (429, 503 SlowDown), server faults, timeouts.
_TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Errors that no retry mends: the object, the bucket or the permission is not there.
_PERMANENT_ERRORS = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)
_LOCAL_PROTOCOLS = frozenset({"file", "local"})
# HTTP answers for an object that is not there (any more).
_GONE_STATUSES = frozenset({404, 410})
# A local disk that cannot take a fetch into the shard cache: no retry mends it.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# A query string at the end of a path (``?token=...``, ``?versionId=...``): not a glob.
_QUERY_TAIL = re.compile(r"\?[^/?=]+=.*$")
# Packages whose exceptions mean "the store failed", whatever their class: botocore's
# EndpointConnectionError and aiohttp's errors are not OSErrors.
_STORE_ERROR_PACKAGES = frozenset(
    {
        "botocore",
        "aiobotocore",
        "aiohttp",
        "requests",
        "urllib3",
        "huggingface_hub",
        "google",
        "gcsfs",
        "adlfs",
        "azure",
        "s3fs",
        "fsspec",
    }
)
_SECRET_OPTION_NAMES = (
    "key",
    "secret",
    "token",
    "password",
    "aws_secret_access_key",
    "aws_access_key_id",
    "aws_session_token",
)


@dataclass(frozen=True, slots=True)
class Shard:
    """One file of the dataset, as one listing saw it.

    Attributes:
        url: Full URL with protocol (``s3://bucket/a.parquet``, ``file:///data/a.jsonl``).
        size: Size in bytes.
        version: ETag (object stores) or modification time (file systems): what tells a
            changed object from the one a state was saved against. Empty if the store gives
            neither.
        format: Registry name of the format that reads it.
        members: The files of a work unit of a folder dataset (:mod:`ingest.formats.folder`),
            each one row; empty for a file. A unit's size is theirs added up, its version a
            hash of theirs, and its URL its first member's with ``+N`` (the N after it).
        labels: The class index of each member (folder datasets).
    """

    url: str
    size: int
    version: str
    format: str
    members: tuple[Shard, ...] = ()
    labels: tuple[int, ...] = ()


class FormatResolver(Protocol):
    """Which listed files are data, and the name of the format that reads each one.

    A :class:`Source` lists files and knows no formats; the format registry implements this
    (:data:`ingest.formats.FORMAT_RESOLVER`) and is handed to :meth:`Source.list_shards`.
    """

    def format_of(self, path: str, *, chosen: str | None, explicit: bool) -> str | None:
        """The name of the format that reads ``path``, or None to leave the file out.

        Args:
            path: A listed file.
            chosen: The format the user named for every file (checked, then used), or None
                to tell it from the file's name.
            explicit: Whether the user named this very file rather than a glob or a
                directory; a file that no format reads is then an error, not left out.

        Raises:
            ConfigError: If ``chosen`` names no format, or ``explicit`` and no format reads
                the file.
        """
        ...

    def describe(self) -> str:
        """Which files it takes as data, for the fix of a listing that matched none."""
        ...


class ListingStore(Protocol):
    """Keeps listings that never change (an ``hf://`` glob at a commit) across jobs; the
    shard index implements it (:class:`ingest.IndexStore`)."""

    def get_listing(self, key: str) -> list[tuple[str, int, str]] | None:
        """The files ``(name, size, version)`` stored under ``key``, or None."""
        ...

    def put_listing(self, key: str, files: Sequence[tuple[str, int, str]]) -> None:
        """Store the files of the listing ``key``."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a source retries what the store gets wrong: one deadline per request.

    A request (a listing, an open, one read, one batch of range reads) is tried again after
    a transient fault (503 SlowDown, 500, 429, a dropped or refused connection, a body cut
    short, a timeout) until it succeeds or ``deadline_s`` has passed since its first
    attempt. Waits between attempts grow exponentially with jitter, or follow the store's
    ``Retry-After``.
    This is the only retry layer: botocore's and s3fs's own retries are turned off, so
    retries never stack. Each S3 or HTTP attempt waits at most ``connect_timeout_s`` to
    connect and ``read_timeout_s`` for the next bytes (unless ``storage_options`` set them),
    so a request that keeps failing, or an endpoint that accepts connections and never
    answers, fails within ``deadline_s + read_timeout_s``: 30 s with the defaults; a refused
    connection is reported as one, naming the endpoint. Missing objects (S3's NoSuchKey, an
    HTTP 404 or 410), refused credentials and a full local disk (the shard cache's) fail at
    once; local files are not retried.

    Attributes:
        deadline_s: No new attempt starts this long after the first.
        connect_timeout_s: Longest wait for a connection (S3, HTTP).
        read_timeout_s: Longest wait for the next bytes of a response (S3, HTTP).
        backoff_s: The most to wait before the first retry; doubled for each retry after
            it. The wait is a uniform draw between 0 and that ("full jitter", as the AWS
            SDKs do: clients that failed together do not retry together, and a lone fault
            costs half the bound on average).
        max_backoff_s: Longest wait between two attempts, Retry-After aside.
    """

    deadline_s: float = 20.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("deadline_s", "connect_timeout_s", "read_timeout_s", "max_backoff_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0 seconds")
        if not 0 < self.backoff_s <= self.max_backoff_s:
            raise ConfigError(
                f"backoff_s={self.backoff_s} must be > 0 and <= max_backoff_s={self.max_backoff_s}"
            )

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based), jittered."""
        cap = min(self.max_backoff_s, self.backoff_s * 2.0 ** min(retry, 30))
        return random.uniform(0.0, cap)


@dataclass(slots=True)
class IOStats:
    """Counts of what a stream asked of its stores, and of its node-local cache. Thread-safe.

    ``retries`` counts attempts made again after a transient fault (:class:`RetryPolicy`).
    ``cache_*`` count shard opens served from the node's shard cache (``cache_hits``, the
    bytes they held in ``cache_hit_bytes``), opens that fetched the shard into it
    (``cache_misses``, ``cache_fetched_bytes``), copies evicted to make room
    (``cache_evicted_bytes``) and opens that read from the store because the shard could not
    be cached (``cache_bypassed``): see :mod:`ingest.storage.cache`.
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


def is_store_error(error: BaseException) -> bool:
    """Whether ``error`` comes from the store or the network rather than from our code."""
    if isinstance(error, OSError | TimeoutError):
        return True
    return type(error).__module__.split(".")[0] in _STORE_ERROR_PACKAGES


class _ShortBodyError(OSError):
    """A response ended before the bytes asked for: never handed on as data."""


class _GaveUpError(Exception):
    """A request still failed at its deadline (or failed for good): what the caller reports."""

    def __init__(self, last: BaseException, retries: int, elapsed: float) -> None:
        super().__init__(str(last))
        self.last = last
        self.retries = retries
        self.elapsed = elapsed

    def describe(self, scrub: Callable[[str], str]) -> str:
        """``"after N retries in S s: Error: message"``."""
        return (
            f"after {self.retries} retries in {self.elapsed:.1f} s: "
            f"{type(self.last).__name__}: {scrub(str(self.last))}"
        )


def _vanished(url: str, gave_up: _GaveUpError) -> SourceError | None:
    """The error for a listed object that is gone, if that is why a request failed: a
    ``FileNotFoundError`` (S3's NoSuchKey), or an HTTP 404 or 410 (an HTTP server, the Hub)."""
    if not _not_found(gave_up.last):
        return None
    return SourceError(
        url,
        "disappeared after it was listed",
        "the dataset changed under the stream; restart the epoch or restore the object",
    )


_REFUSED_FIX = (
    "check that the store runs at that address and port, and the endpoint in storage_options "
    "(client_kwargs.endpoint_url for S3, endpoint for the Hub) or in the URL"
)


def _store_error(
    url: str,
    what: str,
    gave_up: _GaveUpError,
    fix: str,
    *,
    endpoint: str,
    scrub: Callable[[str], str],
    byte: int = 0,
) -> SourceError | StoreError:
    """The error of a shard request that still failed at the retry deadline: the shard is
    gone (:class:`SourceError`), or the store did not answer (:class:`StoreError`), saying so
    when the endpoint refused the connection."""
    gone = _vanished(url, gave_up)
    if gone is not None:
        return gone
    if _refused(gave_up.last) is not None:
        what, fix = f"{what}: the endpoint {endpoint} refused the connection", _REFUSED_FIX
    return StoreError(url, f"{what} {gave_up.describe(scrub)}", fix, byte=byte)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and its causes, outermost first."""
    seen: list[BaseException] = []
    node: BaseException | None = error
    while node is not None and all(node is not e for e in seen) and len(seen) < 8:
        seen.append(node)
        node = node.__cause__ or node.__context__
    return seen


def _http_status(error: BaseException) -> tuple[int | None, Mapping[str, Any]]:
    """The HTTP status and headers of a failed response somewhere in ``error``'s chain."""
    for e in _chain(error):
        response = getattr(e, "response", None)
        if isinstance(response, Mapping):  # botocore ClientError
            meta = response.get("ResponseMetadata", {})
            if "HTTPStatusCode" in meta:
                return int(meta["HTTPStatusCode"]), meta.get("HTTPHeaders", {})
        status = getattr(e, "status", None)  # aiohttp ClientResponseError
        if isinstance(status, int):
            return status, getattr(e, "headers", None) or {}
        code = getattr(response, "status_code", None)  # requests, huggingface_hub
        if isinstance(code, int):
            return code, getattr(response, "headers", None) or {}
    return None, {}


def _not_found(error: BaseException) -> bool:
    """Whether ``error`` says the object is not there; not a connection that failed, which
    fsspec's HTTP filesystem reports as a ``FileNotFoundError`` too."""
    if _refused(error) is not None:
        return False
    return isinstance(error, FileNotFoundError) or _http_status(error)[0] in _GONE_STATUSES


def _refused(error: BaseException) -> BaseException | None:
    """The refused connection somewhere in ``error``'s chain (nothing listens at the
    endpoint's port), or None. aiohttp keeps it as ``os_error``, urllib3 as the cause."""
    for e in _chain(error):
        for candidate in (e, getattr(e, "os_error", None)):
            if isinstance(candidate, ConnectionRefusedError):
                return e
    return None


def _transient(error: BaseException) -> bool:
    """Whether another attempt may succeed where ``error`` failed: a refused connection may
    (a store restarting), a missing object or a full local disk may not."""
    if _refused(error) is not None:
        return True
    if isinstance(error, _PERMANENT_ERRORS) or not is_store_error(error):
        return False
    if isinstance(error, OSError) and error.errno in _DISK_FULL:
        return False
    status, _ = _http_status(error)
    return status is None or status in _TRANSIENT_STATUSES or status >= 500


def _retry_after(error: BaseException) -> float | None:
    """Seconds the store asked to wait (``Retry-After``: seconds or an HTTP date)."""
    _, headers = _http_status(error)
    value = next((str(v) for k, v in headers.items() if k.lower() == "retry-after"), None)
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _attempt(call: Callable[[], _T], policy: RetryPolicy | None, stats: IOStats | None) -> _T:
    """Run ``call`` until it succeeds, retrying transient store faults under one deadline.

    Raises:
        _GaveUpError: If it failed for good, or still failed when the next attempt would start
            past the deadline (``policy`` None: no retries).
        Exception: Whatever ``call`` raised that is not a store error.
    """
    start = time.monotonic()
    retries = 0
    while True:
        try:
            return call()
        except Exception as e:
            if not is_store_error(e):
                raise
            elapsed = time.monotonic() - start
            if policy is None or not _transient(e):
                raise _GaveUpError(e, retries, elapsed) from e
            wait = _retry_after(e)
            wait = policy.backoff(retries) if wait is None else wait
            if elapsed + wait >= policy.deadline_s:
                raise _GaveUpError(e, retries, elapsed) from e
            retries += 1
            if stats is not None:
                stats.add(retries=1)
            time.sleep(wait)


def _s3fs_no_sleep_after_the_last_attempt() -> None:
    """Make s3fs raise at once when its only attempt fails (``retries=1``).

    s3fs's retry loop (``s3fs.core._error_wrapper``) sleeps 0.1 s after a failed attempt
    before it checks whether another follows, so with one attempt every transient fault cost
    that sleep on top of this source's own backoff: 0.13 s per failed call, two thirds of
    the cost of faults in benchmarks/storage_faults.py. There is no option for it; for
    ``retries == 1`` this runs the attempt itself and raises what s3fs would (its
    ``translate_boto_error``), and leaves every other case to s3fs.
    """
    import s3fs.core
    from s3fs.errors import translate_boto_error

    original = s3fs.core._error_wrapper
    if getattr(original, "ingest_one_attempt", False):
        return

    async def one_attempt(
        func: Any, *, args: tuple[Any, ...] = (), kwargs: Any = None, retries: int
    ) -> Any:
        if retries != 1:
            return await original(func, args=args, kwargs=kwargs, retries=retries)
        try:
            return await func(*args, **(kwargs or {}))
        except Exception as e:
            failed = e
        if "'coroutine'" in str(failed):  # an aiobotocore internal error: s3fs digs it out

            async def again() -> Any:
                raise failed

            return await original(again, retries=1)
        # translate_boto_error sets the boto error as the cause: its response carries the
        # status and Retry-After that _attempt reads, so the chain must stay (no ``from``).
        raise translate_boto_error(failed)

    one_attempt.ingest_one_attempt = True  # type: ignore[attr-defined]
    s3fs.core._error_wrapper = one_attempt


class _CountingFile:
    """A read-only file wrapper that counts read calls and bytes into :class:`IOStats`.

    A read returns every byte asked for (up to the end of the shard) or raises: a body cut
    short, a dropped connection or a timeout is retried on a reopened file under the
    source's :class:`RetryPolicy`, and a read that still fails becomes a :class:`StoreError`
    naming the URL, the byte range and the retries.
    """

    def __init__(
        self,
        raw: IO[bytes],
        reopen: Callable[[], IO[bytes]],
        stats: IOStats | None,
        size: int,
        url: str,
        scrub: Callable[[str], str],
        policy: RetryPolicy | None,
        endpoint: str = "",
    ) -> None:
        self._reopen = reopen
        self._endpoint = endpoint
        self._raw = raw
        self._stats = stats
        self._url = url
        self._scrub = scrub
        self._policy = policy
        self._pos = 0
        self._broken = False
        self.size = size
        self.closed = False

    def _read_exactly(self, pos: int, want: int) -> bytes:
        if self._broken:
            self._raw.close()
            self._raw = self._reopen()
            self._broken = False
        try:
            if self._raw.tell() != pos:
                self._raw.seek(pos)
            data = self._raw.read(want)
        except Exception:
            self._broken = True
            raise
        if len(data) != want:
            self._broken = True
            raise _ShortBodyError(f"the response held {len(data)} of the {want} bytes asked for")
        return data

    def read(self, n: int | None = -1) -> bytes:
        pos = self._pos
        want = self.size - pos if n is None or n < 0 else min(n, self.size - pos)
        if want <= 0:
            return b""
        try:
            data = _attempt(lambda: self._read_exactly(pos, want), self._policy, self._stats)
        except _GaveUpError as e:
            raise _store_error(
                self._url,
                f"read of bytes [{pos}, {pos + want}) failed",
                e,
                "check the store and the network; the deadline, timeouts and backoff are "
                "set with ReadOptions(retry=ingest.RetryPolicy(...))",
                endpoint=self._endpoint,
                scrub=self._scrub,
                byte=pos,
            ) from None
        self._pos = pos + len(data)
        if self._stats is not None:
            self._stats.add(reads=1, bytes_read=len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}.get(whence)
        if base is None:
            raise ValueError(f"whence={whence} is not 0, 1 or 2")
        if base + offset < 0:
            raise ValueError(f"cannot seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._raw.close()

    def __enter__(self) -> _CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``KEY=VALUE`` strings into storage options.

    Dotted keys nest (``client_kwargs.endpoint_url=http://...``); ``true``/``false``,
    integers and floats become Python values.

    Raises:
        ConfigError: If an item has no ``=``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"storage option {pair!r} is not KEY=VALUE; "
                "write e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000"
            )
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    continue
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


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
        ConfigError: If two ``s3://`` URLs carry different credentials.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        format: str | None = None,
        retry: RetryPolicy | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        self.urls: tuple[str, ...] = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ConfigError("a Source needs at least one URL; got an empty list")
        self.format = format
        self.retry = retry or RetryPolicy()
        self.cache = cache
        self._shard_cache: ShardCache | None = None
        self._options = dict(storage_options or {})
        self._secrets = _url_secrets(self.urls)
        self._userinfo = _s3_userinfo(self.urls)
        # Listed URL (secrets shown as ***) -> the URL to open, for URLs whose secrets are
        # part of the request (HTTP user or query).
        self._hidden = {redact(u): u for u in self.urls if redact(u) != u}
        self._filesystems: dict[str, fsspec.AbstractFileSystem] = {}
        self._fs_lock = threading.Lock()
        self.stats = IOStats()

    # -- filesystems ---------------------------------------------------------------------

    def filesystem(self, url: str) -> fsspec.AbstractFileSystem:
        """The (cached) fsspec filesystem for ``url``'s protocol."""
        protocol = get_protocol(url)
        with self._fs_lock:
            fs = self._filesystems.get(protocol)
            if fs is None:
                options = self._fs_options(protocol)
                try:
                    fs, _ = url_to_fs(_strip_userinfo(url), **options)
                except (ImportError, ValueError) as e:
                    raise SourceError(
                        url,
                        f"no filesystem for protocol {protocol!r}: {self.scrub(str(e))}",
                        "install the fsspec backend it names, or check the URL scheme",
                    ) from None
                if protocol in ("s3", "s3a"):
                    fs.retries = 1  # s3fs's own retry loop: this source retries instead
                    _s3fs_no_sleep_after_the_last_attempt()
                self._filesystems[protocol] = fs
            return fs

    def _fs_options(self, protocol: str) -> dict[str, Any]:
        """Storage options with this source's timeouts, and S3 credentials from the URLs."""
        options = dict(self._options)
        policy = self.retry
        if protocol in ("s3", "s3a"):
            options["config_kwargs"] = {
                "connect_timeout": policy.connect_timeout_s,
                "read_timeout": policy.read_timeout_s,
                # One attempt per call: retries are this source's, under one deadline.
                "retries": {"total_max_attempts": 1, "mode": "standard"},
                **options.get("config_kwargs", {}),
            }
            if self._userinfo is not None and "key" not in options:
                options["key"], options["secret"] = self._userinfo
        elif protocol in ("http", "https"):
            import aiohttp

            client = dict(options.get("client_kwargs", {}))
            client.setdefault(
                "timeout",
                aiohttp.ClientTimeout(
                    sock_connect=policy.connect_timeout_s, sock_read=policy.read_timeout_s
                ),
            )
            options["client_kwargs"] = client
        return options

    def _policy(self, url: str) -> RetryPolicy | None:
        """The retry policy for ``url``: none for local files."""
        return None if get_protocol(url) in _LOCAL_PROTOCOLS else self.retry

    def scrub(self, text: str) -> str:
        """Remove secret storage-option values and URL credentials from ``text``."""
        for name in _SECRET_OPTION_NAMES:
            value = self._options.get(name)
            if isinstance(value, str) and len(value) >= 4:
                text = text.replace(value, "***")
        text = redact(text)
        for value in self._secrets:
            text = text.replace(value, "***")
        return text

    # -- listing -------------------------------------------------------------------------

    def list_shards(
        self, formats: FormatResolver, listings: ListingStore | None = None
    ) -> list[Shard]:
        """List every URL once and return the shards, sorted by URL, without duplicates.

        Shard URLs hold no credentials (see the class docstring). An ``hf://`` URL is
        pinned to the commit its revision names now (:mod:`ingest.storage.hub`).

        Args:
            formats: Tells which listed files are data and the format of each (the format
                registry: :data:`ingest.formats.FORMAT_RESOLVER`).
            listings: Where listings at a commit are kept across jobs (the shard index);
                one found there is not listed again.

        Raises:
            SourceError: If a URL matches nothing, its bucket does not exist, the
                credentials are refused or the store cannot be reached within the
                :class:`RetryPolicy` deadline.
            ConfigError: If :attr:`format` names no format, or a file named explicitly has
                no known format.
        """
        found: dict[str, Shard] = {}
        for url in self.urls:
            # A listing is of the store now: s3fs and gcsfs keep directory listings, and a
            # shard written since the last listing would be listed but refused by open().
            self.filesystem(url).invalidate_cache()
            for shard in self._list_one(url, formats, listings):
                found.setdefault(shard.url, shard)
        return [found[u] for u in sorted(found)]

    def _list_one(
        self, url: str, formats: FormatResolver, listings: ListingStore | None
    ) -> list[Shard]:
        fs = self.filesystem(url)
        key = None
        if get_protocol(url) == "hf":
            url = self._pin(url)
            key = f"{hub.endpoint_of(self._options)} {url} {self.format}"
        path = fs._strip_protocol(_strip_userinfo(url))
        stored = listings.get_listing(key) if listings is not None and key else None
        if stored is not None:
            infos: list[dict[str, Any]] = [
                {"name": name, "size": size, "ETag": version, "type": "file"}
                for name, size, version in stored
            ]
            explicit = len(infos) == 1 and infos[0]["name"] == path
        else:
            infos, explicit = self._file_infos(fs, url, path)
            if listings is not None and key:
                listings.put_listing(
                    key,
                    [
                        (str(i["name"]), int(i.get("size") or 0), _version_of(i))
                        for i in infos
                        if i.get("type", "file") == "file"
                    ],
                )
        shards: list[Shard] = []
        for info in infos:
            if info.get("type", "file") != "file":
                continue
            name = info["name"]
            if not explicit and posixpath.basename(name).startswith((".", "_")):
                continue  # _SUCCESS, .crc and other writer droppings
            fmt = formats.format_of(_without_query(name), chosen=self.format, explicit=explicit)
            if fmt is None:
                continue
            real = fs.unstrip_protocol(name)
            shown = redact(real)
            if shown != real:
                self._hidden[shown] = real
            shards.append(
                Shard(
                    url=shown,
                    size=int(info.get("size") or 0),
                    version=_version_of(info),
                    format=fmt,
                )
            )
        if not shards:
            self._raise_no_match(fs, url, path, formats)
        return shards

    def _pin(self, url: str) -> str:
        """``url`` (``hf://``) at the commit its revision names now: one request."""
        where = hub.parse(url)
        self._hub_token()  # scrubbed from the errors below

        def resolve() -> str:
            self.stats.add(listings=1)
            return hub.resolve_revision(where, self._options)

        try:
            sha = _attempt(resolve, self._policy(url), self.stats)
        except _GaveUpError as gave_up:
            refused = _refused(gave_up.last) is not None
            raise SourceError(
                url,
                f"cannot resolve revision {where.revision or 'main'!r} of {where.repo_id}"
                + (
                    f": the endpoint {self._endpoint(url)} refused the connection"
                    if refused
                    else ""
                )
                + f": {gave_up.describe(self.scrub)}",
                _REFUSED_FIX
                if refused
                else "check the repository, the revision and the token (HF_TOKEN, or "
                "storage_options={'token': ...}); a private or gated repository needs one",
            ) from None
        return where.at(sha)

    def _file_infos(
        self, fs: fsspec.AbstractFileSystem, url: str, path: str
    ) -> tuple[list[dict[str, Any]], bool]:
        """The fsspec infos ``url`` matches, and whether it named one file explicitly.

        Raises:
            SourceError: If the path does not exist, access is denied or the store fails.
        """

        def infos() -> tuple[list[dict[str, Any]], bool]:
            self.stats.add(listings=1)
            if _is_glob(path):
                return list(fs.glob(path, detail=True).values()), False
            if url.endswith("/"):
                # A directory by its name: one listing, not a HEAD and a listing to tell
                # (object stores) first. Nothing under it: the checks below say why.
                found = fs.find(path, detail=True, withdirs=False)
                if found:
                    return list(found.values()), False
            info = fs.info(path)
            if info.get("type") != "directory":
                return [info], True
            self.stats.add(listings=1)
            return list(fs.find(path, detail=True, withdirs=False).values()), False

        try:
            return _attempt(infos, self._policy(url), self.stats)
        except _GaveUpError as gave_up:
            e = gave_up.last
            if _refused(e) is not None:
                raise SourceError(
                    url,
                    f"cannot list: the endpoint {self._endpoint(url)} refused the connection "
                    f"{gave_up.describe(self.scrub)}",
                    _REFUSED_FIX,
                ) from None
            if isinstance(e, FileNotFoundError):
                raise NoShardsError(
                    url,
                    f"not found ({self.scrub(str(e)) or 'no such object'})",
                    "check the bucket and path; for object stores the bucket must "
                    "exist and be visible with these credentials",
                ) from None
            if isinstance(e, PermissionError):
                raise SourceError(
                    url,
                    f"access denied ({self.scrub(str(e))})",
                    "check the credentials in storage_options or the environment "
                    "(key/secret/token, or the profile)",
                ) from None
            raise SourceError(
                url,
                f"cannot list: {gave_up.describe(self.scrub)}",
                "check the endpoint and the network; the deadline and timeouts are set "
                "with ReadOptions(retry=ingest.RetryPolicy(...))",
            ) from None

    def _raise_no_match(
        self, fs: fsspec.AbstractFileSystem, url: str, path: str, formats: FormatResolver
    ) -> NoReturn:
        """Raise for a URL that listed no data files: a missing prefix, or no data among them.

        Raises:
            SourceError: Always.
        """
        if _is_glob(path):
            prefix = re.split(r"[*?\[]", path, maxsplit=1)[0].rsplit("/", 1)[0]
            if prefix and not fs.exists(prefix):
                raise NoShardsError(
                    url,
                    f"not found: {redact(fs.unstrip_protocol(prefix))} does not exist",
                    "check the bucket and prefix; for object stores the bucket must exist "
                    "and be visible with these credentials",
                )
        raise NoShardsError(url, "matches no data files", f"check the glob; {formats.describe()}")

    # -- opening -------------------------------------------------------------------------

    def _path(self, shard: Shard) -> tuple[fsspec.AbstractFileSystem, str]:
        real = self._hidden.get(shard.url, shard.url)
        if get_protocol(real) == "hf":  # plain range requests at the commit (ingest.storage.hub)
            return self._hub_http(), hub.parse(real).resolve_url(hub.endpoint_of(self._options))
        fs = self.filesystem(real)
        return fs, fs._strip_protocol(real)

    def _hub_token(self) -> str | None:
        """The Hub token (:func:`ingest.storage.hub.token_of`), kept among the secrets scrubbed from
        every message (it may come from the environment, not the storage options)."""
        token = hub.token_of(self._options)
        if token and token not in self._secrets:
            self._secrets = (*self._secrets, token)
        return token

    def _hub_http(self) -> fsspec.AbstractFileSystem:
        """The HTTP filesystem that reads Hub files, the token in its headers."""
        with self._fs_lock:
            fs = self._filesystems.get("hf-http")
        if fs is not None:
            return fs
        token = self._hub_token()
        options = self._fs_options("http")
        options.pop("token", None)
        options.pop("endpoint", None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        fs = fsspec.filesystem("http", headers=headers, skip_instance_cache=True, **options)
        with self._fs_lock:
            return self._filesystems.setdefault("hf-http", fs)

    def open(
        self, shard: Shard, *, block_size: int | None = None, part: bool = False
    ) -> _CountingFile:
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
        cached = self._open_cached(shard, fetch=not part)
        if cached is not None:
            return cached
        fs, path = self._path(shard)
        kwargs: dict[str, Any] = {"size": shard.size}
        if block_size is None:
            kwargs["cache_type"] = "none"
        else:
            kwargs.update(cache_type="readahead", block_size=block_size)

        def reopen() -> IO[bytes]:
            self.stats.add(opens=1)
            return _listed(fs.open(path, "rb", **kwargs), path, shard)

        return self._counting(shard, reopen, self.stats)

    def _counting(
        self, shard: Shard, reopen: Callable[[], IO[bytes]], stats: IOStats | None
    ) -> _CountingFile:
        policy = self._policy(shard.url)
        try:
            raw = _attempt(reopen, policy, self.stats)
        except _GaveUpError as gave_up:
            raise self._gave_up(
                shard,
                gave_up,
                "cannot be opened",
                "check the credentials, the store and the network",
            ) from None
        return _CountingFile(
            raw, reopen, stats, shard.size, shard.url, self.scrub, policy, self._endpoint(shard)
        )

    def _gave_up(
        self, shard: Shard, gave_up: _GaveUpError, what: str, fix: str, byte: int = 0
    ) -> SourceError | StoreError:
        """The error of a shard read that still failed at the retry deadline (see
        :func:`_store_error`)."""
        return _store_error(
            shard.url,
            what,
            gave_up,
            fix,
            endpoint=self._endpoint(shard),
            scrub=self.scrub,
            byte=byte,
        )

    def _endpoint(self, shard: Shard | str) -> str:
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

    def fetches_ranges(self, shard: Shard) -> bool:
        """Whether the shard's store serves many byte ranges concurrently (async fsspec),
        and the shard is not one for the node's cache (whose copy :meth:`open` reads)."""
        if self._caches(shard):
            return False
        return bool(getattr(self._path(shard)[0], "async_impl", False))

    # -- the node-local shard cache --------------------------------------------------------

    def _caches(self, shard: Shard) -> bool:
        if self.cache is None or shard.size > self.cache.max_bytes:
            return False
        return get_protocol(self._hidden.get(shard.url, shard.url)) not in ("file", "local")

    def _node_cache(self) -> ShardCache:
        assert self.cache is not None
        with self._fs_lock:
            if self._shard_cache is None:
                self._shard_cache = ShardCache(self.cache)
            return self._shard_cache

    def drop_cached(self, shard: Shard) -> bool:
        """Delete the node's cached copy of ``shard``, one that failed to read, so that the
        next :meth:`open` fetches it again (see :mod:`ingest.storage.cache`). Whether there was
        one."""
        return self._caches(shard) and self._node_cache().drop(shard.url, shard.size, shard.version)

    def _open_cached(self, shard: Shard, *, fetch: bool) -> _CountingFile | None:
        """The shard from the node's cache (fetched whole into it on a miss if ``fetch``),
        or None."""
        if not self._caches(shard):
            return None
        cache = self._node_cache()

        def held() -> IO[bytes] | None:
            event = CacheEvent()
            f = cache.open(
                shard.url,
                shard.size,
                shard.version,
                (lambda to: self._fetch(shard, to)) if fetch else None,
                event,
            )
            if f is None:
                self.stats.add(cache_bypassed=int(fetch))
                return None
            if event.hit:
                self.stats.add(cache_hits=1, cache_hit_bytes=shard.size)
            else:
                self.stats.add(cache_misses=1, cache_fetched_bytes=event.fetched_bytes)
            self.stats.add(cache_evicted_bytes=event.evicted_bytes)
            return f

        first = held()
        if first is None:
            return None

        def reopen() -> IO[bytes]:
            again = held()
            if again is None:
                raise OSError(f"the cached copy of {self.scrub(shard.url)} went away")
            return again

        # Reads of the copy are local: what the fetch sent is what was counted.
        return _CountingFile(first, reopen, None, shard.size, shard.url, self.scrub, None)

    def _fetch(self, shard: Shard, to: str) -> None:
        """The whole shard into the local file ``to``: one request, retried as a whole."""
        fs, path = self._path(shard)
        kwargs: dict[str, Any] = {}
        if self.cache is not None and self.cache.progress:
            bar = {"desc": f"caching {posixpath.basename(path)}", "unit": "B", "leave": False}
            kwargs["callback"] = TqdmCallback(tqdm_kwargs={**bar, "unit_scale": True})

        def get() -> None:
            self.stats.add(opens=1, reads=1)
            fs.get_file(path, to, **kwargs)

        try:
            _attempt(get, self._policy(shard.url), self.stats)
        except _GaveUpError as gave_up:
            last = gave_up.last
            if isinstance(last, OSError) and last.errno in _DISK_FULL:
                raise last from None  # the cache's disk, not the store: it reads from the store
            raise self._gave_up(
                shard,
                gave_up,
                "cannot be fetched into the shard cache",
                "check the store and the network",
            ) from None
        self.stats.add(bytes_read=os.path.getsize(to))

    def fetch_ranges(self, shard: Shard, starts: list[int], ends: list[int]) -> _CountingFile:
        """Fetch byte ranges concurrently and open the shard with exactly those bytes known.

        Reads outside the ranges still work (one request each). Uses fsspec's
        ``cat_ranges`` and its ``parts`` cache. Ranges that fail or come back short are
        fetched again under :attr:`retry` (one deadline for the whole call).

        Raises:
            StoreError: If a range still fails at the retry deadline, naming the range.
        """
        fs, path = self._path(shard)
        ends = [min(e, shard.size) for e in ends]
        blobs: dict[int, bytes] = {}
        sent = 0

        def missing() -> list[int]:
            nonlocal sent
            todo = [n for n in range(len(starts)) if n not in blobs]
            sent += len(todo)
            try:
                got: list[Any] = fs.cat_ranges(
                    [path] * len(todo), [starts[n] for n in todo], [ends[n] for n in todo]
                )
            except Exception as e:
                got = [e] * len(todo)
            failed: BaseException | None = None
            for n, blob in zip(todo, got, strict=True):
                if isinstance(blob, BaseException):
                    failed = _worst(failed, blob)
                elif len(blob) != ends[n] - starts[n]:
                    failed = _worst(failed, _ShortBodyError(_short(starts[n], ends[n], len(blob))))
                else:
                    blobs[n] = blob
            if failed is not None:
                raise failed
            return todo

        try:
            _attempt(missing, self._policy(shard.url), self.stats)
        except _GaveUpError as gave_up:
            n = next(n for n in range(len(starts)) if n not in blobs)
            raise self._gave_up(
                shard,
                gave_up,
                f"range read of bytes [{starts[n]}, {ends[n]}) failed",
                "check the store and the network; the deadline, timeouts and backoff are "
                "set with ReadOptions(retry=ingest.RetryPolicy(...))",
                byte=starts[n],
            ) from None
        self.stats.add(reads=sent, bytes_read=sum(len(b) for b in blobs.values()))
        parts = {(starts[n], ends[n]): blobs[n] for n in range(len(starts))}

        def reopen() -> IO[bytes]:
            return fs.open(  # type: ignore[no-any-return]
                path,
                "rb",
                size=shard.size,
                cache_type="parts",
                cache_options={"data": parts, "strict": False},
            )

        # Reads of this file are served from memory: the fetch above is what was sent.
        return self._counting(shard, reopen, None)

    def __getstate__(self) -> dict[str, Any]:
        skip = ("_filesystems", "_fs_lock", "stats", "_shard_cache")
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stats = IOStats()
        self._filesystems = {}
        self._fs_lock = threading.Lock()
        self._shard_cache = None


def _short(start: int, end: int, got: int) -> str:
    return f"the response to bytes [{start}, {end}) held {got} of {end - start} bytes"


def _worst(kept: BaseException | None, new: BaseException) -> BaseException:
    """The error to act on among a call's failures: a permanent one wins."""
    return new if kept is None or not _transient(new) else kept


def _without_query(path: str) -> str:
    return _QUERY_TAIL.sub("", path)


def _is_glob(path: str) -> bool:
    """Whether ``path`` is a glob; a trailing query (``?token=...``) is not one."""
    return has_magic(_without_query(path))


def _strip_userinfo(url: str) -> str:
    """``s3://key:secret@bucket/k`` -> ``s3://bucket/k``; other URLs as they are.

    Only S3 URLs: s3fs reads no credentials from a URL, while HTTP clients send the user
    and password of theirs as basic authentication.
    """
    if get_protocol(url) not in ("s3", "s3a"):
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _s3_userinfo(urls: Sequence[str]) -> tuple[str, str] | None:
    """The ``(key, secret)`` that ``s3://`` URLs carry, if any.

    Raises:
        ConfigError: If the URLs carry different credentials.
    """
    found: set[tuple[str, str]] = set()
    for url in urls:
        if get_protocol(url) in ("s3", "s3a"):
            parts = urlsplit(url)
            if parts.username is not None:
                found.add((parts.username, parts.password or ""))
    if len(found) > 1:
        raise ConfigError(
            "the s3:// URLs carry different credentials; one source has one set: pass "
            "key= and secret= in storage_options, or read them as separate streams"
        )
    return found.pop() if found else None


def _url_secrets(urls: Sequence[str]) -> tuple[str, ...]:
    """Passwords and query values in ``urls`` (4 characters or longer), to scrub from text."""
    out: set[str] = set()
    for url in urls:
        try:
            parts = urlsplit(url)
            password = parts.password
        except ValueError:
            continue
        out.update(v for v in (parts.username, password) if v)
        for item in parts.query.split("&"):
            out.add(item.partition("=")[2])
    return tuple(sorted((v for v in out if len(v) >= 4), key=len, reverse=True))


_S3_ETAG = re.compile(r"[0-9a-f]{32}(-[0-9]+)?")
"""An S3 ETag without its quotes: an MD5, or a multipart upload's MD5 and part count."""


def _listed(f: Any, path: str, shard: Shard) -> IO[bytes]:
    """``f`` (just opened), told what the listing saw of it where that saves a request.

    s3fs asks the store for an object's details (a HEAD) on the first read of every file it
    opens, to hand its ETag to each ranged GET: one request per shard opened, half of what
    reading a small shard sends (an index pass over small JSONL shards: 9.3 ms a shard
    before, 5.3 ms after). The listing holds the ETag, so it is given instead; the one
    check that uses it (``local_expiry_check=True``, for stores without ``If-Match``) then
    compares each GET with the object as listed.
    """
    module = type(f).__module__
    if module.startswith("s3fs") and _S3_ETAG.fullmatch(shard.version) and not shard.members:
        f.details = {"name": path, "size": shard.size, "ETag": f'"{shard.version}"', "type": "file"}
    return f  # type: ignore[no-any-return]


def _version_of(info: Mapping[str, Any]) -> str:
    for key in (
        "ETag",
        "etag",
        "md5Hash",
        "blob_id",
        "sha",
        "LastModified",
        "mtime",
        "updated",
        "last_modified",
    ):
        value = info.get(key)
        if value not in (None, ""):
            return str(value).strip('"')
    return ""
