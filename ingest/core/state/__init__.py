"""Stream state: small, plain, versioned JSON in named parts. Pure; no Ray, opens no file.

Layout (version 7, every state alike): the book's four parts, each validated by its own
class, then one part per node of the rank's chain that holds any (``pack``)::

    {"version": 7,
     "dataset": {"sources": [...], "digest": "sha256...",            # DatasetState
                 "shards": [[url, size, version, rows or null], ...]},
     "progress": {"epoch": 2, "first_step": 96, "step": 120,          # ProgressState
                  "delivered": 123456, "dropped": 0,
                  "consumed": {"done": [[0, 40]],                     # shards fully consumed
                               "partial": {"41": [[0, 512], ...]},    # rows of the others
                               "rows": {"41": 9000}},                 # counts learnt by reading
                  "quarantined": [{"url": ..., "start": 500,          # on_error="skip" only:
                                   "stop": 1000, "reason": ...}],     # rows skipped, consumed
                  "skip_ahead": [{"epoch": 3, "what": ...,            # ingest.skip of a later
                                  "rows": {url: [[0, 5]]}}]},         # epoch's steps
     "distributed": {"world_size": 4,                                 # DistributedState
                     "carry": {"spans": [[3, 0, 17]], "consumed": {}}},
     "position": {"seed": 0, "batch_size": 1024,                      # PositionState
                  "shuffle": {"window": 16384, "lanes": 16},
                  "ranks": [cursor or null, ...]},
     "pack": {"tokens": [[segment, shard, row, offset], ...],         # with pack= only
              "steps": 1234}}

``pack.tokens`` (:mod:`ingest.engine.pack`): rows whose tokens ``[0, offset)`` reached a
batch and the rest not; a resume packs them again from there (``ProgressState.tokens`` once
parsed). ``pack.steps``: the batches handed out since the run began (a packing stream's
steps, as its provenance log numbers them; ``ProgressState.batches``). A part of a node
this ingest does not have is refused, never ignored.

The version says nothing of what a state holds (its parts do). Earlier versions numbered it,
and are still read: 2 (a listing as records), 3 (packed, below), 5 (``tokens`` inside
``progress``), 6 (``distributed.owed``), 4 (several sources, :mod:`.sources`).

``progress.step`` is the next global step; ``first_step`` the step the epoch began at.
``distributed.carry`` holds the rows carried in from the previous epoch (equal steps per
rank). ``position`` says where each rank's reading order stood: with the same seed, shuffle
and world size a restored stream continues with exactly the batches of the uninterrupted
run; without it the rest of the epoch is shared out again. Exactly-once rests on
``progress``, ``carry`` and ``owed`` alone, never on the position.

``distributed.owed``, ``[[shard, row, offset], ...]``: copies of rows due again
beyond the carried ones (a packing epoch left a row over with its carried copy: the next
epoch carries one and owes the other, :mod:`ingest.core.carry`), carried out at the epoch's
end; the tokens ``[0, offset)`` of each were handed out already.

A set of consumed rows (``partial``, ``carry.consumed``) is ``[[start, stop], ...]`` or,
when shorter, a bitmap ``{"from": a, "to": b, "bits": base64}``
(:meth:`ingest.core.intervals.IntervalSet.encode`). ``partial`` sets of more than
:data:`~ingest.core.state.consumed.PACK_FROM_INTERVALS` intervals in all (a rank stopped
inside a shuffle window: a random part of the window's rows) are written as version 3's
``{"packed": ...}`` below: a bit per row of the window, 2-3 KB a rank for
a window of 16,384 rows, against 47-87 KB of pairs.

A listing of :data:`.dataset.PACK_FROM_SHARDS` shards or more is packed (version 3 made it
so), so that a million shards take a few MB, not a hundred::

     "dataset": {"sources": [...], "digest": "sha256...",
                 "packed": {"count": 1000000, "prefix": "s3://bucket/train/",
                            "urls": z, "rows": z, "size_hashes": z, "version_hashes": z,
                            "sha256": "..."}},
     "progress": {..., "consumed": {"done": intervals or bitmap of shard indices,
                                    "partial": {"packed": {"shards": z, "from": z,
                                                           "to": z, "bits": z}}, ...}}

Each ``z`` is a column, zlib-compressed and base64-encoded (integers little-endian, byte
planes apart). In ``dataset.packed``: the URLs after ``prefix`` front-coded (bytes shared
with the previous URL, then the rest), the row counts (-1: unknown), an 8-bit hash of each
size and a 16-bit hash of each version (0: no version). ``packed.sha256`` covers ``count``,
``prefix`` and every column, so an edited column is refused. ``digest`` covers the full
``(url, size, version)`` of every shard (:func:`packed_digest`) and is checked against the
listing on restore (:func:`match_listing`): a shard changed in place is always refused, and
the hashes name it (a size change escapes being named once in 256, a version change once in
65,536; then the message says that some shard changed). In ``partial.packed``: the shard
indices (as differences), and for each set its first row, its extent and its rows as bits
(one bitmap per set, byte-aligned, in ``bits``).

Shard indices refer to the shards of the state itself, so a dataset that grew (new shards
only) still resolves every saved index. The size is O(shards + ranks x lanes).

Validation. A state is checked before it is used: JSON text larger than ``max_bytes``
(:data:`MAX_STATE_BYTES` by default) before it is parsed (:meth:`StreamState.from_json`,
:meth:`StreamState.read` for a file), and JSON nested deeper than Python's recursion limit
(a state nests a few levels); then the version, every count and offset (integers
from 0 to :data:`.checks.MAX_OFFSET`), intervals against their shard's row count, a learnt row count
against the listing's, each saved position's layout, and ``progress.step`` against the rows
consumed (:meth:`StreamState.check_counts`). Where it is loaded, the listing is checked
against ``dataset`` (:func:`match_listing`) and the saved positions against the plan they
resume (:func:`ingest.core.positions.check_positions`). Each refusal names the field, its value, the
rule and the fix (:data:`FIX`).

The package: :mod:`.schema` (the whole state), :mod:`.dataset` (``dataset``), :mod:`.parts`
(``progress``, ``distributed``, ``position``), :mod:`.consumed` (the rows consumed per shard),
:mod:`.shards` (shard records and digests), :mod:`.packed` (the version 3 columns),
:mod:`.matching` (a saved dataset against a listing), :mod:`.checks` (versions, limits
and refusals) and :mod:`.sources` (the state of a stream over several named sources: each
source's own state side by side, and the mix node's part).
"""

