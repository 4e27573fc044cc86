"""The feed: one rank's share of an epoch -> shuffled, full batches with their provenance.

This is the one engine behind :class:`ingest.Stream` (in-process, one rank) and
:class:`ingest.RayStream` (in the reader pool's actors, one feed per rank). It knows no Ray.

Reading order. The rank's spans (its share, from :mod:`ingest.core.assign`) are grouped by shard
and dealt round-robin to ``lanes`` lanes; each lane reads its shards front to back through
the formats (one open per shard, seeks, coalesced ranges: :mod:`ingest.engine.lanes`). A
*window* takes ``window // lanes`` rows from every lane that still has rows, so one window
holds rows of up to ``lanes`` shards of different parts of the epoch plan; with a seed its
rows are permuted by a key of (seed, epoch, rank, window index), in one gather of the whole
window. Batches are cut from consecutive windows (a batch within one shuffled window is a
zero-copy slice). Without a seed there is one lane and no permutation: listing order.

Memory, in bytes as well as rows (:mod:`ingest.planner.budget`). A window holds ``FeedPlan.window``
rows: ``shuffle_window``, or fewer where ``shuffle_bytes`` says so for the epoch's listing
(fixed when the epoch is planned, so the order and the cursors are those of a window of
that many rows). A window of more than :data:`_GATHER_BYTES` (or a quarter of
``shuffle_bytes``) is not permuted in one gather, which would hold a second copy of it for a
moment: each batch gathers its rows from the window's record batches instead. Before the
next window is read, the rows of the last one not yet cut (less than a batch) are copied
out, so that its table is let go. The lanes hold their read-ahead within their share of
``ReadOptions.prefetch_bytes``, beyond the record batch each holds in any case (a Parquet
row group at most: a smaller record batch would keep the reader's row group open longer,
which holds more). A feed holds about ``shuffle_bytes + prefetch_bytes`` and a batch
(:attr:`Feed.held_bytes`), beside one record batch per lane and what its open shard holds
in its reader.

Resume. Every batch carries a *cursor*: where each lane stood at the start of the oldest
window that still had rows not yet cut into batches. A feed started from that cursor rebuilds
that window, leaves out the rows already consumed (the ``skip`` sets) and continues with
exactly the batches of the uninterrupted run. Exactly-once rests on the consumed rows alone.

Provenance never travels with the rows: each batch's rows are described beside the table,
for the rank to ack, as packed rows (one int64 per row, ``segment << 62 | shard << 31 |
row``: a gather and an add per row from the window's keys, no sort), or as runs ``(segment,
shard, start, stop)`` where they do not pack (shards or rows past 2**31). A batch that takes
a window's last position also carries the window's rows as a few runs
(:class:`ingest.core.ledger.Closed`): a fold up to it adds those runs and sorts no packed row.

Bad data. With ``ReadOptions(on_error="skip")`` the rest of a span that cannot be read
becomes *holes*: window positions that are acked with their batch but carry no row, so the
batches are cut at the same steps as without the error (see :mod:`ingest.core.quarantine`).
A shard that could not be read while the listing was made has no rows in the plan: the feed
of rank 0 records it whole, with its first batch (:mod:`ingest.planner.catalog`).

Derived cache. With ``FeedConfig.derived`` and a chain that has a fingerprint, the lanes read
each span they read whole from its copy or derive it whole and keep it, and the window's rows
are refs to the outputs (:mod:`ingest.engine.derived.reading`): windows, shuffles, batches and
acks are those of the input rows as without it, and each batch gathers its rows' outputs in
place of running the transform; rows read in part run it per batch, as without the cache
(:mod:`ingest.engine.derived.batches`).
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.assign import CARRY, MAIN, Span
from ingest.core.errors import ConfigError, IngestError
from ingest.core.ledger import Closed, Rows, Runs, as_runs, runs_of
from ingest.core.plan import permutation
from ingest.core.quarantine import Quarantine, Quarantined, skippable
from ingest.core.share import FeedPlan
from ingest.core.state import Cursor
from ingest.engine.decoders import UndecodedMemberError
from ingest.engine.derived.batches import DerivedBatches
from ingest.engine.derived.reading import REF, Deriving, refs_of
from ingest.engine.derived.store import DerivedConfig
from ingest.engine.lanes import LaneReader, make_lanes, unit_rest
from ingest.engine.pack_settings import ORIGIN
from ingest.engine.prefetch import in_order, read_ahead
from ingest.engine.stage import RowError
from ingest.engine.tensor_types import NULL_FIX, refused_null
from ingest.engine.transform import output_of_no_rows, parallel_batches, split_failures
from ingest.engine.window import Hole, Lane, Origin, Piece, Window, indices, piece_rows
from ingest.formats.base import ReadOptions
from ingest.planner.catalog import Listing
from ingest.storage.sources import Source

_GATHER_BYTES = 32 << 20
"""Windows of more bytes are gathered batch by batch, not in one take. One take of the whole
window is the fastest for small rows (40x fewer calls than a take per record batch per batch
for 100-byte rows), but holds the window twice for a moment; above this size a window is
of large rows, for which the take per batch is about as fast (measured 0.6-1.6x)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedConfig:
    """How a feed reads and batches; the same for every rank of a stream.

    Attributes:
        batch_size: Rows per batch.
        seed: Shuffle seed; None reads in listing order with one lane.
        window: Rows per shuffle window, at most (the plan says how many: ``FeedPlan.window``).
        lanes: Shards read side by side to fill a window.
        columns: Columns to read, or None.
        read: Read options.
        window_bytes: The stream's ``shuffle_bytes``: a window of more than a quarter of it
            is gathered batch by batch (see the module's docstring). None: no byte bound.
        derived: Where the transform's outputs of each unit read whole are kept and read
            again (:mod:`ingest.engine.derived.reading`); None: the transform runs on every
            batch.
    """

    batch_size: int
    seed: int | None
    window: int
    lanes: int
    columns: tuple[str, ...] | None
    read: ReadOptions
    window_bytes: int | None = None
    derived: DerivedConfig | None = None


