"""A shard's batches in the stream's schema: its columns' order and offset widths.

Shards written by several tools or jobs hold the same columns and values in other forms:
the columns in another order (a DataFrame's columns reordered between two jobs), or
``string`` and ``large_string``, ``binary`` and ``large_binary``, ``list`` and
``large_list``, which hold the same values with 32- or 64-bit offsets (polars writes the
large kinds where pyarrow and pandas write the small ones). The stream's schema (the first
shard's) decides; a shard that differs from it only so agrees (:func:`same_values`, in
:func:`ingest.formats.base.check_schema`) and is read through :class:`ConformingReader`,
which puts each batch's columns in the stream's order and casts them to its types
(:func:`ingest.formats.open_reader`). Written here because pyarrow's schema unification
(``promote_options="permissive"``) picks the large kinds, where a stream keeps its first
shard's.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ingest.formats.base import MappedReader, ReadContext, ShardReader

_FAMILIES = (
    (pa.types.is_string, pa.types.is_large_string),
    (pa.types.is_binary, pa.types.is_large_binary),
)


def same_values(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether ``a`` and ``b`` hold the same values, offset widths aside (nested types
    compared member by member; list item names aside)."""
    if a.equals(b) or any(
        (small(a) or large(a)) and (small(b) or large(b)) for small, large in _FAMILIES
    ):
        return True
    if _is_list(a) and _is_list(b):
        return same_values(a.value_type, b.value_type)
    if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
        return a.list_size == b.list_size and same_values(a.value_type, b.value_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(
            same_values(x.type, y.type) for x, y in zip(a, b, strict=True)
        )
    if pa.types.is_map(a) and pa.types.is_map(b):
        return same_values(a.key_type, b.key_type) and same_values(a.item_type, b.item_type)
    return False


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def casts(
    schema: pa.Schema, expected: pa.Schema, columns: Sequence[str] | None
) -> dict[str, pa.DataType]:
    """The columns of a shard of ``schema`` (of ``columns``, None: all) whose type is not
    ``expected``'s but holds the same values: each to the stream's type."""
    names = expected.names if columns is None else [c for c in columns if c in expected.names]
    out = {}
    for name in names:
        if name in schema.names:
            got, want = schema.field(name).type, expected.field(name).type
            if not got.equals(want) and same_values(got, want):
                out[name] = want
    return out


def reorders(schema: pa.Schema, expected: pa.Schema, columns: Sequence[str] | None) -> bool:
    """Whether a shard of ``schema`` gives the stream's columns (``columns``, None: all of
    ``expected``) in another order than the stream's: its reader reads all of them in its
    own order (a format reads the columns asked for in the order it has them)."""
    if columns is not None:
        return False  # a reader keeps the order ``columns`` names (check_columns, select)
    return bool([n for n in schema.names if n in expected.names] != expected.names)


class ConformingReader(MappedReader):
    """A format's reader whose batches' columns come in ``order`` (None: as read) and those
    named in ``casts`` cast to the type given (the stream's)."""

    def __init__(
        self,
        ctx: ReadContext,
        inner: ShardReader,
        casts: dict[str, pa.DataType],
        order: Sequence[str] | None,
    ) -> None:
        super().__init__(ctx, inner)
        self._casts = casts
        self._order = None if order is None else list(order)

    def mapped(self, data: pa.RecordBatch) -> pa.RecordBatch:
        if self._order is not None:
            data = data.select(self._order)
        if not self._casts:
            return data
        arrays = list(data.columns)
        fields = list(data.schema)
        for i, field in enumerate(fields):
            want = self._casts.get(field.name)
            if want is not None:
                arrays[i] = arrays[i].cast(want)
                fields[i] = field.with_type(want)
        schema = pa.schema(fields, metadata=data.schema.metadata)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


__all__ = ["ConformingReader", "casts", "reorders", "same_values"]
