"""Interval sets against a plain Python set model (hypothesis)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.core.intervals import IntervalSet, runs

pairs = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=30)


def model(intervals: list[tuple[int, int]]) -> set[int]:
    return {v for s, n in intervals for v in range(s, s + n)}


@given(pairs)
def test_add_matches_set_model_and_stays_compact(items: list[tuple[int, int]]) -> None:
    iv = IntervalSet()
    for s, n in items:
        iv.add(s, s + n)
    expected = model(items)
    assert {v for s, e in iv for v in range(s, e)} == expected
    assert iv.count == len(expected)
    spans = list(iv)
    # Sorted, disjoint and not touching: the representation is canonical.
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))
    assert all(s < e for s, e in spans)


@given(pairs, st.integers(0, 250), st.integers(0, 250))
def test_queries_match_model(items: list[tuple[int, int]], a: int, b: int) -> None:
    iv = IntervalSet((s, s + n) for s, n in items)
    expected = model(items)
    lo, hi = min(a, b), max(a, b)
    assert iv.covers(lo, hi) == all(v in expected for v in range(lo, hi))
    gaps = {v for s, e in iv.gaps(lo, hi) for v in range(s, e)}
    assert gaps == {v for v in range(lo, hi) if v not in expected}
    first = iv.first_missing(lo)
    assert first not in expected and all(v in expected for v in range(lo, first))
    probe = np.arange(0, 260, dtype=np.int64)
    assert iv.contains_many(probe).tolist() == [int(v) in expected for v in probe]
    assert all((int(v) in iv) == (int(v) in expected) for v in probe)


@given(st.lists(st.integers(0, 300), max_size=200))
def test_add_rows_and_runs(rows: list[int]) -> None:
    arr = np.array(rows, dtype=np.int64)
    iv = IntervalSet()
    iv.add_rows(arr)
    assert {v for s, e in iv for v in range(s, e)} == set(rows)
    assert {v for s, e in runs(arr) for v in range(s, e)} == set(rows)


@given(pairs)
def test_json_round_trip(items: list[tuple[int, int]]) -> None:
    iv = IntervalSet((s, s + n) for s, n in items)
    assert IntervalSet.from_json(iv.to_json()) == iv


def test_a_fully_consumed_run_is_one_interval() -> None:
    iv = IntervalSet()
    for start in range(0, 10_000, 100):
        iv.add(start, start + 100)
    assert iv.to_json() == [[0, 10_000]]


@pytest.mark.parametrize("bad", [[[1]], [[1, "x"]], "nope", [[5, 2]], [[True, 5]], [[0, 5.0]]])
def test_from_json_rejects_malformed(bad: object) -> None:
    with pytest.raises(ValueError, match="interval"):
        IntervalSet.from_json(bad)


def test_rows_of_runs_gives_each_runs_rows_in_turn() -> None:
    from ingest.core.intervals import rows_of_runs

    assert rows_of_runs([10, 3, 7], [2, 0, 3]).tolist() == [10, 11, 7, 8, 9]
    assert rows_of_runs([], []).tolist() == []
    assert runs(rows_of_runs([5, 0], [2, 3])) == [(0, 3), (5, 7)]
