"""Follow mode over a Delta Lake table (:mod:`ingest.storage.sources.delta`): each round reads
the rows appended since the last, every row once, through compactions (OPTIMIZE), which
rewrite files without changing the table's rows. Before, the first round after a compaction
was refused: the files the rounds before read had left the table's newest version ("vanished
while the stream followed the dataset"), though a compaction changes no row. Tables are
written by ``deltalake`` (delta-rs), the reference."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from ingest.core.book import EpochBook
from ingest.core.errors import SourceError
from ingest.core.state import StreamState
from ingest.engine.options import Shuffle
from ingest.engine.spec import StreamSpec
from ingest.planner.catalog import Listing
from tests.test_epochs import batches_of

deltalake = pytest.importorskip("deltalake")

FOLLOW = ingest.Follow(poll_s=0.02, idle_timeout_s=0.3)
BATCH = 10


def _append(url: str, first: int, n: int = 40) -> None:
    deltalake.write_deltalake(url, pa.table({"id": list(range(first, first + n))}), mode="append")


def _compact(url: str) -> None:
    deltalake.DeltaTable(url).optimize.compact()  # its commit: dataChange false


def _round(stream: Any) -> list[int]:
    return [i for batch in stream for i in batch["id"].tolist()]


def _once(got: list[int], *firsts: int, n: int = 40) -> None:
    """``got`` is each id of the appends that start at ``firsts`` once, and no other."""
    expected = [i for first in firsts for i in range(first, first + n)]
    assert Counter(got) == Counter(expected)


@pytest.mark.parametrize("vacuumed", [False, True], ids=["kept", "vacuumed"])
def test_a_followed_table_reads_each_appended_row_once_through_compactions(
    tmp_path: Path, vacuumed: bool
) -> None:
    """Round 2 reads the rows appended since round 1, though a compaction between rewrote
    them with round 1's into one file (its rows are round 1's and the new append's: the new
    rows are read from the file they were appended in, still on the store until VACUUM);
    round 3 the append after a compaction of that compaction. A VACUUM that removed the
    files the rounds before read (never read again) changes nothing."""
    url = str(tmp_path / "t")
    for k in range(4):
        _append(url, k * 100)
    stream = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW, shuffle_seed=1)
    _once(_round(stream), 0, 100, 200, 300)
    _append(url, 1000)
    _compact(url)
    _append(url, 2000)
    _once(_round(stream), 1000, 2000)
    _compact(url)
    if vacuumed:
        table = deltalake.DeltaTable(url)
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    _append(url, 3000)
    _once(_round(stream), 3000)
    assert _round(stream) == [], "nothing new: the round holds no step"


def test_a_restore_inside_a_round_after_a_compaction_reads_each_row_once(
    tmp_path: Path,
) -> None:
    """A state saved inside round 2 (after a compaction, at the table's version then),
    loaded into a new stream after another compaction and an append: the rest of round 2,
    then round 3 (the append), every row once."""
    url = str(tmp_path / "t")
    for k in range(3):
        _append(url, k * 100)
    stream = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW, shuffle_seed=1)
    first = _round(stream)
    _append(url, 1000)
    _compact(url)
    _append(url, 2000)
    it = iter(stream)
    before = [i for _ in range(3) for i in next(it)["id"].tolist()]
    state = json.loads(json.dumps(stream.state_dict()))
    assert set(state["dataset"]["tables"]) == {f"file://{url}"}
    _compact(url)
    _append(url, 3000)
    resumed = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW, shuffle_seed=1)
    resumed.load_state_dict(state)
    rest = _round(resumed)
    _once(first + before + rest, 0, 100, 200, 1000, 2000)
    _once(_round(resumed), 3000)


def test_a_restore_after_a_vacuum_of_files_the_rounds_read_reads_only_the_new_rows(
    tmp_path: Path,
) -> None:
    """A state saved at a round's end, loaded by a new stream after a compaction and a
    VACUUM deleted the files the rounds read: they are listed from the log (their row
    counts from its statistics, nothing read), and the next round reads the new append
    alone. A file a VACUUM deleted before its rows were read is an error naming it (before,
    an assertion in the Parquet reader: it had no footer)."""
    url = str(tmp_path / "t")
    for k in range(3):
        _append(url, k * 100)
    stream = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW, shuffle_seed=1)
    _once(_round(stream), 0, 100, 200)
    state = json.loads(json.dumps(stream.state_dict()))
    _append(url, 1000)  # not read: removed by the compaction, deleted by the VACUUM
    _compact(url)
    table = deltalake.DeltaTable(url)
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    resumed = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW, shuffle_seed=1)
    resumed.load_state_dict(state)
    with pytest.raises(SourceError, match="deleted by a VACUUM before the stream read"):
        _round(resumed)
    url = str(tmp_path / "read")
    for k in range(3):
        _append(url, k * 100)
    stream = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW, shuffle_seed=1)
    _round(stream)
    state = json.loads(json.dumps(stream.state_dict()))
    _compact(url)
    table = deltalake.DeltaTable(url)
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    _append(url, 1000)
    resumed = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW, shuffle_seed=1)
    resumed.load_state_dict(state)
    _once(_round(resumed), 1000)


def _delta_ids(listing: Listing, runs: list[tuple[int, int, int, int]]) -> list[int]:
    """The ``id`` of each row of ``runs`` (read from the shards' files)."""
    out: list[int] = []
    for _, shard, start, stop in runs:
        path = listing.shards[shard].url.removeprefix("file://")
        out += pq.read_table(path, columns=["id"])["id"].to_pylist()[start:stop]
    return out


def _book_round(
    book: EpochBook[Listing], epoch: int, steps: int | None = None
) -> tuple[list[int], int]:
    """Every rank acks ``steps`` of its share of round ``epoch`` (None: all); the ids, and
    the first step none acked."""
    got = []
    for rank in range(book.world_size):
        plan = book.rank_plan(rank, epoch)
        records = batches_of(plan, BATCH)[:steps]
        book.ack(rank, records)
        got += _delta_ids(plan.listing, [run for r in records for run in r.runs])
    return got, book.plan(epoch).first_step + (steps or 0)


def test_a_restore_at_another_world_size_reads_each_row_once(tmp_path: Path) -> None:
    """Ranks' books: a state saved by 2 ranks inside round 2, after a compaction, loaded
    by 3 after another: the rest of the round and the next, each row once (the rows that
    fill no step at the round's end are carried, and counted)."""
    url = str(tmp_path / "t")
    for k in range(3):
        _append(url, k * 100)
    spec = StreamSpec(urls=(url,), batch_size=BATCH, follow=FOLLOW, shuffle=Shuffle(seed=3))
    book = spec.book(2)
    first, _ = _book_round(book, 0)
    _append(url, 1000)
    _compact(url)
    _append(url, 2000)
    partial, step = _book_round(book, 1, steps=2)
    state = StreamState.from_json(json.loads(json.dumps(book.snapshot(step - 1).to_json())))
    _compact(url)
    _append(url, 3000)
    resumed = spec.book(3)
    resumed.load(state)
    rest, _ = _book_round(resumed, 1)
    third, _ = _book_round(resumed, 2)
    got = first + partial + rest + third
    appended = {i for first in (0, 100, 200, 1000, 2000, 3000) for i in range(first, first + 40)}
    assert len(got) == len(set(got)) and set(got) <= appended
    assert len(got) + resumed.plan(2).assignment.remainder_rows == len(appended)


@pytest.mark.parametrize("change", ["delete", "overwrite"])
def test_a_followed_table_whose_rows_changed_is_refused_naming_the_commit(
    tmp_path: Path, change: str
) -> None:
    """A commit that removes rows (DELETE, UPDATE, MERGE, an overwrite: a file removed
    with dataChange true) is not an append: rows a round read may be gone, or come again
    rewritten. Refused, naming the commit's version and operation, and the fix."""
    url = str(tmp_path / "t")
    for k in range(2):
        _append(url, k * 100)
    stream = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW)
    _round(stream)
    if change == "delete":
        deltalake.DeltaTable(url).delete("id < 10")
    else:
        deltalake.write_deltalake(url, pa.table({"id": [7]}), mode="overwrite")
    with pytest.raises(SourceError) as e:
        _round(stream)
    message = str(e.value)
    assert "commit 2" in message and ("DELETE" in message or "WRITE" in message), message
    assert "only grows" in message and "new stream" in message, message


def test_a_followed_table_whose_log_lost_the_first_rounds_version_is_refused(
    tmp_path: Path,
) -> None:
    """The rounds are read from the version the first was listed at: a log whose retention
    removed its commits cannot tell which files were appended since. Refused, naming the
    version and the fix."""
    url = str(tmp_path / "t")
    for k in range(2):
        _append(url, k * 100)
    stream = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW)
    _round(stream)
    _append(url, 1000)
    deltalake.DeltaTable(url).create_checkpoint()
    log = tmp_path / "t" / "_delta_log"
    for commit in sorted(log.glob("*.json"))[:-1]:
        commit.unlink()
    with pytest.raises(SourceError, match=r"version 1\b.*retention"):
        _round(stream)


