"""A node-local shard cache: whole shards on local disk under a byte bound.

Opt-in with ``ReadOptions(cache=CacheOptions(directory, max_bytes))``. The first read of a
shard on a node fetches it whole (one request) into the directory; later reads on that node,
in any process and after a restart, open the local copy and send no request.

Why not fsspec's ``filecache``/``blockcache``: their index is one JSON file that every
process rewrites (concurrent readers on a node lose entries or serve a stale one), they
bound nothing but age (no byte bound, no LRU eviction), and they validate a copy with an
extra request per open (``ukey``/``info``). Here the listing already carries each shard's
size and version, so the copy's name is derived from them: a shard that changed in the store
has another name and is fetched again, with no request to check.

Files under ``directory``:

- ``data/<key>.shard``: complete copies; an atomic rename puts one in place, so a process
  that dies mid-fetch never leaves a half file where a reader looks. Readers hold a shared
  ``flock`` on the copy while it is open; eviction takes an exclusive one without waiting and
  passes over a copy it cannot take, so it never deletes a file a reader has open.
- ``tmp/<key>.<bytes>.<nonce>.part``: fetches under way, each held by its writer with an
  exclusive ``flock`` and counted at its full size against the bound before it starts. A
  part whose lock can be taken belongs to a dead process and is removed.
- ``cache.lock``: taken while the bytes in use are summed and room is made, so that several
  processes never pass the bound between them. ``locks/<nn>.lock``: 256 stripes of one
  fetcher per shard on the node.

Least recently used goes first: a hit touches the copy's modification time. A shard larger
than the bound, or one for which no room can be made because every copy is open, is read
from the store as if there were no cache (``cache_bypassed`` in the stats).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from ingest.errors import ConfigError, SourceError

_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """Where a node keeps whole shards, and how many bytes it may keep.

    Attributes:
        directory: A local directory on each node that reads (``~`` is expanded); created
            if missing. Several streams and processes may share it.
        max_bytes: The most bytes of shards the directory holds, fetches under way
            included. Shards larger than this are read from the store directly.
        lock_timeout_s: Longest wait for another process's fetch of the same shard, or for
            the directory's lock; past it the read goes to the store instead.
        progress: Show a progress bar (bytes) while a shard is fetched into the cache.
    """

    directory: str
    max_bytes: int
    lock_timeout_s: float = 300.0
    progress: bool = False

    def __post_init__(self) -> None:
        if not self.directory:
            raise ConfigError("CacheOptions(directory=...) needs a local directory")
        if "://" in self.directory and not self.directory.startswith("file://"):
            raise ConfigError(
                f"CacheOptions(directory={self.directory!r}) must be a local directory on "
                "the node, not a remote URL"
            )
        if self.max_bytes < 1:
            raise ConfigError(f"CacheOptions(max_bytes={self.max_bytes}) must be >= 1")
        if self.lock_timeout_s <= 0:
            raise ConfigError(f"CacheOptions(lock_timeout_s={self.lock_timeout_s}) must be > 0")


@dataclass(slots=True)
class CacheEvent:
    """What one :meth:`ShardCache.open` did, for the stream's stats."""

    hit: bool = False
    fetched_bytes: int = 0
    evicted_bytes: int = 0
    evictions: int = 0


