"""Provenance of a packing stream (issue 35): a step is a batch of sequences, and the log
names every piece of every document in it (the row, the batch's sequence it filled and its
tokens), the same as what the ranks received, across stops, resumes and world sizes, on
every transport. Token ``j`` of document ``d`` is ``d * 10_000 + j + 1``
(``tests/test_pack_stream``), so a piece named by the log gives its tokens back."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import ray

import ingest
from ingest.core.provenance import step_pieces
from ingest.engine.provenance import ProvenanceWriter, which
from ingest.testing import Store
from tests.test_pack_stream import (
    DOCS,
    SHARDS,
    carried_tokens,
    consumed_docs,
    every_token,
    tokenize,
    tokens_due,
    write_corpus,
)

SEQ_LEN, READ_ROWS, BATCH = 64, 16, 4

Seqs = list[list[int]]
"""A batch's real tokens, sequence by sequence."""


def seqs(batch: Any) -> Seqs:
    return [[t for t in row if t] for row in batch["input_ids"].tolist()]


def named(table: pa.Table, docs: int) -> dict[tuple[int, int], Seqs]:
    """``(rank, step)`` -> the tokens of each sequence, as the log's pieces name them."""
    per = -(-docs // SHARDS)
    out: dict[tuple[int, int], dict[int, list[int]]] = {}
    for r in table.to_pylist():
        assert r["stop"] == r["start"] + 1  # a piece is of one row
        shard = int(r["url"].rsplit("part-", 1)[1].split(".")[0])
        d = shard * per + r["start"]
        seq = out.setdefault((r["rank"], r["step"]), {}).setdefault(r["sequence"], [])
        seq += [d * 10_000 + j + 1 for j in range(r["token_start"], r["token_stop"])]
    return {k: [v[s] for s in sorted(v)] for k, v in out.items()}


def make(url: str, store: Store, log: str, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        url,
        batch_size=BATCH,
        transform=ingest.Tokenize(tokenize),
        pack=ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, pad_id=0),
        storage_options=store.storage_options,
        shuffle_seed=4,
        provenance=log,
        **options,
    )


def test_pieces_are_kept_as_rows_with_their_sequence_and_tokens(tmp_path: Path) -> None:
    w = ProvenanceWriter(str(tmp_path / "log"))
    w.start(0, 1)
    pieces = np.array([[0, 1, 7, 0, 30], [1, 1, 7, 30, 41], [1, 0, 2, 0, 5]], dtype=np.int64)
    w.record(0, 0, ["a", "b"], [(3, step_pieces(pieces))])
    w.flush()
    assert which(str(tmp_path / "log"), 3).to_pylist() == [
        {"step": 3, "rank": 0, "epoch": 0, "url": u, "start": r, "stop": r + 1,
         "sequence": s, "token_start": a, "token_stop": b}
        for s, u, r, a, b in [(0, "b", 7, 0, 30), (1, "b", 7, 30, 41), (1, "a", 2, 0, 5)]
    ]  # fmt: skip


def test_stream_and_dataloader_steps_through_stops(local: Store, tmp_path: Path) -> None:
    """A Stream's batches 0..4, a state, 3 more (rolled back by the resume); a
    DataLoader(2) from the state (its batches are steps 5, 6, ... whichever worker packed
    them), a stop; a Stream to the end and one more epoch. which() names what each step's
    batch held, and the steps go on from the state's ``pack.steps``."""
    url = write_corpus(local)
    log = str(tmp_path / "log")
    seen: dict[int, Seqs] = {}
    first = make(url, local, log)
    it = iter(first)
    for step in range(8):
        seen[step] = seqs(next(it))
        if step == 4:
            state = json.loads(json.dumps(first.state_dict()))
    first.state_dict()  # the rolled-back steps 5..7 are logged too
    assert state["pack"]["steps"] == 5
    loader = ingest.DataLoader(make(url, local, log), num_workers=2)
    loader.load_state_dict(state)
    step = 5
    for n, batch in enumerate(loader):
        seen[step] = seqs(batch)
        step += 1
        if n == 5:
            again = loader.state_dict()
            break
    assert again["pack"]["steps"] == step
    last = make(url, local, log)
    last.load_state_dict(again)
    for _ in range(2):  # the rest of the epoch, and the next one
        for batch in last:
            seen[step] = seqs(batch)
            step += 1
    answer = named(which(log, range(step + 3)), 192)
    assert {s for _, s in answer} == set(range(step))
    assert {s: v for (_, s), v in answer.items()} == seen
    assert all(r == 0 for r, s in answer if s < 5 or s >= 11)  # one-process steps


