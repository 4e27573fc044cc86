"""Parquet: row counts and row groups from the footer, seek by row group.

The footer is read once per shard by :meth:`ParquetFormat.inspect` and handed back to every
reader as ``ParquetFile(metadata=...)``, so opening a shard again costs no request.
On object stores, the column chunks of the row groups about to be read are computed from
that footer, merged with ``fsspec.utils.merge_offset_ranges`` and fetched concurrently with
``cat_ranges``: a few large requests per run of row groups. This is what
``fsspec.parquet.open_parquet_file`` does, but that function re-reads the footer on every
open and, with the pyarrow engine, cannot take one that was already read. pyarrow's own
pre-buffering is slower here: its reads call back into the Python file one range at a time.
On local disks pyarrow reads the file directly, with pre-buffering.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.utils import merge_offset_ranges

from ingest.core.errors import ShardError, SourceError
from ingest.formats.base import (
    Format,
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    check_columns,
    check_schema,
)
from ingest.formats.spans import Range
from ingest.storage.sources import Shard, Source

_TAIL_BYTES = 64 << 10
# Ranges closer than _MAX_GAP are merged: on object stores the first byte of a request costs
# tens of milliseconds, which buys about a megabyte of transfer. When every column is read,
# a hole between ranges is the rows of row groups skipped (a shard resumed at 45% of an
# epoch: whole groups consumed between groups left), and it is read through up to
# _GROUPS_GAP, pyarrow's own model of that trade (its hole size limit for a 50 ms first byte
# at 90 MiB/s: 4.5 MiB); with 1 MiB, each run of groups left was a request of its own (16
# requests against a fresh epoch's 9). With a projection, a hole is mostly columns not asked
# for, and stays at _MAX_GAP: a narrow column of wide row groups is not the whole file.
# Merged ranges are cut into _MAX_BLOCK pieces that cat_ranges fetches concurrently.
_MAX_GAP = 1 << 20
_GROUPS_GAP = pa.CacheOptions.from_network_metrics(
    time_to_first_byte_millis=50, transfer_bandwidth_mib_per_sec=90
).hole_size_limit
_MAX_BLOCK = 8 << 20
_BUFFER_BYTES = 1 << 20
"""Local files: bytes pyarrow reads at a time from a column chunk (a buffered stream). Without
it pyarrow reads the whole column chunk first and keeps it beside its pages, decompressed,
while it decodes them: a row group of 1 MiB rows written in one page (pyarrow's default for
rows this large) held three times over: 64 rows of 1 MiB peaked at 256 MiB, 193 buffered."""
_FIX = "check that the object is a complete Parquet file (re-upload it), or pass format="


class ParquetFormat(Format):
    name = "parquet"
    extensions = (".parquet", ".pq")
    empty_is_valid = False

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        # One request for the tail, which holds the footer of all but very wide files;
        # pyarrow's read_metadata on the file would make three (magic, length, footer).
        size = shard.size
        with source.open(shard, part=True) as f:
            n = min(size, _TAIL_BYTES)
            f.seek(size - n)
            tail = f.read(n)
            if tail[-4:] != b"PAR1" or size < 12:
                f.seek(0)
                head = f.read(4)
                if head == b"PAR1":
                    raise ShardError(
                        shard.url,
                        "has no readable Parquet footer (it does not "
                        "end with b'PAR1': the file is truncated)",
                        _FIX,
                        byte=size,
                    )
                raise ShardError(
                    shard.url,
                    f"is not a Parquet file (starts with {head!r}, not b'PAR1')",
                    _FIX,
                    byte=0,
                )
            need = int.from_bytes(tail[-8:-4], "little") + 8
            if need > size:
                raise ShardError(
                    shard.url,
                    f"has a footer length ({need - 8}) larger than the file: the file is corrupt",
                    _FIX,
                    byte=size - 8,
                )
            if need > n:
                f.seek(size - need)
                tail = f.read(need)
            try:
                meta = pq.read_metadata(pa.BufferReader(tail))
            except (pa.ArrowInvalid, OSError) as e:
                raise ShardError(
                    shard.url, f"has no readable Parquet footer ({e})", _FIX, byte=size - need
                ) from None
        if meta.num_columns == 0:
            # A table whose columns were all dropped is written so, its rows lost (num_rows=0).
            raise ShardError(
                shard.url,
                f"has no columns (its footer lists {meta.num_rows} rows and not one column): "
                "there is nothing in it to read",
                "write the file again with its columns, or remove it from the dataset",
                byte=size - need,
            )
        return _info(meta)

    # The shard index keeps the footer (ingest.planner.index.footers): a restarted job
    # reads none again.
    def footer_of(self, info: ShardInfo) -> bytes:
        """The footer of ``info`` as a Parquet metadata file's bytes."""
        sink = pa.BufferOutputStream()
        info.meta.write_metadata_file(sink)  # PAR1, the footer, its length, PAR1
        return bytes(sink.getvalue().to_pybytes())

    def from_footer(self, shard: Shard, footer: bytes) -> ShardInfo:
        """:meth:`inspect`'s result again from :meth:`footer_of`'s bytes."""
        return _info(pq.read_metadata(pa.BufferReader(footer)))

    def open(self, ctx: ReadContext) -> ShardReader:
        return _ParquetReader(ctx)


