"""JSON Lines (plain, .gz, .zst, .bz2, .xz): one JSON object per line, parsed by pyarrow in
chunks; a shard that is one JSON array of objects is read as the lines of its items
(:mod:`ingest.formats._json_document`), as ``datasets``' json builder reads it.

Row k is the k-th non-blank line. Uncompressed shards resume by byte offset; compressed ones
decompress and skip within the shard. The schema is inferred from the first block of the
first shard with a line that is not blank unless ``ReadOptions.schema`` gives it (integers
past int64 as ``uint64``: :mod:`ingest.formats.big_integers`), and every shard must match it;
under ``on_error="skip"`` from the lines of that block that parse (a bad one is quarantined
alone when it is read).
A line that nests deeper than ``ReadOptions.max_json_depth`` is refused before pyarrow sees
it (:func:`too_deep`): pyarrow's recursion over 10,000 levels crashes the process.
"""

from __future__ import annotations

import copy
import functools
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from ingest.core.errors import SchemaMismatchError, ShardError
from ingest.formats._json_document import open_json
from ingest.formats._lines import LineReader, Opener, iter_chunks, not_utf8
from ingest.formats.base import (
    MAX_JSON_DEPTH,
    ReadContext,
    ReadOptions,
    ShardInfo,
    ShardReader,
    UncountedFormat,
    check_columns,
)
from ingest.formats.big_integers import exact, exact_json
from ingest.formats.conform import declaration
from ingest.storage.sources import Shard, Source


class JsonlFormat(UncountedFormat):
    name = "jsonl"
    extensions = (".jsonl", ".ndjson", ".json")
    field: str | None = None
    """The key of a JSON document whose rows it holds (``ReadOptions.field``), or None."""

    def variant(self, inner: str) -> JsonlFormat | None:
        """This format named ``jsonl[field=KEY]`` (:func:`ingest.formats.read_as`): a JSON
        document's rows under ``KEY``; None for another name."""
        key = inner.removeprefix("field=")
        if key == inner or not key:
            return None
        other = copy.copy(self)
        other.field = key
        other.name = f"{self.name}[{inner}]"  # type: ignore[misc]  # its own name
        return other

    def opener(self) -> Opener:
        """How a read from a shard's first byte opens it: a JSON array document (or, with
        :attr:`field`, an object's list under it) as JSON Lines
        (:mod:`ingest.formats._json_document`)."""
        return functools.partial(open_json, field=self.field)

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema | None:
        """The types pyarrow infers from the shard's first lines; None where it holds blank
        lines only (the next shard's are taken).

        Raises:
            ShardError: If it holds lines and none is a JSON record (``on_error="skip"``:
                none reads).
        """
        ctx = ReadContext(source, shard, info, options, None, shard.url, None)
        reader = _JsonlReader(ctx, self.opener())
        chunks = iter_chunks(
            source, shard, 0, options.block_bytes, options.max_line_bytes, opener=self.opener()
        )
        text = False
        for _, chunk in chunks:
            if chunk.strip():
                text = True
                try:
                    return _inferred(chunk, options.max_json_depth)
                except pa.ArrowInvalid:
                    if options.on_error != "skip":
                        reader.parse_or_locate(chunk, 0, 1, 0)  # names the bad line
                        raise
                # on_error="skip": from the lines a read does not quarantine.
                good = reader.without_bad_lines(chunk)
                if good.strip():
                    return _inferred(good, options.max_json_depth)
        if not text:
            return None
        raise ShardError(
            shard.url, "has no JSON lines to infer a schema from", "pass ReadOptions(schema=...)"
        )

    def schema_key(self, options: ReadOptions) -> str | None:
        """The first block's bytes and lines, how deep they may nest, lines skipped or not,
        and the field that holds a JSON document's records."""
        return json.dumps(
            [
                self.name,
                self.field,
                options.block_bytes,
                options.max_line_bytes,
                options.max_json_depth,
                options.on_error,
            ]
        )

    def open(self, ctx: ReadContext) -> ShardReader:
        return _JsonlReader(ctx, self.opener())


