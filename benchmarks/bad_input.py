"""The bad-input table: every bad input the tests check, the error it gives, and how fast.

Each case builds the same bad input as its test (tests/test_bad_input.py,
tests/test_state_validation.py, tests/test_state.py, tests/test_storage_faults.py,
tests/test_quarantine.py, tests/test_cache.py, tests/test_options.py, tests/test_follow.py,
tests/test_errors.py, tests/test_formats.py, tests/test_folders.py, tests/test_http.py,
tests/test_versions.py, tests/test_tokenize.py, tests/test_packing.py, tests/test_mixture.py,
tests/test_stage.py, tests/test_plan_skip.py, tests/test_pool_sizing.py) with real components:
local files under a temporary directory, or the loopback S3 server
(:class:`ingest.testing.LoopbackS3`, a ``moto_server`` child process on 127.0.0.1; a second
one that checks credentials for the wrong-credentials cases). It then creates an
``ingest.Stream`` (or the option object) and iterates it, or loads a state into a new one,
and records the exception's class, the first line of its message and the seconds from
creating the stream to the error. The clock starts at ``ingest.Stream(...)``, except where
the stream must exist (and have listed) before the input goes bad (an object deleted after
the listing): there it starts at the loop that fails. A refused shard read is timed from
``ingest.Source(...)``, as its test reads it (a Stream lists and reads through one
endpoint). Two cases run in a child process, timed there from ``ingest.Stream(...)``: the
JSON line that crashed the process, and the read-only cache directory (a read-only bind
mount in a user and mount namespace, ``unshare``). Setup (writing shards, saving a state)
is never timed.

The goal (issue 8, "Bad input"): every case fails with an ``ingest.IngestError`` subclass
within 30 s. A case that raises anything else, raises nothing, or takes longer is listed in a
final ``NOT MET`` line and the exit status is 1. A case that the tests treat as valid input
(a tar sample missing a field: a null there; since issue 17, a same-size damaged cached copy,
fetched again; CSV values holding newlines across blocks; under on_error="skip", a deep JSON
line or an image that does not decode, quarantined alone; zoned timestamps and dates, as
integers) is shown as "not an error" and checked to give exactly what its test expects. A
case this machine cannot build (no user namespaces for the read-only mount) is listed as
skipped and not counted. A message that does not match its test's pattern is reported on
stderr. Nothing leaves 127.0.0.1; Ray is started only in the child processes of the
reader-pool cases (a 2-CPU local Ray each, as on a laptop). One to two minutes in all (the
refused endpoint retries to the default 20 s deadline, as in its test).

    .venv/bin/python benchmarks/bad_input.py
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

import ingest
from ingest.core import errors
from ingest.core.state import MAX_STATE_BYTES
from ingest.testing import (
    FaultProxy,
    Faults,
    LoopbackS3,
    Store,
    credential_checking_s3,
    date_time_table,
    encode,
    make_table,
    tar_link,
    tar_of,
    write_dataset,
    write_image_folder,
)

GOAL_S = 30.0  # the tests' QUICK_S: "within seconds", far below any hang
HANG_S = 60.0  # a case still running after this is reported as hung and left behind
MESSAGE_CHARS = 160
SHORT_RETRY = {"deadline_s": 3.0, "read_timeout_s": 1.0}  # as the stall test's policy

Thunk = Callable[[], object]
"""The timed part of a case: creates the stream and makes it fail (or returns a result)."""


@dataclass
class Context:
    """The temporary directory, the loopback S3 server, and fresh stores on both."""

    tmp: str
    s3: LoopbackS3
    stack: contextlib.ExitStack
    auth: tuple[LoopbackS3, dict[str, str]] | None = None
    """The credential-checking server and the right credentials, once started."""
    validation_url: str | None = None
    """tests/test_state_validation.py's dataset, once written."""
    _names: Iterator[int] = field(default_factory=itertools.count)

    def local(self) -> Store:
        root = os.path.join(self.tmp, f"c{next(self._names)}")
        os.makedirs(root)
        return Store("local", fsspec.filesystem("file"), f"file://{root}", {})

    def s3_store(self) -> Store:
        return Store(
            "s3",
            self.s3.filesystem(),
            f"s3://ingest-test/c{next(self._names)}",
            self.s3.storage_options(),
        )


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[Context], Thunk]
    expect: type[BaseException] | None
    """The class the test expects; None: the test treats the input as valid."""
    pattern: str
    """The test's ``match=`` pattern (searched in the message)."""


@dataclass(frozen=True)
class Row:
    case: Case
    error: str
    seconds: float | None
    message: str
    clear: bool
    """Failed with an IngestError (or, for a valid input, gave what its test expects)."""
    note: str = ""
    skipped: bool = False
    """The case cannot be built on this machine: listed, not counted."""


CASES: list[Case] = []


def case(
    name: str, expect: type[BaseException] | None, pattern: str = ""
) -> Callable[[Callable[[Context], Thunk]], Callable[[Context], Thunk]]:
    def register(setup: Callable[[Context], Thunk]) -> Callable[[Context], Thunk]:
        CASES.append(Case(name, setup, expect, pattern))
        return setup

    return register


def drain(stream: Any) -> int:
    """Iterate ``stream`` to the end (or its error); always close it."""
    try:
        return sum(1 for _ in stream)
    finally:
        stream.close()


def first(stream: Any) -> object:
    try:
        return next(iter(stream))
    finally:
        stream.close()


