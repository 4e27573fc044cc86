"""Delta Lake tables: the data files of a table's current version, from its log.

A Delta table's directory keeps the Parquet files of its earlier versions (overwritten,
deleted, compacted) until ``VACUUM`` removes them, and its ``_delta_log`` says which are the
table: each commit ``_delta_log/<version>.json`` is a line per action, ``add`` a file (its
path a URI relative to the table's root, its partition values) or ``remove`` one; a
checkpoint ``<version>.checkpoint.parquet`` (named by ``_last_checkpoint``) holds the files
of its version, so that only the commits after it are read. A listing that finds a table
(a ``_delta_log`` directory under the listed URL, or at a glob's root) keeps the table's
current files alone, with their partition values as the partition columns
(:mod:`ingest.storage.sources.listing`).

A stream's state records the version each table was listed at; a resume reads the rest of
its epoch at that version (``read_log(at=...)``: Delta's time travel), since a compaction
(OPTIMIZE) or an overwrite after the state leaves the files it was saved on out of the
newest version, though on the store until VACUUM.

A followed table (``follow=``) is read as a stream of appends, as Delta's own streaming
source reads it: the files of the version the first round listed, then those each commit
since added with ``dataChange`` true (``snapshot(..., since=...)``). A compaction's commit
(``dataChange`` false) rewrites rows the table holds already: the files it added are not
read (their rows are in the files it removed, read or to be read from them, on the store
until VACUUM), and the files it removed stay in the listing (:attr:`DeltaSnapshot.retired`).
A commit that removes a file with ``dataChange`` true (DELETE, UPDATE, MERGE, an overwrite)
is refused: a followed table only grows.

Written here, with fsspec and pyarrow, because the listing already holds the log's names
and reads through the source's filesystem, retries and credentials; ``deltalake`` reads a
table with its own object-store client and options. What this reader cannot read exactly
is refused, naming the feature: column mapping (the files' columns named otherwise than the
table's), other reader features, v2 checkpoints, and a deletion vector in a followed table.
A file's deletion vector (rows deleted without rewriting it) goes with it
(:attr:`DeltaFile.deletions`), and its rows are read without them
(:mod:`ingest.formats.deleted_rows`); a file is its path and its vector, as the protocol
reconciles ``add`` and ``remove`` actions.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from ingest.core.errors import SourceError
from ingest.storage.sources.deletion_vectors import (
    VECTOR_FIX,
    DeletionVector,
    VectorError,
    unique_id,
)
from ingest.storage.sources.partitions import Partition

LOG = "_delta_log"
"""The directory of a Delta table's log, under its root."""
_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet")
_FEATURES = frozenset(
    {"timestampNtz", "vacuumProtocolCheck", "deletionVectors", "columnMapping", "variantType"}
)
"""Reader features of tables whose files this reader reads exactly: deletion vectors (each
file's read with it; refused in a followed table), column mapping and variants only where
the mapping is ``none`` and no column is a variant (checked apart; delta-rs lists the last
two on every table it writes at reader version 3)."""
_FIX = (
    "read the files of its current version with a Delta reader: pass "
    "deltalake.DeltaTable(url).file_uris() as the stream's URLs (a partitioned table's "
    "partition columns are not in its files: add them in a stage), or rewrite the table "
    "without the feature"
)


@dataclass(frozen=True, slots=True)
class DeltaFile:
    """A data file of a table's current version."""

    path: str
    """Its path on the table's filesystem."""
    size: int
    partition: Partition
    """Its partition values, in the table's partition columns' order (null: null)."""
    rows: int | None = None
    """Its row count from the log's statistics (``numRecords``), for the files of
    :attr:`DeltaSnapshot.retired` only (None elsewhere, or where the log has none)."""
    deletions: DeletionVector | None = None
    """Its deletion vector (the rows of it the table deleted), its file's path on the
    table's filesystem resolved (:attr:`DeletionVector.path`); None: none."""


