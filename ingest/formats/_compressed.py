"""The decompressed bytes of a gzip, zstd, bzip2 or xz shard, read as a file that fails loudly.

Python's ``GzipFile`` reports a truncated stream but not where the damage is, and
zstandard's stream reader ends a truncated frame as if the file were complete: the rows
before the cut would be delivered and the rest lost without a word. This reader feeds the
compressed bytes to a decompressor object, follows gzip members, zstd frames and bzip2 or xz
streams one after another (``cat a.gz b.gz``, ``pzstd`` and ``pbzip2`` output are valid), and
raises a
:class:`~ingest.core.errors.ShardError` naming the decompressed byte offset and the compressed one
when the input ends inside a member or frame, or is corrupt.

Compressed input is fed in pieces of :data:`_STEP` bytes. Memory: gzip output is bounded by
the size asked for; the others' are given no output bound per call (bzip2's and xz's would
hold the rest inside, to be drained before the input's end is judged), so a piece's output is
bounded only by the compression ratio.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from typing import Any, Protocol

from ingest.core.errors import ConfigError, ShardError

_GZIP_MAGIC = b"\x1f\x8b"
_STEP = 16 << 10
_FIX = (
    "re-upload the complete file (check that its writer finished; `gzip -t FILE`, "
    "`zstd -t FILE`, `bzip2 -t FILE` or `xz -t FILE` tests one)"
)


_STREAMS: dict[str, type[bz2.BZ2Decompressor] | type[lzma.LZMADecompressor]] = {
    "bz2": bz2.BZ2Decompressor,
    "xz": lzma.LZMADecompressor,
}
"""The codecs of the standard library whose decompressors take one stream each (the next
stream of a file, ``pbzip2``'s, gets a new one), by name."""


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class DecompressedFile:
    """A read-only, forward-only file of the decompressed bytes of ``raw``.

    Args:
        raw: The compressed shard, opened for reading.
        codec: ``"gzip"``, ``"zstd"``, ``"bz2"`` or ``"xz"``.
        url: The shard URL, for errors.
        read_bytes: Compressed bytes read from ``raw`` per call.

    Raises:
        ConfigError: If ``codec`` is zstd and the ``zstandard`` package is missing.
    """

    def __init__(self, raw: _Readable, codec: str, url: str, read_bytes: int) -> None:
        if codec == "zstd":
            try:
                import zstandard
            except ImportError:
                raise ConfigError(
                    f"{url}: reading .zst needs the zstandard package; pip install zstandard"
                ) from None
            self._zstd: Any = zstandard
        elif codec not in _STREAMS and codec != "gzip":
            raise ConfigError(f"{url}: unknown compression {codec!r}; known: gzip, zstd, bz2, xz")
        self._raw = raw
        self._codec = codec
        self._url = url
        self._read_bytes = read_bytes
        self._decoder: Any = None
        """The decompressor of the member or frame in progress; None between two."""
        self._buffer = b""
        """The last compressed bytes read from ``raw``; ``_buffer[_at:]`` are not yet fed."""
        self._at = 0
        self._compressed = 0
        """Compressed bytes read from ``raw`` so far."""
        self._output: list[bytes] = []
        """Decompressed bytes not yet handed out, ``_ready`` in all."""
        self._ready = 0
        self._position = 0
        """Decompressed bytes handed out so far."""

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` decompressed bytes (all the rest for ``n < 0``); ``b""`` at the end.

        Raises:
            ShardError: If the compressed stream is corrupt, or ends inside a member/frame.
        """
        want = n if n >= 0 else 1 << 62
        while self._ready < want and self._decode_more(want - self._ready):
            pass
        data = b"".join(self._output)
        self._output.clear()
        if len(data) > want:
            self._output.append(data[want:])
            data = data[:want]
        self._ready -= len(data)
        self._position += len(data)
        return data

    def _decode_more(self, want: int) -> bool:
        """Decompress some more input into ``_output``; False at the clean end of the file."""
        if self._at == len(self._buffer):
            self._buffer, self._at = self._raw.read(self._read_bytes), 0
            self._compressed += len(self._buffer)
            if not self._buffer:
                if self._decoder is not None:
                    raise self._error(
                        f"the {self._codec} stream is truncated: the file ends at compressed byte "
                        f"{self._compressed} inside a {self._unit()}, before its end marker"
                    )
                return False
        if self._decoder is None and not self._start():
            return True
        out = self._decompress(want)
        if out:
            self._output.append(out)
            self._ready += len(out)
        if self._decoder.eof:
            self._decoder = None
        return True

    def _start(self) -> bool:
        """Start the next gzip member or zstd frame; False if the input held only padding."""
        if self._codec == "zstd":
            self._decoder = self._zstd.ZstdDecompressor().decompressobj()
            return True
        if self._codec in _STREAMS:
            self._decoder = _STREAMS[self._codec]()
            return True
        # Writers may pad a gzip file with zeros after its last member.
        while self._at < len(self._buffer) and self._buffer[self._at] == 0:
            self._at += 1
        head = self._buffer[self._at : self._at + 4]
        if not head:
            return False
        if not _GZIP_MAGIC.startswith(head[:2]):
            raise self._error(
                f"is not a gzip stream at compressed byte {self._consumed()} "
                f"(starts with {head!r}, not {_GZIP_MAGIC!r})"
            )
        self._decoder = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        return True

    def _decompress(self, want: int) -> bytes:
        """Feed a piece of input to the decompressor in progress; its output.

        Pieces are views of the buffer (no copy). gzip output is at most ``want``.
        """
        decoder = self._decoder
        piece = memoryview(self._buffer)[self._at : self._at + _STEP]
        try:
            if self._codec == "gzip":
                out: bytes = decoder.decompress(piece, want)
                left = decoder.unused_data if decoder.eof else decoder.unconsumed_tail
            else:
                out = decoder.decompress(piece)
                left = decoder.unused_data if decoder.eof else b""
        except zlib.error as e:
            raise self._error(
                f"the gzip stream is corrupt near compressed byte {self._consumed()} ({e})"
            ) from None
        except (OSError, EOFError, lzma.LZMAError) as e:  # bz2's and xz's decompressors
            raise self._error(
                f"the {self._codec} stream is corrupt near compressed byte {self._consumed()} ({e})"
            ) from None
        except Exception as e:
            if type(e).__name__ != "ZstdError":
                raise
            raise self._error(
                f"the zstd stream is corrupt near compressed byte {self._consumed()} ({e})"
            ) from None
        self._at += len(piece) - len(left)
        return out

    def _consumed(self) -> int:
        return self._compressed - len(self._buffer) + self._at

    def _unit(self) -> str:
        return {"gzip": "member", "zstd": "frame"}.get(self._codec, "stream")

    def _error(self, problem: str) -> ShardError:
        return ShardError(self._url, problem, _FIX, byte=self._position + self._ready)

    @property
    def position(self) -> int:
        """Decompressed bytes handed out so far (the offset of the next one)."""
        return self._position

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> DecompressedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
