"""A Delta table whose files have deletion vectors (rows deleted without rewriting a file, as
Databricks deletes, updates and merges by default): every reader hands out the rows of the
table's version, the deleted ones never, each once through a stop and a resume, on every
transport. delta-rs (``deltalake.QueryBuilder``) reads the same table: its rows are the
expected ones. The vectors are written by the protocol (tests/deletion_vector_writer.py):
delta-rs writes none."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import ingest
from ingest.core.errors import SourceError, StateError
from ingest.testing import Store
from tests import deletion_vector_writer as dvw
from tests.resumed import through_a_resume

deltalake = pytest.importorskip("deltalake")

FILES, ROWS, GROUP = 3, 300, 64
"""Files of the table, rows in each and rows per row group (several groups a file)."""


def _write(root: Path) -> list[str]:
    """A table of ``FILES`` files of ``ROWS`` ids each, with deletion vectors enabled; the
    paths of its files, in the order written."""
    props = deltalake.WriterProperties(max_row_group_size=GROUP)
    for k in range(FILES):
        rows = pa.table({"id": pa.array(range(k * ROWS, (k + 1) * ROWS), pa.int64())})
        deltalake.write_deltalake(
            str(root),
            rows,
            mode="append",
            writer_properties=props,
            configuration={"delta.enableDeletionVectors": "true"},
        )
    return sorted(dvw.added(root), key=lambda p: dvw.added(root)[p]["modificationTime"])


def _delete(root: Path) -> list[int]:
    """Delete rows of the first two files by deletion vectors: the first in a file (runs
    across a row group's end, then more rows in a second commit that replaces that vector),
    the second inline (scattered rows); the table's ids, as delta-rs reads them."""
    first, second, _ = _write(root)
    runs = [*range(60, 70), *range(120, 200), 299]  # 64 and 128 start row groups
    dvw.delete_rows(root, {first: dvw.in_file(root, dvw.portable(runs, runs=True))})
    more = sorted({*runs, 0, 1, 2, 250})
    dvw.delete_rows(
        root,
        {
            first: dvw.in_file(root, dvw.portable(more), prefix=""),
            second: dvw.inline(dvw.portable([5, 63, 64, 65, 200])),
        },
    )
    query = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(root)))
    ids = query.execute("select id from t").read_all().column("id").to_pylist()
    deleted = len(more) + 5
    assert len(ids) == FILES * ROWS - deleted  # the premise: delta-rs deletes them
    return sorted(ids)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    root = tmp_path_factory.mktemp("deletions") / "t"
    return root, _delete(root)


def test_a_stream_reads_the_rows_the_vectors_leave(table: tuple[Path, list[int]]) -> None:
    root, expected = table
    ids = [i for b in ingest.Stream(str(root), batch_size=8) for i in b["id"].tolist()]
    assert Counter(ids) == Counter(expected)  # every row the table holds, once, none deleted
    shuffled = Counter(
        i for b in ingest.Stream(str(root), batch_size=8, shuffle_seed=1) for i in b["id"].tolist()
    )
    assert shuffled == Counter(expected)


@pytest.mark.parametrize("at", [3, 40])
def test_a_resume_inside_a_window_hands_out_the_rest_once(
    table: tuple[Path, list[int]], at: int
) -> None:
    root, expected = table
    kwargs: dict[str, Any] = {"batch_size": 10, "shuffle_seed": 3, "shuffle_window": 100}
    got = through_a_resume(str(root), at, **kwargs)
    assert Counter(got) == Counter(expected)


def test_a_dataloader_resumes_at_another_worker_count(table: tuple[Path, list[int]]) -> None:
    root, expected = table
    kwargs: dict[str, Any] = {"batch_size": 10, "shuffle_seed": 5, "shuffle_window": 60}
    first = ingest.DataLoader(ingest.Stream(str(root), **kwargs), num_workers=2)
    it = iter(first)
    before = [i for _ in range(9) for i in next(it)["id"].tolist()]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = ingest.DataLoader(ingest.Stream(str(root), **kwargs), num_workers=1)
    resumed.load_state_dict(state)
    try:
        rest = [i for b in resumed for i in b["id"].tolist()]
    finally:
        resumed.close()
    assert Counter(before + rest) == Counter(expected)


