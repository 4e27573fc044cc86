"""The ranks' acks as a book keeps them, without Ray or I/O: the steps each rank acked with
their rows (:class:`ingest.core.ledger.Ledger`), each rank's position after its last acked
step, the quarantines the acks brought, the rows missing from steps that held quarantined
rows, and the last epoch whose end each rank's loop reached.

A book (:class:`ingest.core.book.EpochBook`) has one :class:`Acks` from its start or its
last loaded state on, and turns them into states (:meth:`ingest.core.book.EpochBook.snapshot`)
and folds them into its epochs' progress (:meth:`ingest.core.book.EpochBook.fold`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ingest.core.errors import ConfigError
from ingest.core.ledger import Ledger, StepRecord
from ingest.core.quarantine import Quarantined, check_bound, merge
from ingest.core.state import Cursor


class Acks:
    """What ``world_size`` ranks acked from ``first_step`` on.

    Args:
        world_size: Number of ranks.
        first_step: The first step the ranks ack (a loaded state's next step).
        batch_size: Rows per batch on every rank.
        max_errors: Most quarantines per rank and epoch (``ReadOptions.max_errors``).
        quarantined: Quarantines a loaded state recorded.
    """

    def __init__(
        self,
        world_size: int,
        first_step: int,
        *,
        batch_size: int,
        max_errors: int,
        quarantined: Iterable[Quarantined] = (),
    ) -> None:
        self.world_size = world_size
        self.batch_size = batch_size
        self.max_errors = max_errors
        self.ledger = Ledger(world_size, first_step)
        self.folded = first_step - 1
        """The last step folded (:meth:`forget`)."""
        self._cursors: dict[int, tuple[int, Cursor]] = {}
        self._quarantined: list[tuple[int, Quarantined]] = [(-1, q) for q in quarantined]
        """``(step acked with, record)``; step -1: from the loaded state or an epoch's end."""
        self._short: dict[int, int] = {}
        """Rows missing from the batches of each step that held quarantined rows."""
        self._ended: dict[int, int] = {}
        """The last epoch whose end each rank's loop reached (:meth:`end`)."""

    def ack(
        self,
        rank: int,
        records: Sequence[StepRecord],
        cursor: Cursor | None = None,
        *,
        again: bool = False,
    ) -> Sequence[StepRecord]:
        """See :meth:`ingest.core.book.EpochBook.ack`; returns the records recorded (a
        resend's steps recorded already left out)."""
        if again:
            records = [r for r in records if not self.ledger.has(rank, r.step)]
        self.ledger.ack(rank, records)
        if cursor is not None and records:
            self._cursors[rank] = (max(r.step for r in records), cursor)
        for r in records:
            if r.rows >= 0:
                self._short[r.step] = self._short.get(r.step, 0) + self.batch_size - r.rows
            if r.quarantined:
                self.note_quarantined(r.quarantined, r.step)
        return records

    def cursor(self, rank: int) -> tuple[int, Cursor] | None:
        """``(step, cursor)``: ``rank``'s position after the last step it acked with one."""
        return self._cursors.get(rank)

    def cursor_at(self, rank: int, step: int) -> Cursor | None:
        """``rank``'s position after ``step``, if its last ack with a position was ``step``."""
        got = self._cursors.get(rank)
        return got[1] if got is not None and got[0] == step else None

    def note_quarantined(self, records: Iterable[Quarantined], step: int = -1) -> None:
        """See :meth:`ingest.core.book.EpochBook.note_quarantined`."""
        known = [q for _, q in self._quarantined]
        added = merge(known, records)[len(known) :]
        for q in added:
            self._quarantined.append((step, q))
        for epoch, rank in {(q.epoch, q.rank) for q in added}:
            mine = [r for _, r in self._quarantined if (r.epoch, r.rank) == (epoch, rank)]
            check_bound(mine, self.max_errors)

    def quarantined(self) -> list[Quarantined]:
        """Every quarantine kept, oldest first."""
        return [q for _, q in sorted(self._quarantined, key=lambda sq: sq[1].epoch)]

    def quarantined_in(self, epoch: int, step: int) -> list[Quarantined]:
        """The quarantines of ``epoch`` acked with a step up to ``step`` (or with none)."""
        return [q for s, q in self._quarantined if q.epoch == epoch and s <= step]

    def missing(self, first: int, last: int) -> int:
        """Rows the quarantines took out of the batches of steps ``first..last``."""
        return sum(n for step, n in self._short.items() if first <= step <= last)

    def end(self, rank: int, epoch: int) -> None:
        """``rank``'s loop reached the end of ``epoch``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} is outside world_size {self.world_size}")
        self._ended[rank] = max(self._ended.get(rank, -1), epoch)

    def reached_end(self, rank: int, epoch: int) -> bool:
        """Whether ``rank``'s loop reached the end of ``epoch`` (or of a later one)."""
        return epoch <= self._ended.get(rank, -1)

    def all_ended(self, epoch: int) -> bool:
        """Whether every rank's loop reached the end of ``epoch``."""
        return all(self.reached_end(r, epoch) for r in range(self.world_size))

    def forget(self, step: int) -> None:
        """Forget the acks of steps ``<= step``, folded into the epochs' progress."""
        self.ledger.fold(step)
        self.folded = max(self.folded, step)
        for s in [s for s in self._short if s <= step]:
            del self._short[s]


__all__ = ["Acks"]
