"""``hf://`` sources against the loopback Hub (tests/hub_stub.py): one listing pinned to a
commit, kept with the shard index, plain range reads, request counts that do not grow with
ranks or readers, 429s retried as the Hub asks, the token never shown."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import ray

import ingest
from ingest.storage.hub import parse
from ingest.testing import encode, make_table
from tests.hub_stub import HubStub
from tests.test_hub_stub import hf_env  # noqa: F401 - the fixture, used below

TOKEN = "hf_stub_secret_token_0123456789"
REPO = "org/name"
SHARDS, ROWS = 6, 200
META = ("revision", "tree", "paths-info", "commits", "refs", "other")

pytestmark = pytest.mark.usefixtures("hf_env")


def files(first: int = 0, shards: int = SHARDS) -> dict[str, bytes]:
    out = {
        f"data/train-{n:03d}.parquet": encode(
            make_table((first + n) * ROWS, ROWS), "parquet", row_group_rows=50
        )
        for n in range(shards)
    }
    out["README.md"] = b"# a dataset\n"
    return out


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubStub]:
    # A fresh shard index per test: a listing kept by another test is not listed again.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with HubStub(page_size=4, token=TOKEN) as stub:
        stub.add_dataset(REPO, files())
        stub.add_dataset(
            REPO,
            {
                f"default/train/{n:04d}.parquet": encode(make_table(n * 10, 10), "parquet")
                for n in range(3)
            },
            revision="refs/convert/parquet",
        )
        yield stub


def options(stub: HubStub) -> dict[str, Any]:
    return {"endpoint": stub.endpoint, "token": TOKEN}


def counts(stub: HubStub) -> Counter[str]:
    return Counter(kind for kind, _, _ in stub.requests)


def ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in b["id"].tolist()]


def test_parse_takes_an_hf_url_apart() -> None:
    p = parse("hf://datasets/org/name@refs%2Fconvert%2Fparquet/default/train/*.parquet")
    assert (p.repo_type, p.repo_id, p.revision, p.path) == (
        "dataset",
        "org/name",
        "refs/convert/parquet",
        "default/train/*.parquet",
    )
    assert parse("hf://datasets/org/name@refs/convert/parquet/a.parquet").revision == (
        "refs/convert/parquet"
    )
    model = parse("hf://org/model/weights/w.bin")
    assert (model.repo_type, model.repo_id, model.revision, model.path) == (
        "model",
        "org/model",
        None,
        "weights/w.bin",
    )
    with pytest.raises(ingest.ConfigError, match="names no repository"):
        parse("hf://datasets/org")
    with pytest.raises(ingest.ConfigError, match=r"an empty revision.*@main"):
        parse("hf://datasets/org/name@/data/*.parquet")  # was asked as revision ''


def test_a_stream_lists_once_at_a_commit_and_reads_with_range_requests(hub: HubStub) -> None:
    s = ingest.Stream(
        f"hf://datasets/{REPO}/data/*.parquet", batch_size=50, storage_options=options(hub)
    )
    listing = s.listing()
    sha = hub.commit_of(REPO)
    assert [sh.url for sh in listing.shards][:1] == [
        f"hf://datasets/{REPO}@{sha}/data/train-000.parquet"
    ]
    hub.reset_counts()
    assert sorted(ids(s)) == list(range(SHARDS * ROWS))
    c = counts(hub)
    # Listing: one revision lookup; the glob's pages at the commit were kept (shard index).
    assert c["revision"] == 1 and c["tree"] == 0 and c["paths-info"] == 0, c
    assert c["other"] == 0 and set(c) <= {"revision", "resolve"}, c
    assert all(
        r.method == "GET" and "/resolve/" + sha in r.path
        for r in hub.records
        if r.kind == "resolve"
    )
    assert TOKEN in hub.tokens_seen


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_file_the_hub_redirects_is_resolved_once_and_read_from_its_cdn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fmt: str
) -> None:
    """The Hub answers a resolve URL of an LFS or Xet file with a redirect to a signed CDN
    URL, and counts every resolve request against the account's rate limit (3,000 or 5,000
    per 5 minutes): a reader that sends each range request to the resolve URL sends two
    requests a range, and spends the budget on every block it reads. Each file's redirect is
    followed once; its ranges go to the CDN, without the token (a presigned URL refuses a
    second credential). Before, every range request went to the resolve URL (and was
    redirected again)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lfs = ("*.parquet", "*.jsonl")
    with HubStub(page_size=4, token=TOKEN, redirect_lfs=True, lfs_patterns=lfs) as stub:
        stub.add_dataset(
            REPO,
            {
                f"data/train-{n:03d}.{fmt}": encode(
                    make_table(n * ROWS, ROWS), fmt, row_group_rows=20
                )
                for n in range(3)
            },
        )
        read = ingest.ReadOptions(block_bytes=2048, prefetch=0)  # many reads a file
        s = ingest.Stream(
            f"hf://datasets/{REPO}/data/*.{fmt}",
            batch_size=50,
            storage_options=options(stub),
            read=read,
        )
        assert sorted(ids(s)) == list(range(3 * ROWS))
        c = counts(stub)
        assert c["resolve"] == 3, c  # one a file
        assert c["cdn"] > 3, c  # its reads: more than one a file
        assert all(r.status in (200, 206) for r in stub.records if r.kind == "cdn"), [
            (r.status, r.range) for r in stub.records if r.kind == "cdn"
        ]


