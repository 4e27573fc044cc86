"""The format contract: every format, on local disk and on the loopback S3 server.

Each subclass names a generated format; the tests are the same for all: row count, read-all
equals the file, seek to row k equals the tail from k (and reads less than the whole shard
where the format can seek), corrupt input raises a clear error naming the URL.
"""

from __future__ import annotations

import bz2
import gzip
import itertools
import json
import lzma
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, ClassVar

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import ingest
from ingest.core.errors import ConfigError, SchemaMismatchError, ShardError
from ingest.engine.derived import read_fingerprint
from ingest.formats import get_format
from ingest.formats.base import ReadOptions, RowBatch
from ingest.planner.catalog import Catalog, Listing
from ingest.storage.sources import Source
from ingest.testing import Store, date_time_table, encode, make_table
from tests.resumed import through_a_resume

ROWS = 3000
OPTIONS = ReadOptions(block_bytes=4096, batch_rows=256)


def open_shard(
    store: Store, fmt: str, data: bytes, options: ReadOptions = OPTIONS
) -> tuple[Catalog, Listing]:
    store.write(f"shard.{fmt}", data)
    source = Source(store.url(f"shard.{fmt}"), storage_options=store.storage_options)
    catalog = Catalog(source, options, None)
    return catalog, catalog.scan()


def _wide_parquet(rows: int, row_bytes: int, *, seed: int) -> bytes:
    """Four row groups of ``rows`` rows: an ``id`` and ``row_bytes`` random bytes a row (no
    dictionary, so that a group's bytes are its rows')."""
    blob = np.random.default_rng(seed).integers(0, 256, rows * 4 * row_bytes, dtype=np.uint8)
    payload = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(row_bytes), rows * 4, [None, pa.py_buffer(blob.tobytes())]
    )
    table = pa.table({"id": np.arange(rows * 4), "blob": payload})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=rows, use_dictionary=False)
    return bytes(sink.getvalue().to_pybytes())


def read(
    catalog: Catalog,
    listing: Listing,
    start: int = 0,
    stop: int | None = None,
    seek: tuple[int, int] | None = None,
) -> list[RowBatch]:
    ctx = listing.context(0, catalog.source, catalog.options, catalog.columns)
    with get_format(ctx.shard.format).open(ctx) as reader:
        return list(reader.read(start, stop, seek))


def ids(batches: list[RowBatch], key: str) -> list[int]:
    out: list[int] = []
    for b in batches:
        col = b.data.column(key).to_pylist()
        if key == "__key__":
            out += [int(v[len("sample") :]) for v in col]
        else:  # a text shard's lines are the ids as text
            out += [int(v) for v in col] if key == "text" else col
    return out


class FormatContract:
    fmt: ClassVar[str]
    key: ClassVar[str] = "id"
    seeks: ClassVar[bool] = True
    """Whether resuming at row k reads less than the whole shard (invariant 3)."""
    footer_rows: ClassVar[bool] = False
    """Whether inspecting the shard gives its row count (a footer: Parquet, Arrow IPC file);
    the others give None until the shard is indexed."""
    options: ClassVar[ReadOptions] = OPTIONS

    def corrupt(self, data: bytes) -> bytes:
        return data[: len(data) // 2]

    def shard(self, store: Store) -> tuple[Catalog, Listing]:
        return open_shard(store, self.fmt, encode(make_table(0, ROWS), self.fmt), self.options)

    def test_row_count(self, store: Store) -> None:
        catalog, listing = open_shard(
            store, self.fmt, encode(make_table(0, ROWS), self.fmt), self.options
        )
        assert listing.infos[0].rows == (ROWS if self.footer_rows else None)
        batches = read(catalog, listing)
        assert sum(b.data.num_rows for b in batches) == ROWS

    def test_read_all_equals_the_file(self, store: Store) -> None:
        catalog, listing = open_shard(
            store, self.fmt, encode(make_table(0, ROWS), self.fmt), self.options
        )
        batches = read(catalog, listing)
        assert ids(batches, self.key) == list(range(ROWS))
        # Offsets tag every batch and follow on without gaps.
        assert [b.row for b in batches] == [0, *[b.stop for b in batches[:-1]]]

    @pytest.mark.parametrize("k", [0, 1, 1234, ROWS - 1, ROWS])
    def test_seek_to_k_equals_the_tail(self, store: Store, k: int) -> None:
        catalog, listing = open_shard(
            store, self.fmt, encode(make_table(0, ROWS), self.fmt), self.options
        )
        full = read(catalog, listing)
        points = [b.seek for b in full if b.seek is not None and b.seek[0] <= k]
        seek = points[-1] if points else None
        tail = read(catalog, listing, k, None, seek)
        assert ids(tail, self.key) == list(range(k, ROWS))
        # The tail's batches start at k and follow on without gaps; at the end (k == ROWS),
        # there are none (not even an empty batch).
        assert [b.row for b in tail[:1]] == ([k] if k < ROWS else [])
        assert [b.row for b in tail[1:]] == [b.stop for b in tail[:-1]]
        assert ids(read(catalog, listing, k, None, None), self.key) == list(range(k, ROWS))
        assert ids(read(catalog, listing, k, k + 300, seek), self.key) == list(
            range(k, min(k + 300, ROWS))
        )

    def test_resume_at_90_percent_is_a_seek(self, store: Store) -> None:
        catalog, listing = open_shard(
            store, self.fmt, encode(make_table(0, ROWS), self.fmt), self.options
        )
        stats = catalog.source.stats
        before = stats.bytes_read
        full = read(catalog, listing)
        full_bytes = stats.bytes_read - before
        k = ROWS * 9 // 10
        points = [b.seek for b in full if b.seek is not None and b.seek[0] <= k]
        before = stats.bytes_read
        tail = read(catalog, listing, k, None, points[-1] if points else None)
        tail_bytes = stats.bytes_read - before
        assert ids(tail, self.key) == list(range(k, ROWS))
        if self.seeks:
            assert tail_bytes < 0.5 * full_bytes, (tail_bytes, full_bytes)

    def test_the_gaps_a_resume_inside_a_window_leaves_are_read_in_one_pass(
        self, store: Store
    ) -> None:
        """A rank stopped inside a shuffle window consumed a random part of the window's
        rows: the rest of a shard is hundreds of short spans. They are read like one range,
        not one open, seek and decode each (issue 32: 8,191 read items for 16,384 rows)."""
        catalog, listing = open_shard(
            store, self.fmt, encode(make_table(0, ROWS), self.fmt), self.options
        )
        stats = catalog.source.stats
        before = (stats.bytes_read, stats.reads)
        read(catalog, listing)
        full = (stats.bytes_read - before[0], stats.reads - before[1])
        spans: list[tuple[int, int | None]] = [(k, k + 1 + k % 3) for k in range(100, ROWS, 5)]
        spans.append((ROWS - 2, None))
        ctx = listing.context(0, catalog.source, catalog.options, catalog.columns)
        before = (stats.bytes_read, stats.reads)
        with get_format(ctx.shard.format).open(ctx) as reader:
            got = list(reader.read_spans(spans, None))
        gaps = (stats.bytes_read - before[0], stats.reads - before[1])
        expected = [
            (i, r) for i, (a, b) in enumerate(spans) for r in range(a, ROWS if b is None else b)
        ]
        assert [(i, r) for i, batch in got for r in range(batch.row, batch.stop)] == expected
        assert [v for _, batch in got for v in ids([batch], self.key)] == [r for _, r in expected]
        assert gaps[0] <= 1.5 * full[0] + 65536, (gaps, full)
        assert gaps[1] <= 2 * full[1] + 2, (gaps, full)

    def test_inspect_reads_the_shard_exactly_when_the_format_says_so(self, store: Store) -> None:
        """A listing inspects in threads only the shards of formats whose ``inspect`` reads
        (``Format.inspect_reads``): a format that says it reads nothing must not, or its
        shards' footers would be read one after another on the listing's thread."""
        catalog, listing = self.shard(store)
        shard = listing.shards[0]
        fmt = get_format(shard.format)
        stats = catalog.source.stats
        before = (stats.opens, stats.reads)
        info = fmt.inspect(catalog.source, shard, self.options)
        touched = (stats.opens, stats.reads) != before
        assert touched == fmt.inspect_reads, (fmt.name, before, stats.opens, stats.reads)
        assert info.rows == (ROWS if self.footer_rows else None)

    def test_a_column_it_does_not_have_is_an_error_naming_it(self, store: Store) -> None:
        """``columns=[...]`` naming a column the shard lacks (a typo) fails naming the shard,
        the column and the ones it has, in every format: Parquet handed out batches without
        it (``{}`` for ``columns=["nope"]``), CSV raised pyarrow's ArrowKeyError, naming no
        shard."""
        store.write(f"shard.{self.fmt}", encode(make_table(0, ROWS), self.fmt))
        source = Source(store.url(f"shard.{self.fmt}"), storage_options=store.storage_options)
        catalog = Catalog(source, self.options, [self.key, "nope"])
        with pytest.raises(ShardError, match=r"has no column\(s\) \['nope'\]; it has \[") as err:
            read(catalog, catalog.scan())
        assert err.value.url.endswith(f"shard.{self.fmt}") and self.key in str(err.value)

    def test_corrupt_input_raises_a_clear_error(self, store: Store) -> None:
        bad = self.corrupt(encode(make_table(0, ROWS), self.fmt))
        with pytest.raises(ShardError) as err:
            catalog, listing = open_shard(store, self.fmt, bad, self.options)
            read(catalog, listing)
        assert f"shard.{self.fmt}" in str(err.value)
        assert err.value.url.startswith(store.root.split("://")[0])


class TestParquet(FormatContract):
    fmt = "parquet"
    footer_rows = True

    def test_spans_of_one_row_group_fetch_and_decode_it_once(self, store: Store) -> None:
        """Many spans in one row group (the rest of a shuffle window) are cut from one read
        of the group, whatever the byte budget of one call: the group fetched once, not once
        per span (each span its own call decoded the whole group again)."""
        options = ReadOptions(batch_rows=256, coalesce_bytes=1)
        catalog, listing = open_shard(
            store, "parquet", encode(make_table(0, ROWS), "parquet"), options
        )
        stats = catalog.source.stats
        ctx = listing.context(0, catalog.source, catalog.options, catalog.columns)
        spans: list[tuple[int, int | None]] = [(k, k + 2) for k in range(0, ROWS, 7)]
        before = stats.bytes_read
        with get_format("parquet").open(ctx) as reader:
            got = [r for _, b in reader.read_spans(spans, None) for r in ids([b], "id")]
        assert got == [r for a, b in spans for r in range(a, min(b or ROWS, ROWS))]
        meta = ctx.info.meta
        groups = sum(
            meta.row_group(g).column(c).total_compressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
        )
        assert meta.num_row_groups < len(spans) // 10
        assert stats.bytes_read - before <= groups + 4096

    def test_row_groups_left_around_a_consumed_one_are_one_request(self, store: Store) -> None:
        """By 45% of an epoch, whole row groups of a shard were consumed between row groups
        that were not: each run of groups left was a request of its own (16 requests
        against a fresh epoch's 9 in ``benchmarks/resume.py``). A gap of one 1.5 MiB row
        group costs less to read through than a request's first byte on an object store."""
        rows = 2048  # a consumed group is more rows than GAP_ROWS: not read through for rows
        catalog, listing = open_shard(store, "parquet", _wide_parquet(rows, 768, seed=0))
        ctx = listing.context(0, catalog.source, catalog.options, catalog.columns)
        assert ctx.info.meta.num_row_groups == 4
        assert ctx.info.meta.row_group(2).total_byte_size > 1 << 20
        stats = catalog.source.stats
        spans: list[tuple[int, int | None]] = [(5, 9), (40, 2 * rows), (3 * rows, None)]
        before = stats.reads
        with get_format("parquet").open(ctx) as reader:
            got = [r for _, b in reader.read_spans(spans, None) for r in ids([b], "id")]
        assert got == [*range(5, 9), *range(40, 2 * rows), *range(3 * rows, 4 * rows)]
        assert stats.reads - before == 1

    def test_one_narrow_column_of_wide_row_groups_reads_only_its_chunks(self, store: Store) -> None:
        """A projection's holes are columns not asked for: read through, a narrow column of
        wide row groups would fetch the whole file (here 4 MiB for 64 KiB of ids)."""
        rows = 2048
        catalog, listing = open_shard(store, "parquet", _wide_parquet(rows, 512, seed=1))
        ctx = listing.context(0, catalog.source, catalog.options, ["id"])
        stats = catalog.source.stats
        before = stats.bytes_read
        with get_format("parquet").open(ctx) as reader:
            got = [r for _, b in reader.read_spans([(0, None)], None) for r in ids([b], "id")]
        assert got == list(range(rows * 4))
        meta = ctx.info.meta
        wanted = sum(meta.row_group(g).column(0).total_compressed_size for g in range(4))
        assert stats.bytes_read - before <= wanted + (1 << 20)

    @pytest.mark.parametrize("batch_rows", [100, 256, 4096])
    def test_spans_in_any_order_are_cut_as_one_row_group_at_a_time(
        self, store: Store, batch_rows: int
    ) -> None:
        """Row groups read in one call give the record batches of one call per row group
        (a call's record batch may hold rows of two): the same rows, cut at the same rows,
        for uneven row groups and spans in shuffled order."""
        sizes = [500, 500, 130, 500, 256, 512, 70]
        table = make_table(0, sum(sizes))
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, table.schema) as writer:
            for at, n in zip(np.cumsum([0, *sizes[:-1]]).tolist(), sizes, strict=True):
                writer.write_table(table.slice(at, n))
        data = sink.getvalue().to_pybytes()
        catalog, listing = open_shard(store, "parquet", data, ReadOptions(batch_rows=batch_rows))
        spans: list[tuple[int, int | None]] = [(1200, 1700), (0, 20), (520, 1130), (1700, None)]
        ctx = listing.context(0, catalog.source, catalog.options, catalog.columns)
        with get_format("parquet").open(ctx) as reader:
            got = [(i, b.row, b.data["id"].to_pylist()) for i, b in reader.read_spans(spans, None)]
        expected = []
        for i, (start, stop) in enumerate(spans):
            end = sum(sizes) if stop is None else stop
            for first, n in zip(np.cumsum([0, *sizes[:-1]]).tolist(), sizes, strict=True):
                for lo in range(first, first + n, batch_rows):
                    a, b = max(start, lo), min(end, lo + batch_rows, first + n)
                    if b > a:
                        expected.append((i, a, list(range(a, b))))
        assert got == expected


