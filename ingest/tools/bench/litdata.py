"""Peer: LitData, ``optimize`` into chunks, ``StreamingDataset`` + ``StreamingDataLoader``.

As its docs wire it: ``litdata.optimize(fn, inputs, output_dir=...)`` with one input per
Parquet shard (``fn`` reads the shard from the bench's S3 and yields its rows, one sample
each) and a chunk per shard's rows, in ``workers`` processes; every rank then builds a
``StreamingDataset(input_dir=...)`` with ``shuffle=True``, ``seed`` the shared seed and
``item_shuffle_window`` the shared window (chunk order and the items of a chunk are
shuffled), and a ``StreamingDataLoader`` with worker processes. LitData finds ranks in
``WORLD_SIZE`` and ``GLOBAL_RANK``. Resume: ``StreamingDataLoader.state_dict()`` at the
checkpoint, ``load_state_dict`` on a new loader.

The chunks are written to, and read from, local disk (:data:`READ_NOTE`): LitData 0.2.76
moves chunks with obstore, whose S3 store it builds without ``allow_http``, so it refuses
the loopback server's plain-HTTP endpoint (``BadScheme``) whatever ``storage_options`` say;
boto3's endpoint reaches only its listing and index calls.

``litdata`` is optional (``make peers``); it is imported by name so this module loads, and
type-checks, without it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import multiprocessing
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.tools.bench.config import BenchConfig
from ingest.tools.bench.contenders import Loader, RankSource
from ingest.tools.bench.convert import environment, read_shard, rows, shard_paths
from ingest.tools.bench.data import Dataset

READ_NOTE = (
    "reads its chunks from local disk: LitData 0.2.76 moves chunks with obstore, which it "
    "builds without allow_http, so it refuses the loopback S3 server's http:// endpoint"
)
"""Why LitData's epochs make no S3 requests (the report's note)."""


def shard_samples(
    options: dict[str, Any], columns: list[str], path: str
) -> Iterator[dict[str, Any]]:
    """``optimize``'s ``fn``: the rows of one Parquet shard, one sample each.

    Integers go in as Python ints (LitData's integer serializer); a numpy scalar would be
    pickled, and unpickled for every sample read.
    """
    for sample in rows(read_shard(options, columns, path)):
        yield {k: v.item() if getattr(v, "ndim", None) == 0 else v for k, v in sample.items()}


@contextlib.contextmanager
def _start_method(method: str | None) -> Iterator[None]:
    try:
        yield
    finally:
        multiprocessing.set_start_method(method, force=True)


@dataclass(slots=True)
class _LitLoader:
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
        self.loader = None


@dataclass(frozen=True, slots=True)
class LitDataSource:
    """Builds the rank's ``StreamingDataset`` and ``StreamingDataLoader`` in its process."""

    data: Dataset
    config: BenchConfig
    rank: int
    chunks: str
    state: Any = None

    def open(self) -> Loader:
        litdata: Any = importlib.import_module("litdata")
        config = self.config
        os.environ.update(
            {"WORLD_SIZE": str(config.ranks), "GLOBAL_RANK": str(self.rank), "NNODES": "1"}
        )
        shuffle = config.shuffle
        dataset = litdata.StreamingDataset(
            input_dir=self.chunks,
            shuffle=shuffle.seed is not None,
            seed=shuffle.seed or 0,
            item_shuffle_window=shuffle.window,
        )
        loader = litdata.StreamingDataLoader(
            dataset,
            batch_size=config.batch_size,
            num_workers=config.workers,
            persistent_workers=config.workers > 0,
        )
        if self.state is not None:
            loader.load_state_dict(self.state)
        return _LitLoader(loader)


class LitDataContender:
    """LitData over its own chunks on each of ``ranks`` ranks.

    Args:
        config: The run's settings.
    """

    resume_unsupported: str | None = None
    read_note: str | None = READ_NOTE

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.ranks = config.ranks
        self._root = tempfile.mkdtemp(prefix="ingest-bench-litdata-")
        weakref.finalize(self, shutil.rmtree, self._root, ignore_errors=True)

    def _chunks(self, data: Dataset) -> str:
        return os.path.join(self._root, data.name)

    def convert(self, data: Dataset) -> None:
        """Write ``data``'s rows as LitData chunks on local disk with ``litdata.optimize``."""
        litdata: Any = importlib.import_module("litdata")
        fn = functools.partial(shard_samples, data.storage_options(), list(data.columns))
        # optimize prints its progress (the bench keeps stdout for its table) and sets the
        # process-wide multiprocessing start method to spawn (put back after).
        method = multiprocessing.get_start_method(allow_none=True)
        with (
            contextlib.redirect_stdout(io.StringIO()),
            _start_method(method),
            environment(
                {
                    "DATA_OPTIMIZER_CACHE_FOLDER": os.path.join(self._root, "cache", "chunks"),
                    "DATA_OPTIMIZER_DATA_CACHE_FOLDER": os.path.join(self._root, "cache", "data"),
                }
            ),
        ):
            litdata.optimize(
                fn=fn,
                inputs=shard_paths(data),
                output_dir=self._chunks(data),
                chunk_size=self.config.rows,
                num_workers=max(self.config.workers, 1),
                mode="overwrite",
                verbose=False,
            )

    def start(self, data: Dataset) -> list[RankSource]:
        chunks = self._chunks(data)
        return [LitDataSource(data, self.config, r, chunks) for r in range(self.ranks)]

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        chunks = self._chunks(data)
        return [LitDataSource(data, self.config, r, chunks, s) for r, s in enumerate(states)]

    def stop(self) -> None:
        """Nothing runs outside the rank processes; the chunks go with this object."""
