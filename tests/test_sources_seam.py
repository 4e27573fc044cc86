"""The seam for several sources (ingest.core.state.sources, ingest.planner.sources): each
named source keeps its own listing, fingerprint and progress in the state.

:class:`Draw` below is the small implementation the seam is shown with: batches drawn from
named :class:`ingest.Stream` objects by weight, the next source a pure function of the
counts drawn so far (each source the furthest below its share), every source on its own
epochs. Stopped and resumed anywhere it goes on with exactly the draws of the uninterrupted
run, and every source delivers each of its rows once per epoch of its own.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import ingest
from ingest.core.errors import StateError
from ingest.core.state import SourcesState, StreamState, read_state
from ingest.planner.sources import SourcePlanners
from ingest.testing import Store, write_dataset

BATCH = 8
WEB_SHARDS, WEB_ROWS = 3, 40  # 120 rows: 15 batches an epoch
CODE_SHARDS, CODE_ROWS = 2, 12  # 24 rows: 3 batches an epoch, repeated in a new order
WEIGHTS = {"web": 0.75, "code": 0.25}
DRAWS = 40


class Draw:
    """Batches drawn from named streams by weight (the seam's small implementation).

    The source of draw ``n`` is the one furthest below its share of ``n + 1`` draws (ties in
    the given order): a pure function of ``(drawn, taken)``, so a state that keeps them resumes
    with the same choices, and every source stays within one draw of its weight at every
    prefix. A source whose epoch ends starts its next one (its own order, its own epochs).
    """

    def __init__(self, streams: dict[str, ingest.Stream], weights: dict[str, float]) -> None:
        self.streams = streams
        total = sum(weights.values())
        self.weights = {name: weights[name] / total for name in streams}
        self.planners = SourcePlanners({n: s.parts.planner for n, s in streams.items()})
        self.drawn = 0
        self.taken = dict.fromkeys(streams, 0)
        self._loops: dict[str, Iterator[dict[str, Any]]] = {}

    def choose(self) -> str:
        order = list(self.streams)
        return max(
            order,
            key=lambda n: (self.weights[n] * (self.drawn + 1) - self.taken[n], -order.index(n)),
        )

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        while True:
            name = self.choose()
            batch = self._next(name)
            self.drawn += 1
            self.taken[name] += 1
            yield name, batch

    def _next(self, name: str) -> dict[str, Any]:
        for _ in range(3):  # an epoch of this test's sources is never empty
            loop = self._loops.get(name)
            if loop is None:
                loop = self._loops[name] = iter(self.streams[name])
            batch = next(loop, None)
            if batch is not None:
                return batch
            del self._loops[name]  # the source's epoch ended: its next one
        raise AssertionError(f"source {name} gave no batch in three loops")

    def state_dict(self) -> dict[str, Any]:
        parts = {n: StreamState.from_json(s.state_dict()) for n, s in self.streams.items()}
        return SourcesState(parts, self.drawn, dict(self.taken)).to_json()

    def load_state_dict(self, data: Any) -> None:
        state = SourcesState.from_json(data)
        listings = self.planners.listings()  # every source listed once, side by side
        self.planners.check(state, listings)
        for name, stream in self.streams.items():
            stream.load_state_dict(state.parts[name], listing=listings[name])
        self._loops = {}
        self.drawn, self.taken = state.drawn, dict(state.taken)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()


@pytest.fixture
def sources(local: Store) -> dict[str, str]:
    write_dataset(local.fs, local.url("web"), "parquet", WEB_SHARDS, WEB_ROWS, row_group_rows=16)
    write_dataset(local.fs, local.url("code"), "jsonl", CODE_SHARDS, CODE_ROWS)
    return {"web": local.url("web"), "code": local.url("code")}


def _draw(urls: dict[str, str]) -> Draw:
    streams = {
        name: ingest.Stream(
            url, columns=["id"], batch_size=BATCH, shuffle_seed=3, shuffle_window=16
        )
        for name, url in urls.items()
    }
    return Draw(streams, WEIGHTS)


def _take(draw: Draw, n: int) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for name, batch in draw:
        out.append((name, tuple(batch["id"].tolist())))
        if len(out) == n:
            break
    return out


def _uninterrupted(urls: dict[str, str]) -> list[tuple[str, tuple[int, ...]]]:
    draw = _draw(urls)
    try:
        return _take(draw, DRAWS)
    finally:
        draw.close()


def test_each_source_on_its_own_epochs_keeps_its_weight_and_delivers_every_row_once(
    sources: dict[str, str],
) -> None:
    draws = _uninterrupted(sources)
    taken = Counter[str]()
    for n, (name, _) in enumerate(draws, start=1):
        taken[name] += 1
        for source, weight in WEIGHTS.items():
            assert abs(taken[source] - weight * n) <= 1, (n, dict(taken))
    assert taken == {"web": 30, "code": 10}
    for name, rows, per_epoch in (("web", WEB_SHARDS * WEB_ROWS, 15), ("code", 24, 3)):
        ids = [i for source, batch in draws if source == name for i in batch]
        epochs = [ids[k : k + per_epoch * BATCH] for k in range(0, len(ids), per_epoch * BATCH)]
        for epoch in epochs[:-1]:  # every whole epoch of the source: each row once
            assert sorted(epoch) == list(range(rows))
        assert len(set(epochs[-1])) == len(epochs[-1])
    code = [i for source, batch in draws if source == "code" for i in batch]
    assert code[:24] != code[24:48], "a small source repeats in a new seeded order"


@pytest.mark.parametrize("stops", [[1], [7, 20], [3, 16, 29]])
def test_a_draw_stopped_and_resumed_goes_on_with_the_uninterrupted_runs_draws(
    sources: dict[str, str], stops: list[int]
) -> None:
    expected = _uninterrupted(sources)
    got: list[tuple[str, tuple[int, ...]]] = []
    state: str | None = None
    for stop in [*stops, DRAWS]:
        draw = _draw(sources)  # a new process, as after a restart
        try:
            if state is not None:
                draw.load_state_dict(state)
            got += _take(draw, stop - len(got))
            state = json.dumps(draw.state_dict())
        finally:
            draw.close()
    assert got == expected and state is not None
    saved = json.loads(state)
    assert saved["version"] == 7 and list(saved["sources"]) == ["web", "code"]
    assert saved["mix"]["taken"] == {"web": 30, "code": 10} and saved["mix"]["drawn"] == DRAWS
    # Each source's part is a whole one-source state, with its own listing and fingerprint.
    assert (
        saved["sources"]["web"]["dataset"]["digest"]
        != saved["sources"]["code"]["dataset"]["digest"]
    )
    assert isinstance(read_state(saved["sources"]["code"]), StreamState)


def test_a_state_whose_source_changed_is_refused_naming_the_source(
    sources: dict[str, str], local: Store
) -> None:
    draw = _draw(sources)
    _take(draw, 5)
    state = draw.state_dict()
    draw.close()
    path = local.url("code") + "/part-00001.jsonl"
    with local.fs.open(path, "ab") as f:
        f.write(b'{"id": 999}\n')
    again = _draw(sources)
    with pytest.raises(StateError, match=r"source 'code'.*part-00001\.jsonl"):
        again.load_state_dict(state)
    again.close()


def test_a_state_of_other_sources_is_refused_naming_them(sources: dict[str, str]) -> None:
    draw = _draw(sources)
    _take(draw, 3)
    state = draw.state_dict()
    draw.close()
    only_web = _draw({"web": sources["web"]})
    with pytest.raises(StateError, match=r"gone: \['code'\]"):
        only_web.load_state_dict(state)
    only_web.close()


def test_a_one_source_state_is_read_as_before_and_not_taken_for_several(
    sources: dict[str, str],
) -> None:
    stream = ingest.Stream(sources["web"], columns=["id"], batch_size=BATCH)
    next(iter(stream))
    one = stream.state_dict()
    assert isinstance(read_state(one), StreamState)
    several = SourcesState({"web": StreamState.from_json(one)}, 1, {"web": 1}).to_json()
    assert isinstance(read_state(json.dumps(several)), SourcesState)
    with pytest.raises(StateError, match=r"several sources .*'web'"):
        stream.load_state_dict(several)
    with pytest.raises(StateError, match="not a state of several sources"):
        SourcesState.from_json(one)
    stream.close()


def _several(sources: dict[str, str]) -> dict[str, Any]:
    draw = _draw(sources)
    _take(draw, 6)
    state = draw.state_dict()
    draw.close()
    return state


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["mix"].update(drawn=s["mix"]["drawn"] + 1), "drawn is 7, but the items"),
        (lambda s: s["mix"]["taken"].pop("code"), "taken is"),
        (lambda s: s.update(drawn=6), "it holds version, sources and the mix part"),
        (lambda s: s.update(sources={}), "names at least one"),
        (
            lambda s: s["sources"].update(web={"version": 9}),
            "source 'web' of the state: state version 9",
        ),
        (
            lambda s: s["sources"]["code"]["progress"].update(step=-1),
            "source 'code' of the state: progress.step",
        ),
        (lambda s: s["sources"].update(web={"sources": {}, "version": 4}), "they nest once"),
        (lambda s: s["mix"].update(taken=[1, 2]), "taken is"),
    ],
)
def test_an_edited_state_of_several_sources_is_refused_naming_the_field(
    sources: dict[str, str], edit: Any, message: str
) -> None:
    state = _several(sources)
    edit(state)
    with pytest.raises(StateError, match=message):
        SourcesState.from_json(state)


def test_a_source_that_cannot_be_listed_is_named(sources: dict[str, str], local: Store) -> None:
    draw = _draw(sources)
    state = draw.state_dict()
    for name in local.fs.ls(local.url("code")):
        local.fs.rm(name)
    with pytest.raises(ingest.IngestError) as got:
        draw.load_state_dict(state)
    assert "while listing source 'code' of the stream" in (got.value.__notes__ or [])
    draw.close()
