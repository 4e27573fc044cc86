"""The rank iterator: the thin torch side inside each training worker.

It asks the coordinator for its share of the epoch, runs that share through Ray Data (read
tasks and the decode pool run elsewhere, on CPU), strips the provenance columns off each
batch, acks them to the coordinator a few batches per message, and yields dicts of torch
tensors. It never parses or decodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import ray
import torch

from ingest._prefetch import Prefetcher
from ingest.convert import Batch, to_torch
from ingest.distributed.datasource import (
    PROVENANCE,
    PROVENANCE_COLUMN,
    Decoder,
    SpanDatasource,
    unpack,
)
from ingest.epochs import RankPlan, StreamSpec
from ingest.errors import ConfigError, IngestError
from ingest.ledger import StepRecord, runs_of
from ingest.sources import Source


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderPool:
    """Where and how wide the CPU side runs.

    Attributes:
        min_size: Fewest decode actors (per rank).
        max_size: Most decode actors (per rank); Ray Data scales between the two.
        num_cpus: CPUs per decode actor.
        read_num_cpus: CPUs per read task.
        resources: Custom resources every read task and decode actor asks for, e.g.
            ``{"ingest": 0.001}`` to keep them on nodes that declare an ``ingest`` resource.
        label_selector: Node labels the read tasks and decode actors must match.
    """

    min_size: int = 1
    max_size: int = 4
    num_cpus: float = 1.0
    read_num_cpus: float = 1.0
    resources: dict[str, float] | None = None
    label_selector: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_size <= self.max_size:
            raise ConfigError(
                f"ReaderPool(min_size={self.min_size}, max_size={self.max_size}) "
                "needs 1 <= min_size <= max_size"
            )
        if self.num_cpus < 0 or self.read_num_cpus < 0:
            raise ConfigError("ReaderPool CPUs must be >= 0")

    def remote_args(self, num_cpus: float) -> dict[str, Any]:
        args: dict[str, Any] = {"num_cpus": num_cpus}
        if self.resources:
            args["resources"] = dict(self.resources)
        if self.label_selector:
            args["label_selector"] = dict(self.label_selector)
        return args


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOptions:
    """How a rank iterator delivers batches.

    Attributes:
        prefetch_batches: Batches Ray Data prepares ahead of the training loop.
        ack_every: Batches per ack message to the coordinator.
        progress_bars: Show Ray Data's progress bars (noisy inside training workers).
        track: Tag rows with their provenance and ack what was consumed. Without it there
            is no state and no exactly-once resume; turn it off only to measure its cost.
        pin_memory: Pin tensors (when CUDA is available) for fast host-to-device copies.
        device: Move tensors to this device (``"cuda"``, ``"cuda:1"``) before yielding.
        timeout_s: Longest wait for the coordinator or for a snapshot.
    """

    prefetch_batches: int = 2
    ack_every: int = 16
    progress_bars: bool = False
    track: bool = True
    pin_memory: bool = False
    device: str | None = None
    timeout_s: float = 300.0


@dataclass(slots=True)
class RankIterator:
    """Batches of one rank, epoch after epoch; picklable, iterate it in any Ray worker.

    Created by :meth:`ingest.RayStream.rank_iterator`.
    """

    coordinator: Any
    rank: int
    spec: StreamSpec
    readers: ReaderPool
    transform: Callable[[pa.Table], Any] | type | None
    options: RankOptions = field(default_factory=RankOptions)
    epoch: int | None = None
    session: int | None = None
    """Set by :func:`ingest.train.rank_iterator`: acks of a replaced worker group are dropped."""
    step: int = -1
    """The global step of the last batch yielded (-1 before any)."""
    _pending: list[StepRecord] = field(default_factory=list)

    def upcoming_epoch(self) -> int:
        """The epoch the next ``for`` loop over this iterator runs."""
        if self.epoch is None:
            ref = self.coordinator.first_epoch.remote()
            self.epoch = int(ray.get(ref, timeout=self.options.timeout_s))
        return self.epoch

    def plan(self) -> RankPlan:
        """This rank's share of the next epoch (asks the coordinator)."""
        ref = self.coordinator.rank_plan.remote(self.rank, self.epoch)
        try:
            return ray.get(ref, timeout=self.options.timeout_s)  # type: ignore[no-any-return]
        except Exception as e:
            raise unwrap(e) from None

    def __iter__(self) -> Iterator[Batch]:
        plan = self.plan()
        self.epoch = plan.epoch
        self.step = plan.first_step - 1
        yielded = 0
        # The Ray Data iteration runs behind a bounded queue with a timeout: a pipeline that
        # cannot get CPUs (training workers holding them all) must fail, not hang the rank.
        tables = Prefetcher(
            lambda: self._tables(plan),
            max(self.options.prefetch_batches, 1),
            self.options.timeout_s,
            f"rank {self.rank}'s read pipeline (if read tasks wait for CPUs that "
            "training workers hold, give the cluster more CPUs than the workers "
            "use, or lower ReaderPool num_cpus/read_num_cpus)",
        )
        for table in _unwrapped(tables):
            self.step += 1
            yielded += 1
            if not self.options.track:
                yield self._to_torch(table)
                continue
            seg, shard, row = unpack(table.column(PROVENANCE_COLUMN).to_numpy())
            self._pending.append(StepRecord(self.step, runs_of(seg, shard, row)))
            if len(self._pending) >= self.options.ack_every:
                self.flush(wait=False)
            yield self._to_torch(table.drop_columns(list(PROVENANCE)))
        tables.close()
        self.flush(wait=False)
        if yielded != plan.steps:
            raise IngestError(
                f"rank {self.rank} got {yielded} batches in epoch {plan.epoch}, "
                f"planned {plan.steps}; every rank must take the same steps"
            )
        self.epoch = plan.epoch + 1

    def _tables(self, plan: RankPlan) -> Iterator[pa.Table]:
        if not plan.spans:
            return
        from ray.data import ActorPoolStrategy, DataContext, read_datasource

        context = DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = self.options.progress_bars
        source = Source(
            self.spec.urls, storage_options=self.spec.storage_options, format=self.spec.format
        )
        contexts = [
            plan.listing.context(s.shard, source, self.spec.read, self.spec.columns)
            for s in plan.spans
        ]
        datasource = SpanDatasource(
            contexts, plan.spans, self.spec.shuffle_seed, plan.epoch, provenance=self.options.track
        )
        ds = read_datasource(
            datasource,
            override_num_blocks=datasource.num_tasks,
            **self.readers.remote_args(self.readers.read_num_cpus),
        )
        if self.transform is not None:
            ds = ds.map_batches(
                Decoder,
                fn_constructor_args=(self.transform,),
                batch_size=None,
                batch_format="pyarrow",
                zero_copy_batch=True,
                compute=ActorPoolStrategy(
                    min_size=self.readers.min_size, max_size=self.readers.max_size
                ),
                max_restarts=-1,
                max_task_retries=-1,
                **self.readers.remote_args(self.readers.num_cpus),
            )
        yield from ds.iter_batches(
            batch_size=self.spec.batch_size,
            batch_format="pyarrow",
            prefetch_batches=self.options.prefetch_batches,
        )

    def _to_torch(self, table: pa.Table) -> Batch:
        batch = to_torch(table)
        if not (self.options.pin_memory or self.options.device):
            return batch
        pin = self.options.pin_memory and torch.cuda.is_available()
        out: Batch = {}
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                if pin:
                    value = value.pin_memory()
                if self.options.device:
                    value = value.to(self.options.device, non_blocking=pin)
            out[name] = value
        return out

    def flush(self, *, wait: bool = True) -> None:
        """Send the acks held back; ``wait`` until the coordinator has them."""
        if not self._pending:
            return
        ref = self.coordinator.ack.remote(self.rank, self._pending, self.session)
        self._pending = []
        if wait:
            ray.get(ref, timeout=self.options.timeout_s)

    def state_dict(self) -> dict[str, Any]:
        """Flush, then the stream state after this rank's last batch (same on every rank).

        Every rank must call it at the same step: the snapshot waits until all ranks acked
        that step (up to ``RankOptions.timeout_s``).
        """
        self.flush()
        ref = self.coordinator.state_dict.remote(self.step, self.options.timeout_s)
        return ray.get(ref, timeout=self.options.timeout_s + 30)  # type: ignore[no-any-return]


def unwrap(error: BaseException) -> BaseException:
    """The :class:`IngestError` inside Ray's wrappers (task errors, user code errors), if any.

    A bad shard read in a read task reaches the rank as a chain of Ray exceptions; the user
    should see the clear error raised where the shard was read.
    """
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, IngestError):
            return e
        for nxt in (getattr(e, "cause", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    return error


def _unwrapped(tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    try:
        yield from tables
    except Exception as e:
        found = unwrap(e)
        if found is e:
            raise
        raise found from None


__all__ = ["RankIterator", "RankOptions", "ReaderPool", "unwrap"]
