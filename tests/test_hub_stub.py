"""The loopback Hub (tests/hub_stub.py) against the real huggingface_hub client.

These pin what huggingface_hub 2.3.0's `HfFileSystem` and `HfApi` send, so that a test
built on the stub notices when the client starts calling the Hub differently.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import (
    HfApi,
    HfFileSystem,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
)
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import _http

from tests.hub_stub import HubStub

TOKEN = "hf_stub_secret_token_0123456789"
REPO = "org/name"
PARQUET = "refs/convert/parquet"


@pytest.fixture(autouse=True)
def hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No token from the machine, nothing offline, nothing cached outside tmp_path."""
    for name in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_OIDC_RESOURCE",
        "HF_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    # huggingface_hub reads these at import time: set the module values too.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))


@pytest.fixture
def stub() -> Iterator[HubStub]:
    with HubStub(page_size=10, token=TOKEN) as hub:
        yield hub


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits huggingface_hub's retry loop asks for, recorded instead of slept."""
    waits: list[float] = []
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=waits.append))
    return waits


def new_fs(stub: HubStub, token: str | bool | None = TOKEN) -> HfFileSystem:
    return HfFileSystem(endpoint=stub.endpoint, token=token, skip_instance_cache=True)


def shard(i: int, size: int = 200) -> bytes:
    return bytes((i + j) % 251 for j in range(size))


def train_files(n: int = 25) -> dict[str, bytes]:
    files = {f"data/train-{i:03d}.parquet": shard(i) for i in range(n)}
    files["data/nested/extra.parquet"] = shard(99)
    files["README.md"] = b"# a dataset\n"
    return files


def test_glob_follows_pagination(stub: HubStub) -> None:
    """26 entries in data/, 10 a page: the listing takes 3 `tree` requests via `Link: rel=next`."""
    stub.add_dataset(REPO, train_files())
    fs = new_fs(stub)
    found = fs.glob(f"hf://datasets/{REPO}/data/*.parquet")
    assert found == [f"datasets/{REPO}/data/train-{i:03d}.parquet" for i in range(25)]
    data_pages = [p for k, _, p in stub.requests if k == "tree" and "/tree/main/data?" in p]
    assert len(data_pages) == 3
    assert sum("cursor=" in p for p in data_pages) == 2
    assert stub.count("revision") == 1
    assert stub.count("other") == 0


def test_recursive_glob_lists_every_level(stub: HubStub) -> None:
    stub.add_dataset(REPO, train_files())
    fs = new_fs(stub)
    found = fs.glob(f"hf://datasets/{REPO}/**/*.parquet")
    assert len(found) == 26
    assert f"datasets/{REPO}/data/nested/extra.parquet" in found
    assert stub.count("tree") > 1
    assert any("recursive=true" in p for k, _, p in stub.requests if k == "tree")


def test_info_of_a_file(stub: HubStub) -> None:
    """`info` lists the parent directory (a `tree` call), not the file itself."""
    stub.add_dataset(REPO, train_files())
    fs = new_fs(stub)
    info = fs.info(f"hf://datasets/{REPO}/data/train-003.parquet")
    assert info["type"] == "file"
    assert info["size"] == 200
    assert info["name"] == f"datasets/{REPO}/data/train-003.parquet"
    assert info["xet_hash"] is None
    assert info["lfs"] is not None  # *.parquet is an LFS file, as on the Hub
    assert stub.count("tree") == 3 and stub.count("paths-info") == 0
    assert fs.info(f"hf://datasets/{REPO}/data")["type"] == "directory"
    fs.info(f"hf://datasets/{REPO}/data/train-003.parquet", refresh=True)
    assert stub.count("paths-info") == 1


