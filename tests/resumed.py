"""A stream stopped and resumed from its state, as the tests' exactly-once witnesses read it."""

from __future__ import annotations

import json
from typing import Any

import ingest


def through_a_resume(url: Any, batches: int, column: str = "id", **kwargs: Any) -> list[Any]:
    """The values of ``column`` a ``Stream(url, **kwargs)`` hands out in its first
    ``batches`` batches, then those of a new stream that loads its state (through JSON, as a
    checkpoint keeps it) to the epoch's end, in the order handed out."""
    stream = ingest.Stream(url, **kwargs)
    it = iter(stream)
    before = [v for _ in range(batches) for v in _values(next(it)[column])]
    resumed = ingest.Stream(url, **kwargs)
    resumed.load_state_dict(json.loads(json.dumps(stream.state_dict())))
    return before + [v for batch in resumed for v in _values(batch[column])]


def _values(column: Any) -> list[Any]:
    return column.tolist() if hasattr(column, "tolist") else list(column)
