"""The training jobs' harness: YAML config with overrides, the driver, the loop, the checks.

Not part of the library: the job scripts next to this file import it as their sibling
module (``python train/lm.py`` puts ``train/`` first on ``sys.path``; so does
``ray job submit --working-dir . -- python train/lm.py`` in the uploaded copy) and it uses
only ``ingest``'s public API. The Ray workers may not have ``train/`` on their path (under
a runtime env's ``working_dir`` only the working dir is), so this module registers itself
to be pickled by value: what the workers run from it travels with the task.

A job is a model built per worker, a step function, a config file and a writer of
synthetic data; :func:`main` does the rest. The driver builds the ``RayStream`` and the
``TorchTrainer``; the loop restores from the latest checkpoint, runs epochs, checkpoints
every few steps (model + stream state of the same step) and reports per-epoch throughput and
the data-stall share (time the rank waited for its next batch over the time of its steps).
At the end :func:`report_exactly_once` checks, from a per-row counter kept in the
checkpoint, that every row was trained on once per epoch.

    # train/lm.py
    from harness import Config, Job, main

    CONFIG = Path(__file__).parent / "configs" / "lm.yaml"
    JOB = Job("lm", build, step, columns=["id", "tokens"])
    if __name__ == "__main__":
        sys.exit(main(JOB, CONFIG, "*.parquet", _generate, description=__doc__))

A job with a loop of its own (``train/pretrain.py``) takes the pieces: :func:`parse_args`,
:func:`init_ray`, :func:`reader_pool` and :class:`Fault`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec
import torch
import yaml
from ray import cloudpickle

import ingest
import ingest.train

if TYPE_CHECKING:
    import ray.train
    from ray.train.torch import TorchTrainer

    from ingest.distributed.rank import RankIterator
    from ingest.distributed.ray_mix import MixedRankIterator
    from ingest.distributed.ray_stream import RayStream

# Workers import nothing from train/: what they run from here is pickled with the task.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

INGEST_RESOURCE = "ingest"
"""Custom resource of the CPU nodes that run read tasks and decode actors (see cluster/)."""
TRAINER_RESOURCE = "trainer"
"""Custom resource of the nodes that run the training workers (see cluster/)."""

Config = dict[str, Any]
Writer = Callable[[str, dict[str, Any], dict[str, Any]], None]
"""``write(url, storage_options, generate)``: writes a job's synthetic shards."""


def load_config(path: str | os.PathLike[str], overrides: Sequence[str]) -> Config:
    """The YAML file at ``path`` with ``a.b=value`` overrides (values parsed as YAML).

    Args:
        path: A YAML config file.
        overrides: ``KEY=VALUE`` items; dotted keys reach into nested mappings.

    Returns:
        The config, overrides applied.

    Raises:
        SystemExit: If an override is not ``KEY=VALUE``.
    """
    with open(path) as f:
        config: Config = yaml.safe_load(f)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"override {item!r} is not KEY=VALUE (e.g. train.epochs=3)")
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(raw)
    return config


def parse_args(
    default_config: str | os.PathLike[str],
    argv: Sequence[str] | None = None,
    *,
    description: str | None = None,
) -> Config:
    """Parse ``[--config PATH] [KEY=VALUE ...]`` into a config.

    Args:
        default_config: The config used when ``--config`` is not given (a job script passes
            its own, next to it: ``train/configs/<job>.yaml``).
        argv: The arguments; None reads ``sys.argv``.
        description: What ``--help`` says about the job (the script's docstring).

    Returns:
        The loaded config with the overrides applied.
    """
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", default=str(default_config), help="YAML config (default: %(default)s)"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, e.g. train.epochs=3 data.url=s3://b/tokens/",
    )
    args = parser.parse_args(argv)
    return load_config(args.config, args.overrides)


