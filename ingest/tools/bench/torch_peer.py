"""Peer: a torch ``DataLoader`` whose worker processes read Parquet over fsspec (s3fs).

The way a careful user writes it: each rank lists the shards once and hands the paths to
an ``IterableDataset``; shards are split across every worker of every rank (worker ``w`` of
rank ``r`` takes shards ``r * workers + w``, stepping by ``ranks * workers``); each worker
opens its own ``s3fs`` filesystem (never one inherited through ``fork``) and reads row
groups with pyarrow. With a seed, shard order is shuffled per epoch and rows pass through
a streaming shuffle buffer of the shared window (:class:`ShuffleBuffer`). Workers yield
ready batches (``batch_size=None``), persistently across epochs. A DataLoader keeps no
position: resume is not measured.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ingest.tools.bench.config import BenchConfig, ShuffleSettings
from ingest.tools.bench.contenders import Loader, RankSource
from ingest.tools.bench.data import Dataset

# Arrow memory is read-only, so zero-copy numpy views warn in torch.from_numpy.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def to_tensors(table: pa.Table) -> dict[str, torch.Tensor]:
    """Numeric and fixed-size-list columns as tensors, zero-copy where Arrow allows."""
    out: dict[str, torch.Tensor] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        arr = column.combine_chunks()
        if pa.types.is_fixed_size_list(arr.type):
            size = arr.type.list_size
            flat = arr.values.slice(arr.offset * size, len(arr) * size)
            out[name] = torch.from_numpy(flat.to_numpy()).reshape(len(arr), size)
        else:
            out[name] = torch.from_numpy(arr.to_numpy())
    return out


class ParquetShards(IterableDataset[dict[str, torch.Tensor]]):
    """Batches of this rank's share of Parquet shards, read in DataLoader workers.

    Args:
        paths: Every shard (``bucket/key``), in listing order.
        storage_options: s3fs options.
        columns: Columns to read.
        batch_size: Rows per batch (the last batch of a worker may be short).
        shuffle: Shard-order seed and row buffer.
        rank: This rank.
        ranks: Number of ranks.
    """

    def __init__(
        self,
        paths: list[str],
        storage_options: dict[str, Any],
        columns: list[str],
        batch_size: int,
        shuffle: ShuffleSettings,
        rank: int,
        ranks: int,
    ) -> None:
        self.paths = paths
        self.storage_options = storage_options
        self.columns = columns
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.rank = rank
        self.ranks = ranks
        self._epoch = 0
        self._fs: Any = None

    def _mine(self, epoch: int) -> tuple[list[str], int]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        me = self.rank * workers + worker
        paths = list(self.paths)
        if self.shuffle.seed is not None:
            np.random.default_rng((self.shuffle.seed, epoch)).shuffle(paths)
        return paths[me :: self.ranks * workers], me

    def _tables(self, paths: list[str]) -> Iterator[pa.Table]:
        if self._fs is None:  # created in the worker process, never inherited
            import s3fs

            self._fs = s3fs.S3FileSystem(**self.storage_options)
        for path in paths:
            with self._fs.open(path, "rb") as f:
                pf = pq.ParquetFile(f)
                for group in range(pf.num_row_groups):
                    yield pf.read_row_group(group, columns=self.columns)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch, self._epoch = self._epoch, self._epoch + 1
        paths, me = self._mine(epoch)
        batches = Rebatcher(self.batch_size)
        if self.shuffle.seed is None:
            for table in self._tables(paths):
                yield from batches.add(table)
        else:
            buffer = ShuffleBuffer(self.shuffle.window, (self.shuffle.seed, epoch, me))
            for table in self._tables(paths):
                yield from batches.add(buffer.add(table))
            yield from batches.add(buffer.drain())
        yield from batches.flush()


class ShuffleBuffer:
    """A streaming shuffle buffer of ``window`` rows (the ``datasets``/webdataset kind).

    Each incoming table joins the buffer; as many rows as came in leave it, drawn at
    random from all rows held, so rows mix across shard boundaries as they stream by.

    Args:
        window: Rows held back.
        seed: Seed of the draws.
    """

    def __init__(self, window: int, seed: tuple[int, ...]) -> None:
        self.window = window
        self.rng = np.random.default_rng(seed)
        self.held: pa.Table | None = None

    def add(self, table: pa.Table) -> pa.Table:
        """Take ``table`` in; return the rows that leave (empty until the buffer fills)."""
        pool = table if self.held is None else pa.concat_tables([self.held, table])
        out = max(pool.num_rows - self.window, 0)
        order = self.rng.permutation(pool.num_rows)
        self.held = pool.take(order[out:])
        return pool.take(order[:out])

    def drain(self) -> pa.Table | None:
        """Every row still held, in random order."""
        held, self.held = self.held, None
        return None if held is None else held.take(self.rng.permutation(held.num_rows))


class Rebatcher:
    """Cuts a stream of tables into batches of ``batch_size`` rows as tensors.

    Args:
        batch_size: Rows per batch; only the last batch of :meth:`flush` may be short.
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.tail: list[pa.Table] = []
        self.rows = 0

    def add(self, table: pa.Table | None) -> Iterator[dict[str, torch.Tensor]]:
        """Full batches that ``table`` completes; the rest waits for more rows."""
        if table is None or table.num_rows == 0:
            return
        self.tail.append(table)
        self.rows += table.num_rows
        if self.rows < self.batch_size:
            return
        rows = pa.concat_tables(self.tail)
        full = rows.num_rows // self.batch_size * self.batch_size
        for start in range(0, full, self.batch_size):
            yield to_tensors(rows.slice(start, self.batch_size))
        self.tail, self.rows = [rows.slice(full)], rows.num_rows - full

    def flush(self) -> Iterator[dict[str, torch.Tensor]]:
        """The last, short batch, if rows are left."""
        if self.rows:
            yield to_tensors(pa.concat_tables(self.tail))
        self.tail, self.rows = [], 0


