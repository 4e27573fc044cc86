"""One URL -> its shards: the files a URL (a file, a directory or a glob) names, the data
files among them and the version of each; an ``hf://`` URL pinned to its commit first."""

from __future__ import annotations

import functools
import os
import posixpath
import re
import stat
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from glob import has_magic
from typing import TYPE_CHECKING, Any, NoReturn

import fsspec
from fsspec.utils import get_protocol

from ingest.core.errors import ConfigError, NoShardsError, SourceError, redact
from ingest.storage import hub
from ingest.storage.sources import delta
from ingest.storage.sources.deletion_vectors import DeletionVector
from ingest.storage.sources.faults import missing_credentials, refused_connection, server_answer
from ingest.storage.sources.files import is_local
from ingest.storage.sources.hubfs import known_commit, pin
from ingest.storage.sources.options import strip_userinfo
from ingest.storage.sources.partitions import base_of, hive_partition
from ingest.storage.sources.retry import REFUSED_FIX, GaveUpError, attempt
from ingest.storage.sources.shard import FormatResolver, ListingStore, Shard
from ingest.storage.sources.splits import warn_mixed_splits
from ingest.storage.sources.tables import refuse_other_tables

if TYPE_CHECKING:
    from ingest.storage.sources.source import Source

# A query string at the end of a path (``?token=...``, ``?versionId=...``): not a glob.
_QUERY_TAIL = re.compile(r"\?[^/?=]+=.*$")


def list_url(
    source: Source,
    url: str,
    formats: FormatResolver,
    listings: ListingStore | None,
    tables: dict[str, delta.TableVersion] | None = None,
    at: Mapping[str, Sequence[int]] | None = None,
    since: Mapping[str, int] | None = None,
    commits: Mapping[str, str] | None = None,
) -> list[Shard]:
    """The shards ``url`` lists, for :meth:`Source.list_shards` (see there); ``tables``
    gets the Delta tables it holds, each root's URL with the version listed and its schema;
    ``at`` pins tables (by their roots' URLs) to versions (the files of each), the newest
    otherwise; ``since`` follows tables from a version (the files appended since it too;
    a table it does not name at its newest; None: not following); ``commits`` pins Hub
    repositories (by their ``hf://`` URLs) to commits."""
    fs = source.filesystem(url)
    key = None
    if get_protocol(url) == "hf":
        url = pin(source, url, commits)
        known_commit(fs, url)
        key = f"{hub.endpoint_of(source.storage_options)} {url} {source.format}"
    path = _path_of(fs, url)
    local = is_local(fs)  # a local path has no query: a '?' in it is a glob's or a name's
    _check_http_names_a_file(url, path)
    infos, explicit = _kept_or_listed(source, fs, url, path, key, listings)
    base = base_of(_without_query(path, local=local), glob=_is_glob(path, local) and not explicit)
    logged: dict[str, delta.DeltaFile] = {}  # a Delta table's files, as their log says
    if not explicit:
        found = {} if tables is None else tables
        pins = (at or {}, since)
        infos, logged = _delta_tables(source, fs, (url, path, base), infos, found, pins)
    shards: list[Shard] = []
    names: list[str] = []  # each shard's path on its filesystem
    unread: list[str] = []  # files no format reads unless named (an image folder's)
    _warn_broken(fs, url, infos, formats, source.format)
    for info in infos:
        if info.get("type", "file") != "file":
            continue
        name = info["name"]
        if not explicit and _dropping(base, name):
            continue  # _SUCCESS, .crc, _temporary/ and other writer droppings
        # A query string (``?token=...``, ``?versionId=...``) comes only with a URL named
        # explicitly: in a directory's or a glob's listing, a '?' is part of the file's name.
        plain = _without_query(name, local=local) if explicit else name
        fmt = _format_of(fs, formats, source.format, plain, explicit=explicit)
        if fmt is None:
            unread.append(plain)
            continue
        if info.get("size") is None:
            _no_size(fs.unstrip_protocol(name))
        real = fs.unstrip_protocol(name)
        # A listed name holds no secret (a '?' in it is its own): a query's values are
        # scrubbed only from a URL named explicitly, where a token may be one.
        shown = redact(real) if explicit else real
        if shown != real:
            source.hide(shown, real)
        shards.append(
            Shard(
                url=shown,
                size=int(info.get("size") or 0),
                version=_version_of(info),
                format=fmt,
                partition=logged[name].partition
                if name in logged
                else (hive_partition(base, name) if "=" in name and not explicit else ()),
                deletions=_vector_of(fs, logged.get(name)),
            )
        )
        names.append(name)
    _check_found(fs, (url, path), formats, shards, unread)
    if not explicit:
        _warn_splits(url, base, names, shards)
    return shards