class BadLine:
    """A line format's contract: line 1701 of a shard replaced by :attr:`bad` is named in the
    error, with its line, its row and what is wrong (:attr:`says`); in a gzip shard too."""

    fmt: ClassVar[str]
    bad: ClassVar[bytes]
    says: ClassVar[str]

    def corrupt(self, data: bytes) -> bytes:
        packed = self.fmt.endswith(".gz")
        lines = (gzip.decompress(data) if packed else data).split(b"\n")
        lines[1700] = self.bad
        out = b"\n".join(lines)
        return gzip.compress(out) if packed else out

    def test_bad_line_is_named(self, store: Store) -> None:
        catalog, listing = open_shard(
            store, self.fmt, self.corrupt(encode(make_table(0, ROWS), self.fmt))
        )
        name = self.fmt.replace(".", r"\.")
        with pytest.raises(
            ShardError, match=rf"shard\.{name} at line 1701, row 1700.*: {self.says}"
        ):
            read(catalog, listing)


class TestJsonl(BadLine, FormatContract):
    fmt = "jsonl"
    bad = b'{"id": 1700, "score": 0.5, "text": "cut'
    says = "invalid JSON"


class TestJsonlGzip(FormatContract):
    fmt = "jsonl.gz"
    seeks = False  # a gzip stream can only be skipped through, within the shard


class TestJsonlZstd(FormatContract):
    fmt = "jsonl.zst"
    seeks = False


class TestJsonlBz2(FormatContract):
    """bzip2 (``.bz2``), as Hugging Face ``datasets`` reads it (Wikipedia dumps, older
    corpora): before, a listing skipped ``.jsonl.bz2`` as unknown, and ``format="jsonl"``
    read its compressed bytes as text ("invalid JSON ... b'BZh91AY&SY...'")."""

    fmt = "jsonl.bz2"
    seeks = False


class TestJsonlXz(FormatContract):
    """xz (``.xz``), as ``datasets`` reads it."""

    fmt = "jsonl.xz"
    seeks = False


class TestJsonArray(FormatContract):
    """A ``.json`` file that is one JSON array of objects (``json.dump(rows, f, indent=2)``:
    Alpaca's ``alpaca_data.json`` and most instruction datasets on the Hub), as Hugging Face
    ``datasets``' json builder reads it: a row per item. Before: "invalid JSON ... b'[\\n'
    ... every line must be one JSON object". It is read whole (no seek inside it)."""

    fmt = "json"
    seeks = False


class TestJsonArrayGzip(TestJsonArray):
    fmt = "json.gz"


def test_a_json_array_streams_and_resumes_exactly_once(local: Store) -> None:
    """Shuffled, stopped inside a window, resumed; and counted for a DataLoader's workers
    (the index reads it whole too). A BOM and whitespace before the ``[`` are allowed."""
    for n in range(3):
        rows = make_table(n * 100, 100).select(["id", "text"]).to_pylist()
        local.write(f"sft/part{n}.json", b"\xef\xbb\xbf \n" + json.dumps(rows, indent=4).encode())
    kwargs: dict[str, Any] = {"batch_size": 10, "shuffle_seed": 4, "shuffle_window": 50}
    assert sorted(through_a_resume(local.url("sft"), 7, **kwargs)) == list(range(300))
    loader = ingest.DataLoader(ingest.Stream(local.url("sft"), batch_size=10), num_workers=2)
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(300))
    assert batches[0]["text"][0].startswith("row ")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b'[{"id": 1}, 2, {"id": 3}]', r"item 1 of its JSON array is int, not an object"),
        (b'[{"id": 1}, {"id": 2}', r"at byte 21: is a JSON array.*not valid JSON"),
        (b'[{"id": 1}, {"id": "\xff"}]', r"is not UTF-8"),
        (b"[" + b'{"id": 1},' * 200 + b'{"id": 1}]', r"read whole.*max_line_bytes=1024.*jq -c"),
    ],
)
def test_a_json_array_that_cannot_be_read_is_named_with_the_fix(
    local: Store, data: bytes, says: str
) -> None:
    local.write("bad.json", data)
    source = Source(local.url("bad.json"))
    catalog = Catalog(source, ReadOptions(max_line_bytes=1024), None)
    with pytest.raises(ShardError, match=says) as err:
        read(catalog, catalog.scan())
    assert err.value.url.endswith("bad.json")


