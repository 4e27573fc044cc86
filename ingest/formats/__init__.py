"""Format registry: a name -> the class that reads it, imported lazily.

An unknown name is an error that lists the known ones; registering a taken name needs
``overwrite=True``. File extensions map to names: :data:`FORMAT_RESOLVER` tells a listing
which files are data and which format reads each (sources know no formats; the catalog hands
it to :meth:`ingest.storage.sources.Source.list_shards`).
"""

from __future__ import annotations

import importlib
import posixpath
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.formats import conform
from ingest.formats.base import (
    Format,
    ReadContext,
    ReadOptions,
    RowBatch,
    Seek,
    ShardInfo,
    ShardReader,
    declares,
)
from ingest.formats.deleted_rows import DeletedRowsReader
from ingest.formats.folder import FOLDER_METADATA
from ingest.formats.listed_version import ListedVersionReader
from ingest.formats.partitions import PartitionedReader
from ingest.storage.sources import Shard

__all__ = [
    "FORMAT_RESOLVER",
    "Format",
    "IncidentalFilesWarning",
    "ReadContext",
    "ReadOptions",
    "RowBatch",
    "Seek",
    "ShardInfo",
    "ShardReader",
    "format_for_path",
    "get_format",
    "known_extensions",
    "open_reader",
    "read_as",
    "read_casts",
    "register_format",
    "registered_formats",
    "without_incidental",
]

_REGISTRY: dict[str, str] = {
    "parquet": "ingest.formats.parquet:ParquetFormat",
    "jsonl": "ingest.formats.jsonl:JsonlFormat",
    "csv": "ingest.formats.csv:CsvFormat",
    "tsv": "ingest.formats.csv:TsvFormat",
    "text": "ingest.formats.text:TextFormat",
    "arrow": "ingest.formats.arrow:ArrowFormat",
    "webdataset": "ingest.formats.webdataset:WebDatasetFormat",
    "imagefolder": "ingest.formats.folder:ImageFolderFormat",
    "audiofolder": "ingest.formats.folder:AudioFolderFormat",
}
_EXTENSIONS: dict[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "text",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".arrows": "arrow",
    ".tar": "webdataset",
    ".tgz": "webdataset",
}
COMPRESSIONS: dict[str, str] = {
    ".gz": "gzip",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".bz2": "bz2",
    ".xz": "xz",
}
_COMPRESSIBLE = ("jsonl", "csv", "tsv", "text", "webdataset")
_instances: dict[str, Format] = {}


def registered_formats() -> list[str]:
    """Names of every registered format."""
    return sorted(_REGISTRY)


def register_format(
    name: str, target: str, extensions: tuple[str, ...] = (), *, overwrite: bool = False
) -> None:
    """Register a format class by import path (``"package.module:Class"``).

    Raises:
        ConfigError: If ``name`` or an extension is taken and ``overwrite`` is False.
    """
    if not overwrite and name in _REGISTRY:
        raise ConfigError(
            f"format {name!r} is already registered ({_REGISTRY[name]}); "
            "pass overwrite=True to replace it"
        )
    taken = [e for e in extensions if e in _EXTENSIONS and _EXTENSIONS[e] != name]
    if taken and not overwrite:
        raise ConfigError(
            f"extensions {taken} already map to other formats; pass overwrite=True to remap them"
        )
    _REGISTRY[name] = target
    _instances.pop(name, None)
    for ext in extensions:
        _EXTENSIONS[ext] = name


