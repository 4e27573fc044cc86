"""Stages: transforms that may change the number of rows (filter, split a row into several).

A plain transform keeps one output row per input row. A :class:`Stage` may return any number
of rows, with where each came from: :class:`Staged` maps every output row to the input row
of the batch it came from (``origin``) and, when it holds only a part of that row (a chunk
of a document's tokens), to that part (``part``: ``[start, stop)`` in the row's own units).

Stages here are batch-local: every output of an input row leaves in the batch (the step)
that input row came in. A step's provenance is therefore its input rows, as for any batch,
and acks, states and elastic resume stay exact at the level of input rows: a state after a
step holds every input row of it consumed, whatever the stage made of them; a filtered-out
row is consumed with its step. Steps stay equal on every rank (a step is an input batch);
the number of output rows per batch varies. A stage runs where transforms run: in the
reader pool of a :class:`ingest.RayStream`, in the worker of an :class:`ingest.DataLoader`.

Stages that hold rows across steps (packing documents into sequences) record consumption as
parts of input rows: that is the language-model data's issue, built on this seam.
"""

from __future__ import annotations

import functools
import json
import reprlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ingest.core.errors import ConfigError
from ingest.engine.window import indices
from ingest.formats.arrays import numbers

_NOTED = "while running "
"""How the note :func:`noted` adds begins: an error that has one already names its stage."""


class RowError(ConfigError):
    """A stage refused one input row of its batch (a tokenizer's id out of range): the feed
    that ran it names the row's shard URL and row (:meth:`at`).

    Attributes:
        row: The row's position in the batch the stage was given.
        problem: What is wrong with what the stage made of it.
        fix: What to do.
    """

    def __init__(self, row: int, problem: str, fix: str) -> None:
        self.row = row
        self.problem = problem
        self.fix = fix
        super().__init__(f"row {row} of the batch: {problem}; {fix}")

    def at(self, url: str, row: int) -> ConfigError:
        """The same error naming the document by its shard ``url`` and ``row``."""
        return ConfigError(f"{url} row {row}: {self.problem}; {self.fix}")


@dataclass(frozen=True, slots=True)
class Staged:
    """What a :class:`Stage` made of a batch.

    Attributes:
        table: The output rows.
        origin: For each output row, the position in the input batch of the row it came
            from; non-decreasing (outputs keep the order of their inputs).
        part: For each output row, ``[start, stop)`` of the part of its input row it holds
            (shape ``(rows, 2)``), parts of one input row in order and not overlapping; None:
            each output row comes from its whole input row.
    """

    table: pa.Table
    origin: npt.NDArray[np.int64]
    part: npt.NDArray[np.int64] | None = None

    def check(self, inputs: int, name: str) -> None:
        """Refuse a result whose mapping does not fit ``inputs`` input rows.

        Raises:
            ConfigError: Naming the stage, the rule broken and the fix.
        """
        rows = self.table.num_rows
        origin = np.asarray(self.origin)
        where = f"stage {name} returned {rows} rows for {inputs}"
        if origin.size and origin.dtype.kind not in "iu":
            raise ConfigError(
                f"{where} with origins of {origin.dtype} ({origin.ravel()[:3].tolist()}...); "
                "an origin is an integer, the position of an input row of the batch (numpy "
                "int64, as np.flatnonzero gives)"
            )
        if origin.shape != (rows,):
            raise ConfigError(
                f"{where} with {origin.shape} origins; give one origin (input row) per output row"
            )
        if rows and (origin.min() < 0 or origin.max() >= inputs):
            raise ConfigError(
                f"{where} with origins in [{origin.min()}, {origin.max()}]; an origin is the "
                f"position of an input row of the batch, in [0, {inputs})"
            )
        if rows > 1 and bool((np.diff(origin) < 0).any()):
            raise ConfigError(
                f"{where} with origins out of order; keep the outputs in the order of the "
                "input rows they come from"
            )
        if self.part is None:
            return
        part = np.asarray(self.part)
        if part.size and part.dtype.kind not in "iu":
            raise ConfigError(
                f"{where} with parts of {part.dtype}; a part is [start, stop) in integers"
            )
        if part.shape != (rows, 2) or (rows and bool((part[:, 0] > part[:, 1]).any())):
            raise ConfigError(
                f"{where} with parts of shape {part.shape}; give [start, stop) per output row, "
                "start <= stop, shape (rows, 2)"
            )
        same = origin[1:] == origin[:-1]
        if rows > 1 and bool((part[1:, 0][same] < part[:-1, 1][same]).any()):
            raise ConfigError(
                f"{where} with overlapping or unordered parts of one input row; the parts of "
                "a row must follow each other"
            )


