"""The single-process stream: shards -> plan -> shuffle windows -> torch batches.

Reading order is a pure function of (listing, seed, epoch): units come from
:func:`ingest.plan.epoch_units`; with a seed, rows are then shuffled in windows of
``shuffle_buffer`` consecutive rows, each permuted by a key of (seed, epoch, window index).
The state records the consumed rows of every shard and where the oldest window with rows
still to deliver starts, so a restored stream seeks there, rebuilds that window, drops what
was delivered, and continues with exactly the batches the uninterrupted run would have
produced. Exactly-once rests on the consumed rows alone, not on that replay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest._prefetch import Prefetcher
from ingest.catalog import Catalog, Listing
from ingest.convert import Batch, to_torch
from ingest.errors import ConfigError, StateError
from ingest.formats import get_format
from ingest.formats.base import ReadOptions, RowBatch, Seek
from ingest.plan import Unit, epoch_units, permutation
from ingest.sources import Source
from ingest.state import Progress, StreamState, match_listing

Transform = Callable[[pa.Table], "pa.Table | pa.RecordBatch | Mapping[str, Any]"]


@dataclass(frozen=True, slots=True)
class _Position:
    """A place in the epoch's read order: row ``row`` of unit ``unit``."""

    unit: int
    row: int
    seek: Seek | None

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "row": self.row,
            "seek": None if self.seek is None else list(self.seek),
        }


@dataclass(frozen=True, slots=True)
class _Piece:
    unit: int
    shard: int
    batch: RowBatch


@dataclass(frozen=True, slots=True)
class _ShardEnd:
    shard: int
    rows: int


@dataclass(slots=True)
class _Window:
    """Rows in delivery order with their provenance, and how many were delivered."""

    index: int
    start: _Position
    table: pa.Table
    shards: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]
    runs: list[tuple[int, int, int]]  # (shard, start, stop) of every row read, kept or not
    taken: int = 0
    delivered: int = 0

    @property
    def size(self) -> int:
        return len(self.rows)


@dataclass(slots=True)
class _Epoch:
    listing: Listing
    units: list[Unit]
    progress: Progress
    delivered: int = 0
    dropped: int = 0
    complete: bool = False
    open: deque[_Window] = field(default_factory=deque)
    next_window: tuple[int, _Position] = (0, _Position(0, 0, None))