_COMMITS_KEPT = 100_000
"""Commits a followed table's listing keeps read (their bytes, by version: a commit file is
never rewritten) so that a round lists only the commits written since the last."""


@dataclass(slots=True)
class DeltaLog:
    """What a table's log says from its last checkpoint: the checkpoint's actions (as
    dicts) and the commits after it (``version: bytes`` of each commit file)."""

    root: str
    """The table's root on its filesystem."""
    commits: dict[int, bytes] = field(default_factory=dict)
    checkpoint: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_version: int | None = None
    at: int | None = None
    """The version read (None: the newest)."""
    since: int | None = None
    """Followed from this version: its checkpoint is at or before it (see :func:`snapshot`)."""


@dataclass(frozen=True, slots=True)
class TableVersion:
    """A table as a listing found it: the versions listed (one, but where a state's epoch
    reads files of two) and the newest one's schema (None where the log holds none this
    reader converts)."""

    versions: tuple[int, ...]
    schema: pa.Schema | None
    vacuumed: Mapping[str, int | None] = field(default_factory=dict)
    """A followed table's files that a compaction removed and a VACUUM deleted since a
    round listed them (their URLs), each with its row count from the log (None: the log
    has none): listed without a read (the rounds before read them)."""


def table_roots(names: Iterable[str]) -> set[str]:
    """The roots of the Delta tables whose log is among ``names`` (paths)."""
    roots = set()
    marker = f"/{LOG}/"
    for name in names:
        at = name.find(marker)
        if at >= 0:
            roots.add(name[:at])
        elif name.startswith(f"{LOG}/"):
            roots.add("")
    return roots


def in_log(name: str, root: str) -> bool:
    """Whether path ``name`` is in the log (or another ``_`` directory: change data) of the
    table at ``root``: never a data file of the table's rows."""
    rest = name[len(root) + 1 :] if root else name
    return rest.startswith("_")


def read_log(
    fs: fsspec.AbstractFileSystem,
    root: str,
    names: Iterable[str],
    at: int | None = None,
    *,
    since: int | None = None,
    kept: MutableMapping[int, bytes] | None = None,
) -> DeltaLog:
    """The log of the table at ``root``: its last checkpoint and the commits after it, up
    to version ``at`` (None: the newest).

    Args:
        fs: The table's filesystem.
        root: The table's root on it.
        names: The paths of the log's files (a listing's; the log is listed when empty).
        at: The version to read (a state's): the newest checkpoint at or before it, and the
            commits after that up to it.
        since: A followed table's first version: the newest checkpoint at or before it,
            and every commit after that (:func:`snapshot` with ``since``).
        kept: Commits read before, by version (a followed table's): not read again, and
            those read are added (up to :data:`_COMMITS_KEPT`).
    """
    log_dir = posixpath.join(root, LOG)
    files = {posixpath.basename(n): n for n in names if posixpath.dirname(n) == log_dir}
    if not files:
        files = {posixpath.basename(n): n for n in fs.ls(log_dir, detail=False)}
    commits = {int(m[1]): path for b, path in files.items() if (m := _COMMIT.fullmatch(b))}
    if at is not None:
        commits = {v: path for v, path in commits.items() if v <= at}
    version, parts = _last_checkpoint(files, at if since is None else since)
    log = DeltaLog(root, checkpoint_version=version, at=at, since=since)
    if version is not None:
        for path in parts:
            with fs.open(path, "rb") as f:
                parquet = pq.ParquetFile(f)
                names = parquet.schema_arrow.names  # a part may lack a kind of action
                table = parquet.read(columns=[c for c in _CHECKPOINT_COLUMNS if c in names])
            log.checkpoint.extend(_actions(table))
    wanted = {commits[v]: v for v in sorted(commits) if version is None or v > version}
    if kept is not None:
        log.commits = {v: kept[v] for v in wanted.values() if v in kept}
        wanted = {path: v for path, v in wanted.items() if v not in kept}
    if wanted:
        # One call for all: an object store's filesystem (s3fs, gcsfs) fetches them at once,
        # where a table written without checkpoints (delta-rs writes none unless asked) has
        # a commit per write.
        got = fs.cat(list(wanted))
        found = got if isinstance(got, dict) else {next(iter(wanted)): got}
        by_name = {posixpath.basename(k): data for k, data in found.items()}  # as it keys them
        read = {v: by_name[posixpath.basename(path)] for path, v in wanted.items()}
        log.commits.update(read)
        if kept is not None and len(kept) + len(read) <= _COMMITS_KEPT:
            kept.update(read)
    return log


