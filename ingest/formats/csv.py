"""CSV and TSV (plain, .gz, .zst) with a header line, parsed by pyarrow in chunks of whole
records. TSV is CSV with a tab between values (``.tsv``; quoting as in CSV, as Hugging Face
``datasets`` reads it: its csv builder with ``sep="\\t"``).

Row k is the k-th record after the header. A quoted value may hold newlines: chunks are cut,
and resume seeks by byte offset, only at record ends (:class:`CsvRecords`), never inside a
quoted value. A quoted value still open at the end of the shard is an error, not a value
that swallows the rest of the file. Column types are inferred from the first block of the
first shard with a record after its header line (a file of the header alone, which Spark
writes for an empty partition, types nothing) and fixed for every shard, so a chunk read
after a seek gets the same types as one read from the top.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pcsv

from ingest.core.errors import ConfigError, SchemaMismatchError, ShardError, redact
from ingest.formats import NO_HEADER, variant
from ingest.formats._lines import (
    PARSE_ERRORS,
    LineReader,
    RecordEnds,
    first_bad_line,
    iter_chunks,
    not_utf8,
)
from ingest.formats.base import (
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    UncountedFormat,
    check_columns,
    check_names,
)
from ingest.formats.big_integers import exact_csv
from ingest.formats.conform import declaration
from ingest.storage.sources import Shard, Source


def _parse_options(delimiter: str) -> pcsv.ParseOptions:
    """pyarrow's defaults (``"``, doubled quotes) with ``delimiter`` between values, and
    records that hold newlines in quoted values: without it pyarrow's own blocks (1 MiB)
    would cut such records too."""
    return pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True)


_QUOTE, _CR, _LF = b'"'[0], b"\r"[0], b"\n"[0]
_NOT_A_LINE_BREAK = re.compile(rb"[^\r\n]")


def holds_record(body: bytes) -> bool:
    """Whether ``body`` (whole records) holds a record: a byte other than a line break.
    pyarrow skips empty lines only: a line of spaces is a value in a one-column CSV, one of
    tabs a record of empty values in TSV."""
    return _NOT_A_LINE_BREAK.search(body) is not None


_OTHER = 0
"""``CsvRecords._before`` for a byte after which a quote is text (not a value's start)."""


class CsvRecords:
    """Where CSV records end, as pyarrow's parser (:func:`_parse_options`) reads them.

    A newline ends a record unless it is inside a quoted value. A quote opens a quoted value
    only at the start of a value (after the delimiter, a line break or at the record's
    start); one elsewhere (``6" tall``) is text. Inside, ``""`` is a quote and a lone quote
    closes the value. Written here because pyarrow does not tell where its records start,
    and resume needs that offset. Vectorised: the quotes of a read are taken as alternately
    opening and closing, which is exact when each opening one starts a value (checked);
    otherwise a loop over the read's quotes follows the parser's rules one by one.
    """

    def __init__(self, delimiter: str = ",") -> None:
        self._delimiter = delimiter.encode()[0]
        """The byte between values (``,``; a tab for TSV)."""
        self._inside = False
        """Whether the bytes read so far end inside a quoted value."""
        self._before = _LF
        """The last byte read (a record starts as after a line break); a quote that closed a
        value is ``_QUOTE``, a quote that is text ``_OTHER``."""
        self._opened = 0
        """Offset of the quote that opened the value still open."""

    def scan(self, data: bytes, at: int) -> tuple[int, int]:
        if not self._inside and b'"' not in data:
            self._before = data[-1]
            return data.find(b"\n"), data.rfind(b"\n")
        quotes, inside = self._read(data, at)
        # A newline inside a quoted value steps over the value: about one step per read.
        first = data.find(b"\n")
        while first >= 0:
            k = int(np.searchsorted(quotes, first))  # quotes before it
            if (k + inside) % 2 == 0:
                break
            first = data.find(b"\n", int(quotes[k]) + 1) if k < len(quotes) else -1
        last = data.rfind(b"\n") if first >= 0 else -1
        while last > first:
            k = int(np.searchsorted(quotes, last))
            if (k + inside) % 2 == 0:
                break
            last = data.rfind(b"\n", 0, int(quotes[k - 1]))
        return first, last

    def ends(self, data: bytes, at: int) -> npt.NDArray[np.intp]:
        """The indices of the newlines of ``data`` that end a record, in order."""
        quotes, inside = self._read(data, at)
        lf = np.flatnonzero(np.frombuffer(data, np.uint8) == _LF)
        # A newline is outside quoted values where an even number of quotes came before it.
        found: npt.NDArray[np.intp] = lf[(np.searchsorted(quotes, lf) + inside) % 2 == 0]
        return found

    def _read(self, data: bytes, at: int) -> tuple[npt.NDArray[np.intp], bool]:
        """The quotes of ``data`` that open or close a value, and whether it starts inside
        one; the state moves on to the end of ``data``."""
        a = np.frombuffer(data, np.uint8)
        quotes, inside = self._quotes(a), self._inside
        if len(quotes):
            last = int(quotes[-1])
            closes = (len(quotes) - 1 + inside) % 2 == 1
            if not closes:
                self._opened = at + last
            self._inside = not closes
        end = data[-1]
        if end == _QUOTE:  # a quote that closed a value, or one that is text
            end = _QUOTE if len(quotes) and quotes[-1] == len(a) - 1 else _OTHER
        self._before = end
        return quotes, inside

    def _quotes(self, a: npt.NDArray[np.uint8]) -> npt.NDArray[np.intp]:
        """The positions of the quotes that open or close a quoted value."""
        quotes = np.flatnonzero(a == _QUOTE)
        opening = quotes[1 if self._inside else 0 :: 2]
        before = a[np.maximum(opening - 1, 0)]
        if len(opening) and opening[0] == 0:
            before[0] = self._before
        # A quote before an opening one is the one that closed a value: ``""`` inside it.
        starts = (
            (before == self._delimiter) | (before == _LF) | (before == _QUOTE) | (before == _CR)
        )
        if starts.all():
            return quotes
        return self._quotes_one_by_one(a, quotes)

    def _quotes_one_by_one(
        self, a: npt.NDArray[np.uint8], quotes: npt.NDArray[np.intp]
    ) -> npt.NDArray[np.intp]:
        """:meth:`_quotes` where some quote is text: the parser's rules, quote by quote."""
        kept: list[int] = []
        inside, closed = self._inside, -2
        for p in quotes.tolist():
            if inside:
                kept.append(p)
                inside, closed = False, p
                continue
            before = int(a[p - 1]) if p else self._before
            if before in (self._delimiter, _CR, _LF) or (
                before == _QUOTE and (p == 0 or closed == p - 1)
            ):
                kept.append(p)
                inside = True
        return np.array(kept, np.intp)

    def open_record(self) -> str | None:
        if not self._inside:
            return None
        return f"the quoted value opened at byte {self._opened} never closes"


def split_records(body: bytes, delimiter: str = ",") -> list[bytes]:
    """The CSV records of ``body``, each with its newline (the last one may have none)."""
    cuts = [int(x) + 1 for x in CsvRecords(delimiter).ends(body, 0)] if body else []
    if not cuts or cuts[-1] != len(body):
        cuts.append(len(body))
    return [body[lo:hi] for lo, hi in zip([0, *cuts[:-1]], cuts, strict=True)]


def _first_chunk(
    source: Source, shard: Shard, block_bytes: int, options: ReadOptions, delimiter: str
) -> bytes | None:
    """The shard's first chunk of whole records (None for an empty shard)."""
    records = functools.partial(CsvRecords, delimiter)
    for _, chunk in iter_chunks(source, shard, 0, block_bytes, options.max_line_bytes, records):
        return chunk
    return None


def _first_record(source: Source, shard: Shard, options: ReadOptions, delimiter: str) -> bytes:
    chunk = _first_chunk(source, shard, min(options.block_bytes, 1 << 20), options, delimiter)
    return b"" if chunk is None else split_records(chunk, delimiter)[0]


class CsvFormat(UncountedFormat):
    name = "csv"
    extensions = (".csv",)
    delimiter = ","
    """The character between values."""
    header = True
    """Whether the first record is a header line (False: ``ReadOptions.column_names``)."""

    def with_delimiter(self, delimiter: str, *, header: bool = True) -> CsvFormat:
        """This format with ``delimiter`` between values (``ReadOptions.delimiter``) and a
        header line or none (``ReadOptions.column_names``), named for them
        (:func:`ingest.formats.read_as`)."""
        other = copy.copy(self)
        other.delimiter = delimiter
        other.header = header
        other.name = variant(self.name, delimiter, header=header)  # type: ignore[misc]
        return other

    def variant(self, inner: str) -> CsvFormat | None:
        """This format named ``csv[;]`` or ``csv[, no header]`` (:func:`ingest.formats.read_as`):
        ``inner`` is a delimiter, then nothing or :data:`ingest.formats.NO_HEADER`; None for
        another name."""
        delimiter, rest = inner[:1], inner[1:]
        if not delimiter or rest not in ("", NO_HEADER):
            return None
        return self.with_delimiter(delimiter, header=not rest)

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema | None:
        """The types pyarrow infers from the shard's first chunk; None where the shard holds
        no record after its header line (Spark writes such a part file for each empty
        partition): typed from it, every column was null, and every other shard failed."""
        names = _names(self, shard, options)
        chunk = _first_chunk(source, shard, options.block_bytes, options, self.delimiter)
        if chunk is None:
            raise ShardError(shard.url, "has no header line", "pass ReadOptions(schema=...)")
        parse = _parse_options(self.delimiter)
        records = split_records(chunk, self.delimiter)
        header, lines = (b"", records) if names else (records[0], records[1:])
        if not any(line.strip(b"\r\n") for line in lines):  # (pyarrow skips empty lines)
            return None
        read = pcsv.ReadOptions(column_names=names)
        if options.on_error == "skip":  # from the records a read does not quarantine
            lines = _readable(header, lines, read, parse, names, options.max_errors)
            if not any(line.strip(b"\r\n") for line in lines):
                raise ShardError(
                    shard.url,
                    f"has no readable {self.name.upper()} record in its first "
                    f"{len(chunk)} bytes to infer the column types from",
                    "fix the records, or pass ReadOptions(schema=...)",
                )
            chunk = header + b"".join(lines)
        try:
            schema = exact_csv(chunk, read, parse).schema
        except pa.ArrowInvalid as e:
            raise _locate(shard, header, lines, (), parse, names) or ShardError(
                shard.url,
                f"is not valid {self.name.upper()} ({e})",
                "check the file, or pass ReadOptions(schema=...)",
            ) from None
        # pyarrow infers binary only for a column with a value that is not UTF-8.
        text = [f.name for f in schema if pa.types.is_binary(f.type)]
        error = _locate(shard, header, lines, text, parse, names) if text else None
        if error is not None:
            raise error
        if names:
            _warn_header_as_row(shard, records[0], names, parse)
        elif len(schema) == 1 and options.delimiter is None:
            _warn_one_column(shard, schema.names[0], self.delimiter)
        return schema

    def schema_key(self, options: ReadOptions) -> str | None:
        """The delimiter and the first block's bytes and records; None without a header line
        (whether the first record is the column names is a warning of the data's)."""
        if not self.header:
            return None
        return json.dumps(
            [
                self.name,
                self.delimiter,
                options.block_bytes,
                options.max_line_bytes,
                options.on_error,
            ]
        )

    def kept_schema(self, shard: Shard, schema: pa.Schema, options: ReadOptions) -> None:
        if len(schema) == 1 and options.delimiter is None:
            _warn_one_column(shard, schema.names[0], self.delimiter)

    def open(self, ctx: ReadContext) -> ShardReader:
        if ctx.schema is None:  # no shard of the listing held a record (infer_schema)
            return _NoRecords(ctx, self)
        return _CsvReader(ctx, self.delimiter, _names(self, ctx.shard, ctx.options))


class _NoRecords(ShardReader):
    """A shard of a listing where no shard held a record after its header line, so no
    column has a type (:meth:`CsvFormat.infer_schema`): it reads as no rows, once checked
    to hold none still (never rows dropped without a word)."""

    def __init__(self, ctx: ReadContext, fmt: CsvFormat) -> None:
        super().__init__(ctx)
        self._format = fmt

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        ctx = self.ctx
        if ctx.shard.size and self._format.infer_schema(
            ctx.source, ctx.shard, ctx.info, ctx.options
        ):
            raise ShardError(
                ctx.shard.url,
                "holds records, and its listing found none in any shard to type the columns",
                "list the source again (the shard changed since), or pass ReadOptions(schema=...)",
                byte=0,
            )
        return iter(())


def _names(fmt: CsvFormat, shard: Shard, options: ReadOptions) -> list[str] | None:
    """The column names of a header-less read (``ReadOptions.column_names``); None where the
    first record is the header."""
    if fmt.header:
        return None
    if options.column_names is None:
        raise ConfigError(
            f"{redact(shard.url)}: format {fmt.name!r} reads shards without a header line, "
            "and no ReadOptions(column_names=[...]) names their columns: pass them"
        )
    return list(options.column_names)


def _warn_header_as_row(
    shard: Shard, first: bytes, names: list[str], parse: pcsv.ParseOptions
) -> None:
    """Warn where the first record of a shard read without a header is the column names:
    it is a header, read as a row."""
    try:
        row = pcsv.read_csv(
            pa.BufferReader(first),
            pcsv.ReadOptions(column_names=names),
            parse,
            pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string())),
        ).to_pylist()
    except pa.ArrowInvalid:
        return
    if row and list(row[0].values()) == names:
        warnings.warn(
            f"{redact(shard.url)}: its first record is the column names {names}: it has a "
            "header line, read as a row under ReadOptions(column_names=...); leave "
            "column_names out to take the header for one",
            UserWarning,
            stacklevel=3,
        )


