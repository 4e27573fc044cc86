"""Packing a rank's documents into sequences of ``seq_len`` tokens, exact across stops.

A packing rank (:class:`PackedRank`) sits between its feed and the user's loop. The feed
reads the rank's share in *read steps* of :attr:`Pack.read_rows` documents (the book's
steps: equal on every rank, acked and folded as any stream's), with their token ids (a
``Tokenize`` transform, or a column of them). Every document goes into a
:class:`~ingest.core.packing.Packer` at once; the rank hands out batches of ``batch_size``
sequences as the packer closes them. A sequence holds pieces of documents from several read
steps, and a document may be cut across sequences, so what a batch consumed is tokens of
documents, not the rows of a read step:

- A document whose last piece reached a batch is done. A read step is acked to the book
  (:class:`~ingest.engine.loop.RankLoop`) once every document of it is done, and of the
  earlier ones too: the book's steps stay whole and in order.
- A state (:meth:`PackedRank.state`) is the book's snapshot at the last read step acked,
  cursors included, with the pack node's part, ``pack.tokens`` (``progress.tokens`` in
  the parsed state): for every document of a
  later read step that reached a batch, ``(segment, shard, row, offset)``, the tokens ``[0,
  offset)`` handed out (all of them for a document done). Tokens still in open sequences,
  and in sequences closed but not handed out, are not consumed: no token buffer is saved.
  See :func:`ingest.core.snapshot.state_with_tokens`.
- A resume reads the read steps after the snapshot again (in the same order, with the same
  settings; shared anew otherwise), and packs each listed document from its offset
  (``Packer.add(start=)``; a document done starts at its end, so nothing of it is packed).
  Best-fit and greedy packing hand out the pieces of a document in token order, so what
  any prefix of the batches consumed of a document is a prefix of its tokens: one offset.
- The epoch's end closes the open sequences (padded); its last batch may hold fewer than
  ``batch_size`` sequences. Rows the book carries into the next epoch (the epoch's
  remainder, fewer than a read step) are packed there, as any stream reads them; one cut
  before a resume that shared the rest anew keeps its offset there (segment 0).

Transforms before packing may drop documents (an :class:`ingest.Filter`): a dropped document
is consumed with its read step. They may not make several rows of one.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.assign import CARRY
from ingest.core.book import EpochBook
from ingest.core.errors import ConfigError, IngestError, StateError
from ingest.core.ledger import StepRecord, packed_row, unpacked_row
from ingest.core.packing import Packed, Packer
from ingest.core.snapshot import state_with_tokens
from ingest.core.state import StreamState
from ingest.engine.grouping import Group, Grouper, Grouping
from ingest.engine.interrupts import commit
from ingest.engine.loop import BatchItem, Ending, RankLoop
from ingest.engine.pack_settings import ORIGIN, Pack, with_origin
from ingest.engine.stage import RowError
from ingest.engine.tokenize import EOS_KEY, check_ids
from ingest.formats.arrays import numbers

if TYPE_CHECKING:  # convert imports torch, which the Ray readers of a packing stream need not
    from ingest.engine.convert import Batch


@dataclass(slots=True)
class _Step:
    """A read step in flight: its item, its documents not done, and the ones done."""

    item: _ReadStep
    first: int = 0
    """The serial of its first document (documents are numbered as they are packed)."""
    open: int = 0
    done: list[tuple[int, int]] = field(default_factory=list)
    """``(packed row, tokens)`` of its documents done (all of its rows are, once it is
    acked)."""


class StepCount:
    """A packing stream's steps: the batches handed out since the run began, numbered in
    the order they reach the user's loop, so shared by the nodes of one loop (a
    :class:`ingest.DataLoader`'s workers' nodes hand their batches out through one loader).

    A provenance log keys each batch's pieces by its step (:mod:`ingest.core.provenance`),
    and a state keeps the count (``pack.steps``), so the steps go on after a resume at any
    world size. A Ray rank's count is its own (every rank hands out as many batches).
    """

    def __init__(self, first: int = 0) -> None:
        self.next = first
        """The step of the next batch."""
        self.known = True
        """Whether :attr:`next` counts from the run's start: not after loading a state saved
        before the count was kept (its log's steps start again at 0, and its states keep
        no count, as the loaded one)."""

    def load(self, batches: int | None) -> None:
        """Go on after a state's ``pack.steps`` (None: not kept in it)."""
        self.next, self.known = batches or 0, batches is not None

    @property
    def saved(self) -> int | None:
        """What a state keeps (``pack.steps``): the count, if known."""
        return self.next if self.known else None

    def take(self) -> int:
        """The next batch's step."""
        step = self.next
        self.next += 1
        return step


