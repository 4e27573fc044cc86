"""Delta Lake tables: a listing reads the files of the table's current version, as its log
says. A Delta table's directory keeps the data files of earlier versions until ``VACUUM``
removes them: a stream over it read its ``_delta_log`` commits as JSON shards (refused:
"schema differs ... missing column 'id'"), and a glob of its ``*.parquet`` read the rows of
every version, those the table had deleted or replaced among them, without a word. Tables
are written by ``deltalake`` (delta-rs), the reference."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import ingest
from ingest.core.errors import SourceError, StateError
from ingest.core.state import StreamState
from ingest.storage.sources.delta import DeltaLog, current_files, read_log, snapshot
from ingest.testing import Store
from tests.resumed import through_a_resume

deltalake = pytest.importorskip("deltalake")


def _ids(url: str, **kwargs: Any) -> list[int]:
    return sorted(i for b in ingest.Stream(url, batch_size=1, **kwargs) for i in b["id"].tolist())


def _table(first: int, n: int, **columns: list[Any]) -> pa.Table:
    return pa.table({"id": list(range(first, first + n)), **columns})


def test_a_table_overwritten_and_appended_reads_its_current_rows(tmp_path: Path) -> None:
    url = str(tmp_path / "t")
    deltalake.write_deltalake(url, _table(0, 100))
    deltalake.write_deltalake(url, _table(100, 100), mode="overwrite")
    deltalake.write_deltalake(url, _table(200, 50), mode="append")
    assert len(list((tmp_path / "t").glob("*.parquet"))) == 3  # the premise: a stale file
    expected = sorted(deltalake.DeltaTable(url).to_pyarrow_table()["id"].to_pylist())
    assert expected == list(range(100, 250))
    assert _ids(url) == expected
    assert _ids(f"{url}/*.parquet") == expected  # a glob of its files: the current ones
    assert _ids(f"file://{url}/") == expected
    assert _ids(str(tmp_path)) == expected  # listed from the directory above it


def test_deleted_rows_and_a_checkpoint_and_a_compaction(tmp_path: Path) -> None:
    url = str(tmp_path / "t")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 25, 25), mode="append")
    table = deltalake.DeltaTable(url)
    table.delete("id < 10")  # rewrites the file that held them
    table.create_checkpoint()
    deltalake.write_deltalake(url, _table(100, 5), mode="append")  # a commit after it
    deltalake.DeltaTable(url).optimize.compact()
    deltalake.write_deltalake(url, _table(105, 5), mode="append")
    expected = sorted(deltalake.DeltaTable(url).to_pyarrow_table()["id"].to_pylist())
    assert expected == list(range(10, 110))
    assert _ids(url) == expected


def test_partition_columns_come_from_the_log(tmp_path: Path) -> None:
    url = str(tmp_path / "t")
    rows = _table(0, 60, lang=[["en", "fr", None][i % 3] for i in range(60)])
    deltalake.write_deltalake(url, rows, partition_by=["lang"])
    got: dict[int, Any] = {}
    for batch in ingest.Stream(url, batch_size=6, shuffle_seed=2):
        got.update(zip(batch["id"].tolist(), batch["lang"], strict=True))
    assert got == {i: ["en", "fr", None][i % 3] for i in range(60)}


def test_a_resume_inside_a_window_is_exactly_once_on_s3(s3_store: Store, tmp_path: Path) -> None:
    url = str(tmp_path / "t")
    for k in range(3):
        deltalake.write_deltalake(url, _table(k * 100, 100), mode="append")
    deltalake.write_deltalake(url, _table(300, 100), mode="overwrite")
    for k in range(3):
        deltalake.write_deltalake(url, _table(400 + k * 100, 100), mode="append")
    for path in sorted(Path(url).rglob("*")):
        if path.is_file():
            s3_store.write(f"t/{path.relative_to(url)}", path.read_bytes())
    kwargs: dict[str, Any] = {
        "batch_size": 20,
        "shuffle_seed": 3,
        "shuffle_window": 60,
        "storage_options": s3_store.storage_options,
    }
    assert sorted(through_a_resume(s3_store.url("t"), 6, **kwargs)) == list(range(300, 700))


def _stop_compact_resume(url: str, loader: bool = False) -> tuple[list[int], list[int]]:
    """The ids of an epoch stopped after 2 batches of 10 (inside a window of 40), its state
    saved (through JSON), the table compacted and appended to (ids 100..119), and the epoch
    resumed from the state; then the ids of the resumed stream's next epoch. (The row counts
    fill every step of a loader's 2 workers: none is carried into the next epoch.)"""
    kwargs: dict[str, Any] = {"batch_size": 10, "shuffle_seed": 4, "shuffle_window": 40}

    def make() -> Any:
        stream = ingest.Stream(url, **kwargs)
        return ingest.DataLoader(stream, num_workers=2) if loader else stream

    first = make()
    it = iter(first)
    before = [i for _ in range(2) for i in next(it)["id"].tolist()]
    state = json.loads(json.dumps(first.state_dict()))
    getattr(first, "close", lambda: None)()
    deltalake.DeltaTable(url).optimize.compact()  # the state's files are no longer the table's
    deltalake.write_deltalake(url, _table(100, 20), mode="append")
    resumed = make()
    try:
        resumed.load_state_dict(state)
        rest = [i for batch in resumed for i in batch["id"].tolist()]
        after = [i for batch in resumed for i in batch["id"].tolist()]
    finally:
        getattr(resumed, "close", lambda: None)()
    return before + rest, after


