"""Tar members read from a byte stream, for the WebDataset format
(:mod:`ingest.formats.webdataset`): each member's name, type, link name and data, and the
byte its first header starts at.

Written here rather than taken from Python's ``tarfile`` for two reasons. ``tarfile`` parses
each header through several layers of Python (a ``TarInfo``, every field of the header, a
file object per member's data): 25-30 us a member, most of the CPU a WebDataset stream
spends on a sample of small fields. And in its stream mode (``r|``, the only one a shard
read through once can use) a header that fails its checksum after the first member ends the
archive as if it were its end marker: the members after a corrupt header were lost without
a word. Here a corrupt header is an error that names its byte, and the archive ends at its
end marker (a zero block) only.

What is read, as ``tarfile`` reads it: POSIX ustar headers (a name's prefix field
included), GNU ones (long names and long link names, ``L`` and ``K``), PAX extended headers
(``x``; their ``path``, ``linkpath`` and ``size``), octal and base-256 numbers, checksums
signed or unsigned, a V7 directory (a regular file whose name ends with ``/``). Unlike it:
a PAX global header (``g``) is skipped, not applied to the members after it (a read that
starts at a member's offset, a resume, would not see it, and a member's name must not
depend on where the read began); and a sparse member (GNU ``S`` or PAX ``GNU.sparse.*``) is
given as its own type, :data:`SPARSE`, not rebuilt (no WebDataset writer makes one).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

BLOCK = 512
REGULAR = b"0"
"""The type of a regular file (``\\0`` and ``7``, contiguous, are given as this)."""
DIRECTORY = b"5"
SPARSE = b"S"
HARD_LINK, SYMBOLIC_LINK, CHARACTER_DEVICE, BLOCK_DEVICE, FIFO = b"1", b"2", b"3", b"4", b"6"
_REGULAR = frozenset({b"0", b"\0", b"7"})
_HAS_NO_DATA = frozenset(
    {HARD_LINK, SYMBOLIC_LINK, CHARACTER_DEVICE, BLOCK_DEVICE, DIRECTORY, FIFO}
)
"""Links, devices, FIFOs and directories: their size field counts no data blocks."""
_LONG = {b"L": "name", b"K": "linkname"}
_PAX = frozenset({b"x", b"X"})  # X: Solaris's extended header, as tarfile reads it
_PAX_GLOBAL = b"g"
_EXTENDING = frozenset({*_LONG, *_PAX, _PAX_GLOBAL})
_PAX_KEYS = {b"path": "name", b"linkpath": "linkname", b"size": "size"}
_ZERO = bytes(BLOCK)
_SPACES = 8 * ord(" ")


class TarFormatError(Exception):
    """The bytes are not a tar archive at ``byte`` (a header that fails its checksum, one
    cut short, a number that is not one, data that ends early)."""

    def __init__(self, message: str, byte: int) -> None:
        super().__init__(message)
        self.byte = byte


class Member(NamedTuple):
    offset: int
    """The byte its first header starts at (a long name's or a PAX header's, if any):
    where a read of the archive may start again."""
    name: str
    type: bytes
    """One byte: :data:`REGULAR`, :data:`DIRECTORY`, :data:`SPARSE`, or the header's own."""
    linkname: str
    data: bytes
    """A regular file's bytes; empty for any other member."""


