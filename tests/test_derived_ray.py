"""The derived cache on a RayStream (issue 34, items 1 and 5): the reader actors read each
unit read whole from its copy, or derive it whole and keep the copy, so a second stream over
the same data and store runs no stage; every output once per epoch through a stop and a
resume at another world size with some units cached and some not."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import ray

import ingest
from ingest.testing import Store, write_dataset
from tests.carry import carried_rows
from tests.test_derived_stream import BATCH, EXPECTED, ROWS, SHARDS, Split
from tests.test_metrics import scrape
from tests.test_pack_stream import (
    READ_ROWS,
    SEQ_LEN,
    carried_tokens,
    every_token,
    tokenize,
    write_corpus,
)

pytestmark = pytest.mark.usefixtures("ray_session")


class Logged(Split):
    """:class:`Split`, counting the input rows it runs on in a file: it runs in the reader
    actors, whose class attributes the test cannot read."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.log = str(log)

    def __call__(self, table: pa.Table) -> ingest.Staged:
        with open(self.log, "a") as f:
            f.write(f"{table.num_rows}\n")
        return super().__call__(table)


def _ran(log: Path) -> int:
    return sum(int(n) for n in log.read_text().split()) if log.exists() else 0


@pytest.fixture
def data(local: Store) -> str:
    write_dataset(local.fs, local.url("d"), "parquet", SHARDS, ROWS, row_group_rows=16)
    return local.url("d")


def _stream(url: str, log: Path, copies: Path, world_size: int) -> ingest.RayStream:
    return ingest.RayStream(
        url,
        world_size=world_size,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=5,
        shuffle_window=40,
        shuffle_lanes=2,
        transform=Logged(log),
        derived=f"file://{copies}",
        readers=ingest.ReaderPool(min_size=2, max_size=2),
        timeout_s=120,
    )


@ray.remote(num_cpus=0)
def consume(it: Any, stop_after: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"outputs": [], "state": None}
    for n, batch in enumerate(it):
        out["outputs"] += list(zip(batch["id"].tolist(), batch["k"].tolist(), strict=True))
        if stop_after is not None and n + 1 == stop_after:
            out["state"] = it.state_dict()
            break
    return out


def _epoch(stream: ingest.RayStream, stop_after: int | None = None) -> list[dict[str, Any]]:
    refs = [consume.remote(stream.rank_iterator(r), stop_after) for r in range(stream.world_size)]
    got: list[dict[str, Any]] = ray.get(refs, timeout=240)
    return got


def _carried(stream: ingest.RayStream) -> Counter[tuple[int, int]]:
    """The outputs of the rows the epoch left over (unequal shares), which the next epoch
    carries in first: ``[shard, start, stop]`` spans of the listing's shards in id order."""
    state = stream.state_dict()
    assert state["progress"]["epoch"] == 1, "the epoch ended"
    rows = [shard * ROWS + r for shard, r in carried_rows(state)]
    return Counter((i, k) for i in rows for k in range(i % 3))


def test_a_second_ray_stream_reads_the_copies_and_runs_no_stage(data: str, tmp_path: Path) -> None:
    log, copies = tmp_path / "ran", tmp_path / "derived"
    with _stream(data, log, copies, 2) as first:
        got = _epoch(first)
        carried = _carried(first)
        made = first.stats()
    assert Counter(o for r in got for o in r["outputs"]) + carried == EXPECTED
    assert _ran(log) == SHARDS * ROWS, "each input row derived once, over whole units"
    assert sorted(copies.rglob("*.derived")), "copies written by the reader actors"
    log.unlink()
    with _stream(data, log, copies, 3) as second:
        again = _epoch(second)
        carried = _carried(second)
        read = second.stats()
        exported = _exported(second.name, "ingest_derived_hits_total", read["derived_hits"])
    assert Counter(o for r in again for o in r["outputs"]) + carried == EXPECTED
    assert _ran(log) == 0, "no stage ran: every unit came from its copy"
    # The readers' counts, summed (issue 34, item 6).
    assert made["derived_writes"] == len(list(copies.rglob("*.derived"))) > 0
    assert made["derived_stage_us"] > 0 and made["derived_hits"] == 0
    assert read["derived_hits"] > 0 and read["derived_misses"] == read["derived_writes"] == 0
    assert read["derived_saved_us"] > 0
    # A reader reports at most every second while it reads: its last second may not be out.
    assert 0 < exported <= read["derived_hits"], "the readers export their hits as a metric"


def _exported(stream: str, name: str, want: int) -> float:
    """The metric ``name`` of ``stream`` summed over the readers, once it reaches ``want``
    or stops growing (a reader reports every second while it reads; waits at most 30 s)."""
    deadline = time.monotonic() + 30
    seen: list[float] = []
    while True:
        seen.append(sum(scrape(stream).get(name, {}).values()))
        steady = len(seen) >= 3 and seen[-1] > 0 and len(set(seen[-3:])) == 1
        if seen[-1] >= want or steady or time.monotonic() > deadline:
            return seen[-1]
        time.sleep(1)