@pytest.mark.parametrize("loader", [False, True], ids=["stream", "dataloader2"])
def test_a_resume_after_a_compaction_reads_the_version_it_was_saved_at(
    tmp_path: Path, loader: bool
) -> None:
    """OPTIMIZE (Databricks' auto-compaction) rewrites a table's files into fewer: the files
    a state was saved on are no longer the table's, though they stay until VACUUM. The
    resumed epoch reads the table at the version the state was saved at (Delta's time
    travel), every row once; the next epoch reads the newest version. Before, the resume
    was refused ('shards missing')."""
    url = str(tmp_path / "t")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 25, 25), mode="append")
    epoch, after = _stop_compact_resume(url, loader)
    assert sorted(epoch) == list(range(100))
    assert sorted(after) == list(range(120))


def test_a_state_records_the_version_of_each_table(tmp_path: Path) -> None:
    url = str(tmp_path / "t")
    deltalake.write_deltalake(url, _table(0, 10))
    deltalake.write_deltalake(url, _table(10, 10), mode="append")
    stream = ingest.Stream(url, batch_size=5, shuffle_seed=1)
    next(iter(stream))
    state = json.loads(json.dumps(stream.state_dict()))
    assert state["dataset"]["tables"] == {f"file://{url}": [1]}
    assert StreamState.from_json(state).dataset.tables == ((f"file://{url}", 1),)
    bad: Any
    for bad in ("x", {f"file://{url}": 1}, {f"file://{url}": []}, {f"file://{url}": ["1"]}):
        state["dataset"]["tables"] = bad
        with pytest.raises(StateError, match=r"dataset\.tables"):
            StreamState.from_json(state)
    plain = tmp_path / "plain.parquet"
    pq.write_table(_table(0, 10), plain)
    stream = ingest.Stream(str(plain), batch_size=5)
    next(iter(stream))
    assert "tables" not in stream.state_dict()["dataset"]