class Members:
    """The members of the tar archive in ``f`` from its current position, which is byte
    ``offset`` of the archive (a member's :attr:`Member.offset`, or 0).

    Iterate for the members; after the last, :attr:`end` is the byte of the end marker
    (the first zero block) or of the end of the bytes, where ``f`` ended before one.
    ``f`` is read ``chunk`` bytes at a time (a member larger than that in one read).

    Raises (while iterated):
        TarFormatError: If a header or a member's data is not a tar archive's.
    """

    def __init__(self, f: Any, offset: int = 0, chunk: int = 1 << 20) -> None:
        self._f = f
        self._chunk = max(chunk, 64 * BLOCK)
        self._buf = b""
        self._pos = 0
        self._base = offset  # the archive's byte at the start of _buf
        self.end: int | None = None

    def _tell(self) -> int:
        return self._base + self._pos

    def _take(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer where ``f`` ends)."""
        pos, end = self._pos, self._pos + n
        if end <= len(self._buf):
            self._pos = end
            return self._buf[pos:end]
        parts, have = [self._buf[pos:]], len(self._buf) - pos
        self._base += pos  # the buffer starts at the old position from here on
        while have < n:
            more = self._f.read(max(self._chunk, n - have))
            if not more:
                break
            parts.append(more)
            have += len(more)
        self._buf = b"".join(parts)
        self._pos = min(n, have)
        return self._buf if have <= n else self._buf[:n]

    def _data(self, size: int, byte: int, what: str) -> bytes:
        """``size`` bytes of data and the padding to the next block."""
        padded = -(-size // BLOCK) * BLOCK
        got = self._take(padded)
        if len(got) < padded:
            raise TarFormatError(
                f"the data of {what} ends after {len(got)} of its {size} bytes "
                "(the archive is truncated)",
                byte,
            )
        return got[:size] if padded != size else got

    def __iter__(self) -> Iterator[Member]:
        while (member := self._next()) is not None:
            yield member

    def _next(self) -> Member | None:
        """The next member, its extended headers applied; None at the archive's end."""
        extended: dict[str, Any] = {}
        first = self._tell()  # the first header of the member's: where a read may start
        while True:
            at = self._tell()
            header = self._take(BLOCK)
            if self._ended(header, at, first if extended else None):
                return None
            _check_sum(header, at)
            kind = header[156:157]
            size = _number(header[124:136], at, "size")
            if kind not in _EXTENDING:
                return self._member(header, kind, extended.get("size", size), extended, first)
            data = self._data(size, at, "an extended header")
            if kind in _LONG:  # the first header's word stands, as in tarfile
                extended.setdefault(_LONG[kind], _text(data.split(b"\0", 1)[0]))
            elif kind in _PAX:
                for key, value in _pax_records(data, at).items():
                    extended.setdefault(key, value)
            elif not extended:  # a global header (skipped) begins no member
                first = self._tell()

    def _ended(self, header: bytes, at: int, extending: int | None) -> bool:
        """Whether ``header`` (read at byte ``at``) ends the archive: its end marker (a zero
        block), or the end of the bytes at a block's boundary. ``extending``: the byte of
        extended headers read for a member not read yet.

        Raises:
            TarFormatError: If the bytes end inside a header, or after extended headers.
        """
        if len(header) == BLOCK and header != _ZERO:
            return False
        if header and header != _ZERO:
            raise TarFormatError(
                f"a header is cut short: {len(header)} of its {BLOCK} bytes (the archive "
                "is truncated)",
                at,
            )
        if extending is not None:
            raise TarFormatError(
                "the archive ends after an extended header (a long name or a PAX header) "
                "and before the member it belongs to",
                extending,
            )
        self.end = at
        return True

    def _member(
        self, header: bytes, kind: bytes, size: int, extended: dict[str, Any], first: int
    ) -> Member:
        """The member of ``header``, its data read."""
        name = extended.get("name")
        if name is None:
            name = _text(header[:100].split(b"\0", 1)[0])
            if header[345] != 0 and kind != SPARSE:  # ustar's prefix (tarfile's rule)
                prefix = _text(header[345:500].split(b"\0", 1)[0])
                name = f"{prefix}/{name}" if prefix else name
        if extended.get("sparse"):
            kind = SPARSE
        elif kind in _REGULAR:
            kind = DIRECTORY if kind == b"\0" and name.endswith("/") else REGULAR
        linkname = extended.get("linkname")
        if linkname is None:
            linkname = "" if header[157] == 0 else _text(header[157:257].split(b"\0", 1)[0])
        what = f"member {name!r}"
        if kind == REGULAR:
            return Member(first, name, kind, linkname, self._data(size, first, what))
        if kind not in _HAS_NO_DATA:  # tarfile's rule: all but links, devices and folders
            self._data(size, first, what)
        return Member(first, name.rstrip("/") if kind == DIRECTORY else name, kind, linkname, b"")


