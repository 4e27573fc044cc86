"""A mixture's provenance log: which draw of which source each slot of a mixed batch was.

A stream over an :class:`ingest.Mix` given ``provenance=URL`` keeps two kinds of log:

- ``URL/sources/<name>``: each source's own stream's log (:mod:`ingest.engine.provenance`),
  with its own attempts; the source's steps are its draws (a row, or one packed sequence).
- ``URL/mix``: for every mixed step and rank, the source and the source's step of each slot
  of the batch (:class:`MixLog`), logged as the draws are pulled: a plain source's steps can
  skip numbers (an epoch's end, a rank's empty step), so they are not recomputed.

:func:`which_mixed` joins the two: the rows (or pieces) each slot of a mixed step held.
:func:`skip_mixed` leaves the rows of some mixed steps out of each source's part of a state.

Under ``URL/mix`` (written by rank 0 alone: every rank of a Ray worker group draws alike,
the same sources and each source's same steps, so rank 0's slots are every rank's, and a
lookup reads one chunk however many ranks):

- ``attempts/<attempt>-<rank>.json``: one per rank that logs an attempt (a one-process
  stream's name is random; a Ray worker group's is its first source's coordinator session,
  which a new group or a loaded state changes), with its world size.
- ``steps/<bucket>/<first>-<last>-<attempt>-<rank>-<n>.arrow``: a chunk of one rank's steps
  ``first..last`` (``step``, ``rank``, ``slot``, ``source``, ``source_step``), in folders of
  :data:`~ingest.engine.provenance.BUCKET_STEPS` steps.

Mixed steps are numbered since the run began (the mixer's batches, kept in the state), and
a resume supersedes the steps from its first on, as in a one-source log
(:func:`ingest.core.provenance.authoritative`). A chunk is written every
:data:`FOLD_STEPS` steps behind the loop, and waited for at each state and each epoch's end
of the mixture, so a state is covered by its log.
"""

from __future__ import annotations

import json
import secrets
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.core import url_to_fs

from ingest.core.errors import StateError, redact
from ingest.core.provenance import Attempt, authoritative
from ingest.core.skipping import SkipRows, apply_skip
from ingest.core.state import SourcesState, read_state
from ingest.engine.provenance import (
    BUCKET_STEPS,
    ProvenanceError,
    ProvenanceLog,
    ProvenanceWarning,
    WriteBehind,
    list_chunks,
    put_whole,
    read_attempts,
    step_span,
    steps_logged,
)
from ingest.formats.arrays import ints, strings

FOLD_STEPS = 64
"""Mixed steps a rank holds before its chunk is written (behind the loop)."""

_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("rank", pa.int32()),
        ("slot", pa.int32()),
        ("source", pa.dictionary(pa.int32(), pa.string())),
        ("source_step", pa.int64()),
    ]
)
_WRITE = pa.ipc.IpcWriteOptions(compression="zstd")
_KEYS = ["step", "rank", "slot", "source", "source_step"]


def source_log(url: str, name: str) -> str:
    """Where the source ``name`` of a mixture logged at ``url`` keeps its own log."""
    return f"{url.rstrip('/')}/sources/{name}"


def mix_log(url: str) -> str:
    """Where a mixture logged at ``url`` keeps which source step each slot was."""
    return f"{url.rstrip('/')}/mix"


