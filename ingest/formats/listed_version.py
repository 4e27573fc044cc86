"""A local shard is read as the version listed: every batch a format reads of a local file
is handed on only after a ``stat`` finds the file as its listing did (its size and
modification time: :func:`~ingest.storage.sources.files.as_listed`).

A read from a store names the version listed (S3's ``If-Match``); a read of a local file
cannot, and a file rewritten in place or replaced by a rename since the listing was read on
as its new version: rows of two versions in one epoch, or a decoding error naming no cause.
The check follows each read, so a batch read before the change is the listed version's and
none read after it is handed on; a format's error on a file that changed names the change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from ingest.formats.base import ReadContext, RowBatch, Seek, ShardReader
from ingest.formats.spans import Range
from ingest.storage.sources.files import as_listed

_T = TypeVar("_T")


class ListedVersionReader(ShardReader):
    """Another reader (``inner``) of the local file ``path``, whose batches are checked
    against the listing as they are read (see the module)."""

    def __init__(self, ctx: ReadContext, inner: ShardReader, path: str) -> None:
        super().__init__(ctx)
        self.inner = inner
        self._path = path

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        return self._checked(self.inner.read(start, stop, seek))

    def read_ranges(
        self, ranges: Sequence[Range], seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch]]:
        return self._checked(self.inner.read_ranges(ranges, seek))

    def _checked(self, items: Iterable[_T]) -> Iterator[_T]:
        it = iter(items)
        while True:
            try:
                item = as_listed(self.ctx.shard, self._path, lambda: next(it))
            except StopIteration:
                return
            yield item

    def close(self) -> None:
        self.inner.close()
