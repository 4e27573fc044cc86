"""WebDataset tar shards: consecutive members with the same key form one sample (row).

``images/0001.jpg`` and ``images/0001.cls`` are fields ``jpg`` and ``cls`` of the sample
with key ``images/0001``. Fields stay bytes: nothing is decoded here, and pickled fields
(``.pyd``, ``.pickle``) are never unpickled; decode them in a transform if you trust them.
Seek points are ``(row, byte offset of the sample's first tar header)``.
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterator

import pyarrow as pa

from ingest.errors import SchemaMismatchError, ShardError
from ingest.formats.base import (
    Format,
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    clip,
)
from ingest.sources import Shard, Source

KEY = "__key__"
_INFER_SAMPLES = 256
_FIX = "check that the object is a complete tar file (re-upload it), or pass format="


def split_name(name: str) -> tuple[str, str]:
    """``("dir/0001", "jpg")`` for ``"dir/0001.jpg"`` (the key ends at the first dot)."""
    directory, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(directory, stem), ext if dot else ""


def _samples(
    source: Source, shard: Shard, offset: int, block_bytes: int
) -> Iterator[tuple[int, str, dict[str, bytes]]]:
    """Yield ``(header offset, key, fields)`` for each sample from byte ``offset``."""
    with source.open(shard, block_size=block_bytes) as f:
        f.seek(offset)
        key: str | None = None
        fields: dict[str, bytes] = {}
        start = end = position = offset
        try:
            with tarfile.open(fileobj=f, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    position = offset + member.offset
                    if not member.isfile():
                        continue
                    k, ext = split_name(member.name)
                    if k != key:
                        if key is not None:
                            yield start, key, fields
                        key, fields, start = k, {}, position
                    extracted = tar.extractfile(member)
                    fields[ext] = extracted.read() if extracted is not None else b""
                end = offset + tar.offset
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ShardError(
                shard.url, f"tar stream is corrupt or truncated ({e})", _FIX, byte=position
            ) from None
        # tarfile takes a file cut at a member boundary for a clean end; a complete archive
        # ends with two zero blocks (1024 bytes) after its last member.
        if shard.size - end < 2 * tarfile.BLOCKSIZE:
            raise ShardError(
                shard.url,
                "tar archive ends without its end-of-archive marker (the file is truncated)",
                _FIX,
                byte=end,
            )
        if key is not None:
            yield start, key, fields


class WebDatasetFormat(Format):
    name = "webdataset"
    extensions = (".tar",)

    def inspect(self, source: Source, shard: Shard, options: ReadOptions) -> ShardInfo:
        return ShardInfo(rows=None)

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema:
        extensions: set[str] = set()
        for n, (_, _, fields) in enumerate(_samples(source, shard, 0, options.block_bytes)):
            extensions.update(fields)
            if n + 1 >= _INFER_SAMPLES:
                break
        return pa.schema(
            [pa.field(KEY, pa.string())] + [pa.field(e, pa.binary()) for e in sorted(extensions)]
        )

    def open(self, ctx: ReadContext) -> ShardReader:
        return _WebDatasetReader(ctx)


class _WebDatasetReader(ShardReader):
    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        seek = self.ctx.info.seek_for(start, seek)
        row, offset = seek if seek is not None else (0, 0)
        yield from clip(self._batches(row, offset), start, stop)

    def _batches(self, row: int, offset: int) -> Iterator[RowBatch]:
        ctx = self.ctx
        schema = ctx.schema
        assert schema is not None
        names = list(ctx.columns) if ctx.columns is not None else schema.names
        known = set(schema.names)
        out_schema = pa.schema([schema.field(n) for n in names])
        columns: dict[str, list[object]] = {n: [] for n in names}
        batch_seek: Seek | None = None
        size = count = 0
        for header, key, fields in _samples(ctx.source, ctx.shard, offset, ctx.options.block_bytes):
            extra = [e for e in fields if e not in known]
            if extra and ctx.columns is None:
                raise SchemaMismatchError(
                    ctx.shard.url,
                    f"sample {key!r} has field(s) {extra} that the first "
                    f"samples of {ctx.schema_origin} do not have",
                    "select the fields you need with columns=[...] or pass ReadOptions(schema=...)",
                    row=row,
                    byte=header,
                )
            if batch_seek is None:
                batch_seek = (row, header)
            for n in names:
                columns[n].append(key if n == KEY else fields.get(n))
            size += sum(len(v) for v in fields.values())
            count += 1
            if count >= ctx.options.batch_rows or size >= ctx.options.block_bytes:
                yield RowBatch(row, pa.record_batch(columns, schema=out_schema), batch_seek)
                row += count
                columns = {n: [] for n in names}
                batch_seek, size, count = None, 0, 0
        if count:
            yield RowBatch(row, pa.record_batch(columns, schema=out_schema), batch_seek)
