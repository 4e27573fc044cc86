"""Which Arrow types become which torch tensors: the rules :mod:`ingest.engine.convert`
applies, asked where torch is not imported (a reader process, the feed before the batch
goes to its rank)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from ingest.formats.arrays import first_null

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
            return name, column.type, first_null(column)
        if is_number_list(column.type):
            row = _first_null_inside(column)
            if row is not None:
                return name, column.type, row
    return None


def _first_null_inside(column: pa.Array | pa.ChunkedArray) -> int | None:
    """The first row of a list-of-numbers column (:func:`is_number_list`) that holds a
    refused null inside: a null integer, or a null list of a row's fixed shape; None if
    none does. The levels' values are only counted (no copy); where one holds a null, each
    value is mapped to its row (``list_parent_indices``)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    before = 0
    for chunk in chunks:
        row = _null_inside(chunk)
        if row is not None:
            return before + row
        before += len(chunk)
    return None


def _null_inside(values: pa.Array) -> int | None:
    """:func:`_first_null_inside` of one array."""
    levels = []
    while is_number_list(values.type):
        levels.append(values)
        values = pc.list_flatten(values)
        if values.null_count and not pa.types.is_floating(values.type):  # (floats: NaN)
            break
    else:
        return None
    index = first_null(values)
    for level in reversed(levels):  # the value's list, its list's, ... its row
        index = int(pc.list_parent_indices(level)[index].as_py())
    return index


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


HF_ARRAY = "datasets.features.features.Array"
"""The start of the extension names of Hugging Face ``datasets``' ``Array2D`` to
``Array5D`` features (``...Array2DExtensionType``): lists of lists of one shape."""


def hf_array_shape(
    t: pa.DataType, metadata: Mapping[bytes, bytes] | None
) -> tuple[int | None, ...] | None:
    """The shape of a row of a ``datasets`` ``ArrayND`` column (its first dimension None
    where rows differ there), from its type where ``datasets`` is imported (the registered
    extension type), or from the field's ``metadata`` where it is not (the type is then its
    storage, lists of lists); None for any other column."""
    if isinstance(t, pa.ExtensionType):
        shape = getattr(t, "shape", None)
        if t.extension_name.startswith(HF_ARRAY) and shape is not None:
            return tuple(shape)
        return None
    name = (metadata or {}).get(b"ARROW:extension:name", b"")
    if not name.startswith(HF_ARRAY.encode()):
        return None
    try:
        shape, _ = json.loads((metadata or {})[b"ARROW:extension:metadata"])
        return tuple(None if d is None else int(d) for d in shape)
    except (KeyError, ValueError, TypeError):
        return None  # not the metadata datasets writes: the lists stay lists


def is_number_list(t: pa.DataType) -> bool:
    """A list (fixed or variable) of integers, floats or booleans, or of fixed-size lists of
    them at any depth: one tensor, or a list of views."""
    lists = pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
    return bool(lists and _numbers_within(t.value_type))


def _numbers_within(t: pa.DataType) -> bool:
    """Integers, floats or booleans, or fixed-size lists of them at any depth (a row's fixed
    shape)."""
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


__all__ = ["HF_ARRAY", "NULL_FIX", "hf_array_shape", "is_number_list", "refused_null"]
