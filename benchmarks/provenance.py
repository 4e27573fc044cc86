"""What a provenance log costs (issue 35): bytes kept per step and rank, and the time to
answer ``ingest which`` for a step early and late in a long run, simulated.

Two parts, no data read and no Ray (the log is what :class:`ingest.core.book.EpochBook` hands
its :class:`ingest.engine.provenance.ProvenanceWriter`; the writer is driven here directly):

1. *Bytes.* ``--sample-ranks`` ranks take ``--sample-steps`` steps of ``--batch`` rows each,
   cut from shuffle windows of ``--window`` rows over ``--lanes`` shards of 1M rows (a keyed
   permutation per window, as the feed's), and each step's rows go to the writer as the
   feed's packed rows would (:func:`ingest.core.provenance.step_rows`). Printed: bytes per
   row, per rank-step, and the log of a run of ``--ranks`` x ``--steps`` at that rate.
2. *Lookups.* A log of ``--ranks`` ranks x ``--steps`` steps is written whole, one run of
   rows per rank-step (its size is part 1's business; this part has the run's number of
   chunks and folders), a chunk per 64 steps as the book folds. Then ``which(step)`` is
   timed for a step early and one late in the run, each from a new
   :class:`~ingest.engine.provenance.ProvenanceLog` (nothing cached), median of
   ``--repeat``; and the answer is checked (every rank, its one run).
3. *Packed.* A packing stream's log (``pack=``): the pieces of batches of ``--seqs``
   sequences of ``--seq-len`` tokens, packed best-fit from shuffled documents. Printed: bytes
   per piece and per rank-step, and the time of ``which`` for a step of that log.
4. *Mixed.* A mixture's log over two sources (:mod:`ingest.engine.mix_provenance`): bytes a
   rank's mixed step and the time of ``which`` (joined with the sources' logs).

    .venv/bin/python benchmarks/provenance.py                    # 1,024 ranks x 100,000 steps
    .venv/bin/python benchmarks/provenance.py --ranks 64 --steps 5000   # a quick look
    .venv/bin/python benchmarks/provenance.py --packed-only             # parts 1, 3 and 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ingest.core.ledger import packed_row
from ingest.core.packing import Packed, Packer
from ingest.core.provenance import step_pieces, step_rows
from ingest.engine.mix_provenance import MixLog, which_mixed
from ingest.engine.provenance import ProvenanceLog, ProvenanceWriter

FOLD = 64
"""Steps per chunk: the book writes at each fold (``ingest.core.book.FOLD_EVERY``)."""


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def shuffled_cost(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Part 1: the log of shuffled batches, bytes per row and per rank-step."""
    rng = np.random.default_rng(0)
    writer = ProvenanceWriter(str(root / "sample"))
    writer.start(0, args.sample_ranks)
    urls = [f"s3://bucket/train/part-{i:05d}.parquet" for i in range(args.lanes * 64)]
    per_lane = args.window // args.lanes
    steps_per_window = args.window // args.batch
    for rank in range(args.sample_ranks):
        shards = rng.choice(len(urls), args.lanes, replace=False)
        offset = int(rng.integers(0, 1 << 20))
        step = 0
        while step < args.sample_steps:
            # one window: per_lane consecutive rows of each lane's shard, permuted
            shard = np.repeat(shards, per_lane).astype(np.int64)
            row = (offset + np.tile(np.arange(per_lane), args.lanes)).astype(np.int64)
            packed = (1 << 62) + (shard << 31) + row
            assert packed[0] == packed_row(1, int(shard[0]), int(row[0]))
            packed = packed[rng.permutation(len(packed))]
            offset += per_lane
            for k in range(min(steps_per_window, args.sample_steps - step)):
                rows = packed[k * args.batch : (k + 1) * args.batch]
                writer.record(rank, 0, urls, [(step, step_rows(rows))])
                step += 1
            if step % FOLD == 0:
                writer.flush()
    writer.flush()
    size = _bytes(root / "sample")
    rank_steps = args.sample_ranks * args.sample_steps
    return {
        "bytes_per_row": size / (rank_steps * args.batch),
        "bytes_per_rank_step": size / rank_steps,
    }


