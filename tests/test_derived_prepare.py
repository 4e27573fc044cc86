"""Filling the derived cache ahead (issue 34, item 4): ``prepare`` (the function, and ``ingest
prepare`` in a subprocess, in threads or Ray tasks) writes exactly the copies a stream with the
same transform and ``derived=`` reads, so that stream runs no stage in a whole epoch and hands
out the batches it hands out without the cache; a second prepare writes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import ingest
from ingest.core.errors import ConfigError
from ingest.engine.derived import copies
from ingest.engine.derived.prepare import PrepareError, load_transform, prepare
from ingest.testing import LoopbackS3, Store, write_dataset
from tests.test_derived_stream import BATCH, EXPECTED, ROWS, SHARDS, Split, _calls, _epoch, _files

ROOT = Path(__file__).resolve().parents[1]
UNITS = {"parquet": SHARDS * ROWS // 16, "jsonl": SHARDS}
"""Units of the data: a row group of 16 rows, or a whole JSONL shard."""


def make_split() -> list[Any]:
    """A factory, as ``--transform tests.test_derived_prepare:make_split`` names it."""
    return [Split()]


def unversioned(table: pa.Table) -> pa.Table:
    """A transform of one argument (``--transform`` takes it as is) with no fingerprint."""
    return table


def _write(store: Store, format: str) -> str:
    extra = {"row_group_rows": 16} if format == "parquet" else {}
    write_dataset(store.fs, store.url("d"), format, SHARDS, ROWS, **extra)
    return store.url("d")


def _stream(url: str, derived: Any, options: dict[str, Any] | None = None) -> ingest.Stream:
    return ingest.Stream(
        url,
        columns=["id"],
        batch_size=BATCH,
        shuffle_seed=5,
        shuffle_window=40,
        shuffle_lanes=2,
        transform=Split(),
        derived=derived,
        storage_options=options,
    )


def _snapshot(copies: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in _files(copies)}


@pytest.mark.parametrize("format", ["parquet", "jsonl"])
def test_after_prepare_a_stream_runs_no_stage_and_a_second_prepare_writes_nothing(
    local: Store, tmp_path: Path, format: str
) -> None:
    data = _write(local, format)
    copies = tmp_path / "derived"
    report, ran = _calls(lambda: prepare(data, Split(), f"file://{copies}", columns=["id"]))
    units = UNITS[format]
    assert (report.units, report.derived, report.present, report.failed) == (units, units, 0, 0)
    assert ran == report.rows == SHARDS * ROWS, "each input row derived once, in whole units"
    assert len(_files(copies)) == units
    assert report.bytes_written == sum(p.stat().st_size for p in _files(copies))
    written = _snapshot(copies)
    got, ran = _calls(lambda: _epoch(_stream(data, f"file://{copies}")))
    assert ran == 0, "every unit the stream read came from its copy"
    assert got == _epoch(_stream(data, None)), "the batches of the stream without the cache"
    again, ran = _calls(lambda: prepare(data, Split(), f"file://{copies}", columns=["id"]))
    assert (again.derived, again.present, again.bytes_written, ran) == (0, units, 0, 0)
    assert _snapshot(copies) == written, "nothing written the second time, nor by the stream"


@pytest.mark.parametrize("where", ["local", "url"])
def test_a_second_prepare_reads_no_copy(
    local: Store, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun looks for each unit's copy and reads none (before, it read and checked every
    copy's bytes: a download of the whole cache from a shared URL)."""
    data = _write(local, "parquet")
    derived = (
        ingest.DerivedConfig(local=ingest.CacheOptions(str(tmp_path / "node"), max_bytes=1 << 30))
        if where == "local"
        else ingest.DerivedConfig(url=f"file://{tmp_path / 'shared'}")
    )
    prepare(data, Split(), derived, columns=["id"])
    read: list[str] = []
    for kind in (copies.LocalCopies, copies.SharedCopies):
        monkeypatch.setattr(kind, "read", lambda self, name: read.append(name))
    again = prepare(data, Split(), derived, columns=["id"])
    assert (again.derived, again.present) == (0, UNITS["parquet"])
    assert read == []


def test_prepared_jsonl_serves_a_stream_of_several_ranks(local: Store, tmp_path: Path) -> None:
    """JSONL shards have no row count: prepare keys each to its end, and a DataLoader of 2
    workers (2 ranks), which counts them and reads ``[0, rows)``, reads the same copies."""
    data = _write(local, "jsonl")
    copies = tmp_path / "derived"
    prepare(data, Split(), f"file://{copies}", columns=["id"])
    written = _snapshot(copies)
    loader = ingest.DataLoader(_stream(data, f"file://{copies}"), num_workers=2)
    got = Counter(o for b in loader for o in zip(b["id"].tolist(), b["k"].tolist(), strict=True))
    assert got == EXPECTED
    assert _snapshot(copies) == written, "every unit the workers read was a hit: none written"


def test_a_chain_without_a_fingerprint_is_refused_naming_the_fix(
    local: Store, tmp_path: Path
) -> None:
    data = _write(local, "parquet")

    def double(table: pa.Table) -> pa.Table:
        return table

    with pytest.raises(ConfigError, match=r"double has no fingerprint.*version="):
        prepare(data, double, f"file://{tmp_path / 'derived'}")
    assert not _files(tmp_path / "derived")


