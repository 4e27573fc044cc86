"""Ctrl-C in a notebook: a KeyboardInterrupt that comes at any line of a Stream's hand-out
loses no batch and repeats none, and the stream goes on after it.

The interrupt is a real SIGINT, raised (``signal.raise_signal``) at the N-th line the
library runs in one ``next()``, for every N: Python runs the handler between bytecodes, as
for a Ctrl-C that comes then. The loop caught it, then a new ``for`` loop runs the epoch to
its end; every row came once.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

import ingest
from ingest.engine import interrupts
from ingest.testing import Store, encode, make_table
from tests.carry import carried_rows
from tests.test_pack_stream import (
    carried_tokens,
    every_token,
    tokenize,
    tokens_of,
    write_corpus,
)

LIBRARY = os.path.dirname(ingest.__file__)


@pytest.fixture(autouse=True)
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler, as in a script or a notebook cell (the session's may be
    another's), and no Ctrl-C held from before; put back after."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.GUARD.pending = False
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


def _lines_of(call: Callable[[], Any]) -> int:
    """Lines of the library ``call`` runs."""
    return len(_trace(call))


def _trace(call: Callable[[], Any], where: list[Any] | None = None) -> list[tuple[str, str]]:
    """The library lines ``call`` runs: (function, source line), in order; and in ``where``
    (if given) each one's (code, line number), in the same order."""
    lines: list[tuple[str, str]] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_code.co_filename.startswith(LIBRARY):
            source = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            lines.append((frame.f_code.co_qualname, source))
            if where is not None:
                where.append((frame.f_code, frame.f_lineno))
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines


def _first_and_last_runs(where: list[Any]) -> list[int]:
    """The positions (from 1) in a trace's ``where`` (:func:`_trace`) of each line's first
    and last run: every line of the call, and a loop's body at its first and last pass (the
    passes between run the same lines on other values). A packed hand-out runs 700 lines,
    287 of them the packer's loop over its pieces: 330 runs instead of 700, 36 s less."""
    first: dict[Any, int] = {}
    last: dict[Any, int] = {}
    for n, line in enumerate(where, start=1):
        first.setdefault(line, n)
        last[line] = n
    return sorted({*first.values(), *last.values()})


def _return_line() -> int:
    """The line of ``Guarded.__next__``'s ``return item``."""
    lines, first = inspect.getsourcelines(interrupts.Guarded.__next__)
    (at,) = [first + n for n, text in enumerate(lines) if text.strip() == "return item"]
    return at


RETURN = (interrupts.Guarded.__next__.__code__, _return_line())
"""The loop's return, after it left the critical part. A Ctrl-C that comes there is handled
at the eval loop's next check, in the caller's frame, the batch in hand; under a tracer, the
handler runs in the tracer itself, before that return: none is raised there."""


