"""The :class:`IndexStore`: entries of the shard index kept under one location, a local
directory (owner-only) or an fsspec URL a cluster shares, read and written in batches (see
:mod:`ingest.planner.index`)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
from fsspec.utils import get_protocol

from ingest.core.errors import ConfigError, IngestError, LocationError, redact
from ingest.formats.base import ShardInfo
from ingest.planner.index.entries import (
    INDEX_VERSION,
    SCHEMA,
    CorruptEntryError,
    blob_name,
    decode_blob,
    decode_entry,
    encode_blob,
    encode_entry,
    entry_name,
    listing_name,
    shard_identity,
)
from ingest.storage.sources import Shard, Source, is_store_error

IO_THREADS = 16
"""Threads that read or write index entries at once (and index shards, by default)."""
_REMOTE_BATCH = 512
_LOCAL_PROTOCOLS = ("file", "local")


class IndexStoreError(LocationError):
    """The index location cannot be read or written (not a bad entry: those are rebuilt)."""

    what = "shard index"


class IndexEntryWarning(UserWarning):
    """An index entry was unreadable or did not match its shard; it is being rebuilt."""


def default_location() -> str:
    """``$XDG_CACHE_HOME/ingest/index``, or ``~/.cache/ingest/index`` without it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ingest", "index")


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexConfig:
    """Where the shard index lives.

    Attributes:
        location: A directory or an fsspec URL (``s3://bucket/ingest-index/``,
            ``gs://...``): a URL shared by the cluster lets every node and every later job
            use one index. None: :func:`default_location`, resolved when the store is made.
        storage_options: fsspec options for ``location`` (endpoint, credentials). Never
            printed, never written to an entry.
    """

    location: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.location is not None and not isinstance(self.location, str):
            raise TypeError(
                f"IndexConfig.location must be a str path or URL, "
                f"got {type(self.location).__name__}"
            )
        if self.location is not None and not self.location.strip():
            raise ConfigError(
                "IndexConfig.location is empty; give a directory or a URL such as "
                "s3://bucket/ingest-index/, or None for the user's cache directory"
            )


@dataclass(frozen=True, slots=True)
class IndexStats:
    """What an :class:`IndexStore` was asked, since it was made.

    Attributes:
        hits: Shards found in the index.
        misses: Shards not found (new, changed, or with a corrupt entry).
        corrupt: Entries ignored because they did not parse or did not match their shard.
        written: Entries written.
        footer_hits: Footers found in the index (the shard's footer not read again).
        footer_misses: Footers looked up and not found.
        footer_writes: Footers written (apart from ``written``, which counts entries).
        schema_hits: Schemas inferred from a shard's bytes found in the index (not inferred
            again).
        schema_misses: Such schemas looked up and not found.
        schema_writes: Such schemas written.
    """

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    written: int = 0
    footer_hits: int = 0
    footer_misses: int = 0
    footer_writes: int = 0
    schema_hits: int = 0
    schema_misses: int = 0
    schema_writes: int = 0