def is_mixed(url: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether the log at ``url`` is a mixture's (``URL/mix`` is there)."""
    try:
        fs, root = url_to_fs(mix_log(url), **dict(storage_options or {}))
    except (ImportError, ValueError):
        return False  # the one-source reader says what is wrong with the URL
    return bool(fs.exists(root))


class MixLog:
    """One rank's log of a mixture's batches: the source step of each draw, a chunk of steps
    at a time, written in a thread behind the loop. Picklable: a copy holds nothing and
    starts its own attempt.

    Args:
        url: The stream's ``provenance=`` (this log goes under ``URL/mix``).
        storage_options: fsspec options for ``url``.
        rank: The rank whose batches these are.
        world_size: The ranks drawing alike.
        batch_size: Draws per mixed batch (every batch is full).
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None,
        rank: int,
        world_size: int,
        batch_size: int,
    ) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self._root: str | None = None
        self._fs: Any = None
        self._attempt: str | None = None
        self._picks: list[tuple[str, int]] = []
        self._held: list[tuple[int, list[tuple[str, int]]]] = []
        self._chunks = 0
        self._behind = WriteBehind("ingest-mix-provenance", self._write)

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.url, self.storage_options, self.rank, self.world_size, self.batch_size)
        return (MixLog, args)

    def restart(self) -> None:
        """A state was loaded: the next batch begins a new attempt (draws pulled for a batch
        not handed out are forgotten)."""
        self._picks = []
        if self._attempt is not None:
            self.flush(wait=False)
        self._attempt = None

    def pulled(self, source: str, source_step: int) -> None:
        """A draw of the batch being made: ``source``'s step ``source_step``."""
        self._picks.append((source, source_step))

    def batch(self, step: int, attempt: Callable[[], str]) -> None:
        """The batch whose draws were pulled is handed out as mixed step ``step``
        (:attr:`ingest.engine.mix.Mixer.step`); ``attempt`` names the attempt if this batch
        begins one."""
        picks, self._picks = self._picks[-self.batch_size :], []
        if self._attempt is None:
            self._attempt = attempt()
            self._announce(self._attempt, step)
        self._held.append((step, picks))
        if len(self._held) >= FOLD_STEPS:
            self.flush(wait=False)

    def flush(self, *, wait: bool = True) -> None:
        """Write the steps held: behind the caller, or (``wait``) before returning.

        Raises:
            ProvenanceError: If a chunk could not be written.
        """
        held, self._held = self._held, []
        if held and self._attempt is not None:
            self._behind.put(self._attempt, held)
        if wait:
            self._behind.wait()
        failed = self._behind.failure()
        if failed is not None:
            raise ProvenanceError(
                mix_log(self.url),
                f"writing a chunk failed ({type(failed).__name__}: {failed})",
                "check that the URL is writable from every rank's process, or leave "
                "provenance= out",
            ) from failed

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            try:
                self._fs, root = url_to_fs(mix_log(self.url), **self.storage_options)
            except (ImportError, ValueError) as e:
                raise ProvenanceError(
                    self.url, str(e), "install the fsspec backend or fix the URL"
                ) from e
            self._root = root
        return self._fs, str(self._root)

    def _announce(self, name: str, first_step: int) -> None:
        fs, root = self._filesystem()
        data = {
            "name": name,
            "first_step": first_step,
            "started_ns": time.time_ns(),
            "world_size": self.world_size,
            "rank": self.rank,
        }
        put_whole(fs, f"{root}/attempts/{name}-{self.rank}.json", json.dumps(data).encode())

    def _write(self, name: str, held: list[tuple[int, list[tuple[str, int]]]]) -> None:
        fs, root = self._filesystem()
        by_bucket: dict[int, list[tuple[int, list[tuple[str, int]]]]] = {}
        for h in sorted(held, key=lambda h: h[0]):
            by_bucket.setdefault(h[0] // BUCKET_STEPS, []).append(h)
        for bucket, part in by_bucket.items():
            self._chunks += 1
            first, last = part[0][0], part[-1][0]
            file = f"{first:012d}-{last:012d}-{name}-{self.rank}-{self._chunks:05d}.arrow"
            put_whole(fs, f"{root}/steps/{bucket:06d}/{file}", self._chunk(part))

    def _chunk(self, part: list[tuple[int, list[tuple[str, int]]]]) -> bytes:
        rows = [(step, slot, s, k) for step, picks in part for slot, (s, k) in enumerate(picks)]
        n = len(rows)
        table = pa.Table.from_arrays(
            [
                ints([r[0] for r in rows]),
                ints(np.full(n, self.rank), pa.int32()),
                ints([r[1] for r in rows], pa.int32()),
                strings([r[2] for r in rows]).dictionary_encode(),
                ints([r[3] for r in rows]),
            ],
            schema=_SCHEMA,
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, _SCHEMA, options=_WRITE) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue())


def logged(
    batches: Iterator[Any], log: MixLog | None, step: Callable[[], int], attempt: Callable[[], str]
) -> Iterator[Any]:
    """``batches`` (a mixer's), each logged as it is handed out (``step``: the mixer's step
    of the last batch), and the log written at the end of the mixture's epoch."""
    if log is None:
        yield from batches
        return
    for batch in batches:
        log.batch(step(), attempt)
        yield batch
    log.flush()


def new_attempt() -> str:
    """A one-process stream's attempt name (its start and a random part)."""
    return f"{time.time_ns():x}-{secrets.token_hex(4)}"


# -- reading -----------------------------------------------------------------------------------


class MixedLog:
    """A mixture's log, read: which source step each slot of a mixed step was.

    Args:
        url: The stream's ``provenance=``.
        storage_options: fsspec options for ``url``.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        try:
            self._fs, self._root = url_to_fs(mix_log(self.url), **self.storage_options)
        except (ImportError, ValueError) as e:
            raise ProvenanceError(url, str(e), "install the fsspec backend or fix the URL") from e

    def attempts(self) -> list[Attempt]:
        """Every attempt, oldest first (an attempt's ranks grouped by its name).

        Raises:
            ProvenanceError: If no attempt is recorded there.
        """
        found = read_attempts(self._fs, self._root)
        if not found:
            raise ProvenanceError(
                mix_log(self.url),
                "no attempt is recorded there",
                "pass the URL a stream over an ingest.Mix was given as provenance= (it "
                "writes its first chunk at its first state or after 64 steps)",
            )
        return sorted(found.values(), key=lambda a: (a.started_ns, a.name))

    def slots(self, steps: int | Iterable[int]) -> pa.Table:
        """``step``, ``rank``, ``slot``, ``source``, ``source_step`` of ``steps``, as the
        authoritative attempt of each step logged them."""
        wanted = [steps] if isinstance(steps, int) else sorted(set(steps))
        attempts = self.attempts()
        by_chunk: dict[str, list[int]] = {}
        listed: dict[int, list[tuple[int, int, str, str]]] = {}
        ranks: dict[int, int] = {}  # per step, its attempt's world size
        for step in wanted:
            chosen = authoritative(attempts, step)
            if chosen is None:
                continue
            ranks[step] = chosen.world_size
            bucket = step // BUCKET_STEPS
            if bucket not in listed:
                listed[bucket] = self._chunks(bucket)
            for first, last, name, path in listed[bucket]:
                if name == chosen.name and first <= step <= last:
                    by_chunk.setdefault(path, []).append(step)
        tables = [t for path, got in by_chunk.items() if (t := self._read(path, got)) is not None]
        if not tables:
            return _plain_schema().empty_table()
        out = _every_rank(pa.concat_tables(tables), ranks)
        return out.sort_by([("step", "ascending"), ("rank", "ascending"), ("slot", "ascending")])

    def _chunks(self, bucket: int) -> list[tuple[int, int, str, str]]:
        return list_chunks(self._fs, self._root, bucket, tail=2)  # ...-<rank>-<n>.arrow

    def _read(self, path: str, steps: list[int]) -> pa.Table | None:
        try:
            with self._fs.open(path, "rb") as f:
                table = pa.ipc.open_file(f).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            warnings.warn(
                f"mixture provenance chunk {redact(path)} left out: it cannot be read whole "
                f"({e}); a writer stopped while writing it",
                ProvenanceWarning,
                stacklevel=4,
            )
            return None
        table = table.filter(pc.is_in(table["step"], pa.array(steps, pa.int64())))
        return table.set_column(3, "source", table["source"].cast(pa.string()))


def _every_rank(table: pa.Table, ranks: Mapping[int, int]) -> pa.Table:
    """Rank 0's slots as every rank's: each step's rows once per rank of its attempt (the
    ranks of a Ray worker group draw alike; rank 0 alone logs them)."""
    step = table["step"].to_numpy()
    copies = np.fromiter((ranks[s] for s in step.tolist()), np.int64, len(step))
    out = table.take(pa.array(np.repeat(np.arange(len(step)), copies)))
    # each row's copies numbered 0.. (the ranks): position less the start of its run
    starts = np.repeat(np.cumsum(copies) - copies, copies)
    rank = (np.arange(int(copies.sum())) - starts).astype(np.int32)
    return out.set_column(1, "rank", pa.array(rank))


def _plain_schema() -> pa.Schema:
    return _SCHEMA.set(3, pa.field("source", pa.string()))


def which_mixed(
    url: str, steps: int | Iterable[int], *, storage_options: Mapping[str, Any] | None = None
) -> pa.Table:
    """The rows each slot of each rank's mixed ``steps`` held, in the run of a stream over an
    :class:`ingest.Mix` whose ``provenance=`` was ``url``.

    One row per run of rows (per piece, with packing), by step, rank, slot, then the source's
    order: the mixed ``step``, ``rank``, ``slot`` (the batch's row, or sequence with
    packing), ``source`` (its name in the Mix) and ``source_step`` (the source's own step:
    its draw), then the columns the source's own log answers for that step and rank
    (:meth:`ingest.engine.provenance.ProvenanceLog.which`: ``epoch`` (the source's),
    ``url``, ``start``, ``stop``, and with packing ``sequence`` (0: the draw's one
    sequence), ``token_start``, ``token_stop``). A slot its source's log has no row for (a
    chunk that could not be read) has nulls there. A step no attempt logged has no row.

    Raises:
        ProvenanceError: If no mixture's log is at ``url``.
    """
    slots = MixedLog(url, storage_options).slots(steps)
    parts = []
    for name in sorted(set(slots["source"].to_pylist())):
        mine = slots.filter(pc.equal(slots["source"], name))
        asked = sorted(set(mine["source_step"].to_pylist()))
        own = ProvenanceLog(source_log(url, name), storage_options).which(asked)
        own = own.append_column("_order", pa.array(np.arange(own.num_rows, dtype=np.int64)))
        own = own.rename_columns(["source_step" if c == "step" else c for c in own.column_names])
        parts.append(
            mine.join(own, keys=["source_step", "rank"], join_type="left outer", use_threads=False)
        )
    if not parts:
        return _plain_schema().empty_table()
    out = pa.concat_tables(parts, promote_options="default")
    out = out.sort_by([(k, "ascending") for k in ("step", "rank", "slot", "_order")])
    columns = [*_KEYS, *(c for c in out.column_names if c not in (*_KEYS, "_order"))]
    return out.select(columns)


def skip_mixed(
    state: Mapping[str, Any] | str | SourcesState,
    *,
    steps: Iterable[int] | None = None,
    rows: Iterable[tuple[str, int, int]] | None = None,
    provenance: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A mixture's ``state`` with rows left out of its sources' parts (``ingest.skip`` of a
    mixture's state): each source's part as :func:`ingest.skip` leaves out a one-source
    state's rows, the mixture's counts unchanged.

    Args:
        state: A state a stream over an :class:`ingest.Mix` saved.
        steps: Leave out every row these mixed steps consumed on any rank, from every
            source, as the run's log recorded them (``provenance``).
        rows: Leave out these ``(url, start, stop)`` rows, in every source that lists the URL.
        provenance: The run's ``provenance=``, for ``steps``.
        storage_options: fsspec options for ``provenance``.

    Raises:
        ProvenanceError: If ``steps`` is given without a log, or a step is in none of its
            attempts.
        StateError: If the state is not a mixture's, or a source's rows are of an earlier
            epoch than its part's (skip them from a state saved in that epoch).
    """
    parsed = state if isinstance(state, SourcesState) else read_state(state)
    if not isinstance(parsed, SourcesState):
        raise StateError(
            "this state is not a mixture's (no 'sources'): skip its rows with ingest.skip"
        )
    wanted: dict[str, list[SkipRows]] = {name: [] for name in parsed.parts}
    asked: list[str] = []
    if steps is not None:
        asked.append(f"mixed steps {step_span(sorted(set(steps)))}")
        for name, got in _rows_of_steps(sorted(set(steps)), provenance, storage_options).items():
            wanted[name] += got
    given = list(rows or ())
    if given:
        asked.append(f"{len(given)} row range(s)")
        for name, part in parsed.parts.items():
            # a local shard is listed as file://PATH; its bare path names it too
            urls = {u for s in part.shards for u in (s.url, s.url.removeprefix("file://"))}
            wanted[name] += [SkipRows(u, int(a), int(b)) for u, a, b in given if u in urls]
    parts = dict(parsed.parts)
    for name, skip in wanted.items():
        if skip:
            parts[name], _ = apply_skip(parts[name], skip, f"{', '.join(asked)} (source {name})")
    out = SourcesState(parts, parsed.drawn, parsed.taken, parsed.mixture)
    return out.to_json()  # type: ignore[no-any-return]


def _rows_of_steps(
    steps: list[int], provenance: str | None, storage_options: Mapping[str, Any] | None
) -> dict[str, list[SkipRows]]:
    table = steps_logged(
        steps,
        provenance,
        lambda url: which_mixed(url, steps, storage_options=storage_options),
        "mixed step",
        mix_log,
    )
    assert provenance is not None  # steps_logged refused none
    out: dict[str, list[SkipRows]] = {}
    for r in table.to_pylist():
        if r["url"] is None:
            raise ProvenanceError(
                source_log(provenance, r["source"]),
                f"source step {r['source_step']} of rank {r['rank']} (mixed step "
                f"{r['step']}) has no row in the source's log",
                "name the rows with rows= instead",
            )
        out.setdefault(r["source"], []).append(
            SkipRows(r["url"], r["start"], r["stop"], r["epoch"])
        )
    return out


__all__ = [
    "FOLD_STEPS",
    "MixLog",
    "MixedLog",
    "is_mixed",
    "logged",
    "mix_log",
    "new_attempt",
    "skip_mixed",
    "source_log",
    "which_mixed",
]
