"""The derived cache wired into the readers (issue 34, item 1): ``derived=`` makes a Stream and
a DataLoader's workers keep what the stage chain made of each unit read whole and read it
again in place of running the chain, exactly: the same batches as without it, every input
row acked once and every output row delivered once per epoch, through stops and resumes with
some units cached and some not."""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import ingest
from ingest.core.errors import ShardError
from ingest.engine.derived import CorruptCopyWarning, DerivedWarning
from ingest.engine.stage import RowError
from ingest.testing import Store, write_dataset
from tests.carry import carried_rows

SHARDS, ROWS, BATCH = 4, 64, 16
"""256 rows: 16 batches an epoch, none carried."""
EXPECTED = Counter((i, k) for i in range(SHARDS * ROWS) for k in range(i % 3))
"""Every output of an epoch (Split's): row ``i`` makes ``i % 3`` of them."""


class Split(ingest.Stage):
    """Row ``i`` becomes ``i % 3`` rows ``(i, 0), (i, 1)...``: a filter (``i % 3 == 0``
    makes none) and a split in one. Counts the input rows it is run on (all instances)."""

    rows = 0
    lock = threading.Lock()

    def __init__(
        self, version: str = "1", fail_on: int | None = None, error: type = RuntimeError
    ) -> None:
        self.version = version
        self.fail_on = fail_on
        self.error = error

    def fingerprint(self) -> str:
        return f"split {self.version}"

    def __call__(self, table: pa.Table) -> ingest.Staged:
        ids = table["id"].to_numpy()
        with Split.lock:
            Split.rows += len(ids)
        if self.fail_on is not None and self.fail_on in ids:
            if self.error is ShardError:  # a data error: its row alone is quarantined
                raise ShardError("(stage)", f"bad row {self.fail_on}", "fix the row")
            raise RuntimeError(f"bad row {self.fail_on}")
        counts = ids % 3
        origin = np.repeat(np.arange(len(ids), dtype=np.int64), counts)
        k = np.arange(len(origin)) - np.repeat(np.cumsum(counts) - counts, counts)
        return ingest.Staged(pa.table({"id": ids[origin], "k": k.astype(np.int64)}), origin)


@pytest.fixture
def data(local: Store) -> str:
    write_dataset(local.fs, local.url("d"), "parquet", SHARDS, ROWS, row_group_rows=16)
    return local.url("d")


@pytest.fixture
def copies(tmp_path: Path) -> Path:
    return tmp_path / "derived"


def _stream(url: str, stage: Any, derived: Path | None, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        url,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=5,
        shuffle_window=40,  # 20 rows a lane: windows start inside units
        shuffle_lanes=2,
        transform=stage,
        derived=None if derived is None else f"file://{derived}",
        **options,
    )


def _outputs(batch: dict[str, Any]) -> list[tuple[int, int]]:
    return list(zip(batch["id"].tolist(), batch["k"].tolist(), strict=True))


def _epoch(stream: Any) -> list[list[tuple[int, int]]]:
    return [_outputs(b) for b in stream]


def _files(copies: Path) -> list[Path]:
    return sorted(copies.rglob("*.derived"))


def _calls(run: Any) -> tuple[Any, int]:
    before = Split.rows
    got = run()
    return got, Split.rows - before


def test_epoch_one_writes_a_copy_per_unit_and_epoch_two_runs_no_stage(
    data: str, copies: Path
) -> None:
    """Epoch 1 runs the chain once per unit (each input row once) and writes one copy per
    unit; epoch 2, and a new stream (a restart, another job), read the copies and run no
    stage. Every epoch's batches are those of the same stream without the cache, in order."""
    plain = _stream(data, Split(), None)
    want = [_epoch(plain), _epoch(plain)]
    stream = _stream(data, Split(), copies)
    first, ran = _calls(lambda: _epoch(stream))
    assert first == want[0]
    assert ran == SHARDS * ROWS, "the chain ran once on every input row, over whole units"
    written = _files(copies)
    assert len(written) >= SHARDS
    second, ran = _calls(lambda: _epoch(stream))
    assert (second, ran) == (want[1], 0)
    again, ran = _calls(lambda: _epoch(_stream(data, Split(), copies)))
    assert (again, ran) == (want[0], 0)
    assert _files(copies) == written, "a hit writes nothing"
    assert Counter(o for b in first for o in b) == EXPECTED


