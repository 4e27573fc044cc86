"""The JSON state: round trip, size, validation against the dataset."""

from __future__ import annotations

import json
import re

import pytest

import ingest
from ingest.core.errors import StateError
from ingest.core.intervals import IntervalSet
from ingest.core.state import (
    MAX_STATE_BYTES,
    Consumed,
    DatasetState,
    DistributedState,
    PackedFingerprint,
    PositionState,
    ProgressState,
    ShardRecord,
    SkipAhead,
    StreamState,
    match_listing,
)
from ingest.core.state import dataset as dataset_module

SHARDS = [ShardRecord(f"s3://b/part-{i}.parquet", 1000 + i, f"etag{i}", 500) for i in range(6)]


def make_state() -> StreamState:
    progress = Consumed()
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
    assert data["version"] == 7
    assert list(data) == ["version", "dataset", "progress", "distributed", "position"]
    consumed = data["progress"]["consumed"]
    assert consumed["done"] == [[0, 3]]  # a consumed run of shards is one range
    assert consumed["partial"] == {"4": [[0, 120], [300, 310]]}
    assert (data["position"]["seed"], data["progress"]["epoch"]) == (7, 2)
    assert data["distributed"]["world_size"] == 4


def test_size_is_linear_in_shards_not_rows() -> None:
    many = [ShardRecord(f"s3://b/p{i}.parquet", 10**9, "e", 10**7) for i in range(1000)]
    progress = Consumed()
    for i in range(900):
        progress.of(i).add(0, 10**7)
    state = StreamState(DatasetState(["s3://b/"], many), ProgressState(consumed=progress))
    text = json.dumps(state.to_json())
    assert json.loads(text)["progress"]["consumed"]["done"] == [[0, 900]]
    assert len(text) < 60 * 1000


@pytest.mark.parametrize("version", [0, 1, 4, None, "2", True])
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


def nested(depth: int) -> list[object]:
    out: list[object] = []
    for _ in range(depth):
        out = [out]
    return out


@pytest.mark.parametrize(
    "where", ["text", "dataset.sources", "progress.quarantined", "position.ranks", "carry"]
)
def test_a_deeply_nested_state_is_refused_not_a_recursion_error(where: str) -> None:
    """Issue 17: JSON nested 100,000 levels was a bare RecursionError."""
    data = make_state().to_json()
    deep = nested(100_000)
    if where == "text":
        given: object = '{"version": 2, "dataset": ' + "[" * 100_000 + "]" * 100_000 + "}"
    else:
        if where == "dataset.sources":
            data["dataset"]["sources"] = [deep]
        elif where == "progress.quarantined":
            data["progress"]["quarantined"] = [{"reason": "x", "url": deep}]
        elif where == "position.ranks":
            data["position"]["ranks"][0] = {"window": 3, "lanes": deep}
        else:
            data["distributed"]["carry"]["spans"] = deep
        given = data
    with pytest.raises(StateError, match=r"nested too deep.*state_dict\(\) returned"):
        StreamState.from_json(given)


# -- the packed form (version 3) ----------------------------------------------------------


