"""States written by an earlier main load and resume exactly as they did then.

``tests/fixtures/states/make.py`` wrote each case: its options, the state after some batches
and what new streams delivered after loading it. A refactoring that changes what a state
means, or the order a loaded state resumes in, fails here. Two generations:

- Written at f5e380e (before the layers moved into folders): ``parquet_*``, ``jsonl_*``,
  ``dataloader_two_workers``, each with the ids two loops of a one-rank Stream delivered
  (``ids_after``). Two changes of order were made on purpose: since issue 31 the rows
  carried into an epoch lead its first window (finding 4), so an epoch that starts with
  carried rows comes in a new order; since issue 32 the first window of a share cut anew
  from a state taken inside windows holds the rest of each lane's unit consumed in part
  alone. Those cases keep the ids of before beside today's (``ids_after_at_f5e380e``,
  ``ids_after_at_2a54e22``), and the test checks the same rows, the same order up to that
  epoch, and today's order.
- Written for issue 33, item 3 (before the state nests one part per node) at the commit in
  each case's ``written_at``: 54d4ac5, and f047816 for the three added after it
  (``stream_mixed_packed_epoch_end_carried``, ``loader_mixed_plain_mid_epoch``,
  ``ray_mixed_plain_after_two_loops``; ingest as at 3a3368f, which changed only where a
  batch is placed): ``stream_*``, ``loader_*`` and ``ray_*``, taken from
  ``Stream``, ``DataLoader(num_workers=2)`` and ``RayStream`` (2 ranks): plain, packed
  (``Tokenize`` + ``Pack``) and mixed (``Mix`` of two sources), mid-epoch inside a shuffle
  window and at an epoch's end with carried rows, schema versions 2 to 6 (``versions``: the
  state's, and each source's part's; make.py's docstring says how each is made, 3 with the
  packed-listing threshold lowered). ``resumed`` holds, per transport and world size (the
  one it was taken at and, for DataLoader and Ray, another), what two loops of a new stream
  delivered after loading it: each row's id, or each packed sequence's pieces
  ``[doc, start token, stop token]``, with the source's name and epoch over a Mix; a Ray
  case one list per rank. The Ray cases are system tests (``-m system``; the session's Ray).
  One change of order was made on purpose: a state of 2 DataLoader workers, loaded into a
  loader of 2, goes on from their places (the uninterrupted run's batches) where it went
  through its stream's book of one rank and was shared anew: ``loader_mixed_plain_mid_epoch``
  on a loader of 2 was recorded again (its earlier items kept beside, under
  ``items_before_a_loaders_state_kept_its_places``; its state and other resumes unchanged).

Regenerate the second generation (never the first) from the repository root, then commit
``tests/fixtures/states``::

    .venv/bin/python -m tests.fixtures.states.make
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import ingest
from ingest.core.state import StreamState
from ingest.core.state.sources import SourcesState
from tests.fixtures.states import make
from tests.fixtures.states.make import DATA, HERE, MTIME

CASES = sorted((HERE / "cases").glob("*.json"))
SAVED = {p.stem: json.loads(p.read_text()) for p in CASES}
OLD = [name for name, saved in SAVED.items() if "resumed" not in saved]
NEW = [name for name, saved in SAVED.items() if "resumed" in saved]


@pytest.fixture(scope="module")
def data() -> Path:
    """The committed shards at the path the states name, with their recorded mtimes."""
    for src in (HERE / "data").rglob("*.*"):
        dst = DATA / src.relative_to(HERE / "data")
        if not (dst.exists() and filecmp.cmp(src, dst, shallow=False)):
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + f".{os.getpid()}")
            shutil.copyfile(src, tmp)
            tmp.replace(dst)
        os.utime(dst, (MTIME, MTIME))
    return DATA


def _stream(case: dict[str, Any]) -> ingest.Stream:
    options = dict(case["options"])
    if "read" in options:
        options["read"] = ingest.ReadOptions(**options["read"])
    return ingest.Stream(str(DATA / case["data"]), columns=["id"], **options)


def test_every_case_is_here() -> None:
    assert OLD == [
        "dataloader_two_workers",
        "jsonl_unindexed_skip_mid_epoch",
        "parquet_mid_epoch",
        "parquet_next_epoch_with_carry",
        "parquet_second_epoch",
    ]
    assert sorted(NEW) == sorted(make.CASES)


def test_the_cases_cover_every_version_transport_and_kind() -> None:
    versions = {v for name in NEW for v in SAVED[name]["versions"]}
    assert versions == {2, 3, 4, 5, 6}
    kinds = {
        (c["taken"]["transport"], "mixed" if c["mix"] else "packed" if c["pack"] else "plain")
        for c in (SAVED[name]["case"] for name in NEW)
    }
    # Every transport packed and mixed; plain from each (the f5e380e cases add more).
    assert {(t, k) for t in ("stream", "loader", "ray") for k in ("plain", "packed")} <= kinds
    assert {(t, "mixed") for t in ("stream", "loader", "ray")} <= kinds
    for name in NEW:
        saved = SAVED[name]
        assert make.versions(saved["state"]) == saved["versions"], name
        assert make.carried(saved["state"]) == ("_end_" in name), name
        if saved["case"]["taken"]["transport"] != "stream":
            worlds = {on["world_size"] for on in saved["resumed"]}
            assert len(worlds) > 1, f"{name}: resumed at one world size only"


@pytest.mark.parametrize("name", OLD)
def test_a_state_of_an_earlier_main_resumes_with_the_same_rows(data: Path, name: str) -> None:
    saved = SAVED[name]
    stream = _stream(saved["case"])
    stream.load_state_dict(saved["state"])
    loops = [[int(i) for b in stream for i in b["id"]] for _ in range(2)]
    ids = loops[0] + loops[1]
    assert ids == saved["ids_after"]
    epoch_starts = {0, len(loops[0])}  # where each of the two loops starts in ids_after
    # Orders changed on purpose, each kept as it was (``ids_after_at_<commit>``): the same
    # rows, and the same order up to the epoch whose first window changed.
    # - f5e380e, issue 31 (finding 4): the rows carried into an epoch lead its first window,
    #   so an epoch that starts with carried rows comes in another order.
    # - 2a54e22, issue 32: a share cut anew from a state taken inside windows (a DataLoader's
    #   two workers' state on one rank) gives its first window the rest of each lane's unit
    #   consumed in part alone (ingest.engine.lanes.unit_rest), not that and more.
    for key in sorted(k for k in saved if k.startswith("ids_after_at_")):
        earlier = saved[key]
        assert sorted(ids) == sorted(earlier), key
        changed = next(k for k, (a, b) in enumerate(zip(ids, earlier, strict=True)) if a != b)
        assert changed in epoch_starts, (key, changed)


def _resumes(ray: bool) -> list[Any]:
    out = []
    for name in NEW:
        for k, on in enumerate(SAVED[name]["resumed"]):
            if (on["transport"] == "ray") == ray:
                marks = [pytest.mark.system] if ray else []
                label = f"{name}-on-{on['transport']}-{on['world_size']}"
                out.append(pytest.param(name, k, marks=marks, id=label))
    return out


def _check_resume(name: str, k: int) -> None:
    saved = SAVED[name]
    on = saved["resumed"][k]
    got = json.loads(json.dumps(make.resume(saved["case"], saved["state"], on)))
    want = on["items"]
    if on["transport"] == "ray":
        assert len(got) == len(want) == on["world_size"]
        pairs = [(f"rank {r}", g, w) for r, (g, w) in enumerate(zip(got, want, strict=True))]
    else:
        pairs = [("", got, want)]
    for where, g, w in pairs:
        first = next(
            (n for n, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w))
        )
        assert g == w, (
            f"{name} on {on['transport']} x{on['world_size']} {where}: {len(g)} items, "
            f"{len(w)} recorded; item {first} is {g[first : first + 1]}, was {w[first : first + 1]}"
        )


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(("name", "k"), _resumes(ray=False))
def test_a_state_of_today_s_main_resumes_as_recorded(data: Path, name: str, k: int) -> None:
    _check_resume(name, k)


@pytest.mark.parametrize(("name", "k"), _resumes(ray=True))
def test_a_ray_state_of_today_s_main_resumes_as_recorded(
    data: Path, request: pytest.FixtureRequest, name: str, k: int
) -> None:
    request.getfixturevalue("ray_session")
    _check_resume(name, k)


@pytest.mark.parametrize("name", NEW)
def test_a_state_of_today_s_main_reads_as_its_versions(name: str) -> None:
    """Each state parses with the checks of its version (and its sources' parts theirs)."""
    state = SAVED[name]["state"]
    if "sources" in state:
        parts = SourcesState.from_json(state).parts
        assert list(parts) == list(SAVED[name]["case"]["mix"]["sources"])
    else:
        StreamState.from_json(state)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_a_loaded_state_is_saved_again_as_it_was(data: Path, path: Path) -> None:
    """A state loaded into a one-rank Stream and taken again before any batch is the same
    JSON as the loaded one in version 7's layout (:func:`as_version_7`: each node's part under
    its name; the listing packed as it was, under the threshold it was written with).

    A state of world size 2 (DataLoader, Ray) taken inside its epoch (a step past its
    first) too, its ranks' places kept: the stream gives back the state it loaded until a
    loop of its own begins (a DataLoader of 2 workers over it then goes on from them; it
    gave its own book's, the rest shared anew, and the loader's resume was not the
    uninterrupted run's: tests/test_loader.py). One at its epoch's first step, where no rank
    has a place, is shared anew into the one rank: the epoch's rest starts a new run of
    steps there, so only what it consumed and saw is the same. A shard's row count learnt by
    reading a JSONL shard (``dataset.shards[i][3]``) is not known to the new stream until it
    reads the shard again (a state of a new epoch, or of several ranks, lists anew): unknown
    (None) there, it must be the same where known.
    """
    saved = json.loads(path.read_text())
    if "resumed" in saved:
        stream = make.stream(saved["case"])

        def again() -> dict[str, Any]:
            stream.load_state_dict(saved["state"])
            return stream.state_dict()

        now = make._with_threshold(saved["case"], again)
    else:
        stream = _stream(saved["case"])
        stream.load_state_dict(saved["state"])
        now = stream.state_dict()
    stream.close()
    # Every state is written as version 7 now: the old one's parts, each node's under its name.
    assert set(make.versions(now)) == {ingest.STATE_VERSION}
    for part, was in _parts(now, as_version_7(saved["state"])):
        was = _unlearnt(part, _with_formats(part, was))
        inside = was["progress"]["step"] > was["progress"]["first_step"]
        if was["distributed"]["world_size"] == 1 or inside:
            assert part == was
            continue
        assert part["dataset"] == was["dataset"]
        for key in ("epoch", "step", "delivered", "dropped", "consumed"):
            assert part["progress"].get(key) == was["progress"].get(key), key
        assert part.get("pack") == was.get("pack")
        for key in ("carry", "owed"):
            assert part["distributed"].get(key) == was["distributed"].get(key), key
        assert part["distributed"]["world_size"] == 1
        assert part["progress"]["first_step"] == part["progress"]["step"]


def as_version_7(state: dict[str, Any]) -> dict[str, Any]:
    """An older state's JSON in version 7's layout, by hand (to compare what a stream writes
    after loading it): ``progress.tokens`` become the pack node's part, a mixture's
    ``drawn``, ``taken`` and ``mixture`` its mix part, every version 7."""
    if "sources" in state:
        mix = {k: state[k] for k in ("drawn", "taken", "mixture") if k in state}
        sources = {name: as_version_7(part) for name, part in state["sources"].items()}
        return {"version": 7, "sources": sources, "mix": state.get("mix", mix)}
    out = {**state, "version": 7, "progress": dict(state["progress"])}
    tokens = out["progress"].pop("tokens", None)
    if tokens:
        out["pack"] = {"tokens": tokens}
    return out


def test_an_older_state_in_version_7s_layout_loads_as_the_same_state() -> None:
    """The hand conversion above is the reader's: every fixture, converted, parses to the
    same state as the fixture itself (so the comparison above compares like with like)."""
    for name, saved in SAVED.items():
        old, new = saved["state"], as_version_7(saved["state"])
        if "sources" in old:
            a, b = SourcesState.from_json(old), SourcesState.from_json(new)
            assert (a.drawn, a.taken, a.mixture) == (b.drawn, b.taken, b.mixture), name
            pairs = [(a.parts[k], b.parts[k]) for k in a.parts]
        else:
            pairs = [(StreamState.from_json(old), StreamState.from_json(new))]
        for x, y in pairs:
            assert x.to_json() == y.to_json(), name


def _parts(now: dict[str, Any], was: dict[str, Any]) -> list[tuple[Any, Any]]:
    """The one-source states to compare: the states, or each source's part over a Mix."""
    if "sources" not in was:
        return [(now, was)]
    assert {k: v for k, v in now.items() if k != "sources"} == {
        k: v for k, v in was.items() if k != "sources"
    }
    assert list(now["sources"]) == list(was["sources"])
    return [(now["sources"][name], part) for name, part in was["sources"].items()]


def _with_formats(now: dict[str, Any], was: dict[str, Any]) -> dict[str, Any]:
    """``was`` with the formats ``now`` records of its shards, where ``was`` (a state saved
    before they were recorded) has none: a stream that lists anew records them."""
    formats = now["dataset"].get("formats")
    if formats is None or "formats" in was["dataset"]:
        return was
    return {**was, "dataset": {**was["dataset"], "formats": formats}}


def _unlearnt(now: dict[str, Any], was: dict[str, Any]) -> dict[str, Any]:
    """``was`` with the row counts ``now`` has not learnt yet (None) set to None."""
    shards = now["dataset"].get("shards")
    if shards is None:  # packed (version 3): counts in a column, compared whole
        return was
    rows = [
        [*w[:3], None if n[3] is None else w[3]]
        for w, n in zip(was["dataset"]["shards"], shards, strict=True)
    ]
    return {**was, "dataset": {**was["dataset"], "shards": rows}}
