"""Peer: Hugging Face ``datasets`` streaming with torchdata's ``StatefulDataLoader``.

As the ``datasets`` docs wire it: ``load_dataset("parquet", data_files=..., streaming=True,
storage_options=...)``, ``select_columns``, ``shuffle(seed, buffer_size)`` with the shared
window, ``split_dataset_by_node`` for ranks when there is more than one, torch formatting
and ``.batch(batch_size)`` (batches formatted whole, far faster than collating rows), then
a ``StatefulDataLoader`` with worker processes. ``set_epoch`` reseeds each epoch. Resume:
``StatefulDataLoader.state_dict()`` at the checkpoint, ``load_state_dict`` on a new loader.

``datasets`` and ``torchdata`` are optional (``pip install "ingest[bench]"``); they are
imported by name so this module loads, and type-checks, without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.tools.bench.config import BenchConfig
from ingest.tools.bench.contenders import Loader, RankSource
from ingest.tools.bench.data import Dataset


@dataclass(slots=True)
class _HFLoader:
    dataset: Any
    loader: Any
    epochs: int = 0

    def epoch(self) -> Iterator[Mapping[str, Any]]:
        self.dataset.set_epoch(self.epochs)
        self.epochs += 1
        batches: Iterator[Mapping[str, Any]] = iter(self.loader)
        return batches

    def state_dict(self) -> Any:
        return self.loader.state_dict()

    def close(self) -> None:
        self.loader = None


@dataclass(frozen=True, slots=True)
class HFSource:
    """Builds the rank's streaming dataset and StatefulDataLoader in the rank process."""

    data: Dataset
    config: BenchConfig
    rank: int
    state: Any = None

    def open(self) -> Loader:
        datasets: Any = importlib.import_module("datasets")
        distributed: Any = importlib.import_module("datasets.distributed")
        stateful: Any = importlib.import_module("torchdata.stateful_dataloader")
        config = self.config
        ds = datasets.load_dataset(
            "parquet",
            data_files=self.data.glob,
            split="train",
            streaming=True,
            storage_options=self.data.storage_options(),
        ).select_columns(list(self.data.columns))
        if config.shuffle.seed is not None:
            ds = ds.shuffle(seed=config.shuffle.seed, buffer_size=config.shuffle.window)
        if config.ranks > 1:
            ds = distributed.split_dataset_by_node(ds, rank=self.rank, world_size=config.ranks)
        ds = ds.with_format("torch").batch(config.batch_size)
        loader = stateful.StatefulDataLoader(ds, batch_size=None, num_workers=config.workers)
        if self.state is not None:
            loader.load_state_dict(self.state)
        return _HFLoader(ds, loader)


class HFContender:
    """HF ``datasets`` streaming + ``StatefulDataLoader`` on each of ``ranks`` ranks.

    Args:
        config: The run's settings.
    """

    resume_unsupported: str | None = None

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.ranks = config.ranks

    def start(self, data: Dataset) -> list[RankSource]:
        return [HFSource(data, self.config, r) for r in range(self.ranks)]

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        return [HFSource(data, self.config, r, s) for r, s in enumerate(states)]

    def stop(self) -> None:
        """Nothing runs outside the rank processes."""
