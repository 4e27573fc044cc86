"""Chunks of whole lines from a line-delimited shard, with their byte offsets.

Shared by JSONL and CSV. Offsets are in the decompressed stream: an uncompressed shard seeks
to one directly; a gzip or zstd shard decompresses and discards the bytes before it, within
that shard only. Written here rather than taken from pyarrow's streaming readers because
those do not report where a batch starts, and the byte offset is what makes resume a seek.
"""

from __future__ import annotations

import gzip
import zlib
from abc import abstractmethod
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa

from ingest.errors import SchemaMismatchError, ShardError
from ingest.formats import split_compression
from ingest.formats.base import RowBatch, Seek, ShardReader, clip
from ingest.sources import Shard, Source


def open_decompressed(source: Source, shard: Shard, block_bytes: int) -> tuple[Any, bool]:
    """Open ``shard`` and wrap it in a decompressor; returns (file, seekable)."""
    raw = source.open(shard, block_size=block_bytes)
    _, compression = split_compression(shard.url)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb"), False  # type: ignore[arg-type]
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), False  # type: ignore[arg-type]
    return raw, True


def _read(f: IO[bytes], n: int, shard: Shard, offset: int) -> bytes:
    try:
        return f.read(n)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ShardError(
            shard.url,
            f"compressed stream is corrupt or truncated ({e})",
            "re-upload the file; a truncated .gz/.zst cannot be read past the damage",
            byte=offset,
        ) from None
    except Exception as e:
        if type(e).__name__ == "ZstdError":
            raise ShardError(
                shard.url,
                f"zstd stream is corrupt or truncated ({e})",
                "re-upload the file",
                byte=offset,
            ) from None
        raise


def iter_chunks(
    source: Source, shard: Shard, start: int, block_bytes: int
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, chunk)``: whole lines starting at decompressed byte ``offset``.

    Args:
        source: Opens the shard.
        shard: The shard.
        start: Decompressed byte offset of a line start to begin at.
        block_bytes: Bytes read per step; a longer line makes a longer chunk.
    """
    f, seekable = open_decompressed(source, shard, block_bytes)
    with f:
        offset = 0
        if start:
            if seekable:
                f.seek(start)
                offset = start
            else:
                while offset < start:
                    skipped = _read(f, min(block_bytes, start - offset), shard, offset)
                    if not skipped:
                        raise ShardError(
                            shard.url,
                            f"ends at byte {offset}, before the saved position {start}",
                            "the shard changed since the state was saved; restart the epoch",
                            byte=offset,
                        )
                    offset += len(skipped)
        tail = b""
        while True:
            data = _read(f, block_bytes, shard, offset + len(tail))
            if not data:
                if tail:
                    yield offset, tail
                return
            buf = tail + data
            cut = buf.rfind(b"\n")
            if cut < 0:
                tail = buf
                continue
            yield offset, buf[: cut + 1]
            offset += cut + 1
            tail = buf[cut + 1 :]


class LineReader(ShardReader):
    """A reader over line-delimited text: parses whole-line chunks into Arrow tables.

    Seek points are ``(row, byte offset of a chunk start)``. Line numbers in errors are known
    when reading started at the top of the shard; after a seek, errors give the row and byte.
    """

    def header(self) -> bytes | None:
        """Bytes of a header line to drop from the first chunk (CSV), or None."""
        return None

    @abstractmethod
    def parse(self, chunk: bytes) -> pa.Table:
        """Parse whole lines into a table with the stream's (projected) schema."""

    @abstractmethod
    def describe_error(self, line: bytes, error: Exception) -> tuple[str, str, bool]:
        """(problem, fix, is_schema_mismatch) for the first line that fails to parse."""

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        seek = self.ctx.info.seek_for(start, seek)
        row, offset = seek if seek is not None else (0, 0)
        line: int | None = 1 if offset == 0 else None
        opts = self.ctx.options
        batches = self._batches(row, offset, line, opts.block_bytes, opts.batch_rows)
        yield from clip(batches, start, stop)

    def _batches(
        self, row: int, offset: int, line: int | None, block_bytes: int, batch_rows: int
    ) -> Iterator[RowBatch]:
        header = self.header()
        for chunk_offset, chunk in iter_chunks(
            self.ctx.source, self.ctx.shard, offset, block_bytes
        ):
            body, skip = chunk, 0
            if chunk_offset == 0 and header is not None:
                skip = len(header)
                body = chunk[skip:]
                if line is not None:
                    line += 1
            if body.strip():
                chunk_seek = (row, chunk_offset)
                table = self._parse_or_locate(body, row, line, chunk_offset + skip)
                for batch in table.to_batches(max_chunksize=batch_rows):
                    yield RowBatch(row, batch, chunk_seek)
                    row += batch.num_rows
            if line is not None:
                line += body.count(b"\n")

    def _parse_or_locate(self, body: bytes, row: int, line: int | None, offset: int) -> pa.Table:
        try:
            return self.parse(body)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            first_error = e
        # Find the first bad line by bisection over whole lines: O(log n) parses.
        lines = body.splitlines(keepends=True)
        lo, hi = 0, len(lines)  # invariant: lines[:lo] parse, lines[:hi] do not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                self.parse(b"".join(lines[:mid]))
                lo = mid
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                hi = mid
        bad = hi - 1
        byte = offset + sum(len(x) for x in lines[:bad])
        rows_before = sum(1 for x in lines[:bad] if x.strip())
        try:
            self.parse(lines[bad])
            error: Exception = first_error
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            error = e
        problem, fix, schema = self.describe_error(lines[bad], error)
        cls = SchemaMismatchError if schema else ShardError
        raise cls(
            self.ctx.shard.url,
            problem,
            fix,
            row=row + rows_before,
            line=None if line is None else line + bad,
            byte=byte,
        )
