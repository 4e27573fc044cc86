"""Integers past int64 in JSON Lines and CSV come out exact, as ``uint64``: never rounded
through a double (:mod:`ingest.formats.big_integers`)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pj
import pytest
import torch

import ingest
from ingest.formats.conform import declaration
from ingest.testing import Store

BIG = 2**64 - 1
"""A 64-bit hash's largest value: a double holds 2**64, so BIG and BIG - 1 both read as it."""


def _exact(table: pa.Table, again: Any) -> pa.Table:
    from ingest.formats.big_integers import exact  # the rule's module

    return exact(table, again)


def _read_json(data: bytes) -> pa.Table:
    return pj.read_json(io.BytesIO(data))


def _json_again(data: bytes) -> Any:
    return lambda schema: pj.read_json(
        io.BytesIO(data), parse_options=pj.ParseOptions(explicit_schema=schema)
    )


def _values(batch: dict[str, Any], name: str) -> list[int]:
    return [int(v) for v in batch[name].tolist()]


def test_jsonl_integers_past_int64_are_read_exactly(local: Store) -> None:
    """Eight 64-bit hashes (``BIG - i``): pyarrow's reader infers ``double`` for a column
    with one past int64 and the Stream handed out eight equal floats, 1.8446744073709552e19,
    without a word (a dedup pipeline's hashes, unsigned ids). Now the column is ``uint64``,
    each value as written, in lists too, resumed exactly once."""
    lines = [{"id": i, "h": BIG - i, "small": i, "l": [BIG - i, i], "f": i + 0.5} for i in range(8)]
    local.write("d/a.jsonl", "".join(json.dumps(r) + "\n" for r in lines).encode())
    got: dict[int, tuple[int, list[int], float]] = {}
    for batch in ingest.Stream(local.url("d"), batch_size=4, shuffle_seed=1):
        assert batch["h"].dtype == torch.uint64
        assert batch["small"].dtype == torch.int64  # integers within int64 stay int64
        assert batch["f"].dtype == torch.float64
        for n, h, items, f in zip(
            _values(batch, "id"), _values(batch, "h"), batch["l"], batch["f"].tolist(), strict=True
        ):
            got[n] = (h, [int(v) for v in items.tolist()], f)
    assert got == {i: (BIG - i, [BIG - i, i], i + 0.5) for i in range(8)}


def test_csv_integers_past_int64_are_read_exactly(local: Store) -> None:
    """The same for CSV: pyarrow's CSV inference goes from int64 to double."""
    rows = "".join(f"{i},{BIG - i},{i}\n" for i in range(8))
    local.write("d/a.csv", ("id,h,small\n" + rows).encode())
    got: dict[int, int] = {}
    for batch in ingest.Stream(local.url("d"), batch_size=4):
        assert batch["h"].dtype == torch.uint64
        assert batch["small"].dtype == torch.int64
        got.update(zip(_values(batch, "id"), _values(batch, "h"), strict=True))
    assert got == {i: BIG - i for i in range(8)}


def test_integers_past_int64_in_a_later_shard_name_uint64_in_the_fix(local: Store) -> None:
    """The first shard's hashes fit int64, a later shard's do not: the later shard is
    refused (its type is not the stream's), and the fix it gave declared the column
    ``float64``, which reads it and rounds every hash. It declares ``uint64`` now."""
    local.write("d/a.jsonl", b"".join(b'{"id": %d, "h": %d}\n' % (i, i) for i in range(4)))
    local.write("d/b.jsonl", b"".join(b'{"id": %d, "h": %d}\n' % (i, BIG - i) for i in range(4)))
    with pytest.raises(ingest.SchemaMismatchError) as refused:
        list(ingest.Stream(local.url("d"), batch_size=4, shuffle_seed=None))
    assert "('h', pa.uint64())" in str(refused.value)
    assert "float64" not in str(refused.value)


