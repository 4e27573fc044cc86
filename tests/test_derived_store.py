"""The derived cache's codec and store (issue 34, items 1 and 3): a copy decodes to exactly
what the stage chain made, row-aligned with its unit; a node's directory stays within its
bytes, least recently used first, owner-only; a damaged copy is a miss and is removed; two
processes racing to write one key leave one copy that both read; a URL is written once."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import stat
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.core.errors import ConfigError
from ingest.engine.derived import (
    CorruptCopyWarning,
    CorruptDerivedError,
    DerivedConfig,
    DerivedKey,
    DerivedStore,
    decode,
    encode,
)
from ingest.engine.derived.codec import stored_schema
from ingest.engine.derived.store import frame
from ingest.engine.stage import Filter, Staged
from ingest.engine.tokenize import EOS_KEY
from ingest.storage.cache import CacheOptions
from ingest.storage.cache.seal import seal_of, write_seal
from ingest.testing import LoopbackS3

# -- the codec ---------------------------------------------------------------------------


def tokenized(docs: list[list[int]], eos_id: int | None = 0) -> Staged:
    """A Staged as ingest.Tokenize makes it: ids (list<int32>, eos in the field's metadata),
    counts, an id column kept; one output row per input row."""
    meta = None if eos_id is None else {EOS_KEY: str(eos_id).encode()}
    table = pa.table(
        {
            "id": pa.array(range(len(docs)), pa.int64()),
            "input_ids": pa.array(docs, pa.list_(pa.int32())),
            "num_tokens": pa.array([len(d) for d in docs], pa.int64()),
        }
    )
    table = table.cast(
        pa.schema(
            [
                table.schema.field("id"),
                table.schema.field("input_ids").with_metadata(meta),
                table.schema.field("num_tokens"),
            ]
        )
    )
    return Staged(table, np.arange(len(docs), dtype=np.int64))


def assert_same(got: Staged, want: Staged) -> None:
    assert got.table.equals(want.table, check_metadata=True), (got.table.schema, want.table.schema)
    np.testing.assert_array_equal(got.origin, want.origin)
    assert got.origin.dtype == np.int64
    if want.part is None:
        assert got.part is None
    else:
        assert got.part is not None
        np.testing.assert_array_equal(got.part, want.part)


@st.composite
def chain_outputs(draw: st.DrawFn) -> tuple[Staged, int]:
    """What a chain may make of a unit: any number of outputs per input row (0 for a row
    left out), token ids of a small or large vocabulary (nulls too), other columns, parts."""
    inputs = draw(st.integers(0, 12))
    counts = draw(st.lists(st.integers(0, 3), min_size=inputs, max_size=inputs))
    rows = sum(counts)
    high = draw(st.sampled_from([255, 65_535, 65_536, 2**31 - 1]))
    ids = st.lists(st.integers(0, high), max_size=6)
    docs = draw(st.lists(st.none() | ids, min_size=rows, max_size=rows))
    words = draw(st.lists(st.text(max_size=5), min_size=rows, max_size=rows))
    signed = draw(st.lists(st.integers(-(2**40), 2**40), min_size=rows, max_size=rows))
    list_type = draw(st.sampled_from([pa.list_(pa.int32()), pa.large_list(pa.int64())]))
    table = pa.table(
        {
            "input_ids": pa.array(docs, list_type),
            "word": pa.array(words, pa.string()),
            "signed": pa.array(signed, pa.int64()),
            "small": pa.array([len(w) for w in words], pa.int32()),
        }
    )
    if draw(st.booleans()):
        table = table.replace_schema_metadata({b"made_by": b"a test"})
    origin = np.repeat(np.arange(inputs, dtype=np.int64), counts)
    part = None
    if draw(st.booleans()):  # consecutive parts of each input row
        starts = [k * 4 for c in counts for k in range(c)]
        part = np.array([[s, s + 4] for s in starts], dtype=np.int64).reshape(-1, 2)
    return Staged(table, origin, part), inputs


@settings(max_examples=50)
@given(chain_outputs())
def test_a_copy_decodes_to_exactly_what_the_chain_made(made: tuple[Staged, int]) -> None:
    staged, inputs = made
    unit = decode(encode(staged, inputs))
    assert unit.inputs == inputs
    assert_same(unit.staged, staged)
    assert unit.counts.sum() == staged.table.num_rows


def test_ids_are_kept_as_uint16_when_the_vocabulary_fits_and_decoded_as_int32() -> None:
    small = tokenized([[1, 65_535, 7], [3]])
    large = tokenized([[1, 65_536, 7], [3]])
    assert stored_schema(encode(small, 2)).field("input_ids").type.value_type == pa.uint16()
    assert stored_schema(encode(large, 2)).field("input_ids").type.value_type == pa.int32()
    for staged in (small, large):
        assert_same(decode(encode(staged, 2)).staged, staged)
        assert decode(encode(staged, 2)).staged.table.schema.field("input_ids").metadata == {
            EOS_KEY: b"0"
        }


def test_a_filter_keeps_which_rows_survived() -> None:
    table = pa.table({"n": [5, 1, 7, 2, 9]})
    staged = Filter(lambda t: np.asarray(t["n"]) > 4)(table)
    unit = decode(encode(staged, table.num_rows))
    assert unit.counts.tolist() == [1, 0, 1, 0, 1]
    assert_same(unit.staged, staged)


def test_a_result_that_does_not_fit_its_unit_is_refused() -> None:
    staged = tokenized([[1], [2], [3]])
    with pytest.raises(ConfigError, match=r"origins in \[0, 2\].*in \[0, 2\)"):
        encode(staged, 2)


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-10],
        lambda b: b"XXXXXXXX" + b[8:],
        lambda b: b[:12] + b"[" + b[13:],
        lambda b: b + b"\0",
    ],
    ids=["cut short", "other magic", "bad header", "trailing bytes"],
)
def test_bytes_that_are_not_a_unit_are_refused(damage: Any) -> None:
    blob = encode(tokenized([[1, 2], [3]]), 2)
    with pytest.raises(CorruptDerivedError):
        decode(damage(blob))


# -- the store ----------------------------------------------------------------------------


def key(n: int = 0, chain: str = "c" * 64, **change: Any) -> DerivedKey:
    fields: dict[str, Any] = {
        "url": f"s3://bucket/shard-{n}.jsonl",
        "size": 1000 + n,
        "version": "etag",
        "start": 0,
        "stop": None,
        "chain": chain,
    }
    return DerivedKey(**{**fields, **change})


def docs(seed: int, rows: int = 50, tokens: int = 40) -> Staged:
    rng = np.random.default_rng(seed)
    return tokenized([rng.integers(0, 60_000, tokens).tolist() for _ in range(rows)])


def local(tmp_path: Path, max_bytes: int = 1 << 30) -> DerivedStore:
    return DerivedStore(
        DerivedConfig(local=CacheOptions(str(tmp_path / "derived"), max_bytes=max_bytes))
    )


def root_of(store: DerivedStore) -> Path:
    """The local folder of a node's directory or of a ``file://`` URL."""
    config = store.config
    if config.local is not None:
        return Path(config.local.directory)
    return Path(str(config.url).removeprefix("file://"))


def copy_files(store: DerivedStore) -> list[Path]:
    root = root_of(store)
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".shard", ".derived"))


