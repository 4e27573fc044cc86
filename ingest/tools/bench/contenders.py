"""The contenders a bench run can measure: a registry keyed by name.

Each entry names the class that drives it (imported only when it runs), the modules it
needs and the pip command that installs them, so a peer that is not installed is reported
as skipped with that hint instead of failing the run.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ingest.core.errors import ConfigError
from ingest.tools.bench.config import BenchConfig
from ingest.tools.bench.data import Dataset


class Loader(Protocol):
    """A contender's per-rank iterable, built inside the rank process."""

    def epoch(self) -> Iterator[Mapping[str, Any]]:
        """The batches of the next epoch."""
        ...

    def state_dict(self) -> Any:
        """The contender's resume state after the last batch handed out."""
        ...

    def close(self) -> None:
        """Release what the loader holds (processes, iterators)."""
        ...


class RankSource(Protocol):
    """What the driver sends to a rank (picklable): opens the rank's :class:`Loader`."""

    def open(self) -> Loader:
        """Build the loader in the rank process."""
        ...


class Contender(Protocol):
    """A loader under test, driven the same way as every other one.

    ``start`` builds the contender's pipeline on the driver and returns one picklable
    source per rank; each rank opens its source in its own process. ``resume`` does the
    same from the states taken at the half-epoch checkpoint (one per rank).
    """

    ranks: int
    resume_unsupported: str | None
    """Why first-batch-after-resume cannot be measured; None when it can."""

    def start(self, data: Dataset) -> list[RankSource]:
        """Build the pipeline for ``data``; one source per rank."""
        ...

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        """Build the pipeline again, positioned after ``states`` (one per rank)."""
        ...

    def stop(self) -> None:
        """Release what ``start``/``resume`` built on the driver; safe to call twice."""
        ...


@runtime_checkable
class Converter(Protocol):
    """A contender that reads only its own format: the bench's rows are converted first.

    The bench times :meth:`convert` apart (seconds and CPU) before the first epoch's clock
    starts; ``start`` and ``resume`` then read what it wrote.
    """

    read_note: str | None
    """Where the converted copy is read from when not from the bench's S3, and why."""

    def convert(self, data: Dataset) -> None:
        """Write ``data``'s rows in the contender's format with its own writer."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """A registered contender.

    Attributes:
        name: Name on the command line.
        title: Name in the table.
        target: ``module:Class`` of its :class:`Contender`, built with the run's config.
        modules: Modules the rank processes import before timing starts.
        install: pip command that installs what it needs beyond this package.
        requires: Further top-level packages it needs that the rank processes do not import
            by name before timing (:attr:`modules` loads them its own way).
    """

    name: str
    title: str
    target: str
    modules: tuple[str, ...]
    install: str | None = None
    requires: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """Top-level packages of :attr:`modules` and :attr:`requires` that are not installed."""
        tops = dict.fromkeys(m.split(".")[0] for m in (*self.modules, *self.requires))
        return [m for m in tops if importlib.util.find_spec(m) is None]

    def build(self, config: BenchConfig) -> Contender:
        """The contender object for ``config``."""
        module, _, name = self.target.partition(":")
        cls: Any = getattr(importlib.import_module(module), name)
        contender: Contender = cls(config)
        return contender


_BENCH_EXTRA = 'pip install "ingest[bench]"'
# Both peers pin torchvision, whose only wheel for torch 2.13 is the CUDA build (it cannot be
# imported beside the CPU torch): they are installed without their dependencies, which the
# `peers` extra lists instead (see the Makefile's `peers` target).
_PEERS_EXTRA = (
    "pip install -e '.[peers]' && pip install --no-deps "
    "mosaicml-streaming==0.13.0 litdata==0.2.76 (or: make peers)"
)

CONTENDERS: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            name="stream",
            title="ingest.Stream (1 process)",
            target="ingest.tools.bench.ours:StreamContender",
            modules=("ingest.engine.stream",),
        ),
        Entry(
            name="raystream",
            title="ingest.RayStream",
            target="ingest.tools.bench.ours:RayStreamContender",
            modules=("ingest.distributed.rank",),
        ),
        Entry(
            name="raydata",
            title="Ray Data streaming_split",
            target="ingest.tools.bench.raydata:RayDataContender",
            modules=("ray.data",),
        ),
        Entry(
            name="torch",
            title="torch DataLoader + fsspec",
            target="ingest.tools.bench.torch_peer:TorchContender",
            modules=("ingest.tools.bench.torch_peer", "s3fs"),
        ),
        Entry(
            name="hf",
            title="HF datasets + StatefulDataLoader",
            target="ingest.tools.bench.hf:HFContender",
            modules=("datasets", "torchdata.stateful_dataloader", "s3fs"),
            install=f"{_BENCH_EXTRA} (or pip install datasets torchdata)",
        ),
        Entry(
            name="mosaic",
            title="Mosaic Streaming (MDS)",
            target="ingest.tools.bench.mosaic:MosaicContender",
            modules=("ingest.tools.bench.mosaic", "streaming.base"),
            install=_PEERS_EXTRA,
            requires=("streaming", "xxhash", "zstd", "snappy", "brotli", "catalogue"),
        ),
        Entry(
            name="litdata",
            title="LitData (optimize)",
            target="ingest.tools.bench.litdata:LitDataContender",
            modules=("litdata",),
            install=_PEERS_EXTRA,
            requires=("lightning_utilities", "obstore", "tifffile"),
        ),
    )
}
"""Every contender, in the default running order."""


def entry(name: str) -> Entry:
    """The registered contender called ``name``.

    Raises:
        ConfigError: If no contender has that name (the message lists them).
    """
    found = CONTENDERS.get(name)
    if found is None:
        raise ConfigError(
            f"unknown contender {name!r}; choose from {', '.join(CONTENDERS)} "
            "(comma-separated in --contenders)"
        )
    return found
