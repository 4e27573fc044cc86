"""The shard cache's folders and files, owner-only whatever the umask (a folder of another
user is refused), and the ``flock`` locks that its processes share."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

from ingest.core.errors import ConfigError

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""Write errors that mean a disk cannot take a file (the cache's, or a copy's): read from the
store instead."""

# -- owner-only folders and files -------------------------------------------------------


def make_private_dirs(path: str, option: str) -> None:
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


def check_private(path: str, option: str) -> None:
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


def open_private(path: str, flags: int) -> int:
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


# -- the disk and locks --------------------------------------------------------------------


def free_bytes(path: str) -> int:
    """Bytes free to this user on the disk that holds ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def try_flock(fd: int, how: int) -> bool:
    """Take the ``flock`` ``how`` on ``fd`` without waiting: whether it was taken."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def unlink_unheld(path: str) -> bool:
    """Delete ``path`` unless a process holds a lock on it: a copy a reader has open, or
    the part file of a fetch whose writer is alive. True if it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    try:
        if not try_flock(fd, fcntl.LOCK_EX):
            return False
        if os.fstat(fd).st_nlink > 0:  # else another process deleted it first
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return True
    finally:
        os.close(fd)
