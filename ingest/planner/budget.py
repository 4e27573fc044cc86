"""Memory bounds in bytes, turned into rows from what the listing says.

A feed holds rows: a shuffle window of them, the record batches its lanes read ahead and the
batches ready ahead of the loop. Bounds in rows are bounds in bytes only for rows of one
size: 16,384 rows of 1 MiB images are 16 GiB. The shuffle window's size in rows is part of
the reading order and of the saved positions (:func:`ingest.core.positions.check_positions` counts
windows of rows), so its byte bound becomes rows once per epoch, when the epoch is planned,
as a pure function of the listing, never of what was read or when: the same listing gives
the same window, and a state records the window it was saved with. What does not change the
order (the read-ahead queues) is bounded in bytes directly.

Bytes per row come from the listing: the uncompressed size of the columns read in Parquet
footers (close to their size in memory), else the file's size over its rows (a compressed
JSONL or CSV shard holds several times that in memory). A window mixes the rows of several
shards, so the bound takes the largest bytes per row among up to :data:`SAMPLE` shards
spread over the listing (a few footers' worth of work for any listing size).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.formats.base import ShardInfo
    from ingest.planner.catalog import Listing
    from ingest.storage.sources import Shard

SAMPLE = 256
"""Shards whose bytes per row are looked at, spread evenly over the listing."""
_ROW_GROUPS = 8
"""Row groups of a Parquet footer looked at, spread evenly over the file."""


def shard_row_bytes(shard: Shard, info: ShardInfo, columns: Sequence[str] | None) -> float | None:
    """Bytes per row of ``shard`` in memory, estimated from its listing; None when its row
    count is unknown or zero."""
    if not info.rows:
        return None
    if info.meta is not None:
        import pyarrow.parquet as pq  # only where a footer was read

        if isinstance(info.meta, pq.FileMetaData) and info.meta.num_row_groups:
            return _parquet_row_bytes(info.meta, columns)
    return shard.size / info.rows


def _parquet_row_bytes(meta: Any, columns: Sequence[str] | None) -> float | None:
    """Uncompressed bytes per row of the ``columns`` (None: all) of some row groups."""
    groups = meta.num_row_groups
    schema = meta.schema
    wanted = None if columns is None else set(columns)
    leaves = [
        i
        for i in range(len(schema))
        if wanted is None or schema.column(i).path.split(".")[0] in wanted
    ]
    size = rows = 0
    step = max(1, groups // _ROW_GROUPS)
    for g in range(0, groups, step):
        group = meta.row_group(g)
        rows += group.num_rows
        if wanted is None:
            size += group.total_byte_size
        else:
            size += sum(group.column(i).total_uncompressed_size for i in leaves)
    return size / rows if rows else None


def row_bytes(listing: Listing, columns: Sequence[str] | None) -> float | None:
    """The largest bytes per row among up to :data:`SAMPLE` shards of ``listing``; None
    when no shard looked at has a row count (unindexed JSONL, CSV or tar)."""
    count = len(listing.shards)
    step = max(1, -(-count // SAMPLE))
    found = [
        shard_row_bytes(listing.shards[n], listing.infos[n], columns) for n in range(0, count, step)
    ]
    known = [b for b in found if b is not None]
    return max(known) if known else None


def listing_window_rows(
    listing: Listing, columns: Sequence[str] | None, window: int, window_bytes: int | None
) -> int:
    """Rows per shuffle window in an epoch of ``listing``: :func:`window_rows` with the
    listing's bytes per row (:func:`row_bytes`, looked at only when bytes bound the window)."""
    per_row = row_bytes(listing, columns) if window_bytes else None
    return window_rows(window, window_bytes, per_row)


def window_rows(window: int, window_bytes: int | None, per_row: float | None) -> int:
    """Rows per shuffle window: ``window``, or fewer so that the window holds about
    ``window_bytes`` of rows of ``per_row`` bytes (one row at least).

    Args:
        window: The most rows (``shuffle_window``).
        window_bytes: The most bytes (``shuffle_bytes``); None: rows only.
        per_row: Bytes per row (:func:`row_bytes`); None: unknown, rows only.
    """
    if window_bytes is None or not per_row:
        return window
    return max(1, min(window, int(window_bytes // per_row)))


__all__ = ["SAMPLE", "listing_window_rows", "row_bytes", "shard_row_bytes", "window_rows"]