def _dropping(base: str, name: str) -> bool:
    """Whether ``name`` (a listed file) is a writer's dropping, no shard: its own name or a
    folder's below ``base`` (the listed folder, a glob's fixed part) starts with ``.`` or
    ``_`` (``_SUCCESS``, ``x.crc``, Spark's ``_temporary/``, ``.ipynb_checkpoints/``), as
    pyarrow's and Spark's discovery skip them. A Delta table's ``_delta_log/`` is read apart
    (:func:`_delta_tables`)."""
    prefix = base + "/" if base else ""
    below = name[len(prefix) :] if name.startswith(prefix) else posixpath.basename(name)
    return any(part.startswith((".", "_")) for part in below.split("/"))


_NO_TABLES = frozenset({"hf", "http", "https"})
"""Stores whose globs are not looked at for a Delta table at their root: one more request
each (a Hub listing at a commit is made once, and kept), for tables no one keeps there."""


def _delta_tables(
    source: Source,
    fs: fsspec.AbstractFileSystem,
    where: tuple[str, str, str],
    infos: list[dict[str, Any]],
    tables: dict[str, delta.TableVersion],
    pins: tuple[Mapping[str, Sequence[int]], Mapping[str, int] | None],
) -> tuple[list[dict[str, Any]], dict[str, delta.DeltaFile]]:
    """``infos`` less the files of Delta tables that their version does not hold (earlier
    versions' files, the logs, change data), and the partition of each file kept that is a
    table's (from its log): the tables whose log the listing holds, or at a glob's root
    (:mod:`ingest.storage.sources.delta`), at the versions ``pins`` pins (by the root's URL:
    the files of each), else the newest, or followed from the version ``pins`` gives second
    (the files appended since too, and those a compaction since removed: listed from the
    log where a VACUUM removed them; None: not following, and a followed table's commits
    are kept as read, :meth:`Source.delta_commits`); ``tables`` gets each one's root URL,
    versions and schema. ``where``: the listed URL, its path and its base.

    Raises:
        SourceError: If a table's log cannot be read (or no longer holds the version
            pinned), or the table needs a Delta reader; or a directory's listing lacks a
            file the log holds.
    """
    url, path, base = where
    names = [str(i["name"]) for i in infos]
    refuse_other_tables(names, fs.unstrip_protocol)
    roots = delta.table_roots(names)
    glob = _is_glob(path, is_local(fs))
    if glob and base and base not in roots and get_protocol(url) not in _NO_TABLES:
        roots |= {base} if fs.isdir(posixpath.join(base, delta.LOG)) else set()
    if not roots:
        return infos, {}
    at, since = pins
    current: dict[str, delta.DeltaFile] = {}
    listed = set(names)
    retired: list[dict[str, Any]] = []  # a followed table's files a VACUUM removed
    for root in sorted(roots):
        logged = [n for n in names if n.startswith(f"{root}/{delta.LOG}/")]
        table = fs.unstrip_protocol(root)
        versions: list[delta.DeltaSnapshot] = []
        vacuumed: dict[str, int | None] = {}
        followed = None if since is None else since.get(table)
        pinned_to: Sequence[int | None] = at.get(table) or [None]
        for pinned in pinned_to if followed is None else [None]:
            commits = None if since is None else source.delta_commits(table)
            read = functools.partial(
                delta.read_log, fs, root, logged, pinned, since=followed, kept=commits
            )
            try:
                log = attempt(read, source.policy(url), source.stats)
            except GaveUpError as gave_up:
                raise _listing_error(source, url, gave_up) from None
            version = delta.snapshot(log, table)
            _same_vectors(table, current, version)
            current.update((f.path, f) for f in version.files)
            paths = [f.path for f in version.files if f.path not in version.retired]
            _check_listed(fs, root, paths, listed, glob=glob, at=log.at)
            gone = [f for f in version.files if f.path in version.retired and f.path not in listed]
            retired += [{"name": f.path, "size": f.size, "type": "file"} for f in gone]
            vacuumed.update((fs.unstrip_protocol(f.path), f.rows) for f in gone)
            versions.append(version)
        newest = max(versions, key=lambda v: v.version)
        numbers = {v.version for v in versions} | ({followed} if followed is not None else set())
        tables[table] = delta.TableVersion(tuple(sorted(numbers)), newest.schema, vacuumed)
    kept = []
    for info in [*infos, *retired]:
        name = str(info["name"])
        table = next((r for r in roots if name.startswith(f"{r}/")), None)
        if table is None or (name in current and not delta.in_log(name, table)):
            kept.append(info)
    return kept, current


