"""Token-budget batches (ingest.engine.token_batches): whole documents of similar length, at
most ``max_tokens`` a batch; every token once through stops and resumes on every transport
(Stream, DataLoader, RayStream at 3 -> 2 -> 4 ranks), checked token by token.

The batcher is a Grouping plugged into the packing rank: no transport knows of it. Token
``j`` of document ``d`` is ``d * 10_000 + j + 1`` (see ``test_pack_stream``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

import ingest
from ingest.core.packing import IGNORE, Packed
from ingest.engine.token_batches import TokenBatcher
from ingest.testing import Store
from tests.test_pack_stream import carried_tokens, every_token, tokenize, write_corpus

MAX_TOKENS, READ_ROWS = 128, 16


def batches_of(batcher: TokenBatcher, sizes: list[int], lag: int | None = None) -> list[Packed]:
    """``sizes[k]`` tokens for document ``k``, then the end; with ``lag``, the batches
    holding a document ``lag`` or more before the newest are closed as it comes."""
    out: list[Packed] = []
    for key, n in enumerate(sizes):
        out += batcher.add(key, np.arange(n) + key * 10_000 + 1)
        if lag is not None and key >= lag:
            out += batcher.close_before(key - lag)
    return out + batcher.flush()


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), max_size=60),
    max_tokens=st.integers(1, 200),
    max_rows=st.integers(1, 8),
    spread=st.sampled_from([1.1, 1.25, 2.0]),
    lag=st.none() | st.integers(0, 5),
)
def test_every_batch_keeps_its_budget_and_every_token_leaves_once_in_order(
    sizes: list[int], max_tokens: int, max_rows: int, spread: float, lag: int | None
) -> None:
    batcher = TokenBatcher(max_tokens, max_rows, spread)
    out = batches_of(batcher, sizes, lag)
    at: dict[int, int] = {}
    done = set()
    for group in out:
        rows = [len(t) for t in group.tokens]
        if rows:
            assert len(rows) <= max_rows and len(rows) * max(rows) <= max_tokens
            assert max(rows) <= min(rows) * spread or len(rows) == 1, rows
        for piece in group.pieces:  # in token order, from the first, to the end
            assert piece.start == at.get(piece.key, 0)
            at[piece.key] = piece.stop
            if piece.last:
                assert piece.stop == sizes[piece.key] and piece.key not in done
                done.add(piece.key)
    assert done == set(range(len(sizes)))
    again = batches_of(TokenBatcher(max_tokens, max_rows, spread), sizes, lag)
    assert [g.pieces for g in again] == [g.pieces for g in out], "a function of the documents"


def test_a_document_resumed_at_its_offset_gives_only_the_rest() -> None:
    batcher = TokenBatcher(16, 8)
    out = batcher.add(7, np.arange(40), start=30) + batcher.flush()
    pieces = [p for g in out for p in g.pieces]
    assert [(p.start, p.stop, p.last) for p in pieces] == [
        (30, 46, False),
        (46, 62, False),
        (62, 70, True),
    ]


def test_a_batch_is_padded_rows_with_a_mask_labels_and_positions() -> None:
    settings_ = ingest.TokenBatches(max_tokens=32, spread=2.0, provenance=True)
    batcher = settings_.grouper(1024)
    out = [g for k, n in enumerate([5, 7, 6]) for g in batcher.add(k, np.arange(n) + 100 * k + 1)]
    out += batcher.flush()
    assert len(out) == 1
    got = settings_.collate(out, pad_id=0)
    ids, mask = got.arrays["input_ids"], got.arrays["attention_mask"]
    assert isinstance(ids, np.ndarray) and isinstance(mask, np.ndarray)
    assert ids.shape == (3, 7) and mask.sum(axis=1).tolist() == [5, 7, 6]
    assert ids[0].tolist() == [1, 2, 3, 4, 5, 0, 0]
    labels = got.arrays["labels"]
    assert isinstance(labels, np.ndarray)
    assert labels[0].tolist() == [1, 2, 3, 4, 5, IGNORE, IGNORE]
    assert got.real_tokens == 18 and got.size == 21
    assert got.pieces.tolist() == [[0, 0, 0, 5, 1], [1, 1, 0, 7, 1], [2, 2, 0, 6, 1]]


def test_settings_are_checked_and_a_mixture_is_refused(local: Store) -> None:
    with pytest.raises(ingest.ConfigError, match="max_tokens"):
        ingest.TokenBatches(max_tokens=0)
    with pytest.raises(ingest.ConfigError, match="spread"):
        ingest.TokenBatches(max_tokens=8, spread=1.0)
    url = write_corpus(local)
    with pytest.raises(ingest.ConfigError, match=r"Mix.*ingest.Pack"):
        ingest.Stream(
            ingest.Mix({"a": url, "b": url}, weights={"a": 1, "b": 1}),
            transform=ingest.Tokenize(tokenize),
            pack=ingest.TokenBatches(max_tokens=64),
            storage_options=local.storage_options,
        )


def settings_() -> ingest.TokenBatches:
    return ingest.TokenBatches(max_tokens=MAX_TOKENS, read_rows=READ_ROWS, pad_id=0)


def stream(url: str, store: Store, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        url,
        transform=ingest.Tokenize(tokenize),
        pack=settings_(),
        shuffle_seed=options.pop("shuffle_seed", 5),
        shuffle_window=48,
        storage_options=store.storage_options,
        **options,
    )


def tokens_of(batches: list[dict[str, Any]]) -> Counter[int]:
    return Counter(t for b in batches for t in b["input_ids"].flatten().tolist() if t)


def check_budget(batch: dict[str, Any]) -> None:
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.numel() <= MAX_TOKENS and mask.shape == ids.shape
    assert (ids[mask == 0] == 0).all() and (ids[mask == 1] != 0).all()


def test_a_stream_hands_out_every_token_once_through_stops(local: Store) -> None:
    url = write_corpus(local)
    whole = list(stream(url, local))
    for batch in whole:
        check_budget(batch)
    assert tokens_of(whole) == every_token()
    rows = [len(b["input_ids"]) for b in whole]
    assert max(rows) > 1 and len(set(rows)) > 2, "batches of several rows, varying in number"
    in_flight = 0
    for stop in (1, len(whole) // 3, len(whole) - 2):
        s = stream(url, local)
        got: list[dict[str, Any]] = []
        for batch in s:
            got.append(batch)
            if len(got) == stop:
                break
        state = json.loads(json.dumps(s.state_dict()))
        in_flight += len(state.get("pack", {}).get("tokens", []))
        s.close()
        resumed = stream(url, local)
        resumed.load_state_dict(state)
        got += list(resumed)
        assert tokens_of(got) == every_token(), stop
    assert in_flight, "a state listed documents handed out beyond its read steps acked"


@pytest.mark.parametrize(("workers", "then"), [(2, 3), (2, -1)])
def test_dataloader_workers_tokenize_and_the_main_process_batches(
    local: Store, workers: int, then: int
) -> None:
    url = write_corpus(local)
    loader = ingest.DataLoader(stream(url, local), num_workers=workers)
    got: list[dict[str, Any]] = []
    for batch in loader:
        check_budget(batch)
        got.append(batch)
        if len(got) == 9:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = stream(url, local)
    resumed.load_state_dict(state)
    source = resumed if then < 0 else ingest.DataLoader(resumed, num_workers=then)
    rest = list(source)
    carried = carried_tokens(source.state_dict())
    assert tokens_of(got + rest) == every_token() - carried


@ray.remote(num_cpus=0)
def consume(it: Any, stop_after: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"batches": [], "state": None}
    for batch in it:
        check_budget(batch)
        out["batches"].append([t for t in batch["input_ids"].flatten().tolist() if t])
        if stop_after is not None and len(out["batches"]) == stop_after:
            out["state"] = it.state_dict()
            return out
    return out


@pytest.mark.usefixtures("ray_session")
def test_ray_ranks_take_equal_steps_and_every_token_once_at_3_then_2_then_4(
    s3_store: Store,
) -> None:
    url = write_corpus(s3_store, 480)
    handed: Counter[int] = Counter()
    state = None
    for world_size, stop in ((3, 2), (2, 3), (4, None)):
        with ingest.RayStream(
            url,
            world_size=world_size,
            transform=ingest.Tokenize(tokenize),
            pack=settings_(),
            shuffle_seed=3,
            shuffle_window=64,
            storage_options=s3_store.storage_options,
            timeout_s=120,
        ) as rs:
            if state is not None:
                rs.load_state_dict(state)
            refs = [consume.remote(rs.rank_iterator(r), stop) for r in range(world_size)]
            got: list[dict[str, Any]] = ray.get(refs, timeout=240)
            assert len({len(r["batches"]) for r in got}) == 1, "equal steps on every rank"
            handed += Counter(t for r in got for b in r["batches"] for t in b)
            if stop is None:
                state = rs.state_dict()
                continue
        states = [r["state"] for r in got]
        assert all(s == states[0] for s in states)
        state = json.loads(json.dumps(states[0]))
    assert state is not None and state["progress"]["epoch"] == 1
    assert handed == every_token(480) - carried_tokens(state, 480)