_OTHER_DELIMITERS = (";", "|", "\t", ",")


def _warn_one_column(shard: Shard, name: str, delimiter: str) -> None:
    """Warn where a header read as one column holds another likely delimiter: every row
    would come as one value."""
    for other in _OTHER_DELIMITERS:
        if other != delimiter and other in name:
            warnings.warn(
                f"{redact(shard.url)}: its header is read as one column, {name[:80]!r}, which "
                f"holds {other!r}: if values are separated by {other!r}, read with "
                f"ReadOptions(delimiter={other!r}); every row is one value of that column "
                "otherwise",
                UserWarning,
                stacklevel=2,
            )
            return


class TsvFormat(CsvFormat):
    """Tab-separated values: CSV with a tab between values."""

    name = "tsv"
    extensions = (".tsv",)
    delimiter = "\t"


class _CsvReader(LineReader):
    def __init__(self, ctx: ReadContext, delimiter: str, column_names: list[str] | None) -> None:
        super().__init__(ctx)
        schema = ctx.schema
        assert schema is not None  # the stream always resolves a schema for CSV
        self._delimiter = delimiter
        self._parse = _parse_options(delimiter)
        self._header: bytes | None = None
        """The shard's header line, once read (None: none yet, or none: ``column_names``)."""
        self._headed = column_names is None
        """Whether the shard has a header line (not ``column_names``)."""
        if column_names is not None:  # no header: every record is a row
            self._check(column_names)
        self._read_options = pcsv.ReadOptions(column_names=schema.names, use_threads=False)
        self._convert = pcsv.ConvertOptions(
            column_types=schema,
            include_columns=list(ctx.columns) if ctx.columns is not None else None,
        )

    def record_ends(self) -> RecordEnds:
        return CsvRecords(self._delimiter)

    def header(self) -> bytes | None:
        if self._headed and self._header is None:
            first = _first_record(
                self.ctx.source, self.ctx.shard, self.ctx.options, self._delimiter
            )
            self._took(first)
        return self._header

    def header_of(self, chunk: bytes) -> bytes | None:
        if self._headed and self._header is None:
            self._took(split_records(chunk, self._delimiter)[0] if chunk else b"")
        return self._header

    def _took(self, header: bytes) -> None:
        """The shard's header line, its names checked against the stream's."""
        names = (
            pcsv.read_csv(pa.BufferReader(header), parse_options=self._parse).column_names
            if header
            else []
        )
        self._check(names)
        self._header = header

    def _check(self, names: list[str]) -> None:
        """Refuse a shard whose columns (its header's, or ``column_names``) are not the
        stream's."""
        ctx = self.ctx
        assert ctx.schema is not None
        check_names(ctx.shard.url, names)
        if names != ctx.schema.names:
            raise SchemaMismatchError(
                ctx.shard.url,
                f"header {names} differs from {ctx.schema_origin}'s {ctx.schema.names}",
                "make the shards agree or read them as separate streams",
                line=1,
                byte=0,
            )
        check_columns(ctx.shard.url, ctx.columns, names)  # pyarrow's error names no shard

    def split(self, body: bytes) -> list[bytes]:
        return split_records(body, self._delimiter)

    def has_rows(self, body: bytes) -> bool:
        return holds_record(body)

    def parse(self, chunk: bytes) -> pa.Table:
        options = pcsv.ReadOptions(
            column_names=self._read_options.column_names,
            use_threads=False,
            block_size=len(chunk) + 1,
        )
        return pcsv.read_csv(
            pa.BufferReader(chunk),
            read_options=options,
            parse_options=self._parse,
            convert_options=self._convert,
        )

    def describe_error(self, line: bytes, error: Exception) -> tuple[str, str, bool]:
        problem, fix = _describe(line, error)
        declare = self._declaration(line)
        if declare:  # a value of a type the inferred one does not hold
            fix = f"declare the types that read both, {declare}, or fix the record"
        return problem, fix, False

    def _declaration(self, line: bytes) -> str | None:
        """The declared schema that reads the stream's rows and ``line``'s, or None."""
        if self.ctx.schema is None:
            return None
        read = pcsv.ReadOptions(column_names=self.ctx.schema.names)
        try:
            seen = exact_csv(line, read, self._parse).schema
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        return declaration(self.ctx.schema, seen)


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


