"""Footers in the shard index: a shard's inspection (a Parquet footer: rows, row groups,
schema) kept as its format's own bytes, so that a restarted job, or another node, plans
without reading any footer again.

A catalog keeps inspections in memory for the epochs of one stream; a new process (a job
restarted from its checkpoint) had none, and read every footer again: on small shards a
footer read is the shard's last 64 KiB, the whole shard (7 restarts of an HTTP stream served
11.3 times the data, against 1.2-1.6 times for an epoch). A format that can give its
inspection back from bytes (a :class:`FooterFormat`: Parquet, Arrow IPC) has them kept
here, under the shard's URL, size, version and format: a shard rewritten in place is
inspected again.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

from ingest.formats import get_format
from ingest.formats.base import ShardInfo
from ingest.planner.index.entries import shard_identity
from ingest.planner.index.store import IndexEntryWarning, IndexStore
from ingest.storage.sources import Shard


@runtime_checkable
class FooterFormat(Protocol):
    """A format whose inspection the shard index keeps as bytes."""

    def footer_of(self, info: ShardInfo) -> bytes:
        """The bytes to keep of ``info`` (the format's ``inspect``'s)."""
        ...

    def from_footer(self, shard: Shard, footer: bytes) -> ShardInfo:
        """``inspect``'s result again, from the bytes :meth:`footer_of` gave."""
        ...


Key = tuple[str, int, str]
"""A catalog's key of an inspection: the shard's URL, size and version."""


def _key(shard: Shard) -> Key:
    return (shard.url, shard.size, shard.version)


_KEEPS: dict[type, bool] = {}
"""Whether each format class is a :class:`FooterFormat`: ``isinstance`` against a runtime
protocol looks up its members every call, a third of a 20,000-shard listing's time
(``benchmarks/listing_scale.py``)."""


def _format(shard: Shard) -> FooterFormat | None:
    """``shard``'s format if it keeps footers and the shard has one (not empty, not a folder
    dataset's unit), else None."""
    if shard.size <= 0 or shard.members:
        return None
    fmt = get_format(shard.format)
    kind = type(fmt)
    keeps = _KEEPS.get(kind)
    if keeps is None:
        keeps = _KEEPS[kind] = isinstance(fmt, FooterFormat)
    return fmt if keeps else None  # type: ignore[return-value]


def stored_footers(store: IndexStore, shards: Sequence[Shard]) -> dict[Key, ShardInfo]:
    """The inspections of ``shards`` that ``store`` keeps footers of (one batch of reads).

    A footer its format cannot read back is left out with a warning (read and kept again).

    Raises:
        IndexStoreError: If the index location cannot be read.
    """
    wanted = [(s, f) for s in shards if (f := _format(s)) is not None]
    if not wanted:
        return {}
    out: dict[Key, ShardInfo] = {}
    footers = store.get_footers([s for s, _ in wanted])
    for (shard, fmt), footer in zip(wanted, footers, strict=True):
        if footer is None:
            continue
        try:
            out[_key(shard)] = fmt.from_footer(shard, footer)
        except Exception as e:  # a damaged entry: the shard's own footer is read instead
            warnings.warn(
                f"shard index footer for {shard_identity(shard.url)} is ignored "
                f"({type(e).__name__}: {e}); the footer is read again and kept",
                IndexEntryWarning,
                stacklevel=2,
            )
    return out


def keep_footers(
    store: IndexStore, inspected: Sequence[tuple[Shard, ShardInfo]], known: Collection[Key]
) -> None:
    """Keep the footers of the shards just inspected (those not in ``known``, already kept
    or inspected before) in ``store``, in one batch of writes.

    Raises:
        IndexStoreError: If the index location cannot be written.
    """
    items = []
    for shard, info in inspected:
        fmt = _format(shard)
        if fmt is None or _key(shard) in known or getattr(info, "unread", None) is not None:
            continue
        items.append((shard, fmt.footer_of(info)))
    store.put_footers(items)
