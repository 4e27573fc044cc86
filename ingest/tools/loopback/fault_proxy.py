"""A fault-injecting HTTP proxy on 127.0.0.1, in front of the loopback S3 server.

:class:`FaultProxy` sits between a client and that server and misbehaves as storage does
(:class:`Faults`), seeded and bounded, so that a failure seen once can be reproduced.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import cast

from ingest.tools.forward import ForwardingHandler, ForwardingServer

FAULT_KINDS = ("slow_down", "server_error", "throttle", "drop", "short", "stall")
"""The kinds of fault a :class:`FaultProxy` injects, as named in :class:`Faults`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    """What a :class:`FaultProxy` gets wrong, as shares of the requests it receives.

    Each request draws one number from a generator seeded with ``seed`` and gets at most one
    fault; the shares must sum to at most 1. Faults stop after ``limit`` of them.

    Attributes:
        slow_down: Answered ``503 SlowDown`` (S3's throttling) without reaching the store.
        server_error: Answered ``500 InternalError``.
        throttle: Answered ``429 Too Many Requests`` with ``Retry-After: retry_after_s``.
        retry_after_s: The ``Retry-After`` of ``throttle`` answers, whole seconds.
        drop: The store's answer is sent with its full ``Content-Length``, then the
            connection is closed halfway through the body (an answer without a body: closed
            before any answer).
        short: The store's answer is cut to half its body, with a ``Content-Length`` that
            matches the cut: a body that looks complete and is not.
        stall: No answer for ``stall_s`` (past a client's read timeout), then the store's.
        stall_s: How long a stall lasts; stopping the proxy ends it.
        seed: Seed of the draws.
        limit: Most faults injected in all; None: no bound.
        methods: HTTP methods that get faults; others are forwarded as they are.
        ranges_only: Only requests for a byte range (``Range:`` header: data reads) get
            faults; listings and whole-object requests pass.
        latency_s: Every request, of any method, waits this long before it is forwarded:
            a store far away (a cross-region bucket, the Hub over the internet).
    """

    slow_down: float = 0.0
    server_error: float = 0.0
    throttle: float = 0.0
    retry_after_s: int = 1
    drop: float = 0.0
    short: float = 0.0
    stall: float = 0.0
    stall_s: float = 30.0
    seed: int = 0
    limit: int | None = None
    methods: tuple[str, ...] = ("GET", "HEAD")
    ranges_only: bool = False
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        shares = [getattr(self, k) for k in FAULT_KINDS]
        if any(not 0 <= v <= 1 for v in shares) or sum(shares) > 1:
            raise ValueError(
                f"fault shares {dict(zip(FAULT_KINDS, shares, strict=True))} must each be in "
                "[0, 1] and sum to at most 1"
            )
        if self.retry_after_s < 0 or self.stall_s < 0 or self.latency_s < 0:
            raise ValueError("retry_after_s, stall_s and latency_s must be >= 0")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit={self.limit} must be >= 0 or None")


_ERRORS = {
    "slow_down": (503, "SlowDown", "Please reduce your request rate."),
    "server_error": (500, "InternalError", "We encountered an internal error. Please try again."),
    "throttle": (429, "TooManyRequests", "Too many requests; retry after the given delay."),
}


class _FaultServer(ForwardingServer):
    def __init__(self, upstream: str, faults: Faults) -> None:
        super().__init__(0, upstream, _FaultHandler)
        self.faults = faults
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.random = random.Random(faults.seed)
        self.counts = dict.fromkeys(("requests", *FAULT_KINDS), 0)
        self.before = 0
        """Faults injected before :attr:`faults` were set (``limit`` counts from there)."""
        self.in_flight = 0
        self.peak = 0
        """The most requests in flight at once (received, not answered yet)."""

    def draw(self, method: str, ranged: bool) -> str | None:
        """Count a request and pick its fault, if any."""
        with self.lock:
            self.counts["requests"] += 1
            if method not in self.faults.methods or (self.faults.ranges_only and not ranged):
                return None
            x = self.random.random()
            injected = sum(self.counts[k] for k in FAULT_KINDS) - self.before
            if self.faults.limit is not None and injected >= self.faults.limit:
                return None
            for kind in FAULT_KINDS:
                x -= getattr(self.faults, kind)
                if x < 0:
                    self.counts[kind] += 1
                    return kind
            return None


