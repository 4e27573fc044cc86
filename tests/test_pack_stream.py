"""Documents tokenized and packed into sequences by a Stream (ingest.engine.pack): every token
once per epoch, checked token by token, across stops at any batch, loops left early, a
filter before packing, both packing methods and two epochs; on local disk and loopback S3.

Each document's tokens say where they came from: token ``j`` of document ``d`` is
``d * 10_000 + j + 1`` (no 0: the padding), so the tokens handed out name every document and
token, and a token lost or repeated shows.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import ingest
from ingest.core.assign import Span
from ingest.core.errors import StateError
from ingest.engine.pack import Pack, PackedRank
from ingest.testing import Store
from tests.carry import carried_rows, carry_consumed

SEQ_LEN = 64
DOCS = 192  # 12 read steps of 16: no remainder
READ_ROWS = 16
SHARDS = 3


def lengths(n: int = DOCS, seed: int = 0) -> list[int]:
    """Token counts: lognormal (median ~25), some empty, some beyond ``SEQ_LEN`` (up to 4x)."""
    rng = np.random.default_rng(seed)
    out = np.minimum(rng.lognormal(np.log(25), 1.0, n).astype(int), 4 * SEQ_LEN)
    out[rng.choice(n, 5, replace=False)] = 0
    return [int(x) for x in out]


def write_corpus(store: Store, n: int = DOCS) -> str:
    """JSONL shards of ``{"doc": d, "text": "<d> <tokens>"}``; the glob."""
    per = -(-n // SHARDS)
    for s, first in enumerate(range(0, n, per)):
        lines = [
            json.dumps({"doc": d, "text": f"{d} {k}"})
            for d, k in zip(
                range(first, min(first + per, n)), lengths(n)[first : first + per], strict=True
            )
        ]
        store.write(f"docs/part-{s}.jsonl", ("\n".join(lines) + "\n").encode())
    return store.url("docs/*.jsonl")


def tokenize(texts: list[str]) -> list[list[int]]:
    """Text ``"<d> <k>"`` -> the ``k`` tokens of document ``d``."""
    out = []
    for text in texts:
        d, k = map(int, text.split())
        out.append([d * 10_000 + j + 1 for j in range(k)])
    return out


def every_token(n: int = DOCS) -> Counter[int]:
    return Counter(t for d, k in enumerate(lengths(n)) for t in tokenize([f"{d} {k}"])[0])


def stream(url: str, store: Store, **options: Any) -> ingest.Stream:
    pack = options.pop("pack", Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS))
    return ingest.Stream(
        url,
        batch_size=options.pop("batch_size", 4),
        transform=options.pop("transform", ingest.Tokenize(tokenize)),
        pack=pack,
        storage_options=store.storage_options,
        **options,
    )


def tokens_of(batches: Sequence[dict[str, Any]]) -> Counter[int]:
    return Counter(t for b in batches for t in b["input_ids"].flatten().tolist() if t)


def run_with_stops(make: Any, stops: Sequence[int]) -> tuple[list[dict[str, Any]], list[Any]]:
    """One epoch, stopped after the batches ``stops`` (counted from the start): each stop
    saves a state (through JSON) and a new stream loads it. The batches, and the states."""
    s = make()
    got: list[dict[str, Any]] = []
    states = []
    it: Iterator[dict[str, Any]] = iter(s)
    for batch in it:
        got.append(batch)
        if len(got) in stops:
            state = json.loads(json.dumps(s.state_dict()))
            states.append(state)
            s.close()
            s = make()
            s.load_state_dict(state)
            it = iter(s)
            got.extend(it)
            break
    return got, states


@pytest.mark.parametrize("method", ["best_fit", "greedy"])
@pytest.mark.parametrize("seed", [None, 7])
def test_every_token_once_through_stops_at_any_batch(
    local: Store, method: str, seed: int | None
) -> None:
    url = write_corpus(local)
    pack = Pack(seq_len=SEQ_LEN, method=method, max_open=8, read_rows=READ_ROWS)  # type: ignore[arg-type]

    def make() -> ingest.Stream:
        return stream(url, local, pack=pack, shuffle_seed=seed, shuffle_window=48)

    whole = list(make())
    assert tokens_of(whole) == every_token()
    total = len(whole)
    cut = 0
    rng = np.random.default_rng(0 if seed is None else seed)
    for stop in sorted({1, 2, total - 1, *rng.integers(1, total, 6).tolist()}):
        got, states = [], []
        s = make()
        at = 0
        # Stop after `stop` batches, then twice more further on, each through a new stream.
        marks = {stop, min(stop + 3, total - 1), min(stop + 7, total - 1)}
        while True:
            batches = list(_take(s, marks, at))
            got.extend(batches)
            at += len(batches)
            if at not in marks:
                break
            state = json.loads(json.dumps(s.state_dict()))
            states.append(state)
            cut += len(state.get("pack", {}).get("tokens", []))
            s = make()
            s.load_state_dict(state)
            marks.discard(at)
        assert tokens_of(got) == every_token(), (stop, method, seed)
    assert cut, "some state recorded a document cut across batches"


def _take(s: ingest.Stream, marks: set[int], at: int) -> Iterator[dict[str, Any]]:
    """The batches of the rest of ``s``'s epoch, up to the next mark after ``at``."""
    for batch in s:
        yield batch
        at += 1
        if at in marks:
            return


