"""The reader pool's sizing rules (ingest.core.sizing): pure, no Ray."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest import Autoscale, ConfigError
from ingest.core.sizing import Measure, decide

RULES = Autoscale(target_wait=0.05, busy_load=0.5, idle_load=0.5, shrink_after_s=30)
NEVER = math.inf


def test_ranks_waiting_on_busy_readers_grow_the_pool_by_one() -> None:
    got = decide(2, 1, 8, Measure(3.0, 10.0, 1.9), RULES, NEVER)
    assert got.size == 3
    assert "30.0%" in got.reason and "target 5%" in got.reason


def test_the_pool_never_grows_past_max_size() -> None:
    got = decide(4, 1, 4, Measure(5.0, 10.0, 4.0), RULES, NEVER)
    assert got.size == 4 and "max_size 4" in got.reason


def test_ranks_waiting_on_idle_readers_do_not_grow_it() -> None:
    """The store, not the readers, is slow: more readers would not help."""
    got = decide(2, 1, 8, Measure(5.0, 10.0, 0.4), RULES, NEVER)
    assert got.size == 2 and "something else" in got.reason


def test_fed_ranks_and_idle_readers_shrink_it_by_one() -> None:
    got = decide(4, 1, 8, Measure(0.1, 10.0, 1.0), RULES, NEVER)
    assert got.size == 3 and "3 readers suffice" in got.reason
    assert "1 reader suffices" in decide(2, 1, 8, Measure(0, 10.0, 0.1), RULES, NEVER).reason


def test_it_keeps_its_size_while_fewer_readers_would_be_busy() -> None:
    """3 readers' worth of work: 3 readers would each be busy 100% > idle_load."""
    assert decide(4, 1, 8, Measure(0.1, 10.0, 3.0), RULES, NEVER).size == 4


def test_it_never_shrinks_below_min_size_nor_soon_after_growing() -> None:
    assert decide(2, 2, 8, Measure(0.0, 10.0, 0.0), RULES, NEVER).size == 2
    got = decide(4, 1, 8, Measure(0.0, 10.0, 0.0), RULES, 10.0)
    assert got.size == 4 and "grew 10 s ago" in got.reason
    assert decide(4, 1, 8, Measure(0.0, 10.0, 0.0), RULES, 30.0).size == 3


def test_a_wait_between_half_the_target_and_the_target_holds() -> None:
    """Hysteresis: readers busy enough that the wait may be theirs (one fewer would each be
    busy more than half of idle_load) hold their size."""
    assert decide(3, 1, 8, Measure(0.4, 10.0, 0.8), RULES, NEVER).size == 3


def test_nearly_idle_readers_shrink_though_the_ranks_wait_a_little() -> None:
    """On a loaded machine the ranks wait a little on everything (their own CPU, the calls
    that bring the batches): 3-8% of their time in a system test run under a load of 12,
    while 6 readers were 4% busy, and a pool that shrank only below half the target wait
    held its 6 readers (3 CPUs reserved) for a minute of that. Readers that one fewer would
    still leave nearly idle (at most half of idle_load each) are not what the ranks wait
    on: the pool shrinks by one, as it does not grow for waits on idle readers."""
    got = decide(6, 1, 6, Measure(0.45, 10.0, 0.24), RULES, NEVER)
    assert got.size == 5 and "5 readers suffice" in got.reason, got
    assert decide(2, 1, 6, Measure(0.45, 10.0, 0.24), RULES, NEVER).size == 1
    assert decide(3, 1, 8, Measure(0.4, 10.0, 0.0), RULES, NEVER).size == 2
    assert decide(6, 1, 6, Measure(0.45, 10.0, 0.24), RULES, 10.0).size == 6, "grew lately"


def test_nearly_idle_readers_shrink_whatever_the_ranks_wait() -> None:
    """A CI run of the system test (tests/test_pool_sizing.py) under load: its 2 ranks
    waited 6-24% of their time on a 2-core machine that other tests kept busy, whatever the
    pool's size: readers that one fewer would still leave nearly idle (at most half of
    idle_load each) are not what the ranks wait on, whatever they wait. Held there, a pool
    of idle readers kept its CPUs for as long as the machine stayed busy; it shrinks by one,
    as below the target."""
    got = decide(6, 1, 6, Measure(0.9, 10.0, 0.3), RULES, NEVER)
    assert got.size == 5 and "5 readers suffice" in got.reason, got
    assert decide(3, 1, 8, Measure(0.6, 10.0, 0.0), RULES, NEVER).size == 2
    assert decide(3, 1, 8, Measure(3.0, 10.0, 0.5), RULES, NEVER).size == 2
    # Idle, but not that idle: the ranks' wait may be theirs (no growth either: they are
    # not busy), the pool holds.
    held = decide(3, 1, 8, Measure(0.9, 10.0, 0.8), RULES, NEVER)
    assert held.size == 3 and "something else" in held.reason, held
    assert decide(6, 1, 6, Measure(0.9, 10.0, 0.3), RULES, 10.0).size == 6, "grew lately"


def test_no_report_no_decision() -> None:
    got = decide(3, 1, 8, Measure(0.0, 0.0, 0.0), RULES, NEVER)
    assert got.size == 3 and "no rank reported" in got.reason


@settings(max_examples=200, deadline=None)
@given(
    low=st.integers(1, 4),
    extra=st.integers(0, 4),
    at=st.integers(0, 8),
    waited=st.floats(0, 100),
    span=st.floats(0, 100),
    busy=st.floats(0, 1),
    since=st.floats(0, 100),
)
def test_a_decision_moves_one_step_within_the_bounds(
    low: int, extra: int, at: int, waited: float, span: float, busy: float, since: float
) -> None:
    high = low + extra
    size = min(max(at, low), high)
    got = decide(size, low, high, Measure(waited, span, busy * size), RULES, since).size
    assert low <= got <= high
    assert abs(got - size) <= 1
    load = busy * size
    if got > size:
        assert waited / span > RULES.target_wait and load >= RULES.busy_load * size
    if got < size:  # readers idle enough; nearly idle ones whatever the ranks wait
        assert since >= RULES.shrink_after_s and load <= RULES.idle_load * (size - 1)
        assert waited / span < RULES.target_wait / 2 or load <= RULES.idle_load * (size - 1) / 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_wait": 0},
        {"target_wait": 1.5},
        {"interval_s": 0},
        {"busy_load": 2},
        {"idle_load": -0.1},
        {"shrink_after_s": -1},
        {"start_timeout_s": 0},
    ],
)
def test_bad_settings_are_refused_by_name(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        Autoscale(**kwargs)