@dataclass(frozen=True, slots=True)
class Ready:
    """One full batch: its global step, its rows, where they came from, the cursor after it."""

    step: int
    table: Any
    """The rows as an Arrow table, or whatever the transform returned for them."""
    runs: Runs | Rows
    """Where the rows came from: packed rows (1-d, :func:`ingest.core.ledger.pack_rows`), or
    runs ``(segment, shard, start, stop)`` where they do not pack."""
    cursor: Cursor
    quarantined: tuple[Quarantined, ...] = ()
    """Quarantines recorded since the batch before (``on_error="skip"``)."""
    rows: int = -1
    """Rows delivered (fewer than the batch size where it held holes); -1: all of them."""
    closed: Closed | None = None
    """The windows this batch finished, when ``runs`` are packed rows (for the fold)."""

    @property
    def nbytes(self) -> int:
        """Bytes of the batch (0 when the transform made something other than a table)."""
        return int(getattr(self.table, "nbytes", 0) or 0)


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of a feed: batches yielded, rows left over (fewer than a batch), rows learnt.

    ``leftover`` is only ever non-empty when row counts were unknown at planning time.
    """

    steps: int
    leftover: Runs
    learned: dict[int, int]
    quarantined: tuple[Quarantined, ...] = ()


def item_bytes(item: Ready | Tail) -> int:
    """Bytes of a feed's item, as a read-ahead of them counts them (a :class:`Tail`: 0)."""
    return item.nbytes if isinstance(item, Ready) else 0


