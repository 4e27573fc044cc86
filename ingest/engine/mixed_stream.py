"""A :class:`ingest.Stream` over an :class:`ingest.Mix`: one stream per source, in one
process, their draws mixed by :class:`ingest.engine.mix.Mixer` (see :mod:`ingest.engine.mix`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ingest.core.errors import IngestError
from ingest.core.quarantine import Quarantined
from ingest.engine.mix import Draws, Mix, Mixer, added, load_mixed, mixed_state

if TYPE_CHECKING:
    from ingest.engine.convert import Batch
    from ingest.engine.stream import Stream


class MixedStream:
    """The sources' streams (each read with ``batch_size`` 1: a row, or one sequence) and
    the mixer of their draws.

    Args:
        mix: The mixture.
        make: Builds a source's one-source stream from its URLs.
        batch_size: Draws per batch.
        seq_len: With packing, the sequence length; None: rows.
    """

    def __init__(
        self,
        mix: Mix,
        make: Callable[[str | Sequence[str]], Stream],
        batch_size: int,
        seq_len: int | None,
    ) -> None:
        self.mix = mix
        self.streams = {name: make(urls) for name, urls in mix.sources.items()}
        self.mixer = Mixer(mix, batch_size, seq_len)
        self.draws = Draws(
            lambda name: iter(self.streams[name]),
            lambda name: self.streams[name].epoch,
            self._describe,
        )
        self._active: Iterator[Batch] | None = None

    def _describe(self, name: str) -> str:
        return str(self.mix.sources[name])

    def __iter__(self) -> Iterator[Batch]:
        if self._active is not None:  # one loop at a time, as a one-source stream
            with contextlib.suppress(ValueError):  # ValueError: another thread is inside it
                self._active.close()  # type: ignore[attr-defined]
        self._active = self.mixer.epoch_batches(self.draws.pull)
        return self._active

    def state_dict(self) -> dict[str, Any]:
        """The state after the last batch (see :mod:`ingest.engine.mix`)."""
        return mixed_state({n: s.state_dict() for n, s in self.streams.items()}, self.mixer)

    def load_state_dict(self, state: Mapping[str, Any] | str) -> None:
        parsed = load_mixed(state, self.mixer)
        self._stop()
        for name, stream in self.streams.items():
            stream.load_state_dict(parsed.parts[name])

    def _stop(self) -> None:
        if self._active is not None:
            self._active.close()  # type: ignore[attr-defined]
            self._active = None
        self.draws.drop()

    def close(self) -> None:
        self._stop()
        for stream in self.streams.values():
            stream.close()

    def stats(self) -> dict[str, int]:
        """The sources' figures summed, and the draws from each (``drawn[name]``)."""
        out = added(stream.stats for stream in self.streams.values())
        out["drawn"] = self.mixer.drawn
        out.update({f"drawn[{n}]": k for n, k in self.mixer.taken.items()})
        return out

    def quarantined(self) -> list[Quarantined]:
        return [q for s in self.streams.values() for q in s.quarantined]


def not_for_a_mixture(what: str) -> IngestError:
    from ingest.core.errors import ConfigError

    return ConfigError(
        f"{what} is not available on a stream over an ingest.Mix: each source is a stream of "
        "its own (stream.mixed.streams[name])"
    )


__all__ = ["MixedStream", "not_for_a_mixture"]
