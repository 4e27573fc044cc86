"""Sources: one listing with sizes and versions, on local disk and the loopback S3 server."""

from __future__ import annotations

import ast
import errno
import os
import pickle
import sys
import warnings
from pathlib import Path
from types import CodeType, FunctionType
from typing import Any

import pytest

import ingest
import ingest.core.errors
import ingest.storage.sources
from ingest.formats import FORMAT_RESOLVER
from ingest.storage.sources import (
    BrokenLinkWarning,
    MixedSplitsWarning,
    Source,
    parse_storage_options,
)
from ingest.storage.sources.listing import _is_glob
from ingest.storage.sources.splits import split_of
from ingest.testing import Store, encode, make_table


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


@pytest.mark.parametrize("glob", [False, True])
def test_files_under_folders_named_like_writer_droppings_are_no_shards(
    store: Store, glob: bool
) -> None:
    """Spark's ``_temporary/`` (a failed task's copy), Jupyter's ``.ipynb_checkpoints/``, a
    writer's ``.staging/``: files below a folder whose name starts with ``_`` or ``.`` are no
    shards, as files so named are not (pyarrow and Spark skip them alike). They were read:
    every row of the copies twice, without a word."""
    for n, name in enumerate(["part-0.parquet", "p=1/part-1.parquet"]):
        store.write(f"o/{name}", encode(make_table(10 * n, 10), "parquet"))
    for name in ["_temporary/0/_temporary/a/part-0.parquet", ".ipynb_checkpoints/x.parquet"]:
        store.write(f"o/{name}", encode(make_table(0, 10), "parquet"))
    store.write("o/p=1/.staging/part-1.parquet", encode(make_table(10, 10), "parquet"))
    url = store.url("o/**/*.parquet" if glob else "o")
    listing = ingest.list_shards(url, storage_options=store.storage_options)
    assert [s.url.split("/o/", 1)[1] for s in listing.shards] == [
        "p=1/part-1.parquet",
        "part-0.parquet",
    ]
    # A folder so named that the URL names is read: the rule holds below what is listed.
    so = store.storage_options
    named = ingest.list_shards(store.url("o/.ipynb_checkpoints"), storage_options=so)
    assert [s.url.split("/o/", 1)[1] for s in named.shards] == [".ipynb_checkpoints/x.parquet"]


def test_a_local_folder_named_through_dot_or_dot_dot_is_one_folder(local: Store) -> None:
    """``d/../d`` and ``d/./`` name the folder ``d`` names: its files are listed once, under
    one URL each. They were listed again (every row twice, without a word), under URLs that
    kept ``/../``, so that a state saved with one spelling was another dataset's to the
    other."""
    for n in range(3):
        local.write(f"d/p{n}.parquet", encode(make_table(10 * n, 10), "parquet"))
    url = local.url("d")
    urls = [url, f"{url}/../d", f"{url}/./", f"{url}/./*.parquet"]
    listing = ingest.list_shards(urls)
    assert [s.url for s in listing.shards] == [f"{url}/p{n}.parquet" for n in range(3)]
    stream = ingest.Stream(urls, batch_size=5, shuffle_seed=0)
    it = iter(stream)
    got = [i for _ in range(2) for i in next(it)["id"].tolist()]
    resumed = ingest.Stream(f"{url}/../d/", batch_size=5, shuffle_seed=0)
    resumed.load_state_dict(stream.state_dict())
    assert sorted(got + [i for b in resumed for i in b["id"].tolist()]) == list(range(30))


def test_a_question_mark_in_a_listed_name_is_part_of_the_name(store: Store) -> None:
    """A file or key named ``page?id=7.parquet`` (a crawl keyed by its URL) is a shard of a
    directory's listing like any other. Before, its name was cut at the ``?`` as if a query
    string followed (``page``, no extension) and the shard was left out without a word; and
    with it read, ``?id=7`` and ``?id=8`` were scrubbed to one URL (``?id=***``)."""
    names = ["page?id=7.parquet", "page?id=8.parquet", "plain.parquet"]
    for n, name in enumerate(names):
        store.write(f"q/{name}", encode(make_table(5 * n, 5), "parquet"))
    listing = ingest.list_shards(store.url("q"), storage_options=store.storage_options)
    # Its own name, whole: no query value scrubbed (two such names would be one shard).
    assert [s.url.rsplit("/", 1)[1] for s in listing.shards] == names
    stream = ingest.Stream(store.url("q"), batch_size=5, storage_options=store.storage_options)
    assert sorted(i for b in stream for i in b["id"].tolist()) == list(range(15))


