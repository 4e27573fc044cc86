"""Packing in the Ray reader pool (ingest.distributed.rank_pack): the readers tokenize, each
rank packs its read steps, every rank takes the same number of batches, and every token is
handed out once per epoch across stops and world-size changes (3 -> 2 -> 4 ranks), checked
token by token on the loopback S3 server and a real local Ray.

Token ``j`` of document ``d`` is ``d * 10_000 + j + 1`` (see ``test_pack_stream``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import Store
from tests.test_pack_stream import carried_tokens, every_token, tokenize, write_corpus

pytestmark = pytest.mark.usefixtures("ray_session")

DOCS = 480  # 30 read steps of 16
SEQ_LEN, READ_ROWS, BATCH = 64, 16, 4


@ray.remote(num_cpus=0)
def consume(it: Any, stop_after: int | None = None, epochs: int = 1) -> dict[str, Any]:
    """A rank's batches (their tokens), until ``stop_after`` batches, then a state."""
    out: dict[str, Any] = {"batches": [], "state": None}
    for _ in range(epochs):
        for batch in it:
            assert batch["input_ids"].shape == (BATCH, SEQ_LEN)
            out["batches"].append([t for t in batch["input_ids"].flatten().tolist() if t])
            if stop_after is not None and len(out["batches"]) == stop_after:
                out["state"] = it.state_dict()
                return out
    return out


def make(url: str, store: Store, world_size: int, **options: Any) -> ingest.RayStream:
    return ingest.RayStream(
        url,
        world_size=world_size,
        batch_size=BATCH,
        transform=options.pop("transform", ingest.Tokenize(tokenize)),
        pack=options.pop("pack", ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=8)),
        shuffle_seed=options.pop("shuffle_seed", 3),
        shuffle_window=options.pop("shuffle_window", 64),
        storage_options=store.storage_options,
        timeout_s=120,
        **options,
    )


def run(stream: ingest.RayStream, **kwargs: Any) -> list[dict[str, Any]]:
    refs = [consume.remote(stream.rank_iterator(r), **kwargs) for r in range(stream.world_size)]
    got: list[dict[str, Any]] = ray.get(refs, timeout=240)
    steps = {len(r["batches"]) for r in got}
    assert len(steps) == 1, f"unequal steps per rank: {steps}"
    return got


def tokens(results: list[dict[str, Any]]) -> Counter[int]:
    return Counter(t for r in results for b in r["batches"] for t in b)


def test_stops_and_resumes_at_3_then_2_then_4_ranks_hand_out_every_token_once(
    s3_store: Store,
) -> None:
    url = write_corpus(s3_store, DOCS)
    handed: Counter[int] = Counter()
    state = None
    for world_size, stop in ((3, 3), (2, 4), (4, None)):
        with make(url, s3_store, world_size) as stream:
            if state is not None:
                stream.load_state_dict(state)
            got = run(stream, stop_after=stop)
            handed += tokens(got)
            if stop is None:
                state = stream.state_dict()
                continue
            states = [r["state"] for r in got]
        assert all(s == states[0] for s in states), "every rank gets the same state"
        state = json.loads(json.dumps(states[0]))
        assert state["version"] == 7 and state["pack"]["tokens"]
    assert state is not None and state["progress"]["epoch"] == 1
    assert handed == every_token(DOCS) - carried_tokens(state, DOCS)


def test_a_state_taken_on_the_driver_while_packing_loops_are_open_covers_them(
    s3_store: Store,
) -> None:
    """``stream.state_dict()`` on the driver while the rank's loop is open in its process (a
    notebook; packing ranks wait for each other's batches, so one thread iterates one): the
    state covers the batches it handed out and the documents its packer holds, so a resume
    hands out every other token once."""
    url = write_corpus(s3_store, DOCS)
    with make(url, s3_store, 1) as stream:
        loop = iter(stream.rank_iterator(0))
        head = [next(loop)["input_ids"] for _ in range(3)]
        state = json.loads(json.dumps(stream.state_dict()))
        assert next(loop)["input_ids"].shape == (BATCH, SEQ_LEN)  # it goes on
    with make(url, s3_store, 2) as resumed:
        resumed.load_state_dict(state)
        rest = run(resumed)
        end = resumed.state_dict()
    handed = Counter(t for b in head for t in b.flatten().tolist() if t) + tokens(rest)
    assert handed == every_token(DOCS) - carried_tokens(end, DOCS)


