"""A shard with deleted rows (a Delta file's deletion vector): read as the rows it keeps.

A shard's rows are numbered without the deleted ones: its listing counts the rows kept
(:func:`with_deletions`), the plan, the state and every reader's ranges are of those, and
:class:`DeletedRowsReader` reads each range as the file's rows around the deleted ones
(its format's reader, told of the file as written: :attr:`Deletions.physical`). Nothing
above the reader knows rows were deleted: a resume, a rank's share, a derived copy's range
are ranges of rows kept.

Kept row ``k`` is the file's row ``k + d``, ``d`` the deleted rows before it: with the
deleted rows ``D`` sorted, ``D[i] - i`` is the kept rows before ``D[i]`` (non-decreasing),
so ``d`` is how many of those are ``<= k`` (one binary search).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.errors import SourceError
from ingest.formats.base import BadRows, RowBatch, ShardInfo, ShardReader
from ingest.formats.spans import Range
from ingest.storage.sources.deletion_vectors import VECTOR_FIX

if TYPE_CHECKING:
    from ingest.formats.base import ReadContext, Seek


@dataclass(frozen=True, slots=True)
class Deletions:
    """The deleted rows of a shard, and the shard as written."""

    rows: npt.NDArray[np.uint32] | npt.NDArray[np.int64]
    """The file's deleted rows, sorted: ``uint32`` where they fit (a listing carries every
    file's to every reader: 4 bytes a deleted row)."""
    physical: ShardInfo
    """The shard's inspection as its file is written (every row)."""

    def kept_before(self, row: int) -> int:
        """The kept rows before the file's row ``row``."""
        return row - int(np.searchsorted(self.rows, row))


def with_deletions(url: str, info: ShardInfo, rows: npt.NDArray[np.integer]) -> ShardInfo:
    """``info`` (a shard's inspection as its file is written) with ``rows`` of it deleted:
    its rows and its blocks (row groups) counted without them.

    Raises:
        SourceError: If a deleted row is not a row of the file.
    """
    deleted = np.unique(np.asarray(rows, np.int64))  # sorted, once each
    total = info.rows
    if total is None:  # pragma: no cover - a Delta file is Parquet: its footer counts
        raise SourceError(url, "has deleted rows and no row count in its footer", "")
    if len(deleted) and (int(deleted[-1]) >= total or int(deleted[0]) < 0):
        bad = int(deleted[-1]) if int(deleted[-1]) >= total else int(deleted[0])
        raise SourceError(
            url,
            f"has a deletion vector that deletes row {bad}, and the file holds {total} rows "
            f"(rows 0 to {total - 1}): the vector is not this file's",
            VECTOR_FIX,
        )
    small = not len(deleted) or int(deleted[-1]) < 2**32
    deletions = Deletions(deleted.astype(np.uint32) if small else deleted, info)
    blocks = None
    if info.blocks is not None:  # row groups emptied by the deletions start where the next does
        starts = [deletions.kept_before(int(b)) for b in info.blocks]
        blocks = tuple(sorted(set(starts)))
    return replace(info, rows=total - len(deleted), blocks=blocks, seeks=(), deletions=deletions)


class DeletedRowsReader(ShardReader):
    """The rows a shard keeps, read by its format's reader (``inner``, made with the shard's
    :attr:`Deletions.physical` inspection) as the file's rows around the deleted ones."""

    def __init__(self, ctx: ReadContext, inner: ShardReader, deletions: Deletions) -> None:
        super().__init__(ctx)
        self.inner = inner
        self.deletions = deletions
        self._deleted = deletions.rows.astype(np.int64)
        self._before = self._deleted - np.arange(len(self._deleted), dtype=np.int64)
        """``_before[i]``: the kept rows before the i-th deleted row (non-decreasing)."""

    def _file_row(self, kept: int) -> int:
        """The file's row of kept row ``kept``."""
        return kept + int(np.searchsorted(self._before, kept, side="right"))

    def _span(self, start: int, stop: int | None) -> tuple[int, int | None]:
        """The file's rows of kept rows ``[start, stop)``."""
        first = self._file_row(start)
        if stop is None:
            return first, None
        last = self._file_row(stop - 1) + 1 if stop > start else first
        return first, last

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        first, last = self._span(start, stop)
        for batch in self.inner.read(first, last, None):
            kept = self._kept(batch)
            if kept is not None:
                yield kept

    def read_ranges(
        self, ranges: Sequence[Range], seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch]]:
        mapped = [Range(*self._span(r.start, r.stop), r.members) for r in ranges]
        for n, batch in self.inner.read_ranges(mapped, None):
            kept = self._kept(batch)
            if kept is not None:
                yield n, kept

    def _kept(self, batch: RowBatch) -> RowBatch | None:
        """``batch`` (the file's rows from ``batch.row``) without its deleted rows, numbered
        as kept rows; None where it keeps none."""
        deleted = self._deleted
        lo, hi = (int(i) for i in np.searchsorted(deleted, (batch.row, batch.stop)))
        at = batch.row - lo
        if lo == hi:
            return batch if at == batch.row else replace(batch, row=at)
        keep = np.ones(batch.data.num_rows, dtype=bool)
        keep[deleted[lo:hi] - batch.row] = False
        if not keep.any():
            return None
        data = batch.data.filter(pa.array(keep))
        if isinstance(batch, BadRows):
            return replace(batch, row=at, data=data)
        return RowBatch(at, data, None)

    def close(self) -> None:
        self.inner.close()


__all__ = ["DeletedRowsReader", "Deletions", "with_deletions"]
