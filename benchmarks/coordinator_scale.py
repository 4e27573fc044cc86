"""The coordinator at scale, simulated: plan, acks, state size and snapshot, no data read.

A synthetic listing of ``--shards`` parquet-like shards (row counts known from the "footer",
``--row-groups`` seekable blocks each) is handed to an :class:`ingest.core.book.EpochBook` for
``--ranks`` ranks: the coordinator's logic without Ray and without I/O. What each rank's feed
would deliver is simulated from the rank's plan exactly as :class:`ingest.engine.feed.Feed` orders
it (spans dealt to ``lanes`` lanes by :func:`ingest.core.assign.deal_lanes`, windows of
``window`` rows permuted by the same keyed permutation, batches cut from consecutive
windows), so every ack carries what a real batch carries: one packed row per row of a
shuffled batch, as :class:`ingest.engine.feed.Feed` sends them.

Figures (issue 7, goals in brackets):

1. plan: ``book.plan(0)`` and the plan of every rank (``book.rank_plan``); the plan also
   makes the listing part of the epoch's states [<= 10 s].
2. acks absorbed per second: one ack is one :class:`ingest.core.ledger.StepRecord` of one rank
   (one shuffled batch, with the window it finishes: :class:`ingest.core.ledger.Closed`), sent
   in messages of ``ack_every`` records, round-robin over the ranks. An ack is absorbed
   when its rows are merged into the progress: the ``book.ack`` calls plus the folds the
   coordinator makes between checkpoints (every ``FOLD_EVERY`` steps, on a window's
   edge, so from the windows' runs, with no sort), over ``--steady-windows`` windows
   [>= 100,000/s]. Shown beside it: the ``book.ack`` calls alone; the acks of the
   checkpoint phase with the fold each checkpoint makes (half-way through a window, so
   half a window of packed rows sorted per rank); and with the state of every checkpoint
   written too (a checkpoint every window: far more often than a job of a thousand ranks
   checkpoints, so these two are not held to the goal).
3. state size: the JSON of a mid-epoch snapshot, taken half-way through a shuffle window
   (its rows half consumed, as at a checkpoint that falls inside a window) [<= 10 MB].
4. snapshot: what the coordinator does when a state is asked for at a step: merge the acks
   not folded yet (since the checkpoint before: a window and a half, then a window; the
   finished windows from their runs, the open half window's packed rows sorted), then
   ``book.snapshot(step)`` + ``to_json()`` + ``json.dumps``; the slowest of
   ``--checkpoints``, one window apart. Timed as the fold, then the state of the folded
   book (the same work as the coordinator's snapshot-then-fold, in two parts) [<= 2 s].

Mid-epoch is reached by a fast-forward: each rank acks one record per window holding
the window's rows in reading order and empty records for the window's other steps (the same
rows, so the same progress at every window boundary); only the acks of the measured steps
carry shuffled batches.

    .venv/bin/python benchmarks/coordinator_scale.py [--shards 1000000] [--ranks 1024]
        [--batch-size 1024] [--rows-per-shard 1000] [--steady-windows 8] [--checkpoints 2]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from tqdm.auto import tqdm

from ingest.core.assign import Span, deal_lanes
from ingest.core.book import FOLD_EVERY, EpochBook
from ingest.core.ledger import Closed, Rows, Runs, StepRecord, as_runs, pack_base
from ingest.core.plan import permutation
from ingest.core.state import StreamState
from ingest.engine.options import Shuffle
from ingest.engine.spec import StreamSpec
from ingest.formats.base import ShardInfo
from ingest.planner import budget
from ingest.planner.catalog import Listing
from ingest.storage.sources import Shard

GOALS = {
    "plan_s": ("<=", 10.0),
    "acks_absorbed_per_s": (">=", 100_000.0),
    "state_mb": ("<=", 10.0),
    "snapshot_s": ("<=", 2.0),
}
SOURCE = "s3://bench-bucket/train"
NO_RUNS = as_runs(())


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """What is simulated.

    Attributes:
        shards: Shards in the listing.
        ranks: Ranks (world size).
        batch_size: Rows per batch on every rank.
        rows_per_shard: Mean rows per shard (counts vary from 0.5x to 1.5x of it).
        row_groups: Seekable blocks per shard (parquet row groups).
        window: Shuffle window in rows (a multiple of ``batch_size``).
        lanes: Shards read side by side into each window.
        seed: Shuffle seed.
        ack_every: Records per ack message (``RankOptions.ack_every``).
        steady_windows: Windows of shuffled batches acked and folded as the coordinator
            does between checkpoints (the acks-absorbed figure).
        checkpoints: Snapshots (each followed by a fold), one window apart, each half-way
            through a window; the first comes after a window and a half of shuffled batches.
    """

    shards: int = 1_000_000
    ranks: int = 1024
    batch_size: int = 1024
    rows_per_shard: int = 1000
    row_groups: int = 4
    window: int = 16_384
    lanes: int = 16
    seed: int = 0
    ack_every: int = 16
    steady_windows: int = 8
    checkpoints: int = 2

    def __post_init__(self) -> None:
        for name in (
            "shards",
            "ranks",
            "batch_size",
            "rows_per_shard",
            "row_groups",
            "steady_windows",
            "checkpoints",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.window % self.batch_size:
            raise ValueError(
                f"the simulation cuts whole batches from each window: window={self.window} "
                f"must be a multiple of batch_size={self.batch_size}"
            )


# -- the synthetic dataset and book -------------------------------------------------------


def synthetic_listing(config: Config) -> Listing:
    """A listing of parquet-like shards with sizes, etags, row counts and row groups."""
    rng = np.random.default_rng(1234)
    mean = config.rows_per_shard
    rows = rng.integers(max(mean // 2, 1), mean + mean // 2 + 1, size=config.shards)
    sizes = rows * 180 + rng.integers(4096, 65536, size=config.shards)
    etags = rng.integers(0, 1 << 63, size=(config.shards, 2), dtype=np.int64)
    shards = []
    infos = []
    groups = config.row_groups
    columns = zip(rows.tolist(), sizes.tolist(), etags.tolist(), strict=True)
    for i, (n, size, (e0, e1)) in enumerate(columns):
        etag = f"{e0:016x}{e1:016x}"
        shards.append(Shard(f"{SOURCE}/part-{i:07d}.parquet", size, etag, "parquet"))
        step = -(-n // groups)
        infos.append(ShardInfo(rows=n, blocks=tuple(range(0, n, step))))
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    return Listing(tuple(shards), tuple(infos), schema, shards[0].url)


class GivenListing:
    """A lister (:class:`ingest.core.listing.Lister`) whose listing is given, not read from a
    store: the book plans from it as from a planner's."""

    def __init__(self, spec: StreamSpec, listing: Listing) -> None:
        self.spec = spec
        self._listing = listing

    def listing(
        self,
        wanted: Callable[[Listing], bool] | None = None,
        *,
        first: bool,
        counted: bool,
        at: Mapping[str, Sequence[int]] | None = None,
        since: Mapping[str, int] | None = None,
        commits: Mapping[str, str] | None = None,
    ) -> Listing:
        return self._listing

    def counted(self, listing: Listing, shards: Sequence[int]) -> Listing:
        raise AssertionError("a synthetic listing counts every shard's rows; it follows nothing")

    def window_rows(self, listing: Listing) -> int:
        spec = self.spec
        return budget.listing_window_rows(
            listing, spec.columns, spec.shuffle.window, spec.shuffle.bytes
        )

    def remember(self, listing: Listing) -> None:
        pass