def test_the_vectors_are_read_from_s3(table: tuple[Path, list[int]], s3_store: Store) -> None:
    root, expected = table
    for path in sorted(root.rglob("*")):
        if path.is_file():
            s3_store.write(f"t/{path.relative_to(root)}", path.read_bytes())
    kwargs: dict[str, Any] = {"storage_options": s3_store.storage_options, "batch_size": 16}
    got = through_a_resume(s3_store.url("t"), 5, shuffle_seed=2, **kwargs)
    assert Counter(got) == Counter(expected)


def test_ingest_ls_counts_the_rows_left(table: tuple[Path, list[int]], capsys: Any) -> None:
    from ingest.tools.cli import main

    root, expected = table
    assert main(["ls", str(root), "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(listed) == FILES
    assert sum(s["rows"] for s in listed) == len(expected)


def test_a_vector_that_names_a_row_past_its_file_s_end_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "t"
    (first, *_) = _write(root)
    dvw.delete_rows(root, {first: dvw.inline(dvw.portable([3, ROWS + 7]))})
    with pytest.raises(SourceError, match=rf"row {ROWS + 7}.*{ROWS} rows"):
        list(ingest.Stream(str(root), batch_size=10))


def test_a_vector_file_that_is_gone_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "t"
    (first, *_) = _write(root)
    descriptor = dvw.in_file(root, dvw.portable([1, 2]))
    dvw.delete_rows(root, {first: descriptor})
    (gone,) = root.glob("ab/deletion_vector_*.bin")
    gone.unlink()
    with pytest.raises(SourceError, match=rf"{gone.name}.*{first}"):
        list(ingest.Stream(str(root), batch_size=10))


@pytest.mark.usefixtures("ray_session")
def test_ray_ranks_and_ray_data_read_the_rows_left(table: tuple[Path, list[int]]) -> None:
    import ray

    root, expected = table
    with ingest.RayStream(str(root), world_size=2, batch_size=8, shuffle_seed=4) as stream:
        seen = Counter(
            i
            for rank in range(2)
            for batch in stream.rank_iterator(rank)
            for i in batch["id"].tolist()
        )
    assert seen == Counter(expected)
    refs = ingest.ray_data.read(str(root)).to_arrow_refs()
    got = pa.concat_tables(ray.get(refs, timeout=120))
    assert sorted(got["id"].to_pylist()) == expected


class Doubled(ingest.Stage):
    """Each id twice (a stage the derived cache keeps copies of)."""

    def fingerprint(self) -> str:
        return "doubled 1"

    def __call__(self, table: pa.Table) -> ingest.Staged:
        ids = table["id"].to_numpy()
        return ingest.Staged(pa.table({"id": ids, "twice": ids * 2}), np.arange(len(ids)))


def test_a_derived_copy_made_before_more_rows_were_deleted_is_not_read(tmp_path: Path) -> None:
    """A derived copy is of a range of the rows a file keeps: another vector keeps others, so
    it is keyed by the vector too (the file's size and ETag are the same)."""
    root = tmp_path / "t"
    (first, *_) = _write(root)
    dvw.delete_rows(root, {first: dvw.inline(dvw.portable([1, 2, 3]))})
    derived = f"file://{tmp_path / 'copies'}"

    def epoch() -> list[int]:
        stream = ingest.Stream(str(root), batch_size=1, transform=Doubled(), derived=derived)
        return sorted(i for b in stream for i in b["id"].tolist())

    assert len(epoch()) == FILES * ROWS - 3
    assert list((tmp_path / "copies").rglob("*.derived")), "the premise: copies were made"
    # as many rows of the same row group: every range of rows kept has the same bounds
    dvw.delete_rows(root, {first: dvw.inline(dvw.portable([1, 2, 4]))})
    query = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(root)))
    expected = sorted(query.execute("select id from t").read_all().column("id").to_pylist())
    assert epoch() == expected


