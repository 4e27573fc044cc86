"""Shards whose types differ without their values differing are one stream, in the type
that holds them all: a column that is all null in one shard (pandas writes ``null`` for a
column of ``None``), a pandas categorical beside plain strings, ``int32`` beside ``int64``,
``float32`` beside ``float64``, timestamps in ``ms`` beside ``us``. ``datasets`` and
pyarrow's datasets cast every file to the first file's types (a first shard of ``null``
refuses every other); Ray Data promotes. Before, each of these was refused whole
("column 't' is null, not string"). Types that no type holds without loss (``int64``
beside ``double``: pandas writes an int column with a missing value as ``double``) are
refused as before, with a fix that helps: declare the type with ``ReadOptions(schema=)``."""

from __future__ import annotations

import datetime
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ingest
from ingest.core.errors import ConfigError, SchemaMismatchError, ShardError
from ingest.formats.base import ReadOptions
from ingest.formats.conform import cast_checked, holds, same_values, widened
from ingest.testing import Store, encode
from tests.resumed import through_a_resume

# -- the rule (no store) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        (pa.null(), pa.string(), pa.string()),
        (pa.large_string(), pa.null(), pa.large_string()),
        (pa.dictionary(pa.int8(), pa.string()), pa.string(), pa.string()),
        (
            pa.dictionary(pa.int8(), pa.string()),
            pa.dictionary(pa.int8(), pa.string()),
            pa.dictionary(pa.int8(), pa.string()),
        ),
        (
            pa.dictionary(pa.int8(), pa.string()),
            pa.dictionary(pa.int32(), pa.string()),
            pa.string(),
        ),
        (pa.int32(), pa.int64(), pa.int64()),
        (pa.int64(), pa.int8(), pa.int64()),
        (pa.uint8(), pa.int8(), pa.int16()),
        (pa.uint32(), pa.int32(), pa.int64()),
        (pa.uint16(), pa.uint32(), pa.uint32()),
        (pa.uint64(), pa.int64(), None),  # no integer holds both
        (pa.float32(), pa.float64(), pa.float64()),
        (pa.int16(), pa.float32(), pa.float32()),
        (pa.int32(), pa.float32(), pa.float64()),  # float32 has 24 bits of mantissa
        (pa.int64(), pa.float64(), None),  # 2**53 + 1 is no double
        (pa.timestamp("ms"), pa.timestamp("us"), pa.timestamp("us")),
        (pa.timestamp("ns", "UTC"), pa.timestamp("s", "UTC"), pa.timestamp("ns", "UTC")),
        (pa.timestamp("ms", "UTC"), pa.timestamp("ms"), None),  # another meaning
        (pa.list_(pa.int32()), pa.list_(pa.int64()), pa.list_(pa.int64())),
        (pa.large_list(pa.null()), pa.list_(pa.string()), pa.large_list(pa.string())),
        (pa.list_(pa.int8(), 2), pa.list_(pa.int16(), 2), pa.list_(pa.int16(), 2)),
        (pa.list_(pa.int8(), 2), pa.list_(pa.int8(), 3), None),
        (
            pa.struct([("a", pa.int8()), ("b", pa.null())]),
            pa.struct([("a", pa.int32()), ("b", pa.string())]),
            pa.struct([("a", pa.int32()), ("b", pa.string())]),
        ),
        (pa.struct([("a", pa.int8())]), pa.struct([("b", pa.int8())]), None),
        (pa.list_(pa.struct([])), pa.large_list(pa.null()), pa.list_(pa.struct([]))),
        (pa.list_(pa.struct([]), 2), pa.list_(pa.null(), 2), pa.list_(pa.struct([]), 2)),
        (pa.string(), pa.int64(), None),
        (pa.string(), pa.binary(), None),
        (pa.bool_(), pa.int8(), None),
    ],
)
def test_the_type_that_holds_both_without_loss(
    a: pa.DataType, b: pa.DataType, both: pa.DataType | None
) -> None:
    for x, y in ((a, b), (b, a)):
        got = widened(x, y)
        if both is None:
            assert got is None, (x, y, got)
            continue
        assert got is not None and same_values(got, both), (x, y, got)
        assert holds(got, x) and holds(got, y)
    # Offset widths are the first type's, as the stream keeps its first shard's.
    assert widened(pa.large_string(), pa.string()) == pa.large_string()
    assert widened(pa.string(), pa.large_string()) == pa.string()
    assert not holds(pa.int32(), pa.int64()) and holds(pa.int64(), pa.int32())