def simulated_book(spec: StreamSpec, world_size: int, listing: Listing) -> EpochBook[Listing]:
    """A book of ``world_size`` ranks over the given ``listing``."""
    return EpochBook(spec.book_config(), world_size, GivenListing(spec, listing))


# -- what a rank's feed delivers ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Lane:
    runs: Runs
    """``(segment, shard, start, stop)`` of the lane's spans in reading order."""
    ends: npt.NDArray[np.int64]
    """Rows of the lane's stream up to the end of each span."""

    def pieces(self, a: int, b: int) -> Runs:
        """Rows ``[a, b)`` of the lane's stream as runs."""
        lo = int(np.searchsorted(self.ends, a, side="right"))
        hi = min(int(np.searchsorted(self.ends, b, side="left")) + 1, len(self.runs))
        out = self.runs[lo:hi].copy()
        begins = self.ends[lo:hi] - (out[:, 3] - out[:, 2])
        first = out[:, 2] - begins
        out[:, 2] = first + np.maximum(begins, a)
        out[:, 3] = first + np.minimum(self.ends[lo:hi], b)
        return out[out[:, 3] > out[:, 2]]


class RankFeed:
    """The provenance of one rank's batches, ordered as
    :class:`ingest.engine.feed.Feed` orders them.

    Args:
        spans: The rank's share (``FeedPlan.spans``).
        config: Batch and shuffle settings.
        epoch: The epoch (part of the window permutation's key).
        rank: The rank (likewise).
    """

    def __init__(self, spans: Sequence[Span], config: Config, epoch: int, rank: int) -> None:
        dealt = deal_lanes(spans, config.lanes)
        self.lanes = []
        for lane in dealt:
            runs = as_runs(
                [(spans[i].segment, spans[i].shard, spans[i].start, spans[i].stop) for i in lane]
            )
            self.lanes.append(_Lane(runs, np.cumsum(runs[:, 3] - runs[:, 2])))
        self.per_lane = max(1, config.window // len(dealt))
        self.config, self.epoch, self.rank = config, epoch, rank

    @property
    def batches_per_window(self) -> int:
        return len(self.lanes) * self.per_lane // self.config.batch_size

    def full_windows(self) -> int:
        """Windows before the first one that some lane cannot fill."""
        return min(int(lane.ends[-1]) if len(lane.ends) else 0 for lane in self.lanes) // (
            self.per_lane
        )

    def window_runs(self, w: int) -> Runs:
        """The rows of window ``w`` in reading order (before the permutation)."""
        a, b = w * self.per_lane, (w + 1) * self.per_lane
        return np.concatenate([lane.pieces(a, b) for lane in self.lanes])

    def batches(self, w: int) -> list[tuple[Rows, Closed]]:
        """What each batch cut from window ``w`` (a full window) acks, as the feed sends it:
        its packed rows (:func:`ingest.core.ledger.pack_base`), in the window's shuffled order,
        and the window it finishes (:class:`ingest.core.ledger.Closed`): the last batch's."""
        pieces = self.window_runs(w)
        sizes = pieces[:, 3] - pieces[:, 2]
        first_key = np.cumsum(sizes) - sizes
        base = pack_base(
            pieces[:, 0], pieces[:, 1], pieces[:, 2] - first_key, int(pieces[:, 3].max()) - 1
        )
        if base is None:
            raise ValueError("rows or shards beyond 2**31 do not pack")
        keys = np.arange(int(sizes.sum()), dtype=np.int64)
        packed = base[np.repeat(np.arange(len(pieces)), sizes)] + keys
        order = permutation(len(keys), "window", self.config.seed, self.epoch, self.rank, w)
        packed = packed[order]
        size = self.config.batch_size
        out = [(packed[k : k + size], Closed(NO_RUNS, size)) for k in range(0, len(packed), size)]
        out[-1] = (out[-1][0], Closed(pieces, 0))
        return out