def test_seek_and_read_sends_a_range(stub: HubStub) -> None:
    stub.add_dataset(REPO, train_files())
    fs = new_fs(stub)
    path = f"hf://datasets/{REPO}/data/train-007.parquet"
    stub.reset_counts()
    with fs.open(path, block_size=16) as f:
        f.seek(50)
        assert f.read(10) == shard(7)[50:60]
    gets = [r for r in stub.records if r.kind == "resolve"]
    assert len(gets) == 1
    assert gets[0].method == "GET" and gets[0].status == 206
    assert gets[0].range is not None and gets[0].range.startswith("bytes=50-")
    assert gets[0].path == f"/datasets/{REPO}/resolve/main/data/train-007.parquet"
    # A whole read from the start streams the file without a Range.
    stub.reset_counts()
    assert fs.cat_file(path) == shard(7)
    assert [(r.status, r.range) for r in stub.records] == [(200, None)]


def test_parquet_export_revision(stub: HubStub) -> None:
    """`@refs%2Fconvert%2Fparquet` reads its own tree, quoted the same way on every route."""
    stub.add_dataset(REPO, train_files())
    export = {
        "default/train/0000.parquet": shard(1, 300),
        "default/train/0001.parquet": shard(2, 300),
    }
    stub.add_dataset(REPO, export, revision=PARQUET)
    fs = new_fs(stub)
    root = HubStub.hf_path(REPO, revision=PARQUET)
    assert root == f"hf://datasets/{REPO}@refs%2Fconvert%2Fparquet"
    found = fs.glob(f"{root}/default/train/*.parquet")
    assert found == [
        f"datasets/{REPO}@refs%2Fconvert%2Fparquet/default/train/000{i}.parquet" for i in (0, 1)
    ]
    assert fs.cat_file(found[1]) == shard(2, 300)
    assert fs.glob(f"{root}/data/*.parquet") == []
    paths = [p for _, _, p in stub.requests]
    assert f"/api/datasets/{REPO}/revision/refs%2Fconvert%2Fparquet" in paths
    assert any(
        p.startswith(f"/api/datasets/{REPO}/tree/refs%2Fconvert%2Fparquet/default%2Ftrain?")
        for p in paths
    )
    assert f"/datasets/{REPO}/resolve/refs%2Fconvert%2Fparquet/default/train/0001.parquet" in paths
    assert (
        HfApi(endpoint=stub.endpoint, token=TOKEN)
        .list_repo_refs(REPO, repo_type="dataset")
        .converts[0]
        .ref
        == PARQUET
    )


def test_pinned_sha_reads_the_old_commit(stub: HubStub) -> None:
    old = stub.add_dataset(REPO, {"data/a.parquet": b"old bytes"})
    new = stub.add_dataset(REPO, {"data/a.parquet": b"new bytes!", "data/b.parquet": b"b"})
    assert old != new and stub.commit_of(REPO) == new and len(new) == 40
    fs = new_fs(stub)
    assert fs.cat_file(f"hf://datasets/{REPO}@{old}/data/a.parquet") == b"old bytes"
    assert fs.glob(f"hf://datasets/{REPO}@{old}/data/*") == [
        f"datasets/{REPO}@{old}/data/a.parquet"
    ]
    assert fs.cat_file(f"hf://datasets/{REPO}/data/a.parquet") == b"new bytes!"
    assert f"/api/datasets/{REPO}/revision/{old}" in [p for _, _, p in stub.requests]
    info = HfApi(endpoint=stub.endpoint, token=TOKEN).dataset_info(REPO, revision=old)
    assert info.sha == old and [s.rfilename for s in info.siblings or []] == ["data/a.parquet"]


def test_429_on_tree_is_retried_after_retry_after(stub: HubStub) -> None:
    """`tree` goes through `http_backoff`: a 429 is retried after Retry-After + 1 s (here 2 s)."""
    stub.add_dataset(REPO, train_files(5))
    fs = new_fs(stub)
    fs.info(f"hf://datasets/{REPO}/README.md")  # the revision lookup, out of the timing
    stub.throttle(1, retry_after=1, kinds=("tree",))
    start = time.monotonic()
    assert len(fs.glob(f"hf://datasets/{REPO}/data/*.parquet")) == 5
    elapsed = time.monotonic() - start
    assert stub.count("throttled") == stub.throttled == 1
    assert 1.9 <= elapsed < 5
    statuses = [r.status for r in stub.records if r.kind == "tree" and "/tree/main/data?" in r.path]
    assert statuses == [429, 200]


