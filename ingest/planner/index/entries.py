"""One entry of the shard index: its key (the shard's identity, size, version and format, and
:data:`INDEX_VERSION`), the name it is stored under, and its JSON (rows, blocks and seek
points), checked when it is read back."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ingest.core.errors import redact
from ingest.formats.base import Seek, ShardInfo
from ingest.storage.sources import Shard

INDEX_VERSION = 1
"""Version of the entry layout; part of every key, so a new layout starts a fresh index."""


class CorruptEntryError(Exception):
    """An entry that must not be trusted; the message says why."""


def shard_identity(url: str) -> str:
    """The URL an entry is keyed by and records: no ``user:pass@``; for HTTP, no query.

    Signed HTTP URLs carry their tokens in the query, which changes from job to job and
    must never be written down. The same object reached with other credentials has the
    same identity.
    """
    clean = redact(url)
    if clean != url:
        clean = clean.replace("://***@", "://", 1)
    parts = urlsplit(clean)
    if parts.scheme in ("http", "https"):
        clean = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return clean


def _key(shard: Shard) -> dict[str, Any]:
    return {
        "version": INDEX_VERSION,
        "url": shard_identity(shard.url),
        "size": shard.size,
        "shard_version": shard.version,
        "format": shard.format,
    }


def entry_name(shard: Shard) -> str:
    """Where ``shard``'s index entry is kept: a name derived from its key."""
    digest = hashlib.sha256(json.dumps(_key(shard), sort_keys=True).encode()).hexdigest()
    return f"{digest[:2]}/{digest}.json"


def encode_entry(shard: Shard, info: ShardInfo) -> bytes:
    """The JSON bytes stored for ``shard``'s index ``info`` (rows, blocks, seek points)."""
    if info.rows is None:
        raise ValueError(f"{redact(shard.url)}: cannot store an index without a row count")
    doc = {
        **_key(shard),
        "rows": info.rows,
        "blocks": None if info.blocks is None else list(info.blocks),
        "seeks": [[row, cursor] for row, cursor in info.seeks],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CorruptEntryError(f"{what} is {value!r}, not an integer >= 0")
    return value


def decode_entry(shard: Shard, data: bytes) -> ShardInfo:
    """Parse and check an entry written by :func:`encode_entry` for ``shard``.

    Raises:
        CorruptEntryError: If it does not parse, belongs to another key or is inconsistent.
    """
    doc = _json_object(data)
    for name, want in _key(shard).items():
        if doc.get(name) != want:
            raise CorruptEntryError(f"{name} is {doc.get(name)!r}, expected {want!r}")
    rows = _int(doc.get("rows"), "rows")
    blocks = _blocks(doc.get("blocks"), rows)
    return ShardInfo(rows=rows, blocks=blocks, seeks=_seeks(doc.get("seeks"), rows))


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptEntryError(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise CorruptEntryError(f"not a JSON object but {type(doc).__name__}")
    return doc


def _blocks(raw_blocks: Any, rows: int) -> tuple[int, ...] | None:
    """An entry's block starts: None, or increasing starts within ``rows``."""
    if raw_blocks is None:
        return None
    if not isinstance(raw_blocks, list):
        raise CorruptEntryError(f"blocks is {type(raw_blocks).__name__}, not a list")
    blocks = tuple(_int(b, "a block start") for b in raw_blocks)
    if list(blocks) != sorted(set(blocks)) or any(b > rows for b in blocks):
        raise CorruptEntryError("block starts are not increasing within the row count")
    return blocks


def _seeks(raw_seeks: Any, rows: int) -> tuple[Seek, ...]:
    """An entry's seek points: ``[row, cursor]`` pairs in order, rows within ``rows``."""
    if not isinstance(raw_seeks, list):
        raise CorruptEntryError(f"seeks is {type(raw_seeks).__name__}, not a list")
    seeks: list[Seek] = []
    for item in raw_seeks:
        if not isinstance(item, list) or len(item) != 2:
            raise CorruptEntryError(f"seek point {item!r} is not a [row, cursor] pair")
        seeks.append((_int(item[0], "a seek row"), _int(item[1], "a seek cursor")))
    if seeks != sorted(seeks) or any(row > rows for row, _ in seeks):
        raise CorruptEntryError("seek points are not in order within the row count")
    return tuple(seeks)


FOOTER = "footer"
"""The kind of blob that is a shard's footer (the bytes its format gave to inspect it)."""
SCHEMA = "schema"
"""The kind of blob that is a schema inferred from a shard's bytes (Arrow IPC), kept under
what its inference depends on besides them (``inferred``)."""


def _blob_key(shard: Shard, kind: str, inferred: str | None) -> dict[str, Any]:
    return {**_key(shard), "kind": kind} | ({} if inferred is None else {"inferred": inferred})


def blob_name(shard: Shard, kind: str = FOOTER, inferred: str | None = None) -> str:
    """Where ``shard``'s blob of ``kind`` is kept: apart from its index entry, under the same
    key (and ``inferred``, for a schema)."""
    digest = hashlib.sha256(
        json.dumps(_blob_key(shard, kind, inferred), sort_keys=True).encode()
    ).hexdigest()
    return f"{kind}s/{digest[:2]}/{digest}.json"


def encode_blob(
    shard: Shard, data: bytes, kind: str = FOOTER, inferred: str | None = None
) -> bytes:
    """The JSON bytes stored for ``shard``'s blob of ``kind`` (its bytes, base64)."""
    doc = {**_blob_key(shard, kind, inferred), kind: base64.b64encode(data).decode()}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_blob(
    shard: Shard, data: bytes, kind: str = FOOTER, inferred: str | None = None
) -> bytes:
    """The bytes of a blob written by :func:`encode_blob` for ``shard``, ``kind`` and
    ``inferred``.

    Raises:
        CorruptEntryError: If it does not parse or belongs to another key.
    """
    doc = _json_object(data)
    for name, want in _blob_key(shard, kind, inferred).items():
        if doc.get(name) != want:
            raise CorruptEntryError(f"{name} is {doc.get(name)!r}, expected {want!r}")
    blob = doc.get(kind)
    if not isinstance(blob, str):
        raise CorruptEntryError(f"{kind} is {type(blob).__name__}, not a base64 string")
    try:
        return base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError) as e:
        raise CorruptEntryError(f"{kind} is not base64 ({e})") from None


def listing_name(key: str) -> str:
    """Where the listing saved under ``key`` is kept."""
    h = hashlib.sha256(f"listing\0{key}\0{INDEX_VERSION}".encode()).hexdigest()
    return f"listings/{h[:2]}/{h}.json"