def _squad(first: int, n: int) -> dict[str, Any]:
    """SQuAD's layout: one JSON object, its rows a list under ``data``."""
    rows = [
        {"id": i, "title": f"t{i}", "paragraphs": [{"context": f"c{i}"}]}
        for i in range(first, first + n)
    ]
    return {"version": "1.1", "data": rows}


def test_a_json_document_holding_its_rows_under_a_field_reads_with_field(local: Store) -> None:
    """SQuAD and many a dataset's own files are one JSON object whose rows are a list under
    a key (``{"version": ..., "data": [...]}``): as ``datasets`` takes ``field="data"``, a
    stream takes ``ReadOptions(field="data")``, the list of objects (or an object of
    equal-length column lists) as rows, resumes and DataLoader workers included. Before, a
    pretty-printed one was refused ("invalid JSON ... every line must be one JSON object")
    with no option that helps, and one on a single line was one row."""
    for n in range(3):
        local.write(f"squad/part{n}.json", json.dumps(_squad(n * 40, 40), indent=2).encode())
    data = ReadOptions(field="data")
    got = [
        (i, t, p[0]["context"])
        for b in ingest.Stream(local.url("squad"), batch_size=10, read=data)
        for i, t, p in zip(b["id"].tolist(), b["title"], b["paragraphs"], strict=True)
    ]
    assert got == [(i, f"t{i}", f"c{i}") for i in range(120)]
    kwargs: dict[str, Any] = {
        "batch_size": 10,
        "shuffle_seed": 4,
        "shuffle_window": 30,
        "read": data,
    }
    assert sorted(through_a_resume(local.url("squad"), 5, **kwargs)) == list(range(120))
    loader = ingest.DataLoader(ingest.Stream(local.url("squad"), **kwargs), num_workers=2)
    try:
        assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(120))
    finally:
        loader.close()
    # An object of equal-length column lists is rows too (as datasets reads one); gzip too.
    columns = {"meta": 1, "data": {"id": [0, 1, 2], "text": ["a", "b", "c"]}}
    local.write("cols/a.json.gz", gzip.compress(json.dumps(columns).encode()))
    (batch,) = list(ingest.Stream(local.url("cols"), batch_size=3, read=data))
    assert (batch["id"].tolist(), batch["text"]) == ([0, 1, 2], ["a", "b", "c"])
    # The field is part of the shard's format: the index never gives one read's count to another.
    catalog = Catalog(Source(local.url("squad/part0.json")), data, None)
    listing = catalog.scan(index=True)
    assert (listing.shards[0].format, listing.infos[0].rows) == ("jsonl[field=data]", 40)
    assert get_format("jsonl[field=data]").name == "jsonl[field=data]"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b'{"version": 1, "rows": []}', r"has no key 'data' \(its keys: 'version', 'rows'\)"),
        (b'[{"data": []}]', r"is a JSON array, not an object holding 'data'"),
        (b'{"data": 3}', r"'data' holds int, not a list of objects"),
        (b'{"data": [{"id": 1}, 2]}', r"item 1 of 'data' is int, not an object"),
        (b'{"data": {"id": [1, 2], "t": [1]}}', r"columns of 'data' differ in length"),
        (b'{"data": [', r"not valid JSON"),
    ],
)
def test_a_document_without_its_field_is_named_with_the_fix(
    local: Store, data: bytes, says: str
) -> None:
    local.write("bad.json", data)
    catalog = Catalog(Source(local.url("bad.json")), ReadOptions(field="data"), None)
    with pytest.raises(ShardError, match=says) as err:
        read(catalog, catalog.scan())
    assert err.value.url.endswith("bad.json")


def test_a_pretty_printed_object_says_to_pass_field(local: Store) -> None:
    local.write("doc.json", json.dumps(_squad(0, 2), indent=2).encode())
    with pytest.raises(ShardError, match=r"ReadOptions\(field="):
        list(ingest.Stream(local.url("doc.json"), batch_size=1))
    for bad in ("", 3):
        with pytest.raises(ConfigError, match="field"):
            ReadOptions(field=bad)  # type: ignore[arg-type]


class TestCsv(FormatContract):
    fmt = "csv"
    short: ClassVar[bytes] = b"1,2"
    """A record with a value too few (the shards have 3 columns)."""

    def corrupt(self, data: bytes) -> bytes:
        lines = data.split(b"\n")
        lines[900] = self.short
        return b"\n".join(lines)


class TestTsv(TestCsv):
    """Tab-separated values: CSV with a tab between values (``.tsv``, as Hugging Face
    ``datasets`` reads them: its csv builder with ``sep="\\t"``)."""

    fmt = "tsv"
    short = b"1\t2"


class TestTsvGzip(TestTsv):
    fmt = "tsv.gz"
    seeks = False

    def corrupt(self, data: bytes) -> bytes:
        return FormatContract.corrupt(self, data)


class TestText(BadLine, FormatContract):
    """Plain text, a row per line in a ``text`` column (``.txt``, as Hugging Face
    ``datasets``' text builder reads it); the generated shards' lines are the ids."""

    fmt = "txt"
    key = "text"
    bad = b"17\xff00"
    says = "is not UTF-8"


class TestTextGzip(TestText):
    fmt = "txt.gz"
    seeks = False


class TestArrowFile(FormatContract):
    fmt = "arrow"
    footer_rows = True


class TestArrowStream(FormatContract):
    fmt = "arrows"
    seeks = False  # the IPC stream format has no index
    footer_rows = False  # nor a footer: rows are counted by reading


def test_a_feather_v1_file_is_named_as_one(tmp_path: Any) -> None:
    """A ``.feather`` file of Feather V1 (pandas' ``to_feather`` before pyarrow 0.17) is not
    Arrow IPC: it was called "not a readable Arrow IPC file" (its magic missing), with a fix
    that did not apply. Its own magic names it, and the fix (write it again as V2)."""
    from pyarrow import feather

    feather.write_feather(pa.table({"id": list(range(10))}), tmp_path / "a.feather", version=1)
    with pytest.raises(ShardError, match=r"a\.feather.*Feather V1.*version=2"):
        next(iter(ingest.Stream(str(tmp_path), batch_size=5)))


@pytest.mark.parametrize("fmt", ["arrows", "arrow"])
def test_an_arrow_shard_is_read_in_large_requests(s3: Any, fmt: str) -> None:
    """An Arrow IPC shard was opened without a read-ahead buffer, so every read pyarrow
    makes (a message's length, its metadata, its body; a file's footer, each record batch's
    metadata to count rows) was a request of its own: 32 shards of one record batch on a
    store 50 ms away sent 417 requests for the stream format (13 a shard) and 225 for the
    file format, 4.2 and 2.4 s to the first batch. ``datasets``' save_to_disk writes the
    stream format, record batches of 1,000 rows: a shard of 500 MB was thousands of
    requests in a row. Now a read fetches ahead: a shard of 64 record batches here is
    listed in a request beside the listing's, and read in one beside the epoch's listing
    (a shard within ``block_bytes`` is read whole: a file's footer, at its end, was two
    requests more)."""
    from ingest.testing import FaultProxy

    root = s3.create_bucket(f"ipc-requests-{fmt}")
    table = make_table(0, 64 * 16)
    s3.filesystem().pipe(f"{root}/d/shard.{fmt}", encode(table, fmt, row_group_rows=16))
    with FaultProxy(s3.endpoint) as proxy:
        options = s3.storage_options(endpoint=proxy.endpoint)
        before = proxy.counts()["requests"]
        stream = ingest.Stream(f"s3://{root}/d/", batch_size=64, storage_options=options)
        stream.listing()
        listed = proxy.counts()["requests"] - before
        got = [i for batch in stream for i in batch["id"].tolist()]
        read = proxy.counts()["requests"] - before - listed
    assert got == list(range(64 * 16))
    assert listed <= 2 and read <= 2, (listed, read)  # read: the epoch's listing, the shard


def test_an_arrow_file_s_large_record_batches_are_counted_at_once(s3: Any) -> None:
    """An Arrow IPC file's rows are counted from each record batch's metadata (the footer
    gives where each lies, not its rows). Batches larger than the read-ahead were a request
    each, one after another: 32 record batches of 90 KB on a store 50 ms away, 1.6 s to
    list one shard. Now the footer is read first, and every batch's metadata is fetched
    at once (neighbours in one range): the listing's requests are in flight together."""
    from ingest.testing import FaultProxy, Faults

    root = s3.create_bucket("ipc-metadata")
    table = make_table(0, 32 * 1024)
    data = encode(table, "arrow", row_group_rows=1024)
    assert len(data) > 2 << 20
    s3.filesystem().pipe(f"{root}/d/shard.arrow", data)
    with FaultProxy(s3.endpoint, Faults(latency_s=0.05)) as proxy:
        options = s3.storage_options(endpoint=proxy.endpoint)
        stream = ingest.Stream(f"s3://{root}/d/", batch_size=1024, storage_options=options)
        (info,) = stream.listing().infos
        peak, listed = proxy.peak_in_flight(), proxy.counts()["requests"]
        got = [i for batch in stream for i in batch["id"].tolist()]
    assert info.rows == 32 * 1024
    assert got == list(range(32 * 1024))
    assert peak >= 4, f"the batches' metadata was fetched one request after another ({peak})"
    # The listing, the first bytes, the footer, a range a batch (and the footer again, at
    # once): none of count_rows's reads left for a request of its own.
    assert listed <= 32 + 4, listed  # 35 here; a read of count_rows apart would be 32 more


