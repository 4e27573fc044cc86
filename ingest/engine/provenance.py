"""A run's provenance log at an fsspec URL: written by its book, read by ``ingest which``.

What is kept and why is in :mod:`ingest.core.provenance`. The layout under the URL:

- ``attempts/<name>.json``: one per book (:class:`~ingest.core.provenance.Attempt`), written
  with its first chunk.
- ``steps/<bucket>/<first>-<last>-<attempt>-<n>.arrow``: a chunk, the steps ``first..last``
  some ranks acked, as a zstd Arrow IPC file with one record batch per step (``step``,
  ``rank``, ``epoch``, ``url``, ``start``, ``stop``: one row per run of rows, in the order
  the batch held them). A chunk never crosses a bucket of :data:`BUCKET_STEPS` steps, so a
  lookup lists one folder, and reads only the record batches of its steps.

A chunk is written whole when the book folds (every 64 steps) and before every state, so a
state a run saved is covered by its log. A chunk that cannot be parsed (a writer killed
while writing one) is left out of every answer with a warning.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.core import url_to_fs

from ingest.core.errors import ConfigError, LocationError, redact
from ingest.core.provenance import PIECE_WIDTH, Attempt, StepRows, authoritative
from ingest.core.skipping import SkipRows, apply_skip
from ingest.core.state import StreamState, read_state
from ingest.formats.arrays import ints, strings
from ingest.storage.sources.files import is_local

BUCKET_STEPS = 4096
"""Steps per folder of chunks: a lookup lists one folder (and the one before, for chunks
that start there), however long the run."""
BATCH_RUNS = 1 << 16
"""Runs of rows (about rows, shuffled) per record batch of a chunk, at least: whole steps."""
FLUSH_ROWS = 1 << 20
"""Runs held before a chunk is written between folds (memory: about 40 bytes a run)."""

_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("rank", pa.int32()),
        ("epoch", pa.int32()),
        ("url", pa.dictionary(pa.int32(), pa.string())),
        ("start", pa.int64()),
        ("rows", pa.int32()),
    ]
)
"""A chunk's columns. A run's length, not its stop: a shuffled batch's runs are a row each,
so ``rows`` is all ones and compresses to nothing (3.4 bytes a row, 5.2 with ``stop``)."""
_PIECES = (
    _SCHEMA.append(pa.field("sequence", pa.int32()))
    .append(pa.field("token_start", pa.int64()))
    .append(pa.field("token_stop", pa.int64()))
)
"""A packing stream's chunk: a row per piece of a document in a batch (``rows`` 1), the
batch's sequence it went into and its tokens ``[token_start, token_stop)`` of the row."""
_WRITE = pa.ipc.IpcWriteOptions(compression="zstd")


class ProvenanceError(LocationError):
    """A provenance log cannot be read or written, or holds no answer for a step."""

    what = "provenance log"


class ProvenanceWarning(UserWarning):
    """A chunk of a provenance log was left out (it could not be read whole)."""


