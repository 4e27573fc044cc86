"""A rank's last node before the user's loop: read steps in, batches out, its part of the state.

The transports in one process (:class:`ingest.Stream`, and :class:`ingest.DataLoader`, whose
main process runs one node per worker) run each rank's read steps through one node, built in
one place (:func:`rank_node`) from the stream's ``pack=``:

- :class:`PlainRank` (no ``pack``): each read step is a batch, converted (to torch tensors,
  or the batch a worker made of it) and recorded by the rank's loop;
- :class:`ingest.engine.pack.PackedRank` (``pack=``): the documents of the read steps
  regrouped by the :class:`~ingest.engine.grouping.Grouping` (sequences for
  :class:`ingest.Pack`, token-budget batches for :class:`ingest.TokenBatches`).

Both take a read step (:meth:`RankNode.feed`) and the feed's end (:meth:`RankNode.finish`),
yield ``(rows, batch)``, and give their part of the state over the book's (:meth:`RankNode.
state`, :meth:`RankNode.entries`: the documents in flight, none for a plain rank). So a
transport drives a rank without knowing which it is. A Ray rank packs through
:mod:`ingest.distributed.rank_pack`, where its ranks also agree on their number of steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ingest.core.book import EpochBook
from ingest.core.errors import IngestError, StateError
from ingest.core.state import StreamState
from ingest.engine.grouping import Grouping
from ingest.engine.loop import Ending, RankLoop
from ingest.engine.pack import ORIGIN, PackedRank, StepCount, with_origin
from ingest.engine.transform import applying

if TYPE_CHECKING:  # convert imports torch; the Ray readers import the engine, not torch
    import pyarrow as pa

    from ingest.engine.convert import Batch

Convert = Callable[[Any], "Batch"]
"""Makes the batch to hand out of a read step."""


class RankNode(Protocol):
    """One rank's read steps in, its batches out (see the module docstring)."""

    def begin(self, urls: Sequence[str]) -> None:
        """An epoch (or the rest of one) whose listing's shards are ``urls`` begins."""
        ...

    def feed(self, item: Any, convert: Convert | None = None) -> Iterator[tuple[int, Batch]]:
        """The batches a read step makes, each with its rows (sequences, with ``pack``);
        ``convert``: how this read step becomes a batch (a plain rank's; None: its table
        made torch tensors)."""
        ...

    def finish(self, epoch: int, ending: Ending) -> Iterator[tuple[int, Batch]]:
        """The rank's feed of ``epoch`` ended: the last batches, then the epoch's end."""
        ...

    def check(self, state: StreamState) -> None:
        """Refuse a state the node cannot go on from, before anything is loaded."""
        ...

    def load(self, state: StreamState) -> None:
        """Go on after ``state`` (loaded into the book already)."""
        ...

    def state(self) -> StreamState:
        """The state after the last batch handed out (the node's book in this process)."""
        ...

    def entries(self, base: StreamState) -> list[tuple[int, int, int, int]]:
        """The node's documents in flight over ``base`` (the ``pack`` part's ``tokens``)."""
        ...

    def counts(self) -> dict[str, int]:
        """What the node counts for ``stream.stats``."""
        ...

    @property
    def step(self) -> int:
        """The step of the last batch handed out, as a provenance log numbers it (a plain
        rank's: its read step; with ``pack``: its batches since the run began); -1: none."""
        ...

    def batches(self) -> int | None:
        """What a state keeps of the node's count of batches (``pack.steps``); None: none
        (a plain rank's steps are the book's)."""
        ...


