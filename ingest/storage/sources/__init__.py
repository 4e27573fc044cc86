"""Sources: fsspec URLs and globs -> one listing of shards.

A :class:`Source` lists its URLs once per call of :meth:`Source.list_shards` (the stream
calls it once per epoch), opens shards for the format readers, and counts what it asks of
the store (:class:`IOStats`). It never reads data itself, and it knows no formats: which
listed files are data, and which format reads each, is asked of a :class:`FormatResolver`
that the caller hands to :meth:`Source.list_shards` (the format registry is one). Formats
import sources, never the other way round.
"""

from __future__ import annotations

from ingest.storage.sources.source import (
    FormatResolver,
    IOStats,
    ListingStore,
    RetryPolicy,
    Shard,
    Source,
    is_store_error,
    parse_storage_options,
)

__all__ = [
    "FormatResolver",
    "IOStats",
    "ListingStore",
    "RetryPolicy",
    "Shard",
    "Source",
    "is_store_error",
    "parse_storage_options",
]
