"""The node-local shard cache (issue 9, part 1): bound, LRU, open copies, crashes, several
processes, changed shards; then a Stream and a RayStream reading S3 through it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ingest
from ingest.core.errors import SourceError
from ingest.storage.cache import CacheEvent, CacheOptions, ShardCache
from ingest.testing import write_dataset

ROOT = Path(__file__).resolve().parent.parent


def blob(n: int, size: int) -> bytes:
    return bytes((n * 7 + i) % 251 for i in range(size))


class Store:
    """A fake remote store: shards by name, and the fetches it served."""

    def __init__(self) -> None:
        self.shards: dict[str, bytes] = {}
        self.fetches: list[str] = []

    def fetcher(self, url: str) -> Any:
        def fetch(to: str) -> None:
            self.fetches.append(url)
            Path(to).write_bytes(self.shards[url])

        return fetch

    def open(self, cache: ShardCache, url: str, version: str = "v1") -> tuple[Any, CacheEvent]:
        event = CacheEvent()
        data = self.shards[url]
        return cache.open(url, len(data), version, self.fetcher(url), event), event


def read_all(f: Any) -> bytes:
    with f:
        return f.read()  # type: ignore[no-any-return]


def test_a_miss_fetches_once_and_later_opens_hit_even_after_a_restart(tmp_path: Path) -> None:
    store = Store()
    store.shards["s3://b/a"] = blob(1, 1000)
    options = CacheOptions(str(tmp_path / "c"), max_bytes=10_000)
    f, event = store.open(ShardCache(options), "s3://b/a")
    assert not event.hit and event.fetched_bytes == 1000
    assert read_all(f) == store.shards["s3://b/a"]
    for cache in (ShardCache(options), ShardCache(options)):  # a new process, a restart
        f, event = store.open(cache, "s3://b/a")
        assert event.hit and read_all(f) == store.shards["s3://b/a"]
    assert store.fetches == ["s3://b/a"]


def test_a_changed_shard_is_fetched_again(tmp_path: Path) -> None:
    store = Store()
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))
    store.shards["s3://b/a"] = blob(1, 1000)
    read_all(store.open(cache, "s3://b/a", "etag-1")[0])
    store.shards["s3://b/a"] = blob(2, 1000)  # same size, new version
    f, event = store.open(cache, "s3://b/a", "etag-2")
    assert not event.hit and read_all(f) == blob(2, 1000)
    store.shards["s3://b/a"] = blob(3, 900)  # new size
    f, event = store.open(cache, "s3://b/a", "etag-2")
    assert not event.hit and read_all(f) == blob(3, 900)
    assert len(store.fetches) == 3


def test_the_bound_holds_and_the_least_recently_used_goes_first(tmp_path: Path) -> None:
    store = Store()
    for n in range(6):
        store.shards[f"s3://b/{n}"] = blob(n, 1000)
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=3_500))  # three shards fit
    evicted = 0
    for url in ["s3://b/0", "s3://b/1", "s3://b/2", "s3://b/0", "s3://b/3"]:
        f, event = store.open(cache, url)
        evicted += event.evicted_bytes
        assert read_all(f) == store.shards[url]
        assert cache.usage() <= 3_500
    # 1 was used least recently when 3 needed room; 0 was touched again.
    assert evicted == 1000
    assert store.open(cache, "s3://b/0")[1].hit and store.open(cache, "s3://b/2")[1].hit
    assert not store.open(cache, "s3://b/1")[1].hit
    for n in range(6):
        for f in [store.open(cache, f"s3://b/{n}")[0]]:
            read_all(f)
        assert cache.usage() <= 3_500


def test_a_copy_a_reader_has_open_is_never_evicted(tmp_path: Path) -> None:
    store = Store()
    for n in range(4):
        store.shards[f"s3://b/{n}"] = blob(n, 1000)
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=2_000))
    held = [store.open(cache, "s3://b/0")[0], store.open(cache, "s3://b/1")[0]]
    # No room: both copies are open. The shard is read from the store (None), the bound kept.
    f, event = store.open(cache, "s3://b/2")
    assert f is None and event.evicted_bytes == 0
    assert [read_all(h) for h in held] == [blob(0, 1000), blob(1, 1000)]
    f, event = store.open(cache, "s3://b/3")  # closed now: room is made
    assert f is not None and event.evicted_bytes == 1000
    assert read_all(f) == blob(3, 1000) and cache.usage() <= 2_000


def test_a_shard_larger_than_the_bound_is_not_cached(tmp_path: Path) -> None:
    store = Store()
    store.shards["s3://b/big"] = blob(1, 5000)
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=4_000))
    assert store.open(cache, "s3://b/big")[0] is None and store.fetches == []


def test_a_fetch_of_the_wrong_size_is_the_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))

    def fetch(to: str) -> None:
        Path(to).write_bytes(b"x" * 700)

    with pytest.raises(SourceError, match=r"s3://b/a: has 700 bytes, not the 1000"):
        cache.open("s3://b/a", 1000, "v1", fetch, CacheEvent())
    assert cache.usage() == 0 and not list((tmp_path / "data").iterdir())
    assert not list((tmp_path / "tmp").iterdir())


CRASHING_FETCH = """
import sys, time
from pathlib import Path
from ingest.storage.cache import CacheEvent, CacheOptions, ShardCache

