"""A :class:`ingest.Stream` over an :class:`ingest.Mix`: one stream per source, in one
process, their draws mixed by :class:`ingest.engine.mix.Mixer` (see :mod:`ingest.engine.mix`).

``ingest.Stream(mix, ...)`` makes a :class:`MixedStream` (``Stream.__new__`` picks the class
by the source), so the one-source stream carries no branch on a mixture: this class gives
the same members over its sources' streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ingest.core.errors import ConfigError, IngestError, redact
from ingest.core.quarantine import Quarantined
from ingest.engine.mix import (
    Draws,
    Mix,
    Mixer,
    added,
    join,
    load_mixed,
    load_parts,
    mixed_state,
)
from ingest.engine.mix_provenance import MixLog, logged, new_attempt, source_log, which_mixed
from ingest.engine.options import StreamOptions
from ingest.engine.stream import Stream, StreamParts

if TYPE_CHECKING:
    from ingest.engine.convert import Batch
    from ingest.engine.grouping import Grouping
    from ingest.planner.catalog import Listing
    from ingest.storage.sources import URLs


class MixedStream(Stream):
    """A stream over an :class:`ingest.Mix`: the sources' streams (each read with
    ``batch_size`` 1: a row, or one sequence) and the mixer of their draws. Made by
    ``ingest.Stream(mix, ...)``; see :class:`ingest.Stream` for the members."""

    def _start(self, source: URLs | Mix, options: StreamOptions) -> None:
        if not isinstance(source, Mix):  # pragma: no cover - Stream.__new__ picks the class
            raise ConfigError(f"a MixedStream reads an ingest.Mix, not {source!r}")
        self.options = options
        self._batch_size = options.batch_size
        self.mixed = self
        self.mix = source
        self.streams = {
            name: Stream.of(urls, options.of_sources(name)) for name, urls in source.sources.items()
        }
        """Each source's one-source stream, by name."""
        self.mixer = Mixer(source, options.batch_size, options.draw_tokens())
        self.draws = Draws(
            lambda name: iter(self.streams[name]),
            lambda name: self.streams[name].epoch,
            self._describe,
        )
        self._active_mix: Iterator[Batch] | None = None
        self.log = None
        if options.provenance is not None:
            self.log = MixLog(options.provenance, options.storage_options, 0, 1, self.batch_size)
        """With ``provenance``: which source step each slot of a batch was
        (:mod:`ingest.engine.mix_provenance`)."""
        self._attempt = new_attempt()

    def _describe(self, name: str) -> str:
        return str(self.mix.sources[name])

    @property
    def parts(self) -> StreamParts:
        raise not_for_a_mixture("Stream.parts (and so ingest.DataLoader)")

    @property
    def pack(self) -> Grouping | None:
        return next(iter(self.streams.values())).pack

    @property
    def shuffle_seed(self) -> int | None:
        return next(iter(self.streams.values())).shuffle_seed

    @property
    def epoch(self) -> int:
        """The mixture's epoch in progress, or the next one to run."""
        return self.mixer.epoch

    @property
    def stats(self) -> dict[str, int]:
        """The sources' figures summed, and the draws from each (``drawn[name]``)."""
        out = added(stream.stats for stream in self.streams.values())
        out["drawn"] = self.mixer.drawn
        out.update({f"drawn[{n}]": k for n, k in self.mixer.taken.items()})
        return out

    @property
    def quarantined(self) -> list[Quarantined]:
        return [q for s in self.streams.values() for q in s.quarantined]

    def listing(self) -> Listing:
        raise not_for_a_mixture("Stream.listing()")

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of the mixture (:mod:`ingest.engine.mix`)."""
        if self._active_mix is not None:  # one loop at a time, as a one-source stream
            with contextlib.suppress(ValueError):  # ValueError: another thread is inside it
                self._active_mix.close()  # type: ignore[attr-defined]
        batches = self.mixer.epoch_batches(self._pull, self.draws.begin)
        self._active_mix = logged(batches, self.log, lambda: self.mixer.step, self._named)
        return self._active_mix

    def _pull(self, name: str) -> tuple[Batch, bool, int]:
        got = self.draws.pull(name)
        if self.log is not None:
            # the source's step of the draw just pulled, as its own log numbers it
            self.log.pulled(name, self.streams[name].step)
        return got

    def _named(self) -> str:
        return self._attempt

    def replay(
        self,
        steps: int | Iterable[int],
        *,
        provenance: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> Iterator[tuple[int, int, Batch]]:
        """The mixed batches of ``steps`` again, as each rank got them: ``(step, rank,
        batch)``. Each slot is its source's step read again by that source's stream
        (:meth:`ingest.Stream.replay`: only its rows, the transform run, packed again with
        ``pack``), and the slots are joined as the mixture joined them, with their
        ``source`` and ``source_epoch``.

        Raises:
            ConfigError: If there is no log to read.
            IngestError: If the log names a slot whose source step its source's log lacks.
        """
        url = provenance or self.options.provenance
        if url is None:
            raise ConfigError(
                "replay reads the run's provenance log: pass provenance= the URL the run "
                "was given as provenance=, or make this stream with it"
            )
        slots = which_mixed(url, steps, storage_options=storage_options).to_pylist()
        draws: dict[tuple[str, int, int], Batch] = {}
        for name in dict.fromkeys(r["source"] for r in slots):
            asked = sorted({r["source_step"] for r in slots if r["source"] == name})
            own = source_log(url, name)
            for step, rank, batch in self.streams[name].replay(
                asked, provenance=own, storage_options=storage_options
            ):
                draws[(name, step, rank)] = batch
        by_step: dict[tuple[int, int], dict[int, tuple[str, int, int]]] = {}
        for r in slots:  # a slot's rows (runs, or pieces) name the same draw: its first
            at = by_step.setdefault((r["step"], r["rank"]), {})
            at.setdefault(r["slot"], (r["source"], r["source_step"], r["epoch"]))
        packs = self.mixer.seq_len is not None
        for (step, rank), at in by_step.items():
            parts, sources = [], []
            for slot in sorted(at):
                name, source_step, epoch = at[slot]
                draw = draws.get((name, source_step, rank))
                if draw is None or epoch is None:
                    raise IngestError(
                        f"{redact(url)}: step {step} slot {slot} was source {name!r}'s step "
                        f"{source_step}, which {source_log(redact(url), name)} does not hold "
                        "(a chunk left out, or the source's log was moved)"
                    )
                parts.append(draw)
                sources.append((self.mix.names.index(name), epoch))
            yield step, rank, join(parts, sources, packed=packs)

    def state_dict(self) -> dict[str, Any]:
        """The state after the last batch: the sources' and the mix part
        (:mod:`ingest.engine.mix`)."""
        state = mixed_state({n: s.state_dict() for n, s in self.streams.items()}, self.mixer)
        if self.log is not None:
            self.log.flush()  # the state is covered by the log
        return state

    def load_state_dict(  # type: ignore[override]
        self, state: Mapping[str, Any] | str, *, listing: Listing | None = None
    ) -> None:
        if listing is not None:
            raise not_for_a_mixture("load_state_dict(listing=...)")
        # Each source loads its part on its own: one refused (its source changed since the
        # state was saved) leaves the stream as it was, the parts loaded before it put back.
        # (a source that has not begun is begun again: its state would list it, once more
        # than the load does)
        before = {n: s.state_dict() if s.begun else None for n, s in self.streams.items()}
        mixer = self.mixer.state(), self.mixer.drawn, dict(self.mixer.taken)
        parsed = load_mixed(state, self.mixer)
        self._stop_mix()
        try:
            load_parts(self.streams, parsed.parts, before, self._begin_again)
        except BaseException:
            self.mixer.load(*mixer)
            raise
        if self.log is not None:  # a new attempt from the state's step
            self.log.restart()
            self._attempt = new_attempt()

    def _begin_again(self, name: str) -> None:
        """Source ``name`` as a new stream, as it was before it began."""
        self.streams[name].close()
        self.streams[name] = Stream.of(self.mix.sources[name], self.options.of_sources(name))

    def _stop_mix(self) -> None:
        if self._active_mix is not None:
            self._active_mix.close()  # type: ignore[attr-defined]
            self._active_mix = None
        self.draws.drop()

    def close(self) -> None:
        self._stop_mix()
        for stream in self.streams.values():
            stream.close()
        if self.log is not None:
            self.log.flush()


def not_for_a_mixture(what: str) -> IngestError:
    return ConfigError(
        f"{what} is not available on a stream over an ingest.Mix: each source is a stream of "
        "its own (stream.mixed.streams[name])"
    )


__all__ = ["MixedStream", "not_for_a_mixture"]