def test_a_batch_is_sequences_with_labels_positions_and_boundaries(local: Store) -> None:
    url = write_corpus(local)
    s = stream(url, local)
    batches = list(s)
    for b in batches:
        ids, labels, pos, cu = b["input_ids"], b["labels"], b["position_ids"], b["cu_seqlens"]
        assert ids.dtype == torch.int64 and ids.shape[1] == SEQ_LEN and cu.dtype == torch.int32
        flat_ids, flat_pos, flat_labels = ids.flatten(), pos.flatten(), labels.flatten()
        starts = cu[:-1].long()
        assert (flat_pos[starts] == 0).all() and int(cu[-1]) == ids.numel()
        assert int(b["max_seqlen"]) == int(torch.diff(cu).max())
        # A label is its own token, except at a piece's first token and on padding.
        mask = torch.ones_like(flat_ids, dtype=torch.bool)
        mask[starts] = False
        mask &= flat_ids != 0
        assert (flat_labels[mask] == flat_ids[mask]).all()
        assert (flat_labels[~mask] == -100).all()
        # Within a piece, tokens of one document follow each other.
        for a, z in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            piece = flat_ids[a:z][flat_ids[a:z] != 0]
            if len(piece) > 1:
                assert set((piece // 10_000).tolist()) == {int(piece[0]) // 10_000}
                assert (torch.diff(piece) == 1).all()
    assert all(len(b["input_ids"]) == 4 for b in batches[:-1])
    real = sum(int((b["input_ids"] != 0).sum()) for b in batches)
    assert real == sum(every_token().values()) == s.stats["tokens"]
    assert s.stats["padding_tokens"] == sum(b["input_ids"].numel() for b in batches) - real
    assert s.stats["rows_delivered"] == sum(len(b["input_ids"]) for b in batches)


def test_a_loop_left_early_goes_on_with_the_rest(local: Store) -> None:
    url = write_corpus(local)
    s = stream(url, local, shuffle_seed=1)
    got: list[dict[str, Any]] = []
    for stop in (3, 5, 1):
        for batch in s:
            got.append(batch)
            if len(got) % 10 == stop:
                break
    got.extend(s)
    assert tokens_of(got) == every_token()


def test_two_epochs_each_token_once_with_a_state_in_the_second(s3_store: Store) -> None:
    url = write_corpus(s3_store)
    s = stream(url, s3_store, shuffle_seed=2)
    first = list(s)
    assert tokens_of(first) == every_token()
    second: list[dict[str, Any]] = []
    for batch in s:
        second.append(batch)
        if len(second) == 5:
            break
    state = s.state_dict()
    assert state["version"] == 7 and state["progress"]["epoch"] == 1 and state["pack"]["tokens"]
    t = stream(url, s3_store, shuffle_seed=2)
    t.load_state_dict(state)
    second.extend(t)
    assert tokens_of(second) == every_token()
    assert [b["input_ids"].tolist() for b in first] != [b["input_ids"].tolist() for b in second]


class KeepEven(ingest.Stage):
    """Drops odd documents, then tokenizes the rest (a filter before packing)."""

    def __call__(self, table: pa.Table) -> ingest.Staged:
        keep = np.flatnonzero(np.asarray(table.column("doc").to_pylist()) % 2 == 0)
        kept = table.take(keep)
        ids = tokenize(kept.column("text").to_pylist())
        return ingest.Staged(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int64()))}), keep)


