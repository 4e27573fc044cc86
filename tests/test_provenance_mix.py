"""Provenance over a mixture (issue 35 with ingest.Mix): each source's stream keeps its own
log at ``URL/sources/<name>``, the mixture logs which source step each slot of its batches
was, and ``which_mixed`` answers, for every mixed step and rank, the rows the ranks received
at the time, across stops, resumes and world-size changes (Stream, and RayStream 2 -> 3 -> a
Stream). A skip of mixed steps leaves their rows out of every source after a resume and every
other row once.

Two Parquet sources ``a`` and ``b`` whose ids are ``shard * rows + row`` of their own
listing; a batch's ``source`` tensor names each row's source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pytest
import ray

import ingest
from ingest.engine.mix_provenance import MixedLog, skip_mixed, which_mixed
from ingest.testing import Store, write_dataset
from tests.test_mix import CORPORA, write_corpora
from tests.test_pack_stream import tokenize

NAMES = ("a", "b")
SHARDS, ROWS, BATCH = 2, 120, 6

SEQ_LEN, READ_ROWS, PACK_BATCH = 64, 16, 4
MIX_NAMES = list(CORPORA)

Draw = tuple[str, int]
"""A slot of a mixed batch: its source and its row's id."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("provmix")
    fs = fsspec.filesystem("file")
    return {
        name: sorted(write_dataset(fs, str(root / name), "parquet", SHARDS, ROWS)) for name in NAMES
    }


def mix(data: Mapping[str, list[str]]) -> ingest.Mix:
    return ingest.Mix(dict(data), weights={"a": 2, "b": 1})


def make(data: Mapping[str, list[str]], log: str) -> ingest.Stream:
    return ingest.Stream(
        mix(data), columns=["id"], batch_size=BATCH, shuffle_seed=4, shuffle_window=64,
        provenance=log,
    )  # fmt: skip


def drawn(batch: Mapping[str, Any]) -> list[Draw]:
    return [
        (NAMES[s], int(i))
        for s, i in zip(batch["source"].tolist(), batch["id"].tolist(), strict=True)
    ]


def answer(table: pa.Table, data: Mapping[str, list[str]]) -> dict[tuple[int, int], list[Draw]]:
    """``(rank, mixed step)`` -> the draws ``which_mixed`` names, slot by slot."""
    shard = {name: {u: i for i, u in enumerate(urls)} for name, urls in data.items()}
    out: dict[tuple[int, int], list[Draw]] = {}
    for r in table.to_pylist():
        base = shard[r["source"]][r["url"].removeprefix("file://")] * ROWS
        out.setdefault((r["rank"], r["step"]), []).extend(
            (r["source"], base + row) for row in range(r["start"], r["stop"])
        )
    return out


