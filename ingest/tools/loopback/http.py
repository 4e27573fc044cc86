"""A static-file HTTP server on 127.0.0.1 with range reads, as a CDN or a web server serves
shards: ``HEAD`` (size, ``ETag``, ``Last-Modified``), ``GET`` of a whole file, ``GET`` with
one ``Range: bytes=a-b`` (``206``, ``Content-Range``), and a count of the requests.

Python's ``http.server`` answers every ``GET`` whole (no ranges), so a reader that seeks
would fetch the whole file for every read: this handler serves ranges.

For tests of servers that do less, :class:`LoopbackHTTP` can leave out ``ETag`` or
``Last-Modified`` (or both), and ignore ``Range`` (answer ``200`` with the whole file, as
some servers and proxies do).
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any


class _Handler(SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _file(self) -> Path | None:
        path = Path(self.translate_path(self.path))
        return path if path.is_file() else None

    def _headers(self, path: Path, length: int) -> None:
        stat = path.stat()
        tag = hashlib.md5(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        if self.server.sizes or (self.command == "GET" and self.headers.get("Range")):
            self.send_header("Content-Length", str(length))
        if self.server.ranges:
            self.send_header("Accept-Ranges", "bytes")
        if self.server.etag:
            self.send_header("ETag", f'"{tag}"')
        if self.server.last_modified:
            self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
        self.send_header("Content-Type", "application/octet-stream")

    def _seen(self) -> None:
        for name in ("Authorization",):
            value = self.headers.get(name)
            if value is not None:
                self.server.seen(name, value)

    def do_HEAD(self) -> None:
        self._seen()
        self.server.count("HEAD")
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        self.send_response(200)
        self._headers(path, path.stat().st_size)
        self.end_headers()

    def do_GET(self) -> None:
        self._seen()
        path = self._file()
        if path is None:
            self.server.count("GET")
            self.send_error(404)
            return
        size = path.stat().st_size
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if wanted is None or not self.server.ranges:
            self.server.count("GET" if wanted is None else "GET range ignored")
            self.send_response(200)
            self._headers(path, size)
            self.end_headers()
            self.wfile.write(path.read_bytes())
            return
        self.server.count("GET range")
        a, b = wanted.groups()
        start = int(a) if a else max(size - int(b), 0)
        stop = min(int(b) + 1, size) if a and b else size
        self.server.ranged(self.path, start, stop, size)
        if start >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return
        self.send_response(206)
        self._headers(path, stop - start)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.end_headers()
        with path.open("rb") as f:
            f.seek(start)
            self.wfile.write(f.read(stop - start))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # socketserver's 5 dropped a burst's connections past it: each
    # sent again by the client's kernel a second later

    def __init__(
        self, root: str, *, etag: bool, last_modified: bool, ranges: bool, sizes: bool
    ) -> None:
        self.root = root
        self.etag = etag
        self.last_modified = last_modified
        self.ranges = ranges
        self.sizes = sizes
        self.requests: dict[str, int] = {}
        self.served: list[tuple[str, int, int, int]] = []
        self.headers: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        super().__init__(
            ("127.0.0.1", 0),
            lambda *a: _Handler(*a, directory=root),  # type: ignore[arg-type]
        )

    def count(self, kind: str) -> None:
        with self._lock:
            self.requests[kind] = self.requests.get(kind, 0) + 1

    def ranged(self, path: str, start: int, stop: int, size: int) -> None:
        with self._lock:
            self.served.append((path, start, stop, size))

    def seen(self, header: str, value: str) -> None:
        with self._lock:
            self.headers.setdefault(header, set()).add(value)


class LoopbackHTTP:
    """Serves the files under ``root`` at :attr:`endpoint` for the life of a ``with`` block.

    Args:
        root: The directory served.
        etag: Send an ``ETag`` (a hash of the path, size and modification time).
        last_modified: Send ``Last-Modified`` (the modification time, to the second).
        ranges: Serve ``Range`` requests (``206``); False answers them ``200`` with the whole
            file and sends no ``Accept-Ranges``, counted as ``GET range ignored``.
        sizes: Send ``Content-Length`` with a ``HEAD`` and a whole ``GET``; False: a server
            that says no file's size (one that compresses or streams its answers).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        etag: bool = True,
        last_modified: bool = True,
        ranges: bool = True,
        sizes: bool = True,
    ) -> None:
        self.root = Path(root)
        self._server = _Server(
            str(root), etag=etag, last_modified=last_modified, ranges=ranges, sizes=sizes
        )
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, relative: str) -> str:
        return f"{self.endpoint}/{relative.lstrip('/')}"

    def requests(self) -> dict[str, int]:
        """Requests answered so far, by kind (``HEAD``, ``GET``, ``GET range``, and ``GET range
        ignored`` when ``ranges=False``)."""
        with self._server._lock:
            return dict(self._server.requests)

    def ranges(self) -> list[tuple[str, int, int, int]]:
        """The ranges served so far: ``(path, start, stop, file size)``, in order."""
        with self._server._lock:
            return list(self._server.served)

    def headers_seen(self, header: str) -> set[str]:
        """The values of ``header`` (``Authorization``) that requests carried so far."""
        with self._server._lock:
            return set(self._server.headers.get(header, set()))

    def __enter__(self) -> LoopbackHTTP:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
