"""The coordinator: one named Ray actor per stream, thin around :class:`EpochBook`.

It plans epochs (listing the source once per epoch), serves each rank its share, takes the
ranks' acks and answers snapshots consistent across ranks. It never reads data rows. Calls
run on a few threads so that a snapshot can wait for the acks it needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import ray

from ingest.epochs import EpochBook, RankPlan, StreamSpec
from ingest.errors import StateError
from ingest.ledger import StepRecord
from ingest.state import StreamState


class _Coordinator:
    """See the module docstring. Created by :class:`ingest.RayStream`."""

    def __init__(self, spec: StreamSpec, world_size: int) -> None:
        self._book = EpochBook(spec, world_size)
        self._lock = threading.Condition()
        self._initial: dict[str, Any] | None = None  # what a session without a state starts at
        self._session = 0
        self._joined: set[int] = set()

    def join(self, rank: int, world_size: int, state: dict[str, Any] | None) -> int:
        """A rank of a (new) worker group starts; returns the session its acks must carry.

        The first rank to join a new attempt (a rank that already joined the current
        session, or another world size) starts a new session: the book restarts from
        ``state`` (the checkpoint's), or from the stream's initial state when there is none.
        Acks of older sessions are ignored from then on.
        """
        with self._lock:
            new = rank in self._joined or world_size != self._book.world_size or not self._joined
            if new:
                book = EpochBook(self._book.spec, world_size)
                start = state if state is not None else self._initial
                if start is not None:
                    book.load(StreamState.from_json(start))
                self._book = book
                self._session += 1
                self._joined = set()
                self._lock.notify_all()
            self._joined.add(rank)
            return self._session

    def first_epoch(self) -> int:
        with self._lock:
            return self._book.first_epoch

    def ping(self) -> bool:
        return True

    def world_size(self) -> int:
        return self._book.world_size

    def rank_plan(self, rank: int, epoch: int | None) -> RankPlan:
        with self._lock:
            return self._book.rank_plan(rank, self._book.first_epoch if epoch is None else epoch)

    def ack(self, rank: int, records: Sequence[StepRecord], session: int | None = None) -> None:
        with self._lock:
            if session is not None and session != self._session:
                return  # a rank of a worker group that was replaced
            self._book.ack(rank, records)
            self._lock.notify_all()

    def acked(self) -> list[int]:
        with self._lock:
            return [self._book.ledger.acked(r) for r in range(self._book.world_size)]

    def state_dict(self, step: int | None, timeout_s: float) -> dict[str, Any]:
        """The state after ``step``; None: after the last step every rank acked."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            book = self._book
            if step is None:
                step = min(book.ledger.acked(r) for r in range(book.world_size))
            while not book.ledger.ready(step):
                left = deadline - time.monotonic()
                if left <= 0:
                    lagging = [r for r in range(book.world_size) if book.ledger.acked(r) < step]
                    raise StateError(
                        f"snapshot for step {step} timed out after {timeout_s:.0f} s: rank(s) "
                        f"{lagging} have not acked it (last acked: "
                        f"{[book.ledger.acked(r) for r in lagging]}); every rank must call "
                        "its iterator's state_dict() (or flush()) at that step"
                    )
                self._lock.wait(timeout=min(left, 1.0))
            state = book.snapshot(step).to_json()
            book.fold(step)
            return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            book = EpochBook(self._book.spec, self._book.world_size)
            book.load(StreamState.from_json(state))
            self._book = book
            self._initial = dict(state)


# The actor class; ray.remote on a class is opaque to type checkers, hence Any.
_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 8, "max_restarts": 0}
Coordinator: Any = ray.remote(**_ACTOR_OPTIONS)(_Coordinator)