class ChildError(Exception):
    """What a case run in a child process met: the error, rebuilt from its class name and
    message, and the child's own seconds from creating the stream to the error."""

    def __init__(self, error: BaseException, seconds: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.seconds = seconds


CHILD_PRELUDE = """
import json, sys, time
import ingest

def record(thunk):
    start = time.monotonic()
    try:
        result, name, message = repr(thunk()), None, ""
    except Exception as e:
        result, name, message = None, type(e).__name__, str(e)
    seconds = time.monotonic() - start
    print(json.dumps({"result": result, "error": name, "message": message, "seconds": seconds}))
"""


class Unavailable(Exception):  # noqa: N818 (not an error: a case this machine cannot build)
    """Raised by a case's setup where this machine cannot build it (no user namespaces)."""


NAMESPACE = ["unshare", "--map-root-user", "--mount"]


def in_child(script: str, *args: str, namespace: bool = False) -> object:
    """Run ``script`` (after :data:`CHILD_PRELUDE`; it calls ``record(thunk)``) in a child
    Python, in a user and mount namespace if ``namespace``, and raise :class:`ChildError` with
    the error it reports (an ``ingest.core.errors`` class by name; anything else as a
    RuntimeError naming it), or return its result."""
    argv = [*(NAMESPACE if namespace else []), sys.executable, "-c", CHILD_PRELUDE + script, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the child exited with {done.returncode}: {done.stderr[-500:]}")
    out = json.loads(lines[-1])
    if out["error"] is None:
        return out["result"]
    cls = getattr(errors, out["error"], None)
    if isinstance(cls, type) and issubclass(cls, ingest.IngestError):
        error: BaseException = cls.__new__(cls)
        Exception.__init__(error, out["message"])  # its own __init__ takes the parts
    else:
        error = RuntimeError(f"{out['error']}: {out['message']}")
    raise ChildError(error, out["seconds"])


# -- shards (tests/test_bad_input.py) ------------------------------------------------------


@case(
    "truncated parquet",
    ingest.ShardError,
    r"a\.parquet.*no readable Parquet footer.*re-upload",
)
def truncated_parquet(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.parquet", encode(make_table(0, 500), "parquet")[:-100])
    return lambda: drain(ingest.Stream(store.url("d")))


@case("bad-magic parquet", ingest.ShardError, r"a\.parquet at byte 0: is not a Parquet file")
def bad_magic_parquet(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.parquet", b'{"id": 1}\n')
    return lambda: drain(ingest.Stream(store.url("d")))


def zero_byte(ctx: Context, fmt: str) -> Thunk:
    store = ctx.local()
    store.write(f"d/a.{fmt}", encode(make_table(0, 100), fmt))
    store.write(f"d/c.{fmt}", b"")
    return lambda: drain(ingest.Stream(store.url("d"), columns=["id"]))


@case(
    "zero-byte parquet",
    ingest.ShardError,
    r"c[.]parquet at byte 0: is empty \(0 bytes\).*write it again",
)
def zero_byte_parquet(ctx: Context) -> Thunk:
    return zero_byte(ctx, "parquet")


@case("zero-byte arrow", ingest.ShardError, r"c[.]arrow at byte 0: is empty \(0 bytes\).*write it")
def zero_byte_arrow(ctx: Context) -> Thunk:
    return zero_byte(ctx, "arrow")


@case(
    "parquet shard without columns",
    ingest.ShardError,
    r"b\.parquet at byte \d+: has no columns \(its footer lists 0 rows and not one column\): "
    r"there is nothing in it to read.*write the file again with its columns",
)
def zero_column_parquet(ctx: Context) -> Thunk:
    """A table whose columns were all dropped, beside a good shard (tests/test_bad_input.py):
    pyarrow writes it with 0 rows, and it was read as a shard of 0 rows, silently."""
    store = ctx.local()
    store.write("d/a.parquet", encode(make_table(0, 100), "parquet"))
    sink = pa.BufferOutputStream()
    pq.write_table(make_table(0, 3).drop_columns(["id", "tokens", "score", "text"]), sink)
    store.write("d/b.parquet", sink.getvalue().to_pybytes())
    return lambda: drain(ingest.Stream(store.url("d"), batch_size=10))


@case("timestamps with a time zone, a date32, a time64 and a duration", None)
def dates_and_times(ctx: Context) -> Thunk:
    """Valid input (tests/test_formats.py): each arrives as integers in its Arrow unit, a
    zoned timestamp as the instant in UTC (it came as int64 with the zone dropped silently,
    a date32 as Python date objects, a time64 as time objects)."""
    import torch

    table = date_time_table()
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    store = ctx.local()
    store.write("d/a.parquet", sink.getvalue().to_pybytes())
    expected = {
        "paris": (torch.int64, [1_704_063_600_000]),  # 2023-12-31T23:00:00Z, in ms
        "utc": (torch.int64, [1_704_063_600_000]),
        "naive_us": (torch.int64, [1_704_067_200_000_000]),
        "day": (torch.int32, [19_723]),
        "at": (torch.int64, [3_723_000_000]),
        "took": (torch.int64, [2000]),
    }

    def run() -> object:
        stream = ingest.Stream(store.url("d"), batch_size=1)
        try:
            batches = list(stream)
        finally:
            stream.close()
        got = {k: (v.dtype, v.tolist()) for b in batches for k, v in b.items()}
        if len(batches) != 1 or got != expected:
            raise AssertionError(f"expected one batch {expected}, got {batches}")
        return "not an error: integers in each column's unit, the same instant in both zones"

    return run


@case(
    "schema drift across parquet shards",
    ingest.SchemaMismatchError,
    r"b\.parquet: schema differs from .*a\.parquet's: column 'id' is string, not int64",
)
def parquet_drift(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.parquet", encode(make_table(0, 10), "parquet"))
    table = make_table(10, 10).set_column(0, "id", pa.array([str(i) for i in range(10)]))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    store.write("d/b.parquet", sink.getvalue().to_pybytes())
    return lambda: drain(ingest.Stream(store.url("d")))


@case(
    "schema drift across jsonl shards",
    ingest.SchemaMismatchError,
    r"b\.jsonl at line 1, row 0, byte 0: line does not match the schema taken from .*a\.jsonl",
)
def jsonl_drift(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.jsonl", b"".join(b'{"id": %d, "x": 1.5}\n' % i for i in range(50)))
    store.write("d/b.jsonl", b"".join(b'{"id": %d, "x": "text"}\n' % i for i in range(50)))
    return lambda: drain(ingest.Stream(store.url("d")))


@case(
    "non-UTF-8 JSON line",
    ingest.ShardError,
    r"a\.jsonl at line 41, row 40, byte \d+: is not UTF-8 text \(byte 0xe9.*re-encode the file",
)
def non_utf8_jsonl(ctx: Context) -> Thunk:
    store = ctx.local()
    lines = encode(make_table(0, 3000), "jsonl").split(b"\n")
    lines[40] = b'{"id": 40, "score": 0.5, "text": "caf\xe9"}'
    store.write("d/a.jsonl", b"\n".join(lines))
    read = ingest.ReadOptions(block_bytes=4096)
    return lambda: drain(ingest.Stream(store.url("d"), batch_size=10, read=read))


def csv_with(rows: dict[int, bytes]) -> bytes:
    """A 3,000-record CSV shard (``id,score,text``) with records ``rows`` (0-based) replaced."""
    lines = encode(make_table(0, 3000), "csv").split(b"\n")
    for row, record in rows.items():
        lines[row + 1] = record
    return b"\n".join(lines)


@case(
    "non-UTF-8 CSV record",
    ingest.ShardError,
    r"a\.csv at line 42, row 40, byte \d+: is not UTF-8 text \(byte 0xe9.*re-encode the file",
)
def non_utf8_csv(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.csv", csv_with({40: b'40,0.5,"caf\xe9 40"'}))
    read = ingest.ReadOptions(block_bytes=4096)
    return lambda: drain(ingest.Stream(store.url("d"), batch_size=10, read=read))


@case(
    "invalid JSON line",
    ingest.ShardError,
    r"a\.jsonl at line 124, row 123, byte \d+: invalid JSON",
)
def invalid_json(ctx: Context) -> Thunk:
    store = ctx.local()
    lines = encode(make_table(0, 400), "jsonl").split(b"\n")
    lines[123] = b"{not json"
    store.write("d/a.jsonl", b"\n".join(lines))
    read = ingest.ReadOptions(block_bytes=2048)
    return lambda: drain(ingest.Stream(store.url("d"), read=read))


@case(
    "4 MB JSON line over max_line_bytes=64 KiB",
    ingest.ShardError,
    r"a\.jsonl at line 71, row 70, byte \d+: a line is longer than max_line_bytes=65536"
    r".*raise ReadOptions\(max_line_bytes=\.\.\.\)",
)
def long_line(ctx: Context) -> Thunk:
    """Issue 8's 50 MB line, scaled down as its test does (on S3: no whole-file read)."""
    store = ctx.s3_store()
    lines = encode(make_table(0, 100), "jsonl").split(b"\n")
    lines[70] = b'{"id": 70, "score": 0.07, "text": "' + b"x" * (4 << 20) + b'"}'
    store.write("d/a.jsonl", b"\n".join(lines))
    read = ingest.ReadOptions(max_line_bytes=64 << 10, block_bytes=16 << 10)
    return lambda: drain(
        ingest.Stream(
            store.url("d"), batch_size=10, storage_options=store.storage_options, read=read
        )
    )


def truncated_compressed(ctx: Context, codec: str) -> Thunk:
    import zstandard

    store = ctx.local()
    raw = encode(make_table(0, 20_000), "jsonl")
    data = gzip.compress(raw) if codec == "gz" else zstandard.ZstdCompressor().compress(raw)
    store.write(f"d/a.jsonl.{codec}", data[: len(data) * 2 // 3])
    read = ingest.ReadOptions(block_bytes=64 << 10)
    return lambda: drain(ingest.Stream(store.url("d"), batch_size=100, read=read))


@case(
    "truncated .jsonl.gz",
    ingest.ShardError,
    r"a\.jsonl\.gz at byte \d+: the gzip stream is truncated.*re-upload the complete file",
)
def truncated_gz(ctx: Context) -> Thunk:
    return truncated_compressed(ctx, "gz")


@case(
    "truncated .jsonl.zst",
    ingest.ShardError,
    r"a\.jsonl\.zst at byte \d+: the zstd stream is truncated.*re-upload the complete file",
)
def truncated_zst(ctx: Context) -> Thunk:
    return truncated_compressed(ctx, "zst")


def ragged(ctx: Context, row: int, record: bytes) -> Thunk:
    store = ctx.local()
    store.write("d/a.csv", csv_with({row: record}))
    read = ingest.ReadOptions(block_bytes=4096)
    return lambda: drain(ingest.Stream(store.url("d"), read=read))


@case(
    "ragged CSV row (first block)",
    ingest.ShardError,
    r"a\.csv at line 52, row 50, byte \d+: bad CSV record \(CSV parse error: Expected 3 "
    "columns, got 4.*fix the record",
)
def ragged_first_block(ctx: Context) -> Thunk:
    return ragged(ctx, 50, b"50,0.05,row 50,extra")


@case(
    "ragged CSV row (later chunk)",
    ingest.ShardError,
    r"a\.csv at line 2502, row 2500, byte \d+: bad CSV record \(CSV parse error: Expected 3 "
    "columns, got 2.*fix the record",
)
def ragged_later(ctx: Context) -> Thunk:
    return ragged(ctx, 2500, b"2500,0.5")


def plain_csv(rows: int, replaced: dict[int, bytes]) -> bytes:
    """``id,text`` records without quotes, with records ``replaced`` (0-based) replaced."""
    records = [replaced.get(i, b"%d,text %d" % (i, i)) for i in range(rows)]
    return b"id,text\n" + b"".join(r + b"\n" for r in records)


STRAY = b'2990,"a stray quote'
"""tests/test_bad_input.py's record with a quote that never closes, in the last block."""


@case(
    "CSV quote that never closes",
    ingest.ShardError,
    r"a\.csv at byte \d+: ends inside a record: the quoted value opened at byte \d+ never "
    r"closes.*close the quote, or double each quote meant as text",
)
def csv_open_quote(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.csv", plain_csv(3000, {2990: STRAY}))
    read = ingest.ReadOptions(block_bytes=4096)
    return lambda: drain(ingest.Stream(store.url("d"), read=read))


@case(
    "CSV quote that never closes, past max_line_bytes=1024",
    ingest.ShardError,
    r"a\.csv at .*byte \d+: a line is longer than max_line_bytes=1024 \(the quoted value "
    r"opened at byte \d+ never closes\).*an unbalanced quote",
)
def csv_open_quote_long(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.csv", plain_csv(3000, {2990: STRAY, 2999: b"x" * 2000}))
    read = ingest.ReadOptions(block_bytes=4096, max_line_bytes=1024)
    return lambda: drain(ingest.Stream(store.url("d"), read=read))


@case("CSV quoted values holding newlines across 1 MiB blocks", None)
def csv_quoted_newlines(ctx: Context) -> Thunk:
    """Valid input (tests/test_formats.py): 100,000 records whose second value holds a
    newline, read in 1 MiB blocks, give pyarrow's rows for the whole file; a block cut
    inside a quoted value cut a record in two, silently."""
    import pyarrow.csv as pcsv

    store = ctx.local()
    data = b"k,v\n" + b"".join(
        b'k%d,"first%d\nk%dx,second%d"\n' % (i, i, i, i) for i in range(100_000)
    )
    store.write("d/a.csv", data)
    whole = pcsv.read_csv(
        pa.BufferReader(data), parse_options=pcsv.ParseOptions(newlines_in_values=True)
    )
    expected = sorted(zip(whole["k"].to_pylist(), whole["v"].to_pylist(), strict=True))

    def run() -> object:
        stream = ingest.Stream(
            store.url("d"), batch_size=1000, read=ingest.ReadOptions(block_bytes=1 << 20)
        )
        try:
            got = sorted((k, v) for b in stream for k, v in zip(b["k"], b["v"], strict=True))
        finally:
            stream.close()
        if got != expected:
            raise AssertionError(f"{len(got)} rows, not pyarrow's {len(expected)}, or others")
        return f"not an error: {len(got):,} rows, pyarrow's for the whole file"

    return run


DEEP = b'{"id": 60, "score": 0.5, "text": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
"""tests/test_bad_input.py's JSON line of 20 KB that nests 10,001 levels deep."""


def deep_jsonl(ctx: Context) -> Store:
    """A first shard of 100 plain lines, then b.jsonl with line 61 :data:`DEEP`."""
    store = ctx.local()
    store.write("d/a.jsonl", encode(make_table(0, 100), "jsonl"))
    lines = encode(make_table(0, 100), "jsonl").split(b"\n")
    lines[60] = DEEP
    store.write("d/b.jsonl", b"\n".join(lines))
    return store


@case(
    "JSON line nested 10,001 levels deep (a later shard)",
    ingest.ShardError,
    r"b\.jsonl at line 61, row 60, byte \d+: a JSON value nests 10001 levels deep, more than "
    r"max_json_depth=128.*flatten",
)
def deep_json(ctx: Context) -> Thunk:
    store = deep_jsonl(ctx)
    return lambda: drain(ingest.Stream(store.url("d"), batch_size=1))


DEEP_FIRST = """
record(lambda: sum(1 for _ in ingest.Stream(sys.argv[1], batch_size=10)))
"""


@case(
    "JSON line nested 10,001 levels deep (the schema's shard; in a child process)",
    ingest.ShardError,
    r"a\.jsonl at line 61, row 60, byte \d+: a JSON value nests 10001 levels deep",
)
def deep_json_first(ctx: Context) -> Thunk:
    """Here the line crashed the process (a segmentation fault in pyarrow), so the stream
    runs in a child, as in its test; the seconds are the child's, from ``ingest.Stream``."""
    store = ctx.local()
    lines = encode(make_table(0, 100), "jsonl").split(b"\n")
    lines[60] = DEEP
    store.write("d/a.jsonl", b"\n".join(lines))
    return lambda: in_child(DEEP_FIRST, store.url("d"))


@case('JSON line nested 10,001 levels deep, on_error="skip"', None)
def deep_json_skipped(ctx: Context) -> Thunk:
    store = deep_jsonl(ctx)

    def run() -> object:
        read = ingest.ReadOptions(on_error="skip")
        stream = ingest.Stream(store.url("d"), batch_size=1, read=read)
        rows = drain(stream)
        spans = [((q.url or "").rsplit("/", 1)[-1], q.start, q.stop) for q in stream.quarantined]
        if rows != 199 or spans != [("b.jsonl", 60, 61)]:
            raise AssertionError(f"{rows} rows, quarantined {spans}")
        return "not an error: 199 rows; b.jsonl rows [60, 61) quarantined, as its test expects"

    return run


# -- WebDataset tars ---------------------------------------------------------------------


SAMPLE0 = (("s0.jpg", b"jpeg 0"), ("s0.cls", b"0"))  # two members of 1024 bytes each


def tar_stream(store: Store, batch_size: int = 1) -> Thunk:
    return lambda: drain(
        ingest.Stream(store.url("d"), batch_size=batch_size, storage_options=store.storage_options)
    )


@case(
    "tar member escaping with ../",
    ingest.ShardError,
    r"a\.tar at byte 2048: member name '\.\./x\.jpg' leaves the archive.*"
    r"tar -C DIR -cf shard\.tar \.",
)
def tar_escape(ctx: Context) -> Thunk:
    store = ctx.s3_store()
    store.write("d/a.tar", tar_of(*SAMPLE0, ("../x.jpg", b"jpeg"), ("s2.jpg", b"jpeg 2")))
    return tar_stream(store)


@case(
    "tar member with an absolute path",
    ingest.ShardError,
    r"a\.tar at byte 2048: member name '/etc/x\.jpg' leaves the archive",
)
def tar_absolute(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.tar", tar_of(*SAMPLE0, ("/etc/x.jpg", b"jpeg"), ("s2.jpg", b"jpeg 2")))
    return tar_stream(store)


@case(
    "tar symlink member",
    ingest.ShardError,
    r"a\.tar at byte 2048: member 's1\.jpg' is a symbolic link to '\.\./\.\./etc/passwd': "
    r"a WebDataset field must be a regular file.*--dereference",
)
def tar_symlink(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write(
        "d/a.tar", tar_of(*SAMPLE0, tar_link("s1.jpg", "../../etc/passwd", tarfile.SYMTYPE))
    )
    return tar_stream(store)


@case(
    "tar hard-link member",
    ingest.ShardError,
    r"a\.tar at byte 2048: member 's1\.jpg' is a hard link to '\.\./\.\./etc/passwd'",
)
def tar_hardlink(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write(
        "d/a.tar", tar_of(*SAMPLE0, tar_link("s1.jpg", "../../etc/passwd", tarfile.LNKTYPE))
    )
    return tar_stream(store)


@case("tar sample missing a field", None)
def tar_missing_field(ctx: Context) -> Thunk:
    """Valid input in the tests: the columns are the union of the fields, a gap is None."""
    store = ctx.local()
    store.write("d/a.tar", tar_of(*SAMPLE0, ("s1.jpg", b"jpeg 1"), ("s2.cls", b"2")))
    expected = {
        "__key__": ["s0", "s1", "s2"],
        "cls": [b"0", None, b"2"],
        "jpg": [b"jpeg 0", b"jpeg 1", None],
    }

    def run() -> object:
        stream = ingest.Stream(store.url("d"), batch_size=3)
        try:
            batches = list(stream)
        finally:
            stream.close()
        if batches != [expected]:
            raise AssertionError(f"expected one batch {expected}, got {batches}")
        return "not an error: null (s1 has cls=None, s2 has jpg=None, as its test expects)"

    return run


def tar_field(ctx: Context, name: str) -> Thunk:
    store = ctx.local()
    store.write("d/a.tar", tar_of(*SAMPLE0, ("s1.jpg", b"jpeg 1"), (name, b"x")))
    return tar_stream(store)


@case(
    "tar member s1.__key__",
    ingest.ShardError,
    r"a\.tar at byte 3072: member 's1\.__key__' is field '__key__', the column of sample keys"
    r".*rename",
)
def tar_key_member(ctx: Context) -> Thunk:
    return tar_field(ctx, "s1.__key__")


@case(
    "tar member without an extension (s1)",
    ingest.ShardError,
    r"a\.tar at byte 3072: member 's1' has no extension: nothing names its field.*rename",
)
def tar_no_extension(ctx: Context) -> Thunk:
    return tar_field(ctx, "s1")


@case(
    "tar member without an extension in a dotted folder (d.x/s1)",
    ingest.ShardError,
    r"a\.tar at byte 3072: member 'd\.x/s1' has no extension: nothing names its field.*rename",
)
def tar_dotted_folder(ctx: Context) -> Thunk:
    return tar_field(ctx, "d.x/s1")


@case(
    "tar duplicate field",
    ingest.ShardError,
    r"a\.tar at byte 3072: sample 's1' has field 'jpg' twice.*one of them would be lost",
)
def tar_duplicate(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.tar", tar_of(*SAMPLE0, ("s1.jpg", b"one"), ("s1.jpg", b"two")))
    return tar_stream(store)


def image_folder(ctx: Context, images: int) -> Store:
    """An image folder on S3 (tests/test_folders.py): class ``a`` with ``images`` PNGs and
    ``broken.png``, which is not a PNG."""
    store = ctx.s3_store()
    write_image_folder(store.fs, store.root, ("a",), images)
    store.write("a/broken.png", b"not a png")
    return store


def image_stream(store: Store, **options: Any) -> ingest.Stream:
    return ingest.Stream(
        store.root + "/",
        format="imagefolder",
        storage_options=store.storage_options,
        shuffle_seed=3,
        **options,
    )


@case(
    "image that does not decode",
    ingest.ShardError,
    r"a/broken\.png.*cannot be decoded as an image",
)
def broken_image(ctx: Context) -> Thunk:
    store = image_folder(ctx, 2)
    transform = ingest.decode.Images((16, 16))
    return lambda: drain(image_stream(store, batch_size=3, transform=transform))


@case('image that does not decode, on_error="skip"', None)
def broken_image_skipped(ctx: Context) -> Thunk:
    """Since issue 17 it is quarantined alone, as a bad JSONL line is (its whole batch of 8
    was, 7 good images lost with it)."""
    store = image_folder(ctx, 7)

    def run() -> object:
        stream = image_stream(
            store,
            batch_size=8,
            transform=ingest.decode.Images((16, 16), keep=("label",)),
            read=ingest.ReadOptions(on_error="skip"),
        )
        try:
            shapes = [tuple(b["image"].shape) for b in stream]
        finally:
            stream.close()
        records = [(q.rows, "a/broken.png" in q.reason) for q in stream.quarantined]
        if shapes != [(7, 3, 16, 16)] or records != [(1, True)]:
            raise AssertionError(f"batches of {shapes}, quarantined {stream.quarantined}")
        return "not an error: the 7 good images arrive; broken.png alone is quarantined"

    return run


# -- the store -----------------------------------------------------------------------------


def vanishing(ctx: Context, cache: ingest.CacheOptions | None) -> Thunk:
    store = ctx.s3_store()
    for n in range(3):
        store.write(f"d/p{n}.parquet", encode(make_table(n * 1000, 1000), "parquet"))
    stream = ingest.Stream(
        store.url("d"),
        batch_size=100,
        storage_options=store.storage_options,
        read=ingest.ReadOptions(cache=cache),
    )
    stream.state_dict()  # plans the epoch: the listing holds p2
    store.fs.rm(store.url("d", "p2.parquet"))
    return lambda: drain(stream)


@case(
    "listed object missing at read time (S3)",
    ingest.SourceError,
    r"p2\.parquet.*disappeared after it was listed.*restart the epoch",
)
def vanished(ctx: Context) -> Thunk:
    return vanishing(ctx, None)


@case(
    "listed object missing at read time (S3, through the shard cache)",
    ingest.SourceError,
    r"p2\.parquet.*disappeared after it was listed",
)
def vanished_cached(ctx: Context) -> Thunk:
    return vanishing(ctx, ingest.CacheOptions(os.path.join(ctx.tmp, "vanished"), max_bytes=1 << 30))


@case("explicit URL of a missing S3 object", ingest.NoShardsError, r"missing\.jsonl: not found")
def missing_object(ctx: Context) -> Thunk:
    store = ctx.s3_store()
    store.write("d/a.jsonl", encode(make_table(0, 10), "jsonl"))
    url = store.url("d", "missing.jsonl")
    return lambda: first(ingest.Stream(url, storage_options=store.storage_options))


@case("empty glob", ingest.SourceError, r"nothing-\*\.parquet: matches no data files")
def empty_glob(ctx: Context) -> Thunk:
    store = ctx.s3_store()
    store.write("d/a.parquet", encode(make_table(0, 10), "parquet"))
    url = store.url("d", "nothing-*.parquet")
    return lambda: first(ingest.Stream(url, storage_options=store.storage_options))


@case("missing bucket", ingest.SourceError, r"s3://no-such-bucket.*does not exist.*bucket")
def missing_bucket(ctx: Context) -> Thunk:
    options = ctx.s3.storage_options()
    url = "s3://no-such-bucket/train/*.parquet"
    return lambda: first(ingest.Stream(url, storage_options=options))


def auth_server(ctx: Context) -> tuple[LoopbackS3, dict[str, str]]:
    """A second moto server that checks credentials, with a bucket ``private`` holding one
    shard (:func:`ingest.tools.loopback.credential_checking_s3`, as tests/test_bad_input.py's
    ``s3_with_auth``)."""
    if ctx.auth is None:
        server, creds = ctx.stack.enter_context(credential_checking_s3())
        options = server.storage_options(creds["key"], creds["secret"])
        ingest.list_shards("s3://private/", storage_options=options)  # the right ones work
        ctx.auth = (server, creds)
    return ctx.auth


WRONG_SECRET = "wrong-secret-value-0123456789"


def wrong_credentials(ctx: Context, key: str | None) -> Thunk:
    server, creds = auth_server(ctx)
    options = server.storage_options(key or creds["key"], WRONG_SECRET)

    def run() -> object:
        try:
            return first(ingest.Stream("s3://private/", storage_options=options))
        except Exception as e:
            if WRONG_SECRET in str(e) or creds["secret"] in str(e):
                raise AssertionError("a secret reached the message") from e
            raise

    return run


@case("wrong credentials (wrong secret)", ingest.SourceError, r"s3://private/: access denied")
def wrong_secret(ctx: Context) -> Thunk:
    return wrong_credentials(ctx, None)


@case("wrong credentials (unknown key)", ingest.SourceError, r"s3://private/: access denied")
def unknown_key(ctx: Context) -> Thunk:
    return wrong_credentials(ctx, "AKIAWRONGWRONGWRONG1")


def refusing_endpoint() -> str:
    """An address on 127.0.0.1 where nothing listens: connections are refused."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@case(
    "endpoint refuses connections (default RetryPolicy)",
    ingest.SourceError,
    r"s3://ingest-test/nowhere/: cannot list: the endpoint http://127\.0\.0\.1:\d+ refused the "
    "connection",
)
def refused(ctx: Context) -> Thunk:
    options = ctx.s3.storage_options(endpoint=refusing_endpoint())
    return lambda: first(ingest.Stream("s3://ingest-test/nowhere/", storage_options=options))


SHORT_DEADLINE = {"deadline_s": 1.0, "backoff_s": 0.1}  # tests/test_storage_faults.py's SHORT
PASSWORD = "Pa55word"


@case(
    "http:// URL with credentials, endpoint refuses (RetryPolicy deadline 1 s)",
    ingest.SourceError,
    r"cannot list: the endpoint http://\*\*\*@127\.0\.0\.1:\d+ refused the connection",
)
def refused_http(ctx: Context) -> Thunk:
    endpoint = refusing_endpoint()
    url = endpoint.replace("http://", f"http://reader:{PASSWORD}@") + "/data/x.parquet"
    read = ingest.ReadOptions(retry=ingest.RetryPolicy(**SHORT_DEADLINE))

    def run() -> object:
        try:
            return first(ingest.Stream(url, read=read))
        except Exception as e:
            if PASSWORD in str(e):
                raise AssertionError("the password reached the message") from e
            if isinstance(e, ingest.NoShardsError):
                raise AssertionError(f"NoShardsError, which a follow waits out: {e}") from e
            raise

    return run


@case(
    "S3 endpoint refuses a shard read (ingest.Source; RetryPolicy deadline 1 s)",
    ingest.StoreError,
    r"the endpoint http://127\.0\.0\.1:\d+ refused the connection",
)
def refused_read(ctx: Context) -> Thunk:
    """As its test (tests/test_storage_faults.py), through ``ingest.Source``: a shard listed
    on the server, opened and read with an endpoint where nothing listens. (A Stream lists
    and reads with one endpoint, and a proxy stopped after the listing keeps serving the
    connections it has.)"""
    store = ctx.s3_store()
    write_dataset(store.fs, store.url("d"), "parquet", 1, 1000)
    [shard] = ingest.list_shards(store.url("d"), storage_options=store.storage_options).shards
    options = ctx.s3.storage_options(endpoint=refusing_endpoint())
    retry = ingest.RetryPolicy(**SHORT_DEADLINE)

    def run() -> object:
        with ingest.Source(store.url("d"), storage_options=options, retry=retry).open(shard) as f:
            return f.read(4)

    return run


@case(
    "endpoint accepts, never answers (RetryPolicy deadline 3 s, read timeout 1 s)",
    ingest.SourceError,
    r"s3://ingest-test/nowhere/: cannot list",
)
def silent(ctx: Context) -> Thunk:
    # As tests/test_storage_faults.py's silent_endpoint: the kernel accepts, nothing answers.
    server = ctx.stack.enter_context(socket.create_server(("127.0.0.1", 0), backlog=64))
    options = ctx.s3.storage_options(endpoint=f"http://127.0.0.1:{server.getsockname()[1]}")
    read = ingest.ReadOptions(retry=ingest.RetryPolicy(**SHORT_RETRY))
    return lambda: first(
        ingest.Stream("s3://ingest-test/nowhere/", storage_options=options, read=read)
    )


@case(
    "reads stall behind a FaultProxy (RetryPolicy deadline 3 s, read timeout 1 s)",
    ingest.ShardError,
    r"part-\d+\.parquet.*bytes \[\d+, \d+\).*after [1-9]\d* retries in",
)
def stalled_reads(ctx: Context) -> Thunk:
    root = "s3://ingest-test/stall"
    write_dataset(ctx.s3.filesystem(), root, "parquet", 2, 2000, row_group_rows=250)
    faults = Faults(stall=1.0, stall_s=120, ranges_only=True)  # listings pass, reads stall
    proxy = ctx.stack.enter_context(FaultProxy(ctx.s3.endpoint, faults))
    options = ctx.s3.storage_options(endpoint=proxy.endpoint)
    read = ingest.ReadOptions(retry=ingest.RetryPolicy(**SHORT_RETRY))
    return lambda: first(ingest.Stream(root, batch_size=500, storage_options=options, read=read))


@case(
    "unknown format",
    ingest.ConfigError,
    "unknown format 'avro'; known formats: arrow, audiofolder, csv, imagefolder, jsonl, "
    "parquet, webdataset",
)
def unknown_format(ctx: Context) -> Thunk:
    store = ctx.local()
    return lambda: ingest.Stream(store.url("d"), format="avro")


class NeedsAVocabulary:
    """tests/test_errors.py's class transform whose constructor fails (a tokenizer whose
    files are missing)."""

    def __init__(self) -> None:
        raise OSError("vocab.json not found")

    def __call__(self, table: Any) -> Any:
        return table


@case(
    "class transform whose __init__ raises",
    ingest.ConfigError,
    r"transform=NeedsAVocabulary: building it \(NeedsAVocabulary\(\)\) raised OSError: "
    r"vocab\.json not found; fix the class",
)
def transform_init(ctx: Context) -> Thunk:
    store = ctx.local()
    write_dataset(store.fs, store.url("d"), "parquet", 1, 100)
    return lambda: ingest.Stream(store.url("d"), batch_size=10, transform=NeedsAVocabulary)


@case(
    "follow manifest line naming no listed shard",
    ingest.SourceError,
    r"_MANIFEST: line 3 \('part-00007\.parquet'\) names .*part-00007\.parquet, a shard the "
    r"source .* does not list",
)
def manifest_line(ctx: Context) -> Thunk:
    """tests/test_follow.py: two shards listed, the manifest's third line names another."""
    store = ctx.local()
    for n in range(2):
        store.write(f"d/part-{n:05d}.parquet", encode(make_table(n * 1000, 1000), "parquet"))
    store.write("d/_MANIFEST", b"# finished shards\npart-00000.parquet\npart-00007.parquet\n")
    follow = ingest.Follow(poll_s=0.02, idle_timeout_s=0.2, manifest=store.url("d/_MANIFEST"))
    return lambda: first(
        ingest.Stream(store.url("d") + "/", batch_size=64, shuffle_seed=3, follow=follow)
    )


# -- states --------------------------------------------------------------------------------


def saved_state(url: str, batches: int = 7) -> dict[str, Any]:
    """tests/test_state_validation.py's ``saved``: a state after ``batches`` batches."""
    s = ingest.Stream(url, batch_size=100, shuffle_seed=1, shuffle_window=4096)
    for _ in itertools.islice(s, batches):
        pass
    state = s.state_dict()
    s.close()
    return state


def load(url: str, state: dict[str, Any] | str) -> Thunk:
    def run() -> object:
        s = ingest.Stream(url, batch_size=100, shuffle_seed=1, shuffle_window=4096)
        try:
            s.load_state_dict(state)
        finally:
            s.close()
        return None

    return run


def validation_data(ctx: Context) -> str:
    """tests/test_state_validation.py's data: 8 parquet shards of 5,000 rows, shared."""
    if ctx.validation_url is not None:
        return ctx.validation_url
    store = ctx.local()
    url = store.url("d")
    write_dataset(store.fs, url, "parquet", 8, 5000, row_group_rows=1000)
    ctx.validation_url = url
    return url


@case("state from another dataset", ingest.StateError, "another dataset")
def other_dataset(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("a/x.parquet", encode(make_table(0, 100), "parquet"))
    store.write("b/y.parquet", encode(make_table(0, 100), "parquet"))
    state = ingest.Stream(store.url("a")).state_dict()
    return lambda: ingest.Stream(store.url("b")).load_state_dict(state)


@case("state from a future version (9)", ingest.StateError, "version 9 is not supported")
def future_version(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("a/x.parquet", encode(make_table(0, 100), "parquet"))
    state = ingest.Stream(store.url("a")).state_dict()
    return lambda: ingest.Stream(store.url("a")).load_state_dict({**state, "version": 9})


def cursor(state: dict[str, Any]) -> dict[str, Any]:
    got = state["position"]["ranks"][0]
    assert isinstance(got, dict)
    return got


@case(
    "state with a negative row offset (lane row -5)",
    ingest.StateError,
    r"position\.ranks\[0\]\.lanes\[0\].*-5.*state_dict",
)
def negative_offset(ctx: Context) -> Thunk:
    url = validation_data(ctx)
    state = saved_state(url)
    cursor(state)["lanes"][0][1] = -5
    return load(url, state)


@case(
    "state with a negative epoch (-1)",
    ingest.StateError,
    r"epoch",
)
def negative_epoch(ctx: Context) -> Thunk:
    url = validation_data(ctx)
    state = saved_state(url)
    state["progress"]["epoch"] = -1
    return load(url, state)


@case(
    "state with a row outside its lane's span (999,999)",
    ingest.StateError,
    r"position\.ranks\[0\]\.lanes\[0\].*state_dict",
)
def row_outside_span(ctx: Context) -> Thunk:
    url = validation_data(ctx)
    state = saved_state(url)
    cursor(state)["lanes"][0][1] = 999_999
    return load(url, state)


@case(
    "state with consumed rows past the shard's end",
    ingest.StateError,
    "",
)
def rows_past_end(ctx: Context) -> Thunk:
    """tests/test_state.py's ``past_the_end``: rows beyond the shard's 5,000."""
    url = validation_data(ctx)
    state = saved_state(url)
    state["progress"]["consumed"]["partial"]["0"] = [[0, 1_000_000_000]]
    return load(url, state)


@case(
    "state with a row offset of 2**70",
    ingest.StateError,
    str(1 << 70),
)
def huge_offset(ctx: Context) -> Thunk:
    url = validation_data(ctx)
    state = saved_state(url)
    state["progress"]["consumed"]["partial"]["0"] = [[0, 1 << 70]]
    return load(url, state)


@case(
    f"state of {(MAX_STATE_BYTES + 1) >> 20} MiB of JSON text",
    ingest.StateError,
    "byte limit",
)
def huge_state(ctx: Context) -> Thunk:
    """tests/test_state.py's size limit: one byte over MAX_STATE_BYTES (256 MiB), as a str
    given to load_state_dict; refused on its length before parsing (the text is the only
    large allocation, and it is freed after the case)."""
    url = validation_data(ctx)
    holder = [" " * (MAX_STATE_BYTES + 1)]

    def run() -> object:
        try:
            return load(url, holder[0])()
        finally:
            holder.clear()

    return run


@case(
    "shard rewritten under the same name (same size, S3)",
    ingest.StateError,
    r"1 shard\(s\) changed: \S+/p1\.jsonl \(version '\w+' -> '\w+'\)",
)
def rewritten(ctx: Context) -> Thunk:
    store = ctx.s3_store()
    for n in range(2):
        store.write(f"d/p{n}.jsonl", encode(make_table(n * 100, 100), "jsonl"))
    stream = ingest.Stream(store.url("d"), batch_size=10, storage_options=store.storage_options)
    next(iter(stream))
    state = stream.state_dict()
    stream.close()
    old = store.fs.cat(store.url("d", "p1.jsonl"))
    store.write("d/p1.jsonl", old.replace(b"row 1", b"row 7"))  # same size, other bytes
    return lambda: ingest.Stream(
        store.url("d"), batch_size=10, storage_options=store.storage_options
    ).load_state_dict(state)


@case(
    "state moved a window on (rows never consumed)",
    ingest.StateError,
    r"position\.ranks\[0\].*not consumed",
)
def window_moved(ctx: Context) -> Thunk:
    url = validation_data(ctx)
    state = saved_state(url)
    c = cursor(state)
    per_lane = 4096 // len(c["lanes"])
    for lane in c["lanes"]:
        lane[1] += per_lane
    c["window"] += 1
    return load(url, state)


@case(
    "state nested 100,000 levels deep (JSON text)",
    ingest.StateError,
    r"nested too deep to be a stream state",
)
def deep_state(ctx: Context) -> Thunk:
    url = validation_data(ctx)
    return load(url, '{"version": 2, "dataset": ' + "[" * 100_000 + "]" * 100_000 + "}")


QUARANTINE_OPTIONS: dict[str, Any] = {
    "columns": ["id"],
    "batch_size": 40,
    "shuffle_seed": 1,
    "read": ingest.ReadOptions(on_error="skip"),
}


def quarantine_state(ctx: Context) -> tuple[str, dict[str, Any]]:
    """tests/test_quarantine.py's ``_saved_with_a_quarantine``: 4 Parquet shards of 1,000
    rows in row groups of 250, row group 1 of part-1 corrupt; a state after 30 batches under
    on_error="skip", whose ``progress.quarantined[0]`` holds rows of part-1 (which ones
    depends on how far its lane had read ahead: [0, 1000), [250, 1000) or [250, 500))."""
    store = ctx.local()
    root = store.url("d").removeprefix("file://")
    os.makedirs(root)
    for i in range(4):
        pq.write_table(make_table(i * 1000, 1000), f"{root}/part-{i}.parquet", row_group_size=250)
    path = f"{root}/part-1.parquet"
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    start, size = column.data_page_offset, column.total_compressed_size
    data[start + 20 : start + size - 4] = b"\xff" * (size - 24)  # the footer stays readable
    with open(path, "wb") as f:
        f.write(bytes(data))
    stream = ingest.Stream(root, **QUARANTINE_OPTIONS)
    for _ in itertools.islice(stream, 30):
        pass
    state = json.loads(json.dumps(stream.state_dict()))
    stream.close()
    return root, state


def edited_quarantine(ctx: Context, edit: dict[str, Any]) -> Thunk:
    root, state = quarantine_state(ctx)
    record = state["progress"]["quarantined"][0]
    if record["rows"] != record["stop"] - record["start"] or record["rows"] <= 0:
        raise AssertionError(f"the saved record is not the test's: {record}")
    record.update(edit)

    def run() -> object:
        ingest.Stream(root, **QUARANTINE_OPTIONS).load_state_dict(state)
        return None

    return run


@case(
    "state's quarantine record edited: rows -> 10 (not stop - start)",
    ingest.StateError,
    r"progress\.quarantined\[0\]\.rows is 10, but the record skips rows \[",
)
def quarantine_rows(ctx: Context) -> Thunk:
    return edited_quarantine(ctx, {"rows": 10})


@case(
    "state's quarantine record edited: stop -> 5000 on a 1,000-row shard",
    ingest.StateError,
    r"\[0\] ends at row 5000, past the end of .*part-1.*\(1000 rows\)",
)
def quarantine_stop(ctx: Context) -> Thunk:
    return edited_quarantine(ctx, {"stop": 5000, "rows": None})


@case(
    "state's quarantine record edited: url -> a shard not in the state",
    ingest.StateError,
    r"\[0\]\.url .*part-9.* names no shard of the state's dataset",
)
def quarantine_url(ctx: Context) -> Thunk:
    return edited_quarantine(ctx, {"url": "file:///elsewhere/part-9.parquet"})


@case(
    "state's quarantine record edited: epoch -> 7",
    ingest.StateError,
    r"\[0\]\.epoch is 7, but the state is in epoch 0",
)
def quarantine_epoch(ctx: Context) -> Thunk:
    return edited_quarantine(ctx, {"epoch": 7})


# -- the shard cache (tests/test_cache.py) --------------------------------------------------


def cache_options(directory: str, **options: Any) -> Thunk:
    return lambda: ingest.CacheOptions(directory, **options)


@case(
    "CacheOptions(max_bytes='10')",
    ingest.ConfigError,
    r"max_bytes='10'\) must be a whole number of bytes \(an int\)",
)
def cache_max_bytes_str(ctx: Context) -> Thunk:
    return cache_options("/tmp/x", max_bytes="10")


@case(
    "CacheOptions(max_bytes=nan)",
    ingest.ConfigError,
    r"max_bytes=nan\) must be a whole number of bytes",
)
def cache_max_bytes_nan(ctx: Context) -> Thunk:
    return cache_options("/tmp/x", max_bytes=float("nan"))


@case(
    "CacheOptions(lock_timeout_s=nan)",
    ingest.ConfigError,
    r"lock_timeout_s=nan\) must be a finite number of seconds > 0",
)
def cache_lock_timeout_nan(ctx: Context) -> Thunk:
    return cache_options("/tmp/x", max_bytes=10, lock_timeout_s=float("nan"))


def cached_stream(store: Store, cache: ingest.CacheOptions, **options: Any) -> Any:
    return ingest.Stream(
        store.url("d"),
        storage_options=store.storage_options,
        read=ingest.ReadOptions(cache=cache, **options),
        batch_size=20,
    )


def copy_path(cache: ingest.CacheOptions, store: Store, name: str) -> str:
    """Where the node's cache keeps the copy of shard ``name`` of ``store``'s ``d``."""
    from ingest.storage.cache import ShardCache

    stream = cached_stream(store, cache)
    [shard] = [s for s in stream.listing().shards if s.url.endswith(name)]
    stream.close()
    shards = ShardCache(cache)
    return shards.path_of(shards.key(shard.url, shard.size, shard.version))


@case(
    "a directory where the cache keeps a shard's copy",
    ingest.ConfigError,
    r"data/\w+\.shard is not a regular file, where the cache keeps a shard's copy",
)
def cache_directory_in_the_way(ctx: Context) -> Thunk:
    store = ctx.s3_store()
    write_dataset(store.fs, store.url("d"), "parquet", 3, 100, row_group_rows=50)
    cache = ingest.CacheOptions(os.path.join(ctx.tmp, "in-the-way"), max_bytes=1 << 30)
    os.makedirs(copy_path(cache, store, "part-00001.parquet"))
    return lambda: drain(cached_stream(store, cache))


READ_ONLY_CACHE = """
url, directory, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
read = ingest.ReadOptions(cache=ingest.CacheOptions(directory, max_bytes=1 << 30))
record(lambda: sum(1 for _ in ingest.Stream(url, storage_options=options, read=read)))
"""


@case(
    "existing cache directory not writable (read-only mount; in a child process)",
    ingest.ConfigError,
    r"is not writable by this user",
)
def cache_read_only(ctx: Context) -> Thunk:
    """As its test: the directory is made, then bind-mounted read-only in a user and mount
    namespace (``unshare``; a chmod would not stop root); the seconds are the child's."""
    probe = subprocess.run([*NAMESPACE, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        raise Unavailable(f"user namespaces are not available: {probe.stderr.strip()[-200:]}")
    store = ctx.s3_store()
    write_dataset(store.fs, store.url("d"), "parquet", 2, 100)
    directory = os.path.join(ctx.tmp, "read-only")
    from ingest.storage.cache import ShardCache

    ShardCache(ingest.CacheOptions(directory, max_bytes=1 << 30))
    mount = f"mount --bind {directory} {directory} && mount -o remount,ro,bind {directory}"
    script = f"import subprocess\nsubprocess.run({mount!r}, shell=True, check=True)\n"
    args = (store.url("d"), directory, json.dumps(store.storage_options))
    return lambda: in_child(script + READ_ONLY_CACHE, *args, namespace=True)


@case("same-size damaged cached copy (its modification time put back)", None)
def cache_damaged_copy(ctx: Context) -> Thunk:
    """Valid input since issue 17: the damaged copy was served forever and blamed on the
    store; now it is fetched again, and every row arrives (tests/test_cache.py)."""
    store = ctx.s3_store()
    write_dataset(store.fs, store.url("d"), "parquet", 3, 100, row_group_rows=50)
    cache = ingest.CacheOptions(os.path.join(ctx.tmp, "damaged"), max_bytes=1 << 30)
    stream = cached_stream(store, cache, on_error="skip")
    if sum(len(b["id"]) for b in stream) != 300:
        raise AssertionError("the first epoch did not read 300 rows")
    path = copy_path(cache, store, "part-00001.parquet")
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(b"\xff" * 64)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    def run() -> object:
        try:
            ids = sorted(int(i) for b in stream for i in b["id"].tolist())
        finally:
            stream.close()
        misses = stream.stats["cache_misses"]
        if ids != list(range(300)) or stream.quarantined or misses != 4:
            raise AssertionError(f"{len(ids)} rows, {stream.quarantined}, {misses} misses")
        return "not an error: all 300 rows, none quarantined, the copy fetched again (4 misses)"

    return run


# -- options (tests/test_options.py) --------------------------------------------------------

OPTIONS: list[tuple[str, Callable[[], object], str]] = [
    (
        "RankOptions(fetch_batches=0)",
        lambda: ingest.RankOptions(fetch_batches=0),
        r"RankOptions\(fetch_batches=0\) must be >= 1, a whole number; pass fetch_batches=16 "
        r"\(the default\)",
    ),
    (
        "RankOptions(timeout_s=-1)",
        lambda: ingest.RankOptions(timeout_s=-1),
        r"RankOptions\(timeout_s=-1\) must be > 0 seconds, a finite number",
    ),
    (
        "Follow(poll_s=nan)",
        lambda: ingest.Follow(poll_s=float("nan")),
        r"Follow\(poll_s=nan\) must be > 0 seconds",
    ),
    (
        "Follow(idle_timeout_s=inf)",
        lambda: ingest.Follow(idle_timeout_s=float("inf")),
        r"Follow\(idle_timeout_s=inf\) must be >= 0 seconds",
    ),
    (
        "Follow(manifest='')",
        lambda: ingest.Follow(manifest=""),
        r"Follow\(manifest=''\) names no file",
    ),
    (
        "ReadOptions(timeout_s=nan)",
        lambda: ingest.ReadOptions(timeout_s=float("nan")),
        r"timeout_s=nan must be > 0 seconds",
    ),
    (
        "ReadOptions(prefetch_bytes=0)",
        lambda: ingest.ReadOptions(prefetch_bytes=0),
        r"prefetch_bytes=0 must be >= 1 bytes, a whole number, or None",
    ),
]


def option_case(make: Callable[[], object]) -> Callable[[Context], Thunk]:
    return lambda ctx: make


for _name, _make, _pattern in OPTIONS:
    case(_name, ingest.ConfigError, _pattern)(option_case(_make))


def stream_option(ctx: Context, **options: Any) -> Thunk:
    store = ctx.local()
    write_dataset(store.fs, store.url("d"), "parquet", 1, 100)
    return lambda: ingest.Stream(store.url("d"), **options)


@case(
    "Stream(batch_size=2.5)",
    ingest.ConfigError,
    r"^batch_size=2\.5 must be >= 1, a whole number \(got float\)",
)
def batch_size_float(ctx: Context) -> Thunk:
    return stream_option(ctx, batch_size=2.5)


@case(
    "Stream(shuffle_bytes=0)",
    ingest.ConfigError,
    r"shuffle_bytes=0 must be >= 1 bytes, a whole number, or None",
)
def shuffle_bytes_zero(ctx: Context) -> Thunk:
    return stream_option(ctx, shuffle_bytes=0)


# -- the stores: versions, Range, index files (issue 31; tests/test_http.py,
# tests/test_versions.py) --------------------------------------------------------------------


def web(ctx: Context, **options: bool) -> tuple[str, Any]:
    """A directory served by the loopback HTTP server (options: etag, last_modified,
    ranges), for the life of the run."""
    from ingest.tools.loopback.http import LoopbackHTTP

    root = ctx.local().root.removeprefix("file://")
    return root, ctx.stack.enter_context(LoopbackHTTP(root, **options))


@case(
    "urls_from: an index over HTTP naming a file:// line",
    ingest.ConfigError,
    r"index\.txt line 2 names .*a file:// URL.*schemes=\('file', 'http'\)",
)
def index_names_local_file(ctx: Context) -> Thunk:
    root, server = web(ctx)
    with open(os.path.join(root, "index.txt"), "w") as f:
        f.write(f"a.parquet\nfile://{root}/secret.parquet\n")
    return lambda: ingest.urls_from(server.url("index.txt"))


@case(
    "urls_from: an index that is not UTF-8",
    ingest.ConfigError,
    r"latin1\.txt is not UTF-8: byte 3 \(line 1\)",
)
def index_not_utf8(ctx: Context) -> Thunk:
    root, server = web(ctx)
    with open(os.path.join(root, "latin1.txt"), "wb") as f:
        f.write(b"caf\xe9.parquet\n")
    return lambda: ingest.urls_from(server.url("latin1.txt"))


@case("urls_from(schemes=('ftp://',))", ingest.ConfigError, r"give scheme names without '://'")
def index_bad_schemes(ctx: Context) -> Thunk:
    root, server = web(ctx)
    with open(os.path.join(root, "index.txt"), "w") as f:
        f.write("a.parquet\n")
    return lambda: ingest.urls_from(server.url("index.txt"), schemes=("ftp://",))


@case(
    "HTTP server that ignores Range, a shard over 4 MiB",
    ingest.StoreError,
    r"ignored the Range header: it answered a request for bytes \[\d+, \d+\) with the whole",
)
def range_ignored_large(ctx: Context) -> Thunk:
    root, server = web(ctx, ranges=False)
    pq.write_table(make_table(0, 150_000), os.path.join(root, "big.parquet"), compression="none")
    assert os.path.getsize(os.path.join(root, "big.parquet")) > 4 << 20
    return lambda: first(ingest.Stream([server.url("big.parquet")], batch_size=10))


@case("HTTP server that ignores Range, a small shard", None)
def range_ignored_small(ctx: Context) -> Thunk:
    """Valid input in the tests: read from the whole body at once, with a warning."""
    root, server = web(ctx, ranges=False)
    pq.write_table(make_table(0, 500), os.path.join(root, "small.parquet"), row_group_size=50)

    def run() -> object:
        import warnings

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            stream = ingest.Stream([server.url("small.parquet")], batch_size=50)
            got = sorted(i for b in stream for i in b["id"].tolist())
        if got != list(range(500)) or stream.stats["retries"]:
            raise AssertionError(f"expected rows 0-499 and no retry, got {len(got)} rows")
        if not any("ignored the Range header" in str(w.message) for w in said):
            raise AssertionError("no RangeIgnoredWarning")
        return "not an error: every row from the whole body, no retry, a RangeIgnoredWarning"

    return run


@case("HTTP server with neither ETag nor Last-Modified", None)
def unversioned_http(ctx: Context) -> Thunk:
    """Valid input: listed with a warning naming the URL (a resume checks sizes only)."""
    root, server = web(ctx, etag=False, last_modified=False)
    pq.write_table(make_table(0, 10), os.path.join(root, "a.parquet"))

    def run() -> object:
        import warnings

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            listing = ingest.list_shards([server.url("a.parquet")])
        named = [
            w for w in said if "a.parquet" in str(w.message) and "neither ETag" in str(w.message)
        ]
        if listing.shards[0].version or not named:
            raise AssertionError("expected no version and an UnversionedShardWarning")
        return "not an error: an UnversionedShardWarning naming the URL; sizes checked only"

    return run


@case(
    "state over an HTTP shard rewritten with the same size (Last-Modified only)",
    ingest.StateError,
    r"1 shard\(s\) changed: http://127\.0\.0\.1:\d+/a\.parquet \(version",
)
def rewritten_http_shard(ctx: Context) -> Thunk:
    root, server = web(ctx, etag=False)
    path = os.path.join(root, "a.parquet")
    pq.write_table(make_table(1000, 300), path, compression="none", use_dictionary=False)
    stream = ingest.Stream([server.url("a.parquet")], batch_size=50)
    it = iter(stream)
    next(it)
    state = stream.state_dict()
    stream.close()
    size = os.path.getsize(path)
    pq.write_table(make_table(7000, 300), path, compression="none", use_dictionary=False)
    assert os.path.getsize(path) == size
    later = os.stat(path).st_mtime + 3  # Last-Modified counts whole seconds
    os.utime(path, (later, later))

    def run() -> object:
        resumed = ingest.Stream([server.url("a.parquet")], batch_size=50)
        resumed.load_state_dict(state)
        return first(resumed)

    return run


# -- tokenizing, packing, mixtures (issue 31: tests/test_tokenize.py,
# tests/test_packing.py, tests/test_mixture.py, tests/test_stage.py) -----------------------


def text_lines(ctx: Context, texts: list[str]) -> str:
    """A local JSONL shard of ``{"text": ...}`` lines; its directory's URL."""
    store = ctx.local()
    store.write("t/a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    return store.url("t")


def tokenized(url: str, tokenizer: Any, **options: Any) -> Thunk:
    """The first batch of ``url`` through ``Tokenize(tokenizer)``."""
    return lambda: first(
        ingest.Stream(url, batch_size=6, transform=ingest.Tokenize(tokenizer), **options)
    )


def _big_id(texts: list[str]) -> list[Any]:
    return [[2**31 + 5] if t == "BIG" else [7] for t in texts]


@case(
    "token id 2**31 + 5 from a tokenizer (it wrapped to -2147483643)",
    ingest.ConfigError,
    r"a\.jsonl row 5: the tokenizer's id 2147483653 is out of range",
)
def token_id_past_int32(ctx: Context) -> Thunk:
    return tokenized(text_lines(ctx, ["ok"] * 5 + ["BIG"]), _big_id)


@case("float token ids", ingest.ConfigError, r"a\.jsonl row 0: the tokenizer's id 4\.5 is not")
def token_id_float(ctx: Context) -> Thunk:
    return tokenized(text_lines(ctx, ["ok"] * 6), lambda texts: [[4.5]] * len(texts))


@case("Tokenize(eos_id=-7)", ingest.ConfigError, r"Tokenize\(eos_id=-7\) must be a token id")
def eos_negative(ctx: Context) -> Thunk:
    return lambda: ingest.Tokenize(lambda texts: [[1]] * len(texts), eos_id=-7)


@case("tokenizer returning None", ingest.ConfigError, r"returned NoneType for 6 texts")
def tokenizer_none(ctx: Context) -> Thunk:
    return tokenized(text_lines(ctx, ["ok"] * 6), lambda texts: None)


@case("tokenizer returning 1 list for 6 texts", ingest.ConfigError, r"returned 1 id lists for 6")
def tokenizer_too_few(ctx: Context) -> Thunk:
    return tokenized(text_lines(ctx, ["ok"] * 6), lambda texts: [[1]])


@case("tokenizer returning strings", ingest.ConfigError, r"row 0: tokenizer .* returned str")
def tokenizer_strings(ctx: Context) -> Thunk:
    return tokenized(text_lines(ctx, ["ok"] * 6), list)


@case(
    "integer column given to a tokenizers tokenizer",
    ingest.ConfigError,
    r"Tokenize\(column='text'\) is int64, not text",
)
def tokenizer_not_text(ctx: Context) -> Thunk:
    from tokenizers import Tokenizer, models

    store = ctx.local()
    store.write("t/a.jsonl", b"".join(b'{"text": %d}\n' % i for i in range(6)))
    rust = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    return tokenized(store.url("t"), rust)


PACKS: list[tuple[str, Callable[[], object], str]] = [
    (
        "Pack(seq_len=10**9) (a MemoryError of 7.45 GiB)",
        lambda: ingest.Pack(seq_len=10**9),
        r"Pack\(seq_len=1000000000\) is more than 16,777,216 tokens",
    ),
    (
        "Pack(seq_len=16.5)",
        lambda: ingest.Pack(seq_len=16.5),  # type: ignore[arg-type]
        r"Pack\(seq_len=16\.5\) must be >= 1, a whole number",
    ),
    (
        "Pack(seq_len=True)",
        lambda: ingest.Pack(seq_len=True),
        r"Pack\(seq_len=True\) must be >= 1, a whole number \(got a bool\)",
    ),
    (
        "Mix weight 'x'",
        lambda: ingest.Mix({"a": "a/", "b": "b/"}, weights={"a": "x", "b": 1}),  # type: ignore[dict-item]
        r"'a' has weight 'x' \(str\); a weight is a number",
    ),
    (
        "Mix schedule leaving a source out (it was weight 0, silently)",
        lambda: ingest.Mix({"a": "a/", "b": "b/"}, schedule=[(100, {"a": 1})]),
        r"stage at 100: weights \{'a': 1\} give no weight to \['b'\]",
    ),
    (
        "Mix schedule stage at NaN",
        lambda: ingest.Mix({"a": "a/", "b": "b/"}, schedule=[(float("nan"), {"a": 1, "b": 1})]),  # type: ignore[list-item]
        r"stage at nan must begin at a global count",
    ),
]

for _name, _make, _pattern in PACKS:
    case(_name, ingest.ConfigError, _pattern)(option_case(_make))


class _NanOrigins(ingest.Stage):
    """A stage whose origins are floats, one NaN."""

    def __call__(self, table: pa.Table) -> ingest.Staged:
        ids = pa.array([[1, 2]] * 2, pa.list_(pa.int32()))
        out = table.slice(0, 2).append_column("ids", ids)
        return ingest.Staged(out, [0.0, float("nan")])  # type: ignore[arg-type]


@case(
    "stage origins of NaN under Pack (a bare IndexError)",
    ingest.ConfigError,
    r"with origins of float64.*an origin is an integer",
)
def stage_origin_nan(ctx: Context) -> Thunk:
    store = ctx.local()
    write_dataset(store.fs, store.url("d"), "parquet", 1, 100)
    pack = ingest.Pack(seq_len=8, read_rows=16, column="ids", pad_id=0)
    return lambda: first(
        ingest.Stream(store.url("d"), batch_size=2, transform=_NanOrigins(), pack=pack)
    )


def mixed_state(ctx: Context) -> tuple[Callable[[], ingest.Stream], dict[str, Any]]:
    """A mixture of two local sources, and its state after 3 batches."""
    store = ctx.local()
    for name in ("a", "b"):
        write_dataset(store.fs, store.url(name), "parquet", 1, 100)
    mix = ingest.Mix({"a": store.url("a"), "b": store.url("b")}, schedule=[(20, {"a": 1, "b": 3})])

    def make() -> ingest.Stream:
        return ingest.Stream(mix, batch_size=4, shuffle_seed=1)

    s = make()
    for _ in itertools.islice(s, 3):
        pass
    state = s.state_dict()
    s.close()
    return make, state


def load_edited(ctx: Context, key: str, value: Any) -> Thunk:
    make, state = mixed_state(ctx)
    state = json.loads(json.dumps(state))
    if value is None:
        del state["mixture"][key]
    else:
        state["mixture"][key] = value

    def run() -> object:
        s = make()
        try:
            s.load_state_dict(state)
        finally:
            s.close()
        return None

    return run


_EDITS: list[tuple[str, Any, str]] = [
    ("stage", 7, r"the state's mixture has stage 7: the stage reached is a position"),
    ("counts", [1], r"the state's mixture has counts \[1\]: one whole number >= 0 per source"),
    ("counts", [4, -3], r"the state's mixture has counts \[4, -3\]"),
    ("total", -100, r"the state's mixture has total -100"),
    ("stages", None, r"the state's mixture has stages '\(missing\)'"),
]


def _edited(key: str, value: Any) -> Callable[[Context], Thunk]:
    return lambda ctx: load_edited(ctx, key, value)


for _key, _value, _pattern in _EDITS:
    _shown = " removed" if _value is None else f"={_value}"
    case(f"edited mixture state: {_key}{_shown}", ingest.StateError, _pattern)(
        _edited(_key, _value)
    )


# -- the reader pool on a laptop-sized Ray (issue 31: tests/test_pool_sizing.py,
# tests/test_readme_blocks.py) ---------------------------------------------------------------

POOL_ON_TWO_CPUS = """
import ray
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
pool = ingest.ReaderPool(num_cpus=float(sys.argv[2]), min_size=2, max_size=2)
record(lambda: ingest.RayStream(sys.argv[1], batch_size=10, world_size=2, readers=pool))
"""


@case(
    "a reader pool of 2 x 2 CPUs on a 2-CPU Ray (in a child process)",
    ingest.ConfigError,
    r"2 x 2 CPU asked \(4 in all\), the cluster has 2 CPU .*lower ReaderPool\(num_cpus=",
)
def pool_too_large(ctx: Context) -> Thunk:
    store = ctx.local()
    write_dataset(store.fs, store.url("d"), "parquet", 2, 100)
    return lambda: in_child(POOL_ON_TWO_CPUS, store.url("d"), "2")


@case(
    "index tasks with no CPU left beside a 2 x 1 CPU pool on a 2-CPU Ray (in a child process)",
    ingest.ConfigError,
    r"an index task .* cannot run beside the reader pool .*2\.\d+ CPU asked",
)
def index_beside_full_pool(ctx: Context) -> Thunk:
    store = ctx.local()
    write_dataset(store.fs, store.url("d"), "jsonl", 2, 100)
    return lambda: in_child(POOL_ON_TWO_CPUS, store.url("d"), "1")


for _name, _make, _pattern in [
    ("ReaderPool(num_cpus=nan)", lambda: ingest.ReaderPool(num_cpus=float("nan")), r"num_cpus=nan"),
    (
        "ReaderPool(start_timeout_s=0)",
        lambda: ingest.ReaderPool(start_timeout_s=0),
        r"start_timeout_s=0 must be > 0",
    ),
    (
        "Autoscale(first_interval_s=0)",
        lambda: ingest.Autoscale(first_interval_s=0),
        r"first_interval_s=0 must be > 0",
    ),
]:
    case(_name, ingest.ConfigError, _pattern)(option_case(_make))


# -- planning under on_error="skip" (issue 31: tests/test_plan_skip.py) ----------


def planned_parquet(ctx: Context, damage: str) -> Store:
    """4 Parquet shards of 100 rows; part-2 damaged as ``damage`` says."""
    store = ctx.local()
    for n in range(4):
        store.write(f"d/part-{n}.parquet", encode(make_table(n * 100, 100), "parquet"))
    path = store.url("d/part-2.parquet").removeprefix("file://")
    if damage == "footer":
        with open(path, "r+b") as f:
            f.seek(-40, os.SEEK_END)
            f.write(b"\xee" * 32)  # the footer's metadata no longer parses
    elif damage == "empty":
        open(path, "wb").close()
    else:
        pq.write_table(pa.table({"id": pa.array(["a"] * 100)}), path)
    return store


def skipped_whole(store: Store) -> Thunk:
    def run() -> object:
        stream = ingest.Stream(
            store.url("d"), columns=["id"], batch_size=50, read=ingest.ReadOptions(on_error="skip")
        )
        ids = sorted(int(i) for b in stream for i in b["id"].tolist())
        spans = [((q.url or "").rsplit("/", 1)[-1], q.start, q.stop) for q in stream.quarantined]
        if ids != [*range(200), *range(300, 400)] or spans != [("part-2.parquet", 0, None)]:
            raise AssertionError(f"{len(ids)} rows, quarantined {spans}")
        return "not an error: 300 rows; part-2.parquet quarantined whole at planning"

    return run


@case(
    "Parquet footer that does not parse (at planning)",
    ingest.ShardError,
    r"part-2\.parquet at byte \d+: has no readable Parquet footer",
)
def planned_footer(ctx: Context) -> Thunk:
    store = planned_parquet(ctx, "footer")
    return lambda: drain(ingest.Stream(store.url("d"), columns=["id"], batch_size=50))


@case('Parquet footer that does not parse (at planning), on_error="skip"', None)
def planned_footer_skipped(ctx: Context) -> Thunk:
    return skipped_whole(planned_parquet(ctx, "footer"))


@case('empty (0-byte) Parquet shard (at planning), on_error="skip"', None)
def planned_empty_skipped(ctx: Context) -> Thunk:
    return skipped_whole(planned_parquet(ctx, "empty"))


@case('Parquet shard of another schema (at planning), on_error="skip"', None)
def planned_schema_skipped(ctx: Context) -> Thunk:
    return skipped_whole(planned_parquet(ctx, "schema"))


@case('JSON line nested 10,001 levels deep among the schema\'s lines, on_error="skip"', None)
def deep_json_schema_skipped(ctx: Context) -> Thunk:
    store = ctx.local()
    lines = encode(make_table(0, 100), "jsonl").split(b"\n")
    lines[3] = DEEP.replace(b'"id": 60', b'"id": 3')
    store.write("d/a.jsonl", b"\n".join(lines))

    def run() -> object:
        read = ingest.ReadOptions(on_error="skip")
        stream = ingest.Stream(store.url("d"), batch_size=10, read=read)
        ids = sorted(int(i) for b in stream for i in b["id"].tolist())
        spans = [(q.start, q.stop) for q in stream.quarantined]
        if ids != [i for i in range(100) if i != 3] or spans != [(3, 4)]:
            raise AssertionError(f"{len(ids)} rows, quarantined {spans}")
        return "not an error: 99 rows; row 3 quarantined alone (it raised at planning before)"

    return run


# -- running -------------------------------------------------------------------------------


def first_line(error: BaseException, tmp: str = "") -> str:
    """The message's first line, the temporary directory shown as ``…``, truncated."""
    text = str(error).strip().splitlines()
    line = text[0] if text else repr(error)
    if tmp:
        line = line.replace(tmp, "…")
    if len(line) > MESSAGE_CHARS:
        line = line[: MESSAGE_CHARS - 1] + "…"
    return line


def timed(thunk: Thunk) -> tuple[float, object, BaseException | None, bool]:
    """Run ``thunk`` in a daemon thread: (seconds, result, error, finished within HANG_S);
    a :class:`ChildError` gives the child's error and seconds."""
    out: dict[str, Any] = {}

    def target() -> None:
        start = time.monotonic()
        try:
            out["result"] = thunk()
        except ChildError as e:
            out["error"] = e.error
            out["seconds"] = e.seconds
            return
        except BaseException as e:
            out["error"] = e
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        return time.monotonic() - started, None, None, False
    return out["seconds"], out.get("result"), out.get("error"), True


def run_case(c: Case, ctx: Context) -> Row:
    try:
        thunk = c.setup(ctx)
    except Unavailable as e:
        return Row(c, "skipped", None, str(e), True, skipped=True)
    except Exception as e:
        return Row(c, f"setup failed: {type(e).__name__}", None, first_line(e, ctx.tmp), False)
    return judged(c, ctx.tmp, *timed(thunk))


def judged(
    c: Case, tmp: str, seconds: float, result: object, error: BaseException | None, finished: bool
) -> Row:
    """The row of a case that ran: what it raised or returned, against what its test expects."""
    if not finished:
        return Row(c, "(still running)", seconds, f"no error within {HANG_S:.0f} s", False)
    if c.expect is None:
        if error is not None:
            return Row(c, type(error).__name__, seconds, first_line(error, tmp), False)
        return Row(c, "none", seconds, str(result), True)
    if error is None:
        return Row(c, "none", seconds, f"no error: returned {result!r}"[:MESSAGE_CHARS], False)
    note = ""
    if not isinstance(error, c.expect):
        note = f"its test expects {c.expect.__name__}"
    elif c.pattern and not re.search(c.pattern, str(error), re.DOTALL):
        note = f"message does not match its test's pattern {c.pattern!r}"
    clear = isinstance(error, ingest.IngestError)
    return Row(c, type(error).__name__, seconds, first_line(error, tmp), clear, note)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(rows: list[Row]) -> int:
    print("| case | error | seconds | message |")
    print("|---|---|---:|---|")
    for r in rows:
        secs = "-" if r.seconds is None else f"{r.seconds:.2f}"
        print(f"| {cell(r.case.name)} | {cell(r.error)} | {secs} | {cell(r.message)} |")
    skipped = [r for r in rows if r.skipped]
    rows = [r for r in rows if not r.skipped]
    errors = [r for r in rows if r.case.expect is not None]
    valid = [r for r in rows if r.case.expect is None]
    timed_rows = [r for r in errors if r.seconds is not None]
    slowest = max(timed_rows, key=lambda r: r.seconds or 0.0, default=None)
    worst = (slowest.seconds or 0.0) if slowest else 0.0
    missed = [
        r
        for r in rows
        if not r.clear or r.seconds is None or (r.seconds is not None and r.seconds > GOAL_S)
    ]
    clear = sum(1 for r in errors if r.clear)
    verdict = (
        "all failed with a clear error"
        if clear == len(errors)
        else f"{clear} failed with a clear error"
    )
    print()
    where = f" (slowest: {slowest.case.name})" if slowest else ""
    print(f"{len(errors)} cases, {verdict} within {worst:.1f} s{where}")
    for r in valid:
        print(f"note: {r.case.name}: not counted above; {r.message}", file=sys.stderr)
    for r in skipped:
        print(f"note: {r.case.name}: skipped, not counted above: {r.message}", file=sys.stderr)
    for r in rows:
        if r.note:
            print(f"note: {r.case.name}: {r.note}", file=sys.stderr)
    if missed:
        parts = [
            f"{r.case.name} ({r.error}, "
            + ("no time" if r.seconds is None else f"{r.seconds:.1f} s")
            + ")"
            for r in missed
        ]
        print(f"NOT MET: {'; '.join(parts)}")
        return 1
    return 0


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="ingest-bad-input-") as tmp:
        # The persistent shard index goes to this run's directory, not the user's cache.
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
        with contextlib.ExitStack() as stack:
            s3 = stack.enter_context(LoopbackS3())
            s3.create_bucket("ingest-test")
            ctx = Context(os.path.join(tmp, "data"), s3, stack)
            os.makedirs(ctx.tmp)
            rows = [run_case(c, ctx) for c in CASES]
        return report(rows)


if __name__ == "__main__":
    sys.exit(main())