def test_a_file_named_with_glob_characters_is_read_when_named(store: Store) -> None:
    """A URL that names one file whose name holds a glob's characters (``[1].parquet``,
    ``run[a].parquet``: a bracket is a character class to a glob) reads that file, alone or
    in a list of URLs. Before, the URL was taken for a glob only, which matched no file:
    ``NoShardsError: matches no data files``. A glob that matches files is a glob still."""
    for n, name in enumerate(["[1].parquet", "run[a].parquet", "1.parquet", "s[b].parquet"]):
        store.write(f"g/{name}", encode(make_table(5 * n, 5), "parquet"))
    options = store.storage_options

    def ids(url: str | list[str]) -> list[int]:
        stream = ingest.Stream(url, batch_size=5, storage_options=options)
        return sorted(i for b in stream for i in b["id"].tolist())

    assert ids(store.url("g", "run[a].parquet")) == list(range(5, 10))
    assert ids([store.url("g", "run[a].parquet"), store.url("g", "s[b].parquet")]) == [
        *range(5, 10),
        *range(15, 20),
    ]
    listing = ingest.list_shards(store.url("g", "run[a].parquet"), storage_options=options)
    assert [s.url.rsplit("/", 1)[1] for s in listing.shards] == ["run[a].parquet"]
    # "[1].parquet" as a glob matches "1.parquet": a glob that matches is read as one.
    assert ids(store.url("g", "[1].parquet")) == list(range(10, 15))
    with pytest.raises(ingest.NoShardsError, match="matches no data files"):
        ids(store.url("g", "[2].parquet"))


@pytest.mark.parametrize(
    ("path", "split"),
    [
        ("data/train-00000-of-00004.parquet", "train"),
        ("train.jsonl", "train"),
        ("en/training_set/part-0.parquet", "train"),
        ("validation/part.parquet", "validation"),
        ("data/val-0.parquet", "validation"),
        ("dev.tsv", "validation"),
        ("wiki.test.raw.txt", "test"),
        ("eval/x.jsonl", "test"),
        ("part-00000.parquet", None),
        ("attestation/a.parquet", None),
        ("retrain.parquet", None),
        ("interval-3/devices.jsonl", None),
        ("contest_entries.csv", None),
    ],
)
def test_the_split_a_path_names_is_datasets_rule(path: str, split: str | None) -> None:
    assert split_of(path) == split


def test_a_listing_of_several_splits_is_warned_about(store: Store) -> None:
    """A dataset laid out as the Hub's are (``data/train-00000-of-00004.parquet`` beside
    ``data/test-...``, or ``train/`` and ``validation/`` folders) listed from its root mixes
    its splits: the test rows are trained on, without a word (before). It is warned about,
    naming each split's files, as ``datasets`` tells splits apart by these names; a glob or
    folder of one split, or URLs named one by one, are not."""
    for name in [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
        "data/test-00000-of-00001.parquet",
        "dev/part.parquet",
    ]:
        store.write(f"hub/{name}", encode(make_table(0, 5), "parquet"))
    options = store.storage_options
    with pytest.warns(MixedSplitsWarning, match=r"3 splits.*train: 2 .*validation: 1 .*test: 1"):
        ingest.list_shards(store.url("hub"), storage_options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixedSplitsWarning)
        ingest.list_shards(store.url("hub/data/train-*.parquet"), storage_options=options)
        ingest.list_shards(
            [store.url("hub/data/train-00000-of-00002.parquet"), store.url("hub/dev/part.parquet")],
            storage_options=options,
        )
        # Words that hold a split's name are none: "attestation", "eval" in the root's own path.
        store.write("evaluation-runs/attestations/a.parquet", encode(make_table(0, 5), "parquet"))
        store.write("evaluation-runs/retrain_notes/b.parquet", encode(make_table(0, 5), "parquet"))
        ingest.list_shards(store.url("evaluation-runs"), storage_options=options)


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