class Feed:
    """Iterate a rank's batches of one epoch: :class:`Ready` items, then one :class:`Tail`.

    Args:
        plan: The rank's share and start.
        config: Batching and shuffle settings.
        source: Opens shards and counts requests.
        transform: Applied to each batch's table before it is handed out (or None).
    """

    def __init__(
        self,
        plan: FeedPlan[Listing],
        config: FeedConfig,
        source: Source,
        transform: Callable[[pa.Table], Any] | None = None,
    ) -> None:
        self.plan = plan
        self.config = config
        self.source = source
        self.transform = transform
        self._skip = config.read.on_error == "skip"
        self.quarantine = Quarantine(config.read.max_errors, plan.epoch, plan.rank)
        if self._skip and plan.rank == 0:  # shards quarantined at planning (only under skip)
            for n, error in plan.listing.unread():
                self.quarantine.add(error, url=plan.listing.shards[n].url)
        self._window_rows = config.window if plan.window is None else plan.window
        self._lanes = make_lanes(plan, 1 if config.seed is None else config.lanes)
        _LIVE.add(self)
        budget = config.read.prefetch_bytes
        self._reader = LaneReader(
            plan,
            source,
            config.read,
            config.columns,
            self.quarantine,
            None if budget is None else max(1, budget // len(self._lanes)),
        )
        io = None if config.derived is None else source.stats  # the stream's counts
        self._deriving = Deriving.of(config.derived, transform, config.columns, io)
        self._reader.deriving = self._deriving
        self._batches = (
            None
            if self._deriving is None or transform is None
            else DerivedBatches(
                self._deriving,
                transform,
                self.quarantine,
                skip=self._skip,
                empty_input=self._empty_input,
            )
        )
        gather = _GATHER_BYTES
        if config.window_bytes is not None:
            gather = min(gather, config.window_bytes // 4)
        self._gather_bytes = gather
        self._held: list[tuple[Window, int, int]] = []
        """Windows with rows not yet cut into batches: ``(window, start, stop)``."""
        self.peak_bytes = 0
        """The most bytes this feed held at once, seen as each window was made."""

    def ahead(self, name: str) -> contextlib.AbstractContextManager[Iterator[Ready | Tail]]:
        """This feed's items, for one loop; ``name``: what a timeout names (the source). On
        leaving, the feed is closed.

        The lanes read and decode ahead in their own threads (:class:`LaneReader`), which
        hold the GIL little. The feed itself (windows, shuffle, cutting batches) runs in the
        caller's thread, unless a transform is set: then it runs a batch or more ahead in a
        thread of its own, ``ReadOptions.prefetch`` batches and at most ``prefetch_bytes``
        (see :func:`ingest.engine.prefetch.read_ahead`), so that the transform overlaps the
        consumer's step; with one lane, that thread reads the lane too. Without a transform,
        a thread for the feed costs more than it overlaps: it and the consumer take turns at
        the GIL for every batch (an unshuffled local Stream, 32 Parquet shards in the page
        cache: 1.12 -> 1.74 M rows/s, and 0.94 -> 0.73 us of CPU per row, without it)."""
        read = self.config.read
        depth = read.prefetch if self.transform is not None else 0
        if depth and len(self._lanes) == 1:
            self._reader.depth = 0
        if not depth:  # no thread of its own: the first window's lanes start reading now,
            # before its first batch is asked for (a mixture starts its sources so, side by
            # side: Stream's loop start); a feed thread starts them as it begins
            self._reader.start(self._lanes)
        return read_ahead(
            self,
            depth,
            read.timeout_s,
            name,
            max_bytes=read.prefetch_bytes,
            size=item_bytes,
        )

    # -- windows and batches ---------------------------------------------------------------

    def _cursor(self, window: int) -> Cursor:
        return {"window": window, "lanes": [lane.cursor() for lane in self._lanes]}

    def _windows(self) -> Iterator[Window]:
        index = int(self.plan.cursor["window"]) if self.plan.cursor else 0
        per_lane = max(1, self._window_rows // len(self._lanes))
        while any(lane.at is not None for lane in self._lanes):
            start = self._cursor(index)
            self._reader.start(self._lanes)  # every lane reads while the first is taken
            pieces: list[tuple[Span, Piece]] = []
            for lane in self._lanes:
                pieces.extend(self._reader.take(lane, per_lane if index else self._first(lane)))
            if not pieces:
                break
            yield self._window(index, start, self._cursor(index + 1), pieces)
            index += 1

    def _first(self, lane: Lane) -> int:
        """Rows ``lane`` gives the first window: its share of the window; or all the rows
        carried into the epoch it holds (they lead its spans), so that every carried row of
        the rank is in the first window, where it goes first (:meth:`_window`); or, where
        the lane begins with the rest of a unit consumed in part (a share cut anew from a
        state taken inside windows: :func:`~ingest.engine.lanes.unit_rest`), that rest
        alone when it is less than the share: one row group read for the first batch, as
        in a fresh epoch, not two."""
        spans, carried = self.plan.spans, 0
        share = max(1, self._window_rows // len(self._lanes))
        for k in lane.spans:
            if spans[k].segment != CARRY:
                break
            carried += spans[k].rows
        if carried:
            return max(carried, share)
        rest = unit_rest(self.plan, lane.spans)
        return share if rest is None else max(1, min(rest, share))

    def _window(
        self, index: int, start: Cursor, end: Cursor, pieces: list[tuple[Span, Piece]]
    ) -> Window:
        data = [b.data for _, b in pieces if not isinstance(b, Hole)]
        # One table of every piece, the schema's metadata dropped once: from_batches keeps
        # the first batch's and does not compare them (per piece, it cost 0.15 s of a first
        # batch after a resume inside a window, thousands of pieces a few rows long).
        table = pa.Table.from_batches(data).replace_schema_metadata(None) if data else self._empty()
        origin, keys = Origin.of(pieces)
        take: npt.NDArray[np.int64] | None = None
        if self.config.seed is not None:
            take = permutation(
                len(keys), "window", self.config.seed, self.plan.epoch, self.plan.rank, index
            )
            if index == 0:  # the rows carried in lead the epoch: its first steps, never its end
                carried = origin.segments[origin.pieces[keys]] == CARRY
                if carried.any():
                    take = take[np.argsort(~carried[take], kind="stable")]
        seen = self._consumed(origin)
        if seen is not None:
            fresh = ~seen[keys]
            if self._deriving is not None:  # rows a resume leaves out: their units may go
                with_data = _with_data(pieces)
                self._deriving.release(refs_of(table)[~fresh[with_data]])
            take = np.flatnonzero(fresh) if take is None else take[fresh[take]]
        if len(data) < len(pieces):  # holes (quarantined rows): rare
            return self._with_holes(index, start, end, pieces, table, origin, keys, take)
        # The pieces' bytes, known already (RowBatch.nbytes): the table's own nbytes walks
        # every chunk, thousands of slices after a resume inside a window (0.25 s).
        nbytes = sum(b.nbytes for _, b in pieces if not isinstance(b, Hole))
        if take is not None and nbytes > self._gather_bytes:
            # Large rows: each batch gathers its own (see _GATHER_BYTES).
            return Window(index, start, end, table, keys[take], origin, order=take, nbytes=nbytes)
        if take is not None:
            # One gather for the whole window; batches are slices of it.
            table, keys = table.take(indices(take)), keys[take]
        return Window(index, start, end, table, keys, origin, nbytes=nbytes)

    @staticmethod
    def _with_holes(
        index: int,
        start: Cursor,
        end: Cursor,
        pieces: list[tuple[Span, Piece]],
        table: pa.Table,
        origin: Origin,
        keys: npt.NDArray[np.int64],
        take: npt.NDArray[np.int64] | None,
    ) -> Window:
        """The window of :meth:`_window` in delivery order ``take`` (None: reading order)
        where some positions are holes: the table holds only the rows that are not."""
        sizes = [piece_rows(b) for _, b in pieces if piece_rows(b)]
        holes = np.repeat([isinstance(b, Hole) for _, b in pieces if piece_rows(b)], sizes)
        row = np.cumsum(~holes) - 1  # the table row of each position in reading order
        if take is not None:
            holes, keys, row = holes[take], keys[take], row[take]
        table = table.take(indices(row[~holes]))
        before = np.concatenate(([0], np.cumsum(~holes))).astype(np.int64)
        return Window(index, start, end, table, keys, origin, holes, before, nbytes=table.nbytes)

    def _empty(self) -> pa.Table:
        """A table of no rows with the window's columns (a window made only of holes)."""
        if self._deriving is not None:
            return pa.schema([pa.field(REF, pa.int64())]).empty_table()
        return self._empty_input()

    def _empty_input(self) -> pa.Table:
        """A table of no rows with the stream's columns."""
        schema = self.plan.listing.schema
        if schema is None:
            return pa.table({})
        if self.config.columns is not None:
            fields = [schema.field(c) for c in self.config.columns if c in schema.names]
            schema = pa.schema(fields)
        return schema.empty_table()

    def _consumed(self, origin: Origin) -> npt.NDArray[np.bool_] | None:
        """Per key of ``origin``, whether its row was consumed; None when none was."""
        skip = dict(zip((CARRY, MAIN), self.plan.skip, strict=True))
        seen: npt.NDArray[np.bool_] | None = None
        pieces = zip(
            origin.segments.tolist(),
            origin.shards.tolist(),
            origin.starts.tolist(),
            origin.sizes.tolist(),
            origin.offsets.tolist(),
            strict=True,
        )
        for segment, shard, start, size, offset in pieces:
            done = skip[segment].get(shard)
            if done:
                if seen is None:
                    seen = np.zeros(len(origin.pieces), dtype=bool)
                rows = np.arange(start + offset, start + offset + size, dtype=np.int64)
                seen[start : start + size] = done.contains_many(rows)
        return seen if seen is not None and seen.any() else None

    @property
    def held_bytes(self) -> int:
        """Bytes of rows this feed holds now: windows not yet cut into batches, and the
        lanes' rows read and not given (their read-ahead included)."""
        windows = sum(w.nbytes for w, _, _ in list(self._held))
        return windows + sum(lane.held_bytes() for lane in self._lanes)

    def __iter__(self) -> Iterator[Ready | Tail]:
        """The feed's batches, transformed (up to the transform's ``parallel_batches`` at
        once, in order: see :class:`ingest.engine.stage.Stage`), then its :class:`Tail`."""
        calls = parallel_batches(self.transform)
        yield from in_order(self._transformed, self._items(), calls, "transform")

    def _items(self) -> Iterator[tuple[Ready | Tail, list[tuple[Window, int, int]]]]:
        """The batches cut, not transformed, each with the window rows it was cut from."""
        size = self.config.batch_size
        step = self.plan.next_step
        held = self._held  # (window, start, stop) of rows not yet cut
        held_rows = 0
        try:
            for window in self._windows():
                if window.size:
                    held.append((window, 0, window.size))
                    held_rows += window.size
                self.peak_bytes = max(self.peak_bytes, self.held_bytes)
                while held_rows >= size:
                    yield self._cut(held, size, step)
                    held_rows -= size
                    step += 1
                for w, lo, _ in held:  # less than a batch: copied, so the tables go
                    w.compact(lo)
                del window
            leftover = self._runs(held)
            steps = step - self.plan.next_step
            if self.plan.steps is not None and (steps != self.plan.steps or len(leftover)):
                raise IngestError(
                    f"rank {self.plan.rank} read {steps} full batches and "
                    f"{int((leftover[:, 3] - leftover[:, 2]).sum())} more rows in epoch "
                    f"{self.plan.epoch}, "
                    f"planned {self.plan.steps} batches exactly; a shard changed while it was "
                    "read (its row count differs from the listing). Restart the epoch"
                )
            yield Tail(steps, leftover, dict(self._reader.learned), self.quarantine.take()), []
        finally:
            self.close()

    def _cut(
        self, held: list[tuple[Window, int, int]], size: int, step: int
    ) -> tuple[Ready, list[tuple[Window, int, int]]]:
        parts: list[tuple[Window, int, int]] = []
        need = size
        while need:
            window, lo, hi = held[0]
            n = min(need, hi - lo)
            parts.append((window, lo, lo + n))
            need -= n
            if lo + n == hi:
                held.pop(0)
            else:
                held[0] = (window, lo + n, hi)
        cursor = held[0][0].start if held else window.end
        tables = [w.rows(lo, hi) for w, lo, hi in parts]
        table: Any = (pa.concat_tables(tables) if len(tables) > 1 else tables[0]).combine_chunks()
        acked = self._acked(parts)
        closed = None
        if acked.ndim == 1:
            done = [w.origin.all_runs() for w, _, hi in parts if hi == w.size]
            last, lo, hi = parts[-1]
            closed = Closed(
                np.concatenate(done) if done else as_runs(()), 0 if hi == last.size else hi - lo
            )
        rows = int(table.num_rows)  # fewer than the batch size where it held holes
        rows = -1 if rows == size else rows
        return Ready(step, table, acked, cursor, self.quarantine.take(), rows, closed), parts

    def _transformed(self, cut: tuple[Ready | Tail, list[tuple[Window, int, int]]]) -> Ready | Tail:
        """A batch with the transform applied (in a thread of :func:`in_order`); its
        quarantines (``on_error="skip"``) go with it."""
        item, parts = cut
        if isinstance(item, Tail):
            return item
        if self.transform is None:
            self._refuse_nulls(item.table, parts, None)
            return item
        size = self.config.batch_size
        if self._batches is not None:
            out = self._batches.outputs(item.table, item.step, lambda i: self._origin_of(parts, i))
            self._refuse_nulls(out.table, parts, item.step)
            return replace(
                item,
                table=out.table,
                quarantined=(*item.quarantined, *out.quarantined),
                rows=-1 if out.rows == size else out.rows,
            )
        table = item.table
        rows = int(table.num_rows)
        failed: list[Quarantined] = []
        try:
            table = self.transform(table)
        except RowError as e:  # a stage refused a row of the batch: name its shard and row
            url, row = self._origin_of(parts, e.row)
            raise e.at(url, row) from e
        except UndecodedMemberError as e:  # a decoder named a member: name its shard and row
            if not self._skip:
                url, row = self._origin_of(parts, e.batch_row)
                raise e.at(url, row) from None
            table, rows, failed = self._split(self.transform, table, parts, rows)
        except Exception as e:
            if not self._skip:
                self._note_shards(e, parts)
                raise
            if skippable(e):  # a data error (a file that does not decode): its rows alone
                table, rows, failed = self._split(self.transform, table, parts, rows)
            else:
                failed.append(self.quarantine.record(e, step=item.step, rows=rows))
                table, rows = output_of_no_rows(self.transform, table), 0
        self._refuse_nulls(table, parts, item.step)
        quarantined = (*item.quarantined, *failed)
        return replace(
            item, table=table, quarantined=quarantined, rows=-1 if rows == size else rows
        )

    def _split(
        self,
        transform: Callable[[pa.Table], Any],
        table: pa.Table,
        parts: Sequence[tuple[Window, int, int]],
        rows: int,
    ) -> tuple[Any, int, list[Quarantined]]:
        """``transform`` over the rows of ``table`` it does not fail on, the number of them,
        and a quarantine for each row it fails on, named by its shard URL and row
        (``on_error="skip"``; :func:`split_failures`)."""
        out, bad = split_failures(transform, table)
        failed: list[Quarantined] = []
        for index, error in bad:
            url, row = self._origin_of(parts, index)
            named = error.at(url, row) if isinstance(error, UndecodedMemberError) else error
            failed.append(self.quarantine.record(named, url=url, start=row, stop=row + 1, rows=1))
        return out, rows - len(bad), failed

    def _refuse_nulls(
        self, table: pa.Table, parts: Sequence[tuple[Window, int, int]], step: int | None
    ) -> None:
        """Raise for a null that no torch tensor holds (:func:`refused_null`), naming where it
        came from: its shard and row, or after a transform (``step``), whose rows need not be
        the batch's, the step and the shards of the batch. Not for documents a packer
        regroups (they carry :data:`ORIGIN`): it makes tensors of its own columns only."""
        if ORIGIN in table.column_names:
            return
        found = refused_null(table)
        if found is None:
            return
        name, kind, index = found
        if step is None:
            url, row = self._origin_of(parts, index)
            raise ConfigError(
                f"{url} row {row}: column {name!r} ({kind}) is null, and no torch tensor "
                f"holds a null; {NULL_FIX}"
            )
        shards = np.unique(
            np.concatenate([w.origin.locate(w.keys[lo:hi])[1] for w, lo, hi in parts])
        )
        urls = [self.plan.listing.shards[int(s)].url for s in shards[:3]]
        more = f" and {len(shards) - 3} more" if len(shards) > 3 else ""
        raise ConfigError(
            f"column {name!r} ({kind}) is null in row {index} of the transform's output for "
            f"step {step} (rows of {', '.join(urls)}{more}), and no torch tensor holds a null; "
            f"fill it in the transform, or cast the column to float"
        )

    def _origin_of(self, parts: Sequence[tuple[Window, int, int]], index: int) -> tuple[str, int]:
        """The shard URL and row of row ``index`` of the batch cut from ``parts``."""
        for w, lo, hi in parts:
            keys = w.keys[lo:hi] if w.holes is None else w.keys[lo:hi][~w.holes[lo:hi]]
            if index < len(keys):
                _, shard, row = w.origin.locate(keys[index : index + 1])
                return self.plan.listing.shards[int(shard[0])].url, int(row[0])
            index -= len(keys)
        raise IndexError(f"row {index} is past the batch")  # pragma: no cover

    def _note_shards(self, error: Exception, parts: Sequence[tuple[Window, int, int]]) -> None:
        """Name in a note the shards the batch cut from ``parts`` was read from, on a
        :class:`ConfigError` a stage raised of the whole batch (a column that is not text):
        it named no shard. (Another error's note names its stage: :func:`stage.noted`.)"""
        if isinstance(error, ConfigError):
            error.add_note(f"(the batch was read from {self._shards_of(parts)})")

    def _shards_of(self, parts: Sequence[tuple[Window, int, int]], most: int = 3) -> str:
        """The URLs of the shards the batch cut from ``parts`` was read from (``most`` of
        them, then how many more)."""
        shards: list[int] = []
        for w, lo, hi in parts:
            keys = w.keys[lo:hi] if w.holes is None else w.keys[lo:hi][~w.holes[lo:hi]]
            if len(keys):
                shards += np.unique(w.origin.locate(keys)[1]).tolist()
        urls = list(dict.fromkeys(self.plan.listing.shards[s].url for s in shards))
        more = f" and {len(urls) - most} more" if len(urls) > most else ""
        return ", ".join(urls[:most]) + more

    @staticmethod
    def _acked(parts: Sequence[tuple[Window, int, int]]) -> Runs | Rows:
        """The rows of ``parts`` as the rank acks them: packed rows when they pack (a gather
        and an add per row; no sort here, the fold sorts once), else runs."""
        packed = [w.origin.packed(w.keys[lo:hi]) for w, lo, hi in parts]
        if len(packed) == 1 and packed[0] is not None:
            return packed[0]
        if all(p is not None for p in packed):
            return np.concatenate([p for p in packed if p is not None])
        return Feed._runs(parts)

    @staticmethod
    def _runs(parts: Sequence[tuple[Window, int, int]]) -> Runs:
        """The runs of rows ``lo:hi`` of each window of ``parts``."""
        if len(parts) == 1:
            window, lo, hi = parts[0]
            return window.origin.runs(window.keys[lo:hi])
        if not parts:
            return as_runs(())
        located = [w.origin.locate(w.keys[lo:hi]) for w, lo, hi in parts]
        return runs_of(*(np.concatenate(column) for column in zip(*located, strict=True)))

    def close(self) -> None:
        """Stop the lanes' reader threads and let go of the rows held."""
        self._held.clear()
        if self._deriving is not None:
            self._deriving.close()
        for lane in self._lanes:
            if lane.reader is not None:
                # (a feed left open at exit was closed by _close_live_feeds, modules whole)
                with contextlib.suppress(Exception):  # a reader that fails to close goes
                    close = getattr(lane.reader, "close", None)
                    if close is not None:
                        close()
                lane.reader = None
            lane.pending = None


_LIVE: weakref.WeakSet[Feed] = weakref.WeakSet()
"""Feeds made in this process and not collected yet (:func:`_close_live_feeds`)."""


@atexit.register
def _close_live_feeds() -> None:
    """Close the feeds still open as the interpreter exits (a script or a kernel that
    stopped iterating a stream), while their modules are whole. Left to the collector, their
    lanes' readers (generators of the caller's thread without read-ahead) are closed as the
    modules are torn down, and every ``except`` naming a module's exception (``pa.ArrowInvalid``)
    printed an "Exception ignored" traceback."""
    for feed in list(_LIVE):
        with contextlib.suppress(Exception):  # exiting: a feed that fails to close goes
            feed.close()


def _with_data(pieces: Sequence[tuple[Span, Piece]]) -> npt.NDArray[np.bool_]:
    """Per window position in reading order, whether it has a row (is not a hole)."""
    sized = [(not isinstance(b, Hole), piece_rows(b)) for _, b in pieces if piece_rows(b)]
    return np.repeat([d for d, _ in sized], [n for _, n in sized]).astype(bool)


__all__ = ["Feed", "FeedConfig", "Ready", "Tail", "item_bytes"]