class Stream:
    """Batches of torch tensors from fsspec shards, in one process, resumable exactly.

    One ``for`` loop over the stream is one epoch; the next loop runs the next epoch in a new
    seeded order. A loop left early continues, on the next ``for``, where it stopped.

    Args:
        source: URL, glob or directory, or a list of them (any fsspec protocol).
        format: Format name for every shard; None infers it from each file's extension.
        columns: Columns to read; None reads all.
        batch_size: Rows per batch.
        shuffle_seed: Seed for shard, block and row order; None reads in listing order.
        shuffle_buffer: Rows per shuffle window when ``shuffle_seed`` is set; memory is about
            this many rows.
        drop_last: Drop (and count) a last batch smaller than ``batch_size``.
        storage_options: fsspec options for the store (endpoint, credentials). Never saved
            in the state and never logged.
        read: How shards are read (block sizes, prefetch, explicit schema).
        transform: Called on each batch as an Arrow table before conversion to torch; may
            return a table, a record batch or a dict of numpy arrays/tensors.
        progress: Show a progress bar while footers are read at listing time.
    """

    def __init__(
        self,
        source: str | Sequence[str],
        *,
        format: str | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
        shuffle_seed: int | None = None,
        shuffle_buffer: int = 16_384,
        drop_last: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        read: ReadOptions | None = None,
        transform: Transform | None = None,
        progress: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        if shuffle_buffer < 1:
            raise ConfigError(f"shuffle_buffer={shuffle_buffer} must be >= 1 row")
        if columns is not None and (isinstance(columns, str) or not columns):
            raise ConfigError(f"columns={columns!r} must be a non-empty list of names, or None")
        if shuffle_seed is not None and (not isinstance(shuffle_seed, int) or shuffle_seed < 0):
            raise ConfigError(f"shuffle_seed={shuffle_seed!r} must be a non-negative int or None")
        if format is not None:
            get_format(format)
        self.batch_size = batch_size
        self.shuffle_seed = shuffle_seed
        self.shuffle_buffer = shuffle_buffer
        self.drop_last = drop_last
        self.columns = list(columns) if columns is not None else None
        self.read_options = read or ReadOptions()
        self.transform = transform
        self._source = Source(source, storage_options=storage_options, format=format)
        self._catalog = Catalog(self._source, self.read_options, self.columns)
        self._progress_bar = progress
        self._epoch_index = 0
        self._epoch: _Epoch | None = None
        self._hint: dict[str, Any] | None = None
        self._active: Iterator[Batch] | None = None

    # -- public ----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch in progress, or the next one to run."""
        return self._epoch_index

    @property
    def stats(self) -> dict[str, int]:
        """Requests sent to the store and rows delivered in the current epoch."""
        epoch = self._epoch
        return {
            **self._source.stats.as_dict(),
            "rows_delivered": epoch.delivered if epoch else 0,
            "rows_dropped": epoch.dropped if epoch else 0,
        }

    def listing(self) -> Listing:
        """List the source now (one listing; footers read once per shard)."""
        return self._catalog.scan(progress=self._progress_bar)

    def __iter__(self) -> Iterator[Batch]:
        if self._active is not None:
            # A loop left early: fold what it delivered into the state and resume from it.
            snapshot = self.state_dict()
            self._close_active()
            self._restore(
                StreamState.from_json(snapshot), self._epoch.listing if self._epoch else None
            )
        if self._epoch is None or self._epoch.complete:
            if self._epoch is not None:
                self._epoch_index += 1
            listing = self.listing()
            self._epoch = self._new_epoch(listing, Progress())
            self._hint = None
        self._active = self._run(self._epoch)
        return self._active

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable state; see :mod:`ingest.state` for its layout."""
        epoch = self._epoch
        if epoch is None:
            listing = self.listing()
            epoch = self._epoch = self._new_epoch(listing, Progress())
        if epoch.complete:
            state = StreamState(
                list(self._source.urls),
                epoch.listing.records(),
                self.shuffle_seed,
                self._epoch_index + 1,
                1,
                Progress(),
            )
            return state.to_json()
        progress = epoch.progress.copy()
        for window in epoch.open:
            _add_rows(progress, window.shards[: window.delivered], window.rows[: window.delivered])
        if epoch.open:
            index, position = epoch.open[0].index, epoch.open[0].start
        else:
            index, position = epoch.next_window
        resume = {
            "window": index,
            **position.to_json(),
            "buffer": self._window_rows(),
            "units": len(epoch.units),
        }
        return StreamState(
            list(self._source.urls),
            epoch.listing.records(),
            self.shuffle_seed,
            self._epoch_index,
            1,
            progress,
            epoch.delivered,
            resume,
        ).to_json()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly after ``state``: rows it consumed are never delivered again.

        Raises:
            StateError: If the state is of another version, another seed, or a dataset whose
                shards are gone or changed (new shards are accepted and join next epoch).
        """
        parsed = StreamState.from_json(state)
        if parsed.carry:
            raise StateError(
                f"the state carries {len(parsed.carry)} span(s) of rows from the previous epoch "
                "of a distributed stream (equal steps per rank); resume it with ingest.RayStream"
            )
        if parsed.seed != self.shuffle_seed:
            raise StateError(
                f"the state was saved with shuffle_seed={parsed.seed}, this stream "
                f"has shuffle_seed={self.shuffle_seed}; create the stream with "
                "the same seed to resume it"
            )
        self._close_active()
        self._restore(parsed, None)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop background reading. Iterating again resumes where the stream stopped."""
        if self._active is not None:
            snapshot = self.state_dict()
            self._close_active()
            self._restore(
                StreamState.from_json(snapshot), self._epoch.listing if self._epoch else None
            )

    # -- epoch setup -----------------------------------------------------------------------

    def _restore(self, state: StreamState, listing: Listing | None) -> None:
        if listing is None:
            listing = self.listing()
            match_listing(state.shards, listing.records())
        if state.started:
            # The rest of an epoch reads the shards it started with; new ones join next epoch.
            listing = listing.subset([s.url for s in state.shards])
        self._epoch_index = state.epoch
        self._epoch = self._new_epoch(listing, state.progress)
        self._epoch.delivered = state.delivered
        self._hint = state.resume

    def _new_epoch(self, listing: Listing, progress: Progress) -> _Epoch:
        units = epoch_units(listing.plan_shards(), self.shuffle_seed, self._epoch_index)
        return _Epoch(listing, units, progress)

    def _close_active(self) -> None:
        if self._active is not None:
            close = getattr(self._active, "close", None)
            if close is not None:
                close()
            self._active = None

    def _window_rows(self) -> int:
        return self.shuffle_buffer if self.shuffle_seed is not None else 0

    def _start(self, epoch: _Epoch) -> tuple[int, _Position]:
        hint = self._hint
        if (
            hint
            and hint.get("buffer") == self._window_rows()
            and hint.get("units") == len(epoch.units)
        ):
            seek = hint.get("seek")
            return int(hint["window"]), _Position(
                int(hint["unit"]), int(hint["row"]), None if seek is None else (seek[0], seek[1])
            )
        return 0, _Position(0, 0, None)

    # -- the epoch -------------------------------------------------------------------------

    def _run(self, epoch: _Epoch) -> Iterator[Batch]:
        frozen = epoch.progress.copy()  # rows consumed before this run: filtered out
        window_index, start = self._start(epoch)
        epoch.next_window = (window_index, start)
        depth = self.read_options.prefetch
        pieces: Iterator[_Piece | _ShardEnd]
        if depth:
            pieces = Prefetcher(
                lambda: self._read(epoch, start, frozen),
                depth,
                self.read_options.timeout_s,
                f"shards of {self._source.urls[0]}",
            )
        else:
            pieces = self._read(epoch, start, frozen)
        carry: list[tuple[pa.Table, _Window]] = []
        carried = 0
        try:
            for window in self._windows(epoch, pieces, window_index, start, frozen):
                epoch.open.append(window)
                if window.size == 0:
                    self._settle(epoch, [(window, 0)])
                while window.taken < window.size:
                    n = min(self.batch_size - carried, window.size - window.taken)
                    carry.append((window.table.slice(window.taken, n), window))
                    window.taken += n
                    carried += n
                    if carried == self.batch_size:
                        yield self._deliver(epoch, carry)
                        carry, carried = [], 0
            if carry:
                if self.drop_last:
                    epoch.dropped += carried
                    self._settle(epoch, [(w, t.num_rows) for t, w in carry])
                else:
                    yield self._deliver(epoch, carry)
            epoch.complete = True
        finally:
            if isinstance(pieces, Prefetcher):
                pieces.close()
            if self._active is not None and epoch.complete:
                self._active = None

    def _deliver(self, epoch: _Epoch, carry: list[tuple[pa.Table, _Window]]) -> Batch:
        table = pa.concat_tables([t for t, _ in carry]) if len(carry) > 1 else carry[0][0]
        self._settle(epoch, [(w, t.num_rows) for t, w in carry])
        epoch.delivered += table.num_rows
        out: Any = table.combine_chunks()
        if self.transform is not None:
            out = self.transform(out)
        return to_torch(out)

    def _settle(self, epoch: _Epoch, taken: list[tuple[_Window, int]]) -> None:
        """Count rows as delivered; commit windows whose rows are all delivered."""
        for window, n in taken:
            window.delivered += n
        while (
            epoch.open
            and epoch.open[0].delivered == epoch.open[0].size
            and epoch.open[0].taken == epoch.open[0].size
        ):
            done = epoch.open.popleft()
            for shard, lo, hi in done.runs:
                epoch.progress.of(shard).add(lo, hi)

    def _read(
        self, epoch: _Epoch, start: _Position, frozen: Progress
    ) -> Iterator[_Piece | _ShardEnd]:
        """Every row of the epoch from ``start`` on, in plan order; one reader per shard.

        The units of one shard are adjacent in the plan and go to the reader in one call,
        so that a format with random access can fetch their bytes together.
        """
        listing, records, units = epoch.listing, epoch.listing.records(), epoch.units

        def skip(unit: Unit) -> bool:
            if frozen.is_done(unit.shard, records):
                return True
            consumed = frozen.consumed.get(unit.shard)
            return (
                unit.stop is not None
                and consumed is not None
                and consumed.covers(unit.start, unit.stop)
            )

        ui = start.unit
        while ui < len(units):
            shard = units[ui].shard
            run = []
            while ui < len(units) and units[ui].shard == shard:
                if not skip(units[ui]):
                    run.append(ui)
                ui += 1
            if not run:
                continue
            spans = [(units[k].start, units[k].stop) for k in run]
            seek = None
            if run[0] == start.unit:
                spans[0] = (max(spans[0][0], start.row), spans[0][1])
                seek = start.seek
            ctx = listing.context(shard, self._source, self.read_options, self.columns)
            last = [s for s, _ in spans]
            with get_format(ctx.shard.format).open(ctx) as reader:
                for index, batch in reader.read_spans(spans, seek):
                    yield _Piece(run[index], shard, batch)
                    last[index] = batch.stop
            for index, (_, stop) in enumerate(spans):
                if stop is None:
                    yield _ShardEnd(shard, last[index])

    def _windows(
        self,
        epoch: _Epoch,
        pieces: Iterator[_Piece | _ShardEnd],
        index: int,
        start: _Position,
        frozen: Progress,
    ) -> Iterator[_Window]:
        size = self._window_rows()
        pending: list[_Piece] = []
        pending_rows = 0
        for item in pieces:
            if isinstance(item, _ShardEnd):
                epoch.progress.rows[item.shard] = item.rows
                continue
            piece = item
            if size == 0:
                end = _Position(piece.unit, piece.batch.stop, piece.batch.seek)
                yield self._window(index, start, [piece], frozen)
                index, start = index + 1, end
                epoch.next_window = (index, start)
                continue
            while piece.batch.data.num_rows:
                n = min(size - pending_rows, piece.batch.data.num_rows)
                head, piece = _split(piece, n)
                pending.append(head)
                pending_rows += n
                if pending_rows == size:
                    end = _Position(head.unit, head.batch.stop, head.batch.seek)
                    yield self._window(index, start, pending, frozen)
                    index, start, pending, pending_rows = index + 1, end, [], 0
                    epoch.next_window = (index, start)
        if pending:
            yield self._window(index, start, pending, frozen)

    def _window(
        self, index: int, start: _Position, pieces: list[_Piece], frozen: Progress
    ) -> _Window:
        batches = [p.batch.data.replace_schema_metadata(None) for p in pieces]
        table = pa.Table.from_batches(batches)
        shards = np.concatenate(
            [np.full(p.batch.data.num_rows, p.shard, dtype=np.int64) for p in pieces]
        )
        rows = np.concatenate(
            [np.arange(p.batch.row, p.batch.stop, dtype=np.int64) for p in pieces]
        )
        runs = [(p.shard, p.batch.row, p.batch.stop) for p in pieces]
        if self.shuffle_seed is not None:
            order = permutation(len(rows), "rows", self.shuffle_seed, self._epoch_index, index)
            table, shards, rows = table.take(order), shards[order], rows[order]
        if frozen.consumed:
            seen = np.zeros(len(rows), dtype=bool)
            for shard in np.unique(shards).tolist():
                done = frozen.consumed.get(shard)
                if done:
                    mask = shards == shard
                    seen[mask] = done.contains_many(rows[mask])
            if seen.any():
                keep = np.nonzero(~seen)[0]
                table, shards, rows = table.take(keep), shards[keep], rows[keep]
        return _Window(index, start, table, shards, rows, runs)


def _split(piece: _Piece, n: int) -> tuple[_Piece, _Piece]:
    b = piece.batch
    head = RowBatch(b.row, b.data.slice(0, n), b.seek)
    tail = RowBatch(b.row + n, b.data.slice(n), b.seek)
    return _Piece(piece.unit, piece.shard, head), _Piece(piece.unit, piece.shard, tail)


def _add_rows(
    progress: Progress, shards: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]
) -> None:
    for shard in np.unique(shards).tolist():
        progress.of(shard).add_rows(rows[shards == shard])
