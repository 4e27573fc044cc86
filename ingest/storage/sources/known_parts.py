"""A file's byte ranges fetched ahead, as fsspec's file cache: reads inside one are served
from memory, every other read is fetched from the store (``Source.fetch_ranges``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fsspec.caching


class KnownParts(fsspec.caching.KnownPartsOfAFile):  # type: ignore[misc]  # (untyped)
    """fsspec's ``parts`` cache (``cache_type="ingest-known-parts"``, ``cache_options``:
    ``data``, the parts as ``{(start, end): bytes}``; ``on_miss``, called with the bytes of
    each read sent to the store), with every read that one part does not hold fetched.

    fsspec's own (2026.9) never fetches, though its docstring says it does: a read that runs
    past a part's end is filled with zeros (``strict=False``) and one outside every part
    raises ``ValueError``. A zero-filled read is wrong data with no error, so this class
    takes its reads instead: a read that parts do not hold whole (past an end, across a gap
    or outside them all) is one request of its exact range."""

    name = "ingest-known-parts"

    def __init__(
        self,
        blocksize: int,
        fetcher: Callable[[int, int], bytes],
        size: int,
        data: dict[tuple[int, int], bytes] | None = None,
        on_miss: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(blocksize, fetcher, size, data=data, **kwargs)
        self._file_size = size  # (the base's ``size`` is the known parts' bytes)
        self._on_miss = on_miss

    def _fetch(self, start: int | None, stop: int | None) -> bytes:
        start = 0 if start is None else start
        stop = self._file_size if stop is None else min(stop, self._file_size)
        if start >= stop:
            return b""
        for (first, end), blob in self.data.items():
            if first <= start and stop <= end:
                self.hit_count += 1
                return bytes(blob[start - first : stop - first])
        self.miss_count += 1
        self.total_requested_bytes += stop - start
        out = bytes(self.fetcher(start, stop))
        if self._on_miss is not None:
            self._on_miss(len(out))
        return out


fsspec.caching.register_cache(KnownParts, clobber=True)

__all__ = ["KnownParts"]
