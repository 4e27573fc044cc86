"""Token-budget batches: whole documents of similar length, at most ``max_tokens`` a batch.

Variable-length training wants batches of a fixed number of tokens, not of documents: a
batch of long documents holds fewer of them, one of short documents more, and each is
padded only to its own longest row (fairseq's ``max_tokens``, bucketing by length).
``ingest.Stream(url, transform=ingest.Tokenize(...), pack=ingest.TokenBatches(max_tokens=
16384))`` makes them, on every transport, exact through stops and resumes at any world
size: :class:`TokenBatches` is a :class:`~ingest.engine.grouping.Grouping`, so the packing
rank (:class:`ingest.engine.pack.PackedRank`) does the rest as it does for
:class:`ingest.Pack` (acks, the offsets of documents in flight in the state, equal steps on
Ray ranks, the epoch's surplus carried).

How documents are grouped (:class:`TokenBatcher`, online, a function of the documents alone):

- A document lands in the bucket of its length, ``ceil(log(n) / log(spread))``: the rows of
  one batch differ in length by at most the factor ``spread`` (1.25: a row is padded by at
  most a fifth of its length).
- Each bucket fills one batch: it closes when one more row as long as its longest would pass
  ``max_tokens`` (rows x longest row, padding included), or when it holds ``batch_size``
  rows (the stream's; 1,024 by default, so usually the tokens bound).
- A document longer than ``max_tokens`` is cut: each whole ``max_tokens`` chunk is a batch
  of one row at once, its remainder goes to its bucket (pieces leave in token order, as the
  packing rank needs).
- A bucket holding a document from before the last ``max_lag`` read steps is closed as it
  is (a short batch), so a state lists few documents; the epoch's end closes them all.

A batch holds ``input_ids`` ``(rows, longest)``, padded with the pad id, ``attention_mask``
(1 on tokens), ``labels`` (the ids, -100 on padding; the model shifts them) and
``position_ids`` (from 0 on every row), plus ``pieces`` with ``provenance=True``
(``(row, shard, row of the shard, start, stop)`` per row). ``batch_size`` sequences per
batch does not apply: the number of rows varies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingest.core.errors import ConfigError
from ingest.core.packing import IGNORE, Outbox, Packed
from ingest.core.validate import COUNT, Number, check_numbers
from ingest.engine.grouping import Collated, Documents, Group


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenBatches(Documents):
    """Batch whole documents by tokens (``pack=ingest.TokenBatches(max_tokens=...)``): see the
    module docstring.

    Attributes:
        max_tokens: Tokens a batch holds at most, padding included (rows x longest row).
        spread: Most a batch's longest row may be over its shortest (a factor above 1):
            lower pads less and makes more, shorter batches.
        column: The token id column (a list of integers per row).
        pad_id: The padding id (labels -100 there). None: the ``eos_id`` of the
            :class:`ingest.Tokenize` that made the ids; with none, 0, with a warning.
        read_rows: Documents per read step (the book's step, acked whole).
        max_lag: Read steps a document may wait in an open batch before the batch is closed
            short (bounds the documents a state lists).
        provenance: Add ``pieces`` to every batch: ``(row, shard, row, start, stop)`` per
            row, tokens ``[start, stop)`` of the listing's shard's row.
    """

    max_tokens: int
    spread: float = 1.25

    def __post_init__(self) -> None:
        check_numbers(self, "TokenBatches", max_tokens=COUNT, spread=Number(1, above=True))
        self.check_documents("TokenBatches")

    def grouper(self, batch_size: int) -> TokenBatcher:
        """A new batcher: a group is a batch of at most ``batch_size`` rows."""
        return TokenBatcher(self.max_tokens, batch_size, self.spread)

    def per_batch(self, batch_size: int) -> int:
        """One group per batch: each is a whole batch."""
        return 1

    def collate(self, groups: Sequence[Group], pad_id: int) -> Collated:
        """One row per piece with tokens, padded to the longest (see the module docstring)."""
        tokens = [t for group in groups for t in group.tokens]
        rows, longest = len(tokens), max((len(t) for t in tokens), default=0)
        input_ids = np.full((rows, longest), pad_id, dtype=np.int64)
        mask = np.zeros((rows, longest), dtype=np.int64)
        for r, ids in enumerate(tokens):
            input_ids[r, : len(ids)] = ids
            mask[r, : len(ids)] = 1
        pieces: list[tuple[int, int, int, int, int]] = []
        base = 0
        for group in groups:
            filled = len(group.tokens)  # its first pieces have tokens; the rest have none
            for n, p in enumerate(group.pieces):
                row = base + n if n < filled else max(base + filled - 1, 0)
                pieces.append((row, p.key, p.start, p.stop, int(p.last)))
            base += filled
        real = int(mask.sum())
        return Collated(
            arrays={
                "input_ids": input_ids,
                "attention_mask": mask,
                "labels": np.where(mask == 1, input_ids, IGNORE),
                "position_ids": np.broadcast_to(
                    np.arange(longest, dtype=np.int64), (rows, longest)
                ).copy(),
            },
            pieces=np.asarray(pieces, dtype=np.int64).reshape(-1, 5),
            real_tokens=real,
            size=rows * longest,
        )


@dataclass(slots=True)
class _Open:
    group: Packed
    longest: int = 0


class TokenBatcher(Outbox):
    """Groups documents into token-budget batches (a :class:`~ingest.engine.grouping.Grouper`;
    see the module docstring).

    Args:
        max_tokens: Tokens a batch holds at most, padding included.
        max_rows: Rows a batch holds at most.
        spread: The factor between a bucket's shortest and longest lengths.
    """

    def __init__(self, max_tokens: int, max_rows: int, spread: float = 1.25) -> None:
        if max_tokens < 1 or max_rows < 1 or not spread > 1:
            raise ConfigError(
                f"TokenBatcher(max_tokens={max_tokens}, max_rows={max_rows}, spread={spread}): "
                "max_tokens and max_rows must be at least 1, spread above 1"
            )
        super().__init__()
        self.max_tokens = max_tokens
        self.max_rows = max_rows
        self._log_spread = math.log(spread)
        self._open: dict[int, _Open] = {}
        """The open batch of each bucket (a length band)."""

    def bucket(self, n: int) -> int:
        """The bucket of a row of ``n`` tokens."""
        return math.ceil(math.log(n) / self._log_spread) if n > 1 else 0

    def add(self, key: int, tokens: npt.ArrayLike, start: int = 0) -> list[Packed]:
        """Take document ``key``'s ``tokens`` (from its token ``start``); the batches closed."""
        ids = np.asarray(tokens)
        if ids.dtype.kind not in "iu":
            ids = ids.astype(np.int64)
        if start < 0:
            raise ConfigError(f"document {key}: start={start} must be at least 0")
        total, cap = len(ids), self.max_tokens
        if not total:
            return self._no_token_left(key, start)
        at = 0
        while total - at > cap:  # whole chunks first: a document's pieces leave in order
            chunk = Packed()
            chunk.put(key, ids[at : at + cap], start + at, False)
            self._out.append(chunk)
            at += cap
        n = total - at
        bucket = self.bucket(n)
        open_ = self._open.get(bucket)
        if open_ is not None:
            rows = len(open_.group.pieces) + 1
            if rows > self.max_rows or rows * max(open_.longest, n) > cap:
                self._out.append(self._open.pop(bucket).group)
                open_ = None
        if open_ is None:
            open_ = self._open[bucket] = _Open(Packed())
        open_.group.put(key, ids[at:], start + at, True)
        open_.longest = max(open_.longest, n)
        rows = len(open_.group.pieces)
        if rows >= self.max_rows or (rows + 1) * open_.longest > cap:  # no room for another
            self._out.append(self._open.pop(bucket).group)
        return self._take()

    def flush(self) -> list[Packed]:
        """Close every open batch (the end of the input), oldest first."""
        self._out.extend(self._close(lambda first: True))
        return self._flushed()

    def close_before(self, key: int) -> list[Packed]:
        """Close the open batches holding a document added before ``key``, oldest first."""
        self._out.extend(self._close(lambda first: first < key))
        return self._take()

    @property
    def held(self) -> int:
        """Tokens in open batches, not yet out."""
        return sum(o.group.size for o in self._open.values())

    def _close(self, due: Callable[[int], bool]) -> list[Packed]:
        firsts = sorted(
            (o.group.pieces[0].key, bucket)
            for bucket, o in self._open.items()
            if due(o.group.pieces[0].key)
        )
        return [self._open.pop(bucket).group for _, bucket in firsts]


__all__ = ["TokenBatcher", "TokenBatches"]
