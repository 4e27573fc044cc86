"""A node-local shard cache: whole shards on local disk under a byte bound, owner-only.

Opt-in with ``ReadOptions(cache=CacheOptions(directory, max_bytes))``. The first read of a
shard on a node fetches it whole (one request) into the directory; later reads on that node,
in any process and after a restart, open the local copy and send no request.

Why not fsspec's ``filecache``/``blockcache``: their index is one JSON file that every
process rewrites (concurrent readers on a node lose entries or serve a stale one), they
bound nothing but age (no byte bound, no LRU eviction), and they validate a copy with an
extra request per open (``ukey``/``info``). Here the listing already carries each shard's
size and version, so the copy's name is derived from them: a shard that changed in the store
has another name and is fetched again, with no request to check.

Files under ``directory`` (the cache's own folders are 0700 and its files 0600 whatever the
umask, like the shard index: cached shards of a private bucket are no one else's to read; a
folder of the cache owned by another user is refused):

- ``data/<key>.shard``: complete copies; an atomic rename puts one in place, so a process
  that dies mid-fetch never leaves a half file where a reader looks. Readers hold a shared
  ``flock`` on the copy while it is open; eviction takes an exclusive one without waiting and
  passes over a copy it cannot take, so it never deletes a file a reader has open.
- ``data/<key>.seal``: what the copy was when it was fetched: the SHA-256 of its bytes, and
  its size, inode, modification and change times. Its own modification time is the copy's
  last use (least recently used goes first), so that opening a copy never touches the copy.
- ``tmp/<key>.<bytes>.<nonce>.part``: fetches under way, each held by its writer with an
  exclusive ``flock`` and counted at its full size against the bound before it starts. A
  part whose lock can be taken belongs to a dead process and is removed.
- ``cache.lock``: taken while the bytes in use are summed and room is made, so that several
  processes never pass the bound between them. ``locks/<nn>.lock``: 256 stripes of one
  fetcher per shard on the node.

Damaged copies. The seal is checked on every open with one ``stat``, not by hashing: a
change through the file system (a write, a truncation, a replaced file, even with its
modification time put back) changes the change time, which no one can set. Only a copy whose
stat differs is hashed again: the same bytes (a copy moved to another disk, its modes
changed) are sealed anew; other bytes are dropped and fetched again. Hashing every open was
rejected: SHA-256 runs at about 1.4 GB/s on one core (CRC32 2.2 GB/s), so a 512 MB copy
would cost 0.4 s of a reader's CPU per open, and whole-file hashing defeats what a cached
Parquet shard is for (reading a few columns, seeking to a row group on resume). Damage below
the file system (a failing disk) shows as a read error instead: the feed then drops the copy
and fetches the shard again once (:meth:`ShardCache.drop`) before it blames the shard.

Least recently used goes first. A shard larger than the bound, one for which no room can be
made because every copy is open, or one that does not fit on the disk (its free space is
below the shard's size, or a write ran out of space) is read from the store as if there were
no cache (``cache_bypassed`` in the stats); a full disk also warns once per process with a
:class:`CacheWarning` naming the directory and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import secrets
import stat
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from ingest.core.errors import ConfigError, SourceError

_POLL_S = 0.02
_SEAL_VERSION = 1
# Write errors that mean the cache's disk cannot take the shard: read it from the store.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_CHUNK = 1 << 20


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


class ShardCache:
    """The cache directory of one node (see the module docstring). Safe across processes.

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
        _make_private_dirs(self.root, options.directory)
        for d in (self._data, self._tmp, self._locks):
            _make_private_dirs(d, options.directory)
            _check_private(d, options.directory)
        for d in (self.root, self._data, self._tmp, self._locks):
            if not os.access(d, os.W_OK | os.X_OK):
                raise ConfigError(
                    f"CacheOptions(directory={options.directory!r}): {d} is not writable by "
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
            return _remove_copy(path)

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
                _remove_copy(path)  # damaged since it was sealed: fetched again below
            with self._reserved(path, size, url, event) as part:
                if part is None:
                    return False
                try:
                    return self._complete(url, size, path, part, fetch, event)
                except OSError as e:
                    if e.errno not in _DISK_FULL:
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
        digest = _sha256(part)
        with open(part, "rb+") as f:
            os.fsync(f.fileno())  # a crash of the node leaves no half file either
        # The reservation becomes the copy, under the lock that sums the bytes: a sum taken
        # during the rename would see neither and let the bound pass.
        with self._flock(self._lock_path) as locked:
            if not locked:
                return False
            os.rename(part, path)
            try:
                _write_seal(path, digest)
            except BaseException:
                _remove_copy(path)
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
            if not self._wait(lambda: _try_flock(fd, fcntl.LOCK_SH)):
                f.close()
                return None
            st = os.fstat(fd)
            if st.st_nlink == 0 or not _matches_seal(path, st, size):
                f.close()  # evicted meanwhile, or not (or no longer) what was fetched
                return None
        except BaseException:
            f.close()
            raise
        with contextlib.suppress(OSError):
            os.utime(_seal_of(path))  # most recently used
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
        if _matches_seal(path, st, size):
            return True
        seal = _read_seal(path)
        if seal is None or st.st_size != size or seal.get("size") != size:
            return False
        if _sha256(path) != seal.get("sha256"):
            return False
        _write_seal(path, str(seal["sha256"]))
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
            free = _free_bytes(self._tmp)
            if free < size:
                self._warn_full(url, size, f"{free} bytes free")
                yield None
                return
            part = os.path.join(self._tmp, f"{key}.{size}.{secrets.token_hex(4)}.part")
            fd = _open_private(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
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
            if _unlink_unheld(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_seal_of(path))
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
            seal = _seal_of(path)
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
                if remove_dead and _unlink_unheld(entry.path):  # its writer is gone
                    continue
                out.append((entry.path, int(fields[1])))
        return out

    @contextlib.contextmanager
    def _flock(self, path: str) -> Iterator[bool]:
        fd = _open_private(path, os.O_RDWR | os.O_CREAT)
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


# -- owner-only folders and files -------------------------------------------------------


def _make_private_dirs(path: str, option: str) -> None:
    """Create ``path`` and its missing parents, each 0700 whatever the umask.

    Raises:
        ConfigError: If a folder cannot be made (read-only, permissions, a file in the way).
    """
    missing = []
    head = path
    while not os.path.isdir(head):
        missing.append(head)
        parent = os.path.dirname(head)
        if parent == head:
            break
        head = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise ConfigError(
                    f"CacheOptions(directory={option!r}): {directory} is a file, not a "
                    "directory; name another directory for the cache"
                ) from None
            continue
        except OSError as e:
            raise ConfigError(
                f"CacheOptions(directory={option!r}): cannot create {directory} "
                f"({e.strerror or e}); name a directory this user can write (e.g. "
                "~/.cache/ingest-shards), or fix the permissions"
            ) from None
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask


def _check_private(path: str, option: str) -> None:
    """Make a folder of the cache owner-only (0700), or refuse one of another user.

    Raises:
        ConfigError: If the folder belongs to another user, or its modes cannot be fixed.
    """
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"CacheOptions(directory={option!r}): {path} belongs to user {st.st_uid}, not to "
            f"this one ({os.geteuid()}): cached shards would be shared with another user. Name "
            "a directory of your own (e.g. ~/.cache/ingest-shards)"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        try:
            os.chmod(path, 0o700)  # a cache made by an older version (0755): tightened
        except OSError as e:
            raise ConfigError(
                f"CacheOptions(directory={option!r}): {path} has mode "
                f"{oct(stat.S_IMODE(st.st_mode))} and cannot be made owner-only (0700): "
                f"{e.strerror or e}. Fix its modes, or name another directory"
            ) from None


def _open_private(path: str, flags: int) -> int:
    """``os.open`` with mode 0600 whatever the umask, for a file this process creates."""
    fd = os.open(path, flags, 0o600)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != 0o600 and st.st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- seals ----------------------------------------------------------------------------------


def _seal_of(path: str) -> str:
    return path.removesuffix(".shard") + ".seal"


def _identity(st: os.stat_result) -> dict[str, int]:
    """What changes when anything is done to a file through the file system: the change
    time (``st_ctime_ns``) cannot be set by a user, unlike the modification time."""
    return {
        "size": st.st_size,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def _write_seal(path: str, digest: str) -> None:
    """Seal the copy at ``path`` as it is now, with the SHA-256 ``digest`` of its bytes."""
    seal = {"version": _SEAL_VERSION, "sha256": digest, **_identity(os.stat(path))}
    fd = _open_private(_seal_of(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        json.dump(seal, f)


def _read_seal(path: str) -> dict[str, Any] | None:
    try:
        with open(_seal_of(path)) as f:
            seal = json.load(f)
    except (OSError, ValueError):
        return None  # none (a copy of an older version, or a half-written seal): not intact
    if not isinstance(seal, dict) or seal.get("version") != _SEAL_VERSION:
        return None
    return seal


def _matches_seal(path: str, st: os.stat_result, size: int) -> bool:
    seal = _read_seal(path)
    if seal is None or st.st_size != size:
        return False
    return all(seal.get(name) == value for name, value in _identity(st).items())


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _remove_copy(path: str) -> bool:
    """Delete a copy (its seal first: a copy without one is never served). Whether there
    was one."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_seal_of(path))
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


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
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
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


__all__ = ["CacheEvent", "CacheOptions", "CacheWarning", "ShardCache"]