def test_a_node_directory_holds_the_copies_too(data: str, tmp_path: Path) -> None:
    config = ingest.DerivedConfig(local=ingest.CacheOptions(str(tmp_path / "node"), 1 << 30))

    def make() -> ingest.Stream:
        return ingest.Stream(
            data, columns=["id"], batch_size=BATCH, shuffle_seed=5, transform=Split(),
            derived=config,
        )  # fmt: skip

    first, ran = _calls(lambda: _epoch(make()))
    assert ran == SHARDS * ROWS
    second, ran = _calls(lambda: _epoch(make()))
    assert (second, ran) == (first, 0)


def _stop_and_resume(first: Any, stop_after: int, data: str, copies: Path) -> Counter[Any]:
    """Outputs of ``first`` up to ``stop_after`` batches, then of a Stream resumed from its
    state to the end of the epoch."""
    before: Counter[tuple[int, int]] = Counter()
    for n, batch in enumerate(first):
        before.update(_outputs(batch))
        if n + 1 == stop_after:
            break
    state = first.state_dict()
    first.close()
    resumed = _stream(data, Split(), copies)
    resumed.load_state_dict(state)
    after = Counter(o for b in resumed for o in _outputs(b))
    assert not set(before) & set(after), "no output twice"
    return before + after


@pytest.mark.parametrize("stop_after", [3, 9])
def test_a_stop_and_resume_with_some_units_cached_delivers_every_output_once(
    data: str, copies: Path, stop_after: int
) -> None:
    """Half an epoch cached, then a stop and a resume (partial units on today's path, the
    units read whole from their copies or derived now): every output once; and a cold
    stream stopped and resumed over a cache the first run half filled."""
    half = _stream(data, Split(), copies, read=ingest.ReadOptions(prefetch=0))
    for n, _ in enumerate(half):  # without reading ahead: about half the units read
        if n == 7:
            break
    half.close()
    cached = len(_files(copies))
    assert 0 < cached < SHARDS * ROWS // 16, "some units were cached, not all"
    both = _stop_and_resume(_stream(data, Split(), copies), stop_after, data, copies)
    assert both == EXPECTED
    assert len(_files(copies)) > cached


def test_a_dataloader_stopped_and_resumed_on_a_stream_delivers_every_output_once(
    data: str, copies: Path
) -> None:
    warm = _stream(data, Split(), copies, read=ingest.ReadOptions(prefetch=0))
    for n, _ in enumerate(warm):
        if n == 5:
            break
    warm.close()
    loader = ingest.DataLoader(_stream(data, Split(), copies), num_workers=2)
    assert _stop_and_resume(loader, 6, data, copies) == EXPECTED


def test_a_changed_fingerprint_never_reads_an_old_copy(data: str, copies: Path) -> None:
    _epoch(_stream(data, Split("1"), copies))
    old = _files(copies)
    got, ran = _calls(lambda: _epoch(_stream(data, Split("2"), copies)))
    assert ran == SHARDS * ROWS, "every unit derived again"
    assert len(_files(copies)) == 2 * len(old)
    assert got == _epoch(_stream(data, Split("2"), None))


def test_a_corrupt_copy_is_a_miss_and_derived_again(data: str, copies: Path) -> None:
    want = _epoch(_stream(data, Split(), copies))
    damaged = _files(copies)[0]
    blob = bytearray(damaged.read_bytes())
    blob[-1] ^= 0xFF
    damaged.write_bytes(bytes(blob))
    with pytest.warns(CorruptCopyWarning, match="damaged"):
        got, ran = _calls(lambda: _epoch(_stream(data, Split(), copies)))
    assert got == want
    assert 0 < ran < SHARDS * ROWS, "the damaged unit alone was derived again"
    assert damaged.read_bytes() != bytes(blob), "and written anew"
    _, ran = _calls(lambda: _epoch(_stream(data, Split(), copies)))
    assert ran == 0


