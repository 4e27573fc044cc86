"""Peer: MosaicML Streaming, ``StreamingDataset`` over MDS shards + ``StreamingDataLoader``.

As its docs wire it: the rows are first written to MDS shards on S3 with ``MDSWriter``
(``out="s3://..."``: shards are written locally, then uploaded), about one MDS shard per
Parquet shard; every rank then builds a ``StreamingDataset(remote=..., local=...)`` with
``shuffle=True`` (its default ``py1e`` algorithm, ``shuffle_block_size`` the shared window,
``shuffle_seed`` the shared seed) and ``batch_size`` (Mosaic partitions samples per batch),
and a ``StreamingDataLoader`` with worker processes. Ranks are found the torchrun way, from
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, with ``MASTER_ADDR`` and
``MASTER_PORT`` for the gloo group it starts (and ends) while building the dataset, and the
ranks of one machine share one ``local`` cache directory (the local leader downloads each
shard once). Mosaic
takes the S3 endpoint and keys only from the environment (``S3_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...), set in the rank process before the dataset is built. Resume:
``StreamingDataLoader.state_dict()`` (samples seen, all ranks) at the checkpoint,
``load_state_dict`` on a new loader.

Importing ``streaming`` imports its vision and text helpers, and so torchvision, whose only
wheel for this torch is the CUDA build (it cannot be imported beside the CPU torch). This
module loads ``streaming.base`` (every class used here) without them: :func:`streaming_base`.
``mosaicml-streaming`` is optional (``make peers``); it is imported by name so this module
loads, and type-checks, without it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.tools.bench.config import BenchConfig
from ingest.tools.bench.contenders import Loader, RankSource
from ingest.tools.bench.convert import read_shard, rows, s3_environment, s3_variables, shard_paths
from ingest.tools.bench.data import Dataset

_SAMPLE_BYTES = 80
"""About the bytes of one MDS sample of the main dataset (id, 16 int32 tokens, offsets)."""


def streaming_base() -> Any:
    """Mosaic's ``streaming.base``, loaded without ``streaming``'s vision/text subpackages.

    When ``streaming`` is not imported yet, an empty package object stands for it (its
    ``__path__`` is the installed one), so ``streaming.base`` and what it imports load as
    usual while ``streaming/__init__.py``, which imports torchvision, never runs.
    """
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        if spec is None or spec.submodule_search_locations is None:
            raise ModuleNotFoundError("mosaicml-streaming is not installed: make peers")
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["streaming"] = package
    return importlib.import_module("streaming.base")


# The rank processes import this module, then ``streaming.base`` by name, before timing.
if importlib.util.find_spec("streaming") is not None:
    streaming_base()


def _columns(data: Dataset) -> dict[str, str]:
    return {name: ("ndarray:int32:16" if name == "tokens" else "int64") for name in data.columns}


def mds_url(data: Dataset) -> str:
    """Where the MDS copy of ``data`` is written: ``s3://bench/mds/<name>``."""
    return f"{data.url.rsplit('/', 1)[0]}/mds/{data.name}"


@dataclass(slots=True)
class _MosaicLoader:
    loader: Any

    def epoch(self) -> Iterator[Mapping[str, Any]]:
        if self.loader is None:
            raise RuntimeError("the StreamingDataLoader was closed")
        batches: Iterator[Mapping[str, Any]] = iter(self.loader)
        return batches

    def state_dict(self) -> Any:
        if self.loader is None:
            raise RuntimeError("the StreamingDataLoader was closed")
        return self.loader.state_dict()

    def close(self) -> None:
        loader, self.loader = self.loader, None
        if loader is not None:
            dataset = loader.dataset
            del loader
            del dataset


@dataclass(frozen=True, slots=True)
class MosaicSource:
    """Builds the rank's ``StreamingDataset`` and ``StreamingDataLoader`` in its process."""

    data: Dataset
    config: BenchConfig
    rank: int
    local: str
    port: int
    state: Any = None

    def open(self) -> Loader:
        base = streaming_base()
        config = self.config
        ranks = str(config.ranks)
        os.environ.update(
            {
                **s3_variables(self.data),
                "RANK": str(self.rank),
                "WORLD_SIZE": ranks,
                "LOCAL_RANK": str(self.rank),
                "LOCAL_WORLD_SIZE": ranks,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.port),
            }
        )
        shuffle = config.shuffle
        dataset = base.StreamingDataset(
            remote=mds_url(self.data),
            local=self.local,
            batch_size=config.batch_size,
            shuffle=shuffle.seed is not None,
            shuffle_seed=shuffle.seed if shuffle.seed is not None else 9176,
            shuffle_block_size=shuffle.window,
        )
        loader = base.StreamingDataLoader(
            dataset,
            batch_size=config.batch_size,
            num_workers=config.workers,
            persistent_workers=config.workers > 0,
        )
        if self.state is not None:
            loader.load_state_dict(self.state)
        return _MosaicLoader(loader)


class MosaicContender:
    """Mosaic Streaming over MDS shards on each of ``ranks`` ranks.

    Args:
        config: The run's settings.
    """

    resume_unsupported: str | None = None
    read_note: str | None = None

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.ranks = config.ranks
        self._locals: list[str] = []

    def convert(self, data: Dataset) -> None:
        """Write ``data``'s rows to MDS shards on S3 with ``MDSWriter``."""
        base = streaming_base()
        options, columns = data.storage_options(), list(data.columns)
        with (
            s3_environment(data),
            base.MDSWriter(
                out=mds_url(data),
                columns=_columns(data),
                size_limit=max(self.config.rows * _SAMPLE_BYTES, 1 << 12),
                progress_bar=False,
                exist_ok=True,
            ) as writer,
        ):
            for path in shard_paths(data):
                for sample in rows(read_shard(options, columns, path)):
                    writer.write(sample)

    def _sources(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        local = tempfile.mkdtemp(prefix="ingest-bench-mds-")
        self._locals.append(local)
        with socket.socket() as s:  # a free port for this pipeline's rendezvous
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        return [
            MosaicSource(data, self.config, r, local, port, state) for r, state in enumerate(states)
        ]

    def start(self, data: Dataset) -> list[RankSource]:
        return self._sources(data, [None] * self.ranks)

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        return self._sources(data, states)

    def stop(self) -> None:
        """Remove the local shard caches."""
        for local in self._locals:
            shutil.rmtree(local, ignore_errors=True)
        self._locals = []
