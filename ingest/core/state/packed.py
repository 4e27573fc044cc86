"""The packed form of version 3: a listing's columns (``dataset.packed``) and interval sets
as one bitmap (``partial.packed``), zlib-compressed and base64-encoded, each checked as it
is read (the layout is in :mod:`ingest.core.state`). Pure."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.core.errors import StateError
from ingest.core.intervals import IntervalSet
from ingest.core.keyed import set_bounds
from ingest.core.state.checks import MAX_STATE_BYTES, checked_int
from ingest.core.state.shards import ShardColumns, ShardRecord, utf8_joined


@dataclass(frozen=True, slots=True)
class PackedFingerprint:
    """The identity of a packed listing: the full digest and short hashes per shard.

    A packed state keeps neither sizes nor versions (a million etags alone take 32 MB):
    ``digest`` tells exactly whether a listing holds the same shards, and the hashes name
    the ones that changed (:func:`ingest.core.state.matching.match_listing`).
    """

    digest: str
    size_hashes: npt.NDArray[np.uint8]
    version_hashes: npt.NDArray[np.uint16]
    """0 where the shard had no version (such versions are never compared)."""

    @classmethod
    def of(cls, shards: Sequence[ShardRecord]) -> PackedFingerprint:
        return cls.of_columns(ShardColumns.of(shards))

    @classmethod
    def of_columns(cls, columns: ShardColumns) -> PackedFingerprint:
        return cls(columns.digest(), size_hashes(columns.sizes), version_hashes(columns.versions))


# -- the packed listing ----------------------------------------------------------------------

_PACKED_FIELDS = ("count", "prefix", "urls", "rows", "size_hashes", "version_hashes", "sha256")
_CHUNK = 1 << 16
"""URLs front-coded per numpy pass (bounds the memory of one pass)."""


def size_hashes(sizes: Sequence[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """8 bits of splitmix64 of each size."""
    with np.errstate(over="ignore"):
        z = np.asarray(sizes, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((z ^ (z >> np.uint64(31))) >> np.uint64(56)).astype(np.uint8)


def version_hashes(versions: Sequence[str]) -> npt.NDArray[np.uint16]:
    """16 bits of the CRC-32 of each version, never 0; 0 where there is no version."""
    crc = np.fromiter(map(zlib.crc32, map(str.encode, versions)), np.uint32, len(versions))
    crc |= np.uint32(1)
    hashes = (crc >> np.uint32(16)).astype(np.uint16)
    hashes[hashes == 0] = 1
    hashes[np.fromiter(map(len, versions), np.int64, len(versions)) == 0] = 0
    return hashes


def byte_shuffled(values: npt.NDArray[Any], dtype: str) -> bytes:
    """Little-endian ``values`` with byte ``k`` of every value together (compresses better)."""
    raw = np.ascontiguousarray(values, dtype=dtype)
    width = raw.dtype.itemsize
    return np.ascontiguousarray(raw.view(np.uint8).reshape(len(raw), width).T).tobytes()


def _unshuffled(raw: bytes, dtype: str, count: int) -> npt.NDArray[Any]:
    width = np.dtype(dtype).itemsize
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(width, count)
    return np.ascontiguousarray(planes.T).view(dtype).ravel()


def front_coded(text: bytes, lengths: npt.NDArray[np.int64], skip: int = 0) -> bytes:
    """Strings front-coded: ``shared`` (bytes in common with the previous string), the
    ``lengths`` of the rest, and the rest of each.

    Args:
        text: The strings one after the other (:func:`utf8_joined`).
        lengths: The length of each string in bytes.
        skip: Bytes at the start of every string that are left out (a common prefix).
    """
    buf = np.frombuffer(text, dtype=np.uint8)
    lengths = lengths - skip
    starts = np.cumsum(lengths + skip) - lengths
    shared = np.zeros(len(lengths), dtype=np.int64)
    columns = np.arange(int(lengths.max(initial=0)), dtype=np.int64)
    for a in range(1, len(lengths), _CHUNK):
        lens = lengths[a - 1 : a + _CHUNK]
        # Each string of the chunk padded with zeros to the longest: one row per string.
        inside = columns[: int(lens.max())] < lens[:, None]
        at = np.where(inside, starts[a - 1 : a + _CHUNK, None] + columns[: inside.shape[1]], 0)
        m = np.where(inside, buf[at], 0)
        same = np.concatenate((m[1:] == m[:-1], np.zeros((len(m) - 1, 1), bool)), axis=1)
        shared[a : a + len(m) - 1] = np.minimum(
            np.argmin(same, axis=1), np.minimum(lens[1:], lens[:-1])
        )
    rest = lengths - shared
    total = int(rest.sum())
    at = np.repeat(starts + shared - (np.cumsum(rest) - rest), rest) + np.arange(total)
    return byte_shuffled(shared, "<u4") + byte_shuffled(rest, "<u4") + buf[at].tobytes()


def pack_listing(
    urls: Sequence[str], rows: npt.NDArray[np.int64], fingerprint: PackedFingerprint
) -> dict[str, Any]:
    """The ``dataset.packed`` object of a listing: its columns, compressed, and their sha256."""
    prefix = _common_prefix(min(urls), max(urls)) if urls else ""
    text, lengths = utf8_joined(urls)
    columns = {
        "urls": front_coded(text, lengths, len(prefix.encode())),
        "rows": byte_shuffled(rows, "<i8"),
        "size_hashes": fingerprint.size_hashes.tobytes(),
        "version_hashes": byte_shuffled(fingerprint.version_hashes, "<u2"),
    }
    out: dict[str, Any] = {"count": len(urls), "prefix": prefix}
    for name, raw in columns.items():
        out[name] = base64.b64encode(zlib.compress(raw, 6)).decode()
    out["sha256"] = _packed_sha256(len(urls), prefix, columns)
    return out


def _common_prefix(a: str, b: str) -> str:
    """The characters ``a`` and ``b`` begin with (of the least and greatest URL: of all)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _packed_sha256(count: int, prefix: str, columns: Mapping[str, bytes]) -> str:
    h = hashlib.sha256(json.dumps([count, prefix]).encode())
    for name in _PACKED_FIELDS[2:-1]:
        h.update(len(columns[name]).to_bytes(8, "little"))
        h.update(columns[name])
    return h.hexdigest()


