"""Plain text (plain, .gz, .zst, .bz2, .xz): a row per line, in one ``text`` column.

Read as Hugging Face ``datasets`` reads text files (its ``text`` builder, ``sample_by="line"``,
``keep_linebreaks=False``): row k is the k-th line, blank lines included (empty texts); a
line ends at ``\\n``, and a ``\\r`` before it is dropped too (a file written with ``\\r\\n``);
the last line needs no newline. Uncompressed shards resume by byte offset, compressed ones
decompress and skip within the shard, as JSON Lines do (:mod:`ingest.formats._lines`). Lines
must be UTF-8: one that is not is named with its line, row and byte.

A listing that finds ``.txt`` files beside shards of another format (a ``README.txt`` or a
``LICENSE.txt`` beside Parquet shards) leaves them out, with a
:class:`~ingest.formats.IncidentalFilesWarning` naming them (``TextFormat.incidental``:
:func:`ingest.formats.without_incidental`); ``format="text"`` reads them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ingest.formats._lines import LineReader, not_utf8
from ingest.formats.arrays import strings
from ingest.formats.base import (
    ReadContext,
    ReadOptions,
    ShardInfo,
    ShardReader,
    UncountedFormat,
    check_columns,
)
from ingest.storage.sources import Shard, Source

COLUMN = "text"
SCHEMA = pa.schema([pa.field(COLUMN, pa.string())])
_NEWLINE, _RETURN = ord("\n"), ord("\r")


class TextFormat(UncountedFormat):
    name = "text"
    extensions = (".txt",)

    incidental = True

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema:
        return SCHEMA

    def open(self, ctx: ReadContext) -> ShardReader:
        return _TextReader(ctx)


def lines(chunk: bytes) -> pa.StringArray:
    """``chunk``'s lines (whole lines; the last may lack its newline), without their ``\\n``
    or ``\\r\\n``, as one string array: the chunk's bytes copied once with the line ends left
    out (numpy), the offsets from the newlines' places; no Python string per line.

    Raises:
        pyarrow.ArrowInvalid: If a line is not UTF-8.
    """
    if not chunk:
        return strings([])
    data = np.frombuffer(chunk, np.uint8)
    breaks = np.flatnonzero(data == _NEWLINE)
    ends = breaks if chunk.endswith(b"\n") else np.append(breaks, len(data))
    starts = np.zeros(len(ends), np.int64)
    starts[1:] = breaks[: len(ends) - 1] + 1
    returns = (ends > starts) & (data[np.maximum(ends - 1, 0)] == _RETURN)
    keep = np.ones(len(data), bool)
    keep[breaks] = False
    keep[ends[returns] - 1] = False
    offsets = np.zeros(len(ends) + 1, np.int32)
    np.cumsum(ends - starts - returns, out=offsets[1:])
    text = pa.StringArray.from_buffers(
        len(ends), pa.py_buffer(offsets), pa.py_buffer(data[keep].tobytes())
    )
    text.validate(full=True)  # UTF-8
    return text


class _TextReader(LineReader):
    def __init__(self, ctx: ReadContext) -> None:
        super().__init__(ctx)
        self._columns = list(ctx.columns) if ctx.columns is not None else None

    def parse(self, chunk: bytes) -> pa.Table:
        if self._columns is not None:
            check_columns(self.ctx.shard.url, self._columns, [COLUMN])
        return pa.Table.from_arrays([lines(chunk)], schema=SCHEMA)

    def has_rows(self, body: bytes) -> bool:
        return bool(body)  # a blank line is a row (an empty text)

    def describe_error(self, line: bytes, error: Exception) -> tuple[str, str, bool]:
        problem = not_utf8(line) or f"cannot be read as text ({error}): {line[:80]!r}"
        fix = "text shards are UTF-8: re-encode the file (e.g. iconv -f latin1 -t utf-8)"
        return problem, fix, False


__all__ = ["COLUMN", "TextFormat", "lines"]
