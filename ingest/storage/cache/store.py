"""The shard cache's directory on one node (:class:`ShardCache`): complete copies, fetches
under way, the byte bound and least-recently-used eviction, safe across processes. The
package docstring (:mod:`ingest.storage.cache`) describes the files and why."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import time
import warnings
from collections.abc import Callable, Iterator
from typing import IO

from ingest.core.errors import ConfigError, SourceError
from ingest.storage.cache.files import (
    DISK_FULL,
    check_private,
    free_bytes,
    make_private_dirs,
    open_private,
    try_flock,
    unlink_unheld,
)
from ingest.storage.cache.options import CacheEvent, CacheOptions, CacheWarning
from ingest.storage.cache.seal import (
    file_sha256,
    matches_seal,
    read_seal,
    remove_copy,
    seal_of,
    write_seal,
)

_POLL_S = 0.02


class ShardCache:
    """The cache directory of one node (see :mod:`ingest.storage.cache`). Safe across processes.

    Raises:
        ConfigError: If the directory cannot be made or written, or a folder of the cache
            belongs to another user.
    """

    def __init__(self, options: CacheOptions) -> None:
        self.options = options
        root = options.directory.removeprefix("file://")
        self.root = os.path.abspath(os.path.expanduser(root))
        self._data = os.path.join(self.root, "data")
        self._tmp = os.path.join(self.root, "tmp")
        self._locks = os.path.join(self.root, "locks")
        self._lock_path = os.path.join(self.root, "cache.lock")
        self._warned_full = False
        self._make_folders()

    def _make_folders(self) -> None:
        """Make the cache's folders, owner-only, or refuse (again where they were removed
        since: a cleaner of temporary files while a stream ran, see :meth:`open`)."""
        directory = self.options.directory
        make_private_dirs(self.root, directory)
        for d in (self._data, self._tmp, self._locks):
            make_private_dirs(d, directory)
            check_private(d, directory)
        for d in (self.root, self._data, self._tmp, self._locks):
            if not os.access(d, os.W_OK | os.X_OK):
                raise ConfigError(
                    f"CacheOptions(directory={directory!r}): {d} is not writable by "
                    "this user (read-only, or another user's); make it writable, or name a "
                    "directory of your own (e.g. ~/.cache/ingest-shards)"
                )

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
        an ``OSError`` of a full disk (``ENOSPC``, ``EDQUOT``, ``EFBIG``) that it lets out is
        taken as no room. None only looks (a footer read must not fetch a whole shard).
        Returns None when the shard is not cached: larger than the bound, no room (every copy
        open, or the disk full), a lock not had in time, or no ``fetch``. The caller then
        reads from the store.

        Raises:
            SourceError: If the fetched bytes are not the listed size (the object changed
                since it was listed).
            ConfigError: If something that is not a copy of the cache (a directory, a link)
                is where the shard's copy goes.
        """
        if size > self.options.max_bytes:
            return None
        if not all(map(os.path.isdir, (self._data, self._tmp, self._locks))):
            # removed since they were made (a cleaner of temporary files between two
            # epochs): the next lock file's open failed with a bare FileNotFoundError
            self._make_folders()
        path = self.path_of(self.key(url, size, version))
        held = self._open_held(path, size)
        if held is None and fetch is not None and self._fetched(url, size, path, fetch, event):
            held = self._open_held(path, size)
        event.hit = held is not None and not event.fetched_bytes
        return held

    def drop(self, url: str, size: int, version: str) -> bool:
        """Delete the copy of a shard whose bytes did not read (damaged below the file
        system), so that the next :meth:`open` fetches it again. Readers that have it open
        keep reading their file. Returns whether there was a copy."""
        path = self.path_of(self.key(url, size, version))
        with self._flock(self._stripe(path)) as locked:
            if not locked:
                return False
            return remove_copy(path)

    def _fetched(
        self, url: str, size: int, path: str, fetch: Callable[[str], None], event: CacheEvent
    ) -> bool:
        """Whether the copy is there after this: fetched here or by another process."""
        with self._flock(self._stripe(path)) as locked:
            if not locked:
                return False
            if os.path.lexists(path):
                if self._intact(path, size):  # another process fetched it meanwhile
                    return True
                remove_copy(path)  # damaged since it was sealed: fetched again below
            with self._reserved(path, size, url, event) as part:
                if part is None:
                    return False
                try:
                    return self._complete(url, size, path, part, fetch, event)
                except OSError as e:
                    if e.errno not in DISK_FULL:
                        raise
                    self._warn_full(url, size, f"{e.strerror or e}")
                    return False

    def _complete(
        self,
        url: str,
        size: int,
        path: str,
        part: str,
        fetch: Callable[[str], None],
        event: CacheEvent,
    ) -> bool:
        """Fetch into ``part``, check it and make it the sealed copy at ``path``."""
        fetch(part)
        os.chmod(part, 0o600)  # a fetcher may have written a new file with its own mode
        got = os.path.getsize(part)
        if got != size:
            raise SourceError(
                url,
                f"has {got} bytes, not the {size} it was listed with: it changed since the listing",
                "restart the stream so that it lists the dataset again",
            )
        digest = file_sha256(part)
        with open(part, "rb+") as f:
            os.fsync(f.fileno())  # a crash of the node leaves no half file either
        # The reservation becomes the copy, under the lock that sums the bytes: a sum taken
        # during the rename would see neither and let the bound pass.
        with self._flock(self._lock_path) as locked:
            if not locked:
                return False
            os.rename(part, path)
            try:
                write_seal(path, digest)
            except BaseException:
                remove_copy(path)
                raise
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

    def _stripe(self, path: str) -> str:
        return os.path.join(self._locks, f"{os.path.basename(path)[:2]}.lock")

    def _open_held(self, path: str, size: int) -> IO[bytes] | None:
        """``path`` opened with a shared lock, if it is there, whole and as sealed; else None
        (a copy that differs from its seal is left for :meth:`_fetched` to judge)."""
        try:
            # O_NONBLOCK: a FIFO put there must not hang the open; O_NOFOLLOW: nor a link
            # lead elsewhere.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise self._stray(path, "a symbolic link") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._stray(path, "not a regular file")
        f = os.fdopen(fd, "rb")
        try:
            if not self._wait(lambda: try_flock(fd, fcntl.LOCK_SH)):
                f.close()
                return None
            st = os.fstat(fd)
            if st.st_nlink == 0 or not matches_seal(path, st, size):
                f.close()  # evicted meanwhile, or not (or no longer) what was fetched
                return None
        except BaseException:
            f.close()
            raise
        with contextlib.suppress(OSError):
            os.utime(seal_of(path))  # most recently used
        return f

    def _intact(self, path: str, size: int) -> bool:
        """Whether the copy at ``path`` holds the bytes it was sealed with; a copy whose
        stat changed but whose bytes did not (moved, modes changed) is sealed again."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            raise self._stray(path, "not a regular file")
        if matches_seal(path, st, size):
            return True
        seal = read_seal(path)
        if seal is None or st.st_size != size or seal.get("size") != size:
            return False
        if file_sha256(path) != seal.get("sha256"):
            return False
        write_seal(path, str(seal["sha256"]))
        return True

    def _stray(self, path: str, what: str) -> ConfigError:
        return ConfigError(
            f"CacheOptions(directory={self.options.directory!r}): {path} is {what}, where "
            "the cache keeps a shard's copy: something other than the cache writes into its "
            "directory. Remove it, and give the cache a directory of its own"
        )

    def _warn_full(self, url: str, size: int, why: str) -> None:
        if self._warned_full:
            return
        self._warned_full = True
        warnings.warn(
            CacheWarning(
                f"the shard cache {self.root} has no room on its disk for {url} ({size} "
                f"bytes: {why}); it is read from the store instead (cache_bypassed). Free "
                "space on that disk, or lower CacheOptions(max_bytes="
                f"{self.options.max_bytes}) to what the disk holds"
            ),
            stacklevel=2,
        )

    @contextlib.contextmanager
    def _reserved(self, path: str, size: int, url: str, event: CacheEvent) -> Iterator[str | None]:
        """A part file counted at ``size`` against the bound, room made by eviction."""
        key = os.path.basename(path).split(".")[0]
        with self._flock(self._lock_path) as locked:
            if not locked:
                yield None
                return
            if not self._make_room(size, event):
                yield None
                return
            free = free_bytes(self._tmp)
            if free < size:
                self._warn_full(url, size, f"{free} bytes free")
                yield None
                return
            part = os.path.join(self._tmp, f"{key}.{size}.{secrets.token_hex(4)}.part")
            fd = open_private(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            fcntl.flock(fd, fcntl.LOCK_EX)  # alive: not a dead process's part
        try:
            yield part
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            os.close(fd)

    def _make_room(self, size: int, event: CacheEvent) -> bool:
        """Evict least recently used copies no one has open until ``size`` more bytes fit."""
        copies = sorted(self._copies(), key=lambda c: c[2])
        used = sum(s for _, s, _ in copies) + sum(s for _, s in self._parts(remove_dead=True))
        for path, bytes_, _ in copies:
            if used + size <= self.options.max_bytes:
                break
            if unlink_unheld(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(seal_of(path))
                used -= bytes_
                event.evicted_bytes += bytes_
                event.evictions += 1
        return used + size <= self.options.max_bytes

    def _copies(self) -> list[tuple[str, int, float]]:
        """Copies (path, size, last use); entries that are not regular files are not the
        cache's and are left alone. Seals whose copy is gone are removed."""
        out = []
        seals = set()
        with os.scandir(self._data) as it:
            for entry in it:
                if entry.name.endswith(".seal"):
                    seals.add(entry.path)
                elif entry.name.endswith(".shard") and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        out.append((entry.path, entry.stat(follow_symlinks=False).st_size))
        copies = []
        for path, size in out:
            seal = seal_of(path)
            seals.discard(seal)
            try:
                used = os.stat(seal).st_mtime
            except FileNotFoundError:
                used = 0.0  # never sealed: goes first
            copies.append((path, size, used))
        for seal in seals:  # its copy was evicted or dropped
            if not os.path.exists(seal.removesuffix(".seal") + ".shard"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(seal)
        return copies

    def _parts(self, *, remove_dead: bool) -> list[tuple[str, int]]:
        """Fetches under way, at their reserved size; parts of dead processes removed."""
        out = []
        with os.scandir(self._tmp) as it:
            for entry in it:
                fields = entry.name.split(".")
                if len(fields) != 4 or fields[3] != "part" or not fields[1].isdigit():
                    continue
                if remove_dead and unlink_unheld(entry.path):  # its writer is gone
                    continue
                out.append((entry.path, int(fields[1])))
        return out

    @contextlib.contextmanager
    def _flock(self, path: str) -> Iterator[bool]:
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
        try:
            locked = self._wait(lambda: try_flock(fd, fcntl.LOCK_EX))
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
