"""What DataLoader workers send (ingest.integrations.worker_items), without workers: their
batches bundled a few to a torch item, and handed out in the order torch hands out one batch
an item (issue 32: torch's per-item cost in the main process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.core.errors import IngestError
from ingest.integrations.shared_slots import SlotRing
from ingest.integrations.worker_items import (
    BUNDLE_BATCHES,
    BUNDLE_BYTES,
    KEY,
    RUNS,
    Bundle,
    Bundler,
    Came,
    Ended,
    Failed,
    in_turn,
)

NO_ROWS = np.zeros(0, np.int64)


def batch(rank: int, step: int, ring: SlotRing | None = None) -> dict[str, Any]:
    """A worker's batch as ``sent`` makes it: its ids (``[step]``) and runs in ``ring``, or
    by the pipe (no ring)."""
    ids = np.array([step], np.int64)
    placed = ring.put({RUNS: NO_ROWS, "id": ids}, wait_s=1.0) if ring is not None else None
    came = Came(rank, step, NO_ROWS, -1, {}, (), placed=placed)
    return {"id": None if placed is not None else ids, KEY: came}


def rings(workers: int) -> list[SlotRing]:
    out = [SlotRing(16, 4096) for _ in range(workers)]
    for ring in out:
        ring.begin()
    return out


def end(rank: int) -> dict[str, Any]:
    return {KEY: Ended(rank, 0, np.zeros((0, 4), np.int64), {}, ())}


def what(item: dict[str, Any]) -> tuple[str, int, int]:
    got = item[KEY]
    if isinstance(got, Ended):
        return ("end", got.rank, -1)
    assert item["id"] is None or int(item["id"][0]) == got.step  # taken out of its ring
    return ("batch", got.rank, got.step)


def bundled(rank: int, items: list[dict[str, Any]], nbytes: int = 10) -> list[dict[str, Any]]:
    """What a worker sends of ``items`` (its batches, then its end)."""
    bundler, out = Bundler(rank), []
    for item in items:
        if isinstance(item[KEY], Ended):
            out += bundler.flush()
            out.append(item)
        else:
            out += bundler.add(item, nbytes)
    return out + bundler.flush()


def no_ring(rank: int) -> SlotRing:
    raise AssertionError(f"worker {rank} sent every batch by the pipe")


def torch_order(per_worker: list[list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """The items in the order torch's iterator hands them out: tasks go to the workers in
    turn; a worker with nothing left answers its task with its end of iteration and leaves
    the turn (tasks it was given ahead answer nothing, and are passed over)."""
    left = [list(items) for items in per_worker]
    turn = list(range(len(left)))
    at = 0
    while turn:
        worker = turn[at]
        if not left[worker]:
            del turn[at]
            at = at % len(turn) if turn else 0
            continue
        yield left[worker].pop(0)
        at = (at + 1) % len(turn)


def test_an_epochs_first_batch_goes_alone_then_a_few_to_an_item() -> None:
    (ring,) = rings(1)
    sent = bundled(0, [batch(0, s, ring) for s in range(10)] + [end(0)])
    sizes = [len(i[KEY].batches) if isinstance(i[KEY], Bundle) else 1 for i in sent]
    assert sizes == [1, BUNDLE_BATCHES, BUNDLE_BATCHES, 1, 1]  # 1 + 4 + 4 + the rest, the end
    assert isinstance(sent[-1][KEY], Ended)
    flat = [b for i in sent for b in (i[KEY].batches if isinstance(i[KEY], Bundle) else [i])]
    assert [what(b)[2] for b in flat[:-1]] == list(range(10))


def test_a_batch_of_a_mebibyte_closes_its_bundle_and_one_not_in_the_ring_goes_after_it() -> None:
    bundler, (ring,) = Bundler(0), rings(1)
    assert len(bundler.add(batch(0, 0, ring), 10)) == 1  # the first: alone
    assert bundler.add(batch(0, 1, ring), 10) == []
    (big,) = bundler.add(batch(0, 2, ring), BUNDLE_BYTES)
    assert [what(b)[2] for b in big[KEY].batches] == [1, 2]
    assert bundler.add(batch(0, 3, ring), 10) == []
    piped = batch(0, 4)  # by the pipe (ring full): never held back
    out = bundler.add(piped, 10)
    assert [what(i)[2] for i in out] == [3, 4] and out[1] is piped
    assert bundler.flush() == []


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 14), min_size=1, max_size=4),
    piped=st.sets(st.integers(0, 14), max_size=4),
    nbytes=st.sampled_from([10, BUNDLE_BYTES // 3, BUNDLE_BYTES]),
)
def test_bundled_batches_come_out_in_the_order_torch_hands_out_single_ones(
    counts: list[int], piped: set[int], nbytes: int
) -> None:
    """Any number of workers, any number of batches each (an uneven last step too), some sent
    by the pipe: the batches and ends come out of ``in_turn`` as they come from torch when
    each batch is an item of its own."""
    single = [[batch(w, s) for s in range(n)] + [end(w)] for w, n in enumerate(counts)]
    want = [what(i) for i in torch_order(single)]
    placed = rings(len(counts))
    per_worker = [
        [batch(w, s, None if s in piped else placed[w]) for s in range(n)] + [end(w)]
        for w, n in enumerate(counts)
    ]
    items = torch_order([bundled(w, items, nbytes) for w, items in enumerate(per_worker)])
    got = [what(i) for i in in_turn(items, len(counts), placed.__getitem__)]
    assert got == want
    for ring in placed:  # every slot taken, so free again
        assert not (ring._states == 1).any()
        ring.close()


def test_a_failure_comes_at_once() -> None:
    failed = {KEY: Failed(IngestError("s3://b/x.parquet: broken"))}
    items = iter([batch(0, 0), batch(1, 0), failed, batch(0, 1)])  # by the pipe
    out = list(in_turn(items, 2, no_ring))
    assert [what(i) for i in out[:2]] == [("batch", 0, 0), ("batch", 1, 0)]
    assert out[2] is failed and len(out) == 3


def test_batches_of_a_worker_after_its_end_are_an_error_not_lost() -> None:
    items = iter([end(0), batch(1, 0), batch(0, 5), end(1)])
    with pytest.raises(IngestError, match="1 batches of workers that had ended"):
        list(in_turn(items, 2, no_ring))
