"""Provenance (issue 35 item 1): which rows each rank's step consumed, from the log a stream
keeps at ``provenance=``, the same answer the ranks' batches gave at the time, across stops,
resumes and world-size changes, on every transport."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pytest
import ray

import ingest
from ingest.core.ledger import packed_row
from ingest.core.provenance import Attempt, authoritative, step_rows
from ingest.engine.provenance import ProvenanceLog, ProvenanceWriter, which
from ingest.testing import write_dataset

SHARDS, ROWS, BATCH = 4, 500, 32


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("prov")
    paths = write_dataset(
        fsspec.filesystem("file"), str(root / "d"), "parquet", SHARDS, ROWS, row_group_rows=125
    )
    return sorted(paths)


def ids_of(table: pa.Table, urls: list[str]) -> dict[tuple[int, int], list[int]]:
    """``(rank, step)`` -> the ids a log's rows name, in the order logged (ids are
    ``shard * ROWS + row`` in the listing's order)."""
    shard = {u: i for i, u in enumerate(urls)}
    out: dict[tuple[int, int], list[int]] = {}
    for r in table.to_pylist():
        base = shard[_path(r["url"])] * ROWS
        out.setdefault((r["rank"], r["step"]), []).extend(
            base + row for row in range(r["start"], r["stop"])
        )
    return out


def _path(url: str) -> str:
    return url.removeprefix("file://")


def ids(batch: Any) -> list[int]:
    return [int(v) for v in batch["id"].tolist()]


# -- pure ------------------------------------------------------------------------------------


def test_step_rows_keeps_the_batch_order_and_merges_consecutive_rows() -> None:
    rows = np.array(
        [packed_row(1, 2, 7), packed_row(1, 2, 8), packed_row(0, 0, 3), packed_row(1, 2, 9)],
        dtype=np.int64,
    )
    assert step_rows(rows).tolist() == [[2, 7, 9], [0, 3, 4], [2, 9, 10]]
    runs = np.array([[1, 3, 10, 20], [0, 1, 0, 5]], dtype=np.int64)
    assert step_rows(runs).tolist() == [[3, 10, 20], [1, 0, 5]]
    assert step_rows(np.zeros(0, dtype=np.int64)).shape == (0, 3)


def test_the_attempt_started_last_at_or_before_a_step_is_the_one_that_counts() -> None:
    fresh = Attempt("a", 0, 100, 3)
    resumed = Attempt("b", 40, 200, 2)  # from a state at step 40
    rolled_back = Attempt("c", 20, 300, 4)  # later, from an earlier state at step 20
    attempts = [fresh, resumed, rolled_back]
    assert authoritative(attempts, 10) == fresh
    assert authoritative(attempts, 30) == rolled_back
    assert authoritative(attempts, 50) == rolled_back  # b's step 50 was rolled back
    assert authoritative([resumed], 10) is None


# -- Stream ----------------------------------------------------------------------------------


def test_a_stream_logs_each_step_as_its_batch_held_it(data: list[str], tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    stream = ingest.Stream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=3, shuffle_window=256, provenance=log
    )
    seen = {(0, step): ids(b) for step, b in enumerate(stream)}
    assert len(seen) == SHARDS * ROWS // BATCH
    got = ids_of(which(log, range(len(seen))), data)
    assert got == seen  # every row of every step, in the batch's order


def test_a_stop_and_a_resume_supersede_the_steps_rolled_back(
    data: list[str], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")

    def make() -> ingest.Stream:
        return ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=5, provenance=log)

    first = make()
    it = iter(first)
    seen = {}
    for step in range(10):
        seen[(0, step)] = ids(next(it))
        if step == 5:
            state = first.state_dict()
    first.state_dict()  # steps 6..9 logged; then the run died, and resumes from step 5
    assert {k[1] for k in ids_of(which(log, range(10)), data)} == set(range(10))
    resumed = make()
    resumed.load_state_dict(state)
    again = {(0, 6 + k): ids(b) for k, b in enumerate(resumed)}
    assert set(again) & {(0, s) for s in range(6, 10)}
    answer = ids_of(which(log, range(0, 6 + len(again))), data)
    assert answer == {**{k: v for k, v in seen.items() if k[1] <= 5}, **again}
    for step in range(6, 10):  # the first attempt's steps 6..9 were superseded
        assert answer[(0, step)] == again[(0, step)]


