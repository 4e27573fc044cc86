"""Ray Data in: a ``ray.data.Dataset`` over this project's listing, formats and stores.

For offline jobs (tokenizing a corpus, batch inference) that want Ray Data's operators on
shards this project reads: the source is listed once, on the driver, through the same
catalog as a stream (its index store, the Hugging Face Hub resolution, every registered
format: Parquet, JSONL, CSV, Arrow IPC, WebDataset tar, image and audio folders), and each
read task reads whole shards through the same formats and :class:`Source` (its retries and
the node's shard cache, :class:`ingest.CacheOptions`).

Training should not read this way. A Dataset split across ranks (``get_dataset_shard``,
``streaming_split``) is dynamic: a restart cannot say which rows a rank consumed, the world
size cannot change mid-epoch, and ranks may get different numbers of batches. A
:class:`ingest.RayStream` under :func:`ingest.train.rank_iterator` gives exactly-once resume
at any world size with equal steps per rank (README: "From Ray Data to ingest").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from ingest.core.errors import ConfigError
from ingest.engine.spec import StreamSpec
from ingest.formats import open_reader
from ingest.formats.base import BadRows, ReadOptions
from ingest.planner.catalog import Listing
from ingest.storage.sources import URLs


def read(
    source: URLs,
    *,
    storage_options: Mapping[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    format: str | None = None,
    read: ReadOptions | None = None,
    shards_per_task: int = 1,
) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of the rows of ``source`` (URLs, globs or directories, as a
    stream takes them), listed once here; one read task per ``shards_per_task`` shards, in
    listing order.

    Raises:
        ConfigError: If the source lists no shard, or ``shards_per_task`` is below 1.
    """
    if shards_per_task < 1:
        raise ConfigError(f"shards_per_task={shards_per_task} must be at least 1")
    spec = StreamSpec.of(
        source, storage_options=storage_options, columns=columns, read=read, format=format
    )
    listing = spec.planner().scan()
    if not listing.shards:
        raise ConfigError(f"{spec.urls[0]} lists no shard to read")
    dataset: ray.data.Dataset = ray.data.read_datasource(_Shards(spec, listing, shards_per_task))
    return dataset


class _Shards(Datasource):
    """The shards of one listing, read whole by this project's formats."""

    def __init__(self, spec: StreamSpec, listing: Listing, per_task: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.spec, self.listing, self.per_task = spec, listing, per_task

    def get_name(self) -> str:
        return "ingest"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(s.size for s in self.listing.shards)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        # Whole shards per task: this project's formats seek within a shard, but a task per
        # part of a shard would open its footer once per part.
        shards = self.listing.shards
        count = len(shards)
        per = max(self.per_task, -(-count // parallelism)) if parallelism > 0 else self.per_task
        tasks = []
        for first in range(0, count, per):
            group = list(range(first, min(first + per, count)))
            infos = [self.listing.infos[n] for n in group]
            rows = [i.rows for i in infos]
            meta = BlockMetadata(
                num_rows=None if None in rows else sum(r or 0 for r in rows),
                size_bytes=sum(shards[n].size for n in group),
                input_files=tuple(shards[n].url for n in group),
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    _reader(self.spec, self.listing, group),
                    meta,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def _reader(spec: StreamSpec, listing: Listing, group: list[int]) -> Any:
    def read_fn() -> Iterator[pa.Table]:
        source = spec.source()
        for n in group:
            ctx = listing.context(n, source, spec.read, spec.columns)
            with open_reader(ctx) as reader:
                for batch in reader.read(0, None, None):
                    if isinstance(batch, BadRows):  # quarantined rows (on_error="skip")
                        continue
                    yield pa.Table.from_batches([batch.data.replace_schema_metadata(None)])

    return read_fn


__all__ = ["read"]
