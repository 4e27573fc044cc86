"""Exactly once end to end, under Ray Train's TorchTrainer (CPU, gloo).

The "model" is one counter per row id; each step adds 1 at the ids of its batch (summed
across ranks like DDP gradients) and the counters go into every checkpoint with the stream
state. After every epoch has run, through worker deaths and restarts at other worker
counts, every counter must equal the number of epochs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import ingest
from ingest.core.state import StreamState
from ingest.testing import Store, write_dataset

SHARDS, ROWS, BATCH, EPOCHS = 6, 200, 50, 2
TOTAL = SHARDS * ROWS  # divisible by 2 and 3 ranks x BATCH: no remainder to carry

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("ray_session")]


@pytest.fixture(autouse=True)
def poll_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray Train controller polls its workers every 0.25 s, not 2 s (TorchTrainer passes
    this variable of the driver on to it): a worker's ray.train.report waits for the poll that
    takes the previous report, so each checkpoint cost ~1.8 s."""
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")


def counting_loop(config: dict[str, Any]) -> None:
    count(config, TOTAL, lambda batch: batch["id"])


def count(config: dict[str, Any], size: int, where: Any) -> None:
    """Every epoch of the stream, adding 1 to the counters at ``where(batch)`` (summed over
    the ranks, like DDP gradients); the counters go into every checkpoint."""
    import ray.train
    import torch.distributed as dist

    it, checkpoint = ingest.train.rank_iterator(config["stream"])
    counts = torch.zeros(size, dtype=torch.int64)
    if checkpoint:
        with checkpoint.as_directory() as directory:
            counts = torch.load(os.path.join(directory, "counts.pt"))
    rank = ray.train.get_context().get_world_rank()

    def save(directory: str) -> None:
        torch.save(counts, os.path.join(directory, "counts.pt"))

    while it.upcoming_epoch() < EPOCHS:
        for batch in it:
            at = where(batch)
            delta = torch.zeros(size, dtype=torch.int64)
            delta.index_add_(0, at, torch.ones(len(at), dtype=torch.int64))
            dist.all_reduce(delta)
            counts += delta
            if rank == 1 and it.step == config["die_at"] and not os.path.exists(config["marker"]):
                Path(config["marker"]).touch()
                os._exit(1)  # the worker process dies mid-epoch, no cleanup
            if it.step % 3 == 2:
                ingest.train.report(it, {"step": it.step}, save=save)
    ingest.train.report(it, {"step": it.step}, save=save)


def fit(
    stream: ingest.RayStream, tmp: Path, name: str, workers: int, max_failures: int, die_at: int
) -> Any:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        counting_loop,
        train_loop_config={"stream": stream, "die_at": die_at, "marker": str(tmp / name)},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp / "runs"),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit()


def final_counts(result: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    with result.checkpoint.as_directory() as directory:
        counts = torch.load(os.path.join(directory, "counts.pt"))
        state = json.loads(Path(directory, ingest.train.STATE_FILE).read_text())
    return counts, state


@pytest.fixture
def data(local: Store) -> str:
    write_dataset(local.fs, local.url("data"), "parquet", SHARDS, ROWS, row_group_rows=50)
    return local.url("data")


def test_worker_death_and_automatic_restart(data: str, tmp_path: Path) -> None:
    with ingest.RayStream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=0, world_size=2
    ) as stream:
        result = fit(stream, tmp_path, "auto", workers=2, max_failures=1, die_at=7)
    assert (tmp_path / "auto").exists(), "a worker died"
    counts, state = final_counts(result)
    assert torch.all(counts == EPOCHS), torch.bincount(counts).tolist()
    assert state["progress"]["epoch"] == EPOCHS and state["version"] == 7


def test_rerun_of_the_same_run_with_another_worker_count(data: str, tmp_path: Path) -> None:
    from ray.train import TrainingFailedError

    with (
        ingest.RayStream(
            data, columns=["id"], batch_size=BATCH, shuffle_seed=0, world_size=2
        ) as stream,
        pytest.raises(TrainingFailedError),
    ):
        fit(stream, tmp_path, "rerun", workers=2, max_failures=0, die_at=7)
    with ingest.RayStream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=0, world_size=3
    ) as stream:
        result = fit(stream, tmp_path, "rerun", workers=3, max_failures=0, die_at=-1)
    counts, state = final_counts(result)
    assert torch.all(counts == EPOCHS), torch.bincount(counts).tolist()
    assert state["distributed"]["world_size"] == 3


def _keep_all(table: Any) -> Any:
    import numpy as np

    return np.ones(table.num_rows, dtype=bool)


def test_derived_copies_under_ray_train_through_a_death(data: str, tmp_path: Path) -> None:
    """Issue 34 item 5, Ray Train: the readers keep what the stages made of each unit
    (derived=) and read it back in the second epoch, through a worker's death and Ray
    Train's restart, with every row counted once per epoch."""
    with ingest.RayStream(
        data, columns=["id"], batch_size=BATCH, shuffle_seed=0, world_size=2,
        transform=ingest.Filter(_keep_all, version="1"),
        derived=f"file://{tmp_path / 'copies'}",
    ) as stream:  # fmt: skip
        result = fit(stream, tmp_path, "derived", workers=2, max_failures=1, die_at=7)
        stats = stream.stats()
    assert (tmp_path / "derived").exists(), "a worker died"
    counts, _ = final_counts(result)
    assert torch.all(counts == EPOCHS), torch.bincount(counts).tolist()
    assert stats["derived_writes"] > 0 and stats["derived_hits"] > 0, stats


