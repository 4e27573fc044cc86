"""A rank's feed inside a reader actor (:mod:`ingest.distributed.rank_feed`), without Ray:
what its reader reads of it from other threads."""

from __future__ import annotations

import threading
from typing import Any

from ingest.distributed.rank_feed import RankFeed


class _NoCoordinator:
    """A reader whose coordinator cannot be reached: the feed's thread queues the error
    and ends, leaving one item in the queue."""

    depth = 4
    timeout_s = 1.0
    parallel_batches = 1

    @property
    def coordinator(self) -> Any:
        raise ConnectionError("no coordinator in this test")

    def release(self, nbytes: int) -> None:
        pass


def test_depth_reads_the_queue_under_the_feeds_lock() -> None:
    """The reader counts every feed's depth for its metrics while the feeds' threads put
    and takes pop (CI once failed a take with 'deque mutated during iteration'): counting
    waits for the lock that guards the queue."""
    feed = RankFeed(_NoCoordinator(), rank=0, session=1, epoch=0)  # type: ignore[arg-type]
    feed._thread.join(10)
    assert not feed._thread.is_alive()
    got: list[int] = []
    with feed._cond:
        counter = threading.Thread(target=lambda: got.append(feed.depth))
        counter.start()
        counter.join(0.3)
        assert counter.is_alive(), "depth read the queue without holding the feed's lock"
    counter.join(10)
    assert got == [0]  # the queued error is no batch
