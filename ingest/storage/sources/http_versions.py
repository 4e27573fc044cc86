"""Reads of an HTTP shard check that the server still serves the version listed.

An S3 read names the version it wants (``If-Match``: the store refuses another, 412). fsspec's
HTTP files send no such header, and sending one risks refusing every read of a server that
mishandles it (an unquoted or weak ETag, a proxy that drops it): an object overwritten on
the server since the listing was read on as its new version, the rows of two versions in one
epoch (the old version's first rows and the new one's last, some of either lost or doubled).

Every answer to a ``GET`` carries its validators, though (``ETag``, ``Last-Modified``), and
the object's size (``Content-Range``'s total; a whole answer's ``Content-Length``): each
``GET`` of a listed shard is compared with the version and size the listing saw, and an
answer of another fails the read before its body is read (:class:`~ingest.storage.sources.
faults.ChangedError`: the source names the URL and the fix, and retries nothing; a shard of
another size was retried as a short body until the deadline, or parsed as bad data). A
server that sends no validator on a ``GET`` is checked by the size alone (as its listing
warned: ``UnversionedShardWarning``). The check is an aiohttp trace hook on the HTTP filesystem's
session (fsspec makes the requests; subclassing its files to see their answers would copy
their fetches), so ranged reads, whole reads and streamed reads are all checked.

Validators compared as a server changes them without changing the content: a weak ETag
(``W/"x"``) as its strong one (nginx weakens the ETag of a compressed answer), Apache's
``-gzip`` suffix of a compressed answer's ETag left out.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import aiohttp
import yarl

from ingest.storage.sources.faults import ChangedError

_COMPRESSED = re.compile(r"[-;](gzip|br|deflate|zstd)$")
"""The suffix a server adds to the ETag of a compressed answer (Apache's mod_deflate)."""


def _etag(value: str) -> str:
    """An ETag as compared: without ``W/``, its quotes, and a compressed answer's suffix."""
    value = value.strip().removeprefix("W/").strip('"')
    return _COMPRESSED.sub("", value)


def _is_date(version: str) -> bool:
    """Whether the listed ``version`` is a modification time (``Last-Modified``)."""
    return email.utils.parsedate(version) is not None


def other_version(listed: str, headers: Mapping[str, str]) -> str | None:
    """What an answer's ``headers`` say of the object where it is not the ``listed`` version
    (the listing's: an ETag, unquoted, or ``Last-Modified``, or a digest where the server
    sent neither); None where it is, or where the answer does not tell.

    >>> other_version('abc', {"ETag": '"abc"'}) is None
    True
    >>> other_version('abc', {"ETag": '"abd"'})
    'ETag "abd"'
    """
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    same = {headers.get("Content-MD5"), headers.get("Digest"), modified}
    if listed in same or (etag is not None and _etag(etag) == _etag(listed)):
        return None
    if _is_date(listed):
        return None if modified is None else f"Last-Modified {modified}"
    return None if etag is None else f"ETag {etag}"


def other_size(listed: int, status: int, headers: Mapping[str, str]) -> int | None:
    """The object's size an answer's ``headers`` say where it is not ``listed``; None where
    it is, or where they do not tell: a part's (``206``) size is in ``Content-Range`` (a
    server that sends none says nothing), a whole answer's (``200``) is its length, unless
    compressed.

    >>> other_size(100, 206, {"Content-Range": "bytes 0-3/60"})
    60
    """
    whole = headers.get("Content-Range", "").rpartition("/")[2]
    if status == 200 and not whole and "Content-Encoding" not in headers:
        whole = headers.get("Content-Length", "")
    if not whole.isdigit():  # "*": unknown
        return None
    size = int(whole)
    return None if size == listed else size


def _key(url: str | yarl.URL) -> str:
    """``url`` as requested (encoded as aiohttp sends it), without credentials."""
    return str(yarl.URL(url).with_user(None).with_fragment(None))


class ListedVersions:
    """The version listed of each HTTP shard being read, checked against every ``GET``'s
    answer by the trace hook of :meth:`trace_config` (see the module docstring)."""

    def __init__(self) -> None:
        self._listed: dict[str, tuple[str, int]] = {}

    def expect(self, url: str, version: str, size: int) -> None:
        """Check the answers to ``GET`` requests of ``url`` against ``version`` and ``size``
        (the listing's; a shard listed again takes its new ones). No version: the size."""
        self._listed[_key(url)] = (version, size)

    def trace_config(self) -> aiohttp.TraceConfig:
        """A trace config for the HTTP filesystem's session (``client_kwargs``)."""
        config = aiohttp.TraceConfig()
        config.on_request_start.append(self._started)
        config.on_request_end.append(self._answered)
        return config

    async def _started(
        self,
        _: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestStartParams,
    ) -> None:
        ctx.url = params.url  # the URL asked for: a redirect's answer comes from another

    async def _answered(
        self, _: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestEndParams
    ) -> None:
        if params.method != "GET" or params.response.status not in (200, 206):
            return
        listed = self._listed.get(_key(getattr(ctx, "url", params.url)))
        if listed is None:
            return
        version, size = listed
        headers = params.response.headers
        other = other_version(version, headers) if version else None
        if other is not None:  # raised here, the answer is closed and the request fails
            raise ChangedError(
                f"the server answered a read with {other}, where the listing saw {version!r}"
            )
        now = other_size(size, params.response.status, headers)
        if now is not None:
            raise ChangedError(
                f"the server says it holds {now} bytes, where the listing saw {size}"
            )


def watch(fs: Any, listed: ListedVersions) -> Any:
    """``fs``, an HTTP filesystem, knowing ``listed`` (:func:`listed_versions`)."""
    fs.listed_versions = listed
    return fs


def listed_versions(fs: Any) -> ListedVersions | None:
    """The :class:`ListedVersions` of ``fs`` (an HTTP filesystem a source made), or None."""
    found: ListedVersions | None = getattr(fs, "listed_versions", None)
    return found


__all__ = ["ListedVersions", "listed_versions", "other_size", "other_version", "watch"]
