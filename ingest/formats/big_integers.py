"""Integers past int64 in JSON Lines and CSV are read as ``uint64``, not rounded. No Ray.

pyarrow's JSON and CSV readers infer ``int64`` for a column of integers, and ``double`` as
soon as one value is past int64's range (a 64-bit hash, an unsigned id): every value of
the column then goes through a double, whose 53-bit mantissa keeps 15 to 17 digits, so
``18446744073709551615`` and ``18446744073709551614`` come out as one number, without a
word. Non-negative integers fit ``uint64`` exactly, and both readers read them so when
told: :func:`exact` finds the inferred ``double`` columns (and list items, and struct
fields) that hold a value of magnitude 2**63 or more, which no float literal within
int64's range gives, and reads the sample again with those as ``uint64``. Where that read
fails (the column also holds a fraction, a negative value or a float literal such as
``1e19``), the double stays, as pyarrow made it: that column is a float column.

Written here because neither reader infers ``uint64`` (their inference goes from ``int64``
to ``double``) and neither says when a value loses digits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

PAST_INT64 = 2.0**63
"""The smallest magnitude an int64 does not hold (a double holds it exactly)."""


def exact(table: pa.Table, read: Callable[[pa.Schema], pa.Table]) -> pa.Table:
    """``table`` (a sample as pyarrow inferred it), or the sample read again by ``read``
    with each ``double`` that holds integers past int64 as ``uint64``: the same object
    where no column does, or where the read again fails (see the module)."""
    fields = [f.with_type(_unsigned(f.type, table.column(i))) for i, f in enumerate(table.schema)]
    schema = pa.schema(fields, metadata=table.schema.metadata)
    if schema.equals(table.schema):
        return table
    try:
        return read(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return table


def exact_json(data: bytes) -> pa.Table:
    """JSON Lines ``data`` with the types pyarrow infers, integers past int64 as ``uint64``
    (:func:`exact`)."""
    import pyarrow.json as pj

    def read(schema: pa.Schema | None) -> pa.Table:
        parse = pj.ParseOptions(explicit_schema=schema)
        return pj.read_json(pa.BufferReader(data), parse_options=parse)

    return exact(read(None), read)


def exact_csv(data: bytes, read: Any = None, parse: Any = None) -> pa.Table:
    """CSV ``data`` (``read``, ``parse``: pyarrow's ``ReadOptions`` and ``ParseOptions``, or
    None) with the types pyarrow infers, integers past int64 as ``uint64`` (:func:`exact`)."""
    import pyarrow.csv as pcsv

    def again(schema: pa.Schema) -> pa.Table:
        convert = pcsv.ConvertOptions(column_types=schema)
        return pcsv.read_csv(pa.BufferReader(data), read, parse, convert)

    return exact(pcsv.read_csv(pa.BufferReader(data), read, parse), again)


def _unsigned(kind: pa.DataType, values: pa.ChunkedArray | pa.Array) -> pa.DataType:
    """``kind`` with each ``double`` whose ``values`` reach :data:`PAST_INT64` in magnitude
    made ``uint64``: at the top, in list items and in struct fields."""
    if pa.types.is_float64(kind):
        biggest = pc.max(pc.abs(values)).as_py() if len(values) > values.null_count else None
        return pa.uint64() if biggest is not None and biggest >= PAST_INT64 else kind
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = _unsigned(kind.value_type, pc.list_flatten(values))
        if item.equals(kind.value_type):
            return kind
        return pa.large_list(item) if pa.types.is_large_list(kind) else pa.list_(item)
    if pa.types.is_struct(kind):
        fields = [
            f.with_type(_unsigned(f.type, pc.struct_field(values, [i]))) for i, f in enumerate(kind)
        ]
        return pa.struct(fields)
    return kind


__all__ = ["PAST_INT64", "exact", "exact_csv", "exact_json"]
