"""The :class:`DerivedStore`: derived copies by :class:`DerivedKey`, checked on every read.

Each copy is framed: :data:`FRAME_MAGIC`, the key's name, the SHA-256 of the payload, then
the payload (:mod:`ingest.engine.derived.codec`). A copy is read whole and decoded whole, so
checking its hash costs little beside decoding it (unlike a cached shard, of which a reader
may read a few columns), and it catches what a file's seal cannot: damage below the file
system, a copy put under another name by hand. A copy that fails its check is a miss and is
removed (the reader derives the unit again and writes it anew); it is never decoded.
"""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ingest.core.errors import ConfigError
from ingest.engine.derived.codec import CorruptDerivedError, DerivedUnit, decode, encode
from ingest.engine.derived.copies import Copies, LocalCopies, SharedCopies
from ingest.engine.derived.keys import DerivedKey
from ingest.engine.stage import Staged
from ingest.storage.cache import CacheEvent, CacheOptions
from ingest.storage.sources.stats import IOStats

FRAME_MAGIC = b"IDRVSTO1"
"""A stored copy's first bytes; the digit is the frame's version."""
_NAME = 40
_DIGEST = 32
_HEAD = len(FRAME_MAGIC) + _NAME + _DIGEST


class CorruptCopyWarning(UserWarning):
    """A derived copy did not pass its check; it was removed and its unit is derived again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DerivedConfig:
    """Where derived copies live: a node's directory or a URL a cluster shares (one of them).

    Attributes:
        local: A directory on each node, bounded in bytes, least recently used first,
            owner-only (the shard cache's options: its ``directory`` should be one of its own,
            e.g. the shard cache's directory with ``/derived`` added).
        url: An fsspec URL (``s3://bucket/derived/``, ``file:///nfs/derived``) every job of a
            cluster shares: written once by whichever reader derives a unit first, never
            evicted (the bucket's lifecycle rules bound it).
        storage_options: fsspec options for ``url`` (endpoint, credentials). Never printed.
    """

    local: CacheOptions | None = None
    url: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if (self.local is None) == (self.url is None):
            raise ConfigError(
                f"DerivedConfig(local={self.local!r}, url={self.url!r}): give one of them: "
                "local=CacheOptions(directory, max_bytes) for a node's directory, or url= for "
                "a store every job of the cluster shares"
            )
        if self.local is not None and not isinstance(self.local, CacheOptions):
            raise TypeError(
                f"DerivedConfig.local must be an ingest.CacheOptions, got "
                f"{type(self.local).__name__}"
            )
        if self.url is not None and (not isinstance(self.url, str) or not self.url.strip()):
            raise ConfigError(
                f"DerivedConfig(url={self.url!r}) must be a non-empty URL such as "
                "s3://bucket/derived/ or file:///shared/derived"
            )


@dataclass(frozen=True, slots=True)
class DerivedStats:
    """What a :class:`DerivedStore` did since it was made.

    Attributes:
        hits: Copies found and read.
        misses: Keys with no readable copy (none, or a damaged one).
        corrupt: Copies that failed their check and were removed (each a miss too).
        writes: Copies this store wrote.
        bytes_written: Bytes of the copies it wrote (framed, compressed).
        bytes_read: Bytes of the copies it read.
        evictions: Copies evicted to make room (a node's directory).
        evicted_bytes: Their bytes.
    """

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    writes: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    evictions: int = 0
    evicted_bytes: int = 0


class DerivedStore:
    """Derived copies by key (see :mod:`ingest.engine.derived`). Thread-safe and safe across
    processes; picklable (only its config travels, its stats start again).

    Args:
        config: Where the copies live.
        io: A stream's counts (``stream.stats``), which also get the hits, misses, writes and
            bytes as ``derived_*`` (:class:`ingest.IOStats`); None: this store's alone.

    Raises:
        ConfigError: If a node's directory cannot be made or written.
        DerivedStoreError: If a URL's filesystem cannot be set up.
    """

    def __init__(self, config: DerivedConfig, io: IOStats | None = None) -> None:
        self._setup(config, io)

    def _setup(self, config: DerivedConfig, io: IOStats | None = None) -> None:
        self.config = config
        self._io = io
        self._copies = _copies_of(config)
        self.location = self._copies.location
        self._counts = {f.name: 0 for f in fields(DerivedStats)}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["config"])

    @property
    def stats(self) -> DerivedStats:
        """A snapshot of the counters."""
        with self._lock:
            return DerivedStats(**self._counts)

    def path(self, key: DerivedKey) -> str:
        """Where ``key``'s copy is or would be: a local path, or a URL without credentials."""
        return self._copies.where(key.name())

    def usage(self) -> int | None:
        """Bytes a node's directory holds now (copies and writes under way); None for a
        shared store, which counts nothing.

        Raises:
            TimeoutError: If the directory's lock is not had in its ``lock_timeout_s``.
        """
        return self._copies.usage()

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                self._counts[name] += n
        if self._io is not None:
            self._io.add(**{f"derived_{k}": n for k, n in deltas.items() if k in _MIRRORED})

    # -- reading ---------------------------------------------------------------------------

    def get(self, key: DerivedKey) -> DerivedUnit | None:
        """The decoded copy of ``key``, or None (a miss: none, or a damaged one, removed).

        Raises:
            DerivedStoreError: If a shared store cannot be read (permissions, network).
        """
        found = self._checked(key)
        if found is None:
            return None
        payload, stored = found
        try:
            unit = decode(payload)
        except CorruptDerivedError as e:  # its hash held: written by another codec version
            self._damaged(key, str(e))
            return None
        self._count(hits=1, bytes_read=stored)
        return unit

    def get_bytes(self, key: DerivedKey) -> bytes | None:
        """The checked payload of ``key``'s copy (:func:`codec.decode` reads it), or None:
        for moving a copy between processes without decoding it on the way.

        Raises:
            DerivedStoreError: If a shared store cannot be read.
        """
        found = self._checked(key)
        if found is None:
            return None
        self._count(hits=1, bytes_read=found[1])
        return found[0]

    def has(self, key: DerivedKey) -> bool:
        """Whether ``key`` has a copy, without reading it (its bytes are checked when it is
        read: a damaged one is then a miss, removed and derived again). Counted as nothing:
        no hit, no miss.

        Raises:
            DerivedStoreError: If a shared store cannot be read.
        """
        return self._copies.has(key.name())

    def _checked(self, key: DerivedKey) -> tuple[bytes, int] | None:
        """The payload of ``key``'s copy and the copy's stored bytes, if it passes its check;
        a miss is counted here, a hit by the caller."""
        name = key.name()
        try:
            blob = self._copies.read(name)
        except CorruptDerivedError as e:  # removed by the copies already
            self._damaged(key, str(e), drop=False)
            return None
        if blob is None:
            self._count(misses=1)
            return None
        problem = _unframe_problem(name, blob)
        if problem is not None:
            self._damaged(key, problem)
            return None
        return blob[_HEAD:], len(blob)

    def _damaged(self, key: DerivedKey, problem: str, *, drop: bool = True) -> None:
        if drop:
            self._copies.drop(key.name())
        self._count(misses=1, corrupt=1)
        warnings.warn(
            CorruptCopyWarning(
                f"derived copy {key.name()} of {key.url} rows [{key.start}, {key.stop}) in "
                f"{self.location} is damaged ({problem}); it was removed and the unit is "
                "derived again"
            ),
            stacklevel=3,
        )

    # -- writing ---------------------------------------------------------------------------

    def put(self, key: DerivedKey, staged: Staged, inputs: int, seconds: float = 0.0) -> bool:
        """Keep what the stage chain made of ``key``'s unit of ``inputs`` rows (in
        ``seconds``); whether this call wrote it (not when a copy is there already, or a
        node's directory has no room).

        Raises:
            ConfigError: If ``staged`` does not fit ``inputs`` rows.
            DerivedStoreError: If a shared store cannot be written.
        """
        return self.put_bytes(key, encode(staged, inputs, seconds))

    def put_bytes(self, key: DerivedKey, payload: bytes) -> bool:
        """:meth:`put` of a payload already encoded (:func:`codec.encode`)."""
        name = key.name()
        blob = frame(name, payload)
        event = CacheEvent()
        written = self._copies.write(name, blob, event)
        self._count(
            writes=int(written),
            bytes_written=len(blob) if written else 0,
            evictions=event.evictions,
            evicted_bytes=event.evicted_bytes,
        )
        return written


_COPIES: dict[str, Copies] = {}
"""Each config's copies, one per process (see :func:`_copies_of`)."""
_COPIES_LOCK = threading.Lock()


def _copies_of(config: DerivedConfig) -> Copies:
    """Where ``config``'s copies live, made once per process: a stream makes a store for
    each epoch's feed (each DataLoader worker, each reader), and a filesystem made again
    each time is a new S3 client where fsspec's instance cache is off
    (``skip_instance_cache``: 0.1-0.4 CPU s an epoch). Both kinds are thread-safe."""
    key = json.dumps(
        [repr(config.local), config.url, dict(config.storage_options)], sort_keys=True, default=repr
    )
    with _COPIES_LOCK:
        got = _COPIES.get(key)
        if got is None:
            got = _COPIES[key] = (
                LocalCopies(config.local)
                if config.local is not None
                else SharedCopies(str(config.url), config.storage_options)
            )
        return got


_MIRRORED = frozenset({"hits", "misses", "writes", "bytes_read", "bytes_written"})
"""The counts a stream's :class:`ingest.IOStats` also gets, as ``derived_<name>``."""


def frame(name: str, payload: bytes) -> bytes:
    """A copy as stored: :data:`FRAME_MAGIC`, ``name``, the payload's SHA-256, the payload."""
    if len(name) != _NAME or not name.isascii():
        raise ValueError(f"a derived copy's name is {_NAME} hex characters, got {name!r}")
    return b"".join([FRAME_MAGIC, name.encode(), hashlib.sha256(payload).digest(), payload])


def _unframe_problem(name: str, blob: bytes) -> str | None:
    """What is wrong with the stored copy ``blob`` of ``name``, or None if it is whole."""
    if len(blob) < _HEAD or blob[: len(FRAME_MAGIC)] != FRAME_MAGIC:
        return f"{len(blob)} bytes that do not start as a derived copy"
    stored = blob[len(FRAME_MAGIC) : len(FRAME_MAGIC) + _NAME]
    if stored != name.encode():
        return f"it holds the copy of {stored!r}"
    digest = blob[len(FRAME_MAGIC) + _NAME : _HEAD]
    if hashlib.sha256(memoryview(blob)[_HEAD:]).digest() != digest:
        return "its bytes do not match their SHA-256"
    return None


__all__ = [
    "FRAME_MAGIC",
    "CorruptCopyWarning",
    "DerivedConfig",
    "DerivedStats",
    "DerivedStore",
    "frame",
]
