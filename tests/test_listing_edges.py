"""Listing edges: storage options that cannot work, said at once; a local name that holds
a '?'; a format error naming the URL; globs that match folders."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ingest
from ingest.storage.sources import Source
from ingest.testing import Store, encode, make_table


@pytest.mark.parametrize("nested", [True, False])
def test_an_endpoint_url_without_a_scheme_is_a_config_error_naming_the_fix(nested: bool) -> None:
    """``endpoint_url="127.0.0.1:9000"`` (no ``http://``) failed deep in botocore with a bare
    ``ValueError: Invalid endpoint``: no URL, no fix. It is refused when the source is made,
    before any request, naming the URL, the option and the endpoint with its scheme."""
    endpoint = {"endpoint_url": "127.0.0.1:9000"}
    options = {"key": "k", "secret": "s", **({"client_kwargs": endpoint} if nested else endpoint)}
    start = time.monotonic()
    with pytest.raises(ingest.ConfigError) as err:
        ingest.list_shards("s3://bucket/train/", storage_options=options)
    assert time.monotonic() - start < 5, "retried"
    message = str(err.value)
    assert "s3://bucket/train/" in message
    assert "endpoint_url" in message and "http://127.0.0.1:9000" in message
    with pytest.raises(ingest.ConfigError):
        Source("s3://bucket/train/", storage_options=options)
    # an endpoint with its scheme, and a local source's options, are not refused
    Source("s3://b/t/", storage_options={"client_kwargs": {"endpoint_url": "http://h:9"}})
    Source("/tmp/x/", storage_options={"endpoint_url": "127.0.0.1:9000"})


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_endpoint_in_the_environment_without_a_scheme_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """``AWS_ENDPOINT_URL=127.0.0.1:9000`` (no ``http://``) failed in botocore with a bare
    ``ValueError: Invalid endpoint``, as the storage option did. It is refused when the
    stream is made, before any request, naming the variable, its value and the fix."""
    for name in ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "127.0.0.1:9000")
    with pytest.raises(ingest.ConfigError) as err:
        ingest.Stream("s3://bucket/prefix/", batch_size=4, storage_options={"anon": True})
    message = str(err.value)
    assert "s3://bucket/prefix/" in message and f"{variable}='127.0.0.1:9000'" in message
    assert "http://127.0.0.1:9000" in message and "https://127.0.0.1:9000" in message
    # an endpoint in the storage options is the one used; a local source does not look
    Source("s3://b/t/", storage_options={"endpoint_url": "http://h:9"})
    Source("/tmp/x/")


def test_a_profile_that_does_not_exist_fails_at_once_naming_the_profile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``storage_options={"profile": "no-such-profile"}``: botocore's ProfileNotFound carries
    no HTTP status, and was retried for ~19 s, then blamed on the endpoint and the network.
    No retry finds a profile: it fails at once, saying where profiles are set."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    options = {
        "profile": "no-such-profile",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
    }
    start = time.monotonic()
    with pytest.raises(ingest.SourceError) as err:
        ingest.list_shards("s3://bucket/train/", storage_options=options)
    assert time.monotonic() - start < 5, "retried"
    message = str(err.value)
    assert "s3://bucket/train/" in message and "no-such-profile" in message
    assert "AWS_PROFILE" in message and "aws configure" in message
    assert "network" not in message


def test_a_read_whose_profile_is_missing_is_not_retried() -> None:
    from botocore.exceptions import ProfileNotFound

    from ingest.storage.sources.faults import is_transient, missing_credentials

    error = OSError("failed")
    error.__cause__ = ProfileNotFound(profile="p")
    assert not is_transient(error)
    assert "profile" in (missing_credentials(error) or "")


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_local_file_whose_name_holds_a_question_mark_is_read(tmp_path: Path, scheme: str) -> None:
    """A local path has no query string: ``q?x=1.parquet`` named alone was cut at the '?'
    and refused as ``.../q``, a path that does not exist."""
    (tmp_path / "q?x=1.parquet").write_bytes(encode(make_table(0, 10), "parquet"))
    url = f"{scheme}{tmp_path}/q?x=1.parquet"
    listing = ingest.list_shards(url)
    assert [s.url for s in listing.shards] == [f"file://{tmp_path}/q?x=1.parquet"]
    rows = [i for b in ingest.Stream(url, batch_size=5) for i in b["id"].tolist()]
    assert sorted(rows) == list(range(10))


def test_a_named_file_of_no_known_format_is_named_by_its_url(s3_store: Store) -> None:
    """A zero-byte object ``d`` beside the prefix ``d/`` (some tools write one), named: the
    error named ``bucket/.../d``, without ``s3://``; it names the URL, and the folder."""
    s3_store.write("d", b"")
    s3_store.write("d/x.parquet", encode(make_table(0, 10), "parquet"))
    with pytest.raises(ingest.ConfigError) as err:
        ingest.list_shards(s3_store.url("d"), storage_options=s3_store.storage_options)
    message = str(err.value)
    assert f"{s3_store.url('d')} from its extension" in message
    assert f"{s3_store.url('d')}/" in message  # the folder of the same name
    listing = ingest.list_shards(s3_store.url("d/"), storage_options=s3_store.storage_options)
    assert [s.url for s in listing.shards] == [s3_store.url("d/x.parquet")]


def _folders(store: Store) -> None:
    """Day folders (one with a writer's ``_temporary/`` and a subfolder), a file the glob
    matches too, a folder that it does not, and a folder whose name holds brackets."""
    for i, name in enumerate(
        [
            "2024-01-01/part-0.parquet",
            "2024-01-01/sub/part-1.parquet",
            "2024-01-02/part-0.parquet",
            "2024-01-03.parquet",
            "2024-02-01/part-0.parquet",
            "run[1]/part-0.parquet",
        ]
    ):
        store.write(name, encode(make_table(i * 10, 10), "parquet"))
    store.write("2024-01-01/_temporary/0/part-0.parquet", encode(make_table(900, 10), "parquet"))
    store.write("2024-01-01/.hidden/part-0.parquet", encode(make_table(800, 10), "parquet"))
    store.write("2024-01-02/_SUCCESS", b"")


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        (
            "2024-01-*",
            ["2024-01-01/part-0", "2024-01-01/sub/part-1", "2024-01-02/part-0", "2024-01-03"],
        ),
        ("2024-01-0[12]/", ["2024-01-01/part-0", "2024-01-01/sub/part-1", "2024-01-02/part-0"]),
        (
            "2024-0?-0*/",
            [
                "2024-01-01/part-0",
                "2024-01-01/sub/part-1",
                "2024-01-02/part-0",
                "2024-02-01/part-0",
            ],
        ),
        ("2024-01-*/", ["2024-01-01/part-0", "2024-01-01/sub/part-1", "2024-01-02/part-0"]),
        (
            "**",
            [
                "2024-01-01/part-0",
                "2024-01-01/sub/part-1",
                "2024-01-02/part-0",
                "2024-01-03",
                "2024-02-01/part-0",
                "run[1]/part-0",
            ],
        ),
        ("run[1]/", ["run[1]/part-0"]),
        ("run[[]1]", ["run[1]/part-0"]),
        ("**/sub", ["2024-01-01/sub/part-1"]),
    ],
)
def test_a_glob_that_matches_folders_reads_the_files_below_them(
    store: Store, pattern: str, names: list[str]
) -> None:
    """``s3://b/2024-01-*/``, ``/data/2024-01-*``, ``run[1]/``: a glob that matched folders
    holding Parquet shards was "matches no data files". A folder it matches reads every file
    below it, as a folder's URL does (but those below ``_`` and ``.`` folders), each once."""
    _folders(store)
    url = store.url(pattern)
    listing = ingest.list_shards(url, storage_options=store.storage_options)
    got = [s.url.removeprefix(store.url("")).removesuffix(".parquet") for s in listing.shards]
    assert got == names
    rows = [
        i
        for b in ingest.Stream(url, batch_size=10, storage_options=store.storage_options)
        for i in b["id"].tolist()
    ]
    assert len(rows) == len(set(rows)) == 10 * len(names)
    assert not {r for r in rows if r >= 800}, "read below _temporary/ or .hidden/"
