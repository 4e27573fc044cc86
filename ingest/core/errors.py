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
    if "@" not in text and "?" not in text:  # nothing to hide: a listing's every URL
        return text
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _QUERY.sub(lambda m: m["head"] + _QUERY_VALUE.sub("=***", m["query"]), text)


class IngestError(Exception):
    """Base class of every error this package raises on purpose."""

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross process boundaries (reader threads, Ray actors and tasks). The default
        # pickling of an exception calls ``cls(*self.args)``, and ``args`` holds only the
        # formatted message, which the subclasses' ``__init__(url, problem, fix, ...)`` cannot
        # take: Ray then delivers an UnserializableException in place of the clear error.
        # Rebuild from the message and the attributes instead, keeping the exact class.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[IngestError], args: tuple[object, ...], attrs: dict[str, object]
) -> IngestError:
    error = cls.__new__(cls, *args)
    Exception.__init__(error, *args)
    error.__dict__.update(attrs)
    return error


class LocationError(IngestError):
    """A store of this package's own at a location (the shard index, the derived cache, a
    provenance log) cannot be read or written: the location (without credentials), what
    went wrong and the fix. Each store's class names the store (:attr:`what`).

    Attributes:
        location: The store's URL or directory, without credentials.
        problem: What went wrong.
        fix: What to do.
    """

    what = "store"

    def __init__(self, location: str, problem: str, fix: str) -> None:
        self.location = redact(location)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.what} at {self.location}: {problem}. {fix}")


class ConfigError(IngestError, ValueError):
    """An option or argument has a value that cannot work."""


class SourceError(IngestError):
    """The source cannot be listed: empty glob, missing bucket, refused credentials."""

    def __init__(self, url: str, problem: str, fix: str) -> None:
        self.url = redact(url)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.url}: {problem}. {fix}")


class NoShardsError(SourceError):
    """The source lists no data files: its path does not exist, or holds no data. A
    followed source (:class:`ingest.Follow`) waits for its first shard instead, up to
    ``idle_timeout_s``."""


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


class StoreError(ShardError):
    """The store did not deliver a shard's bytes within the retry deadline.

    Not the data's fault: ``ReadOptions(on_error="skip")`` never skips rows for it (a restart
    resumes once the store answers again).
    """


class SchemaMismatchError(ShardError):
    """A shard's schema differs from the schema the stream took from another shard."""


class StateError(IngestError, ValueError):
    """A saved state does not fit this stream: other dataset, other version, other seed."""


class StreamTimeoutError(IngestError, TimeoutError):
    """A wait inside the stream ran past its timeout."""


class SupersededError(IngestError):
    """A newer loop took over what this one read: one loop (one iterator per rank) at a
    time delivers batches, so that no batch is handed out twice."""

    @classmethod
    def of_rank(cls, rank: int) -> SupersededError:
        return cls(
            f"another iterator of rank {rank} took the rank over (its loop started after this "
            "one's) and reads on from the last batch this one acked; one iterator per rank "
            "delivers at a time: end or leave a loop (its acks are sent as it ends) before "
            "the next one starts, e.g. pass the iterator to the next task once the last task "
            "is done"
        )
