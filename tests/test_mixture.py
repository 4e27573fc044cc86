"""Weighted mixtures (ingest.core.mixture): within one document (or the largest draw, in
tokens) of the weights at every prefix, the same choices after a resume, a new stage at the
exact count when the weights change, and a state of a few numbers per source."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ingest.core.errors import ConfigError, StateError
from ingest.core.mixture import Mixture

weight_lists = st.lists(st.integers(1, 20), min_size=1, max_size=6)


def names(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


@given(weights=weight_lists, draws=st.integers(1, 400), seed=st.integers(0, 3))
@example(weights=[1, 1, 7, 7, 7, 3], draws=15, seed=0)  # Megatron's rule: 1.04 documents off
def test_in_documents_every_prefix_is_within_one_document(
    weights: list[int], draws: int, seed: int
) -> None:
    mix = Mixture(dict(zip(names(len(weights)), weights, strict=True)), seed=seed)
    worst = 0.0
    for _ in range(draws):
        mix.record(mix.choose())
        worst = max(worst, *(abs(d) for d in mix.deviation().values()))
    assert worst < 1.0


@given(
    weights=weight_lists,
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=300),
    seed=st.integers(0, 3),
)
def test_in_tokens_every_prefix_is_within_the_largest_draw(
    weights: list[int], sizes: list[int], seed: int
) -> None:
    """Each source's draws have their own sizes (documents cut at seq_len = 64 first)."""
    mix = Mixture(
        dict(zip(names(len(weights)), weights, strict=True)),
        unit="tokens",
        max_draw=max(sizes),
        seed=seed,
    )
    rng = np.random.default_rng(seed)
    for _ in range(len(sizes)):
        name = mix.choose()
        mix.record(name, int(rng.choice(sizes)))
        assert max(abs(d) for d in mix.deviation().values()) <= max(sizes)


@given(weights=weight_lists, stop=st.integers(0, 200), seed=st.integers(0, 3))
def test_a_resumed_mixture_makes_the_uninterrupted_runs_choices(
    weights: list[int], stop: int, seed: int
) -> None:
    w = dict(zip(names(len(weights)), weights, strict=True))
    schedule = [(150, dict(reversed(list(w.items()))))]
    whole = Mixture(w, seed=seed, schedule=schedule)
    ran = []
    for _ in range(300):
        ran.append(whole.choose())
        whole.record(ran[-1])
    first = Mixture(w, seed=seed, schedule=schedule)
    got = []
    for _ in range(stop):
        got.append(first.choose())
        first.record(got[-1])
    state = json.loads(json.dumps(first.state_dict()))
    second = Mixture(w, seed=seed, schedule=schedule)
    second.load_state_dict(state)
    for _ in range(300 - stop):
        got.append(second.choose())
        second.record(got[-1])
    assert got == ran


def test_new_weights_at_a_resume_begin_a_stage_at_the_exact_count() -> None:
    first = Mixture({"web": 3, "code": 1})
    for _ in range(100):
        first.record(first.choose())
    assert first.counts == {"web": 75, "code": 25}
    state = first.state_dict()
    second = Mixture({"web": 1, "code": 1})
    second.load_state_dict(state)
    assert (
        second.total == 100 and second.stage.start == 100 and second.counts == {"web": 0, "code": 0}
    )
    for _ in range(60):
        second.record(second.choose())
        assert max(abs(d) for d in second.deviation().values()) <= 1
    assert second.counts == {"web": 30, "code": 30}
    # Saved again and resumed with the same new weights: the stage goes on, counts kept.
    third = Mixture({"web": 1, "code": 1})
    third.load_state_dict(second.state_dict())
    assert third.stage.start == 100 and third.counts == {"web": 30, "code": 30}
    assert [s.start for s in third.stages] == [0, 100]


def test_a_schedule_changes_the_weights_at_its_counts() -> None:
    mix = Mixture(
        {"a": 1, "b": 0}, unit="tokens", max_draw=100, schedule=[(1000, {"a": 0, "b": 1})]
    )
    while mix.total < 1000:
        assert mix.choose() == "a"
        mix.record("a", 100)
    assert mix.stage.start == 1000 and mix.choose() == "b"


def test_the_state_is_a_few_numbers_per_source() -> None:
    sizes = {}
    for n in (2, 16, 128):
        mix = Mixture(dict.fromkeys(names(n), 1.0), unit="tokens", max_draw=2048)
        for _ in range(1000):
            mix.record(mix.choose(), 2048)
        sizes[n] = len(json.dumps(mix.state_dict()))
    assert sizes[128] < 64 * 128 and sizes[16] < 64 * 16  # no history, whatever the length


def test_bad_mixtures_and_states_are_refused() -> None:
    with pytest.raises(ConfigError, match="not all 0"):
        Mixture({"a": 0, "b": 0})
    with pytest.raises(ConfigError, match=r"weights name \['c'\]"):
        Mixture({"a": 1}, schedule=[(10, {"c": 1})])
    with pytest.raises(ConfigError, match="does not come after"):
        Mixture({"a": 1}, schedule=[(0, {"a": 1})])
    with pytest.raises(ConfigError, match="records 1 a draw"):
        Mixture({"a": 1}).record("a", 5)
    state = Mixture({"a": 1, "b": 1}).state_dict()
    with pytest.raises(StateError, match="names"):
        Mixture({"a": 1, "c": 1}).load_state_dict(state)
    with pytest.raises(StateError, match="unit"):
        Mixture({"a": 1, "b": 1}, unit="tokens", max_draw=8).load_state_dict(state)
    with pytest.raises(ConfigError, match="needs max_draw"):
        Mixture({"a": 1}, unit="tokens")
    with pytest.raises(ConfigError, match="more than max_draw=8"):
        Mixture({"a": 1}, unit="tokens", max_draw=8).record("a", 9)


