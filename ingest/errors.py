"""Errors that say what broke, where, and what to do.

Every error raised for bad input names the shard URL, the position (row, line or byte) when
one is known, the rule that was broken and the fix. Credentials never reach a message: only
URLs are quoted, and URLs given with inline credentials are redacted by :func:`redact`.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s'\"]+@")
# A query string of a URL in free text: ``?`` after ``scheme://...`` and up to the first
# character that cannot be part of the URL.
_QUERY = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"<>]*\?)(?P<query>[^\s#'\"<>]*)")
_QUERY_VALUE = re.compile(r"=[^&;]*")


def redact(text: str) -> str:
    """Return ``text`` with the secrets of every URL in it replaced by ``***``.

    A ``user:password@`` part becomes ``***@``, and every query value becomes ``***``
    (``?token=abc&x=1`` -> ``?token=***&x=***``): pre-signed URLs and tokens travel in the
    query. Works on a bare URL and on free text (an exception message) alike.
    """
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _QUERY.sub(lambda m: m["head"] + _QUERY_VALUE.sub("=***", m["query"]), text)


class IngestError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(IngestError, ValueError):
    """An option or argument has a value that cannot work."""


class SourceError(IngestError):
    """The source cannot be listed: empty glob, missing bucket, refused credentials."""

    def __init__(self, url: str, problem: str, fix: str) -> None:
        self.url = redact(url)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.url}: {problem}. {fix}")


class ShardError(IngestError):
    """One shard cannot be read: corrupt, truncated, wrong format, bad record.

    Attributes:
        url: The shard URL.
        row: Row offset in the shard where the problem was found, when known.
        line: 1-based line number for line-delimited formats, when known.
        byte: Byte offset in the (decompressed) shard, when known.
    """

    def __init__(
        self,
        url: str,
        problem: str,
        fix: str,
        *,
        row: int | None = None,
        line: int | None = None,
        byte: int | None = None,
    ) -> None:
        self.url = redact(url)
        self.problem = problem
        self.fix = fix
        self.row = row
        self.line = line
        self.byte = byte
        where = [
            f"{name} {value}"
            for name, value in (("line", line), ("row", row), ("byte", byte))
            if value is not None
        ]
        at = f" at {', '.join(where)}" if where else ""
        super().__init__(f"{self.url}{at}: {problem}. {fix}")

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default pickling of exceptions, and
        # errors cross process boundaries (reader threads, Ray tasks).
        return (
            _rebuild_shard_error,
            (self.url, self.problem, self.fix, self.row, self.line, self.byte),
        )


def _rebuild_shard_error(
    url: str, problem: str, fix: str, row: int | None, line: int | None, byte: int | None
) -> ShardError:
    return ShardError(url, problem, fix, row=row, line=line, byte=byte)


class SchemaMismatchError(ShardError):
    """A shard's schema differs from the schema the stream took from another shard."""


class StateError(IngestError, ValueError):
    """A saved state does not fit this stream: other dataset, other version, other seed."""


class StreamTimeoutError(IngestError, TimeoutError):
    """A wait inside the stream ran past its timeout."""
