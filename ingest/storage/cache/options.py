"""What a user sets for the shard cache (:class:`CacheOptions`), what one open of it did
(:class:`CacheEvent`) and its warning (:class:`CacheWarning`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ingest.core.errors import ConfigError


class CacheWarning(UserWarning):
    """The shard cache could not keep a shard (its disk is full); it is read from the store."""


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """Where a node keeps whole shards, and how many bytes it may keep.

    Attributes:
        directory: A local directory on each node that reads (``~`` is expanded; a
            ``pathlib.Path`` is taken too); created owner-only if missing. Several streams
            and processes of one user may share it.
        max_bytes: The most bytes of shards the directory holds, fetches under way
            included (an int). Shards larger than this are read from the store directly.
        lock_timeout_s: Longest wait for another process's fetch of the same shard, or for
            the directory's lock; past it the read goes to the store instead.
        progress: Show a progress bar (bytes) while a shard is fetched into the cache.
    """

    directory: str
    max_bytes: int
    lock_timeout_s: float = 300.0
    progress: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.directory, os.PathLike):
            object.__setattr__(self, "directory", os.fspath(self.directory))
        if not isinstance(self.directory, str) or not self.directory:
            raise ConfigError(
                f"CacheOptions(directory={self.directory!r}) needs a local directory, as a "
                "str or a pathlib.Path"
            )
        if "://" in self.directory and not self.directory.startswith("file://"):
            raise ConfigError(
                f"CacheOptions(directory={self.directory!r}) must be a local directory on "
                "the node, not a remote URL"
            )
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int):
            raise ConfigError(
                f"CacheOptions(max_bytes={self.max_bytes!r}) must be a whole number of bytes "
                "(an int), e.g. max_bytes=500 << 30 for 500 GiB"
            )
        if self.max_bytes < 1:
            raise ConfigError(f"CacheOptions(max_bytes={self.max_bytes}) must be >= 1")
        timeout = self.lock_timeout_s
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigError(
                f"CacheOptions(lock_timeout_s={timeout!r}) must be a finite number of seconds "
                "> 0 (default 300.0)"
            )
        if not isinstance(self.progress, bool):
            raise ConfigError(f"CacheOptions(progress={self.progress!r}) must be True or False")


@dataclass(slots=True)
class CacheEvent:
    """What one :meth:`ShardCache.open` did, for the stream's stats."""

    hit: bool = False
    fetched_bytes: int = 0
    evicted_bytes: int = 0
    evictions: int = 0
