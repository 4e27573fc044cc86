"""Helpers for tests, demos and benchmarks: a loopback S3 server, a fault-injecting proxy
in front of it, and generated datasets.

:class:`LoopbackS3` runs ``moto_server`` (``pip install "moto[server]"``) as a child process
bound to 127.0.0.1, so clients talk real S3 over HTTP and the server does not share their
GIL. :class:`FaultProxy` sits between a client and that server and misbehaves as storage
does (:class:`Faults`), seeded and bounded, so that a failure seen once can be reproduced.
Nothing here reaches beyond the loopback interface.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import random
import shutil
import sys
import tarfile
import threading
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from pyarrow import ipc

from ingest.tools.child import ChildServer, free_port
from ingest.tools.forward import ForwardingHandler, ForwardingServer

TOKENS = 16


class LoopbackS3(ChildServer):
    """An S3-protocol server on 127.0.0.1 for the life of a ``with`` block.

    Args:
        port: Port to bind; 0 picks a free one.
        env: Extra environment for the server (e.g. ``INITIAL_NO_AUTH_ACTION_COUNT`` to turn
            on moto's credential checks).
        start_timeout_s: Longest wait for the server to answer.
    """

    name = "moto_server"
    hint = '; install it with pip install "moto[server]"'
    key = "testing"
    secret = "testing-secret"

    def command(self) -> list[str]:
        exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        return [*cmd, "-H", "127.0.0.1", "-p", str(self.port)]

    def ping(self) -> None:
        urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()

    def storage_options(
        self, key: str | None = None, secret: str | None = None, *, endpoint: str | None = None
    ) -> dict[str, Any]:
        """s3fs options that reach this server, or reach it through a proxy at ``endpoint``
        (a :class:`FaultProxy`'s)."""
        return {
            "key": key or self.key,
            "secret": secret or self.secret,
            "client_kwargs": {
                "endpoint_url": endpoint or self.endpoint,
                "region_name": "us-east-1",
            },
            "skip_instance_cache": True,
        }

    def filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("s3", **self.storage_options())

    def create_bucket(self, name: str, key: str | None = None, secret: str | None = None) -> str:
        """Create bucket ``name`` (if missing) and return its ``s3://`` URL."""
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=key or self.key,
            aws_secret_access_key=secret or self.secret,
        )
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def reset(self) -> None:
        """Delete every bucket and object (moto's reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()


@contextlib.contextmanager
def credential_checking_s3() -> Iterator[tuple[LoopbackS3, dict[str, str]]]:
    """A loopback S3 server that checks credentials, with bucket ``private`` holding one
    10-row Parquet shard ``a.parquet``, for the life of a ``with`` block.

    moto lets the first three requests through unchecked (``INITIAL_NO_AUTH_ACTION_COUNT``):
    they make an IAM user allowed everything, and its access key. Every later request needs
    that key, the bucket and the shard's included.

    Yields:
        The server and the user's credentials, ``{"key": ..., "secret": ...}``.
    """
    import boto3

    with LoopbackS3(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"}) as server:
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        allow_all = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        iam.put_user_policy(
            UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(allow_all)
        )
        creds = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
        server.create_bucket("private", creds["key"], creds["secret"])
        fs = fsspec.filesystem("s3", **server.storage_options(creds["key"], creds["secret"]))
        fs.pipe("private/a.parquet", encode(make_table(0, 10), "parquet"))
        yield server, creds


# -- storage faults --------------------------------------------------------------------------


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


# -- generated data ------------------------------------------------------------------------


@dataclass
class Store:
    """Where a test or a benchmark writes shards: a filesystem, a root URL and the options
    to read it (``name``: ``"local"``, ``"s3"``...)."""

    name: str
    fs: fsspec.AbstractFileSystem
    root: str
    storage_options: dict[str, Any]

    def url(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write(self, relpath: str, data: bytes) -> str:
        url = self.url(relpath)
        self.fs.makedirs(url.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe(url, data)
        return url


def tar_of(*members: tuple[str, bytes] | tarfile.TarInfo) -> bytes:
    """A tar of regular files given as ``(name, data)`` and of other members as given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return buf.getvalue()


def tar_link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    """A tar member ``name`` that links to ``target`` (``kind``: tarfile.SYMTYPE, LNKTYPE)."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def make_table(first_id: int, rows: int) -> pa.Table:
    """Rows with a unique ``id``, a fixed-size ``tokens`` list, a float and a string."""
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    tokens = (ids[:, None] * 31 + np.arange(TOKENS)[None, :]) % 50_000
    return pa.table(
        {
            "id": ids,
            "tokens": pa.FixedSizeListArray.from_arrays(
                pa.array(tokens.ravel().astype(np.int32)), TOKENS
            ),
            "score": (ids % 1000).astype(np.float32) / 1000,
            "text": pa.array([f"row {i}" for i in ids.tolist()]),
        }
    )


def _jsonl_bytes(table: pa.Table) -> bytes:
    rows = table.select(["id", "score", "text"]).to_pylist()
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _tar_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for row in table.select(["id", "text"]).to_pylist():
            for ext, payload in (
                ("txt", row["text"].encode()),
                ("json", json.dumps({"id": row["id"]}).encode()),
            ):
                info = tarfile.TarInfo(f"sample{row['id']:09d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _parquet_bytes(table: pa.Table, row_group_rows: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_rows)
    return sink.getvalue()


def _zstd_bytes(data: bytes) -> bytes:
    import zstandard

    return bytes(zstandard.ZstdCompressor().compress(data))


def _csv_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pcsv.write_csv(table.select(["id", "score", "text"]), sink)
    return sink.getvalue()


def _ipc_bytes(table: pa.Table, row_group_rows: int, *, file: bool) -> bytes:
    sink = io.BytesIO()
    opener: Callable[..., Any] = ipc.new_file if file else ipc.new_stream
    with opener(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=row_group_rows):
            writer.write_batch(batch)
    return sink.getvalue()


_ENCODERS: dict[str, Callable[[pa.Table, int], bytes]] = {
    "parquet": _parquet_bytes,
    "jsonl": lambda table, _: _jsonl_bytes(table),
    "jsonl.gz": lambda table, _: gzip.compress(_jsonl_bytes(table)),
    "jsonl.zst": lambda table, _: _zstd_bytes(_jsonl_bytes(table)),
    "csv": lambda table, _: _csv_bytes(table),
    "arrow": lambda table, rows: _ipc_bytes(table, rows, file=True),
    "arrows": lambda table, rows: _ipc_bytes(table, rows, file=False),
    "tar": lambda table, _: _tar_bytes(table),
}
"""Generated shard formats: name -> ``(table, rows per row group or batch) -> bytes``."""


def encode(table: pa.Table, fmt: str, *, row_group_rows: int = 1000) -> bytes:
    """Serialise ``table`` as one shard of ``fmt``.

    Args:
        table: The rows (as :func:`make_table` builds them).
        fmt: ``parquet``, ``jsonl``, ``jsonl.gz``, ``jsonl.zst``, ``csv``, ``arrow`` (IPC
            file), ``arrows`` (IPC stream) or ``tar`` (WebDataset: ``.txt`` and ``.json`` per
            sample).
        row_group_rows: Rows per Parquet row group or Arrow IPC record batch.

    Returns:
        The shard's bytes.

    Raises:
        ValueError: If ``fmt`` is none of the above.
    """
    encoder = _ENCODERS.get(fmt)
    if encoder is None:
        raise ValueError(
            f"unknown generated format {fmt!r}; generated formats: {', '.join(_ENCODERS)}"
        )
    return encoder(table, row_group_rows)


def write_dataset(
    fs: fsspec.AbstractFileSystem,
    root: str,
    fmt: str,
    shards: int,
    rows: int,
    *,
    row_group_rows: int = 1000,
) -> list[str]:
    """Write ``shards`` shards of ``rows`` rows each under ``root``; ids are 0..N-1.

    Returns:
        The paths written, in id order.
    """
    paths = []
    fs.makedirs(root, exist_ok=True)
    for n in range(shards):
        path = f"{root.rstrip('/')}/part-{n:05d}.{fmt}"
        with fs.open(path, "wb") as f:
            f.write(encode(make_table(n * rows, rows), fmt, row_group_rows=row_group_rows))
        paths.append(path)
    return paths


def date_time_table() -> pa.Table:
    """One row of each date and time type: the same instant with the zone Europe/Paris and
    UTC (ms; 2023-12-31T23:00:00Z), a naive us timestamp, a date32, a time64 and a
    duration (what the conversion to torch makes of them: ingest.engine.convert)."""
    import datetime as dt

    instant = dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    return pa.table(
        {
            "paris": pa.array([instant], pa.timestamp("ms", tz="Europe/Paris")),
            "utc": pa.array([instant], pa.timestamp("ms", tz="UTC")),
            "naive_us": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us")),
            "day": pa.array([dt.date(2024, 1, 1)], pa.date32()),
            "at": pa.array([dt.time(1, 2, 3)], pa.time64("us")),
            "took": pa.array([dt.timedelta(seconds=2)], pa.duration("ms")),
        }
    )


def write_large_rows(root: str, shards: int, rows: int, row_bytes: int) -> None:
    """Write ``shards`` Parquet shards of ``rows`` rows under the local directory ``root``:
    an ``id`` (0..N-1 across shards) and ``data``, ``row_bytes`` random bytes. Row groups of
    2 rows and no dictionary, so that what a reader holds open is small next to the
    batches and windows that tests of byte bounds measure."""
    rng = np.random.default_rng(0)
    for n in range(shards):
        blobs = [rng.bytes(row_bytes) for _ in range(rows)]
        table = pa.table({"id": pa.array(range(n * rows, (n + 1) * rows)), "data": blobs})
        path = os.path.join(root, f"part-{n:05d}.parquet")
        pq.write_table(table, path, row_group_size=2, use_dictionary=False)


def write_image_folder(
    fs: fsspec.AbstractFileSystem,
    root: str,
    classes: Sequence[str] = ("cat", "dog"),
    per_class: int = 10,
    *,
    size: int = 16,
) -> dict[str, str]:
    """Write an ImageFolder layout, ``<root>/<class>/<class>-NNNNN.png``, and a README.

    Each class is a colour (class ``c`` has red ``40 * c``); pixel ``(0, 0)``'s green and
    blue hold the file's number (``256 * g + b``), so a decoded image tells which file it
    was. Returns every image's URL (as written) -> its class.
    """
    from PIL import Image

    written: dict[str, str] = {}
    base = root.rstrip("/")
    fs.makedirs(base, exist_ok=True)
    fs.pipe(f"{base}/README.txt", b"not an image: a folder listing leaves it out\n")
    for c, name in enumerate(classes):
        fs.makedirs(f"{base}/{name}", exist_ok=True)
        for n in range(per_class):
            pixels = np.full((size, size, 3), (40 * c % 256, 0, 0), dtype=np.uint8)
            pixels[0, 0, 1:] = (n // 256, n % 256)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="PNG")
            url = f"{base}/{name}/{name}-{n:05d}.png"
            fs.pipe(url, out.getvalue())
            written[url] = name
    return written


def write_audio_folder(
    fs: fsspec.AbstractFileSystem,
    root: str,
    classes: Sequence[str] = ("yes", "no"),
    per_class: int = 4,
    *,
    sample_rate: int = 8000,
    seconds: float = 0.25,
) -> dict[str, str]:
    """Write an AudioFolder layout of WAV files, ``<root>/<class>/<class>-NNNNN.wav``.

    File ``n`` of class ``c`` is a constant signal of ``(c + 1) / 10``, ``n + 1`` samples
    shorter than ``seconds``. Needs soundfile. Returns every file's URL -> its class.
    """
    import soundfile

    written: dict[str, str] = {}
    base = root.rstrip("/")
    frames = round(sample_rate * seconds)
    for c, name in enumerate(classes):
        fs.makedirs(f"{base}/{name}", exist_ok=True)
        for n in range(per_class):
            signal = np.full(frames - n - 1, (c + 1) / 10, dtype=np.float32)
            out = io.BytesIO()
            soundfile.write(out, signal, sample_rate, format="WAV", subtype="FLOAT")
            url = f"{base}/{name}/{name}-{n:05d}.wav"
            fs.pipe(url, out.getvalue())
            written[url] = name
    return written


__all__ = [
    "FAULT_KINDS",
    "TOKENS",
    "FaultProxy",
    "Faults",
    "LoopbackS3",
    "Store",
    "credential_checking_s3",
    "date_time_table",
    "encode",
    "free_port",
    "make_table",
    "tar_link",
    "tar_of",
    "write_audio_folder",
    "write_dataset",
    "write_image_folder",
    "write_large_rows",
]
