"""A ring of shared-memory slots through which one worker process sends a batch's arrays.

Torch's ``DataLoader`` sends what a worker yields through a pipe: the worker pickles each
array into the pipe and the main process reads and unpickles it, two copies and a system
call per 64 KiB on each side. A :class:`SlotRing`, made by the main process before it starts
the worker, is one shared mapping of an anonymous memory file (``os.memfd_create``): a forked
worker inherits the mapping; one started by forkserver or spawn (a loader's in a Ray worker)
gets the file's descriptor as it starts, passed with the dataset the way multiprocessing
passes its own (``multiprocessing.reduction.DupFd``), and maps it. The file has no name to
clean up (it goes with the last descriptor and mapping), and its pages cost memory only once
written. Where the system has no ``memfd_create`` (not Linux), the ring is an anonymous
mapping (``mmap.mmap(-1, n, flags=MAP_SHARED)``), which only forked workers share.
The worker writes a batch's arrays into its lowest free slot and sends only where they lie
(:class:`Placed`); the main process copies them out, one ``memcpy`` each (a batch may be kept
for ever, so no view into a slot escapes), and frees the slot.

The header holds each slot's state (free or full) and a generation the main process moves
when it will take none of the batches sent so far (a loop left early: torch drops what the
workers read ahead). A semaphore counts the free slots: its release and acquire order the
main process's reads of a slot before the worker's next writes to it, on any processor.
A worker that finds no free slot in ``wait_s`` (or whose generation moved while it waited)
sends that batch by the pipe instead (:meth:`SlotRing.put` returns None), as it does a
batch larger than a slot: a ring never makes a worker hang or fail.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import multiprocessing.context
import multiprocessing.reduction
import os
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

FREE, FULL = 0, 1
"""A slot's state in the header."""
ALIGN = 64
"""Each array starts at a multiple of this many bytes in its slot (a cache line)."""
POLL_S = 0.01
"""How often a worker waiting for a free slot looks whether its batches were abandoned."""
SHAREABLE = hasattr(os, "memfd_create")
"""Whether a ring can go to a process started by spawn or forkserver (Linux)."""


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a worker wrote a batch's arrays: what it sends instead of them."""

    slot: int
    arrays: tuple[tuple[str, int, str, tuple[int, ...]], ...]
    """Each array's name, offset in the slot, dtype (``numpy.dtype.str``) and shape."""

    def __reduce__(self) -> tuple[type[Placed], tuple[int, tuple[Any, ...]]]:
        # Sent with every batch: a frozen dataclass with slots pickles through
        # dataclasses.fields() on both sides (several microseconds a batch).
        return Placed, (self.slot, self.arrays)


