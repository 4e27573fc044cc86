"""Tokenizing as a stage: a batch's texts -> token ids, where transforms run (the reader pool).

:class:`Tokenize` takes any tokenizer: a Hugging Face ``tokenizers.Tokenizer``, a
``transformers`` fast tokenizer (its Rust tokenizer is used directly), or any callable from
a list of texts to a list of token id lists (or to a dict holding them as ``"input_ids"``).
One output row per input row: the token ids as a ``list<int32>`` column and their count,
beside the columns kept. Packing them into sequences (:mod:`ingest.core.packing`) is the
next stage.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.engine.stage import RowError, Stage, Staged

EOS_KEY = b"ingest.eos_id"
"""The id column's field metadata key holding ``eos_id``: a :class:`ingest.Pack` without a
``pad_id`` pads with it."""

MAX_ID = 2**31 - 1
"""The largest token id: ids travel as ``int32`` (every vocabulary in use is far below)."""


class _Encoding:
    """One Rust batch encoding at a time in a process: one already runs on every core (rayon),
    and two at once contend for them (measured here: a reader's epoch took up to 4.1 CPU
    seconds, against 3.2 to 3.6 one at a time). Batches tokenized at once
    (``parallel_batches``) overlap the rest: the ids made Python lists and arrays, the feed's
    cutting.

    A child forked while another thread holds the lock (an encoding in flight when a
    DataLoader forks its workers) would inherit it held, by no thread of its own, and wait on
    it for ever: every forked child makes its own (:func:`_new_lock`)."""

    lock = threading.Lock()


def _new_lock() -> None:
    """A forked child's own encoding lock (the parent's may be held by a thread the child
    does not have)."""
    _Encoding.lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


def _ids(batch: Callable[..., Any], texts: list[str]) -> list[list[int]]:
    """``batch`` (a Rust tokenizer's batch encoding) of ``texts``, as id lists. A function of
    the module, not a closure: a closure is pickled with the globals it names (the lock)."""
    with _Encoding.lock:
        encodings = batch(texts, add_special_tokens=False)
    return [e.ids for e in encodings]


def _encoder(tokenizer: Any) -> Callable[[list[str]], Sequence[Sequence[int]]]:
    """A function from texts to token id lists, for ``tokenizer``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a transformers fast tokenizer
    if backend is not None:
        tokenizer = backend
    fast = getattr(tokenizer, "encode_batch_fast", None)  # tokenizers: no offsets computed
    batch = fast or getattr(tokenizer, "encode_batch", None)
    if batch is not None:
        return _Rust(batch)
    if not callable(tokenizer):
        raise ConfigError(
            f"tokenizer {tokenizer!r} is neither a tokenizers.Tokenizer, a transformers fast "
            "tokenizer nor a callable from a list of texts to lists of token ids"
        )

    def call(texts: list[str]) -> Sequence[Sequence[int]]:
        out = tokenizer(texts)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return _checked(out, len(texts), tokenizer)

    return call


class _Rust:
    """A Rust tokenizer's batch encoding, as a function from texts to id lists (ints)."""

    def __init__(self, batch: Callable[..., Any]) -> None:
        self.batch = batch

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return _ids(self.batch, texts)


def _checked(out: Any, texts: int, tokenizer: Any) -> Sequence[Sequence[int]]:
    """A callable's ``out`` for ``texts`` texts, if it is one sequence of ids per text.

    Raises:
        ConfigError: If it is not a list (or array) of as many lists (or arrays) of ids.
    """
    name = getattr(tokenizer, "__qualname__", type(tokenizer).__qualname__)
    rule = (
        "a Tokenize callable must return one list (or 1-d array) of integer token ids per "
        "text, in a list, or a dict holding that list as 'input_ids'"
    )
    if not _sequence(out):
        raise ConfigError(
            f"tokenizer {name} returned {type(out).__name__} for {texts} texts; {rule}"
        )
    if len(out) != texts:
        raise ConfigError(
            f"tokenizer {name} returned {len(out)} id lists for {texts} texts; {rule}"
        )
    for n, ids in enumerate(out):
        if not _sequence(ids):
            raise RowError(
                n,
                f"tokenizer {name} returned {type(ids).__name__} ({_short(ids)}) for the text",
                rule,
            )
        if getattr(ids, "ndim", 1) != 1:
            raise RowError(
                n, f"tokenizer {name} returned an array of shape {tuple(ids.shape)}", rule
            )
    return out  # type: ignore[no-any-return]


def _sequence(value: Any) -> bool:
    """Whether ``value`` is a sequence of items (a list, an array, a tensor), not a text."""
    if isinstance(value, (str, bytes, Mapping)):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_array(values: npt.NDArray[Any], kind: pa.DataType) -> pa.Array:
    """A numpy array as an Arrow array over its memory (``pa.array`` would import pandas)."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _flat(
    ids: Sequence[Sequence[int]], ints: bool, eos_id: int | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Every document's ids, each followed by ``eos_id`` (unless None), one after another,
    checked to be ids; and each document's count (``eos_id`` included).

    Python lists (a Rust tokenizer's) are joined, ``eos_id`` put in as they are, and
    converted once, straight to ``int32`` (:func:`_joined`). Anything else (a callable's
    arrays) goes one array per document, joined, then ``eos_id`` put in. ``ints``: the
    lists hold Python ints (a Rust tokenizer's).

    Raises:
        RowError: Naming the document (its row in the batch) of the first id that is not an
            integer in ``[0, MAX_ID]``.
    """
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    if all(type(i) is list for i in ids):
        flat = _joined(ids, ints, eos_id)
        return (lengths if eos_id is None else lengths + 1), flat
    flat = _flat_arrays(ids)
    if eos_id is None:
        return lengths, flat
    lengths += 1
    with_eos = np.full(int(lengths.sum()), eos_id, dtype=np.int32)
    keep = np.ones(len(with_eos), dtype=bool)
    keep[np.cumsum(lengths) - 1] = False
    with_eos[keep] = flat
    return lengths, with_eos


def _joined(ids: Sequence[Sequence[int]], ints: bool, eos_id: int | None) -> npt.NDArray[np.int32]:
    """:func:`_flat` of lists: one list of every id, each document's followed by ``eos_id``,
    made ``int32`` at once (an int past it fails the conversion, a negative one the minimum).
    ``ints``: the lists hold Python ints (a Rust tokenizer's); else a float or a text among
    them is found by their sum (3 ms for 457 k ids), where ``np.fromiter`` would truncate or
    parse it.

    Measured on 1,000 documents (457 k tokens; the tokenizer's own ids as lists: 9 ms):
    joining 3 ms, the conversion 10 to 16 ms, against 12 to 20 ms for ``array.array``,
    ``np.array`` or ``pa.array``, 24 ms for an array per document and a concatenation.
    ``eos_id`` goes in as the lists are joined (1,000 appends), not by spreading the ids
    afterwards (a mask over every token), and the ids go straight to ``int32``, not through
    ``int64`` (a copy and a maximum fewer).
    """
    every: list[int] = []
    extend = every.extend
    if eos_id is None:
        for i in ids:
            extend(i)
    else:
        append = every.append
        for i in ids:
            extend(i)
            append(eos_id)
    if not ints:
        _integers(ids, every)
    try:
        flat = np.fromiter(every, np.int32, len(every))
    except (OverflowError, TypeError, ValueError):
        _integers(ids, None)
        raise  # pragma: no cover - _integers names the id
    if len(flat) and flat.min() < 0:
        _integers(ids, None)
    return flat


def _flat_arrays(ids: Sequence[Sequence[int]]) -> npt.NDArray[np.int32]:
    """:func:`_flat` of anything but lists: one array per document, checked, joined."""
    parts = [np.asarray(i) for i in ids]
    for n, part in enumerate(parts):
        if not part.size:
            parts[n] = part.astype(np.int64)  # [] is float64 to numpy
        elif part.dtype.kind not in "iu":
            raise RowError(n, f"the tokenizer's ids are {part.dtype} ({_short(part[:5])})", _FIX)
        elif part.dtype == np.uint64:  # int64 and uint64 would concatenate as float64
            if part.max() > MAX_ID:
                raise RowError(n, f"the tokenizer's id {int(part.max())} is out of range", _FIX)
            parts[n] = part.astype(np.int64)
    if not parts:
        return np.zeros(0, np.int32)
    return _in_range(ids, np.concatenate(parts).astype(np.int64, copy=False))


_FIX = (
    f"token ids must be integers in [0, {MAX_ID}]: return the vocabulary's ids (the "
    "tokenizer or its output is not the one meant)"
)


def _integers(ids: Sequence[Sequence[Any]], every: list[Any] | None) -> None:
    """Refuse ids that are not Python (or numpy) integers in ``[0, MAX_ID]``, naming the
    first one's document. With ``every`` (the ids joined), only if their sum is not an
    integer (a float or a text among them); without, by looking at each document's ids."""
    if every is not None:
        try:
            total = sum(every)
        except TypeError:
            total = None
        if isinstance(total, (int, np.integer)):
            return
    for n, doc in enumerate(ids):
        for i in doc:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise RowError(n, f"the tokenizer's id {_short(i)} is not an integer", _FIX)
            if not 0 <= i <= MAX_ID:
                raise RowError(n, f"the tokenizer's id {i} is out of range", _FIX)


def _in_range(ids: Sequence[Sequence[Any]], flat: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    """``flat`` as ``int32`` if every id is in ``[0, MAX_ID]`` (one min and one max)."""
    if len(flat) and (flat.min() < 0 or flat.max() > MAX_ID):
        bad = int(np.flatnonzero((flat < 0) | (flat > MAX_ID))[0])
        ends = np.cumsum(np.fromiter(map(len, ids), np.int64, len(ids)))
        doc = int(np.searchsorted(ends, bad, side="right"))
        raise RowError(doc, f"the tokenizer's id {int(flat[bad])} is out of range", _FIX)
    return flat.astype(np.int32)


class Tokenize(Stage):
    """Token ids of a text column (see the module docstring).

    Two batches are tokenized at once (``parallel_batches``): while a Rust tokenizer encodes
    one on every core without the GIL, the other's ids become arrays and the feed cuts the
    next batch (one encoding runs at a time). Pass ``parallel_batches=1`` for a callable
    that is not thread-safe.

    Args:
        tokenizer: The tokenizer (see the module docstring).
        column: The text column.
        output: The name of the token id column (``list<int32>``).
        eos_id: A token appended to every document (an end of text), or None.
        keep: Other input columns kept beside the ids (the text column is dropped unless
            named here).
        parallel_batches: Batches tokenized at once, in threads (see above).
    """

    def __init__(
        self,
        tokenizer: Any,
        column: str = "text",
        *,
        output: str = "input_ids",
        eos_id: int | None = None,
        keep: Sequence[str] = (),
        parallel_batches: int = 2,
    ) -> None:
        if parallel_batches < 1:
            raise ConfigError(f"Tokenize(parallel_batches={parallel_batches}) must be at least 1")
        if eos_id is not None and (
            isinstance(eos_id, bool)
            or not isinstance(eos_id, (int, np.integer))
            or not 0 <= eos_id <= MAX_ID
        ):
            raise ConfigError(
                f"Tokenize(eos_id={eos_id!r}) must be a token id, an integer in [0, {MAX_ID}], "
                "or None; pass the tokenizer's end-of-text id (tokenizer.token_to_id(...))"
            )
        self.parallel_batches = parallel_batches
        self.encode = _encoder(tokenizer)
        self._rust = isinstance(self.encode, _Rust)
        self.column = column
        self.output = output
        self.eos_id = eos_id
        self.keep = tuple(keep)

    def __call__(self, table: pa.Table) -> Staged:
        if self.column not in table.column_names:
            raise ConfigError(
                f"Tokenize(column={self.column!r}): the batch has columns "
                f"{table.column_names}; name the text column"
            )
        column = table.column(self.column)
        if self._rust and not (
            pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        ):
            raise ConfigError(
                f"Tokenize(column={self.column!r}) is {column.type}, not text: a tokenizers "
                "tokenizer encodes strings; name the text column, or convert it first (a "
                "transform before, or a callable tokenizer that takes these values)"
            )
        texts = column.to_pylist()
        if any(t is None for t in texts):
            raise ConfigError(
                f"column {self.column!r} holds null texts; fill or filter them before Tokenize"
            )
        ids = self.encode(texts)
        lengths, flat = _flat(ids, self._rust, self.eos_id)
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = pa.ListArray.from_arrays(
            _int_array(offsets, pa.int32()), _int_array(flat, pa.int32())
        )
        meta = None if self.eos_id is None else {EOS_KEY: str(self.eos_id).encode()}
        field = pa.field(self.output, tokens.type, metadata=meta)
        out = table.select(list(self.keep)).append_column(field, tokens)
        out = out.append_column("num_tokens", _int_array(lengths, pa.int64()))
        return Staged(out, np.arange(table.num_rows, dtype=np.int64))


__all__ = ["EOS_KEY", "MAX_ID", "Tokenize"]
