"""The coordinator dies: ranks fail fast with a message that says how to resume, and the
state taken before resumes exactly once (issue 8, fault 1, outside Ray Train)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import write_dataset
from tests.conftest import Store

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