def test_paths_are_urls_and_other_objects_are_refused(local: Store) -> None:
    """A pathlib.Path is a local URL, alone or in a list (it raised 'PosixPath' object is
    not iterable, or has no attribute 'decode'); a value that is neither is named."""
    local.write("d/a.parquet", encode(make_table(0, 10), "parquet"))
    root = Path(local.url("d").removeprefix("file://"))
    assert [i.rows for i in ingest.list_shards(root).infos] == [10]
    assert sum(len(b["id"]) for b in ingest.Stream(root, batch_size=5)) == 10
    local.write("d/b.parquet", encode(make_table(10, 10), "parquet"))
    both: list[str | Path] = [root / "a.parquet", str(root / "b.parquet")]
    assert sum(len(b["id"]) for b in ingest.Stream(both, batch_size=5)) == 20
    assert sum(len(b["id"]) for b in ingest.Stream(iter(both), batch_size=5)) == 20
    with pytest.raises(ingest.ConfigError, match=r"source URL 3 \(int\) is not a string"):
        ingest.Stream([str(root), 3])  # type: ignore[list-item]
    with pytest.raises(ingest.ConfigError, match=r"source URL None \(NoneType\) is not a"):
        ingest.list_shards(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["", "  ", "file://", "s3://"])
def test_an_empty_url_is_refused_not_read_as_the_working_directory(
    local: Store, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """``ingest.Stream(os.environ.get("DATA", ""))`` with the variable unset: an empty URL
    (or a scheme alone) read the working directory, a training on whatever lay there."""
    local.write("cwd/a.parquet", encode(make_table(0, 7), "parquet"))
    monkeypatch.chdir(local.url("cwd").removeprefix("file://"))
    with pytest.raises(ingest.ConfigError, match=r"source URL .* names nothing: .*unset"):
        ingest.Stream(url, batch_size=1)
    with pytest.raises(ingest.ConfigError, match=r"names nothing"):
        ingest.list_shards(["a.parquet", url])


def test_symlinked_shards_are_listed_as_the_files_they_name(local: Store) -> None:
    """The Hugging Face cache's layout (``snapshots/<rev>/x.jsonl -> ../../blobs/<hash>``):
    fsspec lists a symlink as 'other', and the listing left it out, so a folder of links was
    'no data files' and a link beside files was dropped with its rows, silently. A link's
    size and version are its file's (a change of the file is seen); a broken link (a
    git-annex or DVC checkout whose object was never fetched) is left out, named in a
    warning: its rows were lost without a word."""
    root = Path(local.url("hf").removeprefix("file://"))
    (root / "blobs").mkdir(parents=True)
    (root / "snap").mkdir()
    for k in range(3):
        (root / "blobs" / f"b{k}").write_bytes(encode(make_table(k * 10, 10), "jsonl"))
        (root / "snap" / f"p{k}.jsonl").symlink_to(f"../blobs/b{k}")
    local.write("hf/snap/real.jsonl", encode(make_table(30, 10), "jsonl"))
    (root / "snap" / "broken.jsonl").symlink_to("../blobs/none")
    for url in (root / "snap", root / "snap" / "*.jsonl"):
        with pytest.warns(BrokenLinkWarning, match=r"1 link\(s\) .*snap/broken.jsonl.*git annex"):
            stream = ingest.Stream(str(url), batch_size=8)
            ids = sorted(i for b in stream for i in b["id"].tolist())
        assert ids == list(range(40)), url
    before = ingest.list_shards(root / "snap").shards[0]
    assert before.size == (root / "blobs" / "b0").stat().st_size
    os.utime(root / "blobs" / "b0", (1, 1))
    assert ingest.list_shards(root / "snap").shards[0].version != before.version


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
    modules: set[str] = set()
    for path in Path(ingest.storage.sources.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "ingest.core.errors" in modules  # the package's modules were read
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


def test_redact_hides_url_userinfo_and_query_values_in_free_text() -> None:
    text = "GET s3://AKIA:pw1234@b/k and https://h/x.parquet?token=abc123&sig=zz failed"
    assert ingest.core.errors.redact(text) == (
        "GET s3://***@b/k and https://h/x.parquet?token=***&sig=*** failed"
    )


def test_a_query_is_not_a_glob_but_a_question_mark_in_a_path_is() -> None:
    assert not _is_glob("bucket/a.parquet?token=abc")
    assert not _is_glob("https://h/a.parquet?X-Amz-Signature=a/b")
    assert _is_glob("bucket/part-?.parquet")
    assert _is_glob("bucket/*.parquet?token=abc")


def test_s3_url_credentials_are_used_and_never_listed(s3_store: Store) -> None:
    s3_store.write("d/a.jsonl", b'{"id": 1}\n')
    options = {"client_kwargs": s3_store.storage_options["client_kwargs"]}
    url = s3_store.url("d").replace("s3://", "s3://testing:an-url-secret@")
    source = Source(url, storage_options=options)
    shards = source.list_shards(FORMAT_RESOLVER)
    assert [s.url for s in shards] == [s3_store.url("d", "a.jsonl")]
    assert source.scrub(f"denied for an-url-secret at {url}") == (
        f"denied for *** at {s3_store.url('d').replace('s3://', 's3://***@')}"
    )
    with pytest.raises(ingest.ConfigError, match="different credentials"):
        Source([url, url.replace("an-url-secret", "another")])


def test_a_shard_cut_short_after_listing_is_an_error_not_fewer_rows(local: Store) -> None:
    path = local.write("d/a.jsonl", b"".join(b'{"id": %d}\n' % i for i in range(100)))
    source = Source(local.url("d"))
    (shard,) = source.list_shards(FORMAT_RESOLVER)
    Path(path.removeprefix("file://")).write_bytes(b'{"id": 0}\n')
    with source.open(shard) as f, pytest.raises(ingest.ShardError, match=r"bytes \[0, \d+\)"):
        f.read()


def test_retry_policy_is_validated_and_retries_are_counted() -> None:
    with pytest.raises(ingest.ConfigError, match="deadline_s"):
        ingest.storage.sources.RetryPolicy(deadline_s=0)
    with pytest.raises(ingest.ConfigError, match="backoff_s"):
        ingest.storage.sources.RetryPolicy(backoff_s=10, max_backoff_s=1)
    policy = ingest.storage.sources.RetryPolicy(backoff_s=0.5, max_backoff_s=2)
    # Full jitter: uniform in [0, bound], the bound doubling per retry up to max_backoff_s.
    first = [policy.backoff(0) for _ in range(200)]
    late = [policy.backoff(9) for _ in range(200)]
    assert all(0 <= w <= 0.5 for w in first) and max(first) > 0.25 > min(first)
    assert all(0 <= w <= 2 for w in late) and max(late) > 1.0 > min(late)
    assert Source("s3://b/").stats.as_dict()["retries"] == 0


@pytest.fixture
def s3fs_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits s3fs's retry loop (``s3fs.core._error_wrapper``) takes: recorded, not
    slept. Every other caller of ``asyncio.sleep`` sleeps as usual."""
    import asyncio

    import s3fs.core

    loop_code = s3fs.core._error_wrapper.__code__
    real_sleep = asyncio.sleep
    slept: list[float] = []

    async def sleep(seconds: float, *args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code is loop_code:
            slept.append(seconds)
            return None
        return await real_sleep(seconds, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return slept


def _throttled_shard(s3: Any, bucket: str) -> tuple[str, dict[str, Any], Any]:
    """A shard on the loopback S3 server, storage options that reach it through a proxy
    answering every GET and HEAD with 503 SlowDown, and the proxy (to enter)."""
    from ingest.testing import FaultProxy, Faults

    path = s3.create_bucket(bucket).removeprefix("s3://") + "/a.jsonl"
    s3.filesystem().pipe(path, b'{"id": 1}\n' * 10)
    proxy = FaultProxy(s3.endpoint, Faults(slow_down=1.0))
    return path, s3.storage_options(endpoint=proxy.endpoint), proxy


def test_ingest_s3_calls_raise_at_once_after_their_only_attempt(
    s3: Any, s3fs_sleeps: list[float]
) -> None:
    """A failed S3 call of a source raises at once: the backoff is the source's alone (s3fs
    slept 0.1 s after its last attempt, which was most of what a fault cost). Each of s3fs's
    retry loops a source goes through: around a request (a listing), and around a request and
    the read of its body (range reads, a file's reads)."""
    import asyncio

    import aiohttp
    from botocore.exceptions import ClientError

    from ingest.storage.sources import s3 as one_attempt
    from ingest.testing import Faults

    path, options, proxy = _throttled_shard(s3, "one-attempt")
    with proxy:
        fs = Source(f"s3://{path}", storage_options=options).filesystem(f"s3://{path}")
        assert isinstance(fs, one_attempt.OneAttemptS3FileSystem) and fs.retries == 1
        with pytest.raises(OSError) as throttled:  # a listing: one request
            fs.ls(path.rsplit("/", 1)[0], refresh=True)
        assert throttled.value.errno == errno.EBUSY  # 503 SlowDown, translated as s3fs does
        proxy.set_faults(Faults(drop=1.0, ranges_only=True))  # every body cut short
        with pytest.raises(aiohttp.ClientPayloadError):
            fs.cat_ranges([path], [0], [5], on_error="raise")
        with (
            fs.open(path, "rb", size=100, cache_type="none") as f,
            pytest.raises(aiohttp.ClientPayloadError),
        ):
            f.read(5)
        assert proxy.counts()["slow_down"] == 1 and proxy.counts()["drop"] == 2
    assert s3fs_sleeps == []

    async def slow_down() -> None:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "SlowDown"}}, "GetObject")

    with pytest.raises(OSError, match="SlowDown"):  # more attempts: s3fs's own loop
        asyncio.run(one_attempt._error_wrapper(slow_down, retries=2))
    assert len(s3fs_sleeps) == 2