@dataclass(slots=True)
class _DataLoaderLoader:
    loader: DataLoader[dict[str, torch.Tensor]] | None

    def epoch(self) -> Iterator[Mapping[str, Any]]:
        if self.loader is None:
            raise RuntimeError("the DataLoader was closed")
        return iter(self.loader)

    def state_dict(self) -> Any:
        raise NotImplementedError(TorchContender.resume_unsupported)

    def close(self) -> None:
        # Persistent workers stop when the loader and its iterator are collected.
        self.loader = None


@dataclass(frozen=True, slots=True)
class TorchSource:
    """Lists the shards in the rank process and builds its DataLoader."""

    data: Dataset
    config: BenchConfig
    rank: int

    def open(self) -> Loader:
        import s3fs

        options = self.data.storage_options()
        paths = sorted(s3fs.S3FileSystem(**options).glob(self.data.glob))
        config = self.config
        dataset = ParquetShards(
            paths,
            options,
            list(self.data.columns),
            config.batch_size,
            config.shuffle,
            self.rank,
            config.ranks,
        )
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=config.workers,
            persistent_workers=config.workers > 0,
        )
        return _DataLoaderLoader(loader)


class TorchContender:
    """torch ``DataLoader`` with fsspec workers on each of ``ranks`` ranks.

    Args:
        config: The run's settings.
    """

    resume_unsupported: str | None = (
        "a torch DataLoader keeps no position (no state_dict); a restarted job replays the epoch"
    )

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.ranks = config.ranks

    def start(self, data: Dataset) -> list[RankSource]:
        return [TorchSource(data, self.config, r) for r in range(self.ranks)]

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        raise NotImplementedError(self.resume_unsupported)

    def stop(self) -> None:
        """Nothing runs outside the rank processes."""