# -- streams ------------------------------------------------------------------------------


def _write(store: Store, path: str, table: pa.Table, fmt: str) -> None:
    store.write(path, encode(table, fmt))


@pytest.mark.parametrize("null_first", [True, False])
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_column_all_null_in_some_shards_reads_in_the_others_type(
    local: Store, fmt: str, null_first: bool
) -> None:
    """pandas and pyarrow write a column of ``None`` as ``null`` (``pa.table`` infers it
    as ``pa.Table.from_pandas`` does): a shard whose comments are all missing. Either
    first, the stream reads the column as the other shards' strings."""
    for n in range(4):
        ids = list(range(n * 10, n * 10 + 10))
        empty = (n % 2 == 0) == null_first
        comments = [None] * 10 if empty else [f"c{i}" for i in ids]
        table = pa.table({"id": ids, "comment": comments})
        assert table.schema.field("comment").type == (pa.null() if empty else pa.string())
        _write(local, f"d/{n}.{fmt}", table, fmt)
    got: dict[int, Any] = {}
    for batch in ingest.Stream(local.url("d"), batch_size=8, shuffle_seed=2):
        got.update(zip(batch["id"].tolist(), batch["comment"], strict=True))
    empty_ids = {
        i for n in range(4) if (n % 2 == 0) == null_first for i in range(n * 10, n * 10 + 10)
    }
    assert got == {i: None if i in empty_ids else f"c{i}" for i in range(40)}


def _kinds(first: int, narrow: bool) -> pa.Table:
    ids = list(range(first, first + 25))
    return pa.table(
        {
            "id": ids,
            "n": pa.array(ids, pa.int32() if narrow else pa.int64()),
            "f": pa.array([i / 4 for i in ids], pa.float32() if narrow else pa.float64()),
            "ts": pa.array([i * 1000 for i in ids], pa.timestamp("ms"))
            if narrow
            else pa.array([i * 1_000_000 for i in ids], pa.timestamp("us")),
            "l": pa.array([[i, -i] for i in ids], pa.list_(pa.int16() if narrow else pa.int64())),
            "c": pa.array([f"k{i % 3}" for i in ids]).dictionary_encode()
            if narrow
            else pa.array([f"k{i % 3}" for i in ids]),
        }
    )


@pytest.mark.parametrize("narrow_first", [True, False])
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_shards_of_narrower_and_wider_kinds_read_in_the_wider(
    local: Store, fmt: str, narrow_first: bool
) -> None:
    for n in range(4):
        _write(local, f"k/{n}.{fmt}", _kinds(n * 25, (n % 2 == 0) == narrow_first), fmt)
    got: dict[int, Any] = {}
    for batch in ingest.Stream(local.url("k"), batch_size=10, shuffle_seed=5):
        assert batch["n"].dtype == torch.int64 and batch["f"].dtype == torch.float64
        assert batch["ts"].dtype == torch.int64
        assert all(pair.dtype == torch.int64 for pair in batch["l"])  # a list: one per row
        rows = zip(
            batch["id"].tolist(),
            batch["n"].tolist(),
            batch["f"].tolist(),
            batch["ts"].tolist(),
            [pair.tolist() for pair in batch["l"]],
            batch["c"],
            strict=True,
        )
        got.update((i, rest) for i, *rest in rows)
    # Timestamps are ticks of the finer unit (us) in every row.
    assert got == {i: [i, i / 4, i * 1_000_000, [i, -i], f"k{i % 3}"] for i in range(100)}


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.parametrize("required_first", [True, False])
def test_shards_that_differ_in_nullability_alone_read_as_one_schema(
    local: Store, fmt: str, required_first: bool
) -> None:
    """Spark writes a column no row leaves empty as ``required`` (``not null``), pandas and
    pyarrow as nullable: shards of both crashed the window's table with a bare pyarrow
    error (Schema at index 1 was different: id: int64 not null vs id: int64), named or
    declared columns too. The stream's column is nullable where any shard's is."""
    required = pa.schema([pa.field("id", pa.int64(), nullable=False), ("x", pa.string())])
    for n in range(4):
        rows = {"id": list(range(n * 10, n * 10 + 10)), "x": [f"r{n}"] * 10}
        nullable = (n % 2 == 1) == required_first
        table = pa.table(rows) if nullable else pa.table(rows, schema=required)
        _write(local, f"nn/{n}.{fmt}", table, fmt)
    declared = ReadOptions(schema=pa.schema([("id", pa.int64()), ("x", pa.string())]))
    for options in ({}, {"columns": ["id"]}, {"read": declared}):
        stream = ingest.Stream(local.url("nn"), batch_size=8, shuffle_seed=1, **options)
        assert sorted(i for b in stream for i in b["id"].tolist()) == list(range(40)), options
    resumed = through_a_resume(local.url("nn"), 2, batch_size=8, shuffle_seed=1)
    assert sorted(resumed) == list(range(40))


