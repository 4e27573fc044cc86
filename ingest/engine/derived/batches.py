"""A deriving feed's batches (issue 34, item 1): each batch's outputs gathered by its rows'
refs (:meth:`Deriving.gather`), in place of the transform run on the batch; the rows on
today's path (a span read in part, or one whose chain raised) through the chain here, with
the errors and quarantines a feed without the cache gives them.

The feed (:class:`ingest.engine.feed.Feed`) cuts batches of refs and hands each one here
with a way to name a batch row's shard and row (for a stage's :class:`RowError` and a
quarantined row); what comes back is the batch's table as the rank's transform makes it,
what was quarantined, and the rows it delivers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.quarantine import Quarantine, Quarantined, skippable
from ingest.engine.derived.reading import Deriving, merged, refs_of
from ingest.engine.stage import RowError, Staged
from ingest.engine.transform import output_of_no_rows, split_failures, staged

Locate = Callable[[int], tuple[str, int]]
"""The shard URL and row of a batch row (by its index among the batch's rows with data)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Outputs:
    """What a batch of refs became.

    Attributes:
        table: The batch's table as the rank's transform makes it.
        quarantined: What this batch quarantined (``on_error="skip"``).
        rows: Input rows it delivers (those not lost to a failure).
    """

    table: Any
    quarantined: tuple[Quarantined, ...]
    rows: int


class DerivedBatches:
    """A deriving feed's batches.

    Args:
        deriving: The feed's derived cache (its copies and the units read).
        transform: The rank's wrapper of the chain
            (:func:`ingest.engine.rank_node.read_transform`).
        quarantine: The feed's quarantine, where a failed row or step is recorded.
        skip: Whether the read options say ``on_error="skip"``.
        empty_input: A table of no rows with the stream's columns.
    """

    def __init__(
        self,
        deriving: Deriving,
        transform: Callable[[pa.Table], Any],
        quarantine: Quarantine,
        *,
        skip: bool,
        empty_input: Callable[[], pa.Table],
    ) -> None:
        self.deriving = deriving
        self.transform = transform
        self.quarantine = quarantine
        self.skip = skip
        self.empty_input = empty_input

    def outputs(self, batch: pa.Table, step: int, locate: Locate) -> Outputs:
        """The outputs of the batch of refs ``batch`` (step ``step``): gathered from the
        units read, the rows on today's path through the chain (:meth:`_todays_path`)."""
        deriving = self.deriving
        refs = refs_of(batch)
        rows = len(refs)
        got = deriving.gather(refs)
        deriving.release(refs)
        made = [] if got.staged is None else [got.staged]
        failed: list[Quarantined] = []
        if got.raw is not None:
            out, failed, lost = self._todays_path(batch, step, got.raw, got.raw_rows, locate)
            if lost is None:  # the step delivers no row, as on today's path
                none = output_of_no_rows(lambda t: staged(deriving.fn, t), got.raw)
                if isinstance(none, Staged):
                    none = _finished(self.transform, deriving.fn, none, batch)
                return Outputs(none, tuple(failed), 0)
            rows -= lost
            made += [] if out is None else [out]
        if made:
            table = _finished(self.transform, deriving.fn, merged(made), batch)
        else:  # holes only, or every row failed: the chain over no rows, as on today's path
            table = output_of_no_rows(self.transform, self.empty_input())
        return Outputs(table, tuple(failed), rows)

    def _todays_path(
        self,
        batch: pa.Table,
        step: int,
        raw: pa.Table,
        at: npt.NDArray[np.int64],
        locate: Locate,
    ) -> tuple[Staged | None, list[Quarantined], int | None]:
        """The chain over the input rows ``raw`` of batch rows ``at``, with the errors and
        quarantines of a feed without the cache: the outputs (origins: batch rows), what was
        quarantined, and the rows lost (None: the whole step, a failure that is not a data
        error under ``on_error="skip"``)."""
        fn = self.deriving.fn

        def chain(table: pa.Table) -> Staged:
            return staged(fn, table)

        try:
            out = chain(raw)
            return dataclasses.replace(out, origin=at[out.origin]), [], 0
        except RowError as e:  # a stage refused a row of the batch: name its shard and row
            url, row = locate(int(at[e.row]))
            raise e.at(url, row) from e
        except Exception as e:
            if not self.skip:
                raise
            if not skippable(e):
                return None, [self.quarantine.record(e, step=step, rows=batch.num_rows)], None
            good, bad = split_failures(chain, raw)
        failed = []
        keep = np.ones(len(at), dtype=bool)
        for index, error in bad:  # a file that does not decode: its rows alone
            url, row = locate(int(at[index]))
            failed.append(self.quarantine.record(error, url=url, start=row, stop=row + 1, rows=1))
            keep[index] = False
        if not isinstance(good, Staged):
            return None, failed, len(bad)
        return dataclasses.replace(good, origin=at[keep][good.origin]), failed, len(bad)


def _finished(transform: Any, fn: Any, made: Staged, refs: pa.Table) -> Any:
    """What the rank's ``transform`` (its wrapper of the chain ``fn``:
    :func:`ingest.engine.rank_node.read_transform`) makes of a batch of rows ``refs`` whose
    chain made ``made``: the wrapper run with ``made`` in place of the chain."""
    return dataclasses.replace(transform, fn=_Made(made, fn))(refs)


class _Made:
    """A chain that made ``made`` (a deriving feed's batch), for the rank's wrapper."""

    def __init__(self, made: Staged, fn: Any) -> None:
        self.made = made
        # The chain's name, for what the wrapper's checks say about it.
        self.__qualname__ = str(getattr(fn, "__qualname__", type(fn).__qualname__))

    def __call__(self, table: pa.Table) -> Staged:
        return self.made


__all__ = ["DerivedBatches", "Locate", "Outputs"]
