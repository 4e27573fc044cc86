"""The tokenizing stage (ingest.engine.tokenize): the ids a tokenizer gives, from a
``tokenizers`` tokenizer trained here, a ``transformers`` one loaded from a local directory,
or a plain callable; one output row per input row; clear refusals."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ingest.core.errors import ConfigError
from ingest.engine.tokenize import Tokenize

WORDS = [
    "the",
    "a",
    "stream",
    "of",
    "rows",
    "read",
    "once",
    "exactly",
    "resumed",
    "shard",
    "token",
    "pack",
    "mixture",
]


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(0, 30)))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A small BPE tokenizer trained on the spot (nothing is downloaded)."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        texts(500), trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "[EOS]"])
    )
    return tok


def test_the_ids_are_the_tokenizers_and_other_columns_stay(tokenizer: Tokenizer) -> None:
    docs = texts(64, seed=1)
    table = pa.table({"text": docs, "id": np.arange(64)})
    staged = Tokenize(tokenizer, keep=["id"])(table)
    staged.check(64, "Tokenize")
    want = [e.ids for e in tokenizer.encode_batch(docs, add_special_tokens=False)]
    assert staged.table.column("input_ids").to_pylist() == want
    assert staged.table.column("num_tokens").to_pylist() == [len(w) for w in want]
    assert staged.table.column("id").to_pylist() == list(range(64))
    assert staged.table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert staged.origin.tolist() == list(range(64)) and staged.part is None
    assert "text" not in staged.table.column_names


def test_an_end_of_text_token_closes_every_document(tokenizer: Tokenizer) -> None:
    docs = ["the stream", "", "a shard of rows"]
    eos = tokenizer.token_to_id("[EOS]")
    got = Tokenize(tokenizer, eos_id=eos)(pa.table({"text": docs})).table
    want = [[*e.ids, eos] for e in tokenizer.encode_batch(docs, add_special_tokens=False)]
    assert got.column("input_ids").to_pylist() == want
    assert got.column("num_tokens").to_pylist() == [len(w) for w in want]


def test_a_transformers_tokenizer_from_a_local_directory(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    fast.save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    docs = texts(16, seed=2)
    got = Tokenize(loaded)(pa.table({"text": docs})).table.column("input_ids").to_pylist()
    assert got == loaded(docs, add_special_tokens=False)["input_ids"]


def test_any_callable_from_texts_to_ids() -> None:
    def by_chars(batch: list[str]) -> dict[str, list[list[int]]]:
        return {"input_ids": [[ord(c) for c in t] for t in batch]}

    got = Tokenize(by_chars)(pa.table({"text": ["ab", "c"]})).table
    assert got.column("input_ids").to_pylist() == [[97, 98], [99]]
    # numpy arrays per text (an empty one too), and a batch of no text
    arrays = Tokenize(lambda b: [np.frombuffer(t.encode(), np.uint8) for t in b], eos_id=0)
    got = arrays(pa.table({"text": ["ab", "", "c"]})).table
    assert got.column("input_ids").to_pylist() == [[97, 98, 0], [0], [99, 0]]
    assert got.column("num_tokens").to_pylist() == [3, 1, 2]
    none = arrays(pa.table({"text": pa.array([], pa.string())})).table
    assert none.num_rows == 0 and none.column("input_ids").type == pa.list_(pa.int32())


def test_bad_input_is_refused(tokenizer: Tokenizer) -> None:
    with pytest.raises(ConfigError, match=r"neither a tokenizers\.Tokenizer"):
        Tokenize(42)
    with pytest.raises(ConfigError, match=r"Tokenize\(column='body'\).*\['text'\]"):
        Tokenize(tokenizer, "body")(pa.table({"text": ["a"]}))
    with pytest.raises(ConfigError, match="null texts"):
        Tokenize(tokenizer)(pa.table({"text": ["a", None]}))


def test_a_stream_tokenizes_in_its_feed_and_resumes_exactly(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """JSONL documents through a Stream with Tokenize as its transform, stopped and resumed:
    every document's token ids arrive once, as the tokenizer gives them."""
    import json

    import ingest

    docs = texts(90, seed=3)
    for shard in range(3):
        lines = [json.dumps({"id": i, "text": docs[i]}) for i in range(shard * 30, shard * 30 + 30)]
        (tmp_path / f"{shard}.jsonl").write_text("\n".join(lines) + "\n")
    want = {i: e.ids for i, e in enumerate(tokenizer.encode_batch(docs, add_special_tokens=False))}

    def stream() -> ingest.Stream:
        return ingest.Stream(
            str(tmp_path),
            batch_size=8,
            shuffle_seed=1,
            remainder="drop",
            transform=Tokenize(tokenizer, keep=["id"]),
        )

    got: dict[int, list[int]] = {}
    first = stream()
    for n, batch in enumerate(first):
        for i, ids in zip(batch["id"].tolist(), batch["input_ids"], strict=True):
            assert i not in got
            got[i] = ids.tolist()
        if n == 4:
            break
    state = first.state_dict()
    second = stream()
    second.load_state_dict(state)
    for batch in second:
        for i, ids in zip(batch["id"].tolist(), batch["input_ids"], strict=True):
            assert i not in got
            got[i] = ids.tolist()
    assert len(got) == 88  # 11 batches of 8; the 2 rows left over are dropped
    assert all(got[i] == want[i] for i in got)


class _Counting:
    """A batch encoder that records how many of its calls run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.02)
        with self.lock:
            self.running -= 1
        return [SimpleNamespace(ids=[len(t)] * len(t)) for t in texts]


def test_batches_tokenized_at_once_encode_one_at_a_time_and_keep_their_rows() -> None:
    """Tokenize runs on two batches at once in a feed (parallel_batches), but their
    encodings run one at a time: a Rust encoding already takes every core."""
    encoder = _Counting()
    stage = Tokenize(encoder)
    assert stage.parallel_batches == 2
    tables = [pa.table({"text": [f"{'x' * (n % 5)}" for n in range(b, b + 8)]}) for b in range(6)]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(stage, tables))
    assert encoder.most == 1
    for table, out in zip(tables, got, strict=True):
        lengths = [len(t) for t in table.column("text").to_pylist()]
        assert out.table.column("input_ids").to_pylist() == [[n] * n for n in lengths]
    with pytest.raises(ConfigError, match="parallel_batches"):
        Tokenize(encoder, parallel_batches=0)