def test_a_dataloader_logs_each_workers_steps(data: list[str], tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=1, provenance=log)
    loader = ingest.DataLoader(stream, num_workers=2)
    batches = [sorted(ids(b)) for _ in range(2) for b in loader]  # two epochs
    logged = ids_of(ProvenanceLog(log).which(range(len(batches))), data)
    assert {r for r, _ in logged} == {0, 1}
    assert sorted(sorted(v) for v in logged.values()) == sorted(batches)


def test_a_torn_chunk_is_left_out_with_a_warning(data: list[str], tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, provenance=log)
    n = 0
    for _ in stream:
        n += 1
        if n == 20:
            stream.state_dict()  # a chunk of steps 0..19; the rest at the epoch's end
    chunks = sorted((tmp_path / "log" / "steps").rglob("*.arrow"))
    assert len(chunks) == 2
    chunks[0].write_bytes(chunks[0].read_bytes()[:100])
    with pytest.warns(ingest.ProvenanceWarning, match="cannot be read whole") as told:
        table = which(log, range(n))
    assert len(told) == 1  # once per chunk, not per step
    assert sorted(set(table["step"].to_pylist())) == list(range(20, n))


def test_a_log_with_no_attempt_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ingest.ProvenanceError, match="no attempt is recorded"):
        which(str(tmp_path / "empty"), 0)


def test_a_writer_pickles_without_what_it_holds(tmp_path: Path) -> None:
    import pickle

    w = ProvenanceWriter(str(tmp_path / "log"))
    w.start(0, 1)
    w.record(0, 0, ["u"], [(0, np.array([[0, 0, 4]], dtype=np.int64))])
    copy = pickle.loads(pickle.dumps(w))
    copy.flush()  # no attempt started in the copy: nothing is written
    assert not (tmp_path / "log").exists()
    w.flush()
    assert which(str(tmp_path / "log"), 0).to_pylist() == [
        {"step": 0, "rank": 0, "epoch": 0, "url": "u", "start": 0, "stop": 4}
    ]


# -- Ray: stops and world sizes 3 -> 2 -> 4 ---------------------------------------------------


@ray.remote(num_cpus=0)
def _rank(it: Any, stop_after: int | None) -> tuple[dict[int, list[int]], Any]:
    seen: dict[int, list[int]] = {}
    for batch in it:
        seen[it.step] = [int(v) for v in batch["id"].tolist()]
        if stop_after is not None and len(seen) == stop_after:
            return seen, it.state_dict()
    return seen, None


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_ray_ranks_through_stops_at_world_sizes_3_2_4(data: list[str], tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    seen: dict[tuple[int, int], list[int]] = {}
    state = None
    for world, stop_after in ((3, 4), (2, 3), (4, None)):
        with ingest.RayStream(
            data,
            columns=["id"],
            batch_size=BATCH,
            shuffle_seed=9,
            world_size=world,
            provenance=log,
        ) as stream:
            if state is not None:
                stream.load_state_dict(state)
            got = ray.get(
                [_rank.remote(stream.rank_iterator(r), stop_after) for r in range(world)],
                timeout=240,
            )
        for rank, (steps, s) in enumerate(got):
            for step, batch in steps.items():
                seen[(rank, step)] = batch
            state = s if s is not None else state
    answer = ids_of(which(log, {s for _, s in seen}), data)
    assert answer == seen
    delivered = [i for v in seen.values() for i in v]
    assert len(delivered) == len(set(delivered))
    # a notebook's stream replays any steps as each rank of each attempt got them
    steps = {2, 3, 5, max(s for _, s in seen)}  # world sizes 3, 3, 2 and 4
    notebook = ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=9)
    again = {(r, s): ids(b) for s, r, b in notebook.replay(steps, provenance=log)}
    assert again == {k: v for k, v in seen.items() if k[1] in steps}


# -- skips (item 3) --------------------------------------------------------------------------


