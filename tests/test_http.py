"""https:// and http:// shards against a static-file server on 127.0.0.1 with range reads
(ingest.tools.loopback.http): a list of URLs or an index file naming them, every row once
through a stop and a resume, footers once, the Ray pool; requests counted at the server."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import re
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
import ray

import ingest
import ingest.storage.sources.files
from ingest.core.errors import ConfigError, SourceError, StoreError
from ingest.storage.sources import RangeIgnoredWarning
from ingest.testing import FaultProxy, Faults, write_dataset
from ingest.tools.loopback.http import LoopbackHTTP

SHARDS, ROWS, BATCH = 4, 250, 50


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopbackHTTP, list[str]]]:
    root = tmp_path_factory.mktemp("web")
    paths = write_dataset(
        fsspec.filesystem("file"), str(root / "data"), "parquet", SHARDS, ROWS, row_group_rows=50
    )
    names = [Path(p).name for p in paths]
    (root / "data" / "index.txt").write_text(
        "# the shards of the dataset\n"
        + "\n".join(names[:2])
        + "\n\n"
        + "\n".join(names[2:])
        + "\n"
    )
    with LoopbackHTTP(root) as server:
        yield server, [server.url(f"data/{n}") for n in names]


def ids(batches: Any) -> Counter[int]:
    return Counter(i for b in batches for i in b["id"].tolist())


def test_every_row_once_through_a_stop_and_a_resume_and_footers_once(
    web: tuple[LoopbackHTTP, list[str]],
) -> None:
    server, urls = web
    before = server.requests()
    stream = ingest.Stream(urls, columns=["id"], batch_size=BATCH, shuffle_seed=2)
    it = iter(stream)
    first = [next(it) for _ in range(9)]
    state = json.loads(json.dumps(stream.state_dict()))
    resumed = ingest.Stream(urls, columns=["id"], batch_size=BATCH, shuffle_seed=2)
    resumed.load_state_dict(state)
    assert ids(first) + ids(resumed) == Counter(range(SHARDS * ROWS))
    # A whole epoch: one HEAD per URL (its size and version), ranges for the data.
    one = ingest.Stream(urls, columns=["id"], batch_size=BATCH)
    start = server.requests()
    assert ids(one) == Counter(range(SHARDS * ROWS))
    mid = server.requests()
    assert ids(one) == Counter(range(SHARDS * ROWS))
    end = server.requests()

    def grew(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {k: b.get(k, 0) - a.get(k, 0) for k in b if b.get(k, 0) != a.get(k, 0)}

    # The footers were read by the first stream above and kept in the shard index: a new
    # stream reads data ranges only (it read each footer again: 2 ranges a shard).
    assert grew(start, mid) == {"HEAD": SHARDS, "GET range": SHARDS}, grew(start, mid)
    # Epoch 2 lists again (HEADs) but reads no footer: data ranges only.
    assert grew(mid, end) == {"HEAD": SHARDS, "GET range": SHARDS}, grew(mid, end)
    assert "GET" not in grew(before, end), "no whole-file GET: every read is a range"


def footer_reads(server: LoopbackHTTP, since: int = 0) -> int:
    """Range reads of a Parquet footer (the file's last bytes) since the ``since``-th range."""
    return sum(1 for _, _, stop, size in server.ranges()[since:] if stop == size)


def test_a_restarted_stream_reads_no_footer_of_a_shard_already_indexed(
    web: tuple[LoopbackHTTP, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job restarted from its checkpoint plans from the footers the shard index keeps
    (keyed by URL, size and version): only data ranges (7 restarts of a stream read every
    footer again, 11.3x the data of an epoch where small shards' footer reads are whole)."""
    server, urls = web
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # a shard index of this test's own

    def stream() -> ingest.Stream:
        return ingest.Stream(urls, columns=["id"], batch_size=BATCH, shuffle_seed=5)

    start = len(server.ranges())
    first = stream()
    it = iter(first)
    got = ids(next(it) for _ in range(3))
    state = json.loads(json.dumps(first.state_dict()))
    assert footer_reads(server, start) == SHARDS, "the first job reads each footer once"
    for _ in range(3):  # restarts, each from the last state
        at = len(server.ranges())
        resumed = stream()
        resumed.load_state_dict(state)
        it = iter(resumed)
        got += ids([next(it)])
        state = json.loads(json.dumps(resumed.state_dict()))
        assert footer_reads(server, at) == 0, server.ranges()[at:]
    last = stream()
    last.load_state_dict(state)
    assert got + ids(last) == Counter(range(SHARDS * ROWS))


def test_an_index_file_names_the_shards(web: tuple[LoopbackHTTP, list[str]]) -> None:
    server, urls = web
    assert ingest.urls_from(server.url("data/index.txt")) == urls
    stream = ingest.Stream(ingest.urls_from(server.url("data/index.txt")), batch_size=BATCH)
    assert ids(stream) == Counter(range(SHARDS * ROWS))
    with pytest.raises(SourceError, match=r"missing\.txt"):
        ingest.urls_from(server.url("data/missing.txt"))


def test_an_index_file_without_urls_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("# nothing yet\n\n")
    with pytest.raises(ConfigError, match="names no URL"):
        ingest.urls_from(str(tmp_path / "empty.txt"))


def test_an_index_over_http_names_no_other_scheme_unless_allowed(
    web: tuple[LoopbackHTTP, list[str]], tmp_path: Path
) -> None:
    """A remote index must not reach the local disk (or another store): a line of another
    scheme than the index's own is refused, naming the index, the line and the fix; the
    user allows other schemes by name."""
    server, urls = web
    secret = tmp_path / "secret.parquet"
    secret.write_bytes(b"PAR1 local data PAR1")
    root = server.root / "data"
    for name, line in [
        ("local.txt", f"file://{secret}"),
        ("bare.txt", f"file:{secret}"),
        ("s3.txt", "s3://bucket/a.parquet"),
    ]:
        (root / name).write_text(f"{urls[0]}\n# a comment\n{line}\n")
        with pytest.raises(ConfigError) as err:
            ingest.urls_from(server.url(f"data/{name}"))
        message = str(err.value)
        assert f"data/{name}" in message and "line 3" in message, message
        assert "schemes=" in message, message
    (root / "mixed.txt").write_text(f"{urls[0]}\nhttps://example.invalid/b.parquet\n")
    with pytest.raises(ConfigError, match="https"):
        ingest.urls_from(server.url("data/mixed.txt"))
    got = ingest.urls_from(server.url("data/local.txt"), schemes=("http", "file"))
    assert got == [urls[0], f"file://{secret}"]
    # A local index keeps local paths, relative or absolute.
    (tmp_path / "index.txt").write_text("a.parquet\n/data/b.parquet\n")
    assert ingest.urls_from(str(tmp_path / "index.txt")) == [
        str(tmp_path / "a.parquet"),
        "/data/b.parquet",
    ]
    with pytest.raises(ConfigError, match="schemes"):
        ingest.urls_from(server.url("data/index.txt"), schemes=("ftp:",))


def test_an_index_that_is_not_utf8_names_the_file_and_the_byte(
    web: tuple[LoopbackHTTP, list[str]],
) -> None:
    server, urls = web
    root = server.root / "data"
    head = f"{urls[0]}\n".encode()
    (root / "latin1.txt").write_bytes(head + b"caf\xe9.parquet\n")
    with pytest.raises(ConfigError) as err:
        ingest.urls_from(server.url("data/latin1.txt"))
    message = str(err.value)
    assert "latin1.txt" in message and f"byte {len(head) + 3}" in message, message
    assert "UTF-8" in message, message


@pytest.fixture
def no_ranges(tmp_path: Path) -> Iterator[tuple[LoopbackHTTP, list[str]]]:
    """A server that ignores Range: every GET is answered 200 with the whole file."""
    paths = write_dataset(
        fsspec.filesystem("file"), str(tmp_path / "data"), "parquet", 2, ROWS, row_group_rows=50
    )
    with LoopbackHTTP(tmp_path, ranges=False) as server:
        yield server, [server.url(f"data/{Path(p).name}") for p in paths]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_server_that_says_no_size_is_refused_naming_it(tmp_path: Path, fmt: str) -> None:
    """A server that sends no ``Content-Length`` (one that compresses or streams its
    answers): fsspec says no size, and the listing took it for 0 bytes, so a JSONL shard
    was read as empty (its rows left out, silently) and a Parquet one as 'empty: not a
    parquet file'."""
    paths = write_dataset(fsspec.filesystem("file"), str(tmp_path / "data"), fmt, 2, ROWS)
    with LoopbackHTTP(tmp_path, sizes=False) as server:
        urls = [server.url(f"data/{Path(p).name}") for p in paths]
        with pytest.raises(ingest.SourceError, match=r"/data/.*: the server says no size"):
            list(ingest.Stream(urls, batch_size=BATCH))


def test_a_small_shard_from_a_server_that_ignores_range_is_sliced_from_the_whole_body(
    no_ranges: tuple[LoopbackHTTP, list[str]],
) -> None:
    """Under a few MiB, the range is taken from the whole body the server sent, at once:
    every row, no retry (it was retried for the whole deadline, then called short)."""
    server, urls = no_ranges
    with pytest.warns(RangeIgnoredWarning, match=re.escape(server.endpoint)):
        stream = ingest.Stream(urls, columns=["id"], batch_size=BATCH, shuffle_seed=1)
        assert ids(stream) == Counter(range(2 * ROWS))
    assert stream.stats["retries"] == 0, stream.stats
    assert server.requests().get("GET range ignored", 0) >= 2, server.requests()


def test_a_footer_read_past_the_start_from_a_server_that_ignores_range_is_read_whole(
    tmp_path: Path,
) -> None:
    """A shard over 64 KiB: its footer is read from past its start (fsspec's file raises
    "doesn't appear to support range requests"): it too is read from the whole body."""
    rows = 3000
    paths = write_dataset(
        fsspec.filesystem("file"), str(tmp_path / "data"), "parquet", 1, rows, row_group_rows=500
    )
    assert Path(paths[0]).stat().st_size > 64 << 10
    with LoopbackHTTP(tmp_path, ranges=False) as server:
        with pytest.warns(RangeIgnoredWarning, match="ignored the Range header"):
            stream = ingest.Stream(
                [server.url(f"data/{Path(paths[0]).name}")], columns=["id"], batch_size=BATCH
            )
            assert ids(stream) == Counter(range(rows))
        assert stream.stats["retries"] == 0, stream.stats


def test_a_large_shard_from_a_server_that_ignores_range_fails_at_once_naming_it(
    no_ranges: tuple[LoopbackHTTP, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, urls = no_ranges
    monkeypatch.setattr(ingest.storage.sources.files, "WHOLE_BODY_BYTES", 1000)
    started = time.monotonic()
    with pytest.raises(StoreError) as err:
        list(ingest.Stream(urls, columns=["id"], batch_size=BATCH))
    assert time.monotonic() - started < 15, "not retried for the deadline (20 s)"
    message = str(err.value)
    assert "retries" not in message, message
    assert "ignored the Range header" in message and server.endpoint in message, message
    assert any(u.rsplit("/", 1)[1] in message for u in urls), message
    assert "range requests" in message, message


@pytest.mark.usefixtures("ray_session")
def test_the_reader_pool_reads_http_exactly_once(web: tuple[LoopbackHTTP, list[str]]) -> None:
    _, urls = web

    @ray.remote(num_cpus=0)
    def consume(it: Any) -> list[int]:
        return [i for batch in it for i in batch["id"].tolist()]

    with ingest.RayStream(urls, columns=["id"], batch_size=BATCH, world_size=2) as stream:
        got = ray.get([consume.remote(stream.rank_iterator(r)) for r in range(2)], timeout=120)
    assert Counter(got[0] + got[1]) == Counter(range(SHARDS * ROWS))


def test_the_shard_cache_fetches_each_shard_once_and_serves_the_second_epoch(
    web: tuple[LoopbackHTTP, list[str]], tmp_path: Path
) -> None:
    server, urls = web
    cache = ingest.CacheOptions(str(tmp_path / "cache"), 1 << 30)
    stream = ingest.Stream(
        urls, columns=["id"], batch_size=BATCH, read=ingest.ReadOptions(cache=cache)
    )
    start = server.requests()
    assert ids(stream) == Counter(range(SHARDS * ROWS))
    mid, after_one = server.requests(), dict(stream.stats)
    assert ids(stream) == Counter(range(SHARDS * ROWS))
    end = server.requests()
    assert after_one["cache_misses"] == SHARDS, after_one
    assert stream.stats["cache_hits"] == SHARDS, stream.stats
    assert stream.stats["bytes_read"] == after_one["bytes_read"], "epoch 2: no byte from the store"
    # Epoch 2 asks the server for its listing (a HEAD per URL) and nothing else.
    assert {k: end[k] - mid.get(k, 0) for k in end if end[k] != mid.get(k, 0)} == {"HEAD": SHARDS}
    assert sum(mid.values()) > sum(start.values())


@pytest.mark.parametrize("where", ["reads", "listing"])
def test_throttling_answers_are_retried_and_every_row_arrives_once(
    web: tuple[LoopbackHTTP, list[str]], where: str
) -> None:
    """A proxy answers 429 (Retry-After: 0) to some requests, 3 times at most: of the reads
    (footers and data: each read again by this project's retry policy), or of the listing's
    HEADs (asked again by fsspec with a GET, the rest by the retry policy: fsspec reported a
    throttled info as a FileNotFoundError, and the listing failed with "not found"; a 429's
    cause now marks it transient). Every row arrives once either way.

    The proxy draws a request's fault in the order requests reach it, and the listing's
    HEADs and the reads after them go out side by side: with both kinds throttled at once,
    which kind got the 3 faults changed from run to run (a run of `make test` had all 3 on
    HEADs, so no retry of ours), so each case throttles one kind."""
    server, urls = web
    reads = where == "reads"
    faults = Faults(
        throttle=0.2 if reads else 0.5,
        retry_after_s=0,
        limit=3,
        seed=4,
        methods=("GET",) if reads else ("HEAD",),
        ranges_only=reads,
    )
    with FaultProxy(server.endpoint, faults) as proxy:
        through = [u.replace(server.endpoint, proxy.endpoint) for u in urls]
        stream = ingest.Stream(through, columns=["id"], batch_size=BATCH)
        got = ids(stream)
        counts = proxy.counts()
    assert got == Counter(range(SHARDS * ROWS))
    if reads:
        assert counts["throttle"] == 3, counts
        assert stream.stats["retries"] == 3, (stream.stats, counts)
    else:
        assert counts["throttle"] >= 1, counts
        assert stream.stats["retries"] <= counts["throttle"], (stream.stats, counts)


def test_a_throttled_info_reported_as_not_found_is_transient() -> None:
    """fsspec's HTTP info raises FileNotFoundError for any failed HEAD and GET; the
    response's status, kept as its cause, says whether the file is gone or the server busy."""
    import aiohttp

    from ingest.storage.sources.faults import is_not_found, is_transient

    def reported(status: int) -> FileNotFoundError:
        try:
            try:
                raise aiohttp.ClientResponseError(None, (), status=status)  # type: ignore[arg-type]
            except aiohttp.ClientResponseError as cause:
                raise FileNotFoundError("http://127.0.0.1/x.parquet") from cause
        except FileNotFoundError as e:
            return e

    for status in (429, 503, 500):
        assert is_transient(reported(status)) and not is_not_found(reported(status)), status
    assert not is_transient(reported(404)) and is_not_found(reported(404))
    assert not is_transient(FileNotFoundError("x")) and is_not_found(FileNotFoundError("x"))


SECRET = "Bearer s3cr3t-http-t0ken"


def test_a_header_credential_reaches_no_state_error_or_log(
    web: tuple[LoopbackHTTP, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """A token sent as a header (fsspec's ``headers`` option) is used and never kept or
    shown: not in the state, not in the error for a URL that is not there."""
    server, urls = web
    options = {"headers": {"Authorization": SECRET}}
    caplog.set_level("DEBUG")
    stream = ingest.Stream(urls, columns=["id"], batch_size=BATCH, storage_options=options)
    assert ids(stream) == Counter(range(SHARDS * ROWS))
    assert SECRET not in json.dumps(stream.state_dict())
    assert server.headers_seen("Authorization") == {SECRET}
    missing = server.url("data/missing.parquet")
    with pytest.raises(SourceError) as err:
        list(ingest.Stream([missing], batch_size=BATCH, storage_options=options))
    assert "missing.parquet" in str(err.value)
    assert SECRET not in str(err.value) and "s3cr3t" not in str(err.value)
    assert "s3cr3t" not in caplog.text
    # Were a message to quote it, a source scrubs a header's value.
    source = ingest.Source(urls, storage_options=options)
    assert source.scrub(f"sent {SECRET} to the server") == "sent *** to the server"


class _Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every request ``status`` (401 or 403); with ``head_ok``, a HEAD is answered
    200 first (a signed URL that expired between the listing and the read)."""

    status = 403
    head_ok = False
    size = 5000

    def do_HEAD(self) -> None:
        if self.head_ok:
            self.send_response(200)
            self.send_header("Content-Length", str(self.size))
            self.send_header("ETag", '"v1"')
        else:
            self.send_response(self.status)
            self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", "9")
        self.end_headers()
        self.wfile.write(b"forbidden")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("status", "head_ok"), [(403, False), (401, False), (403, True)])
def test_a_server_that_refuses_access_is_named_as_such_not_as_missing(
    status: int, head_ok: bool
) -> None:
    """A 401 or 403 was reported as 'not found' at listing ("check the bucket and path"); at
    a read (a signed URL that expired after the listing), as a store fault. It names the
    status, says it is not retried, and where credentials go."""
    handler = type("Handler", (_Refusing,), {"status": status, "head_ok": head_ok})
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/a.parquet"
        start = time.monotonic()
        with pytest.raises(ingest.IngestError) as err:
            next(iter(ingest.Stream(url, batch_size=BATCH)))
        server.shutdown()
    message = str(err.value)
    assert f"HTTP {status}" in message and "a.parquet" in message, message
    assert "not found" not in message, message
    assert "headers" in message and "signed URL" in message, message
    assert time.monotonic() - start < 20


class _Answering(http.server.BaseHTTPRequestHandler):
    """Answers every request ``status``: 503 (busy), or 302 back to its own path (a loop)."""

    status = 503

    def do_HEAD(self) -> None:
        self.send_response(self.status)
        if self.status == 302:
            self.send_header("Location", self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.do_HEAD()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "told"),
    [
        (503, r"kept answering HTTP 503 .*busy.*RetryPolicy\(deadline_s="),
        (429, r"kept answering HTTP 429 .*busy.*RetryPolicy\(deadline_s="),
        (302, r"redirects in a loop.*check the URL"),
    ],
)
def test_a_server_that_is_always_busy_or_redirects_in_a_loop_is_named_as_such(
    status: int, told: str
) -> None:
    """Found by a probe: both were 'not found (...). check the bucket and path' (a
    NoShardsError), the answer only in the error's cause three levels down."""
    handler = type("Handler", (_Answering,), {"status": status})
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/a.parquet"
        read = ingest.ReadOptions(retry=ingest.RetryPolicy(deadline_s=1.0, backoff_s=0.1))
        with pytest.raises(ingest.IngestError, match=told) as err:
            next(iter(ingest.Stream(url, batch_size=BATCH, read=read)))
        server.shutdown()
    assert "not found" not in str(err.value) and not isinstance(err.value, ingest.NoShardsError)
    assert "a.parquet" in str(err.value)


class _IndexPages(http.server.SimpleHTTPRequestHandler):
    """Python's own file server: a folder's GET is an HTML page of links to its files."""

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("index_page", [False, True])
@pytest.mark.parametrize("path", ["data/*.parquet", "data/"])
def test_a_glob_or_a_folder_over_http_says_http_lists_nothing(
    tmp_path: Path, index_page: bool, path: str
) -> None:
    """Found by a probe: a glob or a folder URL over HTTP failed as 'not found: http://host
    does not exist. check the bucket and prefix' (the server was up), or, where the server
    serves an index page (fsspec reads its links), as 'the server says no size'."""
    write_dataset(fsspec.filesystem("file"), str(tmp_path / "data"), "parquet", 2, ROWS)
    handler = functools.partial(_IndexPages, directory=str(tmp_path))
    with contextlib.ExitStack() as stack:
        if index_page:
            server = stack.enter_context(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler))
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stack.callback(server.shutdown)
            endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        else:
            endpoint = stack.enter_context(LoopbackHTTP(tmp_path)).endpoint
        with pytest.raises(ingest.SourceError, match=r"HTTP.*lists no folder.*urls_from"):
            next(iter(ingest.Stream(f"{endpoint}/{path}", batch_size=BATCH)))