def _vector_of(
    fs: fsspec.AbstractFileSystem, file: delta.DeltaFile | None
) -> DeletionVector | None:
    """A Delta file's deletion vector, its file named by URL (None: none)."""
    vector = None if file is None else file.deletions
    if vector is None or vector.path is None:
        return vector
    return replace(vector, path=fs.unstrip_protocol(vector.path))


def _same_vectors(
    table: str, current: Mapping[str, delta.DeltaFile], version: delta.DeltaSnapshot
) -> None:
    """Refuse two versions of a table read in one epoch (a state's) where a file has another
    deletion vector in each: which of its rows the epoch holds is not one answer."""
    for f in version.files:
        held = current.get(f.path)
        mine = None if f.deletions is None else f.deletions.unique_id
        theirs = None if held is None or held.deletions is None else held.deletions.unique_id
        if held is not None and mine != theirs:
            raise SourceError(
                table,
                f"its file {f.path} has other deleted rows (deletion vectors) in version "
                f"{version.version} than in the other version the state's epoch reads: the "
                "rows of the epoch are not one set",
                "start the epoch again (load no state), or resume from a state saved after "
                "the epoch began at the table's newest version",
            )


def _check_listed(
    fs: fsspec.AbstractFileSystem,
    root: str,
    paths: list[str],
    listed: set[str],
    *,
    glob: bool,
    at: int | None = None,
) -> None:
    """Refuse a Delta table whose files of the version read (``paths``; ``at``: a state's,
    else the newest) are not all in the listing: one outside its directory (a shallow
    clone's), or one gone from it (a directory's listing holds them all; a glob may match
    some)."""
    table = fs.unstrip_protocol(root)
    outside = [p for p in paths if not p.startswith(f"{root}/")]
    if outside:
        raise SourceError(
            table,
            f"its Delta log names {len(outside)} file(s) outside the table's directory, "
            f"{fs.unstrip_protocol(outside[0])} first (a shallow clone)",
            "pass the table's current files as the stream's URLs "
            "(deltalake.DeltaTable(url).file_uris())",
        )
    lost = [p for p in paths if p not in listed]
    if lost and at is not None:  # the state's version, no longer the newest: vacuumed since
        raise SourceError(
            table,
            f"{len(lost)} file(s) of its Delta version {at}, the version the stream's state "
            f"was saved at, are gone, {fs.unstrip_protocol(lost[0])} first: a VACUUM since "
            "removed them, so the rest of the state's epoch cannot be read",
            "start the epoch without the state (a new stream reads the newest version), or "
            "keep files longer than a job may be stopped (delta.deletedFileRetentionDuration)",
        )
    if lost and not glob:
        raise SourceError(
            table,
            f"its Delta log holds {len(lost)} file(s) the listing does not, "
            f"{fs.unstrip_protocol(lost[0])} first: removed by hand since the table's last "
            "commit",
            "restore the files, or repair the table (FSCK REPAIR TABLE in Spark)",
        )


