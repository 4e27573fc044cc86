"""Forwarding HTTP to one upstream on 127.0.0.1: what the loopback proxies share.

The bench's counting proxy (:mod:`ingest.tools.bench.proxy`) and the fault-injecting proxy
(:class:`ingest.tools.loopback.FaultProxy`) both stand between an S3 client and the loopback
S3 server. :class:`ForwardingServer` binds 127.0.0.1 and knows the upstream;
:class:`ForwardingHandler` reads a request, sends it upstream on a keep-alive connection of
its own and answers with the upstream's response. Each proxy subclasses the handler and
says in :meth:`ForwardingHandler.forward` what it does around that (count, misbehave).
"""

from __future__ import annotations

import http.client
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te"}
    | {"trailer", "transfer-encoding", "upgrade", "expect", "content-length"}
)
"""Headers that belong to one connection (and ``Content-Length``, which the sender sets
from the body it sends): never passed on."""

UPSTREAM_TIMEOUT_S = 120.0
"""Longest wait for the upstream's answer."""


def parse_upstream(upstream: str) -> tuple[str, int]:
    """The host and port of ``upstream``, ``http://HOST:PORT``.

    Raises:
        ValueError: If ``upstream`` is not of that form.
    """
    parsed = urllib.parse.urlsplit(upstream)
    if parsed.scheme != "http" or parsed.hostname is None or parsed.port is None:
        raise ValueError(f"upstream={upstream!r} must be http://HOST:PORT")
    return parsed.hostname, parsed.port


class ForwardingServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 whose handlers forward to ``upstream``.

    Args:
        port: Port to bind; 0 picks a free one.
        upstream: Where requests go, ``http://HOST:PORT``.
        handler: The proxy's handler class.

    Raises:
        ValueError: If ``upstream`` is not ``http://HOST:PORT``.
    """

    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 dropped connections a store would take

    def __init__(self, port: int, upstream: str, handler: type[ForwardingHandler]) -> None:
        self.upstream = parse_upstream(upstream)
        super().__init__(("127.0.0.1", port), handler)


class ForwardingHandler(BaseHTTPRequestHandler):
    """Forwards each request of one client connection upstream; subclasses implement
    :meth:`forward` with :meth:`read_body`, :meth:`exchange`, :meth:`relay` and
    :meth:`answer`."""

    protocol_version = "HTTP/1.1"
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: object) -> None:
        """Silence the per-request log."""

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client left, or went quiet: end this one

    def finish(self) -> None:
        """The client left: close its upstream connection too."""
        try:
            super().finish()
        finally:
            self._close_upstream()

    def forward(self) -> None:
        """Answer the request in ``self`` (every method)."""
        raise NotImplementedError

    def _dispatch(self) -> None:
        self.forward()

    # http.server dispatches on these names.
    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _dispatch  # noqa: N815

    def read_body(self) -> bytes | None:
        """The request's body (by its ``Content-Length``), or None if it has none."""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def exchange(self, body: bytes | None) -> tuple[http.client.HTTPResponse, bytes]:
        """Send the request upstream, with ``body``, on this client's keep-alive connection;
        once more on a fresh one if the kept one was closed by the server. Returns the
        response and its whole body."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            return self._send_upstream(body, headers)
        except (http.client.HTTPException, ConnectionError):
            self._close_upstream()
            return self._send_upstream(body, headers)

    def response_headers(self, response: http.client.HTTPResponse) -> list[tuple[str, str]]:
        """The upstream's headers that are passed on (no ``Content-Length``)."""
        return [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]

    def relay(self, response: http.client.HTTPResponse, data: bytes) -> None:
        """Answer with the upstream's ``response``, ``data`` as its body (a ``HEAD``'s length
        is the upstream's; a 204 or 304 has none)."""
        headers = self.response_headers(response)
        if self.command == "HEAD":
            headers.append(("Content-Length", response.getheader("Content-Length") or "0"))
        elif response.status not in (204, 304):
            headers.append(("Content-Length", str(len(data))))
        self.answer(response.status, headers, data)

    def answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """Send ``status``, ``headers`` and ``body`` (no body for a ``HEAD``)."""
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _send_upstream(
        self, body: bytes | None, headers: dict[str, str]
    ) -> tuple[http.client.HTTPResponse, bytes]:
        if self._upstream is None:
            host, port = cast(ForwardingServer, self.server).upstream
            self._upstream = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_S)
        self._upstream.request(self.command, self.path, body=body, headers=headers)
        response = self._upstream.getresponse()
        return response, response.read()

    def _close_upstream(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None
