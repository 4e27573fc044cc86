"""A node-local shard cache: whole shards on local disk under a byte bound, owner-only.

Opt-in with ``ReadOptions(cache=CacheOptions(directory, max_bytes))``. The first read of a
shard on a node fetches it whole (one request) into the directory; later reads on that node,
in any process and after a restart, open the local copy and send no request.

Why not fsspec's ``filecache``/``blockcache``: their index is one JSON file that every
process rewrites (concurrent readers on a node lose entries or serve a stale one), they
bound nothing but age (no byte bound, no LRU eviction), and they validate a copy with an
extra request per open (``ukey``/``info``). Here the listing already carries each shard's
size and version, so the copy's name is derived from them: a shard that changed in the store
has another name and is fetched again, with no request to check.

Files under ``directory`` (the cache's own folders are 0700 and its files 0600 whatever the
umask, like the shard index: cached shards of a private bucket are no one else's to read; a
folder of the cache owned by another user is refused):

- ``data/<key>.shard``: complete copies; an atomic rename puts one in place, so a process
  that dies mid-fetch never leaves a half file where a reader looks. Readers hold a shared
  ``flock`` on the copy while it is open; eviction takes an exclusive one without waiting and
  passes over a copy it cannot take, so it never deletes a file a reader has open.
- ``data/<key>.seal``: what the copy was when it was fetched: the SHA-256 of its bytes, and
  its size, inode, modification and change times. Its own modification time is the copy's
  last use (least recently used goes first), so that opening a copy never touches the copy.
- ``tmp/<key>.<bytes>.<nonce>.part``: fetches under way, each held by its writer with an
  exclusive ``flock`` and counted at its full size against the bound before it starts. A
  part whose lock can be taken belongs to a dead process and is removed.
- ``cache.lock``: taken while the bytes in use are summed and room is made, so that several
  processes never pass the bound between them. ``locks/<nn>.lock``: 256 stripes of one
  fetcher per shard on the node.

Damaged copies. The seal is checked on every open with one ``stat``, not by hashing: a
change through the file system (a write, a truncation, a replaced file, even with its
modification time put back) changes the change time, which no one can set. Only a copy whose
stat differs is hashed again: the same bytes (a copy moved to another disk, its modes
changed) are sealed anew; other bytes are dropped and fetched again. Hashing every open was
rejected: SHA-256 runs at about 1.4 GB/s on one core (CRC32 2.2 GB/s), so a 512 MB copy
would cost 0.4 s of a reader's CPU per open, and whole-file hashing defeats what a cached
Parquet shard is for (reading a few columns, seeking to a row group on resume). Damage below
the file system (a failing disk) shows as a read error instead: the feed then drops the copy
and fetches the shard again once (:meth:`ShardCache.drop`) before it blames the shard.

Least recently used goes first. A shard larger than the bound, one for which no room can be
made because every copy is open, or one that does not fit on the disk (its free space is
below the shard's size, or a write ran out of space) is read from the store as if there were
no cache (``cache_bypassed`` in the stats); a full disk also warns once per process with a
:class:`CacheWarning` naming the directory and the fix.

Modules: :mod:`.options` (what a user sets, what an open reports), :mod:`.store` (the
directory: copies, fetches, the byte bound and eviction), :mod:`.seal` (what a copy was when
it was fetched, and whether it still is), :mod:`.files` (owner-only folders and files, and
the locks between processes).
"""

from __future__ import annotations

from ingest.storage.cache.options import CacheEvent, CacheOptions, CacheWarning
from ingest.storage.cache.store import ShardCache

__all__ = ["CacheEvent", "CacheOptions", "CacheWarning", "ShardCache"]