class PlainRank:
    """A rank without ``pack``: each read step is one batch (see the module docstring).

    Args:
        loop: The rank's loop, which records and acks each batch handed out.
        book: The rank's book (for :meth:`state`), or None (in another process).
        batch_size: Rows of a full batch.
    """

    def __init__(self, loop: RankLoop, book: EpochBook[Any] | None, batch_size: int) -> None:
        self.loop = loop
        self.book = book
        self.batch_size = batch_size

    def begin(self, urls: Sequence[str]) -> None:
        return None

    @property
    def step(self) -> int:
        return self.loop.step

    def batches(self) -> int | None:
        return None

    def feed(self, item: Any, convert: Convert | None = None) -> Iterator[tuple[int, Batch]]:
        batch = self.loop.hand_out(item, convert or _to_torch)
        if batch is not None:
            yield (self.batch_size if item.rows < 0 else item.rows), batch

    def finish(self, epoch: int, ending: Ending) -> Iterator[tuple[int, Batch]]:
        self.loop.end(epoch, ending)
        if not ending.steps and self.book is not None:
            warn_no_batch(self.book, epoch, ending.learned)
        return iter(())

    def load(self, state: StreamState) -> None:
        return None

    def check(self, state: StreamState) -> None:
        if state.progress.tokens:
            raise StateError(
                f"the state has {len(state.progress.tokens)} document(s) cut across batches "
                "(pack.tokens): it was saved by a stream with pack=ingest.Pack(...) (or "
                "ingest.TokenBatches); load it into one with the same pack"
            )

    def state(self) -> StreamState:
        self.loop.flush()
        if self.book is None:
            raise IngestError("a Ray rank's state comes from its coordinator")
        return self.book.snapshot(self.loop.step)

    def entries(self, base: StreamState) -> list[tuple[int, int, int, int]]:
        return []

    def counts(self) -> dict[str, int]:
        return {}


def warn_no_batch(book: EpochBook[Any], epoch: int, learned: Mapping[int, int]) -> None:
    """Say that ``epoch`` gave no batch because its dataset holds fewer rows than one batch
    on every rank, or none (``learned``: row counts learnt by reading). Not when it holds more (an
    epoch resumed near its end gives no batch, and that is no fault), while a row count is
    unknown, or for a followed dataset (a round of a few new rows waits for more)."""
    total = book.listed_rows(epoch, learned)
    world, batch_size = book.world_size, book.config.batch_size
    if book.config.follows or total is None or total >= batch_size * world:
        return
    if total == 0:
        shards = book.plan(epoch).listing.shards
        warnings.warn(
            f"epoch {epoch} gave no batch: its {len(shards):,} shards hold no rows "
            f"({', '.join(s.url for s in shards[:3])}{', ...' if len(shards) > 3 else ''}). "
            "Check that the URL names the data you meant, and that its writer wrote rows",
            UserWarning,
            stacklevel=2,
        )
        return
    fate = (
        "dropped (remainder='drop')"
        if book.config.remainder == "drop"
        else "carried into the next epoch (remainder='carry')"
    )
    warnings.warn(
        f"epoch {epoch} gave no batch: the dataset ({total:,} rows listed) holds fewer than "
        f"one batch of batch_size={batch_size} rows x {world} ranks (or DataLoader "
        f"workers), and its rows are {fate}. "
        "Lower batch_size (to at most the rows per rank), or add data",
        UserWarning,
        stacklevel=2,
    )


def rank_node(
    pack: Grouping | None,
    batch_size: int,
    loop: RankLoop,
    book: EpochBook[Any] | None,
    steps: StepCount | None = None,
) -> RankNode:
    """The node of a rank over ``loop``: plain, or regrouping its documents by ``pack``
    (``steps``: the batch count it shares with the other nodes of one loop, see
    :class:`~ingest.engine.pack.StepCount`)."""
    if pack is None:
        return PlainRank(loop, book, batch_size)
    return PackedRank(pack, batch_size, loop, book, steps)


def read_transform(
    fn: Callable[[pa.Table], Any] | None, *, regrouped: bool
) -> Callable[[pa.Table], pa.Table] | None:
    """The transform a rank's reads run for its node (in the stream's process, a
    DataLoader's workers or the reader pool): ``fn``'s rows; for a node that regroups
    documents (``regrouped``: the stream has ``pack``), each with its input row in
    :data:`~ingest.engine.pack.ORIGIN`, for the documents' provenance. None: no transform.
    """
    if regrouped:
        return with_origin(fn)
    return applying(fn) if fn is not None else None


def worker_table(pack: Grouping | None, table: pa.Table) -> pa.Table | None:
    """What a DataLoader worker sends of a read step for its main process's node to regroup
    (the grouping's column and each row's origin); None: the node hands out the read step
    as it is, so the worker makes it a batch itself (a plain rank)."""
    if pack is None:
        return None
    return table.select([c for c in (pack.column, ORIGIN) if c in table.column_names])


def _to_torch(item: Any) -> Batch:
    from ingest.engine.convert import to_torch

    return to_torch(item.table)


__all__ = ["Convert", "PlainRank", "RankNode", "rank_node", "read_transform", "worker_table"]