def _inflated(data: Mapping[str, Any], name: str, limit: int) -> bytes:
    """Column ``name`` of ``dataset.packed``, decoded, at most ``limit`` bytes."""
    text = data[name]
    fix = "the state was edited or truncated: save it again"
    if not isinstance(text, str):
        raise StateError(f"dataset.packed.{name} must be a base64 string; {fix}")
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(text, validate=True), limit + 1)
    except (binascii.Error, ValueError, zlib.error) as e:
        raise StateError(
            f"dataset.packed.{name} is not zlib-compressed base64 ({e}); {fix}"
        ) from None
    if len(raw) > limit or not inflate.eof:
        raise StateError(
            f"dataset.packed.{name} holds more than the {limit} bytes its "
            f"{data['count']} shards need, or is cut short; {fix}"
        )
    return raw


def unpack_listing(data: object, expected: object) -> tuple[list[ShardRecord], PackedFingerprint]:
    """The shards and fingerprint of a ``dataset.packed`` object, checked."""
    if not isinstance(data, Mapping) or sorted(data) != sorted(_PACKED_FIELDS):
        got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise StateError(
            f"dataset.packed must be an object with the fields {list(_PACKED_FIELDS)}, "
            f"got {got}; pass the state unchanged"
        )
    count = checked_int(data["count"], "dataset.packed.count")
    prefix = data["prefix"]
    if not isinstance(prefix, str):
        raise StateError(f"dataset.packed.prefix must be a string, got {prefix!r}")
    if not isinstance(expected, str):
        raise StateError(f"dataset.digest must be a sha256 string, got {expected!r}")
    columns = {
        "urls": _inflated(data, "urls", MAX_STATE_BYTES * 4),
        "rows": _inflated(data, "rows", 8 * count),
        "size_hashes": _inflated(data, "size_hashes", count),
        "version_hashes": _inflated(data, "version_hashes", 2 * count),
    }
    if _packed_sha256(count, prefix, columns) != data["sha256"]:
        raise StateError(
            "dataset.packed does not match its sha256: the state was edited or corrupted; "
            "save it again"
        )
    for name, width in (("rows", 8), ("size_hashes", 1), ("version_hashes", 2)):
        if len(columns[name]) != width * count:
            raise StateError(
                f"dataset.packed.{name} holds {len(columns[name])} bytes, not the "
                f"{width * count} of {count} shards; save the state again"
            )
    rows = _unshuffled(columns["rows"], "<i8", count)
    if count and int(rows.min()) < -1:
        raise StateError("dataset.packed.rows holds a negative row count; save the state again")
    urls = _front_decoded(columns["urls"], count, prefix)
    shards = [
        ShardRecord(url, 0, "", None if n < 0 else n)
        for url, n in zip(urls, rows.tolist(), strict=True)
    ]
    fingerprint = PackedFingerprint(
        expected,
        np.frombuffer(columns["size_hashes"], dtype=np.uint8).copy(),
        _unshuffled(columns["version_hashes"], "<u2", count),
    )
    return shards, fingerprint


