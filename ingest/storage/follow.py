"""Follow mode: a dataset written while training runs, read as it grows. No Ray.

With ``follow=ingest.Follow(...)`` each epoch is a *round* over the shards that appeared
since the previous round: the source is listed again (every ``poll_s`` while nothing new
came) and the round reads the new shards, plus the rows the previous round carried (those
that could not fill a step on every rank). The epoch boundary is explicit: a round's rows
are shared out evenly when it is planned, so every rank gets the same number of steps, and
a round is planned only when it holds at least one full step (``world_size x batch_size``
rows) or when nothing new came for ``idle_timeout_s``; then the round holds what there is
(maybe no step: the loop over it ends at once, and the next round waits again). New shards
whose format keeps no row count (JSON Lines, CSV) are counted, one, then two, four, ... at
a time, while the rows known fall short of a step (the book's ``_counted``). A source
that lists nothing yet (a job started before its data) is waited for the same way: the
first round starts with the first shards, or fails with :class:`ingest.NoShardsError`
once ``idle_timeout_s`` passed without any.

The state stays exact: a round's listing is the whole dataset, and the shards read by the
rounds before are in its progress as consumed, so a restore (any world size) reads each row
once, in the round it stopped in, and the next round reads only newer shards. A shard read
by an earlier round that vanished or changed (size or version) is an error naming it: a
followed dataset only grows. Shards that are still being written must not be listed: on
object stores an object appears when its upload completes; on a file system write under a
name starting with ``.`` or ``_`` and rename, or name a manifest: a text file listing the
finished shards, the only shards a round reads (:class:`Manifest`). A line is a URL
(``s3://bucket/d/p0.parquet``), an absolute path on the manifest's store
(``/data/d/p0.parquet`` beside a local manifest), or a path relative to the manifest's
directory (``p0.parquet``, ``./p0.parquet``); blank lines and ``#`` comments are skipped.
The manifest may be given as a URL or a plain local path. Lines and listed URLs are compared
in one form (:func:`shard_url`), and a line that names no shard the source lists is an
error naming the line: a round that silently read nothing would wait forever.
"""

from __future__ import annotations

import posixpath
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from fsspec.utils import get_protocol

from ingest.core.errors import ConfigError, SourceError, redact
from ingest.core.validate import SECONDS, Number, check_numbers
from ingest.storage.sources import Source


@dataclass(frozen=True, slots=True, kw_only=True)
class Follow:
    """Read a growing dataset as it grows (see :mod:`ingest.storage.follow`).

    Attributes:
        poll_s: Seconds between listings while a round waits for new shards.
        idle_timeout_s: A round waits at most this long for a full step of new rows; then
            it holds what there is (maybe nothing, which ends the loop over it).
        manifest: URL or local path of a text file listing the finished shards, one per
            line (URLs, absolute paths on its store, or paths relative to its directory);
            only those are read, and a line naming no listed shard is an error. None: every
            listed shard.
    """

    poll_s: float = 10.0
    idle_timeout_s: float = 120.0
    manifest: str | None = None

    def __post_init__(self) -> None:
        check_numbers(self, "Follow", poll_s=SECONDS, idle_timeout_s=Number(0, unit="seconds"))
        if self.manifest is not None and (
            not isinstance(self.manifest, str) or not self.manifest.strip()
        ):
            raise ConfigError(
                f"Follow(manifest={self.manifest!r}) names no file: pass the URL or path of "
                "the text file that lists the finished shards, or manifest=None to read every "
                "listed shard"
            )


@dataclass(frozen=True, slots=True)
class Manifest:
    """The shards a follow manifest names, each with the line that named it.

    Attributes:
        url: The manifest, as a URL (a plain path given for it made absolute ``file://``).
        named: Shard URL -> (1-based line number, the line), the URLs written as a listing
            writes them (:func:`shard_url`).
    """

    url: str
    named: dict[str, tuple[int, str]]

    def select(self, source: Source, listed: Sequence[str]) -> list[str]:
        """The URLs of ``listed`` (a listing's, in its order) that this manifest names.

        Raises:
            SourceError: If a line names no shard of ``listed``: a typo, a shard outside the
                source's URLs, or one the listing leaves out (a name starting with ``.`` or
                ``_``, no known format). Silently read nothing, it would wait forever.
        """
        wanted = dict(self.named)
        out = []
        for url in listed:
            # A listed URL is in this form already, as a rule: compare it as it is first.
            key = url if url in wanted else shard_url(source, url)
            if wanted.pop(key, None) is not None:
                out.append(url)
        if wanted:
            first, (line, text) = min(wanted.items(), key=lambda item: item[1][0])
            raise SourceError(
                self.url,
                f"line {line} ({text!r}) names {redact(first)}, a shard the source "
                f"{', '.join(redact(u) for u in source.urls)} does not list ({len(wanted)} "
                f"of {len(self.named)} named shards are not listed)",
                "name only finished shards of the source, one per line: a URL, an absolute "
                "path on the manifest's store, or a path relative to the manifest's "
                "directory; names starting with '.' or '_' and files of no known format are "
                "never listed",
            )
        return out


def shard_url(source: Source, url: str) -> str:
    """``url`` (or a plain local path) as a listing writes a shard's URL: with its
    protocol, a local path absolute, ``.`` and ``..`` parts of a local path resolved.

    Listings write ``fs.unstrip_protocol`` of the path the store lists; manifest lines and
    listed URLs both pass through here, so that they compare equal when they name the same
    file. An object store's key is kept as written (``a/./b`` is a key of its own there).
    """
    fs = source.filesystem(url)
    path = fs._strip_protocol(url)
    if get_protocol(url) in ("file", "local"):
        path = posixpath.normpath(path)
    return str(fs.unstrip_protocol(path))


def _resolve(source: Source, manifest: str, line: str) -> str:
    """The shard URL a manifest line names: a URL; an absolute path on the manifest's store
    (``/data/p0.parquet`` beside a local manifest, ``/bucket/d/p0.parquet`` beside an S3
    one); else a path relative to the manifest's directory (``./p0.parquet``,
    ``sub/../p0.parquet``)."""
    if "://" in line:
        return shard_url(source, line)
    if get_protocol(manifest) in ("http", "https"):
        return shard_url(source, urllib.parse.urljoin(manifest, line))
    fs = source.filesystem(manifest)
    if line.startswith("/"):
        path = fs.root_marker + line.lstrip("/")
    else:
        base = posixpath.dirname(fs._strip_protocol(manifest))
        path = posixpath.normpath(posixpath.join(base, line))
    return shard_url(source, fs.unstrip_protocol(path))


def read_manifest(source: Source, url: str) -> Manifest:
    """The shards a manifest names (a missing manifest names none).

    Raises:
        SourceError: If it cannot be read.
    """
    url = shard_url(source, url)
    fs = source.filesystem(url)
    try:
        text = fs.cat_file(fs._strip_protocol(url)).decode()
    except FileNotFoundError:
        return Manifest(url, {})
    except Exception as e:
        raise SourceError(
            url,
            f"cannot read the follow manifest ({type(e).__name__}: {source.scrub(str(e))})",
            "check the manifest URL and its storage options",
        ) from None
    named: dict[str, tuple[int, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        name = line.strip()
        if name and not name.startswith("#"):
            named.setdefault(_resolve(source, url, name), (number, name))
    return Manifest(url, named)


__all__ = [
    "Follow",
    "Manifest",
    "read_manifest",
    "shard_url",
]