def fetch(to):
    Path(to).write_bytes(b"half" * 100)
    print("writing", flush=True)
    time.sleep(60)

ShardCache(CacheOptions(sys.argv[1], max_bytes=10_000)).open(
    "s3://b/a", 1000, "v1", fetch, CacheEvent())
"""


def test_a_process_killed_mid_fetch_leaves_no_half_file(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_FETCH, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
        cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=1_500))
        assert cache.usage() == 1000, "the fetch under way is counted against the bound"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    store = Store()
    store.shards["s3://b/a"] = blob(1, 1000)
    f, event = store.open(cache, "s3://b/a")
    assert not event.hit and read_all(f) == blob(1, 1000), "the half file is never served"
    store.shards["s3://b/c"] = blob(2, 400)
    read_all(store.open(cache, "s3://b/c")[0])  # its reservation made the dead part go
    assert not list((tmp_path / "tmp").iterdir()) and cache.usage() == 1400


READER = """
import json, random, sys, time
from pathlib import Path
from ingest.storage.cache import CacheEvent, CacheOptions, ShardCache

root, log, seed, bound = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cache = ShardCache(CacheOptions(root, max_bytes=bound))
rng = random.Random(seed)

def blob(n, size):
    return bytes((n * 7 + i) % 251 for i in range(size))

over = 0
for _ in range(40):
    n = rng.randrange(8)
    def fetch(to, n=n):
        with open(log, "a") as f:
            f.write(f"{n}\\n")
        data = blob(n, 1000)
        with open(to, "wb") as f:
            f.write(data[:500]); f.flush(); time.sleep(0.002); f.write(data[500:])
    f = cache.open(f"s3://b/{n}", 1000, "v1", fetch, CacheEvent())
    if f is not None:
        with f:
            assert f.read() == blob(n, 1000), n
    over = max(over, cache.usage())
