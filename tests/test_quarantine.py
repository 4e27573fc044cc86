"""``ReadOptions(on_error="skip")``: bad data is quarantined, counted, recorded and bounded.

Each test ends with the exactly-once check on what is left: every row that was not
quarantined arrives once, and every quarantined row is named by a record (URL, rows, reason).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from ingest.core.quarantine import Quarantined, check_saved, merge, summary
from ingest.testing import encode, make_table

ROWS = 1000
GROUP = 250
SKIP = ingest.ReadOptions(on_error="skip")


def write_parquet(root: Path, shards: int = 4) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(shards):
        path = root / f"part-{i}.parquet"
        pq.write_table(make_table(i * ROWS, ROWS), path, row_group_size=GROUP)
        paths.append(str(path))
    return paths


def corrupt_row_group(path: str, group: int) -> None:
    """Overwrite the pages of ``group``'s ``id`` column: the footer stays readable."""
    column = pq.ParquetFile(path).metadata.row_group(group).column(0)
    data = bytearray(Path(path).read_bytes())
    start = column.data_page_offset + 20
    data[start : column.data_page_offset + column.total_compressed_size - 4] = b"\xff" * (
        column.total_compressed_size - 24
    )
    Path(path).write_bytes(bytes(data))


def ids_of(batches: list[dict[str, Any]]) -> Counter[int]:
    return Counter(int(i) for b in batches for i in b["id"].tolist())


def quarantined_ids(records: list[Quarantined], rows_per_shard: int = ROWS) -> set[int]:
    out: set[int] = set()
    for q in records:
        assert q.url is not None
        shard = int(q.url.rsplit("-", 1)[1].split(".")[0])
        stop = rows_per_shard if q.stop is None else q.stop
        out |= set(range(shard * rows_per_shard + q.start, shard * rows_per_shard + stop))
    return out


def exactly_once_but_quarantined(
    seen: Counter[int], records: list[Quarantined], total: int, rows_per_shard: int = ROWS
) -> None:
    repeated = {i: n for i, n in seen.items() if n > 1}
    assert not repeated, f"{len(repeated)} rows repeated"
    skipped = quarantined_ids(records, rows_per_shard)
    assert not skipped & set(seen), "a quarantined row was delivered"
    missing = set(range(total)) - set(seen) - skipped
    assert not missing, f"{len(missing)} rows lost without a quarantine record"


def test_a_corrupt_row_group_raises_by_default(tmp_path: Path) -> None:
    paths = write_parquet(tmp_path)
    corrupt_row_group(paths[2], 2)
    with pytest.raises(ingest.ShardError, match=r"part-2\.parquet at row 500: row group 2"):
        list(ingest.Stream(str(tmp_path), columns=["id"], batch_size=50))