def test_a_users_own_s3fs_is_stock_s3fs_after_a_stream_ran(
    s3: Any, s3fs_sleeps: list[float]
) -> None:
    """What makes a source's S3 calls raise at once is scoped to the filesystems sources
    make: s3fs is not patched, so a user's own S3FileSystem in the same process keeps s3fs's
    retry loop, sleep after the last attempt included."""
    import s3fs.core

    from ingest.testing import write_dataset

    root = s3.create_bucket("stock-s3fs") + "/d"
    write_dataset(s3.filesystem(), root, "jsonl", 2, 10)
    stream = ingest.Stream(root, batch_size=5, storage_options=s3.storage_options())
    assert sorted(int(i) for batch in stream for i in batch["id"]) == list(range(20))

    assert s3fs.core._error_wrapper.__code__.co_filename == s3fs.core.__file__
    assert s3fs.S3FileSystem.retries == 5
    path, options, proxy = _throttled_shard(s3, "stock-s3fs")
    with proxy:
        # One attempt per call, as a source's (botocore's retries off too): stock s3fs
        # still sleeps after it.
        user = s3fs.S3FileSystem(
            **options, config_kwargs={"retries": {"total_max_attempts": 1, "mode": "standard"}}
        )
        assert type(user) is s3fs.S3FileSystem and user.retries == 5
        user.retries = 1
        with pytest.raises(OSError, match="reduce your request rate"):  # SlowDown
            user.cat_file(path, start=0, end=5)
        assert s3fs_sleeps == [0.1]
        ours = Source(f"s3://{path}", storage_options=options).filesystem(f"s3://{path}")
        with pytest.raises(OSError, match="reduce your request rate"):
            ours.cat_file(path, start=0, end=5)
        assert s3fs_sleeps == [0.1]  # none more