def past_expiry(stub: HubStub) -> None:
    """Sleep until the signed URL the stub's CDN served last has expired (its ``Expires``, a
    whole second, then a little): a fixed sleep raced the second's boundary."""
    path = [r.path for r in stub.records if r.kind == "cdn"][-1]
    expires = float(dict(parse_qsl(urlsplit(path).query))["Expires"])
    time.sleep(max(0.0, expires - time.time()) + 0.2)


def test_a_signed_url_that_expires_while_a_file_is_read_is_asked_for_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The CDN refuses a signed URL once it expired (403): a file opened on it and read
    past then asks the Hub for a new one and reads on, every byte; a range fetch too."""
    from ingest.formats import FORMAT_RESOLVER
    from ingest.storage.sources import Source

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    payload = bytes(range(256)) * 64
    with HubStub(token=TOKEN, redirect_lfs=True, cdn_ttl_s=1.0) as stub:
        stub.add_dataset(REPO, {"data/a.parquet": payload})
        source = Source(f"hf://datasets/{REPO}/data/a.parquet", storage_options=options(stub))
        (shard,) = source.list_shards(FORMAT_RESOLVER)
        f = source.open(shard, block_size=1024)
        first = f.read(1024)
        past_expiry(stub)  # the URL the file was opened on expired
        rest = f.read()
        assert first + rest == payload
        assert [r.status for r in stub.records if r.kind == "cdn"].count(403) >= 1
        assert len([r for r in stub.records if r.method == "HEAD"]) == 2, stub.records
        past_expiry(stub)
        got = source.fetch_ranges(shard, [0, 5000], [100, 5100])
        got.seek(5000)
        assert got.read(100) == payload[5000:5100]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("data/*.parquet", SHARDS),
        ("data/train-00[0-2].parquet", 3),
        ("data/**/*.parquet", SHARDS),
        ("data/", SHARDS),
    ],
)
def test_a_first_listing_asks_the_revision_once_and_lists_only_the_folder_it_names(
    hub: HubStub, pattern: str, expected: int
) -> None:
    """The revision is resolved to its commit by one request, and the listing at that
    commit asks nothing more about it (HfFileSystem looked the commit up again) nor lists the
    folder above the glob's (fsspec's glob asks for the info of the folder it lists, which
    HfFileSystem finds in the listing of its parent): over the internet, each is a round
    trip on a first batch's path, against the Hub's rate limits."""
    s = ingest.Stream(
        f"hf://datasets/{REPO}/{pattern}", batch_size=50, storage_options=options(hub)
    )
    shards = s.listing().shards
    assert len(shards) == expected
    c = counts(hub)
    assert c["revision"] == 1, hub.requests
    sha = hub.commit_of(REPO)
    trees = [path for kind, _, path in hub.requests if kind == "tree"]
    assert trees and all(f"/tree/{sha}/data" in path for path in trees), trees
    assert c["tree"] == -(-SHARDS // 4), trees  # the folder's pages (page_size=4)
    assert c["paths-info"] == 0 and c["other"] == 0, c


def test_a_restarted_job_does_not_list_again(hub: HubStub) -> None:
    url = f"hf://datasets/{REPO}/data/*.parquet"
    first = ingest.Stream(url, batch_size=50, storage_options=options(hub))
    loop = iter(first)
    head = ids(next(loop) for _ in range(5))
    state = first.state_dict()
    tree_pages = counts(hub)["tree"]
    assert tree_pages >= 2, "the glob was listed, page by page (page_size=4)"
    hub.reset_counts()
    second = ingest.Stream(url, batch_size=50, storage_options=options(hub))
    second.load_state_dict(state)
    rest = ids(second)
    assert sorted(head + rest) == list(range(SHARDS * ROWS))
    c = counts(hub)
    assert c["tree"] == 0 and c["paths-info"] == 0 and c["revision"] == 1, c


def test_the_parquet_export_revision_is_read(hub: HubStub) -> None:
    s = ingest.Stream(
        f"hf://datasets/{REPO}@refs%2Fconvert%2Fparquet/default/train/*.parquet",
        batch_size=10,
        storage_options=options(hub),
    )
    assert sorted(ids(s)) == list(range(30))
    assert all(
        f"@{hub.commit_of(REPO, 'refs/convert/parquet')}/" in sh.url for sh in s.listing().shards
    )


def test_a_branch_that_moves_mid_run_changes_no_shard_under_it(hub: HubStub) -> None:
    url = f"hf://datasets/{REPO}/data/*.parquet"
    s = ingest.Stream(url, batch_size=50, storage_options=options(hub))
    loop = iter(s)
    head = ids(next(loop) for _ in range(3))
    hub.add_dataset(REPO, files(first=100, shards=2))  # main now holds other files
    rest = ids(loop)
    assert sorted(head + rest) == list(range(SHARDS * ROWS)), "the epoch reads its commit"
    assert sorted(ids(s)) == list(range(100 * ROWS, 102 * ROWS)), "the next epoch, the new one"


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9", "http://no-such-host.invalid"])
def test_a_hub_that_cannot_be_reached_is_named_with_the_fix(endpoint: str) -> None:
    """A closed port or a name that does not resolve: huggingface_hub's client (httpx)
    raised a bare ConnectError naming neither the URL nor the fix."""
    url = f"hf://datasets/{REPO}/data/*.parquet"
    retry = ingest.RetryPolicy(deadline_s=2)
    stream = ingest.Stream(
        url,
        batch_size=5,
        storage_options={"endpoint": endpoint, "token": TOKEN},
        read=ingest.ReadOptions(retry=retry),
    )
    with pytest.raises(ingest.SourceError) as e:
        next(iter(stream))
    assert url in str(e.value) and endpoint.split("//")[1] in str(e.value)


@pytest.mark.parametrize("push", ["readme", "rewritten", "added"])
def test_a_state_of_a_branch_that_moved_reads_the_rest_of_its_epoch_at_its_commit(
    hub: HubStub, push: str
) -> None:
    """A commit pushed to the branch since the state was saved (a README edited, a shard
    rewritten, a shard added): every state was refused, as "another dataset" and later
    naming both commits with a URL pinned to the state's. The shard URLs name the commit,
    whose files the Hub keeps as they were, so the rest of the state's epoch is read there
    (every row of it once, a rewritten shard as it was), and the next epoch reads the
    branch's new commit, as a Delta table's state reads its version (tests/test_delta.py)."""
    url = f"hf://datasets/{REPO}/data/*.parquet"
    s = ingest.Stream(url, batch_size=50, storage_options=options(hub))
    loop = iter(s)
    head = ids(next(loop) for _ in range(3))
    state = s.state_dict()
    s.close()
    new = files()
    if push == "readme":
        new["README.md"] = b"# edited\n"
    elif push == "rewritten":  # shard 0 holds other rows now
        new["data/train-000.parquet"] = encode(make_table(10_000, ROWS), "parquet")
    else:
        new |= {k.replace("data/train-", "data/more-"): v for k, v in files(SHARDS, 1).items()}
    hub.add_dataset(REPO, new)
    resumed = ingest.Stream(url, batch_size=50, storage_options=options(hub))
    resumed.load_state_dict(state)
    assert sorted(head + ids(resumed)) == list(range(SHARDS * ROWS))
    # The next epoch reads the branch as it is now.
    now = {int(i) for i in ids(resumed)}
    if push == "rewritten":
        assert now == set(range(ROWS, SHARDS * ROWS)) | set(range(10_000, 10_000 + ROWS))
    elif push == "added":
        assert now == set(range((SHARDS + 1) * ROWS))
    else:
        assert now == set(range(SHARDS * ROWS))


def test_a_dataloader_resumes_a_state_of_a_branch_that_moved_at_its_commit(hub: HubStub) -> None:
    """The same through ``ingest.DataLoader(num_workers=2)``: its workers read the rest of
    the epoch at the state's commit, as its main process listed it."""
    url = f"hf://datasets/{REPO}/data/*.parquet"
    loader = ingest.DataLoader(
        ingest.Stream(url, batch_size=50, storage_options=options(hub)), num_workers=2
    )
    loop = iter(loader)
    head = ids(next(loop) for _ in range(4))
    state = loader.state_dict()
    del loop, loader
    hub.add_dataset(
        REPO, {**files(), "data/train-000.parquet": encode(make_table(10_000, ROWS), "parquet")}
    )
    resumed = ingest.DataLoader(
        ingest.Stream(url, batch_size=50, storage_options=options(hub)), num_workers=2
    )
    resumed.load_state_dict(state)
    assert sorted(head + ids(resumed)) == list(range(SHARDS * ROWS))


