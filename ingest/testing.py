"""Helpers for tests, demos and benchmarks: a loopback S3 server and generated datasets.

:class:`LoopbackS3` runs ``moto_server`` (``pip install "moto[server]"``) as a child process
bound to 127.0.0.1, so clients talk real S3 over HTTP and the server does not share their
GIL. Nothing here reaches beyond the loopback interface.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import TracebackType
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from pyarrow import ipc

TOKENS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopbackS3:
    """An S3-protocol server on 127.0.0.1 for the life of a ``with`` block.

    Args:
        port: Port to bind; 0 picks a free one.
        env: Extra environment for the server (e.g. ``INITIAL_NO_AUTH_ACTION_COUNT`` to turn
            on moto's credential checks).
        start_timeout_s: Longest wait for the server to answer.
    """

    key = "testing"
    secret = "testing-secret"

    def __init__(
        self, port: int = 0, env: dict[str, str] | None = None, start_timeout_s: float = 30.0
    ) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._env = env or {}
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LoopbackS3:
        exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        self._proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(self.port)],
            env={**os.environ, **self._env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"moto_server exited with {self._proc.returncode}; "
                    'install it with pip install "moto[server]"'
                )
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(
            f"moto_server did not answer on {self.endpoint} within {self._start_timeout_s:.0f} s"
        )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            self._proc = None

    def __enter__(self) -> LoopbackS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def storage_options(self, key: str | None = None, secret: str | None = None) -> dict[str, Any]:
        """s3fs options that reach this server."""
        return {
            "key": key or self.key,
            "secret": secret or self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
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


# -- generated data ------------------------------------------------------------------------


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
