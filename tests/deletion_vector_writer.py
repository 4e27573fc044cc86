"""Delta deletion vectors written by the protocol (PROTOCOL.md's appendix and Roaring's
RoaringFormatSpec), for tests: no writer here makes them (delta-rs rewrites files on a
DELETE). delta-rs (delta-kernel) reads them through ``deltalake.QueryBuilder``: tests check
these bytes against it, then ingest's reader against both."""

from __future__ import annotations

import json
import struct
import time
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """``data`` (a multiple of 4 bytes) in Z85."""
    assert len(data) % 4 == 0
    out = []
    for at in range(0, len(data), 4):
        value = int.from_bytes(data[at : at + 4], "big")
        digits = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            digits.append(Z85[digit])
        out.append("".join(reversed(digits)))
    return "".join(out)


def bitmap32(values: Sequence[int], runs: bool = False) -> bytes:
    """A 32-bit Roaring bitmap of ``values`` (sorted, distinct): each container an array up
    to 4,096 values, else a bitmap; every container as runs where ``runs``."""
    low = np.asarray(values, np.uint32)
    keys, starts = np.unique(low >> 16, return_index=True)
    groups = np.split(low & 0xFFFF, starts[1:]) if len(low) else []
    count = len(groups)
    bodies = []
    for group in groups:
        if runs:
            breaks = np.flatnonzero(np.diff(group) != 1) + 1
            spans = np.split(group, breaks)
            pairs = [(int(s[0]), len(s) - 1) for s in spans]
            bodies.append(struct.pack(f"<H{2 * len(pairs)}H", len(pairs), *sum(pairs, ())))
        elif len(group) <= 4096:
            bodies.append(group.astype("<u2").tobytes())
        else:
            bits = np.zeros(65536, np.uint8)
            bits[group] = 1
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    if runs:
        head = struct.pack("<I", 12347 | ((count - 1) << 16))
        flags = np.packbits(np.ones(count, np.uint8), bitorder="little").tobytes()
        head += flags[: (count + 7) // 8]
        offsets = count >= 4
    else:
        head = struct.pack("<II", 12346, count)
        offsets = True
    head += b"".join(
        struct.pack("<HH", int(k), len(g) - 1) for k, g in zip(keys, groups, strict=True)
    )
    at = len(head) + (4 * count if offsets else 0)
    if offsets:
        for body in bodies:
            head += struct.pack("<I", at)
            at += len(body)
    return head + b"".join(bodies)


def portable(values: Sequence[int], runs: bool = False) -> bytes:
    """A vector of ``values`` in Roaring's portable 64-bit format, behind Delta's magic."""
    rows = np.asarray(sorted(values), np.uint64)
    high = rows >> np.uint64(32)
    buckets = sorted(set(high.tolist()))
    out = struct.pack("<IQ", 1681511377, len(buckets))
    for key in buckets:
        low = (rows[high == key] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        out += struct.pack("<I", key) + bitmap32(low.tolist(), runs)
    return out


def vector_file(vectors: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """A deletion vector file holding ``vectors``, and each one's offset in it."""
    out, offsets = bytearray(b"\x01"), []
    for data in vectors:
        offsets.append(len(out))
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    return bytes(out), offsets


def in_file(root: Path, data: bytes, prefix: str = "ab") -> dict[str, Any]:
    """A descriptor of ``data`` written to a ``u`` vector file under ``root``."""
    name = uuid.uuid4()
    folder = root / prefix if prefix else root
    folder.mkdir(parents=True, exist_ok=True)
    body, (offset,) = vector_file([data])
    (folder / f"deletion_vector_{name}.bin").write_bytes(body)
    cardinality = len(_rows_of(data))
    return {
        "storageType": "u",
        "pathOrInlineDv": prefix + z85(name.bytes),
        "offset": offset,
        "sizeInBytes": len(data),
        "cardinality": cardinality,
    }


def inline(data: bytes) -> dict[str, Any]:
    """A descriptor of ``data`` inline (padded to 4 bytes for Z85, as Delta does)."""
    padded = data + b"\0" * (-len(data) % 4)
    return {
        "storageType": "i",
        "pathOrInlineDv": z85(padded),
        "sizeInBytes": len(data),
        "cardinality": len(_rows_of(data)),
    }


def _rows_of(data: bytes) -> list[int]:
    from ingest.storage.sources.deletion_vectors import parse

    return [int(r) for r in parse(data)]


def added(table: Path) -> dict[str, dict[str, Any]]:
    """The ``add`` actions of the current files of the Delta table at ``table`` (its log
    without a checkpoint), by path."""
    adds = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds[action["add"]["path"]] = action["add"]
            if "remove" in action:
                adds.pop(action["remove"]["path"], None)
    return adds


def delete_rows(table: Path, vectors: dict[str, dict[str, Any]]) -> None:
    """Commit ``vectors`` (a descriptor by data file path, relative to ``table``) to the
    Delta table at ``table``: each file removed and added again with its vector, as a
    DELETE with deletion vectors commits."""
    log = table / "_delta_log"
    commits = sorted(log.glob("*.json"))
    adds = added(table)
    now = int(time.time() * 1000)
    lines = [{"commitInfo": {"timestamp": now, "operation": "DELETE"}}]
    for path, descriptor in vectors.items():
        add = adds[path]
        remove: dict[str, Any] = {
            k: add[k] for k in ("path", "partitionValues", "size") if k in add
        }
        if add.get("deletionVector"):
            remove["deletionVector"] = add["deletionVector"]
        lines.append(
            {"remove": {**remove, "deletionTimestamp": now, "dataChange": True,
                        "extendedFileMetadata": True}}
        )  # fmt: skip
        lines.append({"add": {**add, "deletionVector": descriptor, "dataChange": True}})
    version = int(commits[-1].stem) + 1
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in lines))