# -- the measurement ------------------------------------------------------------------------


@dataclass(slots=True)
class Clock:
    """Wall-clock and CPU seconds since it was made (CPU time tells a loaded machine apart)."""

    wall: float = field(default_factory=time.perf_counter)
    cpu: float = field(default_factory=time.process_time)

    def lap(self) -> tuple[float, float]:
        """Seconds ``(wall, cpu)`` since the clock was made."""
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(config: Config) -> dict[str, Any]:
    """Run the simulation; return every figure."""
    out: dict[str, Any] = {"config": asdict(config)}
    clock = Clock()
    listing = synthetic_listing(config)
    out["listing_s"] = clock.lap()[0]
    out["rows"] = listing.rows
    tqdm.write(
        f"listing: {config.shards:,} shards, {listing.rows:,} rows ({out['listing_s']:.1f} s)"
    )

    spec = StreamSpec(
        urls=(SOURCE,),
        batch_size=config.batch_size,
        shuffle=Shuffle(seed=config.seed, window=config.window, lanes=config.lanes),
    )
    book = simulated_book(spec, config.ranks, listing)
    gc.collect()
    clock = Clock()
    epoch = book.plan(0)
    planned, _ = clock.lap()
    plans = [book.rank_plan(r, 0) for r in range(config.ranks)]
    out["plan_s"], out["plan_cpu_s"] = clock.lap()
    out["plan_book_s"] = planned

    steps = epoch.steps or 0
    out["steps_per_epoch"] = steps
    out["spans"] = sum(len(p.spans) for p in plans)
    tqdm.write(
        f"plan: {out['plan_s']:.2f} s ({planned:.2f} s book.plan), {out['spans']:,} spans, "
        f"{steps:,} steps per epoch"
    )

    feeds = [RankFeed(p.spans, config, 0, r) for r, p in enumerate(plans)]
    per_window = feeds[0].batches_per_window
    full = min(f.full_windows() for f in feeds)
    windows = config.steady_windows + config.checkpoints + 1
    w0 = min(steps // 2 // per_window, full - windows)
    if w0 < 0 or any(f.batches_per_window != per_window for f in feeds):
        raise ValueError(
            f"ranks have {full} full window(s), fewer than the {windows} measured; "
            "raise --rows-per-shard or --shards"
        )
    out["fast_forward"] = fast_forward(book, feeds, w0, per_window)
    out["steady"] = s = steady(book, feeds, w0, config)
    # Checkpoints half-way through a window: its rows are half consumed, scattered.
    w1 = w0 + config.steady_windows
    marks = [(w1 + k + 1) * per_window + per_window // 2 - 1 for k in range(config.checkpoints)]
    out["checkpoints"] = checkpoints(book, feeds, w1, marks, config)
    cps = out["checkpoints"]
    acks = sum(c["acks"] for c in cps)
    ack_s = sum(c["ack_s"] for c in cps)
    fold_s = sum(c["fold_s"] for c in cps)
    state_s = sum(c["state_s"] for c in cps)
    out.update(
        acks=s["acks"],
        rows_per_ack=s["rows_per_ack"],
        acks_per_s=s["acks"] / s["ack_s"],
        acks_absorbed_per_s=s["acks"] / (s["ack_s"] + s["fold_s"]),
        acks_absorbed_cpu_per_s=s["acks"] / (s["ack_cpu_s"] + s["fold_cpu_s"]),
        checkpoint_acks=acks,
        acks_folded_at_checkpoints_per_s=acks / (ack_s + fold_s),
        acks_with_checkpoints_per_s=acks / (ack_s + fold_s + state_s),
        snapshot_s=max(c["snapshot_s"] for c in cps),
        snapshot_cpu_s=max(c["snapshot_cpu_s"] for c in cps),
        state_mb=max(c["state_mb"] for c in cps),
        peak_rss_mb=peak_rss_mb(),
    )
    return out


def fast_forward(
    book: EpochBook[Listing], feeds: list[RankFeed], windows: int, per_window: int
) -> dict[str, Any]:
    """Ack the first ``windows`` windows of every rank: each window's rows in its first step."""
    empty = as_runs(())
    acks, seconds = 0, 0.0
    for w in tqdm(range(windows), desc="fast-forward (windows)", unit="win", file=sys.stderr):
        first = w * per_window
        records = [[StepRecord(first, f.window_runs(w))] for f in feeds]
        for mine in records:
            mine.extend(StepRecord(first + k, empty) for k in range(1, per_window))
        clock = Clock()
        for rank, mine in enumerate(records):
            book.ack(rank, mine)
        book.fold(first + per_window - 1)
        seconds += clock.lap()[0]
        acks += len(records) * per_window
    return {"windows": windows, "acks": acks, "seconds": seconds}


def steady(
    book: EpochBook[Listing], feeds: list[RankFeed], w0: int, config: Config
) -> dict[str, Any]:
    """Ack ``config.steady_windows`` windows of shuffled batches from window ``w0`` on, as
    the coordinator takes them: messages of ``ack_every`` records round-robin over the
    ranks, each followed by the coordinator's check for a fold (``EpochBook.fold_due``: every
    ``FOLD_EVERY`` steps, on a window's edge). Timed: the ``book.ack`` calls and the folds;
    not timed: making the batches."""
    per_window = feeds[0].batches_per_window
    acks = rows = folds = 0
    ack_s = ack_cpu_s = fold_s = fold_cpu_s = 0.0
    for w in tqdm(
        range(w0, w0 + config.steady_windows), desc="steady acks (windows)", file=sys.stderr
    ):
        made = [f.batches(w) for f in feeds]
        first = w * per_window
        for k in range(0, per_window, config.ack_every):
            chunk = [
                [
                    StepRecord(first + j, packed, closed=closed)
                    for j, (packed, closed) in enumerate(mine[k : k + config.ack_every], k)
                ]
                for mine in made
            ]
            gc.collect()
            for rank, records in enumerate(chunk):
                clock = Clock()
                book.ack(rank, records)
                wall, cpu = clock.lap()
                ack_s, ack_cpu_s = ack_s + wall, ack_cpu_s + cpu
                clock = Clock()  # the coordinator's check after every ack message
                if book.fold_due() is not None:
                    folds += 1
                wall, cpu = clock.lap()
                fold_s, fold_cpu_s = fold_s + wall, fold_cpu_s + cpu
                acks += len(records)
                rows += sum(len(r.runs) for r in records)
        del made
    tqdm.write(
        f"steady: {acks:,} acks in {ack_s:.2f} s, {folds} folds in {fold_s:.2f} s "
        f"(every {FOLD_EVERY} steps, on a window's edge)"
    )
    return {
        "windows": config.steady_windows,
        "acks": acks,
        "rows_per_ack": rows / acks,
        "ack_s": ack_s,
        "ack_cpu_s": ack_cpu_s,
        "folds": folds,
        "fold_s": fold_s,
        "fold_cpu_s": fold_cpu_s,
    }


def checkpoints(
    book: EpochBook[Listing], feeds: list[RankFeed], w0: int, marks: list[int], config: Config
) -> list[dict[str, Any]]:
    """Ack shuffled batches from window ``w0`` on; snapshot and fold at each step of ``marks``."""
    per_window = feeds[0].batches_per_window
    pending: list[list[tuple[Rows, Closed]]] = [[] for _ in feeds]
    made = [w0] * len(feeds)
    step = w0 * per_window
    out = []
    for n, mark in enumerate(marks, 1):
        need = mark + 1 - step
        for r, f in enumerate(
            tqdm(feeds, desc=f"checkpoint {n}: shuffled batches", unit="rank", file=sys.stderr)
        ):
            while len(pending[r]) < need:
                pending[r].extend(f.batches(made[r]))
                made[r] += 1
        sent = [mine[:need] for mine in pending]
        pending = [mine[need:] for mine in pending]
        rows_per_ack = float(np.mean([len(b) for mine in sent for b, _ in mine]))
        gc.collect()
        ack_s = ack_cpu_s = 0.0
        for k in range(0, need, config.ack_every):
            chunk = [
                [
                    StepRecord(step + j, mine[j][0], closed=mine[j][1])
                    for j in range(k, min(k + config.ack_every, need))
                ]
                for mine in sent
            ]
            clock = Clock()
            for rank, records in enumerate(chunk):
                book.ack(rank, records)
            wall, cpu = clock.lap()
            ack_s += wall
            ack_cpu_s += cpu
        del sent
        # What the coordinator does for a state at ``mark``: merge the acks not folded yet,
        # then write the state. The fold first, so that the two parts are timed apart.
        clock = Clock()
        book.fold(mark)
        fold_s, fold_cpu_s = clock.lap()
        clock = Clock()
        state = book.snapshot(mark)
        t_book, _ = clock.lap()
        data = state.to_json()
        t_json, _ = clock.lap()
        text = json.dumps(data)
        state_s, state_cpu_s = clock.lap()
        check_state(state, mark, config)
        out.append(
            {
                "step": mark,
                "acks": need * len(feeds),
                "rows_per_ack": rows_per_ack,
                "ack_s": ack_s,
                "ack_cpu_s": ack_cpu_s,
                "fold_s": fold_s,
                "fold_cpu_s": fold_cpu_s,
                "state_s": state_s,
                "snapshot_s": fold_s + state_s,
                "snapshot_cpu_s": fold_cpu_s + state_cpu_s,
                "state_parts_s": {
                    "book.snapshot": t_book,
                    "to_json": t_json - t_book,
                    "json.dumps": state_s - t_json,
                },
                "state_mb": len(text.encode()) / 1e6,
                "state_parts_mb": {k: len(json.dumps(v)) / 1e6 for k, v in data.items()},
            }
        )
        tqdm.write(
            f"checkpoint {n} at step {mark:,}: {need * len(feeds):,} acks in {ack_s:.2f} s, "
            f"fold {fold_s:.2f} s, state {state_s:.2f} s, {out[-1]['state_mb']:.1f} MB"
        )
        step = mark + 1
    return out


def check_state(state: StreamState, step: int, config: Config) -> None:
    """The snapshot holds exactly the rows of steps ``0..step`` (a check of the simulation).

    Raises:
        RuntimeError: If it does not.
    """
    consumed = state.progress.consumed.count() + state.distributed.carry_consumed.count()
    delivered = (step + 1) * config.ranks * config.batch_size
    if consumed != delivered or state.progress.delivered != delivered:
        raise RuntimeError(
            f"the state after step {step} holds {consumed} consumed rows and says "
            f"{state.progress.delivered} delivered; the ranks delivered {delivered}"
        )


def verdict(name: str, value: float) -> str:
    op, goal = GOALS[name]
    ok = value <= goal if op == "<=" else value >= goal
    return f"{op} {goal:,.0f}: {'met' if ok else 'NOT met'}"


def table(out: dict[str, Any]) -> str:
    """The figures as a text table."""
    c = out["config"]

    def row(label: str, key: str, value: str) -> str:
        return f"{label:<44} {value:>12}  {verdict(key, out[key])}"

    lines = [
        f"coordinator at scale: {c['shards']:,} shards, {c['ranks']:,} ranks, batch "
        f"{c['batch_size']:,}, window {c['window']:,} x {c['lanes']} lanes; "
        f"{out['rows']:,} rows, {out['steps_per_epoch']:,} steps/epoch",
        "",
        f"{'figure':<44} {'value':>12}  goal",
        row("plan one epoch, every rank's share (s)", "plan_s", f"{out['plan_s']:.2f}"),
        row(
            "acks absorbed per s (ack calls + folds)",
            "acks_absorbed_per_s",
            f"{out['acks_absorbed_per_s']:,.0f}",
        ),
        row("mid-epoch state (MB of JSON)", "state_mb", f"{out['state_mb']:.2f}"),
        row("snapshot: merge, state, to_json, dumps (s)", "snapshot_s", f"{out['snapshot_s']:.2f}"),
        f"{'peak RSS (MB)':<44} {out['peak_rss_mb']:>12,.0f}",
        "",
        f"acks per s: ack calls alone {out['acks_per_s']:,.0f}; with a checkpoint's fold "
        f"every window (half a window sorted) {out['acks_folded_at_checkpoints_per_s']:,.0f}, "
        f"and its state written too {out['acks_with_checkpoints_per_s']:,.0f}",
        f"CPU seconds (this machine is shared): plan {out['plan_cpu_s']:.2f}, slowest "
        f"snapshot {out['snapshot_cpu_s']:.2f}; acks absorbed per CPU s "
        f"{out['acks_absorbed_cpu_per_s']:,.0f}",
        f"plan: book.plan {out['plan_book_s']:.2f} s; {out['spans']:,} spans over the ranks",
        f"acks: {out['acks']:,} shuffled batches of {out['rows_per_ack']:.0f} packed rows "
        f"each, in messages of {c['ack_every']}; {out['steady']['folds']} folds in "
        f"{out['steady']['fold_s']:.2f} s over {c['steady_windows']} windows",
    ]
    for n, cp in enumerate(out["checkpoints"], 1):
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in cp["state_parts_s"].items())
        sizes = ", ".join(f"{k} {v:.2f}" for k, v in cp["state_parts_mb"].items() if v >= 0.01)
        lines.append(
            f"checkpoint {n} at step {cp['step']:,}: acks {cp['ack_s']:.2f} s, fold "
            f"{cp['fold_s']:.2f} s, state {cp['state_s']:.2f} s ({parts}); MB by part: {sizes}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Config()
    parser.add_argument("--shards", type=int, default=default.shards)
    parser.add_argument("--ranks", type=int, default=default.ranks)
    parser.add_argument("--batch-size", type=int, default=default.batch_size)
    parser.add_argument("--rows-per-shard", type=int, default=default.rows_per_shard)
    parser.add_argument("--row-groups", type=int, default=default.row_groups)
    parser.add_argument("--steady-windows", type=int, default=default.steady_windows)
    parser.add_argument("--checkpoints", type=int, default=default.checkpoints)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    config = Config(
        shards=args.shards,
        ranks=args.ranks,
        batch_size=args.batch_size,
        rows_per_shard=args.rows_per_shard,
        row_groups=args.row_groups,
        steady_windows=args.steady_windows,
        checkpoints=args.checkpoints,
    )
    out = measure(config)
    print(table(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
