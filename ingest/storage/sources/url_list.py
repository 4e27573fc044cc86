"""An index file of shard URLs: what a web server or a CDN serves instead of a listing.

HTTP(S) has no listing: a stream over a web server takes its shards' URLs, either as a list
or from an index file that names them, one per line (``#`` starts a comment; a relative URL
is taken relative to the index file's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

import fsspec

from ingest.core.errors import ConfigError, SourceError, redact

MAX_INDEX_BYTES = 64 << 20
"""An index file larger than this is refused (about a million URLs)."""


def urls_from(index: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The shard URLs an index file names, in its order, without duplicates.

    Raises:
        SourceError: If the index file cannot be read.
        ConfigError: If it is larger than :data:`MAX_INDEX_BYTES` or names no URL.
    """
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
    out: list[str] = []
    seen: set[str] = set()
    for line in data.decode("utf-8").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a comment; a URL's own # stays
        if not line:
            continue
        url = urljoin(index, line) if "://" not in line else line
        if url not in seen:
            seen.add(url)
            out.append(url)
    if not out:
        raise ConfigError(f"index file {redact(index)} names no URL (one per line)")
    return out


__all__ = ["MAX_INDEX_BYTES", "urls_from"]
