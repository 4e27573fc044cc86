"""The coordinator: one named Ray actor per stream, thin around :class:`EpochBook`.

It plans epochs (listing the source once per epoch), serves each rank's feed its share,
takes the ranks' acks and answers snapshots consistent across ranks. It never reads data
rows. Calls run on a few threads so that a snapshot can wait for the acks it needs.

Sessions: a worker group (a Ray Train attempt) and every ``load_state_dict`` start a new
session; feeds and acks of an older session are refused, so a replaced worker group can
neither consume nor ack the new group's rows.

Restarts: the actor is restarted when its process or its node dies (``max_restarts=-1``).
A restarted coordinator has lost the acks it took, so it refuses every call of a session of
its former life with :class:`CoordinatorLostError` (a rank never keeps yielding batches
whose acks cannot be recorded), and its state is the one the next worker group or
``load_state_dict`` brings: under Ray Train, the latest checkpoint's.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from ingest.core.errors import IngestError, StateError, SupersededError
from ingest.core.ledger import Rows, Run, Runs, StepRecord
from ingest.core.provenance import BatchPieces
from ingest.core.quarantine import Quarantined, summary
from ingest.core.share import FeedPlan
from ingest.core.state import Cursor, StreamState
from ingest.distributed.directory import PoolDirectory
from ingest.distributed.index_tasks import ray_indexer
from ingest.distributed.metrics import skipped_on_request
from ingest.distributed.pack_coordinator import PackedRanks
from ingest.engine.rank_node import warn_no_batch
from ingest.engine.spec import StreamSpec
from ingest.planner.catalog import Listing

log = logging.getLogger(__name__)

_SESSION_BITS = 20
"""Sessions of one life of the actor: ``life << _SESSION_BITS`` onwards."""


_LOST = "the stream's coordinator actor died"

_STATES_KEPT = 16
"""The ranks' states kept for the ranks yet to ask (:meth:`_Coordinator.state_dict`)."""


class CoordinatorLostError(IngestError):
    """The stream's coordinator actor died: the acks since then cannot be recorded."""

    def __init__(self, cause: BaseException | str) -> None:
        super().__init__(
            f"{_LOST} ({str(cause).splitlines()[0]}); the "
            "batches consumed since the last state are not recorded, so this rank stops. "
            "Resume from the last state: stream.load_state_dict(last_state) before the ranks "
            "iterate (on this stream if its coordinator restarted, else on a new "
            "ingest.RayStream(...) with the same source and settings); under Ray Train with "
            "FailureConfig(max_failures=N) the run continues from the latest checkpoint "
            "(ingest.train.rank_iterator restores it)"
        )


class StaleSessionError(IngestError):
    """A feed or an ack of a session that a newer worker group or state replaced."""


@dataclass(frozen=True, slots=True)
class Claim:
    """What a rank iterator that starts a loop gets from the coordinator (see
    :meth:`_Coordinator.claim`)."""

    lease: int
    """The iterator's lease of the rank: calls with an older one are refused."""
    step: int
    """The rank's last step with every batch up to it acked."""
    epoch: int
    next_step: int | None
    """The rank's next step, or None: its share from the epoch's start (this run's)."""
    cursor: Cursor | None
    kept: bool
    """The asking iterator holds the rank already and is where the coordinator has it: it
    goes on with the batches it holds."""


