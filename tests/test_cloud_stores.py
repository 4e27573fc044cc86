"""gs:// and az:// end to end on 127.0.0.1: a GCS emulator (gcp-storage-emulator, gcsfs) and
Azurite (npm ``azurite@3``, adlfs). For each: every row once through a stop and a resume,
one listing, footers read once, the shard cache, the Ray pool, no endpoint or credential in
a state. Throttling answers retried: GCS's by gcsfs itself; an Azure 429 on an open by this
project's retry policy (the Azure SDK retries some answers itself, 15 s after each, a fixed
backoff adlfs gives no way to change: one fault is injected, not a share of them). Azure: a
wrong key named by URL, never by value.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import FaultProxy, Faults, write_dataset
from ingest.tools.loopback.azure import KEY, LoopbackAzure, azurite
from ingest.tools.loopback.gcs import LoopbackGCS

SHARDS, ROWS, BATCH = 4, 250, 50


@dataclass
class Cloud:
    server: LoopbackGCS | LoopbackAzure
    url: str
    secrets: tuple[str, ...] = ()

    def options(self) -> dict[str, Any]:
        return self.server.storage_options()


@pytest.fixture(scope="module", params=["gs", "az"])
def cloud(request: pytest.FixtureRequest) -> Iterator[Cloud]:
    if request.param == "gs":
        with LoopbackGCS() as gcs:
            gcs.create_bucket("ingest-cloud")
            write_dataset(
                gcs.filesystem(), "ingest-cloud/d", "parquet", SHARDS, ROWS, row_group_rows=50
            )
            yield Cloud(gcs, "gs://ingest-cloud/d")
        return
    if azurite() is None:  # make setup installs it where npm is
        pytest.skip("azurite-blob is not installed (npm install --prefix .venv/azurite azurite@3)")
    with LoopbackAzure() as azure:
        azure.create_container("ingest-cloud")
        write_dataset(
            azure.filesystem(), "ingest-cloud/d", "parquet", SHARDS, ROWS, row_group_rows=50
        )
        yield Cloud(azure, "az://ingest-cloud/d", (KEY, "AccountKey"))


def ids(batches: list[dict[str, Any]]) -> Counter[int]:
    return Counter(i for b in batches for i in b["id"].tolist())


def make(cloud: Cloud, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        cloud.url,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=3,
        storage_options=options.pop("storage_options", cloud.options()),
        **options,
    )


def test_every_row_once_through_a_stop_and_a_resume(cloud: Cloud) -> None:
    stream = make(cloud)
    it = iter(stream)
    first = [next(it) for _ in range(7)]
    state = json.loads(json.dumps(stream.state_dict()))
    stats = stream.stats
    assert stats["listings"] == 2, stats  # one listing of the prefix: info, then find
    resumed = make(cloud)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert ids(first) + ids(rest) == Counter(range(SHARDS * ROWS))
    # The state names the source as given; no endpoint or credential option is saved.
    text = json.dumps(state)
    assert cloud.url in text and cloud.server.endpoint not in text
    assert not [s for s in cloud.secrets if s in text]


@pytest.fixture
def fresh_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard index of the test's own: the footers the tests before kept are not found."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.mark.usefixtures("fresh_index")
def test_footers_once_and_the_shard_cache_serves_the_second_epoch(
    cloud: Cloud, tmp_path: Path
) -> None:
    cache = ingest.CacheOptions(str(tmp_path / "cache"), 1 << 30)
    stream = make(cloud, read=ingest.ReadOptions(cache=cache))
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
    # A restarted job plans from the footers the shard index kept: no request but the listing.
    again = make(cloud, read=ingest.ReadOptions(cache=cache))
    assert ids(list(again)) == Counter(range(SHARDS * ROWS))
    assert again.stats["opens"] == 0 and again.stats["bytes_read"] == 0, again.stats


@pytest.mark.usefixtures("ray_session")
def test_the_reader_pool_reads_every_row_once(cloud: Cloud) -> None:
    @ray.remote(num_cpus=0)
    def consume(it: Any) -> list[int]:
        return [i for batch in it for i in batch["id"].tolist()]

    with ingest.RayStream(
        cloud.url,
        columns=["id"],
        batch_size=BATCH,
        world_size=2,
        shuffle_seed=3,
        storage_options=cloud.options(),
    ) as stream:
        got = ray.get([consume.remote(stream.rank_iterator(r)) for r in range(2)], timeout=120)
    assert Counter(got[0] + got[1]) == Counter(range(SHARDS * ROWS))
    assert len(got[0]) == len(got[1])


def test_gcs_throttling_answers_are_retried_and_every_row_arrives_once(cloud: Cloud) -> None:
    """A proxy answers 429 (with Retry-After) to a fifth of the requests, 12 times at most."""
    if not isinstance(cloud.server, LoopbackGCS):
        pytest.skip("Azure throttling: the test below")
    faults = Faults(throttle=0.2, retry_after_s=0, limit=12, seed=5)
    with FaultProxy(cloud.server.endpoint, faults) as proxy:
        options = {**cloud.options(), "endpoint_url": proxy.endpoint}
        got = list(make(cloud, storage_options=options))
        counts = proxy.counts()
    assert ids(got) == Counter(range(SHARDS * ROWS))
    assert counts["throttle"] > 0, counts


@pytest.mark.usefixtures("fresh_index")  # its footers are read: the opens it counts
def test_an_azure_throttling_answer_is_retried_by_the_sdk_and_every_row_arrives_once(
    cloud: Cloud,
) -> None:
    """One request answered 429 through a proxy (an open: the SDK raised it at once) is
    retried by this project's retry policy; every row arrives once."""
    if not isinstance(cloud.server, LoopbackAzure):
        pytest.skip("GCS throttling: the test above")
    faults = Faults(throttle=0.2, retry_after_s=0, limit=1, seed=5)
    with FaultProxy(cloud.server.endpoint, faults) as proxy:
        options = cloud.server.storage_options(endpoint=proxy.endpoint)
        stream = make(cloud, storage_options=options)
        got = list(stream)
        counts = proxy.counts()
    assert ids(got) == Counter(range(SHARDS * ROWS))
    assert counts["throttle"] == 1, counts
    assert stream.stats["retries"] == 1 and stream.stats["opens"] == SHARDS + 1, stream.stats


def test_a_wrong_azure_key_fails_naming_the_url_never_the_key(cloud: Cloud) -> None:
    if not isinstance(cloud.server, LoopbackAzure):
        pytest.skip("the emulated GCS takes any credentials")
    wrong = KEY[:-8] + "AAAAAAA="
    stream = make(cloud, storage_options=cloud.server.storage_options(key=wrong))
    with pytest.raises(ingest.IngestError) as caught:
        next(iter(stream))
    text = str(caught.value)
    assert cloud.url in text and wrong not in text and KEY not in text, text