def _ray_round(it: Any) -> list[int]:
    return [int(i) for batch in it for i in batch["id"].tolist()]


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_a_ray_streams_ranks_follow_a_table_through_a_compaction(tmp_path: Path) -> None:
    """The coordinator plans the rounds: 2 ranks read round 2 through a compaction, then 3
    ranks of a new stream, loaded with the state at its end, read round 3 after another;
    every appended row once (but the rows that fill no step, carried)."""
    import ray

    rank = ray.remote(num_cpus=0)(_ray_round)
    url = str(tmp_path / "t")
    for k in range(3):
        _append(url, k * 100)
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle_seed": 4, "follow": FOLLOW}
    firsts, got = [0, 100, 200], []
    with ingest.RayStream(url, world_size=2, timeout_s=60, **kwargs) as stream:
        for n in (1, 2):
            out = ray.get([rank.remote(stream.rank_iterator(r)) for r in range(2)], timeout=120)
            assert len(out[0]) == len(out[1]), "equal steps per rank"
            got += out[0] + out[1]
            firsts.append(1000 * n)
            _append(url, firsts[-1])
            _compact(url)
        state = json.loads(json.dumps(stream.state_dict()))
    with ingest.RayStream(url, world_size=3, timeout_s=60, **kwargs) as stream:
        stream.load_state_dict(state)
        out = ray.get([rank.remote(stream.rank_iterator(r)) for r in range(3)], timeout=120)
        assert len(out[0]) == len(out[1]) == len(out[2]), "equal steps per rank"
        got += [i for ids in out for i in ids]
    appended = {i for first in firsts for i in range(first, first + 40)}
    assert len(got) == len(set(got)) and set(got) <= appended
    assert len(appended) - len(got) < 3 * 5, "all but the rows that fill no step of 3 ranks"


def test_each_round_reads_only_the_commits_written_since_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rounds list the table from the first round's version: the commits since are
    kept as read (a commit file is never rewritten), so each is read once, not every round
    (every ``poll_s`` while a round waits)."""
    from fsspec.implementations.local import LocalFileSystem

    url = str(tmp_path / "t")
    for k in range(2):
        _append(url, k * 100)
    read: list[str] = []
    cat = LocalFileSystem.cat

    def counted(self: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        paths = path if isinstance(path, list) else [path]
        read.extend(p.rsplit("/", 1)[-1] for p in paths if "_delta_log" in str(p))
        return cat(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "cat", counted)
    stream = ingest.Stream(url, batch_size=BATCH, follow=FOLLOW)
    for n in range(1, 4):
        _round(stream)
        _append(url, 1000 * n)
        _compact(url)
    _once(_round(stream), 3000)
    counts = Counter(read)
    assert counts and max(counts.values()) == 1, counts