def _text(raw: bytes) -> str:
    """A name's bytes as text: UTF-8, a byte that is not kept as a lone surrogate (as
    ``tarfile`` decodes names on a UTF-8 system)."""
    return raw.decode("utf-8", "surrogateescape")


def _number(field: bytes, at: int, what: str) -> int:
    """A header's number: octal digits (ended by a NUL or a space), or base-256 (a first
    byte of 0x80, or 0xff for a negative number), as ``tarfile.nti``."""
    if field[0] in (0x80, 0xFF):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0xFF else n
    digits = field.split(b"\0", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise TarFormatError(
            f"the header's {what} field is not a number ({field!r}): this is not a tar "
            "header, or it is corrupt",
            at,
        ) from None


def _check_sum(header: bytes, at: int) -> None:
    """Refuse a header whose checksum (the sum of its bytes, the checksum's own 8 as
    spaces; unsigned, or signed as some old writers made it) is not the one it holds."""
    held = _number(header[148:156], at, "checksum")
    unsigned = _sum(header) - sum(header[148:156]) + _SPACES
    if held == unsigned:
        return
    signed = unsigned - 256 * sum(1 for b in header if b > 127)
    signed += 256 * sum(1 for b in header[148:156] if b > 127)
    if held != signed:
        raise TarFormatError(
            f"the header fails its checksum (it holds {held}, its bytes sum to "
            f"{unsigned}): this is not a tar header, or it is corrupt",
            at,
        )


def _sum(header: bytes) -> int:
    """The sum of ``header``'s bytes. Adler-32's low half is one more than that sum, modulo
    65,521, and zlib computes it in C: exact where the sum is less than 65,520, which it is
    whenever no more than 256 bytes are not zero (a header's names and numbers fill far
    fewer). Python's ``sum`` over the 512 bytes took 2.5 us, most of a member's reading."""
    if BLOCK - header.count(0) <= _ADLER_EXACT:
        return (zlib.adler32(header) & 0xFFFF) - 1
    return sum(header)


_ADLER_EXACT = 65_519 // 255
"""Non-zero bytes at most for which :func:`_sum` reads the sum from Adler-32: 256 bytes of
255 sum to 65,280, under Adler-32's modulus (65,521) less its initial 1."""


def _pax_records(data: bytes, at: int) -> dict[str, Any]:
    """The ``path``, ``linkpath`` and ``size`` of a PAX extended header's records (``"%d
    %s=%s\\n"``: the record's length, its keyword, its value); ``sparse`` where it describes
    a GNU sparse file."""
    out: dict[str, Any] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        length = int(data[pos:space]) if space > pos and data[pos:space].isdigit() else 0
        record = data[space + 1 : pos + length - 1] if length else b""
        keyword, equals, value = record.partition(b"=")
        if not length or not equals or pos + length > len(data):
            raise TarFormatError(
                f"a PAX extended header's record at its byte {pos} is not 'LENGTH "
                "KEYWORD=VALUE' (the archive is corrupt)",
                at,
            )
        field = _PAX_KEYS.get(keyword)
        if field == "size":
            try:
                out[field] = int(value)
            except ValueError:
                raise TarFormatError(
                    f"a PAX extended header gives a size that is not a number ({value!r})", at
                ) from None
        elif field is not None:
            out[field] = _text(value)
        elif keyword.startswith(b"GNU.sparse."):
            out["sparse"] = True
        pos += length
    return out


__all__ = [
    "BLOCK",
    "BLOCK_DEVICE",
    "CHARACTER_DEVICE",
    "DIRECTORY",
    "FIFO",
    "HARD_LINK",
    "REGULAR",
    "SPARSE",
    "SYMBOLIC_LINK",
    "Member",
    "Members",
    "TarFormatError",
]
