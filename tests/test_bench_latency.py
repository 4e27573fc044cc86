"""``benchmarks/store_latency.py`` at a smoke size, on the session's loopback S3: every
format's first batch is measured, and the requests a stream sends are one a shard (with its
listing's), whatever the format's reader asks pyarrow to read: the figures the benchmark
prints of a store far away (each request a round trip) stay those of a few requests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ingest.testing import LoopbackS3

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "store_latency.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("store_latency", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_format_reads_a_shard_in_a_request(s3: LoopbackS3) -> None:
    bench = _script()
    shards = 3
    args = bench.parse(
        ["--latency-ms", "5", "--shards", str(shards), "--rows", "40", "--repeat", "1"]
    )
    out = bench.measure(args, s3)
    assert set(out["first_batch"]) == set(bench.FORMATS)
    for fmt, got in out["first_batch"].items():
        assert got["seconds"] > 0.005, fmt  # at least a round trip
        # A listing, the first shard's first block where the schema is inferred (JSON
        # Lines, CSV, tar), and a request a shard
        most = 2 + shards
        assert got["requests"] <= most, (fmt, got["requests"])
    assert out["url_list"]["requests"] <= 2 * shards  # a HEAD and a footer a URL
    # A mixture of 4 sources of a shard each: a listing and a shard each
    assert out["mix"]["mixed"]["requests"] <= 2 * 4, out["mix"]
    report = bench.report(out)
    assert "| parquet |" in report and "an ingest.Mix of 4 sources" in report