def test_an_arrow_file_of_thousands_of_small_batches_is_counted_in_a_few_ranges(s3: Any) -> None:
    """3,000 record batches: the footer (72 KB) is past the read-ahead of the file's end, so
    it is read apart; the batches' metadata, a few KB apart, is fetched in a few ranges of
    up to 4 MiB side by side (the bytes between read too), not a request a batch."""
    from ingest.testing import FaultProxy, Faults

    root = s3.create_bucket("ipc-small-batches")
    data = encode(make_table(0, 3000 * 32), "arrow", row_group_rows=32)
    s3.filesystem().pipe(f"{root}/d/shard.arrow", data)
    with FaultProxy(s3.endpoint, Faults(latency_s=0.05)) as proxy:
        options = s3.storage_options(endpoint=proxy.endpoint)
        stream = ingest.Stream(f"s3://{root}/d/", batch_size=4096, storage_options=options)
        (info,) = stream.listing().infos
        listed, peak = proxy.counts()["requests"], proxy.peak_in_flight()
    assert info.rows == 3000 * 32
    assert listed <= 4 + -(-len(data) // (4 << 20)), listed
    assert peak >= 2, peak


def test_an_arrow_file_s_footer_says_where_each_message_s_metadata_lies() -> None:
    """metadata_ranges reads the footer's blocks (pyarrow does not give them): each range
    is an encapsulated message's metadata (its continuation marker, its length, as many
    bytes as the block says) of the kind pyarrow reads there, every record batch and
    dictionary once, in the file's order; a footer that is not one gives None."""
    from pyarrow import ipc

    from ingest.formats.arrow import metadata_ranges

    schema = pa.schema([("id", pa.int64()), ("tag", pa.dictionary(pa.int32(), pa.string()))])
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, schema) as writer:
        for n in (3, 5, 7):
            tags = pa.array([f"t{i % 2}" for i in range(n)]).dictionary_encode()
            writer.write_batch(pa.record_batch([pa.array(range(n), pa.int64()), tags], schema))
    data = sink.getvalue().to_pybytes()
    footer_size = int.from_bytes(data[-10:-6], "little")
    blocks = metadata_ranges(data[-10 - footer_size : -10], len(data))
    assert blocks is not None
    for ranges, kind, count in zip(blocks, ["dictionary", "record batch"], [1, 3], strict=True):
        assert len(ranges) == count
        for start, end in ranges:
            assert data[start : start + 4] == b"\xff\xff\xff\xff"
            assert 8 + int.from_bytes(data[start + 4 : start + 8], "little") == end - start
            assert ipc.read_message(pa.py_buffer(data[start:])).type == kind
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(sorted(blocks[0] + blocks[1])))
    assert metadata_ranges(b"\x00" * 3, len(data)) is None
    assert metadata_ranges(data[-10 - footer_size : -10], 100) is None  # blocks past the end


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"compression": "zstd"},
        {"compression": "lz4"},
        {"use_legacy_format": True},  # a 4-byte length before each message, no marker
    ],
    ids=["plain", "zstd", "lz4", "legacy"],
)
def test_an_arrow_record_batch_s_rows_are_read_from_its_metadata(options: dict[str, Any]) -> None:
    """A file's rows are the sum of its record batches' ``length`` (each message's metadata,
    fetched at listing). pyarrow's ``count_rows`` reads each batch's body with it (a range of
    the whole batch): a listing that fetched only the metadata handed it a file that filled
    the bodies with zeros (fsspec's parts cache), or it fetched every batch whole. Each
    batch's rows are the ones pyarrow reads; a dictionary's message, or bytes that are not
    a message, give None."""
    from pyarrow import ipc

    from ingest.formats.arrow import batch_rows, metadata_ranges

    schema = pa.schema([("id", pa.int64()), ("tag", pa.dictionary(pa.int32(), pa.string()))])
    sink = pa.BufferOutputStream()
    sizes = [3, 0, 1024, 1, 70_000, 5]
    with ipc.new_file(sink, schema, options=ipc.IpcWriteOptions(**options)) as writer:
        for n in sizes:
            tags = pa.DictionaryArray.from_arrays(
                pa.array([i % 3 for i in range(n)], pa.int32()), ["t0", "t1", "t2"]
            )
            writer.write_batch(pa.record_batch([pa.array(range(n), pa.int64()), tags], schema))
    data = sink.getvalue().to_pybytes()
    footer_size = int.from_bytes(data[-10:-6], "little")
    blocks = metadata_ranges(data[-10 - footer_size : -10], len(data))
    assert blocks is not None
    dictionaries, batches = blocks
    assert [batch_rows(data[a:b]) for a, b in batches] == sizes
    assert sum(sizes) == ipc.open_file(pa.py_buffer(data)).count_rows()
    assert dictionaries and all(batch_rows(data[a:b]) is None for a, b in dictionaries)
    assert batch_rows(b"") is None and batch_rows(b"\xff" * 7) is None
    assert batch_rows(b"\xff\xff\xff\xff" + b"\x40\x00\x00\x00" + b"\x00" * 3) is None


def test_a_csv_shard_read_from_its_start_is_one_request(s3: Any) -> None:
    """A CSV reader read its shard's header line apart as it opened (up to 1 MiB, a request)
    to check the columns, then the shard from its first byte, header included: two requests
    a shard where one holds both (32 shards 50 ms away: 66 requests, 0.87 s to the first
    batch, against 34 and 0.56 s for the same rows as JSON Lines). Now a read from the
    first byte takes the header from its first chunk; a read from inside the shard (a rank's
    share, a resume) still reads it apart, and a header that differs is refused either way."""
    from ingest.testing import FaultProxy

    root = s3.create_bucket("csv-requests")
    fs = s3.filesystem()
    for n in range(4):
        fs.pipe(f"{root}/d/p{n}.csv", encode(make_table(n * 50, 50), "csv"))
    with FaultProxy(s3.endpoint) as proxy:
        options = s3.storage_options(endpoint=proxy.endpoint)
        stream = ingest.Stream(f"s3://{root}/d/", batch_size=10, storage_options=options)
        stream.listing()
        before = proxy.counts()["requests"]
        got = sorted(i for batch in stream for i in batch["id"].tolist())
        read = proxy.counts()["requests"] - before
    assert got == list(range(200))
    assert read <= 4 + 1, read  # a request a shard, and the epoch's listing
    data = encode(make_table(200, 50), "csv")
    assert data.startswith(b'"id",')
    fs.pipe(f"{root}/d/p9.csv", b'"ID",' + data[len(b'"id",') :])  # another column name
    with pytest.raises(ingest.SchemaMismatchError, match=r"p9\.csv.*header \['ID'"):
        list(ingest.Stream(f"s3://{root}/d/", batch_size=10, storage_options=s3.storage_options()))


class TestWebDataset(FormatContract):
    fmt = "tar"
    key = "__key__"
    # Read-ahead is block_bytes for tar: 4 KiB would make every tar block one request.
    options = ReadOptions(block_bytes=256 << 10, batch_rows=256)

    def test_fields_are_bytes_and_grouped_by_key(self, local: Store) -> None:
        catalog, listing = open_shard(local, self.fmt, encode(make_table(0, 10), self.fmt))
        batch = read(catalog, listing)[0].data
        assert batch.schema.names == ["__key__", "json", "txt"]
        assert batch.column("txt")[3].as_py() == b"row 3"
        assert batch.column("json")[3].as_py() == b'{"id": 3}'

    @pytest.mark.parametrize("columns", [None, ["__key__", "txt"]])
    def test_an_empty_tar_listed_first_gives_no_columns(
        self, local: Store, columns: list[str] | None
    ) -> None:
        """A tar of no sample (an empty shard of a writer) listed first: its columns
        (``__key__`` alone) were the stream's, so every other shard was refused ('fields the
        first samples of a.tar do not have'), and the fix it named (columns=...) failed
        on the empty tar itself ('has no column(s)'). It holds no sample to infer from: the
        next shard's are taken, as for a CSV file of its header alone."""
        local.write("e/a.tar", encode(make_table(0, 0), "tar"))
        local.write("e/b.tar", encode(make_table(0, 10), "tar"))
        stream = ingest.Stream(local.url("e"), batch_size=5, columns=columns)
        batches = list(stream)
        assert sorted(k for b in batches for k in b["__key__"]) == sorted(
            k for b in ingest.Stream(local.url("e/b.tar"), batch_size=5) for k in b["__key__"]
        )
        assert all(len(b["txt"]) == 5 for b in batches)
        with pytest.warns(UserWarning, match="gave no batch"):  # an empty tar alone: no rows
            assert list(ingest.Stream(local.url("e/a.tar"), batch_size=5)) == []


