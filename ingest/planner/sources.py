"""A planner over several named sources: each source listed by its own planner, once.

A stream that draws from several datasets plans each one as a one-source stream plans its
own: every source has its :class:`~ingest.planner.planner.Planner` (its URLs, format,
catalog of footers and index, follow mode), its listing, and its part of the state
(:class:`ingest.core.state.SourcesState`). :class:`SourcePlanners` lists them side by side (the
stores answer in parallel: the time of the slowest source, not of them all) and checks a
loaded state against the listings, source by source, so that a changed shard or a source
added or gone is named. It does no more: how the items of the sources are drawn is the
stream's.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from ingest.core.errors import ConfigError, IngestError, StateError
from ingest.core.state import SourcesState, match_listing
from ingest.planner.catalog import Listing
from ingest.planner.planner import Planner


class SourcePlanners:
    """The planners of a stream's named sources, in the stream's order.

    Args:
        planners: Each source's planner, by name.
    """

    def __init__(self, planners: Mapping[str, Planner]) -> None:
        if not planners:
            raise ConfigError("a stream over several sources needs at least one source")
        self.planners = dict(planners)

    @property
    def names(self) -> list[str]:
        return list(self.planners)

    def listings(self, *, counted: bool = False) -> dict[str, Listing]:
        """One listing of every source, listed side by side; ``counted``: every shard gets
        a row count (:meth:`Planner.scan`).

        Raises:
            IngestError: As :meth:`Planner.scan`, for the first source (in order) that
                could not be listed, with a note naming it.
        """
        with ThreadPoolExecutor(
            max_workers=min(8, len(self.planners)), thread_name_prefix="ingest-sources"
        ) as pool:
            futures = {
                name: pool.submit(planner.scan, counted=counted)
                for name, planner in self.planners.items()
            }
            out: dict[str, Listing] = {}
            for name, future in futures.items():
                try:
                    out[name] = future.result()
                except IngestError as e:  # its class kept, so callers catch it as before
                    e.add_note(f"while listing source {name!r} of the stream")
                    raise
            return out

    def check(self, state: SourcesState, listings: Mapping[str, Listing]) -> None:
        """Refuse a state whose sources are not these, or one whose source's shards are gone
        or changed in its listing (new shards are fine: they join the source's next epoch).

        Raises:
            StateError: Naming the sources added or gone, or the source whose shards
                changed with what changed.
        """
        saved, now = list(state.parts), self.names
        if sorted(saved) != sorted(now):
            gone = sorted(set(saved) - set(now))
            added = sorted(set(now) - set(saved))
            raise StateError(
                f"the state holds the sources {saved}, this stream reads {now} (gone: "
                f"{gone}, added: {added}); a source's rows and progress are kept by its "
                "name: build the stream over the same sources to resume it"
            )
        for name, part in state.parts.items():
            listing = listings[name]
            try:
                match_listing(part.dataset, listing.records(), listing.classes, listing.formats)
            except StateError as e:
                raise StateError(f"source {name!r}: {e}") from None


__all__ = ["SourcePlanners"]