def test_a_resume_after_a_vacuum_of_the_saved_versions_files_names_the_fix(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "t")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 25, 25), mode="append")
    stream = ingest.Stream(url, batch_size=10, shuffle_seed=4)
    it = iter(stream)
    next(it)
    state = json.loads(json.dumps(stream.state_dict()))
    table = deltalake.DeltaTable(url)
    table.optimize.compact()
    table = deltalake.DeltaTable(url)
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    resumed = ingest.Stream(url, batch_size=10, shuffle_seed=4)
    with pytest.raises(SourceError, match=r"version 3.*VACUUM.*without the state"):
        resumed.load_state_dict(state)


def _two_epochs(
    url: str, loader: bool, stop: int | None = None, **kwargs: Any
) -> tuple[list[int], list[int]]:
    """Two epochs' ids of a stream (``loader``: in a ``DataLoader`` of no worker, whose
    every epoch starts from the last one's state), the table compacted and appended to
    (ids 1000..1019) between them; ``stop``: the second epoch stopped after that many
    batches, its state saved (through JSON) and loaded into a new stream, which reads the
    rest."""

    def make() -> Any:
        stream = ingest.Stream(url, batch_size=10, shuffle_seed=4, shuffle_window=40, **kwargs)
        return ingest.DataLoader(stream, num_workers=0) if loader else stream

    it = make()
    first = [i for batch in it for i in batch["id"].tolist()]
    deltalake.DeltaTable(url).optimize.compact()
    deltalake.write_deltalake(url, _table(1000, 20), mode="append")
    if stop is None:
        return first, [i for batch in it for i in batch["id"].tolist()]
    batches = iter(it)
    second = [i for _ in range(stop) for i in next(batches)["id"].tolist()]
    state = json.loads(json.dumps(it.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    return first, second + [i for batch in resumed for i in batch["id"].tolist()]


@pytest.mark.parametrize("loader", [False, True], ids=["stream", "dataloader0"])
def test_the_epoch_after_a_compaction_reads_the_newest_version(
    tmp_path: Path, loader: bool
) -> None:
    """Between epochs, the state's shards need not be there: only those it carries rows
    from. Before, a DataLoader's next epoch (planned from the last one's state) was refused
    ('the state belongs to another dataset'); a stream's, where the last epoch carried
    rows, said the shard 'vanished while the stream followed the dataset'."""
    url = str(tmp_path / "t")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 25, 25), mode="append")
    first, second = _two_epochs(url, loader)
    assert sorted(first) == list(range(100))
    assert sorted(second) == [*range(100), *range(1000, 1020)]
    url = str(tmp_path / "dropped")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 24, 24), mode="append")
    first, second = _two_epochs(url, loader, remainder="drop")
    assert len(first) == len(set(first)) == 90 and set(first) <= set(range(96))
    assert len(second) == len(set(second)) == 110
    assert set(second) <= {*range(96), *range(1000, 1020)}


@pytest.mark.parametrize("stop", [None, 3], ids=["whole", "resumed"])
@pytest.mark.parametrize("loader", [False, True], ids=["stream", "dataloader0"])
def test_rows_carried_from_files_a_compaction_replaced_are_read_from_them(
    tmp_path: Path, loader: bool, stop: int | None
) -> None:
    """Rows of an epoch that fill no step are carried into the next; a compaction between
    the epochs replaced the files they are in, which stay on the store until VACUUM. The
    next epoch reads the carried rows from them (its listing holds them beside the newest
    version's files, their own rows consumed), then the newest version, every row once; and
    so does a resume inside that epoch (its state records both versions). Before, the next
    epoch was refused."""
    url = str(tmp_path / "t")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 24, 24), mode="append")
    first, second = _two_epochs(url, loader, stop)
    assert len(first) == len(set(first)) == 90
    carried = set(range(96)) - set(first)  # 6 rows
    assert carried <= set(second) and len(second) == 120  # 6 carried + 114 of 116, 2 on
    own = Counter(second) - Counter(carried)
    assert max(own.values()) == 1 and sum(own.values()) == 114
    assert set(own) <= {*range(96), *range(1000, 1020)}