class TestWebDatasetGzip(TestWebDataset):
    """A compressed tar (``.tar.gz``, as ``webdataset`` reads it): decompressed as it is read,
    seek points in the tar's own bytes, a resume skipped through."""

    fmt = "tar.gz"
    seeks = False


class TestWebDatasetTgz(TestWebDatasetGzip):
    fmt = "tgz"


class TestWebDatasetZstd(TestWebDatasetGzip):
    fmt = "tar.zst"


def zstd(data: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor().compress(data))


def jsonl_ids(first: int, count: int) -> bytes:
    return b"".join(b'{"id": %d}\n' % i for i in range(first, first + count))


@pytest.mark.parametrize(
    ("fmt", "data"),
    [
        # `cat a.gz b.gz`, and the zero padding some writers leave after the last member
        ("jsonl.gz", gzip.compress(jsonl_ids(0, 2000)) + gzip.compress(jsonl_ids(2000, 1000))),
        ("jsonl.gz", gzip.compress(jsonl_ids(0, 3000)) + bytes(1000)),
        # pzstd and `cat a.zst b.zst` write several frames
        ("jsonl.zst", zstd(jsonl_ids(0, 1000)) + zstd(jsonl_ids(1000, 2000))),
        # pbzip2 and `cat a.bz2 b.bz2` write several streams; xz alike
        ("jsonl.bz2", bz2.compress(jsonl_ids(0, 1500)) + bz2.compress(jsonl_ids(1500, 1500))),
        ("jsonl.xz", lzma.compress(jsonl_ids(0, 10)) + lzma.compress(jsonl_ids(10, 2990))),
    ],
)
def test_every_member_or_frame_of_a_compressed_shard_is_read(
    local: Store, fmt: str, data: bytes
) -> None:
    catalog, listing = open_shard(local, fmt, data)
    assert ids(read(catalog, listing), "id") == list(range(3000))
    assert ids(read(catalog, listing, 2500), "id") == list(range(2500, 3000))


@pytest.mark.parametrize(
    ("fmt", "compress", "where", "problem"),
    [
        # the CRC-32 of the gzip trailer: the data decompresses, and its check fails
        ("jsonl.gz", gzip.compress, -8, "the gzip stream is corrupt near compressed byte"),
        ("jsonl.zst", zstd, 0.5, "the zstd stream is corrupt near compressed byte"),
        ("jsonl.bz2", bz2.compress, 0.5, "the bz2 stream is corrupt near compressed byte"),
        ("jsonl.xz", lzma.compress, 0.5, "the xz stream is corrupt near compressed byte"),
    ],
)
def test_corrupt_compressed_bytes_are_an_error(
    local: Store, fmt: str, compress: Callable[[bytes], bytes], where: float, problem: str
) -> None:
    data = bytearray(compress(encode(make_table(0, ROWS), "jsonl")))
    at = int(where) if where < 0 else int(len(data) * where)
    data[at : at + 4] = bytes(b ^ 0xFF for b in data[at : at + 4])
    with pytest.raises(ShardError, match=rf"shard\.{fmt} at byte \d+: {problem} \d+"):
        read(*open_shard(local, fmt, bytes(data)))


def test_trailing_bytes_after_a_gzip_stream_are_an_error(local: Store) -> None:
    data = gzip.compress(jsonl_ids(0, 100))
    with pytest.raises(
        ShardError,
        match=rf"at byte 1090: is not a gzip stream at compressed byte {len(data)} "
        r"\(starts with b'trai'",
    ):
        read(*open_shard(local, "jsonl.gz", data + b"trailing"))


@pytest.mark.parametrize("block_bytes", [1024, 64 << 10])  # below and above the limit
@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz"])
def test_the_line_limit_is_exact(local: Store, fmt: str, block_bytes: int) -> None:
    limit = 4096
    head = b'{"id": 1, "text": "'
    line = head + b"x" * (limit - len(head) - 2) + b'"}'  # exactly the limit
    data = b'{"id": 0, "text": ""}\n' + line + b"\n" + b'{"id": 2, "text": ""}\n'
    options = ReadOptions(block_bytes=block_bytes, max_line_bytes=limit)
    encoded = gzip.compress(data) if fmt == "jsonl.gz" else data
    catalog, listing = open_shard(local, fmt, encoded, options)
    assert ids(read(catalog, listing), "id") == [0, 1, 2]
    longer = data.replace(b"xxx", b"xxxx", 1)
    encoded = gzip.compress(longer) if fmt == "jsonl.gz" else longer
    catalog, listing = open_shard(local, fmt, encoded, options)
    with pytest.raises(ShardError, match=r"at line 2, row 1, byte 22: a line is longer than"):
        read(catalog, listing)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tar", "arrow", "jsonl.gz"])
def test_index_gives_rows_and_seek_points(local: Store, fmt: str) -> None:
    from ingest.formats import get_format

    catalog, listing = open_shard(local, fmt, encode(make_table(0, ROWS), fmt))
    ctx = listing.context(0, catalog.source, catalog.options, None)
    info = get_format(ctx.shard.format).index(ctx)
    assert info.rows == ROWS
    indexed = listing.__class__(listing.shards, (info,), listing.schema, listing.schema_origin)
    key = "__key__" if fmt == "tar" else "id"
    stats = catalog.source.stats
    before = stats.bytes_read
    assert ids(read(catalog, indexed, 2500, 2600), key) == list(range(2500, 2600))
    if fmt != "jsonl.gz":  # compressed: decompress-skip; the others seek with the index
        assert stats.bytes_read - before < ctx.shard.size / 2


# -- CSV records with newlines inside quoted values (issue 17, item 5) ---------------------


def read_all_as_pyarrow(
    data: bytes, schema: pa.Schema | None = None, delimiter: str = ","
) -> list[dict[str, Any]]:
    """What pyarrow reads from the whole file in one call: the reference for the reader."""
    rows: list[dict[str, Any]] = pcsv.read_csv(
        pa.BufferReader(data),
        parse_options=pcsv.ParseOptions(newlines_in_values=True, delimiter=delimiter),
        convert_options=pcsv.ConvertOptions(column_types=schema),
    ).to_pylist()
    return rows


def rows_of(batches: list[RowBatch]) -> list[dict[str, Any]]:
    return [row for b in batches for row in b.data.to_pylist()]


def indexed(catalog: Catalog, listing: Listing) -> Listing:
    ctx = listing.context(0, catalog.source, catalog.options, None)
    info = get_format(ctx.shard.format).index(ctx)
    return Listing(listing.shards, (info,), listing.schema, listing.schema_origin)


def test_a_csv_with_another_delimiter_reads_with_delimiter_and_a_warning_without(
    local: Store,
) -> None:
    """Semicolons between values (a spreadsheet saved in a European locale), pipes: as
    ``datasets`` takes ``sep=``, a stream takes ``ReadOptions(delimiter=";")``, and a record
    holding newlines, quotes and the delimiter in a quoted value reads as pyarrow reads it,
    resumes included. Before, there was no way to say so, and without it every row came as
    one value of one column (``{'id;text;score': ['1;hello;0.5', ...]}``) without a word:
    now a header read as one column that holds ``;``, ``|`` or a tab says which to pass."""
    rows = [(i, f'say "{i}";\nthen {i}', i / 10) for i in range(600)]
    quoted = ['"{}"'.format(t.replace('"', '""')) for _, t, _ in rows]
    text = "id;text;score\n" + "".join(
        f"{i};{q};{x}\n" for (i, _, x), q in zip(rows, quoted, strict=True)
    )
    local.write("semi/a.csv", text.encode())
    semi = ReadOptions(delimiter=";", block_bytes=4096)
    got = [
        row
        for b in ingest.Stream(local.url("semi"), batch_size=100, read=semi)
        for row in zip(b["id"].tolist(), b["text"], b["score"].tolist(), strict=True)
    ]
    assert got == [(i, t, pytest.approx(x)) for i, t, x in rows]
    kwargs: dict[str, Any] = {"batch_size": 50, "shuffle_seed": 2, "read": semi}
    assert sorted(through_a_resume(local.url("semi"), 5, **kwargs)) == list(range(600))
    with pytest.warns(UserWarning, match=r"a\.csv.*one column.*';'.*ReadOptions\(delimiter=';'\)"):
        next(iter(ingest.Stream(local.url("semi"), batch_size=100)))
    local.write("pipe/a.csv", b"a|b\n1|2\n")
    pipe = ingest.Stream(local.url("pipe"), batch_size=1, read=ReadOptions(delimiter="|"))
    assert {k: v.tolist() for k, v in next(iter(pipe)).items()} == {"a": [1], "b": [2]}
    for bad in ["", ";;", '"', "\n"]:
        with pytest.raises(ConfigError, match="delimiter"):
            ReadOptions(delimiter=bad)


