"""Delta deletion vectors read by the protocol: the protocol's own inline example, vectors of
every Roaring container kind written by tests/deletion_vector_writer.py and read by delta-rs
(the reference: what its reader leaves out of the table is what ours deletes), and every way
a vector can disagree with its descriptor refused."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ingest.storage.sources.deletion_vectors import DeletionVector, VectorError, parse
from tests import deletion_vector_writer as dvw

deltalake = pytest.importorskip("deltalake")

# Kinds of vectors: (rows, whether written as runs).
ROWS = 70_000
KINDS = {
    "array": ([3, 4, 7, 11, 18, 29, 65_535, 65_536, 69_999], False),
    "bitmap": (list(range(0, 20_000, 3)), False),  # 6,667 values in container 0
    "runs": ([*range(100, 5_000), *range(66_000, 66_010), 69_999], True),
    "runs-few": ([5, 6, 7], True),  # one container: no offset header
    "mixed": ([*range(0, 65_536, 2), 65_536, 65_540], False),  # a bitmap, then an array
}


def test_the_protocol_s_inline_example_reads_its_rows() -> None:
    """PROTOCOL.md's JSON Example 3: the row indexes 3, 4, 7, 11, 18 and 29 (Delta's native
    format, which delta-rs does not read)."""
    vector = DeletionVector.from_action(
        {
            "storageType": "i",
            "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
            "sizeInBytes": 40,
            "cardinality": 6,
        }
    )
    assert vector.rows().tolist() == [3, 4, 7, 11, 18, 29]
    assert vector.file("s3://mytable") is None


def test_a_uuid_vector_s_file_is_named_as_the_protocol_says() -> None:
    """PROTOCOL.md's JSON Example 1: a random prefix and the UUID's file under the root."""
    vector = DeletionVector.from_action(
        {
            "storageType": "u",
            "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
            "offset": 4,
            "sizeInBytes": 40,
            "cardinality": 6,
        }
    )
    assert vector.file("s3://mytable/") == (
        "s3://mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    assert vector.span() == (4, 4 + 4 + 40 + 4)
    assert vector.unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_vector_of_each_container_kind_deletes_what_delta_rs_deletes(
    tmp_path: Path, kind: str
) -> None:
    rows, runs = KINDS[kind]
    data = dvw.portable(rows, runs=runs)
    assert parse(data).tolist() == rows
    root = tmp_path / "t"
    deltalake.write_deltalake(
        str(root),
        pa.table({"id": pa.array(range(ROWS), pa.int64())}),
        configuration={"delta.enableDeletionVectors": "true"},
    )
    (path,) = dvw.added(root)
    descriptor = dvw.in_file(root, data) if kind != "array" else dvw.inline(data)
    dvw.delete_rows(root, {path: descriptor})
    query = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(root)))
    kept = query.execute("select id from t").read_all().column("id").to_numpy()
    assert sorted(set(range(ROWS)) - set(kept.tolist())) == rows  # the reference's reading

    vector = DeletionVector.from_action(descriptor)
    where = vector.file(str(root))
    if where is None:
        got = vector.rows()
    else:
        lo, hi = vector.span()
        got = vector.rows(Path(where).read_bytes()[lo:hi])
    assert got.dtype == np.uint64 and got.tolist() == rows


def test_high_buckets_read_as_64_bit_rows() -> None:
    rows = [1, 2**32, 2**32 + 70_000, 5 * 2**32 + 9]
    assert parse(dvw.portable(rows)).tolist() == rows
    assert parse(dvw.portable(rows, runs=True)).tolist() == rows


def _file_vector(rows: list[int]) -> tuple[DeletionVector, bytes]:
    data = dvw.portable(rows)
    body, (offset,) = dvw.vector_file([data])
    vector = DeletionVector("p", "/t/dv.bin", offset, len(data), len(rows))
    return vector, body[offset : offset + 4 + len(data) + 4]


def test_a_vector_that_disagrees_with_its_descriptor_is_refused() -> None:
    vector, framed = _file_vector([1, 5, 9])
    assert vector.rows(framed).tolist() == [1, 5, 9]
    flipped = bytearray(framed)
    flipped[12] ^= 1
    with pytest.raises(VectorError, match="CRC-32"):
        vector.rows(bytes(flipped))
    with pytest.raises(VectorError, match="read as 10 bytes"):
        vector.rows(framed[:10])
    with pytest.raises(VectorError, match="by its file"):
        DeletionVector("p", "/t/dv.bin", 1, vector.size - 2, 3).rows(
            framed[:-2]
        )  # the descriptor's size is not the file's
    with pytest.raises(VectorError, match="descriptor says 4"):
        DeletionVector("p", "/t/dv.bin", 1, vector.size, 4).rows(framed)
    with pytest.raises(VectorError, match="magic number"):
        parse(struct.pack("<I", 7) + dvw.portable([1])[4:])
    with pytest.raises(VectorError, match="ends early"):
        parse(dvw.portable(list(range(10)))[:-3])
    with pytest.raises(VectorError, match="ends at byte"):
        parse(dvw.portable([1]) + b"\0")
    with pytest.raises(VectorError, match="storageType"):
        DeletionVector.from_action(
            {"storageType": "x", "pathOrInlineDv": "", "sizeInBytes": 1, "cardinality": 1}
        )
    with pytest.raises(VectorError, match="cardinality"):
        DeletionVector.from_action({"storageType": "i", "pathOrInlineDv": "", "sizeInBytes": 1})
