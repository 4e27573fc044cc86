"""Which Arrow types become which torch tensors: the rules :mod:`ingest.engine.convert`
applies, asked where torch is not imported (a reader process, the feed before the batch
goes to its rank)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

NULL_FIX = "fill them in a transform (pyarrow.compute.fill_null) or cast the column to float"


def refused_null(table: pa.Table) -> tuple[str, pa.DataType, int] | None:
    """The first column of ``table`` with a null that
    :func:`ingest.engine.convert.column_to_torch` refuses, its type and the row of its first
    null; None when every null it holds has a torch form (NaN in a float, None in a list of
    strings).

    Integers, booleans, dates and times, lists of numbers and tensors refuse a null: no torch
    dtype of theirs holds one. The feed asks before the conversion, while it still knows each
    row's shard (the conversion, on the rank, knows only the batch).
    """
    for name, column in zip(table.column_names, table.columns, strict=True):
        if column.null_count and _refuses_null(column.type):
            row = pc.index(pc.is_null(column), True).as_py()
            return name, column.type, int(row)
    return None


def _refuses_null(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or (pa.types.is_temporal(t) and not pa.types.is_interval(t))
        or is_number_list(t)
        or isinstance(t, pa.FixedShapeTensorType)
    )


def is_number_list(t: pa.DataType) -> bool:
    """A list (fixed or variable) of integers or floats, or of fixed-size lists of them at any
    depth: one tensor, or a list of views."""
    lists = pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
    return bool(lists and _numbers_within(t.value_type))


def _numbers_within(t: pa.DataType) -> bool:
    """Integers or floats, or fixed-size lists of them at any depth (a row's fixed shape)."""
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


__all__ = ["NULL_FIX", "is_number_list", "refused_null"]
