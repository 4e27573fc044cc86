"""A counting HTTP proxy on 127.0.0.1 in front of the loopback S3 server.

Every contender reaches the store through this proxy, so requests and bytes are counted the
same way for all of them, whatever S3 client they use (s3fs, pyarrow's S3 filesystem).
It runs in its own process (``python -m ingest.tools.bench.proxy``) so that forwarding never
competes for the GIL of a process being measured. ``GET`` :data:`COUNTERS_PATH` returns the
counters as JSON (no S3 bucket can be named ``__ingest_bench__``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from types import TracebackType
from typing import cast

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
        self.relay(response, data)
        self._server().count(len(data))


class CountingProxy:
    """The proxy process for the life of a ``with`` block.

    Args:
        upstream: The S3 server's endpoint, ``http://127.0.0.1:PORT``.
        start_timeout_s: Longest wait for the proxy to answer.
    """

    def __init__(self, upstream: str, start_timeout_s: float = 30.0) -> None:
        from ingest.testing import free_port

        self.upstream = upstream
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CountingProxy:
        """Start the proxy process and wait until it answers.

        Raises:
            RuntimeError: If the process exits while starting.
            TimeoutError: If it does not answer within ``start_timeout_s``.
        """
        self._proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "ingest.tools.bench.proxy"),
                *("--port", str(self.port), "--upstream", self.upstream),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the bench proxy exited with {self._proc.returncode}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                self.counters()
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"the bench proxy did not answer on {self.endpoint}")

    def counters(self) -> Counters:
        """The requests and bytes counted so far."""
        with urllib.request.urlopen(self.endpoint + COUNTERS_PATH, timeout=10) as response:
            data = json.loads(response.read())
        return Counters(int(data["requests"]), int(data["bytes_read"]))

    def stop(self) -> None:
        """Stop the proxy process."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            self._proc = None

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


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