def get_format(name: str) -> Format:
    """The format registered as ``name``.

    ``name`` may also be an import path, ``"package.module:Class"``: each process (Ray
    workers included) imports it on first use, with no registration.

    Raises:
        ConfigError: If no format has that name; the message lists the known ones.
    """
    fmt = _instances.get(name)
    if fmt is not None:
        return fmt
    if name.endswith("]") and "[" in name:  # a variant (read_as): csv[;], jsonl[field=data]
        base, _, inner = name[:-1].partition("[")
        of = getattr(get_format(base), "variant", None)
        found = None if of is None else of(inner)
        if found is None:
            raise ConfigError(
                f"unknown format {name!r}: only {', '.join(_DELIMITED)} take a delimiter "
                f"(csv[;]) and a header-less read (csv[,{NO_HEADER}]), and jsonl a field "
                "(jsonl[field=data])"
            )
        fmt = cast(Format, found)
        _instances[name] = fmt
        return fmt
    target = _REGISTRY.get(name)
    if target is None and ":" in name:
        target = name  # an import path: usable in every process without registering
    if target is None:
        raise ConfigError(
            f"unknown format {name!r}; known formats: {', '.join(registered_formats())}"
        )
    module, _, cls = target.partition(":")
    try:
        fmt = cast(Format, getattr(importlib.import_module(module), cls)())
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"format {name!r} cannot be loaded from {target} ({e}); check the import path"
        ) from None
    _instances[name] = fmt
    return fmt


_DELIMITED = ("csv", "tsv")
"""The formats ``ReadOptions.delimiter`` applies to."""


NO_HEADER = " no header"
"""What a CSV or TSV variant's name holds after its delimiter when read without a header."""


def variant(name: str, delimiter: str, *, header: bool = True) -> str:
    """The name of format ``name`` read with ``delimiter`` between values: ``csv[;]``;
    without a header line (``ReadOptions.column_names``): ``csv[, no header]``."""
    return f"{name}[{delimiter}{'' if header else NO_HEADER}]"


def read_as(name: str, options: ReadOptions) -> str:
    """The format that reads a shard listed as format ``name`` under ``options``: CSV or TSV
    with ``ReadOptions.delimiter`` or ``column_names`` is its variant (:func:`variant`), as
    JSON with ``field`` is (``jsonl[field=data]``), anything else itself.

    Each makes other rows of the same bytes (a quote opens a value only after the delimiter;
    without a header the first record is a row; a document's rows are under its field), and
    a shard's format is part of every key kept across jobs (the shard index's entries,
    derived copies): as a name of its own, a count or a copy made one way is never taken
    for another's. The catalog renames the shards it lists so."""
    if name == "jsonl" and options.field is not None:
        return f"{name}[field={options.field}]"
    if (options.delimiter is None and options.column_names is None) or name not in _DELIMITED:
        return name
    native = str(getattr(get_format(name), "delimiter", ","))  # every format of _DELIMITED's
    delimiter = native if options.delimiter is None else options.delimiter
    if delimiter == native and options.column_names is None:
        return name
    return variant(name, delimiter, header=options.column_names is None)


def open_reader(ctx: ReadContext) -> ShardReader:
    """A reader over ``ctx.shard`` by its format, whose batches are in the stream's column
    order and types (a shard that differs only so is conformed: :mod:`ingest.formats.conform`)
    and hold the shard's hive partition columns too (:attr:`ReadContext.partition_columns`,
    :mod:`ingest.formats.partitions`), of the version listed (a local file's batches are
    checked: :mod:`ingest.formats.listed_version`). Every read of the stream's rows opens
    one so."""
    known = ctx.info.schema
    if known is None or ctx.schema is None or known.equals(ctx.schema):
        reader = _format_reader(ctx)
    else:
        absent = conform.absent(known, ctx.schema, ctx.columns, declares(ctx.schema_origin))
        unnamed = ctx.columns is None and not set(known.names) <= set(ctx.schema.names)
        wanted = ctx.schema.names if ctx.columns is None else ctx.columns
        inner = ctx
        if absent or unnamed:  # a declared schema's: the format reads the columns it names
            inner = replace(ctx, columns=[c for c in wanted if c not in absent])
        reader = _format_reader(inner)
        cast = read_casts(ctx)
        reorder = conform.reorders(known, ctx.schema, ctx.columns)
        reshape = reorder or bool(absent) or unnamed  # the columns come in another set
        if cast or reshape or conform.relabels(known, ctx.schema):
            order = list(wanted) if reshape else None
            reader = conform.ConformingReader(ctx, reader, cast, order, absent)
    if ctx.partition_columns:
        reader = PartitionedReader(ctx, reader)
    path = ctx.source.local_path(ctx.shard)
    return reader if path is None else ListedVersionReader(ctx, reader, path)


