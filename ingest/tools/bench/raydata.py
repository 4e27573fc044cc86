"""Peer: plain Ray Data, ``read_parquet`` + ``streaming_split(N, equal=True)`` +
``iter_torch_batches``, as a Ray Train user would wire it.

The files are read with pyarrow's S3 filesystem (Ray Data's own default for ``s3://``),
shuffled by file order (``FileShuffleConfig``) and by a local shuffle buffer of the shared
window. Ray Data's iterators keep no position, so resuming mid-epoch is not measured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.tools.bench.config import BenchConfig, ShuffleSettings
from ingest.tools.bench.contenders import Loader, RankSource
from ingest.tools.bench.data import Dataset


@dataclass(slots=True)
class _SplitLoader:
    split: Any
    batch_size: int
    shuffle: ShuffleSettings

    def epoch(self) -> Iterator[Mapping[str, Any]]:
        seed = self.shuffle.seed
        batches: Iterator[Mapping[str, Any]] = self.split.iter_torch_batches(
            batch_size=self.batch_size,
            local_shuffle_buffer_size=self.shuffle.window if seed is not None else None,
            local_shuffle_seed=seed,
        )
        return batches

    def state_dict(self) -> Any:
        raise NotImplementedError(RayDataContender.resume_unsupported)

    def close(self) -> None:
        self.split = None


@dataclass(frozen=True, slots=True)
class SplitSource:
    """One split of ``streaming_split``, sent to its rank process."""

    split: Any
    batch_size: int
    shuffle: ShuffleSettings

    def open(self) -> Loader:
        return _SplitLoader(self.split, self.batch_size, self.shuffle)


class RayDataContender:
    """Ray Data ``streaming_split`` across ``ranks`` consumers.

    Args:
        config: The run's settings.
    """

    resume_unsupported: str | None = (
        "Ray Data's DataIterator has no state_dict; a restarted job replays the epoch"
    )

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.ranks = config.ranks
        self._splits: list[Any] | None = None

    def start(self, data: Dataset) -> list[RankSource]:
        import ray.data

        seed = self.config.shuffle.seed
        shuffle = ray.data.FileShuffleConfig(seed=seed) if seed is not None else None
        ds = ray.data.read_parquet(
            data.bucket_path, filesystem=data.pyarrow_filesystem(), shuffle=shuffle
        ).select_columns(list(data.columns))
        self._splits = ds.streaming_split(self.ranks, equal=True)
        return [SplitSource(s, self.config.batch_size, self.config.shuffle) for s in self._splits]

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        raise NotImplementedError(self.resume_unsupported)

    def stop(self) -> None:
        self._splits = None
