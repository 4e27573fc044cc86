"""Soak: many epochs of one stream, watching for growth and for what is left behind.

A fresh local Ray, a small Parquet dataset on the loopback S3 server, and one stream run for
``--epochs`` epochs (or until ``--minutes`` pass), twice: a single-process ``Stream`` in
this process, then a 2-rank ``RayStream`` whose ranks are long-lived actors. Per epoch it
prints rows/s, the resident memory of the process that consumes (this one, or the largest
rank), the object store's used bytes, and this process's threads. At the end:

- growth: resident memory of the last epoch over the second's, and the object store's used
  bytes (median of the last third of the epochs over the first third after the first;
  goal: at most 1.10x each; the first epoch is start-up),
- left behind, checked with ``ray.util.state``: actors still alive, tasks still running or
  pending, objects still referenced, and threads of this process beyond those it started
  with.

Exit status 0 when every check holds, 1 otherwise.

    .venv/bin/python benchmarks/soak.py [--epochs 30] [--minutes 10] [--shards 8] [--rows 4096]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import ray

import ingest
from ingest.testing import LoopbackS3, write_dataset

GROWTH = 1.10


@dataclass(slots=True)
class EpochLine:
    epoch: int
    rows: int
    rows_per_s: float
    rss_mb: float
    store_mb: float
    threads: int


def _store_bytes() -> int:
    """Bytes in use in the object store of the local Ray."""
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    gcs = ray.get_runtime_context().gcs_address  # other Ray instances may run on the machine
    reply = get_memory_info_reply(get_state_from_address(gcs))  # type: ignore[no-untyped-call]
    return int(reply.store_stats.object_store_bytes_used)


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


@ray.remote(num_cpus=0)
class _Rank:
    """A long-lived rank: consumes one epoch per call, reports rows and its RSS."""

    def __init__(self, it: Any) -> None:
        self.it = it

    def epoch(self) -> tuple[int, int]:
        rows = 0
        for batch in self.it:
            rows += len(batch["id"])
        return rows, _rss()


def _soak(
    name: str,
    run_epoch: Callable[[], tuple[int, int]],
    epochs: int,
    deadline: float,
) -> list[EpochLine]:
    lines: list[EpochLine] = []
    print(f"\n{name}")
    print(f"{'epoch':>5} {'rows':>8} {'rows/s':>10} {'RSS MB':>8} {'store MB':>9} {'threads':>7}")
    for epoch in range(epochs):
        start = time.perf_counter()
        rows, rss = run_epoch()
        wall = time.perf_counter() - start
        line = EpochLine(
            epoch, rows, rows / wall, rss / 1e6, _store_bytes() / 1e6, threading.active_count()
        )
        lines.append(line)
        print(
            f"{line.epoch:>5} {line.rows:>8,} {line.rows_per_s:>10,.0f} {line.rss_mb:>8.0f} "
            f"{line.store_mb:>9.1f} {line.threads:>7}"
        )
        if time.monotonic() > deadline:
            print(f"stopped after {epoch + 1} epochs: the time limit passed")
            break
    return lines


def _growth(name: str, lines: list[EpochLine]) -> list[str]:
    """Failures: RSS or store bytes of the last epoch over the second's by more than 10%."""
    if len(lines) < 3:
        return [f"{name}: fewer than 3 epochs ran; nothing to compare"]
    second, last = lines[1], lines[-1]
    failures = []
    rss = last.rss_mb / second.rss_mb
    print(f"{name}: RSS last/second epoch {rss:.3f}x (goal <= {GROWTH:.2f}x)")
    if rss > GROWTH:
        failures.append(f"{name}: RSS grew {rss:.3f}x")
    # The store holds the ready batches in flight, a few MB that vary from one moment to the
    # next: compare the medians of the first and the last third of the epochs after the
    # first, so a growth shows and one sample's noise does not.
    third = max((len(lines) - 1) // 3, 1)
    early = statistics.median(x.store_mb for x in lines[1 : 1 + third])
    late = statistics.median(x.store_mb for x in lines[-third:])
    store = (late + 1) / (early + 1)  # 1 MB of slack: a near-empty store is not a ratio
    print(
        f"{name}: object store, median of the last {third} epochs over the first {third} "
        f"after start-up: {store:.3f}x (goal <= {GROWTH:.2f}x)"
    )
    if store > GROWTH:
        failures.append(f"{name}: object-store bytes grew {store:.3f}x")
    return failures


def _left_behind(threads_before: set[int | None], dashboard: str) -> list[str]:
    from ray.util.state import list_actors, list_objects, list_tasks

    failures = []
    deadline = time.monotonic() + 30
    while True:  # actors and threads take a moment to stop after shutdown
        actors = list_actors(dashboard, filters=[("state", "=", "ALIVE")], timeout=30)
        tasks = [
            t
            for t in list_tasks(dashboard, timeout=30)
            if t.state in ("RUNNING", "PENDING_NODE_ASSIGNMENT", "PENDING_ARGS_AVAIL")
        ]
        threads = [t for t in threading.enumerate() if t.ident not in threads_before]
        if not (actors or tasks or threads) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    gc.collect()
    # A handle to an actor that is dead holds no memory; every other reference is a leak.
    objects = [o for o in list_objects(dashboard, timeout=30) if o.reference_type != "ACTOR_HANDLE"]
    print(
        f"left behind: {len(actors)} actors alive, {len(tasks)} tasks running or pending, "
        f"{len(objects)} objects referenced, {len(threads)} threads "
        f"({', '.join(sorted({t.name for t in threads})) or 'none'})"
    )
    if actors:
        failures.append(f"actors alive: {[a.class_name for a in actors]}")
    if tasks:
        failures.append(f"tasks running: {[t.name for t in tasks]}")
    if objects:
        kinds = sorted({f"{o.reference_type} {o.type} {o.call_site}" for o in objects})
        failures.append(f"objects referenced: {len(objects)}: {kinds}")
    ours = [t for t in threads if t.name.startswith("ingest")]
    if ours:
        failures.append(f"threads: {[t.name for t in ours]}")
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--minutes", type=float, default=10.0, help="per stream")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--rows", type=int, default=4096)
    args = p.parse_args(argv)
    failures: list[str] = []
    with LoopbackS3() as s3:
        s3.create_bucket("soak")
        write_dataset(s3.filesystem(), "s3://soak/data", "parquet", args.shards, args.rows)
        options: dict[str, Any] = {
            "columns": ["id", "tokens"],
            "batch_size": 256,
            "shuffle_seed": 0,
            "storage_options": s3.storage_options(),
        }
        # The dashboard serves ray.util.state, which the end-of-run checks use.
        info = ray.init(num_cpus=4, include_dashboard=True, log_to_driver=False)
        dashboard = f"http://{info.dashboard_url}"
        try:
            threads_before = {t.ident for t in threading.enumerate()}
            stream = ingest.Stream("s3://soak/data", **options)

            def one_process() -> tuple[int, int]:
                rows = 0
                for batch in stream:
                    rows += len(batch["id"])
                return rows, _rss()

            deadline = time.monotonic() + args.minutes * 60
            lines = _soak("ingest.Stream (this process)", one_process, args.epochs, deadline)
            stream.close()
            failures += _growth("Stream", lines)

            ray_stream = ingest.RayStream("s3://soak/data", world_size=2, **options)
            ranks = [_Rank.remote(ray_stream.rank_iterator(r)) for r in range(2)]  # type: ignore[attr-defined]

            def two_ranks() -> tuple[int, int]:
                got: list[tuple[int, int]] = ray.get([r.epoch.remote() for r in ranks])
                return sum(rows for rows, _ in got), max(rss for _, rss in got)

            deadline = time.monotonic() + args.minutes * 60
            lines = _soak("ingest.RayStream (2 rank actors)", two_ranks, args.epochs, deadline)
            failures += _growth("RayStream", lines)
            for rank in ranks:
                ray.kill(rank)
            ray_stream.shutdown()
            ranks.clear()  # handles of dead actors count as referenced objects
            del ray_stream
            failures += _left_behind(threads_before, dashboard)
        finally:
            ray.shutdown()
    print("\n" + ("PASS" if not failures else "FAIL:\n  " + "\n  ".join(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    raise SystemExit(main())
