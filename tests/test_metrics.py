"""Metrics of a running RayStream on the node's Prometheus endpoint (issue 10, part 2)."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import write_dataset

pytestmark = pytest.mark.usefixtures("ray_session")


@ray.remote(num_cpus=0)
def train(it: Any) -> int:
    rows = 0
    for batch in it:
        rows += len(batch["id"])
        time.sleep(0.2)  # a training step: the run lasts a few seconds
    return rows


def scrape(stream: str) -> dict[str, dict[str, float]]:
    """``name -> {rank or "": value}`` of this stream's ingest metrics, summed over workers."""
    port = ray.nodes()[0]["MetricsExportPort"]
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[str, float]] = {}
    for line in body.splitlines():
        m = re.match(r"ray_(ingest_\w+)\{(.*)\} (\S+)$", line)
        if m and f'stream="{stream}"' in m.group(2):
            rank = re.search(r'rank="(\d+)"', m.group(2))
            key = rank.group(1) if rank else ""
            values = out.setdefault(m.group(1), {})
            values[key] = values.get(key, 0.0) + float(m.group(3))
    return out


PREFETCH = 3
"""Ready batches a reader's feed keeps ahead of its rank (``ReaderPool.prefetch_batches``)."""


def test_a_running_stream_exports_its_metrics(s3_store: Any) -> None:
    write_dataset(s3_store.fs, s3_store.url("d"), "parquet", 4, 300, row_group_rows=100)
    gauges: dict[str, list[float]] = {"ingest_data_wait_share": [], "ingest_queue_depth": []}
    with ingest.RayStream(
        s3_store.url("d"),
        columns=["id"],
        batch_size=30,
        world_size=2,
        storage_options=s3_store.storage_options,
        readers=ingest.ReaderPool(prefetch_batches=PREFETCH),
    ) as stream:
        # One batch per take: the reader reads a batch in milliseconds and the rank trains
        # on it for 0.2 s, so a take finds the queue full and leaves PREFETCH - 1 behind.
        one = ingest.RankOptions(fetch_batches=1)
        refs = [train.remote(stream.rank_iterator(r, options=one)) for r in range(2)]
        # Gauges are what the ranks and readers see now: read them while the run goes on.
        while ray.wait(refs, num_returns=2, timeout=0.5)[1]:
            for name, values in scrape(stream.name).items():
                if name in gauges:
                    gauges[name] += values.values()
        rows = ray.get(refs, timeout=120)
        io = stream.stats()
        deadline = time.monotonic() + 30
        found = scrape(stream.name)
        while time.monotonic() < deadline and (
            sum(found.get("ingest_rows_total", {}).values()) < sum(rows)
            or "ingest_requests_total" not in found
        ):
            time.sleep(1)
            found = scrape(stream.name)
    assert sum(rows) == 1200
    assert found["ingest_rows_total"] == {"0": rows[0], "1": rows[1]}, found
    assert found["ingest_batches_total"] == {"0": rows[0] / 30, "1": rows[1] / 30}
    assert gauges["ingest_data_wait_share"], "the ranks' wait share was seen while they ran"
    assert all(0 <= v <= 1 for v in gauges["ingest_data_wait_share"])
    # Never more than the feed may hold; while the rank trains, the batches read ahead of it.
    depths = gauges["ingest_queue_depth"]
    assert depths and all(0 <= v <= PREFETCH for v in depths), depths
    assert max(depths) >= PREFETCH - 1, depths
    # The readers' store counts grow as their stats do (the last second may not be out yet).
    assert 0 < found["ingest_bytes_read_total"][""] <= io["bytes_read"]
    assert 0 < found["ingest_requests_total"][""] <= io["opens"] + io["reads"] + io["listings"]
    assert found["ingest_pool_size"] == {"": len(stream.readers)}, "one reader reports the size"


@ray.remote(num_cpus=0)
def _report_nothing() -> None:
    from ingest.distributed.metrics import RankMeter

    meter = RankMeter("empty", 0)
    meter.report()  # an epoch with no batch (a followed dataset's empty round)
    meter.batch(0, 0.01)  # a batch that lost all its rows to quarantine
    meter.report()


def test_a_rank_with_no_rows_to_report_reports_without_error() -> None:
    # Ray's Counter.inc(0) raises: it did, in the rank's loop, at the end of an empty epoch.
    ray.get(_report_nothing.remote(), timeout=60)


def test_a_feed_moved_to_a_new_reader_is_counted_once_in_the_queue_depth(s3_store: Any) -> None:
    # The pool grew while the ranks ran: rank 1's feed moved to the new reader. The old
    # reader's gauge for rank 1 stayed at its last value, and a sum over the readers showed
    # rank 1 with twice the batches a feed may hold (6 of 3).
    write_dataset(s3_store.fs, s3_store.url("m"), "parquet", 4, 600, row_group_rows=100)
    with ingest.RayStream(
        s3_store.url("m"),
        columns=["id"],
        batch_size=30,
        world_size=2,
        storage_options=s3_store.storage_options,
        readers=ingest.ReaderPool(min_size=1, max_size=1, prefetch_batches=PREFETCH),
    ) as stream:
        one = ingest.RankOptions(fetch_batches=1)
        refs = [train.remote(stream.rank_iterator(r, options=one)) for r in range(2)]
        deadline = time.monotonic() + 30  # the one reader reports rank 1's queue
        while not scrape(stream.name).get("ingest_queue_depth", {}).get("1"):
            assert time.monotonic() < deadline, "rank 1's queue depth was never reported"
            time.sleep(0.2)
        stream._pool.add(stream._pool.make())  # what the sizer does when it grows the pool
        moved = time.monotonic()
        depths = []  # (seconds since the move, rank 1's depth summed over the readers)
        while ray.wait(refs, num_returns=2, timeout=0.5)[1]:
            depth = scrape(stream.name).get("ingest_queue_depth", {}).get("1", 0.0)
            depths.append((time.monotonic() - moved, depth))
        rows = ray.get(refs, timeout=120)
        assert len(stream.readers) == 2
    assert sum(rows) == 2400, "every row once through the move"
    settled = [depth for after, depth in depths if after >= SETTLE_S]
    assert settled and max(settled) <= PREFETCH, depths


SETTLE_S = 2.5
"""Seconds after a feed moved from which rank 1's depth, summed over the readers, counts its
batches once. Each process pushes its gauges on its own every second
(``metrics_report_interval_ms`` in conftest; a reader reports each ``REPORT_EVERY_S``): the
new reader's depth can be pushed before the old reader's 0, and a sum in between counts the
rank's batches on both (4 of 3 in one sample right after the move, once, in a full run on a
loaded machine). A gauge left at its last value (the bug) never settles."""
