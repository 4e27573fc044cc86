"""What one bench run measures: the data, the contenders, and the shuffle they all use."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ingest.core.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class ShuffleSettings:
    """The shuffle every contender runs with, set here once and mapped to each one's knobs.

    Attributes:
        seed: Seed of every contender's shuffle; None reads in listing order everywhere.
        window: Rows a shuffle mixes at once: ``shuffle_window`` of ingest, ``buffer_size`` of
            Hugging Face ``IterableDataset.shuffle``, ``local_shuffle_buffer_size`` of Ray
            Data, the permuted buffer of the torch DataLoader peer, ``shuffle_block_size``
            of Mosaic Streaming and ``item_shuffle_window`` of LitData.
        lanes: ingest's ``shuffle_lanes`` (shards read side by side into a window); None
            keeps the library default.
    """

    seed: int | None = 0
    window: int = 16_384
    lanes: int | None = None

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ConfigError(f"shuffle window={self.window} must be >= 1 row")
        if self.lanes is not None and self.lanes < 1:
            raise ConfigError(f"shuffle lanes={self.lanes} must be >= 1, or None")

    def ingest_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``ingest.Stream`` / ``ingest.RayStream`` for this shuffle."""
        kwargs: dict[str, Any] = {"shuffle_seed": self.seed, "shuffle_window": self.window}
        if self.lanes is not None:
            kwargs["shuffle_lanes"] = self.lanes
        return kwargs


def _default_ray_cpus() -> int:
    return max(4, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """One run of ``ingest bench``.

    Attributes:
        contenders: Contender names, in the order they run (see
            :data:`ingest.tools.bench.contenders.CONTENDERS`).
        shards: Parquet shards in each generated dataset.
        rows: Rows per shard.
        row_group: Rows per Parquet row group.
        batch_size: Rows per batch on every rank.
        ranks: Ranks of the distributed contenders (the one-process ``Stream`` has one).
        workers: DataLoader worker processes per rank of the torch, Hugging Face, Mosaic
            Streaming and LitData peers (and LitData's ``optimize`` processes).
        epochs: Epochs measured per contender; the first is cold, the others warm.
        labels: Distinct labels of the shuffle-quality dataset (shard ``i`` holds label
            ``i % labels`` only: every shard sorted by label).
        shuffle: The shuffle every contender uses.
        ray_cpus: Logical CPUs of the local Ray started for the run.
        timeout_s: Longest wait on the rank processes for one phase (an epoch, a resume, a
            close): a contender still running then fails, its processes killed, and the
            bench goes on with the next.
        progress: Show a progress bar on stderr.
    """

    contenders: tuple[str, ...]
    shards: int = 32
    rows: int = 16_384
    row_group: int = 4_096
    batch_size: int = 1_024
    ranks: int = 2
    workers: int = 2
    epochs: int = 2
    labels: int = 8
    shuffle: ShuffleSettings = field(default_factory=ShuffleSettings)
    ray_cpus: int = field(default_factory=_default_ray_cpus)
    timeout_s: float = 1800.0
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.contenders:
            raise ConfigError("no contenders to run; name at least one with --contenders")
        for name, value, least in (
            ("shards", self.shards, 1),
            ("rows", self.rows, 1),
            ("row_group", self.row_group, 1),
            ("batch_size", self.batch_size, 1),
            ("ranks", self.ranks, 1),
            ("workers", self.workers, 0),
            ("epochs", self.epochs, 1),
            ("labels", self.labels, 2),
            ("ray_cpus", self.ray_cpus, 1),
        ):
            if value < least:
                raise ConfigError(f"{name}={value} must be >= {least}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s={self.timeout_s} must be > 0 seconds")
        if self.shards * self.rows < self.ranks * self.batch_size * 2:
            raise ConfigError(
                f"{self.shards} shards x {self.rows} rows hold fewer than two batches of "
                f"{self.batch_size} per rank on {self.ranks} ranks; raise --rows or --shards"
            )

    @property
    def total_rows(self) -> int:
        """Rows in each generated dataset."""
        return self.shards * self.rows
