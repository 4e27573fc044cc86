"""ingest.hf.Trainer (issue 10, part 1): a tiny randomly initialised GPT-2 fine-tuned on CPU
from a Stream, stopped by a crash half way, resumed from its last checkpoint: every row
trained on once per epoch, no batch replayed or skipped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import transformers

import ingest
from ingest.hf import Trainer

pytestmark = pytest.mark.system

SHARDS, ROWS, BATCH, TOKENS = 4, 64, 8, 8
STEPS_PER_EPOCH = SHARDS * ROWS // BATCH  # 32


def write_tokens(root: Path) -> str:
    rng = np.random.default_rng(0)
    for n in range(SHARDS):
        ids = np.arange(n * ROWS, (n + 1) * ROWS)
        tokens = rng.integers(0, 32, size=(ROWS, TOKENS))
        column = pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), TOKENS)
        table = pa.table({"id": ids, "input_ids": column, "labels": column})
        pq.write_table(table, root / f"part-{n}.parquet", row_group_size=16)
    return f"file://{root}"


class CrashError(Exception):
    pass


class Recording(Trainer):
    """Records the ids of each batch it trains on (at the global step it trained it in),
    and crashes after ``crash_after`` steps."""

    def __init__(self, *args: Any, crash_after: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, list[int]]] = []
        self.crash_after = crash_after

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any) -> Any:
        if self.crash_after is not None and self.state.global_step == self.crash_after:
            raise CrashError(f"crashed at step {self.state.global_step}")
        self.seen.append((self.state.global_step, inputs.pop("id").tolist()))
        return super().training_step(model, inputs, *args)


def make(url: str, out: Path, workers: int, **kwargs: Any) -> Recording:
    transformers.set_seed(0)
    config = transformers.GPT2Config(
        vocab_size=32, n_positions=TOKENS, n_embd=16, n_layer=1, n_head=2
    )
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=40,
        save_steps=10,
        logging_steps=10,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=workers,
        disable_tqdm=True,
    )
    stream = ingest.Stream(url, batch_size=BATCH, shuffle_seed=5)
    return Recording(
        model=transformers.GPT2LMHeadModel(config), args=args, train_stream=stream, **kwargs
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_trainer_resumed_from_its_checkpoint_trains_on_every_row_once(
    tmp_path: Path, workers: int
) -> None:
    (tmp_path / "data").mkdir()
    url = write_tokens(tmp_path / "data")
    out = tmp_path / "out"
    first = make(url, out, workers, crash_after=25)
    with pytest.raises(CrashError):
        first.train()
    assert os.path.exists(out / "checkpoint-20" / "ingest_data_state.json")
    saved = json.loads((out / "checkpoint-20" / "ingest_data_state.json").read_text())
    assert saved["progress"]["delivered"] == 20 * BATCH
    # Batches of steps 20..24 were trained on after the checkpoint: lost with the crash.
    kept = [ids for step, ids in first.seen if step < 20]
    second = make(url, out, 1 if workers else 0)  # another worker count
    second.train(resume_from_checkpoint=True)
    assert second.state.global_step == 40
    assert [step for step, _ in second.seen] == list(range(20, 40)), "no batch replayed"
    batches = kept + [ids for _, ids in second.seen]
    assert len(batches) == 40
    epoch_one = [i for ids in batches[:STEPS_PER_EPOCH] for i in ids]
    epoch_two = [i for ids in batches[STEPS_PER_EPOCH:] for i in ids]
    assert sorted(epoch_one) == list(range(SHARDS * ROWS)), "every row once in epoch 1"
    assert len(epoch_two) == len(set(epoch_two)) == 8 * BATCH


def test_a_checkpoint_without_the_data_state_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    url = write_tokens(tmp_path / "data")
    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    trainer = make(url, tmp_path / "out", 0)
    with pytest.raises(ingest.ConfigError, match=r"has no ingest_data_state\.json"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-5"))
    with pytest.raises(ingest.ConfigError, match="max_steps"):
        Trainer(
            model=trainer.model,
            args=transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[]),
            train_stream=ingest.Stream(url, batch_size=BATCH),
        )


def test_the_dataloader_arguments_are_taken_or_refused(tmp_path: Path) -> None:
    # Found by a probe: dataloader_prefetch_factor and dataloader_drop_last were ignored
    # without a word (the loader read 2 batches ahead, and kept the last short one).
    (tmp_path / "data").mkdir()
    url = write_tokens(tmp_path / "data")
    model = make(url, tmp_path / "out", 0).model

    def trainer(**arguments: Any) -> Trainer:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), report_to=[], max_steps=5, use_cpu=True, **arguments
        )
        return Trainer(model=model, args=args, train_stream=ingest.Stream(url, batch_size=BATCH))

    loader = trainer(dataloader_num_workers=2, dataloader_prefetch_factor=4).loader
    assert loader.prefetch_factor == 4
    loader.close()
    with pytest.raises(ingest.ConfigError, match=r"dataloader_drop_last.*remainder='drop'"):
        trainer(dataloader_drop_last=True)


class RecordingSources(Recording):
    """Records each batch's rows as (source, source epoch, id)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drawn: list[tuple[int, list[tuple[int, int, int]]]] = []

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any) -> Any:
        if self.crash_after is not None and self.state.global_step == self.crash_after:
            raise CrashError(f"crashed at step {self.state.global_step}")
        rows = zip(
            inputs["source"].tolist(),
            inputs["source_epoch"].tolist(),
            inputs.pop("id").tolist(),
            strict=True,
        )
        self.drawn.append((self.state.global_step, list(rows)))
        return super(Recording, self).training_step(model, inputs, *args)


