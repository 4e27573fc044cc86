"""The Hugging Face Hub (``hf://``): one listing, pinned to a commit, and plain range reads.

``hf://datasets/<org>/<name>[@<revision>]/<path or glob>`` (``spaces/...``, or a model repo
with no prefix) is read in two parts, so that the Hub's request count never grows with the
number of ranks or readers:

- Listing, once per epoch by the coordinator (or the one :class:`ingest.Stream`): the
  revision (a branch, a tag, ``refs/convert/parquet``, written ``refs%2Fconvert%2Fparquet``
  or as is) is resolved to its commit in one request, and the glob is listed with
  ``huggingface_hub.HfFileSystem`` at that commit. Shard URLs name the commit
  (``hf://datasets/org/name@<sha>/...``): a branch that moves during a run changes no shard
  under it. A listing at a commit never changes, so it is kept with the shard index
  (:meth:`ingest.IndexStore.put_listing`) and a restarted job does not list again: it
  resolves the revision (one request) and finds the listing.
- Reading, by every reader: HfFileSystem's ``open`` first lists the file's folder and looks
  the revision up, per process. Readers instead send plain HTTP range requests to the
  file's ``resolve`` URL at the listed commit (``<endpoint>/datasets/<repo>/resolve/<sha>/
  <path>``) with the size the listing gave: no listing, no lookup, no HEAD.

The token is the ``token`` storage option, else ``huggingface_hub``'s own (``HF_TOKEN``,
``huggingface-cli login``); the endpoint is the ``endpoint`` storage option, else
``HF_ENDPOINT``. The token is sent only as an ``Authorization`` header, and scrubbed from
every message. 429 answers are retried as the Hub asks (``Retry-After``) under the source's
:class:`~ingest.RetryPolicy`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from ingest.core.errors import ConfigError

_TYPES = {"datasets": "dataset", "spaces": "space"}
_SHA = re.compile(r"^[0-9a-f]{40}$")
# Revisions with slashes written as is: refs/convert/<name>, refs/pr/<n>.
_SLASHED = re.compile(r"^(refs/(?:convert|pr)/[^/]+)(?:/(.*))?$")


@dataclass(frozen=True, slots=True)
class HubPath:
    """An ``hf://`` URL taken apart."""

    repo_type: str
    """``"dataset"``, ``"space"`` or ``"model"``."""
    repo_id: str
    revision: str | None
    path: str
    """The path (or glob) in the repository, without a leading slash."""

    @property
    def pinned(self) -> bool:
        """Whether the revision is a commit (a listing at it never changes)."""
        return self.revision is not None and bool(_SHA.match(self.revision))

    @property
    def repo(self) -> str:
        """``datasets/org/name``, ``spaces/org/name`` or (a model) ``org/name``."""
        prefix = "" if self.repo_type == "model" else f"{self.repo_type}s/"
        return f"{prefix}{self.repo_id}"

    def at(self, sha: str) -> str:
        """This URL at commit ``sha``."""
        tail = f"/{self.path}" if self.path else ""
        return f"hf://{self.repo}@{sha}{tail}"

    def resolve_url(self, endpoint: str) -> str:
        """The file's download URL at this path's revision (a commit, for reads)."""
        revision = quote(self.revision or "main", safe="")
        return f"{endpoint.rstrip('/')}/{self.repo}/resolve/{revision}/{quote(self.path)}"


def parse(url: str) -> HubPath:
    """Take ``hf://[datasets/|spaces/]<org>/<name>[@<revision>]/<path>`` apart.

    Raises:
        ConfigError: If the URL names no repository.
    """
    rest = url.split("://", 1)[1] if "://" in url else url
    parts = rest.split("/")
    repo_type = "model"
    if parts and parts[0] in _TYPES:
        repo_type = _TYPES[parts[0]]
        parts = parts[1:]
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ConfigError(
            f"{url} names no repository; write hf://datasets/<org>/<name>[@<revision>]/<glob>"
        )
    name, at, revision = parts[1].partition("@")
    tail = "/".join(parts[2:])
    if at and not revision:
        raise ConfigError(
            f"{url} names an empty revision after '@'; name one (@main, a tag, a commit) or "
            "leave out the '@' for the default branch"
        )
    if at:
        match = _SLASHED.match(f"{revision}/{tail}") if revision == "refs" else None
        if match:
            revision, tail = match.group(1), match.group(2) or ""
        revision = unquote(revision)
    return HubPath(repo_type, f"{parts[0]}/{name}", revision if at else None, tail)


def endpoint_of(options: dict[str, Any]) -> str:
    """The Hub endpoint: the ``endpoint`` storage option, else ``HF_ENDPOINT``'s."""
    from huggingface_hub import constants

    return str(options.get("endpoint") or constants.ENDPOINT)


def token_of(options: dict[str, Any]) -> str | None:
    """The token: the ``token`` storage option, else huggingface_hub's (env, login)."""
    token = options.get("token")
    if isinstance(token, str) and token:
        return token
    if token is False:
        return None
    from huggingface_hub import get_token

    return get_token()


def resolve_revision(path: HubPath, options: dict[str, Any]) -> str:
    """The commit ``path``'s revision names now (one request; none for a commit)."""
    if path.pinned:
        assert path.revision is not None
        return path.revision
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint_of(options), token=token_of(options))
    info = api.repo_info(path.repo_id, repo_type=path.repo_type, revision=path.revision)
    sha = getattr(info, "sha", None)
    if not sha:
        raise ConfigError(
            f"the Hub gave no commit for {path.repo_id}@{path.revision or 'main'}; "
            "pass a commit as the revision (hf://datasets/<org>/<name>@<sha>/...)"
        )
    return str(sha)


__all__ = ["HubPath", "endpoint_of", "parse", "resolve_revision", "token_of"]