def _interrupted_at(line: int, call: Callable[[], Any]) -> Any:
    """``call``, with SIGINT raised at its ``line``-th line of the library (none if that is
    the loop's return, :data:`RETURN`)."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line" and frame.f_code.co_filename.startswith(LIBRARY):
            count += 1
            if count == line and (frame.f_code, frame.f_lineno) != RETURN:
                signal.raise_signal(signal.SIGINT)
        return tracer

    sys.settrace(tracer)
    try:
        return call()
    finally:
        sys.settrace(None)


@contextlib.contextmanager
def _no_escape(line: int) -> Iterator[None]:
    """A Ctrl-C that escapes where none is due fails the test, not the whole session (pytest
    ends its run at a KeyboardInterrupt)."""
    try:
        yield
    except KeyboardInterrupt as e:
        raise AssertionError(f"a Ctrl-C raised at line {line} came out later") from e


def _sweep(
    make: Callable[[], Any],
    key: Callable[[dict[str, Any]], list[int]],
    stride: int = 1,
    carried: Callable[[dict[str, Any]], list[int]] = lambda state: [],
) -> None:
    """For every line of the third ``next()``, at its first and last run
    (:func:`_first_and_last_runs`; every ``stride``-th of those): interrupt it there, go
    on, count every row: those handed out, and those the epoch carried into the next
    (``carried`` of the state at its end: a loader resumed on 2 workers after an odd number
    of batches shares the rest out again, and carries what fills no step on both)."""
    probe = iter(make())
    next(probe), next(probe)
    where: list[Any] = []
    trace = _trace(lambda: next(probe), where)
    lines = len(trace)
    assert lines > 20
    # The last line is the loop's return (RETURN): no Ctrl-C is raised there.
    assert trace[-1] == ("Guarded.__next__", "return item"), trace[-3:]
    every: Counter[int] | None = None
    for line in _first_and_last_runs(where)[:-1][::stride]:
        with _no_escape(line):  # before the Ctrl-C: none may be held from the last run
            stream = make()
            it = iter(stream)
            got = key(next(it)) + key(next(it))
        try:
            got += key(_interrupted_at(line, lambda: next(it)))  # noqa: B023
            got += key(next(it))  # a Ctrl-C held while a batch was handed out comes here
        except KeyboardInterrupt:
            pass
        with _no_escape(line):
            for batch in stream:
                got += key(batch)
            counted = Counter(got + carried(stream.state_dict()))
        if every is None:
            every = counted
        assert counted == every, f"interrupted at line {line} of {lines}"
    assert every is not None and max(every.values()) == 1


def test_a_ctrl_c_at_any_line_of_a_hand_out_loses_no_batch(local: Store) -> None:
    for n in range(2):
        local.write(f"d/p{n}.parquet", encode(make_table(n * 60, 60), "parquet", row_group_rows=20))

    def make() -> ingest.Stream:
        return ingest.Stream(local.url("d"), columns=["id"], batch_size=10, shuffle_seed=0)

    _sweep(make, lambda batch: batch["id"].tolist())


@pytest.mark.parametrize(("workers", "stride"), [(0, 1), (2, 7)])
def test_a_ctrl_c_at_any_line_of_a_dataloader_hand_out_loses_no_batch(
    local: Store, workers: int, stride: int
) -> None:
    """The same through ingest.DataLoader, in this process or from 2 worker processes (every
    7th line: each run starts its workers)."""
    for n in range(2):
        local.write(f"d/p{n}.parquet", encode(make_table(n * 60, 60), "parquet", row_group_rows=20))

    def make() -> ingest.DataLoader:
        stream = ingest.Stream(local.url("d"), columns=["id"], batch_size=10, shuffle_seed=0)
        return ingest.DataLoader(stream, num_workers=workers)

    def carried(state: dict[str, Any]) -> list[int]:  # shard n holds ids 60n..60n+59
        return [shard * 60 + row for shard, row in carried_rows(state)]

    _sweep(make, lambda batch: batch["id"].tolist(), stride, carried)


PACKED: dict[str, Any] = {
    "batch_size": 4,
    "transform": ingest.Tokenize(tokenize),
    "pack": ingest.Pack(seq_len=64, read_rows=16),
    "shuffle_seed": 0,
}
"""The packing streams' settings (a Stream's, a RayStream's)."""


def test_a_ctrl_c_at_any_line_of_a_packed_hand_out_loses_no_token(local: Store) -> None:
    url = write_corpus(local)

    def make() -> ingest.Stream:
        return ingest.Stream(url, **PACKED)

    def tokens(batch: dict[str, Any]) -> list[int]:
        return list(tokens_of([batch]).elements())

    _sweep(make, tokens)
    assert every_token()


def test_a_ctrl_c_at_any_line_of_state_dict_keeps_every_batch(local: Store) -> None:
    """A state taken after a Ctrl-C in the last one covers every batch handed out: the acks
    a state sends first are sent whole or not at all."""
    local.write("d/a.parquet", encode(make_table(0, 100), "parquet", row_group_rows=20))

    def make() -> ingest.Stream:
        return ingest.Stream(local.url("d"), columns=["id"], batch_size=10, shuffle_seed=0)

    def ids(batch: dict[str, Any]) -> list[int]:
        return [int(i) for i in batch["id"].tolist()]

    probe = make()
    it = iter(probe)
    next(it), next(it), next(it)
    lines = _lines_of(probe.state_dict)
    for line in range(1, lines + 2):
        stream = make()
        it = iter(stream)
        got = ids(next(it)) + ids(next(it)) + ids(next(it))
        try:
            state = _interrupted_at(line, stream.state_dict)
        except KeyboardInterrupt:
            state = stream.state_dict()
        with _no_escape(line):
            resumed = make()
            resumed.load_state_dict(state)
            got += [i for batch in resumed for i in ids(batch)]
        assert sorted(got) == list(range(100)), f"interrupted at line {line} of {lines}"


