"""A JSON shard that is one array of objects, read as the JSON Lines it stands for.

Hugging Face ``datasets``' json builder reads a ``.json`` file either as JSON Lines or, when
it is one JSON document, as the array it holds: ``json.dump(rows, f, indent=2)`` is how
Alpaca's ``alpaca_data.json`` and most instruction datasets on the Hub are written. The
JSON Lines format opens every shard it reads from the first byte with :func:`open_json`: a
shard whose first byte past whitespace (and a UTF-8 byte order mark) is ``[`` is such a
document. It is read whole (its size bounded by ``ReadOptions.max_line_bytes``: the whole
document is one record), parsed by the standard library, and handed to the line reader as
one chunk of JSON Lines, an item a line, so that the types, checks and errors are JSON
Lines' own (pyarrow infers and parses them alike). Its only seek point is byte 0: a resume
reads it again from the top. Any other shard is read as it is, its first bytes put back.

Written here because pyarrow's JSON reader takes newline-delimited objects only.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ingest.core.errors import ShardError
from ingest.formats._lines import open_decompressed
from ingest.storage.sources import Shard, Source

_PEEK = 4096
"""The fewest bytes read to find the first one past whitespace."""
_FIRST = re.compile(rb"[^ \t\r\n]")
"""The first byte past whitespace (found without copying the bytes read)."""
_BOM = b"\xef\xbb\xbf"
_FIX = "convert it to JSON Lines, an object a line (jq -c '.[]' FILE > FILE.jsonl)"


class _Peeked:
    """``raw`` with the bytes read from it to look at them (``head``) put back in front."""

    def __init__(self, head: bytes, raw: Any) -> None:
        self._head = head
        self._raw = raw

    def read(self, n: int = -1) -> bytes:
        if not self._head:
            return self._raw.read(n)  # type: ignore[no-any-return]
        if n < 0 or n >= len(self._head):
            out, self._head = self._head, b""
            rest = self._raw.read(-1 if n < 0 else n - len(out))
            return out + rest  # type: ignore[no-any-return]
        out, self._head = self._head[:n], self._head[n:]
        return out

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> _Peeked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Lines:
    """A document's items as JSON Lines, handed over in one read (one chunk, one parse)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, n: int = -1) -> bytes:
        out, self._data = self._data, b""
        return out

    def close(self) -> None:
        self._data = b""

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_json(
    source: Source,
    shard: Shard,
    block_bytes: int,
    max_line_bytes: int,
    field: str | None = None,
) -> tuple[Any, bool]:
    """Open ``shard`` (and its compression) for a read from its first byte: a JSON array
    document as the JSON Lines of its items, anything else as it is
    (:func:`ingest.formats._lines.iter_chunks`'s opener). With ``field``
    (``ReadOptions.field``), the shard is one JSON object, read whole, and its rows are
    under that key: a list of objects, or an object of equal-length column lists (as
    ``datasets``' json builder reads ``field=``).

    Raises:
        ShardError: If a JSON document is over ``max_line_bytes``, not valid JSON or UTF-8,
            or holds an item that is not an object (with ``field``: is no object holding
            the key); each names the fix.
    """
    raw, seekable = open_decompressed(source, shard, block_bytes)
    if field is not None:
        try:
            data = _whole(raw, b"", shard, max_line_bytes)
        finally:
            raw.close()
        return _Lines(_as_lines(data, shard, field)), True
    # The first look is the read the line reader makes first: no read more than before.
    step = max(_PEEK, min(block_bytes, max_line_bytes))
    try:
        head = b""
        while True:
            more = raw.read(step)
            head += more
            first = _FIRST.search(head, len(_BOM) if head.startswith(_BOM) else 0)
            if first or not more:
                break
        if first is None or head[first.start()] != ord("["):
            return _Peeked(head, raw), seekable
        data = _whole(raw, head, shard, max_line_bytes)
    except BaseException:
        raw.close()
        raise
    raw.close()
    return _Lines(_as_lines(data, shard)), True


