"""The shared-memory slot ring (ingest.integrations.shared_slots), without a DataLoader: a
writer in another process (forked, or started by forkserver or spawn) and this process
reading, as a DataLoader worker and its main process do."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ingest.integrations.shared_slots import SHAREABLE, Placed, SlotRing

FORK = multiprocessing.get_context("fork")


def batch(n: int) -> dict[str, np.ndarray]:
    """A batch of the kinds a DataLoader worker sends, its values a function of ``n``."""
    ids = np.arange(n * 100, n * 100 + 100, dtype=np.int64)
    return {
        "id": ids,
        "tokens": (ids[:, None] * 31 + np.arange(16)).astype(np.int32) % 50_000,
        "score": (ids % 7).astype(np.float32) / 7,
        "mask": ids % 2 == 0,
        "empty": np.zeros((0, 3), np.float64),
    }


def equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def forked(ring: SlotRing, write: Callable[[SlotRing, Any], None]) -> tuple[Any, Any]:
    """A forked writer running ``write(ring, conn)``, and this end of its pipe."""
    here, there = FORK.Pipe()
    process = FORK.Process(target=write, args=(ring, there), daemon=True)
    process.start()
    there.close()
    return process, here


def write_batches(count: int) -> Callable[[SlotRing, Any], None]:
    def write(ring: SlotRing, conn: Any) -> None:
        ring.begin()
        for n in range(count):
            conn.send(ring.put(batch(n), wait_s=30.0))
        conn.close()

    return write


def test_a_forked_writer_s_batches_read_back_equal_and_as_copies() -> None:
    ring = SlotRing(4, 1 << 20)
    process, conn = forked(ring, write_batches(3))
    got = [ring.take(conn.recv()) for _ in range(3)]
    process.join(10)
    for n, taken in enumerate(got):
        equal(taken, batch(n))
        # A copy of its own: a batch kept for ever does not change when its slot is reused.
        assert all(a.flags.owndata and a.flags.writeable for a in taken.values())
    ring.begin()  # this process writes next: every slot again
    ring.put({"id": np.full(100, -1, np.int64)}, wait_s=1.0)
    assert got[0]["id"][0] == 0
    ring.close()


def test_a_forked_writer_goes_on_through_the_ring_as_the_reader_frees_slots() -> None:
    ring = SlotRing(3, 1 << 20)
    process, conn = forked(ring, write_batches(10))
    for n in range(10):
        placed = conn.recv()
        assert isinstance(placed, Placed) and 0 <= placed.slot < 3
        equal(ring.take(placed), batch(n))
    process.join(10)
    ring.close()


def test_the_writer_takes_the_lowest_free_slot() -> None:
    """A steady loop uses the same few slots again (their pages warm), however many the
    ring has for bundles (ingest.integrations.worker_items)."""
    ring = SlotRing(6, 1 << 20)
    ring.begin()
    placed = [ring.put(batch(n), wait_s=1.0) for n in range(4)]
    assert [p.slot for p in placed if p is not None] == [0, 1, 2, 3]
    for p in (placed[2], placed[0]):
        assert p is not None
        ring.take(p)
    again = [ring.put(batch(n), wait_s=1.0) for n in (4, 5, 6)]
    assert [p.slot for p in again if p is not None] == [0, 2, 4]
    for p, n in ((placed[1], 1), (placed[3], 3), (again[0], 4), (again[1], 5), (again[2], 6)):
        assert p is not None
        equal(ring.take(p), batch(n))
    ring.close()


def test_a_full_ring_sends_by_the_pipe_after_the_wait_then_a_freed_slot_is_used() -> None:
    ring = SlotRing(3, 1 << 20)
    ring.begin()
    placed = [ring.put(batch(n), wait_s=1.0) for n in range(3)]
    started = time.monotonic()
    assert ring.put(batch(3), wait_s=0.2) is None  # no slot freed in 0.2 s: by the pipe
    assert time.monotonic() - started >= 0.2
    first = placed[0]
    assert first is not None
    equal(ring.take(first), batch(0))
    again = ring.put(batch(4), wait_s=0.2)
    assert again is not None and again.slot == first.slot
    for p, n in ((placed[1], 1), (placed[2], 2), (again, 4)):
        assert p is not None
        equal(ring.take(p), batch(n))
    ring.close()


def test_a_batch_larger_than_a_slot_goes_by_the_pipe_and_takes_no_slot() -> None:
    ring = SlotRing(2, 4096)
    ring.begin()
    assert ring.put({"big": np.zeros(4097, np.uint8)}, wait_s=1.0) is None
    # Two arrays of 2,000 bytes each start on a 64-byte boundary: 2,048 + 2,000 fit in 4,096.
    fits = ring.put({"a": np.ones(2000, np.uint8), "b": np.ones(2000, np.uint8)}, wait_s=1.0)
    assert fits is not None and fits.slot == 0
    assert [at for _, at, _, _ in fits.arrays] == [0, 2048]
    ring.close()


def test_abandoned_batches_end_the_writer_s_wait_and_free_their_slots() -> None:
    def write(ring: SlotRing, conn: Any) -> None:
        ring.begin()
        for n in range(2):
            conn.send(ring.put(batch(n), wait_s=30.0))
        started = time.monotonic()
        conn.send(ring.put(batch(2), wait_s=30.0))  # the ring is full: waits
        conn.send(time.monotonic() - started)
        ring.begin()  # the next epoch: the abandoned batches' slots are free
        conn.send([ring.put(batch(n), wait_s=1.0) for n in (3, 4)])

    ring = SlotRing(2, 1 << 20)
    process, conn = forked(ring, write)
    assert [conn.recv().slot for _ in range(2)] == [0, 1]
    time.sleep(0.1)
    ring.abandon()  # the loop was left: neither batch will be taken
    assert conn.recv() is None
    assert conn.recv() < 5.0
    again = conn.recv()
    process.join(10)
    assert [p.slot for p in again] == [0, 1]
    equal(ring.take(again[1]), batch(4))
    ring.close()


def test_a_writer_killed_mid_write_leaves_the_ring_usable_for_the_next() -> None:
    def write(ring: SlotRing, conn: Any) -> None:
        ring.begin()
        conn.send(ring.put(batch(0), wait_s=30.0))
        huge = {"huge": np.ones(ring.slot_bytes // 2, np.uint8)}
        while True:  # killed while it writes
            conn.send("writing")
            ring.put(huge, wait_s=30.0)

    ring = SlotRing(3, 64 << 20)
    process, conn = forked(ring, write)
    sent = conn.recv()
    assert conn.recv() == "writing"
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    assert process.exitcode == -signal.SIGKILL
    equal(ring.take(sent), batch(0))  # what it sent before it died reads back whole
    ring.begin()  # the next writer: every slot free again, none lost to the dead one
    placed = [ring.put(batch(n), wait_s=0.5) for n in range(3)]
    assert [p.slot for p in placed if p is not None] == [0, 1, 2]
    for n, p in enumerate(placed):
        assert p is not None
        equal(ring.take(p), batch(n))
    ring.close()


@pytest.mark.parametrize(("slots", "slot_bytes"), [(0, 4096), (2, 10)])
def test_a_ring_refuses_no_slots_or_a_slot_under_a_cache_line(slots: int, slot_bytes: int) -> None:
    with pytest.raises(ValueError, match="slot"):
        SlotRing(slots, slot_bytes)


def write_three(ring: SlotRing, conn: Any) -> None:
    """A writer in a process started by spawn or forkserver (at a module's top level: that
    process imports it), which got ``ring`` by pickling, as a Process's argument."""
    write_batches(3)(ring, conn)