def test_a_state_between_epochs_of_a_branch_that_moved_goes_on_at_the_new_commit(
    hub: HubStub,
) -> None:
    """A state taken at an epoch's end, a shard added since: its next epoch reads the new
    commit (it was refused as another dataset's)."""
    url = f"hf://datasets/{REPO}/data/*.parquet"
    s = ingest.Stream(url, batch_size=50, storage_options=options(hub))
    assert sorted(ids(s)) == list(range(SHARDS * ROWS))
    state = s.state_dict()
    s.close()
    more = {k.replace("data/train-", "data/more-"): v for k, v in files(SHARDS, 1).items()}
    hub.add_dataset(REPO, files() | more)
    resumed = ingest.Stream(url, batch_size=50, storage_options=options(hub))
    resumed.load_state_dict(state)
    assert sorted(ids(resumed)) == list(range((SHARDS + 1) * ROWS))


def test_a_missing_commit_or_folder_says_what_to_check(hub: HubStub) -> None:
    """A commit that does not exist was told to "check the endpoint and the network", a
    folder the repository lacks to "check the bucket and prefix"."""
    commit = f"hf://datasets/{REPO}@{'a' * 40}/data/*.parquet"
    with pytest.raises(ingest.SourceError, match=r"check the revision") as e:
        next(iter(ingest.Stream(commit, batch_size=5, storage_options=options(hub))))
    assert "network" not in str(e.value)
    folder = f"hf://datasets/{REPO}/nodir/*.parquet"
    with pytest.raises(ingest.NoShardsError, match=r"check the path in the repository") as e:
        next(iter(ingest.Stream(folder, batch_size=5, storage_options=options(hub))))
    assert "bucket" not in str(e.value)


