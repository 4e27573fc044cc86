"""Hive partitions as columns: the ``key=value`` directories of a shard's path
(:mod:`ingest.storage.sources.partitions`) become string columns of every batch read from
it, after the file's own, as ``ray.data.read_parquet`` (``partitioning="hive"``, its
default) reads them; types are left as strings, as there, but where a declared schema
(``ReadOptions(schema=...)``) names a key: its type, each value cast (as pyarrow's hive
partitioning takes a schema).

A listing settles the stream's partition columns (:func:`partition_keys`) and their fields
(:func:`with_partition_fields`, which refuses a key that is also a file column); a reader
of any format is wrapped by :class:`PartitionedReader`, so no format knows of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ingest.core.errors import ConfigError, ShardError, redact
from ingest.formats.arrays import strings
from ingest.formats.base import MappedReader, ReadContext, ShardReader
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
    schema: pa.Schema,
    keys: Sequence[str],
    shards: Sequence[Shard],
    origin: str,
    declared: pa.Schema | None = None,
) -> pa.Schema:
    """``schema`` (the files' columns, from ``origin``) with a field per key after: a
    string, or the type ``declared`` (``ReadOptions.schema``) gives it.

    Raises:
        ConfigError: If a key is also a column of the files, naming the directory and the
            file, and the fix.
    """
    for key in keys:
        if key in schema.names:
            shard = next(s for s in shards if any(k == key for k, _ in s.partition))
            value = dict(shard.partition)[key]
            raise ConfigError(
                f"{redact(shard.url)}: the directory '{key}={value}' makes {key!r} a hive "
                f"partition column, and {key!r} is also a column of {redact(origin)}: rename "
                "the directories or the column, or read with ReadOptions(partitioning=None) "
                "(the files' columns alone)"
            )
    out = schema
    for key in keys:
        out = out.append(pa.field(key, partition_type(key, declared)))
    return out


def partition_type(key: str, declared: pa.Schema | None) -> pa.DataType:
    """The type of partition column ``key``: the declared schema's, else a string."""
    if declared is not None and key in declared.names:
        return declared.field(key).type
    return PARTITION_TYPE


def declared_partition_types(ctx: ReadContext) -> dict[str, pa.DataType]:
    """The partition columns of ``ctx`` a declared schema gives another type than a
    string, each with it (part of a derived copy's key: its rows are read so)."""
    out = {}
    for key in ctx.partition_columns:
        t = partition_type(key, ctx.options.schema)
        if not t.equals(PARTITION_TYPE):
            out[key] = t
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
        self._values = [
            (key, _typed(ctx, key, values.get(key), partition_type(key, ctx.options.schema)))
            for key in ctx.partition_columns
        ]

    def mapped(self, data: pa.RecordBatch) -> pa.RecordBatch:
        n = data.num_rows
        arrays = list(data.columns)
        schema = data.schema
        for key, value in self._values:
            arrays.append(pa.nulls(n, value.type) if not value.is_valid else pa.repeat(value, n))
            schema = schema.append(pa.field(key, value.type))
        out = pa.RecordBatch.from_arrays(arrays, schema=schema)
        if self.ctx.order is not None:
            out = out.select(list(self.ctx.order))
        return out


def _typed(ctx: ReadContext, key: str, value: str | None, to: pa.DataType) -> pa.Scalar:
    """A partition value as a scalar of its column's type (a null for None)."""
    text = strings([value], PARTITION_TYPE)[0]  # (pa.scalar would import pandas)
    if to.equals(PARTITION_TYPE):
        return text
    try:
        return text.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ShardError(
            ctx.shard.url,
            f"its directory '{key}={value}' is no {to}, the type ReadOptions(schema=...) "
            f"gives {key!r} ({e})",
            "rename the directory, or declare a type that holds it (a string)",
        ) from None


__all__ = [
    "PARTITION_TYPE",
    "PartitionedReader",
    "declared_partition_types",
    "partition_keys",
    "partition_type",
    "with_partition_fields",
    "without_partition_fields",
]