def _format_reader(ctx: ReadContext) -> ShardReader:
    """The shard's format's reader; for a shard with deleted rows, its reader of the file as
    written, around which the rows kept are read (:mod:`ingest.formats.deleted_rows`)."""
    deletions = ctx.info.deletions
    if deletions is None:
        return get_format(ctx.shard.format).open(ctx)
    inner = get_format(ctx.shard.format).open(replace(ctx, info=deletions.physical))
    return DeletedRowsReader(ctx, inner, deletions)


def read_casts(ctx: ReadContext) -> dict[str, pa.DataType]:
    """The columns of ``ctx.shard`` read cast to the stream's type (its footer's type is
    another the stream's holds, or one a declared schema casts: :mod:`ingest.formats.conform`),
    each to that type; empty for a shard read in its own types (every shard of a format
    without a footer)."""
    known = ctx.info.schema
    if known is None or ctx.schema is None or known.equals(ctx.schema):
        return {}
    return conform.casts(known, ctx.schema, ctx.columns, declared=declares(ctx.schema_origin))


def given_names(ctx: ReadContext) -> tuple[str, ...] | None:
    """The column names ``ctx`` gives a shard whose files have none (CSV or TSV without a
    header: ``ReadOptions.column_names``); None where the shard names its own."""
    if getattr(get_format(ctx.shard.format), "header", True):
        return None
    return None if ctx.options.column_names is None else tuple(ctx.options.column_names)


def split_compression(path: str) -> tuple[str, str | None]:
    """``("a.jsonl", "gzip")`` for ``"a.jsonl.gz"`` (``("a.tar", "gzip")`` for ``"a.tgz"``);
    ``(path, None)`` when uncompressed."""
    root, ext = posixpath.splitext(path)
    if ext.lower() == ".tgz":
        return root + ".tar", "gzip"
    if ext.lower() in COMPRESSIONS:
        return root, COMPRESSIONS[ext.lower()]
    return path, None


def format_for_path(path: str, *, strict: bool = False) -> str | None:
    """The format name for a file path, from its extension.

    Args:
        path: File path or URL.
        strict: Raise for an unknown extension instead of returning None (used for files
            named explicitly rather than found by a glob or a directory walk).

    Raises:
        ConfigError: If ``strict`` and the extension is unknown.
    """
    root, compression = split_compression(path)
    name = _EXTENSIONS.get(posixpath.splitext(root)[1].lower())
    if name is not None and (compression is None or name in _COMPRESSIBLE):
        return name
    if strict:
        raise ConfigError(
            f"cannot tell the format of {path} from its extension; pass "
            f"format= one of {', '.join(registered_formats())}"
        )
    return None


def known_extensions() -> list[str]:
    """Every extension the registry maps to a format."""
    return sorted(_EXTENSIONS)