_CHECKPOINT_COLUMNS = ["add", "remove", "protocol", "metaData"]


def _last_checkpoint(
    files: Mapping[str, str], at: int | None = None
) -> tuple[int | None, list[str]]:
    """The version of the newest checkpoint (at or before ``at``) whose parts are all
    there, and their paths (None, [] without one). A v2 checkpoint
    (``<version>.checkpoint.<uuid>.json``) is none: its table lists the reader feature
    ``v2Checkpoint``, refused (:func:`current_files`)."""
    found: dict[int, dict[int, str]] = {}
    counts: dict[int, int] = {}
    for name, path in files.items():
        m = _CHECKPOINT.fullmatch(name)
        if m and (at is None or int(m[1]) <= at):
            v = int(m[1])
            found.setdefault(v, {})[int(m[2] or 1)] = path
            counts[v] = int(m[3] or 1)
    complete = [v for v, parts in found.items() if len(parts) == counts[v]]
    if not complete:
        return None, []
    v = max(complete)
    return v, [found[v][k] for k in sorted(found[v])]


def _actions(table: pa.Table) -> Iterator[dict[str, Any]]:
    """A checkpoint's rows as actions (``{"add": {...}}``...), its maps as dicts."""
    for row in table.to_pylist():
        for kind, action in row.items():
            if action is not None:
                yield {kind: _with_dicts(action)}


def _with_dicts(action: dict[str, Any]) -> dict[str, Any]:
    """pyarrow gives a map as a list of pairs: as a dict."""
    out = dict(action)
    for key in ("partitionValues", "configuration"):
        value = out.get(key)
        if isinstance(value, list):
            out[key] = dict(value)
    return out


@dataclass(frozen=True, slots=True)
class DeltaSnapshot:
    """A version of a table (the newest, or the log's ``at``): its data files and its
    schema (the log's, partition columns included; None where the log holds none this
    reader converts)."""

    files: list[DeltaFile]
    schema: pa.Schema | None
    version: int = 0
    retired: frozenset[str] = frozenset()
    """Followed (``since``): the paths among :attr:`files` that the newest version no longer
    holds, removed by a compaction since (their rows are read from them, not from the files
    it added): read from the store while there, listed from the log when a VACUUM removed
    them (the rounds before read them)."""


def current_files(log: DeltaLog, url: str | None = None) -> list[DeltaFile]:
    """The data files of the table's newest version, in path order (:func:`snapshot`)."""
    return snapshot(log, url).files