print(json.dumps({"max_usage": over}))
"""


@pytest.mark.parametrize("bound", [100_000, 3_000])
def test_several_processes_share_one_cache(tmp_path: Path, bound: int) -> None:
    log = tmp_path / "fetches.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(tmp_path / "c"), str(log), str(seed), str(bound)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for seed in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    import json

    usage = [json.loads(out.strip().splitlines()[-1])["max_usage"] for out, _ in outs]
    assert max(usage) <= bound, usage
    fetched = log.read_text().split()
    if bound == 100_000:  # everything fits: each shard is fetched once on the node
        assert sorted(fetched) == sorted(set(fetched)), fetched


def test_options_are_checked() -> None:
    with pytest.raises(ingest.ConfigError, match="max_bytes"):
        CacheOptions("/tmp/x", max_bytes=0)
    with pytest.raises(ingest.ConfigError, match="local directory"):
        CacheOptions("s3://bucket/cache", max_bytes=10)
    with pytest.raises(TypeError, match="CacheOptions"):
        ingest.ReadOptions(cache="/tmp/x")  # type: ignore[arg-type]


# -- a stream through the cache ----------------------------------------------------------


def epoch_ids(stream: Any) -> list[int]:
    return [int(v) for batch in stream for v in batch["id"].tolist()]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_streams_second_epoch_reads_the_cache_and_sends_no_read(
    s3_store: Any, tmp_path: Path, fmt: str
) -> None:
    write_dataset(s3_store.fs, s3_store.url("d"), fmt, 6, 200, row_group_rows=50)
    options = ingest.ReadOptions(cache=CacheOptions(str(tmp_path / "cache"), max_bytes=1 << 30))
    stream = ingest.Stream(
        s3_store.url("d"),
        storage_options=s3_store.storage_options,
        batch_size=40,
        shuffle_seed=1,
        read=options,
    )
    if fmt == "parquet":
        stream.listing()
        assert stream.stats["cache_misses"] == 0, "a footer read fetches no whole shard"
    first = epoch_ids(stream)
    after_one = stream.stats
    second = epoch_ids(stream)
    after_two = stream.stats
    assert sorted(first) == sorted(second) == list(range(1200))
    assert after_one["cache_misses"] == 6 and after_one["cache_fetched_bytes"] > 0
    assert after_one["cache_bypassed"] == 0
    sent = {k: after_two[k] - after_one[k] for k in ("opens", "reads", "bytes_read")}
    assert sent == {"opens": 0, "reads": 0, "bytes_read": 0}, (after_one, after_two)
    assert after_two["cache_hits"] - after_one["cache_hits"] >= 6
    assert after_two["cache_misses"] == 6 and after_two["cache_evicted_bytes"] == 0


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_shard_larger_than_the_bound_is_counted_as_read_past_the_cache(
    s3_store: Any, tmp_path: Path, fmt: str
) -> None:
    """The stats count a shard read from the store because it cannot be cached
    (``cache_bypassed``, as the cache's docs say of one larger than the bound): one over the
    bound was read past the cache with no count, so a cache too small for every shard
    looked like a cache that was never asked. Found by a probe."""
    write_dataset(s3_store.fs, s3_store.url("d"), fmt, 3, 200, row_group_rows=50)
    options = ingest.ReadOptions(cache=CacheOptions(str(tmp_path / "cache"), max_bytes=64))
    stream = ingest.Stream(
        s3_store.url("d"), storage_options=s3_store.storage_options, batch_size=40, read=options
    )
    assert sorted(epoch_ids(stream)) == list(range(600))
    stats = stream.stats
    assert stats["cache_misses"] == stats["cache_hits"] == 0, stats
    assert stats["cache_bypassed"] >= 3, stats


def test_a_cache_directory_removed_between_epochs_is_made_again(
    s3_store: Any, tmp_path: Path
) -> None:
    """The cache's folders were made once, when it was first opened: removed between two
    epochs of a stream (a cleaner of temporary files), the next epoch failed with a bare
    FileNotFoundError on a lock file, naming neither shard nor fix. Found by a probe."""
    write_dataset(s3_store.fs, s3_store.url("d"), "parquet", 2, 100)
    directory = tmp_path / "cache"
    options = ingest.ReadOptions(cache=CacheOptions(str(directory), max_bytes=1 << 30))
    stream = ingest.Stream(
        s3_store.url("d"), storage_options=s3_store.storage_options, batch_size=20, read=options
    )
    assert sorted(epoch_ids(stream)) == list(range(200))
    shutil.rmtree(directory)
    assert sorted(epoch_ids(stream)) == list(range(200))
    assert stream.stats["cache_misses"] == 4, "each shard fetched again into the new folders"
    assert options.cache is not None and ShardCache(options.cache).usage() > 0


def test_a_stream_keeps_reading_when_the_cache_cannot_hold_every_shard(
    s3_store: Any, tmp_path: Path
) -> None:
    paths = write_dataset(s3_store.fs, s3_store.url("d"), "parquet", 4, 200, row_group_rows=50)
    biggest = max(s3_store.fs.size(p) for p in paths)
    options = ingest.ReadOptions(cache=CacheOptions(str(tmp_path / "c"), max_bytes=biggest))
    stream = ingest.Stream(
        s3_store.url("d"), storage_options=s3_store.storage_options, batch_size=40, read=options
    )
    for _ in range(2):
        assert sorted(epoch_ids(stream)) == list(range(800))
    assert stream.stats["cache_evicted_bytes"] > 0
    assert options.cache is not None and ShardCache(options.cache).usage() <= biggest


@pytest.mark.usefixtures("ray_session")
def test_ray_readers_and_the_driver_on_one_node_share_the_cache(
    s3_store: Any, tmp_path: Path
) -> None:
    from tests.test_distributed import run

    write_dataset(s3_store.fs, s3_store.url("d"), "parquet", 6, 200, row_group_rows=50)
    options = ingest.ReadOptions(cache=CacheOptions(str(tmp_path / "c"), max_bytes=1 << 30))
    with ingest.RayStream(
        s3_store.url("d"),
        storage_options=s3_store.storage_options,
        batch_size=30,
        world_size=2,
        read=options,
    ) as stream:
        results = run(stream, epochs=2)
        readers = stream.stats()
    for epoch in range(2):
        ids = [i for r in results for b in r["epochs"][epoch] for i in b]
        assert sorted(ids) == list(range(1200))
    # Footers are read at listing without fetching whole shards; the readers of the node
    # fetched each shard once (one request each) and hit the copies after.
    assert readers["cache_misses"] == 6 and readers["reads"] == 6, readers
    assert readers["cache_hits"] >= 6, readers


def test_a_fetch_into_the_cache_shows_its_progress(
    s3_store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dataset(s3_store.fs, s3_store.url("d"), "jsonl", 2, 300)
    cache = CacheOptions(str(tmp_path / "c"), max_bytes=1 << 30, progress=True)
    stream = ingest.Stream(
        s3_store.url("d"),
        storage_options=s3_store.storage_options,
        batch_size=50,
        read=ingest.ReadOptions(cache=cache),
    )
    assert sorted(epoch_ids(stream)) == list(range(600))
    err = capsys.readouterr().err
    assert "caching part-00000.jsonl" in err and "caching part-00001.jsonl" in err, err[-500:]


# -- damaged copies (issue 17, finding 4) ---------------------------------------------------


def damage(path: Path, offset: int, keep_mtime: bool = True) -> None:
    """Overwrite 64 bytes of a file in place, same size; put its modification time back."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 64)
    if keep_mtime:
        import os

        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def the_copy(cache: ShardCache, url: str, size: int, version: str = "v1") -> Path:
    return Path(cache.path_of(cache.key(url, size, version)))


def test_a_copy_damaged_on_disk_is_fetched_again_not_served(tmp_path: Path) -> None:
    store = Store()
    store.shards["s3://b/a"] = blob(1, 1000)
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))
    read_all(store.open(cache, "s3://b/a")[0])
    damage(the_copy(cache, "s3://b/a", 1000), 100)  # same size, same modification time
    f, event = store.open(cache, "s3://b/a")
    assert not event.hit and event.fetched_bytes == 1000
    assert read_all(f) == blob(1, 1000), "the damaged bytes were served"
    assert store.fetches == ["s3://b/a", "s3://b/a"]