def _names(code: CodeType) -> set[str]:
    """The global and attribute names ``code`` and the functions nested in it use."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            out |= _names(const)
    return out


def _functions_naming(holder: Any, names: set[str]) -> dict[str, FunctionType]:
    """The functions of s3fs.core defined in ``holder`` (the module or a class) that use any
    of ``names``."""
    return {
        name: f
        for name, f in vars(holder).items()
        if isinstance(f, FunctionType)
        and f.__module__ == "s3fs.core"
        and _names(f.__code__) & names
    }


def test_every_s3fs_function_that_reaches_its_retry_loop_is_rebound() -> None:
    """s3fs calls ``_error_wrapper`` from a few functions; each one (and each that reaches
    it through another, or opens an ``S3File``) must run the source's copy, or that path
    sleeps after its last attempt again: this fails on an s3fs that adds one."""
    import s3fs.core

    from ingest.storage.sources import s3 as one_attempt

    reach = {"_error_wrapper"}
    while more := set(_functions_naming(s3fs.core, reach)) - reach:
        reach |= more
    if _functions_naming(s3fs.core.S3File, reach):
        reach.add("S3File")  # s3fs opens its files by that name
    ours = {
        s3fs.core.S3FileSystem: one_attempt.OneAttemptS3FileSystem,
        s3fs.core.S3File: one_attempt.OneAttemptS3File,
    }
    classes = [c for c in vars(s3fs.core).values() if isinstance(c, type)]
    assert {c for c in classes if _functions_naming(c, reach)} <= set(ours)
    assert set(_functions_naming(s3fs.core.S3FileSystem, reach)) == {
        "_call_s3",
        "_cat_file",
        "_open",
    }
    for stock, mine in ours.items():
        for name in _functions_naming(stock, reach):
            assert vars(mine)[name].__globals__ is one_attempt._NAMESPACE, name
    for name in reach - {"_error_wrapper", "S3File"}:
        assert one_attempt._NAMESPACE[name].__globals__ is one_attempt._NAMESPACE, name
    assert one_attempt._NAMESPACE["S3File"] is one_attempt.OneAttemptS3File
    assert one_attempt._NAMESPACE["_error_wrapper"] is one_attempt._error_wrapper


def test_s3_filesystems_share_the_parsed_service_models_not_their_sessions(s3: Any) -> None:
    """Each stream's S3 filesystem (a new one per stream with skip_instance_cache=True, as
    the loopback server's options say) has a session of its own (credentials resolved for
    it), but botocore's parsed service models and endpoint rules are loaded once a process:
    each new client loaded them again, 36,000 objects (0.04 s of CPU) that only a full
    collection of Python's garbage collector frees, and that collection, run at a resume's
    first batch, walked them all (benchmarks/resume.py, DataLoader(2) -> Stream)."""
    import gc

    from aiobotocore.session import AioSession  # type: ignore[import-untyped]

    url = s3.create_bucket("shared-models") + "/a.jsonl"
    options = s3.storage_options()
    assert options["skip_instance_cache"]
    first = Source(url, storage_options=options).filesystem(url)
    first.connect()
    second = Source(url, storage_options=options).filesystem(url)
    gc.collect()
    before = len(gc.get_objects())
    second.connect()
    made = len(gc.get_objects()) - before
    assert second is not first and second.session is not first.session
    loader = first.session.get_component("data_loader")
    assert second.session.get_component("data_loader") is loader
    assert made < 10_000, f"a second S3 client made {made} objects"
    own = AioSession()  # a session the user passes is used as it is
    given = Source(url, storage_options={**options, "session": own}).filesystem(url)
    given.connect()
    assert given.session is own


def test_a_directory_named_with_a_slash_is_listed_in_one_request(s3: Any) -> None:
    from ingest.testing import FaultProxy, write_dataset

    root = s3.create_bucket("one-listing") + "/d"
    write_dataset(s3.filesystem(), root, "jsonl", 3, 10)
    with FaultProxy(s3.endpoint) as proxy:
        options = s3.storage_options(endpoint=proxy.endpoint)
        sent = []
        for url in (root + "/", root):
            before = proxy.counts()["requests"]
            shards = Source(url, storage_options=options).list_shards(FORMAT_RESOLVER)
            sent.append(proxy.counts()["requests"] - before)
            assert len(shards) == 3
        with pytest.raises(ingest.SourceError, match="not found"):
            Source(root + "-missing/", storage_options=options).list_shards(FORMAT_RESOLVER)
    assert sent[0] == 1 and sent[1] > 1, sent


def test_reading_an_s3_shard_sends_no_head(s3: Any) -> None:
    # s3fs sent a HEAD on the first read of every file it opened (for its ETag) in a process
    # without the listing's directory cache (a reader, an index task), beside the ranged
    # GETs: two requests per small shard. The listing's ETag is given instead.
    from ingest.testing import FaultProxy, write_dataset

    root = s3.create_bucket("no-head") + "/d"
    write_dataset(s3.filesystem(), root, "jsonl", 3, 10)
    with FaultProxy(s3.endpoint) as proxy:
        source = Source(root, storage_options=s3.storage_options(endpoint=proxy.endpoint))
        shards = source.list_shards(FORMAT_RESOLVER)
        # As a reader or an index task gets it: without the listing's directory cache.
        reader = pickle.loads(pickle.dumps(source))
        for shard in shards:
            before = proxy.counts()["requests"]
            with reader.open(shard, block_size=1 << 20) as f:
                data = f.read()
            assert proxy.counts()["requests"] - before == 1
            assert len(data) == shard.size and data.count(b"\n") == 10


def test_local_path_is_given_for_files_read_in_place_only(local: Store, s3_store: Store) -> None:
    """Formats may read a local shard natively (Source.local_path); a remote shard, or one
    read through the node's cache, goes through Source.open."""
    local.write("lp/a.jsonl", b'{"id": 0}\n')
    (shard,) = Source(local.url("lp")).list_shards(FORMAT_RESOLVER)
    assert Source(local.url("lp")).local_path(shard) == shard.url.removeprefix("file://")
    s3_store.write("lp/a.jsonl", b'{"id": 0}\n')
    remote = Source(s3_store.url("lp"), storage_options=s3_store.storage_options)
    (far,) = remote.list_shards(FORMAT_RESOLVER)
    assert remote.local_path(far) is None