class SlotRing:
    """``slots`` shared slots of ``slot_bytes`` each, written by one process and read by
    another (a worker started after the ring was made, and the main process).

    Args:
        slots: The number of slots (>= 1): batches the worker may have sent and the main
            process not yet taken, before the worker waits.
        slot_bytes: Bytes per slot; a batch's arrays larger than that go by the pipe. Pages
            are only backed by memory once written, so a large slot costs what the largest
            batch written into it needs.
        context: The multiprocessing context (or module) that starts the writer; None: this
            process's default. Under spawn or forkserver the writer gets the ring pickled
            as it starts (a Process's argument), which needs ``memfd_create``
            (:data:`SHAREABLE`).

    Raises:
        ValueError: If ``slots`` < 1 or ``slot_bytes`` < ``ALIGN``.
        OSError: If the system refuses the memory (the caller sends by the pipe instead).
    """

    def __init__(self, slots: int, slot_bytes: int, context: Any = None) -> None:
        if slots < 1:
            raise ValueError(f"a SlotRing needs at least one slot, not slots={slots}")
        if slot_bytes < ALIGN:
            raise ValueError(f"slot_bytes={slot_bytes} must be at least {ALIGN}")
        self.slots = slots
        self.slot_bytes = slot_bytes - slot_bytes % ALIGN
        self._fd: int | None = None
        """The memory file's descriptor in the process that made the ring (None in a
        writer that got it pickled, and without ``memfd_create``)."""
        size = self._laid_out()
        if SHAREABLE:
            self._fd = os.memfd_create("ingest-slots", os.MFD_CLOEXEC)
            # A ring dropped without close() closes its file too: an open descriptor would
            # keep its pages for the life of the process (the mapping goes with the object).
            self._closer = weakref.finalize(self, os.close, self._fd)
            try:
                os.ftruncate(self._fd, size)
                self._map = mmap.mmap(self._fd, size, flags=mmap.MAP_SHARED)
            except OSError:
                self._closer()
                raise
        else:
            self._map = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
        # A semaphore of the writer's start method: one of a fork context has no name, and
        # multiprocessing refuses to send it to a process started otherwise.
        method = start_method(context)
        self._free = multiprocessing.get_context(method).Semaphore(slots)
        self._began = 0
        """The generation the writer's batches belong to."""
        self._viewed()

    def _laid_out(self) -> int:
        """Set where the slots begin (after the header); the ring's size in bytes."""
        self._header = _aligned(8 + self.slots)
        return self._header + self.slots * self.slot_bytes

    def _viewed(self) -> None:
        self._generation = np.ndarray((1,), np.uint64, buffer=self._map, offset=0)
        self._states = np.ndarray((self.slots,), np.uint8, buffer=self._map, offset=8)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Only as a process starts (spawn, forkserver): the descriptor is passed to it by
        # the process's start (DupFd), as multiprocessing passes its semaphores' and
        # queues'; pickled any other time, it would name memory the other end cannot find.
        if self._fd is None or multiprocessing.context.get_spawning_popen() is None:
            raise RuntimeError(
                "a SlotRing is sent to another process only as it starts (an argument of a "
                "multiprocessing Process, or the dataset of a DataLoader's workers), and only "
                "by the process that made it, where os.memfd_create exists; a forked process "
                "inherits it as it is"
            )
        fd = multiprocessing.reduction.DupFd(self._fd)
        return _attached, (fd, self.slots, self.slot_bytes, self._free)

    # The reader (the main process).

    def take(self, placed: Placed) -> dict[str, np.ndarray]:
        """Copies of the arrays ``placed`` names; their slot is free again."""
        with self.viewed(placed) as views:
            return {name: view.copy() for name, view in views.items()}

    @contextlib.contextmanager
    def viewed(self, placed: Placed) -> Iterator[dict[str, np.ndarray]]:
        """Views of the arrays ``placed`` names, in their slot, for the block only: the slot
        is free again when it is left (the writer may then overwrite it), so nothing made
        in the block may keep a view (copy it, or decode it into objects of their own)."""
        base = self._header + placed.slot * self.slot_bytes
        try:
            yield {
                name: np.ndarray(shape, np.dtype(dtype), buffer=self._map, offset=base + at)
                for name, at, dtype, shape in placed.arrays
            }
        finally:
            self._states[placed.slot] = FREE
            self._free.release()

    def abandon(self) -> None:
        """The reader will take none of the batches sent so far: the writer stops waiting
        for a slot (it sends by the pipe) and frees every slot when it :meth:`begin`\\ s."""
        self._generation[0] += 1

    def close(self) -> None:
        """Unmap the ring in this process (the writer's copy goes with its process)."""
        del self._generation, self._states
        with contextlib.suppress(BufferError):  # a caller's view still open: GC unmaps
            self._map.close()
        if self._fd is not None:
            self._fd = None
            self._closer()

    # The writer (the worker).

    def begin(self) -> None:
        """Writer: the reader takes none of the batches sent before (a new epoch's
        iterator, after the reader drained or dropped the last one's): every slot is free,
        even one a writer killed while writing had counted as taken."""
        self._states[:] = FREE
        while self._free.acquire(block=False):
            pass
        for _ in range(self.slots):
            self._free.release()
        self._began = int(self._generation[0])

    def put(self, arrays: Mapping[str, np.ndarray], wait_s: float) -> Placed | None:
        """Writer: write ``arrays`` into a free slot and return where they lie; None (send
        them by the pipe) if they are larger than a slot, or no slot was freed in
        ``wait_s`` seconds, or the reader abandoned this generation's batches."""
        layout = []
        size = 0
        for name, array in arrays.items():
            layout.append((name, size, array.dtype.str, array.shape))
            size = _aligned(size + array.nbytes)
        if size > self.slot_bytes:
            return None
        if not self._acquire(wait_s):
            return None
        slot = self._free_slot()
        base = self._header + slot * self.slot_bytes
        for (_, at, dtype, shape), array in zip(layout, arrays.values(), strict=True):
            into = np.ndarray(shape, np.dtype(dtype), buffer=self._map, offset=base + at)
            np.copyto(into, array, casting="no")
            del into
        self._states[slot] = FULL
        return Placed(slot, tuple(layout))

    def _acquire(self, wait_s: float) -> bool:
        """Take a free slot's count from the semaphore, looking every ``POLL_S`` whether
        the reader abandoned this generation."""
        deadline = time.monotonic() + wait_s
        while True:
            if int(self._generation[0]) != self._began:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._free.acquire(timeout=min(POLL_S, left)):
                return True

    def _free_slot(self) -> int:
        """The lowest free slot: the reader frees slots in about the order they were
        written, so the few a steady loop needs are used again and again (their pages stay
        warm in the caches, and no more of the mapping is backed by memory than they)."""
        free = np.flatnonzero(self._states == FREE)
        if not len(free):
            raise AssertionError("the semaphore counted a free slot that the header has not")
        return int(free[0])


