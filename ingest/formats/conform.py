"""A shard's batches in the stream's schema: its columns' order and types.

Shards written by several tools or jobs hold the same columns and values in other forms:
the columns in another order (a DataFrame's columns reordered between two jobs), ``string``
and ``large_string`` (polars writes the large kinds where pyarrow and pandas write the small
ones), a column all ``None`` in one shard (``null``), a pandas categorical (a dictionary)
beside plain strings, ``int32`` beside ``int64``, timestamps in ``ms`` beside ``us``. The
stream's type of each column is the one that holds every shard's values without loss
(:func:`widened`, over the footers the listing reads anyway: the first shard's where it
does); a shard whose types it holds agrees (:func:`holds`, in
:func:`ingest.formats.base.check_schema`) and is read through :class:`ConformingReader`,
which puts each batch's columns in the stream's order and casts them to its types, each
value checked (:func:`ingest.formats.open_reader`). A declared schema
(``ReadOptions(schema=...)``) casts every shard to it where pyarrow casts (:func:`reads_as`).
Written here because pyarrow's schema unification (``promote_options="permissive"``) picks
the large kinds and widens with loss (``int64`` and ``double`` to ``double``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.errors import ShardError
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


def widened(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type that holds every value of ``a`` and every value of ``b`` unchanged (``a``'s
    offset widths and list kinds kept, as a stream keeps its first shard's), or None where
    none does: ``null`` and any type; a dictionary and its values' type (decoded); integers
    of other widths or signs (``uint64`` and a signed one: none); floats of other widths; an
    integer and a float whose mantissa holds it (``int64`` and ``double``: none, 2**53 + 1 is
    no double); timestamps of one time zone in other units (the finer, whose range is
    shorter: a value past it, after 2262 in ``ns``, is an error when read); lists, fixed-size
    lists of one size, maps and structs of the same fields, member by member.

    Written here because pyarrow's ``unify_schemas(promote_options="permissive")`` widens
    with loss (``int64`` and ``double`` to ``double``) and to the large offset kinds."""
    if same_values(a, b) or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_dictionary(a) or pa.types.is_dictionary(b):
        return widened(_decoded(a), _decoded(b))
    if _is_number(a) and _is_number(b):
        return _number(a, b)
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return (a if _TICKS[a.unit] >= _TICKS[b.unit] else b) if a.tz == b.tz else None
    return _nested(a, b)


def holds(wide: pa.DataType, narrow: pa.DataType) -> bool:
    """Whether every value of ``narrow`` is one of ``wide`` (read cast, or as it is)."""
    both = widened(wide, narrow)
    return both is not None and same_values(both, wide)


_TICKS = {"s": 0, "ms": 1, "us": 2, "ns": 3}
_MANTISSA = ((pa.float16(), 11), (pa.float32(), 24), (pa.float64(), 53))