def test_two_versions_read_in_one_epoch_with_other_deletions_are_refused(tmp_path: Path) -> None:
    """A state's epoch may read files of two versions of a table (rows carried from files a
    compaction replaced); a file with other deleted rows in each is not one set of rows."""
    from ingest.formats import FORMAT_RESOLVER
    from ingest.storage.sources import Source

    root = tmp_path / "t"
    (first, *_) = _write(root)  # versions 0, 1, 2
    dvw.delete_rows(root, {first: dvw.inline(dvw.portable([1]))})  # version 3
    dvw.delete_rows(root, {first: dvw.inline(dvw.portable([1, 2]))})  # version 4
    table = f"file://{root}"
    shards = Source([str(root)]).list_shards(FORMAT_RESOLVER, at={table: [3]})
    (vector,) = [s.deletions for s in shards if s.deletions is not None]
    assert vector.cardinality == 1
    for versions in ([3, 4], [2, 3]):
        with pytest.raises(SourceError, match=rf"{first} has other deleted rows.*version"):
            Source([str(root)]).list_shards(FORMAT_RESOLVER, at={table: versions})
    assert len(Source([str(root)]).list_shards(FORMAT_RESOLVER, at={table: [4, 4]})) == FILES


def _one_file(root: Path) -> str:
    deltalake.write_deltalake(
        str(root),
        pa.table({"id": pa.array(range(ROWS), pa.int64())}),
        configuration={"delta.enableDeletionVectors": "true"},
    )
    (path,) = dvw.added(root)
    dvw.delete_rows(root, {path: dvw.inline(dvw.portable([1, 2, 3]))})
    return path


def test_rows_carried_from_a_file_whose_vector_changed_are_refused_before_a_batch(
    tmp_path: Path,
) -> None:
    """Rows an epoch carries into the next are rows of the file as its vector kept them: a
    DELETE between the epochs numbers its rows otherwise (the first batch of the next epoch
    read other rows in their place). The next epoch says so before its first batch, and a
    state taken between the epochs is refused the same way; a stream that drops its
    remainders reads the new version whole."""
    root = tmp_path / "t"
    path = _one_file(root)
    streams = [
        ingest.Stream(str(root), batch_size=30, shuffle_seed=1, remainder=remainder)
        for remainder in ("carry", "drop")
    ]
    for stream in streams:  # 297 rows: 27 carried (or dropped)
        assert len([b for b in stream]) == 9
    state = json.loads(json.dumps(streams[0].state_dict()))
    dvw.delete_rows(root, {path: dvw.inline(dvw.portable([1, 2, 3, *range(100, 200)]))})
    with pytest.raises(SourceError, match=r"carries into the next.*deletion"):
        next(iter(streams[0]))
    resumed = ingest.Stream(str(root), batch_size=30, shuffle_seed=1)
    # (found by a probe: it said "rewritten or removed", the file being neither)
    told = r"carries rows of its last epoch.*deletions.*given other deleted rows.*no state"
    with pytest.raises(StateError, match=told):
        resumed.load_state_dict(state)
        next(iter(resumed))
    epoch = [i for b in streams[1] for i in b["id"].tolist()]  # 194 rows: 180 in 6 batches
    kept = {0, *range(4, 100), *range(200, ROWS)}
    assert len(epoch) == 180 and len(set(epoch)) == 180 and set(epoch) <= kept


def test_vectors_from_a_checkpoint_and_in_a_partitioned_table(tmp_path: Path) -> None:
    """A checkpoint holds each file's vector as a struct (delta-rs writes it so); a
    partitioned table's file with a vector gets its partition value on the rows it keeps."""
    root = tmp_path / "t"
    expected = _delete(root)
    deltalake.DeltaTable(str(root)).create_checkpoint()
    assert list((root / "_delta_log").glob("*.checkpoint.parquet"))  # the premise
    assert sorted(i for b in ingest.Stream(str(root), batch_size=1) for i in b["id"].tolist()) == (
        expected
    )
    parted = tmp_path / "p"
    rows = pa.table(
        {"id": pa.array(range(200), pa.int64()), "lang": [["en", "fr"][i % 2] for i in range(200)]}
    )
    enabled = {"delta.enableDeletionVectors": "true"}
    deltalake.write_deltalake(str(parted), rows, partition_by=["lang"], configuration=enabled)
    en = next(p for p in dvw.added(parted) if "lang=en" in p)
    dvw.delete_rows(parted, {en: dvw.inline(dvw.portable([0, 5, 99]))})
    query = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(parted)))
    table = pa.table(query.execute("select id, lang from t").read_all())
    want = sorted(zip(table["id"].to_pylist(), table["lang"].to_pylist(), strict=True))
    got = sorted(
        (i, lang)
        for b in ingest.Stream(str(parted), batch_size=1)
        for i, lang in zip(b["id"].tolist(), b["lang"], strict=True)
    )
    assert got == want and len(got) == 197
