"""Hive-style partitions: the ``key=value`` directories of a shard's path below the root it
was listed from.

Spark, Hive, pyarrow (``partitioning="hive"``), Ray Data and polars write a table's rows
split by the values of some columns, one directory level per column, and leave those
columns out of the files: ``s3://lake/t/lang=en/year=2024/part-0.parquet`` holds rows whose
``lang`` is ``en`` and ``year`` is ``2024``. A listing keeps each shard's
(:attr:`Shard.partition <ingest.storage.sources.Shard.partition>`); the stream adds them as
columns (:mod:`ingest.formats.partitions`).

Only directories below the listed root count (the root of ``s3://lake/t/lang=en`` is that
directory, so ``lang`` is not a column of its rows), as pyarrow's datasets and polars read
them. Values are unescaped (Hive writes ``/``, ``=``, ``%``, ``:`` and others as ``%XX``),
and Hive's null partition (:data:`HIVE_NULL`) is a null. Pure functions over paths.
"""

from __future__ import annotations

from glob import has_magic
from urllib.parse import unquote

from ingest.core.errors import ConfigError

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""The directory value Hive and Spark write for a null partition value."""

Partition = tuple[tuple[str, str | None], ...]
"""A shard's ``(key, value)`` pairs, outermost directory first; a value None is a null."""


def base_of(path: str, *, glob: bool) -> str:
    """The directory whose shards' partitions start below it: a listed directory itself,
    or a glob's directories before its first pattern (``b/t/lang=*/*.parquet``: ``b/t``)."""
    if not glob:
        return path.rstrip("/")
    fixed: list[str] = []
    for part in path.split("/"):
        if has_magic(part):
            break
        fixed.append(part)
    return "/".join(fixed).rstrip("/")


def hive_partition(base: str, path: str) -> Partition:
    """The ``key=value`` directories of ``path`` below ``base`` (both paths of one
    filesystem, without protocol), in order; ``()`` where there are none or ``path`` is not
    below ``base``. A directory without ``=`` (or starting with one) is no partition, nor
    is the file's own name.

    Raises:
        ConfigError: If a key comes twice in the path (two values for one column).
    """
    prefix = base + "/" if base else ""
    if not path.startswith(prefix) or "=" not in path:
        return ()
    directories = path[len(prefix) :].split("/")[:-1]
    pairs: list[tuple[str, str | None]] = []
    for directory in directories:
        key, equals, value = directory.partition("=")
        if not equals or not key:
            continue
        key, value = unquote(key), unquote(value)
        if any(k == key for k, _ in pairs):
            raise ConfigError(
                f"the partition key {key!r} twice in one path: {path} ({key}={value} below "
                f"{key}={dict(pairs)[key]}); a hive-partitioned dataset has one directory "
                "level per key: move the files, or read with ReadOptions(partitioning=None)"
            )
        pairs.append((key, None if value == HIVE_NULL else value))
    return tuple(pairs)


__all__ = ["HIVE_NULL", "Partition", "base_of", "hive_partition"]
