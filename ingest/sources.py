"""Sources: fsspec URLs and globs -> one listing of shards.

A :class:`Source` lists its URLs once per call of :meth:`Source.list_shards` (the stream
calls it once per epoch), opens shards for the format readers, and counts what it asks of
the store (:class:`IOStats`). It never reads data itself, and it knows no formats: which
listed files are data, and which format reads each, is asked of a :class:`FormatResolver`
that the caller hands to :meth:`Source.list_shards` (the format registry is one). Formats
import sources, never the other way round.
"""

from __future__ import annotations

import posixpath
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from glob import has_magic
from typing import IO, Any, NoReturn, Protocol

import fsspec
from fsspec.core import url_to_fs
from fsspec.utils import get_protocol

from ingest.errors import ConfigError, ShardError, SourceError, redact

# Timeouts and retries for S3 when the caller gives none: botocore's defaults wait 60 s per
# attempt on connect, which turns an unreachable endpoint into a minutes-long hang.
_S3_CONFIG_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 60,
    "retries": {"max_attempts": 3, "mode": "standard"},
}
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
    """

    url: str
    size: int
    version: str
    format: str


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


@dataclass(slots=True)
class IOStats:
    """Counts of what a stream asked of its stores. Thread-safe."""

    listings: int = 0
    opens: int = 0
    reads: int = 0
    bytes_read: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(
        self, *, listings: int = 0, opens: int = 0, reads: int = 0, bytes_read: int = 0
    ) -> None:
        with self._lock:
            self.listings += listings
            self.opens += opens
            self.reads += reads
            self.bytes_read += bytes_read

    def as_dict(self) -> dict[str, int]:
        return {
            "listings": self.listings,
            "opens": self.opens,
            "reads": self.reads,
            "bytes_read": self.bytes_read,
        }


def is_store_error(error: BaseException) -> bool:
    """Whether ``error`` comes from the store or the network rather than from our code."""
    if isinstance(error, OSError | TimeoutError):
        return True
    return type(error).__module__.split(".")[0] in _STORE_ERROR_PACKAGES


class _CountingFile:
    """A read-only file wrapper that counts read calls and bytes into :class:`IOStats`.

    A failed read becomes a :class:`ShardError` naming the URL and the byte offset.
    """

    def __init__(
        self, raw: IO[bytes], stats: IOStats | None, size: int, url: str, scrub: Any
    ) -> None:
        self._raw = raw
        self._stats = stats
        self._url = url
        self._scrub = scrub
        self.size = size
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._raw.read(n)
        except Exception as e:
            if not is_store_error(e):
                raise
            raise ShardError(
                self._url,
                f"read failed ({type(e).__name__}: {self._scrub(str(e))})",
                "check the store and the network; "
                "timeouts and retries are set with storage_options",
                byte=self._raw.tell(),
            ) from None
        if self._stats is not None:
            self._stats.add(reads=1, bytes_read=len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self._raw.tell())

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

    Args:
        urls: A URL or a list of them, any fsspec protocol (``s3://``, ``gs://``, ``hf://``,
            ``https://``, ``file://`` or a plain path).
        storage_options: Passed to the fsspec filesystem of each protocol. Never logged.
        format: A format name to read every shard with, checked and applied by the
            :class:`FormatResolver` at listing; None: the resolver tells it per file from
            the file's name.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        format: str | None = None,
    ) -> None:
        self.urls: tuple[str, ...] = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ConfigError("a Source needs at least one URL; got an empty list")
        self.format = format
        self._options = dict(storage_options or {})
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
                options = dict(self._options)
                if protocol in ("s3", "s3a"):
                    config = {**_S3_CONFIG_DEFAULTS, **options.get("config_kwargs", {})}
                    options["config_kwargs"] = config
                try:
                    fs, _ = url_to_fs(url, **options)
                except (ImportError, ValueError) as e:
                    raise SourceError(
                        url,
                        f"no filesystem for protocol {protocol!r}: {self.scrub(str(e))}",
                        "install the fsspec backend it names, or check the URL scheme",
                    ) from None
                self._filesystems[protocol] = fs
            return fs

    def scrub(self, text: str) -> str:
        """Remove secret storage-option values and URL credentials from ``text``."""
        for name in _SECRET_OPTION_NAMES:
            value = self._options.get(name)
            if isinstance(value, str) and len(value) >= 4:
                text = text.replace(value, "***")
        return redact(text)

    # -- listing -------------------------------------------------------------------------

    def list_shards(self, formats: FormatResolver) -> list[Shard]:
        """List every URL once and return the shards, sorted by URL, without duplicates.

        Args:
            formats: Tells which listed files are data and the format of each (the format
                registry: :data:`ingest.formats.FORMAT_RESOLVER`).

        Raises:
            SourceError: If a URL matches nothing, its bucket does not exist, the
                credentials are refused or the store cannot be reached.
            ConfigError: If :attr:`format` names no format, or a file named explicitly has
                no known format.
        """
        found: dict[str, Shard] = {}
        for url in self.urls:
            # A listing is of the store now: s3fs and gcsfs keep directory listings, and a
            # shard written since the last listing would be listed but refused by open().
            self.filesystem(url).invalidate_cache()
            for shard in self._list_one(url, formats):
                found.setdefault(shard.url, shard)
        return [found[u] for u in sorted(found)]

    def _list_one(self, url: str, formats: FormatResolver) -> list[Shard]:
        fs = self.filesystem(url)
        path = fs._strip_protocol(url)
        infos, explicit = self._file_infos(fs, url, path)
        shards: list[Shard] = []
        for info in infos:
            if info.get("type", "file") != "file":
                continue
            name = info["name"]
            if not explicit and posixpath.basename(name).startswith((".", "_")):
                continue  # _SUCCESS, .crc and other writer droppings
            fmt = formats.format_of(name, chosen=self.format, explicit=explicit)
            if fmt is None:
                continue
            shards.append(
                Shard(
                    url=fs.unstrip_protocol(name),
                    size=int(info.get("size") or 0),
                    version=_version_of(info),
                    format=fmt,
                )
            )
        if not shards:
            self._raise_no_match(fs, url, path, formats)
        return shards

    def _file_infos(
        self, fs: fsspec.AbstractFileSystem, url: str, path: str
    ) -> tuple[list[dict[str, Any]], bool]:
        """The fsspec infos ``url`` matches, and whether it named one file explicitly.

        Raises:
            SourceError: If the path does not exist, access is denied or the store fails.
        """
        try:
            self.stats.add(listings=1)
            if has_magic(path):
                return list(fs.glob(path, detail=True).values()), False
            info = fs.info(path)
            if info.get("type") != "directory":
                return [info], True
            self.stats.add(listings=1)
            return list(fs.find(path, detail=True, withdirs=False).values()), False
        except FileNotFoundError as e:
            raise SourceError(
                url,
                f"not found ({self.scrub(str(e)) or 'no such object'})",
                "check the bucket and path; for object stores the bucket must "
                "exist and be visible with these credentials",
            ) from None
        except PermissionError as e:
            raise SourceError(
                url,
                f"access denied ({self.scrub(str(e))})",
                "check the credentials in storage_options or the environment "
                "(key/secret/token, or the profile)",
            ) from None
        except Exception as e:
            if not is_store_error(e):
                raise
            raise SourceError(
                url,
                f"cannot list ({type(e).__name__}: {self.scrub(str(e))})",
                "check the endpoint and network; timeouts are set with "
                "storage_options config_kwargs",
            ) from None

    def _raise_no_match(
        self, fs: fsspec.AbstractFileSystem, url: str, path: str, formats: FormatResolver
    ) -> NoReturn:
        """Raise for a URL that listed no data files: a missing prefix, or no data among them.

        Raises:
            SourceError: Always.
        """
        if has_magic(path):
            prefix = re.split(r"[*?\[]", path, maxsplit=1)[0].rsplit("/", 1)[0]
            if prefix and not fs.exists(prefix):
                raise SourceError(
                    url,
                    f"not found: {fs.unstrip_protocol(prefix)} does not exist",
                    "check the bucket and prefix; for object stores the bucket must exist "
                    "and be visible with these credentials",
                )
        raise SourceError(url, "matches no data files", f"check the glob; {formats.describe()}")

    # -- opening -------------------------------------------------------------------------

    def open(self, shard: Shard, *, block_size: int | None = None) -> _CountingFile:
        """Open ``shard`` for reading; every read call is counted in :attr:`stats`.

        ``block_size`` None opens without a read-ahead cache, for readers that ask for exact
        ranges themselves (parquet pre-buffering, Arrow IPC); otherwise reads go through a
        read-ahead buffer of that many bytes.
        """
        fs = self.filesystem(shard.url)
        path = fs._strip_protocol(shard.url)
        kwargs: dict[str, Any] = {"size": shard.size}
        if block_size is None:
            kwargs["cache_type"] = "none"
        else:
            kwargs.update(cache_type="readahead", block_size=block_size)
        self.stats.add(opens=1)
        try:
            raw = fs.open(path, "rb", **kwargs)
        except FileNotFoundError:
            raise SourceError(
                shard.url,
                "disappeared after it was listed",
                "the dataset changed under the stream; restart the epoch or restore the object",
            ) from None
        except Exception as e:
            if not is_store_error(e):
                raise
            raise ShardError(
                shard.url,
                f"cannot be opened ({type(e).__name__}: {self.scrub(str(e))})",
                "check the credentials, the store and the network",
                byte=0,
            ) from None
        return _CountingFile(raw, self.stats, shard.size, shard.url, self.scrub)

    def fetches_ranges(self, shard: Shard) -> bool:
        """Whether the shard's store serves many byte ranges concurrently (async fsspec)."""
        return bool(getattr(self.filesystem(shard.url), "async_impl", False))

    def fetch_ranges(self, shard: Shard, starts: list[int], ends: list[int]) -> _CountingFile:
        """Fetch byte ranges concurrently and open the shard with exactly those bytes known.

        Reads outside the ranges still work (one request each). Uses fsspec's
        ``cat_ranges`` and its ``parts`` cache.
        """
        fs = self.filesystem(shard.url)
        path = fs._strip_protocol(shard.url)
        try:
            blobs = fs.cat_ranges([path] * len(starts), starts, ends)
        except Exception as e:
            blobs = [e]
        for start, blob in zip(starts, blobs, strict=False):
            if isinstance(blob, BaseException):
                if not is_store_error(blob):
                    raise blob
                raise ShardError(
                    shard.url,
                    f"range read failed ({type(blob).__name__}: {self.scrub(str(blob))})",
                    "check the store and the network",
                    byte=start,
                ) from None
        self.stats.add(reads=len(starts), bytes_read=sum(len(b) for b in blobs))
        parts = {(s, e): b for s, e, b in zip(starts, ends, blobs, strict=True)}
        raw = fs.open(
            path,
            "rb",
            size=shard.size,
            cache_type="parts",
            cache_options={"data": parts, "strict": False},
        )
        # Reads of this file are served from memory: the fetch above is what was sent.
        return _CountingFile(raw, None, shard.size, shard.url, self.scrub)

    def __getstate__(self) -> dict[str, Any]:
        skip = ("_filesystems", "_fs_lock", "stats")
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stats = IOStats()
        self._filesystems = {}
        self._fs_lock = threading.Lock()


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
