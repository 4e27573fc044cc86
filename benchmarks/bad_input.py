"""The bad-input table: every bad input the tests check, the error it gives, and how fast.

Each case builds the same bad input as its test (tests/test_bad_input.py,
tests/test_state_validation.py, tests/test_state.py, tests/test_storage_faults.py) with real
components: local files under a temporary directory, or the loopback S3 server
(:class:`ingest.testing.LoopbackS3`, a ``moto_server`` child process on 127.0.0.1; a second
one that checks credentials for the wrong-credentials cases). It then creates an
``ingest.Stream`` and iterates it, or loads a state into a new one, and records the
exception's class, the first line of its message and the seconds from creating the stream to
the error. The clock starts at ``ingest.Stream(...)``, except for the object deleted after
the listing, whose stream must exist (and have listed) before the deletion: there it starts
at the loop that fails. Setup (writing shards, saving a state) is never timed.

The goal (issue 8, "Bad input"): every case fails with an ``ingest.IngestError`` subclass
within 30 s. A case that raises anything else, raises nothing, or takes longer is listed in a
final ``NOT MET`` line and the exit status is 1. A case that the tests treat as valid input
(a tar sample missing a field: a null there) is shown as "not an error" and checked to give
exactly what its test expects. A message that does not match its test's pattern is reported
on stderr. Nothing leaves 127.0.0.1; Ray is not started. About a minute in all (the refused
endpoint retries to the default 20 s deadline, as in its test).

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
from ingest.state import MAX_STATE_BYTES
from ingest.testing import (
    FaultProxy,
    Faults,
    LoopbackS3,
    Store,
    encode,
    make_table,
    tar_link,
    tar_of,
    write_dataset,
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


@case(
    "tar duplicate field",
    ingest.ShardError,
    r"a\.tar at byte 3072: sample 's1' has field 'jpg' twice.*one of them would be lost",
)
def tar_duplicate(ctx: Context) -> Thunk:
    store = ctx.local()
    store.write("d/a.tar", tar_of(*SAMPLE0, ("s1.jpg", b"one"), ("s1.jpg", b"two")))
    return tar_stream(store)


# -- the store -----------------------------------------------------------------------------


@case(
    "listed object missing at read time (S3)",
    ingest.IngestError,
    r"p2\.parquet.*disappeared after it was listed.*restart the epoch",
)
def vanished(ctx: Context) -> Thunk:
    store = ctx.s3_store()
    for n in range(3):
        store.write(f"d/p{n}.parquet", encode(make_table(n * 1000, 1000), "parquet"))
    stream = ingest.Stream(store.url("d"), batch_size=100, storage_options=store.storage_options)
    stream.state_dict()  # plans the epoch: the listing holds p2
    store.fs.rm(store.url("d", "p2.parquet"))
    return lambda: drain(stream)


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
    """A second moto server that checks credentials (after three setup calls), with a
    bucket ``private`` holding one shard, as tests/test_bad_input.py's ``s3_with_auth``."""
    if ctx.auth is not None:
        return ctx.auth
    import boto3

    server = ctx.stack.enter_context(LoopbackS3(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"}))
    iam = boto3.client(
        "iam",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )
    iam.create_user(UserName="trainer")
    key = iam.create_access_key(UserName="trainer")["AccessKey"]
    iam.put_user_policy(
        UserName="trainer",
        PolicyName="all",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
            }
        ),
    )
    creds = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    server.create_bucket("private", creds["key"], creds["secret"])
    options = server.storage_options(creds["key"], creds["secret"])
    fs = ingest.Source("s3://private/", storage_options=options).filesystem("s3://private")
    fs.pipe("private/a.parquet", encode(make_table(0, 10), "parquet"))
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
    r"s3://ingest-test/nowhere/: cannot list",
)
def refused(ctx: Context) -> Thunk:
    options = ctx.s3.storage_options(endpoint=refusing_endpoint())
    return lambda: first(ingest.Stream("s3://ingest-test/nowhere/", storage_options=options))


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
    """Run ``thunk`` in a daemon thread: (seconds, result, error, finished within HANG_S)."""
    out: dict[str, Any] = {}

    def target() -> None:
        start = time.monotonic()
        try:
            out["result"] = thunk()
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
    except Exception as e:
        return Row(c, f"setup failed: {type(e).__name__}", None, first_line(e, ctx.tmp), False)
    seconds, result, error, finished = timed(thunk)
    if not finished:
        return Row(c, "(still running)", seconds, f"no error within {HANG_S:.0f} s", False)
    if c.expect is None:
        if error is not None:
            return Row(c, type(error).__name__, seconds, first_line(error, ctx.tmp), False)
        return Row(c, "none", seconds, str(result), True)
    if error is None:
        return Row(c, "none", seconds, f"no error: returned {result!r}"[:MESSAGE_CHARS], False)
    note = ""
    if not isinstance(error, c.expect):
        note = f"its test expects {c.expect.__name__}"
    elif c.pattern and not re.search(c.pattern, str(error), re.DOTALL):
        note = f"message does not match its test's pattern {c.pattern!r}"
    clear = isinstance(error, ingest.IngestError)
    return Row(c, type(error).__name__, seconds, first_line(error, ctx.tmp), clear, note)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(rows: list[Row]) -> int:
    print("| case | error | seconds | message |")
    print("|---|---|---:|---|")
    for r in rows:
        secs = "-" if r.seconds is None else f"{r.seconds:.2f}"
        print(f"| {cell(r.case.name)} | {cell(r.error)} | {secs} | {cell(r.message)} |")
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