def _plain(table: pa.Table) -> pa.Table:
    return table.append_column("k", pa.array(np.zeros(table.num_rows, np.int64)))


def test_a_chain_without_a_fingerprint_caches_nothing_and_warns_once(
    data: str, copies: Path
) -> None:
    stream = _stream(data, _plain, copies)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _epoch(stream)
        second = _epoch(stream)
    said = [w for w in caught if issubclass(w.category, DerivedWarning)]
    assert len(said) == 1 and "has no fingerprint" in str(said[0].message)
    assert not copies.exists() or not _files(copies)
    plain = _stream(data, _plain, None)
    assert [first, second] == [_epoch(plain), _epoch(plain)]


@pytest.mark.parametrize("error", [RuntimeError, ShardError])
def test_a_unit_whose_chain_raised_is_not_cached_as_empty(
    data: str, copies: Path, error: type
) -> None:
    """on_error="skip": the unit holding the row the chain fails on runs on each batch, as
    without the cache: the same batches and the same quarantines (the step for an error,
    the row alone for a data error); it has no copy, the others have, and the next stream
    derives it again (and fails again)."""
    skip = ingest.ReadOptions(on_error="skip")

    def run(derived: Path | None) -> tuple[Any, list[Any]]:
        stream = _stream(data, Split(fail_on=100, error=error), derived, read=skip)
        got = _epoch(stream)
        return got, [(q.step, q.url, q.start, q.rows, q.reason) for q in stream.quarantined]

    want = run(None)
    assert len(want[1]) == 1 and "bad row 100" in want[1][0][-1]
    if error is ShardError:
        assert want[1][0][1:4] == (f"{data}/part-00001.parquet", 36, 1)
    assert run(copies) == want
    held = _files(copies)
    again, ran = _calls(lambda: run(copies))
    assert again == want
    assert 0 < ran < SHARDS * ROWS, "the failed unit alone ran again"
    assert _files(copies) == held, "and was not cached"


def test_derived_takes_a_config_or_a_url_and_refuses_anything_else(data: str) -> None:
    with pytest.raises(TypeError, match="derived=3"):
        ingest.Stream(data, derived=3)  # type: ignore[arg-type]


def _tokenizer() -> Any:
    """A word-level ``tokenizers`` tokenizer of the rows' text (``"row <id>"``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "</s>", "row", *(str(i) for i in range(SHARDS * ROWS))]
    tokenizer = Tokenizer(models.WordLevel({w: n for n, w in enumerate(words)}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def test_tokenize_and_pack_read_the_copies_and_tokenize_nothing(
    data: str, copies: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case the cache is for: Tokenize (fingerprinted by its tokenizer) before Pack. A
    warm stream's sequences are those of a stream without the cache, token for token, and
    it tokenizes nothing."""
    tokenize = ingest.Tokenize(_tokenizer(), eos_id=1)
    calls = Counter[str]()
    call = ingest.Tokenize.__call__

    def counted(self: Any, table: pa.Table) -> Any:
        calls["rows"] += table.num_rows
        return call(self, table)

    monkeypatch.setattr(ingest.Tokenize, "__call__", counted)

    def sequences(derived: Path | None) -> list[list[list[int]]]:
        stream = ingest.Stream(
            data, columns=["text"], batch_size=4, shuffle_seed=5, shuffle_window=40,
            transform=tokenize, pack=ingest.Pack(seq_len=16, read_rows=BATCH),
            derived=None if derived is None else f"file://{derived}",
        )  # fmt: skip
        return [b["input_ids"].tolist() for b in stream]

    want = sequences(None)
    assert sequences(copies) == want
    assert calls["rows"] == 2 * SHARDS * ROWS, "once per batch, then once per unit"
    calls.clear()
    assert sequences(copies) == want
    assert calls["rows"] == 0