def _int_and_double(store: Store, fmt: str = "parquet") -> None:
    """pandas: an int column, and the same column with a missing value (``double``)."""
    store.write(f"p/0.{fmt}", encode(pa.table({"id": [0, 1], "n": [5, 6]}), fmt))
    store.write(f"p/1.{fmt}", encode(pa.table({"id": [2, 3], "n": [None, 7.0]}), fmt))


def test_types_no_type_holds_without_loss_are_refused_with_the_fix(local: Store) -> None:
    _int_and_double(local)
    with pytest.raises(SchemaMismatchError) as e:
        list(ingest.Stream(local.url("p"), batch_size=2))
    text = str(e.value)
    assert "p/1.parquet" in text and "column 'n' is double, not int64" in text
    assert "ReadOptions(schema=" in text  # the fix that helps


def test_a_declared_schema_casts_each_shard_and_names_a_value_it_cannot_hold(
    local: Store,
) -> None:
    _int_and_double(local)
    schema = pa.schema([("id", pa.int64()), ("n", pa.float64())])
    read = ReadOptions(schema=schema)

    def fill(t: pa.Table) -> pa.Table:
        return t.set_column(1, "n", pc.fill_null(t.column("n"), -1.0))

    got: dict[int, Any] = {}
    for batch in ingest.Stream(local.url("p"), batch_size=2, read=read, transform=fill):
        assert batch["n"].dtype == torch.float64
        got.update(zip(batch["id"].tolist(), batch["n"].tolist(), strict=True))
    assert got == {0: 5.0, 1: 6.0, 2: -1.0, 3: 7.0}
    # A value the declared type cannot hold is named, not rounded.
    local.write("p/2.parquet", encode(pa.table({"id": [4], "n": [2**53 + 1]}), "parquet"))
    with pytest.raises(ShardError) as e:
        list(ingest.Stream(local.url("p"), batch_size=1, read=read, transform=fill))
    text = str(e.value)
    assert "p/2.parquet" in text and "'n'" in text and "double" in text
    # A declared type no cast reaches is refused when listed, naming the column.
    odd = pa.schema([("id", pa.int64()), ("n", pa.list_(pa.int64()))])
    with pytest.raises(SchemaMismatchError, match=r"column 'n' is (int64|double)"):
        list(ingest.Stream(local.url("p"), batch_size=2, read=ReadOptions(schema=odd)))


_NOON = datetime.datetime(2020, 1, 1, 12, 30)
_MIDNIGHT = datetime.datetime(2020, 1, 2)


@pytest.mark.parametrize(
    ("values", "kind", "declared", "fits"),
    [
        ([1e300, 0.5], pa.float64(), pa.float32(), False),  # was inf
        ([70000.0], pa.float64(), pa.float16(), False),  # was inf
        ([2, 0], pa.int64(), pa.bool_(), False),  # was True
        ([_NOON], pa.timestamp("s"), pa.date32(), False),  # its time of day was dropped
        ([0.1, float("inf"), float("nan"), None], pa.float64(), pa.float32(), True),
        ([1, 0, None], pa.int64(), pa.bool_(), True),
        ([_MIDNIGHT, None], pa.timestamp("s"), pa.date32(), True),
    ],
    ids=["overflow-f32", "overflow-f16", "int-to-bool", "time-of-day", "f32", "bool", "date"],
)
def test_a_declared_cast_pyarrow_does_not_check_is_checked(
    local: Store, values: list[Any], kind: pa.DataType, declared: pa.DataType, fits: bool
) -> None:
    """pyarrow's safe cast checks integers and truncation, not a float made infinite, an
    integer made a bool or a timestamp made a date: each was read as another value, where
    the docs promise an error naming the shard and the column. A float narrowed rounds, as
    its type does; its infinities and NaNs stay."""
    array = pa.array(values, kind)
    if fits:
        got, want = cast_checked(array, declared), array.cast(declared)
        assert repr(got.to_pylist()) == repr(want.to_pylist())  # (NaN is no NaN's equal)
        return
    local.write("c/0.parquet", encode(pa.table({"x": array}), "parquet"))
    read = ReadOptions(schema=pa.schema([("x", declared)]))
    with pytest.raises(ShardError, match=r"c/0.parquet.*column 'x' .* does not fit") as e:
        list(ingest.Stream(local.url("c"), batch_size=len(values), read=read))
    assert "ReadOptions(schema=" in str(e.value)


