"""The file a source hands to a format reader: reads counted into :class:`IOStats`, each one
whole or retried under the source's :class:`RetryPolicy`."""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any, TypeVar

from ingest.core.errors import SourceError, StoreError
from ingest.storage.sources.faults import RangeIgnoredError, ShortBodyError, is_range_ignored
from ingest.storage.sources.retry import GaveUpError, RetryPolicy, attempt, store_error
from ingest.storage.sources.shard import Shard
from ingest.storage.sources.stats import IOStats

WHOLE_BODY_BYTES = 4 << 20
"""A shard up to this size is read from the whole body when its server ignores ``Range``
(answers ``200`` with the whole file); a larger one fails at once, naming the server."""


class RangeIgnoredWarning(UserWarning):
    """A server answered a range request with the whole file; the shard (small) is read from
    that body, one whole-file request per read instead of a range."""


def range_ignored(
    url: str, endpoint: str, size: int, start: int, stop: int, *, whole: bool = True
) -> RangeIgnoredWarning | StoreError:
    """What a server that ignored ``Range`` for bytes ``[start, stop)`` of ``url`` gives:
    a warning for a shard small enough to read from a whole body (``whole``: one can be
    had), else the :class:`StoreError` (raised at once: no retry mends it)."""
    said = f"the server {endpoint} ignored the Range header"
    whole_file = f"with the whole file ({size} bytes)"
    if whole and size <= WHOLE_BODY_BYTES:
        return RangeIgnoredWarning(
            f"{url}: {said}: it answers range requests {whole_file}; the shard is read from "
            f"the whole body, as it is at most {WHOLE_BODY_BYTES} bytes. Serve the shards "
            "from a server that honours range requests (answers 206) to read only the "
            "bytes needed"
        )
    said = f"{said}: it answered a request for bytes [{start}, {stop}) {whole_file}"
    return StoreError(
        url,
        f"{said}; a shard over {WHOLE_BODY_BYTES} bytes is read only with range requests "
        "(it would be fetched whole for every read)",
        "serve the shards from a server that honours range requests (answers 206 Partial "
        "Content with Accept-Ranges: bytes), such as nginx, Apache, S3 or a CDN",
        byte=start,
    )


