"""A loopback stand-in of the Hugging Face Hub HTTP API, for dataset repos.

`HubStub` serves, on 127.0.0.1, the routes that `huggingface_hub` (2.3.0) calls to read
dataset repos through `HfFileSystem` and `HfApi`: repo and revision info, the `tree` listing
(with cursor pagination in a `Link: <...>; rel="next"` header), `paths-info`, the commit
list, the refs and `resolve` (GET and HEAD, with `Range`). Revisions are branches such as
`main`, special refs such as `refs/convert/parquet` (sent URL-quoted as
`refs%2Fconvert%2Fparquet`) or any commit sha the stub made. Every request is logged under a
kind so tests can count what a client asked for; anything the stub does not know is logged
as "other" and answered 404.

No Xet headers and no `xetHash` are ever sent, so clients read files over plain HTTP from
`/resolve/`. With `redirect_lfs`, a `resolve` of an LFS file answers as the Hub does: 302 to
a signed URL of its CDN (`/cdn/{sha256}?Expires=...` on another port, `cdn_endpoint`: another
origin, logged as "cdn"), which serves the
bytes (with `Range`) until it expires (403 after), and refuses a request that carries an
`Authorization` header (400), as a presigned S3 URL does.

Usage::

    with HubStub(page_size=10, token="hf_test") as stub:
        stub.add_dataset("org/name", {"data/train-0.parquet": b"..."})
        fs = HfFileSystem(endpoint=stub.endpoint, token="hf_test", skip_instance_cache=True)
        fs.glob("hf://datasets/org/name/data/*.parquet")
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import datetime as dt
import fnmatch
import hashlib
import itertools
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

KINDS = ("revision", "tree", "paths-info", "resolve", "cdn", "commits", "refs", "whoami", "other")
"""What `HubStub.requests` logs each request as (see `HubStub`)."""

_LFS_POINTER_SIZE = 134  # bytes of a Git LFS pointer file, what the Hub reports as pointerSize
_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


def _utc_now() -> str:
    """A timestamp the way the Hub writes them (`2024-05-01T12:00:00.000Z`)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _git_blob_oid(content: bytes) -> str:
    """The git object id of a blob: what the Hub returns as a file's `oid`."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _is_true(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class RequestRecord:
    """One request as the stub saw it."""

    kind: str
    method: str
    path: str  # as sent: quoted path and query
    status: int
    range: str | None  # the `Range` header, if any
    throttled: bool


@dataclass(frozen=True)
class _Commit:
    sha: str
    seq: int  # order of creation, to pick the latest of several commits
    date: str
    title: str
    parent: str | None
    files: Mapping[str, bytes]
    last_changed: Mapping[str, str]  # path -> sha of the commit that last changed the file


@dataclass
class _Repo:
    refs: dict[str, str] = field(default_factory=dict)  # revision name -> commit sha
    commits: dict[str, _Commit] = field(default_factory=dict)
    created_at: str = field(default_factory=_utc_now)


class _Snapshot:
    """A commit's tree: files, the directories they imply, and the JSON entries of both."""

    def __init__(
        self,
        commit: _Commit,
        commits: Mapping[str, _Commit],
        lfs_min_size: int,
        lfs_patterns: Sequence[str],
    ) -> None:
        self.commit = commit
        self._commits = commits
        self._oids: dict[str, str] = {}
        self._sha256s: dict[str, str] = {}
        self._lfs_min_size = lfs_min_size
        self._lfs_patterns = lfs_patterns
        dirs: set[str] = set()
        for path in commit.files:
            parts = path.split("/")[:-1]
            dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        self.dirs = dirs
        self.sorted_paths = sorted([*commit.files, *dirs])
        children: dict[str, list[str]] = {}
        for path in self.sorted_paths:
            children.setdefault(path.rpartition("/")[0], []).append(path)
        # The Hub lists a directory's sub-directories first, then its files.
        self.children = {
            parent: sorted(paths, key=lambda p: (p not in dirs, p))
            for parent, paths in children.items()
        }
        # Directory oids and last commits, bottom-up.
        self.dir_oid: dict[str, str] = {}
        self.dir_last: dict[str, str] = {}
        for d in sorted(dirs, key=lambda p: -p.count("/")):
            listing = []
            latest: _Commit | None = None
            for child in self.children.get(d, []):
                is_dir = child in dirs
                oid = self.dir_oid[child] if is_dir else self.blob_oid(child)
                listing.append(f"{'tree' if is_dir else 'blob'} {child.rpartition('/')[2]} {oid}")
                last = commits[self.dir_last[child] if is_dir else commit.last_changed[child]]
                latest = last if latest is None or last.seq > latest.seq else latest
            self.dir_oid[d] = hashlib.sha1("\n".join(listing).encode()).hexdigest()
            self.dir_last[d] = latest.sha if latest is not None else commit.sha

    def blob_oid(self, path: str) -> str:
        oid = self._oids.get(path)
        if oid is None:
            oid = self._oids[path] = _git_blob_oid(self.commit.files[path])
        return oid

    def is_lfs(self, path: str) -> bool:
        name = path.rpartition("/")[2]
        return len(self.commit.files[path]) >= self._lfs_min_size or any(
            fnmatch.fnmatch(name, pattern) for pattern in self._lfs_patterns
        )

    def sha256(self, path: str) -> str:
        digest = self._sha256s.get(path)
        if digest is None:
            digest = self._sha256s[path] = hashlib.sha256(self.commit.files[path]).hexdigest()
        return digest

    def etag(self, path: str) -> str:
        """The Hub's ETag of a file: the LFS sha256 for LFS files, the git blob oid otherwise."""
        return self.sha256(path) if self.is_lfs(path) else self.blob_oid(path)

    def exists(self, path: str) -> bool:
        return path in self.commit.files or path in self.dirs

    def entry(self, path: str, *, expand: bool) -> dict[str, Any]:
        """The JSON a `tree` or `paths-info` response holds for one path."""
        if path in self.dirs:
            out: dict[str, Any] = {
                "type": "directory",
                "oid": self.dir_oid[path],
                "size": 0,
                "path": path,
            }
            last_sha = self.dir_last[path]
        else:
            content = self.commit.files[path]
            out = {"type": "file", "oid": self.blob_oid(path), "size": len(content), "path": path}
            if self.is_lfs(path):
                out["lfs"] = {
                    "oid": self.sha256(path),
                    "size": len(content),
                    "pointerSize": _LFS_POINTER_SIZE,
                }
            last_sha = self.commit.last_changed[path]
        if expand:
            last = self._commits[last_sha]
            out["lastCommit"] = {"id": last.sha, "title": last.title, "date": last.date}
            if out["type"] == "file":
                out["securityFileStatus"] = {
                    "status": "safe",
                    "avScan": {"virusFound": False, "virusNames": None},
                    "pickleImportScan": None,
                }
        return out

    def listing(self, path: str, *, recursive: bool) -> list[str]:
        """The paths a `tree` request lists, in the order its pages hold them."""
        if not recursive:
            return self.children.get(path, [])
        if not path:
            return self.sorted_paths
        lo = bisect.bisect_left(self.sorted_paths, path + "/")
        hi = bisect.bisect_left(self.sorted_paths, path + "0")  # "0" sorts right after "/"
        return self.sorted_paths[lo:hi]