def _whole(raw: Any, head: bytes, shard: Shard, limit: int) -> bytes:
    """The document: ``head`` and the rest of ``raw``, at most ``limit`` bytes (a JSON
    array's, or an object's read with ``ReadOptions.field``)."""
    parts = [head]
    size = len(head)
    while size <= limit:
        more = raw.read(min(1 << 20, limit + 1 - size))
        if not more:
            return b"".join(parts)
        parts.append(more)
        size += len(more)
    raise ShardError(
        shard.url,
        f"is a JSON document (not JSON Lines), which is read whole, and it is over "
        f"max_line_bytes={limit} bytes",
        f"{_FIX}, or raise ReadOptions(max_line_bytes=...) to read it whole",
        byte=0,
    )


def _as_lines(data: bytes, shard: Shard, field: str | None = None) -> bytes:
    """The rows of the JSON document ``data`` as JSON Lines (UTF-8, a newline after each):
    the items of an array, or those under ``field`` of an object."""
    kind = (
        "JSON array document (it starts with '[')"
        if field is None
        else (f"JSON document read with ReadOptions(field={field!r})")
    )
    document = _parsed(data, shard, kind)
    what = "its JSON array"
    if field is not None:
        document, what = _under(document, shard, field), f"{field!r}"
    for n, item in enumerate(document):  # an array (checked where it was not certain)
        if not isinstance(item, dict):
            raise ShardError(
                shard.url,
                f"item {n} of {what} is {type(item).__name__}, not an object: "
                f"{json.dumps(item)[:80]}",
                "every item must be one JSON object, a row (its keys the columns)",
                row=n,
            )
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    return "".join(f"{dumps(item)}\n" for item in document).encode()


def _parsed(data: bytes, shard: Shard, kind: str) -> Any:
    """The JSON document ``data`` (a ``kind``, for errors), parsed by the standard library."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ShardError(
            shard.url,
            f"is a {kind} that is not UTF-8 (byte {data[e.start]:#04x}: {e.reason})",
            "JSON is UTF-8: re-encode the file (e.g. iconv -f latin1 -t utf-8)",
            byte=e.start,
        ) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ShardError(
            shard.url,
            f"is a {kind} nested too deep for Python's json module",
            "flatten the data (store deep structures as a JSON string)",
            byte=0,
        ) from None
    except ValueError as e:
        at = len(text[: getattr(e, "pos", 0)].encode())
        raise ShardError(
            shard.url,
            f"is a {kind} but not valid JSON ({e})",
            "fix the document (a truncated upload needs writing again), or if it is JSON "
            "Lines, remove what precedes its first object (and leave field out)",
            byte=at,
        ) from None


def _under(document: Any, shard: Shard, field: str) -> list[Any]:
    """The rows under ``field`` of a JSON object: its list, or its object of equal-length
    column lists as a row per position."""
    fix = f"read it without ReadOptions(field={field!r}), or name the key that holds the rows"
    if not isinstance(document, dict):
        kind = "a JSON array" if isinstance(document, list) else type(document).__name__
        raise ShardError(shard.url, f"is {kind}, not an object holding {field!r}", fix, byte=0)
    if field not in document:
        keys = ", ".join(repr(k) for k in list(document)[:10])
        raise ShardError(shard.url, f"has no key {field!r} (its keys: {keys})", fix, byte=0)
    rows = document[field]
    if isinstance(rows, dict) and all(isinstance(c, list) for c in rows.values()):
        lengths = {name: len(c) for name, c in rows.items()}
        if len(set(lengths.values())) > 1:
            raise ShardError(
                shard.url,
                f"the columns of {field!r} differ in length: {lengths}",
                "every column list must hold a value per row",
                byte=0,
            )
        names = list(rows)
        return [
            dict(zip(names, values, strict=True)) for values in zip(*rows.values(), strict=True)
        ]
    if not isinstance(rows, list):
        raise ShardError(
            shard.url,
            f"{field!r} holds {type(rows).__name__}, not a list of objects (rows) or an "
            "object of column lists",
            fix,
            byte=0,
        )
    return rows


__all__ = ["open_json"]
