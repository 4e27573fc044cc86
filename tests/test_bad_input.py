"""Bad input gives a clear error naming the URL, the place and the fix; never a hang."""

from __future__ import annotations

import gzip
import json
import math
import os
import pickle
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import zstandard

import ingest
from ingest.testing import (
    LoopbackS3,
    Store,
    credential_checking_s3,
    encode,
    free_port,
    make_table,
    tar_link,
    tar_of,
)

QUICK_S = 30  # "within seconds": generous for a loaded CI machine, far below any hang


def drain(stream: ingest.Stream) -> int:
    return sum(len(b["id"]) for b in stream)


def test_truncated_parquet(store: Store) -> None:
    data = encode(make_table(0, 500), "parquet")
    store.write("d/a.parquet", data[:-100])
    with pytest.raises(
        ingest.ShardError,
        match=r"a\.parquet.*no readable Parquet footer.*"
        "re-upload",
    ):
        ingest.list_shards(store.url("d"), storage_options=store.storage_options)


def test_file_that_is_not_what_its_extension_says(local: Store) -> None:
    local.write("d/a.parquet", b'{"id": 1}\n')
    with pytest.raises(ingest.ShardError, match=r"a\.parquet at byte 0: is not a Parquet file"):
        ingest.list_shards(local.url("d"))
    local.write("e/b.jsonl", encode(make_table(0, 10), "parquet"))
    with pytest.raises(ingest.ShardError, match=r"b\.jsonl at line 1.*invalid JSON"):
        drain(ingest.Stream(local.url("e")))


def test_invalid_json_line_names_url_and_line_through_the_stream(local: Store) -> None:
    lines = encode(make_table(0, 400), "jsonl").split(b"\n")
    lines[123] = b"{not json"
    local.write("d/a.jsonl", b"\n".join(lines))
    start = time.monotonic()
    with pytest.raises(
        ingest.ShardError,
        match=r"a\.jsonl at line 124, row 123, byte \d+: "
        "invalid JSON",
    ) as err:
        drain(ingest.Stream(local.url("d"), read=ingest.ReadOptions(block_bytes=2048)))
    assert err.value.line == 124
    assert time.monotonic() - start < QUICK_S


def test_zero_row_shards_and_empty_line_files_are_fine(store: Store) -> None:
    store.write("d/a.parquet", encode(make_table(0, 100), "parquet"))
    store.write("d/b.parquet", encode(make_table(0, 0), "parquet"))
    store.write("d/d.jsonl", b"")
    store.write("d/e.jsonl", b"\n\n")
    listing = ingest.list_shards(store.url("d"), storage_options=store.storage_options)
    assert [i.rows for i in listing.infos] == [100, 0, 0, None]
    stream = ingest.Stream(
        store.url("d"),
        columns=["id"],
        storage_options=store.storage_options,
        shuffle_seed=0,
        batch_size=10,
    )
    assert drain(stream) == 100


@pytest.mark.parametrize("seed", [None, 0])
def test_a_null_in_an_integer_column_names_its_shard_and_row(
    local: Store, seed: int | None
) -> None:
    """No torch integer dtype holds a null: the error names the shard and the row, where a
    shuffled batch of many shards said only the column before."""
    local.write("d/a.parquet", encode(pa.table({"id": range(100), "v": range(100)}), "parquet"))
    values: list[int | None] = list(range(100))
    values[37] = None
    table = pa.table({"id": pa.array(range(100, 200)), "v": pa.array(values, pa.int64())})
    local.write("d/b.parquet", encode(table, "parquet"))
    local.write(
        "d/c.parquet", encode(pa.table({"id": range(200, 300), "v": range(100)}), "parquet")
    )
    stream = ingest.Stream(local.url("d"), columns=["id", "v"], shuffle_seed=seed, batch_size=50)
    with pytest.raises(
        ingest.ConfigError,
        match=r"b\.parquet row 37: column 'v' \(int64\) is null.*fill_null",
    ):
        drain(stream)


@pytest.mark.parametrize(
    "values",
    [
        pa.array([[1], [1, None], [2]] * 20, pa.list_(pa.int64())),
        pa.array([[1, 1], [1, None], [2, 2]] * 20, pa.list_(pa.int64(), 2)),
        pa.array([[[1, 1]], [[1, 1], None], [[2, 2]]] * 20, pa.list_(pa.list_(pa.int16(), 2))),
    ],
    ids=["list", "fixed-size list", "a null row of a list of rows"],
)
def test_a_null_inside_a_list_of_integers_names_its_shard_and_row(
    local: Store, values: pa.Array
) -> None:
    # Found by a probe: a null inside a row's list failed at the conversion, naming neither
    # the shard nor the row (a null row of the same column named both).
    table = pa.table({"id": range(60), "v": values}).slice(30)  # rows 30.. of the table
    local.write("d/b.parquet", encode(table, "parquet"))
    stream = ingest.Stream(local.url("d"), columns=["id", "v"], batch_size=10)
    with pytest.raises(ingest.ConfigError, match=r"b\.parquet row 1: column 'v' \(.*\) is null"):
        drain(stream)