class _RegistryResolver:
    """The registry as a listing sees it (an :class:`ingest.storage.sources.FormatResolver`).

    Stateless: it reads the registry at each call, so formats registered later count too.
    """

    def format_of(self, path: str, *, chosen: str | None, explicit: bool) -> str | None:
        """``chosen`` once checked, else the format of ``path``'s extension.

        Raises:
            ConfigError: If ``chosen`` names no format, or ``explicit`` and the extension is
                unknown.
        """
        if chosen is not None:
            fmt = get_format(chosen)  # unknown name -> error listing the known ones
            if fmt.selective and not path.lower().endswith(fmt.extensions):
                if explicit:
                    raise ConfigError(
                        f"{path} is not a {chosen} file (extensions: "
                        f"{', '.join(fmt.extensions)}); name a directory of them"
                    )
                if posixpath.basename(path) in FOLDER_METADATA:  # its files' columns
                    return format_for_path(path)  # taken by the units (folder.group)
                return None  # a folder dataset's README, labels file, ...
            return chosen
        return format_for_path(path, strict=explicit)

    def describe(self) -> str:
        """The known extensions, and the way to name a format instead."""
        return f"known extensions: {', '.join(known_extensions())}; or pass format=..."

    def unread(self, paths: Sequence[str], listed: Sequence[str]) -> str | None:
        """The format read only when named (a folder format: ``Format.selective``) that
        reads the most of ``paths``, as a sentence, where nothing but documents (an
        incidental format: a README.txt) or nothing at all was listed beside them (see
        :class:`~ingest.storage.sources.FormatResolver`); None otherwise."""
        if not paths or not all(get_format(f).incidental for f in listed):
            return None
        counts: dict[str, int] = {}
        for name in registered_formats():
            fmt = get_format(name)
            if fmt.selective:
                counts[name] = sum(p.lower().endswith(fmt.extensions) for p in paths)
        best = max(counts, key=lambda n: counts[n], default=None)
        if best is None or not counts[best]:
            return None
        kind = best.removesuffix("folder")
        return f"it holds {counts[best]} {kind} files, which format={best!r} reads as a dataset"


class IncidentalFilesWarning(UserWarning):
    """A listing left out files of a format that are documents beside shards of another
    (a ``README.txt`` beside Parquet shards; ``format=`` reads them), or the metadata files
    Hugging Face ``datasets`` writes beside its data (``save_to_disk``'s
    ``dataset_info.json`` and ``state.json``)."""


_DATASETS_METADATA = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json"})
"""Files Hugging Face ``datasets`` writes beside its data: ``save_to_disk``'s
``dataset_info.json`` and a ``DatasetDict``'s ``dataset_dict.json``, a Hub repository's
legacy ``dataset_infos.json``."""
_SAVED_STATE = "state.json"
"""``save_to_disk``'s list of its ``.arrow`` files: metadata where an ``.arrow`` file lies
beside it, a name like any other elsewhere."""


def without_incidental(shards: Sequence[Shard]) -> list[Shard]:
    """``shards`` without datasets' metadata files (:func:`_metadata`) and those of an
    incidental format (``Format.incidental``: text) when others are of another format, with
    a warning naming them; all of them where nothing else is listed."""
    shards = _without(shards, _metadata(shards), "Hugging Face datasets' metadata")
    kinds = {s.format for s in shards}
    left = {k for k in kinds if get_format(k).incidental} if len(kinds) > 1 else set()
    if not left or left == kinds:
        return shards
    dropped = {s.url for s in shards if s.format in left}
    return _without(shards, dropped, f"{'/'.join(sorted(left))}", " (documents)")


def _metadata(shards: Sequence[Shard]) -> set[str]:
    """The URLs of files ``datasets`` writes as metadata beside its data, where other
    shards are listed (named alone, they are read)."""
    arrow_dirs = {s.url.rpartition("/")[0] for s in shards if s.url.endswith(".arrow")}
    found = set()
    for s in shards:
        where, _, name = s.url.rpartition("/")
        if name in _DATASETS_METADATA or (name == _SAVED_STATE and where in arrow_dirs):
            found.add(s.url)
    return found if len(found) < len(shards) else set()


def _without(shards: Sequence[Shard], dropped: set[str], what: str, taken: str = "") -> list[Shard]:
    """``shards`` but those of ``dropped`` (URLs), with an :class:`IncidentalFilesWarning`."""
    if not dropped:
        return list(shards)
    urls = [s.url for s in shards if s.url in dropped]
    named = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
    kinds = sorted({s.format for s in shards if s.url not in dropped})
    warnings.warn(
        f"left out {len(urls)} {what} file(s) listed beside {'/'.join(kinds)} shards{taken}: "
        f"{named}; list them apart (with format=... where needed) to read them",
        IncidentalFilesWarning,
        stacklevel=4,
    )
    return [s for s in shards if s.url not in dropped]


FORMAT_RESOLVER = _RegistryResolver()
"""Tells a listing each file's format from the registry (see :class:`_RegistryResolver`)."""
