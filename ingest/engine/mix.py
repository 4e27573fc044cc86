"""Weighted mixtures of named sources in a stream: :class:`Mix`, and the draws of its batches.

A :class:`Mix` names sources (each a URL, glob or list of them, as a one-source stream takes)
with weights, and goes where a URL goes: ``ingest.Stream(mix, ...)``,
``ingest.RayStream(mix, ...)``. Each source is read as a stream of its own, with its own
listing, plans, book, epochs and part of the state; the mixture draws every slot of a batch
from one of them (:class:`Mixer`):

- **A draw.** With ``pack``, one sequence of ``seq_len`` tokens from one source (its
  documents packed together, as a one-source stream packs them), counted as ``seq_len``
  tokens: the weights are in tokens. Without, one row, counted as one document.
- **Which source.** :class:`ingest.core.mixture.Mixture` chooses: a pure function of the seed
  and the counts drawn, so every source stays within one draw (``seq_len`` tokens, or one
  document) of its weight at every prefix of the draws. A sequence's padding (under 1% with
  best-fit) counts as its source's tokens: the real tokens follow the weights within that.
- **Under Ray every rank draws alike**: the same sources in the same order, so each rank
  takes as many draws from each source as any other (each source's equal steps and epoch
  ends hold as in a one-source stream), and the counts are the same on every rank: one
  state, at any world size. So at every step every rank is within one draw of the weights,
  and all ranks together within one draw per rank. The schedule's stages begin at global
  counts (every rank's draws: a draw counts ``world_size`` times), the same meaning at any
  world size.
- **Epochs.** Each source has its own: a source whose epoch ends starts its next one, in a
  new seeded order, in the same slot. *An epoch of the mixture* ends with the batch in which
  every source of positive weight (in the current stage) has finished an epoch of its own
  since the mixture's epoch began: the source largest against its weight is read once, the
  others repeat. A loop over the stream is one epoch of the mixture.
- **The state** (:mod:`ingest.core.state.sources`): every source's own state
  (with its tokens in flight, when packed), ``drawn`` and ``taken`` (draws in all and from
  each source), and ``mixture``: the counts, the stages, and the mixture's epoch with the
  sources that ended in it. Loaded into a stream with other weights, a new stage begins at
  the state's exact count (:meth:`ingest.core.mixture.Mixture.load_state_dict`): nothing
  drawn is drawn again or skipped; only the draws from there on follow the new weights.

Pure: the streams are given as a ``pull`` function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from ingest.core.errors import ConfigError, IngestError, StateError
from ingest.core.mixture import Mixture
from ingest.core.state import SourcesState, StreamState, read_state
from ingest.storage.sources import URLs

Batch = dict[str, Any]
SOURCE = "source"
"""The key of a mixed batch's tensor of each row's (or sequence's) source, by its index in
:attr:`Mix.names`."""
SOURCE_EPOCH = "source_epoch"
"""The key of a mixed batch's tensor of each row's (or sequence's) epoch of its source."""


@dataclass(frozen=True)
class Mix:
    """A weighted mixture of named sources; give it where a URL goes.

    Args:
        sources: Name -> URL, glob or directory, or a list of them (any fsspec protocol);
            every source is read with the stream's options.
        weights: Name -> weight (normalised; default: equal). In tokens with ``pack``
            (sequences of ``seq_len`` tokens), in documents (rows) without.
        schedule: Later stages: ``(global count, weights)`` pairs in increasing order, the
            count in the weights' unit over all ranks since the run began.
        seed: Orders the ties between sources.
    """

    sources: Mapping[str, URLs]
    weights: Mapping[str, float] | None = None
    schedule: Sequence[tuple[int, Mapping[str, float]]] = ()
    seed: int = 0
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(self.sources)
        if not names:
            raise ConfigError("ingest.Mix needs at least one named source")
        for name in names:
            if not isinstance(name, str) or not name or len(name) > 200:
                raise ConfigError(f"source name {name!r} must be a string of 1 to 200 characters")
        object.__setattr__(self, "names", names)
        self.mixture(None, 1)  # the weights and the schedule checked now

    def mixture(self, seq_len: int | None, world_size: int) -> Mixture:
        """The draws' rule: in tokens of ``seq_len`` per sequence, or in documents (None)."""
        given = dict.fromkeys(self.names, 1.0) if self.weights is None else self.weights
        if set(given) != set(self.names):
            raise ConfigError(
                f"ingest.Mix weights name {sorted(given)}, its sources are "
                f"{sorted(self.names)}: give one weight per source (0 leaves one out)"
            )
        return Mixture(
            {name: given[name] for name in self.names},
            unit="documents" if seq_len is None else "tokens",
            max_draw=seq_len,
            seed=self.seed,
            schedule=self.schedule,
            ranks=world_size,
        )


Pull = Callable[[str], tuple[Batch, bool, int]]
"""A source's next draw (a batch of one row or one sequence), whether the source began a new
epoch for it, and the source's epoch it is of."""


class Mixer:
    """The draws of a mixed stream's batches, on one rank (see the module docstring).

    Args:
        mix: The mixture.
        batch_size: Draws per batch.
        seq_len: With packing, the sequence length (a draw counts ``seq_len`` tokens); None:
            rows, a draw counts one document.
        world_size: Ranks that draw alike (a draw counts this many times towards the
            schedule's global counts).
    """

    def __init__(self, mix: Mix, batch_size: int, seq_len: int | None, world_size: int = 1):
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        self.mix = mix
        self.names = mix.names
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.mixture = mix.mixture(seq_len, world_size)
        self.size = 1 if seq_len is None else seq_len
        self.epoch = 0
        """The mixture's epoch (see the module docstring)."""
        self.ended: set[str] = set()
        """The sources that finished an epoch of their own since the mixture's epoch began."""
        self.drawn = 0
        self.taken = dict.fromkeys(self.names, 0)
        self.steps: int | None = 0
        """Batches handed out since the run began (kept in the state: a provenance log's
        mixed steps, whatever the batch size of each attempt); None: a state saved before
        they were kept was loaded (counted as ``drawn // batch_size``)."""

    @property
    def step(self) -> int:
        """The step of the last batch (see :attr:`steps`); -1: none."""
        steps = self.drawn // self.batch_size if self.steps is None else self.steps
        return steps - 1

    def over(self) -> bool:
        """Whether the mixture's epoch is over: every source of positive weight ended one."""
        weights = self.mixture.stage.weights
        return all(name in self.ended for name, w in zip(self.names, weights, strict=True) if w)

    def drawing(self) -> list[str]:
        """The sources drawn from now: a weight above 0 in the schedule's stage."""
        weights = self.mixture.stage.weights
        return [name for name, w in zip(self.names, weights, strict=True) if w]

    def epoch_batches(
        self, pull: Pull, begin: Callable[[Sequence[str]], None] | None = None
    ) -> Iterator[Batch]:
        """The batches of the rest of the mixture's epoch; then the next epoch begins.
        ``begin``: starts the sources drawn from now before the first draw
        (:meth:`Draws.begin`)."""
        if begin is not None and not self.over():
            begin(self.drawing())
        while not self.over():
            yield self.batch(pull)
        self.epoch += 1
        self.ended = set()

    def batch(self, pull: Pull) -> Batch:
        """The next ``batch_size`` draws, one batch."""
        parts: list[Batch] = []
        sources: list[tuple[int, int]] = []
        for _ in range(self.batch_size):
            name = self.mixture.choose()
            part, began, epoch = pull(name)
            if began:
                self.ended.add(name)
            self.mixture.record(name, self.size)
            self.drawn += 1
            self.taken[name] += 1
            parts.append(part)
            sources.append((self.names.index(name), epoch))
        if self.steps is not None:
            self.steps += 1
        return join(parts, sources, packed=self.seq_len is not None)

    # -- state -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The mixture's part of the state (``mixture``), beside ``drawn`` and ``taken``."""
        out = {**self.mixture.state_dict(), "epoch": self.epoch, "ended": sorted(self.ended)}
        if self.steps is not None:
            out["steps"] = self.steps
        return out

    def load(self, state: Mapping[str, Any], drawn: int, taken: Mapping[str, int]) -> None:
        """Go on after ``state`` (with this mixer's weights from its count on).

        Raises:
            StateError: If the state is another mixture's, or malformed.
        """
        epoch, ended, steps = state.get("epoch"), state.get("ended"), state.get("steps")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise StateError(f"the state's mixture epoch {epoch!r} is not a count >= 0")
        bad = isinstance(steps, bool) or not isinstance(steps, int) or steps < 0
        if steps is not None and bad:
            raise StateError(f"the state's mixture steps {steps!r} is not a count >= 0")
        if not isinstance(ended, list) or not set(ended) <= set(self.names):
            raise StateError(
                f"the state's mixture lists {ended!r} as sources that ended an epoch; they "
                f"must be among {list(self.names)}"
            )
        self.mixture.load_state_dict(state)
        self.epoch = epoch
        self.ended = set(ended)
        self.drawn = drawn
        self.taken = {name: int(taken[name]) for name in self.names}
        self.steps = steps


class Draws:
    """Each source's draws, one at a time, epoch after epoch: the :data:`Pull` of a rank
    whose sources are loops (``start(name)`` begins the next loop over a source: the rest of
    its epoch, or its next epoch)."""

    def __init__(
        self,
        start: Callable[[str], Iterator[Batch]],
        epoch: Callable[[str], int],
        describe: Callable[[str], str],
    ) -> None:
        self._start = start
        self._epoch = epoch
        self._describe = describe
        self._loops: dict[str, Iterator[Batch]] = {}

    def begin(self, names: Sequence[str]) -> None:
        """Start the loops of ``names`` that have none, side by side, before their first
        draws: a stream's loop (its ``start()``) lists its source and begins reading ahead,
        each in a thread of its own; a DataLoader's starts its workers as it is made. Begun
        at their first draws instead, they waited for the draws before: a mixture of 4
        sources on a store 50 ms away took 1.9 s to its first batch where one source took
        0.45 s. No batch is taken: a state taken now is where nothing was drawn.

        Raises:
            Exception: What the first source that failed to start raised (its loop is
                dropped: its next draw starts it again).
        """
        new = {name: self._start(name) for name in names if name not in self._loops}
        self._loops.update(new)
        starts = {
            name: start
            for name, loop in new.items()
            if (start := getattr(loop, "start", None)) is not None
        }
        if len(starts) < 2:  # one alone starts at its first draw, no later
            return
        with ThreadPoolExecutor(min(len(starts), 16), thread_name_prefix="ingest-mix") as pool:
            futures = {name: pool.submit(start) for name, start in starts.items()}
        errors = {name: e for name, f in futures.items() if (e := f.exception()) is not None}
        for name in errors:
            del self._loops[name]
        if errors:
            raise next(iter(errors.values()))

    def pull(self, name: str) -> tuple[Batch, bool, int]:
        began = False
        while True:
            loop = self._loops.get(name)
            if loop is None:
                loop = self._loops[name] = self._start(name)
            try:
                return next(loop), began, self._epoch(name)
            except StopIteration:
                del self._loops[name]
                if began:
                    raise ConfigError(
                        f"source {name!r} of the mixture ({self._describe(name)}) has nothing "
                        "to draw in a whole epoch of its own: an epoch needs rows for one "
                        "read step on every rank (Pack.read_rows, or 1 row, times world_size; "
                        "the rest is carried). Give it more data, or weight 0"
                    ) from None
                began = True

    def drop(self) -> None:
        """Forget the loops (a state was loaded, or the stream closed): each source goes on
        from where its own stream is."""
        self._loops.clear()


def mixed_state(parts: Mapping[str, Mapping[str, Any]], mixer: Mixer) -> dict[str, Any]:
    """The state of a mixed stream from its sources' states (see the module
    docstring), checked."""
    state = SourcesState(
        {name: StreamState.from_json(part) for name, part in parts.items()},
        mixer.drawn,
        dict(mixer.taken),
        mixer.state(),
    )
    return state.to_json()


def load_mixed(state: Any, mixer: Mixer) -> SourcesState:
    """Parse ``state`` for a mixed stream and load its mixture into ``mixer``; returns it (the
    sources' parts are loaded by the caller).

    Raises:
        StateError: If it is a one-source state, another mixture's, or malformed.
    """
    parsed = read_state(state)
    if not isinstance(parsed, SourcesState) or parsed.mixture is None:
        raise StateError(
            "this state is not a mixture's (no 'sources' and 'mixture'): it was saved by a "
            "stream of one source; load it into one, or start the mixture anew"
        )
    if set(parsed.parts) != set(mixer.names):
        raise StateError(
            f"the state's sources are {sorted(parsed.parts)}, this mixture's "
            f"{sorted(mixer.names)}; resume with the sources the state was saved with"
        )
    mixer.load(parsed.mixture, parsed.drawn, parsed.taken)
    return parsed


class _Loads(Protocol):
    def load_state_dict(self, state: Any, /) -> None: ...


def load_parts(
    streams: Mapping[str, _Loads],
    parts: Mapping[str, Any],
    before: Mapping[str, Any],
    begin_again: Callable[[str], None] | None = None,
) -> None:
    """Each source's stream loads its part of a mixture's state, in turn. A part refused
    (its source changed since the state was saved) names its source, and the parts loaded
    before it are put back (``before``: each source's state before this load; None: a
    stream that had not begun, put back by ``begin_again``), so that a refused state leaves
    the streams as they were, as a one-source stream's does.

    Raises:
        IngestError: The first part's refusal (a :class:`StateError` begins with the
            source's name; another error has a note naming it); a part that cannot be put
            back is noted on it too.
    """
    loaded: list[str] = []
    try:
        for name, stream in streams.items():
            try:
                stream.load_state_dict(parts[name])
            except StateError as e:
                raise StateError(f"source {name!r}: {e}") from None
            except IngestError as e:
                e.add_note(f"while loading source {name!r} of the mixture's state")
                raise
            loaded.append(name)
    except BaseException as e:
        for name in loaded:
            try:
                if before[name] is not None:
                    streams[name].load_state_dict(before[name])
                elif begin_again is not None:
                    begin_again(name)
            except IngestError as failed:
                e.add_note(
                    f"source {name!r} could not be put back where it was ({failed}): build "
                    "the stream again before iterating it"
                )
        raise


def added(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The sources' figures (``stats``), key by key."""
    out: dict[str, int] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0) + int(value)
    return out


def join(parts: Sequence[Batch], sources: Sequence[tuple[int, int]], *, packed: bool) -> Batch:
    """One batch of single draws, with each draw's source and source epoch (:data:`SOURCE`,
    :data:`SOURCE_EPOCH`)."""
    import torch  # here: the readers of a Ray stream import this module, not torch

    first = parts[0]
    for key in (SOURCE, SOURCE_EPOCH):
        if key in first:
            raise ConfigError(
                f"the sources' batches have a column {key!r}, a key a mixed batch gives "
                "each row; rename the column (columns= or a transform)"
            )
    out: Batch = {}
    for key in first:
        if key == "max_seqlen":
            out[key] = max(int(p[key]) for p in parts)
        elif key == "cu_seqlens":
            width = first["input_ids"].shape[1]
            out[key] = torch.cat(
                [first[key]] + [p[key][1:] + n * width for n, p in enumerate(parts) if n]
            )
        elif key == "pieces":
            pieces = [p[key].clone() for p in parts]
            for n, piece in enumerate(pieces):
                piece[:, 0] = n
            out[key] = torch.cat(pieces)
        elif isinstance(first[key], torch.Tensor):
            out[key] = torch.cat([p[key] for p in parts])
        else:  # lists: strings, bytes, ragged token lists
            out[key] = [v for p in parts for v in p[key]]
    rows = torch.tensor([len(p["input_ids"]) if packed else _rows(p) for p in parts])
    per = torch.repeat_interleave(torch.tensor(sources, dtype=torch.int64), rows, dim=0)
    out[SOURCE], out[SOURCE_EPOCH] = per[:, 0].contiguous(), per[:, 1].contiguous()
    return out


def _rows(batch: Batch) -> int:
    return len(next(iter(batch.values())))


__all__ = [
    "SOURCE",
    "SOURCE_EPOCH",
    "Draws",
    "Mix",
    "Mixer",
    "added",
    "join",
    "load_mixed",
    "load_parts",
    "mixed_state",
]
