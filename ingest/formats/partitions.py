"""Hive partitions as columns: the ``key=value`` directories of a shard's path
(:mod:`ingest.storage.sources.partitions`) become string columns of every batch read from
it, after the file's own, as ``ray.data.read_parquet`` (``partitioning="hive"``, its
default) reads them; types are left as strings, as there (a stage casts them).

A listing settles the stream's partition columns (:func:`partition_keys`) and their fields
(:func:`with_partition_fields`, which refuses a key that is also a file column); a reader
of any format is wrapped by :class:`PartitionedReader`, so no format knows of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ingest.core.errors import ConfigError, redact
from ingest.formats.base import DECLARED, MappedReader, ReadContext, ShardReader
from ingest.storage.sources import Shard

PARTITION_TYPE = pa.string()
"""Every partition column's type (Ray Data's: a directory name is text)."""


def partition_keys(shards: Sequence[Shard]) -> tuple[str, ...]:
    """The partition keys of ``shards``, each once, in the order their paths first name
    them."""
    keys: dict[str, None] = {}
    for shard in shards:
        for key, _ in shard.partition:
            keys.setdefault(key)
    return tuple(keys)


def with_partition_fields(
    schema: pa.Schema, keys: Sequence[str], shards: Sequence[Shard], origin: str
) -> pa.Schema:
    """``schema`` (the files' columns, from ``origin``) with a string field per key after.

    Raises:
        ConfigError: If a key is also a column of the files, naming the directory and the
            file, and the fix.
    """
    for key in keys:
        if key in schema.names:
            shard = next(s for s in shards if any(k == key for k, _ in s.partition))
            value = dict(shard.partition)[key]
            fix = (
                "leave the partition columns out of ReadOptions(schema=...): they come from "
                "the paths, as strings (cast them in a stage)"
                if origin == DECLARED
                else "rename the directories or the column"
            )
            raise ConfigError(
                f"{redact(shard.url)}: the directory '{key}={value}' makes {key!r} a hive "
                f"partition column, and {key!r} is also a column of {redact(origin)}: {fix}, "
                "or read with ReadOptions(partitioning=None) (the files' columns alone)"
            )
    out = schema
    for key in keys:
        out = out.append(pa.field(key, PARTITION_TYPE))
    return out


def without_partition_fields(schema: pa.Schema | None, keys: Sequence[str]) -> pa.Schema | None:
    """The files' part of a stream schema that :func:`with_partition_fields` made."""
    if schema is None or not keys:
        return schema
    return pa.schema([f for f in schema if f.name not in keys], metadata=schema.metadata)


class PartitionedReader(MappedReader):
    """A format's reader whose batches get the shard's partition columns
    (:attr:`ReadContext.partition_columns`, in :attr:`ReadContext.order` where given)."""

    def __init__(self, ctx: ReadContext, inner: ShardReader) -> None:
        super().__init__(ctx, inner)
        values = dict(ctx.shard.partition)
        self._values = [(key, values.get(key)) for key in ctx.partition_columns]

    def mapped(self, data: pa.RecordBatch) -> pa.RecordBatch:
        n = data.num_rows
        arrays = list(data.columns)
        schema = data.schema
        for key, value in self._values:
            arrays.append(
                pa.nulls(n, PARTITION_TYPE)
                if value is None
                else pa.repeat(pa.scalar(value, PARTITION_TYPE), n)
            )
            schema = schema.append(pa.field(key, PARTITION_TYPE))
        out = pa.RecordBatch.from_arrays(arrays, schema=schema)
        if self.ctx.order is not None:
            out = out.select(list(self.ctx.order))
        return out


__all__ = [
    "PARTITION_TYPE",
    "PartitionedReader",
    "partition_keys",
    "with_partition_fields",
    "without_partition_fields",
]
