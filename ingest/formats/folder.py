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
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pyarrow as pa

from ingest.core.errors import ShardError
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
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")
AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aiff", ".aif")
FILES_PER_UNIT = 64
"""Most files per work unit: a unit is the least a reader reads, and its files are fetched
concurrently; 64 small files amortise a unit's planning and acks like one shard."""
UNIT_BYTES = 64 << 20
"""Most bytes per work unit (a unit of large files, e.g. long audio, is cut sooner)."""


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
    classes = tuple(sorted({class_of(f.url) for f in files}))
    index = {name: n for n, name in enumerate(classes)}
    out = [s for s in shards if s.format not in FOLDER_FORMATS]
    run: list[Shard] = []
    size = 0
    for f in files:
        if run and (
            f.format != run[0].format or len(run) >= files_per_unit or size + f.size > unit_bytes
        ):
            out.append(_unit(run, index))
            run, size = [], 0
        run.append(f)
        size += f.size
    out.append(_unit(run, index))
    out.sort(key=lambda s: s.url)
    return out, classes


def _unit(files: list[Shard], index: dict[str, int]) -> Shard:
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.url}\0{f.size}\0{f.version}\n".encode())
    return Shard(
        url=f"{files[0].url}+{len(files) - 1}",
        size=sum(f.size for f in files),
        version=h.hexdigest()[:32],
        format=files[0].format,
        members=tuple(files),
        labels=tuple(index[class_of(f.url)] for f in files),
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

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        if not shard.members:
            raise ShardError(
                shard.url,
                f"is a file, not a work unit of a {self.name} listing",
                "list the dataset's root directory (a URL ending in '/') with "
                f'format="{self.name}"',
            )
        return ShardInfo(rows=len(shard.members), schema=self.schema())

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
            batch = pa.record_batch(
                {
                    "path": pa.array([m.url for m in members], pa.string()),
                    self._column: pa.array(datas, pa.binary()),
                    "label": pa.array(unit.labels[row:end], pa.int64()),
                    "label_name": pa.array([class_of(m.url) for m in members], pa.string()),
                }
            )
            yield RowBatch(row, select(batch, ctx.columns, unit.url, row))
            row = end

    def _fetch(self, row: int) -> bytes:
        # read() returns the listed size or raises (Source.open): nothing to check here.
        with self.ctx.source.open(self.ctx.shard.members[row]) as f:
            return f.read()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = [
    "AUDIO_EXTENSIONS",
    "FILES_PER_UNIT",
    "FOLDER_FORMATS",
    "IMAGE_EXTENSIONS",
    "UNIT_BYTES",
    "class_of",
    "group",
]
