"""CSV (plain, .gz, .zst) with a header line, parsed by pyarrow in chunks of whole lines.

Row k is the k-th record after the header. Resume seeks by byte offset, which needs records
without newlines inside quoted values (pyarrow's default ``newlines_in_values=False``).
Column types are inferred from the first block of the first non-empty shard and fixed for
every shard, so a chunk read after a seek gets the same types as one read from the top.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pcsv

from ingest.errors import SchemaMismatchError, ShardError
from ingest.formats._lines import LineReader, iter_chunks
from ingest.formats.base import Format, ReadContext, ReadOptions, ShardInfo, ShardReader
from ingest.sources import Shard, Source


def _first_line(source: Source, shard: Shard, options: ReadOptions) -> bytes:
    for _, chunk in iter_chunks(source, shard, 0, min(options.block_bytes, 1 << 20)):
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
        for _, chunk in iter_chunks(source, shard, 0, options.block_bytes):
            try:
                return pcsv.read_csv(pa.BufferReader(chunk)).schema
            except pa.ArrowInvalid as e:
                raise ShardError(
                    shard.url,
                    f"is not valid CSV ({e})",
                    "check the file, or pass ReadOptions(schema=...)",
                ) from None
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
        text = str(error).split("\n")[0]
        return (
            f"bad CSV record ({text}): {line[:80]!r}",
            "fix the record; every record needs the header's columns with values of the "
            "types inferred from the first shard (or pass ReadOptions(schema=...))",
            False,
        )