def test_following_a_hub_branch_is_refused_with_the_reason() -> None:
    """Each round of a followed branch lists it at its newest commit, where the files a
    round read have other URLs: the round after a push failed, saying a file it read had
    "vanished". Refused when the stream is made, naming why and what to do."""
    url = f"hf://datasets/{REPO}/data/*.parquet"
    with pytest.raises(ingest.ConfigError, match=r"follow= .*hf://.*commit.*new stream"):
        ingest.Stream(url, batch_size=5, follow=ingest.Follow(poll_s=1))


def test_429s_are_retried_as_the_hub_asks(hub: HubStub) -> None:
    hub.throttle(1, retry_after=1, kinds=("revision",))
    hub.throttle(2, retry_after=1, kinds=("resolve",))
    s = ingest.Stream(
        f"hf://datasets/{REPO}/data/*.parquet", batch_size=50, storage_options=options(hub)
    )
    assert sorted(ids(s)) == list(range(SHARDS * ROWS))
    assert hub.throttled == 3 and s.stats["retries"] >= 3


def test_the_token_never_shows(hub: HubStub) -> None:
    with pytest.raises(ingest.SourceError) as raised:
        ingest.Stream("hf://datasets/org/missing/*.parquet", storage_options=options(hub)).listing()
    assert "org/missing" in str(raised.value) and TOKEN not in str(raised.value)
    wrong = {"endpoint": hub.endpoint, "token": "hf_wrong_token_abcdefghij"}
    with pytest.raises(ingest.SourceError) as raised:
        ingest.Stream(f"hf://datasets/{REPO}/data/*.parquet", storage_options=wrong).listing()
    assert "hf_wrong_token_abcdefghij" not in str(raised.value)


