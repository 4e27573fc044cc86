"""Ctrl-C while a stream hands out a batch: a KeyboardInterrupt that loses or repeats none.

Python raises a KeyboardInterrupt in the main thread at whatever line it runs when SIGINT
comes (a notebook's "interrupt kernel" sends it). In a stream's hand-out that may be after
the batch was recorded as handed out and before the loop returned it (the batch lost), or
in the middle of sending the records to the book (the batches repeated after a resume), or
between taking the loop's lock and its ``try`` (every later loop refused as busy). Measured
before this module, over the 103 lines of one hand-out (``tests/test_interrupts``' sweep):
a Ctrl-C at 9 of them lost the batch, and at 1 left the stream refusing every later loop.

So the main thread's SIGINT handler (put in place of Python's default one by each loop step
or state call in the main thread; left alone if the program set its own) holds an interrupt
that comes inside a *critical* part, and raises it otherwise, as Python's does:

- waiting for a batch, reading and converting it (nothing recorded yet) are not critical:
  a Ctrl-C there is raised at once, and the next loop reads that batch again;
- from the moment a node records a batch as handed out (:func:`commit`) to the return of
  the loop's ``next()``, and the whole of ``state_dict``/``load_state_dict``, are: a Ctrl-C
  then is held, and raised by the next call into the stream (the loop's next ``next()``,
  before it takes anything), or at the end of a state call. So the user's loop gets the
  batch in hand, and the interrupt one step later at most. (A ``for`` loop stores the batch
  before the eval loop's next check; ``b = next(it)`` checks after the call, before the
  store, so a Ctrl-C that comes as it returns is raised with the batch in no variable.)

Guarded: an :class:`ingest.Stream`'s loop, an :class:`ingest.DataLoader`'s (its main
process, which records what its workers read) and a Ray rank's iterator in the main thread
(a notebook's, on the driver), each a :class:`Guarded`. A rank's loop that a Ctrl-C ends
while it waits for its reader may lose the reader's answer: its next loop has the reader go
on after the last batch handed out (``RankIterator._recover``). A loop in a thread other
than the main one (a Ray Train worker's) is not guarded: no signal comes there.

Python runs a signal's handler between bytecodes, at points CPython's eval loop checks
(calls, backward jumps); the loop leaves the critical part in its last statement before it
returns, where no call comes in between.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TypeVar

T = TypeVar("T")


class _Guard:
    """The main thread's SIGINT handler and its state (main thread only)."""

    __slots__ = ("depth", "pending", "safe")

    def __init__(self) -> None:
        self.depth = 0
        """Loops and state calls the main thread is inside."""
        self.safe = False
        """Inside one, whether an interrupt may be raised at once (nothing recorded yet)."""
        self.pending = False
        """An interrupt came inside a critical part and was held."""

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.depth and not self.safe:
            self.pending = True
            return
        signal.default_int_handler(signum, frame)

    def install(self) -> bool:
        """Install the handler in place of Python's default one; False outside the main
        thread, or when the program has a SIGINT handler of its own (left in place: its
        interrupts are its own). Asked at every loop step: IPython's kernel sets the default
        handler anew for each cell it runs, and its own (ignoring SIGINT) between cells."""
        if threading.get_ident() != _MAIN:
            return False
        current = signal.getsignal(signal.SIGINT)
        if current == self.handle:
            return True
        if current is not signal.default_int_handler:
            return False
        signal.signal(signal.SIGINT, self.handle)
        return True

    def reset(self) -> None:
        """A forked child starts outside every loop (its parent's may have been inside)."""
        self.depth, self.safe, self.pending = 0, False, False


_MAIN = threading.main_thread().ident
GUARD = _Guard()
os.register_at_fork(after_in_child=GUARD.reset)


def commit() -> None:
    """A node is about to record what it hands out: from here to the loop's return, an
    interrupt is held (a no-op outside the main thread, or outside a loop)."""
    if threading.get_ident() == _MAIN:
        GUARD.safe = False


def enter() -> bool:
    """Enter a loop's ``next()``: raise an interrupt held since the last one; True when
    guarded (the caller leaves with ``GUARD.depth -= 1`` as its last statement)."""
    if not GUARD.install():
        return False
    if GUARD.pending:
        GUARD.pending = False
        raise KeyboardInterrupt
    GUARD.depth += 1
    GUARD.safe = False
    return True


def raise_held() -> None:
    """Raise an interrupt held, if any (a loop that ends without a batch: nothing to lose)."""
    if GUARD.pending and not GUARD.depth:
        GUARD.pending = False
        raise KeyboardInterrupt


class Guarded(Iterator[T]):
    """A loop's iterator over ``items`` (a generator that hands out batches): its
    ``next()`` is interruptible while it waits, and holds a Ctrl-C from the commit on.

    Subclasses check and take what one ``next()`` holds in :meth:`_acquire` (an interrupt is
    held there) and give it back in :meth:`_release`.
    """

    def __init__(self, items: Iterator[T]) -> None:
        self._items = items

    def _acquire(self) -> None:
        return None

    def _release(self) -> None:
        return None

    def close(self) -> None:
        """End the loop: its generator closes (its read-ahead stops)."""
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def __next__(self) -> T:
        guarded = enter()
        try:
            self._acquire()
            try:
                if guarded:
                    GUARD.safe = True  # nothing recorded yet: a Ctrl-C may come at once
                item = next(self._items)
            finally:
                if guarded:
                    GUARD.safe = False
                self._release()
        except BaseException:
            if guarded:
                GUARD.depth -= 1
                raise_held()  # no batch handed out: nothing to lose
            raise
        if guarded:
            GUARD.depth -= 1  # the last statement before the return (no call in between)
        return item


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """The block is critical: an interrupt in it is raised when it ends."""
    safe = GUARD.safe
    if not enter():
        yield
        return
    try:
        yield
    finally:
        GUARD.safe = safe
        GUARD.depth -= 1
        raise_held()


__all__ = ["GUARD", "Guarded", "commit", "deferred", "enter", "raise_held"]
