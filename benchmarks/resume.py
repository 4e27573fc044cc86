"""Resume is a seek (issue 32, item 1): the first batch after a resume, on every transport.

Parquet shards of an int64 ``id`` and 128 int32 ``tokens`` (a fixed-size list column) on a
loopback S3 server reached through the counting proxy of ``ingest bench``
(:mod:`ingest.tools.bench.proxy`), batches of 1,024, ``shuffle_seed=0``. Each saving
transport runs a fresh epoch and takes its state after 24 batches and after 45% of the
epoch's batches (batches handed to the training loop, all ranks together; rounded down to a
whole step of the saving transport); each state is then loaded into a new loader of the
loading transport, which runs to the end of the epoch. Pairs, saved by -> loaded by:
``Stream -> Stream``, ``DataLoader(2) -> DataLoader(2)``, ``-> DataLoader(1)``, ``->
Stream``, ``RayStream(2) -> RayStream(3)`` (a local Ray started here, each rank
iterated in a thread of its own), and ``RayStream(2) -> RayStream(3) joined`` (the ranks'
iterators from ``RayStream.joined`` with the state, as ``ingest.train`` resumes a worker
group from its checkpoint; its fresh epoch joined with no state), and ``RayStream(2) ->
RayStream(3) joined in place`` (Ray Train's restart after a worker failed: the driver's
stream is up, its group of 2 ran past the checkpoint and stopped, and a group of 3 joins it
from the checkpoint; timed from the join, see :func:`run_in_place`). A resume that starts a
new ``RayStream`` starts its pool's processes first (a job resubmitted); one in place
(a run's restart inside the job) does not.

For each resume it prints the state's JSON size (``len(json.dumps(state))``, and that over
the world size at save), the seconds from building the resumed loader (``Stream(...)``,
``DataLoader(...)`` or ``RayStream(...)``, then ``load_state_dict``) to its first batch (on
every rank, for a ``RayStream``), that over a fresh epoch's first batch on the loading
transport, the requests the store answered from that build to the end of the epoch, the
shard opens and reads in ``stats`` (a ``Stream``'s and a ``RayStream``'s; a ``DataLoader``'s
workers keep theirs), and whether the rows before the state, the rows after it and the rows
carried to the next epoch (``distributed.carry`` of the state at the epoch's end: a 3-rank
epoch cuts its rows into equal steps) are every id exactly once. It exits 1 when they are
not. A warm-up of one batch is taken first (imports, the first connection).

Goals (issue 32): a resume's first batch <= 1.2x a fresh epoch's on the loading transport
and <= the faster peer's resume (fixed figures from the issue, Mosaic and LitData, unless
``--peers-json`` names an ``ingest bench --json`` document); a state <= 8 KB per rank.
Figures from a shared 2-core machine are noisy: compare the ratios of one run.

    .venv/bin/python benchmarks/resume.py [--quick] [--repeat N] [--json PATH]
        [--peers-json PATH] [--pairs stream dl2 dl2-dl1 dl2-stream ray ray-joined
        ray-in-place]
        [--preload]

``--preload`` starts the local Ray with ``preload_python_modules`` (:data:`PRELOAD`): the
workers Ray starts ahead import the reader's and the coordinator's modules and s3fs before
an actor takes them, as on a cluster started with ``RAY_preload_python_modules=...``; a
``RayStream`` cannot set it on a running cluster. Without it, each actor imports them as it
starts.

Each fresh and each resumed epoch runs ``--repeat`` times (default 3; 1 with ``--quick``),
in rounds: each round runs every fresh epoch, then every resume, so that a load that
changes during the run (other jobs on a shared machine) weighs on both alike (``order`` in
the JSON). The first batch reported is the median, every run is checked for exactly once,
and the requests are the first run's. Each run's 1-minute load average is kept and printed
(min-max); a ``RayStream``'s phases (its pool started, the state loaded, the first batch:
medians) say where a resume's first batch went: its pool starts before any state is loaded,
so a resume and a fresh epoch differ there only by the machine's noise.

Each run starts after one batch of a ``Stream`` (not measured) and with the garbage of the
runs before collected (``gc.collect``). A ``Stream`` run right after a ``DataLoader`` run
was 15-35 ms slower to its first batch than after a ``Stream`` run (a fresh epoch: 240
against 205 ms, 7 runs each, 2026-12-03; the process's pages written for the first time
since the workers forked, a collection left due): in each round the resumes a ``Stream``
loads follow a ``DataLoader`` run and the fresh ``Stream`` does not, which weighed against
them (``--pairs stream`` alone: ``Stream -> Stream`` at 24 0.99x, against 1.14x to 1.21x in
a run of every pair). On a quiet machine the next day it did not show (medians of 5: 185 ms
after a ``Stream`` run, 179 ms after a ``DataLoader(2)`` run, 191 ms after one and 1 s),
and a run of every pair read 1.31x for ``Stream -> Stream`` at 24 once: a ``Stream``'s
first batch is 0.2 s, so 60 ms of the machine's noise is 1.3x; compare it over several runs.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import re
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import ingest
from ingest.testing import LoopbackS3
from ingest.tools.bench import bytecode
from ingest.tools.bench.proxy import CountingProxy

TOKENS = 128
BUCKET = "resume-bench"
VS_FRESH_MAX = 1.2
STATE_PER_RANK_MAX = 8 * 1024
ISSUE_PEERS: dict[str, dict[str, float]] = {
    "Mosaic streaming": {"1": 2.1, "2": 3.8},
    "LitData": {"1": 1.3, "2": 3.1},
}
"""Issue 32's resume first-batch seconds of the peers, with 1 and with 2 workers."""
ISSUE_SOURCE = "issue 32 (fixed reference figures)"
PRELOAD = (
    "ingest.distributed.pool",
    "ingest.distributed.coordinator",
    "ingest.storage.sources.s3",
)
"""What ``--preload`` has Ray's workers import before they take an actor: the reader's
and the coordinator's modules and the S3 filesystem (s3fs, aiohttp, botocore)."""


