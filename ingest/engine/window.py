"""A feed's shuffle window and what it is made of: the pieces its lanes read, where each
row came from (:class:`Origin`: keys that turn a batch's rows into packed rows or runs), and
the window's positions in delivery order (:class:`Window`). See :mod:`ingest.engine.feed`."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.assign import Span
from ingest.core.intervals import rows_of_runs
from ingest.core.ledger import Rows, Runs, as_runs, pack_base
from ingest.core.state import Cursor
from ingest.formats.base import Gathered, RowBatch, Seek, indices


@dataclass(frozen=True, slots=True)
class SpanEnd:
    span: int
    shard: int
    rows: int


@dataclass(frozen=True, slots=True)
class Hole:
    """Rows ``[row, row + size)`` of a span that are quarantined: positions without data."""

    row: int
    size: int
    seek: Seek | None = None

    @property
    def stop(self) -> int:
        return self.row + self.size


Piece = RowBatch | Gathered | Hole


def read_whole(span: tuple[int, int | None], last: int) -> bool:
    """Whether a range ``[start, stop)`` has been read up to its stop (``last``)."""
    return span[1] is not None and last >= span[1]


def piece_rows(piece: Piece) -> int:
    return piece.size if isinstance(piece, Hole) else int(piece.data.num_rows)


def piece_at(piece: Piece, span: int) -> tuple[int, int]:
    """``(span, row)`` where a lane that handed out ``piece`` whole goes on: the span of
    its last row (``span``, that of its first, for a piece of one span) and the row after."""
    if isinstance(piece, Gathered):
        return int(piece.spans[-1]), piece.stop
    return span, piece.stop


def head_of(piece: Piece, n: int) -> Piece:
    if isinstance(piece, Hole):
        return Hole(piece.row, n)
    return piece.slice(0, n)


def rest_of(piece: Piece, n: int) -> Piece:
    if isinstance(piece, Hole):
        return Hole(piece.row + n, piece.size - n)
    return piece.slice(n, piece_rows(piece) - n)


def read_bytes(item: tuple[int, Piece] | SpanEnd) -> int:
    """Bytes of what a lane's reader yields."""
    if isinstance(item, SpanEnd) or isinstance(item[1], Hole):
        return 0
    return item[1].nbytes