class IndexStore:
    """Row counts and seek points of shards, persisted under one location.

    Thread-safe; picklable (only its config travels). Counts hits, misses, corrupt entries
    and writes in :attr:`stats`.

    Args:
        config: Where the index lives; None: the user's cache directory.

    Raises:
        IndexStoreError: If the location's filesystem cannot be set up (unknown protocol).
    """

    def __init__(self, config: IndexConfig | None = None) -> None:
        self._setup(config or IndexConfig())

    def _setup(self, config: IndexConfig) -> None:
        self.config = config
        location = self.config.location or default_location()
        self._local: Path | None = None
        self._fs: Any = None
        self._root = ""
        self._opener = Source(location, storage_options=self.config.storage_options)
        if get_protocol(location) in _LOCAL_PROTOCOLS:
            path = location.split("://", 1)[1] if "://" in location else location
            self._local = Path(os.path.expanduser(path)).absolute()
            self.location = str(self._local)
        else:
            try:
                self._fs = self._opener.filesystem(location)
            except IngestError as e:
                raise IndexStoreError(
                    location, str(e), "install the fsspec backend or fix the URL"
                ) from None
            self._root = str(self._fs._strip_protocol(location)).rstrip("/")
            self.location = self._opener.scrub(redact(location))
        self._counts = {f.name: 0 for f in fields(IndexStats)}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["config"])

    @property
    def stats(self) -> IndexStats:
        """A snapshot of the counters."""
        with self._lock:
            return IndexStats(**self._counts)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                self._counts[name] += n

    def path(self, shard: Shard) -> str:
        """Where ``shard``'s entry lives (a local path or a URL without credentials)."""
        if self._local is not None:
            return str(self._local / entry_name(shard))
        return f"{self.location.rstrip('/')}/{entry_name(shard)}"

    # -- reading ---------------------------------------------------------------------------

    def get_many(self, shards: Sequence[Shard]) -> list[ShardInfo | None]:
        """The stored index of each shard (rows, blocks, seeks), or None where it has none.

        A corrupt entry, or one that belongs to another key, is a miss, with a warning.

        Raises:
            IndexStoreError: If the location cannot be read (permissions, network).
        """
        blobs = self._get_blobs([entry_name(s) for s in shards])
        out: list[ShardInfo | None] = []
        for shard, blob in zip(shards, blobs, strict=True):
            info = None if blob is None else self._decode(shard, blob)
            out.append(info)
        hits = sum(1 for i in out if i is not None)
        self._count(hits=hits, misses=len(out) - hits)
        return out

    def _decode(self, shard: Shard, blob: bytes) -> ShardInfo | None:
        try:
            return decode_entry(shard, blob)
        except CorruptEntryError as e:
            self._count(corrupt=1)
            warnings.warn(
                f"shard index entry {self.path(shard)} for {shard_identity(shard.url)} is "
                f"ignored ({e}); the shard is indexed again and the entry rewritten",
                IndexEntryWarning,
                stacklevel=3,
            )
            return None

    def _get_blobs(self, names: Sequence[str]) -> list[bytes | None]:
        """The entries stored under ``names`` (paths below the location), None where none."""
        if self._local is not None:
            return _read_local(self._local, names)
        return self._read_remote(names)

    def _read_remote(self, names: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for start in range(0, len(names), _REMOTE_BATCH):
            paths = [f"{self._root}/{n}" for n in names[start : start + _REMOTE_BATCH]]
            try:
                got = self._fs.cat(paths, on_error="return")
            except FileNotFoundError:
                got = {}
            except Exception as e:
                got = {p: e for p in paths}
            for path in paths:
                blob = got.get(path, FileNotFoundError(path))
                if isinstance(blob, FileNotFoundError):
                    out.append(None)
                elif isinstance(blob, BaseException):
                    raise self._store_error(blob, "read") from None
                else:
                    out.append(bytes(blob))
        return out

    def _store_error(self, error: BaseException, verb: str) -> BaseException:
        if not is_store_error(error) and not isinstance(error, PermissionError):
            return error
        return IndexStoreError(
            self.location,
            f"cannot {verb} entries ({type(error).__name__}: {self._opener.scrub(str(error))})",
            "check the index URL, its storage options (credentials, endpoint) and the "
            "network, or choose another index location",
        )

    def get_footers(self, shards: Sequence[Shard]) -> list[bytes | None]:
        """The footer kept for each shard (the bytes its format gave, see
        :meth:`put_footers`), or None where none is; a corrupt one is a miss, with a warning.

        Raises:
            IndexStoreError: If the location cannot be read (permissions, network).
        """
        blobs = self._get_blobs([blob_name(s) for s in shards])
        out: list[bytes | None] = []
        for shard, blob in zip(shards, blobs, strict=True):
            footer = None
            if blob is not None:
                try:
                    footer = decode_blob(shard, blob)
                except CorruptEntryError as e:
                    self._count(corrupt=1)
                    warnings.warn(
                        f"shard index footer {blob_name(shard)} for "
                        f"{shard_identity(shard.url)} is ignored ({e}); the footer is read "
                        "again and kept",
                        IndexEntryWarning,
                        stacklevel=2,
                    )
            out.append(footer)
        found = sum(1 for f in out if f is not None)
        self._count(footer_hits=found, footer_misses=len(out) - found)
        return out

    def put_footers(self, items: Sequence[tuple[Shard, bytes]]) -> None:
        """Keep each shard's footer (the bytes its format gives to inspect it again without
        a request), under the shard's URL, size, version and format: a changed shard's
        footer is never found.

        Raises:
            IndexStoreError: If the location cannot be written.
        """
        if items:
            blobs = [(blob_name(s), encode_blob(s, f)) for s, f in items]
            self._put_blobs(blobs, counter="footer_writes")

    def get_schema(self, shard: Shard, inferred: str) -> pa.Schema | None:
        """The schema inferred from ``shard`` and kept under ``inferred`` (what its inference
        depends on besides the shard's bytes: see :meth:`put_schema`), or None; a corrupt one
        is a miss, with a warning.

        Raises:
            IndexStoreError: If the location cannot be read (permissions, network).
        """
        name = blob_name(shard, SCHEMA, inferred)
        [blob] = self._get_blobs([name])
        schema = None
        if blob is not None:
            try:
                schema = pa.ipc.read_schema(
                    pa.py_buffer(decode_blob(shard, blob, SCHEMA, inferred))
                )
            except (CorruptEntryError, pa.ArrowInvalid) as e:
                self._count(corrupt=1)
                warnings.warn(
                    f"shard index schema {name} for {shard_identity(shard.url)} is ignored "
                    f"({e}); the schema is inferred again and kept",
                    IndexEntryWarning,
                    stacklevel=2,
                )
        self._count(**{"schema_hits" if schema is not None else "schema_misses": 1})
        return schema

    def put_schema(self, shard: Shard, inferred: str, schema: pa.Schema) -> None:
        """Keep the schema inferred from ``shard``'s bytes under ``inferred``: the format and
        the read options its inference depends on (``Format.schema_key``). A changed shard's,
        or one inferred under other options, is never found.

        Raises:
            IndexStoreError: If the location cannot be written.
        """
        data = schema.serialize().to_pybytes()
        blob = encode_blob(shard, data, SCHEMA, inferred)
        self._put_blobs([(blob_name(shard, SCHEMA, inferred), blob)], counter="schema_writes")

    # -- writing ---------------------------------------------------------------------------

    def put_many(self, items: Sequence[tuple[Shard, ShardInfo]]) -> None:
        """Store the index of each shard, replacing any entry atomically.

        Raises:
            IndexStoreError: If the location cannot be written.
        """
        if not items:
            return
        self._put_blobs([(entry_name(shard), encode_entry(shard, info)) for shard, info in items])

    def _put_blobs(self, blobs: Sequence[tuple[str, bytes]], counter: str = "written") -> None:
        """Store each ``(name, bytes)``, replacing any entry atomically; counted in
        ``counter``.

        Raises:
            IndexStoreError: If the location cannot be written.
        """
        if self._local is not None:
            _write_local(self._local, blobs)
        else:
            for start in range(0, len(blobs), _REMOTE_BATCH):
                batch = {f"{self._root}/{n}": b for n, b in blobs[start : start + _REMOTE_BATCH]}
                try:
                    self._fs.pipe(batch)
                except Exception as e:
                    raise self._store_error(e, "write") from None
        self._count(**{counter: len(blobs)})

    # -- listings ----------------------------------------------------------------------------

    def get_listing(self, key: str) -> list[tuple[str, int, str]] | None:
        """The files ``(name, size, version)`` of the listing stored under ``key``, or None.

        Only listings that never change are stored (an ``hf://`` glob at a commit; see
        :meth:`ingest.Source.list_shards`); a corrupt entry is a miss, with a warning.

        Raises:
            IndexStoreError: If the location cannot be read.
        """
        name = listing_name(key)
        [blob] = self._get_blobs([name])
        if blob is None:
            self._count(misses=1)
            return None
        try:
            entry = json.loads(blob)
            if entry.get("key") != key or entry.get("version") != INDEX_VERSION:
                raise ValueError("it belongs to another listing")
            files = [(str(n), int(size), str(v)) for n, size, v in entry["files"]]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            self._count(corrupt=1)
            warnings.warn(
                f"stored listing {name} is ignored ({e}); the source is listed again",
                IndexEntryWarning,
                stacklevel=2,
            )
            return None
        self._count(hits=1)
        return files

    def put_listing(self, key: str, files: Sequence[tuple[str, int, str]]) -> None:
        """Store the files of a listing that never changes under ``key``.

        Raises:
            IndexStoreError: If the location cannot be written.
        """
        blob = json.dumps(
            {"key": key, "version": INDEX_VERSION, "files": [list(f) for f in files]}
        ).encode()
        self._put_blobs([(listing_name(key), blob)])


def _write_local(root: Path, blobs: Sequence[tuple[str, bytes]]) -> None:
    try:
        _make_private_dirs(root)
        for name, blob in blobs:
            path = root / name
            _make_private_dirs(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except OSError as e:
        raise IndexStoreError(
            str(root),
            f"cannot write entries ({type(e).__name__}: {e.strerror or e})",
            "make the directory writable, or choose another index location",
        ) from None


def _read_local(root: Path, names: Sequence[str]) -> list[bytes | None]:
    def one(name: str) -> bytes | None:
        path = root / name
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise IndexStoreError(
                str(root),
                f"cannot read {path} ({type(e).__name__}: {e.strerror or e})",
                "fix the directory's permissions, or choose another index location",
            ) from None

    if len(names) <= 1:
        return [one(n) for n in names]
    with ThreadPoolExecutor(min(IO_THREADS, len(names))) as pool:
        return list(pool.map(one, names))


def _make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each owner-only (0o700)."""
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
