"""Sources: fsspec URLs and globs -> one listing of shards.

A :class:`Source` lists its URLs once per call of :meth:`Source.list_shards` (the stream
calls it once per epoch), opens shards for the format readers, and counts what it asks of
the store (:class:`IOStats`). It never reads data itself, and it knows no formats: which
listed files are data, and which format reads each, is asked of a :class:`FormatResolver`
that the caller hands to :meth:`Source.list_shards` (the format registry is one). Formats
import sources, never the other way round.

Modules, one concept each:

- :mod:`.shard`: a listed file (:class:`Shard`) and what a listing asks of its caller
  (:class:`FormatResolver`, :class:`ListingStore`).
- :mod:`.source`: the :class:`Source`: filesystems, opens and range reads.
- :mod:`.listing`: one URL (file, directory or glob) -> its shards.
- :mod:`.partitions`: the hive partitions (``key=value`` directories) of a shard's path.
- :mod:`.splits`: the split (train, validation, test) a shard's path names; a listing of
  several warns.
- :mod:`.hubfs`: ``hf://`` URLs pinned to a commit and read over HTTP.
- :mod:`.cached`: shards read through the node's shard cache.
- :mod:`.files`: the file handed to readers, each read whole, retried and counted.
- :mod:`.retry`: :class:`RetryPolicy` and attempts under one deadline.
- :mod:`.faults`: what a failed request was (transient, gone, refused, Retry-After).
- :mod:`.options`: storage options, credentials in URLs, secrets to scrub.
- :mod:`.stats`: :class:`IOStats`.
- :mod:`.s3`: the S3 filesystem of a source: one attempt per call, nothing patched.
"""

from __future__ import annotations

from ingest.storage.sources.faults import is_store_error
from ingest.storage.sources.files import WHOLE_BODY_BYTES, RangeIgnoredWarning
from ingest.storage.sources.listing import (
    BrokenLinkWarning,
    UnreadFolderFilesWarning,
    UnversionedShardWarning,
)
from ingest.storage.sources.options import parse_storage_options
from ingest.storage.sources.retry import RetryPolicy
from ingest.storage.sources.shard import FormatResolver, ListingStore, Shard
from ingest.storage.sources.source import Source, URLs, as_urls
from ingest.storage.sources.splits import MixedSplitsWarning
from ingest.storage.sources.stats import IOStats

__all__ = [
    "WHOLE_BODY_BYTES",
    "BrokenLinkWarning",
    "FormatResolver",
    "IOStats",
    "ListingStore",
    "MixedSplitsWarning",
    "RangeIgnoredWarning",
    "RetryPolicy",
    "Shard",
    "Source",
    "URLs",
    "UnreadFolderFilesWarning",
    "UnversionedShardWarning",
    "as_urls",
    "is_store_error",
    "parse_storage_options",
]
