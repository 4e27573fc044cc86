"""Generated shards: rows of known ids, encoded in every generated format, and where to write
them (:class:`Store`).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from pyarrow import ipc

TOKENS = 16


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


def _json_array_bytes(table: pa.Table) -> bytes:
    """The rows as one JSON array document, pretty-printed (as ``json.dump(rows, f,
    indent=2)`` writes an instruction dataset such as Alpaca's ``alpaca_data.json``)."""
    rows = table.select(["id", "score", "text"]).to_pylist()
    return json.dumps(rows, indent=2).encode()


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


def _text_bytes(table: pa.Table) -> bytes:
    """A line per row: its id, as text."""
    return "".join(f"{i}\n" for i in table.column("id").to_pylist()).encode()


def _csv_bytes(table: pa.Table, delimiter: str = ",") -> bytes:
    sink = io.BytesIO()
    options = pcsv.WriteOptions(delimiter=delimiter)
    pcsv.write_csv(table.select(["id", "score", "text"]), sink, write_options=options)
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
    "json": lambda table, _: _json_array_bytes(table),
    "json.gz": lambda table, _: gzip.compress(_json_array_bytes(table)),
    "csv": lambda table, _: _csv_bytes(table),
    "tsv": lambda table, _: _csv_bytes(table, "\t"),
    "tsv.gz": lambda table, _: gzip.compress(_csv_bytes(table, "\t")),
    "jsonl.bz2": lambda table, _: bz2.compress(_jsonl_bytes(table)),
    "jsonl.xz": lambda table, _: lzma.compress(_jsonl_bytes(table)),
    "txt": lambda table, _: _text_bytes(table),
    "txt.gz": lambda table, _: gzip.compress(_text_bytes(table)),
    "arrow": lambda table, rows: _ipc_bytes(table, rows, file=True),
    "arrows": lambda table, rows: _ipc_bytes(table, rows, file=False),
    "tar": lambda table, _: _tar_bytes(table),
    "tar.gz": lambda table, _: gzip.compress(_tar_bytes(table)),
    "tgz": lambda table, _: gzip.compress(_tar_bytes(table)),
    "tar.zst": lambda table, _: _zstd_bytes(_tar_bytes(table)),
}
"""Generated shard formats: name -> ``(table, rows per row group or batch) -> bytes``."""


def encode(table: pa.Table, fmt: str, *, row_group_rows: int = 1000) -> bytes:
    """Serialise ``table`` as one shard of ``fmt``.

    Args:
        table: The rows (as :func:`make_table` builds them).
        fmt: ``parquet``, ``jsonl``, ``jsonl.gz``, ``jsonl.zst``, ``jsonl.bz2``,
            ``jsonl.xz``, ``json`` and ``json.gz`` (one JSON array of the rows, indented),
            ``csv``, ``tsv`` (tabs),
            ``tsv.gz``, ``txt`` (a line per row: its id), ``txt.gz``, ``arrow`` (IPC
            file), ``arrows`` (IPC stream) or ``tar`` (WebDataset: ``.txt`` and ``.json``
            per sample; ``tar.gz``, ``tgz`` and ``tar.zst`` compressed).
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


__all__ = [
    "TOKENS",
    "Store",
    "date_time_table",
    "encode",
    "make_table",
    "tar_link",
    "tar_of",
    "write_dataset",
    "write_large_rows",
]