def test_a_mixed_stream_logs_each_slot_through_a_rolled_back_stop(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    first = make(data, log)
    it = iter(first)
    seen: dict[tuple[int, int], list[Draw]] = {}
    for step in range(12):
        seen[(0, step)] = drawn(next(it))
        if step == 5:
            state = first.state_dict()
    first.state_dict()  # steps 6..11 logged; then the run died and resumes from step 5
    resumed = make(data, log)
    resumed.load_state_dict(state)
    for k, batch in enumerate(resumed):  # the rest of the mixture's epoch
        seen[(0, 6 + k)] = drawn(batch)
    resumed.state_dict()
    table = ingest.which(log, range(len(seen)))  # a mixture's log: which_mixed
    assert answer(table, data) == seen  # the second attempt's steps 6..11 count
    assert table.column_names[:5] == ["step", "rank", "slot", "source", "source_step"]
    assert table.filter(pa.compute.equal(table["step"], 0))["slot"].to_pylist() == list(
        range(BATCH)
    )
    # each source's own log is there, its steps its draws
    own = ingest.which(
        f"{log}/sources/a",
        table.filter(pa.compute.equal(table["source"], "a"))["source_step"].to_pylist(),
    )
    assert own.num_rows == sum(1 for v in seen.values() for s, _ in v if s == "a")


def test_which_for_a_step_not_logged_is_empty_and_a_missing_log_names_the_fix(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    stream = make(data, log)
    next(iter(stream))
    stream.state_dict()
    assert which_mixed(log, [0]).num_rows == BATCH
    assert which_mixed(log, [99]).num_rows == 0
    with pytest.raises(ingest.ProvenanceError, match="no attempt is recorded"):
        which_mixed(str(tmp_path / "elsewhere"), [0])


def test_a_dataloader_over_a_logged_mixture_is_refused_naming_the_fix(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    with pytest.raises(ingest.ConfigError, match=r"ingest.Stream\(mix, provenance=...\)"):
        ingest.DataLoader(make(data, str(tmp_path / "log")), num_workers=1)


# -- Ray: 2 -> 3 ranks, then a Stream ---------------------------------------------------------


@ray.remote(num_cpus=0)
def _rank(
    it: Any, first: int, stop_after: int, record: Callable[[Any], list[Any]] = drawn
) -> tuple[dict[int, list[Any]], Any]:
    """A rank's slots (``record`` of each batch) by mixed step until ``stop_after`` batches,
    and its state there; two more batches are logged after it (then the run dies: a resume
    rolls them back)."""
    seen: dict[int, list[Any]] = {}
    state = None
    for k, batch in enumerate(it):
        if state is not None:
            if k == stop_after + 2:
                break
            continue
        seen[first + k] = record(batch)
        if len(seen) == stop_after:
            state = it.state_dict()
    it.flush()
    return seen, state


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_ray_ranks_at_2_then_3_then_a_stream_each_slot_as_received(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    seen: dict[tuple[int, int], list[Draw]] = {}
    state: dict[str, Any] | None = None
    for world, stop_after in ((2, 4), (3, 3)):
        with ingest.RayStream(
            mix(data), columns=["id"], batch_size=BATCH, shuffle_seed=4, shuffle_window=64,
            world_size=world, provenance=log,
        ) as stream:  # fmt: skip
            if state is not None:
                stream.load_state_dict(state)
            first = 0 if state is None else state["mix"]["drawn"] // BATCH
            got = ray.get(
                [_rank.remote(stream.rank_iterator(r), first, stop_after) for r in range(world)],
                timeout=240,
            )
        for rank, (steps, _) in enumerate(got):
            for step, draws in steps.items():
                seen[(rank, step)] = draws
        state = got[0][1]
    assert state is not None
    last = make(data, log)  # and the rest of the mixture's epoch in one process
    last.load_state_dict(state)
    first = state["mix"]["drawn"] // BATCH
    for k, batch in enumerate(last):
        seen[(0, first + k)] = drawn(batch)
    last.state_dict()
    assert answer(which_mixed(log, {s for _, s in seen}), data) == seen
    assert [a.world_size for a in MixedLog(log).attempts()] == [2, 3, 1]
    # ranks 1 and 2 logged steps 7..9 before the stop rolled them back: none of theirs now
    assert set(which_mixed(log, 7)["rank"].to_pylist()) == {0}


# -- skips -------------------------------------------------------------------------------------


def test_skipped_mixed_steps_stay_out_of_every_source_and_the_rest_comes_once(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    first = make(data, log)
    it = iter(first)
    head: list[Draw] = []
    spiked: list[Draw] = []
    for step in range(20):
        batch = drawn(next(it))
        if step <= 8:
            head += batch
        if step == 8:
            state = first.state_dict()
        if 11 <= step <= 14:
            spiked += batch
    first.state_dict()  # the run logged steps 9..19, then the loss spiked at 11..14
    edited = ingest.skip(state, steps=range(11, 15), provenance=log)
    assert edited == skip_mixed(state, steps=range(11, 15), provenance=log)
    assert {k: v for k, v in edited.items() if k != "sources"} == {
        k: v for k, v in state.items() if k != "sources"
    }
    for name in NAMES:
        records = edited["sources"][name]["progress"]["quarantined"]
        assert [q["reason"] for q in records] == [
            f"skipped on request: mixed steps 11..14 (source {name})"
        ]
    resumed = make(data, log)
    resumed.load_state_dict(edited)
    after: list[Draw] = []
    for got in resumed:  # the rest of the mixture's epoch: every source ends one of its own
        epochs = got["source_epoch"].tolist()
        after += [d for d, e in zip(drawn(got), epochs, strict=True) if e == 0]
    assert not set(after) & set(spiked)
    delivered = head + after
    assert len(delivered) == len(set(delivered))
    every = {(name, i) for name in NAMES for i in range(SHARDS * ROWS)}
    assert set(delivered) == every - set(spiked)
    assert resumed.stats["rows_skipped_on_request"] == len(spiked)


def test_a_skip_reaching_into_a_sources_next_epoch_waits_for_it(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    """Mixed steps whose draws of source a are of a's second epoch (a is drawn twice as
    often) and of b's first: b's part leaves them out now, a's when a's book plans it."""
    log = str(tmp_path / "log")
    first = make(data, log)
    it = iter(first)
    tagged: list[tuple[Draw, int]] = []  # each draw with its source's epoch
    for step in range(70):
        got = next(it)
        tagged += zip(drawn(got), got["source_epoch"].tolist(), strict=True)
        if step == 8:
            state = first.state_dict()
    first.state_dict()
    spiked = tagged[64 * BATCH : 67 * BATCH]  # steps 64..66
    assert {(d[0], e) for d, e in spiked} == {("a", 1), ("b", 0)}
    edited = ingest.skip(state, steps=range(64, 67), provenance=log)
    assert edited["sources"]["a"]["progress"]["skip_ahead"][0]["epoch"] == 1
    assert "skip_ahead" not in edited["sources"]["b"]["progress"]
    resumed = make(data, log)
    resumed.load_state_dict(edited)
    after = tagged[: 9 * BATCH]
    for got in resumed:  # b's first epoch, and a's first two
        after += zip(drawn(got), got["source_epoch"].tolist(), strict=True)
    every = {(name, i) for name in NAMES for i in range(SHARDS * ROWS)}
    for name, epoch in (("a", 0), ("a", 1), ("b", 0)):
        mine = [d for d, e in after if (d[0], e) == (name, epoch)]
        assert len(mine) == len(set(mine))
        left = {d for d, e in spiked if (d[0], e) == (name, epoch)}
        assert set(mine) == {d for d in every if d[0] == name} - left
    assert resumed.stats["rows_skipped_on_request"] == len(spiked)


def test_a_one_source_skip_of_a_mixtures_state_names_what_to_do(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    stream = make(data, log)
    next(iter(stream))
    state = stream.state_dict()
    with pytest.raises(ingest.ProvenanceError, match="without a log"):
        skip_mixed(state, steps=[3])
    with pytest.raises(ingest.ProvenanceError, match="not reached yet"):
        skip_mixed(state, steps=[40], provenance=log)
    with pytest.raises(ingest.StateError, match="not a mixture's"):
        skip_mixed(state["sources"]["a"], steps=[0], provenance=log)


# -- packed sources: a draw is a sequence -------------------------------------------------------

Seq = tuple[str, list[int]]
"""A slot of a packed mixed batch: its source and its real tokens."""


def packed(urls: Mapping[str, str], store: Store, log: str, **options: Any) -> Any:
    """``ingest.Stream`` (or, with ``world_size``, ``ingest.RayStream``) over the corpora of
    ``tests.test_mix``, packed."""
    keywords: dict[str, Any] = {
        "batch_size": PACK_BATCH,
        "transform": ingest.Tokenize(tokenize),
        "pack": ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=8, pad_id=0),
        "shuffle_seed": 1,
        "shuffle_window": 48,
        "storage_options": store.storage_options,
        "provenance": log,
    }
    the_mix = ingest.Mix(urls, weights={"web": 3, "code": 1})
    if "world_size" in options:
        return ingest.RayStream(the_mix, **keywords, **options)
    return ingest.Stream(the_mix, **keywords)


def sequences(batch: Mapping[str, Any]) -> list[Seq]:
    return [
        (MIX_NAMES[s], [t for t in seq if t])
        for s, seq in zip(batch["source"].tolist(), batch["input_ids"].tolist(), strict=True)
    ]


def tokens_named(table: pa.Table) -> dict[tuple[int, int], list[Seq]]:
    """``(rank, mixed step)`` -> each slot's source and the tokens its pieces name (document
    ``first + shard * half + row`` of its corpus, token ``j`` is ``d * 10_000 + j + 1``)."""
    slots: dict[tuple[int, int], dict[int, Seq]] = {}
    for r in table.to_pylist():
        first, count = CORPORA[r["source"]]
        shard = int(r["url"].rsplit("part-", 1)[1].split(".")[0])
        d = first + shard * (count // 2) + r["start"]
        slot = slots.setdefault((r["rank"], r["step"]), {}).setdefault(r["slot"], (r["source"], []))
        slot[1].extend(d * 10_000 + j + 1 for j in range(r["token_start"], r["token_stop"]))
    return {k: [v[s] for s in sorted(v)] for k, v in slots.items()}


def test_packed_sources_name_every_piece_of_every_slot_through_a_rolled_back_stop(
    local: Store, tmp_path: Path
) -> None:
    urls = write_corpora(local)
    log = str(tmp_path / "log")
    first = packed(urls, local, log)
    it = iter(first)
    seen: dict[tuple[int, int], list[Seq]] = {}
    for step in range(10):
        seen[(0, step)] = sequences(next(it))
        if step == 4:
            state = first.state_dict()
    first.state_dict()  # steps 5..9 logged; then the run died and resumes from step 4
    resumed = packed(urls, local, log)
    resumed.load_state_dict(state)
    for k, batch in enumerate(resumed):
        seen[(0, 5 + k)] = sequences(batch)
    resumed.state_dict()
    table = ingest.which(log, range(len(seen)))
    assert {"sequence", "token_start", "token_stop"} <= set(table.column_names)
    assert tokens_named(table) == seen


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_packed_sources_on_ray_through_three_stops_at_world_sizes_3_2_4(
    local: Store, tmp_path: Path
) -> None:
    """Issue 35's goal: a run with three stops at world sizes 3 -> 2 -> 4 (each stop's
    later steps logged, then rolled back by the resume), packing and a two-source mixture:
    which() names every piece of every slot of every step each rank received, token by
    token (that each token comes once per epoch of its source through such stops is
    test_mix_ray's)."""
    urls = write_corpora(local)
    log = str(tmp_path / "log")
    seen: dict[tuple[int, int], list[Seq]] = {}
    state: dict[str, Any] | None = None
    for world, stop_after in ((3, 2), (2, 2), (4, 2), (4, None)):
        with packed(urls, local, log, world_size=world, timeout_s=120) as stream:
            if state is not None:
                stream.load_state_dict(state)
            first = 0 if state is None else state["mix"]["drawn"] // PACK_BATCH
            got = ray.get(
                [
                    _rank.remote(stream.rank_iterator(r), first, stop_after, sequences)
                    for r in range(world)
                ],
                timeout=240,
            )
        for rank, (steps, _) in enumerate(got):
            for step, slots in steps.items():
                seen[(rank, step)] = slots
        state = got[0][1] if stop_after is not None else state
    assert len({s for _, s in seen}) > 8  # past the three stops, to the mixture's end
    assert tokens_named(ingest.which(log, {s for _, s in seen})) == seen


def test_replay_of_mixed_steps_gives_each_slot_again_from_its_source(
    local: Store, tmp_path: Path
) -> None:
    """Replay over a mixture: every slot of the steps read again from its source (only the
    rows its source step consumed, packed again) and joined as the mixed batch was, every
    tensor the same (the source and its epoch too)."""
    urls = write_corpora(local)
    log = str(tmp_path / "log")
    run = packed(urls, local, log)
    batches = [b for _, b in zip(range(7), run, strict=False)]
    run.close()
    again = list(packed(urls, local, log).replay(range(3, 7)))
    assert [(step, rank) for step, rank, _ in again] == [(s, 0) for s in range(3, 7)]
    for (step, _, got), want in zip(again, batches[3:], strict=True):
        assert set(got) == set(want), step
        for name, value in want.items():
            assert (got[name] == value).all() if hasattr(value, "shape") else got[name] == value


def test_replay_of_a_plain_mixture_gives_each_slots_row_again(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    log = str(tmp_path / "log")
    run = make(data, log)
    batches = [drawn(b) for _, b in zip(range(5), run, strict=False)]
    run.close()
    again = [drawn(b) for _, _, b in make(data, log).replay(range(1, 5))]
    assert again == batches[1:]


def test_a_resume_with_another_batch_size_goes_on_from_the_mixed_steps_taken(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    """Mixed steps are the batches handed out since the run began, kept in the state: a
    resume with another batch size numbers its first batch after the state's last, and the
    steps before the state stay the first run's."""
    log = str(tmp_path / "log")
    first = make(data, log)
    it = iter(first)
    seen = {}
    for step in range(5):
        seen[(0, step)] = drawn(next(it))
    state = first.state_dict()
    next(it)  # a step after the state, rolled back by the resume
    first.close()
    assert state["mix"]["mixture"]["steps"] == 5
    resumed = ingest.Stream(
        mix(data), columns=["id"], batch_size=4, shuffle_seed=4, shuffle_window=64,
        provenance=log,
    )  # fmt: skip
    resumed.load_state_dict(state)
    again = iter(resumed)
    for step in range(5, 8):
        seen[(0, step)] = drawn(next(again))
    resumed.close()
    assert answer(which_mixed(log, range(8)), data) == seen