def test_a_delimiter_is_part_of_the_shards_format_in_the_index_and_derived_keys(
    local: Store, tmp_path: Any
) -> None:
    """A quote opens a value only after the delimiter, so one file is other records with
    another one: the shard index and derived copies, kept across jobs, must not hand a count
    or rows made with one delimiter to a read with another. The shard's format names it
    (``csv[;]``), and the format is part of both keys."""
    from ingest.planner.index import IndexConfig, IndexStore

    local.write("q.csv", b'a;b\n1;"x\ny"\n2;z\n')
    index = IndexStore(IndexConfig(location=str(tmp_path / "index")))
    counts = {}
    for delimiter in [None, ";", None]:
        options = ReadOptions(delimiter=delimiter)
        catalog = Catalog(Source(local.url("q.csv")), options, None, index_store=index)
        one_column = delimiter is None  # 'a;b' read with commas: warned
        with pytest.warns(UserWarning, match="one column") if one_column else nullcontext():
            listing = catalog.scan(index=True)
        counts[delimiter] = (listing.shards[0].format, listing.infos[0].rows)
        assert counts[delimiter][1] == sum(b.data.num_rows for b in read(catalog, listing))
    assert counts == {None: ("csv", 3), ";": ("csv[;]", 2)}
    assert read_fingerprint("csv[;]", None) != read_fingerprint("csv", None)
    assert get_format("csv[;]").name == "csv[;]"
    assert getattr(get_format("tsv[|]"), "delimiter", None) == "|"
    with pytest.raises(ConfigError, match="take a delimiter"):
        get_format("jsonl[;]")


def _pairs(first: int, n: int) -> bytes:
    """A TSV of ``id``, ``text`` records without a header line (a parallel corpus, a
    dump of a table): some texts quoted, holding a tab or a line break."""
    texts = [
        f'"line {i}\tcol\nnext"' if i % 7 == 0 else f"text {i}" for i in range(first, first + n)
    ]
    return "".join(
        f"{i}\t{t}\n" for i, t in zip(range(first, first + n), texts, strict=True)
    ).encode()


def test_csv_and_tsv_without_a_header_read_with_column_names(local: Store, tmp_path: Any) -> None:
    """A TSV without a header (a parallel corpus, ``COPY ... TO`` of a table): its first
    record was taken for the header, so the first row of every shard was dropped and the
    columns were named by its values (``{'0': ..., 'text 0': ...}``), without a word. As
    ``datasets`` takes ``column_names=``, a stream takes ``ReadOptions(column_names=[...])``:
    every record is a row, as pyarrow reads it with ``column_names``, resumes included."""
    for n in range(3):
        local.write(f"pairs/{n}.tsv", _pairs(n * 200, 200))
    names = ReadOptions(column_names=["id", "text"], block_bytes=1024)
    reference = [
        row
        for n in range(3)
        for row in pcsv.read_csv(
            pa.BufferReader(_pairs(n * 200, 200)),
            read_options=pcsv.ReadOptions(column_names=["id", "text"]),
            parse_options=pcsv.ParseOptions(delimiter="\t", newlines_in_values=True),
        ).to_pylist()
    ]
    assert len(reference) == 600
    got = [
        {"id": i, "text": t}
        for b in ingest.Stream(local.url("pairs"), batch_size=50, read=names)
        for i, t in zip(b["id"].tolist(), b["text"], strict=True)
    ]
    assert got == reference
    kwargs: dict[str, Any] = {"batch_size": 30, "shuffle_seed": 4, "read": names}
    assert sorted(through_a_resume(local.url("pairs"), 4, **kwargs)) == list(range(600))
    loader = ingest.DataLoader(ingest.Stream(local.url("pairs"), **kwargs), num_workers=2)
    try:
        assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(600))
    finally:
        loader.close()
    # The shard index counts records, not records after a header: a format of its own.
    catalog = Catalog(Source(local.url("pairs/0.tsv")), names, None)
    listing = catalog.scan(index=True)
    assert (listing.shards[0].format, listing.infos[0].rows) == ("tsv[\t no header]", 200)
    assert get_format("csv[, no header]").name == "csv[, no header]"
    # Derived copies are keyed with the names: rows named one way are not read another.
    every = ingest.Filter(lambda t: pc.greater_equal(t.column(0), 0), version="1")
    derived = f"file://{tmp_path}/derived"
    for columns in (["id", "text"], ["n", "words"]):
        read = ReadOptions(column_names=columns)
        stream = ingest.Stream(
            local.url("pairs/0.tsv"), batch_size=200, read=read, transform=every, derived=derived
        )
        assert list(next(iter(stream))) == columns


def test_column_names_are_checked_and_a_header_read_as_a_row_is_warned(local: Store) -> None:
    local.write("h.csv", b"id,text\n1,a\n2,b\n")
    with pytest.warns(UserWarning, match=r"h\.csv.*first record.*column names.*header"):
        stream = ingest.Stream(
            local.url("h.csv"), batch_size=3, read=ReadOptions(column_names=["id", "text"])
        )
        (batch,) = list(stream)
    assert batch["id"] == ["id", "1", "2"]  # as told: three rows, strings
    local.write("three.csv", b"1,a\n2,b,c\n")
    with pytest.raises(ShardError, match=r"three\.csv.*line 2"):
        list(
            ingest.Stream(
                local.url("three.csv"), batch_size=1, read=ReadOptions(column_names=["id", "text"])
            )
        )
    for bad in ([], ["a", "a"], ["a", ""], "ab", [1]):
        with pytest.raises(ConfigError, match="column_names"):
            ReadOptions(column_names=bad)  # type: ignore[arg-type]
    schema = pa.schema([("x", pa.int64())])
    with pytest.raises(ConfigError, match=r"column_names.*schema"):
        ReadOptions(column_names=["id"], schema=schema)
    assert ReadOptions(column_names=["x"], schema=schema).column_names == ("x",)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_shards_with_the_same_columns_in_another_order_are_one_stream(
    local: Store, fmt: str
) -> None:
    """Two writers, two column orders (a DataFrame's columns reordered between jobs): the
    columns are the same by name, and each batch comes in the stream's order (the first
    shard's). Before: refused, "schema differs ...: column order differs"."""
    tables = [make_table(0, 60), make_table(60, 60)]
    tables[1] = tables[1].select(list(reversed(tables[1].column_names)))
    for n, table in enumerate(tables):
        local.write(f"o/{n}.{fmt}", encode(table, fmt))
    names = tables[0].column_names
    batches = list(ingest.Stream(local.url("o"), batch_size=30, shuffle_seed=3))
    assert all(list(b) == names for b in batches)
    got = {i: t for b in batches for i, t in zip(b["id"].tolist(), b["text"], strict=True)}
    assert got == {i: f"row {i}" for i in range(120)}
    some = ingest.Stream(local.url("o"), batch_size=30, columns=["text", "id"])
    assert all(list(b) == ["text", "id"] for b in some)


@pytest.mark.parametrize("first_large", [False, True])
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_shards_whose_types_differ_only_in_offset_width_are_one_stream(
    local: Store, fmt: str, first_large: bool
) -> None:
    """polars writes ``large_string`` (and large binary and lists) where pyarrow and pandas
    write ``string``: the same values with 64-bit offsets. Shards of both were refused
    ("column 't' is large_string, not string"), so a dataset grown by two tools could not be
    read at all. Now each batch comes in the stream's types (the first shard's)."""

    def table(first: int, large: bool) -> pa.Table:
        ids = list(range(first, first + 50))
        return pa.table(
            {
                "id": ids,
                "t": pa.array([f"t{i}" for i in ids], pa.large_string() if large else pa.string()),
                "b": pa.array(
                    [b"x%d" % i for i in ids], pa.large_binary() if large else pa.binary()
                ),
                "l": pa.array(
                    [[i, i] for i in ids],
                    pa.large_list(pa.int32()) if large else pa.list_(pa.int32()),
                ),
                "s": pa.array(
                    [{"k": str(i)} for i in ids],
                    pa.struct([("k", pa.large_string() if large else pa.string())]),
                ),
            }
        )

    for n in range(4):
        local.write(f"w/{n}.{fmt}", encode(table(n * 50, (n % 2 == 0) == first_large), fmt))
    got = {}
    for batch in ingest.Stream(local.url("w"), batch_size=20, shuffle_seed=1):
        columns = (batch["id"].tolist(), batch["t"], batch["b"], batch["l"], batch["s"])
        for i, text, blob, pair, struct in zip(*columns, strict=True):
            got[i] = (text, blob, pair.tolist(), struct)
    assert got == {i: (f"t{i}", b"x%d" % i, [i, i], {"k": str(i)}) for i in range(200)}
    # Other values are refused as before, naming the column.
    local.write(
        f"w/z.{fmt}", encode(table(200, False).set_column(1, "t", pa.array(range(50))), fmt)
    )
    with pytest.raises(SchemaMismatchError, match=r"column 't' is int64, not (large_)?string"):
        list(ingest.Stream(local.url("w"), batch_size=20))


