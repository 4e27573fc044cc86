"""https:// and http:// shards against a static-file server on 127.0.0.1 with range reads
(ingest.tools.loopback.http): a list of URLs or an index file naming them, every row once
through a stop and a resume, footers once, the Ray pool; requests counted at the server."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import ray

import ingest
from ingest.core.errors import ConfigError, SourceError
from ingest.testing import write_dataset
from ingest.tools.loopback.http import LoopbackHTTP

SHARDS, ROWS, BATCH = 4, 250, 50


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopbackHTTP, list[str]]]:
    root = tmp_path_factory.mktemp("web")
    paths = write_dataset(
        fsspec.filesystem("file"), str(root / "data"), "parquet", SHARDS, ROWS, row_group_rows=50
    )
    names = [Path(p).name for p in paths]
    (root / "data" / "index.txt").write_text(
        "# the shards of the dataset\n"
        + "\n".join(names[:2])
        + "\n\n"
        + "\n".join(names[2:])
        + "\n"
    )
    with LoopbackHTTP(root) as server:
        yield server, [server.url(f"data/{n}") for n in names]


def ids(batches: Any) -> Counter[int]:
    return Counter(i for b in batches for i in b["id"].tolist())


def test_every_row_once_through_a_stop_and_a_resume_and_footers_once(
    web: tuple[LoopbackHTTP, list[str]],
) -> None:
    server, urls = web
    before = server.requests()
    stream = ingest.Stream(urls, columns=["id"], batch_size=BATCH, shuffle_seed=2)
    it = iter(stream)
    first = [next(it) for _ in range(9)]
    state = json.loads(json.dumps(stream.state_dict()))
    resumed = ingest.Stream(urls, columns=["id"], batch_size=BATCH, shuffle_seed=2)
    resumed.load_state_dict(state)
    assert ids(first) + ids(resumed) == Counter(range(SHARDS * ROWS))
    # A whole epoch: one HEAD per URL (its size and version), ranges for footers and data.
    one = ingest.Stream(urls, columns=["id"], batch_size=BATCH)
    start = server.requests()
    assert ids(one) == Counter(range(SHARDS * ROWS))
    mid = server.requests()
    assert ids(one) == Counter(range(SHARDS * ROWS))
    end = server.requests()

    def grew(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) != a.get(k, 0)}

    assert grew(start, mid) == {"HEAD": SHARDS, "GET range": 2 * SHARDS}, grew(start, mid)
    # Epoch 2 lists again (HEADs) but reads no footer: data ranges only.
    assert grew(mid, end) == {"HEAD": SHARDS, "GET range": SHARDS}, grew(mid, end)
    assert "GET" not in grew(before, end), "no whole-file GET: every read is a range"


def test_an_index_file_names_the_shards(web: tuple[LoopbackHTTP, list[str]]) -> None:
    server, urls = web
    assert ingest.urls_from(server.url("data/index.txt")) == urls
    stream = ingest.Stream(ingest.urls_from(server.url("data/index.txt")), batch_size=BATCH)
    assert ids(stream) == Counter(range(SHARDS * ROWS))
    with pytest.raises(SourceError, match=r"missing\.txt"):
        ingest.urls_from(server.url("data/missing.txt"))


def test_an_index_file_without_urls_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("# nothing yet\n\n")
    with pytest.raises(ConfigError, match="names no URL"):
        ingest.urls_from(str(tmp_path / "empty.txt"))


@pytest.mark.usefixtures("ray_session")
def test_the_reader_pool_reads_http_exactly_once(web: tuple[LoopbackHTTP, list[str]]) -> None:
    _, urls = web

    @ray.remote(num_cpus=0)
    def consume(it: Any) -> list[int]:
        return [i for batch in it for i in batch["id"].tolist()]

    with ingest.RayStream(urls, columns=["id"], batch_size=BATCH, world_size=2) as stream:
        got = ray.get([consume.remote(stream.rank_iterator(r)) for r in range(2)], timeout=120)
    assert Counter(got[0] + got[1]) == Counter(range(SHARDS * ROWS))
