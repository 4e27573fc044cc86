"""Parquet: row counts and row groups from the footer, seek by row group.

The footer is read once per shard by :meth:`ParquetFormat.inspect` and handed back to every
reader as ``ParquetFile(metadata=...)``, so opening a shard again costs no request.
Column chunks are fetched with pyarrow's own pre-buffering, which coalesces nearby ranges
and issues them concurrently. ``fsspec.parquet.open_parquet_file`` does the same
coalescing, but re-reads the footer on every open and, with the pyarrow engine, cannot take
a footer that was already read.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ingest.errors import ShardError
from ingest.formats.base import (
    Format,
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    check_schema,
)
from ingest.sources import Shard, Source

_FIX = "check that the object is a complete Parquet file (re-upload it), or pass format="


class ParquetFormat(Format):
    name = "parquet"
    extensions = (".parquet", ".pq")

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        with source.open(shard) as f:
            head = f.read(4)
            if head != b"PAR1":
                raise ShardError(
                    shard.url,
                    f"is not a Parquet file (starts with {head!r}, not b'PAR1')",
                    _FIX,
                    byte=0,
                )
            try:
                meta = pq.read_metadata(f)
            except (pa.ArrowInvalid, OSError) as e:
                raise ShardError(
                    shard.url, f"has no readable Parquet footer ({e})", _FIX, byte=shard.size
                ) from None
        starts: list[int] = []
        offset = 0
        for i in range(meta.num_row_groups):
            starts.append(offset)
            offset += meta.row_group(i).num_rows
        return ShardInfo(
            rows=meta.num_rows,
            blocks=tuple(starts),
            schema=meta.schema.to_arrow_schema(),
            meta=meta,
        )

    def open(self, ctx: ReadContext) -> ShardReader:
        return _ParquetReader(ctx)


class _ParquetReader(ShardReader):
    def __init__(self, ctx: ReadContext) -> None:
        super().__init__(ctx)
        info = ctx.info
        assert info.schema is not None  # set by inspect
        check_schema(ctx.shard.url, info.schema, ctx.schema, ctx.schema_origin, ctx.columns)
        self._file = ctx.source.open(ctx.shard)
        self._pf: Any = pq.ParquetFile(
            self._file, metadata=info.meta, pre_buffer=ctx.options.pre_buffer
        )
        self._starts = list(info.blocks or (0,))

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        rows = self.ctx.info.rows or 0
        stop = rows if stop is None else min(stop, rows)
        if start >= stop:
            return
        first = bisect.bisect_right(self._starts, start) - 1
        last = bisect.bisect_left(self._starts, stop)
        columns = list(self.ctx.columns) if self.ctx.columns is not None else None
        for group in range(first, last):
            row = self._starts[group]
            try:
                batches = self._pf.iter_batches(
                    batch_size=self.ctx.options.batch_rows, row_groups=[group], columns=columns
                )
                for batch in batches:
                    lo, hi = max(start - row, 0), min(stop - row, batch.num_rows)
                    if hi > lo:
                        data = (
                            batch if (lo, hi) == (0, batch.num_rows) else batch.slice(lo, hi - lo)
                        )
                        yield RowBatch(row + lo, data)
                    row += batch.num_rows
                    if row >= stop:
                        return
            except (pa.ArrowInvalid, OSError, EOFError) as e:
                raise ShardError(
                    self.ctx.shard.url, f"row group {group} cannot be read ({e})", _FIX, row=row
                ) from None

    def close(self) -> None:
        self._file.close()
