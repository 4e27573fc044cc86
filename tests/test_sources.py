"""Sources: one listing with sizes and versions, on local disk and the loopback S3 server."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

import ingest
import ingest.sources
from ingest.formats import FORMAT_RESOLVER
from ingest.sources import Source, parse_storage_options
from ingest.testing import encode, make_table
from tests.conftest import Store


def test_listing_gives_sizes_versions_formats_and_footer_rows(store: Store) -> None:
    sizes = {}
    for name, fmt, rows in [
        ("a.parquet", "parquet", 120),
        ("b.jsonl", "jsonl", 10),
        ("c.arrow", "arrow", 30),
        ("sub/d.jsonl.gz", "jsonl.gz", 5),
    ]:
        data = encode(make_table(0, rows), fmt)
        store.write(f"d/{name}", data)
        sizes[name] = len(data)
    store.write("d/_SUCCESS", b"")
    store.write("d/notes.txt", b"not data")
    listing = ingest.list_shards(store.url("d"), storage_options=store.storage_options)
    names = [s.url.split("/d/", 1)[1] for s in listing.shards]
    assert names == ["a.parquet", "b.jsonl", "c.arrow", "sub/d.jsonl.gz"]
    assert [s.size for s in listing.shards] == [sizes[n] for n in names]
    assert [s.format for s in listing.shards] == ["parquet", "jsonl", "arrow", "jsonl"]
    assert all(s.version for s in listing.shards)
    assert [i.rows for i in listing.infos] == [120, None, 30, None]
    assert all(s.url.startswith(store.root.split("://")[0] + "://") for s in listing.shards)


def test_glob_list_of_urls_and_duplicates(store: Store) -> None:
    for n in range(3):
        store.write(f"d/p{n}.parquet", encode(make_table(0, 5), "parquet"))
    urls = [
        store.url("d", "p[01].parquet"),
        store.url("d", "p1.parquet"),
        store.url("d", "p2.parquet"),
    ]
    listing = ingest.list_shards(urls, storage_options=store.storage_options)
    assert [s.url.rsplit("/", 1)[1] for s in listing.shards] == [
        "p0.parquet",
        "p1.parquet",
        "p2.parquet",
    ]


def test_explicit_file_with_unknown_extension_asks_for_a_format(local: Store) -> None:
    local.write("d/data.bin", encode(make_table(0, 5), "parquet"))
    with pytest.raises(ingest.ConfigError, match="pass format="):
        ingest.list_shards(local.url("d", "data.bin"))
    listing = ingest.list_shards(local.url("d", "data.bin"), format="parquet")
    assert listing.infos[0].rows == 5


def test_an_unknown_format_name_is_refused_at_listing(local: Store) -> None:
    local.write("d/a.parquet", encode(make_table(0, 5), "parquet"))
    with pytest.raises(ingest.ConfigError, match="unknown format 'avro'; known formats: arrow"):
        ingest.list_shards(local.url("d"), format="avro")


def test_sources_do_not_import_formats() -> None:
    """A listing knows no formats: the registry is handed to ``list_shards`` by its caller."""
    tree = ast.parse(Path(ingest.sources.__file__).read_text())
    modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in modules if m.startswith("ingest.formats")], modules


def test_the_version_changes_when_the_object_changes(s3_store: Store) -> None:
    s3_store.write("d/a.jsonl", b'{"id": 1}\n')
    first = ingest.list_shards(s3_store.url("d"), storage_options=s3_store.storage_options)
    s3_store.write("d/a.jsonl", b'{"id": 2}\n')
    second = ingest.list_shards(s3_store.url("d"), storage_options=s3_store.storage_options)
    assert first.shards[0].size == second.shards[0].size
    assert first.shards[0].version != second.shards[0].version


def test_storage_option_parsing() -> None:
    assert parse_storage_options(
        [
            "anon=true",
            "client_kwargs.endpoint_url=http://h:1",
            "max_concurrency=4",
            "ratio=0.5",
            "name=x=y",
        ]
    ) == {
        "anon": True,
        "client_kwargs": {"endpoint_url": "http://h:1"},
        "max_concurrency": 4,
        "ratio": 0.5,
        "name": "x=y",
    }
    with pytest.raises(ingest.ConfigError, match="KEY=VALUE"):
        parse_storage_options(["novalue"])


def test_source_pickles_without_its_filesystems(s3_store: Store) -> None:
    s3_store.write("d/a.jsonl", b'{"id": 1}\n')
    source = Source(s3_store.url("d"), storage_options=s3_store.storage_options)
    listed = source.list_shards(FORMAT_RESOLVER)
    clone = pickle.loads(pickle.dumps(source))
    assert [s.url for s in clone.list_shards(FORMAT_RESOLVER)] == [s.url for s in listed]


def test_secrets_are_scrubbed_from_messages() -> None:
    source = Source("s3://b/", storage_options={"key": "AKIA123456", "secret": "s3cr3t-value"})
    assert source.scrub("bad key AKIA123456 with s3cr3t-value") == "bad key *** with ***"