def packed_cost(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Part 3: a packing stream's log (``pack=``): shuffled documents of lognormal lengths
    (median ``--doc-tokens``) packed best-fit into sequences of ``--seq-len`` by the real
    :class:`~ingest.core.packing.Packer`, ``--seqs`` a batch; each batch's pieces go to the
    writer as the pack node hands them over (:func:`ingest.core.provenance.step_pieces`).
    Bytes per piece and per rank-step, and ``which`` of one step of that log."""
    rng = np.random.default_rng(1)
    writer = ProvenanceWriter(str(root / "packed"))
    writer.start(0, args.sample_ranks)
    shards = 4096
    urls = [f"s3://bucket/train/part-{i:05d}.jsonl" for i in range(shards)]
    pieces_n = 0
    for rank in range(args.sample_ranks):
        packer = Packer(args.seq_len)
        closed: list[Packed] = []
        docs: dict[int, tuple[int, int]] = {}
        serial, step = 0, 0
        while step < args.sample_steps:
            n = int(min(rng.lognormal(np.log(args.doc_tokens), 1.0), 8 * args.seq_len)) + 1
            docs[serial] = (int(rng.integers(shards)), int(rng.integers(1 << 20)))
            closed += packer.add(serial, np.zeros(n, dtype=np.int64))
            serial += 1
            while len(closed) >= args.seqs and step < args.sample_steps:
                batch, closed = closed[: args.seqs], closed[args.seqs :]
                made = [
                    (seq, *docs[p.key], p.start, p.stop)
                    for seq, packed in enumerate(batch)
                    for p in packed.pieces
                ]
                pieces = np.array(made, dtype=np.int64)
                writer.record(rank, 0, urls, [(step, step_pieces(pieces))])
                pieces_n += len(pieces)
                step += 1
                if step % FOLD == 0:
                    writer.flush()
    writer.flush()
    size = _bytes(root / "packed")
    rank_steps = args.sample_ranks * args.sample_steps
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        table = ProvenanceLog(str(root / "packed")).which(args.sample_steps // 2)
        times.append(time.perf_counter() - t)
    assert sorted(set(table["rank"].to_pylist())) == list(range(args.sample_ranks))
    return {
        "packed_bytes_per_piece": size / pieces_n,
        "packed_pieces_per_rank_step": pieces_n / rank_steps,
        "packed_bytes_per_rank_step": size / rank_steps,
        "packed_which_s": statistics.median(times),
    }


def mixed_cost(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Part 4: a mixture's log (two sources, weights 3:1, ``--mixed-batch`` draws a batch):
    rank 0's :class:`~ingest.engine.mix_provenance.MixLog` of ``--mixed-steps`` steps (which
    source step each slot was: every rank's, as a RayStream logs it), and each source's own
    log of every rank's draws (a row each).
    Bytes of the mixture's log per mixed step, and ``which`` of a step early, in
    the middle and late (each source's log read too), median of ``--repeat``."""
    url = str(root / "mixed")
    ranks, steps, batch = args.sample_ranks, args.mixed_steps, args.mixed_batch
    _write_mixed(url, ranks, steps, batch)
    size = _bytes(root / "mixed" / "mix")
    out = {"mixed_bytes_per_step": size / steps}  # every rank's (rank 0 logs them)
    for name, step in (("early", 3), ("middle", steps // 2), ("late", steps - 2)):
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            table = which_mixed(url, [step])
            times.append(time.perf_counter() - t)
        assert table.num_rows == ranks * batch, (name, table.num_rows)
        out[f"mixed_which_{name}_s"] = statistics.median(times)
    return out


def _write_mixed(url: str, ranks: int, steps: int, batch: int) -> None:
    """Part 4's logs: the mixture's, and its sources' own, as a run's ranks write them."""
    rng = np.random.default_rng(2)
    names = ("web", "code")
    sources = {n: ProvenanceWriter(f"{url}/sources/{n}") for n in names}
    for w in sources.values():
        w.start(0, ranks)
    logs = [MixLog(url, None, 0, ranks, batch)]  # rank 0's is every rank's (ray_mix)
    urls = [f"s3://bucket/{n}/part-{i:05d}.parquet" for n in names for i in range(64)]
    drawn = dict.fromkeys(names, 0)
    for step in range(steps):
        picks = [names[p] for p in rng.choice(2, batch, p=[0.75, 0.25])]
        slots = []
        for name in picks:  # every rank draws alike: the same source steps
            slots.append((name, drawn[name]))
            drawn[name] += 1
        for log in logs:
            for name, source_step in slots:
                log.pulled(name, source_step)
            log.batch(step, lambda: "attempt-0")
        for name in names:
            mine = [k for n, k in slots if n == name]
            for rank in range(ranks):
                rows = rng.integers(0, 1 << 20, len(mine))
                runs = np.stack([rng.integers(0, 64, len(mine)), rows, rows + 1], axis=1)
                steps_ = [(k, run.reshape(1, 3)) for k, run in zip(mine, runs, strict=True)]
                sources[name].record(rank, 0, urls, steps_)
    for log in logs:
        log.flush()
    for w in sources.values():
        w.flush()


def lookups(args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Part 2: a whole run's log (one run of rows per rank-step), then timed lookups."""
    path = root / "run"
    writer = ProvenanceWriter(str(path))
    writer.start(0, args.ranks)
    urls = [f"s3://bucket/train/part-{i:05d}.parquet" for i in range(4096)]
    one = np.zeros((1, 3), dtype=np.int64)
    started = time.perf_counter()
    for first in range(0, args.steps, FOLD):
        for step in range(first, min(first + FOLD, args.steps)):
            for rank in range(args.ranks):
                row = (step * args.ranks + rank) * args.batch
                rows = one.copy()
                rows[0] = (row // (1 << 20)) % len(urls), row % (1 << 20), row % (1 << 20) + 1
                writer.record(rank, 0, urls, [(step, rows)])
        writer.flush()
        if first % (args.steps // 10 or 1) < FOLD:
            done = min(first + FOLD, args.steps)
            print(f"  wrote {done:,} of {args.steps:,} steps", file=sys.stderr, flush=True)
    wrote_s = time.perf_counter() - started
    out: dict[str, float] = {
        "write_s": wrote_s,
        "chunks": float(len(list((path / "steps").rglob("*.arrow")))),
        "log_bytes": float(_bytes(path)),
    }
    for name, step in (("early", min(100, args.steps - 1)), ("late", args.steps - 100)):
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            table = ProvenanceLog(str(path)).which(step)
            times.append(time.perf_counter() - t)
        assert sorted(table["rank"].to_pylist()) == list(range(args.ranks)), name
        out[f"which_{name}_s"] = statistics.median(times)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1024, help="rows a rank's step")
    p.add_argument("--window", type=int, default=16_384)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--sample-ranks", type=int, default=8)
    p.add_argument("--sample-steps", type=int, default=256)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=2048, help="part 3: tokens a sequence")
    p.add_argument("--seqs", type=int, default=8, help="part 3: sequences a batch")
    p.add_argument("--doc-tokens", type=int, default=600, help="part 3: median document")
    p.add_argument("--mixed-steps", type=int, default=2000, help="part 4: mixed steps")
    p.add_argument("--mixed-batch", type=int, default=32, help="part 4: draws a batch")
    p.add_argument("--packed-only", action="store_true", help="parts 1, 3 and 4 only")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ingest-provenance-") as tmp:
        root = Path(tmp)
        cost = shuffled_cost(args, root)
        print(
            f"shuffled batches of {args.batch} rows: {cost['bytes_per_row']:.2f} bytes a row, "
            f"{cost['bytes_per_rank_step']:,.0f} bytes a rank-step; a run of {args.ranks:,} "
            f"ranks x {args.steps:,} steps: "
            f"{cost['bytes_per_rank_step'] * args.ranks * args.steps / 1e9:,.1f} GB"
        )
        packed = packed_cost(args, root)
        print(
            f"packed batches of {args.seqs} x {args.seq_len} tokens (documents of median "
            f"{args.doc_tokens} tokens): {packed['packed_pieces_per_rank_step']:.1f} pieces "
            f"a rank-step, {packed['packed_bytes_per_piece']:.2f} bytes a piece, "
            f"{packed['packed_bytes_per_rank_step']:,.0f} bytes a rank-step; a run of "
            f"{args.ranks:,} ranks x {args.steps:,} steps: "
            f"{packed['packed_bytes_per_rank_step'] * args.ranks * args.steps / 1e9:,.1f} GB; "
            f"which(step) of {args.sample_ranks} ranks: "
            f"{packed['packed_which_s'] * 1e3:.0f} ms"
        )
        cost.update(packed)
        mixed = mixed_cost(args, root)
        print(
            f"a mixture of 2 sources, batches of {args.mixed_batch} draws, "
            f"{args.sample_ranks} ranks x {args.mixed_steps:,} steps: the mixture's log "
            f"{mixed['mixed_bytes_per_step']:.0f} bytes a step, every rank's (beside its "
            f"sources' logs); which(step) early {mixed['mixed_which_early_s'] * 1e3:.0f} ms, "
            f"middle {mixed['mixed_which_middle_s'] * 1e3:.0f} ms, late "
            f"{mixed['mixed_which_late_s'] * 1e3:.0f} ms (median of {args.repeat})"
        )
        cost.update(mixed)
        if args.packed_only:
            return 0
        found = lookups(args, root)
        print(
            f"{args.ranks:,} ranks x {args.steps:,} steps, one run a rank-step: "
            f"{int(found['chunks']):,} chunks, {found['log_bytes'] / 1e6:,.1f} MB written in "
            f"{found['write_s']:.0f} s; which(step): early {found['which_early_s'] * 1e3:.0f} ms,"
            f" late {found['which_late_s'] * 1e3:.0f} ms (median of {args.repeat})"
        )
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({**cost, **found}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