def test_a_copy_whose_metadata_changed_but_not_its_bytes_is_still_a_hit(tmp_path: Path) -> None:
    import os

    store = Store()
    store.shards["s3://b/a"] = blob(1, 1000)
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))
    read_all(store.open(cache, "s3://b/a")[0])
    os.utime(the_copy(cache, "s3://b/a", 1000), (1, 1))  # e.g. restored by a backup tool
    for _ in range(2):
        f, event = store.open(cache, "s3://b/a")
        assert event.hit and read_all(f) == blob(1, 1000)
    assert store.fetches == ["s3://b/a"]


def test_a_dropped_copy_is_fetched_again(tmp_path: Path) -> None:
    store = Store()
    store.shards["s3://b/a"] = blob(1, 1000)
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))
    held = store.open(cache, "s3://b/a")[0]
    assert cache.drop("s3://b/a", 1000, "v1") and not cache.drop("s3://b/a", 1000, "v1")
    assert read_all(held) == blob(1, 1000), "a reader that has it open keeps its file"
    f, event = store.open(cache, "s3://b/a")
    assert not event.hit and read_all(f) == blob(1, 1000) and len(store.fetches) == 2


def test_a_stream_reads_past_a_cached_copy_damaged_on_disk(s3_store: Any, tmp_path: Path) -> None:
    """The issue's case: a same-size damaged copy was served forever, blamed on the store
    ("row group 0 cannot be read ... re-upload it"); under skip, 200 of 300 rows arrived."""
    write_dataset(s3_store.fs, s3_store.url("d"), "parquet", 3, 100, row_group_rows=50)
    cache = CacheOptions(str(tmp_path / "c"), max_bytes=1 << 30)
    stream = ingest.Stream(
        s3_store.url("d"),
        storage_options=s3_store.storage_options,
        batch_size=20,
        read=ingest.ReadOptions(cache=cache, on_error="skip"),
    )
    assert sorted(epoch_ids(stream)) == list(range(300))
    [shard] = [s for s in stream.listing().shards if s.url.endswith("part-00001.parquet")]
    damage(the_copy(ShardCache(cache), shard.url, shard.size, shard.version), 4)
    assert sorted(epoch_ids(stream)) == list(range(300))
    assert stream.quarantined == [] and stream.stats["cache_misses"] == 4, stream.stats


