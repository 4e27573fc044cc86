"""What a state carries into its epoch, as the tests' exactly-once witnesses count it.

A carry span ``[shard, start, stop]`` may cover rows that are not carried: rows of its
epoch handed out before the state (a resume at another world size shares the rest of the
epoch out again), or left out by :func:`ingest.skip`. The state lists them apart, in
``distributed.carry.consumed`` (:mod:`ingest.core.state`); a witness that took every row of
a span for a carried copy counted those twice.
"""

from __future__ import annotations

from typing import Any

from ingest.core.intervals import IntervalSet


def carry_consumed(state: dict[str, Any]) -> set[tuple[int, int]]:
    """``(shard, row)`` of the rows ``state``'s carry spans cover and consumed already."""
    consumed = state["distributed"]["carry"].get("consumed", {})
    return {
        (int(shard), row)
        for shard, rows in consumed.items()
        for start, stop in IntervalSet.from_json(rows)
        for row in range(start, stop)
    }


def carried_rows(state: dict[str, Any]) -> list[tuple[int, int]]:
    """``(shard, row)`` of each row ``state`` carries into its epoch: its carry spans' rows,
    less the consumed ones."""
    consumed = carry_consumed(state)
    return [
        (shard, row)
        for shard, start, stop in state["distributed"]["carry"]["spans"]
        for row in range(start, stop)
        if (shard, row) not in consumed
    ]
