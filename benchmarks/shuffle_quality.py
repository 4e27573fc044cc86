"""Shuffle quality on sorted shards: mean per-batch label entropy over a uniform shuffle's.

Data: ``--shards`` Parquet shards on local disk, each holding one label (shard ``i`` has label
``i % labels``), the usual case of data sorted by source, date or class. For each reader, the
mean Shannon entropy of the labels in a batch, divided by the mean for batches of a uniform
random permutation of all rows (the best any shuffle can do). 1.0 is i.i.d.; a reader that
serves one shard at a time scores near 0.

Readers: ``Stream`` (one rank) and each rank of a 2-rank stream, with the default window and
lanes and with one lane (no interleaving: what a window inside one shard gives). The 2-rank
figures run each rank's :class:`ingest.engine.feed.Feed` in this process: the same code the reader
pool of a ``RayStream`` runs. Goal (issue 7): >= 0.9 at the default window.

    .venv/bin/python benchmarks/shuffle_quality.py [--shards 32] [--rows 16384] [--labels 8]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ingest
from ingest.engine.feed import Feed, Ready
from ingest.engine.options import Shuffle
from ingest.engine.spec import StreamSpec

BATCH = 1024


def entropy(labels: np.ndarray, n_labels: int) -> float:
    counts = np.bincount(labels, minlength=n_labels)
    p = counts[counts > 0] / len(labels)
    return float(-(p * np.log(p)).sum())


def mean_entropy(batches: Iterable[np.ndarray], n_labels: int) -> float:
    values = [entropy(b, n_labels) for b in batches if len(b) == BATCH]
    return float(np.mean(values))


def write(root: str, shards: int, rows: int, labels: int) -> None:
    for i in range(shards):
        table = pa.table(
            {
                "id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64),
                "label": np.full(rows, i % labels, dtype=np.int64),
            }
        )
        pq.write_table(table, f"{root}/part-{i:05d}.parquet", row_group_size=4096)


def uniform(shards: int, rows: int, labels: int) -> float:
    all_labels = np.repeat(np.arange(shards) % labels, rows)
    perm = np.random.default_rng(0).permutation(all_labels)
    return mean_entropy(np.split(perm[: len(perm) // BATCH * BATCH], len(perm) // BATCH), labels)


def stream_entropy(url: str, labels: int, lanes: int) -> float:
    stream = ingest.Stream(
        url, columns=["label"], batch_size=BATCH, shuffle_seed=0, shuffle_lanes=lanes
    )
    return mean_entropy((b["label"].numpy() for b in stream), labels)


def ranks_entropy(url: str, labels: int, lanes: int, world_size: int) -> float:
    spec = StreamSpec(
        urls=(url,), columns=("label",), batch_size=BATCH, shuffle=Shuffle(seed=0, lanes=lanes)
    )
    book = spec.book(world_size)
    batches = []
    for rank in range(world_size):
        for item in Feed(book.rank_plan(rank, 0), spec.feed_config(), spec.source()):
            if isinstance(item, Ready):
                batches.append(item.table.column("label").to_numpy())
    return mean_entropy(batches, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--rows", type=int, default=16_384)
    parser.add_argument("--labels", type=int, default=8)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ingest-quality-")
    write(root, args.shards, args.rows, args.labels)
    url = f"file://{root}"
    best = uniform(args.shards, args.rows, args.labels)
    default_lanes = StreamSpec(urls=(url,)).shuffle.lanes
    rows = [
        ("Stream, default lanes", stream_entropy(url, args.labels, default_lanes)),
        ("Stream, 1 lane (window within a shard)", stream_entropy(url, args.labels, 1)),
        ("2 ranks, default lanes", ranks_entropy(url, args.labels, default_lanes, 2)),
        ("2 ranks, 1 lane", ranks_entropy(url, args.labels, 1, 2)),
    ]
    print(f"uniform shuffle: mean batch entropy {best:.3f} nats ({args.labels} labels)")
    print(f"{'reader':<42} {'entropy':>8} {'of uniform':>11}")
    for name, value in rows:
        print(f"{name:<42} {value:8.3f} {value / best:10.2f}x")
    ratio = rows[0][1] / best
    print(f"goal >= 0.9 of uniform at the default window: {'met' if ratio >= 0.9 else 'NOT met'}")


if __name__ == "__main__":
    main()
