"""The coordinator dies: ranks fail fast with a message that says how to resume, and the
state taken before resumes exactly once (issue 8, fault 1): killed for good outside Ray
Train, crashed and restarted by Ray outside Ray Train, crashed under a TorchTrainer with
``FailureConfig`` (the run continues from the latest checkpoint, every row once per epoch).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import Store, write_dataset
from tests.faults import fire_once, kill_coordinator

SHARDS, ROWS, BATCH = 4, 1024, 32
TOTAL = SHARDS * ROWS

pytestmark = pytest.mark.usefixtures("ray_session")


@ray.remote(num_cpus=0)
class _Rank:
    """A rank whose loop the test drives batch by batch."""

    def __init__(self, it: Any) -> None:
        self.it = it
        self.loop = iter(it)
        self.seen: list[int] = []

    def take(self, n: int) -> int:
        for _ in range(n):
            self.seen += [int(v) for v in next(self.loop)["id"].tolist()]
        return len(self.seen)

    def state(self) -> dict[str, Any]:
        return self.it.state_dict()  # type: ignore[no-any-return]

    def drain(self) -> dict[str, Any]:
        """Iterate on until the loop ends or fails; what failed, how fast, what came."""
        start, came = time.monotonic(), 0
        try:
            for batch in self.loop:
                came += len(batch["id"])
                self.seen += [int(v) for v in batch["id"].tolist()]
        except Exception as e:
            return {"error": e, "seconds": time.monotonic() - start, "rows_after": came}
        return {"error": None, "seconds": time.monotonic() - start, "rows_after": came}

    def rows(self) -> list[int]:
        return self.seen


@pytest.fixture
def data(local: Store) -> Store:
    write_dataset(local.fs, local.url("parquet"), "parquet", SHARDS, ROWS, row_group_rows=256)
    return local


def test_a_dead_coordinator_fails_the_ranks_fast_and_the_last_state_resumes(data: Store) -> None:
    options: dict[str, Any] = {"columns": ["id"], "batch_size": BATCH, "shuffle_seed": 3}
    stream = ingest.RayStream(data.url("parquet"), world_size=2, **options)
    ranks = [_Rank.remote(stream.rank_iterator(r)) for r in range(2)]  # type: ignore[attr-defined]
    try:
        ray.get([r.take.remote(10) for r in ranks], timeout=120)
        states = ray.get([r.state.remote() for r in ranks], timeout=120)
        assert states[0] == states[1]
        ray.get([r.take.remote(5) for r in ranks], timeout=120)
        ray.kill(stream.coordinator, no_restart=True)
        outcomes = ray.get([r.drain.remote() for r in ranks], timeout=120)
        for out in outcomes:
            error = out["error"]
            assert isinstance(error, ingest.IngestError), repr(error)
            message = str(error)
            assert "coordinator" in message and "load_state_dict" in message, message
            assert out["seconds"] < 30, out
            # Acks are checked every few batches: a rank never runs on for long with acks
            # that cannot be recorded.
            assert out["rows_after"] <= 2 * ingest.RankOptions().ack_every * BATCH, out
    finally:
        for r in ranks:
            ray.kill(r)
        stream.shutdown()

    # Resume from the state taken before the death: the rest of the epoch, exactly once.
    resumed = ingest.RayStream(data.url("parquet"), world_size=2, **options)
    try:
        resumed.load_state_dict(states[0])
        its = [resumed.rank_iterator(r) for r in range(2)]
        rest = ray.get([_drain_once.remote(it) for it in its], timeout=120)
    finally:
        resumed.shutdown()
    head = 10 * BATCH * 2
    delivered = Counter(v for r in rest for v in r)
    assert sum(delivered.values()) + head == TOTAL
    assert max(delivered.values()) == 1
    assert len(delivered) == TOTAL - head


@ray.remote(num_cpus=0)
def _drain_once(it: Any) -> list[int]:
    return [int(v) for batch in it for v in batch["id"].tolist()]


@pytest.mark.parametrize("how", ["sigkill", "ray.kill"])
def test_a_crashed_coordinator_restarts_and_the_same_stream_resumes(data: Store, how: str) -> None:
    """SIGKILL of its process, or ray.kill with a restart: Ray restarts it; the ranks of its
    former life fail fast (never an ack dropped), the driver's state_dict says its state is
    lost, and loading the last state on the same stream delivers the rest of the epoch
    exactly once."""
    options: dict[str, Any] = {"columns": ["id"], "batch_size": BATCH, "shuffle_seed": 3}
    stream = ingest.RayStream(data.url("parquet"), world_size=2, **options)
    try:
        ranks = [_Rank.remote(stream.rank_iterator(r)) for r in range(2)]  # type: ignore[attr-defined]
        ray.get([r.take.remote(10) for r in ranks], timeout=120)
        states = ray.get([r.state.remote() for r in ranks], timeout=120)
        ray.get([r.take.remote(5) for r in ranks], timeout=120)
        kill_coordinator(stream.coordinator, how)
        killed = time.monotonic()
        outcomes = ray.get([r.drain.remote() for r in ranks], timeout=120)
        for out in outcomes:
            assert isinstance(out["error"], ingest.CoordinatorLostError), repr(out["error"])
            assert out["seconds"] < 30, out
            # Calls to a restarting actor wait for it: at most two ack messages unanswered,
            # then the rank waits for the oldest and fails.
            assert out["rows_after"] <= 3 * ingest.RankOptions().ack_every * BATCH, out
            assert str(out["error"]).count("actor died") == 1, str(out["error"])
        for r in ranks:
            ray.kill(r)
        with pytest.raises(ingest.CoordinatorLostError, match="load_state_dict"):
            stream.state_dict()
        stream.load_state_dict(states[0])
        its = [stream.rank_iterator(r) for r in range(2)]
        rest = ray.get([_drain_once.remote(it) for it in its], timeout=120)
        recovered = time.monotonic() - killed
        final = stream.state_dict()
    finally:
        stream.shutdown()
    head = 10 * BATCH * 2
    delivered = Counter(v for r in rest for v in r)
    assert sum(delivered.values()) + head == TOTAL, recovered
    assert max(delivered.values()) == 1
    assert final["progress"]["epoch"] == 1, final["progress"]


# Under Ray Train: the "model" is one counter per row id (summed across ranks like DDP
# gradients), saved in every checkpoint with the stream state; see tests/test_train.py.
T_SHARDS, T_ROWS, T_BATCH, T_EPOCHS = 6, 200, 50, 2
T_TOTAL = T_SHARDS * T_ROWS  # 12 steps of 2 x 50 rows per epoch


def _counting_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    events = Path(config["events"])
    it, checkpoint = ingest.train.rank_iterator(config["stream"])
    counts = torch.zeros(T_TOTAL, dtype=torch.int64)
    if checkpoint:
        with checkpoint.as_directory() as directory:
            counts = torch.load(os.path.join(directory, "counts.pt"))
    rank = ray.train.get_context().get_world_rank()
    first = True

    def save(directory: str) -> None:
        torch.save(counts, os.path.join(directory, "counts.pt"))

    def note(kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, "rank": rank, "t": time.time(), **fields})
        with open(events / f"rank{rank}.jsonl", "a") as f:
            f.write(line + "\n")

    try:
        while it.upcoming_epoch() < T_EPOCHS:
            for batch in it:
                if first:
                    note("first_batch", step=it.step, restored=checkpoint is not None)
                    first = False
                delta = torch.zeros(T_TOTAL, dtype=torch.int64)
                delta.index_add_(0, batch["id"], torch.ones(len(batch["id"]), dtype=torch.int64))
                dist.all_reduce(delta)
                counts += delta
                if (
                    rank == 0
                    and (it.upcoming_epoch(), it.step % 12) == config["kill_at"]
                    and fire_once(str(events / "killed"))
                ):
                    note("kill", step=it.step)
                    kill_coordinator(config["stream"].coordinator, "sigkill")
                if it.step % 3 == 2:
                    ingest.train.report(it, {"step": it.step}, save=save)
        ingest.train.report(it, {"step": it.step}, save=save)
    except ingest.CoordinatorLostError as e:
        note("lost", step=it.step, message=str(e))
        raise


@pytest.mark.system
def test_coordinator_death_under_ray_train_continues_from_the_checkpoint(
    s3_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILL of the coordinator's process. ``ray.kill`` with a restart also ends in Ray
    restarting the actor, and the ranks see the same CoordinatorLostError: the cheaper
    same-stream test above runs both ways."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # The controller polls its workers every 0.25 s, not 2 s (TorchTrainer passes this
    # variable of the driver on to it): a worker's ray.train.report waits for the poll that
    # takes the previous report, so each checkpoint cost ~1.8 s.
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")

    url = s3_store.url("data")
    write_dataset(s3_store.fs, url, "parquet", T_SHARDS, T_ROWS, row_group_rows=50)
    events = tmp_path / "events"
    events.mkdir()
    with ingest.RayStream(
        url,
        columns=["id"],
        batch_size=T_BATCH,
        shuffle_seed=0,
        world_size=2,
        storage_options=s3_store.storage_options,
    ) as stream:
        result = TorchTrainer(
            _counting_loop,
            # Killed right after the checkpoint of step 5 of epoch 0: steps 6-8 run again.
            train_loop_config={
                "stream": stream,
                "events": str(events),
                "kill_at": (0, 6),
            },
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="coordinator",
                storage_path=str(tmp_path / "runs"),
                failure_config=FailureConfig(max_failures=2),
            ),
        ).fit()
    log = [
        json.loads(line)
        for rank in range(2)
        for line in (events / f"rank{rank}.jsonl").read_text().splitlines()
    ]
    kill = next(e for e in log if e["kind"] == "kill")
    lost = [e for e in log if e["kind"] == "lost"]
    assert lost, "a rank saw the coordinator's death"
    for e in lost:
        assert "load_state_dict" in e["message"] and "checkpoint" in e["message"], e
        assert e["t"] - kill["t"] < 30, (e, kill)  # seconds, not the 300 s default wait
        assert e["step"] <= kill["step"] + 2 * ingest.RankOptions().ack_every
    resumed = [e for e in log if e["kind"] == "first_batch" and e["restored"]]
    assert {e["step"] for e in resumed} == {6}, resumed  # right after the checkpoint
    recover_s = min(e["t"] for e in resumed) - kill["t"]
    assert recover_s < 120, recover_s
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        counts = torch_load(os.path.join(directory, "counts.pt"))
        state = json.loads(Path(directory, ingest.train.STATE_FILE).read_text())
    # Every row exactly once per epoch: the rows counted after the checkpoint and lost with
    # the old worker group came again, the rows before it never did.
    assert counts.eq(T_EPOCHS).all(), counts.bincount().tolist()
    assert state["progress"]["epoch"] == T_EPOCHS
    print(
        f"coordinator killed: detected in {max(e['t'] for e in lost) - kill['t']:.1f} s, "
        f"first batch after the restart {recover_s:.1f} s after the kill"
    )


def torch_load(path: str) -> Any:
    import torch

    return torch.load(path)
