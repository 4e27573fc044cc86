"""gs:// end to end against a GCS emulator on 127.0.0.1 (gcp-storage-emulator, gcsfs): every
row once, an exact resume, one listing, footers read once, the shard cache, the Ray pool."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import FaultProxy, Faults, write_dataset
from ingest.tools.loopback.gcs import LoopbackGCS

SHARDS, ROWS, BATCH = 4, 250, 50


@pytest.fixture(scope="module")
def gcs() -> Iterator[LoopbackGCS]:
    with LoopbackGCS() as server:
        server.create_bucket("ingest-gcs")
        write_dataset(
            server.filesystem(), "ingest-gcs/d", "parquet", SHARDS, ROWS, row_group_rows=50
        )
        yield server


def ids(batches: list[dict[str, Any]]) -> Counter[int]:
    return Counter(i for b in batches for i in b["id"].tolist())


def make(gcs: LoopbackGCS, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        "gs://ingest-gcs/d",
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=3,
        storage_options=gcs.storage_options(),
        **options,
    )


def test_every_row_once_through_a_stop_and_a_resume(gcs: LoopbackGCS) -> None:
    stream = make(gcs)
    it = iter(stream)
    first = [next(it) for _ in range(7)]
    state = json.loads(json.dumps(stream.state_dict()))
    stats = stream.stats
    assert stats["listings"] == 2, stats  # one listing of the prefix: info, then find
    resumed = make(gcs)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert ids(first) + ids(rest) == Counter(range(SHARDS * ROWS))
    # The state names the source as given; no endpoint or credential option is saved.
    text = json.dumps(state)
    assert gcs.endpoint not in text and "anon" not in text
    assert "gs://ingest-gcs/d" in text


def test_footers_once_and_the_shard_cache_serves_the_second_epoch(
    gcs: LoopbackGCS, tmp_path: Path
) -> None:
    cache = ingest.CacheOptions(str(tmp_path / "cache"), 1 << 30)
    stream = make(gcs, read=ingest.ReadOptions(cache=cache))
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
def test_the_reader_pool_reads_gcs_exactly_once(gcs: LoopbackGCS) -> None:
    @ray.remote(num_cpus=0)
    def consume(it: Any) -> list[int]:
        return [i for batch in it for i in batch["id"].tolist()]

    with ingest.RayStream(
        "gs://ingest-gcs/d",
        columns=["id"],
        batch_size=BATCH,
        world_size=2,
        shuffle_seed=3,
        storage_options=gcs.storage_options(),
    ) as stream:
        got = ray.get([consume.remote(stream.rank_iterator(r)) for r in range(2)], timeout=120)
    assert Counter(got[0] + got[1]) == Counter(range(SHARDS * ROWS))
    assert len(got[0]) == len(got[1])


def test_throttling_answers_are_retried_and_every_row_arrives_once(gcs: LoopbackGCS) -> None:
    """A proxy answers 429 (with Retry-After) to a fifth of the reads, 12 times in all."""
    faults = Faults(throttle=0.2, retry_after_s=0, limit=12, seed=5)
    with FaultProxy(gcs.endpoint, faults) as proxy:
        options = {**gcs.storage_options(), "endpoint_url": proxy.endpoint}
        stream = ingest.Stream(
            "gs://ingest-gcs/d", columns=["id"], batch_size=BATCH, storage_options=options
        )
        got = list(stream)
        counts = proxy.counts()
    assert ids(got) == Counter(range(SHARDS * ROWS))
    assert counts["throttle"] > 0, counts