@dataclass(slots=True)
class Lane:
    """A lane: its spans in order, where it stands, and the rows it read but did not give."""

    spans: list[int]
    reader: Iterator[tuple[int, Piece] | SpanEnd] | None = None
    at: tuple[int, int, Seek | None] | None = None  # (lane span index, row, seek); None: done
    pending: tuple[int, Piece] | None = None

    def cursor(self) -> list[int | None] | None:
        if self.at is None:
            return None
        k, row, seek = self.at
        return [k, row, None if seek is None else seek[0], None if seek is None else seek[1]]

    def held_bytes(self) -> int:
        """Bytes of the rows read and not given yet: the pending piece and the read-ahead."""
        pending = self.pending
        held = 0 if pending is None else read_bytes(pending)
        return held + int(getattr(self.reader, "held_bytes", 0))


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the rows of a window come from: its pieces in ``(segment, shard, row)`` order.

    A window row is known by its *key*, its place in that order, with one key left unused
    between two pieces whose rows do not follow each other. Consecutive keys are then
    consecutive rows of one shard, so the rows of a batch become runs with one integer sort
    of their keys, not a sort by three columns. Piece ``p`` holds keys
    ``starts[p] : starts[p] + sizes[p]``, and key ``k`` of it is row ``k + offsets[p]``.
    """

    segments: npt.NDArray[np.int64]
    shards: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    pieces: npt.NDArray[np.int64]
    """The piece of each key."""
    base: Rows | None
    """Per piece, the packed row of key 0 (:func:`ingest.core.ledger.pack_base`); None if the
    rows do not pack."""

    @staticmethod
    def of(pieces: Sequence[tuple[Span, Piece]]) -> tuple[Origin, npt.NDArray[np.int64]]:
        """The origin of ``pieces`` and the key of each of their rows, in reading order.

        A :class:`~ingest.formats.base.Gathered` piece counts as its runs of consecutive
        rows (all of one segment and shard: a lane gathers the spans of one run)."""
        segments, shards, firsts, sizes = _runs_of(pieces)
        if len(sizes) and not sizes.all():
            kept = sizes > 0
            segments, shards, firsts, sizes = (
                segments[kept],
                shards[kept],
                firsts[kept],
                sizes[kept],
            )
        by_key = np.lexsort((firsts, shards, segments))
        segments, shards, firsts = segments[by_key], shards[by_key], firsts[by_key]
        sizes_k = sizes[by_key]
        gaps = np.ones(len(sizes), dtype=np.int64)
        gaps[:1] = 0
        gaps[1:] -= (
            (segments[1:] == segments[:-1])
            & (shards[1:] == shards[:-1])
            & (firsts[1:] == firsts[:-1] + sizes_k[:-1])
        )
        starts_k = np.cumsum(sizes_k + gaps) - sizes_k
        # A gap's key goes with the piece before it; no row has that key.
        of_key = np.repeat(np.arange(len(sizes)), np.append(gaps[1:], 0) + sizes_k)
        starts = np.empty_like(starts_k)
        starts[by_key] = starts_k
        keys = rows_of_runs(starts, sizes)
        offsets = firsts - starts_k
        last = int((firsts + sizes_k).max()) - 1 if len(sizes) else 0
        base = pack_base(segments, shards, offsets, last)
        origin = Origin(segments, shards, starts_k, sizes_k, offsets, of_key, base)
        return origin, keys

    def locate(
        self, keys: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Segment, shard and row of each key."""
        piece = self.pieces[keys]
        return self.segments[piece], self.shards[piece], self.offsets[piece] + keys

    def packed(self, keys: npt.NDArray[np.int64]) -> Rows | None:
        """The packed rows of ``keys`` (:func:`ingest.core.ledger.pack_rows`), or None."""
        if self.base is None:
            return None
        return self.base[self.pieces[keys]] + keys

    def all_runs(self) -> Runs:
        """Every row of the window (holes and rows consumed before included), as runs."""
        out = np.empty((len(self.sizes), 4), dtype=np.int64)
        out[:, 0], out[:, 1] = self.segments, self.shards
        np.add(self.starts, self.offsets, out=out[:, 2])
        np.add(out[:, 2], self.sizes, out=out[:, 3])
        return out

    def runs(self, keys: npt.NDArray[np.int64]) -> Runs:
        """The runs of the rows of ``keys``, as :func:`ingest.core.ledger.runs_of` gives them."""
        if not len(keys):
            return as_runs(())
        k = np.sort(keys)
        heads = np.flatnonzero(k[1:] - k[:-1] != 1) + 1
        bounds = np.concatenate(([0], heads, [len(k)]))
        out = np.empty((len(bounds) - 1, 4), dtype=np.int64)
        out[:, 0], out[:, 1], out[:, 2] = self.locate(k[bounds[:-1]])
        np.add(out[:, 2], np.diff(bounds), out=out[:, 3])
        return out