def test_skipped_steps_stay_out_through_two_more_stops_at_other_world_sizes(
    data: list[str], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")

    def make() -> ingest.Stream:
        return ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=2, provenance=log)

    first = make()
    it = iter(first)
    head: list[int] = []
    spiked: list[int] = []
    for step in range(20):
        batch = ids(next(it))
        if step <= 10:
            head += batch
        if step == 10:
            state = first.state_dict()
        if 12 <= step <= 15:
            spiked += batch
    first.state_dict()  # the run logged steps 11..19, then the loss spiked at 12..15
    edited = ingest.skip(state, steps=range(12, 16), provenance=log)
    assert len(edited["progress"]["quarantined"]) == 1

    loader = ingest.DataLoader(make(), num_workers=2)  # a second stop, at world size 2
    loader.load_state_dict(edited)
    middle: list[int] = []
    for n, got in enumerate(loader):
        middle += ids(got)
        if n == 5:
            again = loader.state_dict()
            break
    last = make()  # and the rest in one process
    last.load_state_dict(again)
    rest = [i for b in last for i in ids(b)]
    after = middle + rest
    assert not set(after) & set(spiked)
    delivered = head + after
    assert len(delivered) == len(set(delivered))
    missing = set(range(SHARDS * ROWS)) - set(delivered) - set(spiked)
    assert len(missing) < BATCH  # the epoch's remainder, carried into the next
    assert last.stats["rows_skipped_on_request"] == len(spiked)
    assert last.stats["quarantined"] == 0
    assert [q.reason for q in last.quarantined] == ["skipped on request: steps 12..15"]


def test_skip_by_rows_and_the_refusals(data: list[str], tmp_path: Path) -> None:
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH)
    it = iter(stream)
    next(it)
    state = stream.state_dict()
    edited = ingest.skip(state, rows=[(data[1], 0, 100)])
    resumed = ingest.Stream(data, columns=["id"], batch_size=BATCH)
    resumed.load_state_dict(edited)
    got = {i for b in resumed for i in ids(b)}
    assert not got & set(range(ROWS, ROWS + 100))
    with pytest.raises(ingest.StateError, match="not a shard of the state's listing"):
        ingest.skip(state, rows=[("s3://elsewhere/x.parquet", 0, 1)])
    # Rows past a shard's end (a typo: 40-4500 for 40-45) were recorded as that many rows
    # left out (stats["rows_skipped_on_request"] said 4460 of a 500-row shard).
    past = rf"rows \[40, 4500\) of {re.escape(data[1])}: the shard holds {ROWS} rows"
    with pytest.raises(ingest.StateError, match=past):
        ingest.skip(state, rows=[(data[1], 40, 4500)])
    with pytest.raises(ingest.ProvenanceError, match="without a log"):
        ingest.skip(state, steps=[3])