@pytest.fixture
def pack_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pack listings of 4 shards or more, so that the tests stay small."""
    monkeypatch.setattr(dataset_module, "PACK_FROM_SHARDS", 4)


def packed_state() -> StreamState:
    state = make_state()
    state.progress.consumed.of(5).add_many(range(0, 500, 2), range(1, 501, 2))
    state.distributed.carry_consumed.of(4).add(400, 410)
    return state


@pytest.mark.usefixtures("pack_small")
def test_packed_round_trip_is_plain_json() -> None:
    state = packed_state()
    data = json.loads(json.dumps(state.to_json()))
    assert data["version"] == 7
    assert "shards" not in data["dataset"] and data["dataset"]["packed"]["count"] == 6
    assert data["dataset"]["packed"]["prefix"] == "s3://b/part-"
    back = StreamState.from_json(data)
    assert [(s.url, s.rows) for s in back.shards] == [(s.url, s.rows) for s in SHARDS]
    assert back.progress.consumed.sets == {
        k: v for k, v in state.progress.consumed.sets.items() if v
    }
    assert back.distributed.carry_consumed.of(4) == IntervalSet([(400, 410)])
    assert back.to_json() == data
    match_listing(back.dataset, SHARDS)


def test_every_state_is_version_7_and_says_what_it_holds_by_its_parts() -> None:
    """The version is no feature flag (issue 33, item 3): a small listing is written as
    records and a large one packed, both version 7; the pack node's part is there only
    when documents are in flight."""
    small, large = make_state().to_json(), StreamState(DatasetState(["s3://b/"], SHARDS * 2000))
    assert small["version"] == large.to_json()["version"] == ingest.STATE_VERSION == 7
    assert "shards" in small["dataset"] and "packed" in large.to_json()["dataset"]
    assert "pack" not in small


def test_a_part_of_a_node_this_ingest_does_not_know_is_refused_not_ignored() -> None:
    """A later node's part may hold rows to leave out: reading the state without it would
    not be exact, so it is refused, naming the part."""
    data = make_state().to_json()
    with pytest.raises(StateError, match=r"part\(s\) \['skip'\].*newer ingest"):
        StreamState.from_json({**data, "skip": {"steps": [[1, 3]]}})
    with pytest.raises(StateError, match="pack part"):
        StreamState.from_json({**data, "pack": {"tokens": [], "open": 1}})


def test_a_version_2_state_is_read() -> None:
    text = json.dumps(
        {
            "version": 2,
            "dataset": {"sources": ["s3://b/"], "shards": [["s3://b/a.parquet", 10, "e", 100]]},
            "progress": {"epoch": 1, "consumed": {"done": [], "partial": {"0": [[0, 30]]}}},
        }
    )
    state = StreamState.from_json(text)
    assert state.progress.consumed.of(0) == IntervalSet([(0, 30)])
    assert state.to_json()["version"] == 7


@pytest.mark.usefixtures("pack_small")
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("urls", "not base64!", r"dataset\.packed\.urls is not zlib-compressed base64"),
        ("rows", "eJwDAAAAAAE=", r"dataset\.packed does not match its sha256"),
        ("size_hashes", 7, r"dataset\.packed\.size_hashes must be a base64 string"),
        ("count", 1, r"dataset\.packed\.rows holds more than the 8 bytes its 1 shards need"),
        ("prefix", "s3://c/part-", r"dataset\.packed does not match its sha256.*save it again"),
        ("sha256", "0" * 64, r"dataset\.packed does not match its sha256"),
        (None, None, r"dataset\.packed must be an object with the fields"),
    ],
)
def test_an_edited_packed_listing_is_refused(
    field: str | None, value: object, message: str
) -> None:
    data = packed_state().to_json()
    packed = data["dataset"]["packed"]
    if field is None:
        del packed["rows"]
    else:
        packed[field] = value
    with pytest.raises(StateError, match=message):
        StreamState.from_json(data)


@pytest.mark.usefixtures("pack_small")
def test_an_edited_packed_progress_is_refused() -> None:
    data = packed_state().to_json()
    partial = data["progress"]["consumed"]["partial"]["packed"]
    partial["bits"] = partial["from"]
    with pytest.raises(StateError, match=r"progress\.consumed\.partial\.packed\.bits holds"):
        StreamState.from_json(data)
    data = packed_state().to_json()
    data["progress"]["consumed"]["partial"]["packed"]["shards"] = "%%%"
    with pytest.raises(StateError, match=r"partial\.packed\.shards is not zlib-compressed"):
        StreamState.from_json(data)


@pytest.mark.usefixtures("pack_small")
def test_packed_rows_past_the_end_are_refused() -> None:
    """The bounds check holds for packed sets too (rows beyond a shard's count)."""
    state = packed_state()
    state.progress.consumed.of(5).add(900, 901)
    with pytest.raises(StateError, match=r"reaches row 901, but the shard has 500 rows"):
        StreamState.from_json(json.dumps(state.to_json()))


@pytest.mark.usefixtures("pack_small")
def test_a_packed_state_names_what_changed() -> None:
    saved = StreamState.from_json(packed_state().to_json()).dataset
    match_listing(saved, [*SHARDS, ShardRecord("s3://b/new.parquet", 1, "n", 1)])
    resized = list(SHARDS)
    resized[1] = SHARDS[1]._replace(size=5)
    with pytest.raises(StateError, match=r"part-1\.parquet \(size now 5, not as saved\)"):
        match_listing(saved, resized)
    rewritten = list(SHARDS)
    rewritten[2] = SHARDS[2]._replace(version="etag-new")
    with pytest.raises(StateError, match=r"part-2\.parquet \(version now 'etag-new'"):
        match_listing(saved, rewritten)
    with pytest.raises(StateError, match=r"1 shard\(s\) gone: s3://b/part-5\.parquet"):
        match_listing(saved, SHARDS[:5])
    # A listing without versions is compared by size alone, as in version 2.
    match_listing(saved, [s._replace(version="") for s in SHARDS])


@pytest.mark.usefixtures("pack_small")
def test_a_change_the_hashes_miss_is_still_refused() -> None:
    saved = StreamState.from_json(packed_state().to_json()).dataset
    assert saved.fingerprint is not None
    saved.fingerprint = PackedFingerprint(
        "0" * 64, saved.fingerprint.size_hashes, saved.fingerprint.version_hashes
    )
    with pytest.raises(StateError, match="rewritten in place"):
        match_listing(saved, SHARDS)


def test_rows_consumed_in_part_round_trip_as_the_pack_part_and_are_checked() -> None:
    state = make_state()
    state.progress.tokens = [(1, 4, 200, 17), (1, 5, 0, 2048)]
    data = json.loads(json.dumps(state.to_json()))
    assert data["version"] == 7 and data["pack"] == {"tokens": [[1, 4, 200, 17], [1, 5, 0, 2048]]}
    assert "tokens" not in data["progress"]
    assert StreamState.from_json(data).progress.tokens == state.progress.tokens
    # Version 5 held them in progress.tokens; such a state still reads, and not in version 7.
    old = {**data, "version": 5, "progress": {**data["progress"], "tokens": data["pack"]["tokens"]}}
    del old["pack"]
    assert StreamState.from_json(old).progress.tokens == state.progress.tokens
    with pytest.raises(StateError, match=re.escape("since version 7 they are pack.tokens")):
        StreamState.from_json({**old, "version": 7})
    bad = {
        "[1, 4, 300, 5]": [[1, 4, 300, 5]],  # a row consumed whole already
        "segment must be 0 or 1": [[2, 4, 200, 5]],
        "offset at least 1": [[1, 4, 200, 0]],
        "below the 500 rows": [[1, 4, 500, 5]],
        "once, in sorted order": [[1, 5, 0, 2], [1, 4, 200, 17]],
        "[segment, shard, row, offset]": [[1, 4, 200]],
    }
    for rule, tokens in bad.items():
        edited = json.loads(json.dumps(data))
        edited["pack"]["tokens"] = tokens
        with pytest.raises(StateError, match=re.escape(rule)):
            StreamState.from_json(edited)


def test_copies_owed_round_trip_and_are_checked() -> None:
    state = make_state()
    state.distributed.owed = [(4, 200, 0), (4, 200, 17), (5, 3, 2)]  # a row owed twice
    data = json.loads(json.dumps(state.to_json()))
    assert data["version"] == 7 and data["distributed"]["owed"] == [
        list(o) for o in state.distributed.owed
    ]
    assert StreamState.from_json(data).distributed.owed == state.distributed.owed
    assert "owed" not in make_state().to_json()["distributed"], "none: the field is left out"
    bad = {
        "below the shard's 500 rows": [[4, 500, 0]],
        "in sorted order": [[5, 3, 2], [4, 200, 0]],
        "[shard, row, offset]": [[4, 200]],
        "out of range": [[99, 0, 0]],
        "an integer from 0": [[4, 1, -1]],
    }
    for rule, owed in bad.items():
        edited = json.loads(json.dumps(data))
        edited["distributed"]["owed"] = owed
        with pytest.raises(StateError, match=re.escape(rule)):
            StreamState.from_json(edited)


def test_skips_of_later_epochs_round_trip_and_are_checked() -> None:
    state = make_state()
    rows = IntervalSet([(0, 3), (7, 9)])
    state.progress.ahead = [SkipAhead(3, "steps 70..73", {"s3://b/part-9.parquet": rows})]
    data = json.loads(json.dumps(state.to_json()))
    assert data["progress"]["skip_ahead"] == [
        {"epoch": 3, "what": "steps 70..73", "rows": {"s3://b/part-9.parquet": [[0, 3], [7, 9]]}}
    ]  # by URL: a later epoch lists anew (a shard the state does not list is kept)
    assert StreamState.from_json(data).progress.ahead == state.progress.ahead
    assert "skip_ahead" not in make_state().to_json()["progress"], "none: left out"
    bad = {
        "at least the state's (2)": {"epoch": 1, "what": "x", "rows": {}},
        "{'epoch': e, 'what': text, 'rows': {url: rows}}": {"epoch": 3, "rows": {}},
        "map URLs to row intervals": {"epoch": 3, "what": "x", "rows": [[0, 1]]},
        "not a [start, stop] pair": {"epoch": 3, "what": "x", "rows": {"u": [[0]]}},
    }
    for rule, entry in bad.items():
        edited = json.loads(json.dumps(data))
        edited["progress"]["skip_ahead"] = [entry]
        with pytest.raises(StateError, match=re.escape(rule)):
            StreamState.from_json(edited)
