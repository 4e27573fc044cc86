"""The node-local shard cache (see :mod:`ingest.storage.cache.store`)."""

from __future__ import annotations

from ingest.storage.cache.store import CacheEvent, CacheOptions, CacheWarning, ShardCache

__all__ = ["CacheEvent", "CacheOptions", "CacheWarning", "ShardCache"]
