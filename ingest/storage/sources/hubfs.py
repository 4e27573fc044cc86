"""``hf://`` URLs of a source: a revision pinned to its commit, and files read over plain
HTTP range requests at that commit with the token (:mod:`ingest.storage.hub`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import fsspec

from ingest.core.errors import SourceError
from ingest.storage import hub
from ingest.storage.sources.faults import refused_connection
from ingest.storage.sources.options import fs_options
from ingest.storage.sources.retry import REFUSED_FIX, GaveUpError, attempt

if TYPE_CHECKING:
    from ingest.storage.sources.source import Source


def pin(source: Source, url: str) -> str:
    """``url`` (``hf://``) at the commit its revision names now: one request."""
    where = hub.parse(url)
    hub_token(source)  # scrubbed from the errors below

    def resolve() -> str:
        source.stats.add(listings=1)
        return hub.resolve_revision(where, source.storage_options)

    try:
        sha = attempt(resolve, source.policy(url), source.stats)
    except GaveUpError as gave_up:
        refused = refused_connection(gave_up.last) is not None
        raise SourceError(
            url,
            f"cannot resolve revision {where.revision or 'main'!r} of {where.repo_id}"
            + (f": the endpoint {source.endpoint(url)} refused the connection" if refused else "")
            + f": {gave_up.describe(source.scrub)}",
            REFUSED_FIX
            if refused
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
