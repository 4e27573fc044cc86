"""The stage seam (ingest.engine.stage): transforms that filter or split rows, with each
output row mapped to its input row (and part), exact across stops, resumes and world sizes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import ingest
from ingest.testing import Store, write_dataset

SHARDS, ROWS, BATCH = 4, 61, 16
"""244 rows: 15 batches, and 4 rows carried into the next epoch."""


class KeepEven(ingest.Stage):
    """A filter: the rows of even id."""

    def __call__(self, table: pa.Table) -> ingest.Staged:
        keep = np.flatnonzero(pc.equal(pc.bit_wise_and(table["id"], 1), 0).to_numpy())
        return ingest.Staged(table.take(pa.array(keep)), keep.astype(np.int64))


class Halves(ingest.Stage):
    """One-to-many: each row of id ``i`` becomes two, its parts ``[0, 1)`` and ``[1, 2)``."""

    def __call__(self, table: pa.Table) -> ingest.Staged:
        n = table.num_rows
        origin = np.repeat(np.arange(n, dtype=np.int64), 2)
        part = np.stack([np.tile([0, 1], n), np.tile([1, 2], n)], axis=1).astype(np.int64)
        ids = table["id"].to_numpy()[origin]
        return ingest.Staged(pa.table({"id": ids, "part": part[:, 0]}), origin, part)


def _even_ids(table: pa.Table) -> Any:
    return pc.equal(pc.bit_wise_and(table["id"], 1), 0)


def _halves(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"id": row["id"], "part": 0}, {"id": row["id"], "part": 1}]


# The library's helpers, each the same stage as a class above: a table predicate, a per-row
# predicate, and a per-row one-to-many function.
FILTER = ingest.Filter(_even_ids)
FILTER_ROWS = ingest.Filter(lambda row: row["id"] % 2 == 0, per_row=True)
FLAT_MAP = ingest.FlatMap(_halves)
FILTERS = (KeepEven, FILTER, FILTER_ROWS)


@pytest.fixture
def data(local: Store) -> str:
    write_dataset(local.fs, local.url("d"), "parquet", SHARDS, ROWS, row_group_rows=15)
    return local.url("d")


def _stream(url: str, stage: Any, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        url,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=5,
        shuffle_window=32,
        transform=stage,
        **options,
    )


def _outputs(batch: dict[str, Any]) -> list[tuple[int, int]]:
    ids = batch["id"].tolist()
    parts = batch["part"].tolist() if "part" in batch else [0] * len(ids)
    return list(zip(ids, parts, strict=True))


def _expected(stage: Any) -> Counter[tuple[int, int]]:
    ids = range(SHARDS * ROWS)
    if any(stage is f for f in FILTERS):
        return Counter((i, 0) for i in ids if i % 2 == 0)
    return Counter((i, p) for i in ids for p in (0, 1))


@pytest.mark.parametrize(
    "stage",
    [KeepEven, Halves, FILTER, FILTER_ROWS, FLAT_MAP],
    ids=["filter", "split", "Filter", "Filter-per-row", "FlatMap"],
)
@pytest.mark.parametrize("stops", [[1], [3, 2], [5, 1, 4]])
def test_a_stage_delivers_each_output_once_across_stops(
    data: str, stage: Any, stops: list[int]
) -> None:
    """Stopped after some batches and resumed from the state each time (a new stream), one
    epoch delivers every output of every input row once; the remainder carried into the next
    epoch is the only thing missing, and it is whole input rows."""
    got: Counter[tuple[int, int]] = Counter()
    state = None
    for stop in [*stops, None]:
        stream = _stream(data, stage)
        if state is not None:
            stream.load_state_dict(state)
        for n, batch in enumerate(stream):
            got.update(_outputs(batch))
            if stop is not None and n + 1 == stop:
                break
        state = stream.state_dict()
    assert max(got.values()) == 1, "an output delivered twice"
    assert state is not None and state["progress"]["epoch"] == 1
    carried = _carried(state)
    assert len(carried) == SHARDS * ROWS % BATCH
    assert got == Counter({o: n for o, n in _expected(stage).items() if o[0] not in carried})


def _ray_stream(data: str, stage: Any, world_size: int, **options: Any) -> ingest.RayStream:
    """The stage's stream as a RayStream (its batches as _stream's)."""
    return ingest.RayStream(
        data,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=5,
        shuffle_window=32,
        transform=stage,
        world_size=world_size,
        **options,
    )


def _carried(state: dict[str, Any]) -> set[int]:
    """The ids of the rows a state at an epoch's start carries into it (whole input rows:
    none of their outputs was delivered)."""
    spans = state["distributed"]["carry"]["spans"]
    return {shard * ROWS + row for shard, a, b in spans for row in range(a, b)}


@pytest.mark.parametrize("stage", [KeepEven, Halves], ids=["filter", "split"])
def test_a_stage_resumes_exactly_at_another_world_size(data: str, stage: Any) -> None:
    """Two DataLoader workers (ranks) stopped mid-epoch; the state loads into one Stream: the
    rest of the epoch delivers each remaining output once, none of those delivered before."""
    stream = _stream(data, stage)
    loader = ingest.DataLoader(stream, num_workers=2)
    before: Counter[tuple[int, int]] = Counter()
    for n, batch in enumerate(loader):
        before.update(_outputs(batch))
        if n == 4:
            break
    state = loader.state_dict()
    after: Counter[tuple[int, int]] = Counter()
    resumed = _stream(data, stage)
    resumed.load_state_dict(state)
    for batch in resumed:
        after.update(_outputs(batch))
    both = before + after
    assert max(both.values()) == 1
    carried = _carried(resumed.state_dict())
    assert both == Counter({o: n for o, n in _expected(stage).items() if o[0] not in carried})


class _Wrong(ingest.Stage):
    def __init__(self, origin: Any, part: Any = None) -> None:
        self.origin, self.part = origin, part

    def __call__(self, table: pa.Table) -> ingest.Staged:
        rows = len(self.origin)
        return ingest.Staged(table.slice(0, rows), np.asarray(self.origin), self.part)


@pytest.mark.parametrize(
    ("origin", "part", "message"),
    [
        ([0, 1], None, None),
        ([0], None, None),
        ([1, 0], None, "out of order"),
        ([0, 99], None, r"in \[0, 16\)"),
        ([0, 0], np.array([[0, 2], [1, 3]]), "overlapping or unordered parts"),
        ([0, 1], np.array([[0, 1]]), "parts of shape"),
    ],
)
def test_a_stages_origins_are_checked(
    data: str, origin: list[int], part: Any, message: str | None
) -> None:
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, transform=_Wrong(origin, part))
    if message is None:
        assert len(next(iter(stream))["id"]) == len(origin)
        return
    with pytest.raises(ingest.ConfigError, match=message):
        next(iter(stream))


def test_a_plain_transform_that_changes_the_row_count_is_told_about_stages(data: str) -> None:
    stream = ingest.Stream(
        data, columns=["id"], batch_size=BATCH, transform=lambda t: t.slice(0, 3)
    )
    with pytest.raises(ingest.ConfigError, match=r"returned 3 rows for 16.*ingest\.Stage"):
        next(iter(stream))


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("stage", [KeepEven, Halves, FLAT_MAP], ids=["filter", "split", "FlatMap"])
def test_a_stage_runs_in_the_reader_pool_and_resumes_at_another_world_size(
    data: str, stage: Any
) -> None:
    """On a RayStream the stage runs in the reader actors; 2 ranks stop after 3 steps each,
    the state resumes on 3 ranks, and every output of the epoch arrives once."""
    import ray

    @ray.remote(num_cpus=0)
    def rank(it: Any, stop: int | None) -> tuple[list[tuple[int, int]], Any]:
        out = []
        for n, batch in enumerate(it):
            out += _outputs(batch)
            if stop is not None and n + 1 == stop:
                return out, it.state_dict()
        return out, None

    def ranks(world_size: int, stop: int | None, state: Any = None) -> tuple[Counter[Any], Any]:
        with _ray_stream(data, stage, world_size) as stream:
            if state is not None:
                stream.load_state_dict(state)
            its = [stream.rank_iterator(r) for r in range(world_size)]
            got = ray.get([rank.remote(it, stop) for it in its], timeout=240)
            after = got[0][1] if stop is not None else stream.state_dict()
        return Counter(o for outs, _ in got for o in outs), after

    before, state = ranks(2, 3)
    after, end = ranks(3, None, state)
    both = before + after
    assert max(both.values()) == 1
    assert end["progress"]["epoch"] == 1
    carried = _carried(end)
    assert len(carried) < 3 * BATCH, "only the remainder of the 3-rank epoch is carried"
    assert both == Counter({o: n for o, n in _expected(stage).items() if o[0] not in carried})


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("stage", [KeepEven, Halves], ids=["filter", "split"])
def test_a_stage_in_the_pool_is_exact_through_a_reader_actor_killed_mid_epoch(
    data: str, stage: Any, tmp_path: Any
) -> None:
    """The one reader actor (it holds both ranks' feeds and runs the stage) dies at its
    third batch; Ray restarts it, each rank's feed goes on after its last batch acked, and
    every output of the epoch arrives once."""
    import ray

    from tests.faults import KillActorOnce

    marker = str(tmp_path / "killed")

    class Dies(stage):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.kill = KillActorOnce(marker)

        def __call__(self, table: pa.Table) -> ingest.Staged:
            return super().__call__(self.kill(table))  # type: ignore[no-any-return]

    @ray.remote(num_cpus=0)
    def rank(it: Any) -> list[tuple[int, int]]:
        return [o for batch in it for o in _outputs(batch)]

    pool = ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.5)
    with _ray_stream(data, Dies, 2, readers=pool) as stream:
        got = ray.get([rank.remote(stream.rank_iterator(r)) for r in range(2)], timeout=240)
        end = stream.state_dict()
    assert (tmp_path / "killed").exists(), "the fault fired"
    outputs = Counter(o for outs in got for o in outs)
    assert max(outputs.values()) == 1
    carried = _carried(end)
    assert outputs == Counter({o: n for o, n in _expected(stage).items() if o[0] not in carried})


def test_the_helpers_refuse_what_does_not_fit(data: str) -> None:
    wrong = ingest.Filter(lambda t: [True])
    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, transform=wrong)
    with pytest.raises(ingest.ConfigError, match=r"Filter: keep returned .* shape \(1,\) for 16"):
        next(iter(stream))
    # A batch whose rows all map to nothing: the schema given keeps its columns.
    none = ingest.FlatMap(lambda row: [], schema=pa.schema([("id", pa.int64())]))
    staged = none(pa.table({"id": [1, 2]}))
    assert staged.table.schema.names == ["id"] and staged.table.num_rows == 0


class SlowHalves(Halves):
    """Halves, two batches at once (``parallel_batches``), each call sleeping a time of its
    own so that they end out of order; the batch holding id 100 raises."""

    parallel_batches = 2

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.most = 0

    def __call__(self, table: pa.Table) -> ingest.Staged:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            ids = table["id"].to_numpy()
            time.sleep(0.002 * int(ids.sum() % 7) + 0.005 if len(ids) else 0)
            if 100 in ids:
                raise RuntimeError("bad row 100")
            return super().__call__(table)
        finally:
            with self.lock:
                self.running -= 1


def test_a_stage_on_two_batches_at_once_gives_the_batches_and_states_of_one_at_a_time(
    data: str,
) -> None:
    """A stage that runs on two batches at once (in threads of the feed) hands them on in
    order: the same batches, the same state after every batch, and a failing batch
    quarantined at its own step (``on_error="skip"``), as the same stage one at a time."""

    class OneAtATime(SlowHalves):
        parallel_batches = 1

    def run(stage: Any) -> tuple[list[list[tuple[int, int]]], list[dict[str, Any]], Any]:
        stream = _stream(data, stage, read=ingest.ReadOptions(on_error="skip"))
        batches, states = [], []
        for batch in stream:
            batches.append(_outputs(batch))
            states.append(stream.state_dict())
        return batches, states, stream.quarantined

    two, one = SlowHalves(), OneAtATime()
    parallel, serial = run(two), run(one)
    assert (two.most, one.most) == (2, 1), "two calls at once, and one"
    assert parallel[0] == serial[0] and parallel[1] == serial[1]
    [q] = parallel[2]
    assert q == serial[2][0] and q.reason == "RuntimeError: bad row 100"
    assert sum(len(b) for b in parallel[0]) == 2 * (SHARDS * ROWS - 4 - BATCH)


@pytest.mark.parametrize(
    "origin",
    [np.array([0.0, 1.0]), np.array([0, np.nan]), np.array([True, False]), np.array(["0", "1"])],
    ids=["floats", "nan", "bools", "strings"],
)
@pytest.mark.parametrize("packed", [False, True], ids=["stream", "pack"])
def test_origins_that_are_not_integers_are_refused(data: str, origin: Any, packed: bool) -> None:
    """Float, NaN, bool and string origins were taken (under Pack, NaN was a bare
    IndexError at engine/pack.py:305); issue 31, finding 11."""
    pack = ingest.Pack(seq_len=8, read_rows=BATCH, column="ids", pad_id=0) if packed else None

    class Origins(ingest.Stage):
        def __call__(self, table: pa.Table) -> ingest.Staged:
            out = table.slice(0, 2)
            ids = pa.array([[1, 2]] * 2, pa.list_(pa.int32()))
            return ingest.Staged(out.append_column("ids", ids), origin)

    stream = ingest.Stream(data, columns=["id"], batch_size=BATCH, transform=Origins(), pack=pack)
    with pytest.raises(
        ingest.ConfigError, match=rf"with origins of {origin.dtype}.*an origin is an integer"
    ):
        next(iter(stream))
    stream.close()


# -- stages in a list: each runs on what the one before made (issue 33, item 1) -------------


def _plus_thousand(table: pa.Table) -> pa.Table:
    """A plain transform: one row per row, ``id + 1000`` as ``shifted``."""
    return table.append_column("shifted", pc.add(table["id"], 1000))


def test_a_list_of_stages_chains_them_exact_through_a_stop_at_another_world_size(
    data: str,
) -> None:
    """``transform=[filter, split, plain]``: a filter before a one-to-many stage and a plain
    transform, with no composite written by hand. Every output comes once through a stop
    with two DataLoader workers resumed on one Stream; the plain transform saw the split
    rows (``shifted`` is on every output), and the chain's origins are the first input rows
    (the state consumes input rows only)."""
    chain = [ingest.Filter(_even_ids), Halves, _plus_thousand]
    loader = ingest.DataLoader(_stream(data, chain), num_workers=2)
    before: Counter[tuple[int, int]] = Counter()
    for n, batch in enumerate(loader):
        assert batch["shifted"].tolist() == [i + 1000 for i in batch["id"].tolist()]
        before.update(_outputs(batch))
        if n == 4:
            break
    state = loader.state_dict()
    loader.close()
    resumed = _stream(data, chain)
    resumed.load_state_dict(state)
    after: Counter[tuple[int, int]] = Counter(o for b in resumed for o in _outputs(b))
    both = before + after
    assert max(both.values()) == 1
    carried = _carried(resumed.state_dict())
    ids = range(SHARDS * ROWS)
    expected = Counter((i, p) for i in ids if i % 2 == 0 and i not in carried for p in (0, 1))
    assert both == expected


def test_a_single_stage_in_a_list_is_that_stage(data: str) -> None:
    got = Counter(o for b in _stream(data, [KeepEven]) for o in _outputs(b))
    alone = Counter(o for b in _stream(data, KeepEven) for o in _outputs(b))
    assert got == alone and got


def test_two_stages_that_both_cut_rows_into_parts_are_refused(data: str) -> None:
    """A part is ``[start, stop)`` in the input row's own units; parts of parts would need
    the units of both stages: refused, naming the rule."""
    with pytest.raises(ingest.ConfigError, match="one stage of a list may give parts"):
        next(iter(_stream(data, [Halves, Halves])))


def test_a_list_that_is_empty_or_holds_a_non_callable_is_refused(data: str) -> None:
    with pytest.raises(ingest.ConfigError, match="empty"):
        _stream(data, [])
    with pytest.raises(ingest.ConfigError, match="neither a function nor a class"):
        _stream(data, [KeepEven, 3])
