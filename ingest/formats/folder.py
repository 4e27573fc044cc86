"""ImageFolder and AudioFolder datasets: one row per file, read by work units.

``format="imagefolder"`` (or ``"audiofolder"``) on a directory URL takes its image (audio)
files, groups them into work units (:func:`group`) and yields rows of ``path``
(the file's URL), ``image`` (``audio``: the file's bytes, undecoded), ``label`` (the class
index) and ``label_name``. Decoding is a transform that runs where transforms run, in the
CPU pool of a :class:`ingest.RayStream`: :class:`ingest.decode.Images`,
:class:`ingest.decode.Audio`.

A unit's files are fetched :attr:`ReadOptions.file_concurrency` at a time, each whole in
one request (through the shard cache when one is set), in order, by
:meth:`ingest.Source.open`: a file gone or cut short since the listing is its error.

The layout. Each file is one row: its URL (``path``), its class (``label``: the index of the name of
the file's directory in the sorted class list, and ``label_name``) and its bytes. A listing
of a million small files must not become a million shards (the state, the plan and the
requests would all grow with it), so the listed files are grouped into work units: runs of
consecutive files (sorted by URL) of one format, up to :data:`FILES_PER_UNIT` files or
:data:`UNIT_BYTES` bytes. A unit is a :class:`~ingest.storage.sources.Shard` with ``members``: its
URL is its first file's with ``+N`` (the N files after it), its size theirs added up, its
version a hash of their URLs, sizes and versions, so a file changed, added or removed
inside a unit changes the unit (a state saved before is refused, naming it). Row ``i`` of a
unit is its ``i``-th file: a resume seeks to the file, and a reader fetches a unit's files
concurrently (below).

The class list is the sorted set of the files' directory names; it is part of the state's
dataset part, and a state whose class list differs from the listing's is refused (its
label indices would mean other classes).

Metadata. As ``datasets``' imagefolder reads them, a ``metadata.jsonl`` (``.csv``,
``.parquet``) in the tree gives the files at or below its directory their columns: its
``file_name`` column names each file relative to that directory, its other columns are the
row's (a caption per image), and the rows have no labels. Each file takes the nearest
metadata file above it; where the listing holds one, every file must have one
(:func:`group`), and a file without a row is an error naming both. A unit keeps the
metadata files of its members (:attr:`Shard.metadata`), whose versions are part of its
own: a metadata file changed changes the unit. Each reader reads a metadata file whole
once (kept for the process, :func:`_metadata_table`); the stream's columns are the first
unit's first metadata file's.
"""

from __future__ import annotations

import hashlib
import posixpath
import threading
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pyarrow as pa

from ingest.core.errors import ConfigError, ShardError
from ingest.formats.arrays import binaries, ints, record_batch, strings
from ingest.formats.base import (
    Format,
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    select,
)
from ingest.storage.sources import Shard, Source

FOLDER_FORMATS = ("imagefolder", "audiofolder")
FOLDER_METADATA = ("metadata.jsonl", "metadata.csv", "metadata.parquet")
"""The files that give a folder dataset's files their columns (see the module docstring)."""
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")
AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aiff", ".aif")
FILES_PER_UNIT = 64
"""Most files per work unit: a unit is the least a reader reads, and its files are fetched
concurrently; 64 small files amortise a unit's planning and acks like one shard."""
UNIT_BYTES = 64 << 20
"""Most bytes per work unit (a unit of large files, e.g. long audio, is cut sooner)."""


class FolderLabelsWarning(UserWarning):
    """Files of a folder dataset lie in folders above other labelled folders (``pets/x.png``
    beside ``pets/cat/a.png``): each is labelled with its own folder's name, a class of its
    own (:func:`group` says which)."""


def class_of(url: str) -> str:
    """A file's class: the name of its directory (``s3://b/pets/cat/1.jpg`` -> ``cat``)."""
    return posixpath.basename(posixpath.dirname(url.split("://", 1)[-1]))