def test_a_stop_and_a_resume_at_another_world_size_with_half_the_units_cached(
    data: str, tmp_path: Path
) -> None:
    """A Stream fills the cache for part of the data; a RayStream of 3 ranks stops after 2
    steps, and one of 2 ranks resumes from its state: every output exactly once."""
    log, copies = tmp_path / "ran", tmp_path / "derived"
    half = ingest.Stream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=5, shuffle_window=40,
        shuffle_lanes=2, transform=Split(), derived=f"file://{copies}",
        read=ingest.ReadOptions(prefetch=0),
    )  # fmt: skip
    for n, _ in enumerate(half):  # without reading ahead: about half the units read
        if n == 7:
            break
    half.close()
    cached = len(list(copies.rglob("*.derived")))
    assert 0 < cached < SHARDS * ROWS // 16
    with _stream(data, log, copies, 3) as first:
        got = _epoch(first, stop_after=2)
    states = [r["state"] for r in got]
    assert all(s == states[0] for s in states)
    before = Counter(o for r in got for o in r["outputs"])
    with _stream(data, log, copies, 2) as second:
        second.load_state_dict(json.loads(json.dumps(states[0])))
        rest = _epoch(second)
        carried = _carried(second)
    after = Counter(o for r in rest for o in r["outputs"])
    assert not set(before) & set(after), "no output twice"
    assert before + after + carried == EXPECTED
    assert len(list(copies.rglob("*.derived"))) > cached, "the ranks kept the units they derived"


class Failing(Logged):
    """:class:`Logged` that raises on the batch (or unit) holding row 100."""

    def __call__(self, table: pa.Table) -> ingest.Staged:
        if 100 in table["id"].to_numpy():
            raise RuntimeError("bad row 100")
        return super().__call__(table)


def test_a_unit_whose_chain_raised_is_quarantined_as_without_the_cache_and_not_kept(
    data: str, tmp_path: Path
) -> None:
    """on_error="skip" on the ranks: the step holding row 100 is quarantined as without the
    cache (the chain runs per batch on that unit), and that unit has no copy: a second
    stream derives it again, and only it."""
    log, copies = tmp_path / "ran", tmp_path / "derived"

    def run(derived: Path | None) -> tuple[Counter[tuple[int, int]], list[Any]]:
        stream = ingest.RayStream(
            data, world_size=2, columns=["id"], batch_size=BATCH, shuffle_seed=5,
            shuffle_window=40, shuffle_lanes=2, transform=Failing(log),
            derived=None if derived is None else f"file://{derived}",
            read=ingest.ReadOptions(on_error="skip"), timeout_s=120,
        )  # fmt: skip
        with stream:
            got = Counter(o for r in _epoch(stream) for o in r["outputs"])
            failed = sorted((q.step, q.rows, q.reason) for q in stream.quarantined())
        return got, failed

    want = run(None)
    assert len(want[1]) == 1 and "bad row 100" in want[1][0][-1]
    assert run(copies) == want
    log.unlink()
    assert run(copies) == want
    assert 0 < _ran(log) < SHARDS * ROWS, "the failed unit alone ran again"


class Tokens(ingest.Tokenize):
    """``ingest.Tokenize`` over test_pack_stream's tokenizer (token ``j`` of document ``d``
    is ``d * 10_000 + j + 1``), with a fingerprint (a function has no serialized form to
    fingerprint), logging the rows it runs on."""

    def __init__(self, log: Path) -> None:
        super().__init__(tokenize)
        self.log = str(log)

    def fingerprint(self) -> str:
        return "tests.test_derived_ray.Tokens 1"

    def __call__(self, table: pa.Table) -> Any:
        with open(self.log, "a") as f:
            f.write(f"{table.num_rows}\n")
        return super().__call__(table)


@ray.remote(num_cpus=0)
def consume_tokens(it: Any, stop_after: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": [], "state": None}
    for n, batch in enumerate(it):
        out["tokens"] += [t for t in batch["input_ids"].flatten().tolist() if t]
        if stop_after is not None and n + 1 == stop_after:
            out["state"] = it.state_dict()
            break
    return out


def test_packed_tokens_exactly_once_through_a_stop_and_a_resume_at_another_world_size(
    s3_store: Store, tmp_path: Path
) -> None:
    """Token by token (issue 34's goal): a Stream tokenizes part of the corpus into the cache;
    RayStream(Tokenize, Pack) at 3 ranks stops after 2 steps and at 2 ranks resumes to the
    epoch's end, some units from their copies and the rest derived: every token once."""
    url = write_corpus(s3_store, 480)
    log, copies = tmp_path / "ran", tmp_path / "derived"
    options: dict[str, Any] = {
        "pack": ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS),
        "shuffle_seed": 3,
        "shuffle_window": 64,
        "storage_options": s3_store.storage_options,
        "derived": f"file://{copies}",
    }
    warm = ingest.Stream(url, batch_size=4, transform=Tokens(log), **options)
    for n, _ in enumerate(warm):
        if n == 3:
            break
    warm.close()
    handed: Counter[int] = Counter()
    state = None
    for world_size, stop in ((3, 2), (2, None)):
        with ingest.RayStream(
            url, world_size=world_size, batch_size=4, transform=Tokens(log), timeout_s=120,
            **options,
        ) as rs:  # fmt: skip
            if state is not None:
                rs.load_state_dict(state)
            refs = [consume_tokens.remote(rs.rank_iterator(r), stop) for r in range(world_size)]
            got: list[dict[str, Any]] = ray.get(refs, timeout=240)
            handed += Counter(t for r in got for t in r["tokens"])
            if stop is None:
                state = rs.state_dict()
                stats = rs.stats()
                continue
        state = json.loads(json.dumps(got[0]["state"]))
    assert state is not None and state["progress"]["epoch"] == 1
    assert handed == every_token(480) - carried_tokens(state, 480)
    assert stats["derived_hits"] > 0 and stats["derived_writes"] > 0, "some cached, some not"