@dataclass
class Job:
    """One training job.

    Attributes:
        name: Job name (log prefix).
        build: ``config -> (model, optimizer)`` on each worker.
        step: ``(model, optimizer, batch) -> loss`` for one batch.
        columns: Columns the job reads.
        transform: Decode-pool transform (a class built once per actor), or None.
        format: The format to read ``data.url`` with (``"imagefolder"``), or None to tell
            it from the files' extensions.
    """

    name: str
    build: Callable[[Config], tuple[torch.nn.Module, torch.optim.Optimizer]]
    step: Callable[[torch.nn.Module, torch.optim.Optimizer, dict[str, Any]], torch.Tensor]
    columns: list[str]
    transform: Any = None
    format: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """An injected failure: rank 1 exits at ``die_at_step`` once (``marker`` remembers it).

    Attributes:
        name: The job name, for the log line.
        die_at_step: Step at which rank 1 exits; negative: never.
        marker: A file created on the way out, so the restarted run does not die again.
    """

    name: str
    die_at_step: int
    marker: str

    @classmethod
    def from_config(cls, name: str, cfg: Config) -> Fault:
        """The fault a job's config asks for (``fault.die_at_step``, ``fault.marker``).

        Args:
            name: The job name, for the log line.
            cfg: The job's config; no ``fault`` section: never.

        Returns:
            The fault.
        """
        fault = cfg.get("fault", {})
        return cls(
            name=name,
            die_at_step=int(fault.get("die_at_step", -1)),
            marker=str(fault.get("marker", "")),
        )

    def maybe_exit(self, rank: int, step: int) -> None:
        """Exit the process when this is rank 1 at the chosen step, the first time."""
        if rank != 1 or step != self.die_at_step or not self.marker:
            return
        if os.path.exists(self.marker):
            return
        Path(self.marker).touch()
        print(f"[{self.name}] injected failure: rank 1 exits at step {step}", flush=True)
        os._exit(1)


@dataclass(slots=True)
class _Worker:
    """What one training worker holds: the model, its optimizer and the exactly-once witness.

    Attributes:
        model: The model as built by the job (unwrapped).
        optimizer: Its optimizer.
        seen: How often each row id has been trained on, summed over ranks (checkpointed
            with the model, so it survives restarts like the model does).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    seen: torch.Tensor

    def restore(self, checkpoint: ray.train.Checkpoint) -> None:
        """Load model, optimizer and witness from a Ray Train checkpoint."""
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "model.pt"))
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.seen = saved["seen"]

    def save(self, directory: str) -> None:
        """Write model, optimizer and witness into a checkpoint directory."""
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "seen": self.seen,
            },
            os.path.join(directory, "model.pt"),
        )

    def count(self, ids: torch.Tensor) -> None:
        """Add a batch's row ids, from every rank, to the witness."""
        import torch.distributed as dist

        delta = torch.zeros(len(self.seen), dtype=torch.int64)
        delta.index_add_(0, ids, torch.ones(len(ids), dtype=torch.int64))
        if dist.is_initialized():
            dist.all_reduce(delta)
        self.seen += delta


@dataclass(slots=True)
class _EpochTimes:
    """One epoch's rows and seconds on this rank.

    Attributes:
        rows: Rows this rank trained on.
        waited: Seconds spent waiting for the next batch.
        stepped: Seconds spent in steps (and checkpoints).
        loss: The last step's loss.
    """

    rows: int = 0
    waited: float = 0.0
    stepped: float = 0.0
    loss: float = 0.0

    def line(self, name: str, epoch: int, elapsed: float) -> str:
        """The epoch's log line: loss, rows/s and data-stall share."""
        share = self.waited / max(self.waited + self.stepped, 1e-9)
        return (
            f"[{name}] epoch {epoch}: loss {self.loss:.3f}, "
            f"{self.rows / max(elapsed, 1e-9):,.0f} rows/s on rank 0, "
            f"data-stall share {share:.1%}"
        )


