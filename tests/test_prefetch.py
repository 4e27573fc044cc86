"""The read-ahead thread (ingest.engine.prefetch): bounded, in order, errors, timeouts,
close. No Ray."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from ingest.core.errors import StreamTimeoutError
from ingest.engine.prefetch import Prefetcher, in_order


class Counting:
    """An iterator of 0, 1, 2, ... that counts the items read."""

    def __init__(self, n: int = 1000) -> None:
        self.n = n
        self.read = 0
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            with self.lock:
                self.read += 1
            yield i


def test_read_ahead_stops_at_its_depth() -> None:
    """``depth`` items queued and one read and waiting for room: no more until one is taken."""
    source, depth = Counting(), 4
    ahead = Prefetcher(lambda: iter(source), depth, 10.0, "counting")
    try:
        for taken in range(4):
            deadline = time.monotonic() + 5
            while source.read < taken + depth + 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)  # room to read past it, if it would
            assert source.read == taken + depth + 1
            assert next(ahead) == taken
    finally:
        ahead.close()


def test_every_item_in_order_then_the_end() -> None:
    source = Counting(50)
    assert list(Prefetcher(lambda: iter(source), 3, 10.0, "counting")) == list(range(50))


def test_an_error_in_the_thread_is_raised_in_the_consumer() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("bad shard")

    ahead = Prefetcher(failing, 2, 10.0, "failing")
    assert next(ahead) == 1
    with pytest.raises(ValueError, match="bad shard"):
        next(ahead)


def test_a_producer_that_stalls_times_out_with_a_clear_error() -> None:
    stop = threading.Event()

    def stalled() -> Iterator[int]:
        stop.wait(1)  # the timeout's close waits for the thread
        yield 1

    ahead = Prefetcher(stalled, 2, 0.3, "a stalled store")
    try:
        with pytest.raises(StreamTimeoutError, match="a stalled store"):
            next(ahead)
    finally:
        stop.set()
        ahead.close()


def test_close_stops_the_thread_and_closes_the_iterator() -> None:
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    ahead = Prefetcher(endless, 2, 10.0, "endless")
    assert [next(ahead) for _ in range(5)] == list(range(5))
    ahead.close()
    assert closed.wait(5)
    assert not ahead._thread.is_alive()


def test_in_order_runs_calls_at_once_and_hands_results_on_in_order() -> None:
    # Two calls at once: each waits at a barrier of 2, which one call alone never passes.
    both = threading.Barrier(2, timeout=5)

    def slow_first(n: int) -> int:
        if n < 2:
            both.wait()
        time.sleep(0.02 if n % 2 == 0 else 0)  # the later call of a pair ends first
        return n * 10

    assert list(in_order(slow_first, iter(range(6)), 2, "test")) == [0, 10, 20, 30, 40, 50]
    one = threading.Barrier(2, timeout=0.2)

    def alone(n: int) -> int:
        if n == 0:
            with pytest.raises(threading.BrokenBarrierError):
                one.wait()  # no second call runs meanwhile
        return n

    assert list(in_order(alone, iter(range(3)), 1, "test")) == [0, 1, 2]


def test_in_order_raises_a_calls_error_in_its_place_and_closes_its_items() -> None:
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            closed.set()

    def fails_at_3(n: int) -> int:
        if n == 3:
            raise ValueError("bad batch 3")
        return n

    got = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for n in in_order(fails_at_3, items(), 2, "test"):
            got.append(n)
    assert got == [0, 1, 2] and closed.is_set()
    closed.clear()
    early = in_order(lambda n: n, items(), 2, "test")
    assert next(early) == 0
    early.close()  # left early: the items are closed, the calls not started dropped
    assert closed.is_set()
