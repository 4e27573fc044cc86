"""ingest: stream training data from object storage into PyTorch; resume exactly.

Public API::

    import ingest
    stream = ingest.Stream("s3://bucket/train/*.parquet", columns=["id", "tokens"],
                           batch_size=1024, shuffle_seed=0)
    for batch in stream: ...                 # dict of torch tensors
    state = stream.state_dict()              # small JSON
    stream.load_state_dict(state)            # continue exactly after it
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ingest.core.errors import (
    ConfigError,
    IngestError,
    NoShardsError,
    SchemaMismatchError,
    ShardError,
    SourceError,
    StateError,
    StoreError,
    StreamTimeoutError,
    SupersededError,
)
from ingest.core.quarantine import Quarantined
from ingest.core.state import STATE_VERSION

if TYPE_CHECKING:
    from ingest import decode, ray_data, testing, train
    from ingest.core.sizing import Autoscale
    from ingest.distributed.coordinator import CoordinatorLostError
    from ingest.distributed.pool import ReaderPool
    from ingest.distributed.rank import RankIterator, RankOptions
    from ingest.distributed.ray_stream import RayStream
    from ingest.engine.derived import DerivedConfig, DerivedWarning
    from ingest.engine.derived.prepare import PrepareReport, prepare
    from ingest.engine.mix import Mix
    from ingest.engine.options import Shuffle
    from ingest.engine.pack import Pack
    from ingest.engine.provenance import (
        ProvenanceError,
        ProvenanceLog,
        ProvenanceWarning,
        skip,
        which,
    )
    from ingest.engine.stage import Filter, FlatMap, Stage, Staged
    from ingest.engine.stream import Stream
    from ingest.engine.token_batches import TokenBatches
    from ingest.engine.tokenize import Tokenize
    from ingest.formats import get_format, register_format, registered_formats
    from ingest.formats.base import ReadOptions, ShardInfo
    from ingest.integrations.loader import DataLoader
    from ingest.planner.catalog import Listing
    from ingest.planner.index import IndexConfig, IndexStore
    from ingest.storage.cache import CacheOptions
    from ingest.storage.follow import Follow
    from ingest.storage.sources import IOStats, RetryPolicy, Shard, Source, URLs
    from ingest.storage.sources.url_list import urls_from

__version__ = "0.1.0"

__all__ = [
    "STATE_VERSION",
    "Autoscale",
    "CacheOptions",
    "ConfigError",
    "CoordinatorLostError",
    "DataLoader",
    "DerivedConfig",
    "DerivedWarning",
    "Filter",
    "FlatMap",
    "Follow",
    "IOStats",
    "IndexConfig",
    "IndexStore",
    "IngestError",
    "Listing",
    "Mix",
    "NoShardsError",
    "Pack",
    "PrepareReport",
    "ProvenanceError",
    "ProvenanceLog",
    "ProvenanceWarning",
    "Quarantined",
    "RankIterator",
    "RankOptions",
    "RayStream",
    "ReadOptions",
    "ReaderPool",
    "RetryPolicy",
    "SchemaMismatchError",
    "Shard",
    "ShardError",
    "ShardInfo",
    "Shuffle",
    "Source",
    "SourceError",
    "Stage",
    "Staged",
    "StateError",
    "StoreError",
    "Stream",
    "StreamTimeoutError",
    "SupersededError",
    "TokenBatches",
    "Tokenize",
    "__version__",
    "decode",
    "get_format",
    "list_shards",
    "prepare",
    "ray_data",
    "register_format",
    "registered_formats",
    "skip",
    "testing",
    "train",
    "urls_from",
    "which",
]


_LAZY = {
    "get_format": "ingest.formats",
    "register_format": "ingest.formats",
    "registered_formats": "ingest.formats",
    "ReadOptions": "ingest.formats.base",
    "ShardInfo": "ingest.formats.base",
    "Stage": "ingest.engine.stage",
    "Filter": "ingest.engine.stage",
    "FlatMap": "ingest.engine.stage",
    "Staged": "ingest.engine.stage",
    "Pack": "ingest.engine.pack",
    "Mix": "ingest.engine.mix",
    "DerivedConfig": "ingest.engine.derived",
    "DerivedWarning": "ingest.engine.derived",
    "prepare": "ingest.engine.derived.prepare",
    "PrepareReport": "ingest.engine.derived.prepare",
    "ProvenanceError": "ingest.engine.provenance",
    "ProvenanceLog": "ingest.engine.provenance",
    "ProvenanceWarning": "ingest.engine.provenance",
    "which": "ingest.engine.provenance",
    "skip": "ingest.engine.provenance",
    "Shuffle": "ingest.engine.options",
    "Tokenize": "ingest.engine.tokenize",
    "TokenBatches": "ingest.engine.token_batches",
    "Listing": "ingest.planner.catalog",
    "IndexConfig": "ingest.planner.index",
    "IndexStore": "ingest.planner.index",
    "CacheOptions": "ingest.storage.cache",
    "Follow": "ingest.storage.follow",
    "IOStats": "ingest.storage.sources",
    "RetryPolicy": "ingest.storage.sources",
    "Shard": "ingest.storage.sources",
    "Source": "ingest.storage.sources",
    "Stream": "ingest.engine.stream",
    "DataLoader": "ingest.integrations.loader",
    "RayStream": "ingest.distributed.ray_stream",
    "ReaderPool": "ingest.distributed.pool",
    "Autoscale": "ingest.core.sizing",
    "RankIterator": "ingest.distributed.rank",
    "RankOptions": "ingest.distributed.rank",
    "CoordinatorLostError": "ingest.distributed.coordinator",
    "urls_from": "ingest.storage.sources.url_list",
}


def __getattr__(name: str) -> Any:
    # torch and ray take seconds to import, and the pure core (ingest.core) imports this
    # package first and needs no storage, formats or engine: everything above the core
    # loads on first use.
    if name in ("train", "testing", "hf", "decode", "ray_data"):
        import importlib

        return importlib.import_module(f"ingest.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ingest' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def list_shards(
    source: URLs,
    *,
    storage_options: Mapping[str, Any] | None = None,
    format: str | None = None,
    progress: bool = False,
) -> Listing:
    """List a source once and read what each shard's footer tells (rows when known).

    Args:
        source: URL, glob or directory, or a list of them.
        storage_options: fsspec options for the store.
        format: Format name for every shard; None infers it from extensions.
        progress: Show a progress bar while footers are read.
    """
    from ingest.formats.base import ReadOptions
    from ingest.planner.catalog import Catalog
    from ingest.storage.sources import Source

    src = Source(source, storage_options=storage_options, format=format)
    return Catalog(src, ReadOptions(), None).scan(progress=progress, schema=False)
