"""Packing documents into sequences of ``seq_len`` tokens, with where every token came from.

Two methods, both online (documents arrive one after another, in the feed's order):

- ``"best_fit"``: a document is first cut at ``seq_len``: each whole ``seq_len`` chunk is a
  sequence of its own, at once. Its remainder goes into the open sequence it fills best (the
  one with the least room that still holds it); with none, a new one is opened, and when
  ``max_open`` are open, the fullest is closed (padded) first. Only documents longer than
  ``seq_len`` are cut (Ding et al. 2024, "Fewer Truncations Improve Language Modeling").
- ``"greedy"``: documents are concatenated and cut every ``seq_len`` tokens. No padding but
  the last sequence's; a document is cut wherever a sequence ends.

Provenance. Every sequence lists its pieces ``(key, start, stop)``: tokens ``[start, stop)``
of the document ``key`` (the source row). Under both methods the pieces of one document
leave in token order (best-fit's whole chunks at once, its remainder later), so the tokens
of a document consumed by any prefix of the sequences are a prefix of it, ``[0, offset)``,
with ``offset`` a multiple of ``seq_len`` under best-fit. A resumed run feeds such a
document again from ``offset`` (:meth:`Packer.add`'s ``start``): the state holds one offset
per document partly consumed, never tokens, and a sequence left open at a stop is packed
again from its documents.

Batches (:func:`collate`) carry ``input_ids``, ``labels`` (the input ids, with -100 on the
first token of every piece and on padding, so no target crosses a document boundary: the
model shifts the labels by one), ``position_ids`` restarting at 0 on every piece, and
``cu_seqlens``, the boundaries of the pieces (and of each sequence's padding) in the batch
flattened to one row, as varlen attention takes them (FlashAttention's ``flash_attn_varlen``,
Hugging Face's ``DataCollatorWithFlattening``).

Pure: numpy only, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from ingest.core.errors import ConfigError

Method = Literal["best_fit", "greedy"]
IGNORE = -100
"""The label of a token that is no target (Hugging Face's and torch's ignore index)."""


class Piece(NamedTuple):
    """Tokens ``[start, stop)`` of document ``key``; ``last``: they end the document.

    A tuple: made for every piece of every sequence, which a frozen dataclass costs twice as
    much CPU to build."""

    key: int
    start: int
    stop: int
    last: bool


@dataclass(slots=True)
class Packed:
    """One sequence: its tokens (at most ``seq_len``, before padding) and its pieces."""

    tokens: list[npt.NDArray[np.int64]] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    size: int = 0

    def put(self, key: int, tokens: npt.NDArray[np.int64], start: int, last: bool) -> None:
        n = len(tokens)
        self.tokens.append(tokens)
        self.pieces.append(Piece(key, start, start + n, last))
        self.size += n


class Outbox:
    """What a grouper closed and not handed on yet, and the documents without a token left,
    which go out with the next group (so they are acked with it): the part every grouper
    shares (:class:`Packer`, :class:`ingest.engine.token_batches.TokenBatcher`)."""

    def __init__(self) -> None:
        self._out: list[Packed] = []
        self._empty: list[Piece] = []

    def _no_token_left(self, key: int, start: int) -> list[Packed]:
        """Document ``key`` has no token from ``start`` on: it leaves with the next group."""
        self._empty.append(Piece(key, start, start, True))
        return self._take()

    def _flushed(self) -> list[Packed]:
        """The groups out at the end of the input (a group of nothing acks the documents
        without a token when no other is left)."""
        if self._empty and not self._out:
            self._out.append(Packed())
        return self._take()

    def _take(self) -> list[Packed]:
        out, self._out = self._out, []
        if out and self._empty:
            out[0].pieces.extend(self._empty)
            self._empty = []
        return out


class Packer(Outbox):
    """Packs documents into sequences of ``seq_len`` tokens (see the module docstring).

    Args:
        seq_len: Tokens per sequence.
        method: ``"best_fit"`` (default) or ``"greedy"``.
        max_open: Best-fit: sequences open at once (more: fuller sequences, more held).
    """

    def __init__(self, seq_len: int, method: Method = "best_fit", max_open: int = 64) -> None:
        if seq_len < 1:
            raise ConfigError(f"seq_len={seq_len} must be at least 1")
        if method not in ("best_fit", "greedy"):
            raise ConfigError(f'method={method!r} must be "best_fit" or "greedy"')
        if max_open < 1:
            raise ConfigError(f"max_open={max_open} must be at least 1")
        super().__init__()
        self.seq_len = seq_len
        self.method = method
        self.max_open = max_open
        self._open: list[Packed] = []
        self._rooms: list[tuple[int, int]] = []
        """Best-fit: ``(room, serial)`` of each open sequence, sorted (room first)."""
        self._by_serial: dict[int, Packed] = {}
        self._serial = 0

    def add(self, key: int, tokens: npt.ArrayLike, start: int = 0) -> list[Packed]:
        """Pack document ``key``'s ``tokens``, which begin at its token ``start`` (after a
        resume, the tokens before it were consumed); the sequences completed, in order."""
        # any integer type, not copied (collate widens them)
        ids = tokens if type(tokens) is np.ndarray else np.asarray(tokens)
        if ids.dtype.kind not in "iu":
            ids = ids.astype(np.int64)
        if start < 0:
            raise ConfigError(f"document {key}: start={start} must be at least 0")
        if not len(ids):
            return self._no_token_left(key, start)
        if self.method == "greedy":
            self._greedy(key, ids, start)
        else:
            self._best_fit(key, ids, start)
        return self._take()

    def add_run(
        self,
        first: int,
        flat: npt.NDArray[Any],
        ends: Seq[int],
        lengths: Seq[int],
        starts: Seq[int],
    ) -> list[Packed]:
        """:meth:`add` of documents ``first``, ``first + 1``, ...: document ``first + k``
        is ``flat[ends[k] - lengths[k] : ends[k]]``, its tokens from ``starts[k]`` on added.
        The sequences completed, in order, as those calls would close them.

        One call for a read step's documents (a thousand): best-fit's loop with its state in
        locals, without a call, a dtype check and a hand-over per document (a packing
        stream's main thread spent a fifth of its time in those with a cheap tokenizer)."""
        if flat.dtype.kind not in "iu":
            flat = flat.astype(np.int64)
        for k, start in enumerate(starts):
            if start < 0:
                raise ConfigError(f"document {first + k}: start={start} must be at least 0")
        if self.method != "best_fit":
            out: list[Packed] = []
            for k, (end, n, start) in enumerate(zip(ends, lengths, starts, strict=True)):
                out += self.add(first + k, flat[end - n + start : end], start)
            return out
        return self._best_fit_run(first, flat, ends, lengths, starts)

    def _best_fit_run(
        self,
        first: int,
        flat: npt.NDArray[Any],
        ends: Seq[int],
        lengths: Seq[int],
        starts: Seq[int],
    ) -> list[Packed]:
        """:meth:`add_run` under best-fit: :meth:`_best_fit` per document, inlined."""
        size, max_open = self.seq_len, self.max_open
        rooms, by_serial, done = self._rooms, self._by_serial, self._out
        bisect_left, insort = bisect.bisect_left, bisect.insort
        taken: list[Packed] = []
        key = first - 1
        for end, n, start in zip(ends, lengths, starts, strict=True):
            key += 1
            total = n - start
            if total <= 0:  # nothing left: it goes with the next sequence closed
                taken += self._take()
                taken += self._no_token_left(key, start)
                done = self._out
                continue
            ids = flat[end - total : end]
            rest = total % size
            if total >= size:  # cut into whole sequences first (most documents are shorter)
                done += self._whole(key, ids, start, total - rest, total)
                if not rest:
                    continue
                ids = ids[total - rest :]
            i = bisect_left(rooms, (rest, -1))
            if i < len(rooms):
                room, serial = rooms.pop(i)
                seq = by_serial[serial]
            else:
                if len(rooms) >= max_open:
                    _, fullest = rooms.pop(0)
                    done.append(by_serial.pop(fullest))
                serial, self._serial = self._serial, self._serial + 1
                seq = by_serial[serial] = Packed()
                room = size
            seq.tokens.append(ids)
            seq.pieces.append(Piece(key, start + total - rest, start + total, True))
            seq.size += rest
            room -= rest
            if room:
                insort(rooms, (room, serial))
            else:
                done.append(by_serial.pop(serial))
        return taken + self._take()

    def _whole(
        self, key: int, ids: npt.NDArray[Any], start: int, whole: int, total: int
    ) -> list[Packed]:
        """Best-fit's whole sequences of a document: its first ``whole`` tokens (of
        ``total``) cut every ``seq_len``."""
        size, out = self.seq_len, []
        for at in range(0, whole, size):
            seq = Packed()
            seq.put(key, ids[at : at + size], start + at, at + size == total)
            out.append(seq)
        return out

    def flush(self) -> list[Packed]:
        """Close every open sequence (the end of the input); the sequences, in order."""
        if self.method == "greedy":
            self._out.extend(self._open)
        else:
            self._out.extend(self._by_serial[serial] for serial in sorted(self._by_serial))
            self._rooms.clear()
            self._by_serial.clear()
        self._open.clear()
        return self._flushed()

    def close_before(self, key: int) -> list[Packed]:
        """Close the open sequences holding a document whose key is below ``key`` (keys in
        the order documents were added: the ones added before it); the sequences, in order.

        A caller whose documents wait in open sequences (a packing stream acks a read step
        only when all its documents left) bounds their wait with it, for some padding."""
        if self.method == "greedy":
            if self._open and self._open[0].pieces and self._open[0].pieces[0].key < key:
                self._out.append(self._open.pop())
            return self._take()
        old = sorted(s for s, seq in self._by_serial.items() if seq.pieces[0].key < key)
        if old:
            gone = set(old)
            self._rooms = [r for r in self._rooms if r[1] not in gone]
            self._out.extend(self._by_serial.pop(serial) for serial in old)
        return self._take()

    @property
    def held(self) -> int:
        """Tokens in open sequences, not yet out."""
        return sum(p.size for p in self._open) + sum(p.size for p in self._by_serial.values())

    def _greedy(self, key: int, ids: npt.NDArray[np.int64], start: int) -> None:
        at, total = 0, len(ids)
        while at < total:
            if not self._open:
                self._open.append(Packed())
            seq = self._open[0]
            n = min(self.seq_len - seq.size, total - at)
            seq.put(key, ids[at : at + n], start + at, at + n == total)
            at += n
            if seq.size == self.seq_len:
                self._out.append(self._open.pop())

    def _best_fit(self, key: int, ids: npt.NDArray[np.int64], start: int) -> None:
        size, total = self.seq_len, len(ids)
        rest = total % size
        whole = total - rest
        if whole:  # (most documents are shorter than a sequence: no chunk, no slice)
            for at in range(0, whole, size):
                seq = Packed()
                seq.put(key, ids[at : at + size], start + at, at + size == total)
                self._out.append(seq)
            if not rest:
                return
            ids = ids[whole:]
        rooms = self._rooms
        i = bisect.bisect_left(rooms, (rest, -1))
        if i < len(rooms):
            room, serial = rooms.pop(i)
            seq = self._by_serial[serial]
        else:
            if len(rooms) >= self.max_open:
                _, fullest = rooms.pop(0)
                self._out.append(self._by_serial.pop(fullest))
            serial, self._serial = self._serial, self._serial + 1
            seq = self._by_serial[serial] = Packed()
            room = size
        seq.put(key, ids, start + whole, True)
        room -= rest
        if room:
            bisect.insort(rooms, (room, serial))
        else:
            self._out.append(self._by_serial.pop(serial))


@dataclass(frozen=True, slots=True)
class Batch:
    """Sequences as arrays (see the module docstring); ``pieces``: ``(sequence, key, start,
    stop, last)`` per piece, in order."""

    input_ids: npt.NDArray[np.int64]
    labels: npt.NDArray[np.int64]
    position_ids: npt.NDArray[np.int64]
    cu_seqlens: npt.NDArray[np.int32]
    max_seqlen: int
    pieces: npt.NDArray[np.int64]

    @property
    def real_tokens(self) -> int:
        """Tokens that are not padding."""
        return int((self.pieces[:, 3] - self.pieces[:, 2]).sum()) if len(self.pieces) else 0


def collate(sequences: Seq[Packed], seq_len: int, pad_id: int = 0) -> Batch:
    """``sequences`` as one batch of ``(len(sequences), seq_len)`` arrays, padded with
    ``pad_id`` (labels -100).

    Python work per sequence and per piece, none per token: the batch flattened to one row
    is the spans of ``cu_seqlens`` one after another (each piece's tokens, then its
    sequence's padding), so the ids are one concatenation of the pieces' arrays and the
    padding, and the positions one of the first ``n`` of ``arange(seq_len)`` per span;
    the labels are the ids with -100 at every span's first token and on the padding.
    Measured on the toy corpus of ``benchmarks/tokenize_pack.py`` (119 batches of 8
    sequences of 2,048, 4 pieces a sequence on average): 8.5 ms, against 14.3 ms with a
    concatenation per row, the positions by ``arange - repeat``, the padding's labels by a
    mask over the batch and the pieces by ``np.asarray`` of their tuples."""
    rows = len(sequences)
    ids: list[npt.NDArray[np.integer]] = []  # per span: each piece's tokens, then padding
    sizes: list[int] = []
    pieces: list[Piece] = []
    counts: list[int] = []  # pieces per sequence
    padding: npt.NDArray[np.int64] | None = None
    for seq in sequences:
        tokens, size = seq.tokens, seq.size
        ids += tokens  # (documents without a token have a piece, no tokens)
        sizes += map(len, tokens)
        pieces += seq.pieces
        counts.append(len(seq.pieces))
        if size < seq_len:
            if padding is None:
                padding = np.full(seq_len, pad_id, dtype=np.int64)
            ids.append(padding[size:])
            sizes.append(seq_len - size)
    input_ids = np.empty((rows, seq_len), dtype=np.int64)
    position_ids = np.empty((rows, seq_len), dtype=np.int64)
    if ids:  # the spans fill every row: each sequence's tokens, then its padding
        np.concatenate(ids, out=input_ids.reshape(-1), casting="unsafe")
        ramp = np.arange(seq_len, dtype=np.int64)
        np.concatenate([ramp[:n] for n in sizes], out=position_ids.reshape(-1))
    cu = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=cu[1:])
    labels = input_ids.copy()
    labels.reshape(-1)[cu[:-1]] = IGNORE
    for r, seq in enumerate(sequences):
        if seq.size < seq_len:
            labels[r, seq.size :] = IGNORE
    table = np.empty((len(pieces), 5), dtype=np.int64)
    table[:, 0] = np.repeat(np.arange(rows), counts)
    table[:, 1:] = np.fromiter(chain.from_iterable(pieces), np.int64, 4 * len(pieces)).reshape(
        -1, 4
    )
    return Batch(
        input_ids=input_ids,
        labels=labels,
        position_ids=position_ids,
        cu_seqlens=cu.astype(np.int32),
        max_seqlen=max(sizes, default=0),
        pieces=table,
    )


def consumed(
    pieces: npt.NDArray[np.int64], before: Mapping[int, int] | None = None
) -> dict[int, int | None]:
    """The tokens of each document that ``pieces`` (rows of :attr:`Batch.pieces`, every
    sequence of a prefix of the output) consumed: its offset, or None when it is done.
    ``before``: the offsets consumed before (a resumed run's documents start there).

    Raises:
        ValueError: If a document's pieces are not consecutive from its first token.
    """
    out: dict[int, int | None] = dict(before or {})
    for _, key, start, stop, last in pieces.tolist():
        at = out.get(key, 0)
        if at is None or start != at:
            raise ValueError(
                f"document {key}: a piece [{start}, {stop}) after {at} tokens consumed; the "
                "pieces of a document must follow each other"
            )
        out[key] = None if last else stop
    return out