def _train_epoch(
    job: Job,
    worker: _Worker,
    it: RankIterator | MixedRankIterator,
    cfg: Config,
    ddp: torch.nn.Module,
) -> _EpochTimes:
    """Run one epoch of ``it`` on this rank; checkpoint every ``train.checkpoint_every``."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    every = int(cfg["train"]["checkpoint_every"])
    fault = Fault.from_config(job.name, cfg)
    epoch = it.upcoming_epoch()
    times = _EpochTimes()
    mark = time.perf_counter()
    for batch in it:
        got = time.perf_counter()
        times.waited += got - mark
        times.loss = float(job.step(ddp, worker.optimizer, batch))
        worker.count(batch["id"])
        times.rows += len(batch["id"])
        fault.maybe_exit(rank, it.step)
        if it.step % every == every - 1:
            ingest.train.report(it, {"loss": times.loss, "epoch": epoch}, save=worker.save)
        mark = time.perf_counter()
        times.stepped += mark - got
    return times


def train_loop(config: Config) -> None:
    """The loop every worker runs (``train_loop_per_worker``).

    Args:
        config: ``job`` (a :class:`Job`), ``config`` (the job's config), ``stream`` (the
            ``RayStream``) and ``rows_total`` (rows in the dataset, for the witness).
    """
    import ray.train
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    job: Job = config["job"]
    cfg: Config = config["config"]
    it, checkpoint = ingest.train.rank_iterator(config["stream"])
    model, optimizer = job.build(cfg)
    # The exactly-once witness: checkpointed and restored like the model.
    worker = _Worker(model, optimizer, torch.zeros(int(config["rows_total"]), dtype=torch.int64))
    if checkpoint:
        worker.restore(checkpoint)
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    ddp = DistributedDataParallel(model) if distributed else model
    rank = ray.train.get_context().get_world_rank()
    loss = 0.0
    while it.upcoming_epoch() < int(cfg["train"]["epochs"]):
        epoch = it.upcoming_epoch()
        start = time.perf_counter()
        times = _train_epoch(job, worker, it, cfg, ddp)
        loss = times.loss
        if rank == 0:
            print(times.line(job.name, epoch, time.perf_counter() - start), flush=True)
    ingest.train.report(it, {"loss": loss, "done": True}, save=worker.save)


def init_ray(config: Config) -> None:
    """Join the cluster at ``RAY_ADDRESS``, or start a local Ray big enough for the job.

    Args:
        config: The job's config: ``train.workers`` and ``readers.max_size`` size a local
            Ray (room for the workers, the read tasks and the decode actors).
    """
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    # A local Ray: room for the workers plus read tasks and decode actors.
    workers = int(config["train"]["workers"])
    readers_max = int(config.get("readers", {}).get("max_size", 2))
    ray.init(num_cpus=max(os.cpu_count() or 1, 2 * workers + readers_max + 2))


def reader_pool(config: Config) -> ingest.ReaderPool:
    """The stream's reader pool from ``readers`` and ``placement.ingest_nodes``.

    Args:
        config: The job's config: ``readers.min_size``, ``max_size``, ``num_cpus`` and
            ``autoscale``; ``placement.ingest_nodes: true`` puts the pool on the nodes that
            declare :data:`INGEST_RESOURCE`.

    Returns:
        The pool, for ``ingest.RayStream(readers=...)``.
    """
    readers = config.get("readers", {})
    on_ingest_nodes = config.get("placement", {}).get("ingest_nodes")
    # readers.autoscale: true sizes the pool between min_size and max_size while the job
    # runs (ingest.Autoscale's defaults); on an autoscaling cluster its readers bring nodes.
    return ingest.ReaderPool(
        min_size=int(readers.get("min_size", 1)),
        max_size=int(readers.get("max_size", 2)),
        num_cpus=float(readers.get("num_cpus", 1)),
        resources={INGEST_RESOURCE: 0.001} if on_ingest_nodes else None,
        autoscale=ingest.Autoscale() if readers.get("autoscale") else None,
    )


def _trainer(job: Job, config: Config, stream: RayStream, rows_total: int) -> TorchTrainer:
    """The TorchTrainer of a job: ``train.workers`` workers, placed by ``placement``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    run_cfg = config["run"]
    on_trainer_nodes = config.get("placement", {}).get("trainer_nodes")
    return TorchTrainer(
        train_loop,
        train_loop_config={
            "job": job,
            "config": copy.deepcopy(config),
            "stream": stream,
            "rows_total": rows_total,
        },
        scaling_config=ScalingConfig(
            num_workers=int(config["train"]["workers"]),
            resources_per_worker={"CPU": 1, TRAINER_RESOURCE: 1} if on_trainer_nodes else None,
        ),
        run_config=RunConfig(
            name=run_cfg["name"],
            storage_path=run_cfg["storage_path"],
            failure_config=FailureConfig(max_failures=int(run_cfg.get("max_failures", 0))),
        ),
    )