@ray.remote(num_cpus=0)
def _consume(it: Any) -> list[int]:
    return ids(it)


def _ray_counts(hub: HubStub, world_size: int, readers: int, index: Path) -> Counter[str]:
    hub.reset_counts()
    pool = ingest.ReaderPool(min_size=readers, max_size=readers, num_cpus=0.25)
    with ingest.RayStream(
        f"hf://datasets/{REPO}/data/*.parquet",
        world_size=world_size,
        batch_size=25,
        storage_options=options(hub),
        readers=pool,
        index=ingest.IndexConfig(location=str(index)),  # a new one: the glob is listed
    ) as rs:
        got = ray.get(
            [_consume.remote(rs.rank_iterator(r)) for r in range(world_size)], timeout=240
        )
    delivered = [i for g in got for i in g]
    assert sorted(delivered) == list(range(SHARDS * ROWS))
    return counts(hub)


@pytest.mark.usefixtures("ray_session")
def test_hub_requests_do_not_grow_with_ranks_or_readers(hub: HubStub, tmp_path: Path) -> None:
    one = _ray_counts(hub, 2, 1, tmp_path / "one")
    eight = _ray_counts(hub, 2, 8, tmp_path / "eight")
    four_ranks = _ray_counts(hub, 4, 8, tmp_path / "four")
    print(
        f"hub requests: 1 reader {dict(one)}; 8 readers {dict(eight)}; 4 ranks {dict(four_ranks)}"
    )
    listing = [sum(c[k] for k in META) for c in (one, eight, four_ranks)]
    # One listing, by the driver, whatever the readers and ranks: the coordinator waits for
    # it (a reader's first call could come first and list again: [5, 6, 5] in a full run).
    assert listing[0] > 1 and listing[1] == listing[0] and listing[2] == listing[0], (
        "one listing, by the driver",
        listing,
    )
    assert one["other"] == 0 and eight["resolve"] == one["resolve"], (one, eight)
    assert four_ranks["resolve"] <= one["resolve"] + 2 * SHARDS
    # A driver's listing slower than the readers' start (its first tree request answered 429,
    # retried 10 s later): the readers' first calls wait for it, and nobody lists again.
    hub.throttle(1, retry_after=10, kinds=("tree",))
    slow = _ray_counts(hub, 2, 1, tmp_path / "slow")
    assert sum(slow[k] for k in META) == listing[0] + 1, (dict(slow), dict(one))