@pytest.fixture(params=["local", "memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> DerivedStore:
    if request.param == "local":
        return local(tmp_path)
    if request.param == "memory":
        url = f"memory://derived-{tmp_path.name}/"
        return DerivedStore(DerivedConfig(url=url))
    return DerivedStore(DerivedConfig(url=(tmp_path / "shared").as_uri()))


def test_a_copy_put_is_read_back_and_counted(store: DerivedStore) -> None:
    staged = docs(1)
    assert store.get(key()) is None
    assert store.put(key(), staged, 50) is True
    unit = store.get(key())
    assert unit is not None
    assert unit.inputs == 50
    assert_same(unit.staged, staged)
    stats = store.stats
    assert (stats.hits, stats.misses, stats.writes, stats.corrupt) == (1, 1, 1, 0)
    assert stats.bytes_written == stats.bytes_read > 0
    assert store.get_bytes(key()) == encode(staged, 50)


def test_a_second_put_of_a_key_writes_nothing(store: DerivedStore) -> None:
    assert store.put(key(), docs(1), 50) is True
    assert store.put(key(), docs(1), 50) is False
    assert store.stats.writes == 1


def test_a_changed_chain_or_shard_never_reads_an_old_copy(store: DerivedStore) -> None:
    store.put(key(chain="a" * 64), docs(1), 50)
    for other in (
        key(chain="b" * 64),
        key(chain="a" * 64, version="etag2"),
        key(chain="a" * 64, size=1),
        key(chain="a" * 64, start=10),
    ):
        assert store.get(other) is None
    assert store.get(key(chain="a" * 64)) is not None


def test_the_store_travels_by_its_config(store: DerivedStore) -> None:
    store.put(key(), docs(1), 50)
    copy = pickle.loads(pickle.dumps(store))
    assert copy.stats.writes == 0
    assert copy.get(key()) is not None


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_copy_changed_on_disk_is_a_miss_and_removed(tmp_path: Path) -> None:
    store = local(tmp_path)
    store.put(key(), docs(1), 50)
    [path] = copy_files(store)
    _flip_last_byte(path)  # a write through the file system: the seal no longer matches
    with pytest.warns(CorruptCopyWarning, match="is damaged"):
        assert store.get(key()) is None
    assert copy_files(store) == []
    assert (store.stats.corrupt, store.stats.misses) == (1, 1)
    assert store.put(key(), docs(1), 50) is True  # derived again
    assert store.get(key()) is not None


def test_a_copy_whose_stat_changed_but_not_its_bytes_is_sealed_again(tmp_path: Path) -> None:
    store = local(tmp_path)
    store.put(key(), docs(1), 50)
    [path] = copy_files(store)
    os.chmod(path, 0o600)  # its change time moves: the seal no longer matches its stat
    unit = store.get(key())
    assert unit is not None
    assert_same(unit.staged, docs(1))
    assert copy_files(store) == [path]
    assert (store.stats.hits, store.stats.corrupt) == (1, 0)


def test_damage_below_the_file_system_fails_the_checksum(tmp_path: Path) -> None:
    store = local(tmp_path)
    store.put(key(), docs(1), 50)
    [path] = copy_files(store)
    _flip_last_byte(path)
    write_seal(str(path), "not-checked-on-open")  # as if a disk had flipped it unseen
    with pytest.warns(CorruptCopyWarning, match="do not match their SHA-256"):
        assert store.get(key()) is None
    assert copy_files(store) == []


def test_a_copy_put_under_another_name_is_refused(tmp_path: Path) -> None:
    store = DerivedStore(DerivedConfig(url=(tmp_path / "shared").as_uri()))
    store.put(key(1), docs(1), 50)
    [one] = copy_files(store)
    wrong = Path(store.path(key(2)))
    wrong.parent.mkdir(parents=True, exist_ok=True)
    wrong.write_bytes(one.read_bytes())
    with pytest.warns(CorruptCopyWarning, match="holds the copy of"):
        assert store.get(key(2)) is None
    assert not wrong.exists()


def test_a_damaged_shared_copy_is_a_miss_and_removed() -> None:
    url = "memory://derived-damaged/"
    store = DerivedStore(DerivedConfig(url=url))
    store.put(key(), docs(1), 50)
    fs = fsspec.filesystem("memory")
    [path] = fs.find("/derived-damaged")
    fs.pipe_file(path, fs.cat_file(path)[:-1])
    with pytest.warns(CorruptCopyWarning):
        assert store.get(key()) is None
    assert fs.find("/derived-damaged") == []
    assert store.put(key(), docs(1), 50) is True


def test_a_shared_copy_on_s3_is_read_with_one_request(
    s3: LoopbackS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GET alone: s3fs's ``cat_file`` of a whole object asks its size first (a HEAD per
    copy, every epoch), which a read from byte 0 does not."""
    import s3fs

    url = "s3://ingest-test/derived-requests/"
    store = DerivedStore(DerivedConfig(url=url, storage_options=s3.storage_options()))
    store.put(key(), docs(1), 50)
    asked: list[str] = []
    info = s3fs.S3FileSystem._info

    async def counted(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(path)
        return await info(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_info", counted)
    got = store.get(key())
    assert got is not None
    assert_same(got.staged, docs(1))
    assert asked == []


def test_a_directory_stays_within_its_bytes_least_recently_used_first(tmp_path: Path) -> None:
    probe = local(tmp_path / "probe")
    probe.put(key(), docs(0), 50)
    size = probe.stats.bytes_written
    store = local(tmp_path, max_bytes=int(size * 2.5))  # room for two copies
    store.put(key(0), docs(0), 50)
    store.put(key(1), docs(1), 50)
    # A copy's last use is its seal's modification time: 0 older than 1, then read again.
    os.utime(seal_of(store.path(key(0))), (1, 1))
    os.utime(seal_of(store.path(key(1))), (2, 2))
    assert store.get(key(0)) is not None  # 0 used last: 1 goes first
    assert store.put(key(2), docs(2), 50) is True
    assert store.get(key(1)) is None
    assert store.get(key(0)) is not None
    assert store.get(key(2)) is not None
    assert store.stats.evictions == 1
    usage = store.usage()
    assert usage is not None
    assert usage <= int(size * 2.5)


def test_a_copy_larger_than_the_directory_is_not_kept(tmp_path: Path) -> None:
    store = local(tmp_path, max_bytes=1000)
    assert store.put(key(), docs(1), 50) is False
    assert store.get(key()) is None


def test_a_nodes_copies_are_the_owners_alone(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = local(tmp_path)
        store.put(key(), docs(1), 50)
    finally:
        os.umask(old)
    [path] = copy_files(store)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Path(store.path(key())) == path
    for folder in (path.parent, root_of(store)):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({}, "give one of them"),
        ({"url": "memory://x/", "local": CacheOptions("/tmp/x", max_bytes=1)}, "give one"),
        ({"url": " "}, "non-empty URL"),
    ],
)
def test_a_config_names_one_place(config: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        DerivedConfig(**config)


def test_a_frame_needs_a_keys_name() -> None:
    with pytest.raises(ValueError, match="40 hex characters"):
        frame("short", b"")


# -- two processes racing -----------------------------------------------------------------


def _race(configs: list[DerivedConfig], start: Any, out: Any) -> None:
    """One writer: for each store in turn, make the unit, wait for the other writer, put it,
    read it back."""
    staged = docs(7, rows=400)
    for n, config in enumerate(configs):
        store = DerivedStore(config)
        start.wait()
        written = store.put(key(), staged, 400)
        got = store.get_bytes(key())
        out.put((n, written, None if got is None else hashlib.sha256(got).hexdigest()))


def test_two_processes_racing_leave_one_copy_both_read(tmp_path: Path) -> None:
    """In a node's directory and at a ``file://`` URL (both in the same two processes: a
    spawned process costs seconds on a busy machine)."""
    configs = [
        DerivedConfig(local=CacheOptions(str(tmp_path / "derived"), max_bytes=1 << 30)),
        DerivedConfig(url=(tmp_path / "shared").as_uri()),
    ]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process running Arrow threads
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(configs, start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in range(2 * len(configs))]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    want = hashlib.sha256(encode(docs(7, rows=400), 400)).hexdigest()
    for n, config in enumerate(configs):
        both = [(w, d) for m, w, d in results if m == n]
        assert sorted(w for w, _ in both) == [False, True], config
        assert {d for _, d in both} == {want}, config
        store = DerivedStore(config)
        assert len(copy_files(store)) == 1
        leftovers = [p for p in root_of(store).rglob("*") if p.suffix in (".part", ".tmp")]
        assert leftovers == []


def _killed_while_writing(config: DerivedConfig) -> None:
    """A writer killed (os._exit, as SIGKILL leaves it: no cleanup) halfway through its copy:
    in a node's directory inside the part file's write, at a URL before its link."""
    from ingest.engine.derived import copies

    def half_then_die(path: str, blob: bytes) -> None:
        with open(path, "wb") as f:
            f.write(blob[: len(blob) // 2])
            f.flush()
        os._exit(9)

    def die(fd: Any) -> None:
        os._exit(9)

    copies._write = half_then_die  # type: ignore[assignment]
    os.fsync = die
    DerivedStore(config).put(key(), docs(3, rows=50), 50)


@pytest.mark.parametrize("where", ["local", "file"])
def test_a_writer_killed_while_it_writes_leaves_no_copy(tmp_path: Path, where: str) -> None:
    """Issue 34's exactness case: a reader killed while it writes a copy leaves nothing a
    reader takes for a copy (a miss, not a damaged copy), and the next writer writes it whole."""
    config = (
        DerivedConfig(local=CacheOptions(str(tmp_path / "derived"), max_bytes=1 << 30))
        if where == "local"
        else DerivedConfig(url=(tmp_path / "shared").as_uri())
    )
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_killed_while_writing, args=(config,))
    child.start()
    child.join(120)
    assert child.exitcode == 9, "the writer died in the middle of its write"
    store = DerivedStore(config)
    assert store.get(key()) is None
    assert store.stats.misses == 1 and store.stats.corrupt == 0
    assert store.put(key(), docs(3, rows=50), 50), "the next writer writes the copy"
    got = store.get(key())
    assert got is not None
    assert_same(got.staged, docs(3, rows=50))


def test_a_dead_writers_temporary_file_at_a_url_is_removed_by_the_next_writer(
    tmp_path: Path,
) -> None:
    """At a ``file://`` URL a writer killed before it links its copy leaves its temporary
    file; the next writer in that folder removes it once it is older than
    ``STALE_WRITE_S``, and leaves a younger one (a live writer's) alone."""
    from ingest.engine.derived.copies import STALE_WRITE_S

    config = DerivedConfig(url=(tmp_path / "shared").as_uri())
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_killed_while_writing, args=(config,))
    child.start()
    child.join(120)
    assert child.exitcode == 9, "the writer died before it linked its copy"
    [dead] = [p for p in (tmp_path / "shared").rglob("*") if p.suffix == ".tmp"]
    old = time.time() - STALE_WRITE_S - 60
    os.utime(dead, (old, old))
    live = dead.with_name(f".{key(1).name()}.derived.0a0b0c0d.tmp")
    live.write_bytes(b"a writer at work")
    store = DerivedStore(config)
    assert store.put(key(), docs(3, rows=50), 50)
    assert not dead.exists(), "the dead writer's temporary file is removed"
    assert live.exists(), "a live writer's is left alone"