def test_a_trainer_over_a_mix_resumes_exactly_with_another_worker_count(tmp_path: Path) -> None:
    """Two sources (shards 0-1 and 2-3 of the tokens), equal weights, 2 workers per source;
    a crash at step 25, resumed from step 20's checkpoint with 1 worker: no batch replayed,
    every row once per epoch of its source, the sources' rows within one of equal."""
    (tmp_path / "data").mkdir()
    root = tmp_path / "data"
    write_tokens(root)
    mix = ingest.Mix(
        {"a": [f"file://{root}/part-0.parquet", f"file://{root}/part-1.parquet"],
         "b": [f"file://{root}/part-2.parquet", f"file://{root}/part-3.parquet"]}
    )  # fmt: skip

    def trainer(workers: int, **kwargs: Any) -> RecordingSources:
        made = make(f"file://{root}", tmp_path / "out", workers, **kwargs)
        stream = ingest.Stream(mix, batch_size=BATCH, shuffle_seed=5)
        return RecordingSources(model=made.model, args=made.args, train_stream=stream, **kwargs)

    first = trainer(2, crash_after=25)
    with pytest.raises(CrashError):
        first.train()
    kept = [rows for step, rows in first.drawn if step < 20]
    second = trainer(1)
    second.train(resume_from_checkpoint=True)
    assert [step for step, _ in second.drawn] == list(range(20, 40)), "no batch replayed"
    rows = [r for batch in kept + [rows for _, rows in second.drawn] for r in batch]
    assert len(rows) == 40 * BATCH
    per: dict[tuple[int, int], list[int]] = {}
    for source, epoch, row in rows:
        per.setdefault((source, epoch), []).append(row)
    for (source, epoch), ids in per.items():
        assert len(ids) == len(set(ids)), f"source {source} epoch {epoch} repeated a row"
        own = set(range(source * 2 * ROWS, (source + 1) * 2 * ROWS))
        assert set(ids) <= own
        if (source, epoch + 1) in per:
            assert set(ids) == own, f"source {source} epoch {epoch} lost rows"
    a = np.cumsum([s == 0 for s, _, _ in rows])
    assert np.abs(a - np.arange(1, len(rows) + 1) / 2).max() <= 1.0


def test_gradient_accumulation_trains_on_every_row_once_across_a_resume(tmp_path: Path) -> None:
    """With gradient_accumulation_steps=3 the Trainer fetches three batches per optimizer
    step, and 32 batches an epoch leave a short last step: the data state saved at a step
    covers exactly the batches trained on, across the epoch's end and a crash."""
    (tmp_path / "data").mkdir()
    url = write_tokens(tmp_path / "data")
    out = tmp_path / "out"

    def accumulating(**kwargs: Any) -> Recording:
        trainer = make(url, out, 0, **kwargs)
        trainer.args.gradient_accumulation_steps = 3
        trainer.args.max_steps = 16
        trainer.args.save_steps = 5
        return trainer

    first = accumulating(crash_after=12)
    with pytest.raises(CrashError):
        first.train()
    saved = json.loads((out / "checkpoint-10" / "ingest_data_state.json").read_text())
    kept = [ids for step, ids in first.seen if step < 10]
    assert len(kept) == 30 and saved["progress"]["delivered"] == 30 * BATCH
    second = accumulating()
    second.train(resume_from_checkpoint=True)
    assert second.state.global_step == 16
    batches = kept + [ids for _, ids in second.seen]
    epoch_one = [i for ids in batches[:STEPS_PER_EPOCH] for i in ids]
    later = [i for ids in batches[STEPS_PER_EPOCH:] for i in ids]
    assert sorted(epoch_one) == list(range(SHARDS * ROWS)), "every row once in epoch 1"
    assert len(later) == len(set(later)) > 0
