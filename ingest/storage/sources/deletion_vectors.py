"""Delta deletion vectors: the rows of a data file that a table's version deleted without
rewriting the file (Delta's PROTOCOL.md: "Deletion Vectors", and its appendix "Deletion
Vector Format").

An ``add`` action's ``deletionVector`` (:class:`DeletionVector`) says where its vector is:
inline in the log (``storageType`` ``i``, the bytes Z85-encoded), in a file named by a UUID
under the table's root (``u``: ``<root>/<prefix>/deletion_vector_<uuid>.bin``), or in a file
named by its absolute path (``p``), at ``offset`` in it. A vector is a set of row indexes:
each a 0-based position of a row in the Parquet file. A file holds a version byte (1), then
each vector as its size (4 bytes, big-endian), its bytes, and their CRC-32 (big-endian)
(:func:`from_file`).

A vector's bytes start with a magic number: 1681511377 (little-endian) for Roaring's
portable 64-bit format (what Delta writes: a count of 32-bit buckets, each its key, the
high 32 bits of its values, and a 32-bit Roaring bitmap of the low ones), or 1681511376
(big-endian) for Delta's older native format (a count of 32-bit bitmaps, each its size and
its bytes, the n-th holding the values whose high 32 bits are n: the protocol's own inline
example is one). A 32-bit Roaring bitmap (RoaringFormatSpec) is a header of 16-bit
containers, each a key (the values' high 16 bits) and a cardinality, then each container:
a sorted array of the low 16 bits (up to 4,096 values), a bitmap of 65,536 bits, or runs.

Written here: ``pyroaring`` (CRoaring's binding) has no wheel for every platform this
project runs on, and the format is small. Every vector is checked against what its
descriptor says (its size, its checksum, its cardinality): a vector that reads otherwise is
an error, never rows given back or dropped.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

PORTABLE_MAGIC = 1681511377
"""The magic number of a vector in Roaring's portable 64-bit format (little-endian)."""
NATIVE_MAGIC = 1681511376
"""The magic number of a vector in Delta's native format (big-endian)."""
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: n for n, c in enumerate(_Z85)}
_UUID_CHARS = 20
"""A ``u`` vector's UUID, Z85-encoded, at the end of ``pathOrInlineDv``."""
_COOKIE_RUNS = 12347
_COOKIE_NO_RUNS = 12346
_NO_OFFSETS_BELOW = 4
"""A bitmap with runs and fewer containers than this has no offset header."""
_ARRAY_MAX = 4096
"""A container of more values than this is a bitmap (without runs)."""


VECTOR_FIX = (
    "check the table with its writer (a Delta reader refuses it too), or rewrite the file "
    "without deleted rows (OPTIMIZE ... PURGE on Databricks)"
)
"""The fix named where a file's deletion vector cannot be read or is not the file's."""


class VectorError(ValueError):
    """A deletion vector that does not read as its descriptor says (the caller names the
    table and the file)."""


def z85_decode(text: str) -> bytes:
    """The bytes of ``text`` in Z85 (ZeroMQ's Base85; Delta's encoding of a vector inline
    and of a file's UUID): 5 characters to 4 bytes, big-endian."""
    if len(text) % 5:
        raise VectorError(f"{len(text)} Z85 characters are not a multiple of 5")
    out = bytearray()
    for at in range(0, len(text), 5):
        value = 0
        for char in text[at : at + 5]:
            digit = _Z85_VALUE.get(char)
            if digit is None:
                raise VectorError(f"{char!r} at {at} is not a Z85 character")
            value = value * 85 + digit
        if value >= 1 << 32:
            raise VectorError(f"Z85 characters {text[at : at + 5]!r} exceed 32 bits")
        out += value.to_bytes(4, "big")
    return bytes(out)