def test_429_on_range_read_is_retried(stub: HubStub, sleeps: list[float]) -> None:
    """Range GETs (and the streaming whole-file GET) go through `http_backoff` too. 2.3.0 reads
    only an integer Retry-After: with "0.2" it falls back to its own backoff (1 s, then 2, 4, 8);
    with "3" it waits 3 + 1 s."""
    stub.add_dataset(REPO, train_files(5))
    fs = new_fs(stub)
    path = f"hf://datasets/{REPO}/data/train-002.parquet"
    fs.info(path)
    stub.throttle(1, retry_after=0.2, kinds=("resolve",))
    with fs.open(path, block_size=16) as f:
        f.seek(100)
        assert f.read(4) == shard(2)[100:104]
    assert sleeps == [1]
    stub.throttle(1, retry_after=3, kinds=("resolve",))
    assert fs.cat_file(path) == shard(2)  # the streaming read retries as well
    assert sleeps == [1, 4.0]
    # The Hub's own `RateLimit: "api";r=0;t=2` header wins over Retry-After: 2 + 1 s.
    stub.throttle(1, retry_after=2, kinds=("resolve",), ratelimit_header=True)
    assert fs.cat_file(path) == shard(2)
    assert sleeps == [1, 4.0, 3.0]
    statuses = [r.status for r in stub.records if r.kind == "resolve"]
    assert statuses == [429, 206, 429, 200, 429, 200]


def test_429_on_repo_info_and_paths_info_is_not_retried(stub: HubStub, sleeps: list[float]) -> None:
    """`dataset_info` (the revision lookup) and `paths-info` use the session directly, without
    `http_backoff`: a 429 surfaces as HfHubHTTPError, and a failed lookup is not cached."""
    stub.add_dataset(REPO, train_files(5))
    fs = new_fs(stub)
    path = f"hf://datasets/{REPO}/data/train-001.parquet"
    stub.throttle(1, retry_after=1, kinds=("revision",))
    with pytest.raises(HfHubHTTPError) as err:
        fs.info(path)
    assert err.value.response.status_code == 429
    assert fs.info(path)["size"] == 200  # looked up again, now answered
    stub.throttle(1, kinds=("paths-info",))
    with pytest.raises(HfHubHTTPError) as err:
        fs.info(path, refresh=True)
    assert err.value.response.status_code == 429
    assert sleeps == []
    assert stub.count("revision") == 2 and stub.throttled == 2


def test_wrong_or_missing_token(stub: HubStub) -> None:
    stub.add_dataset(REPO, train_files(3))
    with pytest.raises(HfHubHTTPError) as err:
        new_fs(stub, token="hf_wrong").glob(f"hf://datasets/{REPO}/data/*")
    assert err.value.response.status_code == 401
    assert "Invalid credentials" in str(err.value)
    # No token: the Hub's answer for a private repo, which HfFileSystem reports as missing.
    with pytest.raises(FileNotFoundError, match="repository not found"):
        new_fs(stub, token=False).glob(f"hf://datasets/{REPO}/data/*")
    assert stub.tokens_seen == {"hf_wrong"}
    assert len(new_fs(stub).glob(f"hf://datasets/{REPO}/data/*")) == 4
    assert stub.tokens_seen == {"hf_wrong", TOKEN}


def test_token_stays_out_of_repr(stub: HubStub) -> None:
    stub.add_dataset(REPO, train_files(3))
    fs = new_fs(stub)
    fs.glob(f"hf://datasets/{REPO}/data/*")
    assert TOKEN not in repr(fs) and TOKEN not in str(fs)
    assert not any(TOKEN in p for _, _, p in stub.requests)