def group(
    shards: Sequence[Shard],
    *,
    files_per_unit: int = FILES_PER_UNIT,
    unit_bytes: int = UNIT_BYTES,
) -> tuple[list[Shard], tuple[str, ...]]:
    """Group the files of folder formats into work units; other shards pass unchanged.

    Args:
        shards: A listing, sorted by URL.
        files_per_unit: Most files per unit.
        unit_bytes: Most bytes per unit (a single larger file is a unit of its own).

    Returns:
        The shards with folder files replaced by units, sorted by URL, and the class list
        (empty when no shard is of a folder format).
    """
    if files_per_unit < 1 or unit_bytes < 1:
        raise ValueError(
            f"files_per_unit={files_per_unit} and unit_bytes={unit_bytes} must be >= 1"
        )
    files = [s for s in shards if s.format in FOLDER_FORMATS]
    if not files:
        return list(shards), ()
    metadata = {_directory(s.url): s for s in shards if _is_metadata(s)}
    classes = () if metadata else tuple(sorted({class_of(f.url) for f in files}))
    if classes:
        _warn_nested_labels(files)
    index = {name: n for n, name in enumerate(classes)}
    out = [s for s in shards if s.format not in FOLDER_FORMATS and not _is_metadata(s)]
    run: list[Shard] = []
    size = 0
    for f in files:
        if run and (
            f.format != run[0].format or len(run) >= files_per_unit or size + f.size > unit_bytes
        ):
            out.append(_unit(run, index, metadata))
            run, size = [], 0
        run.append(f)
        size += f.size
    out.append(_unit(run, index, metadata))
    out.sort(key=lambda s: s.url)
    return out, classes


def _warn_nested_labels(files: Sequence[Shard]) -> None:
    """Say which files lie in a folder above another labelled folder (``pets/top.png`` and
    ``pets/cat/a.png``; ``dog/c.png`` and ``dog/puppy/e.png``): labelled by its folder's
    name (``pets``, ``dog``) beside its subfolders' classes, most likely not what was meant.
    ``datasets``' imagefolder adds labels only where every file is at one depth; the roots
    are not known here, so a folder nested in another is the sign (two roots at different
    depths are not)."""
    folders = {_directory(f.url) for f in files}
    above: dict[str, str] = {}  # a folder of files -> a labelled folder below it
    for folder in folders:
        parent = _directory(folder)
        while "/" in parent.split("://", 1)[-1]:
            if parent in folders:
                above.setdefault(parent, folder)
            parent = _directory(parent)
    if not above:
        return
    named = [f for f in files if _directory(f.url) in above]
    shown = "; ".join(
        f"{f.url} (labelled {class_of(f.url)!r}, beside {above[_directory(f.url)]}/)"
        for f in named[:3]
    )
    more = f" and {len(named) - 3} more" if len(named) > 3 else ""
    warnings.warn(
        f"{len(named)} files lie in folders above other labelled folders: {shown}{more}. "
        "A file's label is its folder's name, so each of these is a class of its own "
        "beside the classes below it. Put every file at <root>/<class>/<file>, list the "
        "class folders' root alone, or give the files their columns with a metadata.jsonl",
        FolderLabelsWarning,
        stacklevel=3,
    )


def _is_metadata(shard: Shard) -> bool:
    return posixpath.basename(shard.url) in FOLDER_METADATA and not shard.members


def _directory(url: str) -> str:
    return url.rpartition("/")[0]


def metadata_of(url: str, metadata: dict[str, Shard]) -> Shard | None:
    """The metadata file that gives the file at ``url`` its columns: the nearest above it
    (``metadata``: by its directory's URL), or None."""
    where = _directory(url)
    while where and "/" in where:
        found = metadata.get(where)
        if found is not None:
            return found
        where = _directory(where)
    return None


