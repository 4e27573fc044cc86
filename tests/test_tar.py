"""ingest.formats.tar against Python's tarfile: the same members, names, types and data from
archives tarfile writes in each of its formats (ustar, GNU, PAX), read from their start or
from any member's offset; and what tarfile's stream mode let pass: a corrupt header after
the first member, which it took for the archive's end."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.formats import tar

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}

# Names: short, and long enough for ustar's prefix field, GNU long names and PAX paths;
# ASCII and not (a PAX path is UTF-8; ustar's and GNU's fields hold the UTF-8 bytes).
_CHARS = st.sampled_from("abcXYZ019-_.") | st.sampled_from("éü漢")
_ASCII = st.sampled_from("abcXYZ019-_.")
_PART = st.text(_CHARS, min_size=1, max_size=20).filter(lambda p: p not in (".", ".."))
_NAME = st.one_of(
    st.lists(_PART, min_size=1, max_size=4).map("/".join),
    st.lists(st.text(_ASCII, min_size=30, max_size=50), min_size=3, max_size=4).map("/".join),
)
_MEMBER = st.tuples(
    _NAME,
    st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink"]),
    st.binary(max_size=1100),
)


def write(members: list[tuple[str, str, bytes]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8") as t:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}.get(
                kind, tarfile.LNKTYPE
            )
            info.linkname = "" if kind == "dir" else f"target/{name}"
            t.addfile(info)
    return buf.getvalue()


def tarfile_members(raw: bytes, offset: int = 0) -> list[tar.Member]:
    """What Python's tarfile reads in its stream mode from byte ``offset``, as Members."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(raw[offset:]), mode="r|", encoding="utf-8") as t:
        for m in t:
            f = t.extractfile(m) if m.isfile() else None
            kind = (
                tar.REGULAR
                if m.isfile()
                else tar.DIRECTORY
                if m.isdir()
                else tar.SPARSE
                if m.issparse()
                else m.type
            )
            data = f.read() if f is not None else b""
            out.append(tar.Member(offset + m.offset, m.name, kind, m.linkname, data))
    return out


def read(raw: bytes, offset: int = 0, chunk: int = 1 << 20) -> tuple[list[tar.Member], int]:
    f = io.BytesIO(raw)
    f.seek(offset)
    members = tar.Members(f, offset, chunk)
    out = list(members)
    assert members.end is not None
    return out, members.end


@settings(max_examples=60)
@given(
    members=st.lists(_MEMBER, min_size=1, max_size=8),
    fmt=st.sampled_from(sorted(FORMATS)),
    chunk=st.sampled_from([1, 4096, 1 << 20]),
    data=st.data(),
)
def test_members_are_tarfiles_from_the_start_and_from_any_member(
    members: list[tuple[str, str, bytes]], fmt: str, chunk: int, data: st.DataObject
) -> None:
    try:
        raw = write(members, FORMATS[fmt])
    except ValueError:  # a name ustar cannot hold (too long for its fields)
        return
    expected = tarfile_members(raw)
    got, end = read(raw, chunk=chunk)
    assert got == expected
    assert len(raw) - end >= 2 * tar.BLOCK and raw[end:] == bytes(len(raw) - end)
    k = data.draw(st.integers(0, len(expected) - 1))
    again, _ = read(raw, expected[k].offset, chunk)
    assert again == expected[k:] == tarfile_members(raw, expected[k].offset)