@ray.remote(num_cpus=0)
def _rank(it: Any, stop_after: int | None) -> tuple[dict[int, Seqs], Any]:
    got: dict[int, Seqs] = {}
    for batch in it:
        got[it.step] = seqs(batch)
        if stop_after is not None and len(got) == stop_after:
            return got, it.state_dict()
    return got, None


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_ray_ranks_through_three_stops_at_world_sizes_3_2_4(
    s3_store: Store, tmp_path: Path
) -> None:
    docs = 480
    url = write_corpus(s3_store, docs)
    log = str(tmp_path / "log")
    seen: dict[tuple[int, int], Seqs] = {}
    state = None
    for world, stop_after in ((3, 3), (2, 4), (4, 2), (4, None)):  # three stops
        with ingest.RayStream(
            url,
            world_size=world,
            batch_size=BATCH,
            transform=ingest.Tokenize(tokenize),
            pack=ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=8, pad_id=0),
            shuffle_seed=3,
            shuffle_window=64,
            storage_options=s3_store.storage_options,
            timeout_s=120,
            provenance=log,
        ) as stream:
            if state is not None:
                stream.load_state_dict(state)
            got = ray.get(
                [_rank.remote(stream.rank_iterator(r), stop_after) for r in range(world)],
                timeout=240,
            )
        for rank, (steps, s) in enumerate(got):
            for step, batch in steps.items():
                seen[(rank, step)] = batch
            state = s if s is not None else state
        if stop_after is not None:
            assert state is not None and state["pack"]["steps"] == max(s for _, s in seen) + 1
    answer = named(which(log, {s for _, s in seen}), docs)
    assert answer == seen
    handed = Counter(t for v in seen.values() for seq in v for t in seq)
    assert max(handed.values()) == 1
    assert set(handed) <= set(every_token(docs))