def test_documents_dropped_before_packing_are_consumed_with_their_step(local: Store) -> None:
    url = write_corpus(local)
    want = Counter({t: c for t, c in every_token().items() if (t // 10_000) % 2 == 0})
    got, states = run_with_stops(lambda: stream(url, local, transform=KeepEven()), (4,))
    assert tokens_of(got) == want and states


def test_the_epochs_remainder_is_carried_into_the_next_epoch(local: Store) -> None:
    url = write_corpus(local, DOCS + 5)  # 5 documents past the last read step
    s = stream(url, local)
    first = tokens_of(list(s))
    carried = s.state_dict()["distributed"]["carry"]["spans"]
    assert sum(stop - start for _, start, stop in carried) == 5
    every = every_token(DOCS + 5)
    late = every - first  # the carried documents' tokens, and nothing else
    assert max(first.values()) == 1 and not first - every
    assert 0 < len({t // 10_000 for t in late}) <= 5
    second = tokens_of(list(s))  # they come in the next epoch, beside its own rows
    assert all(second[t] >= 1 for t in late) and max(second.values()) <= 2


def test_refusals_name_the_rule(local: Store) -> None:
    url = write_corpus(local)
    with pytest.raises(ingest.ConfigError, match="on_error"):
        stream(url, local, read=ingest.ReadOptions(on_error="skip"))
    with pytest.raises(ingest.ConfigError, match="name the token id column"):
        next(iter(stream(url, local, transform=None)))
    halves = ingest.FlatMap(lambda row: [row, row])  # two rows of each document
    with pytest.raises(ingest.ConfigError, match="several rows of one input row, before Pack"):
        next(iter(stream(url, local, transform=halves)))
    plain = ingest.Stream(url, batch_size=8, storage_options=local.storage_options)
    s = stream(url, local)
    next(iter(s))
    next(iter(s))
    state = s.state_dict()
    assert state["pack"]["tokens"]
    with pytest.raises(StateError, match="pack="):
        plain.load_state_dict(state)
    state["pack"]["tokens"] = state["pack"]["tokens"][::-1] * 2
    with pytest.raises(StateError, match=r"pack\.tokens"):
        stream(url, local).load_state_dict(state)


def test_max_lag_bounds_the_documents_a_state_lists(local: Store) -> None:
    url = write_corpus(local)

    def most_listed(lag: int) -> int:
        pack = Pack(seq_len=SEQ_LEN, max_open=16, read_rows=READ_ROWS, max_lag=lag)
        s = stream(url, local, pack=pack, shuffle_seed=3)
        most = 0
        for _ in s:
            most = max(most, len(s.state_dict().get("pack", {}).get("tokens", [])))
        return most

    assert most_listed(1) <= 3 * READ_ROWS < most_listed(10**6)


@pytest.mark.parametrize(("workers", "then"), [(2, 3), (0, 2), (3, -1)])
def test_dataloader_workers_tokenize_and_the_main_process_packs(
    local: Store, workers: int, then: int
) -> None:
    """Workers read and tokenize their shares; every token once across a stop that resumes
    with another worker count (-1: in a Stream), and the state loads either way."""
    url = write_corpus(local)
    first = stream(url, local, shuffle_seed=4)
    loader = ingest.DataLoader(first, num_workers=workers)
    got: list[dict[str, Any]] = []
    for batch in loader:
        got.append(batch)
        if len(got) == 7:
            break
    # The stream's stats count what the loader's packing handed out (they counted nothing).
    assert first.stats["tokens"] == sum(tokens_of(got).values())
    assert first.stats["rows_delivered"] == sum(len(b["input_ids"]) for b in got)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["version"] == 7 and state["pack"]["tokens"]
    resumed = stream(url, local, shuffle_seed=4)
    resumed.load_state_dict(state)
    source = resumed if then < 0 else ingest.DataLoader(resumed, num_workers=then)
    rest = []
    for batch in source:
        rest.append(batch)
        # A state at every batch: a document cut before the stop and finished since is
        # consumed whole, and no worker's packing may still list it with its old offset.
        assert source.state_dict()["progress"]["step"] >= 0
    assert all(b["input_ids"].shape[1] == SEQ_LEN for b in rest)
    assert resumed.stats["tokens"] == sum(tokens_of(rest).values())
    # Another worker count shares the rest in steps of its own: what does not fill one step
    # on every worker is carried into the next epoch, as rows are.
    carried = carried_tokens(source.state_dict())
    assert tokens_of(got + rest) == every_token() - carried
    # The next epoch packs the carried documents from their offsets, then its own.
    second = tokens_of(list(source))
    assert second == every_token() - carried_tokens(source.state_dict()) + carried


def test_cut_documents_in_the_epochs_remainder_are_carried_with_their_offsets() -> None:
    """A resume that shares the rest anew (another world size) may leave a document cut
    before the stop in the epoch's remainder: at the epoch's end its offset moves to the
    next epoch's carried row (segment 0), as a copy owed does; the other offsets are spent,
    and none is kept when the remainder is dropped."""

    from ingest.core.epoch import PlannedEpoch

    class Plan:  # the parts of a PlannedEpoch the carry takes; a copy owed, at its offset
        assignment = SimpleNamespace(remainder=(Span(1, 10, 12), Span(0, 3, 4)))
        owed = ((0, 5, 2),)
        steps = 3  # an epoch with steps (one with none carries every copy)
        cut_at_end = PlannedEpoch.cut_at_end
        carried_out = PlannedEpoch.carried_out

        def __init__(self) -> None:
            self.cut: dict[tuple[int, int, int], int] = {}

    def packing(remainder: str) -> PackedRank:
        plan = Plan()
        book = SimpleNamespace(
            config=SimpleNamespace(remainder=remainder), plan=lambda e: plan, log=None
        )
        packed = PackedRank(Pack(seq_len=8), 2, cast(Any, None), cast(Any, book))
        packed.begin(["s3://b/a.jsonl", "s3://b/b.jsonl"])
        for shard, row, offset in ((1, 11, 5), (1, 2, 7), (0, 3, 1)):
            packed._offsets[1 << 62 | shard << 31 | row] = offset
        return packed

    carried = packing("carry")
    carried._carry(0)
    assert sorted(carried._loaded) == [
        (0, "s3://b/a.jsonl", 3, 1),
        (0, "s3://b/a.jsonl", 5, 2),
        (0, "s3://b/b.jsonl", 11, 5),
    ]
    assert not carried._offsets
    dropped = packing("drop")
    dropped._carry(0)
    assert not dropped._loaded and not dropped._offsets


def consumed_docs(state: dict[str, Any], n: int = DOCS) -> set[int]:
    """The documents of ``state``'s carry spans consumed already (:func:`carry_consumed`)."""
    per = -(-n // SHARDS)
    return {shard * per + row for shard, row in carry_consumed(state)}


def carried_tokens(state: dict[str, Any], n: int = DOCS) -> Counter[int]:
    """The tokens of the documents ``state`` (at an epoch's start) carries into its epoch
    (:func:`carried_rows`), and of the copies it owes."""
    per = -(-n // SHARDS)
    docs = [shard * per + row for shard, row in carried_rows(state)]
    # A carried document cut before the stop carries only its tokens from its offset.
    start = {
        shard * per + row: offset
        for segment, shard, row, offset in state.get("pack", {}).get("tokens", [])
        if segment == 0
    }
    owed = [
        (shard * per + row, offset)
        for shard, row, offset in state["distributed"].get("owed", [])  # copies due again
    ]
    return Counter(
        t
        for d, at in [*((d, start.get(d, 0)) for d in docs), *owed]
        for t in tokenize([f"{d} {lengths(n)[d]}"])[0][at:]
    )


def tokens_due(state: dict[str, Any], n: int, epochs: int) -> Counter[int]:
    """The times each token of the corpus of ``n`` documents was due by ``state``, taken at
    the start of epoch ``epochs``: once per epoch, less what the state carries into its epoch
    or owes (a row may be both: its two copies left over, :mod:`ingest.core.carry`)."""
    due: Counter[int] = Counter()
    for _ in range(epochs):
        due += every_token(n)
    carried = carried_tokens(state, n)
    assert not carried - due, "the state carries or owes more than was due"
    return due - carried


def test_a_row_carried_and_owed_is_due_twice_less_than_its_epochs() -> None:
    """The witness of the Ray Train tests counts each copy: a row carried into the epoch and
    owed once more (``distributed.owed``) has both copies' tokens still to come. (Counting
    the carried tokens by key, not by multiplicity, made a correct run look 'short'.)"""
    per = -(-DOCS // SHARDS)
    k = lengths(DOCS)[per + 3]
    state = {
        "distributed": {"carry": {"spans": [[1, 3, 4]]}, "owed": [[1, 3, 0]]},
        "progress": {},
    }
    due = tokens_due(state, DOCS, 2)
    row = tokenize([f"{per + 3} {k}"])[0]
    assert k and all(due[t] == 0 for t in row)
    other = tokenize([f"{per + 4} {lengths(DOCS)[per + 4]}"])[0]
    assert all(due[t] == 2 for t in other)
    cut = {**state, "pack": {"tokens": [[0, 1, 3, 1]]}}  # the carried copy cut after 1
    due = tokens_due(cut, DOCS, 2)
    assert due[row[0]] == 1 and all(due[t] == 0 for t in row[1:])


def test_documents_without_a_token_at_the_end_make_no_batch_of_padding(local: Store) -> None:
    # 16 documents of 4 tokens fill one sequence exactly; the 16 after them have none.
    lines = [json.dumps({"text": f"{d} {4 if d < 16 else 0}"}) for d in range(32)]
    local.write("empty/part-0.jsonl", ("\n".join(lines) + "\n").encode())
    s = stream(local.url("empty/*.jsonl"), local)
    batches = list(s)
    assert all(bool((seq != 0).any()) for b in batches for seq in b["input_ids"])
    assert tokens_of(batches) == Counter(d * 10_000 + j + 1 for d in range(16) for j in range(4))
    assert s.state_dict()["progress"]["epoch"] == 1  # the empty documents were consumed
    none = [json.dumps({"text": f"{d} 0"}) for d in range(16)]
    local.write("none/part-0.jsonl", ("\n".join(none) + "\n").encode())
    s = stream(local.url("none/*.jsonl"), local)
    assert list(s) == [] and s.state_dict()["progress"]["epoch"] == 1


def test_provenance_names_every_piece_of_every_sequence(local: Store) -> None:
    """``Pack(provenance=True)``: each batch's ``pieces`` say which tokens of which row fill
    each sequence, in order; together they are the sequence's tokens."""
    url = write_corpus(local)
    per = -(-DOCS // SHARDS)
    pack = Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, provenance=True)
    seen = 0
    for batch in stream(url, local, pack=pack, shuffle_seed=2):
        for seq, ids in enumerate(batch["input_ids"].tolist()):
            named = [
                d * 10_000 + j + 1
                for s, shard, row, start, stop in batch["pieces"].tolist()
                if s == seq
                for d in [shard * per + row]
                for j in range(start, stop)
            ]
            assert [t for t in ids if t] == named
            seen += len(named)
    assert seen == sum(every_token().values())


def _docs_of(spans: Sequence[Sequence[int]], n: int) -> list[int]:
    """The documents of ``[shard, start, stop]`` spans of a corpus of ``n`` (shards by URL)."""
    per = -(-n // SHARDS)
    return [shard * per + row for shard, start, stop in spans for row in range(start, stop)]


def test_a_carried_row_comes_in_the_next_epoch_s_first_step_and_is_never_owed(
    local: Store,
) -> None:
    """Issue 31, finding 4. One process over JSONL (row counts unknown: the remainder is
    what the feed read after its last full batch) with a window that holds the whole epoch:
    the rows carried into an epoch come in its first step (they are fewer than a step), so
    none is left over again with its own copy of the epoch, and nothing is ever owed. (A
    window as large as the share shuffled them anywhere in it: seen at batches 0-117 of
    122, and a row carried and left over again was owed two epochs on.)"""
    n = DOCS + 5
    url = write_corpus(local, n)
    for seed in (3, 4, 5):
        s = ingest.Stream(url, batch_size=16, shuffle_seed=seed, columns=["doc"])
        for epoch in range(6):
            start = s.state_dict()
            assert start["progress"]["epoch"] == epoch
            assert not start["distributed"].get("owed"), (seed, epoch, "a copy owed")
            carried = _docs_of(start["distributed"]["carry"]["spans"], n)
            batches = [b["doc"].tolist() for b in s]
            rows = [d for b in batches for d in b]
            assert len(carried) < 16, "fewer than a step"
            assert set(carried) <= set(batches[0]), (
                f"seed {seed}, epoch {epoch}: carried rows {sorted(carried)} not all in the "
                f"first step; seen at batches "
                f"{sorted({k for k, b in enumerate(batches) for d in b if d in carried})} "
                f"of {len(batches)}"
            )
            end = s.state_dict()["distributed"]
            left = _docs_of(end["carry"]["spans"], n) + _docs_of(
                [(shard, row, row + 1) for shard, row, _ in end.get("owed", [])], n
            )
            assert Counter(rows) + Counter(left) == Counter(carried) + Counter(range(n)), (
                "every row once, but the carried ones twice and the ones left over (or owed) not"
            )
        s.close()


SEEDS = (3, 4)


def test_a_packed_stream_delivers_every_carried_document_in_the_next_epoch(local: Store) -> None:
    """Issue 31, finding 4, with ``Tokenize`` + ``Pack`` through stops that change the
    transport (Stream -> DataLoader(2 workers) -> Stream): a document carried out of an
    epoch is handed out whole in the next one, and no state owes a copy."""
    n = DOCS + 5
    url = write_corpus(local, n)
    every = every_token(n)
    for seed in SEEDS:
        make = functools.partial(stream, url, local, shuffle_seed=seed)
        s = make()
        source: Any = s
        for epoch in range(6):
            start = json.loads(json.dumps(source.state_dict()))
            assert not start["distributed"].get("owed"), (seed, epoch, start["distributed"])
            due = carried_tokens(start, n)
            got = tokens_of(list(source))
            end = source.state_dict()
            assert got + carried_tokens(end, n) == every + due, (seed, epoch)
            assert not due - got, f"seed {seed}: a document carried into epoch {epoch} missed it"
            # The next epoch in another transport: a DataLoader of 2 workers, then a Stream.
            s.close()
            s = make()
            s.load_state_dict(end)
            source = ingest.DataLoader(s, num_workers=2) if epoch % 2 == 0 else s
        s.close()


def test_a_null_in_a_column_packing_leaves_out_is_no_error(local: Store) -> None:
    """The packer makes the batches of its own columns: a null in another integer column
    of the documents never reaches a tensor, so the feed lets it through."""
    docs = [{"doc": d, "text": f"{d} 5", "score": None if d == 3 else d} for d in range(64)]
    local.write("nulls/a.jsonl", "".join(json.dumps(doc) + "\n" for doc in docs).encode())
    every = Counter(d * 10_000 + j + 1 for d in range(64) for j in range(5))

    def plain(table: pa.Table) -> pa.Table:  # a function, not a stage
        ids = pa.array(tokenize(table.column("text").to_pylist()), pa.list_(pa.int64()))
        return table.append_column("input_ids", ids)

    for transform in (ingest.Tokenize(tokenize), plain):
        url = local.url("nulls/*.jsonl")
        got = tokens_of(list(stream(url, local, shuffle_seed=None, transform=transform)))
        assert got and not got - every and 3 * 10_000 + 1 in got


@pytest.mark.parametrize(
    ("ids", "kind", "says"),
    [
        ([[1, 2], [3, -5, 6]], pa.list_(pa.int64()), r"row 1: .*id -5 is out of range"),
        ([[1, 2], [3, 2**40]], pa.list_(pa.int64()), r"row 1: .*id 1099511627776 is out of"),
        ([[1.0, 2.0], [10.7, 11.2]], pa.list_(pa.float64()), r"list<element: double>.*integers"),
        ([[[1, 2]], [[3]]], pa.list_(pa.list_(pa.int64())), r"list<element: list<.*one list"),
    ],
    ids=["negative", "past 2**31", "floats", "nested"],
)
def test_token_ids_made_before_pack_are_checked_as_tokenize_checks_its_own(
    tmp_path: Path, ids: list[Any], kind: pa.DataType, says: str
) -> None:
    """Found by a probe: ``Pack`` over an id column made beforehand (no ``Tokenize``) took
    any list: a negative id and one past 2**31 reached ``input_ids`` (an embedding index
    error or a device-side assert later, far from the shard), float ids were cut to
    integers without a word (10.7 -> 10), lists of lists failed as numpy's bare ValueError.
    Refused, naming the shard and row (or the column's type) and the fix."""
    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"ids": pa.array(ids, kind)}), path)
    s = ingest.Stream(
        str(path), batch_size=1, pack=ingest.Pack(seq_len=2, column="ids", pad_id=0, read_rows=2)
    )
    with pytest.raises(ingest.IngestError, match=says) as err:
        next(iter(s))
    if "row 1" in says:
        assert str(path) in str(err.value)
