"""The transform contract, shared by Stream and the reader pool. No torch, no Ray.

A transform is a function over a batch as an Arrow table, or a class whose instances are
such functions, built once per worker (once per :class:`ingest.Stream`, once per reader
actor of a :class:`ingest.RayStream`: tokenizers, image decoders). It returns a table, a
record batch or a dict of arrays/tensors, with one row per input row, in order; a stage
(:mod:`ingest.engine.stage`) may change the number of rows and says where each came from.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.engine.stage import Stage, Staged, noted
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


def as_table(out: Any, what: str, rows: int | None = None) -> pa.Table:
    """A transform's result as an Arrow table (numpy arrays of any rank are accepted; a
    pandas DataFrame's index is not a column). ``what`` names the transform in a refusal;
    ``rows``: the rows its columns must have, where known.

    Raises:
        ConfigError: If ``out`` is not table-like, or a column of a dict cannot be one (a
            single value, another length, a dtype Arrow has not): naming the column, what
            it holds and the fix.
    """
    if isinstance(out, pa.Table):
        return out
    if isinstance(out, pa.RecordBatch):
        return pa.Table.from_batches([out])
    if type(out).__name__ == "DataFrame" and type(out).__module__.startswith("pandas"):
        return pa.Table.from_pandas(out, preserve_index=False)  # pandas is imported already
    if isinstance(out, Mapping):
        return _dict_table(out, what, rows)
    raise ConfigError(
        f"{what} returned {type(out).__name__}; return a pyarrow Table or "
        "RecordBatch, a pandas DataFrame, or a dict of column name -> numpy array/tensor/list"
    )


def _dict_table(out: Mapping[str, Any], what: str, rows: int | None) -> pa.Table:
    """A transform's dict of columns as a table (see :func:`as_table`)."""
    columns = {name: _column(name, value, what) for name, value in out.items()}
    try:
        if all(isinstance(c, pa.Array) for c in columns.values()):
            return pa.Table.from_arrays(list(columns.values()), names=list(columns))
        return pa.table(columns)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise _refused_table(out, columns, what, rows, e) from e


def _column(name: str, value: Any, what: str) -> Any:
    """One column of a transform's dict: an Arrow array of a numpy array or a tensor (over
    its memory where it can be), else the value as it is, for ``pa.table`` to make one of.
    What does not convert as it is, but would losslessly (a tensor that requires grad,
    numbers of the other byte order), is converted so, and made a column.

    Raises:
        ConfigError: If it cannot be a column: naming it, what it holds and the fix.
    """
    try:
        return _arrow(value)
    except (pa.ArrowException, TypeError, ValueError, RuntimeError) as e:
        again = _lossless(value)
        if again is None:
            raise ConfigError(
                f"{what} returned column {name!r} as {_described(value)}: {_fault(value, e)}"
            ) from e
        return _column(name, again, what)


def _arrow(value: Any) -> Any:
    """``value`` as an Arrow array where numpy or torch made it; any other value as it is."""
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()  # torch tensors
    if not isinstance(value, np.ndarray):
        if isinstance(value, str | bytes):  # (pa.table would make a column of its items)
            raise TypeError("a single value")
        return value
    if value.ndim > 1:
        if value.dtype.kind == "b":  # no tensor type of bool: fixed-size lists of them
            return _bool_lists(value)
        if value.dtype.kind not in "iuf":  # (Arrow makes tensors of str that torch cannot)
            raise TypeError(f"no tensor of {value.dtype}")
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(value))
    if (made := of_numpy(value)) is not None:
        return made  # (pa.table would import pandas to look at it)
    if not value.dtype.isnative:  # numbers of the other byte order: swapped, then as above
        return _arrow(value.astype(value.dtype.newbyteorder("=")))
    return value


def _bool_lists(values: npt.NDArray[np.bool_]) -> pa.Array:
    """An n-d bool array as a column of fixed-size lists of booleans, nested n - 1 deep."""
    column = bools(values.ravel())
    for size in reversed(values.shape[1:]):
        column = pa.FixedSizeListArray.from_arrays(column, size)
    return column


def _lossless(value: Any) -> Any:
    """``value`` converted without loss into what :func:`_arrow` takes where it took it not
    as it was (a tensor that requires grad, detached; a numpy array of the other byte
    order, swapped); None if no such conversion helps."""
    if getattr(value, "requires_grad", False):
        return value.detach()
    if isinstance(value, np.ndarray) and not value.dtype.isnative:
        return value.astype(value.dtype.newbyteorder("="))
    return None


