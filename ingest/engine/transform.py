"""The transform contract, shared by Stream and the reader pool. No torch, no Ray.

A transform is a function over a batch as an Arrow table, or a class whose instances are
such functions, built once per worker (once per :class:`ingest.Stream`, once per reader
actor of a :class:`ingest.RayStream`: tokenizers, image decoders). It returns a table, a
record batch or a dict of arrays/tensors, with one row per input row, in order; a stage
(:mod:`ingest.engine.stage`) may change the number of rows and says where each came from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.engine.stage import Stage, Staged
from ingest.formats.arrays import bools, of_numpy

Transform = Callable[[pa.Table], Any] | type | Sequence[Callable[[pa.Table], Any] | type]
"""A function over a batch as an Arrow table, or a class whose instances are such functions
(built once per worker: once per :class:`Stream`, once per pool actor of a RayStream). It
returns a table, a record batch or a dict of arrays/tensors, one row per input row (or, an
:class:`ingest.Stage`, a :class:`ingest.Staged`). A list (or tuple) of them runs each on what
the one before made, in order (:class:`Chain`)."""


def build_transform(transform: Transform | None) -> Callable[[pa.Table], Any] | None:
    """The callable of a transform: the function itself, or an instance of the class.

    Raises:
        ConfigError: If ``transform`` is not callable, or building the class raised (the
            error it raised is chained, and quoted: the message alone crosses processes).
    """
    if transform is None:
        return None
    if isinstance(transform, (list, tuple)):
        if not transform:
            raise ConfigError(
                "transform=[] is an empty list of stages; pass None for no transform, or "
                "the stages to run in order"
            )
        built = [build_transform(t) for t in transform]
        return built[0] if len(built) == 1 else Chain([b for b in built if b is not None])
    if isinstance(transform, type):
        name = transform.__qualname__
        try:
            return transform()  # type: ignore[no-any-return]
        except Exception as e:
            raise ConfigError(
                f"transform={name}: building it ({name}()) raised {type(e).__name__}: {e}; "
                "fix the class's __init__ (it runs once per Stream and once in each reader "
                "actor of a RayStream, where the files it loads must be found too)"
            ) from e
    if not callable(transform):
        raise ConfigError(
            f"transform={transform!r} is neither a function nor a class; pass a function "
            "over a pyarrow Table, or a class whose instances are one"
        )
    return transform


def parallel_batches(fn: Any) -> int:
    """Batches ``fn`` may transform at once (its ``parallel_batches``, see
    :class:`ingest.engine.stage.Stage`; 1 for a plain function)."""
    return max(1, int(getattr(fn, "parallel_batches", 1)))


def as_table(out: Any, what: str) -> pa.Table:
    """A transform's result as an Arrow table (numpy arrays of any rank are accepted; a
    pandas DataFrame's index is not a column)."""
    if isinstance(out, pa.Table):
        return out
    if isinstance(out, pa.RecordBatch):
        return pa.Table.from_batches([out])
    if type(out).__name__ == "DataFrame" and type(out).__module__.startswith("pandas"):
        return pa.Table.from_pandas(out, preserve_index=False)  # pandas is imported already
    if isinstance(out, Mapping):
        columns = {}
        for name, value in out.items():
            if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
                value = value.numpy()  # torch tensors
            if isinstance(value, np.ndarray) and value.ndim > 1:
                columns[name] = pa.FixedShapeTensorArray.from_numpy_ndarray(
                    np.ascontiguousarray(value)
                )
            elif isinstance(value, np.ndarray) and (made := of_numpy(value)) is not None:
                columns[name] = made  # (pa.table would import pandas to look at it)
            else:
                columns[name] = value
        if all(isinstance(c, pa.Array) for c in columns.values()):
            return pa.Table.from_arrays(list(columns.values()), names=list(columns))
        return pa.table(columns)
    raise ConfigError(
        f"{what} returned {type(out).__name__}; return a pyarrow Table or "
        "RecordBatch, a pandas DataFrame, or a dict of column name -> numpy array/tensor/list"
    )


def staged(fn: Callable[[pa.Table], Any], table: pa.Table) -> Staged:
    """Run ``fn`` on ``table``; its result as a :class:`Staged` table: a stage's
    (:mod:`ingest.engine.stage`), its origins checked, or a transform's, one row per input
    row (each its own origin).

    Raises:
        ConfigError: If the result is not table-like, has another number of rows (not a
            stage's), or is a stage's whose origins do not fit the batch.
    """
    name = _name(fn)
    got = fn(table)
    if isinstance(got, Staged):  # a stage: any number of rows, with their origins
        got.check(table.num_rows, name)
        origin = np.asarray(got.origin, dtype=np.int64)  # checked: integers (or none)
        return Staged(as_table(got.table, f"stage {name}"), origin, got.part)
    out = as_table(got, f"transform {name}")
    if out.num_rows != table.num_rows:
        raise ConfigError(
            f"transform {name} returned {out.num_rows} rows for {table.num_rows}; "
            "transforms must keep one output row per input row, in order; to filter rows or "
            "split them, make it an ingest.Stage returning ingest.Staged (each output row's "
            "input row)"
        )
    return Staged(out, np.arange(table.num_rows, dtype=np.int64))