def test_derived_without_a_transform_is_refused(data: str) -> None:
    with pytest.raises(ingest.ConfigError, match="there is no transform"):
        ingest.Stream(data, derived="file:///tmp/unused")


class Refuses(Split):
    """Refuses row 100 (a tokenizer's id out of range, say): a RowError naming its row."""

    def __call__(self, table: pa.Table) -> ingest.Staged:
        ids = table["id"].to_numpy()
        if 100 in ids:
            raise RowError(int(np.flatnonzero(ids == 100)[0]), "id 100 refused", "drop it")
        return super().__call__(table)


def test_a_row_a_stage_refuses_is_named_as_without_the_cache(data: str, copies: Path) -> None:
    said = []
    for derived in (None, copies):
        with pytest.raises(ingest.ConfigError, match="id 100 refused") as e:
            _epoch(_stream(data, Refuses(), derived))
        said.append(str(e.value))
    assert said[0] == said[1] and "part-00001.parquet row 36" in said[0]


def test_dataloader_workers_tokenize_and_pack_from_the_copies(data: str, copies: Path) -> None:
    """DataLoader(2) over Tokenize and Pack (its workers tokenize, its main process packs):
    cold and warm, the sequences of the same loader without the cache."""

    def sequences(derived: Path | None) -> list[list[list[int]]]:
        stream = ingest.Stream(
            data, columns=["text"], batch_size=4, shuffle_seed=5, shuffle_window=40,
            transform=ingest.Tokenize(_tokenizer(), eos_id=1),
            pack=ingest.Pack(seq_len=16, read_rows=BATCH),
            derived=None if derived is None else f"file://{derived}",
        )  # fmt: skip
        loader = ingest.DataLoader(stream, num_workers=2)
        try:
            return [b["input_ids"].tolist() for b in loader]
        finally:
            loader.close()

    want = sequences(None)
    assert sequences(copies) == want
    written = _files(copies)
    assert written
    assert sequences(copies) == want
    assert _files(copies) == written


def test_stream_stats_count_the_cache(data: str, copies: Path) -> None:
    """``stream.stats`` counts copies missed and written, and the stage time spent; a stream
    over the copies counts them hit and read, and the stage time they saved: the time their
    stages took when they were made (issue 34, item 6)."""
    first = _stream(data, Split(), copies)
    _epoch(first)
    made = first.stats
    units = len(_files(copies))
    assert made["derived_misses"] == made["derived_writes"] == units
    assert made["derived_hits"] == made["derived_saved_us"] == 0
    assert made["derived_bytes_written"] == sum(p.stat().st_size for p in _files(copies))
    assert made["derived_stage_us"] > 0
    second = _stream(data, Split(), copies)
    _epoch(second)
    read = second.stats
    assert read["derived_hits"] == units and read["derived_misses"] == 0
    assert read["derived_bytes_read"] == made["derived_bytes_written"]
    assert read["derived_stage_us"] == 0 and read["derived_writes"] == 0
    assert read["derived_saved_us"] == made["derived_stage_us"]
    plain = _stream(data, Split(), None)
    _epoch(plain)
    assert {k: v for k, v in plain.stats.items() if k.startswith("derived_")} == dict.fromkeys(
        ("derived_hits", "derived_misses", "derived_writes", "derived_bytes_read",
         "derived_bytes_written", "derived_stage_us", "derived_saved_us"), 0
    )  # fmt: skip


