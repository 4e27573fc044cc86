"""The Ray Data side: one deterministic read task per span, and the decode pool.

Each read task reads one span (a shard and a row range), so Ray's task retries and lineage
reconstruction read the same rows again. Every block carries its provenance in three
columns (segment, shard index, row offset) that the rank iterator strips. User transforms run
in ``map_batches`` on an actor pool (``ActorPoolStrategy``), constructed once per actor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from ingest.assign import Span
from ingest.errors import ConfigError
from ingest.formats import get_format
from ingest.formats.base import ReadContext
from ingest.plan import permutation

PROVENANCE_COLUMN = "__ingest_provenance__"
PROVENANCE = (PROVENANCE_COLUMN,)
# Provenance packed in one uint64 per row: 1 bit segment, 23 bits shard index, 40 bits row.
# One column of 8 bytes costs less to move through the object store than three.
_ROW_BITS, _SHARD_BITS = 40, 23
MAX_SHARDS, MAX_ROWS = 1 << _SHARD_BITS, 1 << _ROW_BITS


def pack(segment: int, shard: int, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """Provenance of rows ``rows`` of ``shard`` as one uint64 each."""
    if shard >= MAX_SHARDS or (len(rows) and int(rows[-1]) >= MAX_ROWS):
        raise ConfigError(
            f"shard index {shard} or row {int(rows[-1])} is beyond what provenance "
            f"holds ({MAX_SHARDS} shards of {MAX_ROWS} rows); split the stream"
        )
    head = np.uint64((segment << (_SHARD_BITS + _ROW_BITS)) | (shard << _ROW_BITS))
    return rows.astype(np.uint64) | head


def unpack(
    packed: npt.NDArray[np.uint64],
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """(segments, shards, rows) of packed provenance."""
    segment = (packed >> np.uint64(_SHARD_BITS + _ROW_BITS)).astype(np.int8)
    shard = ((packed >> np.uint64(_ROW_BITS)) & np.uint64(MAX_SHARDS - 1)).astype(np.int32)
    row = (packed & np.uint64(MAX_ROWS - 1)).astype(np.int64)
    return segment, shard, row


Transform = Callable[[pa.Table], Any] | type


def read_spans(
    ctx: ReadContext, spans: Sequence[Span], seed: int | None, epoch: int, provenance: bool = True
) -> Iterator[pa.Table]:
    """Read ``spans`` of one shard and tag their rows; with a seed, permute within batches."""
    with get_format(ctx.shard.format).open(ctx) as reader:
        for index, batch in reader.read_spans([(s.start, s.stop) for s in spans], None):
            span = spans[index]
            n = batch.data.num_rows
            table = pa.Table.from_batches([batch.data.replace_schema_metadata(None)])
            if provenance:
                rows = np.arange(batch.row, batch.stop, dtype=np.int64)
                table = table.append_column(
                    PROVENANCE_COLUMN, pa.array(pack(span.segment, span.shard, rows))
                )
            if seed is not None:
                key = ("rank-rows", seed, epoch, ctx.shard.url, batch.row)
                table = table.take(permutation(n, *key))
            yield table


class SpanDatasource(Datasource):
    """A Ray Data datasource over a rank's spans, in order.

    Consecutive spans of one shard make one read task, so the format can fetch their bytes
    together; a task always reads the same rows, which is what makes Ray's retries safe.

    Args:
        contexts: One read context per span (the span's shard, its footer, the options).
        spans: The spans, in the order the rank consumes them.
        seed: Shuffle seed (None: rows in file order).
        epoch: The epoch, part of the in-batch permutation key.
        provenance: Tag rows with (segment, shard, row) columns.
    """

    def __init__(
        self,
        contexts: Sequence[ReadContext],
        spans: Sequence[Span],
        seed: int | None,
        epoch: int,
        *,
        provenance: bool = True,
    ) -> None:
        self._groups: list[tuple[ReadContext, list[Span]]] = []
        for ctx, span in zip(contexts, spans, strict=True):
            if self._groups and self._groups[-1][1][-1].shard == span.shard:
                self._groups[-1][1].append(span)
            else:
                self._groups.append((ctx, [span]))
        self._seed = seed
        self._epoch = epoch
        self._provenance = provenance

    @property
    def num_tasks(self) -> int:
        return len(self._groups)

    @staticmethod
    def _bytes(ctx: ReadContext, rows: int) -> int:
        return ctx.shard.size * rows // max(ctx.info.rows or 1, 1)

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(self._bytes(ctx, sum(s.rows for s in spans)) for ctx, spans in self._groups)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        tasks = []
        for ctx, spans in self._groups:
            rows = sum(s.rows for s in spans)
            meta = BlockMetadata(
                num_rows=rows,
                size_bytes=self._bytes(ctx, rows),
                exec_stats=None,
                input_files=(ctx.shard.url,),
            )
            fn = functools.partial(
                read_spans, ctx, spans, self._seed, self._epoch, self._provenance
            )
            tasks.append(ReadTask(fn, meta))
        return tasks

    def get_name(self) -> str:
        return "IngestSpans"


def as_table(out: Any, what: str) -> pa.Table:
    """A transform's result as an Arrow table (numpy arrays of any rank are accepted)."""
    if isinstance(out, pa.Table):
        return out
    if isinstance(out, pa.RecordBatch):
        return pa.Table.from_batches([out])
    if isinstance(out, Mapping):
        columns = {}
        for name, value in out.items():
            if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
                value = value.numpy()  # torch tensors
            if isinstance(value, np.ndarray) and value.ndim > 1:
                columns[name] = pa.FixedShapeTensorArray.from_numpy_ndarray(
                    np.ascontiguousarray(value)
                )
            else:
                columns[name] = value
        return pa.table(columns)
    raise ConfigError(
        f"{what} returned {type(out).__name__}; return a pyarrow Table or "
        "RecordBatch, or a dict of column name -> numpy array/tensor/list"
    )


class Decoder:
    """The decode pool's actor: runs the user transform on each block, keeps provenance.

    Args:
        transform: A function over an Arrow table, or a class whose instances are such
            functions (constructed once per actor: tokenizers, image decoders).
    """

    def __init__(self, transform: Transform) -> None:
        self._name = getattr(transform, "__qualname__", repr(transform))
        self._fn: Callable[[pa.Table], Any] = (
            transform() if isinstance(transform, type) else transform
        )

    def __call__(self, table: pa.Table) -> pa.Table:
        tagged = [name for name in PROVENANCE if name in table.column_names]
        data = table.drop_columns(tagged)
        out = as_table(self._fn(data), f"transform {self._name}")
        if out.num_rows != data.num_rows:
            raise ConfigError(
                f"transform {self._name} returned {out.num_rows} rows for "
                f"{data.num_rows}; transforms must keep one output row per input "
                "row, in order (filter in the training loop instead)"
            )
        for name in tagged:
            out = out.append_column(name, table.column(name))
        return out