def _sweep_epochs(
    it: Any,
    key: Callable[[dict[str, Any]], list[int]],
    owed: Callable[[int], Counter[int]],
    runs: int,
) -> None:
    """:func:`_sweep` over the epochs of one iterator ``it`` (a Ray rank's: a stream per line
    would start its processes each time): each line's run is an epoch, the interrupted
    loop's rest run by a new ``for`` loop over the same iterator. After each epoch, what
    every epoch so far handed out is ``owed(epochs)``. The lines are those of epoch 0's
    third hand-out (a later one may run fewer or more: a read step in it, or not), at most
    ``runs`` of them, evenly spread."""
    probe = iter(it)  # epoch 0: the lines of its third hand-out
    got = key(next(probe)) + key(next(probe))
    trace = _trace(lambda: got.extend(key(next(probe))))
    assert trace[-1] == ("Guarded.__next__", "return item"), trace[-3:]
    got += [i for batch in probe for i in key(batch)]
    lines = len(trace)
    assert lines > 20
    epochs = 1
    for line in range(1, lines, max(1, lines // runs)):  # one epoch each
        with _no_escape(line):
            loop = iter(it)
            got += key(next(loop)) + key(next(loop))
        try:
            got += key(_interrupted_at(line, lambda: next(loop)))  # noqa: B023
            got += key(next(loop))
        except KeyboardInterrupt:
            pass
        with _no_escape(line):
            loop.close()  # its generator ends (it did, if the Ctrl-C came out of it)
            got += [i for batch in it for i in key(batch)]
        epochs += 1
        assert Counter(got) == owed(epochs), (
            f"interrupted at line {line} of {lines}: {trace[max(line - 3, 0) : line + 1]}"
        )


@pytest.mark.usefixtures("ray_session")
def test_a_ctrl_c_at_any_line_of_a_ray_rank_hand_out_loses_no_batch(local: Store) -> None:
    """The same through a RayStream's rank iterator in this process (a notebook exploring a
    RayStream on a laptop's Ray), at every line (about 80). Before, a Ctrl-C at the 10th line of 80
    (in the wait for the reader's answer) lost the batches of that answer, and the next loop
    failed: "rank 0 got step 51 after step 49"."""
    for n in range(2):
        local.write(f"d/p{n}.parquet", encode(make_table(n * 60, 60), "parquet", row_group_rows=20))
    pool = ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.5)
    with ingest.RayStream(
        local.url("d"), columns=["id"], batch_size=10, shuffle_seed=0, readers=pool
    ) as stream:
        _sweep_epochs(
            stream.rank_iterator(0),
            lambda batch: [int(i) for i in batch["id"].tolist()],
            lambda epochs: Counter(list(range(120)) * epochs),
            runs=200,
        )


@pytest.mark.usefixtures("ray_session")
def test_a_ctrl_c_at_any_line_of_a_packed_ray_rank_hand_out_loses_no_token(
    local: Store,
) -> None:
    """The same for a packing RayStream's rank (40 lines spread over its 260 or 6,200: the
    third batch packs a read step or not; every line in turn, run for 18 minutes until a
    timeout stopped it, lost none): every token handed out as often as the epochs owe it,
    less what the last one carries on. Before, a Ctrl-C at the 32nd line lost the tokens of
    a read step."""
    url = write_corpus(local)
    pool = ingest.ReaderPool(min_size=1, max_size=1, num_cpus=0.5)
    with ingest.RayStream(url, readers=pool, **PACKED) as stream:
        it = stream.rank_iterator(0)

        def owed(epochs: int) -> Counter[int]:
            due = Counter({t: n * epochs for t, n in every_token().items()})
            return due - carried_tokens(it.state_dict())

        def tokens(batch: dict[str, Any]) -> list[int]:
            return list(tokens_of([batch]).elements())

        _sweep_epochs(it, tokens, owed, runs=40)