def test_csv_with_newlines_in_quoted_values_reads_like_pyarrow(local: Store) -> None:
    """The issue's file: 100,000 records whose second value holds a newline, read in 1 MiB
    blocks. A block cut inside a quoted value cut a record in two, silently: ``('k53539',
    'first53539\\n')``, then a phantom ``('k53539x', 'second53539"')``."""
    data = b"k,v\n" + b"".join(
        b'k%d,"first%d\nk%dx,second%d"\n' % (i, i, i, i) for i in range(100_000)
    )
    catalog, listing = open_shard(local, "csv", data, ReadOptions(block_bytes=1 << 20))
    expected = read_all_as_pyarrow(data)
    assert rows_of(read(catalog, listing)) == expected
    # Every seek point of the index is a record start: resuming there gives the tail.
    listing = indexed(catalog, listing)
    seeks = listing.infos[0].seeks
    assert listing.infos[0].rows == 100_000 and len(seeks) > 1
    for row, _ in seeks:
        assert rows_of(read(catalog, listing, row, row + 3)) == expected[row : row + 3]


def test_a_tsv_value_may_hold_commas_and_a_quoted_one_tabs(local: Store) -> None:
    """A ``.tsv`` shard is read with tabs between values: a comma is text, a quoted value
    may hold a tab. Before, ``.tsv`` was "cannot tell the format", and ``format="csv"``
    read each line as one column."""
    data = b'id\ttext\n1\ta, b "c"\n2\t"x\ty"\n3\t\n'
    local.write("notes.tsv", data)
    (batch,) = list(ingest.Stream(local.url("notes.tsv"), batch_size=3))
    rows = sorted(zip(batch["id"].tolist(), batch["text"], strict=True))
    assert rows == [(1, 'a, b "c"'), (2, "x\ty"), (3, "")]
    rows = [(r["id"], r["text"]) for r in read_all_as_pyarrow(data, delimiter="\t")]
    assert sorted(rows) == [(1, 'a, b "c"'), (2, "x\ty"), (3, "")]


@pytest.mark.parametrize(
    ("fmt", "data"), [("csv", b"a\n" + b" \n" * 2000), ("tsv", b"a\tb\n" + b"\t\n" * 2000)]
)
def test_records_of_blanks_and_delimiters_are_rows_as_pyarrow_reads_them(
    local: Store, fmt: str, data: bytes
) -> None:
    """A record of spaces (a one-column CSV) or of tabs alone (a TSV of empty values) is a
    row, as pyarrow reads it. Before, a chunk whose records held no other byte was taken for
    blank lines and left out: 0 rows of 2,000."""
    catalog, listing = open_shard(local, fmt, data, ReadOptions(block_bytes=1024))
    delimiter = "," if fmt == "csv" else "\t"
    assert rows_of(read(catalog, listing)) == read_all_as_pyarrow(data, delimiter=delimiter)
    assert len(rows_of(read(catalog, listing))) == 2000


_PLAIN = st.text(alphabet="ab ;\"'é", min_size=0, max_size=6).filter(
    lambda s: not s.startswith('"')
)  # unquoted: no delimiter or line break; a quote inside is a literal one
_QUOTED = st.text(alphabet='ab,\t\n\r"é ', min_size=0, max_size=12).map(
    lambda s: '"' + s.replace('"', '""') + '"'
)
# A quoted value may go on with text after its closing quote (pyarrow reads '"ab"c"d' as
# 'abc"d').
_VALUE = st.one_of(_PLAIN, _QUOTED, st.tuples(_QUOTED, _PLAIN).map("".join))
_PAIR = st.tuples(_VALUE, _VALUE)