def test_a_null_after_the_transform_names_the_shards_of_its_batch(local: Store) -> None:
    values = pa.array([None, *range(1, 10)], pa.int64())
    table = pa.table({"id": range(10), "v": values, "s": [str(i) for i in range(10)]})
    local.write("d/a.parquet", encode(table, "parquet"))

    def blank(table: pa.Table) -> pa.Table:
        return table.set_column(1, "v", pa.nulls(table.num_rows, pa.int64()))

    for transform in (
        blank,
        ingest.Tokenize(lambda texts: [[1] for _ in texts], column="s", keep=["id", "v"]),
    ):
        stream = ingest.Stream(local.url("d"), batch_size=5, transform=transform)
        with pytest.raises(
            ingest.ConfigError,
            match=r"column 'v' \(int64\) is null in row 0 of the transform's output for step 0 "
            r"\(rows of .*a\.parquet\)",
        ):
            drain(stream)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_zero_byte_binary_shard_is_refused(local: Store, fmt: str) -> None:
    """Issue 8: a zero-byte .parquet was listed as 0 rows without a word."""
    name = f"c.{fmt}"
    local.write(f"d/a.{fmt}", encode(make_table(0, 100), fmt))
    local.write(f"d/{name}", b"")
    start = time.monotonic()
    with pytest.raises(
        ingest.ShardError,
        match=rf"{name.replace('.', r'[.]')} at byte 0: is empty \(0 bytes\).*write it again",
    ):
        drain(ingest.Stream(local.url("d"), columns=["id"]))
    assert time.monotonic() - start < QUICK_S


def test_a_parquet_shard_without_columns_is_refused(local: Store) -> None:
    """Issue 17: a Parquet file with no columns was a shard of 0 rows, silently (pyarrow
    writes a table whose columns were all dropped with num_rows=0: its rows are gone)."""
    local.write("d/a.parquet", encode(make_table(0, 100), "parquet"))
    sink = pa.BufferOutputStream()
    pq.write_table(make_table(0, 3).drop_columns(["id", "tokens", "score", "text"]), sink)
    local.write("d/b.parquet", sink.getvalue().to_pybytes())
    with pytest.raises(
        ingest.ShardError,
        match=r"b\.parquet at byte \d+: has no columns \(its footer lists 0 rows and not one "
        r"column\): there is nothing in it to read.*write the file again with its columns",
    ):
        drain(ingest.Stream(local.url("d"), batch_size=10))


def write_drifted(local: Store) -> None:
    """Two parquet shards whose ``id`` columns differ in type (int64, then string)."""
    local.write("d/a.parquet", encode(make_table(0, 10), "parquet"))
    table = make_table(10, 10).set_column(0, "id", pa.array([str(i) for i in range(10)]))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    local.write("d/b.parquet", sink.getvalue().to_pybytes())


def test_parquet_schema_drift_names_both_shards(local: Store) -> None:
    write_drifted(local)
    with pytest.raises(
        ingest.SchemaMismatchError,
        match=r"b\.parquet: schema differs from "
        r".*a\.parquet's: column 'id' is string, not int64",
    ):
        ingest.Stream(local.url("d")).listing()


def test_parquet_drift_is_fine_when_the_columns_read_agree(local: Store) -> None:
    write_drifted(local)
    stream = ingest.Stream(local.url("d"), columns=["score"], batch_size=5)
    assert sum(len(b["score"]) for b in stream) == 20


def test_jsonl_schema_drift_names_both_shards(local: Store) -> None:
    local.write("d/a.jsonl", b"".join(b'{"id": %d, "x": 1.5}\n' % i for i in range(50)))
    local.write("d/b.jsonl", b"".join(b'{"id": %d, "x": "text"}\n' % i for i in range(50)))
    with pytest.raises(
        ingest.SchemaMismatchError,
        match=r"b\.jsonl at line 1, row 0, byte 0: "
        r"line does not match the schema taken from .*a\.jsonl",
    ):
        drain(ingest.Stream(local.url("d")))


def test_empty_glob(store: Store) -> None:
    store.write("d/a.parquet", encode(make_table(0, 10), "parquet"))
    with pytest.raises(ingest.SourceError, match=r"nothing-\*\.parquet: matches no data files"):
        ingest.list_shards(
            store.url("d", "nothing-*.parquet"), storage_options=store.storage_options
        )


def test_missing_bucket(s3: LoopbackS3) -> None:
    with pytest.raises(ingest.SourceError, match=r"s3://no-such-bucket.*does not exist.*bucket"):
        ingest.list_shards(
            "s3://no-such-bucket/train/*.parquet", storage_options=s3.storage_options()
        )
    with pytest.raises(ingest.SourceError, match="not found"):
        ingest.list_shards("s3://no-such-bucket/train/", storage_options=s3.storage_options())


@pytest.fixture(scope="module")
def s3_with_auth() -> Iterator[tuple[LoopbackS3, dict[str, str]]]:
    """A second moto server that checks credentials, with a bucket ``private`` holding one
    shard (:func:`ingest.tools.loopback.credential_checking_s3`)."""
    with credential_checking_s3() as server_and_creds:
        yield server_and_creds