def pad_of(pack: Grouping, table: pa.Table) -> int:
    """The pad id: ``pack.pad_id``, else the ``eos_id`` the token ids were made with (their
    field's metadata, :data:`ingest.engine.tokenize.EOS_KEY`), else 0, with a warning."""
    if pack.pad_id is not None:
        return pack.pad_id
    field_ = table.schema.field(pack.column) if pack.column in table.column_names else None
    eos = (field_.metadata or {}).get(EOS_KEY) if field_ is not None else None
    if eos is not None:
        return int(eos)
    name = type(pack).__name__
    warnings.warn(
        f"{name}(pad_id=None) pads with token id 0: the ids of column {pack.column!r} were "
        "not made by Tokenize(eos_id=...), whose end-of-text id would pad; id 0 is a real "
        "token of most vocabularies (its labels are -100, but the model still embeds it). "
        f"Pass {name}(pad_id=...): your tokenizer's pad or end-of-text id",
        UserWarning,
        stacklevel=2,
    )
    return 0


def tokens_of(table: pa.Table, pack: Grouping) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
    """Each row's token count, and all the tokens one after another."""
    column, name = pack.column, type(pack).__name__
    if column not in table.column_names:
        raise ConfigError(
            f"{name}(column={column!r}): the batch has columns "
            f"{[c for c in table.column_names if c != ORIGIN]}; tokenize first "
            "(transform=ingest.Tokenize(...)) or name the token id column"
        )
    ids = table.column(column)
    kind = ids.type
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if not any(is_list(kind) for is_list in lists):
        raise ConfigError(f"{name}(column={column!r}) is {ids.type}, not a list of token ids")
    if not pa.types.is_integer(kind.value_type):
        nested = any(is_list(kind.value_type) for is_list in lists)
        raise ConfigError(
            f"{name}(column={column!r}) is {kind}: a row's token ids are one list of "
            "integers in [0, 2**31)"
            + (
                ", one list per row (flatten the lists of lists)"
                if nested
                else "; cast the column to integers (a float id would be cut: 10.7 to 10)"
            )
            + ", or tokenize with transform=ingest.Tokenize(...)"
        )
    lengths = pc.list_value_length(ids)
    if lengths.null_count:  # null lists: no token (a Python 0 imports pandas: only here)
        lengths = lengths.fill_null(0)
    flat = numbers(pc.list_flatten(ids))
    counts = numbers(lengths).astype(np.int64)
    check_ids(flat, counts)
    return counts, flat


