"""Every store's shard version: what tells a shard rewritten in place with the same size from
the one a state was saved against. On each store (local disk, S3, GCS, Azure, HTTP with an
ETag, HTTP with only Last-Modified, the Hub) a listing gives every shard a version, the
version changes when a shard is rewritten with the same size, and a state saved before (between
epochs and mid-epoch) is refused naming the shard; on the Hub, where a rewrite is a new
commit, the state reads the rest of its epoch at its own commit. A server that gives no
version is said so, naming the URL."""

from __future__ import annotations

import io
import json
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import ingest
from ingest.core.errors import StateError
from ingest.storage.sources import UnversionedShardWarning
from ingest.storage.sources.http_versions import other_size, other_version
from ingest.testing import make_table
from ingest.tools.loopback.http import LoopbackHTTP
from tests.hub_stub import HubStub
from tests.test_hub_stub import hf_env  # noqa: F401 - the fixture (autouse): no machine token

SHARDS, ROWS, BATCH = 3, 300, 50
NAMES = [f"shard-{n:03d}.parquet" for n in range(SHARDS)]


def shard_bytes(first: int) -> bytes:
    """A Parquet shard of ids ``first..first+ROWS``: uncompressed, plain, so that another
    ``first`` with as many digits gives other bytes of the same size."""
    sink = io.BytesIO()
    pq.write_table(
        make_table(first, ROWS),
        sink,
        row_group_size=50,
        compression="none",
        use_dictionary=False,
    )
    return sink.getvalue()


ORIGINAL = [shard_bytes(1000 * (n + 1)) for n in range(SHARDS)]
REWRITTEN = shard_bytes(7000)


@dataclass
class Place:
    """A store holding the shards: the stream's URL(s), its options, and how to write one."""

    name: str
    urls: str | list[str]
    write: Callable[[str, bytes], object]
    options: dict[str, Any] = field(default_factory=dict)

    def stream(self) -> ingest.Stream:
        return ingest.Stream(
            self.urls,
            batch_size=BATCH,
            shuffle_seed=1,
            columns=["id"],
            storage_options=self.options,
        )


def _http(root: Path, server: LoopbackHTTP, *, later: bool) -> Place:
    def write(name: str, data: bytes) -> None:
        path = root / name
        before = path.stat().st_mtime if path.exists() else None
        path.write_bytes(data)
        if later and before is not None:
            # Last-Modified counts whole seconds: the rewrite comes a few seconds later.
            os.utime(path, (before + 3, before + 3))

    return Place("http", [server.url(n) for n in NAMES], write)


@pytest.fixture(
    params=["local", "s3", "gs", "az", "http-etag", "http-last-modified", "hub"],
)
def place(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Place]:
    # A fresh shard index per test: entries are keyed by version, which is what is tested.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kind = request.param
    if kind == "local":
        root = tmp_path / "data"
        root.mkdir()
        yield Place(kind, f"file://{root}/*.parquet", lambda n, d: (root / n).write_bytes(d))
    elif kind == "s3":
        s3 = request.getfixturevalue("s3")
        fs = s3.filesystem()
        prefix = f"ingest-test/versions-{os.getpid()}-{id(request)}"
        yield Place(
            kind,
            f"s3://{prefix}/*.parquet",
            lambda n, d: fs.pipe(f"{prefix}/{n}", d),
            s3.storage_options(),
        )
    elif kind == "gs":
        from ingest.tools.loopback.gcs import LoopbackGCS

        with LoopbackGCS() as gcs:
            gcs.create_bucket("versions")
            fs = gcs.filesystem()
            yield Place(
                kind,
                "gs://versions/d/*.parquet",
                lambda n, d: fs.pipe(f"versions/d/{n}", d),
                gcs.storage_options(),
            )
    elif kind == "az":
        from ingest.tools.loopback.azure import LoopbackAzure, azurite

        if azurite() is None:  # make setup installs it where npm is
            pytest.skip(
                "azurite-blob is not installed (npm install --prefix .venv/azurite azurite@3)"
            )
        with LoopbackAzure() as azure:
            azure.create_container("versions")
            fs = azure.filesystem()
            yield Place(
                kind,
                "az://versions/d/*.parquet",
                lambda n, d: fs.pipe(f"versions/d/{n}", d),
                azure.storage_options(),
            )
    elif kind.startswith("http"):
        root = tmp_path / "web"
        root.mkdir()
        only_date = kind == "http-last-modified"
        with LoopbackHTTP(root, etag=not only_date) as server:
            yield _http(root, server, later=only_date)
    else:
        repo, files = "org/versions", {}
        with HubStub(page_size=4) as hub:

            def commit(name: str, data: bytes) -> None:
                files[f"data/{name}"] = data
                hub.add_dataset(repo, files)

            yield Place(
                kind, f"hf://datasets/{repo}/data/*.parquet", commit, {"endpoint": hub.endpoint}
            )


def ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"].tolist()]


def test_a_shard_rewritten_with_the_same_size_refuses_a_saved_state(place: Place) -> None:
    assert len(REWRITTEN) == len(ORIGINAL[0]), "the rewrite must keep the size"
    for name, data in zip(NAMES, ORIGINAL, strict=True):
        place.write(name, data)
    before = ingest.list_shards(place.urls, storage_options=place.options)
    assert all(s.version for s in before.shards), [(s.url, s.version) for s in before.shards]
    # Between epochs: a whole epoch read, its state saved.
    whole = place.stream()
    assert sorted(ids(whole)) == sorted(
        i for n in range(SHARDS) for i in range(1000 * (n + 1), 1000 * (n + 1) + ROWS)
    )
    between = json.loads(json.dumps(whole.state_dict()))
    # Mid-epoch.
    part = place.stream()
    it = iter(part)
    head = ids(next(it) for _ in range(4))
    assert len(head) == 4 * BATCH
    mid = json.loads(json.dumps(part.state_dict()))
    place.write(NAMES[0], REWRITTEN)
    after = ingest.list_shards(place.urls, storage_options=place.options)
    was = {s.url.rsplit("/", 1)[1]: s for s in before.shards}
    now = {s.url.rsplit("/", 1)[1]: s for s in after.shards}
    assert now[NAMES[0]].size == was[NAMES[0]].size
    assert now[NAMES[0]].version != was[NAMES[0]].version, (place.name, now[NAMES[0]])
    assert now[NAMES[1]].version == was[NAMES[1]].version, "an untouched shard keeps its version"
    if place.name == "hub":  # the rewrite is a new commit; the state's keeps the old file
        resumed = place.stream()
        resumed.load_state_dict(mid)
        rest = ids(resumed)
        assert sorted(head + rest) == sorted(
            i for n in range(SHARDS) for i in range(1000 * (n + 1), 1000 * (n + 1) + ROWS)
        ), "the rest of the epoch at the state's commit (tests/test_hub.py)"
        return
    for saved in (between, mid):
        resumed = place.stream()
        with pytest.raises(StateError, match=NAMES[0]):
            resumed.load_state_dict(saved)
            next(iter(resumed))