def _decoded(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


def _bits(t: pa.DataType) -> int:
    """The bits of an integer type's magnitude (``int8``: 7, ``uint8``: 8)."""
    return int(t.bit_width) - (1 if pa.types.is_signed_integer(t) else 0)


def _number(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    if pa.types.is_floating(a) and pa.types.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        bits = max(_bits(a), _bits(b))
        if not (pa.types.is_signed_integer(a) or pa.types.is_signed_integer(b)):
            return a if a.bit_width >= b.bit_width else b
        widths = [w for w in (8, 16, 32, 64) if w - 1 >= bits]
        return getattr(pa, f"int{widths[0]}")() if widths else None
    whole, real = (a, b) if pa.types.is_integer(a) else (b, a)
    for t, mantissa in _MANTISSA:
        if t.bit_width >= real.bit_width and mantissa >= _bits(whole):
            return t
    return None


def _nested(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """:func:`widened` of two lists, fixed-size lists, maps or structs; None of others."""
    # Tested against None, never for truth: a struct of no fields is a falsy type.
    if _is_list(a) and _is_list(b):
        item = widened(a.value_type, b.value_type)
        if item is None:
            return None
        field = a.value_field.with_type(item)
        return pa.large_list(field) if pa.types.is_large_list(a) else pa.list_(field)
    if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
        item = widened(a.value_type, b.value_type) if a.list_size == b.list_size else None
        return None if item is None else pa.list_(a.value_field.with_type(item), a.list_size)
    if pa.types.is_map(a) and pa.types.is_map(b):
        key, value = widened(a.key_type, b.key_type), widened(a.item_type, b.item_type)
        return None if key is None or value is None else pa.map_(key, value)
    if pa.types.is_struct(a) and pa.types.is_struct(b) and a.names == b.names:
        members = [widened(x.type, y.type) for x, y in zip(a, b, strict=True)]
        if all(m is not None for m in members):
            return pa.struct([f.with_type(m) for f, m in zip(a, members, strict=True)])
    return None


def widened_schema(
    schema: pa.Schema, other: pa.Schema, columns: Sequence[str] | None
) -> pa.Schema | None:
    """``schema`` (a stream's) with each of its columns (of ``columns``, None: all) widened
    to hold ``other``'s (a shard's): the same object where none changes, None where some
    column's types have no :func:`widened` (the shard is refused: check_schema)."""
    changed, nullable = {}, set()
    for name in schema.names if columns is None else columns:
        if name in schema.names and name in other.names:
            mine, theirs = schema.field(name).type, other.field(name).type
            both = widened(mine, theirs)
            if both is None:
                return None
            if not same_values(both, mine):
                changed[name] = both
            if other.field(name).nullable and not schema.field(name).nullable:
                nullable.add(name)  # (Spark writes 'required' columns, pandas nullable ones)
    if not changed and not nullable:
        return schema
    fields = [f.with_type(changed[f.name]) if f.name in changed else f for f in schema]
    fields = [f.with_nullable(True) if f.name in nullable else f for f in fields]
    return pa.schema(fields, metadata=schema.metadata)


def relabels(schema: pa.Schema, expected: pa.Schema) -> bool:
    """Whether a shard of ``schema`` has a column the stream's schema (``expected``) takes
    as nullable and the shard does not (``not null``, as Spark writes a column no row
    leaves empty): its batches are labelled nullable (:class:`ConformingReader`), or a
    window's table of its batches and another shard's would not make one schema."""
    return any(
        not f.nullable and expected.field(f.name).nullable
        for f in schema
        if f.name in expected.names
    )


def reads_as(got: pa.DataType, want: pa.DataType, *, declared: bool) -> bool:
    """Whether a shard's column of type ``got`` is read as the stream's ``want``: a type
    that holds its values (:func:`holds`), or, ``declared`` (``ReadOptions(schema=...)``),
    any type pyarrow casts it to (each value checked as it is read)."""
    if holds(want, got):
        return True
    if not declared:
        return False
    try:
        pa.nulls(0, got).cast(want)  # (pa.array would import pandas)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True


def casts(
    schema: pa.Schema,
    expected: pa.Schema,
    columns: Sequence[str] | None,
    *,
    declared: bool = False,
) -> dict[str, pa.DataType]:
    """The columns of a shard of ``schema`` (of ``columns``, None: all) whose type is not
    ``expected``'s but is read as it (:func:`reads_as`): each to the stream's type."""
    names = expected.names if columns is None else [c for c in columns if c in expected.names]
    out = {}
    for name in names:
        if name in schema.names:
            got, want = schema.field(name).type, expected.field(name).type
            if not got.equals(want) and reads_as(got, want, declared=declared):
                out[name] = want
    return out


def absent(
    schema: pa.Schema, expected: pa.Schema, columns: Sequence[str] | None, declared: bool
) -> dict[str, pa.DataType]:
    """The columns of a declared schema (``expected``, of ``columns``, None: all) that a
    shard of ``schema`` lacks, each with its type: read as nulls. Empty where the schema is
    not declared (a shard that lacks one is refused: check_schema)."""
    if not declared:
        return {}
    names = expected.names if columns is None else [c for c in columns if c in expected.names]
    return {n: expected.field(n).type for n in names if n not in schema.names}


def reorders(schema: pa.Schema, expected: pa.Schema, columns: Sequence[str] | None) -> bool:
    """Whether a shard of ``schema`` gives the stream's columns (``columns``, None: all of
    ``expected``) in another order than the stream's: its reader reads all of them in its
    own order (a format reads the columns asked for in the order it has them)."""
    if columns is not None:
        return False  # a reader keeps the order ``columns`` names (check_columns, select)
    return bool([n for n in schema.names if n in expected.names] != expected.names)


def declaration(stream: pa.Schema, seen: pa.Schema) -> str | None:
    """For a record of types ``seen`` that the stream's inferred ``stream`` schema does not
    read (a column null in every row it was inferred from, an int column with a float
    later): the ``ReadOptions(schema=...)`` that reads both, each column of the stream in
    the type that holds both (:func:`widened`; an integer and a float: ``float64``, as
    pyarrow promotes them; an integer and ``uint64``, a value past int64's range:
    ``uint64``, not a double that rounds it), as Python to paste; None where some column
    has no such type, or none differs."""
    fields, changed = [], False
    for f in stream:
        t = f.type
        if f.name in seen.names:
            other = seen.field(f.name).type
            both = widened(t, other)
            if both is None and _is_number(t) and _is_number(other):
                both = _declared_number(t, other)
            if both is None:
                return None
            changed = changed or not both.equals(t)
            t = both
        fields.append(f"({f.name!r}, {_python(t)})")
    if not changed:
        return None
    return f"ReadOptions(schema=pa.schema([{', '.join(fields)}]))"


def _declared_number(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    """The type :func:`declaration` declares for numbers of types ``a`` and ``b`` that no
    type holds both of (:func:`widened` gave none): ``uint64`` for an integer and
    ``uint64`` (integers past int64: ids, hashes, whose negatives are rare; a negative one
    is then refused by its row), else ``float64``, as pyarrow promotes them."""
    if pa.types.is_integer(a) and pa.types.is_integer(b) and pa.uint64() in (a, b):
        return pa.uint64()
    return pa.float64()


_NAMED = {"double": "float64", "float": "float32", "halffloat": "float16", "bool": "bool_"}


def _python(t: pa.DataType) -> str:
    """``t`` as the pyarrow call that makes it (``pa.list_(pa.int64())``)."""
    if pa.types.is_timestamp(t):
        return f"pa.timestamp({t.unit!r}{'' if t.tz is None else f', {t.tz!r}'})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = "large_list" if pa.types.is_large_list(t) else "list_"
        return f"pa.{kind}({_python(t.value_type)})"
    if pa.types.is_struct(t):
        inner = ", ".join(f"({f.name!r}, {_python(f.type)})" for f in t)
        return f"pa.struct([{inner}])"
    name = str(t)
    return f"pa.{_NAMED.get(name, name)}()"


def cast_checked(array: pa.Array, want: pa.DataType) -> pa.Array:
    """``array`` cast to ``want``, every value checked: pyarrow's safe cast checks integers
    and truncation; a float made infinite (``1e300`` as ``float32``), an integer made a bool
    (``2``) or a timestamp made a date (its time of day) are checked here, by the values
    they had. A float narrowed rounds, as its type does. Nested types: pyarrow's checks.

    Raises:
        pyarrow.ArrowInvalid: If a value does not fit ``want``.
    """
    out = array.cast(want)
    t = array.type
    narrower = pa.types.is_decimal(t) or (
        pa.types.is_floating(t) and want.bit_width < t.bit_width
    )  # (a float widened cannot overflow: no pass over it)
    if pa.types.is_floating(want) and narrower:
        made = pc.is_inf(out)
        if pa.types.is_floating(t):
            made = pc.and_(made, pc.invert(pc.is_inf(array)))
        lost = pc.any(made).as_py()
    elif _round_trips(t, want):
        lost = pc.any(pc.not_equal(out.cast(t), array)).as_py()
    else:
        return out
    if lost:
        raise pa.ArrowInvalid(f"a value of {t} is another value as {want}")
    return out


def _round_trips(t: pa.DataType, want: pa.DataType) -> bool:
    """Whether a cast from ``t`` to ``want`` is checked by casting back: an integer to a
    bool, a timestamp to a date."""
    if pa.types.is_boolean(want):
        return bool(pa.types.is_integer(t))
    return bool(pa.types.is_date(want) and pa.types.is_timestamp(t))


class ConformingReader(MappedReader):
    """A format's reader whose batches' columns come in ``order`` (None: as read), those
    named in ``casts`` cast to the type given (the stream's), and those in ``nulls`` (a
    declared schema's that the shard lacks) added as nulls of the type given."""

    def __init__(
        self,
        ctx: ReadContext,
        inner: ShardReader,
        casts: dict[str, pa.DataType],
        order: Sequence[str] | None,
        nulls: dict[str, pa.DataType] | None = None,
    ) -> None:
        super().__init__(ctx, inner)
        self._casts = casts
        self._order = None if order is None else list(order)
        self._nulls = nulls or {}

    def mapped(self, data: pa.RecordBatch) -> pa.RecordBatch:
        for name, t in self._nulls.items():
            data = data.append_column(pa.field(name, t), pa.nulls(data.num_rows, t))
        if self._order is not None:
            data = data.select(self._order)
        expected = self.ctx.schema if self.ctx.schema is not None else data.schema
        relabel = relabels(data.schema, expected)
        if not self._casts and not relabel:
            return data
        arrays = list(data.columns)
        fields = list(data.schema)
        for i, field in enumerate(fields):
            want = self._casts.get(field.name)
            if want is not None:
                arrays[i] = self._cast(field, arrays[i], want)
                fields[i] = field.with_type(want)
            if relabel and not field.nullable and field.name in expected.names:
                fields[i] = fields[i].with_nullable(expected.field(field.name).nullable)
        schema = pa.schema(fields, metadata=data.schema.metadata)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _cast(self, field: pa.Field, array: pa.Array, want: pa.DataType) -> pa.Array:
        """``array`` as ``want``, every value checked (pyarrow's safe cast): one the type
        cannot hold (a declared ``double`` for ``2**53 + 1``, a ``ns`` timestamp past 2262)
        is an error naming the shard and the column, never a value rounded."""
        try:
            return cast_checked(array, want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ShardError(
                self.ctx.shard.url,
                f"column {field.name!r} ({field.type}) is read as {want}, the stream's type, "
                f"and a value does not fit: {e}",
                "declare a type that holds it with ReadOptions(schema=...), or fix the value",
            ) from None


__all__ = [
    "ConformingReader",
    "absent",
    "cast_checked",
    "casts",
    "declaration",
    "holds",
    "reads_as",
    "reorders",
    "same_values",
    "widened",
    "widened_schema",
]
