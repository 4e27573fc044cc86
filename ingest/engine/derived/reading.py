"""The derived cache in a feed (issue 34, item 1): a unit read whole is its chain's outputs.

A feed with ``derived=`` and a chain that has a fingerprint (:func:`chain_fingerprint`) reads
each of its spans that it reads whole (from the span's first row, no resume skip, to its
stop) through :meth:`Deriving.reads`: the span's copy, if one is sealed (the shard is not
opened for it), else the span's rows, the chain run over all of them at once and the outputs
kept as a copy. A span read in part (a resume inside it), one with quarantined rows, and one
whose chain raised keep today's path: the chain runs on each batch (:meth:`Deriving.batch`),
and nothing is kept (a failed unit is never cached as empty).

Windows, batches and acks stay those of the input rows. Every row a lane hands the window is
a *ref*, one int64 in the column :data:`REF`, naming the row's place in a unit held here
(:class:`_Unit`: the outputs of a derived span and where each input row's start, or the input
rows of a span on today's path). Shuffling and cutting move refs; :meth:`Deriving.batch`
gathers a batch's outputs by its refs in batch order, so a batch holds the outputs of the
same input rows, in the same order, as the chain run on the batch would make for a chain whose
stages treat each row on its own (what a fingerprint promises). A unit is let go when all its
rows were gathered or left out (rows a resume skips).

Store errors (a shared URL that cannot be read or written) warn once and the feed goes on
without the cache.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.assign import TO_END
from ingest.core.intervals import rows_of_runs
from ingest.engine.derived.codec import DerivedUnit
from ingest.engine.derived.copies import DerivedStoreError
from ingest.engine.derived.keys import DerivedKey, DerivedWarning, chain_fingerprint
from ingest.engine.derived.keys import read_fingerprint as _read_fingerprint
from ingest.engine.derived.store import DerivedConfig, DerivedStore
from ingest.engine.stage import Staged
from ingest.engine.transform import staged
from ingest.engine.window import Hole, SpanEnd, indices
from ingest.formats import given_names, read_casts
from ingest.formats.arrays import numbers
from ingest.formats.base import ReadContext, RowBatch
from ingest.formats.partitions import declared_partition_types
from ingest.storage.sources.stats import IOStats

REF = "__ingest_derived"
"""The column of a deriving feed's window rows: each row's ref (see the module docstring)."""

Read = tuple[int, RowBatch | Hole] | SpanEnd

_PRINTS: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
"""Each chain's fingerprint, worked out once per process (so its warning is given once)."""
_PRINTS_LOCK = threading.Lock()


def fingerprint_of(fn: Any) -> str | None:
    """``fn``'s :func:`chain_fingerprint`, remembered for the life of ``fn``."""
    with _PRINTS_LOCK:
        try:
            if fn in _PRINTS:
                return _PRINTS[fn]
        except TypeError:  # not weakly referable: worked out each time
            return chain_fingerprint(fn)
        got = chain_fingerprint(fn)
        _PRINTS[fn] = got
        return got


@dataclass(slots=True)
class _Unit:
    """Rows a lane handed out as refs ``base .. base + size``: a derived span (``staged``,
    with ``offsets[i]`` its input row ``i``'s first output) or raw input rows (``table``)."""

    base: int
    size: int
    left: int
    staged: Staged | None = None
    offsets: npt.NDArray[np.int64] | None = None
    table: pa.Table | None = None


@dataclass(frozen=True, slots=True)
class Gathered:
    """A batch's outputs: ``staged`` (origins are batch rows) of the derived rows, and the
    batch rows on today's path with their input rows (``raw``, None if none)."""

    staged: Staged | None
    raw_rows: npt.NDArray[np.int64]
    raw: pa.Table | None