@pytest.mark.parametrize("seed", [None, 3])
def test_a_corrupt_row_group_is_quarantined_and_the_rest_arrives_once(
    tmp_path: Path, seed: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    paths = write_parquet(tmp_path)
    corrupt_row_group(paths[2], 2)
    stream = ingest.Stream(
        str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=seed, read=SKIP
    )
    with caplog.at_level(logging.WARNING, logger="ingest.engine.stream"):
        batches = list(stream)
    # The span being read loses its rows from the bad row group on: in listing order the
    # shard is one span (rows 500-999); shuffled, the block that holds row 500 from there,
    # and the shard's other blocks are read (found by a probe: they were all quarantined,
    # good row groups with them).
    records = stream.quarantined
    assert {q.url for q in records} == {f"file://{paths[2]}"}
    assert {q.epoch for q in records} == {0}
    assert any(q.start <= 500 and (q.stop or ROWS) >= 750 for q in records)
    assert all("at row 500: row group 2 cannot be read" in q.reason for q in records)
    if seed is None:  # the bad row group alone (row group 3, read with it, was lost too)
        assert [(q.start, q.stop, q.rows) for q in records] == [(500, 750, 250)]
    else:
        assert [q.start for q in records] == [500], [(q.start, q.stop) for q in records]
        assert 0 < (records[0].rows or 0) < 500
    exactly_once_but_quarantined(ids_of(batches), records, 4 * ROWS)
    skipped = sum(q.rows or 0 for q in records)
    assert stream.stats["quarantined"] == len(records)
    assert stream.stats["rows_skipped"] == skipped
    assert stream.stats["rows_delivered"] == 4 * ROWS - skipped
    # Holes keep their place: the steps are those of the run without the error. A batch
    # that lost rows is short; one that lost all is left out (one process).
    sizes = [len(b["id"]) for b in batches]
    if seed is None:  # rows 500-749 of shard 2 are five whole batches in listing order
        assert sizes == [50] * 75
    else:  # shuffled in one window: the holes are spread over the 80 steps
        assert len(sizes) == 80 and max(sizes) <= 50 and min(sizes) < 50
    # Listed at the end of the epoch, with the URL, the rows and the reason.
    told = f"epoch 0 skipped {skipped} rows in {len(records)} quarantine"
    assert any(told in r.message and str(paths[2]) in r.message for r in caplog.records)
    # Next epoch, left after one batch and continued: the same bad rows are quarantined
    # again, the rest arrives once again, and epoch 0's records are still listed.
    for batch in stream:
        again = [batch]
        break
    again += list(stream)
    assert {q.epoch for q in stream.quarantined} == {0, 1}
    in_1 = [q for q in stream.quarantined if q.epoch == 1]
    exactly_once_but_quarantined(ids_of(again), in_1, 4 * ROWS)


def test_the_state_records_the_quarantine_and_a_resume_never_reads_it_again(
    tmp_path: Path,
) -> None:
    paths = write_parquet(tmp_path)
    corrupt_row_group(paths[1], 1)
    options: dict[str, Any] = {"columns": ["id"], "batch_size": 40, "shuffle_seed": 1}
    stream = ingest.Stream(str(tmp_path), read=SKIP, **options)
    first: list[dict[str, Any]] = []
    for batch in stream:
        first.append(batch)
        if len(first) == 70:  # past the quarantine: most of the epoch is read
            break
    state = json.loads(json.dumps(stream.state_dict()))
    stream.close()
    saved = state["progress"]["quarantined"]
    assert saved and {q["url"] for q in saved} == {f"file://{paths[1]}"}
    assert state["progress"]["delivered"] == sum(len(b["id"]) for b in first)

    resumed = ingest.Stream(str(tmp_path), read=SKIP, **options)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(resumed.quarantined) == len(saved), "the resume recorded a quarantine twice"
    exactly_once_but_quarantined(ids_of(first + rest), resumed.quarantined, 4 * ROWS)
    assert resumed.stats["rows_delivered"] == 4 * ROWS - resumed.stats["rows_skipped"]


def _consumed(state: dict[str, Any], url: str, row: int) -> bool:
    """Whether ``state`` counts ``row`` of shard ``url`` consumed (its own or carried in)."""
    index = str([s[0] for s in state["dataset"]["shards"]].index(url))
    for consumed in (state["progress"]["consumed"], state["distributed"]["carry"]["consumed"]):
        if int(index) in consumed.get("done", []):
            return True
        if any(a <= row < b for a, b in consumed.get("partial", {}).get(index, [])):
            return True
    return False


def test_a_state_lists_only_the_quarantines_its_consumed_rows_hold(tmp_path: Path) -> None:
    """A bad line read ahead (its row's place in a later batch) was listed in the state as
    quarantined while its row was not consumed (the docs: a quarantined row is consumed). A
    state lists a quarantine once its row is consumed; a resume reads it again until then,
    and delivers no row twice."""
    for s in range(4):
        lines = [
            "{bad json" if i in (150, 351) else json.dumps({"id": i})
            for i in range(s * 100, s * 100 + 100)
        ]
        (tmp_path / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    options: dict[str, Any] = {"batch_size": 20, "shuffle_seed": 0, "shuffle_window": 64}
    stream = ingest.Stream(str(tmp_path), read=SKIP, shuffle_lanes=2, **options)
    listed, got = 0, []
    for n, batch in enumerate(stream):
        got.append(batch)
        state = json.loads(json.dumps(stream.state_dict()))
        for q in state["progress"].get("quarantined", []):
            assert _consumed(state, q["url"], q["start"]), (n, q["url"], q["start"])
            listed += 1
        if n in (0, 3, 6):
            resumed = ingest.Stream(str(tmp_path), read=SKIP, shuffle_lanes=2, **options)
            resumed.load_state_dict(state)
            seen = ids_of(got + list(resumed))
            exactly_once_but_quarantined(seen, resumed.quarantined, 400, rows_per_shard=100)
    assert listed, "no state listed a quarantine"


def test_a_bad_json_line_quarantines_just_that_line(tmp_path: Path) -> None:
    # It used to quarantine the rest of its shard (277 rows for one bad line).
    rows = 400
    for i in range(3):
        lines = encode(make_table(i * rows, rows), "jsonl").split(b"\n")
        if i == 1:
            lines[123] = b"{not json"
            lines[300] = b'{"id": "not an int"}'
        (tmp_path / f"part-{i}.jsonl").write_bytes(b"\n".join(lines))
    stream = ingest.Stream(
        str(tmp_path),
        columns=["id"],
        batch_size=1,
        shuffle_seed=0,
        read=ingest.ReadOptions(on_error="skip", block_bytes=2048),
    )
    seen = ids_of(list(stream))
    first, second = sorted(stream.quarantined, key=lambda q: q.start)
    assert first.url is not None and first.url.endswith("part-1.jsonl")
    assert (first.start, first.stop, first.rows) == (123, 124, 1), first
    assert "line 124" in first.reason and "invalid JSON" in first.reason
    assert (second.start, second.stop) == (300, 301) and "schema" in second.reason, second
    assert len(seen) == 3 * rows - 2, "every other line arrived"
    exactly_once_but_quarantined(seen, stream.quarantined, 3 * rows, rows_per_shard=rows)


def test_a_ragged_csv_row_quarantines_just_that_row(tmp_path: Path) -> None:
    rows = 300
    for i in range(2):
        lines = encode(make_table(i * rows, rows), "csv").split(b"\n")
        if i == 1:
            lines[251] = lines[251] + b",extra,fields"  # row 250 (line 1 is the header)
        (tmp_path / f"part-{i}.csv").write_bytes(b"\n".join(lines))
    stream = ingest.Stream(
        str(tmp_path),
        columns=["id"],
        batch_size=1,
        read=ingest.ReadOptions(on_error="skip", block_bytes=1024),
    )
    seen = ids_of(list(stream))
    [q] = stream.quarantined
    assert q.url is not None and q.url.endswith("part-1.csv") and (q.start, q.stop) == (250, 251)
    exactly_once_but_quarantined(seen, stream.quarantined, 2 * rows, rows_per_shard=rows)


@pytest.mark.parametrize(
    "bad", [b",extra,fields", b"\xff\xfe not text"], ids=["ragged", "not-utf8"]
)
def test_a_bad_csv_row_where_types_are_inferred_quarantines_just_that_row(
    tmp_path: Path, bad: bytes
) -> None:
    # Found by a probe: a bad record in the first block of the first shard (where the
    # column types are inferred) quarantined the whole shard, its good rows with it, and
    # the epoch said its shard held no rows.
    rows = 100
    for i in range(2):
        lines = encode(make_table(i * rows, rows), "csv").split(b"\n")
        if i == 0:
            lines[31] = lines[31] + bad  # row 30 (line 1 is the header)
        (tmp_path / f"part-{i}.csv").write_bytes(b"\n".join(lines))
    stream = ingest.Stream(str(tmp_path), batch_size=1, read=ingest.ReadOptions(on_error="skip"))
    seen = ids_of(list(stream))
    [q] = stream.quarantined
    assert q.url is not None and q.url.endswith("part-0.csv") and (q.start, q.stop) == (30, 31), q
    assert stream.stats["rows_skipped"] == 1
    exactly_once_but_quarantined(seen, stream.quarantined, 2 * rows, rows_per_shard=rows)


def test_a_quarantine_to_a_shard_s_end_is_told_as_rows_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An unterminated quote runs to the end of its shard: the rows after it cannot be told
    # apart, so the quarantine holds "the rest". The epoch's report said "skipped 0 rows".
    rows = [f"{i},t{i}\n" if i != 30 else f'{i},"open\n' for i in range(100)]  # never closed
    (tmp_path / "a.csv").write_text("id,text\n" + "".join(rows))
    stream = ingest.Stream(str(tmp_path), batch_size=10, read=SKIP)
    with caplog.at_level(logging.WARNING, logger="ingest.engine.stream"):
        assert sorted(ids_of(list(stream))) == list(range(30))
    [q] = stream.quarantined
    assert (q.start, q.stop, q.rows) == (30, None, None)
    assert stream.stats["rows_skipped"] == 0, "rows known to be skipped (none are)"
    told = "epoch 0 skipped 0 rows and the rest of 1 shard (rows not counted) in 1 quarantine"
    assert any(told in r.message for r in caplog.records), [r.message for r in caplog.records]


def test_a_shard_that_vanished_after_the_listing_is_quarantined(tmp_path: Path) -> None:
    paths = write_parquet(tmp_path)
    stream = ingest.Stream(
        str(tmp_path),
        columns=["id"],
        batch_size=50,
        shuffle_seed=0,
        shuffle_window=100,
        shuffle_lanes=1,
        read=ingest.ReadOptions(on_error="skip", prefetch=0),
    )
    loop = iter(stream)
    batches = [next(loop)]  # one shard is open, the others wait for the lane
    reading = int(batches[0]["id"][0]) // ROWS
    gone = 3 if reading != 3 else 0
    Path(paths[gone]).unlink()
    batches.extend(loop)
    [q] = stream.quarantined
    assert (q.url, q.start, q.stop) == (f"file://{paths[gone]}", 0, ROWS)
    assert "disappeared after it was listed" in q.reason
    exactly_once_but_quarantined(ids_of(batches), stream.quarantined, 4 * ROWS)


def test_max_errors_turns_a_flood_of_bad_data_into_the_clear_error(tmp_path: Path) -> None:
    paths = write_parquet(tmp_path)
    for path in paths[:3]:
        corrupt_row_group(path, 0)
    read = ingest.ReadOptions(on_error="skip", max_errors=2)
    with pytest.raises(ingest.IngestError, match=r"more than ReadOptions.max_errors=2") as err:
        list(ingest.Stream(str(tmp_path), columns=["id"], batch_size=50, read=read))
    message = str(err.value)
    # Each shard's bad row group alone (its good ones were quarantined with it before).
    assert all(f"part-{i}.parquet rows [0, 250)" in message for i in range(3)), message
    assert "raise max_errors" in message


def test_a_store_that_does_not_answer_is_never_skipped() -> None:
    from ingest.core.errors import StoreError
    from ingest.core.quarantine import skippable

    assert not skippable(StoreError("s3://b/k", "read failed", "check the store"))
    assert skippable(ingest.ShardError("s3://b/k", "bad", "fix"))
    assert skippable(ingest.SourceError("s3://b/k", "disappeared after it was listed", "fix"))
    assert not skippable(ValueError("a bug of ours"))


def test_a_transform_that_raises_quarantines_its_batch(tmp_path: Path) -> None:
    write_parquet(tmp_path, shards=2)
    calls = {"n": 0}

    def flaky(table: pa.Table) -> pa.Table:
        if table.num_rows:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("bad record in the tokenizer")
        return table

    raising = ingest.Stream(str(tmp_path), columns=["id"], batch_size=100, transform=flaky)
    with pytest.raises(RuntimeError, match="tokenizer"):
        list(raising)
    calls["n"] = 0
    stream = ingest.Stream(
        str(tmp_path), columns=["id"], batch_size=100, transform=flaky, read=SKIP
    )
    seen = ids_of(list(stream))
    [q] = stream.quarantined
    assert (q.url, q.step, q.rows) == (None, 2, 100)
    assert q.reason == "RuntimeError: bad record in the tokenizer"
    assert sorted(seen) == [i for i in range(2 * ROWS) if not 200 <= i < 300]
    assert max(seen.values()) == 1
    state = stream.state_dict()
    assert state["progress"]["epoch"] == 1  # the epoch ended; its records went with it


def test_records_of_the_same_quarantine_merge() -> None:
    first = Quarantined("bad", 0, 0, "s3://b/a", 500, 1000, rows=500)
    again = Quarantined("bad", 0, 1, "s3://b/a", 750, 1000, rows=250)  # resumed later on
    other = Quarantined("bad", 1, 0, "s3://b/a", 500, 1000, rows=500)  # next epoch
    assert merge([first], [again, other]) == [first, other]
    assert Quarantined.from_json(first.to_json(), "q") == first


def test_two_ranks_transform_failures_at_the_same_step_are_two_quarantines() -> None:
    # Under on_error="skip", ranks 0 and 1 both fail their transform at step 3: two
    # batches, 200 rows skipped. A step is a rank's, so the rank tells them apart.
    rank_0 = Quarantined("RuntimeError: bad", 0, 0, step=3, rows=100)
    rank_1 = Quarantined("RuntimeError: bad", 0, 1, step=3, rows=100)
    merged = merge([rank_0], [rank_1])
    assert merged == [rank_0, rank_1]
    assert summary(merged) == {
        "quarantined": 2,
        "rows_skipped": 200,
        "skips": 0,
        "rows_skipped_on_request": 0,
    }
    # The state's JSON keeps both, and a resumed rank 1 that fails again adds nothing.
    saved = json.loads(json.dumps([q.to_json() for q in merged]))
    restored = [Quarantined.from_json(q, f"q[{i}]") for i, q in enumerate(saved)]
    assert restored == merged
    where = "progress.quarantined"
    check_saved(restored, where, epoch=0, steps=range(4), batch_size=100, rows_of={})
    assert merge(restored, [rank_1]) == merged
    assert summary(merge(restored, [rank_1]))["rows_skipped"] == 200


def test_an_edited_quarantine_record_is_refused(tmp_path: Path) -> None:
    write_parquet(tmp_path, shards=1)
    stream = ingest.Stream(str(tmp_path), columns=["id"], batch_size=100)
    next(iter(stream))
    state = stream.state_dict()
    state["progress"]["quarantined"] = [{"reason": "x", "url": "u", "start": 9, "stop": 3}]
    with pytest.raises(ingest.StateError, match=r"progress.quarantined\[0\] ends"):
        ingest.Stream(str(tmp_path), columns=["id"], batch_size=100).load_state_dict(state)
    state["progress"]["quarantined"] = [{"reason": "x", "start": -1}]
    with pytest.raises(ingest.StateError, match=r"progress.quarantined\[0\].start"):
        ingest.Stream(str(tmp_path), columns=["id"], batch_size=100).load_state_dict(state)


def _saved_with_a_quarantine(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A state mid-epoch holding a record of rows [0, 1000) of part-1 (its row group 1 is
    corrupt; shuffled, the lane's spans from the first one left are quarantined)."""
    paths = write_parquet(tmp_path)
    corrupt_row_group(paths[1], 1)
    stream = ingest.Stream(str(tmp_path), read=SKIP, **STATE_OPTIONS)
    for n, _ in enumerate(stream, 1):
        if n == 30:
            break
    state = json.loads(json.dumps(stream.state_dict()))
    stream.close()
    record = state["progress"]["quarantined"][0]  # one, or two when a lane read ahead
    assert record["rows"] == record["stop"] - record["start"] > 0
    return state, record


STATE_OPTIONS: dict[str, Any] = {"columns": ["id"], "batch_size": 40, "shuffle_seed": 1}

EDITS: list[tuple[dict[str, Any], str]] = [
    ({"rows": 10}, r"progress\.quarantined\[0\]\.rows is 10, but the record skips rows \["),
    ({"stop": 5000, "rows": None}, r"\[0\] ends at row 5000, past the end of .*part-1"),
    ({"url": "file:///elsewhere/part-9.parquet"}, r"\[0\]\.url .*part-9.* no shard of"),
    ({"epoch": 7}, r"\[0\]\.epoch is 7, but the state is in epoch 0"),
    ({"step": 3}, r"\[0\] names both a shard and a step"),
    ({"stop": None}, r"\[0\]\.rows is \d+, but the record skips rows \[\d+, end\)"),
]


@pytest.mark.parametrize(("edit", "pattern"), EDITS)
def test_an_edited_quarantine_record_that_disagrees_with_the_state_is_refused(
    tmp_path: Path, edit: dict[str, Any], pattern: str
) -> None:
    """Issue 17: an edited record was accepted and misreported the rows skipped."""
    state, record = _saved_with_a_quarantine(tmp_path)
    ingest.Stream(str(tmp_path), read=SKIP, **STATE_OPTIONS).load_state_dict(state)  # as saved
    record.update(edit)
    with pytest.raises(ingest.StateError, match=pattern):
        ingest.Stream(str(tmp_path), read=SKIP, **STATE_OPTIONS).load_state_dict(state)


def test_an_edited_transform_record_is_refused(tmp_path: Path) -> None:
    state, _ = _saved_with_a_quarantine(tmp_path)
    step = state["progress"]["step"]
    for edit, pattern in [
        ({"step": step}, rf"\[1\]\.step is {step}, not a step of the epoch so far \(0 to "),
        ({"step": 2, "rows": 41}, r"\[1\]\.rows is 41, more than a batch \(batch_size 40\)"),
        ({"step": 2, "start": 5}, r"\[1\] names rows from 5 but no shard"),
    ]:
        record = {"reason": "ValueError: bad", "epoch": 0, "rank": 0, "rows": 40, **edit}
        state["progress"]["quarantined"][1:] = [record]  # after the shard's record
        with pytest.raises(ingest.StateError, match=pattern):
            ingest.Stream(str(tmp_path), read=SKIP, **STATE_OPTIONS).load_state_dict(state)


def test_on_error_is_checked() -> None:
    with pytest.raises(ingest.ConfigError, match=r'on_error=.ignore. must be "raise" or "skip"'):
        ingest.ReadOptions(on_error="ignore")
    with pytest.raises(ingest.ConfigError, match="max_errors=-1 must be >= 0"):
        ingest.ReadOptions(max_errors=-1)


# -- on Ray: every rank keeps its steps ------------------------------------------------------


def _drain_rank(it: Any) -> list[list[int]]:
    return [[int(v) for v in batch["id"].tolist()] for batch in it]


def _raise_on_id_1234(table: pa.Table) -> pa.Table:
    if 1234 in table.column("id").to_pylist():
        raise ValueError("id 1234 cannot be tokenized")
    return table


@pytest.mark.usefixtures("ray_session")
def test_ray_ranks_keep_equal_steps_around_a_quarantine(tmp_path: Path) -> None:
    import ray

    drain = ray.remote(num_cpus=0)(_drain_rank)
    paths = write_parquet(tmp_path)
    corrupt_row_group(paths[2], 2)
    with ingest.RayStream(
        str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=5, world_size=2, read=SKIP
    ) as stream:
        ranks = ray.get([drain.remote(stream.rank_iterator(r)) for r in range(2)], timeout=240)
        records = stream.quarantined()
        stats = stream.stats()
        state = stream.state_dict()
    assert [len(r) for r in ranks] == [40, 40], "the ranks took different numbers of steps"
    assert {q.url for q in records} == {f"file://{paths[2]}"}
    assert any(q.start <= 500 and (q.stop or ROWS) >= 750 for q in records)
    seen = Counter(i for r in ranks for b in r for i in b)
    exactly_once_but_quarantined(seen, records, 4 * ROWS)
    assert stats["rows_skipped"] == sum(q.rows or 0 for q in records) == 4 * ROWS - len(seen)
    assert state["progress"]["epoch"] == 1  # the epoch ended: its quarantines with it


@pytest.mark.usefixtures("ray_session")
def test_ray_transform_that_raises_gives_an_empty_step_and_a_record(tmp_path: Path) -> None:
    import ray

    drain = ray.remote(num_cpus=0)(_drain_rank)
    write_parquet(tmp_path, shards=2)
    with ingest.RayStream(
        str(tmp_path),
        columns=["id"],
        batch_size=100,
        world_size=2,
        transform=_raise_on_id_1234,
        read=SKIP,
    ) as stream:
        ranks = ray.get([drain.remote(stream.rank_iterator(r)) for r in range(2)], timeout=240)
        records = stream.quarantined()
    assert [len(r) for r in ranks] == [10, 10]
    assert sorted(len(b) for r in ranks for b in r)[:2] == [0, 100]  # one empty step
    [q] = records
    assert (q.url, q.rows) == (None, 100) and q.step is not None
    assert q.reason == "ValueError: id 1234 cannot be tokenized"
    seen = Counter(i for r in ranks for b in r for i in b)
    assert max(seen.values()) == 1 and 1234 not in seen and len(seen) == 2 * ROWS - 100


def test_bad_lines_in_the_rest_of_two_ranks_windows_are_quarantined_once_by_one_rank(
    tmp_path: Path,
) -> None:
    """A state taken inside the windows of a two-worker loader, loaded by a stream of one
    rank: the rest of the windows is read as spans a few rows long, several gathered from
    one parsed chunk (:class:`ingest.formats.base.Gathered`), and the bad lines among them
    stay each its own quarantine, never delivered, every other line once."""
    rows = 400
    bad = {0: [150, 151], 1: [37, 290], 2: [5, 333]}
    for i in range(3):
        lines = encode(make_table(i * rows, rows), "jsonl").split(b"\n")
        for n in bad[i]:
            lines[n] = b"{not json"
        (tmp_path / f"part-{i}.jsonl").write_bytes(b"\n".join(lines))
    options: dict[str, Any] = {
        "columns": ["id"],
        "batch_size": 20,
        "shuffle_seed": 3,
        "shuffle_window": 400,
    }
    read = ingest.ReadOptions(on_error="skip", block_bytes=4096)
    loader = ingest.DataLoader(ingest.Stream(str(tmp_path), read=read, **options), num_workers=2)
    first: list[dict[str, Any]] = []
    try:
        for batch in loader:
            first.append(batch)
            if len(first) == 8:  # 4 steps of 2 ranks: inside each rank's first window
                break
        state = json.loads(json.dumps(loader.state_dict()))
    finally:
        loader.close()
    resumed = ingest.Stream(str(tmp_path), read=read, **options)
    resumed.load_state_dict(state)
    rest = list(resumed)
    records = resumed.quarantined
    assert sorted((q.url or "")[-7:-6] + f":{q.start}" for q in records) == sorted(
        f"{i}:{n}" for i, lines in bad.items() for n in lines
    )
    assert all(q.rows == 1 for q in records), records
    exactly_once_but_quarantined(ids_of(first + rest), records, 3 * rows, rows_per_shard=rows)