@settings(max_examples=60)
@given(
    pairs=st.lists(_PAIR, min_size=1, max_size=100),
    endings=st.lists(st.sampled_from(["\n", "\r\n", "\n\n"]), min_size=1, max_size=300),
    block_bytes=st.integers(1024, 4096),
)
@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_csv_records_and_seek_points_match_pyarrow_at_any_block_size(
    tmp_path_factory: pytest.TempPathFactory,
    fmt: str,
    pairs: list[tuple[str, str]],
    endings: list[str],
    block_bytes: int,
) -> None:
    """Property: for records of quoted values (newlines, CRLF, commas, tabs, doubled quotes)
    and unquoted ones (literal quotes inside), every block size reads what pyarrow reads from
    the whole file, and a read from any row, at the index's seek point before it, is the
    tail; with commas between values (CSV) and with tabs (TSV)."""
    delimiter = "," if fmt == "csv" else "\t"
    records = [delimiter.join(pair) for pair in pairs]
    body = "".join(r + endings[i % len(endings)] for i, r in enumerate(records)).encode()
    data = f"a{delimiter}b\n".encode() + body * (3 * block_bytes // len(body) + 1)
    root = tmp_path_factory.mktemp(fmt)
    store = Store("local", fsspec.filesystem("file"), f"file://{root}", {})
    schema = pa.schema([("a", pa.string()), ("b", pa.string())])
    options = ReadOptions(block_bytes=block_bytes, batch_rows=64, schema=schema)
    catalog, listing = open_shard(store, fmt, data, options)
    expected = read_all_as_pyarrow(data, schema, delimiter)
    assert rows_of(read(catalog, listing)) == expected
    listing = indexed(catalog, listing)
    assert listing.infos[0].rows == len(expected)
    for k in sorted({0, len(expected) // 3, len(expected) // 2, len(expected) - 1}):
        seek = listing.infos[0].seek_for(k, None)
        assert rows_of(read(catalog, listing, k, None, seek)) == expected[k:]


# -- dates and times, as the training loop receives them (issue 17) -------------------------


def test_timestamps_with_a_zone_dates_and_times_arrive_as_integers_since_the_epoch(
    local: Store,
) -> None:
    """A zoned timestamp is an instant: it arrives as int64 counts of its unit since the
    epoch in UTC, the same for the same instant in any zone (the zone is dropped, as the
    ingest.engine.convert docstring says). Dates and times arrive as integers too (date32 came as
    Python date objects, time64 as time objects)."""

    import torch

    table = date_time_table()
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    local.write("d/a.parquet", sink.getvalue().to_pybytes())
    (batch,) = ingest.Stream(local.url("d"), batch_size=1)
    assert batch["paris"].dtype == torch.int64
    assert batch["paris"].tolist() == batch["utc"].tolist() == [1_704_063_600_000]
    assert batch["naive_us"].tolist() == [1_704_067_200_000_000]
    assert batch["day"].dtype == torch.int32 and batch["day"].tolist() == [19_723]
    assert batch["at"].tolist() == [3_723_000_000]
    assert batch["took"].tolist() == [2000]


def test_text_lines_are_rows_as_datasets_text_builder_reads_them(tmp_path: Any) -> None:
    """A ``.txt`` shard is a row per line, in a ``text`` column, as Hugging Face ``datasets``
    reads text files (``load_dataset("text", ...)``): blank lines are rows (empty texts), a
    ``\\r\\n`` ends a line as ``\\n`` does (neither is kept), a last line without a newline
    is a row, and the row count is the line count. Before, ``.txt`` shards were refused
    ("cannot tell the format")."""
    body = 'first line\r\n\n  indented, with, commas\t"quotes"\n{not json}\nlast, no newline'
    (tmp_path / "a.txt").write_bytes(body.encode())
    (tmp_path / "b.txt").write_bytes(b"")
    stream = ingest.Stream(str(tmp_path) + "/", batch_size=1, shuffle_seed=None)
    texts = [t for batch in stream for t in batch["text"]]
    assert texts == [
        "first line",
        "",
        '  indented, with, commas\t"quotes"',
        "{not json}",
        "last, no newline",
    ]
    state = stream.state_dict()
    assert state  # a text stream's state saves like any other


def test_a_text_stream_resumes_at_a_line(tmp_path: Any) -> None:
    """A corpus of ``.txt`` files, shuffled: every line once across a resume, which seeks to
    a byte offset (the seek of line formats) and reads less than the corpus again."""
    lines = [f"line {n} " + "word " * (n % 7) for n in range(3000)]
    for k in range(3):
        (tmp_path / f"part-{k}.txt").write_text("\n".join(lines[k * 1000 : (k + 1) * 1000]) + "\n")
    read = ReadOptions(block_bytes=2048)

    def stream() -> ingest.Stream:
        shuffle = ingest.Shuffle(seed=3, window=300, lanes=3)
        return ingest.Stream(str(tmp_path) + "/", batch_size=50, shuffle=shuffle, read=read)

    first = stream()
    seen: list[str] = []
    for batch in first:
        seen += batch["text"]
        if len(seen) == 1250:
            break
    state = first.state_dict()
    second = stream()
    second.load_state_dict(state)
    seen += [t for batch in second for t in batch["text"]]
    assert sorted(seen) == sorted(lines)
    assert second.stats["bytes_read"] < sum(
        (tmp_path / f"part-{k}.txt").stat().st_size for k in range(3)
    )


def test_text_files_beside_shards_of_another_format_are_left_out_with_a_warning(
    tmp_path: Any,
) -> None:
    """A ``README.txt`` or ``LICENSE.txt`` beside Parquet shards is a document, not a text
    shard: the listing leaves it out and says so; a folder of text files alone is read."""
    from ingest.formats import IncidentalFilesWarning

    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "part-0.parquet")
    (tmp_path / "README.txt").write_text("a dataset of ids\n")
    (tmp_path / "LICENSE.txt").write_text("CC0\n")
    with pytest.warns(IncidentalFilesWarning, match=r"left out 2 text file\(s\).*README\.txt"):
        batches = list(ingest.Stream(str(tmp_path) + "/", batch_size=2, shuffle_seed=None))
    assert [b["id"].tolist() for b in batches] == [[1, 2]]
    (tmp_path / "part-0.parquet").unlink()
    texts = [t for b in ingest.Stream(str(tmp_path) + "/", batch_size=1) for t in b["text"]]
    assert sorted(texts) == ["CC0", "a dataset of ids"]


def test_a_directory_saved_by_datasets_reads_its_arrow_files_alone(tmp_path: Any) -> None:
    """``Dataset.save_to_disk`` writes its rows to ``data-*.arrow`` (Arrow IPC streams) beside
    ``dataset_info.json`` and ``state.json``, its metadata: a stream over the directory read
    those as JSON shards and failed ("invalid JSON ... every line must be one JSON object").
    Now datasets' metadata files beside shards are left out, with the warning a README.txt
    beside Parquet shards gets; and so is a Hub repository's ``dataset_infos.json`` beside
    its JSON Lines files. Named alone, such a file is read (and refused: an object)."""
    datasets = pytest.importorskip("datasets")
    from ingest.formats import IncidentalFilesWarning

    rows = {"id": list(range(300)), "text": [f"t{i}" for i in range(300)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    names = sorted(p.name for p in (tmp_path / "saved").iterdir())
    assert "state.json" in names and "dataset_info.json" in names  # the premise
    with pytest.warns(IncidentalFilesWarning, match=r"dataset_info\.json.*state\.json"):
        stream = ingest.Stream(str(tmp_path / "saved"), batch_size=50, shuffle_seed=1)
        got = sorted(i for b in stream for i in b["id"].tolist())
    assert got == rows["id"]
    # A DatasetDict: dataset_dict.json at the root, a saved split in each directory.
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.warns(IncidentalFilesWarning, match=r"dataset_dict\.json"):
        got = sorted(
            i
            for b in ingest.Stream(str(tmp_path / "dict"), batch_size=50)
            for i in b["id"].tolist()
        )
    assert got == rows["id"]
    # A Hub repository's metadata beside JSON Lines shards (one format: JSON).
    (tmp_path / "hub" / "data").mkdir(parents=True)
    (tmp_path / "hub" / "dataset_infos.json").write_text(
        json.dumps({"default": {"features": {}}}, indent=2)
    )
    (tmp_path / "hub" / "data" / "train.jsonl").write_text(
        "".join(f'{{"id": {i}}}\n' for i in range(5))
    )
    with pytest.warns(IncidentalFilesWarning, match=r"dataset_infos\.json"):
        got = sorted(
            i for b in ingest.Stream(str(tmp_path / "hub"), batch_size=5) for i in b["id"].tolist()
        )
    assert got == list(range(5))
    # Named alone, it is read (a state.json of one's own, beside no Arrow file, is data).
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "state.json").write_text('{"id": 7}\n')
    (tmp_path / "mine" / "other.json").write_text('{"id": 8}\n')
    got = sorted(
        i for b in ingest.Stream(str(tmp_path / "mine"), batch_size=1) for i in b["id"].tolist()
    )
    assert got == [7, 8]
    with pytest.raises(ShardError, match=r"state\.json.*invalid JSON"):  # read: an object
        list(ingest.Stream(str(tmp_path / "saved" / "state.json"), batch_size=1))


@pytest.mark.parametrize(
    ("chunk", "texts"),
    [
        (b"", []),
        (b"\n", [""]),
        (b"a", ["a"]),
        (b"a\r", ["a"]),
        (b"a\r\nb\n\n", ["a", "b", ""]),
        (b"\r\n", [""]),
        (b"x\ry\n", ["x\ry"]),
        ("é\nü".encode(), ["é", "ü"]),
    ],
)
def test_text_lines_of_a_chunk(chunk: bytes, texts: list[str]) -> None:
    """The cut of a chunk into lines at its edges: no chunk, blank lines, ``\\r\\n``, a last
    line without its newline, a ``\\r`` inside a line (kept), UTF-8 beyond ASCII."""
    from ingest.formats.text import lines

    assert lines(chunk).to_pylist() == texts


@pytest.mark.parametrize("start", [0, 30])
def test_a_csv_header_that_differs_is_refused_from_any_row(local: Store, start: int) -> None:
    """A read from the shard's first byte takes the header from its first chunk; one from
    inside the shard (a seek: a rank's share, a resume) reads it apart. Either way a shard
    whose header is not the stream's columns is refused before a row is read."""
    import dataclasses

    catalog, listing = open_shard(local, "csv", encode(make_table(0, 50), "csv"))
    ctx = listing.context(0, catalog.source, catalog.options, catalog.columns)
    assert ctx.schema is not None
    other = pa.schema([ctx.schema.field(0).with_name("ID"), *list(ctx.schema)[1:]])
    ctx = dataclasses.replace(ctx, schema=other)
    seek = None
    if start:
        line = encode(make_table(0, 50), "csv").split(b"\n")
        seek = (start, sum(len(x) + 1 for x in line[: start + 1]))  # the header, 30 rows
    with (
        get_format("csv").open(ctx) as reader,
        pytest.raises(ingest.SchemaMismatchError, match=r"header \['id'.*differs from .*\['ID'"),
    ):
        next(iter(reader.read(start, None, seek)))


@pytest.mark.parametrize(
    ("ext", "empty", "full"),
    [
        ("csv", b"id,name\n", b"id,name\n0,x\n1,y\n"),
        ("csv", b"id,name\r\n", b"id,name\r\n0,x\r\n1,y\r\n"),
        ("tsv", b"id\tname\n", b"id\tname\n0\tx\n1\ty\n"),
        ("jsonl", b"\n\n  \n", b'{"id": 0, "name": "x"}\n{"id": 1, "name": "y"}\n'),
    ],
    ids=["csv", "csv-crlf", "tsv", "jsonl-blank-lines"],
)
def test_a_shard_without_records_leaves_the_types_to_one_with_them(
    tmp_path: Any, ext: str, empty: bytes, full: bytes
) -> None:
    """Spark writes a CSV part file holding the header alone for each empty partition, and
    ``part-00000`` often sorts first. The stream's types came from that file: every column
    null, and every other shard failed ("conversion error to null"). A JSON Lines file of
    blank lines failed the stream ("no JSON lines to infer a schema from"). The types now
    come from the first shard with records; a shard without reads as no rows."""
    for name, body in (("part-00000", empty), ("part-00001", full), ("part-00002", empty)):
        (tmp_path / f"{name}.{ext}").write_bytes(body)
    stream = ingest.Stream(str(tmp_path), batch_size=1, shuffle_seed=0)
    rows = sorted((int(b["id"][0]), b["name"][0]) for b in stream)
    assert rows == [(0, "x"), (1, "y")]
    schema = stream.listing().schema
    assert schema is not None and schema.field("id").type == pa.int64()
    assert schema.field("name").type == pa.string()


@pytest.mark.parametrize(
    ("ext", "empty"), [("csv", b"id,name\n"), ("jsonl", b"\n\n")], ids=["csv", "jsonl"]
)
def test_a_listing_whose_shards_hold_no_records_gives_no_rows(
    tmp_path: Any, ext: str, empty: bytes
) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.{ext}").write_bytes(empty)
    assert list(ingest.Stream(str(tmp_path), batch_size=1)) == []


def test_a_csv_shard_of_a_listing_without_records_that_holds_some_is_refused(
    local: Store,
) -> None:
    """Where no shard held a record at listing, the columns have no type and each shard
    reads as no rows, once checked to hold none still: one that holds some is refused,
    not read as nothing."""
    import dataclasses

    catalog, listing = open_shard(local, "csv", encode(make_table(0, 5), "csv"))
    ctx = listing.context(0, catalog.source, catalog.options, catalog.columns)
    ctx = dataclasses.replace(ctx, schema=None)
    with (
        get_format("csv").open(ctx) as reader,
        pytest.raises(ShardError, match=r"holds records, and its listing found none"),
    ):
        list(reader.read(0, None, None))


def test_a_state_is_refused_by_a_stream_that_reads_its_shards_as_another_format(
    tmp_path: Any,
) -> None:
    """Rows are numbered per format: a CSV file's header is no row, a text file's first line
    is one. A state of CSV shards loaded into a stream with ``format="text"`` was taken, and
    its rows were one line early (a row delivered twice, without a word)."""
    for s in range(2):
        lines = ["id"] + [str(i) for i in range(s * 50, s * 50 + 50)]
        (tmp_path / f"p{s}.csv").write_text("\n".join(lines) + "\n")
    stream = ingest.Stream(str(tmp_path), batch_size=10)
    batches = iter(stream)
    for _ in range(3):
        next(batches)
    state = json.loads(json.dumps(stream.state_dict()))
    text = ingest.Stream(str(tmp_path), batch_size=10, format="text")
    with pytest.raises(ingest.StateError, match=r"read as csv.*as text.*format='csv'"):
        text.load_state_dict(state)
    again = ingest.Stream(str(tmp_path), batch_size=10, format="csv")
    again.load_state_dict(state)  # the same format, named: taken
    assert len([i for b in again for i in b["id"].tolist()]) == 70
    del state["dataset"]["formats"]  # a state saved before formats were recorded: taken
    ingest.Stream(str(tmp_path), batch_size=10, format="text").load_state_dict(state)