def test_ingest_which_prints_each_ranks_rows_and_names_missing_steps(
    data: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ingest.tools.cli import main

    log = str(tmp_path / "log")
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, provenance=log)
    batches = [ids(b) for b in stream]
    assert main(["which", log, "--steps", "3-4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"2 step(s), 2 rank-steps, {2 * BATCH} rows"
    assert out[0].startswith("step 3 rank 0 epoch 0 ")
    assert main(["which", log, "--steps", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [i for r in rows for i in range(r["start"], r["stop"])] == [i % ROWS for i in batches[3]]
    assert main(["which", log, "--steps", "900-901"]) == 1
    assert "2 step(s) in no attempt of the log" in capsys.readouterr().out
    assert main(["which", str(tmp_path / "none"), "--steps", "1"]) == 2
    assert "no attempt is recorded" in capsys.readouterr().err


def test_ingest_skip_edits_a_state_file_or_a_checkpoint_in_place(
    data: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ingest.integrations.ray_train import STATE_FILE
    from ingest.tools.cli import main

    log = str(tmp_path / "log")
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=3, provenance=log)
    it = iter(stream)
    for step in range(16):
        next(it)
        if step == 6:
            state = stream.state_dict()
    stream.state_dict()
    saved = tmp_path / "state.json"
    saved.write_text(json.dumps(state))
    out = tmp_path / "skipped.json"
    args = ["skip", str(saved), "--steps", "8-11", "--provenance", log, "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"skipped on request: steps 8..11: {4 * BATCH} rows left out" in printed
    assert json.loads(out.read_text()) == ingest.skip(state, steps=range(8, 12), provenance=log)
    checkpoint = tmp_path / "checkpoint_000007"
    checkpoint.mkdir()
    (checkpoint / STATE_FILE).write_text(json.dumps(state))
    row = f"{data[0]}:0-5"
    assert main(["skip", str(checkpoint), "--rows", row, "--in-place"]) == 0
    assert json.loads((checkpoint / f"{STATE_FILE}.bak").read_text()) == state
    edited = json.loads((checkpoint / STATE_FILE).read_text())
    assert edited == ingest.skip(state, rows=[(data[0], 0, 5)])
    assert main(["skip", str(saved), "--out", str(out)]) == 2  # nothing named
    assert "give --steps" in capsys.readouterr().err
    # Steps without the log that names their rows: the flag to pass, not the library's name.
    assert main(["skip", str(saved), "--steps", "8-9", "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert "--steps needs --provenance" in said and "provenance=" not in said, said
    # A state file that is not one names the file, as a missing one does.
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["skip", str(broken), "--rows", row, "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert f"{broken}: the state is not JSON" in said, said
    # An --out in a folder that is not there: the one-line error, not a traceback.
    nowhere = tmp_path / "no-such-folder" / "out.json"
    assert main(["skip", str(saved), "--rows", row, "--out", str(nowhere)]) == 2
    said = capsys.readouterr().err
    assert f"{nowhere}: cannot write the state" in said and "Traceback" not in said, said


# -- replay (item 2) -------------------------------------------------------------------------


def _odd(table: pa.Table) -> Any:
    return np.asarray(table["id"]) % 2 == 1


def _doubled(table: pa.Table) -> pa.Table:
    return table.set_column(0, "id", pa.array(np.asarray(table["id"]) * 2))


def test_replay_gives_the_steps_batches_again_reading_only_their_rows(
    data: list[str], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")

    def make(**kw: Any) -> ingest.Stream:
        return ingest.Stream(
            data, columns=["id"], batch_size=BATCH, shuffle_seed=4, shuffle_window=64,
            transform=[ingest.Filter(_odd), _doubled], **kw,
        )  # fmt: skip

    run = make(provenance=log)
    before = run.stats["bytes_read"]
    seen = {step: ids(b) for step, b in enumerate(run)}
    epoch_bytes = run.stats["bytes_read"] - before
    notebook = make()
    before = notebook.stats["bytes_read"]
    got = {(s, r): ids(b) for s, r, b in notebook.replay(range(20, 25), provenance=log)}
    assert got == {(s, 0): seen[s] for s in range(20, 25)}
    assert 0 < notebook.stats["bytes_read"] - before < epoch_bytes  # only those rows' bytes
    with pytest.raises(ingest.ConfigError, match="pass provenance="):
        next(notebook.replay(3))


@ray.remote(num_cpus=0)
def _all_ids(it: Any) -> list[int]:
    return _epoch_ids(it)


def _epoch_ids(it: Any) -> list[int]:
    """The ids of one epoch of a rank's iterator."""
    return [i for batch in it for i in ids(batch)]


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_a_raystream_resumed_from_a_skip_leaves_the_rows_out_and_exports_them(
    data: list[str], tmp_path: Path
) -> None:
    from tests.test_metrics import scrape

    log = str(tmp_path / "log")
    first = ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=6, provenance=log)
    it = iter(first)
    head = [i for _ in range(4) for i in ids(next(it))]
    state = first.state_dict()
    spiked = [i for _ in range(3) for i in ids(next(it))]  # steps 4..6
    first.state_dict()
    edited = ingest.skip(state, steps=range(4, 7), provenance=log)
    name = f"skip-{tmp_path.name}"[:60]
    with ingest.RayStream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=6, world_size=2, name=name
    ) as stream:
        stream.load_state_dict(edited)
        rest = [i for got in ray.get([_all_ids.remote(stream.rank_iterator(r)) for r in (0, 1)],
                                     timeout=240) for i in got]  # fmt: skip
        assert stream.stats()["rows_skipped_on_request"] == len(spiked)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = scrape(name).get("ingest_rows_skipped_on_request", {})
            if got:
                break
            time.sleep(1)
        assert got == {"": float(len(spiked))}
    assert not set(rest) & set(spiked)
    delivered = head + rest
    assert len(delivered) == len(set(delivered))
    assert len(set(range(SHARDS * ROWS)) - set(delivered) - set(spiked)) < 2 * BATCH


@ray.remote(num_cpus=0)
def _two_epochs(it: Any) -> tuple[list[int], list[int]]:
    return _epoch_ids(it), _epoch_ids(it)


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_a_raystream_leaves_out_the_skipped_steps_of_the_epoch_after_its_state(
    data: list[str], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    first = ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=7, provenance=log)
    it = iter(first)
    head = [i for _ in range(30) for i in ids(next(it))]
    state = first.state_dict()
    rest0 = [i for b in it for i in ids(b)]
    steps = SHARDS * ROWS // BATCH
    spiked = [i for n, b in enumerate(first) if 3 <= n < 6 for i in ids(b)]  # steps 65..67
    first.state_dict()
    edited = ingest.skip(state, steps=range(steps + 3, steps + 6), provenance=log)
    with ingest.RayStream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=7, world_size=2,
        name=f"ahead-{tmp_path.name}"[:60],
    ) as stream:  # fmt: skip
        stream.load_state_dict(edited)
        got = ray.get([_two_epochs.remote(stream.rank_iterator(r)) for r in (0, 1)], timeout=240)
        assert stream.stats()["rows_skipped_on_request"] == len(spiked)
    epoch0 = [i for g in got for i in g[0]]
    assert sorted(head + epoch0) == sorted(head + rest0)  # epoch 0 as the run had it
    _once_but_skipped([i for g in got for i in g[1]], head + rest0, spiked, ranks=2)


def test_a_followed_dataset_logs_each_rounds_steps_with_its_new_shards(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    root, log = tmp_path / "d", str(tmp_path / "log")
    root.mkdir()

    def write(n: int) -> None:
        ids_ = np.arange(n * ROWS, (n + 1) * ROWS, dtype=np.int64)
        pq.write_table(pa.table({"id": ids_}), root / f"part-{n:05d}.parquet")

    write(0)
    write(1)
    stream = ingest.Stream(
        str(root) + "/", columns=["id"], batch_size=BATCH, shuffle_seed=8, provenance=log,
        follow=ingest.Follow(poll_s=0.02, idle_timeout_s=0.3),
    )  # fmt: skip
    seen: dict[int, list[int]] = {}
    for round_ in range(2):  # round 0 over shards 0-1, round 1 over the two written since
        for step, batch in enumerate(stream, start=len(seen)):
            seen[step] = ids(batch)
        if round_ == 0:
            write(2)
            write(3)
    table = which(log, range(len(seen)))
    got: dict[int, list[int]] = {}
    for r in table.to_pylist():
        shard = int(Path(_path(r["url"])).stem.split("-")[1])
        got.setdefault(r["step"], []).extend(shard * ROWS + i for i in range(r["start"], r["stop"]))
    assert got == seen
    urls = set(table["url"].to_pylist())
    assert any("part-00002" in u for u in urls) and any("part-00003" in u for u in urls)


def test_a_log_that_cannot_be_written_fails_the_stream_naming_it(
    data: list[str], tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, provenance=str(blocked / "log"))
    with pytest.raises(ingest.ProvenanceError, match="writing a chunk failed") as told:
        for _ in stream:
            pass
    assert str(blocked) in str(told.value)


def _epoch(it: Any) -> list[list[int]]:
    return [ids(b) for b in it]


def _cli_skip_agrees(
    state: dict[str, Any], steps: str, log: str, edited: dict[str, Any], tmp_path: Path
) -> None:
    from ingest.tools.cli import main

    saved, out = tmp_path / "state.json", tmp_path / "skipped.json"
    saved.write_text(json.dumps(state))
    assert main(["skip", str(saved), "--steps", steps, "--provenance", log, "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == edited


def _back_next_epoch(epoch2: set[int], spiked: list[int]) -> None:
    """Only the skip's epoch leaves them out: the next misses no more than its remainder."""
    assert len(set(range(SHARDS * ROWS)) - epoch2) < BATCH
    assert len(set(spiked) - epoch2) < BATCH < len(spiked)


def _once_but_skipped(
    epoch1: list[int], epoch0: list[int], spiked: list[int], ranks: int = 1
) -> None:
    """``epoch1`` (the ids an epoch delivered) has no skipped row, every other row once and
    the rows ``epoch0`` left over (carried in) twice, but for its own remainder."""
    got = Counter(epoch1)
    assert not set(got) & set(spiked)
    carried = set(range(SHARDS * ROWS)) - set(epoch0)
    due = Counter(i for i in [*range(SHARDS * ROWS), *carried] if i not in set(spiked))
    assert not got - due  # nothing twice but the rows carried in
    assert len(due - got) < ranks * BATCH  # the epoch's remainder, carried into the next


def test_steps_of_a_later_epoch_are_skipped_when_the_resume_reaches_it(
    data: list[str], tmp_path: Path
) -> None:
    """A spike one epoch after the checkpoint: the states of epoch 0 keep the skip until the
    book plans epoch 1, through stops at world sizes 2 -> 1 (one at epoch 0's end) -> 1 -> 2
    -> 1; epoch 2 reads the rows again (a skip leaves out the rows of the steps named, in
    their epoch)."""
    log = str(tmp_path / "log")

    def make() -> ingest.Stream:
        return ingest.Stream(data, columns=["id"], batch_size=BATCH, shuffle_seed=4, provenance=log)

    first = make()
    it = iter(first)
    head = [ids(next(it)) for _ in range(41)]  # steps 0..40 of epoch 0
    state = first.state_dict()
    steps = SHARDS * ROWS // BATCH  # 62 steps an epoch (16 rows carried)
    rest0 = _epoch(it)
    epoch1 = _epoch(first)  # the run went on into epoch 1 ...
    assert len(head) + len(rest0) == steps
    spiked = [i for b in epoch1[8:12] for i in b]  # ... and spiked at steps 70..73
    first.state_dict()
    edited = ingest.skip(state, steps=range(steps + 8, steps + 12), provenance=log)
    assert "quarantined" not in edited["progress"]  # epoch 0 loses nothing
    _cli_skip_agrees(state, f"{steps + 8}-{steps + 11}", log, edited, tmp_path)
    assert len(edited["progress"]["skip_ahead"]) == 1
    # stop 1 at world size 2 inside epoch 0: the skip waits in the state
    early = ingest.DataLoader(make(), num_workers=2)
    early.load_state_dict(edited)
    got0: list[int] = []
    for n, b in enumerate(early):
        got0 += ids(b)
        if n == 4:
            s1 = early.state_dict()
            break
    assert s1["progress"]["skip_ahead"] == edited["progress"]["skip_ahead"]
    one = make()  # stop 2: the rest of epoch 0 in one process, saved at its end
    one.load_state_dict(s1)
    got0 += [i for b in one for i in ids(b)]
    assert sorted(got0 + [i for b in head for i in b]) == sorted(i for b in head + rest0 for i in b)
    s2 = one.state_dict()
    assert s2["progress"]["epoch"] == 1 and s2["progress"]["skip_ahead"]
    two = make()  # stop 3: epoch 1 planned from the state at its start
    two.load_state_dict(s2)
    it1 = iter(two)
    got1 = [ids(next(it1)) for _ in range(3)]
    saved = two.state_dict()
    loader = ingest.DataLoader(make(), num_workers=2)  # stop 4: world size 2
    loader.load_state_dict(saved)
    for n, b in enumerate(loader):
        got1.append(ids(b))
        if n == 9:
            again = loader.state_dict()
            break
    last = make()  # and the rest of epoch 1 in one process
    last.load_state_dict(again)
    got1 += _epoch(last)
    _once_but_skipped([i for b in got1 for i in b], [i for b in head + rest0 for i in b], spiked)
    assert last.stats["rows_skipped_on_request"] == len(spiked)
    assert [q.reason for q in last.quarantined] == [
        f"skipped on request: steps {steps + 8}..{steps + 11}"
    ]
    _back_next_epoch({i for b in _epoch(last) for i in b}, spiked)