def test_a_mixtures_sources_keep_their_own_copies(local: Store, copies: Path) -> None:
    """Over a Mix each source's stream derives and reads its own units (issue 34, item 5):
    a second stream over the same mixture and store draws the same rows and runs no stage
    on the units the first read whole."""
    for name in ("a", "b"):
        write_dataset(local.fs, local.url(name), "parquet", 2, ROWS, row_group_rows=16)
    urls = {"a": local.url("a"), "b": local.url("b")}

    def run() -> tuple[list[list[tuple[int, int]]], int, dict[str, int]]:
        stream = ingest.Stream(
            ingest.Mix(urls, weights={"a": 1, "b": 1}), columns=["id"], batch_size=BATCH,
            shuffle_seed=5, transform=Split(), derived=f"file://{copies}",
        )  # fmt: skip
        got, ran = _calls(lambda: [_outputs(b) for _, b in zip(range(8), stream, strict=False)])
        return got, ran, stream.stats

    first, ran, made = run()
    assert ran > 0 and made["derived_writes"] > 0
    second, ran_again, read = run()
    assert second == first
    assert read["derived_hits"] == made["derived_writes"], "every unit written is read back"
    assert ran_again < ran


def test_a_followed_dataset_derives_each_new_shard_as_it_comes(local: Store, copies: Path) -> None:
    """Follow mode (issue 34, item 5): each round derives the shards that appeared since the
    last one, and a new stream over the same store reads them all from their copies."""
    write_dataset(local.fs, local.url("f"), "parquet", 2, ROWS, row_group_rows=16)
    follow = ingest.Follow(poll_s=0.02, idle_timeout_s=0.3)

    def stream() -> ingest.Stream:
        return ingest.Stream(
            local.url("f") + "/", columns=["id"], batch_size=BATCH, shuffle_seed=5,
            transform=Split(), derived=f"file://{copies}", follow=follow,
        )  # fmt: skip

    live = stream()
    _, ran = _calls(lambda: _epoch(live))
    assert ran == 2 * ROWS and live.stats["derived_writes"] == len(_files(copies))
    written = len(_files(copies))
    local.fs.copy(f"{local.url('f')}/part-00001.parquet", f"{local.url('f')}/part-00009.parquet")
    _, ran = _calls(lambda: _epoch(live))
    assert ran == ROWS, "the new shard alone was derived"
    assert len(_files(copies)) == written + written // 2
    again = stream()
    _, ran = _calls(lambda: _epoch(again))
    assert ran == 0 and again.stats["derived_hits"] == len(_files(copies))


def test_a_shard_of_unknown_count_is_one_copy_for_every_transport(
    local: Store, copies: Path
) -> None:
    """A JSONL shard (no row count until read) read to its end by a one-process Stream, and
    the same shard counted by a DataLoader's plan: one key, so the loader reads the copies
    the Stream wrote and writes none (each copy names its rows' end the same way)."""
    write_dataset(local.fs, local.url("j"), "jsonl", SHARDS, ROWS)

    def stream() -> ingest.Stream:
        return ingest.Stream(
            local.url("j"), columns=["id"], batch_size=BATCH, shuffle_seed=5,
            transform=Split(), derived=f"file://{copies}",
        )  # fmt: skip

    _epoch(stream())
    written = _files(copies)
    assert len(written) == SHARDS
    loader = ingest.DataLoader(stream(), num_workers=2)
    got = Counter(o for b in loader for o in _outputs(b))
    assert _files(copies) == written, "the loader read the Stream's copies and wrote none"
    assert got + _carried_outputs(loader.state_dict()) == EXPECTED


def _carried_outputs(state: dict[str, Any]) -> Counter[tuple[int, int]]:
    """The outputs of the rows an ended epoch carries into the next (``[shard, start, stop]``
    spans of the listing's shards in id order)."""
    rows = [shard * ROWS + r for shard, r in carried_rows(state)]
    return Counter((i, k) for i in rows for k in range(i % 3))


def test_a_streams_epochs_share_one_store_connection(
    data: str, copies: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each epoch's feed finds the copies through the same store connection: a filesystem
    made again every epoch cost a new S3 client each time where fsspec's instance cache is
    off (skip_instance_cache=True; 0.1-0.4 CPU s an epoch, benchmarks/derived_cache.py)."""
    from ingest.engine.derived import copies as module

    made = Counter[str]()
    init = module.SharedCopies.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made["shared"] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(module.SharedCopies, "__init__", counted)
    stream = _stream(data, Split(), copies)
    for _ in range(3):
        _epoch(stream)
    assert made["shared"] == 1
