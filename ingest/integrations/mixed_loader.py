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

from ingest.core.errors import ConfigError
from ingest.engine.convert import Batch, placed
from ingest.engine.mix import Draws, load_mixed, mixed_state
from ingest.integrations.loader import DataLoader, checked_keywords

if TYPE_CHECKING:
    from ingest.engine.stream import Stream


class MixedLoader(DataLoader):
    """The sources' loaders and the mixer of their draws (the stream's own: the stream's
    state and the loader's stay one). Made by ``ingest.DataLoader(stream)`` over a stream of
    an :class:`ingest.Mix`; see :class:`ingest.DataLoader` for the members.
    """

    def __init__(self, stream: Stream, *, num_workers: int = 0, **kwargs: Any) -> None:
        keep = checked_keywords(num_workers, kwargs)
        mixed = stream.mixed
        if mixed is None:  # pragma: no cover - DataLoader.__new__ picks the class
            raise TypeError("a MixedLoader reads a stream over an ingest.Mix")
        if getattr(mixed, "log", None) is not None:
            # A source's loader numbers its steps per worker: a slot's source step would need
            # the worker too, which the mixture's log does not keep.
            raise ConfigError(
                "ingest.DataLoader over an ingest.Mix does not keep a provenance log: read the "
                "mixture with ingest.Stream(mix, provenance=...) or ingest.RayStream, or make "
                "the stream without provenance="
            )
        self.stream = stream
        self.mixed = mixed
        self.loaders: dict[str, DataLoader] = {
            name: DataLoader(part, num_workers=num_workers, persistent_workers=keep, **kwargs)
            for name, part in mixed.streams.items()
        }
        """Each source's loader, by name."""
        # The loader's pin_memory, taken from the sources' loaders (see the module docstring).
        pin = any(loader.pin_memory for loader in self.loaders.values())
        for loader in self.loaders.values():
            loader.pin_memory = False
        self.draws = Draws(
            lambda name: iter(self.loaders[name]),
            lambda name: mixed.streams[name].epoch,
            lambda name: str(mixed.mix.sources[name]),
        )
        torch.utils.data.DataLoader.__init__(self, Nothing(), batch_size=None, pin_memory=pin)

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        """One epoch of the mixture, or the rest of the one a loop left."""
        return self._epoch()

    def _epoch(self) -> Iterator[Batch]:
        for batch in self.mixed.mixer.epoch_batches(self.draws.pull, self.draws.begin):
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