@pytest.mark.parametrize("which", ["unknown key", "wrong secret"])
def test_wrong_credentials(s3_with_auth: tuple[LoopbackS3, dict[str, str]], which: str) -> None:
    server, creds = s3_with_auth
    assert (
        len(
            ingest.list_shards(
                "s3://private/",
                storage_options=server.storage_options(creds["key"], creds["secret"]),
            ).shards
        )
        == 1
    )  # the right ones work
    secret = "wrong-secret-value-0123456789"
    key = "AKIAWRONGWRONGWRONG1" if which == "unknown key" else creds["key"]
    start = time.monotonic()
    with pytest.raises(
        ingest.SourceError, match=r"s3://private/: access denied.*credentials"
    ) as err:
        ingest.list_shards("s3://private/", storage_options=server.storage_options(key, secret))
    assert time.monotonic() - start < QUICK_S
    assert secret not in str(err.value) and secret not in repr(err.value.__dict__)
    assert creds["secret"] not in str(err.value)


def test_no_credentials_at_all_fail_at_once_saying_where_to_set_them(
    s3: LoopbackS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No credentials in the storage options, the environment or a profile (a laptop that
    never ran ``aws configure``): botocore finds none before any request. No retry mends
    that, so the error comes at once and names where credentials go, and ``anon`` for a
    public bucket; it was retried for 19 s, then said to check the endpoint and network."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role on loopback
    options = {"client_kwargs": {"endpoint_url": s3.endpoint}}
    start = time.monotonic()
    with pytest.raises(ingest.SourceError, match=r"s3://bucket/x: no credentials") as err:
        ingest.list_shards("s3://bucket/x", storage_options=options)
    assert time.monotonic() - start < 5, "retried"
    assert "AWS_ACCESS_KEY_ID" in str(err.value) and "anon" in str(err.value)
    assert "network" not in str(err.value)


def test_a_read_without_credentials_is_not_retried_and_says_where_to_set_them() -> None:
    """A reader on a node whose environment lacks the driver's credentials (Ray does not
    carry a driver's environment to other nodes): its reads fail at once, saying where
    credentials go; google-auth's missing default credentials the same."""
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    from google.auth.exceptions import DefaultCredentialsError

    from ingest.storage.sources.faults import is_transient, missing_credentials
    from ingest.storage.sources.retry import GaveUpError, RetryPolicy, attempt, store_error

    calls = []

    def read() -> bytes:
        calls.append(1)
        raise NoCredentialsError()

    with pytest.raises(GaveUpError) as gave_up:
        attempt(read, RetryPolicy(), None)
    assert len(calls) == 1
    error = store_error(
        "s3://b/k.parquet", "cannot read", gave_up.value, "unused", endpoint="e", scrub=str
    )
    assert "no credentials for the store" in str(error) and "runtime_env" in str(error)
    partial = PartialCredentialsError(provider="env", cred_var="secret")
    for e in (partial, DefaultCredentialsError()):
        assert not is_transient(e) and missing_credentials(e) is not None
    wrapped = OSError("failed")
    wrapped.__cause__ = NoCredentialsError()
    assert not is_transient(wrapped)
    assert missing_credentials(OSError("reset")) is None


def test_a_read_the_store_denies_says_access_denied_not_the_network() -> None:
    """A bucket whose policy lets these credentials list but not read (s3fs and gcsfs raise
    PermissionError): the read fails at once naming the denial and the permission to grant;
    it said to check the store and the network."""
    from ingest.storage.sources.retry import GaveUpError, RetryPolicy, attempt, store_error

    calls = []

    def read() -> bytes:
        calls.append(1)
        raise PermissionError("Access Denied")

    with pytest.raises(GaveUpError) as gave_up:
        attempt(read, RetryPolicy(), None)
    assert len(calls) == 1
    error = store_error(
        "s3://b/k.parquet",
        "read of bytes [0, 10) failed",
        gave_up.value,
        "check the store and the network",
        endpoint="e",
        scrub=str,
    )
    assert "access denied" in str(error) and "s3:GetObject" in str(error), str(error)
    assert "network" not in str(error)


def test_an_unreachable_endpoint_fails_within_seconds_naming_no_credentials() -> None:
    """A refused connection is retried up to the deadline, then reported naming the endpoint
    but never the credentials in the URL. One wait for both checks (they were two tests of
    18 s each); an S3 endpoint that refuses, through a Stream: test_storage_faults.py."""
    start = time.monotonic()
    with pytest.raises(ingest.SourceError, match="cannot list") as err:
        ingest.list_shards(f"http://user:hunter2@127.0.0.1:{free_port()}/data/a.parquet")
    assert time.monotonic() - start < QUICK_S
    assert "refused the connection" in str(err.value)
    assert "hunter2" not in str(err.value) and "user" not in str(err.value)


def test_a_glob_fsspec_refuses_is_an_error_naming_the_url_and_the_fix(local: Store) -> None:
    """``d/**.parquet`` (``**`` inside a path component): fsspec's bare ValueError named
    neither the URL nor how to write it."""
    local.write("d/sub/a.parquet", encode(make_table(0, 10), "parquet"))
    with pytest.raises(ingest.ConfigError, match=r"d/\*\*\.parquet: .*'\*\*'.*d/\*\*/\*\.parquet"):
        ingest.list_shards(local.url("d/**.parquet"))
    assert len(ingest.list_shards(local.url("d/**/*.parquet")).shards) == 1


def test_unknown_format_lists_the_known_ones(local: Store) -> None:
    with pytest.raises(
        ingest.ConfigError,
        match="unknown format 'avro'; known formats: arrow, audiofolder, csv, imagefolder, jsonl, "
        "parquet, text, tsv, webdataset",
    ):
        ingest.Stream(local.url("d"), format="avro")


def test_state_from_another_dataset_or_version(local: Store) -> None:
    local.write("a/x.parquet", encode(make_table(0, 100), "parquet"))
    local.write("b/y.parquet", encode(make_table(0, 100), "parquet"))
    state = ingest.Stream(local.url("a")).state_dict()
    with pytest.raises(ingest.StateError, match="another dataset"):
        ingest.Stream(local.url("b")).load_state_dict(state)
    with pytest.raises(ingest.StateError, match="version 9 is not supported"):
        ingest.Stream(local.url("a")).load_state_dict({**state, "version": 9})
    # Another program's JSON (a trainer's state, a config): said so, not "version None".
    with pytest.raises(ingest.StateError, match=r"not an ingest stream state: .*'global_step'"):
        ingest.Stream(local.url("a")).load_state_dict({"global_step": 10, "epoch": 1.0})


# -- line formats: long lines, compression, ragged and non-UTF-8 records ---------------------


LONG_LINES = {  # row 70 of a 100-row shard, 4 MB long
    "jsonl": b'{"id": 70, "score": 0.07, "text": "' + b"x" * (4 << 20) + b'"}',
    "csv": b"70,0.07," + b"x" * (4 << 20),
}


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_line_past_the_row_size_limit_is_an_error_not_an_out_of_memory(
    store: Store, fmt: str
) -> None:
    """Issue 8's 50 MB line, scaled down: a 4 MB line under a 64 KiB limit is refused after
    about the limit is read, naming its line, row and byte."""
    lines = encode(make_table(0, 100), fmt).split(b"\n")
    at = 70 + (fmt == "csv")  # the index of row 70's line (CSV: after the header)
    lines[at] = LONG_LINES[fmt]
    store.write(f"d/a.{fmt}", b"\n".join(lines))
    byte = sum(len(x) + 1 for x in lines[:at])
    limit = 64 << 10
    stream = ingest.Stream(
        store.url("d"),
        batch_size=10,
        storage_options=store.storage_options,
        read=ingest.ReadOptions(max_line_bytes=limit, block_bytes=16 << 10),
    )
    start = time.monotonic()
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.{fmt} at line {at + 1}, row 70, byte {byte}: a line is longer "
        rf"than max_line_bytes={limit}.*raise ReadOptions\(max_line_bytes=\.\.\.\)",
    ):
        drain(stream)
    assert time.monotonic() - start < QUICK_S
    assert stream.stats["bytes_read"] < 2 * limit + (64 << 10), stream.stats


