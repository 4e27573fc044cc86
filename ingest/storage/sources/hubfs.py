"""``hf://`` URLs of a source: a revision pinned to its commit, and files read over plain
HTTP range requests at that commit with the token (:mod:`ingest.storage.hub`), or, where
the Hub redirects a file (LFS, Xet), at the signed CDN URL it redirects to, asked once
(:func:`located`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from typing import IO, TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl, urljoin, urlsplit

import fsspec
import fsspec.asyn

from ingest.core.errors import SourceError
from ingest.storage import hub
from ingest.storage.sources.faults import http_refusal, refused_connection, unresolved_name
from ingest.storage.sources.options import fs_options
from ingest.storage.sources.retry import REFUSED_FIX, GaveUpError, attempt

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ingest.storage.sources.source import Source


def pin(source: Source, url: str, commits: Mapping[str, str] | None = None) -> str:
    """``url`` (``hf://``) at the commit its revision names now: one request; at its
    repository's commit in ``commits`` (by ``hf://<repo>``; a state's), with none, unless
    the URL names a commit itself (a state of another commit is refused then)."""
    where = hub.parse(url)
    if commits and not where.pinned and (sha := commits.get(f"hf://{where.repo}")):
        return where.at(sha)
    hub_token(source)  # scrubbed from the errors below

    def resolve() -> str:
        source.stats.add(listings=1)
        return hub.resolve_revision(where, source.storage_options)

    try:
        sha = attempt(resolve, source.policy(url), source.stats)
    except GaveUpError as gave_up:
        if refused_connection(gave_up.last) is not None:
            unreached = f": the endpoint {source.endpoint(url)} refused the connection"
        elif unresolved_name(gave_up.last) is not None:
            unreached = f": the endpoint {source.endpoint(url)}'s host name does not resolve"
        else:
            unreached = ""
        raise SourceError(
            url,
            f"cannot resolve revision {where.revision or 'main'!r} of {where.repo_id}"
            + f"{unreached}: {gave_up.describe(source.scrub)}",
            REFUSED_FIX
            if unreached
            else "check the repository, the revision and the token (HF_TOKEN, or "
            "storage_options={'token': ...}); a private or gated repository needs one",
        ) from None
    return where.at(sha)


def known_commit(fs: fsspec.AbstractFileSystem, url: str) -> None:
    """Tell ``fs`` (an ``HfFileSystem``) that the commit ``url`` names (one :func:`pin`
    resolved) exists. It checks a repository's revision before its first listing of it, a
    request of its own (``repo_info``), kept per instance: the commit was resolved a moment
    ago by :func:`pin`, and each lookup is a round trip on a first batch's path and a call
    against the Hub's rate limits. huggingface_hub has no public way to say so; where its
    cache is not there (another version), the lookup is made as before."""
    cache = getattr(fs, "_repo_and_revision_exists_cache", None)
    where = hub.parse(url)
    if isinstance(cache, dict) and where.pinned:
        cache[(where.repo_type, where.repo_id, where.revision)] = (True, None)


def hub_token(source: Source) -> str | None:
    """The Hub token (:func:`ingest.storage.hub.token_of`), kept among the secrets scrubbed from
    every message (it may come from the environment, not the storage options)."""
    token = hub.token_of(source.storage_options)
    if token:
        source.add_secret(token)
    return token


def hub_http(source: Source) -> fsspec.AbstractFileSystem:
    """The HTTP filesystem that reads Hub files, the token in its headers."""

    def make() -> fsspec.AbstractFileSystem:
        token = hub_token(source)
        options = fs_options("http", source.storage_options, source.retry)
        options.pop("token", None)
        options.pop("endpoint", None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return fsspec.filesystem("http", headers=headers, skip_instance_cache=True, **options)

    return source.shared_filesystem("hf-http", make)


def hub_cdn(source: Source) -> fsspec.AbstractFileSystem:
    """The HTTP filesystem that reads the signed CDN URLs the Hub redirects files to
    (:func:`located`): without the token, a second credential that a presigned URL refuses
    (and one that must not leave the Hub)."""

    def make() -> fsspec.AbstractFileSystem:
        options = fs_options("http", source.storage_options, source.retry)
        options.pop("token", None)
        options.pop("endpoint", None)
        return fsspec.filesystem("http", skip_instance_cache=True, **options)

    return source.shared_filesystem("hf-cdn", make)


LOCATION_KEPT_S = 300.0
"""How long a redirect is kept when its URL does not say when it expires."""
LOCATION_MARGIN_S = 1800.0
"""A signed URL is not handed out with less than this left before it expires: a file opened
on it is read for up to that long before a read needs a new one (:func:`expired`)."""
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def located(source: Source, url: str) -> str | None:
    """Where the Hub's resolve URL ``url`` redirects: the signed CDN URL of an LFS or Xet
    file, asked once (a ``HEAD`` that does not follow) and kept until it nears its expiry;
    None where the Hub serves the bytes itself (a file kept in git).

    The Hub counts every request to a resolve URL against the account's rate limit for
    resolvers (3,000 a 5 minutes anonymous, 5,000 for a free account), and redirects each
    one: a reader that sent every range request there spent two requests a range and the
    budget on every block it read. ``huggingface_hub``'s own file (``HfFileSystemFile``)
    sends each range to the resolve URL too, hence this.

    Raises:
        OSError: What the request raised (``FileNotFoundError``: a 404): the callers ask
            from within their retries (:func:`~ingest.storage.sources.retry.attempt`), as
            they open the file.
    """
    now = time.time()
    with source.hub_lock:
        kept = source.hub_locations.get(url)
    if kept is not None and kept[1] > now:
        return kept[0]
    fs = hub_http(source)
    location = cast("str | None", fsspec.asyn.sync(fs.loop, _redirect, fs, url))
    until = float("inf") if location is None else _expiry(location, now)
    with source.hub_lock:
        source.hub_locations[url] = (location, until)
    return location


async def _redirect(fs: Any, url: str) -> str | None:
    """The ``Location`` of ``url``'s redirect (None: not redirected), asked with a HEAD."""
    session = await fs.set_session()
    async with session.head(url, allow_redirects=False, **fs.kwargs) as response:
        if response.status in _REDIRECTS and "Location" in response.headers:
            return urljoin(url, str(response.headers["Location"]))
        if response.status == 404:
            raise FileNotFoundError(url)
        response.raise_for_status()
        return None