def test_a_server_without_etag_or_last_modified_is_named_in_a_warning(tmp_path: Path) -> None:
    """No version at all: a rewrite of the same size cannot be told, and the listing says so
    naming the URL (once per listing), instead of promising a check it cannot make."""
    (tmp_path / NAMES[0]).write_bytes(ORIGINAL[0])
    with LoopbackHTTP(tmp_path, etag=False, last_modified=False) as server:
        url = server.url(NAMES[0])
        with pytest.warns(UnversionedShardWarning, match=NAMES[0]) as caught:
            listing = ingest.list_shards([url])
    assert listing.shards[0].version == ""
    message = str(caught[0].message)
    assert "neither ETag nor Last-Modified" in message and "size" in message, message
    # Made an error by a warnings filter, a stream over such shards is refused.
    with (
        LoopbackHTTP(tmp_path, etag=False, last_modified=False) as server,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error", UnversionedShardWarning)
        with pytest.raises(UnversionedShardWarning, match=NAMES[0]):
            next(iter(ingest.Stream([server.url(NAMES[0])], batch_size=BATCH)))


def test_a_list_of_unversioned_urls_is_named_in_one_warning(tmp_path: Path) -> None:
    """A list of URLs (an index's: thousands) is one listing: one warning counts them and
    names a few, where each URL was named in a warning of its own."""
    for name, data in zip(NAMES, ORIGINAL, strict=True):
        (tmp_path / name).write_bytes(data)
    with (
        LoopbackHTTP(tmp_path, etag=False, last_modified=False) as server,
        warnings.catch_warnings(record=True) as seen,
    ):
        warnings.simplefilter("always")
        ingest.list_shards([server.url(name) for name in NAMES])
    said = [str(w.message) for w in seen if issubclass(w.category, UnversionedShardWarning)]
    assert len(said) == 1, said
    assert said[0].startswith(f"{SHARDS} shard(s) listed by {SHARDS} URLs"), said[0]
    assert all(name in said[0] for name in NAMES), said[0]


LISTED_DATE = "Mon, 07 Dec 2026 08:00:00 GMT"


@pytest.mark.parametrize(
    ("listed", "headers", "other"),
    [
        ("abc", {"ETag": '"abc"'}, None),
        ("abc", {"ETag": '"abd"', "Last-Modified": LISTED_DATE}, 'ETag "abd"'),
        ("abc", {"ETag": 'W/"abc"'}, None),  # a compressed answer's ETag, weakened (nginx)
        ('W/"abc', {"ETag": 'W/"abc"'}, None),  # a weak ETag as listed (its quotes cut)
        ('W/"abc', {"ETag": '"abc"'}, None),
        ("abc", {"ETag": '"abc-gzip"'}, None),  # Apache's compressed answer
        ("abc", {}, None),  # an answer with no validator tells nothing
        ("abc", {"Last-Modified": LISTED_DATE}, None),  # nor one with only another kind
        (LISTED_DATE, {"Last-Modified": LISTED_DATE, "ETag": '"new"'}, None),
        (LISTED_DATE, {"Last-Modified": "Mon, 07 Dec 2026 08:00:10 GMT"}, "Last-Modified Mon"),
        ("q1w2e3==", {"Content-MD5": "q1w2e3==", "Last-Modified": LISTED_DATE}, None),
    ],
)
def test_an_http_answer_of_another_version_is_told_from_one_of_the_listed(
    listed: str, headers: dict[str, str], other: str | None
) -> None:
    # Each GET of an HTTP shard is checked against the version listed
    # (ingest.storage.sources.http_versions): an answer that changes validators without
    # changing content must not fail the read.
    found = other_version(listed, headers)
    assert found == other if other is None else (found or "").startswith(other)


@pytest.mark.parametrize(
    ("status", "headers", "other"),
    [
        (206, {"Content-Range": "bytes 0-3/100"}, None),
        (206, {"Content-Range": "bytes 0-3/60", "Content-Length": "4"}, 60),
        (206, {"Content-Range": "bytes 0-3/*"}, None),  # a server that does not know
        (206, {"Content-Length": "4"}, None),  # no Content-Range: the part's length only
        (200, {"Content-Length": "100"}, None),  # a whole answer
        (200, {"Content-Length": "60"}, 60),
        (200, {"Content-Length": "60", "Content-Encoding": "gzip"}, None),  # compressed
        (200, {}, None),
    ],
)
def test_an_http_answer_of_another_size_is_told_from_one_of_the_listed(
    status: int, headers: dict[str, str], other: int | None
) -> None:
    assert other_size(100, status, headers) == other