def _unit(files: list[Shard], index: dict[str, int], metadata: dict[str, Shard]) -> Shard:
    used: dict[str, Shard] = {}
    for f in files if metadata else ():
        found = metadata_of(f.url, metadata)
        if found is None:
            raise ConfigError(
                f"{f.url} has no metadata file in its directory or above it, where "
                f"{next(iter(metadata.values())).url} gives other files their columns: "
                "every file of a folder dataset with metadata needs a row in one (as "
                "datasets' imagefolder reads them); add one, or list the files apart"
            )
        used[found.url] = found
    h = hashlib.sha256()
    for f in [*files, *used.values()]:
        h.update(f"{f.url}\0{f.size}\0{f.version}\n".encode())
    return Shard(
        url=f"{files[0].url}+{len(files) - 1}",
        size=sum(f.size for f in files),
        version=h.hexdigest()[:32],
        format=files[0].format,
        members=tuple(files),
        labels=() if metadata else tuple(index[class_of(f.url)] for f in files),
        metadata=tuple(used.values()),
    )


class _FolderFormat(Format):
    selective = True
    empty_is_valid = False
    inspect_reads = False
    column: ClassVar[str]

    def schema(self) -> pa.Schema:
        return pa.schema(
            [
                pa.field("path", pa.string()),
                pa.field(self.column, pa.binary()),
                pa.field("label", pa.int64()),
                pa.field("label_name", pa.string()),
            ]
        )

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema:
        """:meth:`schema`; with metadata, ``path``, the file's bytes and the first metadata
        file's columns (but ``file_name``), as ``datasets`` reads them: no labels."""
        if not shard.metadata:
            return self.schema()
        columns = _metadata_table(source, shard.metadata[0]).schema
        fields = [f for f in columns if f.name != _FILE_NAME]
        return pa.schema(
            [pa.field("path", pa.string()), pa.field(self.column, pa.binary()), *fields]
        )

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        if not shard.members:
            raise ShardError(
                shard.url,
                f"is a file, not a work unit of a {self.name} listing",
                "list the dataset's root directory (a URL ending in '/') with "
                f'format="{self.name}"',
            )
        schema = None if shard.metadata else self.schema()  # the metadata's: when read
        return ShardInfo(rows=len(shard.members), schema=schema)

    def open(self, ctx: ReadContext) -> ShardReader:
        return _FolderReader(ctx, self.column)


class ImageFolderFormat(_FolderFormat):
    name = "imagefolder"
    extensions = IMAGE_EXTENSIONS
    column = "image"


class AudioFolderFormat(_FolderFormat):
    name = "audiofolder"
    extensions = AUDIO_EXTENSIONS
    column = "audio"


