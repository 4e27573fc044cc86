"""What every format implements, and the types they share.

A format inspects a shard (row count, seekable blocks, schema: whatever its footer or index
tells cheaply) and opens a shard reader that yields Arrow record batches tagged with the row
offset of their first row, starting at any row. Formats know nothing of Ray or of plans.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.errors import ConfigError, ShardError
from ingest.core.intervals import rows_of_runs
from ingest.core.validate import BYTES_OR_NONE, COUNT, SECONDS, Number, check_numbers
from ingest.formats.arrays import ints
from ingest.formats.memory import use_fork_safe_allocator
from ingest.formats.spans import Parts, Range, coalesce, cut, cut_together, sliced
from ingest.storage.cache import CacheOptions
from ingest.storage.sources import RetryPolicy, Shard, Source

if TYPE_CHECKING:
    from ingest.formats.deleted_rows import Deletions

use_fork_safe_allocator()  # every read imports this module first: see ingest.formats.memory

Seek = tuple[int, int]
"""A place a format can jump to without reading what comes before: ``(row, cursor)``.

``cursor`` means what the format says: a byte offset (line formats, tar), a record batch
index (Arrow IPC file). Formats that seek by row alone (parquet) never hand one out."""


MAX_JSON_DEPTH = 1000
"""The most ``ReadOptions.max_json_depth`` allows: pyarrow's validation of a line 10,000
levels deep overflows an 8 MiB thread stack (a segmentation fault); 5,000 did not here."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOptions:
    """How shards are read. One instance serves every format.

    Attributes:
        block_bytes: Line formats: bytes read and parsed per chunk. WebDataset and Arrow
            IPC: read-ahead buffer size.
        max_line_bytes: Line formats (JSONL, CSV): longest line allowed, its newline not
            counted. A longer line is a :class:`~ingest.core.errors.ShardError` naming its
            offset, found after reading at most this many bytes of it, not an out-of-memory.
        max_json_depth: JSONL: deepest nesting of arrays and objects a line may hold
            (``[[1]]`` is 2). A deeper line is a :class:`~ingest.core.errors.ShardError` naming
            its offset (quarantined alone under ``on_error="skip"``), found before pyarrow
            parses it: pyarrow recurses once per level and crashes the process on lines
            thousands of levels deep. At most :data:`MAX_JSON_DEPTH`.
        batch_rows: Most rows per record batch a reader yields (parquet, Arrow, tar samples).
        prefetch: Record batches each lane of a feed reads ahead in a thread of its own
            (small ones of one shard, as after a resume inside a window, handed over
            together, up to 256 or 256 KiB: one item), and batches a feed with a transform
            makes ahead in another (0: read on demand).
        prefetch_bytes: Bytes read ahead, about, per feed (one rank's reading): the lanes'
            threads share it, and the ready batches ahead of the loop are held within it
            too; one item is always read ahead, however large (a record batch: a Parquet row
            group at most). None: ``prefetch`` items only.
        coalesce_bytes: Parquet: the row groups of one shard read in one call are fetched
            together, up to this many (uncompressed) bytes at a time, as merged concurrent
            range requests (object stores).
        pre_buffer: Parquet on local or other non-async filesystems: let pyarrow pre-buffer
            the column chunks of a row group instead of reading page by page.
        schema: Explicit schema for JSONL, CSV and WebDataset. None infers it from the first
            block of the first shard that holds a record (not a CSV file of its header line
            alone, nor a JSON Lines file of blank lines).
        timeout_s: Longest wait for the next record batch from the reader thread.
        retry: How the stream's source retries store faults under one deadline per
            request, and its S3/HTTP timeouts (see :class:`ingest.storage.sources.RetryPolicy`).
        on_error: What a shard that cannot be read (corrupt, truncated, a bad line, gone
            since the listing) or a transform that raises does to the run. ``"raise"``
            (default): the run fails with the error. ``"skip"``: the rows are quarantined:
            counted as consumed so no resume reads them again, not delivered, recorded with
            the shard URL, the rows and the reason (:mod:`ingest.core.quarantine`). A store that
            does not answer (:class:`~ingest.core.errors.StoreError`) is never skipped.
        max_errors: With ``on_error="skip"``, quarantines allowed per rank and epoch; the
            next one fails the run with the list of what was skipped.
        cache: A node-local shard cache (:class:`ingest.CacheOptions`: a directory and a
            byte bound): remote shards are fetched whole on first read and read from local
            disk after, by every process of the node and after a restart. None: off.
        file_concurrency: Folder datasets (``imagefolder``, ``audiofolder``): files of a
            work unit fetched at once by one reader.
        delimiter: CSV and TSV: the character between values, in place of the format's
            (``,``; a tab for TSV), as ``datasets`` takes ``sep=`` (``";"`` for a
            spreadsheet saved in a European locale, ``"|"``). None: the format's.
        column_names: CSV and TSV: the shards have no header line, and these name their
            columns: every record is a row, as ``datasets`` takes ``column_names=`` (a
            parallel corpus, a table dumped without its header). Such a shard's format is
            named for it (``tsv[\t no header]``). None: the first record is the header.
        field: JSON: each shard is one JSON object whose rows are under this key (a list
            of objects, or an object of equal-length column lists), as ``datasets`` takes
            ``field=`` (SQuAD's ``"data"``); read whole, up to ``max_line_bytes``. Such a
            shard's format is named for it (``jsonl[field=data]``). None: JSON Lines, or one
            JSON array of objects.
        partitioning: ``"hive"`` (default): the ``key=value`` directories of a shard's path
            below the listed root (``lang=en/year=2024/part-0.parquet``, as Spark, Hive and
            pyarrow write a partitioned table) are string columns of its rows, after the
            file's own, null where a shard's path has no such key (Hive's
            ``__HIVE_DEFAULT_PARTITION__`` too), as ``ray.data.read_parquet`` reads them
            (:mod:`ingest.formats.partitions`). None: the files' columns alone.
    """

    block_bytes: int = 8 << 20
    max_line_bytes: int = 64 << 20
    max_json_depth: int = 128
    batch_rows: int = 65_536
    prefetch: int = 4
    prefetch_bytes: int | None = 64 << 20
    coalesce_bytes: int = 64 << 20
    pre_buffer: bool = True
    schema: pa.Schema | None = None
    timeout_s: float = 300.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    on_error: str = "raise"
    max_errors: int = 100
    cache: CacheOptions | None = None
    file_concurrency: int = 16
    delimiter: str | None = None
    column_names: Sequence[str] | None = None
    field: str | None = None
    partitioning: str | None = "hive"

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f'on_error={self.on_error!r} must be "raise" or "skip"')
        if self.column_names is not None:
            object.__setattr__(self, "column_names", _checked_names(self.column_names, self.schema))
        _check_parsing(self.delimiter, self.field)
        if self.partitioning not in ("hive", None):
            raise ConfigError(
                f"partitioning={self.partitioning!r} must be 'hive' or None (the files' "
                "columns alone)"
            )
        check_numbers(
            self,
            "",
            block_bytes=Number(1, whole=True, unit="bytes"),
            max_line_bytes=Number(1, whole=True, unit="bytes"),
            max_json_depth=COUNT,
            batch_rows=COUNT,
            prefetch=Number(0, whole=True),
            coalesce_bytes=Number(1, whole=True, unit="bytes"),
            timeout_s=SECONDS,
            max_errors=Number(0, whole=True),
            file_concurrency=COUNT,
            prefetch_bytes=BYTES_OR_NONE,
        )
        if self.block_bytes < 1024:
            raise ConfigError(
                f"block_bytes={self.block_bytes} is below 1024; use at least "
                "1 KiB (the default is 8 MiB)"
            )
        if self.max_line_bytes < 1024:
            raise ConfigError(
                f"max_line_bytes={self.max_line_bytes} is below 1024; use at least 1 KiB "
                "(the default is 64 MiB)"
            )
        if self.max_json_depth > MAX_JSON_DEPTH:
            raise ConfigError(
                f"max_json_depth={self.max_json_depth} is above {MAX_JSON_DEPTH}; use at most "
                f"{MAX_JSON_DEPTH} (the default is 128): pyarrow recurses once per level, and "
                "lines thousands of levels deep crash the process"
            )
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")
        if self.cache is not None and not isinstance(self.cache, CacheOptions):
            raise TypeError(
                f"cache must be an ingest.CacheOptions, got {type(self.cache).__name__}"
            )
        if self.schema is not None and not isinstance(self.schema, pa.Schema):
            raise TypeError(f"schema must be a pyarrow.Schema, got {type(self.schema).__name__}")


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What a format learnt of a shard without reading its data.

    Attributes:
        rows: Row count, or None when only a full read can tell.
        blocks: Row offsets of independently readable blocks (parquet row groups), or None.
        schema: The shard's schema when its footer holds one.
        meta: Format-private metadata reused by readers (the parquet footer), never saved.
    """

    rows: int | None
    blocks: tuple[int, ...] | None = None
    schema: pa.Schema | None = None
    meta: Any = None
    seeks: tuple[Seek, ...] = ()
    """Seek points found by indexing the shard (line formats, tar, Arrow files)."""
    unread: Exception | None = None
    """Under ``ReadOptions(on_error="skip")``: why the shard could not be opened, counted or
    typed while the listing was made. Such a shard is planned with no rows (``rows`` 0) and
    quarantined whole, by the feed of rank 0 (:mod:`ingest.planner.catalog`)."""
    deletions: Deletions | None = None
    """A shard with deleted rows (a Delta file's deletion vector): ``rows`` and ``blocks``
    count the rows kept, and this holds the deleted ones and the file's own inspection
    (:mod:`ingest.formats.deleted_rows`)."""

    def seek_for(self, start: int, given: Seek | None) -> Seek | None:
        """The best seek point at or before ``start``: ``given`` or one from the index."""
        best = given if given is not None and given[0] <= start else None
        i = bisect.bisect_right(self.seeks, (start, float("inf"))) - 1
        if i >= 0 and (best is None or self.seeks[i][0] > best[0]):
            best = self.seeks[i]
        return best


EMPTY = ShardInfo(rows=0)


@dataclass(frozen=True, slots=True)
class RowBatch:
    """Rows ``[row, row + len(data))`` of a shard, and a seek point at or before ``row``."""

    row: int
    data: pa.RecordBatch
    seek: Seek | None = None
    share: int | None = field(default=None, kw_only=True)
    """``data``'s bytes once known: its share of the batch it was sliced from, or its own
    when first asked (see :attr:`nbytes`); None: not known yet."""

    @property
    def stop(self) -> int:
        return self.row + int(self.data.num_rows)

    @property
    def nbytes(self) -> int:
        """Bytes of ``data``. pyarrow's ``nbytes`` walks a slice's buffers (12 us for a slice
        of a fixed-size list column): a resume inside a window cuts a record batch into
        thousands of slices a few rows long, each counted two or three times by the lane's
        byte bounds, which took 0.3 s of a resumed first batch. :meth:`slice` gives each
        slice its share of the batch's bytes instead, worked out once per batch."""
        if self.share is None:  # worked out once: a batch cut into slices is asked for each
            object.__setattr__(self, "share", int(self.data.nbytes))
        return self.share  # type: ignore[return-value]

    def slice(self, offset: int, length: int) -> RowBatch:
        """Rows ``[offset, offset + length)`` of ``data``, as rows from ``self.row + offset``,
        with this batch's type, seek and share of its bytes."""
        rows = int(self.data.num_rows)
        if offset == 0 and length >= rows:
            return self
        share = self.nbytes * length // rows if rows else 0
        at = self.row + offset
        data = self.data.slice(offset, length)
        if type(self) is RowBatch:  # dataclasses.replace costs 3 times more
            return RowBatch(at, data, self.seek, share=share)
        return replace(self, row=at, data=data, share=share)


@dataclass(frozen=True, slots=True)
class BadRows(RowBatch):
    """Rows ``[row, row + len(data))`` that could not be parsed (``data``: nulls, one per
    row), yielded instead of raising under ``ReadOptions(on_error="skip")`` by formats that
    can go on after them (a bad line of a line format): the feed quarantines just them."""

    error: Exception | None = None


def indices(rows: npt.NDArray[np.int64]) -> pa.Array:
    """``rows`` as an Arrow int64 array for a take, over the same memory
    (:func:`ingest.formats.arrays.ints`: ``pa.array`` would import pandas)."""
    return ints(rows)


@dataclass(frozen=True, slots=True)
class Gathered:
    """Rows of one shard that do not all follow each other, read together: the parts of a
    read batch that belong to several spans (:meth:`ShardReader.read_gathered`), gathered
    in one take. A resume inside a shuffle window leaves the rest of the window as hundreds
    of spans a row or two long in each record batch; a slice, a piece and a Python object
    per span downstream took longer than the read (issue 32).

    ``rows[i]`` is the shard row of ``data``'s row ``i`` (increasing) and ``spans[i]`` the
    index of its span (increasing), as the caller numbers them (:meth:`renumbered`).
    """

    data: pa.RecordBatch
    rows: npt.NDArray[np.int64]
    spans: npt.NDArray[np.int64]
    seek: Seek | None
    share: int

    @staticmethod
    def of(batch: RowBatch, parts: Sequence[tuple[int, int, int]]) -> Gathered:
        """The rows of ``batch`` in ``parts`` (``(span, first row, row after the last)``, in
        row order)."""
        bounds = np.array(parts, dtype=np.int64).reshape(-1, 3)
        sizes = bounds[:, 2] - bounds[:, 1]
        local = rows_of_runs(bounds[:, 1] - batch.row, sizes)
        rows_in = int(batch.data.num_rows)
        share = batch.nbytes * len(local) // rows_in if rows_in else 0
        data = batch.data.take(indices(local))
        return Gathered(data, local + batch.row, np.repeat(bounds[:, 0], sizes), batch.seek, share)

    @property
    def row(self) -> int:
        return int(self.rows[0])

    @property
    def stop(self) -> int:
        return int(self.rows[-1]) + 1

    @property
    def nbytes(self) -> int:
        return self.share

    def slice(self, offset: int, length: int) -> Gathered:
        """Rows ``offset:offset + length`` of ``data``, with their share of the bytes."""
        rows = len(self.rows)
        share = self.share * length // rows if rows else 0
        end = offset + length
        return Gathered(
            self.data.slice(offset, length),
            self.rows[offset:end],
            self.spans[offset:end],
            self.seek,
            share,
        )

    def renumbered(self, spans: Sequence[int]) -> Gathered:
        """The same rows, span ``i`` called ``spans[i]``."""
        return replace(self, spans=np.asarray(spans, dtype=np.int64)[self.spans])

    def ends(self) -> Iterator[tuple[int, int]]:
        """``(span, row after its last row here)`` of each span it holds rows of."""
        last = np.flatnonzero(np.diff(self.spans, append=-1))
        yield from zip(self.spans[last].tolist(), (self.rows[last] + 1).tolist(), strict=True)


def _check_parsing(delimiter: object, field: object) -> None:
    """Check ``ReadOptions.delimiter`` and ``field``."""
    if field is not None and (not isinstance(field, str) or not field):
        raise ConfigError(
            f"field={field!r} must be the key of the rows in each JSON document (SQuAD's "
            "'data'), or None"
        )
    if delimiter is not None and (
        not isinstance(delimiter, str)
        or len(delimiter.encode()) != 1  # one ASCII character
        or delimiter in '"\r\n'
    ):
        raise ConfigError(
            f"delimiter={delimiter!r} must be one ASCII character other than a quote "
            "or a line break (',', ';', '|', '\\t'), or None for the format's own"
        )


def _checked_names(names: object, schema: object) -> tuple[str, ...]:
    """``ReadOptions.column_names`` as a tuple, or a ConfigError naming what is wrong."""
    ok = isinstance(names, (list, tuple)) and names and all(isinstance(n, str) and n for n in names)
    if not ok:
        raise ConfigError(
            f"column_names={names!r} must be a list of non-empty column names (the shards' "
            "columns, in order: they have no header line), or None (the first record is the "
            "header)"
        )
    got: tuple[str, ...] = tuple(names)  # type: ignore[arg-type]  # checked above
    twice = sorted({n for n in got if got.count(n) > 1})
    if twice:
        raise ConfigError(f"column_names={list(got)!r} names {twice} twice; name each column once")
    if isinstance(schema, pa.Schema) and list(schema.names) != list(got):
        raise ConfigError(
            f"column_names={list(got)!r} and the schema's names {schema.names} differ; give "
            "the schema the same names in the same order"
        )
    return got


@dataclass(frozen=True, slots=True)
class ReadContext:
    """Everything a shard reader needs, passed as one value.

    Attributes:
        source: Opens the shard and counts requests.
        shard: The shard to read.
        info: The shard's inspection result.
        options: Read options.
        schema: The stream's schema of the files' columns (all of them), which every shard
            must match.
        schema_origin: URL of the shard the schema was taken from, for error messages.
        columns: Columns of the file to keep, or None for all.
        partition_columns: The hive partition columns each batch gets after the file's
            (from :attr:`Shard.partition <ingest.storage.sources.Shard.partition>`: null
            where the shard has no such key); :func:`ingest.formats.open_reader` adds them,
            not the format.
        order: The order of the columns with them, where the stream names its columns (None:
            the file's, then the partition columns).
    """

    source: Source
    shard: Shard
    info: ShardInfo
    options: ReadOptions
    schema: pa.Schema | None
    schema_origin: str
    columns: Sequence[str] | None
    partition_columns: tuple[str, ...] = ()
    order: tuple[str, ...] | None = None


class ShardReader(ABC):
    """Reads rows of one opened shard."""

    def __init__(self, ctx: ReadContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        """Yield the rows ``[start, stop)`` (``stop`` None: to the end) in order.

        Args:
            start: First row to yield.
            stop: Row to stop before, or None.
            seek: A seek point handed out earlier by this format for this shard, with
                ``seek[0] <= start``; the reader jumps there instead of reading from row 0.
        """

    def read_spans(
        self, spans: Sequence[tuple[int, int | None]], seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch]]:
        """Read several row ranges of the shard, in the order given.

        Yields ``(index of the span, batch)``. ``seek`` applies to the first span. Spans a
        few rows apart (what a resume inside a shuffle window leaves) are read as one range
        (:meth:`read_ranges`) and cut (:mod:`ingest.formats.spans`).
        """
        ranges = coalesce(spans)
        yield from cut(self.read_ranges(ranges, seek), ranges, spans)

    def read_gathered(
        self, spans: Sequence[tuple[int, int | None]], seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch | Gathered]]:
        """:meth:`read_spans`, but the rows of several spans in one read batch come as one
        :class:`Gathered` (``(index of its first span, rows)``), not a slice each."""
        ranges = coalesce(spans)
        for item in cut_together(self.read_ranges(ranges, seek), ranges, spans):
            if not isinstance(item, Parts):
                yield item
            elif type(item.batch) is RowBatch:
                gathered = Gathered.of(item.batch, item.parts)
                yield int(gathered.spans[0]), gathered
            else:  # bad rows: each span's own (the feed quarantines them by span)
                yield from sliced(item.batch, item.parts)

    def read_ranges(
        self, ranges: Sequence[Range], seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch]]:
        """``(index of the range, batch)`` of coalesced ``ranges``, each range's batches in
        row order; ``seek`` applies to the first. Formats with random access override this
        to fetch the bytes of many ranges at once."""
        for n, r in enumerate(ranges):
            for batch in self.read(r.start, r.stop, seek if n == 0 else None):
                yield n, batch

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and buffers."""

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MappedReader(ShardReader):
    """Another reader (``inner``) whose batches of rows each go through :meth:`mapped` (the
    stream's schema of a shard written otherwise, its partition columns); quarantined rows
    (:class:`BadRows`), never delivered, go as they are."""

    def __init__(self, ctx: ReadContext, inner: ShardReader) -> None:
        super().__init__(ctx)
        self.inner = inner

    @abstractmethod
    def mapped(self, data: pa.RecordBatch) -> pa.RecordBatch:
        """The rows ``data`` as this reader hands them out."""

    def _map(self, batch: RowBatch) -> RowBatch:
        if isinstance(batch, BadRows):
            return batch
        return replace(batch, data=self.mapped(batch.data))

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        for batch in self.inner.read(start, stop, seek):
            yield self._map(batch)

    def read_ranges(
        self, ranges: Sequence[Range], seek: Seek | None
    ) -> Iterator[tuple[int, RowBatch]]:
        for n, batch in self.inner.read_ranges(ranges, seek):
            yield n, self._map(batch)

    def close(self) -> None:
        self.inner.close()


class Format(ABC):
    """A file format: inspects shards and opens readers."""

    name: ClassVar[str]
    extensions: ClassVar[tuple[str, ...]]
    selective: ClassVar[bool] = False
    """Whether a listing with ``format=`` this one takes only the files with its extensions
    (a folder dataset holds other files: a README, a labels file)."""
    empty_is_valid: ClassVar[bool] = True
    """Whether a zero-byte file is a shard of no rows (line formats) or a broken file
    (formats that start with a magic number)."""
    incidental: ClassVar[bool] = False
    """Whether files of this format listed beside shards of another are documents, left out
    (text: a ``README.txt`` beside Parquet shards;
    :func:`ingest.formats.without_incidental`)."""
    inspect_reads: ClassVar[bool] = True
    """Whether :meth:`inspect` reads the shard (a footer, a header). A listing inspects the
    shards of formats that do in threads, and the others in line: a thread per shard that
    reads nothing was half of a 20,000-shard listing's time
    (``benchmarks/listing_scale.py``)."""

    @abstractmethod
    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        """Read what the footer or index tells cheaply. Zero-byte shards never get here."""

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema | None:
        """The schema the stream adopts when ``shard`` is the first non-empty one; None
        where the shard holds no records to infer types from (a CSV file of its header line
        alone, a JSON Lines file of blank lines): the next shard's are taken."""
        if info.schema is None:
            raise NotImplementedError(f"format {self.name} must override infer_schema")
        return info.schema

    def schema_key(self, options: ReadOptions) -> str | None:
        """What :meth:`infer_schema` depends on besides the shard's bytes (this format's
        variant and the read options it uses), as a key under which the shard index keeps a
        schema it inferred: a restarted job then reads nothing for it. None (the default):
        nothing is kept (a schema from a footer, kept with the footer)."""
        return None

    def kept_schema(self, shard: Shard, schema: pa.Schema, options: ReadOptions) -> None:
        """Say of a schema the shard index kept (see :meth:`schema_key`) what
        :meth:`infer_schema` says of the one it infers (its warnings); nothing by default."""
        return

    @abstractmethod
    def open(self, ctx: ReadContext) -> ShardReader:
        """Open a reader over ``ctx.shard``."""

    def index(self, ctx: ReadContext) -> ShardInfo:
        """Read the whole shard once to count its rows and collect its seek points.

        Needed where the footer has no row count (JSONL, CSV, tar, IPC streams) and rows must
        be shared out evenly before reading. Formats whose footer knows both return it as is.
        """
        if ctx.info.rows is not None and (ctx.info.blocks or ctx.info.seeks):
            return ctx.info
        rows = 0
        seeks: list[Seek] = []
        with self.open(ctx) as reader:
            for batch in reader.read(0, None, None):
                rows = batch.stop
                if batch.seek is not None and (not seeks or seeks[-1] != batch.seek):
                    seeks.append(batch.seek)
        return replace(ctx.info, rows=rows, seeks=tuple(seeks))


class UncountedFormat(Format):
    """A format whose shards tell no row count short of reading them whole (JSON Lines, CSV,
    text, tar): its inspection reads nothing, and the shard index counts them
    (:meth:`Format.index`)."""

    inspect_reads = False

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        return ShardInfo(rows=None)


def clip(batches: Iterator[RowBatch], start: int, stop: int | None) -> Iterator[RowBatch]:
    """Trim a stream of batches to rows ``[start, stop)``, stopping early at ``stop``."""
    for b in batches:
        if stop is not None and b.row >= stop:
            return
        if b.stop <= start:
            continue
        lo = max(start - b.row, 0)
        hi = b.data.num_rows if stop is None else min(stop - b.row, b.data.num_rows)
        if lo == 0 and hi == b.data.num_rows:
            yield b
        else:
            yield replace(b, row=b.row + lo, data=b.data.slice(lo, hi - lo))
        if stop is not None and b.stop >= stop:
            return


def check_columns(
    url: str,
    columns: Sequence[str] | None,
    names: Sequence[str],
    row: int | None = None,
    *,
    typed: bool = False,
) -> None:
    """Raise if ``columns`` (the stream's ``columns=[...]``) names one that is not among the
    shard's ``names``, naming the missing ones and those it has (in every format: a
    column asked for is never dropped without a word). ``typed``: the shard is the one the
    stream takes its column types from (the first), so it has no type for the column.

    Raises:
        ShardError: Naming ``url``, the missing columns and ``names``.
    """
    missing = [c for c in columns or () if c not in names]
    if missing:
        first = " (the stream takes its column types from this shard, the first that holds "
        raise ShardError(
            url,
            f"has no column(s) {missing}; it has {list(names)}"
            + (first + "records)" if typed else ""),
            "fix columns=[...] or the data"
            + (
                ", or declare the types with ReadOptions(schema=...) (a column a shard lacks "
                "then reads as nulls)"
                if typed
                else ""
            ),
            row=row,
        )


def select(
    batch: pa.RecordBatch, columns: Sequence[str] | None, url: str, row: int
) -> pa.RecordBatch:
    """Keep ``columns`` of ``batch``, with an error naming the missing ones."""
    if columns is None:
        return batch
    check_columns(url, columns, batch.schema.names, row)
    return batch.select(list(columns))


DECLARED = "ReadOptions.schema"
"""The schema origin of a stream whose schema is declared (``ReadOptions(schema=...)``):
every shard is read cast to it where pyarrow casts its types (each value checked)."""
TABLE_LOG = "the log of the Delta table "
"""The start of the schema origin of a stream over one Delta table, whose log declares its
schema (:mod:`ingest.storage.sources.delta`), read as a declared one."""


def declares(origin: str) -> bool:
    """Whether a stream schema from ``origin`` is declared (:data:`DECLARED`, or a Delta
    table's log): each shard read cast to it, a column it lacks as nulls."""
    return origin == DECLARED or origin.startswith(TABLE_LOG)


def check_names(url: str, names: Sequence[str]) -> None:
    """Raise if a shard (``url``) has two columns of one name: a batch holds one column of a
    name, so one of them would be lost without a word.

    Raises:
        SchemaMismatchError: Naming ``url`` and the names.
    """
    if len(set(names)) == len(names):
        return
    from ingest.core.errors import SchemaMismatchError

    twice = sorted({n for n in names if names.count(n) > 1})
    raise SchemaMismatchError(
        url,
        f"has column(s) named twice: {twice} (its columns: {list(names)}); a batch holds "
        "one column of a name",
        "rename them where the shard is written (pyarrow: table.rename_columns([...]); a "
        "CSV file: its header)",
    )


def check_schema(
    url: str,
    schema: pa.Schema,
    expected: pa.Schema | None,
    origin: str,
    columns: Sequence[str] | None,
) -> None:
    """Raise :class:`SchemaMismatchError` if ``schema`` differs from ``expected``.

    Only ``columns`` are compared when given. Columns in another order, and types whose
    values the stream's type holds (``string`` and ``large_string``, ``int32`` and
    ``int64``, ``null`` and any: :func:`ingest.formats.conform.holds`), agree, as does any
    type pyarrow casts to a declared one (``origin`` :data:`DECLARED`): such a shard is
    read conformed to the stream's (:mod:`ingest.formats.conform`).
    """
    from ingest.core.errors import SchemaMismatchError

    check_names(url, schema.names)
    if expected is None:
        return
    names = list(columns) if columns is not None else None
    got = _project(schema, names)
    want = _project(expected, names)
    if got.equals(want):
        return
    from ingest.formats.conform import reads_as  # it reads through this module's types

    declared = declares(origin)
    if (declared or sorted(got.names) == sorted(want.names)) and all(
        reads_as(got.field(w.name).type, w.type, declared=declared)
        for w in want
        if w.name in got.names
    ):
        # But for order and types that hold it, the same: read conformed. A declared
        # schema reads a column a shard lacks as nulls, and leaves out one it does not name.
        return
    diffs = []
    for f in want:
        other = got.field(f.name) if f.name in got.names else None
        if other is None:
            diffs.append(f"missing column {f.name!r}")
        elif not reads_as(other.type, f.type, declared=declared):
            diffs.append(f"column {f.name!r} is {other.type}, not {f.type}")
    diffs += [f"extra column {n!r}" for n in got.names if n not in want.names]
    declare = (
        ""
        if declared
        else "declare the stream's columns and types with ReadOptions(schema=...) to read "
        "every shard cast to them (each value checked; a column a shard lacks as nulls, one "
        "no field names left out), "
    )
    raise SchemaMismatchError(
        url,
        f"schema differs from {origin}'s: {'; '.join(diffs) or 'column order differs'}",
        f"{declare}make the shards agree, select the shared columns with columns=[...], or "
        "read them as separate streams",
    )


def _project(schema: pa.Schema, names: list[str] | None) -> pa.Schema:
    if names is None:
        return pa.schema([pa.field(f.name, f.type) for f in schema])
    return pa.schema(
        [
            pa.field(n, schema.field(n).type) if n in schema.names else pa.field(n, pa.null())
            for n in names
        ]
    )