class ShardCache:
    """The cache directory of one node (see the module docstring). Safe across processes."""

    def __init__(self, options: CacheOptions) -> None:
        self.options = options
        root = options.directory.removeprefix("file://")
        self.root = os.path.abspath(os.path.expanduser(root))
        self._data = os.path.join(self.root, "data")
        self._tmp = os.path.join(self.root, "tmp")
        self._locks = os.path.join(self.root, "locks")
        self._lock_path = os.path.join(self.root, "cache.lock")
        for d in (self._data, self._tmp, self._locks):
            os.makedirs(d, exist_ok=True)

    @staticmethod
    def key(url: str, size: int, version: str) -> str:
        """The copy's name: a changed shard (size or version) is another copy."""
        return hashlib.sha256(f"{url}\0{size}\0{version}".encode()).hexdigest()[:40]

    def path_of(self, key: str) -> str:
        return os.path.join(self._data, f"{key}.shard")

    def open(
        self,
        url: str,
        size: int,
        version: str,
        fetch: Callable[[str], None] | None,
        event: CacheEvent,
    ) -> IO[bytes] | None:
        """The local copy of a shard, open and held; fetched first on a miss.

        ``fetch(path)`` writes the whole shard to ``path`` (retrying as the store needs);
        None only looks (a footer read must not fetch a whole shard). Returns None when the
        shard is not cached: larger than the bound, no room (every copy open), a lock not
        had in time, or no ``fetch``. The caller then reads from the store.

        Raises:
            SourceError: If the fetched bytes are not the listed size (the object changed
                since it was listed).
        """
        if size > self.options.max_bytes:
            return None
        path = self.path_of(self.key(url, size, version))
        held = self._open_held(path, size)
        if held is None and fetch is not None and self._fetched(url, size, path, fetch, event):
            held = self._open_held(path, size)
        event.hit = held is not None and not event.fetched_bytes
        return held

    def _fetched(
        self, url: str, size: int, path: str, fetch: Callable[[str], None], event: CacheEvent
    ) -> bool:
        """Whether the copy is there after this: fetched here or by another process."""
        key = os.path.basename(path).split(".")[0]
        with self._flock(os.path.join(self._locks, f"{key[:2]}.lock")) as locked:
            if not locked:
                return False
            if os.path.exists(path):  # another process fetched it meanwhile
                return True
            with self._reserved(key, size, event) as part:
                if part is None:
                    return False
                fetch(part)
                got = os.path.getsize(part)
                if got != size:
                    raise SourceError(
                        url,
                        f"has {got} bytes, not the {size} it was listed with: it changed "
                        "since the listing",
                        "restart the stream so that it lists the dataset again",
                    )
                with open(part, "rb+") as f:
                    os.fsync(f.fileno())  # a crash of the node leaves no half file either
                # The reservation becomes the copy, under the lock that sums the bytes: a
                # sum taken during the rename would see neither and let the bound pass.
                with self._flock(self._lock_path) as locked:
                    if not locked:
                        return False
                    os.rename(part, path)
                event.fetched_bytes = size
        return True

    def usage(self) -> int:
        """Bytes the directory holds now: copies and the reservations of fetches.

        Raises:
            TimeoutError: If the directory's lock is not had in ``lock_timeout_s``.
        """
        with self._flock(self._lock_path) as locked:
            if not locked:
                raise TimeoutError(f"the shard cache {self.root} stayed locked")
            return sum(size for _, size, _ in self._copies()) + sum(
                size for _, size in self._parts(remove_dead=False)
            )

    # -- internals ---------------------------------------------------------------------

    def _open_held(self, path: str, size: int) -> IO[bytes] | None:
        """``path`` opened with a shared lock, if it is there and whole; else None."""
        try:
            f = open(path, "rb")  # noqa: SIM115 - returned open to the caller
        except FileNotFoundError:
            return None
        try:
            if not self._wait(lambda: _try_flock(f.fileno(), fcntl.LOCK_SH)):
                f.close()
                return None
            st = os.fstat(f.fileno())
            if st.st_nlink == 0:  # evicted between the open and the lock
                f.close()
                return None
            if st.st_size != size:  # not what a rename put there: never serve it
                f.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                return None
        except BaseException:
            f.close()
            raise
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used
        return f

    @contextlib.contextmanager
    def _reserved(self, key: str, size: int, event: CacheEvent) -> Iterator[str | None]:
        """A part file counted at ``size`` against the bound, room made by eviction."""
        with self._flock(self._lock_path) as locked:
            if not locked:
                yield None
                return
            if not self._make_room(size, event):
                yield None
                return
            part = os.path.join(self._tmp, f"{key}.{size}.{secrets.token_hex(4)}.part")
            f = open(part, "wb")  # noqa: SIM115 - held until the fetch is done
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # alive: not a dead process's part
        try:
            yield part
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            f.close()

    def _make_room(self, size: int, event: CacheEvent) -> bool:
        """Evict least recently used copies no one has open until ``size`` more bytes fit."""
        copies = sorted(self._copies(), key=lambda c: c[2])
        used = sum(s for _, s, _ in copies) + sum(s for _, s in self._parts(remove_dead=True))
        for path, bytes_, _ in copies:
            if used + size <= self.options.max_bytes:
                break
            if _unlink_unheld(path):
                used -= bytes_
                event.evicted_bytes += bytes_
                event.evictions += 1
        return used + size <= self.options.max_bytes

    def _copies(self) -> list[tuple[str, int, float]]:
        out = []
        with os.scandir(self._data) as it:
            for entry in it:
                if entry.name.endswith(".shard"):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat()
                        out.append((entry.path, st.st_size, st.st_mtime))
        return out

    def _parts(self, *, remove_dead: bool) -> list[tuple[str, int]]:
        """Fetches under way, at their reserved size; parts of dead processes removed."""
        out = []
        with os.scandir(self._tmp) as it:
            for entry in it:
                fields = entry.name.split(".")
                if len(fields) != 4 or fields[3] != "part" or not fields[1].isdigit():
                    continue
                if remove_dead and _unlink_unheld(entry.path):  # its writer is gone
                    continue
                out.append((entry.path, int(fields[1])))
        return out

    @contextlib.contextmanager
    def _flock(self, path: str) -> Iterator[bool]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = self._wait(lambda: _try_flock(fd, fcntl.LOCK_EX))
            yield locked
        finally:
            os.close(fd)  # closing releases the lock

    def _wait(self, attempt: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.options.lock_timeout_s
        while not attempt():
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)
        return True


def _try_flock(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def _unlink_unheld(path: str) -> bool:
    """Delete ``path`` unless a process holds a lock on it: a copy a reader has open, or
    the part file of a fetch whose writer is alive. True if it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        if not _try_flock(fd, fcntl.LOCK_EX):
            return False
        if os.fstat(fd).st_nlink > 0:  # else another process deleted it first
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return True
    finally:
        os.close(fd)


__all__ = ["CacheEvent", "CacheOptions", "ShardCache"]