class Deriving:
    """A feed's derived cache: reads spans whole through it, gathers batches by ref.

    Args:
        config: Where the copies live.
        fn: The chain (the stream's transform as built, before the rank's wrapper).
        fingerprint: ``fn``'s fingerprint (not None: an uncacheable chain has no Deriving).
        columns: The columns the stream reads (part of every key).
        io: The stream's counts (``stream.stats``): the store's ``derived_*`` and the stage
            time spent and saved.
    """

    def __init__(
        self,
        config: DerivedConfig,
        fn: Callable[[pa.Table], Any],
        fingerprint: str,
        columns: Any,
        io: IOStats | None = None,
    ) -> None:
        self.store = DerivedStore(config, io)
        self._io = io
        self.fn = fn
        self.fingerprint = fingerprint
        self.columns = None if columns is None else tuple(columns)
        self._lock = threading.Lock()
        self._units: dict[int, _Unit] = {}
        self._bases: list[int] = []
        self._next = 0
        self._broken = False

    @classmethod
    def of(
        cls, config: DerivedConfig | None, transform: Any, columns: Any, io: IOStats | None = None
    ) -> Deriving | None:
        """The deriving of a feed whose transform is ``transform`` (the rank's wrapper of the
        chain, :func:`ingest.engine.rank_node.read_transform`), or None: no ``config``, no
        chain, or a chain without a fingerprint (warned once, :class:`DerivedWarning`)."""
        if config is None or transform is None:
            return None
        fn = getattr(transform, "fn", None)
        if fn is None or not dataclasses.is_dataclass(transform):
            return None
        found = fingerprint_of(fn)
        return None if found is None else cls(config, fn, found, columns, io)

    # -- keys and the store ----------------------------------------------------------------

    def key(self, ctx: ReadContext, start: int, stop: int | None) -> DerivedKey:
        """The key of rows ``[start, stop)`` of ``ctx.shard`` through this chain, read as
        ``ctx`` reads them (the types it casts its columns to). A range to the shard's end
        is keyed so (``stop`` None) whether or not the reader knew the count: a one-process
        stream reads a JSONL shard to its end, a counted plan (Ray, a DataLoader's workers)
        to its row count, and both read the same copy."""
        shard, rows = ctx.shard, ctx.info.rows
        to_end = stop is None or stop >= TO_END or (rows is not None and stop >= rows)
        return DerivedKey(
            url=shard.url,
            size=int(shard.size),
            version=shard.rows_version,
            start=int(start),
            stop=None if to_end else int(stop),  # type: ignore[arg-type]
            chain=self.fingerprint,
            read=_read_fingerprint(
                shard.format,
                self.columns,
                shard.partition,
                {**read_casts(ctx), **declared_partition_types(ctx)},
                given_names(ctx),
                ctx.options.schema,
            ),
        )

    def _get(self, key: DerivedKey) -> DerivedUnit | None:
        if self._broken:
            return None
        try:
            unit = self.store.get(key)
        except DerivedStoreError as e:
            self._give_up(e)
            return None
        return unit

    def _put(self, key: DerivedKey, made: Staged, inputs: int, seconds: float) -> None:
        if self._broken:
            return
        try:
            self.store.put(key, made, inputs, seconds)
        except DerivedStoreError as e:
            self._give_up(e)

    def _give_up(self, error: DerivedStoreError) -> None:
        if not self._broken:
            self._broken = True
            warnings.warn(
                DerivedWarning(
                    f"{error}; this epoch reads on without the derived cache (the chain runs "
                    "on every batch)"
                ),
                stacklevel=3,
            )

    # -- reading ---------------------------------------------------------------------------

    def reads(
        self,
        ctx: ReadContext,
        index: int,
        run: Sequence[int],
        ranges: Sequence[tuple[int, int | None]],
        whole: Sequence[bool],
        read: Callable[[list[int], list[tuple[int, int | None]]], Iterator[Read]],
    ) -> Iterator[Read]:
        """What a lane yields for one shard's spans ``run`` (lane span indices) of rows
        ``ranges``, ``whole[i]`` where range ``i`` is read from its span's first row: a
        range with a copy from the copy, the others through ``read(run, ranges)`` (the
        lane's reader of a shard's ranges, called only if any is left), in order, as refs;
        ``ctx``: how the shard is read; ``index``: its index in the listing."""
        hits: dict[int, DerivedUnit] = {}
        for i, (start, stop) in enumerate(ranges):
            if whole[i]:
                found = self._get(self.key(ctx, start, stop))
                if found is not None and _fits(found, start, stop):
                    hits[i] = found
        waiting = sorted(hits)
        todo = [i for i in range(len(run)) if i not in hits]
        if todo:
            at = {k: i for i, k in enumerate(run)}
            got = read([run[i] for i in todo], [ranges[i] for i in todo])
            for i, group in _by_range(got, at):
                while waiting and waiting[0] < i:
                    w = waiting.pop(0)
                    yield from self._hit(run[w], index, ranges[w][0], hits[w], _to_end(ranges[w]))
                yield from self._range(ctx, run[i], ranges[i], whole[i], group)
        for w in waiting:
            yield from self._hit(run[w], index, ranges[w][0], hits[w], _to_end(ranges[w]))

    def _range(
        self,
        ctx: ReadContext,
        k: int,
        rows: tuple[int, int | None],
        whole: bool,
        group: list[Read],
    ) -> Iterator[Read]:
        """What was read of one range: derived if read whole without a quarantined row,
        else as it was read (refs to its input rows)."""
        pieces = [g for g in group if not isinstance(g, SpanEnd)]
        if whole and pieces and all(isinstance(p, RowBatch) for _, p in pieces):
            yield from self._derived(ctx, k, rows, pieces)  # type: ignore[arg-type]
        else:
            for kk, p in pieces:
                yield (kk, p) if isinstance(p, Hole) else self._raw(kk, p)
        yield from (g for g in group if isinstance(g, SpanEnd))

    def _hit(
        self, k: int, shard: int, start: int, found: DerivedUnit, to_end: bool
    ) -> Iterator[Read]:
        """A range's copy as refs: the shard is not read."""
        made, inputs = found.staged, found.inputs
        self._tell(derived_saved_us=_us(found.seconds))
        unit = self._add(inputs, staged=made, counts=found.counts)
        yield k, RowBatch(start, _refs(unit.base, inputs), None, share=int(made.table.nbytes))
        if to_end:  # the shard's row count, learnt from the copy as from a read
            yield SpanEnd(k, shard, start + inputs)

    def _derived(
        self,
        ctx: ReadContext,
        k: int,
        rows: tuple[int, int | None],
        pieces: list[tuple[int, RowBatch]],
    ) -> Iterator[Read]:
        """A range read whole: the chain over all its rows, kept; today's way if it raised."""
        table = pa.Table.from_batches([p.data for _, p in pieces])
        # Wall time: a tokenizer encodes on threads of its own, which this thread's CPU
        # time would leave out (and the process's would count the other lanes in).
        began = time.perf_counter()
        try:
            made = staged(self.fn, table)
        except Exception:  # the batches run it again, and raise or quarantine as today
            yield from (self._raw(kk, p) for kk, p in pieces)
            return
        seconds = time.perf_counter() - began
        self._tell(derived_stage_us=_us(seconds))
        self._put(self.key(ctx, rows[0], rows[1]), made, table.num_rows, seconds)
        counts = np.bincount(made.origin, minlength=table.num_rows).astype(np.int64)
        unit = self._add(table.num_rows, staged=made, counts=counts)
        total = max(1, table.num_rows)
        nbytes = int(made.table.nbytes)
        at = unit.base
        for kk, p in pieces:  # the pieces as read, with their seeks
            n = int(p.data.num_rows)
            yield kk, RowBatch(p.row, _refs(at, n), p.seek, share=nbytes * n // total)
            at += n

    def _tell(self, **counts: int) -> None:
        if self._io is not None:
            self._io.add(**counts)

    def _raw(self, k: int, piece: RowBatch) -> tuple[int, RowBatch]:
        n = int(piece.data.num_rows)
        unit = self._add(n, table=pa.Table.from_batches([piece.data]))
        return k, RowBatch(piece.row, _refs(unit.base, n), piece.seek, share=piece.nbytes)

    def _add(
        self,
        size: int,
        *,
        staged: Staged | None = None,
        counts: npt.NDArray[np.int64] | None = None,
        table: pa.Table | None = None,
    ) -> _Unit:
        offsets = None
        if counts is not None:
            offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        with self._lock:
            unit = _Unit(self._next, size, size, staged, offsets, table)
            self._next += max(1, size)
            if size:
                self._units[unit.base] = unit
                self._bases.append(unit.base)
        return unit

    # -- batches ---------------------------------------------------------------------------

    def _locate(self, refs: npt.NDArray[np.int64]) -> tuple[list[_Unit], npt.NDArray[np.int64]]:
        with self._lock:
            bases = np.asarray(self._bases, dtype=np.int64)
            which = np.searchsorted(bases, refs, side="right") - 1
            units = [self._units[int(b)] for b in bases]
        return units, which

    def release(self, refs: npt.NDArray[np.int64]) -> None:
        """Rows ``refs`` were gathered or left out: a unit all of whose rows were goes."""
        if not len(refs):
            return
        units, which = self._locate(refs)
        used = np.bincount(which, minlength=len(units))
        with self._lock:
            for n in np.flatnonzero(used).tolist():
                unit = units[n]
                unit.left -= int(used[n])
                if unit.left <= 0 and self._units.pop(unit.base, None) is not None:
                    self._bases.remove(unit.base)

    def gather(self, refs: npt.NDArray[np.int64]) -> Gathered:
        """The outputs of batch rows ``refs``: the derived ones as one :class:`Staged` whose
        origins are batch rows, and the rows on today's path with their input rows.

        The derived outputs are taken in one ``take`` over the units' tables, in batch
        order (each row's outputs in order), or sliced where they are one run: a take per
        unit and a second one to put their outputs in batch order copied every batch's
        token ids twice."""
        units, which = self._locate(refs)
        derived = np.fromiter((u.staged is not None for u in units), bool, len(units))[which]
        made = self._taken(units, which, refs, np.flatnonzero(derived))
        raw_rows: list[npt.NDArray[np.int64]] = []
        raw_tables: list[pa.Table] = []
        for n in np.unique(which[~derived]).tolist():
            unit = units[n]
            assert unit.table is not None
            rows = np.flatnonzero(which == n)
            raw_rows.append(rows)
            raw_tables.append(unit.table.take(indices(refs[rows] - unit.base)))
        if not raw_rows:
            return Gathered(made, np.zeros(0, np.int64), None)
        rows = np.concatenate(raw_rows)
        order = np.argsort(rows, kind="stable")
        raw = _concat(raw_tables).take(indices(order))
        return Gathered(made, rows[order], raw)

    @staticmethod
    def _taken(
        units: list[_Unit],
        which: npt.NDArray[np.int64],
        refs: npt.NDArray[np.int64],
        rows: npt.NDArray[np.int64],
    ) -> Staged | None:
        """The outputs of the derived batch rows ``rows`` (ascending), in batch order."""
        if not len(rows):
            return None
        used = np.unique(which[rows]).tolist()
        first = np.empty(len(rows), np.int64)
        counts = np.empty(len(rows), np.int64)
        tables: list[pa.Table] = []
        parts: list[npt.NDArray[np.int64] | None] = []
        at = 0
        for n in used:
            unit = units[n]
            assert unit.staged is not None and unit.offsets is not None
            mine = which[rows] == n
            local = refs[rows[mine]] - unit.base
            first[mine] = at + unit.offsets[local]
            counts[mine] = np.diff(unit.offsets)[local]
            tables.append(unit.staged.table)
            parts.append(unit.staged.part)
            at += unit.staged.table.num_rows
        out = rows_of_runs(first, counts)
        table = _rows_of(_concat(tables), out)
        return Staged(table, np.repeat(rows, counts), _parts(parts, tables, out))

    @property
    def held_units(self) -> int:
        """Units held now (their rows not all gathered)."""
        with self._lock:
            return len(self._units)

    def close(self) -> None:
        with self._lock:
            self._units.clear()
            self._bases.clear()


def merged(pieces: Sequence[Staged], rows: Sequence[npt.NDArray[np.int64]] | None = None) -> Staged:
    """``pieces`` (origins are batch rows, or, with ``rows``, indices into each one's
    ``rows``) as one :class:`Staged` in batch order, each input row's outputs in order."""
    tables = [p.table for p in pieces]
    origins = [
        np.asarray(p.origin, np.int64) if rows is None else rows[n][np.asarray(p.origin, np.int64)]
        for n, p in enumerate(pieces)
    ]
    return _merged(tables, origins, [p.part for p in pieces])


def _merged(
    tables: list[pa.Table],
    origins: list[npt.NDArray[np.int64]],
    parts: list[npt.NDArray[np.int64] | None],
) -> Staged:
    if len(tables) == 1:
        table, origin, part = tables[0], origins[0], parts[0]
        order = np.argsort(origin, kind="stable")
        if (order == np.arange(len(order))).all():
            return Staged(table, origin, None if part is None else np.asarray(part, np.int64))
    origin = np.concatenate(origins) if origins else np.zeros(0, np.int64)
    order = np.argsort(origin, kind="stable")
    table = _concat(tables).take(indices(order))
    return Staged(table, origin[order], _parts(parts, tables, order))


def _parts(
    parts: Sequence[npt.NDArray[np.int64] | None],
    tables: Sequence[pa.Table],
    rows: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64] | None:
    """Rows ``rows`` of the parts of ``tables`` one after the other (None: no parts).

    Raises:
        ValueError: If some tables with rows have parts and others not.
    """
    has = [p is not None for p, t in zip(parts, tables, strict=True) if t.num_rows]
    if not any(has):
        return None
    if not all(has):
        raise ValueError(
            "a chain gave parts of rows (ingest.Staged.part) for some units and not for "
            "others; a stage gives parts for every batch or for none"
        )
    chosen = [np.asarray(p, np.int64).reshape(-1, 2) for p in parts if p is not None]
    return np.concatenate(chosen)[rows]


def _concat(tables: list[pa.Table]) -> pa.Table:
    """``tables`` one after the other; those of no rows only for their columns."""
    full = [t for t in tables if t.num_rows] or tables[:1]
    if len(full) == 1:
        return full[0]
    return pa.concat_tables(full, promote_options="default")


def _rows_of(table: pa.Table, rows: npt.NDArray[np.int64]) -> pa.Table:
    """Rows ``rows`` of ``table``: a slice (no copy) where they are one ascending run, as
    every batch of a stream that does not shuffle is, else a take. A take copies the token
    ids of the batch once more: 1.5 ms a read step of 600,000 tokens against 3 us for the
    slice, 8% of a warm epoch of ``benchmarks/derived_cache.py``."""
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and (np.diff(rows) == 1).all():
        return table.slice(int(rows[0]), len(rows))
    return table.take(indices(rows))


def _by_range(reads: Iterator[Read], at: dict[int, int]) -> Iterator[tuple[int, list[Read]]]:
    """``reads`` in runs of one range each (``at``: a lane span's range), in order."""
    group: list[Read] = []
    of: int | None = None
    for got in reads:
        i = at[got.span if isinstance(got, SpanEnd) else got[0]]
        if of is not None and i != of:
            yield of, group
            group = []
        group.append(got)
        of = i
    if of is not None:
        yield of, group


def _fits(found: DerivedUnit, start: int, stop: int | None) -> bool:
    """Whether a copy holds the rows of ``[start, stop)`` (its key says so; a copy that
    did not would shift every position after it)."""
    return stop is None or stop >= TO_END or found.inputs == stop - start


def _to_end(rows: tuple[int, int | None]) -> bool:
    return rows[1] is None or rows[1] >= TO_END


def _us(seconds: float) -> int:
    """Whole microseconds: the same for a unit's time spent and, read back, saved."""
    return round(seconds * 1e6)


def refs_of(table: pa.Table) -> npt.NDArray[np.int64]:
    """The refs of a deriving feed's rows (the column :data:`REF` of ``table``)."""
    return numbers(table.column(REF)).astype(np.int64, copy=False)


def _refs(base: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [indices(np.arange(base, base + n, dtype=np.int64))], names=[REF]
    )


__all__ = ["REF", "Deriving", "Gathered", "fingerprint_of", "merged", "refs_of"]