def _front_decoded(raw: bytes, count: int, prefix: str) -> list[str]:
    """The URLs of :func:`front_coded` bytes, ``prefix`` put back."""
    head = 8 * count
    if len(raw) < head:
        raise StateError(
            f"dataset.packed.urls holds {len(raw)} bytes, fewer than {count} shards need; "
            "save the state again"
        )
    shared = _unshuffled(raw[: 4 * count], "<u4", count).tolist()
    lengths = _unshuffled(raw[4 * count : head], "<u4", count).tolist()
    if sum(lengths) != len(raw) - head:
        raise StateError(
            "dataset.packed.urls: its lengths do not add up to its text; save the state again"
        )
    out = []
    previous, at = b"", head
    for n, (keep, length) in enumerate(zip(shared, lengths, strict=True)):
        if keep > len(previous):
            raise StateError(
                f"dataset.packed.urls: URL {n} shares {keep} bytes with a URL of "
                f"{len(previous)}; save the state again"
            )
        previous = previous[:keep] + raw[at : at + length]
        at += length
        try:
            out.append(prefix + previous.decode())
        except UnicodeDecodeError:
            raise StateError(
                f"dataset.packed.urls: URL {n} is not UTF-8; save the state again"
            ) from None
    return out


# -- the packed interval sets ----------------------------------------------------------------

_SET_FIELDS = ("shards", "from", "to", "bits")


def pack_sets(
    key: npt.NDArray[np.int64], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> dict[str, str]:
    """Interval sets as one bitmap: each set's rows from its first to its last, byte-aligned.

    ``key``, ``lo``, ``hi``: the sets' intervals, set after set in the order of their keys
    (:func:`ingest.core.intervals.stack`). The rows of a half-consumed shuffle window take about
    a bit each; consumed prefixes and untouched stretches are runs of equal bytes that zlib
    all but removes.
    """
    heads, tails = set_bounds(key)
    keys = key[heads]
    first, last = lo[heads], hi[tails - 1]
    extent = last - first
    # Each set's bits: its intervals (ones) and the gaps between them (zeros), then zeros to
    # its byte's end; all sets' bits written in one pass.
    gaps = np.empty(len(lo), dtype=np.int64)
    gaps[:-1] = lo[1:] - hi[:-1]
    gaps[tails - 1] = -extent % 8
    lengths = np.empty(2 * len(lo), dtype=np.int64)
    lengths[0::2] = hi - lo
    lengths[1::2] = gaps
    ones = np.zeros(2 * len(lo), dtype=bool)
    ones[0::2] = True
    bits = np.packbits(np.repeat(ones, lengths), bitorder="little").tobytes()
    columns = {
        "shards": byte_shuffled(np.diff(keys, prepend=0), "<u4"),
        "from": byte_shuffled(first, "<i8"),
        "to": byte_shuffled(extent, "<i8"),
        "bits": bits,
    }
    return {k: base64.b64encode(zlib.compress(v, 6)).decode() for k, v in columns.items()}


def unpack_sets(data: object, what: str) -> dict[str, IntervalSet]:
    """The sets of :func:`pack_sets`, keyed by shard index as a string (checked later)."""
    fix = "the state was edited or truncated: save it again"
    if not isinstance(data, Mapping) or sorted(data) != sorted(_SET_FIELDS):
        raise StateError(f"{what} must be an object with the fields {list(_SET_FIELDS)}; {fix}")
    raw: dict[str, bytes] = {}
    for name in _SET_FIELDS:
        text = data[name]
        try:
            if not isinstance(text, str):
                raise ValueError("not a string")
            inflate = zlib.decompressobj()
            raw[name] = inflate.decompress(base64.b64decode(text, validate=True), MAX_STATE_BYTES)
            if not inflate.eof:
                raise ValueError("cut short or too long")
        except (binascii.Error, ValueError, zlib.error) as e:
            raise StateError(f"{what}.{name} is not zlib-compressed base64 ({e}); {fix}") from None
    count = len(raw["shards"]) // 4
    if len(raw["shards"]) != 4 * count or {len(raw["from"]), len(raw["to"])} != {8 * count}:
        raise StateError(f"{what}: its columns are not of one length; {fix}")
    keys = np.cumsum(_unshuffled(raw["shards"], "<u4", count).astype(np.int64))
    first = _unshuffled(raw["from"], "<i8", count)
    spans = _unshuffled(raw["to"], "<i8", count)
    if count and (int(first.min()) < 0 or int(spans.min()) < 0):
        raise StateError(f"{what}: a set begins or ends below row 0; {fix}")
    nbytes = (spans + 7) // 8
    if int(nbytes.sum()) != len(raw["bits"]):
        raise StateError(
            f"{what}.bits holds {len(raw['bits'])} bytes, not the {int(nbytes.sum())} its "
            f"{count} sets need; {fix}"
        )
    bits = np.frombuffer(raw["bits"], dtype=np.uint8)
    out: dict[str, IntervalSet] = {}
    at = 0
    for k, a, n, b in zip(
        keys.tolist(), first.tolist(), spans.tolist(), nbytes.tolist(), strict=True
    ):
        member = np.unpackbits(bits[at : at + b], count=n, bitorder="little").astype(np.int8)
        at += b
        edges = np.diff(member, prepend=0, append=0)
        rows = IntervalSet()
        rows.add_many(np.flatnonzero(edges == 1) + a, np.flatnonzero(edges == -1) + a)
        out[str(k)] = rows
    return out
