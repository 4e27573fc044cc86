"""A rank's share of an epoch, as the book hands it to the rank's feed. Pure.

The book (:mod:`ingest.core.book`) cuts each epoch into equal shares; a :class:`FeedPlan` is
one of them with where to start in it (a saved cursor, the rows already consumed). The
engine's feed reads it; a Ray reader receives it from the coordinator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic

from ingest.core.assign import Span
from ingest.core.intervals import IntervalSet
from ingest.core.listing import L
from ingest.core.state import Cursor


@dataclass(frozen=True, slots=True)
class FeedPlan(Generic[L]):
    """What one feed reads: a rank's share of one epoch and where to start in it.

    Attributes:
        epoch: The epoch (part of the shuffle keys).
        rank: The rank (part of the shuffle keys).
        next_step: Global step number of the first batch this feed yields.
        steps: Batches this feed yields, or None when row counts are unknown (one rank).
        spans: The rank's share in reading order.
        skip: Rows already consumed, per segment (``CARRY``, ``MAIN``) and shard: left out.
        cursor: Where to start (from a state), or None for the beginning of the share.
        listing: The epoch's listing (``Span.shard`` indexes it).
        window: Rows per shuffle window in this epoch: ``FeedConfig.window`` within the
            stream's ``shuffle_bytes``, fixed when the epoch was planned
            (:meth:`ingest.core.listing.Lister.window_rows`); None: ``FeedConfig.window``.
    """

    epoch: int
    rank: int
    next_step: int
    steps: int | None
    spans: tuple[Span, ...]
    skip: tuple[Mapping[int, IntervalSet], Mapping[int, IntervalSet]]
    cursor: Cursor | None
    listing: L
    window: int | None = None


__all__ = ["FeedPlan"]