def _expiry(location: str, now: float) -> float:
    """When to ask again for a redirect to ``location``: :data:`LOCATION_MARGIN_S` before
    the expiry its query names (CloudFront's ``Expires``, S3's ``X-Amz-Date`` and
    ``X-Amz-Expires``), or :data:`LOCATION_KEPT_S` from now where it names none."""
    query = {k.lower(): v for k, v in parse_qsl(urlsplit(location).query)}
    expires: float | None = None
    with contextlib.suppress(ValueError):
        if "expires" in query:
            expires = float(query["expires"])
        elif "x-amz-date" in query and "x-amz-expires" in query:
            signed = dt.datetime.strptime(query["x-amz-date"], "%Y%m%dT%H%M%SZ")
            expires = signed.replace(tzinfo=dt.UTC).timestamp() + float(query["x-amz-expires"])
    if expires is None:
        return now + LOCATION_KEPT_S
    return max(now, expires - LOCATION_MARGIN_S)


def expired(source: Source, url: str, error: BaseException) -> BaseException:
    """``error`` of a read of the CDN URL that Hub resolve URL ``url`` redirected to: where
    the CDN refused it (HTTP 403: the signed URL expired while a file was read on it), the
    redirect is forgotten and a transient error returned instead, so that the read is
    retried on a new one; any other error as it is."""
    with source.hub_lock:
        kept = source.hub_locations.get(url)
    if kept is None or kept[0] is None or http_refusal(kept[0], error) is None:
        return error
    with source.hub_lock:
        source.hub_locations.pop(url, None)
    # Transient (a reset connection), and with no cause: the 403 in its chain would say
    # the request was refused for good.
    return ConnectionResetError(f"the CDN refused the signed URL of {url} (expired): {error}")


class _Signed:
    """A file read at a signed CDN URL (:func:`signed`)."""

    def __init__(self, raw: IO[bytes], source: Source, url: str) -> None:
        self._raw, self._source, self._url = raw, source, url

    def read(self, n: int = -1) -> bytes:
        try:
            return self._raw.read(n)
        except Exception as e:
            failure = expired(self._source, self._url, e)
            if failure is e:
                raise
        raise failure  # outside the handler: no context to say "refused for good"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def signed(raw: IO[bytes], source: Source, url: str) -> IO[bytes]:
    """``raw``, a file opened at the CDN URL Hub resolve URL ``url`` redirected to, whose
    reads fail with a transient error where the URL expired (:func:`expired`): the caller
    opens it again, on a new redirect."""
    return cast("IO[bytes]", _Signed(raw, source, url))
