"""WebDataset tar shards: consecutive members with the same key form one sample (row).

``images/0001.jpg`` and ``images/0001.cls`` are fields ``jpg`` and ``cls`` of the sample
with key ``images/0001``. Fields stay bytes: nothing is decoded here, and pickled fields
(``.pyd``, ``.pickle``) are never unpickled; decode them in a transform if you trust them.
Seek points are ``(row, byte offset of the sample's first tar header)``. A compressed shard
(``.tar.gz`` or ``.tgz``, ``.tar.zst``), as ``webdataset`` reads them, is decompressed as it
is read; its seek points are offsets in the tar, and a resume skips through to them.

What a shard may hold, as WebDataset users expect it:

- The stream's columns are ``__key__`` and the union of the fields of the first samples
  (see :meth:`WebDatasetFormat.infer_schema`); a sample without one of them has a null
  there (``None`` in a batch), as in Hugging Face ``datasets``. A field none of those
  samples had is a :class:`~ingest.core.errors.SchemaMismatchError`, unless ``columns=[...]``
  leaves it out.
- The same field twice in one sample (``0001.jpg`` twice in a row) is an error, as in
  ``webdataset``'s ``group_by_keys``: one of the two would be lost. So is a sample whose
  members are apart (``a.txt``, ``b.txt``, ``a.json``): it would be two rows of one key, each
  with half its fields (``webdataset`` yields them so, silently). A read from a seek point
  checks the samples from there on.
- A member with no extension (``0001``, ``dir.v2/0001``) names no field, and one whose
  extension is ``__key__`` would overwrite the sample's key: both are errors (``webdataset``
  drops the first silently).
- Member names are keys, never paths: nothing is extracted or written. A name that would
  leave the archive if extracted (``../x.jpg``, ``/etc/x.jpg``) is refused all the same,
  as a sign of a hostile or broken archive and so that no key can climb out of a directory
  a user's code might write samples to.
- Symbolic and hard links, devices and FIFOs are refused (a link's target is not in the
  sample, and following it could read outside the shard); directory entries are skipped,
  since they hold no data.

Every refusal is a :class:`~ingest.core.errors.ShardError` naming the shard, the member and the
byte offset of its tar header; so is a header that fails its checksum, wherever it is (the
members are read by :mod:`ingest.formats.tar`: Python's ``tarfile``, in the stream mode a
remote shard is read in, took such a header after the first member for the archive's end,
and the samples after it were lost without a word).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Any, NoReturn

import pyarrow as pa

from ingest.core.errors import SchemaMismatchError, ShardError
from ingest.formats import tar
from ingest.formats._lines import go_to, open_decompressed
from ingest.formats.arrays import binaries, strings
from ingest.formats.base import (
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    UncountedFormat,
    check_columns,
    clip,
)
from ingest.storage.sources import Shard, Source

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
    """Yield ``(header offset, key, fields)`` for each sample from byte ``offset`` (of the
    tar: in a compressed shard, ``.tar.gz``, ``.tgz`` or ``.tar.zst``, of its decompressed
    bytes, skipped through to get there).

    Raises:
        ShardError: If the tar is corrupt or truncated, or a member is refused (see the
            module docstring).
    """
    f, seekable = open_decompressed(source, shard, block_bytes)
    with f:
        go_to(f, seekable, offset, block_bytes, shard.url)
        key: str | None = None
        fields: dict[str, bytes] = {}
        done: set[str] = set()  # the keys of the samples read (a key again: members apart)
        start = position = offset
        members = tar.Members(f, offset, block_bytes)
        try:
            for member in members:
                position = member.offset
                if member.type == tar.DIRECTORY:
                    continue
                k, ext = _field(shard, member)
                if k != key:
                    if key is not None:
                        done.add(key)
                        yield start, key, fields
                    if k in done:
                        _refuse_apart(shard, k, key, member.name, position)
                    key, fields, start = k, {}, position
                elif ext in fields:
                    raise ShardError(
                        shard.url,
                        f"sample {k!r} has field {ext!r} twice (member {member.name!r} "
                        "follows another of the same name): one of them would be lost",
                        "give each member of a sample its own extension, or remove the "
                        "duplicate and write the tar again",
                        byte=position,
                    )
                fields[ext] = member.data
        except (tar.TarFormatError, EOFError, OSError) as e:  # OSError: a decompressor's
            byte = e.byte if isinstance(e, tar.TarFormatError) else position
            raise ShardError(
                shard.url, f"tar stream is corrupt or truncated ({e})", _FIX, byte=byte
            ) from None
        assert members.end is not None
        _check_end(shard, f, seekable, members.end)
        if key is not None:
            yield start, key, fields


def _refuse_apart(shard: Shard, key: str, after: str | None, name: str, position: int) -> NoReturn:
    """Refuse sample ``key``, met again after sample ``after`` (its member ``name``)."""
    raise ShardError(
        shard.url,
        f"sample {key!r} goes on after sample {after!r} (member {name!r}): a sample's members "
        "must follow one another, or it would be two rows of one key, each with part of "
        "its fields",
        "write each sample's files one after another (tar --sort=name, or a WebDataset "
        "writer such as webdataset.TarWriter)",
        byte=position,
    )


def _check_end(shard: Shard, f: Any, seekable: bool, end: int) -> None:
    """Refuse an archive whose bytes end at ``end`` without its end marker: a complete
    archive has two zero blocks (1024 bytes) after its last member, and a file cut at a
    member's boundary has none. A compressed one is read to its end for its size (the
    decompressor refuses a truncated stream)."""
    size = shard.size if seekable else len(f.read()) + f.position
    if size - end < 2 * tar.BLOCK:
        raise ShardError(
            shard.url,
            "tar archive ends without its end-of-archive marker (the file is truncated)",
            _FIX,
            byte=end,
        )


def _field(shard: Shard, member: tar.Member) -> tuple[str, str]:
    """The sample key and the field of ``member``, which is refused if it is not a regular
    file, its name leaves the archive, or its name gives no field."""
    if member.type != tar.REGULAR or member.name.startswith("/") or ".." in member.name:
        _check_member(shard, member)
    key, ext = split_name(member.name)
    if not ext or ext == KEY:
        _refuse_field(shard, member.name, ext, member.offset)
    return key, ext


def _check_member(shard: Shard, member: tar.Member) -> None:
    """Refuse a member that is not a regular file, or whose name leaves the archive."""
    if member.type != tar.REGULAR:
        kind = _KINDS.get(member.type, f"member of tar type {member.type!r}")
        target = f" to {member.linkname!r}" if member.type in _LINKS else ""
        raise ShardError(
            shard.url,
            f"member {member.name!r} is a {kind}{target}: a WebDataset field must be a "
            "regular file, and links are never followed",
            "store the file itself in the tar (tar --dereference --hard-dereference), or "
            "remove the member",
            byte=member.offset,
        )
    name = member.name
    normal = posixpath.normpath(name)
    if name.startswith("/") or normal == ".." or normal.startswith("../"):
        raise ShardError(
            shard.url,
            f"member name {name!r} leaves the archive (an absolute path or one that climbs "
            "out with '..'); sample keys must be relative names inside it",
            "write the tar again from inside its directory (tar -C DIR -cf shard.tar .), "
            "or remove the member",
            byte=member.offset,
        )


def _refuse_field(shard: Shard, name: str, ext: str, position: int) -> None:
    """Refuse a member whose name gives no field, or the key column's name."""
    problem = (
        f"member {name!r} has no extension: nothing names its field (a field is what follows "
        "the first dot of the file name: 0001.jpg is field jpg of sample 0001)"
        if not ext
        else f"member {name!r} is field {KEY!r}, the column of sample keys: it would "
        "replace the sample's key"
    )
    raise ShardError(
        shard.url,
        problem,
        "rename the member with the extension of its field (0001.txt), or remove it",
        byte=position,
    )