def test_a_local_parquet_shard_cut_short_after_listing_is_an_error_not_fewer_rows(
    tmp_path: Path,
) -> None:
    """Read natively while its size is the listed one; cut short, it is read through
    Source.open, which names the shard and the bytes it could not read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # The first shard holds more than a window (16,384 rows) and the lane reads on demand
    # (prefetch=0): the second shard is opened after it is cut.
    pq.write_table(pa.table({"id": list(range(40_000))}), tmp_path / "0.parquet")
    pq.write_table(pa.table({"id": list(range(40_000, 40_100))}), tmp_path / "1.parquet")
    stream = ingest.Stream(str(tmp_path), batch_size=10, read=ingest.ReadOptions(prefetch=0))
    batches = iter(stream)
    first = next(batches)
    assert first["id"].tolist() == list(range(10))
    cut = tmp_path / "1.parquet"
    cut.write_bytes(cut.read_bytes()[:200])
    with pytest.raises(ingest.IngestError, match=r"1\.parquet"):
        for _ in batches:
            pass
    stream.close()


def test_a_list_of_urls_is_listed_side_by_side(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list of shard URLs (``data_files=[...]`` as the Hub's datasets name them, an index
    file's lines) was listed one URL after another, a request each: 64 Parquet URLs on a
    store 50 ms away took 3.6-3.8 s at every epoch's listing (a directory of the same 64:
    0.1 s). Now the URLs are listed side by side (here each waits until four have begun: one
    after another, the first waits alone and the test fails), with the same shards in the
    same order, and a URL that matches nothing is named as before."""
    import threading

    import ingest.storage.sources.source as source_module

    for n in range(4):
        store.write(f"d/p{n}.parquet", encode(make_table(n * 5, 5), "parquet"))
    urls = [store.url("d", f"p{n}.parquet") for n in (3, 1, 0, 2)]
    alone = Source(urls, storage_options=store.storage_options).list_shards(FORMAT_RESOLVER)
    barrier = threading.Barrier(4, timeout=20)
    from ingest.storage.sources.listing import list_url

    def side_by_side(*args: Any, **kwargs: Any) -> Any:
        barrier.wait()  # every URL's listing has begun
        return list_url(*args, **kwargs)

    monkeypatch.setattr(source_module, "list_url", side_by_side)
    source = Source(urls, storage_options=store.storage_options)
    assert source.list_shards(FORMAT_RESOLVER) == alone
    assert [s.url.rsplit("/", 1)[1] for s in alone] == [f"p{n}.parquet" for n in range(4)]
    monkeypatch.setattr(source_module, "list_url", list_url)
    missing = [*urls[:2], store.url("d", "gone.parquet"), *urls[2:]]
    with pytest.raises(ingest.SourceError, match=r"gone\.parquet"):
        Source(missing, storage_options=store.storage_options).list_shards(FORMAT_RESOLVER)