def test_a_state_at_an_epochs_end_carries_rows_from_replaced_files_into_a_dataloader(
    tmp_path: Path,
) -> None:
    """The state a DataLoader(2) saved at an epoch's end carries 16 rows into the next
    (96 rows in steps of 2 x 10); a compaction replaced their files before the resume. The
    main process joins them to the newest version's listing and hands it to its workers,
    which plan the same epoch from it: the carried rows once, then the newest version."""
    url = str(tmp_path / "t")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 24, 24), mode="append")

    def loader() -> Any:
        stream = ingest.Stream(url, batch_size=10, shuffle_seed=4, shuffle_window=40)
        return ingest.DataLoader(stream, num_workers=2)

    it = loader()
    try:
        first = [i for batch in it for i in batch["id"].tolist()]
        state = json.loads(json.dumps(it.state_dict()))
    finally:
        it.close()
    deltalake.DeltaTable(url).optimize.compact()
    deltalake.write_deltalake(url, _table(1000, 20), mode="append")
    it = loader()
    try:
        it.load_state_dict(state)
        second = [i for batch in it for i in batch["id"].tolist()]
    finally:
        it.close()
    assert len(first) == len(set(first)) == 80
    carried = set(range(96)) - set(first)
    assert carried <= set(second) and len(second) == 120  # 16 carried + 104 of 116, 12 on
    own = Counter(second) - Counter(carried)
    assert max(own.values()) == 1 and sum(own.values()) == 104
    assert set(own) <= {*range(96), *range(1000, 1020)}


def test_a_table_with_deletion_vectors_enabled_and_none_written_reads(tmp_path: Path) -> None:
    """delta-rs lists the reader features deletionVectors and variantType on such a table;
    no file has a deletion vector and no column is a variant, so the files are the rows."""
    url = str(tmp_path / "t")
    enabled = {"delta.enableDeletionVectors": "true"}
    deltalake.write_deltalake(url, _table(0, 10), configuration=enabled)
    deltalake.write_deltalake(url, _table(10, 10), mode="append")
    features = deltalake.DeltaTable(url).protocol().reader_features or []
    assert "deletionVectors" in features  # the premise
    assert _ids(url) == list(range(20))


# -- the log (no store) -------------------------------------------------------------------


def _commit(*actions: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(a).encode() + b"\n" for a in actions)


_PROTOCOL = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
_META = {"metaData": {"id": "x", "partitionColumns": ["p"], "configuration": {}}}


def _add(path: str, p: str | None = "a") -> dict[str, Any]:
    return {"add": {"path": path, "size": 10, "partitionValues": {"p": p}, "dataChange": True}}


def test_the_log_replays_adds_and_removes_in_commit_order() -> None:
    log = DeltaLog(
        "t",
        commits={
            0: _commit(_PROTOCOL, _META, _add("p=a/one%20file.parquet"), _add("x.parquet", None)),
            1: _commit({"remove": {"path": "x.parquet"}}, _add("y.parquet", "b")),
            2: _commit(
                {"commitInfo": {}}, {"remove": {"path": "y.parquet"}}, _add("y.parquet", "c")
            ),
        },
    )
    files = current_files(log)
    assert [(f.path, f.partition) for f in files] == [
        ("t/p=a/one file.parquet", (("p", "a"),)),  # the path is a URI: decoded
        ("t/y.parquet", (("p", "c"),)),
    ]
    with pytest.raises(SourceError, match=r"commit 1 .*missing"):
        current_files(DeltaLog("t", commits={0: _commit(_PROTOCOL, _META), 2: _commit()}))
    with pytest.raises(SourceError, match=r"reader version 9"):
        protocol = {"protocol": {"minReaderVersion": 9, "minWriterVersion": 9}}
        current_files(DeltaLog("t", commits={0: _commit(protocol, _META)}))