def run(job: Job, config: Config) -> dict[str, Any]:
    """Drive a job: stream + TorchTrainer; returns the final checkpoint's findings.

    Args:
        job: The job.
        config: Its config (``data``, ``train``, ``readers``, ``placement``, ``run``).

    Returns:
        ``checkpoint`` (path), ``state`` (the stream state in it), ``seen_histogram`` (how
        many rows were trained on 0, 1, 2... times), ``rows`` and ``epochs``.

    Raises:
        SystemExit: If the run ended without a checkpoint.
    """
    init_ray(config)
    data, train_cfg = config["data"], config["train"]
    listing = ingest.list_shards(
        data["url"], storage_options=data.get("storage_options"), format=job.format
    )
    total = listing.rows if listing.rows is not None else int(data["rows"])
    with ingest.RayStream(
        data["url"],
        format=job.format,
        columns=job.columns,
        batch_size=int(train_cfg["batch_size"]),
        shuffle_seed=train_cfg.get("seed", 0),
        world_size=int(train_cfg["workers"]),
        storage_options=data.get("storage_options"),
        readers=reader_pool(config),
        transform=job.transform,
    ) as stream:
        result = _trainer(job, config, stream, total).fit()
    if result.checkpoint is None:
        raise SystemExit("the run finished without a checkpoint; is train.checkpoint_every set?")
    with result.checkpoint.as_directory() as directory:
        saved = torch.load(os.path.join(directory, "model.pt"))
        state = json.loads(Path(directory, ingest.train.STATE_FILE).read_text())
    return {
        "checkpoint": result.checkpoint.path,
        "state": state,
        "seen_histogram": torch.bincount(saved["seen"]).tolist(),
        "rows": total,
        "epochs": int(train_cfg["epochs"]),
    }


def generate_if_empty(config: Config, pattern: str, write: Writer) -> None:
    """Write synthetic shards when ``data.generate`` is set and ``data.url`` has none.

    Args:
        config: The job's config.
        pattern: Glob of the job's shard files under ``data.url`` (e.g. ``*.parquet``).
        write: Called as ``write(url, storage_options, generate)`` when nothing matches.
    """
    data = config["data"]
    gen = data.get("generate")
    if not gen:
        return
    options = data.get("storage_options") or {}
    fs, root = fsspec.core.url_to_fs(data["url"], **options)
    if fs.exists(root) and fs.glob(f"{root.rstrip('/')}/{pattern}"):
        return
    write(data["url"], options, gen)


def main(
    job: Job,
    default_config: str | os.PathLike[str],
    pattern: str,
    write: Writer,
    argv: Sequence[str] | None = None,
    *,
    description: str | None = None,
) -> int:
    """Entry point of a job script: config, synthetic data if asked, run, check.

    Args:
        job: The job.
        default_config: Config path used when ``--config`` is not given; a script passes
            its own (``Path(__file__).parent / "configs" / "lm.yaml"``), so nothing depends
            on package data.
        pattern: Glob of the job's shard files (see :func:`generate_if_empty`).
        write: Writes synthetic shards (see :func:`generate_if_empty`).
        argv: Command-line arguments; None reads ``sys.argv``.
        description: What ``--help`` says about the job (the script's docstring).

    Returns:
        The exit status: 0 when every row was delivered exactly once per epoch, else 1.
    """
    config = parse_args(default_config, argv, description=description)
    generate_if_empty(config, pattern, write)
    found = run(job, config)
    print(json.dumps({"state_epoch": found["state"]["progress"]["epoch"], "rows": found["rows"]}))
    return 0 if report_exactly_once(job.name, found) else 1


def report_exactly_once(name: str, found: dict[str, Any]) -> bool:
    """Print the exactly-once check of a finished job.

    Args:
        name: The job name (log prefix).
        found: What :func:`run` returned.

    Returns:
        True when every row was seen once per epoch, except the last epoch's carried
        remainder, seen once less.
    """
    epochs, rows, histogram = found["epochs"], found["rows"], found["seen_histogram"]
    carried = sum(b - a for _, a, b in found["state"]["distributed"]["carry"]["spans"])
    exact = histogram[epochs] if len(histogram) > epochs else 0
    short = histogram[epochs - 1] if len(histogram) >= epochs else 0
    ok = bool(exact + short == rows and short == carried and len(histogram) <= epochs + 1)
    print(
        f"[{name}] exactly once: {exact:,} of {rows:,} rows seen {epochs}x"
        + (
            f", {short:,} seen {epochs - 1}x (the last epoch's remainder, carried into the next)"
            if short
            else ""
        )
        + f"; checkpoint {found['checkpoint']} (stream state epoch "
        f"{found['state']['progress']['epoch']}, step {found['state']['progress']['step']})"
        f" -> {'OK' if ok else 'FAILED'}"
    )
    return ok
