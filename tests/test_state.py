"""The JSON state: round trip, size, validation against the dataset."""

from __future__ import annotations

import json

import pytest

from ingest.errors import StateError
from ingest.intervals import IntervalSet
from ingest.state import (
    MAX_STATE_BYTES,
    DatasetState,
    DistributedState,
    PositionState,
    Progress,
    ProgressState,
    ShardRecord,
    StreamState,
    match_listing,
)

SHARDS = [ShardRecord(f"s3://b/part-{i}.parquet", 1000 + i, f"etag{i}", 500) for i in range(6)]


def make_state() -> StreamState:
    progress = Progress()
    for i in range(3):
        progress.of(i).add(0, 500)
    progress.of(4).add(0, 120)
    progress.of(4).add(300, 310)
    return StreamState(
        DatasetState(["s3://b/*.parquet"], SHARDS),
        ProgressState(epoch=2, first_step=3, step=5, delivered=1630, consumed=progress),
        DistributedState(4),
        PositionState(7, 128, 1000, 4, [{"window": 3, "lanes": [[0, 5, None, None]]}] * 4),
    )


def test_round_trip_is_plain_json() -> None:
    state = make_state()
    data = json.loads(json.dumps(state.to_json()))
    back = StreamState.from_json(data)
    assert back.to_json() == state.to_json()
    assert data["version"] == 2
    assert list(data) == ["version", "dataset", "progress", "distributed", "position"]
    consumed = data["progress"]["consumed"]
    assert consumed["done"] == [[0, 3]]  # a consumed run of shards is one range
    assert consumed["partial"] == {"4": [[0, 120], [300, 310]]}
    assert (data["position"]["seed"], data["progress"]["epoch"]) == (7, 2)
    assert data["distributed"]["world_size"] == 4


def test_size_is_linear_in_shards_not_rows() -> None:
    many = [ShardRecord(f"s3://b/p{i}.parquet", 10**9, "e", 10**7) for i in range(1000)]
    progress = Progress()
    for i in range(900):
        progress.of(i).add(0, 10**7)
    state = StreamState(DatasetState(["s3://b/"], many), ProgressState(consumed=progress))
    text = json.dumps(state.to_json())
    assert json.loads(text)["progress"]["consumed"]["done"] == [[0, 900]]
    assert len(text) < 60 * 1000


@pytest.mark.parametrize("version", [0, 1, 3, None, "2"])
def test_unknown_version_is_refused(version: object) -> None:
    data = make_state().to_json()
    data["version"] = version
    with pytest.raises(StateError, match="version"):
        StreamState.from_json(data)


def test_edited_state_is_refused() -> None:
    data = make_state().to_json()
    data["dataset"]["shards"][0][1] = 1
    with pytest.raises(StateError, match="digest"):
        StreamState.from_json(data)


@pytest.mark.parametrize(
    "breakage",
    ["no_dataset", "bad_epoch", "bad_interval", "bad_index", "past_the_end", "steps", "carry"],
)
def test_malformed_state_is_refused(breakage: str) -> None:
    data = make_state().to_json()
    if breakage == "no_dataset":
        del data["dataset"]
    elif breakage == "bad_epoch":
        data["progress"]["epoch"] = -1
    elif breakage == "bad_interval":
        data["progress"]["consumed"]["partial"]["4"] = [[5, 1]]
    elif breakage == "bad_index":
        data["progress"]["consumed"]["partial"]["99"] = [[0, 1]]
    elif breakage == "past_the_end":  # rows beyond the shard's 500: would skip rows silently
        data["progress"]["consumed"]["partial"]["4"] = [[0, 1_000_000_000]]
    elif breakage == "steps":
        data["progress"]["first_step"] = data["progress"]["step"] + 3
    else:
        data["distributed"]["carry"]["spans"] = [[1, 0, 501]]
    with pytest.raises(StateError):
        StreamState.from_json(data)


def test_same_listing_matches_and_grown_listing_is_accepted() -> None:
    match_listing(SHARDS, SHARDS)
    grown = [*SHARDS, ShardRecord("s3://b/part-9.parquet", 5, "new", 1)]
    match_listing(SHARDS, grown)


def test_changed_shard_is_named() -> None:
    changed = list(SHARDS)
    changed[2] = ShardRecord(SHARDS[2].url, 999, "other", 500)
    with pytest.raises(StateError, match=r"part-2\.parquet \(size 1002 -> 999, version"):
        match_listing(SHARDS, changed)


def test_missing_shard_is_named() -> None:
    with pytest.raises(StateError, match=r"1 shard\(s\) gone: s3://b/part-5\.parquet"):
        match_listing(SHARDS, SHARDS[:5])


def test_other_dataset_is_refused() -> None:
    other = [ShardRecord(f"s3://other/{i}.jsonl", 1, "x", None) for i in range(3)]
    with pytest.raises(StateError, match="another dataset"):
        match_listing(SHARDS, other)


def test_done_needs_known_rows() -> None:
    shards = [ShardRecord("s3://b/a.jsonl", 10, "e", None)]
    data = StreamState(DatasetState(["s3://b/"], shards)).to_json()
    data["progress"]["consumed"]["done"] = [[0, 1]]
    with pytest.raises(StateError, match="row count is unknown"):
        StreamState.from_json(data)
    data["progress"]["consumed"]["rows"] = {"0": 40}
    state = StreamState.from_json(data)
    assert state.progress.consumed.of(0) == IntervalSet([(0, 40)])


def test_state_is_parsed_as_json_with_a_size_limit() -> None:
    text = json.dumps(make_state().to_json())
    assert StreamState.from_json(text).to_json() == make_state().to_json()
    with pytest.raises(StateError, match="not JSON"):
        StreamState.from_json("{not json")
    with pytest.raises(StateError, match="byte limit"):
        StreamState.from_json(" " * (MAX_STATE_BYTES + 1))
