"""The Hugging Face ``Trainer`` reading an :class:`ingest.Stream`, resumable exactly.

``pip install "ingest[hf]"`` brings ``transformers`` and ``accelerate``.

:class:`Trainer` is ``transformers.Trainer`` with ``train_stream=`` instead of
``train_dataset=``. It reads the stream through an :class:`ingest.DataLoader`
(``dataloader_num_workers`` worker processes, ``dataloader_pin_memory``,
``dataloader_prefetch_factor``; the workers are kept across epochs whatever
``dataloader_persistent_workers`` says, and ``dataloader_drop_last`` is refused: the stream
makes the batches), writes the data
state into every checkpoint folder (``ingest_data_state.json``; one file per rank,
``ingest_data_state-rank{R}.json``, when several processes train, each with its own stream),
and ``train(resume_from_checkpoint=...)`` loads it back before training goes on. The
Trainer's own resume replays ("skips") the batches of the epoch trained so far; here the
stream seeks to the first row not trained on instead, so nothing is replayed
(``ignore_data_skip`` is set) and no row is trained on twice or left out.

The stream's batches go to the model as they are: give it the columns the model's
``forward`` takes (``columns=`` or ``transform=``). A stream has no length, so set
``TrainingArguments(max_steps=...)``; each pass over the stream is one Trainer epoch.
"""

from __future__ import annotations

import json
import os
from typing import Any

import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ingest.core.errors import ConfigError
from ingest.engine.mix import SOURCE, SOURCE_EPOCH
from ingest.engine.stream import Stream
from ingest.integrations.loader import DataLoader


def state_file(rank: int, world_size: int) -> str:
    """The name of a rank's data state in a checkpoint folder."""
    return "ingest_data_state.json" if world_size == 1 else f"ingest_data_state-rank{rank}.json"


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` over an ``ingest.Stream``; its data state is in every
    checkpoint and is restored by ``train(resume_from_checkpoint=...)``.

    Args:
        *args: As ``transformers.Trainer`` (model, args, ...).
        train_stream: The training data; not ``train_dataset``. Over an :class:`ingest.Mix`,
            the batches' ``source`` and ``source_epoch`` are dropped before the model.
        **kwargs: As ``transformers.Trainer``.

    Raises:
        ConfigError: With a ``train_dataset``, or without ``TrainingArguments(max_steps)``.
    """

    def __init__(self, *args: Any, train_stream: Stream, **kwargs: Any) -> None:
        if kwargs.get("train_dataset") is not None:
            raise ConfigError(
                "ingest.hf.Trainer reads train_stream=; pass no train_dataset (use "
                "transformers.Trainer for a datasets.Dataset)"
            )
        super().__init__(*args, **kwargs)
        if self.args.max_steps is None or self.args.max_steps <= 0:
            raise ConfigError(
                "a stream has no length: set TrainingArguments(max_steps=N) (each pass over "
                "the stream is one epoch)"
            )
        # The data state resumes by seeking: the Trainer must not replay batches as well.
        self.args.ignore_data_skip = True
        if self.args.dataloader_drop_last:
            raise ConfigError(
                "TrainingArguments(dataloader_drop_last=True): the stream makes the batches, "
                "each whole (the rows that fill no step go on into the next epoch); to drop "
                "them, pass remainder='drop' to the Stream"
            )
        workers = self.args.dataloader_num_workers
        prefetch = getattr(self.args, "dataloader_prefetch_factor", None)
        self.loader = DataLoader(
            train_stream,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory,
            **({"prefetch_factor": prefetch} if workers and prefetch is not None else {}),
        )

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        # A mixture's batches say each row's source; the model takes no such argument.
        for key in (SOURCE, SOURCE_EPOCH):
            inputs.pop(key, None)
        return super()._prepare_inputs(inputs)  # type: ignore[no-any-return]

    def get_train_dataloader(self) -> DataLoader:
        # Not prepared by accelerate: it would wrap the loader in one that shards and
        # skips by itself; each process reads its own stream.
        return self.loader

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # Written first: a folder with the model and no data state is never left behind.
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, state_file(self.args.process_index, self.args.world_size))
        with open(path + ".tmp", "w") as f:
            json.dump(self.loader.state_dict(), f)
        os.replace(path + ".tmp", path)
        super()._save_checkpoint(model, trial)

    def train(  # type: ignore[override]
        self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any
    ) -> Any:
        folder = resume_from_checkpoint
        if folder is True:
            folder = get_last_checkpoint(self.args.output_dir)  # type: ignore[no-untyped-call]
            if folder is None:
                raise ConfigError(
                    f"no checkpoint to resume from in {self.args.output_dir!r}; train "
                    "without resume_from_checkpoint first"
                )
        if isinstance(folder, str):
            path = os.path.join(folder, state_file(self.args.process_index, self.args.world_size))
            if not os.path.exists(path):
                raise ConfigError(
                    f"checkpoint {folder!r} has no {os.path.basename(path)}: it was not saved "
                    "by ingest.hf.Trainer, so where the data stopped is unknown. Resume from "
                    "a checkpoint of this trainer, or start without resume_from_checkpoint"
                )
            with open(path) as f:
                self.loader.load_state_dict(json.load(f))
        return super().train(resume_from_checkpoint=folder or None, **kwargs)


__all__ = ["Trainer", "state_file"]
