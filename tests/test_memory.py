"""Memory bounded in bytes (issue 17, finding 10): the shuffle window, the read-ahead and
the ready batches of a feed hold about ``shuffle_bytes`` + ``prefetch_bytes`` of large rows,
not 16,384 rows whatever their size; the window's rows are fixed when the epoch is planned,
so order, exactly-once and resume are those of a window of that many rows."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

import ingest
from ingest.engine.spec import StreamSpec
from ingest.testing import write_large_rows

SHARDS, ROWS, ROW_BYTES = 8, 16, 256 << 10
"""32 MiB of 256 KiB rows: small for a test, large next to the bounds below."""
WINDOW_BYTES, PREFETCH_BYTES, BATCH = 2 << 20, 1 << 20, 4
MIB = 1 << 20


@pytest.fixture(scope="module")
def large_rows(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("large-rows"))
    write_large_rows(root, SHARDS, ROWS, ROW_BYTES)
    return root


def bounded(url: str, **options: object) -> ingest.Stream:
    return ingest.Stream(
        url,
        batch_size=BATCH,
        shuffle_seed=3,
        shuffle_bytes=WINDOW_BYTES,
        read=ingest.ReadOptions(prefetch_bytes=PREFETCH_BYTES),
        **options,  # type: ignore[arg-type]
    )


PEAK = """
import json, sys
import pyarrow as pa
import ingest
from ingest.testing import write_large_rows
url, options, read = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
read_options = ingest.ReadOptions(**read)
stream = ingest.Stream(url, batch_size=4, shuffle_seed=3, read=read_options, **options)
ids = [i for batch in stream for i in batch["id"].tolist()]
print(json.dumps({"ids": ids, "arrow_peak": pa.default_memory_pool().max_memory(),
                  "stats": stream.stats}))
"""


def peak_of_an_epoch(url: str, options: dict[str, int], read: dict[str, int]) -> dict[str, Any]:
    """One epoch in a fresh process: every id, Arrow's peak allocation, the stats."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, url, json.dumps(options), json.dumps(read)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_window_of_large_rows_holds_about_shuffle_bytes(large_rows: str) -> None:
    """With rows-only bounds the window (16,384 rows) held the whole 32 MiB dataset, and its
    gather a second copy; with the byte bounds Arrow's peak stays near what they allow."""
    got = peak_of_an_epoch(
        large_rows, {"shuffle_bytes": WINDOW_BYTES}, {"prefetch_bytes": PREFETCH_BYTES}
    )
    assert sorted(got["ids"]) == list(range(SHARDS * ROWS))
    # The bounds, two batches (one being cut, one ready) and a record batch per lane (a
    # row group of 2 rows: one item is always read ahead, however large).
    allowed = WINDOW_BYTES + 2 * PREFETCH_BYTES + 2 * BATCH * ROW_BYTES + SHARDS * 2 * ROW_BYTES
    assert got["stats"]["peak_bytes_held"] <= allowed
    assert got["stats"]["peak_bytes_held"] >= WINDOW_BYTES // 2  # it counts what it holds
    # Arrow's own count, the readers' included: 8 lanes, each with a row group of 512 KiB
    # open (its column chunk as read, decompressed and decoded, and a piece in flight; a
    # local shard is read through pyarrow's own file, so the bytes as read are in Arrow's
    # memory, where an fsspec file's reads are Python bytes). A rows-only window held the
    # whole dataset (32 MiB) and a gathered copy: 96 MiB.
    readers = SHARDS * 4 * 2 * ROW_BYTES
    assert got["arrow_peak"] <= allowed + readers < SHARDS * ROWS * ROW_BYTES, got["arrow_peak"]


def test_the_window_in_rows_comes_from_the_listing_and_is_saved(large_rows: str) -> None:
    """The byte bound becomes rows when the epoch is planned (bytes per row from the
    Parquet footers), the same on every plan of the listing, and the state records it."""
    spec = StreamSpec(
        urls=(large_rows,), batch_size=BATCH, shuffle_seed=3, shuffle_bytes=WINDOW_BYTES
    )
    rows = WINDOW_BYTES // ROW_BYTES  # 8 (the footers say a bit over 256 KiB a row: 7)
    plan = spec.book(1).rank_plan(0, 0)
    assert plan.window is not None and rows - 1 <= plan.window <= rows
    assert spec.book(1).rank_plan(0, 0).window == plan.window
    stream = bounded(large_rows)
    next(iter(stream))
    assert stream.state_dict()["position"]["shuffle"]["window"] == plan.window
    unbounded = StreamSpec(urls=(large_rows,), batch_size=BATCH, shuffle_bytes=None)
    assert unbounded.book(1).rank_plan(0, 0).window == unbounded.shuffle_window


@pytest.mark.parametrize("stop_after", [1, 3, 9])
def test_resume_at_k_with_the_byte_bound_equals_the_uninterrupted_tail(
    large_rows: str, stop_after: int
) -> None:
    full = [b["id"].tolist() for b in bounded(large_rows, columns=["id", "data"])]
    first = bounded(large_rows, columns=["id", "data"])
    head = [b["id"].tolist() for _, b in zip(range(stop_after), first, strict=False)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = bounded(large_rows, columns=["id", "data"])
    second.load_state_dict(state)
    rest = [b["id"].tolist() for b in second]
    assert head == full[:stop_after]
    assert rest == full[stop_after:]
    ids = [i for b in head + rest for i in b]
    assert len(ids) == len(set(ids)) == SHARDS * ROWS


def test_a_state_saved_with_another_byte_bound_resumes_exactly_once(large_rows: str) -> None:
    """Another ``shuffle_bytes`` is another window: the rest of the epoch is shared anew
    (as after a change of world size), every row still once."""
    first = bounded(large_rows)
    head = [b["id"].tolist() for _, b in zip(range(5), first, strict=False)]
    state = first.state_dict()
    first.close()
    other = ingest.Stream(
        large_rows, batch_size=BATCH, shuffle_seed=3, shuffle_bytes=4 * WINDOW_BYTES
    )
    other.load_state_dict(state)
    rest = [b["id"].tolist() for b in other]
    ids = [i for b in head + rest for i in b]
    assert len(ids) == len(set(ids)) == SHARDS * ROWS


def test_stats_report_the_bytes_held(large_rows: str) -> None:
    stream = bounded(large_rows)
    before = stream.stats
    assert before["bytes_held"] == before["peak_bytes_held"] == 0
    it = iter(stream)
    next(it)
    during = stream.stats
    assert 0 < during["bytes_held"] <= during["peak_bytes_held"]
    for _ in it:
        pass
    assert stream.stats["bytes_held"] == 0