def _check_http_names_a_file(url: str, path: str) -> None:
    """Refuse an HTTP(S) URL that names a folder or a glob: fsspec reads the links of a
    folder's index page where a server serves one, with no sizes; where it serves none, the
    folder "does not exist" (the server is up). Both were refused naming another cause."""
    if get_protocol(url) in ("http", "https") and (_is_glob(path) or path.endswith("/")):
        raise NoShardsError(
            url,
            "names a folder or a glob, and HTTP(S) lists no folder: each shard is a URL of its own",
            "pass the shards' URLs, or an index file naming them one per line: "
            "ingest.Stream(ingest.urls_from(index_url), ...)",
        )


def _no_size(url: str) -> NoReturn:
    """Refuse a file whose store says no size (an HTTP server that sends no
    ``Content-Length``: one that compresses or streams its answers). Taken for 0 bytes, a
    JSONL shard was read as empty, its rows left out without a word."""
    raise SourceError(
        redact(url),
        "the server says no size for it (no Content-Length: a compressed or streamed "
        "answer), and a shard is read by byte ranges of a known size",
        "serve the files with their Content-Length, as stored (no Content-Encoding for "
        "them), or copy them to an object store or a disk",
    )


def _followed(fs: fsspec.AbstractFileSystem, info: dict[str, Any]) -> dict[str, Any]:
    """``info``, a local symlink's to a file taken as that file's (its size and modification
    time: its version); any other as it is.

    fsspec lists a symlink as ``type: "other"`` (its size the file's, its times the link's):
    left out as not a file, a folder of links (the Hugging Face cache's snapshots, links to
    its blobs) was no data, and a link beside files was dropped with its rows. A broken
    link, or one to a folder, stays out."""
    if not info.get("islink") or info.get("type") == "file" or not is_local(fs):
        return info
    try:
        found = os.stat(info["name"])  # the file the link names (follows every link)
    except OSError:  # broken
        return info
    if not stat.S_ISREG(found.st_mode):
        return info
    return {**info, "type": "file", "size": found.st_size, "mtime": found.st_mtime}


def _path_of(fs: fsspec.AbstractFileSystem, url: str) -> str:
    """``url``'s path on ``fs``; a local one normalised (``d/../d`` and ``d/./`` are ``d``:
    its files listed once, under one URL each)."""
    path: str = fs._strip_protocol(strip_userinfo(url))
    return posixpath.normpath(path) if is_local(fs) else path


def _warn_broken(
    fs: fsspec.AbstractFileSystem,
    url: str,
    infos: list[dict[str, Any]],
    formats: FormatResolver,
    chosen: str | None,
) -> None:
    """Warn of the local links among ``infos`` that point at nothing (:func:`_followed`
    left them out) and whose names a format reads, naming a few."""
    if not is_local(fs):
        return
    links = [
        fs.unstrip_protocol(i["name"])
        for i in infos
        if i.get("islink")
        and not os.path.exists(i["name"])
        and formats.format_of(i["name"], chosen=chosen, explicit=False) is not None
    ]
    if not links:
        return
    named = ", ".join(links[:3]) + (f" and {len(links) - 3} more" if len(links) > 3 else "")
    warnings.warn(
        f"{len(links)} link(s) listed by {url} point at no file, and their rows are not "
        f"read: {named}. Fetch what they point at (git annex get, dvc pull, the download "
        "that fills a cache) or remove the links",
        BrokenLinkWarning,
        stacklevel=3,
    )


