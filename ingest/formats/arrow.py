"""Arrow IPC: the file format (random access by record batch) and the stream format.

A file's row count comes from its record batches' metadata, which the footer says where to
find (:func:`metadata_ranges`): on a remote store, fetched at once and counted here
(:func:`batch_rows`); elsewhere, pyarrow's ``count_rows`` reads them (with the bodies).
Its seek points are ``(row, record batch index)``: a resumed reader fetches that batch
directly. The stream format has no index; it is read front to back and skips within the
shard.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyarrow import ipc

from ingest.core.errors import ShardError
from ingest.formats.base import (
    Format,
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    check_schema,
    clip,
    select,
)
from ingest.storage.sources import Shard, Source

_MAGIC = b"ARROW1"
_FEATHER_V1 = b"FEA1"
"""The magic of Feather V1 (pandas' ``to_feather`` before pyarrow 0.17), not Arrow IPC."""
_INSPECT_BYTES = 64 << 10
"""Read-ahead of the reads that list a shard (its schema, its rows)."""
_WHOLE_BYTES = 1 << 20
"""A shard this small is read whole to be listed: one request."""
_GAP_BYTES = 64 << 10
"""Record batches' metadata this close together is fetched in one range (the bytes between
read too) as a file is listed."""
_RANGE_BYTES = 4 << 20
"""The longest of those ranges: a file's ranges are fetched concurrently."""
_MERGED_BYTES = 16 << 20
"""The most a file's listing reads to count its rows: above it, each batch's metadata alone."""
_FIX = "check that the object is a complete Arrow IPC file or stream, or pass format="


class ArrowFormat(Format):
    name = "arrow"
    extensions = (".arrow", ".feather", ".ipc", ".arrows")
    empty_is_valid = False

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        # A stream's schema, a file's footer and its record batches' metadata (count_rows)
        # are small reads: each was a request. A small shard is read whole (one request);
        # a larger one a little ahead, and a file's record batches' metadata, which the
        # footer says where to find (each is its body's length from the next), fetched
        # at once where the store serves ranges concurrently (:func:`_with_metadata`).
        with contextlib.ExitStack() as stack:
            opened = stack.enter_context(source.open(shard, part=True, block_size=_INSPECT_BYTES))
            f: Any = opened
            if shard.size <= _WHOLE_BYTES:
                f = pa.BufferReader(opened.read())
            head = f.read(len(_MAGIC))
            if head.startswith(_FEATHER_V1):
                raise ShardError(
                    shard.url,
                    "is a Feather V1 file (written by pandas' to_feather before pyarrow 0.17, "
                    "or with version=1), which is not Arrow IPC",
                    "write it again as Feather V2, which is: pyarrow.feather.write_feather("
                    "pyarrow.feather.read_table(path), path, version=2)",
                    byte=0,
                )
            try:
                if head == _MAGIC:
                    rows = None
                    if shard.size > _WHOLE_BYTES and source.fetches_ranges(shard):
                        f, rows = _with_metadata(source, shard, opened, stack) or (f, None)
                    f.seek(0)
                    reader = ipc.open_file(f)
                    if rows is None:
                        rows = reader.count_rows()
                    return ShardInfo(rows=rows, schema=reader.schema, meta="file")
                f.seek(0)
                return ShardInfo(rows=None, schema=ipc.open_stream(f).schema, meta="stream")
            except (pa.ArrowInvalid, OSError) as e:
                raise ShardError(
                    shard.url, f"is not a readable Arrow IPC file or stream ({e})", _FIX, byte=0
                ) from None

    # The shard index keeps the inspection (ingest.planner.index.footers): a restarted job
    # opens no shard before its first batch.
    def footer_of(self, info: ShardInfo) -> bytes:
        """``info`` as bytes: a JSON line (the rows, file or stream), then the schema as
        an Arrow IPC message."""
        assert info.schema is not None
        head = json.dumps({"rows": info.rows, "kind": info.meta}).encode()
        return head + b"\n" + bytes(info.schema.serialize().to_pybytes())

    def from_footer(self, shard: Shard, footer: bytes) -> ShardInfo:
        """:meth:`inspect`'s result again from :meth:`footer_of`'s bytes.

        Raises:
            ValueError: If the bytes are not :meth:`footer_of`'s (the entry is read again).
        """
        head, _, schema = footer.partition(b"\n")
        got = json.loads(head)
        rows, kind = got.get("rows"), got.get("kind")
        if kind not in ("file", "stream") or not (rows is None or isinstance(rows, int)):
            raise ValueError(f"not an Arrow IPC shard's inspection: {head[:80]!r}")
        return ShardInfo(rows=rows, schema=ipc.read_schema(pa.py_buffer(schema)), meta=kind)

    def open(self, ctx: ReadContext) -> ShardReader:
        return _ArrowReader(ctx)


def _with_metadata(
    source: Source, shard: Shard, opened: Any, stack: contextlib.ExitStack
) -> tuple[Any, int | None] | None:
    """The file ``shard`` (an Arrow IPC file, ``opened``) with its footer and every record
    batch's and dictionary's metadata fetched at once (concurrent ranges; neighbours in one),
    and its rows, counted from the record batches' metadata (:func:`batch_rows`; None where
    one does not read as a record batch's: ``count_rows`` counts them); None where the
    footer is not what :func:`metadata_ranges` reads (pyarrow then reads the file as it does).

    pyarrow's ``count_rows`` reads each batch whole (its metadata and its body, one read
    after another: a request each where batches are larger than the read-ahead; 32 batches
    of 90 KB on a store 50 ms away, 1.6 s to list the shard), and has no call that prefetches
    the metadata alone (Arrow's C++ ``PreBufferMetadata`` is not in its Python API), hence
    the footer read here, and the rows counted here from what it points at."""
    tail_start = max(0, shard.size - _INSPECT_BYTES)
    opened.seek(tail_start)
    tail = opened.read()
    if len(tail) < 10 or tail[-len(_MAGIC) :] != _MAGIC:
        return None
    footer_size = int.from_bytes(tail[-10:-6], "little", signed=True)
    if not 0 < footer_size <= shard.size - 10 - len(_MAGIC):
        return None
    if footer_size > len(tail) - 10:  # thousands of batches: the footer is a read of its own
        tail_start = shard.size - 10 - footer_size
        opened.seek(tail_start)
        tail = opened.read()
    blocks = metadata_ranges(tail[-10 - footer_size : -10], shard.size)
    if blocks is None:
        return None
    # The tail, read already, is given as known; what lies before it is fetched (a block
    # that runs into the tail up to it: the two parts are read as one).
    wanted = _merged([(a, min(b, tail_start)) for a, b in blocks[0] + blocks[1] if a < tail_start])
    starts, ends = [a for a, _ in wanted], [b for _, b in wanted]
    known = {(tail_start, shard.size): tail}
    f = stack.enter_context(source.fetch_ranges(shard, starts, ends, known))
    rows = 0
    for start, end in blocks[1]:
        f.seek(start)
        batch = batch_rows(f.read(end - start))
        if batch is None:
            return f, None
        rows += batch
    return f, rows


Range = tuple[int, int]


def metadata_ranges(footer: bytes, size: int) -> tuple[list[Range], list[Range]] | None:
    """Where each dictionary's and each record batch's metadata lies (``[start, end)``, in
    the file's order: the dictionaries', then the record batches') in an Arrow IPC file of
    ``size`` bytes, from its ``footer`` (the ``Footer`` flatbuffer of Arrow's ``File.fbs``:
    its ``dictionaries`` and ``recordBatches`` are vectors of ``Block {offset: long,
    metaDataLength: int, bodyLength: long}``); None where it does not read as one. Read here
    because pyarrow does not give the blocks (see :func:`_with_metadata`)."""
    try:
        table = struct.unpack_from("<I", footer, 0)[0]
        out: tuple[list[Range], list[Range]] = ([], [])
        for field, ranges in zip((2, 3), out, strict=True):  # dictionaries, recordBatches
            where = _field(footer, table, field)
            if where is None:
                continue
            vector = where + struct.unpack_from("<I", footer, where)[0]
            for k in range(struct.unpack_from("<I", footer, vector)[0]):
                offset, length, _ = struct.unpack_from("<qi4xq", footer, vector + 4 + 24 * k)
                if not (offset >= 0 and length > 0 and offset + length <= size):
                    return None
                ranges.append((offset, offset + length))
    except struct.error:
        return None
    return out


_RECORD_BATCH = 3
"""``MessageHeader.RecordBatch``, the union's type in Arrow's ``Message.fbs``."""


def batch_rows(message: bytes) -> int | None:
    """The rows of a record batch from its encapsulated message's metadata (a block of the
    footer: the continuation marker and the length, or a legacy file's length alone, then
    the ``Message`` flatbuffer of Arrow's ``Message.fbs``, whose ``header`` is a
    ``RecordBatch`` and its ``length`` the rows); None where it is not one.

    Read here because pyarrow's ``count_rows`` reads each batch's body with its metadata
    (one read of the whole batch): counting from the metadata alone fetches a few hundred
    bytes a batch, not the file."""
    try:
        start = 8 if message[:4] == b"\xff\xff\xff\xff" else 4
        length = struct.unpack_from("<i", message, start - 4)[0]
        if not 0 < length <= len(message) - start:
            return None
        buf = message[start : start + length]
        table = struct.unpack_from("<I", buf, 0)[0]
        kind, header = _field(buf, table, 1), _field(buf, table, 2)
        if kind is None or header is None or buf[kind] != _RECORD_BATCH:
            return None
        batch = header + struct.unpack_from("<I", buf, header)[0]
        rows = _field(buf, batch, 0)
        count = 0 if rows is None else int(struct.unpack_from("<q", buf, rows)[0])
    except (struct.error, IndexError):
        return None
    return count if count >= 0 else None


def _field(buf: bytes, table: int, field: int) -> int | None:
    """Where field number ``field`` of the flatbuffer table at ``table`` lies in ``buf``;
    None where the table does not hold it (its default)."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    at = 4 + 2 * field
    if at + 2 > struct.unpack_from("<H", buf, vtable)[0]:
        return None
    relative = struct.unpack_from("<H", buf, vtable + at)[0]
    return table + relative if relative else None


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` sorted, those less than :data:`_GAP_BYTES` apart in one of at most
    :data:`_RANGE_BYTES` (fetched side by side); the bytes between them are read too, so
    where that would be more than :data:`_MERGED_BYTES` in all (a large file of small
    batches) each range is its own."""
    ranges = sorted(ranges)
    out: list[tuple[int, int]] = []
    for start, end in ranges:
        near = out and start - out[-1][1] <= _GAP_BYTES
        if near and end - out[-1][0] <= _RANGE_BYTES:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    if sum(b - a for a, b in out) > _MERGED_BYTES:
        return ranges
    return out


class _ArrowReader(ShardReader):
    def __init__(self, ctx: ReadContext) -> None:
        super().__init__(ctx)
        assert ctx.info.schema is not None
        check_schema(ctx.shard.url, ctx.info.schema, ctx.schema, ctx.schema_origin, ctx.columns)
        # Read ahead ``block_bytes``: pyarrow reads a message's length, metadata and body
        # apart, each a request without a buffer (4 a record batch of a stream, 1 of a file).
        # A shard within it is read whole, in one request: a file's footer is at its end,
        # and reading it first (two requests) would leave the buffer there.
        block = ctx.options.block_bytes
        opened = ctx.source.open(ctx.shard, block_size=block)
        self._file: Any = opened
        if ctx.shard.size <= block:
            with opened:
                self._file = pa.BufferReader(opened.read())

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        batches = (
            self._file_batches(start, seek)
            if self.ctx.info.meta == "file"
            else self._stream_batches()
        )
        yield from clip(batches, start, stop)

    def _file_batches(self, start: int, seek: Seek | None) -> Iterator[RowBatch]:
        seek = self.ctx.info.seek_for(start, seek)
        row, index = seek if seek is not None else (0, 0)
        reader: Any = self._open(lambda: ipc.open_file(self._file), row)
        while index < reader.num_record_batches:
            batch = self._batch(lambda i=index: reader.get_batch(i), row)
            yield RowBatch(row, batch, (row, index))
            row += batch.num_rows
            index += 1

    def _stream_batches(self) -> Iterator[RowBatch]:
        row = 0
        self._file.seek(0)
        reader: Any = self._open(lambda: ipc.open_stream(self._file), row)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (pa.ArrowInvalid, OSError, EOFError) as e:
                raise ShardError(
                    self.ctx.shard.url, f"record batch cannot be read ({e})", _FIX, row=row
                ) from None
            batch = select(batch, self.ctx.columns, self.ctx.shard.url, row)
            yield RowBatch(row, batch)
            row += batch.num_rows

    def _open(self, opener: Any, row: int) -> Any:
        try:
            return opener()
        except (pa.ArrowInvalid, OSError) as e:
            raise ShardError(
                self.ctx.shard.url, f"cannot be opened as Arrow IPC ({e})", _FIX, row=row
            ) from None

    def _batch(self, get: Any, row: int) -> pa.RecordBatch:
        try:
            batch = get()
        except (pa.ArrowInvalid, OSError, EOFError) as e:
            raise ShardError(
                self.ctx.shard.url, f"record batch cannot be read ({e})", _FIX, row=row
            ) from None
        return select(batch, self.ctx.columns, self.ctx.shard.url, row)

    def close(self) -> None:
        self._file.close()