def test_the_row_size_limit_is_checked() -> None:
    assert ingest.ReadOptions().max_line_bytes == 64 << 20
    with pytest.raises(ingest.ConfigError, match="max_line_bytes=100 is below 1024"):
        ingest.ReadOptions(max_line_bytes=100)


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress,
    "zst": lambda data: bytes(zstandard.ZstdCompressor().compress(data)),
}


@pytest.mark.parametrize("codec", ["gz", "zst"])
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tar"])
def test_a_truncated_compressed_shard_is_an_error_not_fewer_rows(
    store: Store, fmt: str, codec: str
) -> None:
    """zstandard's stream reader ended a truncated frame as a clean end of file: the rows
    before the cut were delivered and the rest lost without a word."""
    data = COMPRESSORS[codec](encode(make_table(0, 20_000), fmt))
    store.write(f"d/a.{fmt}.{codec}", data[: len(data) * 2 // 3])
    name = "gzip" if codec == "gz" else "zstd"
    start = time.monotonic()
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.{fmt}\.{codec} at byte \d+: the {name} stream is truncated: the file "
        rf"ends at compressed byte {len(data) * 2 // 3} inside a .*re-upload the complete file",
    ):
        drain(
            ingest.Stream(
                store.url("d"),
                batch_size=100,
                storage_options=store.storage_options,
                read=ingest.ReadOptions(block_bytes=64 << 10),
            )
        )
    assert time.monotonic() - start < QUICK_S


def csv_with(rows: dict[int, bytes]) -> bytes:
    """A 3,000-record CSV shard (``id,score,text``) with records ``rows`` (0-based) replaced."""
    lines = encode(make_table(0, 3000), "csv").split(b"\n")
    for row, record in rows.items():
        lines[row + 1] = record
    return b"\n".join(lines)


@pytest.mark.parametrize(
    ("row", "record", "why"),
    [
        # in the first block, which the column types are inferred from
        (50, b"50,0.05,row 50,extra", "Expected 3 columns, got 4"),
        # in a later chunk, read with those types
        (2500, b"2500,0.5", "Expected 3 columns, got 2"),
    ],
)
def test_a_ragged_csv_row_names_its_line(local: Store, row: int, record: bytes, why: str) -> None:
    data = csv_with({row: record})
    local.write("d/a.csv", data)
    byte = data.index(b"\n" + record + b"\n") + 1
    start = time.monotonic()
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.csv at line {row + 2}, row {row}, byte {byte}: bad CSV record "
        rf"\(CSV parse error: {why}.*fix the record",
    ):
        drain(ingest.Stream(local.url("d"), read=ingest.ReadOptions(block_bytes=4096)))
    assert time.monotonic() - start < QUICK_S


