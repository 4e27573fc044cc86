"""Chunks of whole lines from a line-delimited shard, with their byte offsets.

Shared by JSONL and CSV. Offsets are in the decompressed stream: an uncompressed shard seeks
to one directly; a gzip or zstd shard decompresses and discards the bytes before it, within
that shard only. Written here rather than taken from pyarrow's streaming readers because
those do not report where a batch starts, and the byte offset is what makes resume a seek.

A line longer than ``ReadOptions.max_line_bytes`` is an error, found while reading it: at
most that many bytes (plus one read) are held for one line, so a file without newlines, or a
50 MB line, fails with its offset instead of filling memory.

A format says where its records end (:class:`RecordEnds`): at every newline (JSONL), or at
the newlines outside quoted values (CSV). Chunks, and so seek points, start at record starts.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from ingest.core.errors import SchemaMismatchError, ShardError
from ingest.formats import split_compression
from ingest.formats._compressed import DecompressedFile
from ingest.formats.base import BadRows, RowBatch, Seek, ShardReader, clip
from ingest.storage.sources import Shard, Source

PARSE_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError)
"""What pyarrow's JSON and CSV parsers raise for input they cannot read."""


class LineTooLongError(ShardError):
    """A line is longer than ``ReadOptions.max_line_bytes`` (the offset is its first byte)."""


class RecordEnds(Protocol):
    """Where records end in the successive reads of one shard, from its first record on.

    One instance follows one pass over a shard: :meth:`scan` gets every read, in order.
    """

    def scan(self, data: bytes, at: int) -> tuple[int, int]:
        """The first and the last newline of ``data`` that end a record (indices in
        ``data``; -1 when none does). ``at``: the decompressed offset of ``data[0]``."""

    def open_record(self) -> str | None:
        """Why the bytes read since the last record end cannot end the shard (a quoted
        value still open), or None."""


class Newlines:
    """Every newline ends a record (JSON Lines)."""

    def scan(self, data: bytes, at: int) -> tuple[int, int]:
        return data.find(b"\n"), data.rfind(b"\n")

    def open_record(self) -> str | None:
        return None


def open_decompressed(source: Source, shard: Shard, block_bytes: int) -> tuple[Any, bool]:
    """Open ``shard`` and wrap it in a decompressor; returns (file, seekable)."""
    raw = source.open(shard, block_size=block_bytes)
    _, compression = split_compression(shard.url)
    if compression is None:
        return raw, True
    try:
        return DecompressedFile(raw, compression, shard.url, block_bytes), False
    except Exception:
        raw.close()
        raise


def go_to(f: Any, seekable: bool, start: int, block_bytes: int, url: str) -> int:
    """Move ``f`` to decompressed byte ``start``: a seek, or reads skipped (a compressed
    stream). Returns ``start``.

    Raises:
        ShardError: If the shard ends before ``start``.
    """
    if not start:
        return 0
    if seekable:
        f.seek(start)
        return start
    offset = 0
    while offset < start:
        skipped = f.read(min(block_bytes, start - offset))
        if not skipped:
            raise ShardError(
                url,
                f"ends at byte {offset}, before the saved position {start}",
                "the shard changed since the state was saved; restart the epoch",
                byte=offset,
            )
        offset += len(skipped)
    return offset


Opener = Callable[[Source, Shard, int, int], tuple[Any, bool]]
"""Opens a shard's bytes for a read from its first byte: ``(source, shard, block_bytes,
max_line_bytes) -> (file, seekable)``."""


