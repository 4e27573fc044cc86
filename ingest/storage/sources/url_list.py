"""An index file of shard URLs: what a web server or a CDN serves instead of a listing.

HTTP(S) has no listing: a stream over a web server takes its shards' URLs, either as a list
or from an index file that names them, one per line (``#`` starts a comment; a relative URL
is taken relative to the index file's). An index's lines keep its own scheme unless the user
allows others: an index from a web server never names this machine's files.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import fsspec

from ingest.core.errors import ConfigError, SourceError, redact

MAX_INDEX_BYTES = 64 << 20
"""An index file larger than this is refused (about a million URLs)."""


_LOCAL = "file"


def _scheme(url: str) -> str:
    """``url``'s scheme, lower case; a plain path (and ``local://``) is ``file``."""
    scheme = urlsplit(url).scheme.lower()
    return _LOCAL if scheme in ("", "local") or len(scheme) == 1 else scheme  # C:\\ is a path


def urls_from(
    index: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    schemes: Collection[str] | None = None,
) -> list[str]:
    """The shard URLs an index file names, in its order, without duplicates.

    Every URL must have the index file's own scheme (an index served over HTTPS names
    ``https://`` shards, or paths relative to it), so that an index from a web server never
    reaches this machine's disk or another store; ``schemes`` allows others by name.

    Args:
        index: The index file's URL or path: one URL per line, ``#`` starts a comment, a
            relative URL is taken relative to the index file's.
        storage_options: fsspec options to read the index file with.
        schemes: The URL schemes its lines may have (``("https", "s3")``; ``"file"`` for
            local paths). None: the index file's own only.

    Raises:
        SourceError: If the index file cannot be read.
        ConfigError: If it is larger than :data:`MAX_INDEX_BYTES`, is not UTF-8, names no
            URL, or names one of a scheme not allowed.
    """
    own = _scheme(index)
    allowed = _allowed(schemes, own)
    try:
        with fsspec.open(index, "rb", **dict(storage_options or {})) as f:
            data = f.read(MAX_INDEX_BYTES + 1)
    except (OSError, ValueError) as e:
        raise SourceError(
            redact(index), f"reading the index file failed: {redact(str(e))}", "check the URL"
        ) from None
    if len(data) > MAX_INDEX_BYTES:
        raise ConfigError(
            f"index file {redact(index)} is larger than {MAX_INDEX_BYTES} bytes; split it and "
            "pass the URLs as a list"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"index file {redact(index)} is not UTF-8: byte {e.start} (line {line}) is "
            f"{data[e.start : e.start + 1]!r}; write the index file as UTF-8 (percent-encode "
            "other bytes in URLs)"
        ) from None
    out: list[str] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()  # a comment; a URL's own # stays
        if not line:
            continue
        url = urljoin(index, line) if "://" not in line else line
        scheme = _scheme(url)
        if scheme not in allowed:
            raise ConfigError(
                f"index file {redact(index)} line {number} names {redact(line)!r}, a "
                f"{scheme}:// URL; an index read over {own}:// names only "
                f"{' or '.join(sorted(allowed))} URLs, so that it reaches no other store and "
                f"not this machine's disk. Fix the line, or allow the scheme: "
                f"ingest.urls_from(..., schemes={tuple(sorted(allowed | {scheme}))!r})"
            )
        if url not in seen:
            seen.add(url)
            out.append(url)
    if not out:
        raise ConfigError(f"index file {redact(index)} names no URL (one per line)")
    return out


def _allowed(schemes: Collection[str] | None, own: str) -> frozenset[str]:
    """The schemes lines may have: ``schemes`` checked, or the index's own."""
    if schemes is None:
        return frozenset({own})
    if isinstance(schemes, str):
        schemes = (schemes,)
    bad = [s for s in schemes if not isinstance(s, str) or not re.fullmatch(r"[A-Za-z][\w+.-]*", s)]
    if bad or not schemes:
        raise ConfigError(
            f"urls_from schemes={tuple(schemes)!r}: give scheme names without '://' "
            "(such as ('https', 's3'); 'file' for local paths)"
        )
    return frozenset(_LOCAL if s.lower() == "local" else s.lower() for s in schemes)


__all__ = ["MAX_INDEX_BYTES", "urls_from"]