def _inferred(chunk: bytes, max_depth: int) -> pa.Schema:
    """The schema of ``chunk``'s lines, integers past int64 as ``uint64``
    (:func:`ingest.formats.big_integers.exact`)."""
    table = _parse(chunk, None, None, max_depth)
    return exact(table, lambda schema: _parse(chunk, schema, None, max_depth)).schema


def _declaration(stream: pa.Schema | None, line: bytes) -> str | None:
    """The declared schema that reads the stream's rows and ``line``'s
    (:func:`ingest.formats.conform.declaration`), or None."""
    if stream is None:
        return None
    try:
        seen = exact_json(line).schema
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return declaration(stream, seen)


class TooDeepError(pa.ArrowInvalid):  # type: ignore[misc]  # pyarrow has no stubs
    """A line nests deeper than ``ReadOptions.max_json_depth`` (raised before pyarrow parses
    it; a parse error, so the line reader locates the line as it does any other)."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"a JSON value nests {depth} levels deep, more than {limit}")
        self.depth = depth
        self.limit = limit


_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_OPENS = b"[{"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_OPENS = bytes(b for b in range(256) if b not in b"[{\n")
"""Every byte but ``[``, ``{`` and the newline (:meth:`bytes.translate` deletes them)."""


def too_deep(chunk: bytes, limit: int) -> int | None:
    """The nesting depth of the first line of ``chunk`` deeper than ``limit``, or None.

    A line deeper than ``limit`` opens more than ``limit`` arrays or objects: counting the
    brackets of each line rules out nearly every line, and only lines with that many are
    measured, strings left out. The count is one C pass (:meth:`bytes.translate` keeps the
    opening brackets and newlines), a third of the time pyarrow takes to parse the chunk
    (numpy's comparisons over every byte took longer than the parse). Written here because
    neither pyarrow nor the json module stops at a depth: pyarrow crashes, json raises
    RecursionError.
    """
    return _deeper(chunk, _opens(chunk), limit)


def _opens(chunk: bytes) -> list[bytes]:
    """Each line's opening brackets (one more item than ``chunk`` has newlines)."""
    return chunk.translate(None, _NOT_OPENS).split(b"\n")


def _deeper(chunk: bytes, opens: list[bytes], limit: int) -> int | None:
    """:func:`too_deep` with ``chunk``'s :func:`_opens`."""
    if max(map(len, opens)) <= limit:
        return None
    lines = chunk.split(b"\n")
    for n, line_opens in enumerate(opens):
        if len(line_opens) > limit and (depth := _depth(lines[n])) > limit:
            return depth
    return None


def _depth(line: bytes) -> int:
    """The deepest nesting of arrays and objects in ``line``, brackets in strings left out."""
    brackets = np.frombuffer(_STRING.sub(b"", line).translate(None, _NOT_BRACKETS), np.uint8)
    if not len(brackets):
        return 0
    steps = np.where((brackets == _OPENS[0]) | (brackets == _OPENS[1]), 1, -1)
    return int(np.cumsum(steps).max())


def _parse(
    chunk: bytes,
    schema: pa.Schema | None,
    columns: list[str] | None,
    max_depth: int,
    opens: list[bytes] | None = None,
) -> pa.Table:
    """``chunk``'s lines as a table (``opens``: its :func:`_opens`, if counted already)."""
    depth = _deeper(chunk, _opens(chunk) if opens is None else opens, max_depth)
    if depth is not None:
        raise TooDeepError(depth, max_depth)
    parse_options = pj.ParseOptions(
        explicit_schema=schema,
        unexpected_field_behavior="infer"
        if schema is None
        else ("ignore" if columns is not None else "error"),
    )
    # One block per chunk: chunks are already sized by ReadOptions.block_bytes.
    read_options = pj.ReadOptions(use_threads=False, block_size=len(chunk) + 1)
    table = pj.read_json(
        pa.BufferReader(chunk), read_options=read_options, parse_options=parse_options
    )
    # pyarrow's JSON parser copies string bytes as they are: invalid UTF-8 would surface
    # later, as a bare UnicodeDecodeError in the training loop. Validating costs ~0.1 ms/MB.
    table.validate(full=True)
    return table


class _JsonlReader(LineReader):
    def __init__(self, ctx: ReadContext, opener: Opener) -> None:
        super().__init__(ctx)
        self._opener = opener
        self._columns = list(ctx.columns) if ctx.columns is not None else None
        schema = ctx.schema
        if schema is not None and self._columns is not None:
            schema = pa.schema([schema.field(c) for c in self._columns if c in schema.names])
        self._schema = schema
        self._counted: tuple[bytes | None, int] = (None, 0)
        """The last chunk parsed and its newlines."""

    def opener(self) -> Opener:
        """The format's (:meth:`JsonlFormat.opener`)."""
        return self._opener

    def parse(self, chunk: bytes) -> pa.Table:
        opens = _opens(chunk)
        # The depth check's pass over the chunk counts its newlines too: the line reader
        # asks for them next (LineReader.newlines), and need not pass over it again.
        self._counted = (chunk, len(opens) - 1)
        depth = self.ctx.options.max_json_depth
        try:
            table = _parse(chunk, self._schema, self._columns, depth, opens)
        except pa.ArrowNotImplementedError as e:  # a type JSON converts to none of
            ctx = self.ctx
            raise SchemaMismatchError(
                ctx.shard.url,
                f"is read with the stream's types, taken from {ctx.schema_origin}, and "
                f"pyarrow reads JSON as none of some of them ({e})",
                "read the JSON Lines shards as a stream of their own, or declare types JSON "
                "reads with ReadOptions(schema=...) (a list for a fixed-size list)",
            ) from None
        if self._columns is not None:
            check_columns(self.ctx.shard.url, self._columns, table.column_names)
            table = table.select(self._columns)
        return table

    def newlines(self, body: bytes) -> int:
        chunk, count = self._counted
        self._counted = (None, 0)  # the chunk is not held past its count
        return count if chunk is body else super().newlines(body)

    def describe_error(self, line: bytes, error: Exception) -> tuple[str, str, bool]:
        if isinstance(error, TooDeepError):
            return (
                f"a JSON value nests {error.depth} levels deep, more than "
                f"max_json_depth={error.limit}: {line[:80]!r}",
                "flatten the data (store deep structures as a JSON string), or raise "
                f"ReadOptions(max_json_depth=...) up to {MAX_JSON_DEPTH}",
                False,
            )
        problem = not_utf8(line)
        if problem is not None and _is_json(line.decode("latin-1")):
            return (
                problem,
                "JSON Lines are UTF-8: re-encode the file (e.g. iconv -f latin1 -t utf-8) or "
                "fix the line",
                False,
            )
        try:
            json.loads(line)
        except RecursionError:
            return (
                f"a JSON value nests too deep for Python's json module: {line[:80]!r}",
                "flatten the data, or lower ReadOptions(max_json_depth=...)",
                False,
            )
        except ValueError as e:
            document = line.strip() == b"{"  # a pretty-printed object: one document
            return (
                f"invalid JSON ({e}): {line[:80]!r}",
                "fix or remove the line; every line must be one JSON object"
                + (
                    " (if the file is one JSON document holding its rows under a key, "
                    "as SQuAD's 'data', pass ReadOptions(field='data'))"
                    if document
                    else ""
                ),
                False,
            )
        declare = _declaration(self.ctx.schema, line)
        return (
            f"line does not match the schema taken from {self.ctx.schema_origin} "
            f"({error}): {line[:80]!r}",
            (
                f"declare the types that read both, {declare}, "
                if declare
                else "pass ReadOptions(schema=...) with types that fit every shard, "
            )
            + "make the shards agree, or select shared columns with columns=[...]",
            True,
        )


def _is_json(text: str) -> bool:
    """Whether ``text`` parses as JSON.

    A line that does once its bytes are read as Latin-1 is JSON in another encoding than
    UTF-8; one that does not is not JSON at all (a file of another format, say).
    """
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True