@dataclass(frozen=True, slots=True)
class Transport:
    """How batches reach the loop: ``stream``, ``loader`` (n workers) or ``ray`` (n ranks;
    ``joined``: each rank's iterator from ``RayStream.joined`` with the state, as
    ``ingest.train`` resumes a worker group from its checkpoint, in place of
    ``load_state_dict`` and ``rank_iterator``; ``in_place``: joined to a stream that is up,
    see :func:`run_in_place`)."""

    kind: str
    n: int = 1
    joined: bool = False
    in_place: bool = False

    @property
    def name(self) -> str:
        return {
            "stream": "Stream",
            "loader": f"DataLoader({self.n})",
            "ray": f"RayStream({self.n}){' joined' if self.joined else ''}"
            + (" in place" if self.in_place else ""),
        }[self.kind]

    @property
    def readers(self) -> int:
        """Processes that read in parallel: which peer figure (1 or 2 workers) applies."""
        return 1 if self.kind == "stream" else max(1, self.n)


STREAM = Transport("stream")
PAIRS: dict[str, tuple[Transport, Transport]] = {
    "stream": (STREAM, STREAM),
    "dl2": (Transport("loader", 2), Transport("loader", 2)),
    "dl2-dl1": (Transport("loader", 2), Transport("loader", 1)),
    "dl2-stream": (Transport("loader", 2), STREAM),
    "ray": (Transport("ray", 2), Transport("ray", 3)),
    "ray-joined": (Transport("ray", 2), Transport("ray", 3, joined=True)),
    "ray-in-place": (Transport("ray", 2), Transport("ray", 3, joined=True, in_place=True)),
}
"""Every resume measured, by the name ``--pairs`` takes: (saved by, loaded by)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The data and the resume points.

    Attributes:
        shards: Parquet shards.
        rows: Rows per shard.
        row_group: Rows per Parquet row group.
        batch_size: Rows per batch.
        at: The first resume point, in batches handed to the loop.
        fraction: The second resume point, as a fraction of the epoch's batches.
        seed: ``shuffle_seed``.
    """

    shards: int
    rows: int
    row_group: int
    batch_size: int
    at: int
    fraction: float
    seed: int = 0

    @property
    def total(self) -> int:
        return self.shards * self.rows

    @property
    def batches(self) -> int:
        return self.total // self.batch_size

    def points(self, step: int) -> list[int]:
        """The two resume points in batches, whole steps of ``step`` batches."""
        first = self.at // step * step
        second = round(self.fraction * self.batches) // step * step
        if not 0 < first < second < self.batches:
            raise SystemExit(
                f"resume points {first} and {second} must lie inside the epoch's "
                f"{self.batches} batches, the first before the second: change --at or "
                "--fraction"
            )
        return [first, second]


@dataclass(slots=True)
class Env:
    """Where the data is and how to reach it through the counting proxy."""

    url: str
    kwargs: dict[str, Any]
    proxy: CountingProxy
    settings: Settings
    repeat: int = 1
    """Runs of each epoch measured (``--repeat``): the median first batch is reported."""


@dataclass(slots=True)
class Epoch:
    """One epoch of one loader, fresh or resumed.

    Attributes:
        first_batch_s: From building the loader to its first batch (every rank's).
        requests: Requests the store answered from the build to the epoch's end.
        ids: Every id delivered, in arrival order per rank.
        states: State after ``n`` batches handed out, by ``n``.
        before: Ids delivered before each of ``states``.
        end_state: The state after the epoch (it holds the rows carried to the next).
        reads: Opens and reads from the loader's ``stats``; None where it keeps none.
    """

    first_batch_s: float
    requests: int
    ids: np.ndarray
    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    before: dict[int, np.ndarray] = field(default_factory=dict)
    end_state: dict[str, Any] = field(default_factory=dict)
    reads: dict[str, int] | None = None
    runs: list[float] = field(default_factory=list)
    """Every run's first-batch seconds (``--repeat``); ``first_batch_s`` is their median."""
    every_once: bool = True
    """Whether every repeated run delivered each id exactly once (checked per run)."""
    loads: list[float] = field(default_factory=list)
    """The machine's 1-minute load average as each run began (``os.getloadavg``)."""
    phases: dict[str, list[float]] = field(default_factory=dict)
    """A ``RayStream``'s seconds from the build to: its pool started (``RayStream(...)``
    returned), the state loaded (``load_state_dict`` returned; the same as the pool for a
    fresh epoch) and every rank's first batch; one per run."""


# -- data -----------------------------------------------------------------------------------


