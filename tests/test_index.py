"""The persistent shard index: a later job plans without reading any shard to index it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fsspec
import pytest

from ingest.core.errors import ShardError, StreamTimeoutError
from ingest.formats import get_format
from ingest.formats.base import ReadOptions, ShardInfo
from ingest.planner.catalog import Catalog, Listing
from ingest.planner.index import (
    IndexConfig,
    IndexEntryWarning,
    Indexer,
    IndexStore,
    IndexStoreError,
    default_location,
    local_indexer,
)
from ingest.storage.sources import Shard, Source
from ingest.testing import LoopbackS3, Store, encode, free_port, make_table, write_dataset
from ingest.tools import cli

ROWS = 2000
SHARDS = 4
READ = ReadOptions(block_bytes=4096)  # many seek points per shard
# Generated format name -> the data's extension in write_dataset.
UNFOOTED = ["jsonl", "csv", "tar", "arrows", "jsonl.gz"]


def catalog(
    data: Store,
    location: str,
    read: ReadOptions = READ,
    *,
    options: dict[str, Any] | None = None,
    indexer: Indexer | None = None,
) -> tuple[Catalog, IndexStore]:
    """A catalog with fresh state (new Source, new store, empty memory) over ``data``.

    ``options`` are the storage options of the index ``location``.
    """
    store = IndexStore(IndexConfig(location=location, storage_options=options or {}))
    source = Source(data.url("d"), storage_options=data.storage_options)
    return Catalog(source, read, None, index_store=store, indexer=indexer), store


def indexes(listing: Listing) -> list[tuple[int | None, tuple[tuple[int, int], ...]]]:
    return [(i.rows, i.seeks) for i in listing.infos]


def assert_plain_ints(listing: Listing) -> None:
    for info in listing.infos:
        assert type(info.rows) is int
        assert type(info.seeks) is tuple
        for seek in info.seeks:
            assert type(seek) is tuple and [type(x) for x in seek] == [int, int]


@pytest.mark.parametrize("fmt", UNFOOTED)
def test_second_job_reads_no_shard_to_index(store: Store, tmp_path: Path, fmt: str) -> None:
    # A tar row takes 2 KB (headers and 512-byte blocks): at 4 KB reads, 2,000 rows took
    # 1,656 requests of the loopback S3 server per scan (the test: 17.6 s, now 9.5 s); 800
    # still give 4 seek points a shard.
    rows = 800 if fmt == "tar" else ROWS
    write_dataset(store.fs, store.url("d"), fmt, SHARDS, rows)
    first_cat, first_store = catalog(store, str(tmp_path / "idx"))
    first = first_cat.scan(index=True)
    assert [i.rows for i in first.infos] == [rows] * SHARDS
    assert first_store.stats.misses == SHARDS and first_store.stats.written == SHARDS

    # What a scan costs without any indexing: the listing, headers and the schema.
    plain_source = Source(store.url("d"), storage_options=store.storage_options)
    Catalog(plain_source, READ, None).scan(index=False)

    again_cat, again_store = catalog(store, str(tmp_path / "idx"))
    again = again_cat.scan(index=True)
    assert again_store.stats.hits == SHARDS and again_store.stats.misses == 0
    assert again_store.stats.written == 0
    # Nothing is read: an IPC stream's inspection and the others' schema are kept too.
    assert again_cat.source.stats.opens == 0 < plain_source.stats.opens
    assert again_cat.source.stats.bytes_read == 0
    assert indexes(again) == indexes(first)
    assert_plain_ints(again)
    if fmt != "arrows":  # IPC streams have no seek points
        assert all(len(i.seeks) > 3 for i in again.infos)


def test_second_job_opens_no_shard_with_a_known_schema(store: Store, tmp_path: Path) -> None:
    write_dataset(store.fs, store.url("d"), "jsonl", SHARDS, ROWS)
    first = catalog(store, str(tmp_path / "idx"))[0].scan(index=True)
    known = ReadOptions(block_bytes=READ.block_bytes, schema=first.schema)
    again_cat, _ = catalog(store, str(tmp_path / "idx"), known)
    again = again_cat.scan(index=True)
    assert again_cat.source.stats.opens == 0 and again_cat.source.stats.bytes_read == 0
    assert indexes(again) == indexes(first)


def test_stored_seek_points_are_used_to_resume(local: Store, tmp_path: Path) -> None:
    write_dataset(local.fs, local.url("d"), "jsonl", 1, ROWS)
    catalog(local, str(tmp_path / "idx"))[0].scan(index=True)
    again_cat, _ = catalog(local, str(tmp_path / "idx"))
    listing = again_cat.scan(index=True)
    before = again_cat.source.stats.bytes_read
    ctx = listing.context(0, again_cat.source, READ, None)
    start = ROWS * 9 // 10
    with get_format("jsonl").open(ctx) as reader:
        ids = [i for b in reader.read(start, None, None) for i in b.data.column("id").to_pylist()]
    assert ids == list(range(start, ROWS))
    # Resuming at 90% reads about the last 10%, thanks to the stored seek points.
    assert again_cat.source.stats.bytes_read - before < listing.shards[0].size // 5


def test_changed_shard_is_indexed_again(store: Store, tmp_path: Path) -> None:
    write_dataset(store.fs, store.url("d"), "jsonl", SHARDS, ROWS)
    first = catalog(store, str(tmp_path / "idx"))[0].scan(index=True)
    store.write("d/part-00001.jsonl", encode(make_table(0, ROWS + 7), "jsonl"))
    known = ReadOptions(block_bytes=READ.block_bytes, schema=first.schema)
    again_cat, again_store = catalog(store, str(tmp_path / "idx"), known)
    again = again_cat.scan(index=True)
    assert [i.rows for i in again.infos] == [ROWS, ROWS + 7, ROWS, ROWS]
    assert (again_store.stats.hits, again_store.stats.misses) == (SHARDS - 1, 1)
    assert again_cat.source.stats.opens == 1  # only the changed shard is read
    assert again.infos[1].seeks != first.infos[1].seeks


def _entry(store: IndexStore, shard: Shard) -> Path:
    return Path(store.path(shard))


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "arrows"])
def test_second_job_reads_no_footer(store: Store, tmp_path: Path, fmt: str) -> None:
    """Footers are kept in the index (a restarted job read every footer again: on small
    shards the whole shard); a shard rewritten in place is read again. An Arrow IPC shard's
    inspection (its schema; a file's rows) was not kept, so every new job opened every
    shard again before its first batch (a request each, on a store far away): it is kept
    as a Parquet footer is."""
    write_dataset(store.fs, store.url("d"), fmt, SHARDS, 200, row_group_rows=50)
    first_cat, first_store = catalog(store, str(tmp_path / "idx"))
    first = first_cat.scan()
    assert first_cat.source.stats.opens == SHARDS and first_store.stats.footer_writes == SHARDS
    again_cat, again_store = catalog(store, str(tmp_path / "idx"))
    again = again_cat.scan()
    assert again_cat.source.stats.opens == 0 and again_cat.source.stats.bytes_read == 0
    assert (again_store.stats.footer_hits, again_store.stats.footer_writes) == (SHARDS, 0)
    assert [(i.rows, i.blocks, i.schema) for i in again.infos] == [
        (i.rows, i.blocks, i.schema) for i in first.infos
    ]
    if fmt == "parquet":
        assert again.infos[0].meta.to_dict() == first.infos[0].meta.to_dict()
    else:  # file or stream
        assert [i.meta for i in again.infos] == [i.meta for i in first.infos]
    time.sleep(0.01)  # another modification time (local), another ETag (S3)
    store.fs.pipe(first.shards[0].url, encode(make_table(10_000, 300), fmt))
    third_cat, third_store = catalog(store, str(tmp_path / "idx"))
    third = third_cat.scan()
    assert third_cat.source.stats.opens == 1 and third_store.stats.footer_hits == SHARDS - 1
    assert third_store.stats.footer_writes == 1
    assert third.infos[0].rows == (None if fmt == "arrows" else 300)


@pytest.mark.parametrize("damage", ["not-json", "other-shard", "not-a-footer"])
def test_a_corrupt_footer_entry_is_ignored_and_rewritten(
    local: Store, tmp_path: Path, damage: str
) -> None:
    from ingest.planner.index.entries import blob_name

    write_dataset(local.fs, local.url("d"), "parquet", 2, 200, row_group_rows=50)
    first = catalog(local, str(tmp_path / "idx"))[0].scan()
    victim, other = (tmp_path / "idx" / blob_name(s) for s in first.shards)
    good = victim.read_bytes()
    doc = json.loads(good)
    victim.write_bytes(
        {
            "not-json": good[: len(good) // 2],
            "other-shard": other.read_bytes(),
            "not-a-footer": json.dumps({**doc, "footer": "anVuaw=="}).encode(),  # b"junk"
        }[damage]
    )
    again_cat, _ = catalog(local, str(tmp_path / "idx"))
    with pytest.warns(IndexEntryWarning, match=r"part-00000\.parquet is ignored"):
        again = again_cat.scan()
    assert again_cat.source.stats.opens == 1  # the damaged one's footer, read again
    assert again.infos[0].rows == 200
    assert victim.read_bytes() == good  # rewritten
    third_cat, third_store = catalog(local, str(tmp_path / "idx"))
    third_cat.scan()
    assert third_cat.source.stats.opens == 0 and third_store.stats.corrupt == 0


@pytest.mark.parametrize(
    "damage",
    ["truncated", "empty", "not-an-object", "bad-rows", "unsorted-seeks", "other-shard"],
)
def test_corrupt_entry_is_ignored_and_rebuilt(local: Store, tmp_path: Path, damage: str) -> None:
    write_dataset(local.fs, local.url("d"), "jsonl", 2, ROWS)
    first_cat, first_store = catalog(local, str(tmp_path / "idx"))
    first = first_cat.scan(index=True)
    victim, other = (_entry(first_store, s) for s in first.shards)
    good = victim.read_bytes()
    doc = json.loads(good)
    bad = {
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "not-an-object": b"[1, 2, 3]",
        "bad-rows": json.dumps({**doc, "rows": "2000"}).encode(),
        "unsorted-seeks": json.dumps({**doc, "seeks": doc["seeks"][::-1]}).encode(),
        "other-shard": other.read_bytes(),
    }[damage]
    victim.write_bytes(bad)

    again_cat, again_store = catalog(local, str(tmp_path / "idx"))
    with pytest.warns(IndexEntryWarning, match=r"part-00000\.jsonl is ignored.*indexed again"):
        again = again_cat.scan(index=True)
    assert indexes(again) == indexes(first)
    assert (again_store.stats.corrupt, again_store.stats.hits) == (1, 1)
    assert victim.read_bytes() == good  # rewritten

    third_cat, third_store = catalog(local, str(tmp_path / "idx"))
    third_cat.scan(index=True)
    assert (third_store.stats.hits, third_store.stats.corrupt) == (2, 0)


def test_default_location_is_owner_only(
    local: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_location() == str(tmp_path / "cache" / "ingest" / "index")
    write_dataset(local.fs, local.url("d"), "jsonl", 3, 100)
    store = IndexStore()
    source = Source(local.url("d"))
    Catalog(source, READ, None, index_store=store).scan(index=True)
    assert store.stats.written == 3
    dirs = [p for p in (tmp_path / "cache").rglob("*") if p.is_dir()] + [tmp_path / "cache"]
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert {tmp_path / "cache" / "ingest", tmp_path / "cache" / "ingest" / "index"} <= set(dirs)
    assert len(files) == 3 + 1  # an entry per shard, and the schema the first one gave
    assert {stat.S_IMODE(p.stat().st_mode) for p in dirs} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_location() == str(tmp_path / "home" / ".cache" / "ingest" / "index")


def test_index_on_an_s3_url(s3: LoopbackS3, s3_store: Store, local: Store) -> None:
    write_dataset(local.fs, local.url("d"), "jsonl", SHARDS, ROWS)
    location = s3_store.url("index") + "/"
    first_cat, first_store = catalog(local, location, options=s3.storage_options())
    first = first_cat.scan(index=True)
    assert first_store.stats.written == SHARDS
    names = s3_store.fs.find(s3_store.url("index"))
    assert len(names) == SHARDS + 1 and all(n.endswith(".json") for n in names)

    again_cat, again_store = catalog(local, location, options=s3.storage_options())
    again = again_cat.scan(index=True)
    assert (again_store.stats.hits, again_store.stats.misses) == (SHARDS, 0)
    assert indexes(again) == indexes(first)
    assert again_cat.source.stats.opens <= 1  # the schema's first block, no indexing


def test_no_credentials_in_entry_names_or_contents(tmp_path: Path) -> None:
    store = IndexStore(IndexConfig(location=str(tmp_path / "idx")))
    signed = (
        "https://alice:hunter2@data.example/a.jsonl?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA"
    )
    shard = Shard(signed, 1234, "etag-1", "jsonl")
    store.put_many([(shard, ShardInfo(rows=10, seeks=((0, 0), (5, 600))))])
    entries = list((tmp_path / "idx").rglob("*.json"))
    assert len(entries) == 1
    text = entries[0].read_text()
    for secret in ("alice", "hunter2", "deadbeef", "AKIA", "Signature"):
        assert secret not in text and secret not in str(entries[0])
    assert json.loads(text)["url"] == "https://data.example/a.jsonl"
    # The same object signed again (other user, other token) is found.
    resigned = Shard(
        "https://bob:pw@data.example/a.jsonl?X-Amz-Signature=cafe", 1234, "etag-1", "jsonl"
    )
    plain = Shard("https://data.example/a.jsonl", 1234, "etag-1", "jsonl")
    want = ShardInfo(rows=10, seeks=((0, 0), (5, 600)))
    assert store.get_many([resigned, plain]) == [want, want]
    # Another size or version is another key: a miss, never a stale hit.
    assert store.get_many([Shard(signed, 1235, "etag-1", "jsonl")]) == [None]
    assert store.get_many([Shard(signed, 1234, "etag-2", "jsonl")]) == [None]
    assert store.get_many([Shard(signed, 1234, "etag-1", "csv")]) == [None]


def test_s3_credentials_never_reach_the_index(
    s3: LoopbackS3, s3_store: Store, tmp_path: Path
) -> None:
    write_dataset(s3_store.fs, s3_store.url("d"), "jsonl", 2, 100)
    location = s3_store.url("index")
    cat, store = catalog(s3_store, location, options=s3.storage_options())
    cat.scan(index=True)
    assert store.stats.written == 2
    assert s3.secret not in repr(store.config) and s3.key not in store.location
    for path in s3_store.fs.find(location):
        blob = s3_store.fs.cat(path).decode()
        assert s3.secret not in blob and s3.secret not in path


def test_unwritable_index_location_is_a_clear_error(local: Store, tmp_path: Path) -> None:
    write_dataset(local.fs, local.url("d"), "jsonl", 1, 10)
    (tmp_path / "file").write_bytes(b"not a directory")
    cat, _ = catalog(local, str(tmp_path / "file" / "idx"))
    with pytest.raises(
        IndexStoreError, match=r"shard index at .*file/idx: cannot write.*another index location"
    ):
        cat.scan(index=True)


def test_progress_is_kept_when_a_shard_fails(local: Store, tmp_path: Path) -> None:
    write_dataset(local.fs, local.url("d"), "jsonl", 3, ROWS)
    lines = encode(make_table(0, ROWS), "jsonl").split(b"\n")
    lines[77] = b"{not json"
    local.write("d/part-00002.jsonl", b"\n".join(lines))
    cat, store = catalog(local, str(tmp_path / "idx"), indexer=local_indexer(1))
    with pytest.raises(ShardError, match=r"part-00002\.jsonl at line 78"):
        cat.scan(index=True)
    assert store.stats.written == 2  # the shards read before it are kept for the next run


# -- the command line ----------------------------------------------------------------------


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_cli_index_builds_then_finds(s3: LoopbackS3, s3_store: Store, tmp_path: Path) -> None:
    write_dataset(s3_store.fs, s3_store.url("d"), "jsonl", 3, 500)
    s3_store.write("d/part-empty.jsonl", b"")  # listed and counted, nothing to index
    opts = ["-o", f"key={s3.key}", "-o", f"secret={s3.secret}"]
    opts += ["-o", f"client_kwargs.endpoint_url={s3.endpoint}"]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = run("index", s3_store.url("d"), *opts, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["4 shards, 3 indexed, 0 already indexed, 1500 rows"]
    assert len(list((tmp_path / "cache" / "ingest" / "index").rglob("*.json"))) == 3 + 1
    again = run("index", s3_store.url("d"), *opts, "--workers", "2", env=env)
    assert again.stdout.splitlines() == ["4 shards, 0 indexed, 3 already indexed, 1500 rows"]
    # On an index URL with the data's protocol, the -o options reach it too.
    remote = s3_store.url("index")
    on_s3 = run("index", s3_store.url("d"), *opts, "--index-dir", remote)
    assert on_s3.stdout.splitlines() == ["4 shards, 3 indexed, 0 already indexed, 1500 rows"]
    assert len(s3_store.fs.find(remote)) == 3 + 1  # the entries, the first shard's schema
    assert s3.secret not in out.stdout + out.stderr + on_s3.stdout + on_s3.stderr


def test_cli_index_options_reach_an_index_elsewhere(
    s3: LoopbackS3, s3_store: Store, local: Store
) -> None:
    write_dataset(local.fs, local.url("d"), "csv", 2, 50)
    remote = s3_store.url("index")
    opts = ["--index-option", f"key={s3.key}", "--index-option", f"secret={s3.secret}"]
    opts += ["--index-option", f"client_kwargs.endpoint_url={s3.endpoint}"]
    out = run("index", local.url("d"), "--index-dir", remote, *opts)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["2 shards, 2 indexed, 0 already indexed, 100 rows"]
    assert len(s3_store.fs.find(remote)) == 2 + 1
    nowhere = f"client_kwargs.endpoint_url=http://127.0.0.1:{free_port()}"
    refused = run("index", local.url("d"), "--index-dir", remote, "--index-option", nowhere)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith(f"ingest index: error: shard index at {remote}: cannot read")
    assert refused.stderr.count("\n") == 1


def test_cli_index_bad_input_exits_2_with_one_line(local: Store, tmp_path: Path) -> None:
    out = run("index", local.url("missing", "*.jsonl"), "--index-dir", str(tmp_path / "i"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("ingest index: error: ")
    assert "missing" in out.stderr
    local.write("d/a.jsonl", b'{"id": 1}\n{oops\n')
    bad = run("index", local.url("d"), "--index-dir", str(tmp_path / "i"))
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("ingest index: error: ")
    assert "a.jsonl at line 2" in bad.stderr


def test_cli_bench_forwards_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("ingest.tools.bench")

    def main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    fake.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ingest.tools.bench", fake)
    assert cli.main(["bench", "--plot", "--shards", "8"]) == 0
    assert seen == [["--plot", "--shards", "8"]]


def test_cli_bench_missing_module_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ingest.tools.bench", None)
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "ingest bench: error: this install has no ingest.tools.bench" in err
    )


# -- Ray tasks ----------------------------------------------------------------------------


def test_ray_indexer_matches_threads(ray_session: None, store: Store, tmp_path: Path) -> None:
    import ray

    from ingest.distributed.index_tasks import ray_indexer

    write_dataset(store.fs, store.url("d"), "jsonl", 5, ROWS)
    threads_cat, _ = catalog(store, str(tmp_path / "a"))
    by_threads = threads_cat.scan(index=True)
    indexer = ray_indexer(shards_per_task=2, num_cpus=0.5, timeout_s=120)
    ray_cat, ray_store = catalog(store, str(tmp_path / "b"), indexer=indexer)
    by_ray = ray_cat.scan(index=True)
    assert indexes(by_ray) == indexes(by_threads)
    assert_plain_ints(by_ray)
    assert indexer.tasks == 3  # 5 shards, 2 per task
    assert indexer.nodes == {ray.get_runtime_context().get_node_id()}
    assert ray_store.stats.written == 5
    # The reads done in the tasks are counted in the catalog's source.
    assert ray_cat.source.stats.as_dict() == threads_cat.source.stats.as_dict()


def test_ray_indexer_sizes_its_tasks_by_bytes_and_cpus(
    ray_session: None, local: Store, tmp_path: Path
) -> None:
    # Four shards a task made 1,000 small JSONL shards take 74 s to index on 4 CPUs (a task
    # costs far more than a small shard's request); 125 a task, 22 s.
    import ray

    from ingest.distributed.index_tasks import ray_indexer

    cpus = int(ray.cluster_resources()["CPU"])
    indexer = ray_indexer()

    def contexts(n: int, size: int) -> list[Any]:
        return [SimpleNamespace(shard=SimpleNamespace(size=size))] * n

    per_task = indexer._group_size
    assert per_task(contexts(1000, 10_000)) == -(-1000 // (2 * cpus))  # small: by CPUs
    assert per_task(contexts(1000, 10 << 20)) == 25  # 10 GB in 256 MiB tasks: 40 tasks
    assert per_task(contexts(10, 1 << 30)) == 1  # big: one a task
    assert per_task(contexts(1, 10)) == 1
    write_dataset(local.fs, local.url("d"), "jsonl", 9, ROWS)
    cat, _ = catalog(local, str(tmp_path / "idx"), indexer=indexer)
    assert [i.rows for i in cat.scan(index=True).infos] == [ROWS] * 9
    assert indexer.tasks == -(-9 // per_task(contexts(9, 1)))


def test_ray_indexer_raises_the_shard_error(
    ray_session: None, local: Store, tmp_path: Path
) -> None:
    from ingest.distributed.index_tasks import ray_indexer

    write_dataset(local.fs, local.url("d"), "jsonl", 3, ROWS)
    lines = encode(make_table(0, ROWS), "jsonl").split(b"\n")
    lines[5] = b"{not json"
    local.write("d/part-00001.jsonl", b"\n".join(lines))
    cat, _ = catalog(local, str(tmp_path / "idx"), indexer=ray_indexer(shards_per_task=1))
    with pytest.raises(ShardError, match=r"part-00001\.jsonl at line 6.*invalid JSON") as err:
        cat.scan(index=True)
    assert err.value.line == 6


def test_ray_indexer_times_out_instead_of_hanging(
    ray_session: None, local: Store, tmp_path: Path
) -> None:
    from ingest.distributed.index_tasks import ray_indexer

    write_dataset(local.fs, local.url("d"), "jsonl", 2, 10)
    indexer = ray_indexer(resources={"no-such-node": 1}, timeout_s=2)
    cat, store = catalog(local, str(tmp_path / "idx"), indexer=indexer)
    start = time.monotonic()
    with pytest.raises(StreamTimeoutError, match=r"no-such-node.*ray status.*raise timeout_s"):
        cat.scan(index=True)
    assert time.monotonic() - start < 30
    assert store.stats.written == 0


def test_index_store_travels_to_ray_workers(
    ray_session: None, tmp_path: Path, local: Store
) -> None:
    import ray

    write_dataset(local.fs, local.url("d"), "jsonl", 2, 50)
    store = IndexStore(IndexConfig(location=str(tmp_path / "idx")))

    @ray.remote
    def scan_remotely(store: IndexStore, url: str) -> list[int | None]:
        cat = Catalog(Source(url), READ, None, index_store=store)
        return [i.rows for i in cat.scan(index=True).infos]

    assert ray.get(scan_remotely.remote(store, local.url("d")), timeout=120) == [50, 50]
    again_cat = Catalog(Source(local.url("d")), READ, None, index_store=store)
    assert [i.rows for i in again_cat.scan(index=True).infos] == [50, 50]
    assert store.stats.hits == 2  # written by the Ray worker, found here


def test_fsspec_local_url_and_plain_path_share_an_index(local: Store, tmp_path: Path) -> None:
    write_dataset(local.fs, local.url("d"), "csv", 2, 30)
    catalog(local, f"file://{tmp_path}/idx")[0].scan(index=True)
    _, store = catalog(local, str(tmp_path / "idx"))
    again_cat = Catalog(Source(local.url("d")), READ, None, index_store=store)
    again_cat.scan(index=True)
    assert store.stats.hits == 2
    assert fsspec.filesystem("file").exists(str(tmp_path / "idx"))


def test_cli_index_with_ray_joins_the_cluster(
    ray_session: None, local: Store, tmp_path: Path
) -> None:
    import ray

    write_dataset(local.fs, local.url("d"), "jsonl", 3, 100)
    address = ray.get_runtime_context().gcs_address
    out = run(
        "index",
        local.url("d"),
        "--ray",
        "--index-dir",
        str(tmp_path / "i"),
        env={"RAY_ADDRESS": address},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["3 shards, 3 indexed, 0 already indexed, 300 rows"]
    assert len(list((tmp_path / "i").rglob("*.json"))) == 3 + 1


def test_a_second_scan_infers_no_schema_of_an_unchanged_shard(
    local: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream lists its source every epoch; a JSONL schema is inferred by parsing a block
    # of the first shard (12% of a warm epoch's CPU over a tokenized corpus, issue 34).
    from ingest.formats.jsonl import JsonlFormat

    write_dataset(local.fs, local.url("d"), "jsonl", 3, 100)
    calls: list[str] = []
    infer = JsonlFormat.infer_schema

    def counted(self: Any, source: Any, shard: Any, info: Any, options: Any) -> Any:
        calls.append(shard.url)
        return infer(self, source, shard, info, options)

    monkeypatch.setattr(JsonlFormat, "infer_schema", counted)
    catalog = Catalog(Source(local.url("d")), READ, None)
    first = catalog.scan()
    again = catalog.scan()
    assert len(calls) == 1 and again.schema == first.schema
    local.write("d/part-00000.jsonl", b'{"id": 1, "text": "changed", "extra": 2.5}\n')
    changed = catalog.scan()  # the first shard changed: its schema is inferred again
    assert len(calls) == 2 and changed.schema is not None and "extra" in changed.schema.names


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tar", "jsonl.gz"])
def test_a_second_job_infers_no_schema_it_kept(store: Store, tmp_path: Path, fmt: str) -> None:
    """A schema inferred from a shard's first block (JSON Lines, CSV, a tar's first samples)
    is kept in the shard index under the shard, the format and the read options it depends
    on: a restarted job (a new stream) sends no request for it, which was a round trip and
    up to a block of bytes on its first batch's path (50 ms away: 0.41 against 0.31 s to a
    JSON Lines stream's first batch). Other read options, or a changed shard, infer again."""
    write_dataset(store.fs, store.url("d"), fmt, 2, 300)
    first_cat, first_store = catalog(store, str(tmp_path / "idx"))
    first = first_cat.scan()
    assert first_cat.source.stats.opens == 1 and first_store.stats.schema_writes == 1
    again_cat, again_store = catalog(store, str(tmp_path / "idx"))
    again = again_cat.scan()
    assert (again_cat.source.stats.opens, again_cat.source.stats.bytes_read) == (0, 0)
    assert again.schema == first.schema and again_store.stats.schema_hits == 1
    other = ReadOptions(block_bytes=READ.block_bytes * 2)  # a tar's samples are not counted
    other_cat, _ = catalog(store, str(tmp_path / "idx"), other)  # in bytes: the same key
    assert other_cat.scan().schema == first.schema
    assert other_cat.source.stats.opens == (0 if fmt == "tar" else 1)
    time.sleep(0.01)  # another modification time (local), another ETag (S3)
    store.fs.pipe(first.shards[0].url, store.fs.cat(first.shards[1].url))
    changed_cat, _ = catalog(store, str(tmp_path / "idx"))
    changed_cat.scan()
    assert changed_cat.source.stats.opens == 1


def test_a_kept_csv_schema_still_warns_of_a_delimiter_it_missed(
    local: Store, tmp_path: Path
) -> None:
    local.write("d/a.csv", b"id;text\n1;one\n2;two\n")
    for _ in range(2):  # inferred, then kept: the same warning
        cat, _ = catalog(local, str(tmp_path / "idx"))
        with pytest.warns(UserWarning, match=r"read with ReadOptions\(delimiter=';'\)"):
            cat.scan()
    assert cat.source.stats.opens == 0