def test_an_image_folder_on_the_hub(hub: HubStub) -> None:
    import io

    import numpy as np
    from PIL import Image

    def png(red: int) -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.full((4, 4, 3), (red, 0, 0), np.uint8)).save(out, format="PNG")
        return out.getvalue()

    tree = {
        f"pets/{c}/{n}.png": png(40 * i) for i, c in enumerate(("cat", "dog")) for n in range(5)
    }
    hub.add_dataset("org/pets", {**tree, "pets/README.md": b"#"})
    s = ingest.Stream(
        "hf://datasets/org/pets/pets/",
        format="imagefolder",
        batch_size=5,
        storage_options=options(hub),
        transform=ingest.decode.Images((4, 4)),
    )
    seen = 0
    for batch in s:
        assert ((batch["image"][:, 0, 0, 0] * 255).round().long() == 40 * batch["label"]).all()
        seen += len(batch["label"])
    assert seen == 10 and s.state_dict()["dataset"]["classes"] == ["cat", "dog"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("cached", [False, True])
def test_a_file_gone_from_the_hub_after_the_listing_is_quarantined_under_skip(
    hub: HubStub, tmp_path: Path, cached: bool, fmt: str
) -> None:
    hub.add_dataset(
        "org/gone", {f"d/{n}.{fmt}": encode(make_table(n * ROWS, ROWS), fmt) for n in range(3)}
    )
    cache = ingest.CacheOptions(str(tmp_path / "c"), max_bytes=1 << 30) if cached else None
    s = ingest.Stream(
        f"hf://datasets/org/gone/d/*.{fmt}",
        batch_size=50,
        storage_options=options(hub),
        read=ingest.ReadOptions(on_error="skip", cache=cache),
    )
    gone = s.listing().shards[1].url
    hub.purge("org/gone", f"d/1.{fmt}")  # 404 at its resolve URL, at every commit
    assert sorted(ids(s)) == [*range(ROWS), *range(2 * ROWS, 3 * ROWS)]
    [record] = s.quarantined
    # A JSONL shard's rows are not counted before it is read: to its end.
    assert record.url == gone and record.rows == (ROWS if fmt == "parquet" else None), record
    assert "disappeared after it was listed" in record.reason, record.reason


def damaged_once(hub: HubStub, tmp_path: Path, downloads: int, on_error: str) -> Any:
    """A JSONL dataset read through the shard cache; the first ``downloads`` whole-file
    downloads arrive with a byte flipped (right size, so the copy is kept and sealed)."""
    hub.add_dataset(
        "org/flip", {f"d/{n}.jsonl": encode(make_table(n * ROWS, ROWS), "jsonl") for n in range(2)}
    )
    cache = ingest.CacheOptions(str(tmp_path / "c"), max_bytes=1 << 30)
    s = ingest.Stream(
        "hf://datasets/org/flip/d/*.jsonl",
        batch_size=50,
        shuffle_seed=None,
        storage_options=options(hub),
        read=ingest.ReadOptions(on_error=on_error, cache=cache, prefetch=0),
    )
    s.listing()
    hub.corrupt(downloads)
    return s


def test_a_cached_copy_that_fails_to_read_is_fetched_again_once(
    hub: HubStub, tmp_path: Path
) -> None:
    s = damaged_once(hub, tmp_path, downloads=1, on_error="raise")
    assert sorted(ids(s)) == list(range(2 * ROWS))
    assert s.stats["cache_misses"] == 3, s.stats  # shard 0 twice: damaged, then whole


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_shard_that_fails_to_read_from_two_fresh_copies_is_blamed(
    hub: HubStub, tmp_path: Path, on_error: str
) -> None:
    s = damaged_once(hub, tmp_path, downloads=2, on_error=on_error)
    if on_error == "raise":
        with pytest.raises(ingest.ShardError, match=r"/d/[01]\.jsonl at line \d+") as raised:
            ids(s)
        url = raised.value.url
    else:
        got = sorted(ids(s))
        [record] = s.quarantined  # the damaged line of the second copy, no more
        url = record.url
        first = int(url[-len("0.jsonl")]) * ROWS + record.start
        assert record.rows == 1 and got == [i for i in range(2 * ROWS) if i != first]
    path = url.split("@", 1)[1].split("/", 1)[1]
    downloads = [
        r
        for r in hub.records
        if r.kind == "resolve" and r.method == "GET" and r.path.endswith(path) and not r.range
    ]
    assert len(downloads) == 2, "fetched again once, then blamed"


@pytest.mark.usefixtures("ray_session")
def test_ray_data_read_takes_fewer_hub_requests_than_read_parquet(hub: HubStub) -> None:
    """ingest.ray_data.read on the Hub: the same rows as ray.data.read_parquet over
    huggingface_hub's filesystem, with fewer requests (one listing pinned to a commit, footers
    read once by the driver, range reads)."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import ray.data
    from huggingface_hub import HfFileSystem

    def table(dataset: ray.data.Dataset) -> pa.Table:
        got = pa.concat_tables(ray.get(ref) for ref in dataset.to_arrow_refs())
        return got.select(["id", "text"]).sort_by("id")

    hub.reset_counts()
    ours = table(
        ingest.ray_data.read(f"hf://datasets/{REPO}/data/*.parquet", storage_options=options(hub))
    )
    mine = counts(hub)
    hub.reset_counts()
    fs = HfFileSystem(endpoint=hub.endpoint, token=TOKEN)
    paths = sorted(fs.glob(f"datasets/{REPO}/data/*.parquet"))
    handler = pafs.PyFileSystem(pafs.FSSpecHandler(fs))
    theirs = table(ray.data.read_parquet(paths, filesystem=handler))
    others = counts(hub)
    print(f"hub requests: ingest.ray_data.read {dict(mine)}; ray.data.read_parquet {dict(others)}")
    assert ours.num_rows == SHARDS * ROWS and ours.equals(theirs)
    assert sum(mine.values()) < sum(others.values()), (dict(mine), dict(others))