def snapshot(log: DeltaLog, url: str | None = None) -> DeltaSnapshot:
    """The table's newest version (or the log's ``at``): its data files, in path order,
    and its schema.

    A followed table's (the log's ``since``: the version its first round listed) files are
    those of version ``since`` and those each commit after it added with ``dataChange``
    true: a compaction's files (``dataChange`` false) are not, and the files it removed are
    kept (:attr:`DeltaSnapshot.retired`).

    Raises:
        SourceError: If a commit after the checkpoint is missing, the log no longer holds
            version ``at`` or ``since`` (or never did), a commit after ``since`` removes rows
            (a file removed with ``dataChange`` true), or the table needs a reader this one
            is not (a reader version above 3, a feature it cannot read exactly:
            :data:`_FEATURES`, column mapping, a deletion vector that cannot be read or
            one in a followed table).
    """
    where = url or log.root
    first = 0 if log.checkpoint_version is None else log.checkpoint_version + 1
    expected = range(first, first + len(log.commits))
    if log.at is not None:
        _check_holds(log, where, list(expected))
    if log.since is not None:
        _check_follows(log, where, list(expected))
    if sorted(log.commits) != list(expected):
        gap = next(v for v in expected if v not in log.commits)
        raise SourceError(
            where,
            f"its Delta log lacks commit {gap} (it holds {sorted(log.commits)[:5]}... after "
            f"checkpoint {log.checkpoint_version}): commit {gap} is missing, so its current "
            "files cannot be told",
            "restore the log, or write a checkpoint of the table (deltalake's "
            "DeltaTable.create_checkpoint()) and list it again",
        )
    files, retired, protocol, meta = _replay(log, where)
    _check_readable(where, protocol, meta, files.values(), following=log.since is not None)
    columns = list(meta.get("partitionColumns") or [])
    out = [
        DeltaFile(
            path=_data_path(log.root, path),
            size=int(add.get("size") or 0),
            partition=tuple((c, (add.get("partitionValues") or {}).get(c)) for c in columns),
            rows=_records(add) if path in retired else None,
            deletions=_deletions(log.root, where, path, add),
        )
        for path, add in files.items()
    ]
    newest = max(log.commits) if log.commits else log.checkpoint_version
    return DeltaSnapshot(
        sorted(out, key=lambda f: f.path),
        arrow_schema(meta.get("schemaString")),
        newest or 0,
        frozenset(_data_path(log.root, p) for p in retired if p in files),
    )


def _replay(
    log: DeltaLog, where: str
) -> tuple[dict[str, dict[str, Any]], set[str], dict[str, Any], dict[str, Any]]:
    """The log's actions replayed (:func:`snapshot`): the files' ``add`` actions by path,
    the paths among them a compaction since ``log.since`` removed, and the newest
    ``protocol`` and ``metaData``."""
    files: dict[str, dict[str, Any]] = {}
    retired: set[str] = set()
    protocol: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    since = log.since
    for version, action in _replayed(log, where):
        followed = since is not None and version > since
        if "add" in action:
            add = action["add"]
            if followed and add.get("dataChange") is False:
                continue  # a compaction's: its rows are read from the files it removed
            files[add["path"]] = add
            retired.discard(add["path"])
        elif "remove" in action:
            path = action["remove"]["path"]
            if not followed:
                # A file is its path and its deletion vector (the protocol's reconciliation):
                # a remove of the file with another vector (the one a commit replaced, which
                # may come after the add of the new one) leaves it.
                held = (files.get(path) or {}).get("deletionVector")
                if unique_id(held) == unique_id(action["remove"].get("deletionVector")):
                    files.pop(path, None)
            elif action["remove"].get("dataChange") is False:
                retired.add(path)  # a compaction's: the file stays, its rows read from it
            else:
                raise _not_an_append(log, where, version, path)
        elif "protocol" in action:
            protocol = action["protocol"]
        elif "metaData" in action:
            meta = action["metaData"]
    return files, retired, protocol, meta


def _deletions(root: str, where: str, path: str, add: Mapping[str, Any]) -> DeletionVector | None:
    """The deletion vector of file ``path`` (its ``add``), its file's path resolved on the
    table's filesystem (``root``: the table's)."""
    descriptor = add.get("deletionVector")
    if not descriptor:
        return None
    try:
        vector = DeletionVector.from_action(descriptor)
        file = vector.file(root)
    except VectorError as bad:
        raise SourceError(
            where,
            f"its file {path} has a deletion vector that cannot be read: {bad}",
            VECTOR_FIX,
        ) from None
    if file is not None and vector.storage == "p":  # a URI, as a file's absolute path is
        file = _data_path(root, file)
    return replace(vector, path=file)


