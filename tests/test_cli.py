"""The ingest command line, run as a user runs it: a subprocess."""

from __future__ import annotations

import subprocess
import sys

from ingest.testing import LoopbackS3, encode, make_table
from tests.conftest import Store


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def options(s3: LoopbackS3) -> list[str]:
    """The -o storage options that reach the loopback server."""
    return [
        "-o",
        f"key={s3.key}",
        "-o",
        f"secret={s3.secret}",
        "-o",
        f"client_kwargs.endpoint_url={s3.endpoint}",
    ]


def test_ls_on_loopback_s3(s3: LoopbackS3, s3_store: Store) -> None:
    for n in range(3):
        s3_store.write(f"d/part-{n}.parquet", encode(make_table(0, 100 * (n + 1)), "parquet"))
    s3_store.write("d/extra.jsonl", encode(make_table(0, 7), "jsonl"))
    out = run(
        "ls",
        s3_store.url("d"),
        *options(s3),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() == ["path", "format", "bytes", "rows"]
    assert "part-0.parquet" in lines[2] and lines[2].split()[1:] == [
        "parquet",
        lines[2].split()[2],
        "100",
    ]
    assert lines[1].split()[-1] == "?"  # extra.jsonl: no footer
    total_bytes = sum(int(x.split()[2].replace(",", "")) for x in lines[1:5])
    assert lines[-1] == (
        f"4 shards, 600 rows, {total_bytes} bytes (+1 shards not counted; --count reads them)"
    )
    counted = run(
        "ls",
        s3_store.url("d"),
        "--count",
        *options(s3),
    )
    assert counted.stdout.strip().splitlines()[-1] == f"4 shards, 607 rows, {total_bytes} bytes"
    assert s3.secret not in out.stdout + out.stderr


def test_ls_bad_input_exits_2_with_one_line(local: Store) -> None:
    out = run("ls", local.url("missing", "*.parquet"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("ingest ls: error: ")
    local.write("d/a.parquet", b"garbage")
    out = run("ls", local.url("d"))
    assert out.returncode == 2
    assert "a.parquet at byte 0: is not a Parquet file" in out.stderr