def plain_csv(rows: int, replaced: dict[int, bytes]) -> bytes:
    """``id,text`` records without quotes, with records ``replaced`` (0-based) replaced."""
    records = [replaced.get(i, b"%d,text %d" % (i, i)) for i in range(rows)]
    return b"id,text\n" + b"".join(r + b"\n" for r in records)


@pytest.mark.parametrize("row", [40, 2990])  # in the first block, in the last one
def test_a_csv_quote_that_never_closes_is_an_error_not_a_value_that_runs_on(
    local: Store, row: int
) -> None:
    """Issue 17: a stray quote opened a value that took in every record after it (pyarrow
    reads the rest of the file as that value): fewer rows, without a word."""
    stray = b'%d,"a stray quote' % row
    data = plain_csv(3000, {row: stray})
    local.write("d/a.csv", data)
    record = data.index(stray)
    quote = record + stray.index(b'"')
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.csv at byte {record}: ends inside a record: the quoted value opened at "
        rf"byte {quote} never closes.*close the quote, or double each quote meant as text",
    ):
        drain(ingest.Stream(local.url("d"), read=ingest.ReadOptions(block_bytes=4096)))
    # Past max_line_bytes, the record is too long, and the open quote is named as the cause.
    local.write("e/a.csv", plain_csv(3000, {row: stray, 2999: b"x" * 2000}))
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.csv at .*byte {record}: a line is longer than max_line_bytes=1024 \(the "
        rf"quoted value opened at byte {quote} never closes\).*an unbalanced quote",
    ):
        drain(
            ingest.Stream(
                local.url("e"), read=ingest.ReadOptions(block_bytes=4096, max_line_bytes=1024)
            )
        )


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
@pytest.mark.parametrize("row", [40, 2500])
def test_text_that_is_not_utf8_names_its_line(local: Store, fmt: str, row: int) -> None:
    """Issue 8: invalid UTF-8 in a JSONL shard gave a bare UnicodeDecodeError (and in a CSV
    shard's first block, a column of bytes instead of strings)."""
    if fmt == "csv":
        bad = b'%d,0.5,"caf\xe9 %d"' % (row, row)
        data = csv_with({row: bad})
    else:
        lines = encode(make_table(0, 3000), fmt).split(b"\n")
        bad = lines[row] = b'{"id": %d, "score": 0.5, "text": "caf\xe9"}' % row
        data = b"\n".join(lines)
    local.write(f"d/a.{fmt}", data)
    line = row + (2 if fmt == "csv" else 1)
    byte, at = data.index(bad), bad.index(b"\xe9")
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.{fmt} at line {line}, row {row}, byte {byte}: is not UTF-8 text \(byte 0xe9 "
        rf"at byte {at} of the line.*re-encode the file",
    ):
        drain(
            ingest.Stream(local.url("d"), batch_size=10, read=ingest.ReadOptions(block_bytes=4096))
        )


DEEP = b'{"id": 60, "score": 0.5, "text": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
"""Issue 17: one JSON line of 20 KB that nests 10,001 levels deep (an object, its arrays)."""

DEEP_STREAM = """
import sys
import ingest

try:
    for _ in ingest.Stream(sys.argv[1], batch_size=10):
        pass
except ingest.ShardError as e:
    print(e)
"""


def jsonl_with(rows: int, replaced: dict[int, bytes]) -> bytes:
    lines = encode(make_table(0, rows), "jsonl").split(b"\n")
    for row, line in replaced.items():
        lines[row] = line
    return b"\n".join(lines)


