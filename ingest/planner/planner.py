"""The planner: the listings a stream's book plans its epochs from.

A book (:class:`ingest.core.book.EpochBook`) does no I/O: when it plans an epoch it asks its
planner for a listing. The planner lists the source once per call (footers and indexes are
cached across calls by its :class:`~ingest.planner.catalog.Catalog`), gives every shard a row
count when the book needs one (several ranks), keeps to the shards a followed manifest names,
and, following a dataset that grows, lists again every ``poll_s`` until the book finds a
listing worth a round (or the idle timeout passes). It also fixes each epoch's rows per
shuffle window from the listing's bytes per row (:mod:`ingest.planner.budget`).

One planner serves every book of a stream (a book per world size, per restore).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from ingest.core.errors import NoShardsError
from ingest.planner import budget
from ingest.planner.catalog import Catalog, Listing
from ingest.storage.follow import Follow, read_manifest
from ingest.storage.sources import Source


class Planner:
    """Lists a stream's source for its books (see the module docstring).

    Args:
        catalog: Lists the source and reads footers (and the persistent index).
        follow: The dataset grows while the stream runs (:mod:`ingest.storage.follow`).
        columns: The columns the stream reads (bytes per row count these only).
        shuffle_window: Rows per shuffle window, at most.
        shuffle_bytes: Bytes per shuffle window, about; None: rows only.
        progress: Show progress bars while footers are read and shards indexed.
    """

    def __init__(
        self,
        catalog: Catalog,
        *,
        follow: Follow | None = None,
        columns: Sequence[str] | None = None,
        shuffle_window: int,
        shuffle_bytes: int | None,
        progress: bool = False,
    ) -> None:
        self.catalog = catalog
        self.follow = follow
        self.columns = columns
        self.shuffle_window = shuffle_window
        self.shuffle_bytes = shuffle_bytes
        self.progress = progress
        self.wait: Callable[[float], None] = time.sleep
        """How a followed round waits between listings (the coordinator waits on its
        condition, so that acks go on meanwhile)."""

    @property
    def source(self) -> Source:
        return self.catalog.source

    def scan(
        self,
        *,
        counted: bool = False,
        at: Mapping[str, Sequence[int]] | None = None,
        since: Mapping[str, int] | None = None,
        commits: Mapping[str, str] | None = None,
    ) -> Listing:
        """One listing of the source; ``counted``: every shard gets a row count; ``at``:
        Delta tables' versions to list them at; ``since``: followed Delta tables' first
        versions (:meth:`Catalog.scan`).

        Following a manifest, only the shards it names (read first) are in the listing; a
        line that names no listed shard is an error (:meth:`ingest.storage.follow.Manifest.select`).
        """
        finished = None
        if self.follow is not None and self.follow.manifest is not None:
            finished = read_manifest(self.source, self.follow.manifest)
        listing = self.catalog.scan(
            progress=self.progress, index=counted, at=at, since=since, commits=commits
        )
        if finished is not None:
            listing = listing.subset(finished.select(self.source, [s.url for s in listing.shards]))
        return listing

    def listing(
        self,
        wanted: Callable[[Listing], bool] | None = None,
        *,
        first: bool,
        counted: bool,
        at: Mapping[str, Sequence[int]] | None = None,
        since: Mapping[str, int] | None = None,
        commits: Mapping[str, str] | None = None,
    ) -> Listing:
        """See :meth:`ingest.core.listing.Lister.listing`."""
        follow = self.follow
        deadline = time.monotonic() + (follow.idle_timeout_s if follow else 0.0)

        def pause(poll_s: float) -> None:  # until the next listing, within the deadline
            self.wait(min(poll_s, max(deadline - time.monotonic(), 0.0)))

        while True:
            try:
                listing = self.scan(counted=counted, at=at, since=since, commits=commits)
            except NoShardsError as e:  # followed: the first round waits for a first shard
                if follow is None or not first:
                    raise
                if time.monotonic() >= deadline:
                    raise NoShardsError(
                        e.url,
                        f"no data files after waiting {follow.idle_timeout_s:g} s for the "
                        f"first shard ({e.problem})",
                        f"{e.fix}; or raise Follow.idle_timeout_s",
                    ) from None
                pause(follow.poll_s)
                continue
            if wanted is None or follow is None or time.monotonic() >= deadline:
                return listing
            if wanted(listing):
                return listing
            pause(follow.poll_s)

    def counted(self, listing: Listing, shards: Sequence[int]) -> Listing:
        """See :meth:`ingest.core.listing.Lister.counted`."""
        return self.catalog.count(listing, shards, self.progress)

    def window_rows(self, listing: Listing) -> int:
        """See :meth:`ingest.core.listing.Lister.window_rows` (:mod:`ingest.planner.budget`)."""
        return budget.listing_window_rows(
            listing, self.columns, self.shuffle_window, self.shuffle_bytes
        )

    def remember(self, listing: Listing) -> None:
        self.catalog.remember(listing)


__all__ = ["Planner"]