def _runs_of(
    pieces: Sequence[tuple[Span, Piece]],
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]
]:
    """Segment, shard, first row and size of each run of consecutive rows of ``pieces``, in
    reading order: a piece of one span is one run, a gathered piece as many as it has."""
    if not any(isinstance(b, Gathered) for _, b in pieces):
        return (
            np.array([s.segment for s, _ in pieces], dtype=np.int64),
            np.array([s.shard for s, _ in pieces], dtype=np.int64),
            np.array([b.row for _, b in pieces], dtype=np.int64),
            np.array([piece_rows(b) for _, b in pieces], dtype=np.int64),
        )
    parts: list[tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
    for span, b in pieces:
        if isinstance(b, Gathered):
            rows = b.rows
            heads = np.flatnonzero(np.diff(rows) != 1) + 1
            bounds = np.concatenate(([0], heads, [len(rows)]))
            parts.append((span.segment, span.shard, rows[bounds[:-1]], np.diff(bounds)))
        else:
            one = np.array([b.row], dtype=np.int64)
            parts.append((span.segment, span.shard, one, np.array([piece_rows(b)], np.int64)))
    counts = [len(f) for _, _, f, _ in parts]
    return (
        np.repeat(np.array([p[0] for p in parts], dtype=np.int64), counts),
        np.repeat(np.array([p[1] for p in parts], dtype=np.int64), counts),
        np.concatenate([p[2] for p in parts]),
        np.concatenate([p[3] for p in parts]),
    )


class Chunks:
    """A table's record batches, to gather rows from them without joining them first (a take
    on a table of many chunks joins them all, each call)."""

    def __init__(self, table: pa.Table) -> None:
        self.batches = table.to_batches()
        sizes = np.fromiter((b.num_rows for b in self.batches), np.int64, len(self.batches))
        self.starts = np.cumsum(sizes) - sizes

    def take(self, rows: npt.NDArray[np.int64]) -> pa.Table:
        """Rows ``rows`` of the table, in that order: one take per record batch they hit,
        then one to put them in order."""
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        by_chunk = np.argsort(chunk, kind="stable")
        chunk = chunk[by_chunk]
        local = rows[by_chunk] - self.starts[chunk]
        cuts = np.flatnonzero(chunk[1:] != chunk[:-1]) + 1
        bounds = np.concatenate(([0], cuts, [len(chunk)])).tolist()
        parts = [
            self.batches[int(chunk[a])].take(indices(local[a:b]))
            for a, b in itertools.pairwise(bounds)
        ]
        grouped = pa.Table.from_batches(parts, schema=self.batches[0].schema)
        order = np.empty_like(by_chunk)
        order[by_chunk] = np.arange(len(by_chunk))
        return grouped.take(indices(order))


@dataclass(slots=True)
class Window:
    """A window's positions in delivery order: each one's key in ``origin``, and the table.

    Without holes position ``i`` is row ``i`` of the table. With holes, ``holes`` marks the
    positions without data and ``before[i]`` is the table row of position ``i`` (the rows
    before it that are not holes). A window gathered batch by batch keeps its table in
    reading order, and ``order[i]`` is the table row of position ``i``. Once compacted
    (:meth:`compact`) the table holds only the rows of positions ``first`` on.
    """

    index: int
    start: Cursor
    end: Cursor
    table: pa.Table
    keys: npt.NDArray[np.int64]
    origin: Origin
    holes: npt.NDArray[np.bool_] | None = None
    before: npt.NDArray[np.int64] | None = None
    order: npt.NDArray[np.int64] | None = None
    chunks: Chunks | None = None
    first: int = 0
    nbytes: int = 0
    """Bytes of ``table``."""

    @property
    def size(self) -> int:
        return len(self.keys)

    def rows(self, lo: int, hi: int) -> pa.Table:
        """The table rows of positions ``lo:hi`` (``lo >= first``)."""
        if self.order is not None:
            if self.chunks is None:
                self.chunks = Chunks(self.table)
            return self.chunks.take(self.order[lo:hi])
        if self.before is None:
            return self.table.slice(lo - self.first, hi - lo)
        base = int(self.before[self.first])
        a, b = int(self.before[lo]) - base, int(self.before[hi]) - base
        return self.table.slice(a, b - a)

    def compact(self, lo: int) -> None:
        """Keep only the rows of positions ``lo`` on, copied: the window's table goes."""
        if lo <= self.first or lo >= self.size:
            return
        rest = self.rows(lo, self.size)
        if self.order is None:  # a slice, which holds the whole table: copy it
            rest = rest.take(indices(np.arange(rest.num_rows)))
        self.table, self.order, self.chunks, self.first = rest, None, None, lo
        self.nbytes = int(rest.nbytes)


__all__ = [
    "Chunks",
    "Gathered",
    "Hole",
    "Lane",
    "Origin",
    "Piece",
    "SpanEnd",
    "Window",
    "head_of",
    "indices",
    "piece_at",
    "piece_rows",
    "read_bytes",
    "read_whole",
    "rest_of",
]