def test_a_schedule_stage_must_weigh_every_source() -> None:
    """A stage leaving a source out gave it weight 0 silently (issue 31, finding 6)."""
    with pytest.raises(
        ConfigError,
        match=r"the schedule's stage at 100: weights \{'a': 1\} give no weight to \['b'\]: "
        r"give every source .* a weight \(0 to leave one out\)",
    ):
        Mixture({"a": 1, "b": 1}, schedule=[(100, {"a": 1})])
    mix = Mixture({"a": 1, "b": 1}, schedule=[(4, {"a": 1, "b": 0})])  # 0 said: taken
    assert mix.stages[1].weights == (1.0, 0.0)


@pytest.mark.parametrize(
    ("weights", "schedule", "message"),
    [
        (
            {"a": "x", "b": 1},
            (),
            r"mixture weights: 'a' has weight 'x' \(str\); a weight is a number",
        ),
        ({"a": True, "b": 1}, (), r"'a' has weight True \(bool\)"),
        ({"a": None, "b": 1}, (), r"'a' has weight None"),
        (
            {"a": 1, "b": 1},
            [(float("nan"), {"a": 1, "b": 1})],
            r"stage at nan must begin at a global count",
        ),
        (
            {"a": 1, "b": 1},
            [(10.5, {"a": 1, "b": 1})],
            r"stage at 10\.5 must begin at a global count",
        ),
        ({"a": 1, "b": 1}, [(-5, {"a": 1, "b": 1})], r"stage at -5 must begin at a global count"),
        (
            {"a": 1, "b": 1},
            [(10, {"a": float("nan"), "b": 1})],
            r"stage at 10: weights .* must be finite",
        ),
        (
            {"a": 1, "b": 1},
            [(10, [0.5, 0.5])],
            r"stage at 10: weights \[0\.5, 0\.5\] must be a dict",
        ),
        ({"a": 1, "b": 1}, [10], r"schedule entry 10 must be a pair"),
    ],
    ids=[
        "str",
        "bool",
        "None",
        "nan-start",
        "float-start",
        "negative-start",
        "nan-weight",
        "list-weights",
        "no-pair",
    ],
)
def test_weights_and_schedules_that_are_not_numbers_are_refused(
    weights: dict[str, Any], schedule: Any, message: str
) -> None:
    """A weight "x" was a bare ValueError; a stage at NaN passed the order check (NaN
    compares false) and failed in int()."""
    with pytest.raises(ConfigError, match=message):
        Mixture(weights, schedule=schedule)


def _edited(**changes: Any) -> dict[str, Any]:
    mix = Mixture({"a": 1, "b": 1}, schedule=[(10, {"a": 1, "b": 3})])
    for _ in range(12):
        mix.record(mix.choose())
    state: dict[str, Any] = json.loads(json.dumps(mix.state_dict()))
    for key, value in changes.items():
        if value is _GONE:
            del state[key]
        else:
            state[key] = value
    return state


_GONE = object()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"stage": 7}, r"stage 7: the stage reached is a position in its 2 stages"),
        ({"stage": -1}, r"stage -1"),
        ({"stage": "1"}, r"stage '1'"),
        ({"counts": [1]}, r"counts \[1\]: one whole number >= 0 per source \(2\)"),
        ({"counts": [1, -3]}, r"counts \[1, -3\]"),
        ({"counts": [1, 2.5]}, r"counts \[1, 2\.5\]"),
        ({"total": -100}, r"total -100: the draws counted since the start are a whole number"),
        ({"total": 5}, r"stage 1: its stage begins at 10, after total 5"),
        ({"stages": _GONE}, r"stages '\(missing\)'"),
        ({"stages": []}, r"stages \[\]"),
        ({"stages": [{"start": 0, "weights": [1.0]}]}, r"stages .*2 numbers >= 0"),
        (
            {"stages": [{"start": 0, "weights": [1, 1]}, {"start": 0, "weights": [1, 1]}]},
            r"stages .*a count after the last one's",
        ),
        ({"total": _GONE}, r"total '\(missing\)'"),
    ],
    ids=[
        "stage-7",
        "stage-negative",
        "stage-str",
        "counts-short",
        "counts-negative",
        "counts-float",
        "total-negative",
        "total-before-stage",
        "stages-removed",
        "stages-empty",
        "weights-short",
        "stages-unordered",
        "total-removed",
    ],
)
def test_an_edited_mixture_state_is_refused_naming_its_field(
    changes: dict[str, Any], message: str
) -> None:
    """These were bare IndexError, ValueError or KeyError; negative counts were taken."""
    state = _edited(**changes)
    with pytest.raises(StateError, match=rf"the state's mixture has {message}"):
        Mixture({"a": 1, "b": 1}, schedule=[(10, {"a": 1, "b": 3})]).load_state_dict(state)
    Mixture({"a": 1, "b": 1}, schedule=[(10, {"a": 1, "b": 3})]).load_state_dict(_edited())
