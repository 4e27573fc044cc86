"""Tokenizing as a stage: a batch's texts -> token ids, where transforms run (the reader pool).

:class:`Tokenize` takes any tokenizer: a Hugging Face ``tokenizers.Tokenizer``, a
``transformers`` fast tokenizer (its Rust tokenizer is used directly), or any callable from
a list of texts to a list of token id lists (or to a dict holding them as ``"input_ids"``).
A Rust tokenizer encodes each document's own tokens, without its special tokens (its
post-processor's template: a BOS before each document with Llama's), unless
``special_tokens=True``; packed documents are separated by ``eos_id``.
One output row per input row: the token ids as a ``list<int32>`` column and their count,
beside the columns kept. Packing them into sequences (:mod:`ingest.core.packing`) is the
next stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.engine.stage import RowError, Stage, Staged, checked_version, function_id
from ingest.formats.arrays import first_null, ints

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


def _encodings(batch: Callable[..., Any], texts: list[str], special: bool) -> Sequence[Any]:
    """``batch`` (a Rust tokenizer's batch encoding) of ``texts``: an encoding per text, its
    ids as ``ids``. A function of the module, not a closure: a closure is pickled with the
    globals it names (the lock)."""
    with _Encoding.lock:
        return batch(texts, add_special_tokens=special)  # type: ignore[no-any-return]


def _backend(tokenizer: Any) -> Any:
    """A ``transformers`` fast tokenizer's Rust tokenizer; any other tokenizer as it is."""
    return getattr(tokenizer, "backend_tokenizer", None) or tokenizer


def _encoder(tokenizer: Any, special: bool) -> Callable[[list[str]], Sequence[Sequence[int]]]:
    """A function from texts to token id lists, for ``tokenizer`` (``special``: a Rust
    tokenizer's special tokens added)."""
    tokenizer = _backend(tokenizer)
    fast = getattr(tokenizer, "encode_batch_fast", None)  # tokenizers: no offsets computed
    batch = fast or getattr(tokenizer, "encode_batch", None)
    if batch is not None:
        return _Rust(batch, special)
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

    def __init__(self, batch: Callable[..., Any], special: bool) -> None:
        self.batch = batch
        self.special = special

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in _encodings(self.batch, texts, self.special)]

    def flat(
        self, texts: list[str], eos_id: int | None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
        """:func:`_flat` of the ids of ``texts``, each encoding's converted as it comes
        (:func:`_packed`)."""
        encodings = _encodings(self.batch, texts, self.special)
        return _packed((e.ids for e in encodings), len(encodings), eos_id)


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


def _flat(
    ids: Sequence[Sequence[int]], eos_id: int | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """Every document's ids, each followed by ``eos_id`` (unless None), one after another,
    checked to be ids; and each document's count (``eos_id`` included).

    Python lists (a Rust tokenizer's) go to ``int32`` one list at a time (:func:`_packed`).
    Anything else (a callable's arrays) goes one array per document, joined, then
    ``eos_id`` put in.

    Raises:
        RowError: Naming the document (its row in the batch) of the first id that is not an
            integer in ``[0, MAX_ID]``.
    """
    if all(type(i) is list for i in ids):
        return _packed(ids, len(ids), eos_id)
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    flat = _flat_arrays(ids, lengths)
    if eos_id is None:
        return lengths, flat
    lengths += 1
    with_eos = np.full(int(lengths.sum()), eos_id, dtype=np.int32)
    keep = np.ones(len(with_eos), dtype=bool)
    keep[np.cumsum(lengths) - 1] = False
    with_eos[keep] = flat
    return lengths, with_eos


def _packed(
    lists: Iterable[Sequence[int]], count: int, eos_id: int | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]:
    """:func:`_flat` of ``count`` lists of ids: each list, with ``eos_id`` after it, made
    ``int32`` bytes by one :func:`struct.pack`, which refuses an id that is not an integer
    (a float, a text) or does not fit ``int32``; the bytes joined; negative ids refused by
    one minimum.

    Measured on 1,000 documents of ``benchmarks/tokenize_pack.py`` (the tokenizer's own ids
    as lists: 3.8 ms for the toy one, 17.9 ms for the byte-level one): 4.1 ms and 7.6 ms,
    against 6.8 ms and 11.2 ms joining the lists into one and converting it with
    ``np.fromiter`` (``array.array.fromlist``: 5.6 ms and 8.3 ms). And each list is
    converted as it comes: a Rust tokenizer's batch of lists held at once (1,000 of them)
    made Python's collector walk every id in them, 9 ms per 4,000 documents (its first
    generation is collected every 700 containers made).
    """
    pack = struct.pack
    end = () if eos_id is None else (eos_id,)
    lengths = np.empty(count, np.int64)
    parts: list[bytes] = []
    for n, ids in enumerate(lists):
        try:
            parts.append(pack(f"={len(ids) + len(end)}i", *ids, *end))
        except struct.error:
            _integers(n, ids)
            raise  # pragma: no cover - _integers names the id
        lengths[n] = len(ids)
    lengths += len(end)
    flat = np.frombuffer(b"".join(parts), np.int32)
    if len(flat) and flat.min() < 0:
        _in_range(lengths, flat)
    return lengths, flat


def _flat_arrays(
    ids: Sequence[Sequence[int]], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    """:func:`_flat` of anything but lists: one array per document, checked, joined;
    ``lengths``: their lengths."""
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
    flat = np.concatenate(parts).astype(np.int64, copy=False)
    _in_range(lengths, flat)
    return flat.astype(np.int32)


_FIX = (
    f"token ids must be integers in [0, {MAX_ID}]: return the vocabulary's ids (the "
    "tokenizer or its output is not the one meant)"
)


def _integers(n: int, ids: Iterable[Any]) -> None:
    """Refuse the ids of document ``n`` if one is not a Python (or numpy) integer in ``[0,
    MAX_ID]``, naming it."""
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise RowError(n, f"the tokenizer's id {_short(i)} is not an integer", _FIX)
        if not 0 <= i <= MAX_ID:
            raise RowError(n, f"the tokenizer's id {i} is out of range", _FIX)


def _in_range(lengths: npt.NDArray[np.int64], flat: npt.NDArray[np.integer]) -> None:
    """Refuse the tokenizer's ids in ``flat`` out of ``[0, MAX_ID]``, naming the document of
    the first one (``lengths``: the documents' lengths in ``flat``)."""
    check_ids(flat, lengths, "the tokenizer's id", _FIX)


_MADE_FIX = (
    f"token ids are integers in [0, {MAX_ID}]: the vocabulary's ids (the column holds "
    "something else, or was written with another type)"
)


def check_ids(
    flat: npt.NDArray[np.integer],
    lengths: npt.NDArray[np.int64],
    what: str = "token id",
    fix: str = _MADE_FIX,
) -> None:
    """Refuse ids in ``flat`` out of ``[0, MAX_ID]``, naming the row of the first one
    (``lengths``: the rows' id counts): token ids made before packing (a column of them, no
    :class:`Tokenize`), or a tokenizer's (:func:`_in_range`, ``what`` and ``fix`` its own).

    Raises:
        RowError: Naming the row in the batch, for the feed or the packer to name its shard.
    """
    if len(flat) and (flat.min() < 0 or flat.max() > MAX_ID):
        bad = int(np.flatnonzero((flat < 0) | (flat > MAX_ID))[0])
        row = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
        raise RowError(row, f"{what} {int(flat[bad])} is out of range", fix)


REVISION = 1
"""Part of :meth:`Tokenize.fingerprint`: bumped when Tokenize's output for the same tokenizer
and options changes (its columns, their types, where ``eos_id`` goes), so that the derived
copies an older one made are never read."""


def default_parallel_batches() -> int:
    """:class:`Tokenize`'s batches tokenized at once by default: 2 where this process may
    run on more than two CPUs, else 1.

    The second batch's ids are made arrays while the first is encoded, and the encoding
    takes every core already (rayon): on two, the overlap bought no wall time and cost the
    threads' switching, about 20 ms of CPU per epoch of ``benchmarks/tokenize_pack.py``
    (its toy tokenizer: 0.87x the tokenizer's tokens per CPU second with two, 0.90x with
    one, the same tokens per second; issue 32)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform (macOS)
        cpus = os.cpu_count() or 1
    return 2 if cpus > 2 else 1


class Tokenize(Stage):
    """Token ids of a text column (see the module docstring).

    Where the process has more than two CPUs, two batches are tokenized at once
    (``parallel_batches``): while a Rust tokenizer encodes one on every core without the
    GIL, the other's ids become arrays and the feed cuts the next batch (one encoding runs
    at a time). On two CPUs or fewer, one (:func:`default_parallel_batches`). Pass
    ``parallel_batches=1`` for a callable that is not thread-safe.

    Args:
        tokenizer: The tokenizer (see the module docstring).
        column: The text column.
        output: The name of the token id column (``list<int32>``).
        eos_id: A token appended to every document (an end of text), or None.
        keep: Other input columns kept beside the ids (the text column is dropped unless
            named here).
        parallel_batches: Batches tokenized at once, in threads (see above); None:
            :func:`default_parallel_batches`.
        version: For a callable tokenizer, which has no serialized form: a str you change
            whenever what it computes changes, so that the derived cache (``derived=``)
            keeps its output (:meth:`fingerprint`); a Rust tokenizer needs none (given one,
            its copies are made anew when it changes).
        special_tokens: Whether a Rust tokenizer adds its special tokens (its
            post-processor's template, as it does by default: a BOS before each document
            with Llama's). False: each document's own tokens (``eos_id`` separates packed
            documents). A callable adds what it adds: refused with it.
    """

    def __init__(
        self,
        tokenizer: Any,
        column: str = "text",
        *,
        output: str = "input_ids",
        eos_id: int | None = None,
        keep: Sequence[str] = (),
        parallel_batches: int | None = None,
        version: str | None = None,
        special_tokens: bool = False,
    ) -> None:
        if version is not None:
            checked_version("Tokenize", version)
        if parallel_batches is None:
            parallel_batches = default_parallel_batches()
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
        self.version = version
        self.tokenizer = tokenizer
        self.special_tokens = bool(special_tokens)
        self.encode = _encoder(tokenizer, self.special_tokens)
        self._rust = isinstance(self.encode, _Rust)
        if self.special_tokens and not self._rust:
            raise ConfigError(
                "Tokenize(special_tokens=True) is for a tokenizers or transformers tokenizer: "
                "a callable adds what it adds; add the special tokens in it"
            )
        self.column = column
        self.output = output
        self.eos_id = eos_id
        self.keep = tuple(keep)

    def fingerprint(self) -> str | None:
        """What this stage computes, for the derived cache: the SHA-256 of the tokenizer's
        serialized form (``tokenizers.Tokenizer.to_str()``), ``column``, ``output``,
        ``eos_id``, ``keep`` and :data:`REVISION`; ``parallel_batches`` is left out (it
        changes how fast, not what). A callable tokenizer, which has no serialized form to
        compare, is named by its ``version`` (and :func:`~ingest.engine.stage.function_id`)
        instead; None without one: its chain is not cached. A ``transformers`` fast
        tokenizer's serialized form is its ``backend_tokenizer``'s."""
        to_str = getattr(_backend(self.tokenizer), "to_str", None)
        if to_str is None and self.version is None:
            return None
        fields: dict[str, Any] = {
            "revision": REVISION,
            "column": self.column,
            "output": self.output,
            "eos_id": None if self.eos_id is None else int(self.eos_id),
            "keep": list(self.keep),
        }
        if to_str is not None:
            fields["tokenizer"] = hashlib.sha256(str(to_str()).encode()).hexdigest()
        else:
            fields["function"] = function_id(self.tokenizer)
        if self.version is not None:  # (a Rust tokenizer's: to make its copies anew)
            fields["version"] = self.version
        if self.special_tokens:  # (only then: the keys of copies made without stay)
            fields["special_tokens"] = True
        return json.dumps(fields, sort_keys=True)

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
        if column.null_count:  # the feed names the document's shard and row (RowError.at)
            raise RowError(
                first_null(column),
                f"column {self.column!r} holds a null text (or the document has no such key)",
                "fill or filter null texts before Tokenize (a Filter stage before it)",
            )
        texts = column.to_pylist()
        if isinstance(self.encode, _Rust):
            lengths, flat = self.encode.flat(texts, self.eos_id)
        else:
            lengths, flat = _flat(self.encode(texts), self.eos_id)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        tokens = pa.ListArray.from_arrays(ints(offsets, pa.int32()), ints(flat, pa.int32()))
        meta = None if self.eos_id is None else {EOS_KEY: str(self.eos_id).encode()}
        field = pa.field(self.output, tokens.type, metadata=meta)
        out = table.select(list(self.keep)).append_column(field, tokens)
        out = out.append_column("num_tokens", ints(lengths, pa.int64()))
        return Staged(out, np.arange(table.num_rows, dtype=np.int64))


__all__ = ["EOS_KEY", "MAX_ID", "Tokenize", "default_parallel_batches"]