def test_not_found_errors_and_unknown_routes(stub: HubStub) -> None:
    stub.add_dataset(REPO, train_files(3))
    api = HfApi(endpoint=stub.endpoint, token=TOKEN)
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("org/missing")
    with pytest.raises(RevisionNotFoundError):
        api.dataset_info(REPO, revision="nope")
    assert api.file_exists(REPO, "README.md", repo_type="dataset")
    assert not api.file_exists(REPO, "missing.parquet", repo_type="dataset")
    fs = new_fs(stub)
    assert not fs.exists(f"hf://datasets/{REPO}/data/missing.parquet")
    assert not fs.exists(f"hf://datasets/{REPO}@nope/README.md")
    with pytest.raises(FileNotFoundError):
        fs.ls(f"hf://datasets/{REPO}/no-such-dir")
    assert stub.count("other") == 0
    with pytest.raises(HfHubHTTPError) as err:
        api.model_info(REPO)  # a model repo: not served
    assert err.value.response.status_code == 404
    assert stub.count("other") == 1


def test_hfapi_downloads_over_plain_http(stub: HubStub, tmp_path: Path) -> None:
    """No Xet headers: metadata has no xet data and hf_hub_download uses HEAD + GET /resolve/."""
    sha = stub.add_dataset(REPO, train_files(3))
    url = hf_hub_url(REPO, "data/train-001.parquet", repo_type="dataset", endpoint=stub.endpoint)
    meta = get_hf_file_metadata(url, token=TOKEN)
    assert meta.commit_hash == sha and meta.size == 200 and meta.xet_file_data is None
    [entry] = HfApi(endpoint=stub.endpoint, token=TOKEN).get_paths_info(
        REPO, "data/train-001.parquet", repo_type="dataset"
    )
    assert isinstance(entry, RepoFile) and entry.lfs is not None
    assert meta.etag == entry.lfs.sha256  # an LFS file's ETag is its sha256
    stub.reset_counts()
    local = hf_hub_download(
        REPO,
        "README.md",
        repo_type="dataset",
        endpoint=stub.endpoint,
        token=TOKEN,
        cache_dir=tmp_path / "cache",
    )
    assert Path(local).read_bytes() == b"# a dataset\n"
    assert [(k, m) for k, m, _ in stub.requests] == [("resolve", "HEAD"), ("resolve", "GET")]


def test_hffs_caches_listings_but_not_the_commit(stub: HubStub) -> None:
    """One HfFileSystem looks a revision up once and keeps listings, but sends `main` (not the
    sha it saw) in every URL: after a new commit it lists the old tree and reads the new bytes.
    Only an `@<sha>` path is pinned."""
    old = stub.add_dataset(REPO, {"data/a.parquet": b"A" * 100})
    fs = new_fs(stub)
    assert fs.glob(f"hf://datasets/{REPO}/data/*") == [f"datasets/{REPO}/data/a.parquet"]
    stub.add_dataset(REPO, {"data/a.parquet": b"a" * 50, "data/c.parquet": b"C"})
    stub.reset_counts()
    assert fs.glob(f"hf://datasets/{REPO}/data/*") == [f"datasets/{REPO}/data/a.parquet"]
    assert fs.info(f"hf://datasets/{REPO}/data/a.parquet")["size"] == 100  # stale
    assert fs.cat_file(f"hf://datasets/{REPO}/data/a.parquet") == b"a" * 50  # fresh
    assert fs.cat_file(f"hf://datasets/{REPO}@{old}/data/a.parquet") == b"A" * 100
    assert not any("/tree/main" in p for _, _, p in stub.requests)
    assert stub.count("revision") == 1  # the @sha one
    fs.invalidate_cache()
    assert len(fs.glob(f"hf://datasets/{REPO}/data/*")) == 2
