"""ingest.ray_data.read: a ray.data.Dataset over this project's listing and formats, with the
rows ray.data.read_parquet reads of the same shards, on the loopback S3 server."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray.data

import ingest
from ingest.core.errors import ConfigError
from ingest.testing import Store, make_table, write_dataset

pytestmark = pytest.mark.usefixtures("ray_session")

SHARDS, ROWS = 4, 300


def rows_of(dataset: ray.data.Dataset, columns: list[str]) -> pa.Table:
    table = pa.concat_tables(ray.get(ref) for ref in dataset.to_arrow_refs())
    return table.select(columns).sort_by("id")


def test_the_rows_of_read_parquet_through_this_projects_formats(s3_store: Store) -> None:
    write_dataset(s3_store.fs, s3_store.url("d"), "parquet", SHARDS, ROWS, row_group_rows=64)
    url = s3_store.url("d")
    ours = ingest.ray_data.read(url, storage_options=s3_store.storage_options)
    assert ours.count() == SHARDS * ROWS
    handler = pafs.PyFileSystem(pafs.FSSpecHandler(s3_store.fs))
    theirs = ray.data.read_parquet(url.removeprefix("s3://"), filesystem=handler)
    columns = ["id", "tokens", "score", "text"]
    expected = pa.concat_tables(make_table(n * ROWS, ROWS) for n in range(SHARDS))
    assert rows_of(ours, columns).equals(rows_of(theirs, columns))
    assert rows_of(ours, columns).equals(expected.select(columns))
    # Columns as a stream takes them; two shards per read task.
    some = ingest.ray_data.read(
        url, storage_options=s3_store.storage_options, columns=["id", "text"], shards_per_task=2
    )
    assert some.schema().names == ["id", "text"]
    assert rows_of(some, ["id", "text"]).equals(expected.select(["id", "text"]))


def test_any_format_of_a_stream_and_clear_errors(s3_store: Store) -> None:
    write_dataset(s3_store.fs, s3_store.url("j"), "jsonl", 2, 50)
    got = ingest.ray_data.read(s3_store.url("j"), storage_options=s3_store.storage_options)
    assert sorted(got.to_pandas()["id"].tolist()) == list(range(100))
    with pytest.raises(ConfigError, match="shards_per_task=0"):
        ingest.ray_data.read(s3_store.url("j"), shards_per_task=0)
