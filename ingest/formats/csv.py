"""CSV (plain, .gz, .zst) with a header line, parsed by pyarrow in chunks of whole lines.

Row k is the k-th record after the header. Resume seeks by byte offset, which needs records
without newlines inside quoted values (pyarrow's default ``newlines_in_values=False``).
Column types are inferred from the first block of the first non-empty shard and fixed for
every shard, so a chunk read after a seek gets the same types as one read from the top.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.csv as pcsv

from ingest.errors import SchemaMismatchError, ShardError
from ingest.formats._lines import (
    PARSE_ERRORS,
    LineReader,
    first_bad_line,
    iter_chunks,
    not_utf8,
    split_lines,
)
from ingest.formats.base import Format, ReadContext, ReadOptions, ShardInfo, ShardReader
from ingest.sources import Shard, Source


def _first_line(source: Source, shard: Shard, options: ReadOptions) -> bytes:
    block_bytes = min(options.block_bytes, 1 << 20)
    for _, chunk in iter_chunks(source, shard, 0, block_bytes, options.max_line_bytes):
        return chunk[: chunk.find(b"\n") + 1] if b"\n" in chunk else chunk
    return b""


class CsvFormat(Format):
    name = "csv"
    extensions = (".csv",)

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        return ShardInfo(rows=None)

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema:
        for _, chunk in iter_chunks(source, shard, 0, options.block_bytes, options.max_line_bytes):
            end = chunk.find(b"\n") + 1 or len(chunk)
            header, lines = chunk[:end], split_lines(chunk[end:])
            try:
                schema = pcsv.read_csv(pa.BufferReader(chunk)).schema
            except pa.ArrowInvalid as e:
                raise _locate(shard, header, lines, ()) or ShardError(
                    shard.url,
                    f"is not valid CSV ({e})",
                    "check the file, or pass ReadOptions(schema=...)",
                ) from None
            # pyarrow infers binary only for a column with a value that is not UTF-8.
            text = [f.name for f in schema if pa.types.is_binary(f.type)]
            error = _locate(shard, header, lines, text) if text else None
            if error is not None:
                raise error
            return schema
        raise ShardError(shard.url, "has no header line", "pass ReadOptions(schema=...)")

    def open(self, ctx: ReadContext) -> ShardReader:
        return _CsvReader(ctx)


class _CsvReader(LineReader):
    def __init__(self, ctx: ReadContext) -> None:
        super().__init__(ctx)
        schema = ctx.schema
        assert schema is not None  # the stream always resolves a schema for CSV
        self._header = _first_line(ctx.source, ctx.shard, ctx.options)
        names = pcsv.read_csv(pa.BufferReader(self._header)).column_names if self._header else []
        if names != schema.names:
            raise SchemaMismatchError(
                ctx.shard.url,
                f"header {names} differs from {ctx.schema_origin}'s {schema.names}",
                "make the shards agree or read them as separate streams",
                line=1,
                byte=0,
            )
        self._read_options = pcsv.ReadOptions(column_names=schema.names, use_threads=False)
        self._convert = pcsv.ConvertOptions(
            column_types=schema,
            include_columns=list(ctx.columns) if ctx.columns is not None else None,
        )

    def header(self) -> bytes | None:
        return self._header

    def parse(self, chunk: bytes) -> pa.Table:
        options = pcsv.ReadOptions(
            column_names=self._read_options.column_names,
            use_threads=False,
            block_size=len(chunk) + 1,
        )
        return pcsv.read_csv(
            pa.BufferReader(chunk), read_options=options, convert_options=self._convert
        )

    def describe_error(self, line: bytes, error: Exception) -> tuple[str, str, bool]:
        return (*_describe(line, error), False)


def _describe(line: bytes, error: Exception) -> tuple[str, str]:
    """(problem, fix) for a CSV record that does not parse."""
    problem = not_utf8(line)
    if problem is not None:
        return problem, "CSV is read as UTF-8: re-encode the file (e.g. iconv -t utf-8)"
    # pyarrow numbers rows within what it was given, here one line: drop that.
    text = re.sub(r"^(CSV parse error: )Row #\d+: ", r"\1", str(error).split("\n")[0])
    return (
        f"bad CSV record ({text}): {line[:80]!r}",
        "fix the record; every record needs the header's columns with values of the "
        "types inferred from the first shard (or pass ReadOptions(schema=...))",
    )


def _locate(
    shard: Shard, header: bytes, lines: list[bytes], text: Sequence[str]
) -> ShardError | None:
    """The error for the first of ``lines`` (after ``header``) that pyarrow cannot read.

    Args:
        shard: The shard, read from its start.
        header: The header line.
        lines: The lines after it.
        text: Columns to read as strings (pyarrow infers binary for invalid UTF-8).

    Returns:
        The error, or None if pyarrow reads every line.
    """
    convert = pcsv.ConvertOptions(column_types={name: pa.string() for name in text})

    def parse(body: bytes) -> pa.Table:
        return pcsv.read_csv(pa.BufferReader(header + body), convert_options=convert)

    try:
        parse(b"".join(lines))
    except PARSE_ERRORS as e:
        first_error: Exception = e
    else:
        return None
    bad, error = first_bad_line(parse, lines)
    problem, fix = _describe(lines[bad], error or first_error)
    return ShardError(
        shard.url,
        problem,
        fix,
        row=sum(1 for x in lines[:bad] if x.strip()),
        line=bad + 2,
        byte=len(header) + sum(len(x) for x in lines[:bad]),
    )
