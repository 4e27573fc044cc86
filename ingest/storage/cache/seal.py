"""Seals: what a cached copy was when it was fetched (the SHA-256 of its bytes, and its size,
inode, modification and change times), and whether it still is (see
:mod:`ingest.storage.cache`). A seal's own modification time is the copy's last use."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from typing import Any

from ingest.storage.cache.files import open_private

_SEAL_VERSION = 1
_CHUNK = 1 << 20


def seal_of(path: str) -> str:
    """The seal's path of the copy at ``path``."""
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


def write_seal(path: str, digest: str) -> None:
    """Seal the copy at ``path`` as it is now, with the SHA-256 ``digest`` of its bytes."""
    seal = {"version": _SEAL_VERSION, "sha256": digest, **_identity(os.stat(path))}
    fd = open_private(seal_of(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        json.dump(seal, f)


def read_seal(path: str) -> dict[str, Any] | None:
    """The seal of the copy at ``path``, or None if it has none of this version."""
    try:
        with open(seal_of(path)) as f:
            seal = json.load(f)
    except (OSError, ValueError):
        return None  # none (a copy of an older version, or a half-written seal): not intact
    if not isinstance(seal, dict) or seal.get("version") != _SEAL_VERSION:
        return None
    return seal


def matches_seal(path: str, st: os.stat_result, size: int) -> bool:
    """Whether the copy at ``path`` (stat ``st``) is ``size`` bytes and as it was sealed."""
    seal = read_seal(path)
    if seal is None or st.st_size != size:
        return False
    return all(seal.get(name) == value for name, value in _identity(st).items())


def file_sha256(path: str) -> str:
    """The SHA-256 of the file at ``path``, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def remove_copy(path: str) -> bool:
    """Delete a copy (its seal first: a copy without one is never served). Whether there
    was one."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(seal_of(path))
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
