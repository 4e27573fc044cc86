"""A :class:`ingest.RayStream` over an :class:`ingest.Mix`: one one-source stream per source
(its coordinator, its reader pool, its book and equal steps), and on every rank an iterator
that draws from the sources' rank iterators by :class:`ingest.engine.mix.Mixer`.

Every rank draws alike (:mod:`ingest.engine.mix`): the same sources in the same order, so each
rank takes as many sequences (or rows) from each source as every other rank, and each source
stream's own rules hold as in a one-source stream: equal steps per rank, an epoch's end at
the same draw on every rank, states consistent across ranks. A rank takes each draw as a
batch of one from its source's iterator (``batch_size`` 1 in the source's stream: one
sequence, or one row); the sources read, tokenize and pack as one-source streams do.

States are taken on the ranks (:meth:`MixedRankIterator.state_dict`, called by every rank
at the same step, as :func:`ingest.train.report` does): each source's state at the draws the
rank took from it, and the mixture's counts (the same on every rank).

``RankOptions.pin_memory`` and ``device`` apply to the mixture's batches as they leave the
rank; the sources' iterators hand out their draws as they are (a join makes new tensors: it
would lose the draws' pinning, and make the ``source`` columns on the CPU).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from ingest.core.errors import ConfigError
from ingest.core.quarantine import Quarantined
from ingest.distributed.pool import ReaderPool
from ingest.distributed.rank import RankOptions
from ingest.distributed.ray_stream import RayStream
from ingest.engine.mix import Draws, Mix, Mixer, added, load_mixed, load_parts, mixed_state
from ingest.engine.mix_provenance import MixLog, logged
from ingest.engine.options import StreamOptions
from ingest.planner.index import IndexConfig
from ingest.storage.sources import URLs

Batch = dict[str, Any]


class MixedRankIterator:
    """A rank's batches of a mixed stream, one epoch of the mixture per loop; picklable.

    Args:
        parts: The rank's iterator of each source (``batch_size`` 1). Their
            ``RankOptions.pin_memory`` and ``device`` become this iterator's (see the module
            docstring), and are turned off in the parts.
        mixer: The mixture's draws, loaded from the state the run resumes from.
        placement: ``pin_memory`` and ``device`` (a copy's); None: the parts' options.
        log: With ``provenance``: the rank's log of which source step each slot of a batch
            was (:mod:`ingest.engine.mix_provenance`).
    """

    def __init__(
        self,
        parts: Mapping[str, Any],
        mixer: Mixer,
        placement: tuple[bool, Any] | None = None,
        log: MixLog | None = None,
    ) -> None:
        self.parts = dict(parts)
        if placement is None:
            options = next(iter(self.parts.values())).options
            placement = (options.pin_memory, options.device)
            for it in self.parts.values():
                it.options = replace(it.options, pin_memory=False, device=None)
        self.placement = placement
        self.mixer = mixer
        self.log = log
        self.draws = Draws(self._start, self._epoch, lambda name: f"rank {self.rank}'s {name}")
        self._yielded = 0

    def _start(self, name: str) -> Iterator[Batch]:
        return iter(self.parts[name])

    def _epoch(self, name: str) -> int:
        return int(self.parts[name].epoch)

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy is new iterators of the rank's sources (RankIterator.__reduce__), with the
        # mixture's counts as they are now.
        return (MixedRankIterator, (self.parts, self.mixer, self.placement, self.log))

    @property
    def rank(self) -> int:
        return int(next(iter(self.parts.values())).rank)

    @property
    def step(self) -> int:
        """This iterator's batches less one (equal on every rank)."""
        return self._yielded - 1

    def upcoming_epoch(self) -> int:
        """The mixture's epoch in progress, or the next one to run."""
        return self.mixer.epoch

    def __iter__(self) -> Iterator[Batch]:
        from ingest.engine.convert import placed  # torch: on the rank, not the driver

        pin_memory, device = self.placement
        batches = self.mixer.epoch_batches(self._pull, self.draws.begin)
        for batch in logged(batches, self.log, lambda: self.mixer.step, self._attempt):
            self._yielded += 1
            yield placed(batch, pin_memory, device)

    def _pull(self, name: str) -> tuple[Batch, bool, int]:
        got = self.draws.pull(name)
        if self.log is not None:
            # the source's step of the draw just pulled, as its own log numbers it
            self.log.pulled(name, int(self.parts[name].step))
        return got

    def _attempt(self) -> str:
        """The name of the attempt this rank's batches are part of (asked at its first
        batch): the coordinator session of its first source drawn from, which every rank of
        the worker group carries (they draw alike) and which a new group, or a state loaded,
        changes."""
        sessions = [it.session for it in self.parts.values() if it.session is not None]
        return f"{sessions[0]:x}"

    def flush(self) -> None:
        for it in self.parts.values():
            it.flush()
        if self.log is not None:
            self.log.flush()

    def state_dict(self) -> dict[str, Any]:
        """Flush, then the state after this rank's last batch (the same on every rank): every
        rank calls it at the same step."""
        state = mixed_state({name: it.state_dict() for name, it in self.parts.items()}, self.mixer)
        if self.log is not None:
            self.log.flush()  # the state is covered by the log
        return state


class MixedRayStream(RayStream):
    """A :class:`ingest.RayStream` over an :class:`ingest.Mix` (``ingest.RayStream(mix, ...)``
    makes one): a one-source stream per source, the same members over them (see the module
    docstring)."""

    def _start(
        self,
        source: URLs | Mix,
        options: StreamOptions,
        world_size: int,
        readers: ReaderPool | None,
        index: IndexConfig | None,
        name: str | None,
        timeout_s: float,
    ) -> None:
        if not isinstance(source, Mix):  # pragma: no cover - RayStream.__new__ picks the class
            raise ConfigError(f"a MixedRayStream reads an ingest.Mix, not {source!r}")
        self._settle(options, world_size, name, timeout_s)
        self.mixed = self
        self.mix = source
        self.seq_len = options.draw_tokens()
        """With packing, the sequence length (a draw's tokens); None: rows."""
        self.mixer(None)  # the weights checked before any actor starts
        self.streams: dict[str, RayStream] = {}
        """Each source's one-source stream, by name."""
        try:
            for part, urls in source.sources.items():
                self.streams[part] = RayStream.of(
                    urls, options.of_sources(part), world_size=world_size, readers=readers,
                    index=index, name=f"{self.name}-{part}", timeout_s=timeout_s,
                )  # fmt: skip
        except BaseException:
            self.shutdown()  # no actor outlives a stream that could not start
            raise

    def mixer(self, state: Mapping[str, Any] | None) -> Mixer:
        """A rank's mixer, from ``state`` (None: the state loaded on the driver, if any)."""
        mixer = self._fresh()
        state = state if state is not None else self.loaded_state
        if state is not None:
            load_mixed(state, mixer)
        return mixer

    def _fresh(self) -> Mixer:
        return Mixer(self.mix, self.batch_size, self.seq_len, self.world_size)

    def _warm(self) -> None:
        return None  # each source's stream warms its own ranks' feeds

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def rank_iterator(self, rank: int, *, options: RankOptions | None = None) -> MixedRankIterator:
        # each source's stream checks the rank (the same world size)
        parts = {n: s.rank_iterator(rank, options=options) for n, s in self.streams.items()}
        return MixedRankIterator(parts, self.mixer(None), log=self._log(rank, self.world_size))

    def _log(self, rank: int, world_size: int) -> MixLog | None:
        """With ``provenance``, on rank 0: the log of its batches' slots, which are every
        rank's (every rank draws alike: the same sources, each source's same steps, see
        :mod:`ingest.engine.mix`), so a lookup reads one chunk, not one per rank."""
        url = self.options.provenance
        if url is None or rank != 0:
            return None
        return MixLog(url, self.options.storage_options, rank, world_size, self.batch_size)

    def joined(
        self,
        rank: int,
        world_size: int,
        state: Mapping[str, Any] | None,
        *,
        options: RankOptions | None = None,
    ) -> MixedRankIterator:
        """Every source's iterator of ``rank`` joined from its part of ``state``, drawn from
        by a mixer at ``state``'s counts (see :meth:`RayStream.joined`)."""
        parts = {
            name: stream.joined(
                rank,
                world_size,
                None if state is None else state["sources"][name],
                options=options,
            )
            for name, stream in self.streams.items()
        }
        return MixedRankIterator(parts, self.mixer(state), log=self._log(rank, world_size))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        parsed = load_mixed(state, self._fresh())  # checked before any source loads its part
        before = {name: stream.state_dict() for name, stream in self.streams.items()}
        parts = {name: part.to_json() for name, part in parsed.parts.items()}
        load_parts(self.streams, parts, before)  # one refused: the others put back
        self.loaded_state = dict(state)

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        raise ConfigError(
            "a RayStream over an ingest.Mix gives its state on the ranks, where each "
            "source's draws are known: it.state_dict() on every rank at the same step (as "
            "ingest.train.report does)"
        )

    def stats(self) -> dict[str, int]:
        return added(s.stats() for s in self.streams.values())

    def quarantined(self) -> list[Quarantined]:
        return [q for s in self.streams.values() for q in s.quarantined()]

    def shutdown(self) -> None:
        for stream in self.streams.values():
            stream.shutdown()


__all__ = ["MixedRankIterator", "MixedRayStream"]
