"""A weighted mixture in the Ray reader pool (ingest.distributed.ray_mix), on the loopback S3
server and a real local Ray: every rank draws the same sources in the same order, each within
one sequence of its weight at every prefix; stopped and resumed at 3 -> 2 -> 4 ranks, with the
weights changed at the last resume, every token is handed out once per epoch of its source
(rows carried into a source's next epoch are handed out there, copies owed in the epoch
after), checked token by token.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
import ray

import ingest
from ingest.core.errors import StateError
from ingest.distributed.ray_mix import MixedRayStream
from ingest.testing import Store
from tests.test_mix import NAMES, check_carried, deviation, write_corpora
from tests.test_pack_stream import tokenize

pytestmark = pytest.mark.usefixtures("ray_session")

SEQ_LEN, READ_ROWS, BATCH = 64, 16, 4
# Read steps of 16: the code source's epochs hold few per rank, so rows carried into an epoch
# fall in a rank's surplus again with their own copies, each carried once and owed once
# (ingest.core.carry; before, such a carried copy was dropped: 22 documents in this test).


@ray.remote(num_cpus=0)
def consume(it: Any, stop_after: int | None = None) -> dict[str, Any]:
    """A rank's draws (source, source epoch, tokens) of one epoch of the mixture, until
    ``stop_after`` batches, then a state."""
    out: dict[str, Any] = {"draws": [], "state": None}
    for n, batch in enumerate(it, start=1):
        assert batch["input_ids"].shape == (BATCH, SEQ_LEN)
        for seq, source, epoch in zip(
            batch["input_ids"].tolist(),
            batch["source"].tolist(),
            batch["source_epoch"].tolist(),
            strict=True,
        ):
            out["draws"].append((NAMES[source], epoch, [t for t in seq if t]))
        if n == stop_after:
            out["state"] = it.state_dict()
            return out
    out["state"] = it.state_dict()
    return out


def make(urls: Mapping[str, str], store: Store, world_size: int, weights: Any) -> ingest.RayStream:
    return ingest.RayStream(
        ingest.Mix(urls, weights=weights),
        world_size=world_size,
        batch_size=BATCH,
        transform=ingest.Tokenize(tokenize),
        pack=ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=8),
        shuffle_seed=5,
        shuffle_window=64,
        readers=ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.5),
        storage_options=store.storage_options,
        timeout_s=120,
    )


def test_ranks_draw_alike_and_every_token_once_through_3_2_4_ranks_and_new_weights(
    s3_store: Store,
) -> None:
    urls = write_corpora(s3_store)
    first, then = {"web": 3, "code": 1}, {"web": 1, "code": 1}
    state = None
    rank_draws: list[tuple[str, int, list[int]]] = []
    stages: list[list[str]] = []
    for world_size, stop, weights in ((3, 5, first), (2, 7, first), (4, None, then)):
        stream = make(urls, s3_store, world_size, weights)
        try:
            if state is not None:
                stream.load_state_dict(state)
            refs = [consume.remote(stream.rank_iterator(r), stop) for r in range(world_size)]
            got = ray.get(refs, timeout=300)
        finally:
            stream.shutdown()
        sources = [[name for name, _, _ in r["draws"]] for r in got]
        assert all(s == sources[0] for s in sources), "every rank draws the same sources"
        states = [json.dumps(r["state"], sort_keys=True) for r in got]
        assert len(set(states)) == 1, "every rank gets the same state"
        state = json.loads(states[0])
        stages.append(sources[0])
        rank_draws += [d for r in got for d in r["draws"]]
    # The first two runs follow 3:1 from the start; the third, loaded with 1:1, from its count.
    assert deviation(stages[0] + stages[1], first) <= 1.0
    assert deviation(stages[2], then) <= 1.0
    assert state is not None and state["mix"]["mixture"]["stages"][1]["start"] == (
        (3 * 5 + 2 * 7) * BATCH * SEQ_LEN
    )
    check_carried(rank_draws, state)
    epochs = {name: 1 + max(e for n, e, _ in rank_draws if n == name) for name in NAMES}
    assert epochs["code"] > epochs["web"] >= 1
    assert state["mix"]["mixture"]["epoch"] == 1  # one epoch of the mixture, web's first whole

    # The draws are a pure function of the counts: a single-process Stream over the same Mix
    # draws the same sources in the same order (its epochs end elsewhere: one rank's share).
    alone = ingest.Stream(
        ingest.Mix(urls, weights=first),
        batch_size=BATCH,
        transform=ingest.Tokenize(tokenize),
        pack=ingest.Pack(seq_len=SEQ_LEN, read_rows=READ_ROWS, max_open=8),
        storage_options=s3_store.storage_options,
    )
    single = [NAMES[s] for b in alone for s in b["source"].tolist()]
    n = len(stages[0] + stages[1])
    assert single[:n] == stages[0] + stages[1]


def test_a_state_refused_by_one_source_names_it_and_puts_the_others_back(
    s3_store: Store,
) -> None:
    """The sources load their parts in turn (web, then code): code's refused (a shard the
    state names as changed since), web's is put back, so that the stream is as it was."""
    urls = write_corpora(s3_store)
    stream = make(urls, s3_store, 1, {"web": 3, "code": 1})
    try:
        state = ray.get(consume.remote(stream.rank_iterator(0), 3), timeout=300)["state"]
    finally:
        stream.shutdown()
    bad = copy.deepcopy(state)
    code = bad["sources"]["code"]["dataset"]
    code["shards"][0][1] += 1  # its size, as if the shard were rewritten since
    code.pop("digest")
    stream = make(urls, s3_store, 1, {"web": 3, "code": 1})
    try:
        assert isinstance(stream, MixedRayStream)
        before = {name: part.state_dict() for name, part in stream.streams.items()}
        with pytest.raises(StateError, match=r"^source 'code': .*changed"):
            stream.load_state_dict(bad)
        assert {name: part.state_dict() for name, part in stream.streams.items()} == before
        stream.load_state_dict(state)  # the good one loads on the stream put back
        assert stream.streams["web"].state_dict() == state["sources"]["web"]
    finally:
        stream.shutdown()