def test_a_version_is_read_from_the_checkpoint_and_commits_before_it(tmp_path: Path) -> None:
    """``read_log(at=...)`` replays the newest checkpoint at or before the version and the
    commits after it up to the version; a log whose retention removed them is refused."""
    url = str(tmp_path / "t")
    for k in range(3):
        deltalake.write_deltalake(url, _table(k * 10, 10), mode="append")
    deltalake.DeltaTable(url).create_checkpoint()  # at version 2
    deltalake.write_deltalake(url, _table(30, 10), mode="overwrite")
    deltalake.write_deltalake(url, _table(40, 10), mode="append")
    fs = fsspec.filesystem("file")
    for at, ids in [(0, range(10)), (1, range(20)), (2, range(30)), (3, range(30, 40))]:
        version = snapshot(read_log(fs, url, [], at), url)
        assert version.version == at
        assert sorted(
            i for f in version.files for i in pq.read_table(f.path)["id"].to_pylist()
        ) == (list(ids))
    assert snapshot(read_log(fs, url, []), url).version == 4  # the newest
    (tmp_path / "t" / "_delta_log" / f"{0:020}.json").unlink()  # the log's retention
    assert snapshot(read_log(fs, url, [], 3), url).version == 3  # from the checkpoint
    with pytest.raises(SourceError, match=r"no longer holds version 1.*without the state") as e:
        snapshot(read_log(fs, url, [], 1), url)
    # What the log holds, in words (found by a probe: "commits []..[] ... checkpoint None").
    assert "(it holds commit 1 and no checkpoint before version 1)" in str(e.value), e.value
    with pytest.raises(SourceError, match=r"no longer holds version 9") as e:
        snapshot(read_log(fs, url, [], 9), url)
    assert "(it holds commits 3..4 after its checkpoint at version 2)" in str(e.value), e.value


def test_what_the_files_alone_do_not_give_exactly_is_refused_with_the_fix() -> None:
    """A deletion vector marks rows deleted without rewriting their file: a file's is read
    with it (tests/test_delta_deletions.py), and refused where it cannot be read or the
    table is followed (a followed table only grows). Column mapping names the files'
    columns otherwise than the table's; a variant column is no column of plain values.
    Each names the fix."""
    v3 = {"protocol": {"minReaderVersion": 3, "readerFeatures": ["deletionVectors"]}}
    vector = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1}
    add = _add("a.parquet")
    add["add"]["deletionVector"] = {**vector, "sizeInBytes": 40, "cardinality": 6}
    (read,) = current_files(DeltaLog("t", commits={0: _commit(v3, _META, add)}))
    assert read.deletions is not None and read.deletions.cardinality == 6
    assert read.deletions.path == "t/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    followed = DeltaLog("t", commits={0: _commit(v3, _META, add)}, since=0)
    with pytest.raises(SourceError, match=r"a\.parquet has Delta deletionVectors.*follow"):
        current_files(followed)
    add["add"]["deletionVector"] = vector  # no size, no cardinality
    with pytest.raises(SourceError, match=r"a\.parquet has a deletion vector that cannot be"):
        current_files(DeltaLog("t", commits={0: _commit(v3, _META, add)}))
    mapped = {
        "metaData": {**_META["metaData"], "configuration": {"delta.columnMapping.mode": "name"}}
    }
    v2 = {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}
    with pytest.raises(SourceError, match=r"columnMapping \(mode name\)"):
        current_files(DeltaLog("t", commits={0: _commit(v2, mapped)}))
    schema = {"type": "struct", "fields": [{"name": "v", "type": "variant", "nullable": True}]}
    varied = {"metaData": {**_META["metaData"], "schemaString": json.dumps(schema)}}
    v3v = {"protocol": {"minReaderVersion": 3, "readerFeatures": ["variantType"]}}
    with pytest.raises(SourceError, match=r"a variant column"):
        current_files(DeltaLog("t", commits={0: _commit(v3v, varied)}))
    named = {"type": "struct", "fields": [{"name": "variant", "type": "long", "nullable": True}]}
    plain = {"metaData": {**_META["metaData"], "schemaString": json.dumps(named)}}
    assert current_files(DeltaLog("t", commits={0: _commit(v3v, plain)})) == []