def _attached(fd: Any, slots: int, slot_bytes: int, free: Any) -> SlotRing:
    """In a process started by spawn or forkserver: the ring another process made and sent
    as this one started, its memory mapped here (``fd``: multiprocessing's wrapper of the
    descriptor passed with the start)."""
    ring = SlotRing.__new__(SlotRing)
    ring.slots, ring.slot_bytes = slots, slot_bytes
    descriptor = fd.detach()
    try:
        ring._map = mmap.mmap(descriptor, ring._laid_out(), flags=mmap.MAP_SHARED)
    finally:
        os.close(descriptor)  # the mapping keeps the memory
    ring._fd, ring._free, ring._began = None, free, 0
    ring._viewed()
    return ring


def start_method(context: Any | None) -> str:
    """The start method of the processes ``context`` starts (a multiprocessing context, or
    a module such as ``multiprocessing`` or ``torch.multiprocessing``; None: this process's
    default): the one set, or else the platform's default, the first of
    ``get_all_start_methods()`` (not fixed for the process until one is set)."""
    source = multiprocessing if context is None else context
    method: str = source.get_start_method(allow_none=True)
    return method or multiprocessing.get_all_start_methods()[0]


def worker_rings(context: Any, workers: int, slots: int, slot_bytes: int) -> list[SlotRing]:
    """A ring of ``slots`` slots per DataLoader worker that ``context`` starts; none (they
    send by the pipe) where the system refuses the memory, or where workers started by
    ``spawn`` or ``forkserver`` could not get it (no ``memfd_create``)."""
    if start_method(context) != "fork" and not SHAREABLE:
        return []
    try:
        return [SlotRing(slots, slot_bytes, context) for _ in range(workers)]
    except OSError:
        return []


TEXT_TYPES = {
    str(kind): kind for kind in (pa.string(), pa.binary(), pa.large_string(), pa.large_binary())
}
"""The Arrow column types that travel in a slot as their buffers (by their names)."""
_NO_BYTES = np.zeros(0, np.uint8)


def text_buffers(table: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The offsets (from 0) and the bytes of each string or binary column of ``table``
    without nulls, as numpy arrays over its buffers (for :meth:`SlotRing.put`); none for
    anything but an Arrow table or record batch."""
    if not isinstance(table, pa.Table | pa.RecordBatch):
        return {}
    out = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        kind = column.type
        if str(kind) not in TEXT_TYPES or column.null_count:
            continue
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        width = np.int64 if kind in (pa.large_string(), pa.large_binary()) else np.int32
        _, offsets_buffer, data = array.buffers()
        if not len(array) or offsets_buffer is None:
            out[name] = (np.zeros(1, width), _NO_BYTES)
            continue
        at = array.offset * np.dtype(width).itemsize
        offsets = np.frombuffer(offsets_buffer, width, count=len(array) + 1, offset=at)
        first, last = int(offsets[0]), int(offsets[-1])
        values = np.frombuffer(data, np.uint8)[first:last] if data is not None else _NO_BYTES
        out[name] = (offsets - first if first else offsets, values)
    return out


def text_values(offsets: np.ndarray, data: np.ndarray, kind: str) -> list[Any]:
    """The Python values (``str``, ``bytes``) of a column :func:`text_buffers` gave as
    ``offsets`` and ``data`` (views into a slot: the values are objects of their own) of
    the type named ``kind``."""
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(TEXT_TYPES[kind], len(offsets) - 1, buffers).to_pylist()  # type: ignore[no-any-return]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


__all__ = [
    "FREE",
    "FULL",
    "SHAREABLE",
    "TEXT_TYPES",
    "Placed",
    "SlotRing",
    "start_method",
    "text_buffers",
    "text_values",
    "worker_rings",
]
