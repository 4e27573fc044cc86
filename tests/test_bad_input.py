"""Bad input gives a clear error naming the URL, the place and the fix; never a hang."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ingest
from ingest.testing import LoopbackS3, encode, free_port, make_table
from tests.conftest import Store

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
    """A second moto server that checks credentials (after three setup calls)."""
    with LoopbackS3(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"}) as server:
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
        fs = ingest.Source(
            "s3://private/", storage_options=server.storage_options(creds["key"], creds["secret"])
        ).filesystem("s3://private")
        fs.pipe("private/a.parquet", encode(make_table(0, 10), "parquet"))
        yield server, creds


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


def test_unreachable_endpoint_fails_within_seconds() -> None:
    options = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
    }
    start = time.monotonic()
    with pytest.raises(ingest.SourceError, match="cannot list"):
        ingest.list_shards("s3://bucket/data/", storage_options=options)
    assert time.monotonic() - start < QUICK_S


def test_credentials_in_a_url_never_reach_a_message(local: Store) -> None:
    with pytest.raises(ingest.IngestError) as err:
        ingest.list_shards("https://user:hunter2@127.0.0.1:9/data/a.parquet")
    assert "hunter2" not in str(err.value)


def test_unknown_format_lists_the_known_ones(local: Store) -> None:
    with pytest.raises(
        ingest.ConfigError,
        match="unknown format 'avro'; known formats: arrow, csv, jsonl, parquet, webdataset",
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