# -- other table formats -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (
            ["t/metadata/v2.metadata.json", "t/metadata/snap-1.avro", "t/data/00000-0-a.parquet"],
            r"t: an Apache Iceberg table.*earlier snapshots.*plan_files",
        ),
        (
            ["t/.hoodie/hoodie.properties", "t/2024/01/a_1-0-1_20240101.parquet"],
            r"t: an Apache Hudi table.*earlier commits",
        ),
    ],
)
def test_iceberg_and_hudi_tables_are_refused_naming_the_fix(
    tmp_path: Path, files: list[str], says: str
) -> None:
    """An Iceberg or Hudi table's directories keep the files of earlier snapshots too, and
    only its metadata says which are the table: listed as plain files, a stream read its
    metadata as JSON shards, or rows the table had deleted, without a word."""
    for name in files:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".parquet"):
            pq.write_table(_table(0, 3), path)
        else:
            path.write_text("{}\n")
    with pytest.raises(SourceError, match=says):
        _ids(str(tmp_path))
    # A glob of the data files alone, and a file named, are read as files.
    data = next(name for name in files if name.endswith(".parquet"))
    assert _ids(str(tmp_path / data)) == [0, 1, 2]


@pytest.mark.usefixtures("ray_session")
def test_a_ray_streams_ranks_and_ray_data_read_the_current_version(
    s3_store: Store, tmp_path: Path
) -> None:
    """The readers in the pool and Ray Data's blocks read the listing the driver made: the
    current version's files, with the partition values of the log."""
    import ray

    url = str(tmp_path / "t")
    rows = _table(0, 40, lang=[["en", "fr"][i % 2] for i in range(40)])
    deltalake.write_deltalake(url, rows, partition_by=["lang"])
    deltalake.DeltaTable(url).delete("id >= 30")  # rewrites: files of version 0 are stale
    expected = {
        r["id"]: r["lang"] for r in deltalake.DeltaTable(url).to_pyarrow_table().to_pylist()
    }
    assert sorted(expected) == list(range(30))
    for path in sorted(Path(url).rglob("*")):
        if path.is_file():
            s3_store.write(f"t/{path.relative_to(url)}", path.read_bytes())
    options = s3_store.storage_options
    with ingest.RayStream(
        s3_store.url("t"), storage_options=options, world_size=2, batch_size=5, shuffle_seed=2
    ) as stream:
        seen: dict[int, str] = {}
        for rank in range(2):
            for batch in stream.rank_iterator(rank):
                for i, lang in zip(batch["id"].tolist(), batch["lang"], strict=True):
                    assert i not in seen
                    seen[i] = lang
    assert seen == expected
    refs = ingest.ray_data.read(s3_store.url("t"), storage_options=options).to_arrow_refs()
    got = pa.concat_tables(ray.get(refs, timeout=120))
    assert dict(zip(got["id"].to_pylist(), got["lang"].to_pylist(), strict=True)) == expected