def test_skipped_steps_leave_their_documents_out_after_the_resume(
    local: Store, tmp_path: Path
) -> None:
    url = write_corpus(local)
    log = str(tmp_path / "log")
    first = make(url, local, log)
    it = iter(first)
    head: list[int] = []
    spiked: list[int] = []
    for step in range(16):
        batch = [t for s in seqs(next(it)) for t in s]
        if step <= 8:
            head += batch
        if step == 8:
            state = first.state_dict()
        if 11 <= step <= 13:
            spiked += batch
    first.state_dict()
    edited = ingest.skip(state, steps=range(11, 14), provenance=log)
    docs = {t // 10_000 for t in spiked}
    loader = ingest.DataLoader(make(url, local, log), num_workers=2)  # another world size
    loader.load_state_dict(edited)
    after = [t for b in loader for s in seqs(b) for t in s]
    assert not {t // 10_000 for t in after} & docs  # no token of a skipped document
    delivered = Counter(head + after)
    assert max(delivered.values()) == 1
    left_out = {t for t in every_token() if t // 10_000 in docs}
    carried = set(carried_tokens(loader.state_dict()))  # the remainder, due next epoch
    assert not carried & (set(delivered) | left_out)
    assert set(delivered) | left_out | carried == set(every_token())


def test_replay_collates_the_steps_sequences_again(local: Store, tmp_path: Path) -> None:
    """Replay of a packing stream's steps: the documents read and tokenized again, their
    pieces put back into the sequences, the batches as the rank got them (every tensor)."""
    url = write_corpus(local)
    log = str(tmp_path / "log")
    batches = list(make(url, local, log))  # every step: the corpus's empty documents too
    again = list(make(url, local, log).replay(range(2, len(batches))))
    assert [(step, rank) for step, rank, _ in again] == [(s, 0) for s in range(2, len(batches))]
    for (step, _, got), want in zip(again, batches[2:], strict=True):
        assert set(got) == set(want), step
        for name, value in want.items():
            assert (got[name] == value).all() if hasattr(value, "shape") else got[name] == value
    plain = ingest.Stream(url, storage_options=local.storage_options)
    with pytest.raises(ingest.ConfigError, match="packing stream"):
        next(plain.replay(2, provenance=log))


def test_ingest_which_prints_each_piece_with_its_sequence_and_tokens(
    local: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ingest.tools.cli import main

    url = write_corpus(local)
    log = str(tmp_path / "log")
    batches = list(make(url, local, log))
    assert main(["which", log, "--steps", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    tokens = sum(len(s) for s in seqs(batches[1]))
    assert out[-1].startswith("1 step(s), 1 rank-steps, ")
    assert out[-1].endswith(f"pieces of documents, {tokens} tokens")
    line = re.fullmatch(
        r"step 1 rank 0 epoch 0 \S+/part-\d\.jsonl \[(\d+), (\d+)\) sequence=(\d+) "
        r"token_start=(\d+) token_stop=(\d+)",
        out[0],
    )
    assert line is not None, out[0]
    start, stop, sequence, first, last = map(int, line.groups())
    assert stop == start + 1 and sequence == 0 and 0 <= first <= last


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_the_steps_after_the_last_state_are_logged_when_the_stream_shuts_down(
    s3_store: Store, tmp_path: Path
) -> None:
    """A run that ends mid-epoch (no state after its last batches) still logs them: the
    ranks' loops send what they hold as they leave, and the coordinator writes its log
    before it stops; a one-process Stream writes its own at close()."""
    url = write_corpus(s3_store, 480)
    log = str(tmp_path / "log")
    with ingest.RayStream(
        url,
        world_size=2,
        batch_size=BATCH,
        transform=ingest.Tokenize(tokenize),
        pack=ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=8, pad_id=0),
        shuffle_seed=3,
        storage_options=s3_store.storage_options,
        timeout_s=120,
        provenance=log,
    ) as stream:
        got = ray.get([_first.remote(stream.rank_iterator(r), 5) for r in range(2)], timeout=240)
    seen = {(rank, step): v for rank, steps in enumerate(got) for step, v in steps.items()}
    assert named(which(log, range(5)), 480) == seen
    local_log = str(tmp_path / "local")
    one = make(write_corpus(s3_store, 480), s3_store, local_log)
    mine = {(0, step): seqs(b) for step, b in zip(range(3), one, strict=False)}
    one.close()
    assert named(which(local_log, range(3)), 480) == mine


@ray.remote(num_cpus=0)
def _first(it: Any, n: int) -> dict[int, Seqs]:
    got: dict[int, Seqs] = {}
    for batch in it:
        got[it.step] = seqs(batch)
        if len(got) == n:
            break
    it.flush()  # what the loop holds, as a rank whose loop ends sends it
    return got


def test_skipped_steps_of_the_next_epoch_leave_their_documents_out_of_it(
    local: Store, tmp_path: Path
) -> None:
    """A packing run's spike after an epoch's end its checkpoint did not reach: the state
    keeps the skip until the book plans that epoch, through a stop at another world size;
    that epoch leaves the documents out whole and hands out every other token once."""
    url = write_corpus(local)
    log = str(tmp_path / "log")
    first = make(url, local, log)
    it = iter(first)
    head = [t for _ in range(6) for s in seqs(next(it)) for t in s]
    state = first.state_dict()
    steps0 = 6 + len(list(it))
    epoch1 = [seqs(b) for b in first]
    at = steps0 + len(epoch1) // 2  # the middle of epoch 1: no document carried into it
    spiked = [t for b in epoch1[at - steps0 : at - steps0 + 2] for s in b for t in s]
    first.state_dict()
    edited = ingest.skip(state, steps=range(at, at + 2), provenance=log)
    assert edited["progress"]["skip_ahead"][0]["epoch"] == 1
    docs = {t // 10_000 for t in spiked}
    loader = ingest.DataLoader(make(url, local, log), num_workers=2)
    loader.load_state_dict(edited)
    after = [t for b in loader for s in seqs(b) for t in s]  # the rest of epoch 0
    between = loader.state_dict()
    second = make(url, local, log)  # epoch 1 in one process
    second.load_state_dict(between)
    later = [t for b in second for s in seqs(b) for t in s]
    assert not {t // 10_000 for t in later} & docs  # no token of a skipped document
    # left out: the documents' own tokens, and those of their copies carried in (a skip
    # leaves out both). A carried copy left out is a carry span's row consumed (the skip
    # consumed it) whose epoch-0 tokens were not handed out: a span may also cover a row of
    # its epoch handed out before the state (consumed too, and no copy is carried).
    epoch0 = Counter(head + after)
    left_out = Counter(t for t in every_token() if t // 10_000 in docs)
    skipped_copies = docs & consumed_docs(between)
    left_out += Counter(t for t in every_token() if t // 10_000 in skipped_copies) - epoch0
    assert Counter(head + after + later) + left_out == tokens_due(second.state_dict(), DOCS, 2)
