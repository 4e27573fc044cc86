"""What goes wrong while a listing is made, under ``on_error="skip"`` (issue 31, finding 10).

A shard that cannot be opened, counted or typed while the stream plans (its footer gone from
the store or corrupt, an empty file, a schema that is not the stream's) is quarantined whole,
as reading it would be, and every other row arrives exactly once; a line among those the
schema is inferred from that does not parse is quarantined alone, as when it is read. Under
the default ``on_error="raise"`` each stays the error it was.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from ingest.core.quarantine import Quarantined
from ingest.testing import encode, make_table
from tests.hub_stub import HubStub
from tests.test_hub_stub import hf_env  # noqa: F401 - the fixture, used below

ROWS = 200
SKIP = ingest.ReadOptions(on_error="skip")
DEEP = b'{"id": 0, "deep": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"


def ids_of(batches: Any) -> Counter[int]:
    return Counter(int(i) for b in batches for i in b["id"].tolist())


def exactly_once_but(seen: Counter[int], total: int, left_out: set[int]) -> None:
    repeated = {i: n for i, n in seen.items() if n > 1}
    assert not repeated, f"{len(repeated)} rows repeated"
    assert not left_out & set(seen), "a quarantined row was delivered"
    missing = set(range(total)) - set(seen) - left_out
    assert not missing, (
        f"{len(missing)} rows lost without a quarantine record: {sorted(missing)[:5]}"
    )


def whole(record: Quarantined, url: str) -> None:
    """``record`` quarantines the shard ``url`` whole (its rows unknown: to its end)."""
    assert (record.url, record.start, record.stop, record.rows) == (url, 0, None, None), record


def write_parquet(root: Path, shards: int = 4) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"part-{i}.parquet" for i in range(shards)]
    for i, path in enumerate(paths):
        pq.write_table(make_table(i * ROWS, ROWS), path, row_group_size=50)
    return paths


def corrupt_footer(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-40:-8] = b"\xee" * 32  # the footer's end: its metadata no longer parses
    path.write_bytes(bytes(data))


# -- the Hub: a listed file whose footer answers 404 --------------------------------------


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hf_env: None) -> Iterator[HubStub]:  # noqa: F811
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with HubStub(page_size=4) as stub:
        stub.add_dataset(
            "org/gone",
            {f"d/{n}.parquet": encode(make_table(n * ROWS, ROWS), "parquet") for n in range(3)},
        )
        stub.unreadable("org/gone", "d/1.parquet")  # listed, but its bytes answer 404
        yield stub


def hub_stream(hub: HubStub, read: ingest.ReadOptions, **kwargs: Any) -> ingest.Stream:
    return ingest.Stream(
        "hf://datasets/org/gone/d/*.parquet",
        batch_size=50,
        storage_options={"endpoint": hub.endpoint},
        read=read,
        **kwargs,
    )


def test_a_hub_file_whose_footer_answers_404_fails_the_run_by_default(hub: HubStub) -> None:
    with pytest.raises(ingest.SourceError, match=r"d/1\.parquet.*disappeared after it was listed"):
        list(hub_stream(hub, ingest.ReadOptions()))


def test_a_hub_file_whose_footer_answers_404_is_quarantined_under_skip(hub: HubStub) -> None:
    s = hub_stream(hub, SKIP, shuffle_seed=0)
    batches = []
    for batch in s:
        batches.append(batch)
        if len(batches) == 2:  # the state mid-epoch holds the epoch's records
            saved = s.state_dict()["progress"]["quarantined"]
    exactly_once_but(ids_of(batches), 3 * ROWS, set(range(ROWS, 2 * ROWS)))
    [record] = s.quarantined
    assert record.url is not None and record.url.endswith("d/1.parquet"), record
    whole(record, record.url)
    assert "disappeared after it was listed" in record.reason, record.reason
    assert s.stats["quarantined"] == 1
    assert [q["url"] for q in saved] == [record.url]


# -- local shards: corrupt footer, empty file, another schema, a deep JSON line -----------


@pytest.mark.parametrize("seed", [None, 5])
@pytest.mark.parametrize("damage", ["footer", "empty", "schema"])
def test_a_shard_that_cannot_be_planned_is_quarantined_whole_under_skip(
    tmp_path: Path, damage: str, seed: int | None
) -> None:
    paths = write_parquet(tmp_path)
    bad = paths[2]
    if damage == "footer":
        corrupt_footer(bad)
    elif damage == "empty":
        bad.write_bytes(b"")
    else:
        pq.write_table(pa.table({"id": pa.array(["a"] * ROWS)}), bad)
    with pytest.raises(ingest.ShardError, match=r"part-2\.parquet"):
        list(ingest.Stream(str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=seed))

    s = ingest.Stream(str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=seed, read=SKIP)
    exactly_once_but(ids_of(s), 4 * ROWS, set(range(2 * ROWS, 3 * ROWS)))
    [record] = s.quarantined
    whole(record, f"file://{bad}")
    assert s.stats["quarantined"] == 1 and s.stats["rows_delivered"] == 3 * ROWS
    # The next epoch lists again: quarantined again, in its own record.
    exactly_once_but(ids_of(s), 4 * ROWS, set(range(2 * ROWS, 3 * ROWS)))
    assert sorted(q.epoch for q in s.quarantined) == [0, 1]


def test_a_zero_row_shard_is_planned_and_read_with_nothing_quarantined(tmp_path: Path) -> None:
    paths = write_parquet(tmp_path)
    pq.write_table(make_table(0, 0), paths[1])
    s = ingest.Stream(str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=0, read=SKIP)
    exactly_once_but(ids_of(s), 4 * ROWS, set(range(ROWS, 2 * ROWS)))
    assert s.quarantined == [] and s.stats["rows_delivered"] == 3 * ROWS


def test_a_state_saved_after_a_planning_quarantine_resumes_exactly(tmp_path: Path) -> None:
    paths = write_parquet(tmp_path)
    corrupt_footer(paths[1])
    options: dict[str, Any] = {"columns": ["id"], "batch_size": 50, "shuffle_seed": 4, "read": SKIP}
    s = ingest.Stream(str(tmp_path), **options)
    head = []
    for batch in s:
        head.append(batch)
        if len(head) == 5:
            break
    state = json.loads(json.dumps(s.state_dict()))
    s.close()
    [saved] = state["progress"]["quarantined"]
    assert saved["url"] == f"file://{paths[1]}" and saved["start"] == 0 and "stop" not in saved
    resumed = ingest.Stream(str(tmp_path), **options)
    resumed.load_state_dict(state)
    rest = list(resumed)
    exactly_once_but(ids_of(head + rest), 4 * ROWS, set(range(ROWS, 2 * ROWS)))
    assert len(resumed.quarantined) == 1, resumed.quarantined


def test_dataloader_workers_plan_around_a_shard_quarantined_at_planning(tmp_path: Path) -> None:
    # Two workers are two ranks: every shard needs a row count (a counted plan).
    paths = write_parquet(tmp_path)
    corrupt_footer(paths[3])
    stream = ingest.Stream(str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=2, read=SKIP)
    loader = ingest.DataLoader(stream, num_workers=2)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 3:
            saved = loader.state_dict()["progress"]["quarantined"]
    seen = ids_of(batches)
    exactly_once_but(seen, 4 * ROWS, set(range(3 * ROWS, 4 * ROWS)))
    assert sum(seen.values()) == 3 * ROWS  # 600 rows: 6 steps of 2 x 50, nothing carried
    [record] = saved
    assert record["url"] == f"file://{paths[3]}" and record["rank"] == 0, record
    assert record["start"] == 0 and "stop" not in record and "rows" not in record


@pytest.mark.parametrize("at", [0, 7])
def test_a_deep_json_line_among_the_schemas_lines_is_quarantined_alone(
    tmp_path: Path, at: int
) -> None:
    for i in range(3):
        lines = encode(make_table(i * ROWS, ROWS), "jsonl").split(b"\n")
        if i == 0:
            lines[at] = DEEP.replace(b'"id": 0', f'"id": {at}'.encode())
        (tmp_path / f"part-{i}.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(ingest.ShardError, match=r"nests 10001 levels deep"):
        list(ingest.Stream(str(tmp_path), columns=["id"], batch_size=50))

    s = ingest.Stream(str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=1, read=SKIP)
    seen = ids_of(s)
    exactly_once_but(seen, 3 * ROWS, {at})
    [record] = s.quarantined
    assert record.url is not None and record.url.endswith("part-0.jsonl")
    assert (record.start, record.stop, record.rows) == (at, at + 1, 1), record
    assert "nests 10001 levels deep" in record.reason
    assert s.stats["rows_delivered"] == 3 * ROWS - 1


def test_a_shard_whose_indexing_fails_is_quarantined_and_the_others_indexed(
    tmp_path: Path,
) -> None:
    # Two ranks need every JSONL shard's row count: the shards are indexed while planning. A
    # truncated .gz shard fails its indexing: under skip it is quarantined whole and the
    # indexer goes on with the shards after it.
    import gzip

    for i in range(4):
        body = encode(make_table(i * ROWS, ROWS), "jsonl")
        if i == 1:
            (tmp_path / "part-1.jsonl.gz").write_bytes(gzip.compress(body)[:-200])
        else:
            (tmp_path / f"part-{i}.jsonl").write_bytes(body)
    options: dict[str, Any] = {"columns": ["id"], "batch_size": 50, "shuffle_seed": 1}
    with pytest.raises(ingest.ShardError, match=r"part-1\.jsonl\.gz"):
        next(iter(ingest.DataLoader(ingest.Stream(str(tmp_path), **options), num_workers=2)))
    loader = ingest.DataLoader(ingest.Stream(str(tmp_path), read=SKIP, **options), num_workers=2)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 3:
            saved = loader.state_dict()["progress"]["quarantined"]
    exactly_once_but(ids_of(batches), 4 * ROWS, set(range(ROWS, 2 * ROWS)))
    assert sum(ids_of(batches).values()) == 3 * ROWS
    [record] = saved
    assert record["url"] == f"file://{tmp_path}/part-1.jsonl.gz" and record["start"] == 0


def _drain_rank(it: Any) -> list[int]:
    return [int(v) for batch in it for v in batch["id"].tolist()]


@pytest.mark.usefixtures("ray_session")
def test_ray_ranks_plan_around_a_shard_quarantined_at_planning(tmp_path: Path) -> None:
    # The coordinator plans; the listing's error crosses Ray to rank 0's feed, which records
    # it; the stream's records hold it once.
    import ray

    drain = ray.remote(num_cpus=0)(_drain_rank)
    paths = write_parquet(tmp_path)
    corrupt_footer(paths[0])
    with ingest.RayStream(
        str(tmp_path), columns=["id"], batch_size=50, shuffle_seed=5, world_size=2, read=SKIP
    ) as stream:
        ranks = ray.get([drain.remote(stream.rank_iterator(r)) for r in range(2)], timeout=240)
        records = stream.quarantined()
    assert [len(r) for r in ranks] == [300, 300]
    exactly_once_but(Counter(i for r in ranks for i in r), 4 * ROWS, set(range(ROWS)))
    [record] = records
    whole(record, f"file://{paths[0]}")
    assert record.rank == 0 and "has no readable Parquet footer" in record.reason