def test_a_list_of_urls_on_a_store_is_listed_more_than_sixteen_at_once(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list of URLs on a store was listed 16 at once at every epoch (a HEAD each): 256
    Parquet URLs 50 ms away, 1.9 s with their footers. Now as many as a source's S3
    connections (64: 1.5 s on 2 cores, where the client's CPU per request bounds it; the
    Hub keeps 16): here each of 24 URLs waits until all have begun."""
    import threading

    import ingest.storage.sources.source as source_module
    from ingest.storage.sources.listing import list_url

    root = "ingest-test/urls-at-once"
    fs = s3.filesystem()
    for n in range(24):
        fs.pipe(f"{root}/p{n:02d}.parquet", encode(make_table(n * 5, 5), "parquet"))
    urls = [f"s3://{root}/p{n:02d}.parquet" for n in range(24)]
    barrier = threading.Barrier(24, timeout=10)

    def side_by_side(*args: Any, **kwargs: Any) -> Any:
        barrier.wait()  # every URL's listing has begun
        return list_url(*args, **kwargs)

    monkeypatch.setattr(source_module, "list_url", side_by_side)
    shards = Source(urls, storage_options=s3.storage_options()).list_shards(FORMAT_RESOLVER)
    assert [s.url for s in shards] == urls


def test_bytes_read_past_the_ranges_fetched_are_the_file_s_own(s3: Any) -> None:
    """A shard opened with some ranges fetched (``fetch_ranges``) reads those from memory
    and every other byte from the store, one request per read. fsspec's ``parts`` cache
    (2026.9) filled a read that ran past a known part's end with zeros (strict=False) and
    raised ValueError for a read outside every part, though its docstring says it fetches."""
    from ingest.testing import FaultProxy

    root = s3.create_bucket("known-parts")
    payload = bytes(range(256)) * 40  # 10,240 bytes, no two neighbours alike
    s3.filesystem().pipe(f"{root}/f.jsonl", payload)
    with FaultProxy(s3.endpoint) as proxy:
        source = Source(
            f"s3://{root}/f.jsonl",
            format="jsonl",
            storage_options=s3.storage_options(endpoint=proxy.endpoint),
        )
        (shard,) = source.list_shards(FORMAT_RESOLVER)
        listed = proxy.counts()["requests"]
        f = source.fetch_ranges(shard, [0, 5000], [100, 5100])
        assert proxy.counts()["requests"] - listed == 2
        reads = source.stats.reads

        def read(start: int, end: int) -> tuple[bytes, int]:
            before = proxy.counts()["requests"]
            f.seek(start)
            return f.read(end - start), proxy.counts()["requests"] - before

        assert read(10, 90) == (payload[10:90], 0)  # inside a range: from memory
        assert read(5000, 5100) == (payload[5000:5100], 0)
        assert read(50, 300) == (payload[50:300], 1)  # past the range's end
        assert read(1000, 1200) == (payload[1000:1200], 1)  # outside every range
        assert read(4900, 5050) == (payload[4900:5050], 1)  # into a range
        assert read(50, 5080) == (payload[50:5080], 1)  # across both
        assert source.stats.reads - reads == 4, "each read of the store is counted"