def iter_chunks(
    source: Source,
    shard: Shard,
    start: int,
    block_bytes: int,
    max_line_bytes: int,
    records: Callable[[], RecordEnds] = Newlines,
    opener: Opener | None = None,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, chunk)``: whole records starting at decompressed byte ``offset``.

    Args:
        source: Opens the shard.
        shard: The shard.
        start: Decompressed byte offset of a record start to begin at.
        block_bytes: Bytes read per step; a longer record makes a longer chunk.
        max_line_bytes: Longest record allowed, its last newline not counted.
        records: Makes what tells where records end (default: at every newline).
        opener: Opens the shard for a read from its first byte, in place of
            :func:`open_decompressed` (JSON Lines: a JSON array document is made lines
            there, :func:`ingest.formats.jsonl.open_json`). A read from a later byte, a seek
            point's, opens it plainly: a document made lines hands out none past byte 0.

    Raises:
        LineTooLongError: At the first record longer than ``max_line_bytes``.
        ShardError: If the shard ends before ``start`` or inside a record that cannot end
            there (an open quote), or its compressed stream is damaged.
    """
    # Lines within one read are shorter than the read, so only lines that span reads need
    # counting: reads no larger than the limit make that check exact.
    step = min(block_bytes, max_line_bytes)
    if opener is not None and start == 0:
        f, seekable = opener(source, shard, block_bytes, max_line_bytes)
    else:
        f, seekable = open_decompressed(source, shard, block_bytes)
    with f:
        offset = go_to(f, seekable, start, block_bytes, shard.url)
        ends = records()
        parts: list[bytes] = []  # the record in progress, read so far
        pending = 0
        while True:
            data = f.read(step)
            if not data:
                if parts:
                    problem = ends.open_record()
                    if problem is not None:
                        raise ShardError(
                            shard.url,
                            f"ends inside a record: {problem}",
                            'close the quote, or double each quote meant as text (""); a '
                            "truncated file needs writing again",
                            byte=offset,
                        )
                    yield offset, b"".join(parts)
                return
            first, cut = ends.scan(data, offset + pending)
            # The record in progress goes on to the first record end of this read, or past it.
            if pending + (first if cut >= 0 else len(data)) > max_line_bytes:
                raise _too_long(shard, offset, max_line_bytes, ends.open_record())
            if cut < 0:
                parts.append(data)
                pending += len(data)
                continue
            chunk = b"".join([*parts, data[: cut + 1]]) if parts else data[: cut + 1]
            yield offset, chunk
            offset += len(chunk)
            parts = [data[cut + 1 :]] if cut + 1 < len(data) else []
            pending = len(data) - cut - 1


def split_lines(body: bytes) -> list[bytes]:
    """The lines of ``body``, each with its newline (the last one may have none).

    Only a newline byte ends a line, as for the offsets above (``bytes.splitlines`` also
    cuts at carriage returns).
    """
    lines = [x + b"\n" for x in body.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


_OTHER_FORMATS = (
    (b"PAR1", "a Parquet file", "read it with format='parquet' (or name it .parquet)"),
    (b"ARROW1", "an Arrow IPC file", "read it with format='arrow' (or name it .arrow)"),
    (b"\x1f\x8b", "a gzip-compressed file", "name it for its compression (.jsonl.gz, .csv.gz)"),
    (
        b"\x28\xb5\x2f\xfd",
        "a zstd-compressed file",
        "name it for its compression (.jsonl.zst, .csv.zst)",
    ),
    (b"PK\x03\x04", "a zip archive", "unpack it, or store its files as shards"),
)
"""The first bytes of files a line format cannot read: what the file is, and the fix."""


def another_format(first: bytes) -> tuple[str, str] | None:
    """What a file whose first line is ``first`` is, where it starts as a file of another
    format does (a wrong ``format=``, or a compressed file without its extension), and the
    fix; else None."""
    for magic, kind, fix in _OTHER_FORMATS:
        if first.startswith(magic):
            return kind, fix
    return None


def first_bad_line(
    parse: Callable[[bytes], object], lines: list[bytes]
) -> tuple[int, Exception | None]:
    """Find the first of ``lines`` that ``parse`` fails on, given that it fails on them all.

    Bisection over whole lines: O(log n) parses.

    Returns:
        The line's index, and the error of parsing it alone (None if it parses alone: the
        fault is in how it follows the lines before it).
    """
    lo, hi = 0, len(lines)  # invariant: lines[:lo] parse, lines[:hi] do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            parse(b"".join(lines[:mid]))
            lo = mid
        except PARSE_ERRORS:
            hi = mid
    bad = hi - 1
    try:
        parse(lines[bad])
    except PARSE_ERRORS as e:
        return bad, e
    return bad, None


def has_text(body: bytes) -> bool:
    """Whether ``body`` holds a byte that is not ASCII whitespace: ``body.strip()`` without
    its copy of a whole chunk (0.9 ms an epoch of ``benchmarks/tokenize_pack.py``)."""
    return bool(body) and not body.isspace()


def newlines(body: bytes) -> int:
    """The newline bytes in ``body``, for the line numbers errors name: numpy's comparison
    runs over the chunk in vector steps, 2.6x faster than ``body.count(b"\\n")`` (1.3 ms
    against 3.4 ms an epoch of ``benchmarks/tokenize_pack.py``, 13.5 MB)."""
    return int(np.count_nonzero(np.frombuffer(body, np.uint8) == _NEWLINE))


_NEWLINE = ord("\n")


def not_utf8(line: bytes) -> str | None:
    """What is wrong with ``line`` as UTF-8 text, or None when it is valid."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as e:
        return (
            f"is not UTF-8 text (byte {line[e.start]:#04x} at byte {e.start} of the line: "
            f"{e.reason}): {line[:80]!r}"
        )
    return None


