"""The rank iterator: the thin torch side inside each training worker.

It takes ready batches of its rank from the stream's reader pool (one call per few batches,
the next call in flight while the loop trains), wraps them as torch tensors (zero-copy),
and acks what the loop consumed to the coordinator a few batches per message. It never
parses, decodes or plans.

Which batches a state covers: a batch counts as consumed once the iterator has handed it to
the loop. ``state_dict()`` (on every rank at the same step) covers every batch handed out up
to that step; an iterator left early (``break``, an exception, ``close()``) sends its held
acks before it returns, so a state taken on the driver afterwards covers every batch its
loop received, and a new loop over the same iterator continues right after them.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from ingest.convert import Batch, to_torch
from ingest.distributed.coordinator import CoordinatorLostError
from ingest.distributed.pool import End, FeedLostError, Item, TransformFailed
from ingest.errors import IngestError, StreamTimeoutError
from ingest.feed import Cursor
from ingest.ledger import StepRecord
from ingest.metrics import RankMeter
from ingest.quarantine import Quarantined


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOptions:
    """How a rank iterator delivers batches.

    Attributes:
        fetch_batches: Ready batches asked for per call to the reader pool; the next call
            is in flight while the loop consumes these.
        ack_every: Batches per ack message to the coordinator.
        pin_memory: Pin tensors (when CUDA is available) for fast host-to-device copies.
        device: Move tensors to this device (``"cuda"``, ``"cuda:1"``) before yielding.
        timeout_s: Longest wait for the coordinator, the pool or a snapshot.
    """

    fetch_batches: int = 4
    ack_every: int = 16
    pin_memory: bool = False
    device: str | None = None
    timeout_s: float = 300.0


@dataclass(slots=True)
class RankIterator:
    """Batches of one rank, epoch after epoch; picklable, iterate it in any Ray worker.

    Created by :meth:`ingest.RayStream.rank_iterator` or :func:`ingest.train.rank_iterator`.
    """

    coordinator: Any
    reader: Any
    rank: int
    options: RankOptions = field(default_factory=RankOptions)
    session: int | None = None
    """The coordinator session this iterator belongs to (set on first use)."""
    epoch: int | None = None
    step: int = -1
    """The global step of the last batch yielded (-1 before any)."""
    _pending: list[StepRecord] = field(default_factory=list)
    _cursor: Cursor | None = None
    _held: deque[Item | End] = field(default_factory=deque)
    _inflight: Any = None
    _acks: list[Any] = field(default_factory=list)
    """Ack messages sent and not yet answered, oldest first."""
    stream: str = ""
    """The stream's name (its coordinator's), the ``stream`` tag of its metrics."""
    _meter: RankMeter | None = None

    def _get(self, ref: Any) -> Any:
        try:
            return ray.get(ref, timeout=self.options.timeout_s)
        except Exception as e:
            raise unwrap(e) from None

    def _ask(self, ref: Any) -> Any:
        """The answer of a coordinator call; its death is said as such, with how to resume."""
        try:
            return ray.get(ref, timeout=self.options.timeout_s)
        except ray.exceptions.RayActorError as e:
            raise CoordinatorLostError(e) from None
        except Exception as e:
            raise unwrap(e) from None

    def _session(self) -> int:
        if self.session is None:
            self.session = int(self._ask(self.coordinator.session.remote()))
        return self.session

    def upcoming_epoch(self) -> int:
        """The epoch the next ``for`` loop over this iterator runs."""
        if self.epoch is None:
            self.epoch = int(self._ask(self.coordinator.upcoming_epoch.remote(self.rank)))
        return self.epoch

    def _fetch(self, epoch: int) -> Any:
        wait_s = min(self.options.timeout_s, 5.0)
        return self.reader.take.remote(
            self.rank, self._session(), epoch, self.options.fetch_batches, wait_s
        )

    def _recover(self, epoch: int) -> None:
        """The reader that held this rank's feed died: resume the feed after the last batch.

        Batches it had made but this rank had not consumed died with it; the restarted
        reader reads them again, from the rank's cursor, leaving out every acked row.
        """
        self._held.clear()
        self._inflight = None
        self.flush()
        plan_step = self.step + 1 if self._cursor is not None else None
        if plan_step is None:
            self._get(self.reader.warm.remote(self.rank, self._session(), epoch))
        else:
            self._get(
                self.reader.resume.remote(
                    self.rank, self._session(), epoch, plan_step, self._cursor
                )
            )

    def _take(self, ref: Any, epoch: int) -> list[Item | End]:
        try:
            got: list[Item | End] = ray.get(ref, timeout=self.options.timeout_s)
            return got
        except FeedLostError:  # a restarted reader, or an epoch not started there
            self._recover(epoch)
            return []
        except ray.exceptions.RayTaskError as e:  # raised in the reader, not its death
            raise unwrap(e) from None
        except ray.exceptions.RayActorError:
            self._recover(epoch)
            return []
        except Exception as e:
            raise unwrap(e) from None

    def _next(self, epoch: int) -> Item | End:
        deadline = time.monotonic() + self.options.timeout_s
        while not self._held:
            ref = self._inflight if self._inflight is not None else self._fetch(epoch)
            self._inflight = None
            self._held.extend(self._take(ref, epoch))
            if not self._held and time.monotonic() > deadline:
                raise StreamTimeoutError(
                    f"rank {self.rank} got no batch for {self.options.timeout_s:.0f} s from "
                    "the reader pool; the readers may wait for CPUs that training workers "
                    "hold (give the cluster more CPUs, or lower ReaderPool.num_cpus), or the "
                    "store stalled. Raise RankOptions.timeout_s for very slow stores"
                )
        item = self._held.popleft()
        if self._inflight is None and isinstance(item, Item) and not self._held:
            self._inflight = self._fetch(epoch)
        return item

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.upcoming_epoch()
        done = False
        if self._meter is None:
            self._meter = RankMeter(self.stream, self.rank)
        meter = self._meter
        try:
            while True:
                asked = time.monotonic()
                item = self._next(epoch)
                waited = time.monotonic() - asked
                if isinstance(item, End):
                    if len(item.leftover) or item.learned or item.quarantined:
                        self._ask(
                            self.coordinator.close_epoch.remote(
                                epoch,
                                item.steps,
                                item.leftover,
                                item.learned,
                                self._session(),
                                item.quarantined,
                            )
                        )
                    break
                if self._cursor is not None and item.step != self.step + 1:
                    # Never seen since take stopped making feeds; kept so that a feed that
                    # starts over fails loudly instead of delivering rows again.
                    raise IngestError(
                        f"rank {self.rank} got step {item.step} after step {self.step} in "
                        f"epoch {epoch}: its reader's feed did not continue where it was. "
                        "Resume from the last checkpoint"
                    )
                table = item.batch
                if isinstance(table, ray.ObjectRef):  # decoded by another actor of the pool
                    try:
                        table = self._get(table)
                    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
                        self._recover(epoch)  # the reader that owned the batch died with it
                        continue
                rows, quarantined = item.rows, item.quarantined
                if isinstance(table, TransformFailed):  # on_error="skip": the step is empty
                    failed = Quarantined(
                        table.reason, epoch, self.rank, step=item.step, rows=table.rows
                    )
                    rows, quarantined, table = 0, (*quarantined, failed), table.empty
                batch = self._to_torch(table)
                self._pending.append(StepRecord(item.step, item.runs, rows, quarantined))
                self._cursor = item.cursor
                self.step = item.step
                if len(self._pending) >= self.options.ack_every:
                    self.flush(wait=False)
                meter.batch(len(next(iter(batch.values()), ())), waited)
                yield batch
            self.flush()  # the epoch's last acks; a coordinator lost here is the loop's error
            meter.report()
            done = True
            self.epoch = epoch + 1
            self._cursor = None
        finally:
            # Left early: the acks of every batch handed out reach the coordinator (an error
            # here would hide the one that left the loop, if any).
            if not done:
                with contextlib.suppress(Exception):
                    self.flush()

    def _to_torch(self, table: Any) -> Batch:
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
        """Send the acks held back; ``wait`` until the coordinator has every ack sent.

        Without ``wait`` the message goes unanswered for a while, but never more than two
        do: a coordinator that died stops the loop within a few messages (its error says
        how to resume), not at the end of the epoch with every ack since lost.
        """
        if self._pending:
            self._acks.append(
                self.coordinator.ack.remote(self.rank, self._pending, self._session(), self._cursor)
            )
            self._pending = []
        if not self._acks:
            return
        if wait:
            refs, self._acks = self._acks, []
            self._ask(refs)
            return
        ready, self._acks = ray.wait(self._acks, num_returns=len(self._acks), timeout=0)
        if ready:
            self._ask(ready)
        while len(self._acks) > 2:
            self._ask(self._acks.pop(0))

    def state_dict(self) -> dict[str, Any]:
        """Flush, then the stream state after this rank's last batch (same on every rank).

        Every rank must call it at the same step: the snapshot waits until all ranks acked
        that step (up to ``RankOptions.timeout_s``).
        """
        self.flush()
        ref = self.coordinator.state_dict.remote(self.step, self.options.timeout_s, self._session())
        try:
            return ray.get(ref, timeout=self.options.timeout_s + 30)  # type: ignore[no-any-return]
        except ray.exceptions.RayActorError as e:
            raise CoordinatorLostError(e) from None
        except Exception as e:
            raise unwrap(e) from None


def unwrap(error: BaseException) -> BaseException:
    """The :class:`IngestError` inside Ray's wrappers (task errors, user code errors), if any.

    A bad shard read in a reader actor reaches the rank as a chain of Ray exceptions; the user
    should see the clear error raised where the shard was read.
    """
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        # Ray rethrows a remote IngestError as a class deriving from both RayError and the
        # error's class ("RayTaskError(CoordinatorLostError)"): the original is its cause.
        if isinstance(e, IngestError) and not isinstance(e, ray.exceptions.RayError):
            return e
        for nxt in (getattr(e, "cause", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    return error


__all__ = ["RankIterator", "RankOptions", "unwrap"]
