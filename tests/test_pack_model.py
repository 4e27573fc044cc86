"""Packing, exactly once under random sequences of operations: a stateful model test.

Hypothesis drives a packing ``Stream`` (JSONL documents, ``Tokenize`` by a function whose
token ids name their document and position, ``Pack``) through random sequences of what users
do: take k batches, take the state, leave a loop, resume from the last state in a new stream
(or in an ``ingest.DataLoader`` over it, whose states have no cursors: the rest of the epoch
is shared anew, and its remainder may hold documents cut before, carried with their
offsets), run into an epoch's end, under random packing settings (best-fit or greedy, 1 to 8 open
sequences, sequence lengths shorter and longer than most documents, 1 to 4 sequences per
batch, read steps whose epochs leave a remainder, shuffled or not). A model counts every
token handed out in the epoch and checks, token by token:

- at every state: the tokens the state says the epoch consumed (the rows consumed whole, its
  own and the carried ones, and the tokens ``[0, offset)`` of each row in ``progress.tokens``,
  less what a carried row's offset at the epoch's start says the epoch before handed out)
  are exactly the tokens the model saw handed out in the epoch since its start;
- at every epoch's end: each token of the corpus was handed out once in the epoch, but for
  the documents the epoch carried out (its remainder), and the ones carried in came too.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

import ingest
from ingest.core.state import StreamState

DOCS, SHARDS = 60, 3
PER = DOCS // SHARDS
EXAMPLES = int(os.environ.get("INGEST_MODEL_EXAMPLES", "0"))


def lengths(seed: int = 3) -> list[int]:
    rng = np.random.default_rng(seed)
    out = np.minimum(rng.lognormal(np.log(12), 1.0, DOCS).astype(int), 80)
    out[[4, 31]] = 0  # documents without a token
    return [int(x) for x in out]


LENGTHS = lengths()


def doc_tokens(doc: int, upto: int | None = None) -> list[int]:
    n = LENGTHS[doc] if upto is None else upto
    return [doc * 1000 + j + 1 for j in range(n)]


def tokenize(texts: list[str]) -> list[list[int]]:
    return [doc_tokens(int(t)) for t in texts]


def corpus(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(SHARDS):
        lines = [json.dumps({"text": str(d)}) for d in range(s * PER, (s + 1) * PER)]
        (root / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return str(root / "*.jsonl")


EVERY = Counter(t for d in range(DOCS) for t in doc_tokens(d))


def doc_of(shard: int, row: int) -> int:
    return shard * PER + row  # shards list sorted by URL, as written


def claimed(state: dict[str, Any], before: dict[tuple[int, int], int]) -> Counter[int]:
    """The tokens ``state`` says its epoch consumed; ``before``: the offsets the carried rows
    began the epoch at (their tokens before were handed out in the epoch before)."""
    parsed = StreamState.from_json(state)
    out: Counter[int] = Counter()
    for segment, consumed in (
        (1, parsed.progress.consumed),
        (0, parsed.distributed.carry_consumed),
    ):
        for shard, rows in consumed.sets.items():
            for start, stop in rows:
                for row in range(start, stop):
                    first = before.get((shard, row), 0) if segment == 0 else 0
                    out.update(doc_tokens(doc_of(shard, row))[first:])
    for segment, shard, row, offset in parsed.progress.tokens:
        first = before.get((shard, row), 0) if segment == 0 else 0
        out.update(doc_tokens(doc_of(shard, row), offset)[first:])
    return out


def carry_offsets(state: dict[str, Any]) -> dict[tuple[int, int], int]:
    """The offsets the rows ``state`` (at an epoch's start) carries in begin at."""
    return {
        (shard, row): offset
        for segment, shard, row, offset in state["progress"].get("tokens", [])
        if segment == 0
    }


def carried(state: dict[str, Any]) -> Counter[int]:
    """The tokens of the rows ``state`` (at an epoch's start) carries in: from their offsets,
    for the ones cut before (``progress.tokens`` of segment 0)."""
    start = carry_offsets(state)
    out: Counter[int] = Counter()
    for shard, first, stop in state["distributed"]["carry"]["spans"]:
        for row in range(first, stop):
            out.update(doc_tokens(doc_of(shard, row))[start.get((shard, row), 0) :])
    return out


class PackMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stream: ingest.Stream | None = None
        self.source: Any = None
        """What is iterated: the stream, or an ingest.DataLoader over it (no cursors in its
        states: a resume from one shares the rest anew, and the epoch's remainder may then
        hold documents cut before the stop, carried with their offsets)."""
        self.loop: Iterator[dict[str, Any]] | None = None
        self.seen: Counter[int] = Counter()
        """Tokens handed out in the epoch in progress."""
        self.carried_in: Counter[int] = Counter()
        self.before: dict[tuple[int, int], int] = {}
        """The offsets the epoch's carried rows began at."""
        self.saved: tuple[Any, ...] | None = None
        self.epochs = 0

    @initialize(
        method=st.sampled_from(["best_fit", "greedy"]),
        max_open=st.integers(1, 8),
        seq_len=st.sampled_from([8, 32, 100]),
        batch=st.integers(1, 4),
        read_rows=st.sampled_from([7, 16, 60]),
        seed=st.sampled_from([None, 11]),
        lag=st.integers(0, 3),
    )
    def setup(
        self,
        method: str,
        max_open: int,
        seq_len: int,
        batch: int,
        read_rows: int,
        seed: Any,
        lag: int,
    ) -> None:
        root = Path(os.environ["PACK_MODEL_ROOT"])
        url = corpus(root) if not (root / "part-0.jsonl").exists() else str(root / "*.jsonl")
        pack = ingest.Pack(
            seq_len=seq_len,
            method=method,  # type: ignore[arg-type]
            max_open=max_open,
            read_rows=read_rows,
            max_lag=lag,
        )

        def make() -> ingest.Stream:
            return ingest.Stream(
                url,
                batch_size=batch,
                shuffle_seed=seed,
                shuffle_window=24,
                transform=ingest.Tokenize(tokenize),
                pack=pack,
            )

        self.make = make
        self.stream = self.source = make()

    @rule(k=st.integers(1, 12))
    def take(self, k: int) -> None:
        assert self.stream is not None
        for _ in range(k):
            if self.loop is None:
                self.loop = iter(self.source)
            batch = next(self.loop, None)
            if batch is None:
                self._epoch_end()
                return
            self.seen.update(t for t in batch["input_ids"].flatten().tolist() if t)

    def _epoch_end(self) -> None:
        assert self.stream is not None
        self.loop = None
        state = self.source.state_dict()
        out = carried(state)
        assert self.seen == EVERY - out + self.carried_in, "every token once in the epoch"
        self.carried_in, self.seen, self.before = out, Counter(), carry_offsets(state)
        self.epochs += 1

    @rule()
    def state(self) -> None:
        assert self.stream is not None
        state = json.loads(json.dumps(self.source.state_dict()))
        assert claimed(state, self.before) == self.seen, "the state claims what was handed out"
        self.saved = (state, Counter(self.seen), Counter(self.carried_in), dict(self.before))

    @rule()
    def leave(self) -> None:
        self.loop = None  # the next take starts a new loop, after the last batch

    @precondition(lambda self: self.saved is not None)
    @rule(loader=st.booleans())
    def resume(self, loader: bool) -> None:
        assert self.stream is not None and self.saved is not None
        self.loop = None
        self.stream.close()
        self.stream = self.source = self.make()
        state, seen, carried_in, before = self.saved
        self.stream.load_state_dict(state)
        if loader:
            self.source = ingest.DataLoader(self.stream, num_workers=0)
        self.seen, self.carried_in, self.before = Counter(seen), Counter(carried_in), dict(before)

    def teardown(self) -> None:
        if self.stream is not None:
            self.stream.close()


def test_packing_hands_out_every_token_once_whatever_the_user_does(tmp_path: Path) -> None:
    os.environ["PACK_MODEL_ROOT"] = str(tmp_path / "corpus")
    run_state_machine_as_test(
        PackMachine,
        settings=settings(
            max_examples=EXAMPLES or 40,
            stateful_step_count=20,
            deadline=None,
            derandomize=not EXAMPLES,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