class Stage(ABC):
    """A transform that may change the number of rows; returns a :class:`Staged`.

    Pass an instance, or the class (built once per worker), as a stream's ``transform``.
    Subclasses implement :meth:`__call__`. See the module docstring for what stays exact.
    """

    parallel_batches: int = 1
    """Batches a feed may run this stage on at once, in threads of its process, handed on
    in order (1: one after another). A stage whose calls are thread-safe and release the
    GIL for most of their time (a Rust tokenizer's batch encoding) sets more: one batch's
    Python work, and the feed's cutting of the next, overlap another batch's encoding."""

    @abstractmethod
    def __call__(self, table: pa.Table) -> Staged:
        """The rows made of ``table`` (one input batch), with where each came from."""

    def fingerprint(self) -> str | None:
        """What this stage computes, for the derived cache (``derived=``,
        :mod:`ingest.engine.derived`): equal fingerprints promise equal outputs for equal
        inputs, so a copy made under one is read in place of running the stage. Return a
        str that changes whenever the outputs would (the code's version, every option);
        None (the default): unknown, and a chain holding this stage is not cached."""
        return None


class Filter(Stage):
    """Keep the rows ``keep`` says. ``keep(table)`` returns a boolean per row of the batch (a
    pyarrow or numpy array, e.g. ``lambda t: pc.greater(t["n"], 3)``); with ``per_row=True``,
    ``keep(row)`` takes one row as a dict and returns a bool (simpler, slower). A row left
    out is consumed with its step, like any other. ``version``: a str you change whenever
    ``keep`` changes what it keeps; with one, ``derived=`` caches which rows survive (without,
    the chain is not cached: nothing can tell a changed ``keep``)."""

    def __init__(
        self, keep: Callable[[Any], Any], *, per_row: bool = False, version: str | None = None
    ) -> None:
        self.keep = keep
        self.per_row = per_row
        self.version = version

    def fingerprint(self) -> str | None:
        return _versioned("Filter", self.version, fn=function_id(self.keep), per_row=self.per_row)

    def __call__(self, table: pa.Table) -> Staged:
        mask = self._mask(table)
        if mask.shape != (table.num_rows,) or mask.dtype != np.bool_:
            mask = _nulls_dropped(mask)
        if mask.shape != (table.num_rows,) or mask.dtype != np.bool_:
            raise ConfigError(
                f"Filter: keep returned {mask.dtype} of shape {mask.shape} for {table.num_rows} "
                "rows; return one boolean per row"
            )
        rows = np.flatnonzero(mask).astype(np.int64)
        return Staged(table.take(indices(rows)), rows)

    def _mask(self, table: pa.Table) -> npt.NDArray[Any]:
        """What ``keep`` says of ``table``'s rows, as numpy; a null (pyarrow's, a masked
        array's) is False, as ``Table.filter`` takes it: its row is dropped."""
        try:
            if self.per_row:
                rows = table.to_pylist()
                return np.fromiter((bool(self.keep(r)) for r in rows), bool, len(rows))
            got = self.keep(table)
        except Exception as e:
            how = " (per_row)" if self.per_row else ""
            noted(e, f"Filter's keep {_named(self.keep)}{how} on a batch of {len(table)} rows")
            raise
        if isinstance(got, pa.Array | pa.ChunkedArray) and pa.types.is_boolean(got.type):
            if got.null_count:
                got = pc.and_kleene(got, pc.is_valid(got))  # null and false: false
            return numbers(got)  # (to_numpy would import pandas)
        if isinstance(got, np.ma.MaskedArray):
            return np.ma.filled(got, False)
        return np.asarray(got.to_numpy(zero_copy_only=False) if hasattr(got, "to_numpy") else got)