def _kept_or_listed(
    source: Source,
    fs: fsspec.AbstractFileSystem,
    url: str,
    path: str,
    key: str | None,
    listings: ListingStore | None,
) -> tuple[list[dict[str, Any]], bool]:
    """The fsspec infos of ``url`` and whether it named one file: from ``listings`` where it
    keeps this listing (``key``: a Hub commit's, which never changes), else listed (and kept
    there)."""
    stored = listings.get_listing(key) if listings is not None and key else None
    if stored is not None:
        infos: list[dict[str, Any]] = [
            {"name": name, "size": size, "ETag": version, "type": "file"}
            for name, size, version in stored
        ]
        return infos, len(infos) == 1 and infos[0]["name"] == path
    infos, explicit = _file_infos(source, fs, url, path)
    infos = [_followed(fs, i) for i in infos]
    if listings is not None and key:
        listings.put_listing(
            key,
            [
                (str(i["name"]), int(i.get("size") or 0), _version_of(i))
                for i in infos
                if i.get("type", "file") == "file"
            ],
        )
    return infos, explicit


def _warn_splits(url: str, base: str, names: list[str], shards: list[Shard]) -> None:
    """Warn if the shards ``url`` lists (``names``: their paths on its filesystem) name
    several splits below its root ``base`` (:mod:`ingest.storage.sources.splits`)."""
    if len(shards) > 1:
        prefix = len(base) + 1 if base else 0
        warn_mixed_splits(url, [n[prefix:] for n in names], [s.url for s in shards])


def _file_infos(
    source: Source, fs: fsspec.AbstractFileSystem, url: str, path: str
) -> tuple[list[dict[str, Any]], bool]:
    """The fsspec infos ``url`` matches, and whether it named one file explicitly.

    Raises:
        SourceError: If the path does not exist, access is denied or the store fails.
    """

    def infos() -> tuple[list[dict[str, Any]], bool]:
        source.stats.add(listings=1)
        if _is_glob(path, is_local(fs)):
            found = _glob(fs, url, path)
            if found:
                return _with_files_below(source, fs, (path, url.endswith("/")), found), False
            # A file or a folder whose name holds a glob's characters (`run[a].parquet`,
            # `run[1]/`), named: the glob matched nothing; the name may still be its own.
            source.stats.add(listings=1)
            return _named(source, fs, path)
        if url.endswith("/"):
            # A directory by its name: one listing, not a HEAD and a listing to tell
            # (object stores) first. Nothing under it: the checks below say why.
            found = fs.find(path, detail=True, withdirs=False)
            if found:
                return list(found.values()), False
        info = fs.info(path)
        if info.get("type") != "directory":
            return [info], True
        source.stats.add(listings=1)
        return list(fs.find(path, detail=True, withdirs=False).values()), False

    try:
        return attempt(infos, source.policy(url), source.stats)
    except GaveUpError as gave_up:
        raise _listing_error(source, url, gave_up) from None


def _named(
    source: Source, fs: fsspec.AbstractFileSystem, path: str
) -> tuple[list[dict[str, Any]], bool]:
    """The infos of ``path`` taken as a name, not a pattern, and whether it named a file: the
    file, or every file below the folder of that name; none where there is neither."""
    try:
        info: dict[str, Any] = fs.info(path)
    except FileNotFoundError:
        return [], False
    if info.get("type") != "directory":
        return [info], True
    source.stats.add(listings=1)
    return list(fs.find(path, detail=True, withdirs=False).values()), False