_KINDS = {
    tar.SYMBOLIC_LINK: "symbolic link",
    tar.HARD_LINK: "hard link",
    tar.CHARACTER_DEVICE: "character device",
    tar.BLOCK_DEVICE: "block device",
    tar.FIFO: "FIFO",
    tar.SPARSE: "sparse file",
}
_LINKS = (tar.HARD_LINK, tar.SYMBOLIC_LINK)


class WebDatasetFormat(UncountedFormat):
    name = "webdataset"
    extensions = (".tar", ".tgz")

    def infer_schema(
        self, source: Source, shard: Shard, info: ShardInfo, options: ReadOptions
    ) -> pa.Schema | None:
        """``__key__`` (string), then the union of the fields of the shard's first
        :data:`_INFER_SAMPLES` samples (binary), sorted by name; None for a tar of no
        sample (the next shard's are taken: its ``__key__`` alone refused every other)."""
        extensions: set[str] = set()
        n = -1
        for n, (_, _, fields) in enumerate(_samples(source, shard, 0, options.block_bytes)):
            extensions.update(fields)
            if n + 1 >= _INFER_SAMPLES:
                break
        if n < 0:
            return None
        return pa.schema(
            [pa.field(KEY, pa.string())] + [pa.field(e, pa.binary()) for e in sorted(extensions)]
        )

    def schema_key(self, options: ReadOptions) -> str | None:
        """The number of first samples whose fields are the columns."""
        return f"{self.name} {_INFER_SAMPLES}"

    def open(self, ctx: ReadContext) -> ShardReader:
        return _WebDatasetReader(ctx)


class _WebDatasetReader(ShardReader):
    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        seek = self.ctx.info.seek_for(start, seek)
        row, offset = seek if seek is not None else (0, 0)
        yield from clip(self._batches(row, offset), start, stop)

    def _batches(self, row: int, offset: int) -> Iterator[RowBatch]:
        ctx = self.ctx
        # None: no shard of the stream holds a sample (infer_schema)
        schema = ctx.schema if ctx.schema is not None else pa.schema([pa.field(KEY, pa.string())])
        check_columns(ctx.shard.url, ctx.columns, schema.names)
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
                yield RowBatch(row, _batch(columns, out_schema), batch_seek)
                row += count
                columns = {n: [] for n in names}
                batch_seek, size, count = None, 0, 0
        if count:
            yield RowBatch(row, _batch(columns, out_schema), batch_seek)


def _batch(columns: dict[str, list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """The samples' columns as a record batch of ``schema``: the bytes of each field (the
    keys' text) joined into one array (:mod:`ingest.formats.arrays`: ``pa.record_batch`` of
    Python lists imports pandas, on every reader's first batch), cast to a declared type
    other than binary."""
    arrays = []
    for f in schema:
        values, kind = columns[f.name], f.type
        if f.name == KEY:
            got = strings(values)
        elif any(is_(kind) for is_ in _BYTES):
            got = binaries(values)
        else:  # another declared type: pyarrow converts the values
            arrays.append(pa.array(values, kind))
            continue
        arrays.append(got if got.type == kind else got.cast(kind))  # (text: UTF-8 checked)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


_BYTES = (
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_string,
    pa.types.is_large_string,
)