class _FaultHandler(ForwardingHandler):
    timeout = 120  # an idle client connection is closed after this long

    def forward(self) -> None:
        server = cast(_FaultServer, self.server)
        with server.lock:
            server.in_flight += 1
            server.peak = max(server.peak, server.in_flight)
        try:
            self._forward(server)
        finally:
            with server.lock:
                server.in_flight -= 1

    def _forward(self, server: _FaultServer) -> None:
        body = self.read_body()
        fault = server.draw(self.command, "Range" in self.headers)
        if server.faults.latency_s and server.stopping.wait(server.faults.latency_s):
            self.close_connection = True
            return
        if fault in _ERRORS:
            status, code, message = _ERRORS[fault]
            xml = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
            headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(xml)))]
            if fault == "throttle":
                headers.append(("Retry-After", str(server.faults.retry_after_s)))
            self.answer(status, headers, xml)
            return
        if fault == "stall" and server.stopping.wait(server.faults.stall_s):
            self.close_connection = True
            return
        response, data = self.exchange(body)
        bodiless = self.command == "HEAD" or response.status in (204, 304)
        if fault == "drop" and bodiless:
            self.close_connection = True  # closed before any answer
            return
        if fault == "drop" and len(data) > 1:
            headers = [*self.response_headers(response), ("Content-Length", str(len(data)))]
            self.answer(response.status, headers, data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if fault == "short" and len(data) > 1:
            data = data[: len(data) // 2]
        self.relay(response, data)


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that injects storage faults, for the life of a ``with``.

    Point a client's endpoint at :attr:`endpoint` instead of the store's (for S3:
    ``storage_options(proxy.endpoint)`` of a :class:`LoopbackS3`). It serves from threads
    of this process.

    Example::

        with LoopbackS3() as s3, FaultProxy(s3.endpoint, Faults(slow_down=0.1, drop=0.05)) as p:
            stream = ingest.Stream(
                "s3://bucket/data/", storage_options=s3.storage_options(endpoint=p.endpoint)
            )

    Args:
        upstream: The store's endpoint, ``http://127.0.0.1:PORT``.
        faults: What to get wrong (default: nothing; a plain forwarding proxy).
    """

    def __init__(self, upstream: str, faults: Faults | None = None) -> None:
        self.upstream = upstream
        self.faults = faults or Faults()
        self._server = _FaultServer(upstream, self.faults)
        self.port = int(self._server.server_address[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    def start(self) -> FaultProxy:
        """Start serving in a background thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def set_faults(self, faults: Faults) -> None:
        """Get ``faults`` wrong from now on (draws re-seeded), e.g. after a healthy listing."""
        with self._server.lock:
            self._server.faults = faults
            self._server.random = random.Random(faults.seed)
            self._server.before = sum(self._server.counts[k] for k in FAULT_KINDS)
        self.faults = faults

    def counts(self) -> dict[str, int]:
        """Requests received and faults injected so far, by kind (see :class:`Faults`)."""
        with self._server.lock:
            return dict(self._server.counts)

    def peak_in_flight(self) -> int:
        """The most requests this proxy held at once (received and not yet answered)."""
        with self._server.lock:
            return self._server.peak

    def injected(self) -> int:
        """Faults injected so far, all kinds."""
        counts = self.counts()
        return sum(counts[k] for k in FAULT_KINDS)

    def stop(self) -> None:
        """Stop serving; stalls in progress end at once."""
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = [
    "FAULT_KINDS",
    "FaultProxy",
    "Faults",
]