class _Coordinator(PoolDirectory):
    """See the module docstring. Created by :class:`ingest.RayStream`; it also holds the pool's
    directory (:mod:`ingest.distributed.directory`)."""

    def __init__(
        self,
        spec: StreamSpec,
        world_size: int,
        placement: dict[str, Any] | None = None,
        listing_wait_s: float = 0.0,
        packs: bool = False,
    ) -> None:
        # Shards to index (new ones, in later epochs) are read by Ray tasks placed like the
        # reader pool, not in this actor's process.
        placement = placement or {}
        indexer = ray_indexer(
            resources=placement.get("resources"), label_selector=placement.get("label_selector")
        )
        self._spec = spec
        self._planner = spec.planner(indexer)
        self._planner.wait = self._wait
        self._book = spec.book(world_size, self._planner, packs=packs)
        self._packs = packs
        """The ranks' nodes agree on their steps (``pack=``: a rank regroups its documents,
        :mod:`ingest.distributed.rank_pack`): the coordinator keeps their part
        (:class:`PackedRanks`), through :meth:`node_start`, :meth:`agree` and
        :meth:`node_state`."""
        self._packed = PackedRanks(world_size)
        self._states: dict[tuple[int, int], tuple[dict[str, Any], set[int]]] = {}
        """The ranks' states by ``(step, the asking rank's epoch)`` until every rank asked
        (:meth:`state_dict`)."""
        self._lock = threading.Condition()
        self._init_directory()
        self._initial: dict[str, Any] | None = None  # what a session without a state starts at
        self._life = secrets.randbits(31)
        self._session = self._life << _SESSION_BITS
        # Restarted after a death: no state until a worker group or load_state_dict brings one.
        with warnings.catch_warnings():
            # Ray 2.60's property reads its own deprecated actor_id: a RayDeprecationWarning
            # in every driver's log, about nothing the driver can change.
            warnings.simplefilter("ignore", DeprecationWarning)
            self._restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self._joined: set[int] = set()
        self._touched = False
        self._leases: dict[int, int] = {}
        self._opened = False
        """Whether the lister's filesystems were made (:meth:`ack`)."""
        self._listing: Listing | None = None
        """The driver's listing of the source as the stream started (:meth:`prepare`): what
        a state loaded or joined before any rank ran is planned from (:meth:`_reset`);
        dropped at the first reset after a rank ran (every later one lists again)."""
        wait = listing_wait_s > 0 and not self._restarted  # a restarted actor gets none
        self._listing_due = time.monotonic() + listing_wait_s if wait else None
        """While the driver lists the source (:meth:`prepare` brings the listing), until
        when a call that plans waits for it instead of listing a second time: the readers'
        first calls (warmed as the stream starts) may come before it."""

    def _await_listing(self) -> None:
        """Wait (the lock free meanwhile) for the driver's listing, if one is coming; past
        the wait, the book lists itself."""
        while self._listing_due is not None:
            left = self._listing_due - time.monotonic()
            if left <= 0:
                self._listing_due = None
                break
            self._lock.wait(timeout=left)

    def session(self) -> int:
        with self._lock:
            return self._session

    def join(
        self,
        rank: int,
        world_size: int,
        state: dict[str, Any] | None,
        initial: dict[str, Any] | None = None,
    ) -> int:
        """A rank of a (new) worker group starts; returns the session its calls must carry.

        The first rank to join a new attempt (a rank that already joined the current
        session, another world size, or a checkpoint's state) starts a new session: the book
        restarts from ``state`` (the checkpoint's), or from the stream's initial state
        (``initial``, the state the driver loaded, which a restarted actor has lost).
        """
        with self._lock:
            self._await_listing()  # a state joined now is planned from the driver's listing
            if self._initial is None and initial is not None:
                self._initial = dict(initial)
            fresh = not self._joined and state is None and not self._touched
            fresh = fresh and not self._restarted
            new = rank in self._joined or world_size != self._book.world_size
            if new or (not self._joined and not fresh):
                start = state if state is not None else self._initial
                self._reset(world_size, start, relist=self._used())
            self._joined.add(rank)
            return self._session

    def _wait(self, seconds: float) -> None:
        """A followed round's wait for new shards: the lock is free meanwhile (acks go on)."""
        self._lock.wait(timeout=seconds)

    def _used(self) -> bool:
        """Whether a rank joined or acked in this life, or this actor restarted: a state
        loaded or joined now lists the source again, not planned from the listing made as
        the stream started (:meth:`_reset`)."""
        return self._touched or self._restarted or bool(self._joined)

    def _reset(
        self, world_size: int, state: Mapping[str, Any] | None, *, relist: bool = True
    ) -> None:
        """A new book for ``world_size`` ranks from ``state``. ``relist`` False: a state
        loaded on the driver or brought by the first worker group (``join``, ``ingest.train``
        from a checkpoint) before any rank ran is planned from the listing the driver made as
        the stream started (:attr:`_listing`; none: listed here). A second listing sent
        every shard's ``HEAD`` again (a ``LIST`` on a store), from a filesystem this actor
        made cold under its lock, while every rank's join waited: a joined resume's first
        batch came 1.2-1.6 s after a loaded one's (``test_resume_seek``)."""
        if relist:  # a rank ran since the stream started: its start listing is old now
            self._listing = None
        listing = self._listing
        book = self._spec.book(world_size, self._planner, packs=self._packs)
        start = None if state is None else StreamState.from_json(state)
        if start is not None:
            book.load(start, listing, listed_here=True)
        self._book = book
        self._packed = PackedRanks(world_size, start)
        self._states = {}
        self._session += 1
        self._joined = set()
        self._touched = False
        self._leases = {}
        self._restarted = False
        self._lock.notify_all()

    def _check(self, session: int) -> None:
        if session >> _SESSION_BITS != self._life:
            raise CoordinatorLostError(
                f"it restarted and lost the acks of session {session}, which this rank or "
                "reader belongs to"
            )
        if session != self._session:
            raise StaleSessionError(
                f"session {session} was replaced by session {self._session} (a new worker "
                "group or a loaded state); this rank's iterator is stale: get a new one"
            )

    def first_epoch(self) -> int:
        with self._lock:
            return self._book.first_epoch

    def upcoming_epoch(self, rank: int) -> int:
        """The epoch a new iterator of ``rank`` starts with (see EpochBook.upcoming_epoch)."""
        with self._lock:
            self._await_listing()
            return self._book.upcoming_epoch(rank)

    def claim(
        self, rank: int, session: int, lease: int, step: int, epoch: int | None = None
    ) -> Claim:
        """An iterator of ``rank`` starts a loop: where the rank is, and its lease.

        Args:
            rank: The rank.
            session: The iterator's session.
            lease: The lease the iterator holds (0: none yet, a new or copied iterator).
            step: The iterator's last step, with every batch up to it acked.
            epoch: The epoch of the iterator's loop (None: none yet).

        The iterator that holds the rank's newest lease and is at the rank's last acked step
        keeps its lease and its batches. Any other (a second iterator of the rank, a copy
        sent to another task) gets a new lease and the rank's position: its reader's feed is
        moved there (:meth:`ingest.distributed.pool._Reader.adopt`), so the batches an older
        iterator fetched and never handed out are read again, and the older one's calls are
        refused (:class:`SupersededError`). An iterator that keeps the rank stays in its own
        epoch: having acked every step of it, it has yet to take the epoch's end.
        """
        with self._lock:
            self._await_listing()
            self._check(session)
            book = self._book
            upcoming, next_step, cursor = book.position(rank)
            acked = book.ledger.acked(rank)
            current = self._leases.get(rank, 0)
            if lease and lease == current and step == acked and epoch is not None:
                return Claim(current, acked, epoch, None, None, kept=True)
            self._leases[rank] = current + 1
            return Claim(current + 1, acked, upcoming, next_step, cursor, kept=False)

    def _check_lease(self, rank: int, lease: int | None) -> None:
        if lease is not None and lease < self._leases.get(rank, 0):
            raise SupersededError.of_rank(rank)

    def ping(self) -> bool:
        return True

    def world_size(self) -> int:
        return self._book.world_size

    def prepare(self, listing: Listing | None = None, *, plan: bool = True) -> None:
        """Plan the first epoch now so that the first batch comes sooner.

        Args:
            listing: The source's listing, made by the driver while this actor started
                (None: list here).
            plan: False: only stop waiting for the driver's listing (a followed source with
                no shard yet: the first round waits for one when a rank asks).
        """
        with self._lock:
            self._listing_due = None
            self._lock.notify_all()
            if listing is not None:
                self._listing = listing
                self._book.adopt(listing)
            if plan:
                self._book.plan(self._book.first_epoch)

    def rank_plan(self, rank: int, epoch: int | None, session: int) -> FeedPlan[Listing]:
        with self._lock:
            self._await_listing()
            self._check(session)
            epoch = self._book.first_epoch if epoch is None else epoch
            self._check_closed(epoch)
            return self._book.rank_plan(rank, epoch)

    def rank_resume(
        self, rank: int, epoch: int, next_step: int, cursor: Cursor | None, session: int
    ) -> FeedPlan[Listing]:
        with self._lock:
            self._await_listing()
            self._check(session)
            self._check_closed(epoch)
            return self._book.rank_resume(rank, epoch, next_step, cursor)

    def close_epoch(
        self,
        epoch: int,
        steps: int,
        leftover: Runs | Sequence[Run],
        learned: Mapping[int, int],
        session: int,
        quarantined: Sequence[Quarantined],
        rank: int,
        records: Sequence[StepRecord] = (),
        carry: Rows | None = None,
        cut: Sequence[tuple[int, int]] = (),
    ) -> None:
        """``rank``'s loop reached the end of ``epoch`` (its feed's :class:`End`).

        A packing rank (:mod:`ingest.distributed.rank_pack`) also brings, in this one call
        (no state may fall between them), the acks of its read steps not acked yet with their
        documents done only (``records``), the documents it did not hand out (``carry``),
        which the epoch's remainder takes, and the offsets of those cut (``cut``).
        """
        with self._lock:
            self._check(session)
            book = self._book
            if records:
                book.ack(rank, records)
            book.finish(rank, epoch, steps, leftover, learned, quarantined)
            if not steps and not rank and not self._packs:  # shown in the driver's log
                warn_no_batch(book, epoch, learned)
            if carry is not None:
                book.carry_over(epoch, carry)
            if self._packs:
                self._packed.closed(book, rank, epoch, cut)
            book.fold_due()
            self._lock.notify_all()

    # -- a rank's node: ranks that agree on their steps (ingest.distributed.rank_link) --------

    def _check_closed(self, epoch: int) -> None:
        """A packing stream plans an epoch only once every rank closed the one before (their
        documents not handed out join its remainder)."""
        if self._packs and self._packed.waits(self._book, epoch):
            raise IngestError(
                f"epoch {epoch} was asked for before every rank closed epoch {epoch - 1}; a "
                "packing rank starts an epoch only after node_start answers"
            )

    def node_start(
        self, rank: int, session: int
    ) -> tuple[int, dict[int, int], bool, int | None, bool] | None:
        """Where a rank's node starts its next loop: its epoch, the node's part it starts
        with (for packing, the documents cut before: packed row -> offset), whether the
        rank made batches of it already, the step of its first batch, and whether its
        batches go to the provenance log; None while another rank has not closed the epoch
        before (ask again)."""
        with self._lock:
            self._await_listing()
            self._check(session)
            self._check_node()
            book = self._book
            epoch = book.upcoming_epoch(rank)
            prev = epoch - 1
            if self._packed.waits(book, epoch):
                if not book.acks.reached_end(rank, prev):
                    raise IngestError(
                        f"rank {rank} left epoch {prev} after its last batch and before its "
                        "end, and a new iterator took the rank over: a packing rank's epoch "
                        "ends in the iterator that packed it. Loop over the same iterator "
                        "again, or resume from the last state"
                    )
                return None
            packed = self._packed
            logs = book.log is not None
            first = packed.saved_first_step(epoch)
            return epoch, packed.offsets(book, epoch), packed.busy(rank, epoch), first, logs

    def agree(
        self, rank: int, epoch: int, session: int, count: int, ended: bool
    ) -> tuple[int, int | None]:
        """A rank made ``count`` batches of ``epoch`` (``ended``: its feed ended); the fewest
        any rank made and the epoch's count once known (see
        :meth:`ingest.distributed.pack_coordinator.PackedRanks.made`)."""
        with self._lock:
            self._check(session)
            self._check_node()
            return self._packed.made(rank, epoch, count, ended)

    def node_state(
        self,
        rank: int,
        session: int,
        epoch: int,
        part: Sequence[tuple[int, int]],
        step: int | None = None,
        timeout_s: float = 0.0,
        handed: int = 0,
    ) -> dict[str, Any] | None:
        """A rank's node's part of the state in ``epoch`` (for packing, its documents in
        flight); with no ``step``, as its loop leaves (for the driver's state: ``handed``,
        its batches of ``epoch``). With a ``step``: the state after the rank's batch
        ``step`` of ``epoch`` (its ``step`` batches handed out; -1: between epochs), once
        every rank sent its part there (each flushed its acks first)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._check(session)
            self._check_node()
            packed = self._packed
            packed.entries(rank, epoch, part, handed)
            if step is None:
                return None
            key = (epoch, step)
            asked = packed.asked.setdefault(key, set())
            asked.add(rank)
            self._lock.notify_all()
            while key not in packed.states and len(asked) < self._book.world_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    lagging = sorted(set(range(self._book.world_size)) - asked)
                    raise StateError(
                        f"snapshot after batch {step} of epoch {epoch} timed out after "
                        f"{timeout_s:.0f} s: rank(s) {lagging} have not asked for it; every "
                        "rank must call its iterator's state_dict() at the same batch"
                    )
                self._lock.wait(timeout=min(left, 1.0))
            if key not in packed.states:
                packed.states[key] = packed.state(self._book, max(step, 0)).to_json()
                for old in sorted(packed.states)[:-4]:  # the ranks asked for those already
                    del packed.states[old]
            return packed.states[key]

    def _check_node(self) -> None:
        if not self._packs:  # pragma: no cover - a plain rank's driver never calls these
            raise IngestError(
                "a node call came to the coordinator of a stream whose ranks have no node "
                "that agrees on steps (no pack=): the rank iterator and the stream disagree"
            )

    def quarantined(self) -> list[Quarantined]:
        """What ``on_error="skip"`` skipped, oldest first (see :mod:`ingest.core.quarantine`)."""
        with self._lock:
            return self._book.quarantined()

    def ack(
        self,
        rank: int,
        records: Sequence[StepRecord],
        session: int,
        cursor: Cursor | None = None,
        lease: int | None = None,
        pieces: Sequence[BatchPieces] = (),
        *,
        again: bool = False,
    ) -> None:
        """Record a rank's steps; ``again``: a resend (see :meth:`EpochBook.ack`);
        ``pieces``: a packing rank's batches for the provenance log.

        Raises:
            SupersededError: If another iterator took the rank over (``lease`` is older): the
                batches acked here were read again for the new one.
        """
        with self._lock:
            self._check(session)  # never dropped: a restarted actor or a replaced group
            self._check_lease(rank, lease)
            book = self._book
            book.ack(rank, records, cursor, again=again, pieces=pieces)
            self._touched = True
            book.fold_due()  # on a window's edge where there is one: no sort
            self._lock.notify_all()
            if not self._opened:
                # This actor lists the next epoch and any state joined or loaded from now
                # on: it makes its filesystems in the background once a step is acked, not
                # cold under its lock in that listing, and not as its process starts
                # beside the readers' (the driver listed the first epoch).
                self._opened = True
                opener = self._planner.source.open_filesystems
                threading.Thread(target=opener, daemon=True).start()

    def flush_log(self) -> None:
        """Write what the provenance log holds and wait for it (the stream stops: the steps
        the ranks acked since the last state are in the log too)."""
        with self._lock:
            log = self._book.log
        if log is not None:
            log.flush()

    def acked(self) -> list[int]:
        with self._lock:
            return [self._book.ledger.acked(r) for r in range(self._book.world_size)]

    def state_dict(
        self,
        step: int | None,
        timeout_s: float,
        session: int | None = None,
        rank: int | None = None,
    ) -> dict[str, Any]:
        """The state after ``step``; None: after the last step every rank acked.

        ``session``, ``rank``: the asking rank's (None: the driver's call). Every rank asks
        at the same step, each at its own moment, and gets the same state: the first to ask
        makes it (:meth:`EpochBook.snapshot` of the epochs with no step that rank reached the
        end of) and the others at that step and that point of their loop get it as made
        (their own calls came later: a rank already past the step has no position there
        any more). It is kept until every rank asked for it.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if session is not None:
                self._check(session)
            elif self._restarted:
                raise CoordinatorLostError(
                    "it restarted and lost what the ranks consumed; its state is unknown "
                    "until a state is loaded"
                )
            book = self._book
            if self._packs:  # after the ranks' loops left (see node_state)
                return self._packed.state(book).to_json()
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
            if rank is not None:
                return self._rank_state(step, rank)
            state = book.snapshot(step).to_json()
            book.fold(step)
            return state

    def _rank_state(self, step: int, rank: int) -> dict[str, Any]:
        """The state after ``step`` that ``rank`` asked for (see :meth:`state_dict`)."""
        book = self._book
        key = (step, book.upcoming_epoch(rank))
        made, asked = self._states.get(key) or (None, set())
        if made is None:
            made = book.snapshot(step, rank).to_json()
            book.fold(step)
            for old in list(self._states)[: max(0, len(self._states) - _STATES_KEPT + 1)]:
                del self._states[old]  # asked for by some ranks only (a driver saves)
        asked.add(rank)
        if len(asked) < book.world_size:
            self._states[key] = (made, asked)
        else:
            self._states.pop(key, None)
        return made

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restart from ``state`` in a new session; returns the session."""
        with self._lock:
            self._await_listing()
            self._reset(self._book.world_size, state, relist=self._used())
            self._initial = dict(state)
            skipped = summary(self._book.quarantined())["rows_skipped_on_request"]
            name = ray.get_runtime_context().get_actor_name() or "ingest"
            skipped_on_request(name, skipped)
            return self._session


# The actor class; ray.remote on a class is opaque to type checkers, hence Any.
# Restarted when its process or node dies; calls are never retried on the new life (it
# refuses the old sessions' calls, see the module docstring).
_ACTOR_OPTIONS: dict[str, Any] = {
    "num_cpus": 0,
    "max_concurrency": 16,
    "max_restarts": -1,
    "max_task_retries": 0,
}
Coordinator: Any = ray.remote(**_ACTOR_OPTIONS)(_Coordinator)

__all__ = ["Claim", "Coordinator", "CoordinatorLostError"]
