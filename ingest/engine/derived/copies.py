"""Where derived copies live, as named blobs: a node's directory (:class:`LocalCopies`) or an
fsspec URL a cluster shares (:class:`SharedCopies`). Both read a copy whole, write one whole
and atomically, and drop a damaged one; what a copy holds and its checksum are the store's
(:mod:`ingest.engine.derived.store`).

The node's directory is the shard cache's machinery (:class:`ingest.storage.cache.ShardCache`:
owner-only files, a byte bound with least-recently-used eviction, copies sealed and renamed
into place, locks between processes), with copies named by the derived key alone: a shard's
copy is named by its URL, size and version, a derived copy's size is only known once it is
made, and its key already holds the shard's size and version.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Mapping
from typing import Any, Protocol

from fsspec.utils import get_protocol

from ingest.core.errors import IngestError, LocationError, redact
from ingest.engine.derived.codec import CorruptDerivedError
from ingest.storage.cache import CacheEvent, CacheOptions, ShardCache
from ingest.storage.cache.files import open_private
from ingest.storage.cache.seal import matches_seal
from ingest.storage.sources import Source, is_store_error

STALE_WRITE_S = 3600.0
"""A temporary file of a shared ``file://`` store older than this (seconds since its last
write) is a dead writer's (killed before it linked its copy) and the next writer in its
folder removes it: a live writer writes its copy at once and links it within seconds."""

SUFFIX = ".derived"
"""A shared copy's file name: ``<name[:2]>/<name>.derived`` under the URL (256 folders, so
that no local folder holds millions of files)."""


class DerivedStoreError(LocationError):
    """A shared derived store cannot be read or written (not a damaged copy: that is a miss)."""

    what = "derived store"


class Copies(Protocol):
    """Named blobs, each written whole and at once, read whole."""

    location: str
    """Where they live, for messages (no credentials)."""

    def read(self, name: str) -> bytes | None:
        """The blob named ``name``, or None if there is none.

        Raises:
            CorruptDerivedError: If there is one but not as it was written (it is removed).
        """
        ...

    def has(self, name: str) -> bool:
        """Whether a copy named ``name`` is there: a look, its bytes neither read nor
        checked (a damaged copy is found, removed and written again when it is read)."""
        ...

    def write(self, name: str, blob: bytes, event: CacheEvent) -> bool:
        """Store ``blob`` as ``name`` unless a copy is there already; whether this call wrote
        it (False too where a node's directory has no room). Evictions go in ``event``."""
        ...

    def drop(self, name: str) -> None:
        """Remove the copy named ``name`` (damaged), so that the next writer writes it."""
        ...

    def where(self, name: str) -> str:
        """Where the copy named ``name`` is or would be: a local path, or a URL."""
        ...

    def usage(self) -> int | None:
        """Bytes held now, where bounded (a node's directory); None where not counted."""
        ...


class DerivedDirectory(ShardCache):
    """The shard cache's directory, its copies named by a derived key's name alone (passed
    as ``url``; ``size`` is the copy's own, checked against its seal, not part of its name)."""

    @staticmethod
    def key(url: str, size: int, version: str) -> str:
        """The copy's name: the derived key's (``url``), which names the source's size and
        version already."""
        return url


class LocalCopies:
    """Copies in a node's directory: bounded in bytes, least recently used evicted first,
    owner-only, sealed (see :class:`ingest.storage.cache.ShardCache`).

    Raises:
        ConfigError: If the directory cannot be made or written, or belongs to another user.
    """

    def __init__(self, options: CacheOptions) -> None:
        self.cache = DerivedDirectory(options)
        self.location = self.cache.root

    def read(self, name: str) -> bytes | None:
        path = self.cache.path_of(name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if matches_seal(path, st, st.st_size):
            held = self.cache.open(name, st.st_size, "", None, CacheEvent())
        else:
            # Not as sealed: written into, cut short, replaced, or sealed this instant by
            # its writer. The cache judges it under the copy's lock, as for a shard: the
            # same bytes (re-sealed) are read, others removed; nothing is fetched.
            try:
                held = self.cache.open(name, st.st_size, "", _refuse, CacheEvent())
            except NotFetchedError:
                held = None
            if held is None:
                raise CorruptDerivedError(f"{path} is not the copy that was sealed")
        if held is None:
            return None  # evicted since
        with held:
            return held.read()

    def has(self, name: str) -> bool:
        path = self.cache.path_of(name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        # As sealed (a stat and the seal's few bytes); one that is not is judged, and kept
        # or removed, by the read or the write that comes to it.
        return matches_seal(path, st, st.st_size)

    def write(self, name: str, blob: bytes, event: CacheEvent) -> bool:
        if self._present(name, len(blob)):
            return False
        held = self.cache.open(name, len(blob), "", lambda part: _write(part, blob), event)
        if held is not None:
            held.close()
        return event.fetched_bytes > 0

    def _present(self, name: str, size: int) -> bool:
        """Whether a sealed copy of ``size`` bytes is there (a look, no write)."""
        held = self.cache.open(name, size, "", None, CacheEvent())
        if held is None:
            return False
        held.close()
        return True

    def drop(self, name: str) -> None:
        path = self.cache.path_of(name)
        with contextlib.suppress(FileNotFoundError):
            self.cache.drop(name, os.lstat(path).st_size, "")

    def where(self, name: str) -> str:
        return self.cache.path_of(name)

    def usage(self) -> int:
        """Bytes the directory holds (copies and writes under way).

        Raises:
            TimeoutError: If the directory's lock is not had in ``lock_timeout_s``.
        """
        return self.cache.usage()


class SharedCopies:
    """Copies at an fsspec URL every job of a cluster shares, written once: a writer that
    finds a copy there writes nothing.

    On a local file system (``file://``, an NFS mount) a copy is written to a temporary file,
    synced, and linked to its name, which fails if the name exists: exactly one writer's
    copy is ever seen, and never a part of one. On an object store one PUT is atomic, so a
    copy is written straight to its name after a look for it; two writers racing both write,
    the same bytes for the same key (their store is deterministic for equal inputs), and the
    last stays. Nothing here is ever evicted: the bucket's lifecycle rules bound it.

    Raises:
        DerivedStoreError: If the URL's filesystem cannot be set up (no backend installed).
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any]) -> None:
        self._opener = Source(url, storage_options=storage_options)
        self.location = self._opener.scrub(redact(url))
        try:
            self.fs = self._opener.filesystem(url)
        except IngestError as e:
            raise DerivedStoreError(
                url, str(e), "install the fsspec backend or fix the URL"
            ) from None
        self.root = str(self.fs._strip_protocol(url)).rstrip("/")
        self.local = get_protocol(url) in ("file", "local")

    def path(self, name: str) -> str:
        """Where the copy named ``name`` is, on the filesystem (no protocol)."""
        return f"{self.root}/{name[:2]}/{name}{SUFFIX}"

    def where(self, name: str) -> str:
        if self.local:
            return self.path(name)
        return f"{self.location.rstrip('/')}/{name[:2]}/{name}{SUFFIX}"

    def usage(self) -> None:
        return None

    def read(self, name: str) -> bytes | None:
        try:
            # From byte 0, not the whole object: s3fs asks a whole object's size first (a
            # HEAD per copy read, every epoch), which a read from a start does not.
            return bytes(self.fs.cat_file(self.path(name), start=0))
        except FileNotFoundError:
            return None
        except Exception as e:
            raise self._error(e, "read") from None

    def has(self, name: str) -> bool:
        try:
            return bool(self.fs.exists(self.path(name)))
        except Exception as e:
            raise self._error(e, "look for a copy in") from None

    def write(self, name: str, blob: bytes, event: CacheEvent) -> bool:
        path = self.path(name)
        try:
            if self.local:
                return _link_once(path, blob)
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, blob)
        except Exception as e:
            raise self._error(e, "write") from None
        event.fetched_bytes = len(blob)
        return True

    def drop(self, name: str) -> None:
        try:
            self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass
        except Exception as e:
            raise self._error(e, "remove a damaged copy from") from None

    def _error(self, error: BaseException, verb: str) -> BaseException:
        if not is_store_error(error) and not isinstance(error, PermissionError):
            return error
        return DerivedStoreError(
            self.location,
            f"cannot {verb} it ({type(error).__name__}: {self._opener.scrub(str(error))})",
            "check the URL, its storage options (credentials, endpoint) and the network, or "
            "give the derived store another location",
        )


class NotFetchedError(Exception):
    """Raised by a fetch that is only a look: a damaged copy was removed, none written."""


def _refuse(part: str) -> None:
    """The fetch of a read: a reader writes a copy only once it has derived the unit."""
    raise NotFetchedError(part)


def _write(path: str, blob: bytes) -> None:
    """Write ``blob`` to ``path`` (the shard cache's part file, synced by the cache)."""
    with open(path, "wb") as f:
        f.write(blob)


def _link_once(path: str, blob: bytes) -> bool:
    """Write ``blob`` at ``path`` on a local file system unless a file is there: a temporary
    file, synced, then hard-linked to ``path`` (``link`` fails where the name exists, which
    ``rename`` would replace). Whether this call wrote it."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if os.path.exists(path):
        return False
    _remove_stale_temps(folder)
    temp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}{_TEMP}")
    fd = open_private(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


_TEMP = ".tmp"


def _remove_stale_temps(folder: str) -> None:
    """Remove the temporary files in ``folder`` last written over :data:`STALE_WRITE_S`
    ago: those of writers killed before they linked their copy, which nothing else removes
    (the copy's next writer writes a temporary file of its own)."""
    before = time.time() - STALE_WRITE_S
    with os.scandir(folder) as entries:
        for entry in entries:
            if not (entry.name.startswith(".") and entry.name.endswith(_TEMP)):
                continue
            with contextlib.suppress(FileNotFoundError):  # another writer removed it first
                if entry.stat(follow_symlinks=False).st_mtime < before:
                    os.unlink(entry.path)


__all__ = [
    "STALE_WRITE_S",
    "SUFFIX",
    "Copies",
    "DerivedDirectory",
    "DerivedStoreError",
    "LocalCopies",
    "NotFetchedError",
    "SharedCopies",
]
