"""Ctrl-C in a notebook: a KeyboardInterrupt that comes at any line of a Stream's hand-out
loses no batch and repeats none, and the stream goes on after it.

The interrupt is a real SIGINT, raised (``signal.raise_signal``) at the N-th line the
library runs in one ``next()``, for every N: Python runs the handler between bytecodes, as
for a Ctrl-C that comes then. The loop caught it, then a new ``for`` loop runs the epoch to
its end; every row came once.
"""

from __future__ import annotations

import contextlib
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
from tests.test_pack_stream import every_token, tokenize, tokens_of, write_corpus

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


def _trace(call: Callable[[], Any]) -> list[tuple[str, str]]:
    """The library lines ``call`` runs: (function, source line), in order."""
    lines: list[tuple[str, str]] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_code.co_filename.startswith(LIBRARY):
            source = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            lines.append((frame.f_code.co_qualname, source))
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines


def _interrupted_at(line: int, call: Callable[[], Any]) -> Any:
    """``call``, with SIGINT raised at its ``line``-th line of the library."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line" and frame.f_code.co_filename.startswith(LIBRARY):
            count += 1
            if count == line:
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
    """For every line of the third ``next()`` (every ``stride``-th): interrupt it there, go
    on, count every row: those handed out, and those the epoch carried into the next
    (``carried`` of the state at its end: a loader resumed on 2 workers after an odd number
    of batches shares the rest out again, and carries what fills no step on both)."""
    probe = iter(make())
    next(probe), next(probe)
    trace = _trace(lambda: next(probe))
    lines = len(trace)
    assert lines > 20
    # The last line is the loop's return, after it left the critical part. A Ctrl-C that
    # comes there is handled at the eval loop's next check, in the caller's frame, the batch
    # in hand; under a tracer, the handler runs in the tracer itself, before that return.
    assert trace[-1] == ("Guarded.__next__", "return item"), trace[-3:]
    every: Counter[int] | None = None
    for line in range(1, lines, stride):
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


def test_a_ctrl_c_at_any_line_of_a_packed_hand_out_loses_no_token(local: Store) -> None:
    url = write_corpus(local)

    def make() -> ingest.Stream:
        return ingest.Stream(
            url,
            batch_size=4,
            transform=ingest.Tokenize(tokenize),
            pack=ingest.Pack(seq_len=64, read_rows=16),
            shuffle_seed=0,
        )

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
