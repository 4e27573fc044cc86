"""Run an iterator in a background thread, a bounded number of items and bytes ahead.

Reading and decoding release the GIL (network waits, pyarrow), so one thread overlaps them
with the consumer. Every wait has a timeout; an exception in the thread is raised in the
consumer; closing the consumer stops the thread. Items of 1 MiB rows or more make a bound
in items alone a bound of gigabytes: the thread also waits while the items it holds reach
``max_bytes`` (one item is always let through, however large), and it makes the next item
only when one as large as the last would fit: an item made while the queue is full waits
outside the bound, with what its making holds (a Parquet row group's pages).
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

from ingest.core.errors import StreamTimeoutError

T = TypeVar("T")
R = TypeVar("R")
_POLL_S = 0.1


# Prefetchers still running. At exit each is stopped and joined before the interpreter
# finalises: a reader thread (or a pyarrow I/O thread calling back into a Python file) that
# is still running then aborts the process. The handler is registered again whenever a
# prefetcher starts, so that it runs before the exit handlers of the libraries the reader
# uses (atexit runs the most recent first).
_LIVE: weakref.WeakSet[Prefetcher[object]] = weakref.WeakSet()


def _stop_all() -> None:
    for prefetcher in list(_LIVE):
        prefetcher.close()


class _Done:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[T]):
    """Iterate ``make()`` in a daemon thread, up to ``depth`` items and ``max_bytes`` ahead.

    Args:
        make: Builds the iterator; called in the thread.
        depth: Items buffered ahead (>= 1).
        timeout_s: Longest wait for one item before :class:`StreamTimeoutError`.
        what: Names the producer in the timeout message.
        max_bytes: Most bytes of items buffered ahead, as ``size`` counts them; one item is
            buffered whatever its size. None: items only.
        size: The bytes of one item (needed with ``max_bytes``).
    """

    def __init__(
        self,
        make: Callable[[], Iterator[T]],
        depth: int,
        timeout_s: float,
        what: str,
        *,
        max_bytes: int | None = None,
        size: Callable[[T], int] | None = None,
    ) -> None:
        if max_bytes is not None and size is None:
            raise TypeError("Prefetcher(max_bytes=...) needs size=, the bytes of one item")
        self._queue: queue.Queue[tuple[T | _Done | _Failed, int]] = queue.Queue(
            maxsize=max(depth, 1)
        )
        self._max_bytes = max_bytes
        self._size = size
        self._last = 0  # bytes of the last item put: the next one is expected about as large
        self._room = threading.Condition()
        self.held_bytes = 0
        """Bytes of the items buffered now (0 without ``max_bytes``)."""
        self.peak_bytes = 0
        """The most bytes buffered at once."""
        self._stop = threading.Event()
        self._timeout_s = timeout_s
        self._what = what
        self._thread = threading.Thread(
            target=self._run, args=(make,), daemon=True, name=f"ingest-prefetch:{what}"
        )
        self._thread.start()
        _LIVE.add(self)  # type: ignore[arg-type]
        atexit.unregister(_stop_all)
        atexit.register(_stop_all)

    def _put(self, item: T | _Done | _Failed) -> bool:
        size = 0
        if self._max_bytes is not None and not isinstance(item, (_Done, _Failed)):
            assert self._size is not None
            size = self._size(item)
            with self._room:
                while self.held_bytes and self.held_bytes + size > self._max_bytes:
                    if self._stop.is_set():
                        return False
                    self._room.wait(_POLL_S)
                self.held_bytes += size  # taken before the item can be: never below zero
                self.peak_bytes = max(self.peak_bytes, self.held_bytes)
                self._last = size
        while not self._stop.is_set():
            try:
                self._queue.put((item, size), timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _room_for_next(self) -> bool:
        """Wait until an item as large as the last one put would fit in ``max_bytes`` (or
        none is held); False if stopped meanwhile."""
        if self._max_bytes is None:
            return True
        with self._room:
            while self.held_bytes and self.held_bytes + self._last > self._max_bytes:
                if self._stop.is_set():
                    return False
                self._room.wait(_POLL_S)
        return True

    def _run(self, make: Callable[[], Iterator[T]]) -> None:
        it: Iterator[T] | None = None
        try:
            it = make()
            while self._room_for_next():
                try:
                    item = next(it)
                except StopIteration:
                    self._put(_Done())
                    return
                if not self._put(item):
                    return
        except BaseException as e:  # forwarded to the consumer, which re-raises it
            self._put(_Failed(e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        try:
            item, size = self._queue.get(timeout=self._timeout_s)
        except queue.Empty:
            self.close()
            raise StreamTimeoutError(
                f"no data from {self._what} for {self._timeout_s:.0f} s; the store may be "
                "unreachable or a shard read stalled. Raise ReadOptions.timeout_s for very "
                "slow stores"
            ) from None
        if isinstance(item, _Done):
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        if size:
            with self._room:
                self.held_bytes -= size
                self._room.notify()
        return item

    def close(self) -> None:
        """Stop the thread and drop what it buffered; waits up to 10 s for the thread."""
        self._stop.set()
        deadline = 10.0
        while self._thread.is_alive() and deadline > 0:
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=_POLL_S)
            deadline -= _POLL_S
        with self._room:
            self.held_bytes = 0  # what was buffered is dropped
        live: weakref.WeakSet[Prefetcher[object]] | None = _LIVE
        if live is not None:  # None where a loop is closed as the interpreter tears this
            # module down (a script that ended inside a packing loop): _stop_all stopped
            # the thread already, and an error here was printed as "Exception ignored"
            live.discard(self)  # type: ignore[arg-type]


T_co = TypeVar("T_co", covariant=True)


class _Feed(Protocol[T_co]):
    def __iter__(self) -> Iterator[T_co]: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def read_ahead(
    feed: _Feed[T],
    depth: int,
    timeout_s: float,
    name: str,
    *,
    max_bytes: int | None = None,
    size: Callable[[T], int] | None = None,
) -> Iterator[Iterator[T]]:
    """``feed``'s items, read ``depth`` and at most ``max_bytes`` ahead in a background
    thread (0: on demand); on leaving, the thread is stopped and the feed closed."""
    items: Iterator[T] = (
        Prefetcher(lambda: iter(feed), depth, timeout_s, name, max_bytes=max_bytes, size=size)
        if depth
        else iter(feed)
    )
    try:
        yield items
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
        feed.close()


def in_order(
    fn: Callable[[T], R], items: Iterable[T], calls: int, name: str
) -> Generator[R, None, None]:
    """``fn`` of each of ``items``, up to ``calls`` at once in threads of their own, the
    results in the items' order (1: one after another, in the caller's thread).

    For work that releases the GIL for most of its time (a tokenizer's batch encoding): one
    call's Python part, and the caller's making of the next item, overlap the others.
    Closing the iterator closes ``items``, drops the calls not started and waits up to
    :data:`END_S` for the ones running to end, and their threads: a call left running would
    go on after the stream closed (holding the tokenizer's lock across a fork; issue 31)."""
    if calls <= 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(calls, thread_name_prefix=f"ingest-{name}")
    pending: deque[Future[R]] = deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= calls:
                yield pending.popleft().result()  # no timeout: as long as fn's own call
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(items, "close", None)
        if close is not None:
            close()
        _end(pool, pending, END_S)


END_S = 10.0
"""How long closing :func:`in_order` waits for the calls running (a batch's encoding)."""


def _end(pool: ThreadPoolExecutor, running: Iterable[Future[R]], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``running`` to end and for ``pool``'s threads (shut down)
    to exit."""
    deadline = time.monotonic() + timeout_s
    # A cancelled call that never started is not "done" to futures.wait: left out.
    futures.wait([f for f in running if not f.cancelled()], timeout=timeout_s)
    for thread in list(getattr(pool, "_threads", ())):  # the executor's own; no public join
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
