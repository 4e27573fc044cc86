"""The derived cache: what a stage chain made of each source unit, kept so that later epochs,
restarts and other jobs read it instead of running the chain (issue 34).

A copy is named by a :class:`DerivedKey`: the source shard (URL, size, version), the unit
(rows ``[start, stop)``), how its bytes became rows, and the chain's fingerprint
(:func:`chain_fingerprint`), so a changed shard, tokenizer, option or stage version never
reads an old copy; a chain with a stage that cannot say what it computes is not cached.

A copy is row-aligned with its unit (:mod:`.codec`): every output row keeps the input row it
came from, so acks, states and resumes are those of the source rows. It lives in a node's
directory, bounded in bytes and owner-only like the shard cache, or at an fsspec URL a cluster
shares, written once (:mod:`.copies`); every read checks its SHA-256, and a damaged copy is a
miss, removed (:mod:`.store`).

Modules: :mod:`.keys` (names and fingerprints), :mod:`.codec` (a unit as bytes), :mod:`.copies`
(where copies live), :mod:`.store` (:class:`DerivedStore`: keys to checked copies, stats),
:mod:`.reading` (a feed's units read whole through the cache, its batches gathered by ref:
what ``derived=`` of :class:`ingest.Stream` and :class:`ingest.DataLoader` runs),
:mod:`.batches` (a feed's batch of refs to its outputs, rows read in part through the chain),
:mod:`.prepare` and :mod:`.units` (filling the cache ahead).
"""

from __future__ import annotations

from ingest.engine.derived.codec import CorruptDerivedError, DerivedUnit, decode, encode
from ingest.engine.derived.copies import DerivedStoreError
from ingest.engine.derived.keys import (
    DerivedKey,
    DerivedWarning,
    Fingerprinted,
    chain_fingerprint,
    read_fingerprint,
)
from ingest.engine.derived.store import (
    CorruptCopyWarning,
    DerivedConfig,
    DerivedStats,
    DerivedStore,
)

__all__ = [
    "CorruptCopyWarning",
    "CorruptDerivedError",
    "DerivedConfig",
    "DerivedKey",
    "DerivedStats",
    "DerivedStore",
    "DerivedStoreError",
    "DerivedUnit",
    "DerivedWarning",
    "Fingerprinted",
    "chain_fingerprint",
    "decode",
    "encode",
    "read_fingerprint",
]
