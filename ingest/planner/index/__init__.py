"""The persistent shard index (see :mod:`ingest.planner.index.store`)."""

from __future__ import annotations

from ingest.planner.index.store import (
    INDEX_VERSION,
    IndexConfig,
    IndexEntryWarning,
    Indexer,
    IndexStats,
    IndexStore,
    IndexStoreError,
    default_location,
    index_shard,
    local_indexer,
    shard_identity,
)

__all__ = [
    "INDEX_VERSION",
    "IndexConfig",
    "IndexEntryWarning",
    "IndexStats",
    "IndexStore",
    "IndexStoreError",
    "Indexer",
    "default_location",
    "index_shard",
    "local_indexer",
    "shard_identity",
]
