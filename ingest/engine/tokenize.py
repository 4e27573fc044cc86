"""Tokenizing as a stage: a batch's texts -> token ids, where transforms run (the reader pool).

:class:`Tokenize` takes any tokenizer: a Hugging Face ``tokenizers.Tokenizer``, a
``transformers`` fast tokenizer (its Rust tokenizer is used directly), or any callable from
a list of texts to a list of token id lists (or to a dict holding them as ``"input_ids"``).
One output row per input row: the token ids as a ``list<int32>`` column and their count,
beside the columns kept. Packing them into sequences (:mod:`ingest.core.packing`) is the
next stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.engine.stage import Stage, Staged

_ENCODING = threading.Lock()
"""One Rust batch encoding at a time in a process: one already runs on every core (rayon),
and two at once contend for them (measured here: a reader's epoch took up to 4.1 CPU
seconds, against 3.2 to 3.6 one at a time). Batches
tokenized at once (``parallel_batches``) overlap the rest: the ids made Python lists and
arrays, the feed's cutting."""


def _ids(batch: Callable[..., Any], texts: list[str]) -> list[list[int]]:
    """``batch`` (a Rust tokenizer's batch encoding) of ``texts``, as id lists. A function of
    the module, not a closure: a closure is pickled with the globals it names (the lock)."""
    with _ENCODING:
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
        return lambda texts: _ids(batch, texts)
    if not callable(tokenizer):
        raise ConfigError(
            f"tokenizer {tokenizer!r} is neither a tokenizers.Tokenizer, a transformers fast "
            "tokenizer nor a callable from a list of texts to lists of token ids"
        )

    def call(texts: list[str]) -> Sequence[Sequence[int]]:
        out = tokenizer(texts)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return out  # type: ignore[no-any-return]

    return call


def _int_array(values: npt.NDArray[Any], kind: pa.DataType) -> pa.Array:
    """A numpy array as an Arrow array over its memory (``pa.array`` would import pandas)."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _flat(ids: Sequence[Sequence[int]]) -> npt.NDArray[np.int32]:
    """Every document's ids, one after another.

    Python lists (a Rust tokenizer's) are joined into one list, then converted once: 8.7 ms
    for 1,000 documents (457 k tokens), against 11.5 ms for an array per document and a
    concatenation, and 16.5 ms for ``np.fromiter`` over a chain of them. Anything else (a
    callable's arrays) goes one array per document."""
    if all(type(i) is list for i in ids):
        every: list[int] = []
        for i in ids:
            every.extend(i)
        return np.fromiter(every, np.int32, len(every))
    parts = [np.asarray(i, dtype=np.int32) for i in ids]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


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
        self.parallel_batches = parallel_batches
        self.encode = _encoder(tokenizer)
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
        texts = table.column(self.column).to_pylist()
        if any(t is None for t in texts):
            raise ConfigError(
                f"column {self.column!r} holds null texts; fill or filter them before Tokenize"
            )
        ids = self.encode(texts)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        flat = _flat(ids)
        if self.eos_id is not None:  # one more token at the end of every document
            lengths += 1
            ends = np.cumsum(lengths) - 1
            with_eos = np.full(int(lengths.sum()), self.eos_id, dtype=np.int32)
            keep = np.ones(len(with_eos), dtype=bool)
            keep[ends] = False
            with_eos[keep] = flat
            flat = with_eos
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = pa.ListArray.from_arrays(
            _int_array(offsets, pa.int32()), _int_array(flat, pa.int32())
        )
        out = table.select(list(self.keep)).append_column(self.output, tokens)
        out = out.append_column("num_tokens", _int_array(lengths, pa.int64()))
        return Staged(out, np.arange(table.num_rows, dtype=np.int64))


__all__ = ["Tokenize"]