def _info(meta: Any) -> ShardInfo:
    """A shard's inspection from its footer (``pq.FileMetaData``)."""
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


def _open_native(ctx: ReadContext) -> Any:
    """The shard as pyarrow's own file when it is on local disk (see
    :meth:`Source.local_path`), else None. pyarrow reads it without calling back into Python:
    the fsspec file and the counting wrapper cost a Python call per read and take the GIL
    from the consumer's thread (an unshuffled local Stream, 32 shards in the page cache:
    1.79 -> 2.18 M rows/s, 0.72 -> 0.64 us of CPU per row)."""
    path = ctx.source.local_path(ctx.shard)
    if path is None:
        return None
    try:
        f = pa.OSFile(path)
    except OSError:
        return None  # Source.open names what is wrong
    if f.size() != ctx.shard.size:
        f.close()
        return None  # changed since it was listed: Source.open's reads say so
    ctx.source.stats.add(opens=1)
    return f


class _ParquetReader(ShardReader):
    def __init__(self, ctx: ReadContext) -> None:
        super().__init__(ctx)
        info = ctx.info
        if info.meta is None:  # listed from a followed Delta table's log, its file deleted
            raise SourceError(
                ctx.shard.url,
                "was removed by a compaction and deleted by a VACUUM before the stream read "
                "all its rows, while it followed the file's Delta table: those rows are gone",
                "keep files longer than a stream may lag behind the table "
                "(delta.deletedFileRetentionDuration), or start a new stream without the state",
            )
        assert info.schema is not None  # set by inspect
        check_columns(ctx.shard.url, ctx.columns, info.schema.names)  # pyarrow skips them
        check_schema(ctx.shard.url, info.schema, ctx.schema, ctx.schema_origin, ctx.columns)
        self._ranged = ctx.source.fetches_ranges(ctx.shard)
        if self._ranged:  # (an open through Source.open counts itself)
            ctx.source.count_past_cache(ctx.shard)
        self._native = None if self._ranged else _open_native(ctx)
        self._file: Any = self._native
        if self._file is None and not self._ranged:
            self._file = ctx.source.open(ctx.shard)
        self._starts = list(info.blocks or (0,))
        self._leaves = _leaf_columns(info.meta, ctx.columns)
        every = len(self._leaves) == info.meta.num_columns
        self._gap = _GROUPS_GAP if every else _MAX_GAP
        """Bytes between two ranges read through (see _GROUPS_GAP)."""
        meta = info.meta
        self._group_rows: list[int] = [
            meta.row_group(g).num_rows for g in range(meta.num_row_groups)
        ]

    def _parquet_file(self, groups: list[int]) -> Any:
        meta = self.ctx.info.meta
        if not self._ranged:
            if self._native is not None:
                # Counted here (no Python sees its reads), and read a column chunk at a time
                # as it is decoded: a local read waits little, and pre-buffering would hold
                # every row group of the call at once, in Arrow's memory.
                starts, ends = self._ranges(groups)
                self.ctx.source.stats.add(reads=len(starts), bytes_read=sum(ends) - sum(starts))
                return pq.ParquetFile(
                    self._file, metadata=meta, pre_buffer=False, buffer_size=_BUFFER_BYTES
                )
            return pq.ParquetFile(self._file, metadata=meta, pre_buffer=self.ctx.options.pre_buffer)
        starts, ends = self._ranges(groups)
        f = self.ctx.source.fetch_ranges(self.ctx.shard, starts, ends)
        return pq.ParquetFile(f, metadata=meta, pre_buffer=False)

    def _ranges(self, groups: list[int]) -> tuple[list[int], list[int]]:
        """The byte ranges of the columns read of row groups ``groups``, merged as one
        request each (gaps up to _MAX_GAP joined, pieces of at most _MAX_BLOCK)."""
        meta = self.ctx.info.meta
        starts, ends = [], []
        for group in groups:
            row_group = meta.row_group(group)
            for c in self._leaves:
                column = row_group.column(c)
                first = column.data_page_offset
                if column.has_dictionary_page and column.dictionary_page_offset:
                    first = min(first, column.dictionary_page_offset)
                starts.append(first)
                ends.append(first + column.total_compressed_size)
        _, starts, ends = merge_offset_ranges(
            [self.ctx.shard.url] * len(starts),
            starts,
            ends,
            max_gap=self._gap,
            max_block=_MAX_BLOCK,
            sort=True,
        )
        return starts, ends

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        for _, batch in self.read_spans([(start, stop)], seek):
            yield batch

    def read_ranges(
        self, ranges: Sequence[Range], seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch]]:
        # Spans a few rows apart in one row group (the rest of a shuffle window) are one
        # range: the group is fetched and decoded once, not once per span.
        return self._read_ranges([(r.start, r.stop) for r in ranges])

    def _read_ranges(
        self, spans: Sequence[tuple[int, int | None]]
    ) -> Iterator[tuple[int, RowBatch]]:
        rows = self.ctx.info.rows or 0
        items: list[tuple[int, int, int, int]] = []  # (span, row group, start, stop)
        for index, (start, stop) in enumerate(spans):
            end = rows if stop is None else min(stop, rows)
            first = bisect.bisect_right(self._starts, start) - 1
            last = bisect.bisect_left(self._starts, end)
            items += [(index, g, start, end) for g in range(first, last) if start < end]
        columns = list(self.ctx.columns) if self.ctx.columns is not None else None
        for chunk in self._chunks(items):
            # The column chunks of every row group of this chunk are fetched together (a few
            # concurrent requests), then decoded in the order asked.
            pf = self._parquet_file(sorted({group for _, group, _, _ in chunk}))
            done = 0  # items of the chunk read whole
            reached = chunk[0][2]  # the row that the item being read got to
            try:
                for run, size in self._runs(chunk):
                    batches = pf.iter_batches(
                        batch_size=size, row_groups=[g for _, g, _, _ in run], columns=columns
                    )
                    for k, (index, group, start, stop) in enumerate(run):
                        last = k == len(run) - 1
                        for batch in self._group_of(batches, group, start, stop, last):
                            reached = batch.stop
                            yield index, batch
                        done += 1
                        reached = chunk[done][2] if done < len(chunk) else stop
            except (pa.ArrowInvalid, OSError, EOFError):
                # An error may show at another row group than the one at fault when several
                # are read in one call (their pre-buffered reads, say): the rest is read
                # group by group, which names the row group and row as reading it alone does.
                index, group, _, stop = chunk[done]
                rest = [(index, group, reached, stop), *chunk[done + 1 :]]
                pf = self._parquet_file(sorted({group for _, group, _, _ in rest}))
                yield from self._by_group(pf, rest, columns)

    def _runs(
        self, chunk: list[tuple[int, int, int, int]]
    ) -> Iterator[tuple[list[tuple[int, int, int, int]], int]]:
        """A chunk's items in runs, each read by one ``iter_batches`` call over its row
        groups, with its rows per record batch: ``ReadOptions.batch_rows``, or the chunk's
        largest row group. A record batch of such a call may hold rows of two row groups:
        every row group of a run but its last holds a whole number of record batches, so
        that the record batches are those of one call per row group."""
        rows = max(self._group_rows[group] for _, group, _, _ in chunk)
        size = max(1, min(self.ctx.options.batch_rows, rows))
        run: list[tuple[int, int, int, int]] = []
        for item in chunk:
            run.append(item)
            if self._group_rows[item[1]] % size:
                yield run, size
                run = []
        if run:
            yield run, size

    def _group_of(
        self, batches: Iterator[pa.RecordBatch], group: int, start: int, stop: int, last: bool
    ) -> Iterator[RowBatch]:
        """Rows ``[start, stop)`` of row group ``group``, from ``batches`` (the next record
        batches of an ``iter_batches`` call, which begin at the group's first row).

        ``last``: the call's last row group. Its last record batch is handed out only once
        ``batches`` has ended: until then pyarrow holds the pages it decoded the group from
        (the column chunk as read and decompressed: twice the row group again, measured with
        1 MiB rows), and a consumer that stops after that batch (a window full, a lane
        waiting for room) would keep them while it waits.
        """
        row = self._starts[group]
        end = row + self._group_rows[group]
        while row < end:
            batch = next(batches, None)
            if batch is None:
                raise EOFError(f"row group {group} ends at row {row}, short of its {end} rows")
            if last and row + batch.num_rows >= end:
                next(batches, None)  # the end of the call: pyarrow lets its pages go
            lo, hi = max(start - row, 0), min(stop - row, batch.num_rows)
            if hi > lo:
                whole = (lo, hi) == (0, batch.num_rows)
                yield RowBatch(row + lo, batch if whole else batch.slice(lo, hi - lo))
            row += batch.num_rows

    def _by_group(
        self, pf: Any, items: list[tuple[int, int, int, int]], columns: list[str] | None
    ) -> Iterator[tuple[int, RowBatch]]:
        """The rows of ``items``, one ``iter_batches`` call per row group."""
        for index, group, start, stop in items:
            row = self._starts[group]
            try:
                for batch in pf.iter_batches(
                    batch_size=self.ctx.options.batch_rows, row_groups=[group], columns=columns
                ):
                    lo, hi = max(start - row, 0), min(stop - row, batch.num_rows)
                    if hi > lo:
                        data = (
                            batch if (lo, hi) == (0, batch.num_rows) else batch.slice(lo, hi - lo)
                        )
                        yield index, RowBatch(row + lo, data)
                    row += batch.num_rows
            except (pa.ArrowInvalid, OSError, EOFError) as e:
                raise ShardError(
                    self.ctx.shard.url, f"row group {group} cannot be read ({e})", _FIX, row=row
                ) from None

    def _chunks(
        self, items: list[tuple[int, int, int, int]]
    ) -> Iterator[list[tuple[int, int, int, int]]]:
        """Cut the row groups to read into runs of at most ``coalesce_bytes`` (uncompressed)."""
        meta = self.ctx.info.meta
        budget = self.ctx.options.coalesce_bytes
        chunk: list[tuple[int, int, int, int]] = []
        size = 0
        for item in items:
            group_bytes = meta.row_group(item[1]).total_byte_size
            if chunk and size + group_bytes > budget:
                yield chunk
                chunk, size = [], 0
            chunk.append(item)
            size += group_bytes
        if chunk:
            yield chunk

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _leaf_columns(meta: Any, columns: Sequence[str] | None) -> list[int]:
    """Indices of the leaf columns that make up ``columns`` (all when None)."""
    wanted = None if columns is None else set(columns)
    schema = meta.schema
    return [
        i
        for i in range(len(schema))
        if wanted is None or schema.column(i).path.split(".")[0] in wanted
    ]
