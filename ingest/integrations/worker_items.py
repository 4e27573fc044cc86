"""What an ``ingest.DataLoader`` worker sends its main process, and how the main process takes it.

A worker sends torch items: each a dict with an entry :data:`KEY` that says what the item is.
A batch (:class:`Came`: where its rows came from) whose tensors, runs and string columns the
worker wrote into its ring of shared slots (:mod:`ingest.integrations.shared_slots`), or sent
by the pipe where the ring was full or the batch larger than a slot; a packing stream's read
step (its token ids, packed by the main process); the end of the worker's share
(:class:`Ended`) or its failure (:class:`Failed`). What the worker's reads add to its
source's counts goes with a batch every half second, and with its end (:class:`IOSent`).

Torch hands its main process one item at a time, and each costs it about 140 us (the pipe's
receive and unpickling, the next index sent to the worker through a feeder thread): of a
2-worker epoch of 1,000-row batches, 0.11 of the main process's 0.24 CPU seconds. So a worker
sends its small ring-placed batches a few to an item (:class:`Bundle`, made by
:class:`Bundler`): up to :data:`BUNDLE_BATCHES` batches and :data:`BUNDLE_BYTES` bytes; an
epoch's first batch goes alone, so that the first batch of an epoch comes no later. The main
process copies each bundle's batches out of the ring as the bundle comes (its slots free at
once) and hands every batch out in the order torch would have handed them one an item
(:func:`in_turn`): a batch of each worker in turn, a worker leaving the turn after its end.
That order is the one states and their tests rely on: a loader's batches are the same, and
come in the same order, however its workers bundle them.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ingest.core.errors import ConfigError, IngestError
from ingest.core.ledger import Closed, Rows, Runs
from ingest.core.quarantine import Quarantined
from ingest.core.state import Cursor
from ingest.engine.convert import Batch, column_to_torch, to_torch
from ingest.engine.feed import Ready, Tail
from ingest.engine.grouping import Grouping
from ingest.engine.rank_node import worker_table
from ingest.integrations.shared_slots import Placed, SlotRing, text_buffers, text_values
from ingest.storage.sources import IOStats

KEY = "__ingest__"
"""The entry of a worker's item that says what it is (and where a batch's rows came from)."""
RUNS = "\0runs"
"""The name a batch's runs have in a worker's ring (no column's: it begins with a NUL)."""
_OFFSETS, _DATA = "\0offsets:", "\0data:"
"""Prefixes of the names a string or binary column's offsets and bytes have in the ring."""
_NO_ROWS = np.zeros(0, np.int64)
SLOT_WAIT_S = 10.0
"""Seconds a worker waits for a free slot of its ring before it sends that batch by the pipe
(its ring is full only when more of its batches wait in the main process than it has slots,
or when the main process left the loop, which ends the wait at once)."""
IO_EVERY_S = 0.5
"""A worker sends what its reads added to its counts (``stream.stats``) with a batch at most
this often, and with its share's end."""
BUNDLE_BATCHES = 4
"""At most this many ring-placed batches go in one torch item (:class:`Bundle`): four cut the
main process's per-item cost by three quarters; more only hold batches back longer."""
BUNDLE_BYTES = 1 << 20
"""A bundle is sent once its batches hold this many bytes: a batch of 1 MiB or more costs
the main process far more than its item (the copy out of the ring), so it goes alone."""


def ring_slots(prefetch_factor: int | None) -> int:
    """The slots of a worker's ring: torch lets a worker send ``prefetch_factor`` items the
    main process has not taken (each a bundle at most), one more being filled, and one
    batch written before it is known to close a bundle."""
    return ((prefetch_factor or 2) + 1) * BUNDLE_BATCHES + 1


@dataclass(frozen=True, slots=True)
class Came:
    """Where a worker's batch came from (taken off in the main process)."""

    rank: int
    step: int
    runs: Runs | Rows
    rows: int
    cursor: Cursor
    quarantined: tuple[Quarantined, ...]
    arrays: tuple[str, ...] = ()
    """Tensors sent as numpy arrays (see :func:`sent`), made tensors again."""
    placed: Placed | None = None
    """Where in the worker's ring its tensors lie (None at their names in the batch), and
    with them ``runs`` (:data:`RUNS`) and the buffers of the columns in :attr:`texts`."""
    closed: Closed | None = None
    table: pa.Table | None = None
    """A packing stream's read step: its token ids and each row's origin, packed in the
    main process (:class:`ingest.engine.pack.PackedRank`)."""
    texts: tuple[tuple[str, str], ...] = ()
    """The string and binary columns whose buffers lie in the ring (name, Arrow type)."""
    io: tuple[tuple[str, int], ...] = ()
    """What the worker's reads added to its counts since it last sent them
    (:meth:`ingest.IOStats.growth`), sent at most every :data:`IO_EVERY_S`."""

    def __reduce__(self) -> tuple[type[Came], tuple[Any, ...]]:
        # Sent with every batch: a frozen dataclass with slots pickles through
        # dataclasses.fields() on both sides (about 10 us a batch in the main process).
        return Came, tuple(getattr(self, name) for name in self.__slots__)

    @classmethod
    def of(
        cls,
        rank: int,
        item: Ready,
        *,
        arrays: tuple[str, ...] = (),
        placed: Placed | None = None,
        table: pa.Table | None = None,
        texts: tuple[tuple[str, str], ...] = (),
    ) -> Came:
        """Where ``item``, a batch of ``rank``'s feed, came from (its runs left out when
        they lie in the ring, ``placed``)."""
        runs = _NO_ROWS if placed is not None else item.runs
        return cls(
            rank,
            item.step,
            runs,
            item.rows,
            item.cursor,
            item.quarantined,
            arrays,
            placed,
            item.closed,
            table,
            texts,
        )


@dataclass(frozen=True, slots=True)
class Failed:
    """A worker's read failed with this error, sent as it is: torch would re-raise it in the
    main process as a RuntimeError of its message (it rebuilds errors from a message alone),
    so ``except ingest.ShardError`` would not catch it."""

    error: IngestError


@dataclass(frozen=True, slots=True)
class Ended:
    """A worker's feed ended: what the book needs when row counts were unknown."""

    rank: int
    steps: int
    leftover: Runs
    learned: dict[int, int]
    quarantined: tuple[Quarantined, ...]
    io: tuple[tuple[str, int], ...] = ()
    """What the worker's reads added to its counts since it last sent them (see :class:`Came`)."""


class IOSent:
    """In a worker: what of its source's counts (:class:`ingest.IOStats`) it sent the main
    process, for one planner (its counts grow across epochs; an epoch's feed opened early
    reads before its batches go)."""

    def __init__(self, stats: IOStats) -> None:
        self.stats = stats
        self._sent = stats.as_dict()
        self._at = time.monotonic()

    def growth(self, *, now: bool = False) -> tuple[tuple[str, int], ...]:
        """The counts grown since they were last sent, to send now (none if sent less than
        :data:`IO_EVERY_S` ago, unless ``now``)."""
        at = time.monotonic()
        if not now and at - self._at < IO_EVERY_S:
            return ()
        grown = self.stats.growth(self._sent)
        self._at = at
        for name, n in grown.items():
            self._sent[name] += n
        return tuple(grown.items())

    def on(self, batch: Batch) -> Batch:
        """``batch`` (as :func:`sent` made it), with the counts grown if they are due."""
        io = self.growth()
        came = batch[KEY]
        return {**batch, KEY: dataclasses.replace(came, io=io)} if io else batch


@dataclass(frozen=True, slots=True)
class Bundle:
    """Batches of one worker, in its order, sent as one torch item: each as :func:`sent`
    made it, their arrays in the worker's ring."""

    rank: int
    batches: tuple[Batch, ...]

    def __reduce__(self) -> tuple[type[Bundle], tuple[Any, ...]]:
        return Bundle, (self.rank, self.batches)


class Bundler:
    """In a worker: its batches gathered into bundles (:class:`Bundle`), for one epoch.

    :meth:`add` takes the next batch :func:`sent` made and returns the items to send now, in
    order: nothing while a bundle fills; the bundle once full; a batch not in the ring (by the
    pipe, or a packing stream's read step) after the bundle before it. :meth:`flush` returns
    what is left (call it before the worker's end or failure goes out)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._held: list[Batch] = []
        self._bytes = 0
        self._first = True
        """No batch sent yet this epoch: the first goes alone (the main process waits)."""

    def add(self, batch: Batch, nbytes: int) -> list[Batch]:
        came = batch[KEY]
        if not isinstance(came, Came) or came.placed is None:
            return [*self.flush(), batch]
        self._held.append(batch)
        self._bytes += nbytes
        if self._first or len(self._held) >= BUNDLE_BATCHES or self._bytes >= BUNDLE_BYTES:
            return self.flush()
        return []

    def flush(self) -> list[Batch]:
        held, self._held, self._bytes = self._held, [], 0
        if not held:
            return []
        self._first = False
        if len(held) == 1:
            return held
        return [{KEY: Bundle(self.rank, tuple(held))}]


def in_turn(items: Iterator[Batch], ranks: int, ring: Callable[[int], SlotRing]) -> Iterator[Batch]:
    """The batches in ``items`` (what torch hands out from ``ranks`` workers, bundles among
    them) one at a time, in the order torch hands them out one an item: a batch of each
    worker in turn, in rank order, a worker leaving the turn after its :class:`Ended`; a
    :class:`Failed` at once. Each bundle's batches are copied out of their worker's ring
    (``ring(rank)``: the workers' rings are made as ``items`` begins) as it comes, so its
    slots are free while its batches wait their turn."""
    waiting: list[collections.deque[Batch]] = [collections.deque() for _ in range(ranks)]
    turn = list(range(ranks))
    at = 0
    for item in items:
        what = item[KEY]
        if isinstance(what, Failed):
            yield item
            return
        if isinstance(what, Bundle):
            for batch in what.batches:
                waiting[what.rank].append(_out_of_ring(batch, ring))
        else:
            waiting[what.rank].append(_out_of_ring(item, ring))
        while turn and waiting[turn[at]]:
            batch = waiting[turn[at]].popleft()
            if isinstance(batch[KEY], Ended):
                del turn[at]
                at = at % len(turn) if turn else 0
            else:
                at = (at + 1) % len(turn)
            yield batch
    left = sum(len(w) for w in waiting)
    if left:
        raise IngestError(
            f"ingest.DataLoader: {left} batches of workers that had ended came after their "
            "end (a worker's items out of order); iterate the loader again"
        )


def _out_of_ring(batch: Batch, ring: Callable[[int], SlotRing]) -> Batch:
    """``batch`` with what its worker wrote into its ring copied out (the slot freed)."""
    came = batch[KEY]
    if isinstance(came, Came) and came.placed is not None:
        batch[KEY] = taken(batch, came, ring(came.rank))
    return batch


def sent(rank: int, item: Ready, ring: SlotRing | None) -> Batch:
    """What a worker sends for ``item``, a batch of its feed, converted for torch: written
    into its ring (not as torch's shared-memory tensors: a socket handshake per tensor, and
    the sharing strategy is the user's to set), its tensors, runs and each string or binary
    column as Arrow offsets and bytes (the main process decodes them: a list of 1,000
    strings pickled and unpickled cost more); the ring full or the batch larger than a
    slot, all by value through the pipe.

    Raises:
        ConfigError: If a column the conversion left as Python objects holds a value that
            does not pickle (see :func:`refuse_unpicklable`).
    """
    table = item.table
    texts = text_buffers(table) if ring is not None else {}
    names = list(table.column_names) if texts else None
    batch = to_torch(table.drop_columns(list(texts)) if texts else table)
    refuse_unpicklable(batch, table.schema)
    tensors = {k: v.numpy() for k, v in batch.items() if isinstance(v, torch.Tensor)}
    placed = None
    if ring is not None:
        arrays = dict(tensors)
        if isinstance(item.runs, np.ndarray):
            arrays[RUNS] = item.runs
        for name, (offsets, data) in texts.items():
            arrays[_OFFSETS + name], arrays[_DATA + name] = offsets, data
        placed = ring.put(arrays, SLOT_WAIT_S) if RUNS in arrays else None
    if placed is not None:
        kinds = tuple((name, str(table.schema.field(name).type)) for name in texts)
        order = names if names is not None else batch
        out = {k: None if k in tensors or k in texts else batch[k] for k in order}
        return {**out, KEY: Came.of(rank, item, placed=placed, texts=kinds)}
    for name in texts:  # by the pipe after all: as Python objects
        batch[name] = column_to_torch(table.column(name), name)
    order = names if names is not None else batch
    out = {k: tensors.get(k, batch[k]) for k in order}
    return {**out, KEY: Came.of(rank, item, arrays=tuple(tensors))}


_PLAIN = (
    pa.types.is_null,
    pa.types.is_boolean,
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_decimal,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_string_view,
    pa.types.is_binary_view,
    pa.types.is_fixed_size_binary,
    pa.types.is_date,
    pa.types.is_time,
    pa.types.is_timestamp,
    pa.types.is_duration,
)
"""Arrow types whose Python values are Python's, pandas' or the standard library's own
(numbers, strings, bytes, decimals, dates, times, timestamps, timedeltas): they pickle."""


def sure_to_pickle(kind: pa.DataType) -> bool:
    """Whether every Python value of Arrow type ``kind`` (as ``to_pylist`` makes them)
    pickles, told by the type alone: those of :data:`_PLAIN`, and lists, structs, maps,
    unions, dictionaries and run-end encodings of them. Not an interval (pyarrow's
    ``MonthDayNano``, which does not pickle), at any depth, nor an extension type (its
    scalars make what they will), nor a type not known here: their values are tried."""
    if isinstance(kind, pa.BaseExtensionType):
        return False
    if isinstance(kind, pa.DictionaryType):
        return sure_to_pickle(kind.value_type)
    if kind.num_fields:
        return all(sure_to_pickle(kind.field(i).type) for i in range(kind.num_fields))
    return any(plain(kind) for plain in _PLAIN)


def refuse_unpicklable(batch: Batch, schema: pa.Schema) -> None:
    """Refuse a batch a worker is about to send whose values do not all pickle: torch's
    queue pickles it in a feeder thread, which prints the error and drops the batch, and the
    main process waited for it for ever. Tried only for the columns the conversion left as
    Python objects whose type is not :func:`sure_to_pickle` (never tensors, arrays, strings,
    numbers or lists of them: no cost a batch for those).

    Raises:
        ConfigError: Naming the column, the type of the value that does not pickle and the
            fix; sent to the main process as a worker's other errors are (:class:`Failed`).
    """
    for name, value in batch.items():
        if isinstance(value, torch.Tensor | np.ndarray) or value is None:
            continue
        kind = schema.field(name).type
        if sure_to_pickle(kind):
            continue
        try:
            pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # pickling raises PicklingError, TypeError, AttributeError...
            raise _unpicklable(name, kind, _first_unpicklable(value), e) from None


def _unpicklable(name: str, kind: pa.DataType, value: Any, error: Exception) -> ConfigError:
    cls = type(value)
    where = "" if cls.__module__ == "builtins" else f"{cls.__module__}."
    what = where + cls.__qualname__
    return ConfigError(
        f"column {name!r} ({kind}) holds {what} values, and a {what} does not pickle "
        f"({type(error).__name__}: {error}); an ingest.DataLoader worker sends its batches to "
        "the main process pickled, so it cannot send this one: return tensors, numbers, "
        "strings or lists of them from the transform (or read the stream with "
        "num_workers=0, which pickles nothing)"
    )


def _first_unpicklable(value: Any) -> Any:
    """The first value in ``value`` (its lists, tuples and dicts walked) that does not
    pickle alone; ``value`` itself if none does (made only for the error)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) in (list, tuple):  # not a named tuple's subclass (MonthDayNano is one)
            stack.extend(reversed(v))
            continue
        if type(v) is dict:
            stack.extend(reversed([x for pair in v.items() for x in pair]))
            continue
        try:
            pickle.dumps(v, pickle.HIGHEST_PROTOCOL)
        except Exception:
            return v
    return value


def taken(batch: Batch, came: Came, ring: SlotRing) -> Came:
    """Fill ``batch`` with what a worker wrote into its ``ring`` for it (``came.placed``):
    its tensors copied out, its string and binary columns decoded; and return ``came`` with
    the batch's runs. The slot is then free."""
    assert came.placed is not None
    with ring.viewed(came.placed) as views:
        runs = views.pop(RUNS).copy()
        for name, kind in came.texts:
            offsets, data = views.pop(_OFFSETS + name), views.pop(_DATA + name)
            batch[name] = text_values(offsets, data, kind)
        for name, view in views.items():
            batch[name] = torch.from_numpy(view.copy())
        del views
    return dataclasses.replace(came, runs=runs, placed=None, texts=())


def with_tensors(batch: Batch, came: Came) -> Batch:
    """``batch`` with the arrays a worker sent by its pipe (``came.arrays``) made tensors
    again."""
    for name in came.arrays:
        batch[name] = torch.from_numpy(batch[name])
    return batch


def worker_sends(
    rank: int,
    items: Iterator[Any],
    pack: Grouping | None,
    ring: SlotRing | None,
    forked: bool,
    io: IOSent,
) -> Iterator[Batch]:
    """What worker ``rank`` sends of its feed's ``items`` (``forked``: in a worker process,
    not in the main one with ``num_workers=0``): its batches, a few to an item where they lie
    in its ``ring``, then its end; or a failure (the batches before it first): the feed's, or
    a batch's that cannot be sent (:func:`_converted`). What its reads add to its counts goes
    with them (``io``)."""
    bundler = Bundler(rank)
    for item in items:
        out = _converted(rank, item, pack, ring, forked, io) if isinstance(item, Ready) else item
        if isinstance(out, Failed | Tail):
            yield from bundler.flush()
        if isinstance(out, Failed):
            yield {KEY: out}
            return
        if isinstance(out, Tail):
            grown = io.growth(now=True)
            ended = Ended(rank, out.steps, out.leftover, out.learned, out.quarantined, grown)
            yield {KEY: ended}
            return
        yield from bundler.add(*out)


def _converted(
    rank: int,
    item: Ready,
    pack: Grouping | None,
    ring: SlotRing | None,
    forked: bool,
    io: IOSent,
) -> tuple[Batch, int] | Failed:
    """What worker ``rank`` sends of its feed's batch ``item``, with its bytes (for the
    :class:`Bundler`); or, if it cannot be sent (a column no tensor holds, values that do
    not pickle: :func:`ingest.integrations.worker_items.sent`), the error, sent as the
    feed's are, so that it reaches the main process as it is (torch's pipe would have lost
    the batch, and the main process waited for it for ever)."""
    try:
        table = worker_table(pack, item.table)
        if table is not None:  # regrouped by the main process's node
            return io.on({KEY: Came.of(rank, item, table=table)}), 0
        if not forked:
            return io.on({**to_torch(item.table), KEY: Came.of(rank, item)}), 0
        return io.on(sent(rank, item, ring)), item.nbytes
    except IngestError as e:
        return Failed(e)


__all__ = [
    "BUNDLE_BATCHES",
    "BUNDLE_BYTES",
    "KEY",
    "RUNS",
    "Bundle",
    "Bundler",
    "Came",
    "Ended",
    "Failed",
    "IOSent",
    "in_turn",
    "refuse_unpicklable",
    "ring_slots",
    "sent",
    "sure_to_pickle",
    "taken",
    "with_tensors",
    "worker_sends",
]