def _with_files_below(
    source: Source,
    fs: fsspec.AbstractFileSystem,
    glob: tuple[str, bool],
    found: dict[str, Any],
) -> list[dict[str, Any]]:
    """The infos a glob (its path, and whether its URL ends with ``/``: folders only)
    ``found``, with every file below the folders it matched, as a folder's URL lists them
    (``s3://b/2024-01-*/``: the day folders' files), each once. A glob whose last part is
    ``**`` matched those files itself; a folder below another one matched is listed with
    it. A listing per folder, up to 16 at once."""
    path, folders_only = glob
    folders = sorted(
        (n for n, i in found.items() if i.get("type") == "directory"), key=lambda n: n.count("/")
    )
    if not folders or (posixpath.basename(path) == "**" and not folders_only):
        return list(found.values())
    top: set[str] = set()
    for folder in folders:
        parts = folder.split("/")
        if not any("/".join(parts[:i]) in top for i in range(1, len(parts))):
            top.add(folder)

    def below(folder: str) -> dict[str, Any]:
        source.stats.add(listings=1)
        files: dict[str, Any] = fs.find(folder, detail=True, withdirs=False)
        return files

    files = {} if folders_only else {n: i for n, i in found.items() if i.get("type") != "directory"}
    with ThreadPoolExecutor(max_workers=min(16, len(top))) as pool:
        for listed in pool.map(below, sorted(top)):
            files.update(listed)
    return [files[n] for n in sorted(files)]


def _glob(fs: fsspec.AbstractFileSystem, url: str, path: str) -> dict[str, Any]:
    """``fs.glob`` of ``path``, its refusal of the pattern (``**`` inside a path component)
    a :class:`ConfigError` naming ``url`` and the pattern it takes.

    Raises:
        ConfigError: If fsspec refuses the pattern.
    """
    # Files only: with folders (fsspec's default), a glob asks for the info of the folder it
    # lists, which HfFileSystem finds by listing the folder above it (a request more, against
    # the Hub's rate limits). The listing keeps files alone anyway. Asked of the Hub only:
    # other filesystems' globs need not take ``withdirs``.
    files_only = {"withdirs": False} if get_protocol(url) == "hf" else {}
    try:
        found: dict[str, Any] = fs.glob(path, detail=True, **files_only)
    except ValueError as e:
        if "pattern" not in str(e).lower():
            raise
        fixed = re.sub(r"(?<=[^/])\*\*", "*/**", re.sub(r"\*\*(?=[^/])", "**/*", url))
        raise ConfigError(
            f"{redact(url)}: fsspec refuses this glob ({e}); '**' matches whole path "
            f"components: write it as {redact(fixed)}"
        ) from None
    return found


def _listing_error(source: Source, url: str, gave_up: GaveUpError) -> SourceError:
    """The error of a listing that still failed at the retry deadline (or failed for good):
    what the store said, and the fix."""
    e = gave_up.last
    if refused_connection(e) is not None:
        return SourceError(
            url,
            f"cannot list: the endpoint {source.endpoint(url)} refused the connection "
            f"{gave_up.describe(source.scrub)}",
            REFUSED_FIX,
        )
    credentials = missing_credentials(e)
    if credentials is not None:
        return SourceError(
            url,
            f"no credentials for the store ({type(e).__name__}: {source.scrub(str(e))})",
            credentials,
        )
    answered = server_answer(url, e)
    if answered is not None:  # an answer fsspec's HTTP filesystem calls FileNotFoundError
        problem, fix = answered
        return SourceError(url, f"cannot list: {problem} {gave_up.describe(source.scrub)}", fix)
    missing = _missing(url, e, source.scrub(str(e)))
    if missing is not None:
        return missing
    if isinstance(e, PermissionError):
        return SourceError(
            url,
            f"access denied ({source.scrub(str(e))})",
            "check the credentials in storage_options or the environment "
            "(key/secret/token, or the profile)",
        )
    return SourceError(
        url,
        f"cannot list: {gave_up.describe(source.scrub)}",
        "check the endpoint and the network; the deadline and timeouts are set "
        "with ReadOptions(retry=ingest.RetryPolicy(...))",
    )