STARTED = [m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]


@pytest.mark.parametrize("method", STARTED)
def test_a_writer_started_by_spawn_or_forkserver_gets_the_ring_as_it_starts(method: str) -> None:
    """A DataLoader in a Ray worker starts its workers by forkserver (and a caller may name
    spawn): they get the ring with the dataset, pickled as they start, and write into the
    same shared memory this process reads (no copy by the pipe)."""
    context: Any = multiprocessing.get_context(method)
    ring = SlotRing(4, 1 << 20, context=context)
    here, there = context.Pipe()
    process = context.Process(target=write_three, args=(ring, there), daemon=True)
    process.start()
    there.close()
    got = []
    for _ in range(3):
        assert here.poll(120), f"the {method} writer sent nothing in 120 s"
        placed = here.recv()
        assert isinstance(placed, Placed), "it wrote into the ring"
        got.append(ring.take(placed))
    process.join(30)
    assert process.exitcode == 0
    for n, taken in enumerate(got):
        equal(taken, batch(n))
    ring.close()


def test_a_ring_is_sent_only_to_a_process_as_it_starts() -> None:
    """Pickled any other time (to a queue, to a file), a ring would name memory the reader
    cannot find: refused, saying how it travels."""
    ring = SlotRing(2, 4096, context=multiprocessing.get_context(STARTED[0] if STARTED else None))
    with pytest.raises(RuntimeError, match=r"SlotRing.*as it starts"):
        pickle.dumps(ring)
    ring.close()


@pytest.mark.skipif(not SHAREABLE, reason="the ring is an anonymous mapping without memfd_create")
def test_a_ring_dropped_without_close_gives_its_memory_back() -> None:
    """A loader dropped without close(): its rings' memory file is closed with them (an open
    descriptor would keep the file's pages for the life of the process)."""
    ring = SlotRing(2, 1 << 20)
    fd = ring._fd
    assert fd is not None
    assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:ingest-slots")
    del ring
    gc.collect()
    try:
        now = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        now = ""  # closed, and the number not used again
    assert not now.startswith("/memfd:ingest-slots"), "the descriptor was closed"
