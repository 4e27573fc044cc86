"""The coordinator's record of its reader pool: which reader hosts each rank's feed, and
what the ranks waited.

The driver's sizer (:mod:`ingest.distributed.sizer`) sets the pool's readers here whenever
the pool changes; a rank asks which reader hosts its feed each time it adopts one (a new
loop, or a feed that moved or died: :meth:`ingest.distributed.rank.RankIterator._adopt`).
Rank ``r``'s feed lives on reader ``r % len(readers)``. The ranks report here what they
waited, as they report it to the metrics; the sizer takes the sums every interval.

Placement is a hint, never a condition of exactness: a rank served by another reader than
its home (it adopted there just before a resize) is served exactly, and is moved at the
next resize or when that reader ends.
"""

from __future__ import annotations

import threading
from typing import Any


class PoolDirectory:
    """Mixed into the coordinator actor (:class:`ingest.distributed.coordinator._Coordinator`).

    A coordinator restarted after a death knows no pool until the sizer sets it again; its
    ranks keep their readers meanwhile.
    """

    def _init_directory(self) -> None:
        self._dir_lock = threading.Lock()
        self._pool: list[Any] = []
        self._waits = [0.0, 0.0, 0.0]
        """Seconds waited, seconds spanned and rows, summed over the ranks' reports since
        the sizer last took them."""

    def set_readers(self, readers: list[Any]) -> None:
        """The pool's readers now, in order (rank ``r``'s feed on ``r % len(readers)``)."""
        with self._dir_lock:
            self._pool = list(readers)

    def reader_of(self, rank: int) -> Any:
        """The reader that hosts ``rank``'s feed; None while no pool is set."""
        with self._dir_lock:
            return self._pool[rank % len(self._pool)] if self._pool else None

    def waited(self, rank: int, waited_s: float, span_s: float, rows: int) -> None:
        """A rank waited ``waited_s`` of the last ``span_s`` seconds and got ``rows`` rows."""
        with self._dir_lock:
            self._waits[0] += waited_s
            self._waits[1] += span_s
            self._waits[2] += rows

    def take_waits(self) -> tuple[float, float, int]:
        """The sums of the ranks' reports since the last call: waited, spanned, rows."""
        with self._dir_lock:
            waited, span, rows = self._waits
            self._waits = [0.0, 0.0, 0.0]
            return waited, span, int(rows)


__all__ = ["PoolDirectory"]