def _ray_rank(it: Any, stop_after: int | None) -> tuple[list[int], Any]:
    """A rank's ids, to its state after ``stop_after`` batches (None: the epoch's)."""
    got: list[int] = []
    for n, batch in enumerate(it, 1):
        got += batch["id"].tolist()
        if n == stop_after:
            return got, it.state_dict()
    return got, None


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_a_ray_stream_resumes_after_a_compaction_at_the_saved_version(tmp_path: Path) -> None:
    """The coordinator lists the table as the stream starts (its newest version); the
    state loaded is of an older one: the rest of its epoch is listed again at it."""
    import ray

    rank = ray.remote(num_cpus=0)(_ray_rank)
    url = str(tmp_path / "t")
    for k in range(4):
        deltalake.write_deltalake(url, _table(k * 30, 30), mode="append")
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle_seed": 4, "world_size": 2}
    with ingest.RayStream(url, **kwargs) as stream:
        out = ray.get([rank.remote(stream.rank_iterator(r), 2) for r in range(2)], timeout=300)
    before, state = [i for got, _ in out for i in got], json.loads(json.dumps(out[0][1]))
    deltalake.DeltaTable(url).optimize.compact()
    deltalake.write_deltalake(url, _table(1000, 20), mode="append")
    with ingest.RayStream(url, **kwargs) as stream:
        stream.load_state_dict(state)
        out = ray.get([rank.remote(stream.rank_iterator(r), None) for r in range(2)], timeout=300)
    assert sorted(before + [i for got, _ in out for i in got]) == list(range(120))


def test_a_file_the_log_holds_and_the_directory_lacks_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "t")
    deltalake.write_deltalake(url, _table(0, 10))
    deltalake.write_deltalake(url, _table(10, 10), mode="append")
    gone = sorted((tmp_path / "t").glob("*.parquet"))[0]
    gone.unlink()
    with pytest.raises(SourceError, match=rf"holds 1 file.*{gone.name}.*removed by hand"):
        _ids(url)


def test_the_tables_schema_is_the_streams_through_its_evolution(tmp_path: Path) -> None:
    """A Delta table's columns are its log's, not its first file's: a column added by a
    later write (``schema_mode="merge"``, ALTER TABLE ADD COLUMNS) reads as null from the
    files written before it, as a Delta reader gives it; the partition columns take the
    table's types. Before, the stream refused the older files ("missing column 'lang'")."""
    url = str(tmp_path / "t")
    deltalake.write_deltalake(
        url, pa.table({"id": [1, 2], "year": [2023, 2024]}), partition_by=["year"]
    )
    later = pa.table({"id": [3], "year": [2024], "lang": ["en"]})
    deltalake.write_deltalake(url, later, mode="append", schema_mode="merge", partition_by=["year"])
    expected = {
        r["id"]: (r["lang"], r["year"])
        for r in deltalake.DeltaTable(url).to_pyarrow_table().to_pylist()
    }
    assert expected == {1: (None, 2023), 2: (None, 2024), 3: ("en", 2024)}
    got: dict[int, Any] = {}
    for batch in ingest.Stream(url, batch_size=1):
        assert batch["year"].dtype == torch.int64  # the table's long, not a path's string
        got[batch["id"].item()] = (batch["lang"][0], batch["year"].item())
    assert got == expected


def test_a_file_is_its_path_and_its_deletion_vector_in_the_log() -> None:
    """A commit that deletes more rows of a file removes it with its old vector and adds it
    with the new one, in either order (the protocol reconciles by path and vector): the file
    stays, with the new vector; a remove with the vector it has removes it."""
    v3 = {"protocol": {"minReaderVersion": 3, "readerFeatures": ["deletionVectors"]}}

    def action(kind: str, inline: str | None) -> dict[str, Any]:
        body = _add("a.parquet")["add"]
        if inline is not None:
            body["deletionVector"] = {
                "storageType": "i", "pathOrInlineDv": inline, "sizeInBytes": 4, "cardinality": 1
            }  # fmt: skip
        return {kind: body}

    first = _commit(v3, _META, action("add", None))
    for order in ([action("add", "00001"), action("remove", None)],
                  [action("remove", None), action("add", "00001")]):  # fmt: skip
        log = DeltaLog("t", commits={0: first, 1: _commit(*order)})
        (kept,) = current_files(log)
        assert kept.deletions is not None and kept.deletions.unique_id == "i00001"
        removed = _commit(action("remove", "00001"))
        gone = DeltaLog("t", commits={0: first, 1: _commit(*order), 2: removed})
        assert current_files(gone) == []
