"""The single-process stream: the one-rank case of the engine, without Ray.

:class:`Stream` plans epochs with an :class:`ingest.core.book.EpochBook` of one rank, reads its
share with an :class:`ingest.engine.feed.Feed` (lanes that read and decode ahead in their own
threads; shuffle windows and batches in the loop's thread, or in a thread of their own with a
transform: see :meth:`~ingest.engine.feed.Feed.ahead`), and runs the rank's node
(:mod:`ingest.engine.rank_node`: plain, or regrouping with ``pack``) over its items in the
process, its loop (:class:`ingest.engine.loop.RankLoop`) acking each batch to the book as it
is handed to the user's loop. Its state is the book's snapshot at the last batch handed out
(with the node's documents in flight), in the same layout as :class:`ingest.RayStream`'s,
and loads into either.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from ingest.core.errors import ConfigError, IngestError, SupersededError
from ingest.core.quarantine import Quarantined, is_skip, summary
from ingest.core.state import StreamState
from ingest.engine import interrupts
from ingest.engine.convert import Batch
from ingest.engine.feed import Feed, Tail
from ingest.engine.grouping import Grouping
from ingest.engine.loop import BookLink, RankLoop
from ingest.engine.mix import Mix
from ingest.engine.options import StreamKeywords, StreamOptions
from ingest.engine.provenance import ProvenanceLog
from ingest.engine.rank_node import rank_node, read_transform
from ingest.engine.replay import replayed
from ingest.engine.spec import StreamSpec
from ingest.engine.transform import build_transform
from ingest.planner.catalog import Listing
from ingest.planner.planner import Planner

if TYPE_CHECKING:  # typing.Unpack is 3.11's
    from typing_extensions import Unpack

    from ingest.engine.mixed_stream import MixedStream
    from ingest.storage.sources import URLs

_log = logging.getLogger(__name__)


class Stream:
    """Batches of torch tensors from fsspec shards, in one process, resumable exactly.

    One ``for`` loop over the stream is one epoch; the next loop runs the next epoch in a new
    seeded order. A loop left early continues, on the next ``for``, right after the last
    batch it handed out.

    Args:
        source: URL, glob or directory, or a list of them (any fsspec protocol); or an
            :class:`ingest.Mix` of named sources with weights, each read as a stream of its
            own with these options, their rows (or sequences, with ``pack``) drawn by weight
            (see :mod:`ingest.engine.mix`).
        format: Format name for every shard; None infers it from each file's extension.
        columns: Columns to read; None reads all. A shard that lacks one is an error
            naming it and the columns the shard has (:class:`ingest.ShardError`).
        batch_size: Rows per batch. Every batch is full: the rows of an epoch that do not
            fill one are carried into the next epoch (or dropped, see ``remainder``).
        shuffle: The order: ``ingest.Shuffle(seed, window, bytes, lanes)`` (see
            :class:`ingest.Shuffle`); the default reads in listing order. Memory: about
            ``shuffle.bytes`` + ``read.prefetch_bytes`` (see ``stats["peak_bytes_held"]``).
        shuffle_seed, shuffle_window, shuffle_bytes, shuffle_lanes: The same settings as
            keywords, as earlier releases took them (``shuffle_seed=0`` is
            ``shuffle=ingest.Shuffle(seed=0)``); not together with ``shuffle``.
        remainder: ``"carry"`` the rows that cannot fill a batch at the end of an epoch into
            the next epoch, or ``"drop"`` them; counted in the state either way.
        storage_options: fsspec options for the store (endpoint, credentials). Never saved
            in the state and never logged.
        read: How shards are read (block sizes, prefetch, explicit schema), and what bad
            data does: ``ReadOptions(on_error="skip")`` quarantines what cannot be read
            (see :mod:`ingest.core.quarantine`, :attr:`quarantined`); a batch that lost rows to
            it is short, and one that lost all is left out.
        transform: Run on each batch (as an Arrow table) before conversion to torch: a
            function, or a class built once. It keeps one output row per input row, or is an
            :class:`ingest.Stage` that may filter or split rows (:mod:`ingest.engine.stage`).
            A list of them runs each on what the one before made
            (``[ingest.Filter(...), ingest.Tokenize(...)]``; see
            :class:`ingest.engine.transform.Chain`).
        progress: Show a progress bar while footers are read at listing time.
        follow: Read a dataset written while the stream runs: each epoch is a round over
            the shards that appeared since the last one, which waits for new shards
            (``ingest.Follow(poll_s, idle_timeout_s, manifest)``, see :mod:`ingest.storage.follow`).
        pack: Pack the documents' token ids (``transform=ingest.Tokenize(...)``, or a column
            of them) into sequences: ``ingest.Pack(seq_len=...)``. ``batch_size`` is then
            sequences per batch, and a state records the tokens of each document cut
            across batches (see :mod:`ingest.engine.pack`).
        derived: Keep what ``transform`` made of each unit read whole, and read it back in
            place of running it: an :class:`ingest.DerivedConfig` or a URL shared by every
            job (:mod:`ingest.engine.derived`); None (default): it runs on every batch.
        provenance: Keep which rows each step consumed at this directory or fsspec URL,
            for ``ingest which`` / :func:`ingest.which` and :func:`ingest.skip` (after a
            loss spike): written as the book folds (every 64 steps), at each state and at
            each epoch's end, about 3.5 bytes a row of a shuffled batch
            (:mod:`ingest.engine.provenance`); with ``pack``, each batch's pieces of
            documents (their sequences and token ranges). None (default): nothing is kept.
    """

    def __new__(cls, source: Any = None, **options: Any) -> Stream:
        """A stream over an :class:`ingest.Mix` is a :class:`~ingest.engine.mixed_stream.
        MixedStream` (the same members over its sources' streams); any other source, this
        class. (``source`` may be missing: an unpickled or copied stream.)"""
        if isinstance(source, Mix) and cls is Stream:
            from ingest.engine.mixed_stream import MixedStream  # it builds on this module

            return super().__new__(MixedStream)
        return super().__new__(cls)

    def __init__(self, source: URLs | Mix, **options: Unpack[StreamKeywords]) -> None:
        self._start(source, StreamOptions.of("Stream", options))

    @classmethod
    def of(cls, source: URLs | Mix, options: StreamOptions) -> Stream:
        """The stream of ``source`` with ``options`` (what the keywords make)."""
        stream = cls.__new__(cls, source)
        stream._start(source, options)
        return stream

    def _start(self, source: URLs | Mix, options: StreamOptions) -> None:
        batch_size, pack, transform = options.batch_size, options.pack, options.transform
        self.options = options
        """The settings this stream was made with."""
        self._batch_size = batch_size
        self.mixed: MixedStream | None = None
        """Over an :class:`ingest.Mix`: the stream itself (a :class:`~ingest.engine.
        mixed_stream.MixedStream`: its sources' streams and the mixer); else None."""
        if isinstance(source, Mix):  # a subclass's _start takes it (see __new__)
            raise ConfigError(
                f"{type(self).__name__} reads URLs: read a Mix with ingest.Stream(mix)"
            )
        self.spec = StreamSpec.of(source, **options.spec_options())
        # Checked as in the reader pool: one row per input row (a stage: its origins).
        self._transform: Callable[[Any], Any] | None = read_transform(
            build_transform(transform), regrouped=pack is not None
        )
        self._planner = self.spec.planner(progress=options.progress)
        self._book = self.spec.book(1, self._planner, packs=pack is not None)
        self._next_epoch = 0
        self._rank = RankLoop(0, BookLink(self._book), on_quarantined=self._log)
        """The one rank's loop: batches handed out and their acks (:mod:`ingest.engine.loop`)."""
        self._node = rank_node(pack, batch_size, self._rank, self._book)
        """The rank's node: its read steps handed out as batches, or regrouped with ``pack``
        (:mod:`ingest.engine.rank_node`)."""
        self._delivered = 0
        self._lent_counts: dict[str, int] = {}
        """What holders' loops handed out beyond :attr:`_node`'s counts (:meth:`count_lent`)."""
        self._reading: tuple[Feed, Any] | None = None
        """The last loop's feed and its read-ahead, for the bytes they hold (:attr:`stats`)."""
        self._peak_held = 0
        # The loop in progress, held weakly: a loop left by `break` drops the generator,
        # whose `finally` stops its read-ahead threads at once. A strong reference would make a
        # cycle (the generator's frame holds the stream) that only the cyclic GC frees, and a
        # stream left without close() would keep its threads until then.
        self._active: weakref.ref[_Loop] | None = None
        self._running = False
        """An epoch's loop started and has not finished: the next loop rewinds first."""
        self._lent: weakref.ref[Holder] | None = None
        """Who runs this stream's loop, if not the stream itself (:meth:`lend`)."""
        self._as_loaded: StreamState | None = None
        """The state last loaded, taken inside its epoch (a step past its first), until a
        loop begins: :meth:`state_dict` gives it back as it came. This stream's book has one
        rank: it keeps what a state of several ranks (a DataLoader's workers, a RayStream's
        ranks) consumed, not each rank's place, and a DataLoader of as many workers, which
        plans from this stream's state, goes on from their places only if it gets the state
        whole. At an epoch's start no rank has a place to keep: the book's own state then
        (a skip of that epoch's steps applied as the book plans it, the rows carried in)."""

    @property
    def parts(self) -> StreamParts:
        """What another loop over this stream's engine reads with: the spec, the planner
        (footers read once for all) and the built transform (an :class:`ingest.DataLoader`
        runs its workers with them)."""
        return StreamParts(self.spec, self._planner, self._transform)

    @property
    def pack(self) -> Grouping | None:
        """The packing settings (``pack=``), or None."""
        return self.options.pack

    @property
    def batch_size(self) -> int:
        """Rows per batch (sequences, with ``pack``)."""
        return self._batch_size

    @property
    def shuffle_seed(self) -> int | None:
        return self.spec.shuffle.seed

    @property
    def epoch(self) -> int:
        """The epoch in progress, or the next one to run (of the mixture, over a Mix)."""
        return self._next_epoch

    @property
    def stats(self) -> dict[str, int]:
        """Requests sent to the store, rows delivered in the current epoch, the quarantines
        (``quarantined``, ``rows_skipped``) since the stream was made or loaded, and the
        bytes of rows held by the reading (``bytes_held``: shuffle window, lanes' read-ahead
        and ready batches now; ``peak_bytes_held``: the most, at most, since it was made).
        With ``pack``, ``rows_delivered`` counts sequences, and ``tokens`` and
        ``padding_tokens`` what the batches handed out since the stream was made held. Over
        a Mix: the sources' figures summed, and the draws (``drawn``, ``drawn[name]``)."""
        self._rank.flush()
        return {
            **self._planner.source.stats.as_dict(),
            "rows_delivered": self._delivered,
            **{k: n + self._lent_counts.get(k, 0) for k, n in self._node.counts().items()},
            **summary(self._book.quarantined()),
            **self._held(),
        }

    def _held(self) -> dict[str, int]:
        if self._reading is None:
            return {"bytes_held": 0, "peak_bytes_held": self._peak_held}
        feed, ahead = self._reading
        now = feed.held_bytes + int(getattr(ahead, "held_bytes", 0))
        peak = feed.peak_bytes + int(getattr(ahead, "peak_bytes", 0))
        self._peak_held = max(self._peak_held, peak, now)
        return {"bytes_held": now, "peak_bytes_held": self._peak_held}

    @property
    def quarantined(self) -> list[Quarantined]:
        """What ``ReadOptions(on_error="skip")`` skipped since the stream was made or its
        state loaded: shard URL, rows and reason, oldest first (also in the state)."""
        self._rank.flush()
        return self._book.quarantined()

    def listing(self) -> Listing:
        """List the source now (one listing; footers read once per shard)."""
        return self._planner.scan()

    @property
    def step(self) -> int:
        """The step of the last batch handed out, as a provenance log numbers it (the book's
        step; with ``pack``, the batches since the run began, less one); -1: none."""
        return self._node.step

    def replay(
        self,
        steps: int | Iterable[int],
        *,
        provenance: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> Iterator[tuple[int, int, Batch]]:
        """The batches of ``steps`` again, as each rank got them: ``(step, rank, batch)``.

        Made for a debugging session after a loss spike: make a stream with the run's
        source and settings (its transform above all), and replay the steps around the
        spike. Only the rows those steps consumed are read (the run's provenance log says
        which, :func:`ingest.which`), and the transform runs on them as the rank's feed ran
        it (:mod:`ingest.engine.replay`). Nothing is acked: the stream's own position and
        state do not move.

        Args:
            steps: A step, or several (a ``range``).
            provenance: The run's log; None: this stream's ``provenance=``.
            storage_options: fsspec options for the log (default: the stream's, when the log
                is on the source's store).

        Raises:
            ConfigError: If there is no log to read.
        """
        url = provenance or self.spec.provenance
        if url is None:
            raise ConfigError(
                "replay reads the run's provenance log: pass provenance= the URL the run "
                "was given as provenance=, or make this stream with it"
            )
        options = self.spec.options_for(url) if storage_options is None else storage_options
        log = ProvenanceLog(url, options).which(steps)
        source, read, columns = self._planner.source, self.spec.read, self.spec.columns
        yield from replayed(log, self.listing(), source, read, columns, self._transform, self.pack)

    def __len__(self) -> int:
        raise TypeError(
            "an ingest.Stream has no length and is not a map-style dataset: for worker "
            "processes use ingest.DataLoader(stream, num_workers=N), a torch DataLoader whose "
            "workers read disjoint shares and whose state_dict() covers them all"
        )

    def __iter__(self) -> Iterator[Batch]:
        """One epoch, or the rest of the one a loop left; a loop still held stops (see
        :class:`_Loop`). Over a Mix: one epoch of the mixture (:mod:`ingest.engine.mix`)."""
        with interrupts.deferred():  # a Ctrl-C in the rewind: at its end (interrupts)
            self._take_back()
            self._stop_active(superseded=True)
            if self._running:
                self._rewind()
            self._as_loaded = None
            loop = _Loop(self._run(self._next_epoch))
            self._active = weakref.ref(loop)
        return loop

    def lend(self, holder: Holder) -> None:
        """Let ``holder`` (an :class:`ingest.DataLoader`, whose workers read this stream's
        shares) run this stream's loop, until it gives it back (:meth:`release`). Meanwhile
        the stream stands where the holder stands: its state is the holder's, a loop over it
        takes over after the holder's last batch and a state loaded replaces the holder's
        place; either ends the holder's loop (:meth:`Holder.give_back`). A loop of the
        stream's own, or of another holder, ends here (that holder's place put into the
        stream first)."""
        if self._holder() is not holder:
            self._take_back()
        self._stop_active(superseded=True)
        self._lent = weakref.ref(holder)

    def count_lent(self, delivered: int, counts: Mapping[str, int] | None = None) -> None:
        """What a holder's loop (:meth:`lend`) handed out, for :attr:`stats`: ``delivered``
        rows of the epoch in progress so far, and ``counts`` grown since it last said (its
        nodes' ``tokens`` and ``padding_tokens``, with ``pack``)."""
        self._delivered = delivered
        for name, n in (counts or {}).items():
            self._lent_counts[name] = self._lent_counts.get(name, 0) + n

    def release(self, holder: Holder) -> None:
        """``holder``'s loop ended: the stream runs its own loops again (:meth:`lend`)."""
        if self._holder() is holder:
            self._lent = None

    def _holder(self) -> Holder | None:
        return self._lent() if self._lent is not None else None

    def _take_back(self) -> None:
        """End the holder's loop, its place put into this stream (:meth:`lend`)."""
        holder, self._lent = self._holder(), None
        if holder is not None:
            holder.give_back()

    def _stop_active(self, *, superseded: bool = False) -> None:
        """Close the loop in progress, if its caller still holds it; ``superseded``: a newer
        loop takes over, and the old one says so if it is asked for another batch."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.stop(superseded=superseded)
        self._active = None

    def _run(self, epoch: int) -> Generator[Batch | None, None, None]:
        """The epoch's loop: None once its start is done (its plan, its read-ahead begun:
        :meth:`_Loop.start`), then its batches."""
        book = self._book
        plan = book.rank_plan(0, epoch)
        self._running = True  # planned: a loop left from here on rewinds (a failed plan not)
        if plan.next_step == book.plan(epoch).first_step:
            self._delivered = 0
        feed = Feed(plan, self.spec.feed_config(), self._planner.source, self._transform)
        self._held()  # the last loop's peak is kept
        with feed.ahead(self.spec.urls[0]) as items:
            self._reading = (feed, items)
            node = self._node
            node.begin([s.url for s in plan.listing.shards])
            yield None  # started
            for item in items:
                made = node.finish(epoch, item) if isinstance(item, Tail) else node.feed(item)
                for rows, batch in made:
                    self._delivered += rows
                    yield batch
                if isinstance(item, Tail):
                    break
            self._report(epoch)
            self._next_epoch = epoch + 1
            self._running = False

    @staticmethod
    def _log(records: Sequence[Quarantined]) -> None:
        for q in records:
            _log.warning("quarantined (on_error='skip') %s", q.describe())

    def _report(self, epoch: int) -> None:
        """The list of what was skipped in ``epoch``, at its end."""
        records = [q for q in self._book.quarantined() if q.epoch == epoch]
        skips = [q for q in records if is_skip(q)]
        if skips:
            _log.warning(
                "epoch %d left out %d rows on request (ingest.skip): %s",
                epoch,
                summary(skips)["rows_skipped_on_request"],
                "; ".join(q.reason for q in skips),
            )
        records = [q for q in records if not is_skip(q)]
        if records:
            told = summary(records)
            ends = len({q.url for q in records if q.rows is None and q.stop is None})
            rest = f" and the rest of {ends} shard{'s' * (ends > 1)} (rows not counted)"
            _log.warning(
                "epoch %d skipped %d rows%s in %d quarantine(s) (on_error='skip'):\n  %s",
                epoch,
                told["rows_skipped"],
                rest if ends else "",
                told["quarantined"],
                "\n  ".join(q.describe() for q in records),
            )

    def _left_loop(self) -> None:
        """:meth:`_rewind` before a state is loaded; where the rewind itself fails (a shard
        of the loop's epoch gone), the loop's position is dropped, as the state replaces it."""
        try:
            self._rewind()
        except IngestError:
            self._running = False

    def _rewind(self) -> None:
        """Drop the read-ahead of a loop left early; the next loop starts after its last batch."""
        self._stop_active()
        book = self._book
        state = self._snapshot()
        listing = book.plan(state.progress.epoch).listing if state.started else None
        told = book.quarantined()
        book.load(state, listing)  # fails if a shard is gone: the next loop tries again
        self._node.load(state)
        # The state keeps its epoch's quarantines; those of earlier epochs stay listed.
        book.note_quarantined(q for q in told if q.epoch != state.progress.epoch)
        self._running = False
        self._next_epoch = state.progress.epoch

    @property
    def begun(self) -> bool:
        """Whether the stream planned an epoch (its first ``iter``, a ``state_dict``) or
        loaded a state; until then its ``state_dict()`` lists the source to give one (a
        mixture puts such a source back by beginning it again)."""
        return self._book.begun

    def state_dict(self) -> dict[str, Any]:
        """The state after the last batch handed out: plain JSON, see :mod:`ingest.core.state`
        (over a Mix, a state of several sources: :mod:`ingest.engine.mix`)."""
        holder = self._holder()
        held = holder.held_state() if holder is not None else None
        if held is not None:  # a DataLoader's loop runs: where it stands (see lend)
            return held
        with interrupts.deferred():  # its acks are sent whole (ingest.engine.interrupts)
            state = self._snapshot().to_json()
            self._book.fold(self._rank.step)
        if self._as_loaded is not None:  # no loop since: the state loaded, its ranks' places
            return self._as_loaded.to_json()
        return state

    def _snapshot(self) -> StreamState:
        """The state after the last batch handed out, its acks sent first (with ``pack``:
        the documents in flight too, see :meth:`ingest.engine.pack.PackedRank.state`)."""
        return self._node.state()

    def load_state_dict(
        self, state: Mapping[str, Any] | str | StreamState, *, listing: Listing | None = None
    ) -> None:
        """Continue exactly after ``state``: rows it consumed are never delivered again.

        The state may come from a :class:`ingest.RayStream` of any world size.

        Args:
            state: The state: its JSON (a dict or a string), or parsed.
            listing: The source as listed this epoch (:meth:`listing`), so that loading lists
                nothing (an :class:`ingest.DataLoader` hands back its epoch's); None: list now.

        Raises:
            StateError: If the state is malformed, of another version, another seed, or a
                dataset whose shards are gone or changed (new shards join next epoch).
        """
        parsed = state if isinstance(state, StreamState) else StreamState.from_json(state)
        with interrupts.deferred():  # loaded whole (ingest.engine.interrupts)
            self._take_back()  # (its place put here first: where a refused state leaves it)
            self._stop_active(superseded=True)
            if self._running:  # the loop left: put where the next loop would go on, so that
                self._left_loop()  # a state refused leaves the stream as it was
            step, cursor = self._rank.step, self._rank.cursor
            self._rank.restart(parsed.progress.step - 1)  # acks of the position left: gone
            self._running = False
            try:
                self._node.check(parsed)
                self._book.load(parsed, listing)
            except BaseException:
                self._rank.restart(step, cursor)
                raise
            self._node.load(parsed)
            self._next_epoch = parsed.progress.epoch
            self._delivered = parsed.progress.delivered
            inside = parsed.progress.step > parsed.progress.first_step
            self._as_loaded = parsed if inside else None

    def close(self) -> None:
        """Stop background reading. Iterating again resumes where the stream stopped.

        Never raises for a dataset that changed under the stream (a shard gone): the next
        loop says so, or resumes if the shard was restored.
        """
        self._stop_active()
        if self._running:
            with contextlib.suppress(IngestError):
                self._rewind()
        log = self._book.log
        if log is not None:  # the steps handed out since the last state, written too
            try:
                log.flush()
            except IngestError as e:  # told, not raised (close runs as a loop fails too)
                warnings.warn(f"the provenance log was not written whole: {e}", stacklevel=2)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Holder(Protocol):
    """What runs a stream's loop in the stream's stead (:meth:`Stream.lend`): an
    :class:`ingest.DataLoader`."""

    def held_state(self) -> dict[str, Any] | None:
        """The state after the holder's last batch (JSON); None while its loop has not
        begun its epoch."""

    def give_back(self) -> None:
        """End the holder's loop (it raises :class:`ingest.SupersededError` if asked for
        another batch), its place put into the stream (``load_state_dict``)."""


@dataclass(frozen=True, slots=True)
class StreamParts:
    """See :attr:`Stream.parts`."""

    spec: StreamSpec
    planner: Planner
    transform: Callable[[Any], Any] | None


class _Loop(interrupts.Guarded[Batch]):
    """One loop over a :class:`Stream`: its batches, for one consumer at a time.

    A stream delivers through one loop at a time, so that a state covers every batch handed
    out: a newer ``iter()`` or a loaded state stops the loop, which then raises
    :class:`ingest.SupersededError` if asked for another batch (it ended silently, as if the
    epoch were over). Two threads that ask one loop at once, or a new loop while another
    thread is inside this one, get a :class:`ingest.ConfigError` (a generator raised
    ``ValueError: generator already executing``). A Ctrl-C loses no batch
    (:class:`ingest.engine.interrupts.Guarded`).
    """

    def __init__(self, run: Generator[Batch | None, None, None]) -> None:
        # No reference back to the loop from its generators: a loop let go is freed at once
        # (its read-ahead stopped) in the thread that let it go, not by the collector in any
        # thread, its own read-ahead's among them (which cannot join itself).
        self._run = run
        self._started = _Started()
        super().__init__(_batches(run, self._started))
        self._busy = threading.Lock()
        self._superseded = False

    def start(self) -> None:
        """Begin the loop's epoch now, no batch handed out: its plan made (its listing, the
        first time) and its read-ahead begun. A mixture starts its sources side by side so
        (:class:`ingest.engine.mix.Draws`), each in a thread of its own: their listings and
        first reads overlap instead of waiting for the draws before."""
        self._acquire()
        try:
            _begin(self._run, self._started)
        finally:
            self._release()

    def _acquire(self) -> None:
        if self._superseded:
            raise SupersededError(
                "a newer loop over this ingest.Stream (iter(stream) again, or "
                "load_state_dict) took over from this one, after its last batch; iterate the "
                "newest loop only"
            )
        if not self._busy.acquire(blocking=False):
            raise _two_threads()

    def _release(self) -> None:
        self._busy.release()

    def stop(self, *, superseded: bool) -> None:
        """End the loop (its read-ahead stops); ``superseded``: say so when next asked."""
        if not self._busy.acquire(blocking=False):
            raise _two_threads()
        try:
            self._superseded = superseded
            super().close()
            self._run.close()  # (started apart: not inside _batches yet)
        finally:
            self._busy.release()

    def close(self) -> None:
        self.stop(superseded=False)


class _Started:
    """Whether a loop's epoch has begun (its first item, None, taken)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


def _begin(run: Generator[Batch | None, None, None], started: _Started) -> None:
    if not started.done:
        started.done = True
        if next(run) is not None:  # pragma: no cover - Stream._run's first item
            raise AssertionError("a stream's loop handed out a batch before its start")


def _batches(
    run: Generator[Batch | None, None, None], started: _Started
) -> Generator[Batch, None, None]:
    """``run``'s batches, its start taken first where :meth:`_Loop.start` did not."""
    _begin(run, started)
    yield from cast("Generator[Batch, None, None]", run)  # (its None taken above)


def _two_threads() -> ConfigError:
    return ConfigError(
        "another thread is inside a loop over this ingest.Stream: a stream hands out its "
        "batches through one loop in one thread at a time; for several consumers use "
        "ingest.DataLoader(stream, num_workers=N) or an ingest.RayStream's rank iterators"
    )


__all__ = ["Stream"]
