"""Packing, exactly once under random sequences of operations: a stateful model test.

Hypothesis drives a packing ``Stream`` (JSONL documents, ``Tokenize`` by a function whose
token ids name their document and position, ``Pack``) through random sequences of what users
do: take k batches, take the state, leave a loop, resume from the last state in a new stream
(or in an ``ingest.DataLoader`` of 0 to 2 workers over it: another world size, whose states
have no cursors: the rest of the epoch is shared anew, and its remainder may hold documents
cut before, carried with their offsets), run into an epoch's end, under random packing
settings (best-fit or greedy, 1 to 8 open sequences, sequence lengths shorter and longer than
most documents, 1 to 4 sequences per batch, read steps whose epochs leave a remainder,
shuffled or not). A model counts every token handed out in the epoch and checks, token by
token:

- at every state: the tokens the state says the epoch consumed (the rows consumed whole, its
  own and the carried ones, and the tokens ``[0, offset)`` of each row in ``progress.tokens``,
  less what a carried row's offset at the epoch's start says the epoch before handed out)
  are exactly the tokens the model saw handed out in the epoch since its start;
- at every epoch's end: each token of the corpus was handed out once in the epoch, but for
  the documents the epoch carried out (its remainder), and the ones carried in came too (no
  state owes a copy: one process hands every carried row out in the next epoch).

:class:`MixMachine` does the same over a two-source ``ingest.Mix``, tokenized and packed:
each source's tokens handed out since the start are, at every state, what the state's part
of that source says was due (its epochs, consumed rows, cut documents, carried and owed
copies: :func:`tests.test_mix.times_due`).

:class:`RayPackMachine` packs one source through stops that resume as any transport and
world size: a ``Stream``, a ``DataLoader`` of 0 or 2 workers, a ``RayStream`` of 1 to 3
ranks (each rank's iterator held in a process of its own, each rank's state taken there: the
same on every rank), with the same check, which counts owed copies too (a packing epoch
under Ray may owe one).

Each runs a few fixed sequences in ``make test``; ``benchmarks/model_soak.py`` runs random
ones for longer.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import ray
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
from ingest.testing import Store
from tests.carry import carried_rows
from tests.test_mix import times_due, write_corpora
from tests.test_pack_stream import lengths as lengths_of
from tests.test_pack_stream import tokenize as mix_tokenize

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
        for segment, shard, row, offset in state.get("pack", {}).get("tokens", [])
        if segment == 0
    }


def carried(state: dict[str, Any]) -> Counter[int]:
    """The tokens of the rows ``state`` (at an epoch's start) carries in: from their offsets,
    for the ones cut before (``progress.tokens`` of segment 0)."""
    start = carry_offsets(state)
    out: Counter[int] = Counter()
    for shard, row in carried_rows(state):
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
        assert not state["distributed"].get("owed"), "one process owes no copy of a row"
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
    @rule(workers=st.sampled_from([None, 0, 1, 2]))
    def resume(self, workers: int | None) -> None:
        """Resume from the last state in a new stream (None), or a DataLoader of ``workers``
        over one (2: another world size)."""
        assert self.stream is not None and self.saved is not None
        self.loop = None
        self.stream.close()
        self.stream = self.source = self.make()
        state, seen, carried_in, before = self.saved
        self.stream.load_state_dict(state)
        if workers is not None:
            self.source = ingest.DataLoader(self.stream, num_workers=workers)
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


# -- a two-source mixture, tokenized and packed --------------------------------------------

MIX = {"web": (0, 60), "code": (100_000, 24)}
"""The mixture's sources (first document, documents): ``code`` repeats within ``web``'s
epochs; both end epochs within a sequence's steps."""


def mix_due(name: str, part: dict[str, Any]) -> Counter[int]:
    """How often each token of source ``name`` was due by its ``part`` of a state (see
    :func:`tests.test_mix.times_due`)."""
    first, count = MIX[name]
    docs = list(
        zip(range(first, first + count), lengths_of(count, list(MIX).index(name)), strict=True)
    )
    length = dict(docs)
    out: Counter[int] = Counter()
    for (d, upto), n in times_due(StreamState.from_json(part), docs).items():
        for t in mix_tokenize([f"{d} {length[d]}"])[0][: None if upto < 0 else upto]:
            out[t] += n
    return +out


TRANSPORTS = ["stream", "loader0", "loader1", "loader2"]
"""A stream, or a DataLoader of 0 to 2 workers (ranks) over it."""


class MixMachine(RuleBasedStateMachine):
    """A two-source ``ingest.Mix``, tokenized and packed, in a ``Stream`` or a
    ``DataLoader`` of 0 to 2 workers; resumed from the last state in another of them."""

    def __init__(self) -> None:
        super().__init__()
        self.stream: ingest.Stream | None = None
        self.source: Any = None
        self.loop: Iterator[dict[str, Any]] | None = None
        self.handed: dict[str, Counter[int]] = {name: Counter() for name in MIX}
        """Tokens handed out since the start, by source (less what resumes undid)."""
        self.saved: tuple[dict[str, Any], dict[str, Counter[int]]] | None = None

    @initialize(
        transport=st.sampled_from(TRANSPORTS),
        seq_len=st.sampled_from([16, 64]),
        read_rows=st.sampled_from([7, 16]),
        batch=st.integers(1, 3),
        web=st.integers(1, 3),
        seed=st.sampled_from([None, 4]),
    )
    def setup(
        self, transport: str, seq_len: int, read_rows: int, batch: int, web: int, seed: Any
    ) -> None:
        root = Path(os.environ["PACK_MODEL_ROOT"]) / "mix"
        store = Store("local", fsspec.filesystem("file"), f"file://{root}", {})
        if (root / "code" / "part-1.jsonl").exists():
            urls = {name: store.url(f"{name}/*.jsonl") for name in MIX}
        else:
            urls = write_corpora(store, MIX)

        def make() -> ingest.Stream:
            return ingest.Stream(
                ingest.Mix(urls, weights={"web": web, "code": 1}),
                batch_size=batch,
                shuffle_seed=seed,
                shuffle_window=24,
                transform=ingest.Tokenize(mix_tokenize),
                pack=ingest.Pack(seq_len=seq_len, read_rows=read_rows, max_open=4, pad_id=0),
            )

        self.make = make
        self._open(transport)

    def _open(self, transport: str, state: dict[str, Any] | None = None) -> None:
        self.loop = self.source = None  # the loop ends (and a loader's workers) first
        if self.stream is not None:
            self.stream.close()
        self.stream = self.source = self.make()
        if state is not None:
            self.stream.load_state_dict(state)
        if transport != "stream":
            self.source = ingest.DataLoader(self.stream, num_workers=int(transport[-1]))

    @rule(k=st.integers(1, 12))
    def take(self, k: int) -> None:
        names = list(MIX)
        for _ in range(k):
            if self.loop is None:
                self.loop = iter(self.source)
            batch = next(self.loop, None)
            if batch is None:  # the mixture's epoch ended: the next take starts another
                self.loop = None
                return
            for ids, source in zip(
                batch["input_ids"].tolist(), batch["source"].tolist(), strict=True
            ):
                self.handed[names[source]].update(t for t in ids if t)

    @rule()
    def state(self) -> None:
        state = json.loads(json.dumps(self.source.state_dict()))
        for name in MIX:
            due = mix_due(name, state["sources"][name])
            assert self.handed[name] == due, (
                f"{name}: handed out but not due {sum((self.handed[name] - due).values())} "
                f"tokens, due but not handed out {sum((due - self.handed[name]).values())}"
            )
        self.saved = (state, {name: Counter(c) for name, c in self.handed.items()})

    @rule()
    def leave(self) -> None:
        self.loop = None

    @precondition(lambda self: self.saved is not None)
    @rule(transport=st.sampled_from(TRANSPORTS))
    def resume(self, transport: str) -> None:
        """Resume from the last state in another transport (or the same), another world
        size with the DataLoader's workers."""
        assert self.saved is not None
        state, handed = self.saved
        self._open(transport, state)
        self.handed = {name: Counter(c) for name, c in handed.items()}

    def teardown(self) -> None:
        self.loop = self.source = None
        if self.stream is not None:
            self.stream.close()


def test_a_packed_mixture_hands_out_every_token_as_due_whatever_the_user_does(
    tmp_path: Path,
) -> None:
    os.environ["PACK_MODEL_ROOT"] = str(tmp_path / "corpus")
    run_state_machine_as_test(
        MixMachine,
        settings=settings(
            max_examples=EXAMPLES or 8,
            stateful_step_count=10,
            deadline=None,
            derandomize=not EXAMPLES,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )


# -- packing across transports and world sizes, Ray ranks among them -----------------------

WEB = {"web": MIX["web"]}
"""One source of the mixture's, alone (its tokens due: :func:`mix_due`)."""


class _HeldRank:
    """A packing rank's one iterator, held in a process of its own across batches and epochs
    (its documents in flight live in it: another iterator may not take the rank over in the
    middle of an epoch)."""

    def __init__(self, it: Any) -> None:
        self.it = it
        self.loop: Iterator[dict[str, Any]] | None = None

    def take(self, k: int) -> list[list[int]]:
        """Up to ``k`` batches' tokens; fewer where the epoch ended (the next take starts the
        next epoch)."""
        out: list[list[int]] = []
        while len(out) < k:
            if self.loop is None:
                self.loop = iter(self.it)
            batch = next(self.loop, None)
            if batch is None:
                self.loop = None
                break
            out.append([t for t in batch["input_ids"].flatten().tolist() if t])
        return out

    def leave(self) -> None:
        self.loop = None  # a new loop over the same iterator goes on after its last batch

    def state(self) -> dict[str, Any]:
        return self.it.state_dict()  # type: ignore[no-any-return]


_PackingRank: Any = ray.remote(num_cpus=0)(_HeldRank)  # opaque to type checkers, hence Any


PACK_TRANSPORTS = ["stream", "loader0", "loader2", "ray1", "ray2", "ray3"]
"""One process (a Stream, a DataLoader of 0 or 2 workers) or a RayStream of 1 to 3 ranks."""


class RayPackMachine(RuleBasedStateMachine):
    """``Tokenize`` + ``Pack`` through stops that resume as another transport and another
    world size, ``RayStream`` ranks among them (each rank's state taken in its own process,
    every rank's the same). The model: the tokens handed out since the start (less what
    resumes undid) are, at every state, what the state says was due, whatever the epochs,
    the carried and the owed copies (:func:`mix_due`)."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: Counter[int] = Counter()
        self.saved: tuple[dict[str, Any], Counter[int]] | None = None
        self.stream: Any = None
        self.source: Any = None
        self.loop: Iterator[dict[str, Any]] | None = None
        self.ranks: list[Any] = []

    @initialize(
        transport=st.sampled_from(PACK_TRANSPORTS),
        seq_len=st.sampled_from([16, 64]),
        read_rows=st.sampled_from([4, 9]),
        batch=st.integers(1, 3),
        seed=st.sampled_from([None, 4]),
    )
    def setup(self, transport: str, seq_len: int, read_rows: int, batch: int, seed: Any) -> None:
        root = Path(os.environ["PACK_MODEL_ROOT"]) / "one"
        store = Store("local", fsspec.filesystem("file"), f"file://{root}", {})
        if (root / "web" / "part-1.jsonl").exists():
            self.url = store.url("web/*.jsonl")
        else:
            self.url = write_corpora(store, WEB)["web"]
        self.options: dict[str, Any] = {
            "batch_size": batch,
            "shuffle_seed": seed,
            "shuffle_window": 24,
            "transform": ingest.Tokenize(mix_tokenize),
            "pack": ingest.Pack(seq_len=seq_len, read_rows=read_rows, max_open=4, pad_id=0),
        }
        self._open(transport)

    def _close(self) -> None:
        self.loop = None
        for rank in self.ranks:
            ray.kill(rank)
        self.ranks = []
        if isinstance(self.stream, ingest.RayStream):
            self.stream.shutdown()
        elif self.stream is not None:
            self.stream.close()

    def _open(self, transport: str, state: dict[str, Any] | None = None) -> None:
        self._close()
        if transport.startswith("ray"):
            self.stream = self.source = ingest.RayStream(
                self.url,
                world_size=int(transport[-1]),
                readers=ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.25),
                timeout_s=60,
                **self.options,
            )
            if state is not None:
                self.stream.load_state_dict(state)
            self.ranks = [
                _PackingRank.remote(self.stream.rank_iterator(r))
                for r in range(self.stream.world_size)
            ]
            return
        self.stream = self.source = ingest.Stream(self.url, **self.options)
        if state is not None:
            self.stream.load_state_dict(state)
        if transport != "stream":
            self.source = ingest.DataLoader(self.stream, num_workers=int(transport[-1]))

    @rule(k=st.integers(1, 8))
    def take(self, k: int) -> None:
        if self.ranks:
            got = ray.get([rank.take.remote(k) for rank in self.ranks], timeout=240)
            assert len({len(b) for b in got}) == 1, f"ranks took {[len(b) for b in got]}"
            self.handed.update(t for batches in got for b in batches for t in b)
            return
        for _ in range(k):
            if self.loop is None:
                self.loop = iter(self.source)
            batch = next(self.loop, None)
            if batch is None:
                self.loop = None
                return
            self.handed.update(t for t in batch["input_ids"].flatten().tolist() if t)

    @rule()
    def state(self) -> None:
        if self.ranks:
            states = ray.get([rank.state.remote() for rank in self.ranks], timeout=240)
            assert all(s == states[0] for s in states), "the ranks' states differ"
            state = states[0]
        else:
            state = self.source.state_dict()
        state = json.loads(json.dumps(state))
        due = mix_due("web", state)
        assert self.handed == due, (
            f"handed out but not due {sum((self.handed - due).values())} tokens, due but "
            f"not handed out {sum((due - self.handed).values())}"
        )
        self.saved = (state, Counter(self.handed))

    @rule()
    def leave(self) -> None:
        if self.ranks:
            ray.get([rank.leave.remote() for rank in self.ranks], timeout=60)
        self.loop = None

    @precondition(lambda self: self.saved is not None)
    @rule(transport=st.sampled_from(PACK_TRANSPORTS))
    def resume(self, transport: str) -> None:
        """Resume from the last state in another transport and world size (or the same)."""
        assert self.saved is not None
        state, handed = self.saved
        self._open(transport, state)
        self.handed = Counter(handed)

    def teardown(self) -> None:
        self._close()


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_packing_through_every_transport_and_world_size_hands_out_every_token_as_due(
    tmp_path: Path,
) -> None:
    os.environ["PACK_MODEL_ROOT"] = str(tmp_path / "corpus")
    run_state_machine_as_test(
        RayPackMachine,
        settings=settings(
            max_examples=EXAMPLES or 5,
            stateful_step_count=8,
            deadline=None,
            derandomize=not EXAMPLES,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
