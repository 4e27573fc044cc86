"""az:// end to end against Azurite on 127.0.0.1 (its blob service, adlfs): every row once,
an exact resume, one listing, footers read once, the shard cache, the Ray pool, and the
account key in no state or error. Throttling is not injected here: the Azure SDK retries a
429 or 503 itself, 15 s after it first (its default), which adlfs gives no way to change,
so that the request outlives this project's deadline before its own retry would act."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import write_dataset
from ingest.tools.loopback.azure import KEY, LoopbackAzure, azurite

SHARDS, ROWS, BATCH = 4, 250, 50


@pytest.fixture(scope="module")
def azure() -> Iterator[LoopbackAzure]:
    if azurite() is None:  # make setup installs it where npm is
        pytest.skip("azurite-blob is not installed (npm install --prefix .venv/azurite azurite@3)")
    with LoopbackAzure() as server:
        server.create_container("ingest-az")
        write_dataset(
            server.filesystem(), "ingest-az/d", "parquet", SHARDS, ROWS, row_group_rows=50
        )
        yield server


def ids(batches: list[dict[str, Any]]) -> Counter[int]:
    return Counter(i for b in batches for i in b["id"].tolist())


def make(azure: LoopbackAzure, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        "az://ingest-az/d",
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=3,
        storage_options=azure.storage_options(),
        **options,
    )


def test_every_row_once_through_a_stop_and_a_resume(azure: LoopbackAzure) -> None:
    stream = make(azure)
    it = iter(stream)
    first = [next(it) for _ in range(7)]
    state = json.loads(json.dumps(stream.state_dict()))
    stats = stream.stats
    assert stats["listings"] == 2, stats  # one listing of the prefix: info, then find
    resumed = make(azure)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert ids(first) + ids(rest) == Counter(range(SHARDS * ROWS))
    # The state names the source as given; no endpoint or credential option is saved.
    text = json.dumps(state)
    assert azure.endpoint not in text and KEY not in text and "AccountKey" not in text
    assert "az://ingest-az/d" in text


def test_footers_once_and_the_shard_cache_serves_the_second_epoch(
    azure: LoopbackAzure, tmp_path: Path
) -> None:
    cache = ingest.CacheOptions(str(tmp_path / "cache"), 1 << 30)
    stream = make(azure, read=ingest.ReadOptions(cache=cache))
    first = list(stream)
    after_one = dict(stream.stats)
    second = list(stream)
    stats = stream.stats
    assert ids(first) == ids(second) == Counter(range(SHARDS * ROWS))
    assert after_one["cache_misses"] == SHARDS  # each shard fetched once, whole
    assert after_one["opens"] == 2 * SHARDS  # its footer, then its fetch into the cache
    assert stats["cache_hits"] == SHARDS and stats["cache_misses"] == SHARDS
    assert stats["opens"] == after_one["opens"], "footers once, data from the node's copies"
    assert stats["bytes_read"] == after_one["bytes_read"], "epoch 2 read no byte from the store"


@pytest.mark.usefixtures("ray_session")
def test_the_reader_pool_reads_azure_exactly_once(azure: LoopbackAzure) -> None:
    @ray.remote(num_cpus=0)
    def consume(it: Any) -> list[int]:
        return [i for batch in it for i in batch["id"].tolist()]

    with ingest.RayStream(
        "az://ingest-az/d",
        columns=["id"],
        batch_size=BATCH,
        world_size=2,
        shuffle_seed=3,
        storage_options=azure.storage_options(),
    ) as stream:
        got = ray.get([consume.remote(stream.rank_iterator(r)) for r in range(2)], timeout=120)
    assert Counter(got[0] + got[1]) == Counter(range(SHARDS * ROWS))
    assert len(got[0]) == len(got[1])


def test_a_wrong_key_fails_naming_the_url_never_the_key(azure: LoopbackAzure) -> None:
    wrong = KEY[:-8] + "AAAAAAA="
    stream = ingest.Stream(
        "az://ingest-az/d", batch_size=BATCH, storage_options=azure.storage_options(key=wrong)
    )
    with pytest.raises(ingest.IngestError) as caught:
        next(iter(stream))
    text = str(caught.value)
    assert "az://ingest-az/d" in text and wrong not in text and KEY not in text, text