def test_a_json_line_nested_too_deep_is_an_error_not_a_crash(local: Store) -> None:
    """Issue 17: in the shard the schema is inferred from, the line crashed the process
    (segmentation fault in pyarrow's validation), so the stream runs in a child process."""
    data = jsonl_with(100, {60: DEEP})
    local.write("d/a.jsonl", data)
    child = subprocess.run(
        [sys.executable, "-c", DEEP_STREAM, local.url("d")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    byte = data.index(DEEP)
    assert re.search(
        rf"a\.jsonl at line 61, row 60, byte {byte}: a JSON value nests 10001 levels deep, more "
        r"than max_json_depth=128.*flatten",
        child.stdout,
    ), child.stdout


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_json_line_nested_too_deep_in_a_later_shard_is_named_or_quarantined(
    local: Store, on_error: str
) -> None:
    """Issue 17: with the schema from another shard, the line was a bare RecursionError, even
    with on_error="skip"."""
    local.write("d/a.jsonl", encode(make_table(0, 100), "jsonl"))
    data = jsonl_with(100, {60: DEEP})
    local.write("d/b.jsonl", data)
    stream = ingest.Stream(local.url("d"), batch_size=1, read=ingest.ReadOptions(on_error=on_error))
    problem = rf"b\.jsonl at line 61, row 60, byte {data.index(DEEP)}: a JSON value nests "
    if on_error == "raise":
        with pytest.raises(ingest.ShardError, match=problem + "10001 levels deep"):
            drain(stream)
        return
    assert drain(stream) == 199  # every other line
    [record] = stream.quarantined
    assert (record.start, record.stop) == (60, 61)
    assert re.search(problem, record.reason), record.reason


def test_nesting_within_max_json_depth_is_read(local: Store) -> None:
    nested = b'{"id": 7, "x": ' + b"[" * 50 + b"1" + b"]" * 50 + b"}\n"
    local.write("d/a.jsonl", nested)
    stream = ingest.Stream(local.url("d"), batch_size=1, read=ingest.ReadOptions(max_json_depth=51))
    assert [b["id"].tolist() for b in stream] == [[7]]
    # Brackets inside strings are text, not nesting.
    local.write("e/a.jsonl", b'{"id": 8, "x": "' + b"[{" * 500 + b'"}\n')
    stream = ingest.Stream(local.url("e"), batch_size=1, read=ingest.ReadOptions(max_json_depth=2))
    assert [b["id"].tolist() for b in stream] == [[8]]
    with pytest.raises(ingest.ConfigError, match=r"max_json_depth=2000 .*at most 1000"):
        ingest.ReadOptions(max_json_depth=2000)


# -- WebDataset tars: hostile member names, links, missing and duplicate fields, pickles ----


SAMPLE0 = (("s0.jpg", b"jpeg 0"), ("s0.cls", b"0"))  # two members of 1024 bytes each


@pytest.mark.parametrize("name", ["../x.jpg", "a/../../x.jpg", "/etc/x.jpg"])
def test_a_tar_member_that_leaves_the_archive_is_refused(store: Store, name: str) -> None:
    store.write("d/a.tar", tar_of(*SAMPLE0, (name, b"jpeg"), ("s2.jpg", b"jpeg 2")))
    start = time.monotonic()
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.tar at byte 2048: member name '{name}' leaves the archive.*"
        r"tar -C DIR -cf shard\.tar \.",
    ):
        drain(ingest.Stream(store.url("d"), batch_size=1, storage_options=store.storage_options))
    assert time.monotonic() - start < QUICK_S


@pytest.mark.parametrize("corrupt", ["a name's byte", "the checksum", "the size"])
def test_a_corrupt_tar_header_after_the_first_is_refused_naming_its_byte(
    store: Store, corrupt: str
) -> None:
    """tarfile's stream mode took a header that fails its checksum after the first member
    for the archive's end marker: the samples after it were lost without a word (3 of 5)."""
    raw = bytearray(
        tar_of(
            *SAMPLE0, *[(f"s{n}.{ext}", b"%d" % n) for n in (1, 2, 3, 4) for ext in ("jpg", "cls")]
        )
    )
    at = 3072  # the header of s1.cls: s0.jpg, s0.cls, s1.jpg before it, 1024 bytes each
    assert raw[at : at + 6] == b"s1.cls"
    byte = {"a name's byte": at + 1, "the checksum": at + 150, "the size": at + 130}[corrupt]
    raw[byte] ^= 0x01
    store.write("d/a.tar", bytes(raw))
    stream = ingest.Stream(store.url("d"), batch_size=1, storage_options=store.storage_options)
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.tar at byte {at}: tar stream is corrupt.*fails its checksum.*re-upload",
    ):
        drain_keys(stream)


def drain_keys(stream: ingest.Stream) -> list[str]:
    return [k for b in stream for k in b["__key__"]]


def test_member_names_inside_the_archive_are_keys(local: Store) -> None:
    local.write("d/a.tar", tar_of(("./s0.jpg", b"a"), ("x/../s1.jpg", b"b"), ("x/s2.jpg", b"c")))
    (batch,) = ingest.Stream(local.url("d"), batch_size=3)
    assert batch["__key__"] == ["./s0", "x/../s1", "x/s2"]


@pytest.mark.parametrize(
    ("kind", "word"), [(tarfile.SYMTYPE, "symbolic link"), (tarfile.LNKTYPE, "hard link")]
)
def test_a_link_member_is_refused(local: Store, kind: bytes, word: str) -> None:
    local.write("d/a.tar", tar_of(*SAMPLE0, tar_link("s1.jpg", "../../etc/passwd", kind)))
    with pytest.raises(
        ingest.ShardError,
        match=rf"a\.tar at byte 2048: member 's1\.jpg' is a {word} to '\.\./\.\./etc/passwd': "
        r"a WebDataset field must be a regular file.*--dereference",
    ):
        drain(ingest.Stream(local.url("d"), batch_size=1))


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        # Issue 17: KeyError: 'Column __key__ does not exist in schema'
        ("s1.__key__", r"member 's1\.__key__' is field '__key__', the column of sample keys"),
        # Issue 17: a column named ''
        ("s1", r"member 's1' has no extension: nothing names its field"),
        ("d.x/s1", r"member 'd\.x/s1' has no extension: nothing names its field"),
    ],
)
def test_a_tar_member_that_names_no_field_is_refused(local: Store, name: str, problem: str) -> None:
    local.write("d/a.tar", tar_of(*SAMPLE0, ("s1.jpg", b"jpeg 1"), (name, b"x")))
    with pytest.raises(ingest.ShardError, match=rf"a\.tar at byte 3072: {problem}.*rename"):
        drain(ingest.Stream(local.url("d"), batch_size=1))