class _FolderReader(ShardReader):
    def __init__(self, ctx: ReadContext, column: str) -> None:
        super().__init__(ctx)
        self._column = column
        self._pool: ThreadPoolExecutor | None = None

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        ctx = self.ctx
        unit = ctx.shard
        stop = len(unit.members) if stop is None else min(stop, len(unit.members))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                min(ctx.options.file_concurrency, len(unit.members)) or 1,
                thread_name_prefix="ingest-folder",
            )
        row = start
        while row < stop:
            # A batch: up to batch_rows files, fetched concurrently, kept in order.
            end = min(stop, row + ctx.options.batch_rows)
            datas = list(self._pool.map(self._fetch, range(row, end)))
            members = unit.members[row:end]
            columns: dict[str, pa.Array] = {
                "path": strings([m.url for m in members]),
                self._column: binaries(datas),
            }
            if unit.metadata:
                columns.update(self._metadata(members))
            else:
                columns["label"] = ints(unit.labels[row:end])
                columns["label_name"] = strings([class_of(m.url) for m in members])
            batch = record_batch(columns)
            yield RowBatch(row, select(batch, ctx.columns, unit.url, row))
            row = end

    def _metadata(self, members: Sequence[Shard]) -> dict[str, pa.Array]:
        """The metadata columns of ``members``' rows, in the stream's types."""
        ctx = self.ctx
        by_dir = {_directory(m.url): m for m in ctx.shard.metadata}
        assert ctx.schema is not None  # a folder stream's, from its metadata
        names = [f.name for f in ctx.schema][2:]
        runs: list[tuple[Shard, list[int]]] = []  # consecutive members of one metadata file
        for member in members:
            meta = metadata_of(member.url, by_dir)
            assert meta is not None  # every member's is among its unit's (group)
            _, rows = _metadata_index(ctx.source, meta)
            found = rows.get(member.url[len(_directory(meta.url)) + 1 :])
            if found is None:
                raise ShardError(
                    member.url,
                    f"has no row in {meta.url}, which gives the files below it their columns",
                    f"add a row whose {_FILE_NAME} is its path from that directory",
                )
            if runs and runs[-1][0] is meta:
                runs[-1][1].append(found)
            else:
                runs.append((meta, [found]))
        parts = []
        for meta, taken in runs:
            table, _ = _metadata_index(ctx.source, meta)
            missing = [n for n in names if n not in table.column_names]
            if missing:
                raise ShardError(
                    meta.url,
                    f"has no column {missing[0]!r}, which the stream's first metadata file has",
                    "give every metadata file the same columns",
                )
            parts.append(table.select(names).take(taken))
        want = {f.name: f.type for f in ctx.schema}
        try:
            joined = pa.concat_tables(parts, promote_options="permissive").combine_chunks()
            return {n: joined.column(n).chunk(0).cast(want[n]) for n in names}
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise ShardError(
                ctx.shard.url,
                f"its files' metadata columns do not hold the stream's types ({e})",
                "give every metadata file's columns the same types",
            ) from None

    def _fetch(self, row: int) -> bytes:
        # read() returns the listed size or raises (Source.open): nothing to check here.
        with self.ctx.source.open(self.ctx.shard.members[row]) as f:
            return f.read()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_FILE_NAME = "file_name"
_TABLES: dict[tuple[str, int, str], tuple[pa.Table, dict[str, int]]] = {}
_TABLES_LOCK = threading.Lock()


def _metadata_table(source: Source, meta: Shard) -> pa.Table:
    return _metadata_index(source, meta)[0]


def _metadata_index(source: Source, meta: Shard) -> tuple[pa.Table, dict[str, int]]:
    """A metadata file's table and the row of each ``file_name``, read once per process
    (by URL, size and version; the last 8 kept)."""
    key = (meta.url, meta.size, meta.version)
    with _TABLES_LOCK:
        found = _TABLES.get(key)
    if found is not None:
        return found
    with source.open(meta) as f:
        data = f.read()
    table = _parse_metadata(meta, data)
    if _FILE_NAME not in table.column_names:
        raise ShardError(
            meta.url,
            f"has no {_FILE_NAME!r} column (its columns: {table.column_names})",
            f"name each file in a {_FILE_NAME!r} column, its path from the metadata file's "
            "directory (as datasets' imagefolder reads it)",
        )
    names = table.column(_FILE_NAME).to_pylist()
    rows = {str(n): i for i, n in enumerate(names)}
    if len(rows) < len(names):
        twice = next(n for n, k in Counter(names).items() if k > 1)
        raise ShardError(meta.url, f"names {twice!r} in two rows", "give each file one row")
    with _TABLES_LOCK:
        if len(_TABLES) >= 8:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = (table, rows)
    return table, rows


def _parse_metadata(meta: Shard, data: bytes) -> pa.Table:
    import pyarrow.parquet as pq

    from ingest.formats.big_integers import exact_csv, exact_json

    try:  # integers past int64 as uint64
        if meta.url.endswith(".jsonl"):
            return exact_json(data)
        if meta.url.endswith(".csv"):
            return exact_csv(data)
        return pq.read_table(pa.BufferReader(data))
    except pa.ArrowInvalid as e:
        raise ShardError(
            meta.url, f"cannot be read as a metadata file ({e})", "fix the file"
        ) from None


__all__ = [
    "AUDIO_EXTENSIONS",
    "FILES_PER_UNIT",
    "FOLDER_FORMATS",
    "FOLDER_METADATA",
    "IMAGE_EXTENSIONS",
    "UNIT_BYTES",
    "class_of",
    "group",
    "metadata_of",
]
