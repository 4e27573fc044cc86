"""A Ray rank's driver, built in one place (:func:`rank_driver`), and the plain one.

See :mod:`ingest.distributed.rank_link` for what a driver is. A plain rank
(:class:`PlainDriver`) hands out each read step of its feed as a batch, recorded by the
rank's loop (:meth:`ingest.engine.loop.RankLoop.batches`: its acks go to the coordinator a
few batches per message); every rank has the same steps because the plan gives every rank
the same number of read steps. A rank with a grouping (``pack=``) has its own
(:class:`ingest.distributed.rank_pack.PackedDriver`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ingest.core.errors import IngestError
from ingest.distributed.rank_feed import End, Item
from ingest.distributed.rank_link import IteratorLink, RankDriver
from ingest.distributed.rank_pack import PackedDriver
from ingest.engine.grouping import Grouping

if TYPE_CHECKING:
    from ingest.engine.convert import Batch


def rank_driver(pack: Grouping | None, batch_size: int, it: IteratorLink) -> RankDriver:
    """The driver of a rank of a stream with this ``pack`` (and ``batch_size``: sequences or
    rows per batch of the grouping), over its iterator ``it``."""
    if pack is None:
        return PlainDriver(it)
    return PackedDriver.of(pack, batch_size, it)


class PlainDriver:
    """Each read step a batch (see the module docstring)."""

    def __init__(self, it: IteratorLink) -> None:
        self._it = it

    @property
    def step(self) -> int:
        return self._it.loop.step

    def begin(self) -> int:
        return self._it.take_over()

    def batches(self, epoch: int) -> Iterator[Batch]:
        it = self._it
        for _, batch in it.loop.batches(epoch, it.items(epoch), _to_torch, End):
            yield batch

    def skip(self, item: Item) -> bool:
        # Never seen since take stopped making feeds; kept so that a feed that starts over
        # fails loudly instead of delivering rows again.
        loop = self._it.loop
        if loop.cursor is not None and item.step != loop.step + 1:
            raise IngestError(
                f"rank {self._it.rank} got step {item.step} after step {loop.step}: its "
                "reader's feed did not continue where it was. Resume from the last checkpoint"
            )
        return False

    def left(self, epoch: int) -> None:
        """Nothing beyond the acks: a plain rank holds no part of the state."""

    def counts(self) -> dict[str, int]:
        return {}

    def state(self) -> dict[str, Any]:
        it = self._it
        it.flush()
        return it.call(  # type: ignore[no-any-return]
            "state_dict",
            self.step,
            it.timeout_s,
            it.session(),
            it.rank,  # the same state on every rank at a step (Coordinator.state_dict)
            timeout_s=it.timeout_s + 30,
        )


def _to_torch(item: Item) -> Batch:
    # torch is imported where batches become tensors, not with this module: a driver that
    # makes a RayStream never needs it (see ingest.distributed.rank._import_torch_meanwhile).
    from ingest.engine.convert import to_torch

    return to_torch(item.batch)


__all__ = ["PlainDriver", "rank_driver"]
