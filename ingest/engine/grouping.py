"""How a packing rank regroups its documents' tokens into batches: the seam of that node.

A packing rank (:class:`ingest.engine.pack.PackedRank`, driven by every transport: a
:class:`ingest.Stream`, an :class:`ingest.DataLoader`'s main process, a Ray rank through
:mod:`ingest.distributed.rank_pack`) owns what makes its batches exact whatever the
grouping: documents numbered as they come, each read step acked once its documents all left,
the offsets of documents cut across batches in the state, equal steps on Ray ranks, the
surplus of an epoch carried. What goes with what is the grouping's alone, given by the
stream's ``pack=`` settings through the :class:`Grouping` protocol:

- :class:`ingest.Pack`: sequences of ``seq_len`` tokens (best-fit or greedy), ``batch_size``
  of them a batch (:mod:`ingest.core.packing`);
- :class:`ingest.TokenBatches`: whole documents of similar length, at most ``max_tokens`` a
  batch with their padding (:mod:`ingest.engine.token_batches`).

A grouping's contract, which the rank's exactness rests on: the pieces of one document leave
in token order (what a prefix of the batches consumed of a document is a prefix of its
tokens: one offset), and what is grouped with what is a function of the documents added
alone (a resume packs them again).

Pure: no torch, no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ingest.core.errors import ConfigError
from ingest.core.packing import Packed
from ingest.core.validate import COUNT, Number, check_numbers
from ingest.engine.tokenize import MAX_ID

Group = Packed
"""A group the grouper closed: its pieces ``(key, start, stop, last)``, their tokens and
their size (a sequence for :class:`ingest.Pack`, a batch for :class:`ingest.TokenBatches`)."""


class Grouper(Protocol):
    """Documents in, closed groups out, online (:class:`ingest.core.packing.Packer` is one).

    ``key`` numbers the documents in the order they are added; a document that resumes at
    its token ``start`` is added from there (its tokens before were consumed)."""

    def add(self, key: int, tokens: npt.ArrayLike, start: int = 0) -> list[Group]:
        """Take document ``key``'s ``tokens``; the groups that closes, in order."""
        ...

    def flush(self) -> list[Group]:
        """Close every open group (the end of the input); the groups, in order."""
        ...

    def close_before(self, key: int) -> list[Group]:
        """Close the open groups holding a document added before ``key``; in order."""
        ...


@dataclass(frozen=True, slots=True)
class Collated:
    """Groups as one batch of arrays, before torch: ``arrays`` by name (an int stays an
    int), ``pieces`` ``(row, key, start, stop, last)`` per piece in order (``row``: the
    batch's row the piece fills), and the tokens that are not padding."""

    arrays: dict[str, npt.NDArray[np.generic] | int]
    pieces: npt.NDArray[np.int64]
    real_tokens: int
    size: int
    """Tokens in the batch, padding included."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Documents:
    """The settings every grouping shares (:class:`ingest.Pack` and
    :class:`ingest.TokenBatches` say what each does): ``column``, ``pad_id``, ``read_rows``,
    ``max_lag``, ``provenance``."""

    column: str = "input_ids"
    pad_id: int | None = None
    read_rows: int = 256
    max_lag: int = 2
    provenance: bool = False

    def check_documents(self, owner: str) -> None:
        """Refuse shared settings out of range, naming ``owner`` (the settings' class)."""
        check_numbers(
            self,
            owner,
            read_rows=COUNT,
            max_lag=Number(0, whole=True),
            pad_id=Number(0, whole=True, optional=True),
        )
        if self.pad_id is not None and self.pad_id > MAX_ID:
            raise ConfigError(f"{owner}(pad_id={self.pad_id}) must be a token id, at most {MAX_ID}")


class Grouping(Protocol):
    """A stream's ``pack=`` settings, as its packing rank uses them (see the module
    docstring); :class:`ingest.Pack` and :class:`ingest.TokenBatches` are the two."""

    @property
    def column(self) -> str:
        """The token id column."""
        ...

    @property
    def pad_id(self) -> int | None:
        """The padding id (None: the ``eos_id`` the ids were made with, else 0)."""
        ...

    @property
    def read_rows(self) -> int:
        """Documents per read step (the book's step)."""
        ...

    @property
    def max_lag(self) -> int:
        """Read steps a document may wait in an open group."""
        ...

    @property
    def provenance(self) -> bool:
        """Add ``pieces`` (where each token came from) to every batch."""
        ...

    def grouper(self, batch_size: int) -> Grouper:
        """A new grouper, for a stream of ``batch_size``."""
        ...

    def per_batch(self, batch_size: int) -> int:
        """Groups per batch, for a stream of ``batch_size``."""
        ...

    def collate(self, groups: Sequence[Group], pad_id: int) -> Collated:
        """``groups`` as one batch, padded with ``pad_id``."""
        ...


__all__ = ["Collated", "Documents", "Group", "Grouper", "Grouping"]