from ingest.core.state.checks import FIX, MAX_STATE_BYTES, STATE_VERSION, refuse
from ingest.core.state.consumed import Consumed, Intervals
from ingest.core.state.dataset import DatasetState, versions_of
from ingest.core.state.matching import (
    changed_shards,
    hub_commits,
    match_kinds,
    match_listing,
    match_needed,
    moved_from,
)
from ingest.core.state.packed import PackedFingerprint
from ingest.core.state.parts import (
    Cursor,
    DistributedState,
    PositionState,
    ProgressState,
    SkipAhead,
)
from ingest.core.state.schema import StreamState
from ingest.core.state.shards import ShardRecord, ShardTable, packed_digest
from ingest.core.state.sources import SourcesState, read_state

__all__ = [
    "FIX",
    "MAX_STATE_BYTES",
    "STATE_VERSION",
    "Consumed",
    "Cursor",
    "DatasetState",
    "DistributedState",
    "Intervals",
    "PackedFingerprint",
    "PositionState",
    "ProgressState",
    "ShardRecord",
    "ShardTable",
    "SkipAhead",
    "SourcesState",
    "StreamState",
    "changed_shards",
    "hub_commits",
    "match_kinds",
    "match_listing",
    "match_needed",
    "moved_from",
    "packed_digest",
    "read_state",
    "refuse",
    "versions_of",
]