def _first_bad(
    header: bytes,
    lines: list[bytes],
    text: Sequence[str],
    parse_options: pcsv.ParseOptions,
    names: list[str] | None,
) -> tuple[int, Exception] | None:
    """The index of the first of ``lines`` pyarrow cannot read (see :func:`_locate`) and
    its error, or None if it reads every line."""
    convert = pcsv.ConvertOptions(column_types={name: pa.string() for name in text})
    read = pcsv.ReadOptions(column_names=names)

    def parse(body: bytes) -> pa.Table:
        return pcsv.read_csv(pa.BufferReader(header + body), read, parse_options, convert)

    try:
        parse(b"".join(lines))
    except PARSE_ERRORS as e:
        first_error: Exception = e
    else:
        return None
    bad, error = first_bad_line(parse, lines)
    return bad, error or first_error


def _readable(
    header: bytes,
    lines: list[bytes],
    read: pcsv.ReadOptions,
    parse_options: pcsv.ParseOptions,
    names: list[str] | None,
    max_errors: int,
) -> list[bytes]:
    """``lines`` without those a read under ``on_error="skip"`` quarantines: those pyarrow
    cannot read, and those with a value that is not UTF-8 (pyarrow infers such a column as
    binary), for the types inferred (a bad record among them quarantined its whole shard).
    At most ``max_errors`` are left out (a read refuses more): past them, the lines are
    returned as they are, and their inference fails naming the next."""
    lines = list(lines)
    for _ in range(max_errors + 1):
        try:
            schema = exact_csv(header + b"".join(lines), read, parse_options).schema
            text = [f.name for f in schema if pa.types.is_binary(f.type)]
        except pa.ArrowInvalid:
            text = []
        else:
            if not text:  # every record read, as text where text: none to leave out
                break
        found = _first_bad(header, lines, text, parse_options, names)
        if found is None:
            break
        del lines[found[0]]
    return lines


def _locate(
    shard: Shard,
    header: bytes,
    lines: list[bytes],
    text: Sequence[str],
    parse_options: pcsv.ParseOptions,
    names: list[str] | None = None,
) -> ShardError | None:
    """The error for the first of ``lines`` (after ``header``) that pyarrow cannot read.

    Args:
        shard: The shard, read from its start.
        header: The header line (empty where ``names`` names the columns).
        lines: The lines after it.
        text: Columns to read as strings (pyarrow infers binary for invalid UTF-8).
        parse_options: The format's (its delimiter).
        names: The column names of a shard without a header line, or None.

    Returns:
        The error, or None if pyarrow reads every line.
    """
    found = _first_bad(header, lines, text, parse_options, names)
    if found is None:
        return None
    bad, error = found
    problem, fix = _describe(lines[bad], error)
    return ShardError(
        shard.url,
        problem,
        fix,
        row=sum(1 for x in lines[:bad] if holds_record(x)),
        line=1 + sum(x.count(b"\n") for x in [header, *lines[:bad]]),
        byte=len(header) + sum(len(x) for x in lines[:bad]),
    )