@settings(max_examples=60)
@given(
    members=st.lists(_MEMBER, min_size=2, max_size=6),
    fmt=st.sampled_from(sorted(FORMATS)),
    data=st.data(),
)
def test_a_bit_flipped_in_any_header_is_refused_naming_its_byte(
    members: list[tuple[str, str, bytes]], fmt: str, data: st.DataObject
) -> None:
    """Every header's bytes count in its checksum: one bit flipped anywhere in one is
    refused at that header's byte, never taken for the end of the archive."""
    try:
        raw = bytearray(write(members, FORMATS[fmt]))
    except ValueError:
        return
    _, end = read(bytes(raw))
    headers = _header_offsets(bytes(raw), end)
    at = data.draw(st.sampled_from(headers))
    bit = data.draw(st.integers(0, tar.BLOCK * 8 - 1))
    raw[at + bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(tar.TarFormatError) as refused:
        read(bytes(raw))
    assert refused.value.byte == at, (refused.value, headers)


def _header_offsets(raw: bytes, end: int) -> list[int]:
    """The byte of every header block (extended ones included) before ``end``."""
    out, at = [], 0
    while at < end:
        out.append(at)
        size = int(raw[at + 124 : at + 136].split(b"\0", 1)[0].strip() or b"0", 8)
        kind = raw[at + 156 : at + 157]
        data = size if kind not in (b"1", b"2", b"3", b"4", b"5", b"6") else 0
        at += tar.BLOCK + -(-data // tar.BLOCK) * tar.BLOCK
    return out


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_bytes_cut_anywhere_are_refused_or_end_at_a_member(fmt: str) -> None:
    members = [("a" * 120 + "/x.txt", "file", b"x" * 700), ("b.txt", "file", b"b")]
    raw = write(members, FORMATS[fmt])
    full, end = read(raw)
    assert full == tarfile_members(raw)  # a long name: ustar's prefix, GNU's L, a PAX path
    boundaries = {m.offset for m in full} | {end}
    for cut in range(0, end + 1, 7):
        try:
            got, stopped = read(raw[:cut])
        except tar.TarFormatError as e:
            assert cut not in boundaries, (cut, e)
            assert "truncated" in str(e) or "ends after an extended header" in str(e)
            continue
        assert cut in boundaries and stopped == cut
        assert got == [m for m in full if m.offset < cut]


def test_a_corrupt_header_after_the_first_member_is_refused_where_tarfile_ends() -> None:
    raw = bytearray(write([(f"s{n}.txt", "file", b"%d" % n) for n in range(5)], tarfile.GNU_FORMAT))
    raw[2 * 1024 + 3] ^= 0x40  # the third member's header: a byte of its name
    with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r|") as t:
        assert [m.name for m in t] == ["s0.txt", "s1.txt"], "tarfile stops there, silent"
    with pytest.raises(tar.TarFormatError, match="fails its checksum") as refused:
        read(bytes(raw))
    assert refused.value.byte == 2048


def test_a_header_that_is_no_tar_header_is_refused_at_byte_0() -> None:
    with pytest.raises(tar.TarFormatError, match="not a tar header") as refused:
        read(b"PK\x03\x04" + bytes(1020))
    assert refused.value.byte == 0


def test_base_256_sizes_and_signed_checksums_are_read() -> None:
    """GNU tar writes a size of 8 GiB or more in base 256; some old writers summed the
    header's bytes as signed ones."""
    header = bytearray(tarfile.TarInfo("big.bin").tobuf(tarfile.GNU_FORMAT))
    header[124:136] = b"\x80" + (5).to_bytes(11, "big")
    header[265] = 0xE9  # a byte over 127 (in uname): signed and unsigned sums differ
    header[148:156] = b" " * 8
    signed = sum(b - 256 if b > 127 else b for b in header)
    header[148:156] = b"%06o\0 " % signed
    raw = bytes(header) + b"hello".ljust(512, b"\0") + bytes(1024)
    [member], end = read(raw)
    assert (member.name, member.type, member.data, end) == ("big.bin", tar.REGULAR, b"hello", 1024)


def test_pax_global_headers_are_skipped_and_sparse_members_named() -> None:
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "made here"}
    ) as t:
        info = tarfile.TarInfo("a.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"a"))
        sparse = tarfile.TarInfo("s.bin")
        sparse.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
        t.addfile(sparse)
    got, _ = read(buf.getvalue())
    assert [(m.offset, m.name, m.type, m.data) for m in got] == [
        (1024, "a.txt", tar.REGULAR, b"a"),  # its offset: after the global header, not at it
        (2048, "s.bin", tar.SPARSE, b""),
    ]


def test_headers_dense_with_bytes_are_summed_exactly() -> None:
    """A header's checksum is read from Adler-32 where its sum is under Adler's modulus
    (256 bytes not zero at most) and summed byte by byte otherwise: a header near full
    (names of 100 and 155 bytes, a link name, user and group names) is read, and a bit
    flipped in it refused."""
    info = tarfile.TarInfo("ü" * 77 + "/" + "ü" * 49)  # UTF-8: 2 bytes over 127 each
    info.type, info.linkname = tarfile.SYMTYPE, "ü" * 50
    info.uname, info.gname = "ü" * 15, "ü" * 15
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        t.addfile(info)
    raw = bytearray(buf.getvalue())
    assert tar.BLOCK - raw[: tar.BLOCK].count(0) > 256 and sum(raw[: tar.BLOCK]) > 65_521
    [member], _ = read(bytes(raw))
    assert (member.name, member.linkname) == (info.name, info.linkname)
    raw[400] ^= 0x04
    with pytest.raises(tar.TarFormatError, match="fails its checksum"):
        read(bytes(raw))
