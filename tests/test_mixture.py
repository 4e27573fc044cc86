"""Weighted mixtures (ingest.core.mixture): within one document (or the largest draw, in
tokens) of the weights at every prefix, the same choices after a resume, a new stage at the
exact count when the weights change, and a state of a few numbers per source."""

from __future__ import annotations

import json

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