def _records(add: Mapping[str, Any]) -> int | None:
    """A file's row count from its ``add`` action's statistics (``numRecords``), if any."""
    try:
        rows = json.loads(add.get("stats") or "{}").get("numRecords")
    except (ValueError, TypeError, AttributeError):
        return None
    return rows if isinstance(rows, int) and rows >= 0 else None


def _check_follows(log: DeltaLog, where: str, expected: list[int]) -> None:
    """Refuse a followed table's log that no longer holds version ``log.since`` and every
    commit after it (the log's retention removed them, or the table was written again)."""
    since = log.since
    held = sorted(log.commits)
    reaches = (held[-1] if held else log.checkpoint_version) or 0
    if held == expected and reaches >= (since or 0):
        return
    raise SourceError(
        where,
        f"its Delta log no longer holds version {since} and every commit after it (it holds "
        f"{held[:1]}..{held[-1:]} after checkpoint {log.checkpoint_version}): a followed "
        "table's rounds read the files of the version the first round listed and those "
        "appended since, and the log's retention (delta.logRetentionDuration) removed those "
        "commits, or the table was written again from scratch",
        "start a new stream without the state (its first round reads the newest version "
        "whole), or keep the log longer than a stream follows the table",
    )


def _not_an_append(log: DeltaLog, where: str, version: int, path: str) -> SourceError:
    """The error for a followed table's commit ``version`` that removed file ``path`` with
    ``dataChange`` true: not an append (its operation named, from its commitInfo)."""
    operation = "?"
    for line in log.commits.get(version, b"").splitlines():
        if b'"commitInfo"' in line:
            with contextlib.suppress(ValueError, KeyError, AttributeError):
                operation = str(json.loads(line)["commitInfo"].get("operation", "?"))
    return SourceError(
        where,
        f"its Delta commit {version} ({operation}) removes rows while the stream follows the "
        f"table (file {path} removed with dataChange true: a DELETE, UPDATE, MERGE or "
        "overwrite); rows a round read may be gone, or come again rewritten",
        "a followed table only grows: append to it (a compaction, OPTIMIZE, is read through), "
        "or start a new stream without the state to read its newest version",
    )


def _check_holds(log: DeltaLog, where: str, expected: list[int]) -> None:
    """Refuse a log that cannot give version ``log.at``: its commits up to it are not all
    there after the newest checkpoint before it (the log's retention removed them), or the
    table has no such version (written again from scratch)."""
    held = sorted(log.commits)
    if held == expected and (held[-1] if held else log.checkpoint_version) == log.at:
        return
    if not held:
        commits = "no commit"
    elif len(held) == 1:
        commits = f"commit {held[0]}"
    else:
        commits = f"commits {held[0]}..{held[-1]}"
    checkpoint = (
        f"no checkpoint before version {log.at}"
        if log.checkpoint_version is None
        else f"its checkpoint at version {log.checkpoint_version}"
    )
    joined = "and" if log.checkpoint_version is None else "after"
    raise SourceError(
        where,
        f"its Delta log no longer holds version {log.at}, the version the stream's state "
        f"was saved at (it holds {commits} {joined} {checkpoint}): the log's retention "
        "(delta.logRetentionDuration) removed its commits, or the table was written again "
        "from scratch",
        "start the epoch without the state (a new stream reads the newest version), or keep "
        "the log longer",
    )


_PRIMITIVES = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", "UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def arrow_schema(schema_string: object) -> pa.Schema | None:
    """A Delta schema (the log's ``schemaString``: JSON) as an Arrow schema, as delta-rs
    and Spark write its files; None where it holds a type this reader does not convert."""
    try:
        fields = json.loads(schema_string)["fields"] if isinstance(schema_string, str) else None
        return None if fields is None else pa.schema([_field(f) for f in fields])
    except (ValueError, KeyError, TypeError):
        return None


def _field(field: Mapping[str, Any]) -> pa.Field:
    return pa.field(field["name"], _type(field["type"]), nullable=field.get("nullable", True))


