"""The loopback proxies forward alike (:mod:`ingest.tools.forward`): the bench's counting
proxy and the fault proxy with no faults, in front of a small upstream on 127.0.0.1."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ingest.testing import FaultProxy
from ingest.tools.bench.proxy import Counters, CountingProxy

DATA = b"hello, proxy"


class _Upstream(BaseHTTPRequestHandler):
    """``/data``: DATA; ``/empty``: 204; ``/echo``: the length of the body put; ``/quiet``:
    DATA, then the connection closed without saying so (a kept connection gone stale)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Silence the per-request log."""

    def _send(self, status: int, body: bytes, length: bool = True) -> None:
        self.send_response(status)
        if length:
            self.send_header("Content-Length", str(len(DATA if self.command == "HEAD" else body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/empty":
            self._send(204, b"", length=False)
        elif self.path == "/quiet":
            self._send(200, DATA)
            self.close_connection = True
        else:
            self._send(200, DATA)

    do_HEAD = do_GET  # noqa: N815

    def do_PUT(self) -> None:
        got = self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, str(len(got)).encode())


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(params=["counting", "fault"])
def proxy(request: pytest.FixtureRequest, upstream: str) -> Iterator[Any]:
    made = CountingProxy(upstream) if request.param == "counting" else FaultProxy(upstream)
    with made:
        yield made


def ask(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None
) -> tuple[int, str | None, bytes]:
    """Send one request on ``conn``: the status, the ``Content-Length`` and the body."""
    conn.request(method, path, body=body)
    response = conn.getresponse()
    return response.status, response.getheader("Content-Length"), response.read()


def test_a_proxy_forwards_bodies_heads_and_no_content_on_one_connection(proxy: Any) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        assert ask(conn, "GET", "/data") == (200, str(len(DATA)), DATA)
        assert ask(conn, "HEAD", "/data") == (200, str(len(DATA)), b"")
        assert ask(conn, "GET", "/empty") == (204, None, b"")
        assert ask(conn, "PUT", "/echo", b"x" * 1000) == (200, "4", b"1000")
        # The upstream closed its kept connection after /quiet: sent again on a fresh one.
        assert ask(conn, "GET", "/quiet") == (200, str(len(DATA)), DATA)
        assert ask(conn, "GET", "/data") == (200, str(len(DATA)), DATA)
    finally:
        conn.close()


def test_the_counting_proxy_counts_requests_and_body_bytes(upstream: str) -> None:
    with CountingProxy(upstream) as proxy:
        before = proxy.counters()
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        try:
            for method, path in [("GET", "/data"), ("HEAD", "/data"), ("GET", "/empty")]:
                ask(conn, method, path)
        finally:
            conn.close()
        assert proxy.counters() - before == Counters(requests=3, bytes_read=len(DATA))


def test_the_counting_proxy_counts_a_request_before_its_answer_leaves(
    upstream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that has its answer finds it counted: the bench reads the counters right
    after its last request (counted after the answer went, a loaded machine's counters
    missed it: 2 requests where 3 were sent)."""
    from ingest.tools.bench import proxy as proxy_module

    counted_at_answer: list[int] = []
    relay = proxy_module._Handler.relay

    def watched(self: Any, *args: Any) -> None:
        counted_at_answer.append(self._server().requests)
        relay(self, *args)

    monkeypatch.setattr(proxy_module._Handler, "relay", watched)
    server = proxy_module._Server(0, upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    try:
        for method, path in [("GET", "/data"), ("HEAD", "/data"), ("GET", "/empty")]:
            ask(conn, method, path)
    finally:
        conn.close()
        server.shutdown()
        server.server_close()
    assert counted_at_answer == [1, 2, 3]
    assert server.bytes_read == len(DATA)


@pytest.mark.parametrize("upstream", ["127.0.0.1:9", "https://127.0.0.1:9", "http://host"])
def test_an_upstream_that_is_not_an_http_endpoint_is_refused(upstream: str) -> None:
    with pytest.raises(ValueError, match=r"upstream='.*' must be http://HOST:PORT"):
        FaultProxy(upstream)