def write_shards(s3: LoopbackS3, settings: Settings) -> str:
    """Write the shards (ids 0..N-1 in shard order) straight to the server; their URL."""
    url = s3.create_bucket(BUCKET) + "/data"
    fs = s3.filesystem()
    rng = np.random.default_rng(0)
    for shard in range(settings.shards):
        ids = np.arange(shard * settings.rows, (shard + 1) * settings.rows, dtype=np.int64)
        tokens = rng.integers(0, 50_000, size=settings.rows * TOKENS, dtype=np.int32)
        table = pa.table(
            {"id": ids, "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), TOKENS)}
        )
        sink = io.BytesIO()
        pq.write_table(table, sink, row_group_size=settings.row_group)
        fs.pipe(f"{url}/part-{shard:05d}.parquet", sink.getvalue())
    return url + "/"


# -- running one epoch ----------------------------------------------------------------------


def _ids(batch: Any) -> np.ndarray:
    """The batch's ids, copied out of the (read-only, Arrow-backed) tensor."""
    return np.asarray(batch["id"].numpy(), dtype=np.int64).copy()


def _reads(stats: dict[str, int]) -> dict[str, int]:
    """The shard opens and reads of ``stats``, and any count of units the engine adds."""
    keep = ("opens", "reads")
    return {k: int(v) for k, v in stats.items() if k in keep or "unit" in k}


def run_local(env: Env, transport: Transport, state: Any, save_at: Iterable[int]) -> Epoch:
    """One epoch of a ``Stream`` or a ``DataLoader``, from ``state`` (None: fresh)."""
    save = set(save_at)
    counted = env.proxy.counters()
    start = time.perf_counter()
    stream = ingest.Stream(env.url, **env.kwargs)
    loader: Any = stream
    if transport.kind == "loader":
        loader = ingest.DataLoader(stream, num_workers=transport.n)
    if state is not None:
        loader.load_state_dict(state)
    first = 0.0
    chunks: list[np.ndarray] = []
    out = Epoch(0.0, 0, np.empty(0, np.int64))
    for batch in loader:
        if not chunks:
            first = time.perf_counter() - start
        chunks.append(_ids(batch))
        if len(chunks) in save:
            out.states[len(chunks)] = loader.state_dict()
            out.before[len(chunks)] = np.concatenate(chunks)
    out.end_state = loader.state_dict()
    out.requests = (env.proxy.counters() - counted).requests
    out.first_batch_s, out.ids = first, np.concatenate(chunks)
    if transport.kind == "stream":
        out.reads = _reads(stream.stats)
    else:
        getattr(loader, "close", lambda: None)()  # its kept workers stop now
    stream.close()
    return out


@dataclass(slots=True)
class _Rank:
    first: float = 0.0
    chunks: list[np.ndarray] = field(default_factory=list)
    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    before: dict[int, np.ndarray] = field(default_factory=dict)
    end_state: dict[str, Any] = field(default_factory=dict)


def _iterate_rank(it: Any, save_steps: set[int]) -> _Rank:
    """One rank's epoch, in a thread of its own: states after ``save_steps`` steps."""
    out = _Rank()
    for batch in it:
        if not out.chunks:
            out.first = time.perf_counter()
        out.chunks.append(_ids(batch))
        if len(out.chunks) in save_steps:
            out.states[len(out.chunks)] = it.state_dict()  # waits for every rank's step
            out.before[len(out.chunks)] = np.concatenate(out.chunks)
    out.end_state = it.state_dict()
    return out


def run_ray(env: Env, transport: Transport, state: Any, save_at: Iterable[int]) -> Epoch:
    """One epoch of a ``RayStream`` of ``transport.n`` ranks, from ``state`` (None: fresh)."""
    world = transport.n
    steps = {n // world: n for n in save_at}
    counted = env.proxy.counters()
    start = time.perf_counter()
    stream = ingest.RayStream(env.url, world_size=world, **env.kwargs)
    started = loaded = time.perf_counter() - start
    try:
        its: list[Any]
        if transport.joined:  # every rank joins before any iterates, as a worker group's
            its = [stream.joined(rank, world, state) for rank in range(world)]
            loaded = time.perf_counter() - start
        else:
            if state is not None:
                stream.load_state_dict(state)
                loaded = time.perf_counter() - start
            its = [stream.rank_iterator(rank) for rank in range(world)]
        with ThreadPoolExecutor(world) as pool:
            ranks = list(pool.map(lambda it: _iterate_rank(it, set(steps)), its))
        requests = (env.proxy.counters() - counted).requests
        reads = _reads(stream.stats())
    finally:
        stream.shutdown()
    return _ray_epoch(ranks, start, requests, reads, (started, loaded), steps)


def _ray_epoch(
    ranks: list[_Rank],
    start: float,
    requests: int,
    reads: dict[str, int],
    phases: tuple[float, float],
    steps: dict[int, int] | None = None,
) -> Epoch:
    """The epoch of a RayStream's ``ranks`` timed from ``start``: ``phases`` are the
    seconds to the pool started and the state loaded; ``steps`` the saved states' steps,
    by the batches they follow."""
    first = max(r.first for r in ranks) - start
    steps = steps or {}
    return Epoch(
        first_batch_s=first,
        requests=requests,
        ids=np.concatenate([c for r in ranks for c in r.chunks]),
        states={n: ranks[0].states[s] for s, n in steps.items()},
        before={n: np.concatenate([r.before[s] for r in ranks]) for s, n in steps.items()},
        end_state=ranks[0].end_state,
        reads=reads,
        phases={
            "pool_started_s": [phases[0]],
            "state_loaded_s": [phases[1]],
            "first_batch_s": [first],
        },
    )


FAILED_STEPS = 4
"""Steps the worker group of :func:`run_in_place` runs past the checkpoint's before it fails."""
GROUP_START_S = 3.0
"""Seconds between building the stream and a fresh worker group's join in
:func:`run_in_place`: a Ray Train worker group takes that long or more to start (each
worker imports torch) while the driver's pool settles. Joined at once, the readers were
still importing s3fs and making their clients on the same 2 cores: the first batches came
0.65-1.34 s after the first request, against 0.26-0.33 s 3 s after the build."""


def run_in_place(env: Env, transport: Transport, state: Any) -> Epoch:
    """A worker group of ``transport.n`` ranks joining a ``RayStream`` that is up: Ray
    Train's restart after a worker failed (or at another worker count, ``ingest.train``
    calling ``RayStream.joined`` with the last checkpoint), where the driver's stream, its
    coordinator and its readers live on. With ``state``: the stream was made at the state's
    world size and its group ran a fresh epoch to :data:`FAILED_STEPS` steps past the
    state's step, then stopped (failed); the first batch is timed from the join, the
    requests counted from the join to the epoch's end. Fresh (no state): a group joins a
    stream no group ran, :data:`GROUP_START_S` after the build (a worker group's start gives
    the pool that long to settle), with no head start: the feeds start at the join, as a
    resume's do, so the two compare what a join costs. (Sent to the group as a
    ``TorchTrainer``'s config, a stream starts the feeds of a fresh epoch as it is
    serialized, seconds before the join: with that head start, the first batches were there
    0.04 s after the join. A resume has none: the state comes with the join.) The first
    batch is timed from the join, the requests counted from the stream's build (its listing
    among them: a resume in place lists the source again, the ranks having run)."""
    world = transport.n if state is None else int(state["distributed"]["world_size"])
    counted = env.proxy.counters()
    stream = ingest.RayStream(env.url, world_size=world, **env.kwargs)
    try:
        if state is not None:  # the group that failed: past the state's step
            steps = int(state.get("progress", {}).get("step", 0)) + FAILED_STEPS
            failed = [stream.rank_iterator(rank) for rank in range(world)]
            with ThreadPoolExecutor(world) as pool:
                list(pool.map(lambda it: list(islice(it, steps)), failed))
            counted = env.proxy.counters()
        else:  # the pool settles while the first worker group starts
            time.sleep(GROUP_START_S)
        before = _reads(stream.stats())
        start = time.perf_counter()
        its = [stream.joined(rank, transport.n, state) for rank in range(transport.n)]
        joined = time.perf_counter() - start
        with ThreadPoolExecutor(transport.n) as pool:
            ranks = list(pool.map(lambda it: _iterate_rank(it, set()), its))
        requests = (env.proxy.counters() - counted).requests
        reads = {k: v - before.get(k, 0) for k, v in _reads(stream.stats()).items()}
    finally:
        stream.shutdown()
    return _ray_epoch(ranks, start, requests, reads, (0.0, joined))


def ray_floor(pairs: list[tuple[Transport, Transport]], repeat: int) -> dict[str, float]:
    """Seconds for as many processes as each new ``RayStream`` of ``pairs`` starts (its
    pool's readers and its coordinator) to start as actors of an empty class and answer a
    call: the median of ``repeat`` runs, by process count. What Ray itself costs before
    any of this project's code runs (1.2 CPU seconds a process, 2026-12-03)."""
    import ray

    @ray.remote(num_cpus=0)
    class Empty:
        def ready(self) -> bool:
            return True

    cluster = ray.cluster_resources()  # type: ignore[no-untyped-call]
    counts = sorted(
        {
            ingest.ReaderPool().on(cluster).size(t.n) + 1
            for pair in pairs
            for t in pair
            if t.kind == "ray" and not t.in_place
        }
    )
    out: dict[str, float] = {}
    for n in counts:
        runs = []
        for _ in range(repeat):
            gc.collect()
            start = time.perf_counter()
            actors = [Empty.remote() for _ in range(n)]  # type: ignore[attr-defined]
            ray.get([a.ready.remote() for a in actors], timeout=120)
            runs.append(time.perf_counter() - start)
            for a in actors:
                ray.kill(a)
            time.sleep(1)  # their processes gone before the next run
        out[f"{n} processes"] = float(np.median(runs))
        _log(f"Ray's floor: {n} empty actors in {out[f'{n} processes']:.2f} s")
    return out


def run_once(env: Env, transport: Transport, state: Any, save_at: Iterable[int]) -> Epoch:
    """One epoch of ``transport``, from ``state`` (None: a fresh epoch), after one batch of
    a ``Stream`` and a collection of the garbage of the runs before (see the module
    docstring)."""
    warm_up(env)
    gc.collect()
    load = os.getloadavg()[0]
    start = time.perf_counter()
    if transport.in_place:
        epoch = run_in_place(env, transport, state)
    elif transport.kind == "ray":
        epoch = run_ray(env, transport, state, save_at)
    else:
        epoch = run_local(env, transport, state, save_at)
    epoch.runs, epoch.loads = [epoch.first_batch_s], [load]
    phases = " ".join(f"{k[:-2]} {v[0]:.2f}" for k, v in epoch.phases.items())
    _log(
        f"  first batch {epoch.first_batch_s:.2f} s{f' ({phases})' if phases else ''}, "
        f"{epoch.requests} requests, epoch {time.perf_counter() - start:.1f} s, load {load:.1f}"
    )
    return epoch


def record(series: Epoch | None, again: Epoch, before: np.ndarray | None, s: Settings) -> Epoch:
    """``again`` added to the runs of ``series`` (None: ``again`` is the first run, whose
    figures and states are kept); the first batch is the median of the runs. ``before``:
    the ids delivered before the state ``again`` resumed (None: a fresh epoch): every
    run is checked to deliver the rest exactly once."""
    if series is None:
        return again
    series.runs += again.runs
    series.loads += again.loads
    for name, values in again.phases.items():
        series.phases.setdefault(name, []).extend(values)
    delivered = [again.ids] if before is None else [before, again.ids]
    series.every_once &= bool(exactly_once(delivered, again.end_state, s)["ok"])
    series.first_batch_s = float(np.median(series.runs))
    return series


def warm_up(env: Env) -> None:
    """One batch of a ``Stream``, before each run (:func:`run_once`): imports, the first
    connection and what the run before left are not measured."""
    stream = ingest.Stream(env.url, **env.kwargs)
    next(iter(stream))
    stream.close()


# -- checks and figures ---------------------------------------------------------------------


def carried_ids(state: dict[str, Any], rows: int) -> np.ndarray:
    """Ids of the rows ``state`` carries into its epoch (``distributed.carry.spans``)."""
    shards = state["dataset"]["shards"]
    spans = state.get("distributed", {}).get("carry", {}).get("spans", [])
    parts = []
    for shard, begin, end in spans:
        number = int(re.search(r"part-(\d+)", shards[shard][0]).group(1))  # type: ignore[union-attr]
        parts.append(np.arange(number * rows + begin, number * rows + end, dtype=np.int64))
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def exactly_once(
    delivered: Sequence[np.ndarray], end_state: dict[str, Any], s: Settings
) -> dict[str, Any]:
    """Whether ``delivered`` and the rows carried to the next epoch are every id once."""
    got = np.concatenate(delivered)
    carried = carried_ids(end_state, s.rows)
    every = np.concatenate([got, carried])
    foreign = int(((every < 0) | (every >= s.total)).sum())
    counts = np.bincount(every[(every >= 0) & (every < s.total)], minlength=s.total)
    missing, duplicates = int((counts == 0).sum()), int((counts > 1).sum())
    return {
        "ok": missing == 0 and duplicates == 0 and foreign == 0,
        "delivered": int(got.size),
        "carried": int(carried.size),
        "missing": missing,
        "duplicates": duplicates,
        "foreign": foreign,
    }


def peers(path: str | None) -> dict[str, Any]:
    """The peers' resume first-batch seconds with 1 and 2 workers, and the faster of each.

    From the issue's fixed figures, or from an ``ingest bench --json`` document: every
    contender but this project's that measured ``resume_first_batch_s``, filed under the
    run's DataLoader workers per rank (``config.workers``; 1 for 0 or 1) as the issue's are
    (the issue's figures, so labelled, when none did, and for the worker count the run did
    not measure: the one-process and 1-worker pairs keep a figure to meet).
    """
    figures: dict[str, dict[str, float]] = {}
    source = ISSUE_SOURCE
    if path is None:
        figures = {name: dict(f) for name, f in ISSUE_PEERS.items()}
    else:
        with open(path) as f:
            document = json.load(f)
        source = f"ingest bench results in {path}"
        key = "1" if int(document.get("config", {}).get("workers", 1)) <= 1 else "2"
        for c in document.get("contenders", []):
            value = (c.get("figures") or {}).get("resume_first_batch_s")
            if c.get("name") in ("stream", "raystream") or c.get("status") != "ok" or value is None:
                continue
            figures.setdefault(c.get("title", c["name"]), {})[key] = float(value)
    if not figures:
        source = f"{ISSUE_SOURCE}: no peer measured a resume in {path}"
        figures = {name: dict(f) for name, f in ISSUE_PEERS.items()}
    else:  # one run of ingest bench measures one worker count: the other's from the issue
        measured = {key for each in figures.values() for key in each}
        for key in sorted({"1", "2"} - measured):
            for name, each in ISSUE_PEERS.items():
                figures[f"{name} (issue 32)"] = {key: each[key]}
            source += f"; {key} worker(s): {ISSUE_SOURCE}, not measured there"
    faster: dict[str, float] = {}
    for each in figures.values():
        for key, value in each.items():
            faster[key] = min(faster.get(key, value), value)
    return {"source": source, "figures": figures, "faster": faster}


def resume_row(
    saved: Transport,
    loaded: Transport,
    point: int,
    origin: Epoch,
    resumed: Epoch | str,
    fresh: Epoch,
    reference: dict[str, Any],
    s: Settings,
) -> dict[str, Any]:
    """The figures of one resume, as printed and written to JSON; ``resumed`` is the error
    when the resumed epoch failed."""
    state = origin.states[point]
    size = len(json.dumps(state))
    world = int(state.get("distributed", {}).get("world_size", max(1, saved.n)))
    peer = reference["faster"].get("1" if loaded.readers <= 1 else "2")
    row = {
        "saved_by": saved.name,
        "loaded_by": loaded.name,
        "at_batch": point,
        "at_step": point // max(1, saved.n),
        "epoch_fraction": point / s.batches,
        "world_size_at_save": world,
        "state_bytes": size,
        "state_bytes_per_rank": size / world,
        "fresh_first_batch_s": fresh.first_batch_s,
        "peer_reference_s": peer,
    }
    if isinstance(resumed, str):
        return {
            **row,
            **dict.fromkeys(("first_batch_s", "vs_fresh", "requests", "reads")),
            "first_batch_runs_s": [],
            "load_1min": [],
            "error": resumed,
            "exactly_once": {"ok": False, "error": resumed},
            "goals_met": dict.fromkeys(("vs_fresh", "vs_peer", "state_per_rank"), False),
        }
    vs_fresh = resumed.first_batch_s / fresh.first_batch_s
    return {
        **row,
        "first_batch_s": resumed.first_batch_s,
        "vs_fresh": vs_fresh,
        "requests": resumed.requests,
        "reads": resumed.reads,
        "first_batch_runs_s": resumed.runs,
        "load_1min": resumed.loads,
        **_phases(resumed),
        "exactly_once": {
            **exactly_once([origin.before[point], resumed.ids], resumed.end_state, s),
            **({} if resumed.every_once else {"ok": False, "repeated_runs": "NOT exactly once"}),
        },
        "goals_met": {
            "vs_fresh": vs_fresh <= VS_FRESH_MAX,
            "vs_peer": None if peer is None else resumed.first_batch_s <= peer,
            "state_per_rank": size / world <= STATE_PER_RANK_MAX,
        },
    }


def _phases(epoch: Epoch) -> dict[str, Any]:
    """``phases_s``: the median of each phase over the runs (a RayStream's); none else."""
    if not epoch.phases:
        return {}
    return {"phases_s": {k: float(np.median(v)) for k, v in epoch.phases.items()}}


def fresh_row(transport: Transport, epoch: Epoch, s: Settings) -> dict[str, Any]:
    return {
        "transport": transport.name,
        "first_batch_s": epoch.first_batch_s,
        "first_batch_runs_s": epoch.runs,
        "requests": epoch.requests,
        "reads": epoch.reads,
        "load_1min": epoch.loads,
        **_phases(epoch),
        "exactly_once": {
            **exactly_once([epoch.ids], epoch.end_state, s),
            **({} if epoch.every_once else {"ok": False, "repeated_runs": "NOT exactly once"}),
        },
    }


# -- the run --------------------------------------------------------------------------------


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Run:
    """One run of :func:`measure`'s schedule: a fresh epoch of ``loaded`` (saving states at
    ``save``), or ``loaded`` resumed from ``saved``'s state at batch ``point``."""

    round: int
    loaded: Transport
    saved: Transport | None = None
    point: int = 0
    save: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        """``fresh`` or ``resume``."""
        return "fresh" if self.saved is None else "resume"

    @property
    def name(self) -> str:
        if self.saved is None:
            return self.loaded.name
        return f"{self.saved.name} at batch {self.point} -> {self.loaded.name}"


def runs(pairs: list[tuple[Transport, Transport]], points: list[int], repeat: int) -> list[Run]:
    """The order :func:`measure` runs in: ``repeat`` rounds, each a fresh epoch of every
    transport of ``pairs``, then every pair at both ``points``. The states are the first
    round's: a transport that saves for a pair saves at ``points`` in round 0 only. Rounds,
    not each series run whole in turn: on a shared machine the load changes within minutes
    (other jobs start and end), and a series run after another measured a different machine
    (a resume 1.26-1.38x its fresh epoch in one run, 1.0x in the next)."""
    saving = {saved for saved, _ in pairs}
    transports = list(dict.fromkeys(t for pair in pairs for t in pair))
    schedule: list[Run] = []
    for round_ in range(repeat):
        for t in transports:
            save = tuple(points) if round_ == 0 and t in saving else ()
            schedule.append(Run(round_, t, save=save))
        for saved, loaded in pairs:
            schedule += [Run(round_, loaded, saved, point) for point in points]
    return schedule


def apart(
    pairs: list[tuple[Transport, Transport]],
) -> tuple[list[tuple[Transport, Transport]], list[tuple[Transport, Transport]]]:
    """``pairs`` without Ray and those with it, in their order: each part is measured on its
    own (:func:`measure`), the first before Ray starts (DataLoader workers fork)."""
    local = [p for p in pairs if "ray" not in (p[0].kind, p[1].kind)]
    return local, [p for p in pairs if p not in local]


def measure(
    env: Env,
    pairs: list[tuple[Transport, Transport]],
    reference: dict[str, Any],
    order: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every run of :func:`runs` (``env.repeat`` rounds) and the rows of their figures.
    ``order`` gets each run as it goes (the local pairs and the Ray pairs are measured
    apart: ``group``). A resume that fails is reported in its row and not run again."""
    s = env.settings
    points = s.points(2)
    group = "ray" if any(t.kind == "ray" for pair in pairs for t in pair) else "local"
    epochs: dict[Transport, Epoch] = {}
    resumed: dict[tuple[Transport, Transport, int], Epoch | str] = {}
    for run in runs(pairs, points, env.repeat):
        t = run.loaded
        if run.saved is None:
            at = f", states at {list(run.save)}" if run.save else ""
            _log(f"round {run.round + 1}: fresh {t.name}{at}")
            order.append({"group": group, "round": run.round, "kind": run.kind, "run": run.name})
            epochs[t] = record(epochs.get(t), run_once(env, t, None, run.save), None, s)
            continue
        key = (run.saved, t, run.point)
        done = resumed.get(key)
        if isinstance(done, str):  # failed in an earlier round: reported as that
            continue
        _log(f"round {run.round + 1}: {run.name}")
        order.append({"group": group, "round": run.round, "kind": run.kind, "run": run.name})
        try:
            again = run_once(env, t, epochs[run.saved].states[run.point], ())
        except Exception as e:  # reported in its row; the other pairs still run
            resumed[key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            _log(f"  failed: {resumed[key]}")
            continue
        resumed[key] = record(done, again, epochs[run.saved].before[run.point], s)
    rows = [
        resume_row(saved, loaded, point, epochs[saved], got, epochs[loaded], reference, s)
        for (saved, loaded, point), got in resumed.items()
    ]
    return [fresh_row(t, e, s) for t, e in epochs.items()], rows


def _met(value: bool | None) -> str:
    return "n/a" if value is None else ("met" if value else "NOT met")


def _reads_text(reads: dict[str, int] | None) -> str:
    if reads is None:
        return "n/a"
    return " ".join(f"{k} {v:,}" for k, v in reads.items())


def _load_text(loads: list[float]) -> str:
    if not loads:
        return "-"
    low, high = min(loads), max(loads)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"


def _once_text(once: dict[str, Any]) -> str:
    if "error" in once:
        return f"FAILED: {once['error']}"
    carried = f" ({once['carried']:,} carried)" if once["carried"] else ""
    if once["ok"]:
        return "OK" + carried
    return (
        f"VIOLATED: {once['missing']:,} missing, {once['duplicates']:,} duplicated, "
        f"{once['foreign']:,} foreign{carried}"
    )


def report(
    fresh: list[dict[str, Any]], rows: list[dict[str, Any]], reference: dict[str, Any], s: Settings
) -> None:
    """Print the fresh epochs, the resumes and the goals."""
    print(
        f"{s.shards} Parquet shards x {s.rows:,} rows (id, {TOKENS} int32 tokens; row groups of "
        f"{s.row_group:,}), batch {s.batch_size:,}, shuffle_seed={s.seed}: {s.batches} batches "
        "an epoch; loopback S3 through the counting proxy"
    )
    print("\nfresh epoch (load: the 1-minute load average as the runs began, min-max)")
    print("| transport | first batch s | load | requests (epoch) | stats reads | exactly once |")
    print("|---|---|---|---|---|---|")
    for f in fresh:
        print(
            f"| {f['transport']} | {f['first_batch_s']:.2f} | {_load_text(f['load_1min'])} | "
            f"{f['requests']} | {_reads_text(f['reads'])} | {_once_text(f['exactly_once'])} |"
        )
    print("\nresume (requests: from building the resumed loader to the end of the epoch)")
    print(
        "| saved by -> loaded by | at batch (step, % epoch) | state KB (per rank) | first batch s"
        " | x fresh | load | peer s | requests | stats reads | exactly once |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer, first, ratio = r["peer_reference_s"], r["first_batch_s"], r["vs_fresh"]
        print(
            f"| {r['saved_by']} -> {r['loaded_by']} | {r['at_batch']} ({r['at_step']}, "
            f"{r['epoch_fraction']:.0%}) | {r['state_bytes'] / 1000:.1f} "
            f"({r['state_bytes_per_rank'] / 1000:.1f}) | "
            f"{'-' if first is None else f'{first:.2f}'} | "
            f"{'-' if ratio is None else f'{ratio:.2f}x'} | {_load_text(r['load_1min'])} | "
            f"{'n/a' if peer is None else f'{peer:.1f}'} | {r['requests'] or '-'} | "
            f"{_reads_text(r['reads'])} | {_once_text(r['exactly_once'])} |"
        )
    phased = [(f["transport"], f) for f in fresh if "phases_s" in f]
    phased += [(f"{r['saved_by']} -> {r['loaded_by']} at {r['at_batch']}", r) for r in rows]
    phased = [(name, f["phases_s"]) for name, f in phased if "phases_s" in f]
    if phased:
        print(
            "\nRayStream phases, seconds from the build (medians): the pool started "
            "(RayStream(...) returned), the state loaded, every rank's first batch (in place: "
            "from the join, the pool up before it)"
        )
        print("| run | pool started | state loaded | first batch | first batch - state loaded |")
        print("|---|---|---|---|---|")
        for name, p in phased:
            print(
                f"| {name} | {p['pool_started_s']:.2f} | {p['state_loaded_s']:.2f} | "
                f"{p['first_batch_s']:.2f} | {p['first_batch_s'] - p['state_loaded_s']:.2f} |"
            )
    faster = ", ".join(f"{k} worker(s) {v:.1f} s" for k, v in sorted(reference["faster"].items()))
    print(f"\npeer resume figures: {reference['source']}: the faster peer with {faster}")
    for name, figures in reference["figures"].items():
        each = ", ".join(f"{k} worker(s) {v:.1f} s" for k, v in sorted(figures.items()))
        print(f"  {name}: {each}")
    print(
        f"\ngoals: first batch <= {VS_FRESH_MAX}x the loading transport's fresh one; <= the "
        f"faster peer's (its 2-worker figure for 2 or more readers); state <= "
        f"{STATE_PER_RANK_MAX:,} bytes per rank"
    )
    print("| saved by -> loaded by | at batch | x fresh | vs peer | state per rank |")
    print("|---|---|---|---|---|")
    for r in rows:
        g = r["goals_met"]
        print(
            f"| {r['saved_by']} -> {r['loaded_by']} | {r['at_batch']} | {_met(g['vs_fresh'])} | "
            f"{_met(g['vs_peer'])} | {_met(g['state_per_rank'])} |"
        )


def document(
    s: Settings,
    quick: bool,
    fresh: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    reference: dict[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    """Everything measured, as the JSON ``--json`` writes."""
    return {
        "config": {
            "shards": s.shards,
            "rows_per_shard": s.rows,
            "rows": s.total,
            "row_group": s.row_group,
            "batch_size": s.batch_size,
            "batches": s.batches,
            "tokens": TOKENS,
            "shuffle_seed": s.seed,
            "points": s.points(2),
            "quick": quick,
        },
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            # each new process (a reader, the coordinator) compiles these from source
            "uncached_modules": bytecode.uncached(),
        },
        "wall_s": wall_s,
        "goals": {"vs_fresh_max": VS_FRESH_MAX, "state_bytes_per_rank_max": STATE_PER_RANK_MAX},
        "peers": reference,
        "fresh": fresh,
        "resumes": rows,
        "exactly_once_ok": all(r["exactly_once"]["ok"] for r in [*fresh, *rows]),
    }


def measure_on_ray(
    env: Env,
    pairs: list[tuple[Transport, Transport]],
    reference: dict[str, Any],
    order: list[dict[str, Any]],
    preload: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float]]:
    """The Ray pairs (:func:`measure`) and Ray's floor (:func:`ray_floor`) on a local Ray
    of 4 logical CPUs started here, with ``preload_python_modules`` if ``preload``."""
    import ray

    config = {"preload_python_modules": list(PRELOAD)} if preload else {}
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _system_config=config,
    )
    try:
        fresh, rows = measure(env, pairs, reference, order)
        return fresh, rows, ray_floor(pairs, env.repeat)
    finally:
        ray.shutdown()


def settings_of(args: argparse.Namespace) -> Settings:
    if args.quick:
        # 8 batches of 1,024 would leave no point inside the epoch: batches of 256.
        return Settings(shards=2, rows=4_096, row_group=1_024, batch_size=256, at=6, fraction=0.45)
    return Settings(
        shards=args.shards,
        rows=args.rows,
        row_group=args.row_group,
        batch_size=args.batch_size,
        at=args.at,
        fraction=args.fraction,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16_384, help="rows per shard")
    parser.add_argument("--row-group", type=int, default=4_096)
    parser.add_argument("--batch-size", type=int, default=1_024)
    parser.add_argument("--at", type=int, default=24, help="first resume point, in batches")
    parser.add_argument("--fraction", type=float, default=0.45, help="second resume point")
    parser.add_argument(
        "--quick", action="store_true", help="2 shards x 4,096 rows, batches of 256 (a smoke run)"
    )
    parser.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS))
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs of each fresh and resumed epoch; the median first batch is reported "
        "(a shared 2-core machine: one run's figures vary by 20-50%%); default 3, 1 with "
        "--quick",
    )
    parser.add_argument(
        "--preload",
        action="store_true",
        help="start the local Ray with preload_python_modules (its idle workers import "
        "the reader's and the coordinator's modules before an actor takes them), as a "
        "cluster started with RAY_preload_python_modules=... does",
    )
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    parser.add_argument(
        "--peers-json", metavar="PATH", help="an `ingest bench --json` document: peer resumes"
    )
    args = parser.parse_args(argv)
    s = settings_of(args)
    repeat = max(1, args.repeat if args.repeat is not None else 1 if args.quick else 3)
    reference = peers(args.peers_json)
    chosen = [PAIRS[name] for name in PAIRS if name in args.pairs]
    local, distributed = apart(chosen)
    start = time.perf_counter()
    with LoopbackS3() as s3, CountingProxy(s3.endpoint) as proxy:
        url = write_shards(s3, s)
        options = s3.storage_options(endpoint=proxy.endpoint)
        kwargs = {
            "columns": ["id", "tokens"],
            "batch_size": s.batch_size,
            "shuffle_seed": s.seed,
            "storage_options": options,
        }
        env = Env(url=url, kwargs=kwargs, proxy=proxy, settings=s, repeat=repeat)
        warm_up(env)
        # DataLoader workers fork: every local pair runs before Ray starts in this process.
        order: list[dict[str, Any]] = []
        fresh, rows = measure(env, local, reference, order) if local else ([], [])
        floor: dict[str, float] = {}
        if distributed:
            more_fresh, more_rows, floor = measure_on_ray(
                env, distributed, reference, order, args.preload
            )
            fresh, rows = fresh + more_fresh, rows + more_rows
    out = document(s, args.quick, fresh, rows, reference, time.perf_counter() - start)
    out["ray_floor_s"] = floor
    out["config"]["repeat"] = repeat
    out["config"]["preload"] = list(PRELOAD) if args.preload else []
    out["order"] = order
    report(fresh, rows, reference, s)
    if floor:
        each = ", ".join(f"{n} in {v:.2f} s" for n, v in floor.items())
        print(
            f"\nRay's own floor (medians of {repeat}): processes that import nothing of this "
            f"project (num_cpus=0 actors) started and answered: {each}. A new RayStream starts "
            "its readers and its coordinator as processes, each from nothing: a resume that "
            "builds one cannot come sooner than this; one in place starts none"
        )
    if line := bytecode.warning():
        print(f"\n{line}")
    print(f"\n{out['wall_s']:.0f} s in all; every row exactly once: {out['exactly_once_ok']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if out["exactly_once_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