def _check_found(
    fs: fsspec.AbstractFileSystem,
    where: tuple[str, str],
    formats: FormatResolver,
    shards: list[Shard],
    unread: list[str],
) -> None:
    """Raise where ``where`` (a URL and its path) listed no data files; warn where it listed
    documents alone beside ``unread`` files that a format named would read (an image
    folder's: :class:`UnreadFolderFilesWarning`).

    Raises:
        SourceError: If ``shards`` is empty.
    """
    url, path = where
    hint = formats.unread(unread, sorted({s.format for s in shards}))
    if not shards:
        _raise_no_match(fs, url, path, formats, hint)
    if hint is not None:
        warnings.warn(
            f"{redact(url)} lists only {len(shards)} document(s) as data ({shards[0].url}"
            f"{', ...' if len(shards) > 1 else ''}), which are read; {hint}",
            UnreadFolderFilesWarning,
            stacklevel=5,
        )


def _raise_no_match(
    fs: fsspec.AbstractFileSystem,
    url: str,
    path: str,
    formats: FormatResolver,
    hint: str | None = None,
) -> NoReturn:
    """Raise for a URL that listed no data files: a missing prefix, or no data among them.

    Raises:
        SourceError: Always.
    """
    if _is_glob(path, is_local(fs)):
        prefix = re.split(r"[*?\[]", path, maxsplit=1)[0].rsplit("/", 1)[0]
        if prefix and not fs.exists(prefix):
            raise NoShardsError(
                url,
                f"not found: {redact(fs.unstrip_protocol(prefix))} does not exist",
                _missing_fix(url),
            )
    if hint is not None:
        raise NoShardsError(url, f"matches no data files; {hint}", formats.describe())
    raise NoShardsError(url, "matches no data files", f"check the glob; {formats.describe()}")


def _missing(url: str, error: BaseException, said: str) -> SourceError | None:
    """The error of a listing of ``url`` whose revision (a Hub commit) or object is not
    there (``said``: the store's words, scrubbed); None for another failure."""
    if type(error).__name__ == "RevisionNotFoundError":  # huggingface_hub's
        return SourceError(
            url,
            f"cannot list: the repository has no such revision ({said})",
            "check the revision after '@' (a branch, a tag or a commit of the repository)",
        )
    if isinstance(error, FileNotFoundError):
        return NoShardsError(url, f"not found ({said or 'no such object'})", _missing_fix(url))
    return None


def _missing_fix(url: str) -> str:
    """What to check where ``url``'s folder or object is not there: a Hub repository's
    path and revision, else a bucket's."""
    if get_protocol(url) == "hf":
        return (
            "check the path in the repository and the revision (its files: the repository's "
            "'Files' page on the Hub)"
        )
    return (
        "check the bucket and path; for object stores the bucket must exist and be visible "
        "with these credentials"
    )


def _without_query(path: str, *, local: bool = False) -> str:
    """``path`` less a trailing query (``?token=...``); a ``local`` path as it is: it has no
    query, and a '?' in it is a glob's or the file's name's (``q?x=1.parquet``)."""
    return path if local else _QUERY_TAIL.sub("", path)


def _is_glob(path: str, local: bool = False) -> bool:
    """Whether ``path`` is a glob; a trailing query (``?token=...``) is not one, but for a
    ``local`` path, which has none."""
    return has_magic(_without_query(path, local=local))


