"""The settings of packing (:class:`Pack`) and what a packing stream's transform adds to each
row (:func:`with_origin`); the packing itself is :mod:`ingest.engine.pack`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.core.packing import Method, Packer, collate
from ingest.core.validate import COUNT, check_numbers
from ingest.engine.grouping import Collated, Documents, Group, Grouping
from ingest.engine.transform import parallel_batches, staged
from ingest.formats.arrays import ints

MAX_SEQ_LEN = 1 << 24
"""The longest sequence :class:`Pack` makes (16,777,216 tokens): longer is a mistake, not a
context length (10**9 allocated 7.45 GiB a batch before failing)."""

ORIGIN = "__ingest_origin"
"""The column a packing stream's transform adds: each row's position in its read step (the
row it came from), so that a filter's survivors keep their provenance."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pack(Documents):
    """Pack token ids into sequences of ``seq_len`` (``ingest.Stream(..., pack=Pack(...))``).

    The stream's ``batch_size`` is then sequences per batch. Each batch holds ``input_ids``,
    ``labels`` (-100 on the first token of every document piece and on padding: no target
    crosses a document boundary), ``position_ids`` (from 0 at every piece), ``cu_seqlens``
    (int32 boundaries of the pieces in the batch flattened to one row, as FlashAttention's
    varlen kernels and Hugging Face's ``DataCollatorWithFlattening`` take them) and
    ``max_seqlen``; see :mod:`ingest.core.packing`.

    Attributes:
        seq_len: Tokens per sequence.
        method: ``"best_fit"`` (documents longer than ``seq_len`` cut at ``seq_len`` first,
            then each remainder into the open sequence it fills best) or ``"greedy"``
            (concatenate and cut every ``seq_len`` tokens).
        max_open: Best-fit: sequences open at once (more: fuller, more tokens held).
        column: The token id column (a list of integers per row): ``Tokenize``'s output, or
            a column of the data.
        pad_id: The token id of padding (its labels are -100). None (the default): the
            ``eos_id`` of the :class:`ingest.Tokenize` that made the ids; with none (ids
            from a column of the data, or no ``eos_id``), 0, with a warning: id 0 is a
            token of most vocabularies, so name your tokenizer's pad or end-of-text id.
        read_rows: Documents per read step (the book's step, acked whole; see the module
            docstring). The epoch's last fewer than ``read_rows`` documents are carried into
            the next epoch, as a stream's remainder is.
        max_lag: Read steps a document may wait in an open sequence: a sequence holding one
            from before the last ``max_lag`` read steps is closed (padded). A read step is
            acked once all its documents left, so this bounds the documents a state lists
            (about ``max_lag + 1`` read steps of them) and the acks held back, for some
            padding (``benchmarks/pack_state.py``).
        provenance: Add ``pieces`` to every batch: an int64 tensor of one row per document
            piece, ``(sequence, shard, row, start, stop)``: tokens ``[start, stop)`` of row
            ``row`` of the epoch listing's shard ``shard`` (:func:`ingest.list_shards` order)
            fill that part of the sequence. A job can count every token it trained on.
    """

    seq_len: int
    method: Method = "best_fit"
    max_open: int = 64

    def __post_init__(self) -> None:
        check_numbers(self, "Pack", seq_len=COUNT, max_open=COUNT)
        self.check_documents("Pack")
        if self.seq_len > MAX_SEQ_LEN:
            raise ConfigError(
                f"Pack(seq_len={self.seq_len}) is more than {MAX_SEQ_LEN:,} tokens: a batch "
                f"holds three int64 arrays of batch_size x seq_len ({self.seq_len * 8:,} bytes "
                "a sequence each); pass the model's context length"
            )
        Packer(self.seq_len, self.method, self.max_open)  # checks the method

    def grouper(self, batch_size: int) -> Packer:
        """A new packer (:class:`ingest.engine.grouping.Grouping`): groups are sequences."""
        return Packer(self.seq_len, self.method, self.max_open)

    def per_batch(self, batch_size: int) -> int:
        """Sequences per batch: the stream's ``batch_size``."""
        return batch_size

    def collate(self, groups: Sequence[Group], pad_id: int) -> Collated:
        """The sequences as ``(len(groups), seq_len)`` arrays
        (:func:`ingest.core.packing.collate`)."""
        batch = collate(groups, self.seq_len, pad_id)
        return Collated(
            arrays={
                "input_ids": batch.input_ids,
                "labels": batch.labels,
                "position_ids": batch.position_ids,
                "cu_seqlens": batch.cu_seqlens,
                "max_seqlen": batch.max_seqlen,
            },
            pieces=batch.pieces,
            real_tokens=sum(group.size for group in groups),  # (its pieces' tokens)
            size=batch.input_ids.size,
        )


def with_origin(fn: Callable[[pa.Table], Any] | None) -> Callable[[pa.Table], pa.Table]:
    """The transform of a packing stream: ``fn``'s rows (all the batch's, without ``fn``)
    with each one's input row in :data:`ORIGIN` (as many batches at once as ``fn`` allows).

    Raises:
        ConfigError: If ``fn`` makes several rows of one input row, or another number of rows
            without being a stage.
    """
    return _WithOrigin(fn, parallel_batches(fn))


@dataclass(frozen=True, slots=True)
class _WithOrigin:
    fn: Callable[[pa.Table], Any] | None
    parallel_batches: int

    def __call__(self, table: pa.Table) -> pa.Table:
        fn = self.fn
        if fn is None:
            out, origin = table, np.arange(table.num_rows, dtype=np.int64)
        else:
            got = staged(fn, table)
            out, origin = got.table, got.origin
            if got.part is not None or (len(origin) > 1 and not np.diff(origin).all()):
                name = getattr(fn, "__qualname__", type(fn).__qualname__)
                raise ConfigError(
                    f"stage {name} made several rows of one input row, before Pack: "
                    "packing cuts documents itself; pass Pack whole documents (filter "
                    "them if need be, do not split them)"
                )
        return out.append_column(ORIGIN, ints(origin))


def check_read(pack: Grouping | None, read: Any) -> None:
    """Refuse a packing stream whose ``ReadOptions`` quarantine rows."""
    if pack is not None and read is not None and read.on_error != "raise":
        raise ConfigError(
            f'pack with ReadOptions(on_error="{read.on_error}"): packing does not take '
            'quarantined rows yet; read with on_error="raise"'
        )


__all__ = ["MAX_SEQ_LEN", "ORIGIN", "Pack", "check_read", "with_origin"]