def _too_long(shard: Shard, offset: int, limit: int, open_record: str | None) -> LineTooLongError:
    why = f"no newline within {limit} bytes" if open_record is None else open_record
    return LineTooLongError(
        shard.url,
        f"a line is longer than max_line_bytes={limit} ({why})",
        "fix the data (a lost newline joins lines, an unbalanced quote makes the rest of a "
        "CSV file one value; a file that is not line-delimited needs another format=), or "
        "raise ReadOptions(max_line_bytes=...) if lines this long are meant",
        byte=offset,
    )


class LineReader(ShardReader):
    """A reader over line-delimited text: parses whole-line chunks into Arrow tables.

    Seek points are ``(row, byte offset of a chunk start)``. Line numbers in errors are known
    when reading started at the top of the shard; after a seek, errors give the row and byte.
    """

    def record_ends(self) -> RecordEnds:
        """Where the format's records end, for one pass (CSV: at newlines outside quoted
        values)."""
        return Newlines()

    def header(self) -> bytes | None:
        """Bytes of a header line to drop from the first chunk (CSV), or None; a read from
        inside the shard asks it first (the header is checked before any row is read)."""
        return None

    def header_of(self, chunk: bytes) -> bytes | None:
        """:meth:`header` as the shard's first ``chunk`` holds it: a read from the first
        byte takes it from there, not in a request of its own."""
        return self.header()

    def opener(self) -> Opener | None:
        """What opens the shard for a read from its first byte (:func:`iter_chunks`); None:
        :func:`open_decompressed`."""
        return None

    def split(self, body: bytes) -> list[bytes]:
        """``body``'s records, each with its newline (the last one may have none)."""
        return split_lines(body)

    @abstractmethod
    def parse(self, chunk: bytes) -> pa.Table:
        """Parse whole lines into a table with the stream's (projected) schema."""

    def has_rows(self, body: bytes) -> bool:
        """Whether ``body`` (whole records) holds a row: a byte other than whitespace (a
        blank line is none, in JSON Lines)."""
        return has_text(body)

    def newlines(self, body: bytes) -> int:
        """The newline bytes in ``body``, a chunk just read (and parsed, if it held rows)."""
        return newlines(body)

    @abstractmethod
    def describe_error(self, line: bytes, error: Exception) -> tuple[str, str, bool]:
        """(problem, fix, is_schema_mismatch) for the first line that fails to parse."""

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        seek = self.ctx.info.seek_for(start, seek)
        row, offset = seek if seek is not None else (0, 0)
        line: int | None = 1 if offset == 0 else None
        yield from clip(self._batches(row, offset, line), start, stop)

    def _batches(self, row: int, offset: int, line: int | None) -> Iterator[RowBatch]:
        opts = self.ctx.options
        chunks = iter_chunks(
            self.ctx.source,
            self.ctx.shard,
            offset,
            opts.block_bytes,
            opts.max_line_bytes,
            self.record_ends,
            self.opener(),
        )
        if offset:
            self.header()  # read apart and checked (CSV): no chunk holds it
        while True:
            try:
                chunk_offset, chunk = next(chunks)
            except StopIteration:
                return
            except LineTooLongError as e:
                # The long line starts where the lines read so far end: name its row and line.
                raise LineTooLongError(
                    e.url, e.problem, e.fix, row=row, line=line, byte=e.byte
                ) from None
            body, skip = chunk, 0
            header = self.header_of(chunk) if chunk_offset == 0 else None
            if header is not None:
                skip = len(header)
                body = chunk[skip:]
                if line is not None:
                    line += 1
            if self.has_rows(body):
                for batch in self._chunk(body, row, line, chunk_offset, skip):
                    yield batch
                    row = batch.stop
            if line is not None:
                line += self.newlines(body)

    def _chunk(
        self, body: bytes, row: int, line: int | None, chunk_offset: int, skip: int
    ) -> Iterator[RowBatch]:
        """The batches of one chunk's lines (``body``, ``skip`` header bytes after
        ``chunk_offset``), from ``row``; under ``on_error="skip"`` a line that does not parse
        is a :class:`BadRows` instead of the error."""
        opts = self.ctx.options
        seek = (row, chunk_offset)
        offset = chunk_offset + skip
        if opts.on_error != "skip":
            pieces: Iterator[pa.Table | BadRows] = iter(
                [self.parse_or_locate(body, row, line, offset)]
            )
        else:
            pieces = self._parse_skipping(body, row, line, offset)
        for piece in pieces:
            if isinstance(piece, BadRows):
                yield replace(piece, seek=seek)
                row = piece.stop
                continue
            for batch in piece.to_batches(max_chunksize=opts.batch_rows):
                yield RowBatch(row, batch, seek)
                row += batch.num_rows

    def _parse_skipping(
        self, body: bytes, row: int, line: int | None, offset: int
    ) -> Iterator[pa.Table | BadRows]:
        """``on_error="skip"``: the chunk's tables, with each line that does not parse as a
        :class:`BadRows` of one row in its place (found by bisection: O(log n) parses per
        bad line), so only that line is quarantined and the lines after it are read."""
        while self.has_rows(body):
            try:
                yield self.parse(body)
                return
            except PARSE_ERRORS as e:
                lines = self.split(body)
                bad, error = self._locate(lines, row, line, offset, e)
            good = b"".join(lines[:bad])
            if self.has_rows(good):
                table = self.parse(good)
                yield table
                row += table.num_rows
            yield BadRows(row, pa.record_batch([pa.nulls(1)], names=["bad"]), error=error)
            row += 1
            offset += len(good) + len(lines[bad])
            if line is not None:
                line += _newlines(lines[: bad + 1])
            body = b"".join(lines[bad + 1 :])

    def _locate(
        self,
        lines: list[bytes],
        row: int,
        line: int | None,
        offset: int,
        first_error: Exception,
    ) -> tuple[int, ShardError]:
        """The first of ``lines`` (which fail to parse together) that fails, and the error
        that names it: the shard, its row, line and byte, what is wrong and the fix."""
        bad, error = first_bad_line(self.parse, lines)
        byte = offset + sum(len(x) for x in lines[:bad])
        rows_before = sum(1 for x in lines[:bad] if self.has_rows(x))
        problem, fix, schema = self.describe_error(lines[bad], error or first_error)
        other = another_format(lines[bad]) if byte == 0 else None
        if other is not None:  # a wrong format=, or a compressed file without its extension
            problem, fix = f"{problem}; the file starts as {other[0]} does", other[1]
        cls = SchemaMismatchError if schema else ShardError
        return bad, cls(
            self.ctx.shard.url,
            problem,
            fix,
            row=row + rows_before,
            line=None if line is None else line + _newlines(lines[:bad]),
            byte=byte,
        )

    def without_bad_lines(self, body: bytes) -> bytes:
        """``body`` with the lines that do not parse left out (found as
        :meth:`_parse_skipping` finds them: the lines it would quarantine), for a schema
        inferred under ``on_error="skip"``; empty if none parses."""
        while self.has_rows(body):
            try:
                self.parse(body)
                return body
            except PARSE_ERRORS:
                lines = self.split(body)
                bad, _ = first_bad_line(self.parse, lines)
                body = b"".join(lines[:bad] + lines[bad + 1 :])
        return b""

    def parse_or_locate(self, body: bytes, row: int, line: int | None, offset: int) -> pa.Table:
        """``body`` parsed; or, if it cannot be, the error naming its first bad line (``row``,
        ``line`` and ``offset``: where ``body`` starts in its shard)."""
        try:
            return self.parse(body)
        except PARSE_ERRORS as e:
            first_error = e
        _, error = self._locate(self.split(body), row, line, offset, first_error)
        raise error


def _newlines(records: list[bytes]) -> int:
    """Lines that ``records`` take up (a CSV record may hold newlines in quoted values)."""
    return sum(x.count(b"\n") for x in records)