def test_a_resume_inside_a_window_and_a_dataloader_are_exactly_once(local: Store) -> None:
    for n in range(4):
        _write(local, f"k/{n}.parquet", _kinds(n * 25, n % 2 == 1), "parquet")
    kwargs: dict[str, Any] = {"batch_size": 10, "shuffle_seed": 1, "shuffle_window": 40}
    assert sorted(through_a_resume(local.url("k"), 3, **kwargs)) == list(range(100))
    loader = ingest.DataLoader(ingest.Stream(local.url("k"), **kwargs), num_workers=2)
    try:
        seen = []
        for batch in loader:
            assert batch["n"].dtype == torch.int64
            seen += batch["id"].tolist()
    finally:
        loader.close()
    assert sorted(seen) == list(range(100))


class Times(ingest.Stage):
    """``m = n * 1000``, in ``n``'s type."""

    def fingerprint(self) -> str:
        return "times 1000, 1"

    def __call__(self, table: pa.Table) -> ingest.Staged:
        n = table.column("n")
        m = pc.multiply(n, pa.scalar(1000, n.type))
        return ingest.Staged(table.append_column("m", m), np.arange(table.num_rows))


def test_a_derived_copy_is_keyed_with_the_types_its_rows_were_read_in(
    local: Store, tmp_path: Any
) -> None:
    """A copy made while a shard's column was the stream's ``int32`` is not read once a
    new shard makes the stream ``int64``: the stage made it of ``int32`` rows (its ``m`` is
    ``int32``), where the stream now reads ``int64``."""
    kwargs: dict[str, Any] = {"transform": Times(), "derived": f"file://{tmp_path}/derived"}
    local.write("g/0.parquet", encode(pa.table({"n": pa.array([1, 2], pa.int32())}), "parquet"))
    (made,) = list(ingest.Stream(local.url("g"), batch_size=2, **kwargs))
    assert made["m"].dtype == torch.int32
    local.write("g/1.parquet", encode(pa.table({"n": pa.array([3, 4], pa.int64())}), "parquet"))
    (batch,) = list(ingest.Stream(local.url("g"), batch_size=4, **kwargs))
    assert batch["m"].dtype == torch.int64
    assert sorted(batch["m"].tolist()) == [1000, 2000, 3000, 4000]


_NUMBERS = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
]
_UNITS = [pa.timestamp(u, tz) for u in ("s", "ms", "us", "ns") for tz in (None, "UTC")]


