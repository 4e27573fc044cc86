"""Follow mode: a dataset written while training runs, read as it grows. Pure; no Ray.

With ``follow=ingest.Follow(...)`` each epoch is a *round* over the shards that appeared
since the previous round: the source is listed again (every ``poll_s`` while nothing new
came) and the round reads the new shards, plus the rows the previous round carried (those
that could not fill a step on every rank). The epoch boundary is explicit: a round's rows
are shared out evenly when it is planned, so every rank gets the same number of steps, and
a round is planned only when it holds at least one full step (``world_size x batch_size``
rows) or when nothing new came for ``idle_timeout_s``; then the round holds what there is
(maybe no step: the loop over it ends at once, and the next round waits again). A source
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
finished shards (one URL per line, or a path relative to the manifest's directory), the
only shards a round reads.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from ingest.errors import ConfigError, SourceError
from ingest.sources import Shard, Source
from ingest.validate import SECONDS, Number, check_numbers


@dataclass(frozen=True, slots=True, kw_only=True)
class Follow:
    """Read a growing dataset as it grows (see :mod:`ingest.follow`).

    Attributes:
        poll_s: Seconds between listings while a round waits for new shards.
        idle_timeout_s: A round waits at most this long for a full step of new rows; then
            it holds what there is (maybe nothing, which ends the loop over it).
        manifest: URL of a text file listing the finished shards, one per line (URLs, or
            paths relative to its directory); only those are read. None: every listed shard.
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


class NothingNewError(Exception):
    """A round would hold less than one full step: list again after ``poll_s``."""


def read_manifest(source: Source, url: str) -> set[str]:
    """The shard URLs a manifest names (a missing manifest names none).

    Raises:
        SourceError: If it cannot be read.
    """
    fs = source.filesystem(url)
    path = fs._strip_protocol(url)
    try:
        text = fs.cat_file(path).decode()
    except FileNotFoundError:
        return set()
    except Exception as e:
        raise SourceError(
            url,
            f"cannot read the follow manifest ({type(e).__name__}: {source.scrub(str(e))})",
            "check the manifest URL and its storage options",
        ) from None
    base = posixpath.dirname(url)
    out = set()
    for line in text.splitlines():
        name = line.strip()
        if name and not name.startswith("#"):
            out.add(name if "://" in name else f"{base}/{name.lstrip('/')}")
    return out


def consumed_before(before: Sequence[Shard], now: Sequence[Shard]) -> list[int]:
    """Indices in ``now`` of the shards a round ``before`` read (every one of them).

    Raises:
        SourceError: If one of them vanished or changed since (a followed dataset only
            grows).
    """
    at = {s.url: n for n, s in enumerate(now)}
    out = []
    for old in before:
        n = at.get(old.url)
        if n is None:
            raise SourceError(
                old.url,
                "vanished while the stream followed the dataset (a round read it already)",
                "a followed dataset only grows: keep every shard it read, or start a new "
                "stream without the state",
            )
        new = now[n]
        if new.size != old.size or (old.version and new.version and new.version != old.version):
            raise SourceError(
                old.url,
                f"changed since a round read it (size {old.size} -> {new.size}, version "
                f"{old.version!r} -> {new.version!r})",
                "a followed dataset only grows: write new shards instead of rewriting one",
            )
        out.append(n)
    return out


__all__ = ["Follow", "NothingNewError", "consumed_before", "read_manifest"]
