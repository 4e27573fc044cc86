"""A shard overwritten after the stream listed it (on S3, or a local file rewritten in place
or replaced): its reads fail naming it.

Found by a probe: an object overwritten while an epoch read it (a new ETag) was read on as
the new version, with no error: the epoch handed out the old version's first rows and the
new version's last (rows of two versions; some of the old lost, some of the new added), and
an object overwritten between the listing and its first read was read whole at its new
content while the state recorded the old ETag. Every read of a listed S3 object now names
the ETag the listing saw (``If-Match``), the file reads and the concurrent range reads of
Parquet alike: the store refuses a read of another version (412), and the read fails at
once, naming the URL and the fix. (A state saved before the change is refused already:
tests/test_sources.py.)

A local file rewritten in place (the same inode) was read on as the new version, by a probe
too: a JSONL shard failed with a misleading short read and the next loop read on in the new
version; a Parquet shard (read by pyarrow natively) lost the rest of its rows silently until
the epoch's end, whose error named no shard. Local reads take no version to name, so every
batch read of a local shard is checked against its listed size and modification time (one
``stat``) before it is handed on, and so are its inspection and its index.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ingest
from ingest.formats import FORMAT_RESOLVER, ReadOptions
from ingest.formats.base import ReadContext
from ingest.planner.catalog import Catalog
from ingest.planner.index import index_shard
from ingest.storage.sources import Source, UnversionedShardWarning
from ingest.storage.sources.cached import open_cached
from ingest.testing import Store, encode, make_table
from ingest.tools.loopback.http import LoopbackHTTP

CHANGED = r"changed after it was listed.*restart the epoch"


def jsonl(first: int, rows: int) -> bytes:
    return "".join(json.dumps({"id": i}) + "\n" for i in range(first, first + rows)).encode()


def path_of(store: Store, relpath: str) -> str:
    """A local store's file's path."""
    return store.url(relpath).removeprefix("file://")


def read_little_ahead(store: Store) -> ingest.Stream:
    """A stream of ``d/`` in batches of 50, in order, whose read-ahead holds little and
    whose reads are small: a change after its first batch is met by later reads."""
    return ingest.Stream(
        store.url("d"),
        batch_size=50,
        shuffle_lanes=1,
        read=ingest.ReadOptions(prefetch_bytes=1, block_bytes=4096),
        storage_options=store.storage_options,
    )


def listed(store: Store) -> dict[str, Any]:
    source = Source(store.url("d"), storage_options=store.storage_options)
    return {s.url.rsplit("/", 1)[1]: s for s in source.list_shards(FORMAT_RESOLVER)} | {
        "source": source
    }


def read_both(source: Source, shards: dict[str, Any]) -> None:
    """A file read and a range read of the shards ``a.jsonl`` and ``b.parquet`` as listed."""
    assert source.open(shards["a.jsonl"], block_size=1024).read(9) == b'{"id": 0}'
    assert len(source.fetch_ranges(shards["b.parquet"], [0], [4]).read(4)) == 4


def both_refused(source: Source, shards: dict[str, Any]) -> None:
    """The same reads once both shards changed: each refused, naming it, at once."""
    started = time.monotonic()
    with pytest.raises(ingest.SourceError, match=r"/d/a\.jsonl: " + CHANGED):
        source.open(shards["a.jsonl"], block_size=1024).read(9)
    with pytest.raises(ingest.SourceError, match=r"/d/b\.parquet: " + CHANGED):
        source.fetch_ranges(shards["b.parquet"], [0], [4])
    assert time.monotonic() - started < 5, "failed at once, not retried to the deadline"


def test_a_read_of_an_object_overwritten_since_its_listing_fails_naming_it(
    s3_store: Store,
) -> None:
    s3_store.write("d/a.jsonl", jsonl(0, 500))
    s3_store.write("d/b.parquet", encode(make_table(0, 500), "parquet"))
    shards = listed(s3_store)
    source: Source = shards["source"]
    # The versions listed read as before (the ETag is the one listed).
    read_both(source, shards)
    # Overwritten with as many bytes: only the version tells them apart.
    s3_store.write("d/a.jsonl", jsonl(500, 500))
    s3_store.write("d/b.parquet", encode(make_table(500, 500), "parquet"))
    both_refused(source, shards)


SIZES = {"jsonl": (60_000, 300), "parquet": (20_000, 300), "arrow": (20_000, 300)}
"""Rows of the two shards of the mid-epoch tests: the first more than the read-ahead's
windows (two of 16,384 rows)."""


def content(fmt: str, first: int, rows: int) -> bytes:
    """A shard of ``fmt`` of ids ``first..``, in row groups of 100 (Parquet)."""
    if fmt == "jsonl":
        return jsonl(first, rows)
    return encode(make_table(first, rows), fmt, row_group_rows=100)


def read_through_a_rewrite(
    stream: ingest.Stream, fmt: str, rewrite: Callable[[int, bytes], object]
) -> list[int]:
    """The ids ``stream`` hands out before it fails naming a changed shard, both shards
    rewritten (``rewrite(k, data)``, ids from 100,000 on) after its first batch."""
    seen: list[int] = []
    with pytest.raises(ingest.SourceError, match=rf"/d/[01]\.{fmt}: " + CHANGED):
        for batch in stream:
            seen += batch["id"].tolist()
            if len(seen) == 50:
                for k, rows in enumerate(SIZES[fmt]):
                    rewrite(k, content(fmt, 100_000 + k * 10_000, rows))
    assert len(seen) < sum(SIZES[fmt])
    return seen


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "arrow"])
def test_a_stream_whose_shards_are_overwritten_mid_epoch_stops_naming_one(
    store: Store, fmt: str
) -> None:
    """Overwritten after the epoch's first batch, while the first shard is read: a shard of
    more rows than the read-ahead's windows (two of 16,384 rows), small reads. The stream
    hands out no row of the new versions, in that loop or the next (a local file is
    rewritten in place: the same inode, as ``open(path, "wb")`` writes)."""

    for k, rows in enumerate(SIZES[fmt]):
        store.write(f"d/{k}.{fmt}", content(fmt, k * 10_000, rows))
    stream = read_little_ahead(store)
    seen = read_through_a_rewrite(stream, fmt, lambda k, data: store.write(f"d/{k}.{fmt}", data))
    with pytest.raises(ingest.SourceError, match=rf"/d/[01]\.{fmt}: " + CHANGED):
        for batch in stream:  # the next loop: on in the same epoch, still refused
            seen += batch["id"].tolist()
    assert not [i for i in seen if i >= 100_000], "no row of the new versions"
    assert len(seen) == len(set(seen))


def test_a_local_shard_replaced_by_a_rename_mid_epoch_stops_naming_it(local: Store) -> None:
    """A writer's atomic replace (a new file renamed over the old: another inode) is another
    version too: the file opened may read on as the old one, but the next open of the path
    would read the new one, so the stream stops at the first read after it."""
    sizes = (20_000, 300)  # more rows than the read-ahead's windows, as above
    for k, rows in enumerate(sizes):
        table = make_table(k * 100_000, rows)
        local.write(f"d/{k}.parquet", encode(table, "parquet", row_group_rows=100))
    stream = read_little_ahead(local)
    seen: list[int] = []
    with pytest.raises(ingest.SourceError, match=r"/d/[01]\.parquet: " + CHANGED):
        for batch in stream:
            seen += batch["id"].tolist()
            if len(seen) == 50:
                for k, rows in enumerate(sizes):
                    table = make_table(1_000_000 + k * 100_000, rows)
                    local.write(f"d/{k}.tmp", encode(table, "parquet", row_group_rows=100))
                    os.replace(path_of(local, f"d/{k}.tmp"), path_of(local, f"d/{k}.parquet"))
    assert 50 <= len(seen) < sum(sizes)
    assert not [i for i in seen if i >= 1_000_000], "no row of the new versions"
    assert len(seen) == len(set(seen))


def test_a_local_file_changed_after_its_listing_is_neither_inspected_nor_indexed(
    local: Store,
) -> None:
    """An inspection (a Parquet footer) or an index (a JSONL file's row count) of a file
    changed since its listing would be kept under the listed version's name, in this stream
    and in the persistent index that later streams read: refused, naming the file."""
    local.write("d/a.jsonl", jsonl(0, 500))
    local.write("d/b.parquet", encode(make_table(1000, 500), "parquet"))
    shards = listed(local)
    source: Source = shards["source"]
    jsonl_shard = shards["a.jsonl"]
    info = Catalog(source, ReadOptions(), None).inspect(jsonl_shard)
    ctx = ReadContext(source, jsonl_shard, info, ReadOptions(), None, "", None)
    time.sleep(0.05)  # a modification time the listing's is not (the clock's coarse tick)
    local.write("d/a.jsonl", jsonl(0, 400) + b" " * (len(jsonl(400, 100)) - 1) + b"\n")
    local.write("d/b.parquet", encode(make_table(2000, 500), "parquet"))
    for name in ("a.jsonl", "b.parquet"):
        assert os.path.getsize(path_of(local, f"d/{name}")) == shards[name].size, "as many bytes"
    with pytest.raises(ingest.SourceError, match=r"/d/b\.parquet: " + CHANGED):
        Catalog(source, ReadOptions(), None).inspect(shards["b.parquet"])
    with pytest.raises(ingest.SourceError, match=r"/d/a\.jsonl: " + CHANGED):
        index_shard(ctx)


def test_an_object_overwritten_before_its_fetch_into_the_shard_cache_is_not_kept(
    s3_store: Store, tmp_path: Any
) -> None:
    """The cache keeps a copy under the listed URL, size and ETag: a fetch of an object
    overwritten since the listing kept the new version's bytes under the old version's name,
    and a later stream that listed the old version again (its bytes written back: the same
    ETag, an MD5) read the other version's rows from the copy, in another process too."""
    cache = ingest.CacheOptions(str(tmp_path / "cache"), max_bytes=1 << 30)
    old, new = jsonl(1000, 500), jsonl(2000, 500)  # as many bytes: only the ETag differs
    s3_store.write("d/a.jsonl", old)
    source = Source(s3_store.url("d"), storage_options=s3_store.storage_options, cache=cache)
    shard = source.list_shards(FORMAT_RESOLVER)[0]
    s3_store.write("d/a.jsonl", new)
    with pytest.raises(ingest.SourceError, match=r"/d/a\.jsonl: " + CHANGED):
        open_cached(source, shard, fetch=True)
    s3_store.write("d/a.jsonl", old)  # the version listed again
    again = Source(s3_store.url("d"), storage_options=s3_store.storage_options, cache=cache)
    copy = open_cached(again, again.list_shards(FORMAT_RESOLVER)[0], fetch=True)
    assert copy is not None and copy.read() == old
    assert again.stats.cache_misses == 1, "fetched: no copy was kept"


def overwrite(path: Path, data: bytes) -> None:
    """``data`` written in place, modified 10 s later than before (Last-Modified is to the
    second: a server that sends only it tells the versions apart by that)."""
    before = path.stat().st_mtime
    path.write_bytes(data)
    os.utime(path, (before + 10, before + 10))


@pytest.mark.parametrize("validator", ["etag", "last_modified"])
def test_an_http_shard_overwritten_since_its_listing_fails_naming_it(
    tmp_path: Path, validator: str
) -> None:
    # An HTTP read names no version (fsspec's HTTP files send no If-Match): an object
    # overwritten since the listing was read as its new version, rows of two versions in
    # one epoch. Each answer's ETag (or Last-Modified) is compared with the version listed.
    (tmp_path / "d").mkdir()
    (tmp_path / "d/a.jsonl").write_bytes(jsonl(0, 500))
    (tmp_path / "d/b.parquet").write_bytes(encode(make_table(0, 500), "parquet"))
    only = {"etag": validator == "etag", "last_modified": validator == "last_modified"}
    with LoopbackHTTP(tmp_path, **only) as server:
        source = Source([server.url("d/a.jsonl"), server.url("d/b.parquet")])
        shards = {s.url.rsplit("/", 1)[1]: s for s in source.list_shards(FORMAT_RESOLVER)}
        assert all(s.version for s in shards.values())
        read_both(source, shards)
        overwrite(tmp_path / "d/a.jsonl", jsonl(500, 500))
        overwrite(tmp_path / "d/b.parquet", encode(make_table(500, 500), "parquet"))
        both_refused(source, shards)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_http_shard_of_another_size_since_its_listing_fails_naming_it(
    tmp_path: Path, fmt: str
) -> None:
    # Found by a probe: a server that sends no validator, a shard replaced by one of
    # another size mid-epoch: a Parquet read was retried as a short body until the deadline
    # ("check the network"), a JSON Lines one failed as "invalid JSON ... fix the line".
    # Each answer says the object's size (Content-Range, or Content-Length): compared too.
    (tmp_path / "d").mkdir()
    data = jsonl(0, 500) if fmt == "jsonl" else encode(make_table(0, 500), "parquet")
    (tmp_path / f"d/a.{fmt}").write_bytes(data)
    with LoopbackHTTP(tmp_path, etag=False, last_modified=False) as server:
        with pytest.warns(UnversionedShardWarning):
            source = Source([server.url(f"d/a.{fmt}")])
            [shard] = source.list_shards(FORMAT_RESOLVER)
        assert len(source.fetch_ranges(shard, [0], [4]).read(4)) == 4
        (tmp_path / f"d/a.{fmt}").write_bytes(data[: len(data) // 2])
        started = time.monotonic()
        with pytest.raises(ingest.SourceError, match=rf"/d/a\.{fmt}: " + CHANGED) as err:
            source.fetch_ranges(shard, [0], [4])
        assert f"{len(data) // 2} bytes" in str(err.value) and f"{len(data)}" in str(err.value)
        with pytest.raises(ingest.SourceError, match=rf"/d/a\.{fmt}: " + CHANGED):
            source.open(shard, block_size=1024).read(9)
        assert time.monotonic() - started < 5, "failed at once, not retried to the deadline"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_http_stream_whose_shards_are_overwritten_mid_epoch_stops_naming_one(
    tmp_path: Path, fmt: str
) -> None:
    (tmp_path / "d").mkdir()
    for k, rows in enumerate(SIZES[fmt]):
        (tmp_path / f"d/{k}.{fmt}").write_bytes(content(fmt, k * 10_000, rows))
    with LoopbackHTTP(tmp_path) as server:
        stream = ingest.Stream(
            [server.url(f"d/{k}.{fmt}") for k in range(len(SIZES[fmt]))],
            batch_size=50,
            shuffle_lanes=1,
            read=ingest.ReadOptions(prefetch_bytes=1, block_bytes=4096),
        )
        seen = read_through_a_rewrite(
            stream, fmt, lambda k, data: overwrite(tmp_path / f"d/{k}.{fmt}", data)
        )
        assert not [i for i in seen if i >= 100_000], "no row of the new versions"
        assert len(seen) == len(set(seen))
