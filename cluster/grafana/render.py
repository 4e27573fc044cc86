"""Render the dashboard's panels (``ingest.json``) as a PNG from a real run's metrics.

A local Ray (its Prometheus endpoint), a loopback S3 server holding a generated Parquet
dataset, a ``RayStream`` with a shard cache, a pool that sizes itself and a transform that
costs a fixed time per batch, and ranks that train for a fixed time per batch, over a few
epochs. The node's ``/metrics`` is scraped every second while it runs; each panel is drawn
as its query computes it (counters as rates over ``--rate-s`` seconds, not Grafana's minute:
the run lasts about a minute). Writes ``docs/dashboard.png``.

    .venv/bin/python cluster/grafana/render.py [--epochs 3] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray

import ingest
from ingest.testing import write_dataset
from ingest.tools.loopback.s3 import LoopbackS3

HERE = Path(__file__).parent
Sample = dict[tuple[str, str], float]
"""``(metric, rank or "") -> value`` of one stream's ingest metrics, summed over workers."""


def scrape(port: int, stream: str) -> Sample:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: Sample = defaultdict(float)
    for line in body.splitlines():
        m = re.match(r"ray_(ingest_\w+)\{(.*)\} (\S+)$", line)
        if m and f'stream="{stream}"' in m.group(2):
            rank = re.search(r'rank="(\d+)"', m.group(2))
            out[m.group(1), rank.group(1) if rank else ""] += float(m.group(3))
    return dict(out)


class Costly:
    """A transform that costs a fixed time per batch, one batch at a time per reader (a
    GIL-bound decode): more readers, not more cores, feed the ranks faster."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, table: Any) -> Any:
        with self.lock:
            time.sleep(0.012)
        return table


@ray.remote(num_cpus=0)
def train(it: Any, epochs: int, step_s: float) -> int:
    rows = 0
    while it.upcoming_epoch() < epochs:
        for batch in it:
            rows += len(batch["id"])
            time.sleep(step_s)
    return rows


def run(epochs: int, period_s: float) -> tuple[list[float], list[Sample], int]:
    """The run, and the scrapes taken every ``period_s`` while it went on."""
    ray.init(
        address="local",
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        # Metrics reach the endpoint every second (Ray's default: every 10 s).
        _system_config={"metrics_report_interval_ms": 1000},
    )
    port = int(ray.nodes()[0]["MetricsExportPort"])
    times: list[float] = []
    samples: list[Sample] = []
    with LoopbackS3() as s3, tempfile.TemporaryDirectory() as cache:
        s3.create_bucket("dash")
        url = "s3://dash/data"
        write_dataset(s3.filesystem(), url, "parquet", 8, 20_000, row_group_rows=2_500)
        with ingest.RayStream(
            url,
            columns=["id"],
            batch_size=250,
            world_size=2,
            shuffle_seed=0,
            transform=Costly,
            storage_options=s3.storage_options(),
            read=ingest.ReadOptions(cache=ingest.CacheOptions(cache, 1 << 30)),
            # From one reader, sizing itself (the pool panel shows it grow).
            readers=ingest.ReaderPool(
                prefetch_batches=4, max_size=4, autoscale=ingest.Autoscale(interval_s=2.0)
            ),
        ) as stream:
            one = ingest.RankOptions(fetch_batches=1)  # a take leaves the rest queued
            its = [stream.rank_iterator(r, options=one) for r in range(2)]
            refs = [train.remote(it, epochs, 0.02) for it in its]
            start = time.monotonic()
            done = threading.Event()
            while not done.is_set():
                samples.append(scrape(port, stream.name))
                times.append(time.monotonic() - start)
                if not ray.wait(refs, num_returns=2, timeout=period_s)[1]:
                    done.set()
            rows = sum(ray.get(refs, timeout=60))
            for _ in range(3):  # the last reports (every second)
                time.sleep(period_s)
                samples.append(scrape(port, stream.name))
                times.append(time.monotonic() - start)
    ray.shutdown()
    return times, samples, rows


def series(
    times: list[float], samples: list[Sample], name: str, rank: str | None, rate_s: float
) -> tuple[list[float], list[float]]:
    """One metric (of one rank, or summed over ranks) as the panel shows it: a counter's
    rate over ``rate_s`` seconds, a gauge as it is."""
    from ingest.distributed.metrics import KINDS

    def value(s: Sample) -> float | None:
        got = [v for (n, r), v in s.items() if n == name and (rank is None or r == rank)]
        return sum(got) if got else None

    found = [(t, v) for t, v in zip(times, map(value, samples), strict=True) if v is not None]
    if KINDS[name] == "gauge":  # from its first report on
        return [t for t, _ in found], [v for _, v in found]
    values = [0.0 if v is None else v for v in map(value, samples)]  # a counter starts at 0
    xs, ys = [], []
    for i, t in enumerate(times):
        j = next(k for k in range(i + 1) if t - times[k] <= rate_s)
        if j < i:
            xs.append(t)
            ys.append((values[i] - values[j]) / (t - times[j]))
    return xs, ys


def draw(times: list[float], samples: list[Sample], rate_s: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads((HERE / "ingest.json").read_text())
    ranks = sorted({r for s in samples for (_, r) in s if r})
    panels = dashboard["panels"]
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3 * rows), sharex=True)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        names = sorted({n for t in panel["targets"] for n in re.findall(r"ray_(\w+)", t["expr"])})
        if "hit rate" in panel["title"]:  # hits / (hits + misses), of the names it queries
            hit = next(n for n in names if n.endswith("_hits_total"))
            _, hits = series(times, samples, hit, None, rate_s)
            x, misses = series(times, samples, hit.replace("_hits_", "_misses_"), None, rate_s)
            rate = [
                h / (h + m) if h + m else float("nan") for h, m in zip(hits, misses, strict=True)
            ]
            ax.plot(x, rate, label="hit rate")
        elif "by (rank)" in panel["targets"][0]["expr"]:
            for rank in ranks:
                ax.plot(*series(times, samples, names[0], rank, rate_s), label=f"rank {rank}")
        else:
            for name in names:
                label = name.removeprefix("ingest_").removesuffix("_total").replace("_", " ")
                x, y = series(times, samples, name, None, rate_s)
                if any(
                    t["expr"].startswith("60 * ") and name in t["expr"] for t in panel["targets"]
                ):
                    y, label = [60 * v for v in y], f"{label} per minute"
                ax.plot(x, y, label=label)
        ax.set_title(panel["title"], fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run")
    fig.suptitle(f"{dashboard['title']} (a real run; counters as rates over {rate_s:.0f} s)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--period-s", type=float, default=1.0)
    parser.add_argument("--rate-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=HERE.parent.parent / "docs" / "dashboard.png")
    args = parser.parse_args()
    times, samples, rows = run(args.epochs, args.period_s)
    draw(times, samples, args.rate_s, args.out)
    print(f"{rows:,} rows in {times[-1]:.0f} s, {len(samples)} scrapes; wrote {args.out}")


if __name__ == "__main__":
    main()
