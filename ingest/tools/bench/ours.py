"""This project as contenders: ``ingest.Stream`` in one process, ``ingest.RayStream`` on N ranks.

Both use only the public API: the stream is built, iterated one ``for`` loop per epoch,
asked for ``state_dict()`` at the half-epoch checkpoint and resumed with
``load_state_dict()`` on a new stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ingest.tools.bench.config import BenchConfig
from ingest.tools.bench.contenders import Loader, RankSource
from ingest.tools.bench.data import Dataset


def _stream_kwargs(data: Dataset, config: BenchConfig) -> dict[str, Any]:
    """Keyword arguments shared by both streams (the shuffle comes from one place)."""
    return {
        "columns": list(data.columns),
        "batch_size": config.batch_size,
        "storage_options": data.storage_options(),
        **config.shuffle.ingest_kwargs(),
    }


@dataclass(slots=True)
class _StreamLoader:
    stream: Any

    def epoch(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.stream)

    def state_dict(self) -> Any:
        return self.stream.state_dict()

    def close(self) -> None:
        self.stream.close()


@dataclass(frozen=True, slots=True)
class StreamSource:
    """Builds an ``ingest.Stream`` in the rank process, optionally from a saved state."""

    url: str
    kwargs: dict[str, Any]
    state: Any = None

    def open(self) -> Loader:
        from ingest.engine.stream import Stream  # torch: only in the rank process

        stream = Stream(self.url, **self.kwargs)
        if self.state is not None:
            stream.load_state_dict(self.state)
        return _StreamLoader(stream)


class StreamContender:
    """``ingest.Stream``: one process reads, shuffles, batches and consumes.

    Args:
        config: The run's settings.
    """

    ranks = 1
    resume_unsupported: str | None = None

    def __init__(self, config: BenchConfig) -> None:
        self.config = config

    def start(self, data: Dataset) -> list[RankSource]:
        return [StreamSource(data.url, _stream_kwargs(data, self.config))]

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        return [StreamSource(data.url, _stream_kwargs(data, self.config), states[0])]

    def stop(self) -> None:
        """Nothing runs outside the rank process."""


@dataclass(slots=True)
class _RankLoader:
    iterator: Any

    def epoch(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.iterator)

    def state_dict(self) -> Any:
        return self.iterator.state_dict()

    def close(self) -> None:
        """The stream's pool and coordinator are stopped by the driver."""


@dataclass(frozen=True, slots=True)
class RankIteratorSource:
    """A ``RayStream`` rank iterator, sent to its rank process."""

    iterator: Any

    def open(self) -> Loader:
        return _RankLoader(self.iterator)


class RayStreamContender:
    """``ingest.RayStream``: a reader pool feeds ``ranks`` rank iterators.

    Args:
        config: The run's settings.
    """

    resume_unsupported: str | None = None

    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.ranks = config.ranks
        self._stream: Any = None

    def _build(self, data: Dataset, state: Any) -> list[RankSource]:
        self.stop()
        from ingest.distributed.ray_stream import RayStream  # ray: only when it runs

        self._stream = RayStream(
            data.url, world_size=self.ranks, **_stream_kwargs(data, self.config)
        )
        if state is not None:
            self._stream.load_state_dict(state)
        return [RankIteratorSource(self._stream.rank_iterator(r)) for r in range(self.ranks)]

    def start(self, data: Dataset) -> list[RankSource]:
        return self._build(data, None)

    def resume(self, data: Dataset, states: list[Any]) -> list[RankSource]:
        return self._build(data, states[0])  # the same state on every rank

    def stop(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.shutdown()