def test_a_sample_missing_a_field_has_a_null_there(store: Store) -> None:
    """The columns are the union of the fields; a field a sample lacks is None, as in Hugging
    Face datasets' WebDataset loader (documented in ingest.formats.webdataset)."""
    store.write("d/a.tar", tar_of(*SAMPLE0, ("s1.jpg", b"jpeg 1"), ("s2.cls", b"2")))
    (batch,) = ingest.Stream(store.url("d"), batch_size=3, storage_options=store.storage_options)
    assert batch == {
        "__key__": ["s0", "s1", "s2"],
        "cls": [b"0", None, b"2"],
        "jpg": [b"jpeg 0", b"jpeg 1", None],
    }


def test_a_duplicate_field_in_one_sample_is_refused(local: Store) -> None:
    local.write("d/a.tar", tar_of(*SAMPLE0, ("s1.jpg", b"one"), ("s1.jpg", b"two")))
    with pytest.raises(
        ingest.ShardError,
        match=r"a\.tar at byte 3072: sample 's1' has field 'jpg' twice.*one of them would be lost",
    ):
        drain(ingest.Stream(local.url("d"), batch_size=1))


def test_a_sample_whose_members_are_apart_is_refused(local: Store) -> None:
    # Found by a probe: members a.txt, b.txt, a.json, b.json made four rows, two per key,
    # each with half its fields null, without a word.
    local.write(
        "d/a.tar", tar_of(("a.txt", b"1"), ("b.txt", b"2"), ("a.json", b"{}"), ("b.json", b"{}"))
    )
    with pytest.raises(
        ingest.ShardError,
        match=r"a\.tar at byte 2048: sample 'a' goes on after sample 'b'.*\(member 'a\.json'\)"
        r".*two rows.*--sort=name",
    ):
        list(ingest.Stream(local.url("d"), batch_size=1))


