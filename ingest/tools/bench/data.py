"""The generated data every contender reads: two Parquet datasets on the loopback S3 server.

``main``: ``ingest.testing.make_table`` rows (a unique ``id``, 16 int32 ``tokens``, a float
and a string); the contenders read ``id`` and ``tokens``. ``labeled``: ``id`` and ``label``
where shard ``i`` holds only label ``i % labels`` (every shard sorted by label: data
written by source, date or class, the usual case), for the shuffle-quality pass. Ids run
0..N-1 in both, so a consumer can check that every row arrived exactly once.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ingest.tools.bench.config import BenchConfig
from ingest.tools.loopback.s3 import LoopbackS3
from ingest.tools.loopback.shards import write_dataset

BUCKET = "bench"


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataset:
    """A generated dataset as contenders reach it: through the counting proxy.

    Attributes:
        name: ``main`` or ``labeled``.
        url: Directory URL, ``s3://bench/<name>``.
        rows: Rows in all shards.
        shards: Number of shards.
        columns: Columns the contenders read.
        labels: Distinct values of the ``label`` column; None when it has none.
        endpoint: The proxy's endpoint.
        key: Access key of the loopback server.
        secret: Secret key of the loopback server.
    """

    name: str
    url: str
    rows: int
    shards: int
    columns: tuple[str, ...]
    labels: int | None
    endpoint: str
    key: str
    secret: str

    @property
    def glob(self) -> str:
        """A glob of the shards, ``s3://bench/<name>/*.parquet``."""
        return f"{self.url}/*.parquet"

    @property
    def bucket_path(self) -> str:
        """The directory without a scheme, as pyarrow filesystems take it."""
        return self.url.removeprefix("s3://")

    def storage_options(self) -> dict[str, Any]:
        """s3fs options that reach the store through the proxy."""
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
            "skip_instance_cache": True,
        }

    def pyarrow_filesystem(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` that reaches the store through the proxy."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=self.key,
            secret_key=self.secret,
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            region="us-east-1",
        )


def labeled_table(shard: int, rows: int, labels: int) -> pa.Table:
    """Shard ``shard`` of the labeled dataset: ids ``shard*rows...`` and one label."""
    return pa.table(
        {
            "id": np.arange(shard * rows, (shard + 1) * rows, dtype=np.int64),
            "label": np.full(rows, shard % labels, dtype=np.int64),
        }
    )


def write(s3: LoopbackS3, endpoint: str, config: BenchConfig) -> tuple[Dataset, Dataset]:
    """Write both datasets straight to ``s3`` (not through the proxy).

    Args:
        s3: The loopback S3 server.
        endpoint: Where contenders reach it (the counting proxy).
        config: Shard, row and row-group counts.

    Returns:
        The ``main`` and ``labeled`` datasets.
    """
    s3.create_bucket(BUCKET)
    fs = s3.filesystem()

    def dataset(name: str, columns: tuple[str, ...], labels: int | None) -> Dataset:
        return Dataset(
            name=name,
            url=f"s3://{BUCKET}/{name}",
            rows=config.total_rows,
            shards=config.shards,
            columns=columns,
            labels=labels,
            endpoint=endpoint,
            key=s3.key,
            secret=s3.secret,
        )

    main = dataset("main", ("id", "tokens"), None)
    write_dataset(
        fs, main.url, "parquet", config.shards, config.rows, row_group_rows=config.row_group
    )
    labeled = dataset("labeled", ("id", "label"), config.labels)
    for shard in range(config.shards):
        sink = io.BytesIO()
        table = labeled_table(shard, config.rows, config.labels)
        pq.write_table(table, sink, row_group_size=config.row_group)
        fs.pipe(f"{labeled.url}/part-{shard:05d}.parquet", sink.getvalue())
    return main, labeled
