"""RayStream: the distributed stream's handle on the driver."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import ray

from ingest.distributed.coordinator import Coordinator
from ingest.distributed.rank import RankIterator, RankOptions, ReaderPool
from ingest.epochs import StreamSpec
from ingest.errors import ConfigError
from ingest.formats import get_format
from ingest.formats.base import ReadOptions


class RayStream:
    """A stream read by Ray Data on CPU workers and consumed by ``world_size`` ranks.

    A coordinator actor lists the source once per epoch, cuts the epoch into equal shares
    (same number of batches on every rank), collects what each rank consumed and produces
    states consistent across ranks. Each rank iterates :meth:`rank_iterator` inside any Ray
    worker (a Ray Train worker, a task, an actor).

    Args:
        source: URL, glob or directory, or a list of them (any fsspec protocol).
        format: Format name for every shard; None infers it from extensions.
        columns: Columns to read; None reads all.
        batch_size: Rows per batch on every rank.
        shuffle_seed: Seed for shard, row-group and in-block row order; None keeps order.
        world_size: Number of ranks.
        readers: Read task and decode pool resources.
        storage_options: fsspec options for the store; never saved in the state.
        read: How shards are read.
        transform: Run on every block in the decode pool: a function over an Arrow table,
            or a class constructed once per actor. It must keep one row per input row.
        drop_remainder: Drop (and count) rows that cannot fill a step on every rank at the
            end of an epoch, instead of carrying them into the next.
        name: Name of the coordinator actor (default: a fresh unique name).
        timeout_s: Longest wait for the coordinator.
    """

    def __init__(
        self,
        source: str | Sequence[str],
        *,
        format: str | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
        shuffle_seed: int | None = None,
        world_size: int = 1,
        readers: ReaderPool | None = None,
        storage_options: Mapping[str, Any] | None = None,
        read: ReadOptions | None = None,
        transform: Callable[[pa.Table], Any] | type | None = None,
        drop_remainder: bool = False,
        name: str | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size={world_size} must be >= 1")
        if format is not None:
            get_format(format)
        if isinstance(columns, str):
            raise ConfigError(f"columns={columns!r} must be a list of names")
        self.spec = StreamSpec(
            urls=(source,) if isinstance(source, str) else tuple(source),
            storage_options=dict(storage_options or {}),
            format=format,
            columns=tuple(columns) if columns is not None else None,
            batch_size=batch_size,
            shuffle_seed=shuffle_seed,
            read=read or ReadOptions(),
            drop_remainder=drop_remainder,
        )
        self.world_size = world_size
        self.readers = readers or ReaderPool()
        self.transform = transform
        self.timeout_s = timeout_s
        self.name = name or f"ingest-coordinator-{uuid.uuid4().hex[:12]}"
        if not ray.is_initialized():
            ray.init()
        self.coordinator = Coordinator.options(name=self.name).remote(self.spec, world_size)
        ray.get(self.coordinator.ping.remote(), timeout=timeout_s)

    def rank_iterator(self, rank: int, *, options: RankOptions | None = None) -> RankIterator:
        """The iterator of ``rank`` (0 <= rank < world_size); picklable."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside world_size {self.world_size}")
        return RankIterator(
            self.coordinator,
            rank,
            self.spec,
            self.readers,
            self.transform,
            options or RankOptions(timeout_s=self.timeout_s),
        )

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """The state after ``step`` on every rank; None: after the last step all ranks acked."""
        ref = self.coordinator.state_dict.remote(step, self.timeout_s)
        return ray.get(ref, timeout=self.timeout_s + 30)  # type: ignore[no-any-return]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue after ``state``, which may come from another world size or pool size.

        Load before any rank iterates.
        """
        ray.get(self.coordinator.load_state_dict.remote(dict(state)), timeout=self.timeout_s)

    def shutdown(self) -> None:
        """Stop the coordinator actor."""
        ray.kill(self.coordinator)

    def __enter__(self) -> RayStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