class _HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


@dataclass
class _ThrottleRule:
    remaining: int
    retry_after: float
    kinds: tuple[str, ...] | None
    ratelimit_header: bool


class HubStub:
    """A loopback Hugging Face Hub serving dataset repos (see the module docstring).

    Routes (`{rev}` is URL-quoted, `refs%2Fconvert%2Fparquet`; `{path}` may be too) and the
    kind each request is logged as:

    - `GET /api/datasets/{repo}` and `GET /api/datasets/{repo}/revision/{rev}`: repo info
      (`id`, `sha`, `siblings`, ...), what `HfApi.dataset_info`/`repo_info` read: "revision".
    - `GET /api/datasets/{repo}/tree/{rev}[/{path}]?recursive=&expand=&cursor=`: one page of
      the listing, `page_size` entries (at most `expand_page_size` when `expand=true`, as the
      Hub's 50), with a `Link: <next>; rel="next"` header when more follow: "tree".
    - `POST /api/datasets/{repo}/paths-info/{rev}` (form or JSON `paths`, `expand`): "paths-info".
    - `GET /api/datasets/{repo}/commits/{rev}`: the revision's history, newest first: "commits".
    - `GET /api/datasets/{repo}/refs`: branches, `converts` (refs/convert/*) and PRs: "refs".
    - `GET|HEAD /datasets/{repo}/resolve/{rev}/{path}`: the file, 206 for a `Range`: "resolve";
      with `redirect_lfs`, an LFS file's 302 to `/cdn/{sha256}?Expires=...` (`cdn_ttl_s`
      ahead): "cdn", its bytes until then, 403 after, 400 with an `Authorization` header.
    - `GET /api/whoami-v2`: "whoami". Anything else: "other", 404 (without `X-Error-Code`).

    Unknown repo, revision or path: 404 with `X-Error-Code` `RepoNotFound`, `RevisionNotFound`
    or `EntryNotFound`, the codes `huggingface_hub` maps to its errors. With `token` set, a
    request without it gets 401 `RepoNotFound` (the Hub's answer for a private repo) and one
    with another bearer token 401 "Invalid credentials in Authorization header".

    Files of at least `lfs_min_size` bytes, or whose name matches one of `lfs_patterns`, are
    listed with an `lfs` block and served with their sha256 as ETag, like Git LFS files.
    """

    def __init__(
        self,
        *,
        page_size: int = 1000,
        token: str | None = None,
        expand_page_size: int = 50,
        lfs_min_size: int = 10 * 1024 * 1024,
        lfs_patterns: Sequence[str] = ("*.parquet", "*.arrow"),
        redirect_lfs: bool = False,
        cdn_ttl_s: float = 3600.0,
    ) -> None:
        if page_size < 1 or expand_page_size < 1:
            raise ValueError("page sizes must be positive")
        self.page_size = page_size
        self.expand_page_size = expand_page_size
        self.token = token
        self.lfs_min_size = lfs_min_size
        self.lfs_patterns = tuple(lfs_patterns)
        self.redirect_lfs = redirect_lfs
        self.cdn_ttl_s = cdn_ttl_s
        self._cdn: dict[str, bytes] = {}
        self.endpoint = ""
        self.requests: list[tuple[str, str, str]] = []
        self.records: list[RequestRecord] = []
        self.tokens_seen: set[str] = set()
        self.throttled = 0
        self._repos: dict[str, _Repo] = {}
        self._snapshots: dict[str, _Snapshot] = {}
        self._rules: list[_ThrottleRule] = []
        self._corrupt = 0
        self._unreadable: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.cdn_endpoint = ""
        self._cdn_server: ThreadingHTTPServer | None = None
        self._cdn_thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"HubStub(endpoint={self.endpoint!r}, repos={sorted(self._repos)})"

    # -- lifecycle ---------------------------------------------------------------------------

    def server(self) -> ThreadingHTTPServer:
        """A server of this stub bound to a free port of 127.0.0.1, listening (not serving:
        :meth:`start` serves it), with the listen backlog of a real server: socketserver's 5
        dropped the connections of a burst past it, each sent again by the client's kernel a
        second later."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self), bind_and_activate=False)
        server.daemon_threads = True
        server.request_queue_size = 128
        try:
            server.server_bind()
            server.server_activate()
        except BaseException:
            server.server_close()
            raise
        return server

    def start(self) -> HubStub:
        """Bind 127.0.0.1 on a free port and serve in a daemon thread (and the CDN on
        another, with ``redirect_lfs``: another origin, where a client drops the token)."""
        if self._server is not None:
            return self
        self._server, self.endpoint, self._thread = self._serve("hub-stub")
        if self.redirect_lfs:
            self._cdn_server, self.cdn_endpoint, self._cdn_thread = self._serve("hub-stub-cdn")
        return self

    def _serve(self, name: str) -> tuple[ThreadingHTTPServer, str, threading.Thread]:
        """A server of this stub serving in a daemon thread named ``name``; its endpoint."""
        server = self.server()
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
        )
        thread.start()
        return server, f"http://127.0.0.1:{server.server_address[1]}", thread

    def stop(self) -> None:
        """Stop serving and close the listening sockets."""
        for server, thread in ((self._cdn_server, self._cdn_thread), (self._server, self._thread)):
            if server is not None:
                server.shutdown()
                server.server_close()
                if thread is not None:
                    thread.join(timeout=5)
        self._server = self._cdn_server = None

    def __enter__(self) -> HubStub:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- content -----------------------------------------------------------------------------

    def add_dataset(
        self, repo_id: str, files: Mapping[str, bytes], *, revision: str = "main"
    ) -> str:
        """Make `files` (path in repo -> content) the whole tree of `revision`, as a new commit.

        Creates the repo on first use (with an empty `main` when `revision` is another one).
        Calling it again on a revision is a new commit on it; the old sha stays readable.
        Returns the new commit's 40-hex sha.
        """
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"repo_id must be 'namespace/name', got {repo_id!r}")
        for path in files:
            if not path or path.startswith("/") or "" in path.split("/"):
                raise ValueError(f"bad path in repo: {path!r}")
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo())
            if "main" not in repo.refs and revision != "main":
                self._commit(repo, repo_id, "main", {})
            return self._commit(repo, repo_id, revision, files)

    def _commit(self, repo: _Repo, repo_id: str, revision: str, files: Mapping[str, bytes]) -> str:
        seq = next(self._seq)
        parent_sha = repo.refs.get(revision)
        parent = repo.commits[parent_sha] if parent_sha is not None else None
        sha = hashlib.sha1(f"{repo_id}\0{revision}\0{seq}\0{uuid.uuid4()}".encode()).hexdigest()
        last_changed = {
            path: parent.last_changed[path]
            if parent is not None and parent.files.get(path) == content
            else sha
            for path, content in files.items()
        }
        repo.commits[sha] = _Commit(
            sha=sha,
            seq=seq,
            date=_utc_now(),
            title=f"Update {revision} ({len(files)} files)",
            parent=parent_sha,
            files=dict(files),
            last_changed=last_changed,
        )
        repo.refs[revision] = sha
        return sha

    def purge(self, repo_id: str, path: str) -> None:
        """Remove `path` from every commit of `repo_id`, as a rewritten (squashed) history or
        a deleted repo does: its `resolve` URL answers 404 `EntryNotFound` at every commit."""
        with self._lock:
            repo = self._repos[repo_id]
            for sha, commit in list(repo.commits.items()):
                if path in commit.files:
                    files = {p: c for p, c in commit.files.items() if p != path}
                    repo.commits[sha] = dataclasses.replace(commit, files=files)
                    self._snapshots.pop(sha, None)

    def unreadable(self, repo_id: str, path: str) -> None:
        """Answer 404 `EntryNotFound` for `path`'s bytes (its `resolve` URL) while the tree
        still lists it: a file gone between the listing and the read of its footer."""
        with self._lock:
            self._unreadable.add((repo_id, path))

    def corrupt(self, n: int) -> None:
        """Flip the middle byte of the next `n` whole-file downloads (`resolve` GETs without
        a `Range`; the length stays): bytes damaged on their way, as a faulty proxy does."""
        with self._lock:
            self._corrupt += n

    def _take_corrupt(self) -> bool:
        with self._lock:
            if self._corrupt <= 0:
                return False
            self._corrupt -= 1
            return True

    def commit_of(self, repo_id: str, revision: str = "main") -> str:
        """The commit sha `revision` of `repo_id` points to now (KeyError if none)."""
        with self._lock:
            return self._repos[repo_id].refs[revision]

    @staticmethod
    def hf_path(repo_id: str, path: str = "", *, revision: str | None = None) -> str:
        """The `hf://datasets/...` URL of a path, the revision quoted as `HfFileSystem` reads it."""
        at = f"@{quote(revision, safe='')}" if revision is not None else ""
        return f"hf://datasets/{repo_id}{at}" + (f"/{path}" if path else "")

    # -- request log and throttling ------------------------------------------------------------

    def count(self, kind: str | None = None) -> int:
        """How many requests of `kind` arrived (all of them for None; "throttled": the 429s)."""
        with self._lock:
            if kind is None:
                return len(self.requests)
            if kind == "throttled":
                return self.throttled
            return sum(1 for k, _, _ in self.requests if k == kind)

    def reset_counts(self) -> None:
        """Forget the request log (not the tokens seen, not pending throttles)."""
        with self._lock:
            self.requests.clear()
            self.records.clear()
            self.throttled = 0

    def throttle(
        self,
        n: int,
        *,
        retry_after: float = 1.0,
        kinds: tuple[str, ...] | None = None,
        ratelimit_header: bool = False,
    ) -> None:
        """Answer the next `n` requests of `kinds` (any kind for None) with 429 and `Retry-After`.

        `Retry-After` is written as an integer when `retry_after` is one ("1"), else as the float
        ("0.2"); huggingface_hub 2.3.0 only honours the integer form (it waits that + 1 s) and
        otherwise backs off 1, 2, 4... s. With `ratelimit_header`, the Hub's
        `RateLimit: "api";r=0;t=<seconds>` header is sent too, which the client prefers.
        """
        unknown = set(kinds or ()) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown kinds: {sorted(unknown)}")
        with self._lock:
            self._rules.append(_ThrottleRule(n, retry_after, kinds, ratelimit_header))

    def _log(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append((record.kind, record.method, record.path))
            self.records.append(record)
            if record.throttled:
                self.throttled += 1

    def _take_throttle(self, kind: str) -> _ThrottleRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.remaining > 0 and (rule.kinds is None or kind in rule.kinds):
                    rule.remaining -= 1
                    return rule
            self._rules = [rule for rule in self._rules if rule.remaining > 0]
            return None

    # -- lookups used by the handler -------------------------------------------------------------

    def _repo(self, repo_id: str) -> _Repo:
        repo = self._repos.get(repo_id)
        if repo is None:
            raise _HttpError(404, "Repository not found", "RepoNotFound")
        return repo

    def _snapshot(self, repo_id: str, revision: str) -> _Snapshot:
        with self._lock:
            repo = self._repo(repo_id)
            sha = repo.refs.get(revision) or (revision if revision in repo.commits else None)
            if sha is None:
                raise _HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            snapshot = self._snapshots.get(sha)
            if snapshot is None:
                snapshot = _Snapshot(
                    repo.commits[sha], dict(repo.commits), self.lfs_min_size, self.lfs_patterns
                )
                self._snapshots[sha] = snapshot
            return snapshot


# (method, route after /api/datasets/{repo}/) -> kind; "" is the repo itself.
_API_ROUTES = {
    ("GET", ""): "revision",
    ("GET", "revision"): "revision",
    ("GET", "tree"): "tree",
    ("POST", "paths-info"): "paths-info",
    ("GET", "commits"): "commits",
    ("GET", "refs"): "refs",
}


def _split_revision(segments: list[str]) -> tuple[str, list[str]]:
    """The revision at the head of raw path segments, and the segments after it.

    huggingface_hub quotes the revision as one segment (`refs%2Fconvert%2Fparquet`); an
    unquoted `refs/convert/<x>` or `refs/pr/<n>` spans three segments.
    """
    if not segments or not segments[0]:
        raise _HttpError(404, "Revision missing", "RevisionNotFound")
    first = unquote(segments[0])
    if first == "refs" and len(segments) >= 3 and segments[1] in ("convert", "pr"):
        return "/".join(segments[:3]), segments[3:]
    return first, segments[1:]


def _join_path(segments: list[str]) -> str:
    return "/".join(unquote(s) for s in segments).strip("/")


@dataclass
class _Request:
    """A parsed request: its kind, and what the route answering it reads."""

    kind: str
    method: str
    raw_path: str  # still quoted
    query: str
    body: bytes = b""
    repo_id: str = ""
    route: str = ""
    segments: list[str] = field(default_factory=list)  # raw segments after the route

    @cached_property
    def params(self) -> dict[str, str]:
        return dict(parse_qsl(self.query, keep_blank_values=True))

    @cached_property
    def revision_and_path(self) -> tuple[str, str]:
        revision, rest = _split_revision(self.segments)
        return revision, _join_path(rest)


def _classify(method: str, path: str, body: bytes) -> _Request:
    """Which route a request is for ("other" when the stub does not serve it)."""
    raw_path, _, query = path.partition("?")
    request = _Request("other", method, raw_path, query, body)
    segs = raw_path.split("/")[1:]
    if method == "GET" and segs == ["api", "whoami-v2"]:
        request.kind = "whoami"
    elif len(segs) >= 4 and segs[:2] == ["api", "datasets"]:
        request.repo_id = f"{unquote(segs[2])}/{unquote(segs[3])}"
        request.route = segs[4] if len(segs) > 4 else ""
        request.segments = segs[5:]
        request.kind = _API_ROUTES.get((method, request.route), "other")
    elif (
        len(segs) >= 6
        and segs[0] == "datasets"
        and segs[3] == "resolve"
        and method in ("GET", "HEAD")
    ):
        request.repo_id = f"{unquote(segs[1])}/{unquote(segs[2])}"
        request.route = "resolve"
        request.segments = segs[4:]
        request.kind = "resolve"
    elif len(segs) == 2 and segs[0] == "cdn" and method in ("GET", "HEAD"):
        request.route = "cdn"
        request.segments = segs[1:]
        request.kind = "cdn"
    return request


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes
    headers: Mapping[str, str]


_JSON = "application/json; charset=utf-8"


def _json(data: Any, headers: Mapping[str, str] | None = None) -> _Response:
    return _Response(200, json.dumps(data).encode(), {"Content-Type": _JSON, **(headers or {})})


def _error_response(error: _HttpError) -> _Response:
    """The Hub's error shape: JSON `{"error": ...}`, `X-Error-Message` and `X-Error-Code`."""
    headers = {"Content-Type": _JSON, "X-Error-Message": error.message, **error.headers}
    if error.code is not None:
        headers["X-Error-Code"] = error.code
    return _Response(error.status, json.dumps({"error": error.message}).encode(), headers)


