"""ImageFolder and AudioFolder datasets: one row per file, read by work units.

``format="imagefolder"`` (or ``"audiofolder"``) on a directory URL takes its image (audio)
files, groups them into work units (:mod:`ingest.folders`) and yields rows of ``path``
(the file's URL), ``image`` (``audio``: the file's bytes, undecoded), ``label`` (the class
index) and ``label_name``. Decoding is a transform that runs where transforms run, in the
CPU pool of a :class:`ingest.RayStream`: :class:`ingest.decode.Images`,
:class:`ingest.decode.Audio`.

A unit's files are fetched :attr:`ReadOptions.file_concurrency` at a time, each whole in
one request (through the shard cache when one is set), in order, by
:meth:`ingest.Source.open`: a file gone or cut short since the listing is its error.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pyarrow as pa

from ingest.errors import ShardError
from ingest.folders import AUDIO_EXTENSIONS, IMAGE_EXTENSIONS, class_of
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
from ingest.sources import Shard, Source


class _FolderFormat(Format):
    selective = True
    empty_is_valid = False
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