# -- owner-only (issue 17, finding 11) --------------------------------------------------------


def mode(path: Path) -> int:
    import stat

    return stat.S_IMODE(path.stat().st_mode)


def test_the_cache_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    import os

    store = Store()
    store.shards["s3://b/a"] = blob(1, 1000)
    old = os.umask(0)
    try:
        cache = ShardCache(CacheOptions(str(tmp_path / "new" / "c"), max_bytes=10_000))
        read_all(store.open(cache, "s3://b/a")[0])
    finally:
        os.umask(old)
    root = tmp_path / "new" / "c"
    folders = [tmp_path / "new", root, root / "data", root / "tmp", root / "locks"]
    assert {str(d): oct(mode(d)) for d in folders} == {str(d): "0o700" for d in folders}
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) >= 4, files  # the copy, its seal, cache.lock, a stripe lock
    assert {str(p): oct(mode(p)) for p in files} == {str(p): "0o600" for p in files}


def test_a_cache_made_with_open_modes_is_tightened(tmp_path: Path) -> None:
    import os

    for d in ("data", "tmp", "locks"):
        (tmp_path / d).mkdir(mode=0o755)
        os.chmod(tmp_path / d, 0o755)  # as an older version left them
    ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))
    assert [mode(tmp_path / d) for d in ("data", "tmp", "locks")] == [0o700] * 3


def test_a_cache_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    (tmp_path / "data").mkdir()
    os.chown(tmp_path / "data", 65534, 65534)
    with pytest.raises(ingest.ConfigError, match=r"data belongs to user 65534, not to this one"):
        ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))


# -- bad options and a bad directory (issue 17) ---------------------------------------------


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"max_bytes": "10"}, r"max_bytes='10'\) must be a whole number of bytes \(an int\)"),
        ({"max_bytes": float("nan")}, r"max_bytes=nan\) must be a whole number of bytes"),
        ({"max_bytes": 1e9}, r"max_bytes=1000000000.0\) must be a whole number"),
        ({"max_bytes": 10, "lock_timeout_s": float("nan")}, r"lock_timeout_s=nan\) must be a fi"),
        ({"max_bytes": 10, "lock_timeout_s": float("inf")}, r"lock_timeout_s=inf\) must be a fi"),
        ({"max_bytes": 10, "lock_timeout_s": "5"}, r"lock_timeout_s='5'\) must be a finite"),
        ({"max_bytes": 10, "progress": "yes"}, r"progress='yes'\) must be True or False"),
    ],
)
def test_bad_cache_options_are_refused_naming_the_option(
    options: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ingest.ConfigError, match=pattern):
        CacheOptions("/tmp/x", **options)


def test_a_path_is_a_directory() -> None:
    assert CacheOptions(Path("/tmp/x"), max_bytes=10).directory == "/tmp/x"  # type: ignore[arg-type]


def test_a_directory_named_like_a_copy_is_passed_over_or_named(tmp_path: Path) -> None:
    store = Store()
    for n in range(3):
        store.shards[f"s3://b/{n}"] = blob(n, 1000)
    cache = ShardCache(CacheOptions(str(tmp_path), max_bytes=2_000))
    (tmp_path / "data" / "stray.shard").mkdir()  # not the cache's: never counted or evicted
    for n in range(3):
        f, _ = store.open(cache, f"s3://b/{n}")
        assert read_all(f) == blob(n, 1000)
    assert cache.usage() == 2_000 and (tmp_path / "data" / "stray.shard").is_dir()
    the_copy(cache, "s3://b/0", 1000).mkdir()  # in the way of a shard's copy
    with pytest.raises(ingest.ConfigError, match=r"data/\w+\.shard is not a regular file"):
        store.open(cache, "s3://b/0")


NAMESPACE = ["unshare", "--map-root-user", "--mount"]


