"""What the book needs of a listing, and of whoever makes listings. Pure: protocols only.

The planner (:mod:`ingest.planner`) lists the source, reads footers and the persistent index,
follows manifests and waits for new shards; it hands the book a listing that satisfies
:class:`Listed`. The book reads only row counts and fingerprints (URL, size, version) from
it, and passes the listing itself on, untouched, to the feeds in their :class:`FeedPlan
<ingest.core.share.FeedPlan>`: the engine reads the shards with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from ingest.core.errors import SourceError
from ingest.core.plan import PlanShard
from ingest.core.state import ShardRecord


class ListedShard(Protocol):
    """A shard's fingerprint: what the state records of it."""

    @property
    def url(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def version(self) -> str: ...
    @property
    def rows_version(self) -> str:
        """``version``, and what else tells its rows from another listing's (a Delta file's
        deletion vector): what the state records."""
        ...


class ShardCount(Protocol):
    """What the planner learnt of a shard's rows: a count, or None until read."""

    @property
    def rows(self) -> int | None: ...


L = TypeVar("L", bound="Listed")


class Listed(Protocol):
    """One listing of a stream's source: shards in listing order, with their row counts."""

    @property
    def shards(self) -> Sequence[ListedShard]: ...
    @property
    def infos(self) -> Sequence[ShardCount]: ...
    @property
    def classes(self) -> tuple[str, ...]:
        """Folder datasets: the sorted class names (the labels' meaning); else empty."""
        ...

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats its shards are read as, sorted (a state records them: rows are
        numbered per format)."""
        ...

    @property
    def tables(self) -> tuple[tuple[str, int], ...]:
        """The Delta tables listed: each root's URL with a version read (a table twice where
        the listing holds files of two versions: :meth:`joined`), sorted; else empty."""
        ...

    @property
    def kept(self) -> tuple[str, ...]:
        """URLs of shards :meth:`joined` from other versions: only the rows carried into
        the epoch are read from them (their own rows are the epoch's consumed)."""
        ...

    def joined(self: L, other: L, urls: Sequence[str]) -> L:
        """This listing with the shards ``urls`` of ``other`` (a listing of other versions of
        its Delta tables) among its own, in URL order, and ``other``'s versions."""
        ...

    def records(self) -> list[ShardRecord]:
        """The shards as the state records them."""
        ...

    def plan_shards(self) -> list[PlanShard]:
        """The shards as the epoch plan orders them (row counts and blocks)."""
        ...

    def subset(self: L, urls: Sequence[str]) -> L:
        """The shards named by ``urls``, in that order (all must be present)."""
        ...


class Lister(Protocol[L]):
    """Makes the listings a book plans epochs from (:class:`ingest.planner.Planner`)."""

    def listing(
        self,
        wanted: Callable[[L], bool] | None = None,
        *,
        first: bool,
        counted: bool,
        at: Mapping[str, Sequence[int]] | None = None,
        since: Mapping[str, int] | None = None,
        commits: Mapping[str, str] | None = None,
    ) -> L:
        """One listing of the source.

        Args:
            wanted: Whether a listing is worth planning (a followed round: a full step of new
                rows); while it says no, list again after a wait, until the follow's idle
                timeout, and then return the last listing anyway. None: the first listing.
            first: The stream's first epoch in this run: a followed source with no shard yet
                is waited for (up to the idle timeout) instead of refused.
            counted: Every shard needs a row count (several ranks take equal steps): shards
                whose footer has none are indexed.
            at: Versions of Delta tables, by their roots' URLs, to list them at (a state's,
                for the rest of its epoch: the files of each version listed); the others at
                their newest.
            since: Following (None: not), Delta tables' first versions by their roots' URLs
                (a followed stream's first round's): their files are those of that version
                and those appended since, read through compactions (the versions listed are
                the first and the newest); a table it does not name is listed at its newest.
            commits: Hugging Face Hub repositories' commits by their ``hf://`` URLs
                (``hf://datasets/<org>/<name>``; a state's, for the rest of its epoch):
                their files are those of these commits, the others' those their URLs'
                revisions name now.
        """
        ...

    def counted(self, listing: L, shards: Sequence[int]) -> L:
        """``listing`` with a row count for each of ``shards`` (indices) that has none: a
        followed round that must know whether its new shards hold a step of rows. Shards
        whose footer has no count are indexed (read whole, once: the count is kept)."""
        ...

    def window_rows(self, listing: L) -> int:
        """Rows per shuffle window in an epoch of ``listing``: fixed when the epoch is planned
        (within the stream's byte budget for the window), so the order stays a pure function
        of the plan."""
        ...

    def remember(self, listing: L) -> None:
        """Keep what ``listing`` learnt (footers, indexes) for later listings."""
        ...


def consumed_before(before: Sequence[ListedShard], now: Sequence[ListedShard]) -> list[int]:
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


__all__ = ["Listed", "ListedShard", "Lister", "ShardCount", "consumed_before"]
