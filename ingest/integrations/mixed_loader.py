"""An :class:`ingest.DataLoader` over a stream of an :class:`ingest.Mix`: one loader per
source, each with its own worker processes reading that source's shares (and packing, with
``pack``: the workers tokenize, this process packs), their draws mixed here by the stream's
:class:`ingest.engine.mix.Mixer` (see :mod:`ingest.engine.mix`).

Each source's loader hands out one sequence (or one row) at a time (its stream's
``batch_size`` is 1), so every slot of a batch is a draw from the source the mixture chose,
as in the stream itself; states cover every source's loader and the mixture's counts, and
load into any worker count, a ``Stream`` or a ``RayStream`` over the same mix.

With ``pin_memory=True``, the mixture's batches are pinned as they leave (a join makes new
tensors, which would lose the draws' pinning); the sources' loaders pin nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch.utils.data

from ingest.engine.convert import Batch, placed
from ingest.engine.mix import Draws, load_mixed, mixed_state

if TYPE_CHECKING:
    from ingest.engine.mixed_stream import MixedStream
    from ingest.integrations.loader import DataLoader


class MixedLoader:
    """The sources' loaders and the mixer of their draws (the stream's own: the stream's
    state and the loader's stay one).

    Args:
        mixed: The stream's sources and mixer.
        make: Builds a source's loader from its stream.
    """

    def __init__(self, mixed: MixedStream, make: Any) -> None:
        self.mixed = mixed
        self.loaders: dict[str, DataLoader] = {n: make(s) for n, s in mixed.streams.items()}
        self.pin_memory = any(loader.pin_memory for loader in self.loaders.values())
        """The loader's ``pin_memory``, taken from the sources' loaders (see the module
        docstring)."""
        for loader in self.loaders.values():
            loader.pin_memory = False
        self.draws = Draws(
            lambda name: iter(self.loaders[name]),
            lambda name: mixed.streams[name].epoch,
            lambda name: str(mixed.mix.sources[name]),
        )

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of the mixture, or the rest of the one a loop left."""
        for batch in self.mixed.mixer.epoch_batches(self.draws.pull):
            yield placed(batch, self.pin_memory, None)

    def state_dict(self) -> dict[str, Any]:
        parts = {name: loader.state_dict() for name, loader in self.loaders.items()}
        return mixed_state(parts, self.mixed.mixer)

    def close(self) -> None:
        """Stop every source's worker processes (the next loop starts new ones)."""
        self.draws.drop()
        for loader in self.loaders.values():
            loader.close()

    def load_state_dict(self, state: Mapping[str, Any] | str) -> None:
        parsed = load_mixed(state, self.mixed.mixer)
        self.draws.drop()
        for name, loader in self.loaders.items():
            loader.load_state_dict(parsed.parts[name].to_json())


class Nothing(torch.utils.data.IterableDataset[Batch]):
    """The dataset torch's ``DataLoader`` is built with when the mixed loader does the work."""

    def __iter__(self) -> Iterator[Batch]:
        return iter(())


__all__ = ["MixedLoader", "Nothing"]
