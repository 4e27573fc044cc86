"""``ingest.skip`` of rows and steps on small local shards: the ranges it refuses, the counts
it reports (never more rows than a shard holds) and a skip that changes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from ingest.core.state import read_state

ROWS = 10


def _jsonl(root: Path, shards: int = 4) -> list[str]:
    root.mkdir()
    for s in range(shards):
        lines = (json.dumps({"id": s * ROWS + r}) for r in range(ROWS))
        (root / f"s{s}.jsonl").write_text("\n".join(lines) + "\n")
    return [f"file://{root}/s{s}.jsonl" for s in range(shards)]


def _parquet(root: Path, shards: int = 2) -> list[str]:
    root.mkdir()
    for s in range(shards):
        pq.write_table(pa.table({"id": range(s * ROWS, (s + 1) * ROWS)}), root / f"s{s}.parquet")
    return [f"file://{root}/s{s}.parquet" for s in range(shards)]


def _state(root: Path, steps: int = 1, **kw: Any) -> dict[str, Any]:
    stream = ingest.Stream(str(root), batch_size=4, shuffle_seed=5, **kw)
    it = iter(stream)
    for _ in range(steps):
        next(it)
    state = stream.state_dict()
    stream.close()
    return json.loads(json.dumps(state))  # type: ignore[no-any-return]


def _resumed(root: Path, state: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    stream = ingest.Stream(str(root), batch_size=4, shuffle_seed=5)
    stream.load_state_dict(state)
    got = [int(i) for b in stream for i in b["id"].tolist()]
    stats = dict(stream.stats)
    stream.close()
    return got, stats


def _skips(state: dict[str, Any]) -> list[dict[str, Any]]:
    quarantined = state["progress"].get("quarantined", [])
    return [q for q in quarantined if q["reason"].startswith("skipped on request")]


def test_rows_past_the_end_of_a_shard_of_unknown_row_count_are_never_counted(
    tmp_path: Path,
) -> None:
    root = tmp_path / "d"
    urls = _jsonl(root)
    state = _state(root)
    assert state["dataset"]["shards"][0][3] is None  # a JSON Lines shard: rows not counted
    for start, stop in ((5, 50), (100, 200)):
        edited = ingest.skip(state, rows=[(urls[0], start, stop)])
        (record,) = _skips(edited)
        assert record["rows"] <= ROWS - min(start, ROWS), record
        assert "not counted" in record["reason"], record
        got, stats = _resumed(root, edited)
        assert stats["rows_skipped_on_request"] <= ROWS
        assert not set(got) & set(range(start, ROWS))  # the rows that exist: left out
        assert len(got) == len(set(got))


def test_rows_past_a_row_count_learnt_by_reading_are_refused_as_a_listed_ones(
    tmp_path: Path,
) -> None:
    root = tmp_path / "d"
    urls = _jsonl(root)
    state = _state(root)
    state["progress"]["consumed"]["rows"] = {"0": ROWS}  # learnt by reading the shard
    for start, stop in ((5, 50), (100, 200)):
        past = rf"rows \[{start}, {stop}\) of {re.escape(urls[0])}: the shard holds {ROWS} rows"
        with pytest.raises(ingest.StateError, match=past):
            ingest.skip(state, rows=[(urls[0], start, stop)])
    edited = ingest.skip(state, rows=[(urls[0], 5, 10)])
    (record,) = _skips(edited)
    assert record["rows"] == len(set(range(5, 10)) - _consumed(state, 0))
    assert "not counted" not in record["reason"]


def _consumed(state: dict[str, Any], shard: int) -> set[int]:
    sets = read_state(state).progress.consumed.sets  # type: ignore[union-attr]
    return {i for a, b in sets.get(shard, ()) for i in range(a, b)}


@pytest.mark.parametrize("start, stop", [(8, 2), (-3, 2), (4, 4), (0, 1 << 63)])
def test_a_bad_row_range_is_a_config_error_naming_the_url_the_range_and_the_fix(
    tmp_path: Path, start: int, stop: int
) -> None:
    root = tmp_path / "d"
    urls = _parquet(root)
    state = _state(root)
    with pytest.raises(ingest.ConfigError) as raised:
        ingest.skip(state, rows=[(urls[0], start, stop)])
    said = str(raised.value)
    assert f"rows [{start}, {stop}) of {urls[0]}" in said, said
    assert "0 <= start < stop" in said and "pass" in said, said


def test_a_url_not_listed_names_the_listings_shard_count(tmp_path: Path) -> None:
    root = tmp_path / "d"
    _parquet(root, shards=2)
    state = _state(root)
    with pytest.raises(ingest.StateError, match=r"listing \(2 shards\)"):
        ingest.skip(state, rows=[("file:///nope.parquet", 0, 1)])


def test_skipping_steps_the_state_has_passed_changes_nothing(tmp_path: Path) -> None:
    root, log = tmp_path / "d", str(tmp_path / "log")
    _jsonl(root)
    stream = ingest.Stream(str(root), batch_size=4, shuffle_seed=5, provenance=log)
    it = iter(stream)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(stream.state_dict()))
    for _ in it:
        pass
    stream.close()
    edited = ingest.skip(state, steps=[1], provenance=log)
    assert not _skips(edited)
    assert edited == read_state(state).to_json()  # type: ignore[union-attr]
    _, stats = _resumed(root, edited)
    assert stats["skips"] == 0 and stats["rows_skipped_on_request"] == 0