def _type(t: Any) -> pa.DataType:
    """A Delta type (a name, or a struct, array or map as JSON) as an Arrow type."""
    if isinstance(t, str):
        decimal = _DECIMAL.fullmatch(t)
        if decimal:
            return pa.decimal128(int(decimal[1]), int(decimal[2]))
        return _PRIMITIVES[t]
    kind = t["type"]
    if kind == "struct":
        return pa.struct([_field(f) for f in t["fields"]])
    if kind == "array":
        return pa.list_(_type(t["elementType"]))
    if kind == "map":
        return pa.map_(_type(t["keyType"]), _type(t["valueType"]))
    raise KeyError(kind)


def _replayed(log: DeltaLog, where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The checkpoint's actions, then each commit's, in order, each with its version."""
    at = -1 if log.checkpoint_version is None else log.checkpoint_version
    for action in log.checkpoint:
        yield at, action
    for version in sorted(log.commits):
        for n, line in enumerate(log.commits[version].splitlines()):
            if line.strip():
                try:
                    yield version, json.loads(line)
                except ValueError as e:
                    raise SourceError(
                        where,
                        f"line {n + 1} of its Delta commit {version} is not JSON ({e})",
                        "restore the commit file from the table's writer",
                    ) from None


def _check_readable(
    where: str,
    protocol: Mapping[str, Any],
    meta: Mapping[str, Any],
    adds: Iterable[Any],
    *,
    following: bool,
) -> None:
    """Refuse a table whose files (less their deleted rows) do not give its rows exactly, and
    a followed one with a deletion vector (a followed table only grows)."""
    version = int(protocol.get("minReaderVersion") or 1)
    if version > 3:
        raise SourceError(where, f"its Delta protocol needs reader version {version}", _FIX)
    features = set(protocol.get("readerFeatures") or ())
    mode = (meta.get("configuration") or {}).get("delta.columnMapping.mode", "none")
    if version >= 2 and mode != "none":
        features.add(f"columnMapping (mode {mode})")
    if "variantType" in features and _has_variant(meta.get("schemaString")):
        features.add("variantType (a variant column)")
    refused = sorted(f for f in features if f not in _FEATURES)
    if refused:
        raise SourceError(
            where,
            f"its Delta protocol lists reader features this reader does not read: {refused}",
            _FIX,
        )
    with_vector = next((a["path"] for a in adds if a.get("deletionVector")), None)
    if with_vector is not None and following:
        raise SourceError(
            where,
            f"its file {with_vector} has Delta deletionVectors (rows deleted without "
            "rewriting it) while the stream follows the table: a followed table's rows are "
            "appended, never deleted",
            "read the table without follow= (each epoch reads its current version, deleted "
            "rows left out), or follow a table that is only appended to",
        )


def _has_variant(schema: object) -> bool:
    """Whether the table's schema (its JSON) has a variant column, at any depth."""

    def holds(node: object) -> bool:
        if node == "variant":
            return True
        if isinstance(node, dict):
            return any(holds(v) for k, v in node.items() if k not in ("name", "metadata"))
        return isinstance(node, list) and any(holds(v) for v in node)

    try:
        return holds(json.loads(schema)) if isinstance(schema, str) else False
    except ValueError:
        return True  # unreadable: taken to hold one (refused)


def _data_path(root: str, path: str) -> str:
    """A file's path on the table's filesystem: ``path`` is a URI, relative to ``root`` or
    absolute (a shallow clone's)."""
    decoded = unquote(path)
    if "://" in decoded:
        return decoded.split("://", 1)[1]
    if decoded.startswith("/"):
        return decoded
    return posixpath.join(root, decoded) if root else decoded


__all__ = [
    "LOG",
    "DeltaFile",
    "DeltaLog",
    "DeltaSnapshot",
    "TableVersion",
    "arrow_schema",
    "current_files",
    "in_log",
    "read_log",
    "snapshot",
    "table_roots",
]
