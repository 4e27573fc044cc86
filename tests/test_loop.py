"""The rank loop shared by Stream, the DataLoader and the Ray rank (ingest/engine/loop.py),
with a fake link and fake items: no book, no Ray, no torch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from ingest.core.ledger import Closed, Rows, Run, Runs, StepRecord
from ingest.core.provenance import BatchPieces
from ingest.core.quarantine import Quarantined
from ingest.core.state import Cursor
from ingest.engine.loop import Ending, RankLoop


@dataclass(frozen=True)
class Batch:
    step: int
    runs: Runs | Rows
    cursor: Cursor
    rows: int = -1
    quarantined: tuple[Quarantined, ...] = ()
    closed: Closed | None = None


@dataclass(frozen=True)
class End:
    steps: int
    leftover: Sequence[Run] = ()
    learned: dict[int, int] = field(default_factory=dict)
    quarantined: tuple[Quarantined, ...] = ()


@dataclass
class Link:
    """Every message the loop of ``rank`` sends, in order: ("ack", steps, cursor) or
    ("end", epoch, steps)."""

    rank: int = 3
    sent: list[tuple[object, ...]] = field(default_factory=list)

    def ack(
        self,
        rank: int,
        records: list[StepRecord],
        cursor: Cursor | None,
        pieces: Sequence[BatchPieces] = (),
    ) -> None:
        assert rank == self.rank
        self.sent.append(("ack", [r.step for r in records], cursor))
        if pieces:
            self.sent.append(("pieces", [p[0] for p in pieces]))

    def end(self, rank: int, epoch: int, ending: Ending) -> None:
        assert rank == self.rank
        self.sent.append(("end", epoch, ending.steps))

    def acked(self) -> list[int]:
        return [s for m in self.sent if m[0] == "ack" for s in m[1]]  # type: ignore[attr-defined]


def cursor(step: int) -> Cursor:
    return {"lane": step}  # type: ignore[return-value]


def batch(step: int, rows: int = -1, quarantined: tuple[Quarantined, ...] = ()) -> Batch:
    return Batch(step, np.array([step], dtype=np.int64), cursor(step), rows, quarantined)


def items(steps: range, *, end: int | None = None) -> Iterator[Batch | End]:
    yield from (batch(s) for s in steps)
    if end is not None:
        yield End(end)


def to_batch(item: Batch) -> str:
    return f"batch {item.step}"


def test_acks_go_every_few_batches_and_all_before_the_end_which_is_sent_once() -> None:
    link = Link()
    loop = RankLoop(3, link, ack_every=4)
    got, acks_sent = [], []
    for _, out in loop.batches(7, items(range(10), end=10), to_batch, End):
        got.append(out)
        acks_sent.append(len(link.sent))
    assert got == [f"batch {s}" for s in range(10)]
    # The acks leave as the 4th and the 8th batches are handed out, not before.
    assert acks_sent == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert link.sent == [
        ("ack", [0, 1, 2, 3], cursor(3)),
        ("ack", [4, 5, 6, 7], cursor(7)),
        ("ack", [8, 9], cursor(9)),
        ("end", 7, 10),
    ]
    assert (loop.step, loop.cursor) == (9, None)


def test_nothing_after_the_ending_is_taken() -> None:
    link = Link()
    loop = RankLoop(3, link, ack_every=4)

    def then_more() -> Iterator[Batch | End]:
        yield from items(range(2), end=2)
        raise AssertionError("an item after the ending was taken")

    assert [out for _, out in loop.batches(0, then_more(), to_batch, End)] == [
        "batch 0",
        "batch 1",
    ]
    assert link.sent == [("ack", [0, 1], cursor(1)), ("end", 0, 2)]


def test_a_batch_that_fails_to_convert_is_not_acked_and_is_read_again() -> None:
    link = Link()
    loop = RankLoop(3, link, ack_every=2)
    failed: set[int] = set()

    def convert_failing_once_at_3(item: Batch) -> str:
        if item.step == 3 and not failed:
            failed.add(item.step)
            raise ValueError("conversion failed")
        return to_batch(item)

    got = []
    with pytest.raises(ValueError, match="conversion failed"):
        for _, out in loop.batches(0, items(range(6), end=6), convert_failing_once_at_3, End):
            got.append(out)
    loop.flush()  # as a state or a rewind would
    assert link.sent == [("ack", [0, 1], cursor(1)), ("ack", [2], cursor(2))]
    assert loop.step == 2
    # The next loop reads again from the step after the last handed out.
    again = items(range(loop.step + 1, 6), end=6)
    got += [out for _, out in loop.batches(0, again, convert_failing_once_at_3, End)]
    assert got == [f"batch {s}" for s in range(6)]
    assert link.acked() == list(range(6))
    assert link.sent[-1] == ("end", 0, 6)


def quarantine(step: int) -> Quarantined:
    return Quarantined("bad rows", 0, 3, step=step, rows=4)


def empty_at_2() -> Iterator[Batch | End]:
    yield batch(0)
    yield batch(1, rows=2, quarantined=(quarantine(1),))
    yield batch(2, rows=0, quarantined=(quarantine(2),))
    yield batch(3)
    yield End(4, quarantined=(quarantine(9),))


def test_a_batch_of_no_rows_is_acked_but_not_handed_out() -> None:
    link = Link()
    told: list[list[int | None]] = []
    loop = RankLoop(
        3, link, ack_every=16, on_quarantined=lambda qs: told.append([q.step for q in qs])
    )
    got = [(item.step, item.rows) for item, _ in loop.batches(0, empty_at_2(), to_batch, End)]
    assert got == [(0, -1), (1, 2), (3, -1)]
    assert link.sent == [("ack", [0, 1, 2, 3], cursor(3)), ("end", 0, 4)]
    assert told == [[1], [2], [9]]


def test_a_rank_that_keeps_equal_steps_hands_out_a_batch_of_no_rows() -> None:
    link = Link()
    loop = RankLoop(3, link, ack_every=16, keep_empty=True)
    got = [item.step for item, _ in loop.batches(0, empty_at_2(), to_batch, End)]
    assert got == [0, 1, 2, 3]
    assert link.sent == [("ack", [0, 1, 2, 3], cursor(3)), ("end", 0, 4)]


def test_hand_out_and_end_serve_items_of_several_ranks_interleaved() -> None:
    """The DataLoader's main process: one loop per worker, items in any order."""
    links = {r: Link(rank=r) for r in (0, 1)}
    loops = {r: RankLoop(r, links[r], ack_every=2) for r in (0, 1)}
    order: list[tuple[int, Batch | End]] = [
        (0, batch(0)),
        (1, batch(0)),
        (1, batch(1)),
        (0, batch(1, rows=0)),
        (1, End(2)),
    ]
    got = []
    for rank, item in order:
        if isinstance(item, End):
            loops[rank].end(5, item)
        else:
            out = loops[rank].hand_out(item, to_batch)
            if out is not None:
                got.append((rank, out))
    assert got == [(0, "batch 0"), (1, "batch 0"), (1, "batch 1")]
    assert links[0].sent == [("ack", [0, 1], cursor(1))]
    assert links[1].sent == [("ack", [0, 1], cursor(1)), ("end", 5, 2)]


def test_a_packing_ranks_batches_go_to_the_book_with_the_next_message() -> None:
    """A packing rank's batches (for the provenance log) are held as records are: sent with
    the next message, or once ``ack_every`` are held, and before a state (flush)."""
    link = Link()
    loop = RankLoop(3, link, ack_every=2)
    piece = np.zeros((1, 5), dtype=np.int64)
    loop.log_batch((7, 0, piece))
    assert link.sent == []
    loop.log_batch((8, 0, piece))
    assert link.sent == [("ack", [], None), ("pieces", [7, 8])]
    loop.log_batch((9, 1, piece))
    loop.flush()
    assert link.sent[-1] == ("pieces", [9])
    loop.log_batch((10, 1, piece))
    loop.restart(4)  # a state loaded: what was held is of the position left behind
    loop.flush()
    assert link.sent[-1] == ("pieces", [9])
