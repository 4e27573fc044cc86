"""A derived unit as bytes: what a stage chain made of one source unit, row-aligned with it.

A copy holds, for each input row of the unit, how many output rows it became (0 for a row a
filter left out, several for a document cut in chunks), the output rows themselves, and the
parts of input rows they hold where the chain gave any (:class:`ingest.Staged`'s ``part``).
Decoding gives back the :class:`ingest.Staged` the chain made, equal to it column for column
(types, field and schema metadata), so a reader that takes the copy in place of running the
chain cannot tell the difference, and every output still names its input row for acks.

Compact. Integer columns and lists of integers (token ids) are stored in the narrowest
unsigned type that holds their values where that is narrower than their own (``uint8``,
``uint16``, ``uint32``): ``int32`` ids below 65,536 (most vocabularies) as ``uint16``,
64-bit ones below 2**32 as ``uint32``; ``int32`` ids of a larger vocabulary stay as they are
(``uint32`` would save nothing). The original schema
travels with the copy and is cast back on decoding. Every section is Arrow IPC, compressed
with zstd where pyarrow has it (lz4 otherwise; none if neither).

Layout: ``MAGIC``, a little-endian u32 header length, a JSON header (input and output row
counts, each section's length), then the sections: the output schema (an IPC schema
message), the counts per input row, the output table, and the parts (absent without).
Checksums are the store's (:mod:`ingest.engine.derived.store`): this layer trusts its bytes
but refuses any that do not parse (:class:`CorruptDerivedError`).
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.errors import IngestError
from ingest.engine.stage import Staged
from ingest.formats.arrays import ints, numbers

MAGIC = b"IDRVCOD1"
"""The codec's first bytes; the digit is its version (a copy of another is not decoded)."""

_HEADER = struct.Struct("<I")
_SECTIONS = ("schema", "counts", "table", "part")


def _compression() -> pa.Codec | None:
    """zstd, else lz4, else none: whichever this pyarrow was built with.

    zstd's level 3, measured on the byte-level tokenizer's ids of the Zipf text of
    ``benchmarks/tokenize_pack.py`` (16,000 tokens, ``uint16``): 1.53 bytes a token, 3% more
    than level 9 (1.49) at three times its speed (52 against 17 M tokens/s encoded), 2% less
    than level 1 (1.57, 127 M tokens/s); level 19 saves 5% at 0.5 M tokens/s. Encoding at
    level 3 costs under 1% of what tokenizing did (0.16 M tokens/s, same run, load 6)."""
    if pa.Codec.is_available("zstd"):
        return pa.Codec("zstd", compression_level=3)
    if pa.Codec.is_available("lz4"):
        return pa.Codec("lz4")
    return None


_OPTIONS = pa.ipc.IpcWriteOptions(compression=_compression())


class CorruptDerivedError(IngestError):
    """Bytes that are not a derived unit of this codec (another version, cut short, damaged).
    The store takes it as a miss and removes the copy."""


@dataclass(frozen=True, slots=True)
class DerivedUnit:
    """A decoded copy: what the chain made of a unit of ``inputs`` rows.

    Attributes:
        staged: The chain's output, ``origin`` giving each output row's input row in the unit.
        inputs: Rows of the source unit the chain was given.
        seconds: How long the chain took over the unit when the copy was made (what reading
            the copy saves; 0 where not measured).
    """

    staged: Staged
    inputs: int
    seconds: float = 0.0

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        """Output rows per input row (0: left out)."""
        return np.bincount(self.staged.origin, minlength=self.inputs).astype(np.int64)


def encode(staged: Staged, inputs: int, seconds: float = 0.0) -> bytes:
    """The bytes of what a stage chain made of a unit of ``inputs`` rows (in ``seconds``).

    Raises:
        ConfigError: If ``staged`` does not fit ``inputs`` rows (origins out of range or out of
            order, parts of the wrong shape: :meth:`ingest.Staged.check`).
    """
    staged.check(inputs, "(derived copy)")
    origin = np.asarray(staged.origin, dtype=np.int64)
    counts = np.bincount(origin, minlength=inputs) if len(origin) else np.zeros(inputs, np.int64)
    table = staged.table
    sections = {
        "schema": table.schema.serialize().to_pybytes(),
        "counts": _ipc(_narrowed(pa.Table.from_arrays([ints(counts)], names=["outputs"]))),
        "table": _ipc(_narrowed(table)),
        "part": b"",
    }
    if staged.part is not None:
        part = np.asarray(staged.part, dtype=np.int64).reshape(-1, 2)
        bounds = [ints(part[:, 0]), ints(part[:, 1])]
        sections["part"] = _ipc(_narrowed(pa.Table.from_arrays(bounds, names=["start", "stop"])))
    header = json.dumps(
        {
            "inputs": inputs,
            "rows": table.num_rows,
            "parts": staged.part is not None,
            "seconds": float(seconds),
            "sections": [len(sections[s]) for s in _SECTIONS],
        }
    ).encode()
    return b"".join([MAGIC, _HEADER.pack(len(header)), header, *(sections[s] for s in _SECTIONS)])


