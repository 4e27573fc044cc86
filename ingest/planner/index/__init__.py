"""The persistent shard index: row counts and seek points that outlive a job.

Shards whose footer has no row count (JSONL, CSV, WebDataset tar, Arrow IPC streams) must
be read once to count their rows and find their seek points. :class:`IndexStore` keeps what
that pass found, so a later job, a re-run or another node of the cluster plans without
reading any shard again.

Layout: one small JSON file per shard, ``<location>/<h[:2]>/<h>.json``, where ``h`` is the
SHA-256 of the entry's key: the shard's identity (its URL without credentials or query),
size, version (ETag or modification time), format name and :data:`INDEX_VERSION`. A shard
that changes gets a new key, so a stale entry is never found. The location is a local
directory (created owner-only) or any fsspec URL (``s3://bucket/ingest-index/``) a cluster
shares. Writes are atomic (a temporary file renamed over, or one whole-object put); an entry
that does not parse or does not match its key is ignored with a warning and rebuilt.

Building the missing entries is an :data:`Indexer`'s job: :func:`local_indexer` reads
shards in threads of this process; :func:`ingest.distributed.index_tasks.ray_indexer` in Ray
tasks on the ingest nod

Footers are kept too (:mod:`.footers`): a format whose inspection comes back from bytes
(Parquet's footer) has them stored under the same key, so a restarted job reads no footer.
So is a schema inferred from a shard's bytes (JSON Lines, CSV, a tar's first samples), under
the shard's key and what the inference depends on besides (``Format.schema_key``: the
format's variant, the read options it uses, the pyarrow version): a restarted job reads
nothing of the first shard for it (:meth:`IndexStore.get_schema`).

Modules: :mod:`.store` (:class:`IndexStore` and where it keeps entries), :mod:`.entries` (an
entry's key, name and JSON, checked when read), :mod:`.build` (the :data:`Indexer` that
reads the shards an index lacks) and :mod:`.footers` (footers kept and taken back).
"""

from __future__ import annotations

from ingest.planner.index.build import Indexer, index_shard, local_indexer
from ingest.planner.index.entries import INDEX_VERSION, shard_identity
from ingest.planner.index.store import (
    IndexConfig,
    IndexEntryWarning,
    IndexStats,
    IndexStore,
    IndexStoreError,
    default_location,
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