def _format_of(
    fs: fsspec.AbstractFileSystem,
    formats: FormatResolver,
    chosen: str | None,
    name: str,
    *,
    explicit: bool,
) -> str | None:
    """The format of the listed file ``name`` (:meth:`FormatResolver.format_of`); one named
    ``explicit``-ly is told by its URL, which its error names (a path without its scheme,
    ``bucket/d``, named no URL), with the folder of the same name where one is there too.

    Raises:
        ConfigError: If ``explicit`` and the file's format cannot be told, or is not
            ``chosen``.
    """
    if not explicit:
        return formats.format_of(name, chosen=chosen, explicit=False)
    url = fs.unstrip_protocol(name)
    try:
        return formats.format_of(url, chosen=chosen, explicit=True)
    except ConfigError as e:
        message = str(e) if is_local(fs) else redact(str(e))  # a local '?' is no query
        raise ConfigError(message + _folder_beside(fs, name, url)) from None


def _folder_beside(fs: fsspec.AbstractFileSystem, name: str, url: str) -> str:
    """A sentence naming the folder ``url/`` where an object store holds one beside the
    object ``name`` (a zero-byte ``d`` some tools write beside the prefix ``d/``); else
    ``""``."""
    if is_local(fs):
        return ""
    try:
        folder = fs.isdir(name)
    except Exception:  # only a hint: the error stands without it
        return ""
    return (
        f"; a folder {redact(url)}/ is there too: name it so to read the files below it"
        if folder
        else ""
    )


_VERSION_KEYS = (
    "ETag",  # S3 (s3fs), HTTP (fsspec's HTTPFileSystem)
    "etag",  # GCS (gcsfs), Azure (adlfs)
    "md5Hash",  # GCS, where no etag
    "blob_id",  # the Hub (HfFileSystem): the git blob id
    "sha",
    "LastModified",  # S3, where no ETag
    "mtime",  # local disks
    "updated",  # GCS
    "last_modified",  # Azure
    "Content-MD5",  # HTTP without ETag (fsspec's HTTPFileSystem reports these three)
    "Digest",
    "Last-Modified",  # to the second
)
"""Keys of an fsspec info that tell one version of an object from another, best first. New
keys go last: a state saved against a version a key gave must find the same version."""


class UnreadFolderFilesWarning(UserWarning):
    """A listing found documents alone (a README.txt) beside the files of a dataset that a
    format reads only when named (an image folder: ``format="imagefolder"``): it reads the
    documents, as asked, and names the format that would read the rest."""


class BrokenLinkWarning(UserWarning):
    """A local folder or glob listed links that point at no file (a git-annex or DVC
    checkout whose objects were never fetched, a cache whose blobs were deleted): they are
    no shards, and the warning names them."""


class UnversionedShardWarning(UserWarning):
    """Shards were listed without a version (the store sent neither ETag nor a modification
    time): a shard rewritten in place with the same size cannot be told from the one a state
    was saved against. ``warnings.simplefilter("error", UnversionedShardWarning)`` makes it
    an error."""


def _version_of(info: Mapping[str, Any]) -> str:
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value not in (None, ""):
            return str(value).strip('"')
    return ""


def warn_unversioned(urls: Sequence[str], shards: Iterable[Shard], gone: set[str]) -> None:
    """Say in one warning, naming a few, that the ``shards`` a source's ``urls`` listed have
    no version (none is local: a file's modification time always is one), but for those
    ``gone`` (listed from a Delta log: deleted by a VACUUM). One per listing: a list of
    URLs (an index's, thousands) gave one warning per URL before."""
    bare = [s.url for s in shards if not s.version and not s.members and s.url not in gone]
    if not bare:
        return
    named = ", ".join(bare[:3]) + (f" and {len(bare) - 3} more" if len(bare) > 3 else "")
    where = redact(urls[0]) if len(urls) == 1 else f"{len(urls)} URLs"
    warnings.warn(
        f"{len(bare)} shard(s) listed by {where} have no version: the server sent "
        f"neither ETag nor Last-Modified for {named}. A shard rewritten in place with the same "
        "size cannot be told from the one a state was saved against: a resume checks only "
        "their sizes. Have the server send ETag or Last-Modified headers, or write changed "
        "data as new files",
        UnversionedShardWarning,
        stacklevel=2,
    )