@dataclass(frozen=True, slots=True)
class DeletionVector:
    """An ``add`` action's ``deletionVector`` (a descriptor: where its vector is)."""

    storage: str
    """``i`` (inline), ``u`` (a file named by a UUID under the table's root) or ``p`` (a file
    named by its absolute path)."""
    path_or_inline: str
    offset: int | None
    """Where the vector starts in its file (None inline)."""
    size: int
    """The vector's bytes (before Z85, inline)."""
    cardinality: int
    """The rows it deletes."""
    path: str | None = None
    """Its file's path on the table's filesystem, where a table's listing resolved it
    (:meth:`file`); None inline."""

    @classmethod
    def from_action(cls, descriptor: Mapping[str, Any]) -> DeletionVector:
        """The descriptor of an ``add`` action's ``deletionVector`` (its JSON)."""
        try:
            vector = cls(
                storage=str(descriptor["storageType"]),
                path_or_inline=str(descriptor["pathOrInlineDv"]),
                offset=None if descriptor.get("offset") is None else int(descriptor["offset"]),
                size=int(descriptor["sizeInBytes"]),
                cardinality=int(descriptor["cardinality"]),
            )
        except (KeyError, TypeError, ValueError) as bad:
            raise VectorError(
                f"a deletionVector without a valid {bad}: {dict(descriptor)}"
            ) from None
        if vector.storage not in ("i", "u", "p"):
            raise VectorError(f"storageType {vector.storage!r} is none of 'i', 'u' and 'p'")
        return vector

    @property
    def unique_id(self) -> str:
        """What tells this vector from another of the same file (the protocol's
        ``uniqueId``): a file's rows are those of its path and this."""
        return _unique_id(self.storage, self.path_or_inline, self.offset)

    def file(self, root: str) -> str | None:
        """The path (or URL) of the file holding the vector, for a table at ``root`` (the
        same form: a path or a URL); None inline."""
        if self.storage == "i":
            return None
        if self.storage == "p":
            return self.path_or_inline
        prefix = self.path_or_inline[:-_UUID_CHARS]
        name = uuid.UUID(bytes=z85_decode(self.path_or_inline[-_UUID_CHARS:]))
        parts = [root.rstrip("/"), *([prefix] if prefix else []), f"deletion_vector_{name}.bin"]
        return "/".join(parts)

    def span(self) -> tuple[int, int]:
        """The bytes of its file to read: the vector's size, its bytes and its checksum."""
        offset = 1 if self.offset is None else self.offset  # after the file's version byte
        return offset, offset + 4 + self.size + 4

    def rows(self, data: bytes | None = None) -> npt.NDArray[np.uint64]:
        """The row indexes it deletes, sorted: inline from the descriptor, else from
        ``data``, the bytes of :meth:`span` in its file.

        Raises:
            VectorError: If the bytes do not read as a vector of the descriptor's size,
                checksum and cardinality.
        """
        if self.storage == "i":
            raw = z85_decode(self.path_or_inline)
            if len(raw) < self.size:
                raise VectorError(f"the inline vector holds {len(raw)} bytes, not {self.size}")
            rows = parse(raw[: self.size])
        else:
            rows = parse(_framed(self, data))
        if len(rows) != self.cardinality:
            raise VectorError(
                f"the vector holds {len(rows)} row indexes, its descriptor says {self.cardinality}"
            )
        return rows


def unique_id(descriptor: Mapping[str, Any] | None) -> str:
    """:attr:`DeletionVector.unique_id` of an action's ``deletionVector`` (its JSON), as it
    is ("" for none): how the protocol tells one file's actions apart."""
    if not descriptor:
        return ""
    return _unique_id(
        descriptor.get("storageType"), descriptor.get("pathOrInlineDv"), descriptor.get("offset")
    )


def _unique_id(storage: object, path_or_inline: object, offset: object) -> str:
    at = "" if offset is None else f"@{offset}"
    return f"{storage}{path_or_inline}{at}"


def _framed(vector: DeletionVector, data: bytes | None) -> bytes:
    """The vector's bytes in ``data`` (its :meth:`DeletionVector.span` of its file), checked
    against its size and its CRC-32."""
    start, stop = vector.span()
    if data is None or len(data) != stop - start:
        got = "none" if data is None else f"{len(data)} bytes"
        raise VectorError(f"the vector's {stop - start} bytes at {start} read as {got}")
    (size,) = struct.unpack_from(">i", data, 0)
    if size != vector.size:
        raise VectorError(
            f"the vector at {vector.span()[0]} is {size} bytes by its file, {vector.size} by "
            "its descriptor"
        )
    body = data[4 : 4 + size]
    (checksum,) = struct.unpack_from(">I", data, 4 + size)
    if zlib.crc32(body) != checksum:
        raise VectorError(f"the vector at {vector.span()[0]} fails its CRC-32 checksum")
    return body


def parse(data: bytes) -> npt.NDArray[np.uint64]:
    """The row indexes of a vector's bytes (its magic number, then its bitmap), sorted.

    Raises:
        VectorError: If the bytes are not a vector of either format, whole.
    """
    if len(data) < 4:
        raise VectorError(f"a vector of {len(data)} bytes has no magic number")
    try:
        if struct.unpack_from("<I", data)[0] == PORTABLE_MAGIC:
            rows, end = _portable(data, 4)
        elif struct.unpack_from(">I", data)[0] == NATIVE_MAGIC:
            rows, end = _native(data, 4)
        else:
            raise VectorError(
                f"magic number {data[:4].hex()} is neither Roaring's portable format's "
                f"({PORTABLE_MAGIC}, little-endian) nor Delta's native format's ({NATIVE_MAGIC})"
            )
    except VectorError:
        raise
    except (struct.error, ValueError):  # struct's and numpy's reads past the end
        raise VectorError(f"the vector ends early ({len(data)} bytes)") from None
    if end != len(data):
        raise VectorError(f"the vector's bitmap ends at byte {end} of {len(data)}")
    if len(rows) > 1 and not (np.diff(rows) > 0).all():
        raise VectorError("the vector's row indexes are not in ascending order")
    return rows