class WriteBehind:
    """Writes done in order by one daemon thread behind the caller (a log's chunks: a few
    milliseconds of compression each, off the training loop's path); a write that fails is
    told at the next :meth:`failure`, and the ones after it are not tried.

    Daemon: an exit may lose the writes handed over since the last :meth:`wait` (a state
    waits for them, so none that a state covers).

    Args:
        name: The thread's name.
        write: Does one write, with the arguments handed to :meth:`put`.
    """

    def __init__(self, name: str, write: Callable[..., None]) -> None:
        self._name = name
        self._write = write
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    def put(self, *args: Any) -> None:
        """Have ``write(*args)`` done behind the caller, after the ones handed over before."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put(args)

    def wait(self) -> None:
        """Return once every write handed over is done (or failed)."""
        self._queue.join()

    def failure(self) -> BaseException | None:
        """The failure of a write since the last call, if one failed (then forgotten)."""
        failed, self._failed = self._failed, None
        return failed

    def _run(self) -> None:
        while True:
            args = self._queue.get()
            try:
                if self._failed is None:
                    self._write(*args)
            except BaseException as e:  # told at the next failure()
                self._failed = e
            finally:
                self._queue.task_done()


def read_attempts(fs: Any, root: str) -> dict[str, Attempt]:
    """The attempts recorded under ``root/attempts/`` by name; an attempt recorded by each of
    its ranks (a mixture's log) is as old as its first rank and starts at its first step."""
    found: dict[str, Attempt] = {}
    try:
        paths = fs.glob(f"{root}/attempts/*.json")
    except FileNotFoundError:
        paths = []
    for path in paths:
        data = json.loads(fs.cat_file(path))
        a = Attempt(
            str(data["name"]),
            int(data["first_step"]),
            int(data["started_ns"]),
            int(data["world_size"]),
        )
        seen = found.get(a.name)
        if seen is not None:
            started = min(a.started_ns, seen.started_ns)
            a = Attempt(a.name, min(a.first_step, seen.first_step), started, a.world_size)
        found[a.name] = a
    return found


def list_chunks(fs: Any, root: str, bucket: int, tail: int = 1) -> list[tuple[int, int, str, str]]:
    """``(first, last, attempt, path)`` of the chunks under ``root/steps/<bucket>/``, each
    named ``<first>-<last>-<attempt>-...`` with ``tail`` more ``-`` parts after the attempt's
    name (which holds ``-`` itself)."""
    try:
        paths = fs.glob(f"{root}/steps/{bucket:06d}/*.arrow")
    except FileNotFoundError:
        paths = []
    out = []
    for path in paths:
        first, last, rest = os.path.basename(path).split("-", 2)
        out.append((int(first), int(last), rest.rsplit("-", tail)[0], path))
    return out


class ProvenanceWriter:
    """The :class:`~ingest.core.provenance.StepLog` a book writes at ``url``.

    Picklable (a stream's spec carries it to the coordinator's process): what it holds is
    left behind, and the copy starts no attempt until its book starts one.

    Args:
        url: A directory or an fsspec URL (``s3://bucket/run-7/provenance/``).
        storage_options: fsspec options for ``url`` (never written anywhere).
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigError(f"provenance={url!r}: pass a directory or an fsspec URL")
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._root = ""
        self._attempt: Attempt | None = None
        self._announced: set[str] = set()
        self._held: list[_Held] = []
        self._held_runs = 0
        self._chunks = 0
        self._lock = threading.Lock()
        self._behind = WriteBehind("ingest-provenance", self._write)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ProvenanceWriter({redact(self.url)!r})"

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            try:
                self._fs, self._root = url_to_fs(self.url, **self.storage_options)
            except (ImportError, ValueError) as e:
                raise ProvenanceError(
                    self.url, str(e), "install the fsspec backend or fix the URL"
                ) from e
        return self._fs, self._root

    # -- StepLog ----------------------------------------------------------------------------

    def start(self, first_step: int, world_size: int) -> None:
        with self._lock:
            self._hand_over()  # a book loads a state: what the last attempt holds is kept
            self._attempt = Attempt(
                f"{time.time_ns():x}-{secrets.token_hex(4)}",
                first_step,
                time.time_ns(),
                world_size,
            )

    def record(
        self, rank: int, epoch: int, urls: Sequence[str], steps: Sequence[tuple[int, StepRows]]
    ) -> None:
        with self._lock:
            for step, rows in steps:
                self._held.append((step, rank, epoch, urls, rows))
                self._held_runs += len(rows)
            if self._held_runs >= FLUSH_ROWS:
                self._hand_over()

    def flush(self, *, wait: bool = True) -> None:
        """Write what is held: in the writer's thread (``wait=False``: a fold, on the
        training loop's path), or and wait for every chunk handed over to be written (a
        state, an epoch's end: what a state covers is written before it is returned).

        Raises:
            ProvenanceError: If a chunk could not be written (this one, or one written
                behind since the last call).
        """
        with self._lock:
            self._hand_over()
        if wait:
            self._behind.wait()
        self._raise_failure()

    # -- writing ----------------------------------------------------------------------------

    def _hand_over(self) -> None:
        """Give what is held to the writer's thread (one thread, chunks in order)."""
        held, self._held, self._held_runs = self._held, [], 0
        if not held or self._attempt is None:
            return
        self._behind.put(self._attempt, held)

    def _raise_failure(self) -> None:
        failed = self._behind.failure()
        if failed is None:
            return
        if isinstance(failed, ProvenanceError):
            raise failed
        raise ProvenanceError(
            self.url,
            f"writing a chunk failed ({type(failed).__name__}: {failed})",
            "check that the URL is writable from this process (the coordinator's node "
            "for a RayStream), or leave provenance= out",
        ) from failed

    def _write(self, attempt: Attempt, held: list[_Held]) -> None:
        fs, root = self._filesystem()
        if attempt.name not in self._announced:
            put_whole(fs, f"{root}/attempts/{attempt.name}.json", _attempt_json(attempt))
            self._announced.add(attempt.name)
        held.sort(key=lambda h: (h[0], h[1]))
        by_bucket: dict[int, list[_Held]] = {}
        for h in held:
            by_bucket.setdefault(h[0] // BUCKET_STEPS, []).append(h)
        for bucket, part in by_bucket.items():
            first, last = part[0][0], part[-1][0]
            self._chunks += 1
            name = f"{first:012d}-{last:012d}-{attempt.name}-{self._chunks:05d}.arrow"
            put_whole(fs, f"{root}/steps/{bucket:06d}/{name}", _chunk(part))


_Held = tuple[int, int, int, Sequence[str], StepRows]
"""``(step, rank, epoch, the epoch's shard URLs, rows)``: one rank's step, not written yet."""


def _attempt_json(a: Attempt) -> bytes:
    return json.dumps(
        {
            "name": a.name,
            "first_step": a.first_step,
            "started_ns": a.started_ns,
            "world_size": a.world_size,
        }
    ).encode()


def put_whole(fs: Any, path: str, data: bytes) -> None:
    """Write ``data`` at ``path`` whole (a reader never sees part of it): a local file by
    rename, a store object by one put."""
    if is_local(fs):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    else:
        fs.pipe_file(path, data)


def _chunk(part: Sequence[tuple[int, int, int, Sequence[str], StepRows]]) -> bytes:
    """One chunk's bytes (``part`` sorted by step): a record batch per step, URLs as one
    dictionary. Vectorised over the records: a coordinator of 1,024 ranks logs 1,024 a step."""
    n = len(part)
    lens = np.fromiter((len(h[4]) for h in part), dtype=np.int64, count=n)
    width = part[0][4].shape[1] if part[0][4].ndim == 2 else 3
    rows = np.concatenate([h[4] for h in part]).reshape(-1, width).astype(np.int64)
    lists: dict[int, int] = {}
    listed: list[Sequence[str]] = []
    which_list = np.empty(n, dtype=np.int64)
    for k, h in enumerate(part):
        got = lists.get(id(h[3]))
        if got is None:
            got = lists[id(h[3])] = len(listed)
            listed.append(h[3])
        which_list[k] = got
    # one dictionary entry per (epoch's listing, shard) the chunk names
    key = (np.repeat(which_list, lens) << 32) | rows[:, 0]
    uniq, inverse = np.unique(key, return_inverse=True)
    names = []
    for k in uniq.tolist():
        urls, shard = listed[k >> 32], k & 0xFFFFFFFF
        names.append(urls[shard] if shard < len(urls) else f"shard {shard}")
    step = np.repeat(np.fromiter((h[0] for h in part), dtype=np.int64, count=n), lens)
    columns = [
        ints(step),
        ints(np.repeat(np.fromiter((h[1] for h in part), np.int32, n), lens), pa.int32()),
        ints(np.repeat(np.fromiter((h[2] for h in part), np.int32, n), lens), pa.int32()),
        pa.DictionaryArray.from_arrays(ints(inverse.reshape(-1), pa.int32()), strings(names)),
        ints(rows[:, 1]),
        ints(rows[:, 2] - rows[:, 1], pa.int32()),
    ]
    kind = _SCHEMA
    if width == PIECE_WIDTH:  # a packing stream's pieces
        kind = _PIECES
        columns += [ints(rows[:, 3], pa.int32()), ints(rows[:, 4]), ints(rows[:, 5])]
    table = pa.RecordBatch.from_arrays(columns, schema=kind)
    # A record batch per run of whole steps of BATCH_RUNS runs or more (compressing many
    # small buffers costs more than the bytes: 25 -> 5 ms a chunk of 64 steps of 1,024
    # rows), its steps in the schema's metadata: a lookup reads the footer and the record
    # batch of its step, however many ranks.
    starts = np.concatenate(([0], np.flatnonzero(np.diff(step)) + 1))
    cuts, ranges, at = [0], [], 0
    for start in [*starts.tolist()[1:], len(step)]:  # each step's end
        if start - at >= BATCH_RUNS or start == len(step):
            ranges.append([int(step[at]), int(step[start - 1])])
            cuts.append(start)
            at = start
    schema = kind.with_metadata({b"steps": json.dumps(ranges).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema, options=_WRITE) as writer:
        for a, b in itertools.pairwise(cuts):
            writer.write_batch(table.slice(a, b - a))
    return bytes(sink.getvalue())


# -- reading ---------------------------------------------------------------------------------


class ProvenanceLog:
    """A run's provenance log, read: which rows each rank's step consumed.

    Args:
        url: Where the run wrote it (the stream's ``provenance=``).
        storage_options: fsspec options for ``url``.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        try:
            self._fs, self._root = url_to_fs(self.url, **dict(storage_options or {}))
        except (ImportError, ValueError) as e:
            raise ProvenanceError(url, str(e), "install the fsspec backend or fix the URL") from e
        self._attempts: dict[str, Attempt] | None = None
        self._listed: dict[int, list[tuple[int, int, str, str]]] = {}
        self._bad: set[str] = set()
        """Chunks that could not be read whole (told once)."""

    def attempts(self) -> list[Attempt]:
        """Every attempt of the run, oldest first."""
        if self._attempts is None:
            found = read_attempts(self._fs, self._root)
            if not found:
                raise ProvenanceError(
                    self.url,
                    "no attempt is recorded there",
                    "pass the URL the run was given as provenance= (it writes its first "
                    "chunk at its first fold, 64 steps, or its first state)",
                )
            self._attempts = found
        return sorted(self._attempts.values(), key=lambda a: a.started_ns)

    def _chunks(self, bucket: int) -> list[tuple[int, int, str, str]]:
        """``(first, last, attempt, path)`` of the chunks filed under ``bucket``."""
        if bucket not in self._listed:
            self._listed[bucket] = list_chunks(self._fs, self._root, bucket)
        return self._listed[bucket]

    def which(self, steps: int | Iterable[int]) -> pa.Table:
        """The rows each rank's ``steps`` consumed, as the run's authoritative attempt
        recorded them: one row per run of rows (``step``, ``rank``, ``epoch``, ``url``,
        ``start``, ``stop``), by step, rank, then the batch's order. A step no attempt
        recorded (not reached, or rolled back and not reached again) has no row.

        A packing stream's log (``pack=``) answers a row per piece of a document in the
        step's batch, in the batch's order: the row (``start``, ``stop`` = ``start + 1``),
        the batch's ``sequence`` it went into, and its tokens ``[token_start, token_stop)``
        (the document's, counted from its first token)."""
        wanted = [steps] if isinstance(steps, int) else sorted(set(steps))
        attempts = self.attempts()
        by_chunk: dict[str, list[int]] = {}  # each chunk read once for all its steps asked
        for step in wanted:
            chosen = authoritative(attempts, step)
            if chosen is None:
                continue
            for first, last, name, path in self._chunks(step // BUCKET_STEPS):
                if name == chosen.name and first <= step <= last:
                    by_chunk.setdefault(path, []).append(step)
        tables = [self._read_steps(path, got) for path, got in by_chunk.items()]
        found = [_plain(t) for t in tables if t is not None]
        if not found:
            return _PLAIN.empty_table()
        if len({t.schema for t in found}) > 1:  # pragma: no cover - a log holds one kind
            raise ProvenanceError(
                self.url,
                "it holds both row runs and packed pieces",
                "give each stream its own provenance= URL",
            )
        return pa.concat_tables(found).sort_by([("step", "ascending"), ("rank", "ascending")])

    def _read_steps(self, path: str, steps: list[int]) -> pa.Table | None:
        """The rows of ``steps`` in one chunk; None: none, or a chunk that cannot be read
        whole (told once)."""
        if path in self._bad:
            return None
        try:
            return _read_steps(self._fs, path, steps)
        except (pa.ArrowInvalid, OSError, KeyError, ValueError) as e:
            self._bad.add(path)
            warnings.warn(
                f"provenance chunk {redact(path)} left out: it cannot be read whole ({e}); a "
                "writer stopped while writing it",
                ProvenanceWarning,
                stacklevel=4,
            )
            return None

    def records(self, steps: int | Iterable[int]) -> list[dict[str, Any]]:
        """:meth:`which` as a list of records (``{"step", "rank", "epoch", "url", "start",
        "stop"}``, and ``"sequence", "token_start", "token_stop"`` from a packing
        stream's log)."""
        return self.which(steps).to_pylist()  # type: ignore[no-any-return]


_PLAIN = pa.schema(
    [
        ("step", pa.int64()),
        ("rank", pa.int32()),
        ("epoch", pa.int32()),
        ("url", pa.string()),
        ("start", pa.int64()),
        ("stop", pa.int64()),
    ]
)
"""What :meth:`ProvenanceLog.which` answers: a run's stop, its URL as a string."""


_PLAIN_PIECES = (
    _PLAIN.append(pa.field("sequence", pa.int32()))
    .append(pa.field("token_start", pa.int64()))
    .append(pa.field("token_stop", pa.int64()))
)
"""What :meth:`ProvenanceLog.which` answers from a packing stream's log."""


def _plain(table: pa.Table) -> pa.Table:
    """A chunk's rows as :data:`_PLAIN` (:data:`_PLAIN_PIECES`, a packing stream's)."""
    stop = pc.add(table["start"], table["rows"].cast(pa.int64()))
    columns = [
        table["step"],
        table["rank"],
        table["epoch"],
        table["url"].cast(pa.string()),
        table["start"],
        stop,
    ]
    if "sequence" not in table.column_names:
        return pa.table(columns, schema=_PLAIN)
    extra = [table["sequence"], table["token_start"], table["token_stop"]]
    return pa.table(columns + extra, schema=_PLAIN_PIECES)


def _read_steps(fs: Any, path: str, steps: list[int]) -> pa.Table | None:
    """The rows of ``steps`` in one chunk: its footer, then only the record batches whose
    steps (the schema's metadata) hold one of them."""
    with fs.open(path, "rb") as f:
        reader = pa.ipc.open_file(f)
        ranges = json.loads(reader.schema.metadata[b"steps"])
        found = [
            reader.get_batch(i)
            for i, (a, b) in enumerate(ranges)
            if any(a <= step <= b for step in steps)
        ]
        if not found:
            return None
        table = pa.Table.from_batches(found).replace_schema_metadata(None)
        table = table.filter(pc.is_in(table["step"], pa.array(steps, pa.int64())))
        return table if table.num_rows else None


def which(
    url: str, steps: int | Iterable[int], *, storage_options: Mapping[str, Any] | None = None
) -> pa.Table:
    """The rows each rank's ``steps`` consumed in the run whose log is at ``url`` (the
    stream's ``provenance=``): see :meth:`ProvenanceLog.which`, and over an ingest.Mix
    :func:`ingest.engine.mix_provenance.which_mixed` (``source``, ``source_step`` columns)."""
    from ingest.engine.mix_provenance import is_mixed, which_mixed  # it imports this module

    if is_mixed(url, storage_options):
        return which_mixed(url, steps, storage_options=storage_options)
    return ProvenanceLog(url, storage_options).which(steps)


def skip(
    state: Mapping[str, Any] | str | StreamState,
    *,
    steps: Iterable[int] | None = None,
    rows: Iterable[tuple[str, int, int]] | None = None,
    provenance: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``state`` with rows left out, to resume from after a loss spike (issue 35).

    The rows are consumed in the returned state, never delivered, at any world size, and
    the skip is listed in the state (``stream.quarantined()``, ``stream.stats``'s
    ``rows_skipped_on_request``) through every later state of the epoch: see
    :mod:`ingest.core.skipping`.

    Args:
        state: A state a stream saved (over an ingest.Mix, ``steps`` are its mixed steps:
            :func:`ingest.engine.mix_provenance.skip_mixed`).
        steps: Leave out every row these steps consumed on any rank, as the run's
            provenance log recorded them (``provenance``). Steps at or before the state's
            were consumed already: nothing changes for them.
        rows: Leave out these ``(url, start, stop)`` rows (URLs as the stream listed them).
        provenance: The run's log (its ``provenance=``), for ``steps``.
        storage_options: fsspec options for ``provenance``.

    Raises:
        ProvenanceError: If ``steps`` is given without a log, or a step is in none of its
            attempts.
        StateError: For rows of an earlier epoch than the state's (a later epoch's wait in
            the state until the run reaches it: :mod:`ingest.core.skipping`).
    """
    parsed = read_state(state.to_json() if isinstance(state, StreamState) else state)
    if not isinstance(parsed, StreamState):  # a mixture's: each source's part, its rows
        from ingest.engine.mix_provenance import skip_mixed

        return skip_mixed(
            parsed, steps=steps, rows=rows, provenance=provenance, storage_options=storage_options
        )
    given = list(rows or ())
    wanted: list[SkipRows] = [SkipRows(u, int(a), int(b)) for u, a, b in given]
    asked = []
    if steps is not None:
        steps = sorted(set(steps))
        table = steps_logged(
            steps, provenance, lambda url: which(url, steps, storage_options=storage_options)
        )
        wanted += [SkipRows(r["url"], r["start"], r["stop"], r["epoch"]) for r in table.to_pylist()]
        asked.append(f"steps {step_span(steps)}")
    if rows is not None:
        asked.append(f"{len(given)} row range(s)")
    out, _ = apply_skip(parsed, wanted, ", ".join(asked) or "nothing")
    return out.to_json()


def steps_logged(
    steps: list[int],
    provenance: str | None,
    lookup: Callable[[str], pa.Table],
    what: str = "step",
    log_of: Callable[[str], str] = str,
) -> pa.Table:
    """``lookup(provenance)``, the log's rows of ``steps`` (``what``: what a step is called),
    for a skip: every step must be in the log (``log_of``: the log's URL, to name it).

    Raises:
        ProvenanceError: If there is no log, or a step is in none of its attempts.
    """
    if provenance is None:
        raise ProvenanceError(
            "(none)",
            f"{what}s {step_span(steps)} asked without a log",
            "pass provenance= the URL the run was given as provenance=",
        )
    table = lookup(provenance)
    missing = sorted(set(steps) - set(table["step"].to_pylist()))
    if missing:
        raise ProvenanceError(
            log_of(provenance),
            f"{what}(s) {step_span(missing)} are in no attempt of the log (not reached yet?)",
            "skip only steps the run handed out, or name rows= instead",
        )
    return table


def step_span(steps: Sequence[int]) -> str:
    """Steps as a message or a skip's record names them: ``first..last`` if consecutive."""
    if len(steps) > 1 and steps[-1] - steps[0] == len(steps) - 1:
        return f"{steps[0]}..{steps[-1]}"
    return ", ".join(str(s) for s in steps[:8]) + (" ..." if len(steps) > 8 else "")


__all__ = [
    "BUCKET_STEPS",
    "ProvenanceError",
    "ProvenanceLog",
    "ProvenanceWarning",
    "ProvenanceWriter",
    "WriteBehind",
    "list_chunks",
    "put_whole",
    "read_attempts",
    "skip",
    "step_span",
    "steps_logged",
    "which",
]