def _refused_table(
    out: Mapping[str, Any],
    columns: Mapping[str, Any],
    what: str,
    rows: int | None,
    error: Exception,
) -> ConfigError:
    """Why a transform's dict (``out``; ``columns``: each as :func:`_column` made it) makes
    no table: its first column that is a single value, or of another length than ``rows``
    (if None, the first column's), or that pyarrow makes no column of, named; else
    pyarrow's ``error``."""
    lengths = {name: _length(value) for name, value in out.items()}
    if rows is None:
        rows = next((n for n in lengths.values() if n is not None), None)
    for name, value in out.items():
        length = lengths[name]
        if length is None or (rows is not None and length != rows):
            fault = _fault(value, error) if length is None else _short(length, rows)
            return ConfigError(f"{what} returned column {name!r} as {_described(value)}: {fault}")
    for name, column in columns.items():
        if (failed := _unconvertible(column)) is not None:
            value = out[name]
            return ConfigError(
                f"{what} returned column {name!r} as {_described(value)}: {_fault(value, failed)}"
            )
    return ConfigError(
        f"{what} returned a dict of columns pyarrow makes no table of ({type(error).__name__}: "
        f"{error}); give numpy arrays, tensors, pyarrow arrays or lists, one value per row"
    )


def _unconvertible(column: Any) -> Exception | None:
    """What pyarrow raised making an array of ``column`` (a list, say, of mixed types);
    None if it made one."""
    if isinstance(column, pa.Array | pa.ChunkedArray):
        return None
    try:
        pa.array(column)
    except (pa.ArrowException, TypeError, ValueError) as e:
        return e
    return None


def _length(value: Any) -> int | None:
    """How many values a column holds; None for a single value (a number, a str, a 0-d
    array)."""
    if isinstance(value, str | bytes) or getattr(value, "ndim", 1) == 0:
        return None
    try:
        return len(value)
    except TypeError:
        return None


def _short(length: int, rows: int | None) -> str:
    return (
        f"{length} values for {rows} rows; give one value per row of the batch, in order (to "
        "change the number of rows, make it an ingest.Stage: see ingest.Filter, ingest.FlatMap)"
    )


def _fault(value: Any, error: Exception) -> str:
    """What is wrong with ``value`` as a column, which raised ``error``, and the fix."""
    dtype = str(getattr(value, "dtype", ""))
    if dtype == "torch.bfloat16":
        return (
            "numpy and Arrow have no bfloat16; convert it with .float() (float32 holds every "
            "bfloat16 exactly)"
        )
    device = getattr(value, "device", None)
    if type(value).__module__.startswith("torch") and getattr(device, "type", "cpu") != "cpu":
        return f"a tensor on {device} is not read from there; move it with .cpu()"
    if _length(value) is None:
        return (
            "a single value, not a column; give one value per row (a list, or a numpy array: "
            "np.full(rows, value))"
        )
    if getattr(value, "ndim", 1) > 1:
        return (
            "a column of n-d arrays holds numbers or booleans, one array per row; convert it "
            "(.astype(...)), or give a list of per-row values (.tolist())"
        )
    return (
        f"pyarrow makes no column of it ({type(error).__name__}: {error}); give a numpy "
        "array, a tensor, a pyarrow array or a list, one value per row, all of one type"
    )


def _described(value: Any) -> str:
    """``value`` in a message: its type, with its shape and dtype, or a short repr."""
    kind = type(value)
    module = kind.__module__.split(".")[0]
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{name} of shape {tuple(shape)} and dtype {dtype}"
    length = _length(value)
    return f"{name} {reprlib.repr(value)}" if length is None else f"{name} of {length} values"


def staged(fn: Callable[[pa.Table], Any], table: pa.Table) -> Staged:
    """Run ``fn`` on ``table``; its result as a :class:`Staged` table: a stage's
    (:mod:`ingest.engine.stage`), its origins checked, or a transform's, one row per input
    row (each its own origin).

    Raises:
        ConfigError: If the result is not table-like, has another number of rows (not a
            stage's), or is a stage's whose origins do not fit the batch.
    """
    name = _name(fn)
    try:
        got = fn(table)
    except Exception as e:  # the user's: named where it was raised, and raised as it is
        noted(e, f"transform {name!r} on a batch of {table.num_rows} rows")
        raise
    if isinstance(got, Staged):  # a stage: any number of rows, with their origins
        got.check(table.num_rows, name)
        origin = np.asarray(got.origin, dtype=np.int64)  # checked: integers (or none)
        return Staged(as_table(got.table, f"stage {name}"), origin, got.part)
    out = as_table(got, f"transform {name}", table.num_rows)
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