def decode(blob: bytes) -> DerivedUnit:
    """What :func:`encode` was given, equal to it (``Table.equals`` with metadata).

    Raises:
        CorruptDerivedError: If ``blob`` is not a derived unit of this codec.
    """
    try:
        return _decode(memoryview(blob))
    except CorruptDerivedError:
        raise
    except (pa.ArrowException, ValueError, TypeError, KeyError, struct.error) as e:
        raise CorruptDerivedError(f"not a derived unit ({type(e).__name__}: {e})") from None


def _sections(blob: memoryview) -> tuple[dict[str, Any], dict[str, memoryview]]:
    """The header of an encoded unit and its sections by name."""
    if bytes(blob[: len(MAGIC)]) != MAGIC:
        raise CorruptDerivedError(
            f"not a derived unit of this codec (starts {bytes(blob[:8])!r}, not {MAGIC!r})"
        )
    at = len(MAGIC) + _HEADER.size
    (size,) = _HEADER.unpack(blob[len(MAGIC) : at])
    header = json.loads(bytes(blob[at : at + size]))
    at += size
    sections = {}
    for name, length in zip(_SECTIONS, header["sections"], strict=True):
        sections[name] = blob[at : at + length]
        at += length
    if at != len(blob):
        raise CorruptDerivedError(f"{len(blob)} bytes where its header says {at}")
    return header, sections


def _decode(blob: memoryview) -> DerivedUnit:
    header, sections = _sections(blob)
    inputs, rows = int(header["inputs"]), int(header["rows"])
    schema = pa.ipc.read_schema(pa.py_buffer(sections["schema"]))
    table = _read(sections["table"]).cast(schema)
    counts = numbers(_read(sections["counts"]).column("outputs")).astype(np.int64)
    if len(counts) != inputs or int(counts.sum()) != rows or table.num_rows != rows:
        raise CorruptDerivedError(
            f"{len(counts)} input rows and {int(counts.sum())}/{table.num_rows} output rows, "
            f"where its header says {inputs} and {rows}"
        )
    origin = np.repeat(np.arange(inputs, dtype=np.int64), counts)
    part = None
    if header["parts"]:
        parts = _read(sections["part"])
        part = np.stack(
            [numbers(parts.column(c)).astype(np.int64) for c in ("start", "stop")], axis=1
        ).reshape(-1, 2)
        if len(part) != rows:
            raise CorruptDerivedError(f"{len(part)} parts for {rows} output rows")
    seconds = float(header.get("seconds", 0.0))  # absent in copies made before it was kept
    return DerivedUnit(Staged(table, origin, part), inputs, seconds)


def stored_schema(blob: bytes) -> pa.Schema:
    """The schema the output table is stored with (its integer columns narrowed), for a
    report of what a copy holds; :func:`decode` gives back the chain's own.

    Raises:
        CorruptDerivedError: If ``blob`` is not a derived unit of this codec.
    """
    try:
        sections = _sections(memoryview(blob))[1]
        return pa.ipc.open_stream(pa.py_buffer(sections["table"])).schema
    except CorruptDerivedError:
        raise
    except (pa.ArrowException, ValueError, TypeError, KeyError, struct.error) as e:
        raise CorruptDerivedError(f"not a derived unit ({type(e).__name__}: {e})") from None


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema, options=_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _read(section: memoryview) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(section)).read_all()


def _narrowed(table: pa.Table) -> pa.Table:
    """``table`` with each integer column (or list of integers) in the narrowest unsigned
    type that holds its values, where that is narrower than its own."""
    fields = [_narrow_field(f, table.column(f.name)) for f in table.schema]
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)


def _narrow_field(field: pa.Field, column: pa.ChunkedArray) -> pa.Field:
    kind = field.type
    if pa.types.is_integer(kind):
        narrow = _narrow_int(kind, column)
        return field if narrow is None else pa.field(field.name, narrow, field.nullable)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = kind.value_field
        if not pa.types.is_integer(item.type):
            return field
        narrow = _narrow_int(item.type, pc.list_flatten(column))
        if narrow is None:
            return field
        make = pa.list_ if pa.types.is_list(kind) else pa.large_list
        return pa.field(field.name, make(pa.field(item.name, narrow)), field.nullable)
    return field


def _narrow_int(kind: pa.DataType, values: pa.ChunkedArray) -> pa.DataType | None:
    """The unsigned type narrower than ``kind`` that holds every value, or None."""
    low, high = pc.min_max(values).values()
    low = 0 if low.as_py() is None else low.as_py()
    high = 0 if high.as_py() is None else high.as_py()
    if low < 0:
        return None
    for narrow in (pa.uint8(), pa.uint16(), pa.uint32()):
        if narrow.bit_width < kind.bit_width and high < 1 << narrow.bit_width:
            return narrow
    return None


__all__ = ["MAGIC", "CorruptDerivedError", "DerivedUnit", "decode", "encode", "stored_schema"]
