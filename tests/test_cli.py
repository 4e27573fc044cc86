"""The ingest command line, run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ingest.testing import LoopbackS3, Store, encode, make_table


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.tools.cli", *args],
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
    sizes: dict[str, int] = {}
    for n in range(3):
        data = encode(make_table(0, 100 * (n + 1)), "parquet")
        s3_store.write(f"d/part-{n}.parquet", data)
        sizes[f"part-{n}.parquet"] = len(data)
    data = encode(make_table(0, 7), "jsonl")
    s3_store.write("d/extra.jsonl", data)
    sizes["extra.jsonl"] = len(data)
    total_bytes = sum(sizes.values())
    out = run("ls", s3_store.url("d"), *options(s3))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].split() == ["path", "format", "bytes", "rows"]
    # One line per shard, sorted by URL: format, bytes as listed, rows from the footer.
    assert [line.split() for line in lines[1:-1]] == [
        [s3_store.url("d", "extra.jsonl"), "jsonl", f"{sizes['extra.jsonl']:,}", "?"],
        [s3_store.url("d", "part-0.parquet"), "parquet", f"{sizes['part-0.parquet']:,}", "100"],
        [s3_store.url("d", "part-1.parquet"), "parquet", f"{sizes['part-1.parquet']:,}", "200"],
        [s3_store.url("d", "part-2.parquet"), "parquet", f"{sizes['part-2.parquet']:,}", "300"],
    ]
    assert lines[-1] == (
        f"4 shards, 600 rows, {total_bytes} bytes (+1 shards not counted; --count reads them)"
    )
    counted = run("ls", s3_store.url("d"), "--count", *options(s3))
    assert counted.returncode == 0, counted.stderr
    counted_lines = counted.stdout.strip().splitlines()
    assert counted_lines[1].split()[-1] == "7"  # extra.jsonl, read to count its rows
    assert counted_lines[-1] == f"4 shards, 607 rows, {total_bytes} bytes"
    assert s3.secret not in out.stdout + out.stderr + counted.stdout + counted.stderr


def test_ls_json_is_one_object_per_shard_and_nothing_on_stderr(local: Store) -> None:
    """For scripts: `ingest ls --json` writes a JSON object per shard (rows null when not
    counted), and no progress bar on a stderr that is not a terminal."""
    a, b = encode(make_table(0, 100), "parquet"), encode(make_table(0, 7), "jsonl")
    local.write("d/a.parquet", a)
    local.write("d/b.jsonl", b)
    out = run("ls", local.url("d"), "--json")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"url": local.url("d", "a.parquet"), "format": "parquet", "bytes": len(a), "rows": 100},
        {"url": local.url("d", "b.jsonl"), "format": "jsonl", "bytes": len(b), "rows": None},
    ]
    counted = run("ls", local.url("d"), "--json", "--count")
    assert [json.loads(line)["rows"] for line in counted.stdout.splitlines()] == [100, 7]


def test_ls_and_index_read_csv_and_json_as_the_stream_does(local: Store, tmp_path: object) -> None:
    """`--delimiter ';'` reads as ReadOptions(delimiter=';') does: `ls --count` counts the
    records its quotes make, `index` keeps the count under the stream's format (csv[;]),
    which a stream with that delimiter then plans from."""
    local.write("c/a.csv", b'a;b\n1;"x\ny"\n2;z\n')
    assert counted(local.url("c"), "--delimiter", ";") == [("csv[;]", 2)]
    assert counted(local.url("c")) == [("csv", 3)]
    index = run("index", local.url("c"), "--index-dir", f"{tmp_path}/i", "--delimiter", ";")
    assert index.returncode == 0, index.stderr
    # Without a header line, every record is a row: `--column-names` names the columns.
    local.write("n/a.tsv", b"1\tx\n2\ty\n3\tz\n")
    assert counted(local.url("n"), "--column-names", "id,text") == [("tsv[\t no header]", 3)]
    assert counted(local.url("n")) == [("tsv", 2)]
    # A JSON document's rows under a key: `--field data`.
    local.write("j/a.json", json.dumps({"v": 1, "data": [{"id": 1}, {"id": 2}]}).encode())
    assert counted(local.url("j"), "--field", "data") == [("jsonl[field=data]", 2)]


def counted(*args: str) -> list[tuple[str, int]]:
    """``ingest ls --json --count`` of ``args``: each shard's format and rows."""
    out = run("ls", *args, "--json", "--count")
    assert out.returncode == 0, out.stderr
    return [(r["format"], r["rows"]) for r in map(json.loads, out.stdout.splitlines())]