def test_a_unit_that_fails_raises_or_is_counted_and_left_to_the_stream(
    local: Store, tmp_path: Path
) -> None:
    data = _write(local, "parquet")
    copies = f"file://{tmp_path / 'derived'}"
    with pytest.raises(PrepareError, match=r"part-00001\.parquet rows \[0, 16\).*bad row 70"):
        prepare(data, Split(fail_on=70), copies, columns=["id"], deriver=_one_at_a_time())
    report = prepare(data, Split(fail_on=70), copies, columns=["id"], on_error="skip")
    assert (report.failed, report.derived + report.present) == (1, UNITS["parquet"] - 1)
    assert len(report.failures) == 1 and "part-00001.parquet rows [0, 16)" in report.failures[0]
    _, ran = _calls(lambda: _epoch(_stream(data, copies)))
    assert ran == 16, "the stream derives the failed unit alone"


def _one_at_a_time() -> Any:
    from ingest.engine.derived.units import local_deriver

    return local_deriver(1)


def test_load_transform_takes_a_factory_a_class_and_a_stage() -> None:
    made = load_transform("tests.test_derived_prepare:make_split")
    assert isinstance(made, list) and [type(s) for s in made] == [Split]
    assert load_transform("tests.test_derived_stream:Split") is Split
    with pytest.raises(ConfigError, match=r"must be MODULE:NAME"):
        load_transform("make_split")
    with pytest.raises(ConfigError, match=r"no_such_module.*does not import"):
        load_transform("no_such_module:x")
    with pytest.raises(ConfigError, match=r"has no 'nothing'"):
        load_transform("tests.test_derived_prepare:nothing")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.tools.cli", "prepare", *args],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        check=False,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


SUMMARY = re.compile(
    r"^(\d+) units: (\d+) derived \(([\d,]+) rows\), (\d+) already there, (\d+) failed; "
    r"([\d,]+) bytes written in [\d.]+ s$"
)


def _summary(out: subprocess.CompletedProcess[str]) -> tuple[int, ...]:
    assert out.returncode == 0, out.stderr
    found = SUMMARY.match(out.stdout.splitlines()[-1])
    assert found, out.stdout
    return tuple(int(g.replace(",", "")) for g in found.groups())


def test_cli_prepares_on_loopback_s3(s3: LoopbackS3, s3_store: Store) -> None:
    data = _write(s3_store, "parquet")
    derived = s3_store.url("derived")
    options = ["-o", f"key={s3.key}", "-o", f"secret={s3.secret}"]
    options += ["-o", f"client_kwargs.endpoint_url={s3.endpoint}"]
    argv = [data, *options, "--columns", "id", "--derived", derived]
    argv += ["--transform", "tests.test_derived_prepare:make_split"]
    units, derived_now, rows, there, failed, nbytes = _summary(run_cli(*argv))
    assert (units, derived_now, rows, there, failed) == (16, 16, SHARDS * ROWS, 0, 0)
    assert nbytes == sum(s3_store.fs.du(derived.removeprefix("s3://"), total=False).values())
    config = ingest.DerivedConfig(url=derived, storage_options=s3_store.storage_options)
    got, ran = _calls(lambda: _epoch(_stream(data, config, s3_store.storage_options)))
    assert ran == 0
    assert got == _epoch(_stream(data, None, s3_store.storage_options))
    assert _summary(run_cli(*argv))[:6] == (16, 0, 0, 16, 0, 0)


def test_cli_refuses_a_chain_without_a_fingerprint(local: Store, tmp_path: Path) -> None:
    data = _write(local, "parquet")
    argv = [data, "--derived", str(tmp_path / "derived")]
    out = run_cli(*argv, "--transform", "tests.test_derived_prepare:unversioned")
    assert out.returncode == 2
    assert re.search(
        r"^ingest prepare: error: .*unversioned has no fingerprint.*version=", out.stderr
    )
    assert not _files(tmp_path / "derived")


def test_cli_with_ray_derives_in_tasks_of_the_cluster(
    ray_session: None, local: Store, tmp_path: Path
) -> None:
    import ray

    data = _write(local, "parquet")
    copies = tmp_path / "derived"
    argv = [data, "--columns", "id", "--derived", str(copies), "--ray", "--workers", "2"]
    argv += ["--transform", "tests.test_derived_prepare:make_split"]
    address = ray.get_runtime_context().gcs_address
    out = run_cli(*argv, env={"RAY_ADDRESS": address})
    assert _summary(out)[:5] == (16, 16, SHARDS * ROWS, 0, 0)
    got, ran = _calls(lambda: _epoch(_stream(data, str(copies))))
    assert ran == 0
    assert got == _epoch(_stream(data, None))


def test_ray_deriver_refuses_a_node_directory(
    ray_session: None, local: Store, tmp_path: Path
) -> None:
    from ingest.distributed.prepare_tasks import ray_deriver

    data = _write(local, "parquet")
    config = ingest.DerivedConfig(local=ingest.CacheOptions(str(tmp_path / "node"), 1 << 30))
    with pytest.raises(ConfigError, match=r"each task would fill the directory.*url="):
        prepare(data, Split(), config, deriver=ray_deriver())
