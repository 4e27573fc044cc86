"""A store far away: the first batch and the requests, when every request waits.

Object stores answer in tens of milliseconds (a first byte from S3 in the same region: 20-
60 ms; across regions, or the Hub over the internet, more), so whatever a stream asks one
request after another shows as that many round trips before the first batch. On this
machine the loopback S3 server answers in a millisecond or two; here every request goes
through ``ingest.testing.FaultProxy`` with ``latency_s`` (``--latency-ms``, default 50),
which holds it that long first.

For each format (``--formats``: Parquet, JSON Lines, gzipped JSON Lines, CSV, Arrow IPC
files and streams, WebDataset tar, text), ``--shards`` shards of ``--rows`` rows
(``ingest.testing.write_dataset``) in a directory: a new ``ingest.Stream`` (``shuffle_seed=0``,
batches of 64) to its first batch, and the requests the store answered for it, listing
included; the median of ``--repeat`` streams after one made first (the footers, the
connections: a job's later epochs and restarts, not its very first listing). Then the same
Parquet shards named as a list of URLs (``data_files=[...]``): the listing alone. And with
``--mix N`` (default 4; 0: none), the Parquet shards in ``N`` folders read as an
``ingest.Mix`` of ``N`` sources of equal weights, to its first batch, beside one source of
the same shards.

Prints a table and, with ``--json PATH``, the figures. No goal: it shows what the store's
latency costs (issue 32's peers keep shards on local disk). Before this script, on
2026-12-05 (50 ms, 32 shards of 200 rows, 16 lanes): Parquet 64 shards of 1,024 rows 1.18 s
to the first batch (a window's lanes opened one after another), Arrow IPC streams 4.2 s (417
requests: a request per read pyarrow made), CSV 0.87 s (66: the header read apart), a list
of 64 URLs listed in 3.7 s (a HEAD each, one after another); with botocore's 10 connections,
a feed's 16 lanes waited for one. A mixture of 4 sources took 1.9 s to its first batch
where one source took 0.45 (each source listed and read when first drawn).

    .venv/bin/python benchmarks/store_latency.py [--latency-ms 50] [--shards 32] [--rows 200]
        [--formats parquet,jsonl,...] [--mix 4] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import ingest
from ingest.testing import FaultProxy, Faults, LoopbackS3, write_dataset

FORMATS = ("parquet", "jsonl", "jsonl.gz", "csv", "arrow", "arrows", "tar", "txt")
BUCKET = "store-latency"


def first_batch(
    make: Callable[[], ingest.Stream], requests: Callable[[], int]
) -> tuple[float, int]:
    """Seconds from a new stream to its first batch, and the requests the store answered."""
    before = requests()
    start = time.perf_counter()
    stream = make()
    next(iter(stream))
    took = time.perf_counter() - start
    stream.close()
    return took, requests() - before


def listed(
    urls: list[str], options: dict[str, Any], requests: Callable[[], int]
) -> tuple[float, int]:
    """Seconds to list ``urls`` (a source of many URLs), and the requests it sent."""
    before = requests()
    start = time.perf_counter()
    listing = ingest.list_shards(urls, storage_options=options)
    took = time.perf_counter() - start
    assert len(listing.shards) == len(urls)
    return took, requests() - before


def median_of(repeat: int, run: Callable[[], tuple[float, int]]) -> dict[str, float]:
    """``run`` once unmeasured, then ``repeat`` times: the median seconds, the requests of
    the first measured run."""
    run()
    runs = [run() for _ in range(repeat)]
    return {"seconds": statistics.median(r[0] for r in runs), "requests": runs[0][1]}


def measure(args: argparse.Namespace, s3: LoopbackS3 | None = None) -> dict[str, Any]:
    """The figures, on ``s3`` (None: a loopback S3 server started here)."""
    if s3 is None:
        with LoopbackS3() as server:
            return measure(args, server)
    out: dict[str, Any] = {"latency_ms": args.latency_ms, "shards": args.shards, "rows": args.rows}
    s3.create_bucket(BUCKET)
    fs = s3.filesystem()
    for fmt in args.formats:
        write_dataset(fs, f"{BUCKET}/{fmt}", fmt, args.shards, args.rows)
    for k in range(args.mix):
        write_dataset(
            fs, f"{BUCKET}/mix/{k}", "parquet", max(1, args.shards // args.mix), args.rows
        )
    with FaultProxy(s3.endpoint, Faults(latency_s=args.latency_ms / 1000)) as proxy:
        options = s3.storage_options(endpoint=proxy.endpoint)

        def requests() -> int:
            return proxy.counts()["requests"]

        streams: dict[str, dict[str, float]] = {}
        for fmt in args.formats:

            def make(fmt: str = fmt) -> ingest.Stream:
                url = f"s3://{BUCKET}/{fmt}/"
                return ingest.Stream(url, batch_size=64, shuffle_seed=0, storage_options=options)

            streams[fmt] = median_of(args.repeat, lambda: first_batch(make, requests))
            _log(f"{fmt}: {streams[fmt]['seconds']:.2f} s, {streams[fmt]['requests']} requests")
        out["first_batch"] = streams
        if "parquet" in args.formats:
            urls = [f"s3://{path}" for path in sorted(fs.find(f"{BUCKET}/parquet"))]
            out["url_list"] = median_of(args.repeat, lambda: listed(urls, options, requests))
        if args.mix:
            out["mix"] = mixture(args.mix, options, args.repeat, requests)
        out["peak_in_flight"] = proxy.peak_in_flight()
    return out


def mixture(
    n: int, options: dict[str, Any], repeat: int, requests: Callable[[], int]
) -> dict[str, Any]:
    """The first batch of an ``ingest.Mix`` of the ``n`` folders of Parquet shards, and of
    the same shards read as one source."""
    sources = {f"s{k}": f"s3://{BUCKET}/mix/{k}/" for k in range(n)}

    def mixed() -> ingest.Stream:
        mix = ingest.Mix(sources)
        return ingest.Stream(mix, batch_size=64, shuffle_seed=0, storage_options=options)

    def one() -> ingest.Stream:
        url = f"s3://{BUCKET}/mix/"
        return ingest.Stream(url, batch_size=64, shuffle_seed=0, storage_options=options)

    many = median_of(repeat, lambda: first_batch(mixed, requests))
    single = median_of(repeat, lambda: first_batch(one, requests))
    _log(f"a mix of {n}: {many['seconds']:.2f} s, one source {single['seconds']:.2f} s")
    return {"sources": n, "mixed": many, "one": single}


def _log(message: str) -> None:
    print(f"  {message}", flush=True)


def report(out: dict[str, Any]) -> str:
    lines = [
        f"\nA store {out['latency_ms']} ms away (every request held that long): "
        f"{out['shards']} shards of {out['rows']} rows, a new Stream to its first batch "
        "(medians; requests of one, its listing included)",
        "| format | first batch | requests |",
        "|---|---|---|",
    ]
    for fmt, got in out["first_batch"].items():
        lines.append(f"| {fmt} | {got['seconds']:.2f} s | {got['requests']} |")
    if "url_list" in out:
        got = out["url_list"]
        lines.append(
            f"\nThe Parquet shards named as a list of {out['shards']} URLs, listed: "
            f"{got['seconds']:.2f} s, {got['requests']} requests"
        )
    if "mix" in out:
        got = out["mix"]
        lines.append(
            f"The Parquet shards in {got['sources']} folders, an ingest.Mix of "
            f"{got['sources']} sources: {got['mixed']['seconds']:.2f} s to the first batch "
            f"({got['mixed']['requests']} requests); read as one source: "
            f"{got['one']['seconds']:.2f} s ({got['one']['requests']})"
        )
    lines.append(f"Most requests in flight at once: {out['peak_in_flight']}")
    return "\n".join(lines)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--formats", type=lambda v: v.split(","), default=list(FORMATS))
    parser.add_argument("--mix", type=int, default=4, help="sources of the mixture (0: none)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.formats) - set(FORMATS))
    if unknown:
        parser.error(f"unknown formats {unknown}; these are measured: {', '.join(FORMATS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out = measure(args)
    print(report(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