class PackedRank:
    """One rank's packing: read steps in, batches of sequences out (see the module docstring).

    What goes with what is the grouping's (``pack``: :class:`Pack`'s sequences, or another
    :class:`~ingest.engine.grouping.Grouping`); the rest is this class's, whatever the
    grouping.

    Args:
        pack: The packing settings.
        batch_size: The stream's batch size (sequences per batch, for a :class:`Pack`).
        rank: The rank's loop, which acks read steps to its book.
        book: The rank's book (for :meth:`state` and the carry at an epoch's end); None: the
            book is in another process (a Ray rank, :mod:`ingest.distributed.rank_pack`).
        steps: The loop's batch count, shared with the other nodes whose batches the same
            loop hands out (a DataLoader's); None: the node's own.
    """

    def __init__(
        self,
        pack: Grouping,
        batch_size: int,
        rank: RankLoop,
        book: EpochBook[Any] | None,
        steps: StepCount | None = None,
    ) -> None:
        self.pack = pack
        self.steps = steps or StepCount()
        self.logs = book is not None and book.log is not None
        """Each batch's pieces go to the book's provenance log (``provenance=``; a Ray
        rank is told by its coordinator, :meth:`load_offsets`)."""
        self._last_read = -1
        """The last read step packed (its epoch is the batches')."""
        self._stream_batch = batch_size
        self.batch_size = pack.per_batch(batch_size)
        """Groups per batch (for a :class:`Pack`, sequences: the stream's batch size)."""
        self.rank = rank
        self.book = book
        self._steps: deque[_Step] = deque()
        self._docs: dict[int, tuple[_Step, int, int]] = {}
        """Documents in the packer, by serial: their read step, packed row and tokens."""
        self._serial = 0
        self._firsts: deque[int] = deque(maxlen=pack.max_lag + 1)
        """The first serials of the last read steps packed."""
        self._closed: list[Packed] = []
        """Sequences the packer closed, not handed out yet."""
        self._offsets: dict[int, int] = {}
        """Packed row -> tokens handed out, of documents cut (loaded ones included until read)."""
        self._loaded: list[tuple[int, str, int, int]] = []
        """A loaded state's cut documents by shard URL, until the epoch's listing is known."""
        self._urls: Sequence[str] = ()
        self.packer: Grouper = pack.grouper(batch_size)
        self.tokens = 0
        """Tokens handed out (not padding)."""
        self.padding = 0
        """Padding tokens handed out."""
        self.handed = 0
        """Batches handed out in the epoch (this run of it)."""
        self._pad = pack.pad_id
        """The pad id (None: from the first read step's ids, :func:`pad_of`)."""

    @property
    def step(self) -> int:
        """The step of the last batch handed out (see :class:`StepCount`)."""
        return self.steps.next - 1

    def batches(self) -> int | None:
        """The batches handed out since the run began, as a state keeps them (``pack.steps``);
        None: not known (see :class:`StepCount`)."""
        return self.steps.saved

    def check(self, state: StreamState) -> None:
        """Any state loads (one without documents in flight too)."""
        return None

    def load(self, state: StreamState) -> None:
        """Go on after ``state`` (loaded into the book): its cut documents start at their
        offsets; nothing in flight is kept."""
        self._reset()
        self._loaded = [
            (segment, state.shards[shard].url, row, offset)
            for segment, shard, row, offset in state.progress.tokens
        ]
        self.steps.load(state.progress.batches)

    def _reset(self) -> None:
        self._steps.clear()
        self._firsts.clear()
        self._docs.clear()
        self._closed = []
        self._offsets = {}
        self._loaded = []
        self.packer = self.pack.grouper(self._stream_batch)

    def feed(self, item: _ReadStep, convert: Any = None) -> Iterator[tuple[int, Batch]]:
        """Pack a read step's documents; the batches that fills, each with its rows (a
        :class:`~ingest.engine.rank_node.RankNode`; ``convert`` is a plain rank's)."""
        self._take(item)
        while len(self._closed) >= self.batch_size:
            yield self._handed(self._hand_out(self.batch_size))

    def finish(self, epoch: int, ending: Ending) -> Iterator[tuple[int, Batch]]:
        """The rank's feed of ``epoch`` ended: its open sequences closed, the last batches
        (the last one may be short), then the end of the epoch for its book."""
        commit()  # see ingest.engine.interrupts
        self.close_all()
        self._firsts.clear()
        while self._closed:
            yield self._handed(self._hand_out(self.batch_size))
        if self._steps or self._docs:  # pragma: no cover - the packer holds none
            raise IngestError(f"epoch {epoch} ended with {len(self._docs)} documents not packed")
        commit()  # resumed after the last batch's return
        if not self.handed and not ending.steps:
            self._warn_empty(epoch, ending)
        self.rank.end(epoch, ending)
        self._carry(epoch)

    def close_all(self) -> None:
        """The feed ended: close the open sequences (padded)."""
        closed = self._closed + self.packer.flush()
        # Documents without a token left at the end come in a sequence of padding alone:
        # they go with the last sequence of tokens, or, with none, are done as they are.
        empty = [p for seq in closed if not seq.size for p in seq.pieces]
        self._closed = [seq for seq in closed if seq.size]
        if empty and self._closed:
            self._closed[-1].pieces.extend(empty)
        elif empty:
            self._done([Packed(pieces=empty)])  # (a group of no token)

    @staticmethod
    def _handed(batch: Batch) -> tuple[int, Batch]:
        return len(batch["input_ids"]), batch

    def counts(self) -> dict[str, int]:
        """The tokens and the padding the batches handed out held (``stream.stats``)."""
        return {"tokens": self.tokens, "padding_tokens": self.padding}

    @property
    def ready(self) -> int:
        """Full batches closed and not handed out yet."""
        return len(self._closed) // self.batch_size

    def next_batch(self) -> Batch:
        """Hand out the next full batch (:attr:`ready` must be at least 1)."""
        return self._hand_out(self.batch_size)

    def add(self, item: _ReadStep) -> None:
        """Pack a read step's documents without handing out a batch (see :attr:`ready`)."""
        self._take(item)

    def surplus(
        self, unread: Iterable[_ReadStep]
    ) -> tuple[list[StepRecord], npt.NDArray[np.int64], list[tuple[int, int]]]:
        """End the epoch before every document was handed out (ranks with equal steps: the
        epoch ends at the fewest batches any rank made, :mod:`ingest.distributed.rank_pack`).

        Args:
            unread: The rank's read steps after the ones packed, not packed.

        Returns:
            The acks of every read step not acked yet, each with its documents done only
            (and those a filter dropped), without the windows it closed (a fold must not
            count a window's rows not done); the packed rows not done, which the book carries
            into the next epoch (:meth:`ingest.core.book.EpochBook.carry_over`); and the
            offsets of the ones cut, ``(packed row, tokens handed out)``.
        """
        records: list[StepRecord] = []
        open_keys = {key for _, key, _ in self._docs.values()}
        not_done = np.fromiter(open_keys, np.int64, len(open_keys))
        leftover: list[npt.NDArray[np.int64]] = []
        for step in self._steps:
            item = step.item
            keys = np.asarray(item.runs, dtype=np.int64)
            stays = np.isin(keys, not_done)
            records.append(StepRecord(item.step, keys[~stays], int((~stays).sum())))
            leftover.append(keys[stays])
        for item in unread:
            keys = np.asarray(item.runs, dtype=np.int64)
            stays = np.zeros(len(keys), dtype=bool)
            stays[item.table.column(ORIGIN).to_numpy()] = True  # a filter's survivors
            records.append(StepRecord(item.step, keys[~stays], int((~stays).sum())))
            leftover.append(keys[stays])
        cut = [(key, offset) for key, offset in self._offsets.items() if key in open_keys]
        self._reset()
        rows = np.concatenate(leftover) if leftover else np.zeros(0, np.int64)
        return records, rows, cut

    def load_offsets(self, offsets: Mapping[int, int], first_step: int | None, logs: bool) -> None:
        """Start an epoch with these documents cut before, ``packed row -> tokens handed
        out``, by the epoch's listing, its first batch's step (None: not known, see
        :class:`StepCount`), and whether its batches are logged (a Ray rank: its
        coordinator knows the listing and the other ranks' steps)."""
        self._reset()
        self._offsets = dict(offsets)
        self.handed = 0
        self.steps.load(first_step)
        self.logs = logs

    def in_flight(self) -> list[tuple[int, int]]:
        """``(packed row, offset)`` of the documents of the read steps not acked yet that
        reached a batch (the length of a document done), by the epoch's listing."""
        handed = [(key, n) for s in self._steps for key, n in s.done if n]
        return handed + list(self._offsets.items())

    def _warn_empty(self, epoch: int, ending: Ending) -> None:
        """Say that ``epoch`` gave this rank no batch: it read no whole read step. Not when
        the epoch's listing holds a read step for every rank: an epoch resumed near its end
        (the rest consumed before the state) gives no batch too, and that is no fault."""
        rows, ranks, name = "", "", type(self.pack).__name__
        if self.book is not None:
            total = self.book.listed_rows(epoch, ending.learned)  # JSONL's counted by reading
            if total is not None and len(self.book.plan(epoch).counts):
                if total >= self.pack.read_rows * self.book.world_size:
                    return
                rows = f" ({total:,} rows listed)"
            ranks = f" x {self.book.world_size} ranks"
        warnings.warn(
            f"epoch {epoch} of the packed stream gave no batch: the dataset{rows} holds fewer "
            f"than one read step of {name}.read_rows={self.pack.read_rows} documents{ranks}, "
            f"and its rows are carried into the next epoch. Lower {name}.read_rows (to at most "
            "the rows per rank), or add data",
            UserWarning,
            stacklevel=2,
        )

    def _carry(self, epoch: int) -> None:
        """After ``epoch``'s end: the book takes the offsets of the documents cut before a
        resume that the epoch did not read again (its remainder, shared anew at the resume),
        and the next epoch's carried rows start at their copies' (:mod:`ingest.core.carry`);
        the other offsets are spent."""
        keep: list[tuple[int, str, int, int]] = []
        if self.book is None:  # the book carries them (a Ray rank's coordinator)
            self._offsets = {}
            return
        if self.book.config.remainder == "carry":
            noted = {unpacked_row(key): offset for key, offset in self._offsets.items()}
            for (shard, row), offset in self.book.plan(epoch).cut_at_end(noted).offsets.items():
                keep.append((CARRY, self._urls[shard], row, offset))
        self._offsets = {}
        self._loaded = keep

    def begin(self, urls: Sequence[str]) -> None:
        """An epoch (or the rest of one) whose listing's shards are ``urls`` begins."""
        self._urls = urls
        self.handed = 0
        if not self._loaded:
            return
        by_url = {url: n for n, url in enumerate(urls)}
        for segment, url, row, offset in self._loaded:
            shard = by_url.get(url)
            if shard is None:
                raise StateError(
                    f"the state cut row {row} of {url}, which this epoch's listing does not "
                    "hold; resume on the dataset the state was saved on"
                )
            self._offsets[packed_row(segment, shard, row)] = offset
        self._loaded = []

    def _take(self, item: _ReadStep) -> None:
        commit()  # the read step's documents join the packer whole (ingest.engine.interrupts)
        keys = item.runs
        if keys.ndim != 1:
            raise IngestError(
                f"{type(self.pack).__name__} needs each row's place (shards and rows below "
                f"2**31); this epoch's read step {item.step} has rows past it"
            )
        if item.rows >= 0:
            raise ConfigError(
                f"{type(self.pack).__name__} does not take read steps with quarantined rows "
                "yet; read with "
                'ReadOptions(on_error="raise") when packing'
            )
        table = item.table
        self._last_read = item.step
        if self._pad is None:
            self._pad = pad_of(self.pack, table)
        origin = numbers(table.column(ORIGIN))
        try:
            lengths, flat = tokens_of(table, self.pack)
        except RowError as e:  # an id made before packing out of range: name its row
            _, shard, row = unpacked_row(keys[origin][e.row])
            raise e.at(self._url(shard), row) from None
        ends = np.cumsum(lengths)
        step = _Step(item, self._serial)
        self._steps.append(step)
        # Per document: Python ints, no numpy scalar (a third of the time); the packer takes
        # the read step's documents in one call (Packer.add_run)
        docs, offsets, first = self._docs, self._offsets, self._serial
        keys_, lengths_, ends_ = keys[origin].tolist(), lengths.tolist(), ends.tolist()
        starts = [offsets.get(key, 0) for key in keys_] if offsets else [0] * len(keys_)
        bad = None
        if offsets:  # a document that the state consumed further than it is long
            over = (k for k, (s, n) in enumerate(zip(starts, lengths_, strict=True)) if s > n)
            bad = next(over, None)
        count = len(keys_) if bad is None else bad  # the documents packed (those before it)
        entries = zip(repeat(step, count), keys_, lengths_, strict=False)  # (count of each)
        docs.update(zip(range(first, first + count), entries, strict=False))
        if isinstance(self.packer, Packer):
            ends_, lengths_, starts = ends_[:count], lengths_[:count], starts[:count]
            self._closed += self.packer.add_run(first, flat, ends_, lengths_, starts)
        else:  # another grouper: a document at a time
            for k in range(count):
                n, end, start = lengths_[k], ends_[k], starts[k]
                self._closed += self.packer.add(first + k, flat[end - n + start : end], start)
        step.open += count
        self._serial = first + count
        if bad is not None:
            key = keys_[bad]
            _, shard, row = unpacked_row(key)
            raise StateError(
                f"row {row} of {self._url(shard)} has {int(lengths[bad])} "
                f"tokens, and the state consumed {offsets[key]} of them: the data or the "
                "tokenizer changed since the state was saved; resume with the same ones"
            )
        lag = self.pack.max_lag
        self._firsts.append(step.first)
        if len(self._firsts) > lag:  # documents from before the last max_lag read steps go
            # (counted in read steps packed, not in steps not acked yet: what is packed with
            # what is then a function of the read steps alone, whenever batches are taken)
            first = self._firsts[-lag] if lag else self._serial
            self._closed.extend(self.packer.close_before(first))
        self._ack()

    def _url(self, shard: int) -> str:
        if shard < len(self._urls):
            return self._urls[shard]
        return f"shard {shard} of the epoch's listing"

    def _hand_out(self, size: int) -> Batch:
        commit()  # see ingest.engine.interrupts
        self.handed += 1
        step = self.steps.take()
        groups, self._closed = self._closed[:size], self._closed[size:]
        batch = self.pack.collate(groups, self._pad or 0)
        wanted = self.pack.provenance or self.logs
        pieces = self._provenance(batch.pieces) if wanted else None
        if self.logs and pieces is not None:  # logged with the read steps it acks next
            self.rank.log_batch((step, self._last_read, pieces))
        self._done(groups)
        real = batch.real_tokens
        self.tokens += real
        self.padding += batch.size - real
        out = packed_torch(batch.arrays)
        if pieces is not None and self.pack.provenance:
            out["pieces"] = packed_torch({"pieces": pieces})["pieces"]
        return out

    def _provenance(self, pieces: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``(sequence, shard, row, start, stop)`` per piece (see :attr:`Pack.provenance`)."""
        docs = self._docs
        keys = np.fromiter((docs[s][1] for s in pieces[:, 1].tolist()), np.int64, len(pieces))
        _, shard, row = unpacked_row(keys)  # type: ignore[arg-type]
        out = np.empty((len(pieces), 5), dtype=np.int64)
        out[:, 0], out[:, 1], out[:, 2] = pieces[:, 0], shard, row
        out[:, 3:] = pieces[:, 2:4]
        return out

    def _done(self, groups: Iterable[Group]) -> None:
        """The groups handed out: the offsets of their pieces' documents move on, a document
        whose last piece it is is done, and the read steps now done are acked. (Read from the
        groups' own pieces: no array of the batch's pieces made lists again.)"""
        docs, offsets = self._docs, self._offsets
        for serial, _, stop, last in chain.from_iterable(g.pieces for g in groups):
            if last:
                step, key, n = docs.pop(serial)
                offsets.pop(key, None)
                step.open -= 1
                step.done.append((key, n))
            else:
                offsets[docs[serial][1]] = stop
        self._ack()

    def _ack(self) -> None:
        """Ack the read steps whose documents are all done, oldest first."""
        while self._steps and self._steps[0].open == 0:
            self.rank.hand_out(self._steps.popleft().item, _nothing)

    def state(self) -> StreamState:
        """The state after the last batch handed out (see the module docstring)."""
        self.rank.flush()
        if self.book is None:
            raise IngestError("a Ray rank's state comes from its coordinator")
        base = self.book.snapshot(self.rank.step)
        return state_with_tokens(base, self.entries(base), self.batches())

    def entries(self, base: StreamState) -> list[tuple[int, int, int, int]]:
        """``(segment, shard, row, offset)`` of the documents of the read steps not acked yet
        that reached a batch (all their tokens for a document done), and of a loaded state's
        not read again yet, by ``base``'s shard indices.

        A row ``base`` consumed whole is left out: with several ranks, each starts from a
        loaded state's offsets, and only the rank that reads a row finishes it."""
        handed = self.in_flight()
        if not handed and not self._loaded:
            return []
        by_url = {s.url: n for n, s in enumerate(base.shards)}
        tokens = []
        for key, offset in handed:
            segment, shard, row = unpacked_row(key)
            url = self._urls[shard]
            if url not in by_url:  # pragma: no cover - an epoch's listing is its state's
                raise StateError(f"{url} is not in the state's listing")
            tokens.append((segment, by_url[url], row, offset))
        tokens += [(s, by_url[url], row, off) for s, url, row, off in self._loaded if url in by_url]
        return [t for t in tokens if not base.consumed_whole(t[0], t[1], t[2])]


def packed_torch(arrays: Mapping[str, Any]) -> Batch:
    """A collated batch's arrays as torch tensors (``max_seqlen`` stays an int)."""
    import torch  # here: the readers of a Ray stream import this module, not torch

    return {
        name: value if isinstance(value, int) else torch.from_numpy(value)
        for name, value in arrays.items()
    }


def merged(entries: Iterable[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Several ranks' :meth:`PackedRank.entries`, one per row (the largest offset: each rank
    starts from a loaded state's, and only the rank that reads a row moves it on)."""
    most: dict[tuple[int, int, int], int] = {}
    for segment, shard, row, offset in entries:
        key = (segment, shard, row)
        most[key] = max(most.get(key, 0), offset)
    return sorted((*key, offset) for key, offset in most.items())


class _ReadStep(BatchItem, Protocol):
    """A read step as packing takes it: :class:`ingest.engine.feed.Ready`, or a DataLoader
    worker's copy of one (its table holding the token ids and :data:`ORIGIN`)."""

    @property
    def table(self) -> Any: ...


def _nothing(_: Any) -> None:
    return None


__all__ = [
    "ORIGIN",
    "Pack",
    "PackedRank",
    "StepCount",
    "merged",
    "packed_torch",
    "pad_of",
    "tokens_of",
    "with_origin",
]
