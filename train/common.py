"""What the example jobs share: YAML config with overrides, the driver, the train loop frame.

A job is a model (built per worker), a step function and a config. The driver builds the
``RayStream`` and the ``TorchTrainer``; the loop restores from the latest checkpoint, runs
epochs, checkpoints every few steps (model + stream state of the same step), and reports
per-epoch throughput and the data-stall share (time the rank waited for its next batch over
the time of its steps).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import torch
import yaml

import ingest
import ingest.train

INGEST_RESOURCE = "ingest"
"""Custom resource of the CPU nodes that run read tasks and decode actors (see cluster/)."""
TRAINER_RESOURCE = "trainer"
"""Custom resource of the nodes that run the training workers (see cluster/)."""

Config = dict[str, Any]


def load_config(path: str, overrides: Sequence[str]) -> Config:
    """The YAML file at ``path`` with ``a.b=value`` overrides (values parsed as YAML)."""
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


def parse_args(default_config: str, argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=default_config, help="YAML config")
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
    """One example job.

    Attributes:
        name: Job name (log prefix).
        build: ``config -> (model, optimizer)`` on each worker.
        step: ``(model, optimizer, batch) -> loss`` for one batch.
        columns: Columns the job reads.
        transform: Decode-pool transform (a class built once per actor), or None.
    """

    name: str
    build: Callable[[Config], tuple[torch.nn.Module, torch.optim.Optimizer]]
    step: Callable[[torch.nn.Module, torch.optim.Optimizer, dict[str, Any]], torch.Tensor]
    columns: list[str]
    transform: Any = None


def train_loop(config: Config) -> None:
    """The loop every worker runs (``train_loop_per_worker``)."""
    import ray.train
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    job: Job = config["job"]
    cfg: Config = config["config"]
    it, checkpoint = ingest.train.rank_iterator(config["stream"])
    model, optimizer = job.build(cfg)
    rows_total = int(config["rows_total"])
    seen = torch.zeros(rows_total, dtype=torch.int64)  # exactly-once witness, like a model
    if checkpoint:
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "model.pt"))
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            seen = saved["seen"]
    ddp = (
        DistributedDataParallel(model)
        if dist.is_initialized() and dist.get_world_size() > 1
        else model
    )
    rank = ray.train.get_context().get_world_rank()
    every = int(cfg["train"]["checkpoint_every"])
    die_at = int(cfg.get("fault", {}).get("die_at_step", -1))
    marker = str(cfg.get("fault", {}).get("marker", ""))

    def save(directory: str) -> None:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "seen": seen},
            os.path.join(directory, "model.pt"),
        )

    while it.upcoming_epoch() < int(cfg["train"]["epochs"]):
        epoch = it.upcoming_epoch()
        waited = stepped = 0.0
        rows = 0
        loss = torch.tensor(0.0)
        start = mark = time.perf_counter()
        for batch in it:
            got = time.perf_counter()
            waited += got - mark
            loss = job.step(ddp, optimizer, batch)
            delta = torch.zeros(rows_total, dtype=torch.int64)
            delta.index_add_(0, batch["id"], torch.ones(len(batch["id"]), dtype=torch.int64))
            if dist.is_initialized():
                dist.all_reduce(delta)
            seen += delta
            rows += len(batch["id"])
            if rank == 1 and it.step == die_at and marker and not os.path.exists(marker):
                Path(marker).touch()
                print(f"[{job.name}] injected failure: rank 1 exits at step {it.step}", flush=True)
                os._exit(1)
            if it.step % every == every - 1:
                ingest.train.report(it, {"loss": float(loss), "epoch": epoch}, save=save)
            mark = time.perf_counter()
            stepped += mark - got
        elapsed = time.perf_counter() - start
        if rank == 0:
            share = waited / max(waited + stepped, 1e-9)
            print(
                f"[{job.name}] epoch {epoch}: loss {float(loss):.3f}, "
                f"{rows / max(elapsed, 1e-9):,.0f} rows/s on rank 0, "
                f"data-stall share {share:.1%}",
                flush=True,
            )
    ingest.train.report(it, {"loss": float(loss), "done": True}, save=save)


def run(job: Job, config: Config) -> dict[str, Any]:
    """Drive a job: stream + TorchTrainer; returns the final checkpoint's findings."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    data, train_cfg, place = config["data"], config["train"], config.get("placement", {})
    workers = int(train_cfg["workers"])
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
        else:  # a local Ray: room for the workers plus read tasks and decode actors
            readers_max = int(config.get("readers", {}).get("max_size", 2))
            ray.init(num_cpus=max(os.cpu_count() or 1, 2 * workers + readers_max + 2))
    readers = ingest.ReaderPool(
        min_size=1,
        max_size=int(config.get("readers", {}).get("max_size", 2)),
        num_cpus=float(config.get("readers", {}).get("num_cpus", 1)),
        resources={INGEST_RESOURCE: 0.001} if place.get("ingest_nodes") else None,
    )
    rows_total = ingest.list_shards(
        data["url"], storage_options=data.get("storage_options"), progress=False
    )
    with ingest.RayStream(
        data["url"],
        columns=job.columns,
        batch_size=int(train_cfg["batch_size"]),
        shuffle_seed=train_cfg.get("seed", 0),
        world_size=workers,
        storage_options=data.get("storage_options"),
        readers=readers,
        transform=job.transform,
    ) as stream:
        total = rows_total.rows if rows_total.rows is not None else int(data["rows"])
        run_cfg = config["run"]
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={
                "job": job,
                "config": copy.deepcopy(config),
                "stream": stream,
                "rows_total": total,
            },
            scaling_config=ScalingConfig(
                num_workers=workers,
                resources_per_worker={"CPU": 1, TRAINER_RESOURCE: 1}
                if place.get("trainer_nodes")
                else None,
            ),
            run_config=RunConfig(
                name=run_cfg["name"],
                storage_path=run_cfg["storage_path"],
                failure_config=FailureConfig(max_failures=int(run_cfg.get("max_failures", 0))),
            ),
        )
        result = trainer.fit()
    if result.checkpoint is None:
        raise SystemExit("the run finished without a checkpoint; is train.checkpoint_every set?")
    with result.checkpoint.as_directory() as directory:
        saved = torch.load(os.path.join(directory, "model.pt"))
        state = json.loads(Path(directory, ingest.train.STATE_FILE).read_text())
    counts = torch.bincount(saved["seen"]).tolist()
    return {
        "checkpoint": result.checkpoint.path,
        "state": state,
        "seen_histogram": counts,
        "rows": total,
        "epochs": int(train_cfg["epochs"]),
    }


def generate_if_empty(
    config: Config, pattern: str, write: Callable[[str, dict[str, Any], dict[str, Any]], None]
) -> None:
    """Write synthetic shards with ``write(url, storage_options, generate)`` when
    ``data.generate`` is set and nothing matches ``pattern`` under ``data.url``."""
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
    default_config: str,
    pattern: str,
    write: Callable[[str, dict[str, Any], dict[str, Any]], None],
    argv: Sequence[str] | None = None,
) -> int:
    """Entry point of an example job: config, synthetic data if asked, run, check."""
    config = parse_args(default_config, argv)
    generate_if_empty(config, pattern, write)
    found = run(job, config)
    print(json.dumps({"state_epoch": found["state"]["progress"]["epoch"], "rows": found["rows"]}))
    return 0 if report_exactly_once(job.name, found) else 1


def report_exactly_once(name: str, found: dict[str, Any]) -> bool:
    """Print the exactly-once check of a finished job; True when it holds."""
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