def _throttled_response(rule: _ThrottleRule) -> _Response:
    seconds = rule.retry_after
    text = str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))
    headers = {"Content-Type": _JSON, "Retry-After": text}
    if rule.ratelimit_header:
        headers["RateLimit"] = f'"api";r=0;t={max(0, round(seconds))}'
        headers["RateLimit-Policy"] = '"fixed window";"api";q=500;w=300'
    return _Response(
        429, json.dumps({"error": "Too Many Requests: rate limited by HubStub"}).encode(), headers
    )


def _make_handler(stub: HubStub) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        hub = stub

    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests (HTTP/1.1, keep-alive) from `hub`'s repos."""

    hub: HubStub
    protocol_version = "HTTP/1.1"
    server_version = "HubStub/1.0"
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read `HubStub.requests` instead

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing ------------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = _classify(method, self.path, body)
        throttled = False
        try:
            self._check_auth(request)
            rule = self.hub._take_throttle(request.kind)
            if rule is not None:
                throttled = True
                response = _throttled_response(rule)
            else:
                response = self._route(request)
        except _HttpError as e:
            response = _error_response(e)
        # Logged before answering: a client that got its answer finds its request in the log.
        range_header = self.headers.get("Range")
        self.hub._log(
            RequestRecord(request.kind, method, self.path, response.status, range_header, throttled)
        )
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("X-Request-Id", f"Root=stub-{uuid.uuid4().hex[:16]}")
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(response.body)

    def _check_auth(self, request: _Request) -> None:
        auth = self.headers.get("Authorization") or ""
        given = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        if given is not None:
            with self.hub._lock:
                self.hub.tokens_seen.add(given)
        expected = self.hub.token
        if request.kind == "cdn":
            return  # a signed URL: its query is the credential (see _cdn)
        if expected is None and request.kind != "whoami":
            return
        if given is None:
            if request.kind == "whoami":
                raise _HttpError(401, _INVALID_CREDENTIALS)
            raise _HttpError(401, "Repository not found", "RepoNotFound")
        if expected is not None and given != expected:
            raise _HttpError(401, _INVALID_CREDENTIALS)

    def _route(self, request: _Request) -> _Response:
        routes = {
            "revision": self._repo_info,
            "tree": self._tree,
            "paths-info": self._paths_info,
            "commits": self._commits,
            "refs": self._refs,
            "resolve": self._resolve,
            "cdn": self._cdn,
            "whoami": self._whoami,
        }
        route = routes.get(request.kind)
        if route is None:
            raise _HttpError(404, f"Not found: {request.method} {request.raw_path}")
        return route(request)

    def _whoami(self, request: _Request) -> _Response:
        """`/api/whoami-v2`: `HfApi.whoami` (HfFileSystem never calls it)."""
        token = {"displayName": "stub", "role": "read"}
        auth = {"type": "access_token", "accessToken": token}
        return _json({"type": "user", "name": "hub-stub", "fullname": "Hub Stub", "auth": auth})

    # -- routes --------------------------------------------------------------------------------

    def _repo_info(self, request: _Request) -> _Response:
        """`/api/datasets/{repo}[/revision/{rev}]`: `HfApi.dataset_info` (DatasetInfo's JSON)."""
        revision = unquote("/".join(request.segments)) if request.route == "revision" else "main"
        snapshot = self.hub._snapshot(request.repo_id, revision)
        with self.hub._lock:
            created_at = self.hub._repos[request.repo_id].created_at
        blobs = _is_true(request.params.get("blobs"))
        siblings = []
        for path in sorted(snapshot.commit.files):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling["size"] = len(snapshot.commit.files[path])
                sibling["blobId"] = snapshot.blob_oid(path)
                if snapshot.is_lfs(path):
                    sibling["lfs"] = {
                        "size": sibling["size"],
                        "sha256": snapshot.sha256(path),
                        "pointerSize": _LFS_POINTER_SIZE,
                    }
            siblings.append(sibling)
        namespace = request.repo_id.split("/")[0]
        return _json(
            {
                "_id": hashlib.sha1(request.repo_id.encode()).hexdigest()[:24],
                "id": request.repo_id,
                "author": namespace,
                "sha": snapshot.commit.sha,
                "lastModified": snapshot.commit.date,
                "createdAt": created_at,
                "private": self.hub.token is not None,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "usedStorage": sum(len(c) for c in snapshot.commit.files.values()),
            }
        )

    def _tree(self, request: _Request) -> _Response:
        """`/api/datasets/{repo}/tree/{rev}[/{path}]`: `HfApi.list_repo_tree`, one page a request.

        The cursor is an opaque base64 of the last entry's sort key (keyset pagination), and the
        next page's URL (absolute, all other query parameters kept) is in `Link: rel="next"`.
        """
        revision, path = request.revision_and_path
        snapshot = self.hub._snapshot(request.repo_id, revision)
        params = request.params
        recursive = _is_true(params.get("recursive"))
        expand = _is_true(params.get("expand"))
        if path and path in snapshot.commit.files:
            paths = [path]  # listing a file's path gives the file itself
        elif path and path not in snapshot.dirs:
            raise _HttpError(404, f'{path} does not exist on "{revision}"', "EntryNotFound")
        else:
            paths = snapshot.listing(path, recursive=recursive)
        keys = [(0, p) if recursive else (p not in snapshot.dirs, p) for p in paths]
        start = 0
        if cursor := params.get("cursor"):
            try:
                after = json.loads(base64.urlsafe_b64decode(cursor.encode()))
                after_key = (bool(after[0]) if not recursive else 0, str(after[1]))
            except (ValueError, IndexError, TypeError) as e:
                raise _HttpError(400, f"Invalid cursor: {cursor}") from e
            start = bisect.bisect_right(keys, after_key)
        size = min(self.hub.page_size, self.hub.expand_page_size) if expand else self.hub.page_size
        page = paths[start : start + size]
        headers: dict[str, str] = {}
        if start + size < len(paths):
            last = keys[start + size - 1]
            token = base64.urlsafe_b64encode(json.dumps([int(last[0]), last[1]]).encode()).decode()
            kept = [
                (k, v) for k, v in parse_qsl(request.query, keep_blank_values=True) if k != "cursor"
            ]
            query = urlencode([*kept, ("cursor", token)])
            next_url = f"{self.hub.endpoint}{request.raw_path}?{query}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        return _json([snapshot.entry(p, expand=expand) for p in page], headers)

    def _paths_info(self, request: _Request) -> _Response:
        """`POST /api/datasets/{repo}/paths-info/{rev}`: `HfApi.get_paths_info`.

        Body: form (`paths=a&paths=b&expand=false`, what huggingface_hub sends) or JSON
        (`{"paths": [...], "expand": bool}`). Paths that do not exist are left out, as on the Hub.
        """
        revision, extra = request.revision_and_path
        if extra:
            raise _HttpError(404, f"Not found: {self.path}")
        snapshot = self.hub._snapshot(request.repo_id, revision)
        if (self.headers.get("Content-Type") or "").startswith("application/json"):
            data = json.loads(request.body or b"{}")
            paths = [str(p) for p in data.get("paths", [])]
            expand = bool(data.get("expand", False))
        else:
            pairs = parse_qsl(request.body.decode(), keep_blank_values=True)
            paths = [v for k, v in pairs if k in ("paths", "paths[]")]
            expand = any(k == "expand" and _is_true(v) for k, v in pairs)
        paths = [p.strip("/") for p in paths]
        return _json([snapshot.entry(p, expand=expand) for p in paths if p and snapshot.exists(p)])

    def _commits(self, request: _Request) -> _Response:
        """`/api/datasets/{repo}/commits/{rev}`: `HfApi.list_repo_commits`, newest first."""
        revision, extra = request.revision_and_path
        if extra:
            raise _HttpError(404, f"Not found: {self.path}")
        snapshot = self.hub._snapshot(request.repo_id, revision)
        with self.hub._lock:
            commits = self.hub._repos[request.repo_id].commits
            history = []
            sha: str | None = snapshot.commit.sha
            while sha is not None:
                commit = commits[sha]
                history.append(
                    {
                        "id": commit.sha,
                        "title": commit.title,
                        "message": "",
                        "date": commit.date,
                        "authors": [{"user": "hub-stub"}],
                    }
                )
                sha = commit.parent
        return _json(history)

    def _refs(self, request: _Request) -> _Response:
        """`/api/datasets/{repo}/refs`: `HfApi.list_repo_refs` (`converts` holds refs/convert/*)."""
        if request.segments:
            raise _HttpError(404, f"Not found: {self.path}")
        with self.hub._lock:
            refs = dict(self.hub._repo(request.repo_id).refs)
        out: dict[str, list[dict[str, str]]] = {"branches": [], "converts": [], "tags": []}
        prs: list[dict[str, str]] = []
        for name, sha in sorted(refs.items()):
            if name.startswith("refs/convert/"):
                out["converts"].append(
                    {"name": name.rpartition("/")[2], "ref": name, "targetCommit": sha}
                )
            elif name.startswith("refs/pr/"):
                prs.append({"name": name, "ref": name, "targetCommit": sha})
            else:
                out["branches"].append(
                    {"name": name, "ref": f"refs/heads/{name}", "targetCommit": sha}
                )
        data: dict[str, Any] = dict(out)
        if _is_true(request.params.get("include_prs")):
            data["pullRequests"] = prs
        return _json(data)

    def _resolve(self, request: _Request) -> _Response:
        """`GET|HEAD /datasets/{repo}/resolve/{rev}/{path}`: the file's bytes, served directly.

        Sends what `get_hf_file_metadata` and the fsspec file read: `X-Repo-Commit`, `ETag`,
        `Content-Length`, `Accept-Ranges: bytes`; a `Range: bytes=a-b` (or `a-`, `-n`) gets 206
        with `Content-Range`, one past the end 416. No redirect, no Xet headers.
        """
        revision, path = request.revision_and_path
        snapshot = self.hub._snapshot(request.repo_id, revision)
        content = snapshot.commit.files.get(path)
        if (request.repo_id, path) in self.hub._unreadable:
            content = None
        if content is None:
            commit = {
                "X-Repo-Commit": snapshot.commit.sha
            }  # as the Hub: lets clients cache the miss
            raise _HttpError(404, "Entry not found", "EntryNotFound", commit)
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": f'"{snapshot.etag(path)}"',
            "X-Repo-Commit": snapshot.commit.sha,
        }
        if self.hub.redirect_lfs and snapshot.is_lfs(path):
            sha = snapshot.sha256(path)
            with self.hub._lock:
                self.hub._cdn[sha] = content
            # Whole seconds, as CloudFront's: rounded up, so a URL holds for cdn_ttl_s at
            # least (rounded down, a 1 s URL lasted anywhere from 0 to 1 s)
            expires = math.ceil(time.time() + self.hub.cdn_ttl_s)
            location = f"{self.hub.cdn_endpoint}/cdn/{sha}?Expires={expires}&Signature=stub"
            redirect = {
                "Location": location,
                "ETag": headers["ETag"],
                "X-Repo-Commit": snapshot.commit.sha,
                "X-Linked-Size": str(len(content)),
                "X-Linked-Etag": f'"{sha}"',
            }
            return _Response(302, b"", redirect)
        return self._bytes(content, headers)

    def _cdn(self, request: _Request) -> _Response:
        """`GET|HEAD /cdn/{sha256}?Expires=...`: an LFS file's bytes at its signed URL (what
        a `resolve` redirected to), 206 for a `Range`; 403 once it expired, 400 for a
        request that also sends `Authorization` (a presigned S3 URL takes one credential)."""
        if self.headers.get("Authorization"):
            error = b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism "
            return _Response(400, error + b"allowed</Message></Error>", {})
        try:
            expires = float(request.params.get("Expires", ""))
        except ValueError:
            expires = 0.0
        if expires < time.time():
            error = b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message>"
            return _Response(403, error + b"</Error>", {"Content-Type": "application/xml"})
        with self.hub._lock:
            content = self.hub._cdn.get(request.segments[0] if request.segments else "")
        if content is None:
            return _Response(404, b"<Error><Code>NoSuchKey</Code></Error>", {})
        return self._bytes(content, {"Content-Type": "application/octet-stream"})

    def _bytes(self, content: bytes, headers: dict[str, str]) -> _Response:
        """``content``, whole (200) or the `Range` asked for (206, 416 past the end)."""
        headers = {"Accept-Ranges": "bytes", **headers}
        size = len(content)
        range_header = self.headers.get("Range")
        if range_header is None:
            if self.command == "GET" and size and self.hub._take_corrupt():
                middle = size // 2
                flipped = bytes([content[middle] ^ 0xFF])
                content = content[:middle] + flipped + content[middle + 1 :]
            return _Response(200, content, headers)
        match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", range_header)
        if match is None or match.group(1) == match.group(2) == "":
            raise _HttpError(416, f"Unsupported range: {range_header}")
        first, last = match.groups()
        if first == "":
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), min(size - 1, int(last)) if last else size - 1
        if start >= size or start > end:
            headers = {
                "Content-Range": f"bytes */{size}",
                "X-Error-Message": "Range Not Satisfiable",
            }
            return _Response(416, b"", headers)
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return _Response(206, content[start : end + 1], headers)