class CountingFile:
    """A read-only file wrapper that counts read calls and bytes into :class:`IOStats`.

    A read returns every byte asked for (up to the end of the shard) or raises: a body cut
    short, a dropped connection or a timeout is retried on a reopened file under the
    source's :class:`RetryPolicy`, and a read that still fails becomes a :class:`StoreError`
    naming the URL, the byte range and the retries.
    """

    def __init__(
        self,
        raw: IO[bytes],
        reopen: Callable[[], IO[bytes]],
        stats: IOStats | None,
        size: int,
        url: str,
        scrub: Callable[[str], str],
        policy: RetryPolicy | None,
        endpoint: str = "",
        whole: Callable[[], bytes] | None = None,
    ) -> None:
        self._reopen = reopen
        self._whole = whole
        self._endpoint = endpoint
        self._raw = raw
        self._stats = stats
        self._url = url
        self._scrub = scrub
        self._policy = policy
        self._pos = 0
        self._broken = False
        self.size = size
        self.closed = False

    def _read_exactly(self, pos: int, want: int) -> bytes:
        if self._broken:
            self._raw.close()
            self._raw = self._reopen()
            self._broken = False
        try:
            if self._raw.tell() != pos:
                self._raw.seek(pos)
            data = self._raw.read(want)
        except Exception as e:
            self._broken = True
            if is_range_ignored(e):
                raise RangeIgnoredError(str(e)) from e
            raise
        if len(data) != want:
            self._broken = True
            raise ShortBodyError(f"the response held {len(data)} of the {want} bytes asked for")
        return data

    def read(self, n: int | None = -1) -> bytes:
        pos = self._pos
        want = self.size - pos if n is None or n < 0 else min(n, self.size - pos)
        if want <= 0:
            return b""
        try:
            data = attempt(lambda: self._read_exactly(pos, want), self._policy, self._stats)
        except RangeIgnoredError:
            data = self._from_whole_body(pos, want)
        except GaveUpError as e:
            raise store_error(
                self._url,
                f"read of bytes [{pos}, {pos + want}) failed",
                e,
                "check the store and the network; the deadline, timeouts and backoff are "
                "set with ReadOptions(retry=ingest.RetryPolicy(...))",
                endpoint=self._endpoint,
                scrub=self._scrub,
                byte=pos,
            ) from None
        self._pos = pos + len(data)
        if self._stats is not None:
            self._stats.add(reads=1, bytes_read=len(data))
        return data

    def _from_whole_body(self, pos: int, want: int) -> bytes:
        """Bytes ``[pos, pos + want)`` from the whole file, fetched once, for a server that
        ignores ``Range`` (see :func:`range_ignored`); the file reads from memory after.

        Raises:
            StoreError: If the shard is too large to read so, or no whole body can be had.
        """
        fetch = self._whole
        said = range_ignored(
            self._url, self._endpoint, self.size, pos, pos + want, whole=fetch is not None
        )
        if isinstance(said, StoreError) or fetch is None:
            raise said
        try:
            body = attempt(fetch, self._policy, self._stats)
        except GaveUpError as e:
            raise store_error(
                self._url,
                "fetching the whole file (its server ignores Range) failed",
                e,
                "check the store and the network",
                endpoint=self._endpoint,
                scrub=self._scrub,
            ) from None
        if len(body) != self.size:
            raise StoreError(
                self._url,
                f"the whole file its server sent (it ignores Range) holds {len(body)} bytes, "
                f"not the {self.size} listed",
                "the file changed since it was listed: restart the epoch",
                byte=0,
            )
        warnings.warn(said, stacklevel=4)
        if self._stats is not None:  # what was sent; the reads after it are from memory
            self._stats.add(reads=1, bytes_read=len(body))
        self._stats = None
        self._raw.close()
        self._raw = io.BytesIO(body)
        self._reopen = lambda: io.BytesIO(body)
        self._policy = None
        return body[pos : pos + want]

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}.get(whence)
        if base is None:
            raise ValueError(f"whence={whence} is not 0, 1 or 2")
        if base + offset < 0:
            raise ValueError(f"cannot seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._raw.close()

    def __enter__(self) -> CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_S3_ETAG = re.compile(r"[0-9a-f]{32}(-[0-9]+)?")
"""An S3 ETag without its quotes: an MD5, or a multipart upload's MD5 and part count."""


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is this machine's file system (fsspec's ``file``/``local``)."""
    protocol = fs.protocol
    return "file" in ((protocol,) if isinstance(protocol, str) else tuple(protocol))


def local_change(shard: Shard, path: str) -> SourceError | None:
    """The error for a local file ``path`` (listed as ``shard``) whose size or modification
    time is no longer the listing's, or that is gone; None where it is as listed.

    A store's read names the version listed (:func:`with_listed_details`: ``If-Match``), a
    local read cannot: a file rewritten in place is read on as its new version (the same
    inode: a JSONL file's next lines, or Parquet's row groups at the old footer's offsets),
    and a file replaced by a rename is read as the new one from its next open. So a local
    shard's reads are followed by this ``stat`` (a microsecond or two) before what they read
    is handed on (:mod:`ingest.formats.listed_version`). The modification time is the
    version a local listing records (fsspec's ``mtime``): a writer changes it as it writes.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return SourceError(
            shard.url,
            "disappeared after it was listed",
            "the dataset changed under the stream; restart the epoch or restore the file",
        )
    except OSError:
        return None  # unreadable: the read says why
    if st.st_size == shard.size and (not shard.version or str(st.st_mtime) == shard.version):
        return None
    return SourceError(
        shard.url,
        f"changed after it was listed (listed: {shard.size} bytes, modified "
        f"{_when(shard.version)}; now {st.st_size} bytes, modified {_when(str(st.st_mtime))}): "
        "its rows would mix two versions",
        "the dataset changed under the stream; restart the epoch (its listing takes the new "
        "version) or restore the file; write new shards under new names rather than "
        "rewriting or replacing a file that a stream may be reading",
    )


_T = TypeVar("_T")


def as_listed(shard: Shard, path: str, read: Callable[[], _T]) -> _T:
    """``read()``, something read of the local file ``path`` (listed as ``shard``), refused
    where the file is no longer as listed once it is read (:func:`local_change`); a read
    that failed on a file that changed says it changed. The end of an iterator read so
    (``StopIteration``) passes as it is: what was read before it was checked."""
    try:
        got = read()
    except StopIteration:
        raise
    except Exception as e:
        error = local_change(shard, path)
        if error is not None:
            raise error from e
        raise
    error = local_change(shard, path)
    if error is not None:
        raise error
    return got


def _when(mtime: str) -> str:
    """A local version (a modification time in seconds) as a UTC time, where it is one."""
    try:
        return datetime.fromtimestamp(float(mtime), tz=UTC).isoformat(timespec="microseconds")
    except (ValueError, OverflowError, OSError):
        return repr(mtime)


def listed_etag(shard: Shard) -> str | None:
    """The ETag the listing saw of an S3 object (quoted, as S3 sends it), or None: another
    store's version, or a member of an archive (its version is the archive's)."""
    if _S3_ETAG.fullmatch(shard.version) and not shard.members:
        return f'"{shard.version}"'
    return None


def with_listed_details(f: Any, path: str, shard: Shard) -> IO[bytes]:
    """``f`` (just opened), told what the listing saw of it where that saves a request, and
    reading only the version listed.

    s3fs asks the store for an object's details (a HEAD) on the first read of every file it
    opens, to hand its ETag to each ranged GET: one request per shard opened, half of what
    reading a small shard sends (an index pass over small JSONL shards: 9.3 ms a shard
    before, 5.3 ms after). The listing holds the ETag, so it is given instead, and every
    ranged GET names it (``If-Match``, as s3fs does with the ETag of its HEAD): a read of an
    object overwritten since the listing is refused (:func:`~ingest.storage.sources.faults.
    is_changed`), where it read the new version's bytes at the old version's offsets. A
    store without ``If-Match`` (``local_expiry_check=True``) compares each GET's ETag.
    """
    # An s3fs file: the source's (ingest.storage.sources.s3) subclasses s3fs's.
    s3 = any(c.__module__.startswith("s3fs") for c in type(f).__mro__)
    etag = listed_etag(shard)
    if s3 and etag is not None:
        f.details = {"name": path, "size": shard.size, "ETag": etag, "type": "file"}
        if not f.fs.local_expiry_check:
            f.read_kw = {**f.read_kw, "IfMatch": etag}  # (s3fs's: RequestPayer)
    return f  # type: ignore[no-any-return]
