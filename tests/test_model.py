"""Exactly once under random sequences of operations: a stateful model test (issue 17).

Hypothesis drives ``Stream``, ``ingest.DataLoader`` and ``RayStream`` through random
sequences of what users do: take k batches, take the state, leave a loop, start a second
loop or a new iterator for a rank, pass an iterator to another Ray task, kill a reader,
resume from the last state with another kind, world size, worker count or batch size (some
give epochs with no full step). A model (:class:`Model`) counts every id delivered, forgets
what came after a state when it is restored, and checks the system against it:

- at every state: the rows the state says the epoch consumed (its own and the carried ones)
  are, as a multiset, exactly the ids the model saw delivered in the epoch, and
  ``progress.delivered`` is their number;
- at every epoch's end: every id was delivered once per epoch so far, but for the rows the
  state carries into the next epoch (``count + carried == epochs``), and every rank of the
  epoch had the same number of batches.

Any loss, repeat or rank split fails with the shortest sequence Hypothesis finds. The bounded
runs here are part of ``make test``; ``benchmarks/model_soak.py`` runs them for longer and
prints the cases tried per minute.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

import ingest
from ingest.core.state import StreamState
from ingest.testing import write_dataset

SHARDS, ROWS = 3, 40
TOTAL = SHARDS * ROWS
BATCHES = (8, 16, 48)
"""Batch sizes a run may take; 48 x 3 ranks is more than the dataset: epochs with no step."""

EXAMPLES = int(os.environ.get("INGEST_MODEL_EXAMPLES", "0"))
"""Sequences per machine (0: each test's own bound); benchmarks/model_soak.py raises it."""


@dataclass
class Data:
    url: str
    ids: dict[str, list[int]]
    """Each shard's ids in row order, by URL."""

    def rows(self, url: str, start: int, stop: int) -> list[int]:
        return self.ids[url][start:stop]


def make_data(root: str) -> Data:
    fs = fsspec.filesystem("file")
    url = f"file://{root}/model"
    paths = write_dataset(fs, url, "parquet", SHARDS, ROWS, row_group_rows=10)
    ids = {}
    for p in paths:
        ids[p] = pq.read_table(p.removeprefix("file://"), columns=["id"])["id"].to_pylist()
    return Data(url, ids)


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> Data:
    return make_data(str(tmp_path_factory.mktemp("model")))


@dataclass
class Model:
    """What a user saw: every id delivered since the start, less what restores undid."""

    data: Data
    history: list[tuple[int, int]] = field(default_factory=list)
    """``(epoch, id)`` of every row delivered, in order."""
    epoch: int = 0
    """Epochs finished."""
    saved: tuple[dict[str, Any], int, int] | None = None
    """The last state taken, with ``(len(history), epoch)`` at that moment."""
    told: bool = False
    """A state said the epoch ended (its last batch was handed out) before the loop did."""

    def deliver(self, ids: list[int], epoch: int | None = None) -> None:
        """``ids`` delivered in ``epoch`` (None: the epoch in progress)."""
        self.told = False
        self.history += [(self.epoch if epoch is None else epoch, i) for i in ids]
        assert max(Counter(i for _, i in self.history).values()) <= self.most(), (
            "an id delivered more often than once per epoch"
        )

    def of_epoch(self, epoch: int) -> list[int]:
        return [i for e, i in self.history if e == epoch]

    def most(self) -> int:
        """The most times an id may have been delivered so far."""
        # Rows carried through epochs with no step come in a later epoch, several at once.
        return 2 * (self.epoch + 1)

    def universe(self) -> range:
        return range(TOTAL)

    def expected(self, i: int) -> int:
        """Deliveries of id ``i`` plus its carried copies after the epochs so far."""
        return self.epoch

    def before(self) -> Counter[int]:
        """Rows a state counts consumed in its epoch though not delivered in it."""
        return Counter()

    def save(self, state: dict[str, Any]) -> None:
        parsed = StreamState.from_json(state)
        assert parsed.progress.epoch == self.epoch, (parsed.progress.epoch, self.epoch)
        consumed = Counter(self._ids(parsed.progress.consumed.sets, parsed))
        consumed += Counter(self._ids(parsed.distributed.carry_consumed.sets, parsed))
        delivered = self.of_epoch(self.epoch)
        seen = Counter(delivered) + self.before()
        assert consumed == seen, (
            f"the state's consumed rows differ from what was delivered in epoch {self.epoch}: "
            f"only in the state {sorted((consumed - seen).elements())}, "
            f"only delivered {sorted((seen - consumed).elements())}"
        )
        assert parsed.progress.delivered == len(delivered)
        self.saved = (state, len(self.history), self.epoch)
        self.keep()

    def keep(self) -> None:
        """Remember what a restore of :attr:`saved` goes back to (a subclass's fields)."""

    def loop_ended(self, state: dict[str, Any]) -> None:
        """A loop ended (StopIteration); ``state``: the state then."""
        if state["progress"]["epoch"] > self.epoch:
            self.end_epoch(state)
        else:
            assert self.told, f"a loop ended in the middle of epoch {self.epoch}"
            assert state["progress"]["epoch"] == self.epoch
        self.told = False

    def end_epoch(self, state: dict[str, Any], *, told: bool = False, jump: bool = False) -> None:
        """The epoch ended; ``state``: a state of the next epoch. ``told``: a state said so
        before the loop ended (see :attr:`told`). ``jump``: several epochs may have ended
        (ranks that went on, some through epochs with no step)."""
        self.told = told
        parsed = StreamState.from_json(state)
        assert parsed.progress.epoch > self.epoch and (
            jump or parsed.progress.epoch == self.epoch + 1
        ), (parsed.progress.epoch, self.epoch)
        self.epoch = parsed.progress.epoch
        carried = Counter(
            i
            for s, a, b in parsed.distributed.carry
            for i in self.data.rows(parsed.shards[s].url, a, b)
        )
        counts = Counter(i for e, i in self.history if e < self.epoch)
        wrong = {
            i: (counts[i], carried[i], self.expected(i))
            for i in self.universe()
            if counts[i] + carried[i] != self.expected(i)
        }
        assert not wrong, (
            f"after {self.epoch} epochs, ids delivered/carried a wrong number of times: "
            f"{dict(list(wrong.items())[:10])}"
        )
        if parsed.progress.step == parsed.progress.first_step:
            self.saved = (state, len(self.history), self.epoch)
            self.keep()

    def restore(self) -> dict[str, Any]:
        assert self.saved is not None
        state, length, self.epoch = self.saved
        del self.history[length:]
        self.told = False
        return state

    def _ids(self, sets: dict[int, Any], parsed: StreamState) -> Iterator[int]:
        for index, intervals in sets.items():
            url = parsed.shards[index].url
            for a, b in intervals:
                yield from self.data.rows(url, a, b)


def ids_of(batch: Any) -> list[int]:
    return [int(i) for i in batch["id"].tolist()]


def finish_epoch(model: Model, take: Any, most: int) -> None:
    """Take batches until the epoch in progress ends: every sequence ends with a checked
    epoch's end (at most ``most`` calls of ``take(50)``)."""
    epoch = model.epoch
    for _ in range(most):
        if model.epoch != epoch:
            return
        take(50)
    assert model.epoch != epoch, f"epoch {epoch} never ended"


def bounded(examples: int, steps: int = 12) -> settings:
    """Settings of a bounded run: fixed sequences in ``make test`` (derandomized), or
    ``INGEST_MODEL_EXAMPLES`` random ones (benchmarks/model_soak.py runs longer)."""
    return settings(
        max_examples=EXAMPLES or examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=not EXAMPLES,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


# -- one process: Stream and ingest.DataLoader --------------------------------------------


class Local:
    """A ``Stream``, or a ``DataLoader`` over one, and its loop in progress."""

    def __init__(
        self, data: Data, kind: str, batch: int, follow: ingest.Follow | None = None
    ) -> None:
        self.kind, self.batch = kind, batch
        self.stream = ingest.Stream(
            data.url, columns=["id"], batch_size=batch, shuffle_seed=5, follow=follow
        )
        self.loader = None
        if kind != "stream":
            self.loader = ingest.DataLoader(self.stream, num_workers=int(kind[-1]))
        self.loop: Iterator[Any] | None = None
        self.left = False

    @property
    def source(self) -> Any:
        return self.stream if self.loader is None else self.loader

    def state(self) -> dict[str, Any]:
        return self.source.state_dict()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.loop = None
        self.stream.close()


class Loops(RuleBasedStateMachine):
    """The rules of one process's loops (a ``Stream``, or a ``DataLoader`` over one): take
    k batches, take the state, leave the loop. Subclasses make :attr:`sut` and
    :attr:`model`, and add rules of their own."""

    model: Model
    sut: Local | None = None
    loops_to_end = TOTAL
    """Loops of 50 batches within which the teardown's epoch must end."""

    def _loop(self) -> Iterator[Any]:
        sut = self.sut
        assert sut is not None
        if sut.loop is None:
            if sut.left:
                # A loop left early: if it had handed out the epoch's last batch, the next
                # loop runs the next epoch. The state says which.
                self._maybe_ended(sut.state())
                sut.left = False
            sut.loop = iter(sut.source)
        return sut.loop

    def _maybe_ended(self, state: dict[str, Any]) -> None:
        if state["progress"]["epoch"] > self.model.epoch:
            self.model.end_epoch(state)

    @rule(k=st.integers(1, 6))
    def take(self, k: int) -> None:
        sut = self.sut
        assert sut is not None
        loop = self._loop()
        for _ in range(k):
            try:
                batch = next(loop)
            except StopIteration:
                sut.loop = None
                self.model.loop_ended(sut.state())
                return
            self.model.deliver(ids_of(batch))

    @rule()
    def save(self) -> None:
        assert self.sut is not None
        state = self.sut.state()
        if state["progress"]["epoch"] > self.model.epoch:  # after the epoch's last batch
            self.model.end_epoch(state, told=self.sut.loop is not None)
        else:
            self.model.save(state)

    @rule()
    def leave(self) -> None:
        assert self.sut is not None
        if self.sut.loop is not None:
            self.sut.loop = None
            self.sut.left = True

    def teardown(self) -> None:
        if self.sut is not None:
            try:
                finish_epoch(self.model, self.take, self.loops_to_end)
            finally:
                self.sut.close()


class LocalMachine(Loops):
    data: Data

    def __init__(self) -> None:
        super().__init__()
        self.model = Model(self.data)

    @initialize(
        kind=st.sampled_from(["stream", "loader0", "loader2"]), batch=st.sampled_from(BATCHES)
    )
    def start(self, kind: str, batch: int) -> None:
        self.sut = Local(self.data, kind, batch)

    @precondition(lambda self: self.sut is not None and self.sut.kind == "stream")
    @rule()
    def second_loop(self) -> None:
        # A second iter() while the first loop is held: the first stops, and says so.
        sut = self.sut
        assert sut is not None
        old = sut.loop
        sut.loop, sut.left = None, old is not None
        new = self._loop()
        if old is not None:
            with pytest.raises(ingest.SupersededError):
                next(old)
        sut.loop = new

    @precondition(lambda self: self.model.saved is not None)
    @rule(
        kind=st.sampled_from(["stream", "loader0", "loader1", "loader3"]),
        batch=st.sampled_from(BATCHES),
    )
    def restore(self, kind: str, batch: int) -> None:
        assert self.sut is not None
        self.sut.close()
        self.sut = Local(self.data, kind, batch)
        self.sut.source.load_state_dict(self.model.restore())


def test_stream_and_dataloader_deliver_every_row_once_whatever_the_user_does(data: Data) -> None:
    LocalMachine.data = data
    run_state_machine_as_test(
        LocalMachine,
        settings=bounded(25, 12),
    )


# -- Ray: RayStream ranks in this process and in tasks ------------------------------------


@ray.remote(num_cpus=0)
def _in_a_task(it: Any, k: int) -> tuple[list[tuple[int, list[int]]], int]:
    """Up to ``k`` batches of a rank's iterator in another process, each with its epoch;
    and the epoch the iterator is in at the end (the next one once its loop ended)."""
    return _taken(it, k)


def _taken(it: Any, k: int) -> tuple[list[tuple[int, list[int]]], int]:
    """See :func:`_in_a_task`."""
    out: list[tuple[int, list[int]]] = []
    for batch in it:
        out.append((it.epoch, ids_of(batch)))
        if len(out) == k:
            break
    return out, it.epoch


@ray.remote(num_cpus=0)
def _state_in_a_task(it: Any, k: int) -> tuple[list[tuple[int, list[int]]], int, dict[str, Any]]:
    """:func:`_in_a_task`, then the rank's state (``it.state_dict()``) in that task."""
    out, epoch = _taken(it, k) if k else ([], it.upcoming_epoch())
    return out, epoch, it.state_dict()


class Ranks:
    """A ``RayStream`` and each rank's iterator and loop, driven from this process."""

    def __init__(self, data: Data, world: int, batch: int) -> None:
        self.world = world
        self.stream = ingest.RayStream(
            data.url,
            world_size=world,
            columns=["id"],
            batch_size=batch,
            shuffle_seed=5,
            readers=ingest.ReaderPool(min_size=1, max_size=2, num_cpus=0.25),
            timeout_s=60,
        )
        self.its = [self.stream.rank_iterator(r) for r in range(world)]
        self.loops: list[Iterator[Any] | None] = [None] * world
        self.at: list[int] = [0] * world
        """The epoch each rank is in, as its iterator says (a rank goes on to the next
        epoch when its loop ends, or when a new iterator finds every step of it acked)."""
        self.batches: list[Counter[int]] = [Counter() for _ in range(world)]
        """Batches of each rank, by epoch."""

    def close(self) -> None:
        self.loops = [None] * self.world
        self.stream.shutdown()


class RayMachine(RuleBasedStateMachine):
    """``RayStream`` ranks, driven in turn from this process or in Ray tasks. The model's
    epochs end when a state (after every rank's acks) says so: a new iterator of a rank
    whose every step was acked goes on in the next epoch without a loop's end."""

    data: Data

    def __init__(self) -> None:
        super().__init__()
        self.model = Model(self.data)
        self.sut: Ranks | None = None

    @initialize(world=st.integers(1, 3), batch=st.sampled_from(BATCHES))
    def start(self, world: int, batch: int) -> None:
        self.sut = Ranks(self.data, world, batch)

    def _got(self, rank: int, epoch: int, ids: list[int]) -> None:
        sut = self.sut
        assert sut is not None
        assert epoch >= sut.at[rank], f"rank {rank} went back from epoch {sut.at[rank]}"
        sut.at[rank] = epoch
        sut.batches[rank][epoch] += 1
        self.model.deliver(ids, epoch)

    def _settle(self) -> dict[str, Any]:
        """The state after every rank's acks; the epochs it says ended are checked."""
        sut = self.sut
        assert sut is not None
        for it in sut.its:
            it.flush()
        state = sut.stream.state_dict()
        ended = state["progress"]["epoch"]
        if ended > self.model.epoch:
            for epoch in range(self.model.epoch, ended):
                counts = [b[epoch] for b in sut.batches]
                assert len(set(counts)) == 1, f"ranks split in epoch {epoch}: {counts}"
            self.model.end_epoch(state, jump=True)
        return state

    def _drive(self, rank: int, k: int) -> None:
        """Rank ``rank`` takes up to ``k`` batches in this process."""
        sut = self.sut
        assert sut is not None
        it = sut.its[rank]
        for _ in range(k):
            loop = sut.loops[rank]
            if loop is None:
                loop = sut.loops[rank] = iter(it)
            try:
                batch = next(loop)
            except StopIteration:
                sut.loops[rank] = None
                sut.at[rank] = max(sut.at[rank], it.upcoming_epoch())
                return
            self._got(rank, it.upcoming_epoch(), ids_of(batch))

    @rule(k=st.integers(1, 4))
    def take(self, k: int) -> None:
        """Every rank, in turn, takes up to ``k`` batches in this process."""
        assert self.sut is not None
        for rank in range(self.sut.world):
            self._drive(rank, k)
        self._settle()

    def _even(self) -> bool:
        sut = self.sut
        return (
            sut is not None
            and len({(a, b[a]) for a, b in zip(sut.at, sut.batches, strict=True)}) == 1
        )

    @precondition(lambda self: self._even())
    @rule()
    def save(self) -> None:
        """A state when every rank is at the same step of the same epoch."""
        state = self._settle()
        if state["progress"]["epoch"] == self.model.epoch:
            self.model.save(state)

    @rule()
    def leave(self) -> None:
        assert self.sut is not None
        self.sut.loops = [None] * self.sut.world

    @rule(data=st.data())
    def new_iterator(self, data: st.DataObject) -> None:
        """A new iterator for a rank, while the old one's loop is held: the old one stops."""
        sut = self.sut
        assert sut is not None
        rank = data.draw(st.integers(0, sut.world - 1))
        old = sut.loops[rank]
        sut.its[rank] = sut.stream.rank_iterator(rank)
        sut.loops[rank] = None
        self._drive(rank, 1)
        if old is not None:
            with pytest.raises(ingest.SupersededError):
                next(old)
        self._settle()

    @rule(k=st.integers(1, 6))
    def in_tasks(self, k: int) -> None:
        """Each rank's iterator passed to a Ray task for up to ``k`` batches (loops here
        left first: one iterator of a rank delivers at a time)."""
        sut = self.sut
        assert sut is not None
        sut.loops = [None] * sut.world
        got = ray.get([_in_a_task.remote(it, k) for it in sut.its], timeout=240)
        for rank, (batches, at) in enumerate(got):
            for epoch, ids in batches:
                self._got(rank, epoch, ids)
            sut.at[rank] = max(sut.at[rank], at)
        self._settle()

    @precondition(lambda self: self._even())
    @rule(k=st.integers(1, 4))
    def states_in_tasks(self, k: int) -> None:
        """Each rank's iterator in a Ray task of its own: up to ``k`` batches, then the
        rank's ``state_dict()`` there, every rank at the same step. Every rank's state is the
        same (a trainer saves one of them), and it is a state of the model's."""
        sut = self.sut
        assert sut is not None
        sut.loops = [None] * sut.world
        got = ray.get([_state_in_a_task.remote(it, k) for it in sut.its], timeout=240)
        for rank, (batches, at, _) in enumerate(got):
            for epoch, ids in batches:
                self._got(rank, epoch, ids)
            sut.at[rank] = max(sut.at[rank], at)
        states = [state for _, _, state in got]
        assert all(s == states[0] for s in states), (
            "the ranks' states at one step differ: "
            f"{[(s['progress']['epoch'], s['progress']['step']) for s in states]}"
        )
        state = states[0]
        if state["progress"]["epoch"] > self.model.epoch:
            for epoch in range(self.model.epoch, state["progress"]["epoch"]):
                counts = [b[epoch] for b in sut.batches]
                assert len(set(counts)) == 1, f"ranks split in epoch {epoch}: {counts}"
            self.model.end_epoch(state, jump=True)
        else:
            self.model.save(state)

    @rule(data=st.data())
    def kill_a_reader(self, data: st.DataObject) -> None:
        sut = self.sut
        assert sut is not None
        reader = data.draw(st.sampled_from(sut.stream.readers))
        ray.kill(reader, no_restart=False)

    @precondition(lambda self: self.sut is not None and len(self.sut.stream.readers) < 3)
    @rule()
    def grow_the_pool(self) -> None:
        """A reader joins the pool as its sizer adds one (loops held here go on): feeds
        whose home changed move to it, decode work spreads over it."""
        assert self.sut is not None
        pool = self.sut.stream._pool
        pool.add(pool.make())

    @precondition(lambda self: self.sut is not None and len(self.sut.stream.readers) > 1)
    @rule()
    def shrink_the_pool(self) -> None:
        """The newest reader leaves the pool as its sizer removes one."""
        assert self.sut is not None
        self.sut.stream._pool.remove()

    @precondition(lambda self: self.model.saved is not None)
    @rule(world=st.integers(1, 3), batch=st.sampled_from(BATCHES))
    def restore(self, world: int, batch: int) -> None:
        """Resume from the last state with another world size or batch size."""
        assert self.sut is not None
        self.sut.close()
        state = self.model.restore()
        self.sut = Ranks(self.data, world, batch)
        self.sut.stream.load_state_dict(state)
        self.sut.at = [self.model.epoch] * world

    def teardown(self) -> None:
        if self.sut is None:
            return
        try:
            finish_epoch(self.model, self.take, TOTAL)
        finally:
            self.sut.close()


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_raystream_ranks_deliver_every_row_once_whatever_the_user_does(data: Data) -> None:
    RayMachine.data = data
    run_state_machine_as_test(
        RayMachine,
        settings=bounded(6, 8),
    )


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_every_rank_s_state_at_a_step_is_the_same(data: Data) -> None:
    """Issue 31, finding 12: the ranks of a ``RayStream`` each take a state in a Ray task of
    their own at the same step, next to an epoch with no step (3 ranks of 48 rows: 144 rows,
    more than the dataset's 120), one rank after another: each gets the same state. (The
    first rank asked before the others reached the end of the epoch with no step and got a
    state of that epoch; the last got one of the next.) Then again at the first batch of the
    epoch after, the ranks side by side."""
    sut = Ranks(data, 3, 48)
    try:
        first = [ray.get(_state_in_a_task.remote(it, 1), timeout=120) for it in sut.its]
        states = [state for _, _, state in first]
        assert all(not batches for batches, _, _ in first), "epoch 0 has no step"
        assert [(s["progress"]["epoch"], s["progress"]["step"]) for s in states] == [(1, 0)] * 3
        assert all(s == states[0] for s in states)
        got = ray.get([_state_in_a_task.remote(it, 1) for it in sut.its], timeout=120)
        assert [len(batches) for batches, _, _ in got] == [1, 1, 1]
        after = [state for _, _, state in got]
        assert all(s == after[0] for s in after) and after[0]["progress"]["step"] == 1
        assert sum(len(b) for batches, _, _ in got for _, b in batches) == 144
    finally:
        sut.close()


def _batches(source: Any, k: int, *, to_end: bool = False) -> int:
    """Take ``k`` batches of ``source``, a loop after another (then, ``to_end``, the rest of
    the epoch the last one is in); returns the batches taken."""
    taken = 0
    while taken < k:
        got = 0
        for _ in source:
            taken, got = taken + 1, got + 1
            if taken == k and not to_end:
                break
        assert got or taken, "an epoch with no batch and nothing before it"
    return taken


@pytest.mark.system
@pytest.mark.usefixtures("ray_session")
def test_the_ranks_states_agree_after_a_resume_from_a_dataloader_into_three_ranks(
    data: Data,
) -> None:
    """Issue 31, finding 12, the sequence the report gives: a 1-rank ``RayStream`` takes 4
    batches and saves; a 1-worker ``DataLoader`` resumes that, takes 4 batches, finishes the
    epoch and saves; a 3-rank ``RayStream`` resumes that and takes the next epoch's first
    batch in a task per rank, each rank taking its state there: the same on every rank."""
    one = Ranks(data, 1, 48)
    try:
        _batches(one.its[0], 4)
        one.its[0].flush()
        state = one.stream.state_dict()
    finally:
        one.close()
    stream = ingest.Stream(data.url, columns=["id"], batch_size=48, shuffle_seed=5)
    loader = ingest.DataLoader(stream, num_workers=1)
    loader.load_state_dict(state)
    _batches(loader, 4, to_end=True)
    state = loader.state_dict()
    stream.close()
    three = Ranks(data, 3, 48)
    try:
        three.stream.load_state_dict(state)
        for _ in range(3):
            got = ray.get([_state_in_a_task.remote(it, 1) for it in three.its], timeout=120)
            states = [s for _, _, s in got]
            where = [(s["progress"]["epoch"], s["progress"]["step"]) for s in states]
            assert all(s == states[0] for s in states), f"the ranks' states differ: {where}"
    finally:
        three.close()


# -- a followed dataset: rounds over the shards written since the last -------------------

FOLLOW_ROWS = 30


@dataclass
class FollowModel(Model):
    """A followed dataset's rounds: each id once in all, but the rows carried (see
    :class:`Model`); a round reads the shards written before it was listed."""

    written: int = 0
    listed: int = 0
    """Shards of the rounds so far: those of the state after the last round (a round lists
    when it is planned: at its first loop, or at a state taken before it)."""
    earlier: int = 0
    """Shards of the rounds before the one in progress (its state counts them consumed)."""
    kept: tuple[int, int] = (0, 0)

    def most(self) -> int:
        return 1

    def universe(self) -> range:
        return range(self.written * FOLLOW_ROWS)

    def expected(self, i: int) -> int:
        return 1 if i < self.listed * FOLLOW_ROWS else 0

    def before(self) -> Counter[int]:
        return Counter(range(self.earlier * FOLLOW_ROWS))

    def end_epoch(self, state: dict[str, Any], *, told: bool = False, jump: bool = False) -> None:
        shards = StreamState.from_json(state).shards
        assert all(s.url in self.data.ids for s in shards), "a round listed a shard never written"
        self.listed = len(shards)
        super().end_epoch(state, told=told, jump=jump)
        self.earlier = self.listed
        self.kept = (self.listed, self.earlier)

    def keep(self) -> None:
        self.kept = (self.listed, self.earlier)

    def restore(self) -> dict[str, Any]:
        state = super().restore()
        self.listed, self.earlier = self.kept
        return state


class FollowMachine(Loops):
    """A ``Stream`` or ``DataLoader`` following a directory that grows between its loops."""

    model: FollowModel
    loops_to_end = 20

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ingest-follow-model-")
        self.data = Data(f"file://{self.dir}/", {})
        self.model = FollowModel(self.data)

    def _make(self, kind: str) -> Local:
        follow = ingest.Follow(poll_s=0.02, idle_timeout_s=0.3)
        return Local(self.data, kind, 16, follow=follow)

    @initialize(kind=st.sampled_from(["stream", "loader2"]), shards=st.integers(1, 2))
    def start(self, kind: str, shards: int) -> None:
        for _ in range(shards):
            self.write()
        self.sut = self._make(kind)

    @rule()
    def write(self) -> None:
        n = self.model.written
        path = os.path.join(self.dir, f"part-{n:05d}.parquet")
        ids = list(range(n * FOLLOW_ROWS, (n + 1) * FOLLOW_ROWS))
        pq.write_table(pa.table({"id": ids}), path)
        self.data.ids[f"file://{path}"] = ids
        self.model.written += 1

    @precondition(lambda self: self.model.saved is not None)
    @rule(kind=st.sampled_from(["stream", "loader0", "loader2"]))
    def restore(self, kind: str) -> None:
        assert self.sut is not None
        self.sut.close()
        self.sut = self._make(kind)
        self.sut.source.load_state_dict(self.model.restore())

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def test_a_followed_stream_reads_every_row_once_whatever_the_user_does() -> None:
    run_state_machine_as_test(
        FollowMachine,
        settings=bounded(15, 12),
    )