SEQ_LEN, SEQS = 64, 4


def token_counting_loop(config: dict[str, Any]) -> None:
    """As counting_loop, with one counter per token of the corpus (token ``j`` of document
    ``d`` is ``d * 10_000 + j + 1``; ``offsets[d]`` is where ``d``'s counters start)."""
    offsets = torch.tensor(config["offsets"], dtype=torch.int64)

    def where(batch: dict[str, Any]) -> torch.Tensor:
        assert batch["input_ids"].shape == (SEQS, SEQ_LEN)
        ids = batch["input_ids"].flatten()
        ids = ids[ids > 0] - 1
        at: torch.Tensor = offsets[ids // 10_000] + ids % 10_000
        return at

    count(config, int(offsets[-1]), where)


def fit_tokens(
    stream: ingest.RayStream,
    tmp: Path,
    name: str,
    offsets: list[int],
    max_failures: int,
    die_at: int,
) -> Any:
    """``token_counting_loop`` over ``stream`` on its world size of workers."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    config = {"stream": stream, "die_at": die_at, "marker": str(tmp / "died")}
    return TorchTrainer(
        token_counting_loop,
        train_loop_config={**config, "offsets": offsets},
        scaling_config=ScalingConfig(num_workers=stream.world_size),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp / "runs"),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    ).fit()


def exact(counts: Any, expected: Any, offsets: list[int], dropped: int) -> None:
    """Every token trained on exactly as often as due, and no row dropped (a row left over
    with its carried copy is carried once and owed once, :mod:`ingest.core.carry`); a
    failure names the documents (``offsets``: each one's first token) short or over."""
    firsts = torch.tensor(offsets[:-1], dtype=torch.int64)

    def docs(where: Any) -> list[int]:
        found = torch.nonzero(where).flatten()
        return sorted(set((torch.searchsorted(firsts, found, right=True) - 1).tolist()))

    assert dropped == 0, f"{dropped} rows dropped"
    assert not docs(counts > expected), f"documents trained on too often: {docs(counts > expected)}"
    assert not docs(counts < expected), (
        f"documents short of their tokens: {docs(counts < expected)}"
    )


MIX_CORPORA = {"web": (0, 192), "code": (100_000, 64)}


def test_a_mixture_every_token_once_per_epoch_of_its_source_through_a_death(
    local: Store, tmp_path: Path
) -> None:
    """ingest.train over an ingest.Mix: 2 workers draw 3:1 from two corpora, one dies (the
    run fails), the same run goes on with 3 workers from its checkpoint. Each token is
    trained on once per epoch of its own corpus: the epochs each finished, and the one in
    progress as the final state's part for that corpus says (rows consumed, documents cut,
    rows carried into it).

    The readers tokenize and the ranks pack, so this is also the test of packed documents
    under Ray Train through a death and another worker count. A one-source packed stream
    under Ray Train has no test of its own: each source here is a one-source packed stream
    (batches of one sequence, states through the mixture's); tests/test_pack_ray.py stops
    and resumes one with batches of several sequences at 3 -> 2 -> 4 ranks, and the tests
    above take a one-source stream's checkpoints through Ray Train."""
    from ray.train import TrainingFailedError

    from tests.test_mix import write_corpora
    from tests.test_pack_stream import lengths, tokenize

    urls = write_corpora(local, MIX_CORPORA)
    docs = {  # source -> its documents' (id, tokens), in shard order (2 shards each)
        name: list(zip(range(first, first + n), lengths(n, seed=k), strict=True))
        for k, (name, (first, n)) in enumerate(MIX_CORPORA.items())
    }
    table = [0] * (max(first + n for first, n in MIX_CORPORA.values()) + 1)
    at = 0
    for pairs in docs.values():
        for d, k in pairs:
            table[d], at = at, at + k
    table[-1] = at

    def run(workers: int, die_at: int) -> Any:
        with ingest.RayStream(
            ingest.Mix(urls, weights={"web": 3, "code": 1}),
            batch_size=SEQS,
            transform=ingest.Tokenize(tokenize),
            pack=ingest.Pack(seq_len=SEQ_LEN, read_rows=8, max_open=8),
            shuffle_seed=1,
            world_size=workers,
            readers=ingest.ReaderPool(max_size=1, num_cpus=0.5),
        ) as s:
            return fit_tokens(s, tmp_path, "mixed", table, 0, die_at)

    with pytest.raises(TrainingFailedError):
        run(2, die_at=7)
    assert (tmp_path / "died").exists(), "a worker died"
    counts, state = final_counts(run(3, die_at=-1))
    assert state["mix"]["mixture"]["epoch"] == EPOCHS and set(state["sources"]) == set(docs)
    expected = torch.zeros_like(counts)
    dropped = 0
    for name, pairs in docs.items():
        part = StreamState.from_json(state["sources"][name])
        due(part, pairs, table, expected)
        assert part.progress.epoch >= 1, f"{name} finished an epoch of its own"
        dropped += part.progress.dropped
    firsts = sorted({table[d] for pairs in docs.values() for d, k in pairs if k})
    exact(counts, expected, [*firsts, table[-1]], dropped)


def due(part: StreamState, pairs: list[tuple[int, int]], table: list[int], expected: Any) -> None:
    """Add to ``expected`` the times each token of one corpus (its documents ``pairs``, in
    2 shards) was due by its part of the state (:func:`tests.test_mix.times_due`)."""
    from tests.test_mix import times_due

    length = dict(pairs)
    for (d, upto), n in times_due(part, pairs).items():
        expected[table[d] : table[d] + (length[d] if upto < 0 else upto)] += n
