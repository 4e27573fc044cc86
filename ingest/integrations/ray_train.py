"""Ray Train glue: the stream's state rides in every Ray Train checkpoint.

Inside ``train_loop_per_worker`` of a ``TorchTrainer``::

    def train_loop(config):
        it, checkpoint = ingest.train.rank_iterator(config["stream"])
        if checkpoint:                              # restarted: restore the model
            with checkpoint.as_directory() as d:
                model.load_state_dict(torch.load(f"{d}/model.pt"))
        while it.upcoming_epoch() < config["epochs"]:
            for batch in it:
                ...                                 # forward, backward, step
                if it.step % 50 == 49:              # every rank, at the same step
                    ingest.train.report(it, {"loss": loss.item()},
                                        save=lambda d: torch.save(model.state_dict(),
                                                                  f"{d}/model.pt"))

:func:`rank_iterator` restores the stream from ``ray.train.get_checkpoint()`` (the
coordinator restarts from the checkpoint's state once per worker group), so both automatic
restarts under ``FailureConfig(max_failures=N)`` and a re-run of the same run resume right
after the checkpointed step, with any number of workers. A coordinator whose process or node
died is restarted by Ray; the ranks fail with :class:`ingest.CoordinatorLostError` at their
next ack, and the restarted group continues from the latest checkpoint. :func:`report` puts
the model's files and the stream state of the same step, consistent across ranks, into one
checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import ray
import ray.train

from ingest.core.errors import StateError
from ingest.core.state import MAX_STATE_BYTES, read_state
from ingest.distributed.rank import RankIterator, RankOptions
from ingest.distributed.ray_mix import MixedRankIterator
from ingest.distributed.ray_stream import RayStream

STATE_FILE = "ingest_stream_state.json"


def load_state(checkpoint: ray.train.Checkpoint | None) -> dict[str, Any] | None:
    """The stream state stored in ``checkpoint``, or None."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        path = os.path.join(directory, STATE_FILE)
        if not os.path.exists(path):
            return None
        # Size-limited and validated before use (ingest.core.state.MAX_STATE_BYTES).
        with open(path, "rb") as f:
            text = f.read(MAX_STATE_BYTES + 1)
        try:  # one source's state, or a mixture's (several sources)
            return read_state(text).to_json()
        except StateError as e:
            raise StateError(f"{STATE_FILE} of checkpoint {checkpoint.path}: {e}") from None


def rank_iterator(
    stream: RayStream, *, options: RankOptions | None = None
) -> tuple[RankIterator | MixedRankIterator, ray.train.Checkpoint | None]:
    """This worker's iterator, restored from the latest checkpoint; and that checkpoint.

    Call once at the start of ``train_loop_per_worker``. The rank and world size come from
    Ray Train's context; the world size may differ from the one the checkpoint was saved
    with (the rest of the epoch is shared out again). Over an :class:`ingest.Mix`, every
    source's stream is restored from its part of the state, and the mixture's draws go on
    from its counts.
    """
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    checkpoint = ray.train.get_checkpoint()
    state = load_state(checkpoint)
    return stream.joined(rank, world_size, state, options=options), checkpoint


def report(
    it: RankIterator | MixedRankIterator,
    metrics: dict[str, Any],
    *,
    save: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``ray.train.report`` with a checkpoint of the model and the stream at ``it.step``.

    Every rank calls it at the same step. Rank 0 writes the checkpoint: the stream state
    (consistent across ranks: all rows of steps <= ``it.step`` of every rank) and whatever
    ``save(directory)`` writes (the model, the optimizer). Returns the stream state.
    """
    state = it.state_dict()
    if ray.train.get_context().get_world_rank() != 0:
        ray.train.report(metrics, checkpoint=None)
        return state
    with tempfile.TemporaryDirectory() as directory:
        if save is not None:
            save(directory)
        with open(os.path.join(directory, STATE_FILE), "w") as f:
            json.dump(state, f)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
    return state


__all__ = [
    "STATE_FILE",
    "load_state",
    "rank_iterator",
    "report",
]