class RunsCode:
    """Unpickling this runs code: it creates the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return exec, (f"import pathlib; pathlib.Path({str(self.marker)!r}).touch()",)


def test_a_pickle_member_is_delivered_as_bytes_and_never_loaded(
    local: Store, tmp_path: Path
) -> None:
    marker = tmp_path / "pickle-ran"
    payload = pickle.dumps(RunsCode(marker))
    local.write(
        "d/a.tar",
        tar_of(*SAMPLE0, ("s1.pyd", payload), ("s1.pickle", payload), ("s1.cls", b"1")),
    )
    (batch,) = ingest.Stream(local.url("d"), batch_size=2)
    assert batch["pyd"] == [None, payload] and batch["pickle"] == [None, payload]
    assert not marker.exists()
    pickle.loads(batch["pyd"][1])  # the control: the payload was live
    assert marker.exists()


# -- the store: objects that vanish or change ----------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_listed_object_that_disappears_is_named(store: Store, fmt: str) -> None:
    for n in range(3):
        store.write(f"d/p{n}.{fmt}", encode(make_table(n * 1000, 1000), fmt))
    stream = ingest.Stream(store.url("d"), batch_size=100, storage_options=store.storage_options)
    stream.state_dict()  # plans the epoch: the listing holds p2
    store.fs.rm(store.url("d", f"p2.{fmt}"))
    start = time.monotonic()
    with pytest.raises(
        ingest.IngestError,
        match=rf"p2\.{fmt}.*disappeared after it was listed.*restart the epoch",
    ):
        drain(stream)
    assert time.monotonic() - start < QUICK_S
    stream.close()  # never raises; the next loop says what is wrong
    with pytest.raises(ingest.StateError, match=rf"1 shard\(s\) gone: .*p2\.{fmt}"):
        next(iter(stream))


def test_a_shard_rewritten_with_the_same_size_is_refused(s3_store: Store) -> None:
    for n in range(2):
        s3_store.write(f"d/p{n}.jsonl", encode(make_table(n * 100, 100), "jsonl"))
    first = ingest.Stream(
        s3_store.url("d"), batch_size=10, storage_options=s3_store.storage_options
    )
    next(iter(first))
    state = first.state_dict()
    first.close()
    old = s3_store.fs.cat(s3_store.url("d", "p1.jsonl"))
    s3_store.write("d/p1.jsonl", old.replace(b"row 1", b"row 7"))  # same size, other bytes
    again = ingest.Stream(
        s3_store.url("d"), batch_size=10, storage_options=s3_store.storage_options
    )
    with pytest.raises(
        ingest.StateError, match=r"1 shard\(s\) changed: \S+/p1\.jsonl \(version '\w+' -> '\w+'\)"
    ):
        again.load_state_dict(state)


def test_too_deep_measures_the_first_line_past_the_limit_strings_left_out() -> None:
    import json

    from ingest.formats.jsonl import too_deep

    def nested(depth: int) -> str:
        return "[" * depth + "]" * depth

    shallow = [json.dumps({"a": nested(3)}), json.dumps({"s": "[[[[[[[[[[{{{{{"})]
    assert too_deep("\n".join(shallow * 50).encode(), 4) is None, "brackets in strings"
    lines = [*shallow, nested(5), nested(9)]
    assert too_deep("\n".join(lines).encode(), 4) == 5, "the first line past it"
    assert too_deep("\r\n".join(lines).encode(), 9) is None, "a depth of the limit is allowed"
    assert too_deep(nested(7).encode(), 6) == 7, "no newline at all"
    assert too_deep(b"", 1) is None


def written(table: pa.Table, fmt: str) -> bytes:
    """``table`` as a shard of ``fmt``, whatever its columns."""
    if fmt == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in table.to_pylist()).encode()
    if fmt == "csv":
        sink = pa.BufferOutputStream()
        pa_csv.write_csv(table, sink)
        return bytes(sink.getvalue())
    return encode(table, fmt)


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl", "csv"])
@pytest.mark.parametrize("first_lacks", [True, False])
def test_a_selected_column_one_shard_lacks_is_named_in_that_shard(
    local: Store, fmt: str, first_lacks: bool
) -> None:
    # Found by a probe: where the first shard (whose types the stream takes) lacked a
    # column of columns=[...], the error blamed the shard that has it ("column 'b' is
    # int64, not null": a type nobody wrote); the other way round it named the right one.
    table = make_table(0, 50).select(["id", "score", "text"])
    lacking, having = ("a", "b") if first_lacks else ("b", "a")
    local.write(f"d/{lacking}.{fmt}", written(table.drop_columns(["score"]), fmt))
    local.write(f"d/{having}.{fmt}", written(table, fmt))
    stream = ingest.Stream(local.url("d"), columns=["id", "score"], batch_size=10)
    if fmt == "jsonl" and not first_lacks:  # a key no line of it holds: nulls, as in JSON
        scores = [float(x) for b in stream for x in b["score"].tolist()]
        assert len(scores) == 100 and sum(math.isnan(x) for x in scores) == 50
        return
    told = r"has no column\(s\) \['score'\]; it has \['id', 'text'\]"
    if first_lacks:
        told += r" \(the stream takes its column types from this shard.*ReadOptions\(schema="
    if fmt == "csv" and not first_lacks:  # CSV shards must share the first one's header
        told = r"header \['id', 'text'\] differs from .*a\.csv's"
    with pytest.raises(ingest.ShardError, match=told) as err:
        drain(stream)
    assert err.value.url == local.url(f"d/{lacking}.{fmt}")


def test_a_json_lines_shard_the_stream_types_as_json_cannot_hold_is_named(local: Store) -> None:
    """A JSON Lines shard beside Parquet shards whose column is a fixed-size list (the type
    the stream takes from them): pyarrow's JSON reader converts to no fixed-size list, and
    its bare ArrowNotImplementedError named neither the shard nor a fix."""
    local.write("m/a.parquet", encode(make_table(0, 10), "parquet"))
    local.write("m/b.jsonl", encode(make_table(10, 10), "jsonl"))
    with pytest.raises(ingest.ShardError, match=r"fixed_size_list.*schema=") as err:
        drain(ingest.Stream(local.url("m"), batch_size=5))
    assert err.value.url == local.url("m/b.jsonl") and "a.parquet" in str(err.value)


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "csv"])
@pytest.mark.parametrize("first", [True, False])
def test_a_shard_with_two_columns_of_one_name_is_refused_naming_them(
    local: Store, fmt: str, first: bool
) -> None:
    """Two columns named ``x``: a batch holds one column of a name, so a Parquet or Arrow
    shard's first ``x`` was dropped without a word, and a CSV header ``x,x`` failed with a
    bare ``KeyError`` naming no shard."""
    twice = pa.Table.from_arrays([pa.array([1, 2]), pa.array([10, 20])], names=["x", "x"])
    once = pa.table({"x": [3, 4]})
    local.write(f"d/a.{fmt}", written(twice if first else once, fmt))
    local.write(f"d/b.{fmt}", written(once if first else twice, fmt))
    bad = local.url(f"d/{'a' if first else 'b'}.{fmt}")
    with pytest.raises(ingest.ShardError, match=r"column\(s\) named twice: \['x'\]") as err:
        drain(ingest.Stream(local.url("d"), batch_size=2))
    assert err.value.url == bad and "rename" in str(err.value)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (encode(make_table(0, 10), "parquet"), r"a Parquet file.*format='parquet'"),
        (gzip.compress(b'{"id": 1}\n'), r"gzip-compressed.*\.jsonl\.gz"),
    ],
    ids=["parquet", "gzip"],
)
def test_a_file_read_as_json_lines_that_is_another_format_says_so(
    local: Store, data: bytes, kind: str
) -> None:
    # Found by a probe: format="jsonl" over a Parquet file said "invalid JSON ... fix or
    # remove the line", its bytes (b'PAR1...') the only hint.
    local.write("d/a.jsonl", data)
    with pytest.raises(ingest.ShardError, match=r"a\.jsonl at line 1, row 0, byte 0: .*" + kind):
        list(ingest.Stream(local.url("d"), batch_size=1))