def test_ls_bad_input_exits_2_with_one_line(local: Store) -> None:
    out = run("ls", local.url("missing", "*.parquet"))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("ingest ls: error: ")
    local.write("d/a.parquet", b"garbage")
    out = run("ls", local.url("d"))
    assert out.returncode == 2
    assert "a.parquet at byte 0: is not a Parquet file" in out.stderr


def test_ls_count_on_tar_shards(local: Store) -> None:
    """Issue 8: `ingest ls --count` on any .tar ended in an AssertionError traceback."""
    local.write("w/a.tar", encode(make_table(0, 37), "tar"))
    local.write("w/b.tar", encode(make_table(37, 5), "tar"))
    out = run("ls", local.url("w"), "--count")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[-1] for line in lines[1:3]] == ["37", "5"]
    assert lines[-1].startswith("2 shards, 42 rows, ")


def test_a_warning_is_one_line_naming_the_command(local: Store) -> None:
    # Found by a probe: a warning came as Python prints it, with the library's source line
    # ("/.../ingest/tools/cli.py:414: IncidentalFilesWarning: ... listing = catalog.scan(").
    local.write("d/a.parquet", encode(make_table(0, 10), "parquet"))
    local.write("d/README.txt", b"about the data\n")
    out = run("ls", local.url("d"))
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ingest ls: warning: "), out.stderr
    assert "README.txt" in lines[0] and ".py:" not in out.stderr, out.stderr


def test_the_help_describes_the_commands_for_a_user() -> None:
    top = run("--help")
    assert top.returncode == 0
    assert "Thin" not in top.stdout and "calls the library" not in top.stdout, top.stdout
    assert "ingest ls" not in top.stdout.splitlines()[2], top.stdout  # a sentence, not usage
    ls = run("ls", "--help")
    head = ls.stdout.split("positional arguments:")[0]
    assert "row" in head.split("\n\n", 1)[1], ls.stdout  # a description under the usage


def test_prepare_with_a_transform_that_is_no_stage_names_the_fix(tmp_path: object) -> None:
    got = run("prepare", str(tmp_path), "--transform", "os:path", "--derived", str(tmp_path))
    assert got.returncode == 2
    said = got.stderr.strip()
    assert "'os:path' is a module, not a stage" in said, said
    assert "pass MODULE:NAME" in said and "Traceback" not in said, said


def test_skip_on_a_folder_with_no_state_names_the_path_and_the_fix(tmp_path: object) -> None:
    got = run("skip", str(tmp_path), "--rows", "file:///x.jsonl:0-1", "--out", f"{tmp_path}/o")
    assert got.returncode == 2
    said = got.stderr.strip()
    assert f"{tmp_path}/ingest_stream_state.json" in said, said
    assert "pass the state file" in said and "checkpoint folder" in said, said


def test_skip_rows_past_the_end_of_a_json_lines_shard_count_no_row_it_lacks(
    tmp_path: object,
) -> None:
    import ingest

    root = f"{tmp_path}/d"
    os.makedirs(root)
    with open(f"{root}/s0.jsonl", "w") as f:
        f.writelines(json.dumps({"id": i}) + "\n" for i in range(10))
    stream = ingest.Stream(root, batch_size=4)
    next(iter(stream))
    with open(f"{tmp_path}/state.json", "w") as f:
        json.dump(stream.state_dict(), f)
    stream.close()
    url = f"file://{root}/s0.jsonl"
    out = f"{tmp_path}/out.json"
    got = run("skip", f"{tmp_path}/state.json", "--rows", f"{url}:2-900", "--out", out)
    assert got.returncode == 0, got.stderr
    (line,) = [x for x in got.stdout.splitlines() if "left out" in x]
    assert line.endswith(": 0 rows left out") and "not counted" in line, line