def _extremes(t: pa.DataType) -> list[Any]:
    """Values of ``t`` at its edges and between (ints at their bounds, floats with the
    largest and the smallest normal, timestamps across their range)."""
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        return [int(info.min), int(info.max), 0, -1 if info.min < 0 else 1, int(info.max) // 3]
    if pa.types.is_floating(t):
        real = np.finfo(t.to_pandas_dtype())
        return [float(real.max), float(real.min), float(real.tiny), 0.1, -1.5, None]
    return [0, 1, -1, 10**9, -(10**9), None]  # timestamps: ticks, within 2262 in ns


@settings(max_examples=200, deadline=None)
@given(a=st.sampled_from(_NUMBERS + _UNITS), b=st.sampled_from(_NUMBERS + _UNITS))
def test_every_value_of_either_type_survives_the_type_that_holds_both(
    a: pa.DataType, b: pa.DataType
) -> None:
    """Lossless is checked, not assumed: each type's extreme values cast to the widened type
    (pyarrow's safe cast, as a shard is read) and back give the same values. Timestamps
    widen to the finer unit, whose range is shorter (``ns``: the years 1677 to 2262): a
    value past it is an error, never a value wrapped."""
    both = widened(a, b)
    if both is None:
        return
    for t in (a, b):
        if pa.types.is_float16(t) and not pa.types.is_float16(both):
            values = pa.array(np.array([65504.0, -65504.0, 6.1e-05, 0.5], np.float16))
        else:
            values = pa.array(_extremes(t), t)
        there = values.cast(both)  # safe: raises where a value would change
        assert there.cast(t).equals(values), (t, both)
    if pa.types.is_timestamp(both) and both.unit == "ns" and a.unit != "ns":
        with pytest.raises(pa.ArrowInvalid, match="out of bounds"):
            pa.array([2**62], a).cast(both)


@pytest.mark.parametrize(
    ("fmt", "first", "later", "ids"),
    [
        (
            "jsonl",
            b'{"id": 1, "note": null}\n{"id": 2, "note": null}\n',
            b'{"id": 3, "note": "hi"}\n',
            [1, 2, 3],
        ),
        ("jsonl", b'{"id": 1, "note": 5}\n', b'{"id": 3, "note": 1.5}\n', [1, 3]),
        ("csv", b"id,note\n1,\n2,\n", b"id,note\n3,hi\n", [1, 2, 3]),
        ("csv", b"id,note\n1,5\n", b"id,note\n3,1.5\n", [1, 3]),
    ],
)
def test_a_later_shard_of_a_wider_type_names_the_schema_that_reads_both(
    local: Store, fmt: str, first: bytes, later: bytes, ids: list[int]
) -> None:
    """JSON Lines and CSV infer their types from the first shard's first block: a column null
    in every row of it (an optional field) is null, and a later shard's strings are refused
    ("changed from null to string"). The error now gives the declared schema that reads
    both, to paste: pasted, it reads every row."""
    local.write(f"s/a.{fmt}", first)
    local.write(f"s/b.{fmt}", later)
    with pytest.raises(ShardError) as e:
        list(ingest.Stream(local.url("s"), batch_size=1))
    said = re.search(r"ReadOptions\(schema=pa\.schema\(\[.*?\]\)\)", str(e.value))
    assert said is not None, str(e.value)
    read = eval(said[0], {"pa": pa, "ReadOptions": ReadOptions})  # the message's own text
    stream = ingest.Stream(local.url("s"), batch_size=1, read=read)
    assert sorted(i for b in stream for i in b["id"].tolist()) == ids


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_column_added_in_later_shards_reads_null_where_a_schema_declares_it(
    local: Store, fmt: str
) -> None:
    """A dataset whose later shards gained a column (a feature added to the pipeline): the
    earlier shards lack it, and the stream refused them ("missing column 'lang'"). Declared
    in ``ReadOptions(schema=...)``, it reads as null where a shard lacks it, as pyarrow's
    datasets read a declared schema; a column no declared field names is left out. A
    declared column that no shard holds (a typo) is refused."""
    for n in range(4):
        table = pa.table({"id": list(range(n * 10, n * 10 + 10)), "text": ["t"] * 10})
        if n >= 2:
            table = table.append_column("lang", pa.array(["en"] * 10))
        _write(local, f"g/{n}.{fmt}", table, fmt)
    with pytest.raises(
        SchemaMismatchError, match=r"(missing|extra) column 'lang'.*ReadOptions\(schema=.*null"
    ):
        list(ingest.Stream(local.url("g"), batch_size=10))
    schema = pa.schema([("id", pa.int64()), ("lang", pa.string())])
    read = ReadOptions(schema=schema)
    got: dict[int, Any] = {}
    for batch in ingest.Stream(local.url("g"), batch_size=5, shuffle_seed=1, read=read):
        assert list(batch) == ["id", "lang"]  # text: declared by no field, left out
        got.update(zip(batch["id"].tolist(), batch["lang"], strict=True))
    assert got == {i: "en" if i >= 20 else None for i in range(40)}
    some = ingest.Stream(local.url("g"), batch_size=10, read=read, columns=["lang", "id"])
    assert sorted(i for b in some for i in b["id"].tolist()) == list(range(40))
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle_seed": 2, "read": read}
    assert sorted(through_a_resume(local.url("g"), 3, **kwargs)) == list(range(40))
    typo = ReadOptions(schema=pa.schema([("id", pa.int64()), ("lagn", pa.string())]))
    with pytest.raises(ConfigError, match=r"'lagn'.*no shard"):
        list(ingest.Stream(local.url("g"), batch_size=10, read=typo))


def test_a_derived_copy_is_keyed_with_the_declared_schema(local: Store, tmp_path: Any) -> None:
    """JSON Lines are parsed in the declared types: a copy made of ``int64`` rows is not read
    once the schema declares ``float64``."""
    local.write("j/a.jsonl", b'{"n": 1}\n{"n": 2}\n')
    derived = f"file://{tmp_path}/derived"
    for t, dtype in ((pa.int64(), torch.int64), (pa.float64(), torch.float64)):
        read = ReadOptions(schema=pa.schema([("n", t)]))
        stream = ingest.Stream(
            local.url("j"), batch_size=2, read=read, transform=Times(), derived=derived
        )
        (batch,) = list(stream)
        assert batch["m"].dtype == dtype
