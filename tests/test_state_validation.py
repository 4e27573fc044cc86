"""A state is validated before use (issue 8, "Bad input" and "Security").

The cases already covered elsewhere are not repeated here: another dataset and a future
version (tests/test_bad_input.py), negative or past-the-end intervals of ``progress`` and
``distributed.carry``, an edited listing and a state that is not JSON (tests/test_state.py).
These are the rest: the saved position against the plan it resumes, the counts against the
rows consumed, numbers too large for a row offset, and the size limit before parsing.
Each error names the field, the value, the rule and the fix.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

import ingest
from ingest.core.errors import StateError
from ingest.core.state import StreamState
from ingest.testing import Store, write_dataset

SHARDS, ROWS, BATCH = 8, 5000, 100
FIX = "state_dict"  # every message says to pass the state as state_dict() returned it


@pytest.fixture
def data(local: Store) -> str:
    url = local.url("d")
    write_dataset(local.fs, url, "parquet", SHARDS, ROWS, row_group_rows=1000)
    return url


def stream(url: str) -> ingest.Stream:
    return ingest.Stream(url, batch_size=BATCH, shuffle_seed=1, shuffle_window=4096)


def saved(url: str, batches: int = 7) -> dict[str, Any]:
    """The state of a stream after ``batches`` batches (mid-window: window 1 of 4096 rows)."""
    s = stream(url)
    for _ in itertools.islice(s, batches):
        pass
    state = s.state_dict()
    s.close()
    return state


def refused(url: str, state: dict[str, Any], *patterns: str) -> str:
    """Load ``state`` into a new stream; it must be refused with every pattern in the message."""
    with pytest.raises(StateError) as info:
        stream(url).load_state_dict(state)
    message = str(info.value)
    for pattern in (*patterns, FIX):
        assert pattern in message, f"{pattern!r} not in {message!r}"
    return message


def cursor(state: dict[str, Any]) -> dict[str, Any]:
    got = state["position"]["ranks"][0]
    assert isinstance(got, dict)
    return got


# -- the position against the plan -------------------------------------------------------


def test_a_window_moved_three_units_is_refused(data: str) -> None:
    """Issue 8: a resume position moved on loaded without complaint, the epoch ended short."""
    state = saved(data, batches=45)  # in window 1
    edited = copy.deepcopy(state)
    window = cursor(state)["window"]
    cursor(edited)["window"] = window + 3
    refused(data, edited, "position.ranks[0].window", str(window + 3), "lane")
    stream(data).load_state_dict(state)  # the state as saved loads


def test_a_lane_moved_within_its_span_is_refused(data: str) -> None:
    state = saved(data)
    lanes = cursor(state)["lanes"]
    n = next(i for i, lane in enumerate(lanes) if lane is not None)
    lanes[n][1] += 3
    refused(data, state, f"position.ranks[0].lanes[{n}]", "row")


def test_a_lane_moved_a_whole_window_on_is_refused(data: str) -> None:
    """Consistent with its window index, but the rows it skips were never consumed."""
    state = saved(data)
    c = cursor(state)
    per_lane = 4096 // len(c["lanes"])
    for lane in c["lanes"]:
        lane[1] += per_lane  # every shard holds more than one window's share of its lane
    c["window"] += 1
    refused(data, state, "position.ranks[0]", "not consumed")


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c["lanes"][0].__setitem__(0, 99), "lanes[0]"),
        (lambda c: c["lanes"][0].__setitem__(1, 999_999), "lanes[0]"),
        (lambda c: c["lanes"].pop(), "lanes"),
    ],
    ids=["span index", "row outside the span", "lane count"],
)
def test_a_position_that_does_not_fit_the_plan_is_refused(data: str, edit: Any, field: str) -> None:
    state = saved(data)
    edit(cursor(state))
    refused(data, state, f"position.ranks[0].{field}")


@pytest.mark.parametrize(
    ("edit", "field", "value"),
    [
        (lambda c: c.__setitem__("window", -1), "position.ranks[0].window", "-1"),
        (lambda c: c.__setitem__("window", "1"), "position.ranks[0].window", "'1'"),
        (lambda c: c.__setitem__("lanes", {}), "position.ranks[0].lanes", "{}"),
        (lambda c: c["lanes"].__setitem__(0, [0, 5]), "position.ranks[0].lanes[0]", "[0, 5]"),
        (lambda c: c["lanes"][0].__setitem__(1, -5), "position.ranks[0].lanes[0]", "-5"),
        (lambda c: c.pop("window"), "position.ranks[0]", "window"),
        (lambda c: c["lanes"][0].__setitem__(0, None), "position.ranks[0].lanes[0] span", "None"),
        (lambda c: c["lanes"][0].__setitem__(1, None), "position.ranks[0].lanes[0] row", "None"),
    ],
    ids=[
        "negative window",
        "text window",
        "lanes not a list",
        "short lane",
        "negative row",
        "no window",
        "null span",
        "null row",
    ],
)
def test_a_malformed_position_is_refused_when_parsed(
    data: str, edit: Any, field: str, value: str
) -> None:
    state = saved(data)
    edit(cursor(state))
    with pytest.raises(StateError) as info:
        StreamState.from_json(state)
    for pattern in (field, value, FIX):
        assert pattern in str(info.value)


def _set(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    part = state
    for key in path[:-1]:
        part = part[key]
    part[path[-1]] = value
    return state


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("dataset",), []),
        (("progress", "consumed"), None),
        (("progress", "consumed", "partial"), []),
        (("progress",), "x"),
        (("distributed",), "x"),
        (("position", "shuffle"), 3),
        (("position",), [1]),
    ],
)
def test_a_part_of_another_kind_is_refused_as_malformed(
    data: str, path: tuple[str, ...], value: Any
) -> None:
    """A part of the state edited into another JSON kind is a StateError naming the state as
    malformed (a list where an object goes was a bare AttributeError from deep inside)."""
    refused(data, _set(saved(data), path, value), "malformed")


@pytest.mark.parametrize("null", [False, True], ids=["deleted", "null"])
@pytest.mark.parametrize("part", ["position", "progress", "distributed", "dataset"])
def test_a_missing_part_is_refused_as_malformed_naming_it(data: str, part: str, null: bool) -> None:
    """Found by a probe: a state whose ``position`` was deleted was refused as saved "with
    another shuffle_seed", which it was not; one set to null was read as empty. A part
    missing, or null, is the state malformed, named."""
    state = saved(data)
    if null:
        state[part] = None
    else:
        del state[part]
    message = refused(data, state, "malformed", f"{part!r}", "missing")
    assert "shuffle_seed" not in message


# -- counts against rows --------------------------------------------------------------------


def test_a_step_moved_on_is_refused(data: str) -> None:
    state = saved(data)
    state["progress"]["step"] += 3
    refused(data, state, "progress.step", "10", "700")


def test_a_learnt_row_count_must_agree_with_the_listing(data: str) -> None:
    state = saved(data)
    state["progress"]["consumed"]["rows"] = {"3": 7}
    with pytest.raises(StateError, match=r"progress\.rows\[3\] is 7.*5000 rows"):
        StreamState.from_json(state)


@pytest.mark.parametrize("where", ["partial", "delivered"])
def test_numbers_too_large_for_a_row_offset_are_refused(data: str, where: str) -> None:
    state = saved(data)
    huge = 1 << 70
    if where == "partial":
        state["progress"]["consumed"]["partial"] = {"0": [[0, huge]]}
    else:
        state["progress"]["delivered"] = huge
    with pytest.raises(StateError, match=str(huge)):
        StreamState.from_json(state)


def test_a_packed_partial_beside_other_sets_is_refused(data: str) -> None:
    """A state inside a window writes its partial sets packed (issue 32): a set added beside
    the packed ones (an edit) would be read by nobody, so the state is refused."""
    state = saved(data)
    partial = state["progress"]["consumed"]["partial"]
    assert list(partial) == ["packed"]
    partial["0"] = [[0, 10]]
    with pytest.raises(StateError, match="packed"):
        StreamState.from_json(state)


# -- size ----------------------------------------------------------------------------------


def test_the_size_limit_is_configurable_and_checked_before_parsing(data: str) -> None:
    text = json.dumps(saved(data))
    assert StreamState.from_json(text, max_bytes=len(text)).progress.step == 7
    for given in (text, text.encode()):
        with pytest.raises(StateError, match=rf"{len(text)} bytes, above the 100 byte limit"):
            StreamState.from_json(given, max_bytes=100)
    # Counted in bytes, not characters: 50 characters of 2 bytes each.
    with pytest.raises(StateError, match="100 bytes, above the 99 byte limit"):
        StreamState.from_json("é" * 50, max_bytes=99)


def test_a_state_file_is_refused_before_it_is_read(data: str, tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(saved(data)))
    with path.open("rb") as f:
        assert StreamState.read(f).progress.step == 7
    with path.open("rb") as f:
        assert StreamState.read(f, max_bytes=path.stat().st_size).progress.step == 7
    with path.open("rb") as f, pytest.raises(StateError) as info:
        StreamState.read(f, max_bytes=100)
    assert str(path) in str(info.value) and "above the 100 byte limit (max_bytes)" in str(
        info.value
    )
    path.write_text("[" * 300)  # not JSON, and too large: the size is what is reported
    with path.open("rb") as f, pytest.raises(StateError, match="byte limit"):
        StreamState.read(f, max_bytes=100)


def test_a_refused_state_leaves_the_stream_as_it_was(data: str) -> None:
    good = saved(data, batches=10)
    bad = copy.deepcopy(good)
    c = cursor(bad)
    for lane in c["lanes"]:  # a window on: its rows would never be read
        lane[1] += 4096 // len(c["lanes"])
    c["window"] += 1
    s = stream(data)
    s.load_state_dict(good)
    with pytest.raises(StateError):
        s.load_state_dict(bad)
    rest = [i for batch in s for i in batch["id"].tolist()]
    first = stream(data)
    head = [i for batch in itertools.islice(first, 10) for i in batch["id"].tolist()]
    first.close()
    assert sorted(head + rest) == list(range(SHARDS * ROWS))


@pytest.mark.parametrize("workers", [None, 0, 2], ids=["stream", "dataloader0", "dataloader2"])
@pytest.mark.parametrize("refusal", ["position", "listing"])
def test_a_state_refused_mid_loop_leaves_the_stream_where_its_loop_was(
    data: str, refusal: str, workers: int | None
) -> None:
    """A loop that handed out batches, then a state refused: the stream (or loader) goes on
    after the loop's last batch, every row of the epoch once. Before, the refusal came after
    the stream had dropped the loop's position (a loader, its book), and the next loop
    handed its batches out again (the test above loads a state into a stream that had
    handed out none)."""
    good = saved(data, batches=10)
    bad = copy.deepcopy(good)
    if refusal == "position":
        c = cursor(bad)
        for lane in c["lanes"]:  # a window on: its rows would never be read
            lane[1] += 4096 // len(c["lanes"])
        c["window"] += 1
    else:  # a shard the state names, as changed since
        bad["dataset"]["shards"][0][1] += 1
        bad["dataset"].pop("digest")
    s: Any = stream(data)
    if workers is not None:
        s = ingest.DataLoader(s, num_workers=workers)
    try:
        # 4 batches: whole steps of a loader's 2 workers (a loop left inside a step leaves
        # its rank's share of it to be carried into the next epoch)
        head = [i for batch in itertools.islice(s, 4) for i in batch["id"].tolist()]
        with pytest.raises(StateError):
            s.load_state_dict(bad)
        rest = [i for batch in s for i in batch["id"].tolist()]
    finally:
        s.close()
    assert sorted(head + rest) == list(range(SHARDS * ROWS))
