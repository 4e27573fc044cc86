"""What the peers that read their own format share: the bench's rows, and the S3 settings.

Mosaic Streaming and LitData cannot read the Parquet shards the other contenders read: each
reads only its own format (MDS shards, LitData chunks), written by its own writer. Their
contenders convert the same rows first (:func:`shard_paths`, :func:`read_shard`) and the
bench reports the conversion's seconds and CPU apart (the cost they need and this project
does not). Mosaic takes the S3 endpoint and keys from the environment only
(:func:`s3_environment`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from ingest.tools.bench.data import Dataset


def shard_paths(data: Dataset) -> list[str]:
    """Every Parquet shard of ``data`` (``bucket/key``), in listing order."""
    import s3fs

    paths: list[str] = sorted(s3fs.S3FileSystem(**data.storage_options()).glob(data.glob))
    return paths


def read_shard(options: dict[str, Any], columns: list[str], path: str) -> pa.Table:
    """The ``columns`` of the Parquet shard at ``path`` (``bucket/key``), read with s3fs."""
    import s3fs

    with s3fs.S3FileSystem(**options).open(path, "rb") as f:
        table: pa.Table = pq.read_table(f, columns=columns)
    return table


def rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` as samples: ints stay ints, fixed-size lists become arrays."""
    columns: dict[str, npt.NDArray[Any]] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        arr = column.combine_chunks()
        if pa.types.is_fixed_size_list(arr.type):
            size = arr.type.list_size
            flat = arr.values.slice(arr.offset * size, len(arr) * size).to_numpy()
            columns[name] = np.ascontiguousarray(flat.reshape(len(arr), size))
        else:
            columns[name] = arr.to_numpy()
    for i in range(table.num_rows):
        yield {name: values[i] for name, values in columns.items()}


def s3_options(data: Dataset) -> dict[str, str]:
    """boto3 client keyword arguments that reach ``data``'s store through the proxy."""
    return {
        "endpoint_url": data.endpoint,
        "aws_access_key_id": data.key,
        "aws_secret_access_key": data.secret,
        "region_name": "us-east-1",
    }


def s3_variables(data: Dataset) -> dict[str, str]:
    """Environment variables through which boto3 (and Mosaic) reach ``data``'s store."""
    return {
        "S3_ENDPOINT_URL": data.endpoint,
        "AWS_ACCESS_KEY_ID": data.key,
        "AWS_SECRET_ACCESS_KEY": data.secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def s3_environment(data: Dataset) -> contextlib.AbstractContextManager[None]:
    """Set :func:`s3_variables` for the block, then restore what was there."""
    return environment(s3_variables(data))


@contextlib.contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """Set ``variables`` in ``os.environ`` for the block, then restore what was there."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