def in_namespace(mounts: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a user and mount namespace after the shell commands ``mounts``
    (a small tmpfs, a read-only bind mount): a real full or read-only disk, no root."""
    probe = subprocess.run([*NAMESPACE, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not available: {probe.stderr.decode()[-200:]}")
    return subprocess.run(
        [
            *NAMESPACE,
            "sh",
            "-c",
            f'{mounts} && exec "$0" "$@"',
            sys.executable,
            "-c",
            script,
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        check=False,
    )


READ_ONLY = """
import sys
import ingest
from ingest.storage.cache import CacheOptions, ShardCache
for directory in (sys.argv[1], sys.argv[1] + "/sub"):
    try:
        ShardCache(CacheOptions(directory, max_bytes=10_000))
    except ingest.ConfigError as e:
        print(str(e))
"""


def test_a_read_only_cache_directory_is_the_clear_error(tmp_path: Path) -> None:
    ShardCache(CacheOptions(str(tmp_path), max_bytes=10_000))  # made, then mounted read-only
    mounts = f"mount --bind {tmp_path} {tmp_path} && mount -o remount,ro,bind {tmp_path}"
    run = in_namespace(mounts, READ_ONLY, str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    existing, missing = run.stdout.strip().splitlines()
    assert f"CacheOptions(directory='{tmp_path}'): {tmp_path} is not writable" in existing
    assert f"cannot create {tmp_path}/sub (Read-only file system)" in missing


# -- a full disk (issue 17) -------------------------------------------------------------------

FULL_DISK_STREAM = """
import json, sys, warnings
import ingest
from ingest.storage.cache import CacheOptions, CacheWarning
url, directory, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
read = ingest.ReadOptions(
    cache=CacheOptions(directory, max_bytes=1 << 30),
    retry=ingest.RetryPolicy(deadline_s=2.0),
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    stream = ingest.Stream(url, storage_options=options, batch_size=100, read=read)
    ids = sorted(int(i) for b in stream for i in b["id"].tolist())
print(json.dumps({
    "rows": ids == list(range(4 * 2000)),
    "stats": stream.stats,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)],
}))
"""


def test_a_full_cache_disk_reads_from_the_store_with_one_warning(
    s3_store: Any, tmp_path: Path
) -> None:
    import json

    paths = write_dataset(s3_store.fs, s3_store.url("d"), "jsonl", 4, 2000)
    size = s3_store.fs.size(paths[0])
    disk = tmp_path / "disk"
    disk.mkdir()
    # Room on the disk for about two shards; max_bytes (1 GiB) says much more.
    mounts = f"mount -t tmpfs -o size={size * 5 // 2} tmpfs {disk}"
    args = [s3_store.url("d"), str(disk / "c"), json.dumps(s3_store.storage_options)]
    run = in_namespace(mounts, FULL_DISK_STREAM, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["rows"], "every row, whether its shard was cached or not"
    assert out["stats"]["cache_bypassed"] >= 1 and out["stats"]["cache_misses"] >= 1, out
    [warning] = out["warnings"]
    assert f"the shard cache {disk}/c has no room on its disk" in warning
    assert "Free space on that disk, or lower CacheOptions(max_bytes=1073741824)" in warning


FILLED_MID_FETCH = """
import json, sys, warnings
from pathlib import Path
from ingest.storage.cache import CacheEvent, CacheOptions, CacheWarning, ShardCache
disk = Path(sys.argv[1])
cache = ShardCache(CacheOptions(str(disk / "c"), max_bytes=1 << 30))

def fetch(to):
    try:  # another program fills the disk once the fetch has started
        with open(disk / "filler", "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
    except OSError:
        pass
    Path(to).write_bytes(b"y" * 100_000)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    held = cache.open("s3://b/a", 100_000, "v1", fetch, CacheEvent())
print(json.dumps({
    "held": held is not None,
    "usage": cache.usage(),
    "left": sorted(p.name for p in (disk / "c").rglob("*") if p.is_file()),
    "warnings": [str(w.message) for w in caught if issubclass(w.category, CacheWarning)],
}))
"""


def test_a_disk_filled_during_a_fetch_leaves_nothing_and_reads_from_the_store(
    tmp_path: Path,
) -> None:
    import json

    disk = tmp_path / "disk"
    disk.mkdir()
    run = in_namespace(f"mount -t tmpfs -o size=1m tmpfs {disk}", FILLED_MID_FETCH, str(disk))
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert not out["held"] and out["usage"] == 0, out
    assert not [n for n in out["left"] if n.endswith((".part", ".shard", ".seal"))], out
    [warning] = out["warnings"]
    assert "has no room on its disk for s3://b/a (100000 bytes: No space left on device)" in warning