def _portable(data: bytes, at: int) -> tuple[npt.NDArray[np.uint64], int]:
    """Roaring's portable 64-bit format from ``at``: a count of buckets (8 bytes), each a
    key (4 bytes, the values' high 32 bits) and a 32-bit bitmap; the rows and the end."""
    (buckets,) = struct.unpack_from("<Q", data, at)
    at += 8
    parts = []
    for _ in range(buckets):
        (key,) = struct.unpack_from("<I", data, at)
        low, at = _bitmap32(data, at + 4)
        parts.append(_high(key, low))
    return _joined(parts), at


def _native(data: bytes, at: int) -> tuple[npt.NDArray[np.uint64], int]:
    """Delta's native format from ``at``: a count of 32-bit bitmaps (4 bytes, big-endian),
    each its size (4 bytes, big-endian) and its bytes, the n-th holding the values whose
    high 32 bits are n."""
    (count,) = struct.unpack_from(">i", data, at)
    at += 4
    parts = []
    for key in range(count):
        (size,) = struct.unpack_from(">i", data, at)
        low, end = _bitmap32(data, at + 4)
        if end != at + 4 + size:
            raise VectorError(f"bitmap {key} at byte {at} is {end - at - 4} bytes, not {size}")
        parts.append(_high(key, low))
        at = end
    return _joined(parts), at


def _high(key: int, low: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint64]:
    """The 64-bit values of a 32-bit bitmap's ``low`` ones, their high 32 bits ``key``."""
    return (np.uint64(key) << np.uint64(32)) | low.astype(np.uint64)


def _joined(parts: list[npt.NDArray[np.uint64]]) -> npt.NDArray[np.uint64]:
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def _bitmap32(data: bytes, at: int) -> tuple[npt.NDArray[np.uint32], int]:
    """A 32-bit Roaring bitmap (RoaringFormatSpec) from ``at``: its values and its end."""
    (cookie,) = struct.unpack_from("<I", data, at)
    if cookie & 0xFFFF == _COOKIE_RUNS:
        count = (cookie >> 16) + 1
        flags = data[at + 4 : at + 4 + (count + 7) // 8]
        runs = np.unpackbits(np.frombuffer(flags, np.uint8), bitorder="little")[:count]
        at += 4 + len(flags)
        offsets = count >= _NO_OFFSETS_BELOW
    elif cookie == _COOKIE_NO_RUNS:
        (count,) = struct.unpack_from("<I", data, at + 4)
        runs = np.zeros(count, np.uint8)
        at += 8
        offsets = True
    else:
        raise VectorError(f"a 32-bit bitmap's cookie {cookie} is not Roaring's")
    header = np.frombuffer(data, "<u2", 2 * count, at).reshape(-1, 2).astype(np.uint32)
    at += 4 * count + (4 * count if offsets else 0)
    parts = []
    for (key, less), run in zip(header, runs, strict=True):
        low, at = _container(data, at, int(less) + 1, bool(run))
        parts.append((key << np.uint32(16)) | low)
    values = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    return values, at


def _container(
    data: bytes, at: int, cardinality: int, run: bool
) -> tuple[npt.NDArray[np.uint32], int]:
    """One container's low 16 bits from ``at`` (runs, an array or a bitmap) and its end."""
    if run:
        (count,) = struct.unpack_from("<H", data, at)
        pairs = np.frombuffer(data, "<u2", 2 * count, at + 2).reshape(-1, 2).astype(np.uint32)
        lengths = pairs[:, 1] + 1
        starts = np.repeat(pairs[:, 0], lengths)
        steps = np.arange(int(lengths.sum()), dtype=np.uint32) - np.repeat(
            np.cumsum(lengths) - lengths, lengths
        ).astype(np.uint32)
        values = starts + steps
        end = at + 2 + 4 * count
    elif cardinality <= _ARRAY_MAX:
        values = np.frombuffer(data, "<u2", cardinality, at).astype(np.uint32)
        end = at + 2 * cardinality
    else:
        bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, at), bitorder="little")
        values = np.flatnonzero(bits).astype(np.uint32)
        end = at + 8192
    if len(values) != cardinality or int(values.max(initial=0)) > 0xFFFF:
        raise VectorError(
            f"a container at byte {at} holds {len(values)} values, its header says {cardinality}"
        )
    return values, end


__all__ = [
    "NATIVE_MAGIC",
    "PORTABLE_MAGIC",
    "VECTOR_FIX",
    "DeletionVector",
    "VectorError",
    "parse",
    "unique_id",
    "z85_decode",
]