def test_a_csv_record_past_int64_later_names_uint64_in_the_fix(local: Store) -> None:
    """The same for a CSV record after the block the types were inferred from."""
    rows = "".join(f"{i},{i}\n" for i in range(300)) + f"300,{BIG}\n"
    local.write("d/a.csv", ("id,h\n" + rows).encode())
    options = ingest.ReadOptions(block_bytes=1024)  # the big record is past the first block
    with pytest.raises(ingest.IngestError) as refused:
        list(ingest.Stream(local.url("d"), batch_size=7, shuffle_seed=None, read=options))
    assert "('h', pa.uint64())" in str(refused.value)
    assert "float64" not in str(refused.value)


def test_metadata_integers_past_int64_are_read_exactly(tmp_path: Path) -> None:
    """An image folder's ``metadata.jsonl`` (``datasets``' imagefolder layout) with a hash
    per image: read whole by pyarrow, its hashes were rounded the same way."""
    from PIL import Image

    root = tmp_path / "d"
    root.mkdir()
    for i in range(4):
        Image.new("RGB", (2, 2), (i, 0, 0)).save(root / f"{i}.png")
    rows = [{"file_name": f"{i}.png", "h": BIG - i} for i in range(4)]
    (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got: dict[str, int] = {}
    for batch in ingest.Stream(str(root) + "/", format="imagefolder", batch_size=2):
        assert batch["h"].dtype == torch.uint64
        got.update(zip(batch["path"], _values(batch, "h"), strict=True))
    assert {p.rsplit("/", 1)[1]: h for p, h in got.items()} == {
        f"{i}.png": BIG - i for i in range(4)
    }


# The rule, without a stream.


def test_exact_reads_doubles_of_integers_past_int64_as_uint64() -> None:
    data = b"".join(
        json.dumps({"h": BIG - i, "s": {"x": BIG, "y": 1.5}, "l": [[BIG]], "n": None}).encode()
        + b"\n"
        for i in range(3)
    )
    table = _exact(_read_json(data), _json_again(data))
    assert table.schema.field("h").type == pa.uint64()
    assert table.schema.field("s").type == pa.struct([("x", pa.uint64()), ("y", pa.float64())])
    assert table.schema.field("l").type == pa.list_(pa.list_(pa.uint64()))
    assert table.schema.field("n").type == pa.null()
    assert table.column("h").to_pylist() == [BIG, BIG - 1, BIG - 2]


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ([1.5, BIG], "a fraction: a float column"),
        ([-1, BIG], "a negative value: no unsigned type holds it"),
        ([1e19, 2.0], "a float literal past int64: uint64 does not parse it"),
        ([2**62, 1.5], "within int64: a double only by a float beside it"),
    ],
)
def test_exact_leaves_a_double_that_is_not_unsigned_integers(values: list[Any], why: str) -> None:
    data = b"".join(b'{"v": %s}\n' % json.dumps(v).encode() for v in values)
    table = _read_json(data)
    assert table.schema.field("v").type == pa.float64(), why
    assert _exact(table, _json_again(data)) is table, why


def test_exact_reads_csv_again_with_the_column_types() -> None:
    data = f"a,b\n{BIG},1\n2,3\n".encode()
    table = pcsv.read_csv(io.BytesIO(data))
    assert table.schema.field("a").type == pa.float64()

    def again(schema: pa.Schema) -> pa.Table:
        convert = pcsv.ConvertOptions(column_types=schema)
        return pcsv.read_csv(io.BytesIO(data), convert_options=convert)

    assert _exact(table, again).column("a").to_pylist() == [BIG, 2]


def test_a_declaration_widens_an_integer_and_uint64_to_uint64() -> None:
    stream = pa.schema([("h", pa.int64()), ("x", pa.int64())])
    assert declaration(stream, pa.schema([("h", pa.uint64())])) == (
        "ReadOptions(schema=pa.schema([('h', pa.uint64()), ('x', pa.int64())]))"
    )
    # an integer and a float: float64, as pyarrow promotes them
    assert "('x', pa.float64())" in str(declaration(stream, pa.schema([("x", pa.float64())])))