class Chain(Stage):
    """Stages (and plain transforms) run in order, each on what the one before made: the
    callable of ``transform=[ingest.Filter(...), ingest.Tokenize(...)]``.

    Its result maps every output row to the input row of the batch it came from, through
    every stage (the origins compose), so acks, states and resumes stay exact at the level
    of input rows, as for one stage. At most one stage of the chain may give parts of rows
    (:class:`ingest.Staged`'s ``part``): a part is in its input row's own units (tokens,
    say), and parts of parts would need the units of both.

    Each stage's results are checked as a stage's alone are (:func:`staged`). The chain
    runs its batches ``parallel_batches`` at a time, the fewest any of its stages allows.
    """

    def __init__(self, stages: Sequence[Callable[[pa.Table], Any]]) -> None:
        self.stages = list(stages)
        self.parallel_batches = min(parallel_batches(fn) for fn in self.stages)

    def __call__(self, table: pa.Table) -> Staged:
        origin = np.arange(table.num_rows, dtype=np.int64)
        part: npt.NDArray[np.int64] | None = None
        for fn in self.stages:
            made = staged(fn, table)
            origin = origin[made.origin]
            if made.part is not None:
                if part is not None:
                    raise ConfigError(
                        f"transform list: {_name(fn)} gives parts of rows after an earlier "
                        "stage did; only one stage of a list may give parts of rows (a part "
                        "is in its input row's own units): cut rows into parts once"
                    )
                part = np.asarray(made.part, dtype=np.int64)
            elif part is not None:
                part = part[made.origin]
            table = made.table
        return Staged(table, origin, part)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))


def apply(fn: Callable[[pa.Table], Any], table: pa.Table) -> pa.Table:
    """Run ``fn`` on ``table``; its rows as an Arrow table (see :func:`staged`)."""
    return staged(fn, table).table


def applying(fn: Callable[[pa.Table], Any]) -> Callable[[pa.Table], pa.Table]:
    """:func:`apply` with ``fn``, as one callable that keeps ``fn``'s ``parallel_batches``."""
    return _Applied(fn, parallel_batches(fn))


@dataclass(frozen=True, slots=True)
class _Applied:
    fn: Callable[[pa.Table], Any]
    parallel_batches: int

    def __call__(self, table: pa.Table) -> pa.Table:
        return apply(self.fn, table)


def output_of_no_rows(fn: Callable[[pa.Table], Any], table: pa.Table) -> Any:
    """What the step of a batch whose transform raised delivers (``on_error="skip"``):
    ``fn`` over none of ``table``'s rows if it takes them, else those no rows."""
    empty = table.slice(0, 0)
    try:
        return fn(empty)
    except Exception:
        return empty


def split_failures(
    fn: Callable[[pa.Table], Any], table: pa.Table
) -> tuple[Any, list[tuple[int, Exception]]]:
    """``fn`` over the rows of ``table`` it does not fail on, and the rows it fails on.

    For ``on_error="skip"`` when a transform raised a data error (a file that does not
    decode): only the rows it fails on alone are quarantined, as a bad line is. Found by
    bisection, O(failures x log n) calls, then one call over the other rows.

    Returns:
        What ``fn`` returns for the rows it does not fail on (:func:`output_of_no_rows` if
        none), and ``(row, error)`` for each row it fails on, in order.
    """
    bad: list[tuple[int, Exception]] = []
    todo = [(0, table.num_rows)]
    while todo:
        lo, hi = todo.pop()
        try:
            fn(table.slice(lo, hi - lo))
            continue
        except Exception as e:
            if hi - lo == 1:
                bad.append((lo, e))
                continue
        mid = (lo + hi) // 2
        todo += [(mid, hi), (lo, mid)]
    bad.sort(key=lambda item: item[0])
    keep = np.ones(table.num_rows, dtype=bool)
    keep[[row for row, _ in bad]] = False
    if not keep.any():
        return output_of_no_rows(fn, table), bad
    return fn(table.filter(bools(keep))), bad


__all__ = [
    "Chain",
    "Transform",
    "apply",
    "as_table",
    "build_transform",
    "output_of_no_rows",
    "split_failures",
]
