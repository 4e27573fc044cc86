"""A counting HTTP proxy on 127.0.0.1 in front of the loopback S3 server.

Every contender reaches the store through this proxy, so requests and bytes are counted the
same way for all of them, whatever S3 client they use (s3fs, pyarrow's S3 filesystem).
It runs in its own process (``python -m ingest.tools.bench.proxy``) so that forwarding never
competes for the GIL of a process being measured. ``GET`` :data:`COUNTERS_PATH` returns the
counters as JSON (no S3 bucket can be named ``__ingest_bench__``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.request
from dataclasses import dataclass
from typing import cast

from ingest.tools.child import ChildServer
from ingest.tools.forward import ForwardingHandler, ForwardingServer

COUNTERS_PATH = "/__ingest_bench__/counters"


@dataclass(frozen=True, slots=True)
class Counters:
    """Requests the proxy forwarded and response body bytes it returned to clients."""

    requests: int = 0
    bytes_read: int = 0

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.requests - other.requests, self.bytes_read - other.bytes_read)


class _Server(ForwardingServer):
    def __init__(self, port: int, upstream: str) -> None:
        super().__init__(port, upstream, _Handler)
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes_read = 0

    def count(self, nbytes: int) -> None:
        with self.lock:
            self.requests += 1
            self.bytes_read += nbytes


class _Handler(ForwardingHandler):
    def _server(self) -> _Server:
        return cast(_Server, self.server)

    def _counters(self) -> None:
        server = self._server()
        with server.lock:
            body = json.dumps(
                {"requests": server.requests, "bytes_read": server.bytes_read}
            ).encode()
        self.answer(
            200, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], body
        )

    def forward(self) -> None:
        if self.path == COUNTERS_PATH:
            self._counters()
            return
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            message = b"the bench proxy forwards reads; send uploads to the S3 server itself"
            self.answer(501, [("Content-Length", str(len(message)))], message)
            return
        response, data = self.exchange(self.read_body())
        # Counted before the answer leaves: a client reads the counters right after its
        # last answer, and counted after, a loaded machine could miss that request.
        self._server().count(len(data))
        self.relay(response, data)


class CountingProxy(ChildServer):
    """The proxy process for the life of a ``with`` block.

    Args:
        upstream: The S3 server's endpoint, ``http://127.0.0.1:PORT``.
        start_timeout_s: Longest wait for the proxy to answer.
    """

    name = "the bench proxy"
    show_stderr = True

    def __init__(self, upstream: str, start_timeout_s: float = 30.0) -> None:
        super().__init__(start_timeout_s=start_timeout_s)
        self.upstream = upstream

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "ingest.tools.bench.proxy"),
            *("--port", str(self.port), "--upstream", self.upstream),
        ]

    def ping(self) -> None:
        self.counters()

    def counters(self) -> Counters:
        """The requests and bytes counted so far."""
        with urllib.request.urlopen(self.endpoint + COUNTERS_PATH, timeout=10) as response:
            data = json.loads(response.read())
        return Counters(int(data["requests"]), int(data["bytes_read"]))


def serve(argv: list[str] | None = None) -> None:
    """Run the proxy in this process until it is terminated."""
    parser = argparse.ArgumentParser(description="counting HTTP proxy for ingest bench")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    args = parser.parse_args(argv)
    with _Server(args.port, args.upstream) as server:
        server.serve_forever()


if __name__ == "__main__":
    serve()