class FlatMap(Stage):
    """Each row, as a dict, becomes the rows ``fn(row)`` returns (dicts, none or several),
    in order: a document split into chunks, a sample into crops. ``schema``: the outputs'
    columns; without it they are inferred from each batch's outputs, and a batch with none
    has no columns. ``version``: a str you change whenever ``fn`` changes what it makes; with
    one, ``derived=`` caches the outputs (see :class:`Filter`)."""

    def __init__(
        self,
        fn: Callable[[dict[str, Any]], Iterable[dict[str, Any]]],
        schema: Any = None,
        *,
        version: str | None = None,
    ) -> None:
        self.fn = fn
        self.schema = schema
        self.version = version

    def fingerprint(self) -> str | None:
        return _versioned("FlatMap", self.version, fn=function_id(self.fn), schema=str(self.schema))

    def __call__(self, table: pa.Table) -> Staged:
        out: list[dict[str, Any]] = []
        origin: list[int] = []
        rows = table.to_pylist()
        for i, row in enumerate(rows):
            try:
                made = self._made(row, i)
            except Exception as e:
                where = f"on row {i} of a batch of {len(rows)} rows"
                noted(e, f"FlatMap's fn {_named(self.fn)} {where}")
                raise
            out += made
            origin += [i] * len(made)
        return Staged(self._table(out, origin), np.asarray(origin, dtype=np.int64).reshape(-1))

    def _made(self, row: dict[str, Any], i: int) -> list[Any]:
        """The rows ``fn`` makes of ``row``, row ``i`` of its batch.

        Raises:
            ConfigError: If ``fn`` returned what is not an iterable of rows (None, one dict,
                a str).
        """
        got = self.fn(row)
        if isinstance(got, list):
            return got
        if got is None or isinstance(got, Mapping | str | bytes) or not isinstance(got, Iterable):
            raise _not_rows(_what(got), i)
        return list(got)

    def _table(self, out: list[Any], origin: list[int]) -> pa.Table:
        """The rows ``fn`` made (``origin``: each one's input row) as a table.

        Raises:
            ConfigError: If one of them is not a dict.
        """
        try:
            return pa.Table.from_pylist(out, schema=self.schema)
        except (AttributeError, TypeError) as e:
            bad = next((k for k, row in enumerate(out) if not isinstance(row, Mapping)), None)
            if bad is None:
                raise
            raise _not_rows(f"an iterable holding {_what(out[bad])}", origin[bad]) from e


def _not_rows(got: str, row: int) -> ConfigError:
    """FlatMap's refusal of what its ``fn`` returned (``got``) for ``row`` of the batch."""
    return ConfigError(
        f"FlatMap: fn returned {got} for row {row} of the batch; fn must return an iterable "
        "of dicts, the rows it makes of the row, each a dict of column -> value (a list, [] "
        "for none): return [{'text': ...}] for one row, not {'text': ...}"
    )


def _what(value: Any) -> str:
    """``value`` in a message: its type, and a short repr of it."""
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} (keys {reprlib.repr(list(value))})"
    return f"{type(value).__name__} {reprlib.repr(value)}" if value is not None else "None"


def _nulls_dropped(mask: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """An object array of booleans and Nones (a list with a None, pyarrow's ``to_numpy`` of
    a mask with nulls) as booleans, a None False; any other array as it is."""
    if mask.dtype == object and all(v is None or isinstance(v, bool | np.bool_) for v in mask.flat):
        return mask.astype(bool)
    return mask


def noted(error: BaseException, where: str) -> None:
    """Add to ``error``, raised by a user's function that a stage ran, a note naming
    ``where`` it was raised ("while running ..."), for the message to name the stage; its
    type and traceback stay the user's. Once: the innermost stage names it. Not to a
    :class:`ConfigError`, whose message names its stage already.
    """
    if isinstance(error, ConfigError):
        return
    if any(note.startswith(_NOTED) for note in getattr(error, "__notes__", ())):
        return
    error.add_note(f"{_NOTED}{where}")


def _named(fn: Any) -> str:
    """A user's function's name for a message, quoted."""
    return repr(str(getattr(fn, "__qualname__", type(fn).__qualname__)))


def checked_version(stage: str, version: object) -> str:
    """``version`` of the stage named ``stage``, a non-empty str.

    Raises:
        ConfigError: If it is anything else.
    """
    if not isinstance(version, str) or not version:
        raise ConfigError(
            f"stage {stage} has version={version!r}; a version is a non-empty str (e.g. '2'), "
            "changed whenever what the stage computes changes"
        )
    return version


def function_id(fn: Any) -> str:
    """What names a user's function in a derived copy's key, beside its ``version``: its
    module and qualified name, for a lambda or a function made inside another (which share
    a name) with the line it starts on, for a ``functools.partial`` its function's. Without
    it two functions of one version read each other's copies (a ``derived=`` URL is shared
    by every job); what a function computes is still told by its version (an edited body,
    or a partial's arguments, are not)."""
    if isinstance(fn, functools.partial):
        return f"partial({function_id(fn.func)})"
    kind = fn if hasattr(fn, "__qualname__") else type(fn)
    name = f"{getattr(kind, '__module__', '?')}.{kind.__qualname__}"
    code = getattr(fn, "__code__", None)
    if code is not None and ("<lambda>" in name or "<locals>" in name):
        name += f":{code.co_firstlineno}"
    return name


def _versioned(stage: str, version: str | None, **options: Any) -> str | None:
    """A user function's stage's fingerprint: its ``version`` and the options that change
    its outputs (its function's :func:`function_id` among them); None without a version."""
    if version is None:
        return None
    version = checked_version(stage, version)
    return json.dumps({"stage": stage, "version": version, **options}, sort_keys=True)


__all__ = [
    "Filter",
    "FlatMap",
    "RowError",
    "Stage",
    "Staged",
    "checked_version",
    "function_id",
    "noted",
]
