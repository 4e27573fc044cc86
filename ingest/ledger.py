"""The ack ledger: what each rank consumed, step by step. Pure.

Ranks report the rows of each batch they handed to the training loop, tagged with the
global step of that batch, a few batches per message. A snapshot for step S holds exactly
the rows of steps <= S of every rank, whatever ranks consumed beyond S, so a checkpoint
saved at step S resumes at step S + 1 on every rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

Run = tuple[int, int, int, int]
"""``(segment, shard, start, stop)``: rows of a shard consumed by one batch; segments are
:data:`ingest.assign.CARRY` and :data:`ingest.assign.MAIN`."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    runs: tuple[Run, ...]


class Ledger:
    """Per-rank step records since the last fold.

    Args:
        world_size: Number of ranks that ack.
        first_step: The step the ranks start at; steps before it are already folded.
    """

    def __init__(self, world_size: int, first_step: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        self.world_size = world_size
        self._records: list[dict[int, tuple[Run, ...]]] = [{} for _ in range(world_size)]
        self._acked = [first_step - 1] * world_size

    def ack(self, rank: int, records: Iterable[StepRecord]) -> None:
        """Record steps of ``rank``; each step once, in order.

        Raises:
            ValueError: On an unknown rank, or a step out of order (a bug or a replay).
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size {self.world_size}")
        for record in records:
            if record.step != self._acked[rank] + 1:
                raise ValueError(
                    f"rank {rank} acked step {record.step} after "
                    f"{self._acked[rank]}; steps are acked once, in order"
                )
            self._records[rank][record.step] = record.runs
            self._acked[rank] = record.step

    def acked(self, rank: int) -> int:
        """The last step ``rank`` acked (``first_step - 1`` before any)."""
        return self._acked[rank]

    def ready(self, step: int) -> bool:
        """Whether every rank acked ``step``."""
        return min(self._acked) >= step

    def runs(self, first: int, last: int) -> list[Run]:
        """Rows of steps ``first..last`` of every rank that are not folded yet."""
        return [
            run
            for per_rank in self._records
            for s, runs in per_rank.items()
            if first <= s <= last
            for run in runs
        ]

    def fold(self, step: int) -> None:
        """Forget steps ``<= step``: the caller has kept what it needs of them."""
        for per_rank in self._records:
            for s in [s for s in per_rank if s <= step]:
                del per_rank[s]