def test_two_epochs_carry_the_surplus_with_its_offsets(s3_store: Store) -> None:
    """Every rank takes the same steps (``run`` checks), and the ranks' documents packed
    beyond the epoch's last common step (cut ones too) are carried into the next epoch, which
    hands out each of them from its offset, then its own."""
    url = write_corpus(s3_store, DOCS)
    with make(url, s3_store, 3) as stream:
        first = run(stream)
        middle = stream.state_dict()
        second = run(stream)
        end = stream.state_dict()
    assert middle["progress"]["epoch"] == 1 and end["progress"]["epoch"] == 2
    carried = carried_tokens(middle, DOCS)
    assert [t for t in middle["pack"]["tokens"] if t[0] == 0], "cut documents carried"
    assert tokens(first) == every_token(DOCS) - carried
    # The remainder and the ranks' surplus: a few batches' worth at most.
    assert sum(carried.values()) < 3 * 4 * BATCH * SEQ_LEN
    assert tokens(second) == every_token(DOCS) - carried_tokens(end, DOCS) + carried


class DiesOnce:
    """Tokenizes, and kills its reader actor's process at its twelfth batch (the ranks have
    packed read steps they have not acked by then), once."""

    marker = ""

    def __init__(self) -> None:
        from tests.faults import KillActorOnce

        self.kill = KillActorOnce(self.marker, at=12)
        self.tokenize = ingest.Tokenize(tokenize)

    def __call__(self, table: Any) -> Any:
        return self.tokenize(self.kill(table))


def test_a_reader_killed_mid_epoch_loses_and_repeats_no_token(
    s3_store: Store, tmp_path: Any
) -> None:
    """The one reader actor dies; each rank keeps what it packed, its feed restarts after its
    last read step acked, and the read steps it packed already are left out."""
    url = write_corpus(s3_store, DOCS)
    marker = str(tmp_path / "killed")
    transform = type("Dies", (DiesOnce,), {"marker": marker})
    pool = ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.5)
    with make(url, s3_store, 2, readers=pool, transform=transform) as stream:
        got = run(stream)
        end = stream.state_dict()
    assert (tmp_path / "killed").exists(), "the fault fired"
    assert tokens(got) == every_token(DOCS) - carried_tokens(end, DOCS)


def test_what_ranks_leave_over_is_the_same_every_run_and_nothing_is_repeated(s3: Any) -> None:
    """An epoch of few read steps per rank (read steps of 48 on 3 ranks: 3 each), and a
    shuffle window as large as a share (carried rows anywhere in rank 0's read order). Which
    documents each rank leaves over at an epoch's end, and so the next epoch's plan, is the
    same on every run (the book keeps the carried rows in their order, not in the order the
    ranks close in): two runs hand out the same batches on every rank, the same states. A row
    carried into the second epoch may fall in a rank's surplus again with its own copy; the
    next epoch carries one and owes the other (:mod:`ingest.core.carry`): every token is
    handed out exactly as often as due, none dropped."""
    store = Store("s3", s3.filesystem(), "s3://ingest-test/carried-twice", s3.storage_options())
    url = write_corpus(store, DOCS)
    pack = ingest.Pack(seq_len=SEQ_LEN, read_rows=48, max_open=8)
    runs = []
    for _ in range(2):
        with make(url, store, 3, pack=pack, shuffle_window=16_384, shuffle_seed=2) as s:
            first, second = run(s), run(s)
            runs.append(([r["batches"] for r in first + second], s.state_dict()))
    assert runs[0] == runs[1], "the same batches on every rank, and the same state, each run"
    end = runs[0][1]
    owed = every_token(DOCS) + every_token(DOCS) - carried_tokens(end, DOCS)
    handed = tokens(first) + tokens(second)
    assert not handed - owed, "no token repeated"
    assert not owed - handed, "no token lost"
    assert end["progress"]["dropped"] == 0
