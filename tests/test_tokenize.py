"""The tokenizing stage (ingest.engine.tokenize): the ids a tokenizer gives, from a
``tokenizers`` tokenizer trained here, a ``transformers`` one loaded from a local directory,
or a plain callable; one output row per input row; clear refusals."""

from __future__ import annotations

import os
import signal
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


def test_a_tokenizers_special_tokens_are_added_when_asked_and_said_when_not() -> None:
    """Found by a probe: a tokenizer whose post-processor puts a BOS before each document
    (Llama's, Mistral's) lost it without a word: Tokenize encodes without special tokens
    (documents are separated by ``eos_id`` when packed), which no doc said. It is said, and
    ``special_tokens=True`` encodes as the tokenizer does by default; the derived cache keys
    the two apart; a callable tokenizer, which adds what it adds, refuses it."""
    from tokenizers import processors

    tok = Tokenizer(models.WordLevel({"<s>": 0, "hello": 1, "world": 2}, unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    table = pa.table({"text": ["hello world", "world"]})
    assert Tokenize(tok)(table).table.column("input_ids").to_pylist() == [[1, 2], [2]]
    with_bos = Tokenize(tok, special_tokens=True, eos_id=2)(table).table
    assert with_bos.column("input_ids").to_pylist() == [[0, 1, 2, 2], [0, 2, 2]]
    assert Tokenize(tok).fingerprint() != Tokenize(tok, special_tokens=True).fingerprint()
    with pytest.raises(ConfigError, match="special_tokens"):
        Tokenize(lambda texts: [[1] for _ in texts], special_tokens=True)


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
    stage = Tokenize(encoder, parallel_batches=2)
    tables = [pa.table({"text": [f"{'x' * (n % 5)}" for n in range(b, b + 8)]}) for b in range(6)]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(stage, tables))
    assert encoder.most == 1
    for table, out in zip(tables, got, strict=True):
        lengths = [len(t) for t in table.column("text").to_pylist()]
        assert out.table.column("input_ids").to_pylist() == [[n] * n for n in lengths]
    with pytest.raises(ConfigError, match="parallel_batches"):
        Tokenize(encoder, parallel_batches=0)


@pytest.mark.parametrize(("cpus", "batches"), [(1, 1), (2, 1), (3, 2), (16, 2)])
def test_batches_tokenized_at_once_by_default_follow_the_cpus(
    monkeypatch: pytest.MonkeyPatch, cpus: int, batches: int
) -> None:
    """Two batches at once where the process has more than two CPUs; one on two or fewer,
    where the encoding takes both already and a second thread cost CPU for no time (issue
    32: 0.87x the tokenizer's tokens per CPU second with two, 0.90x with one)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert Tokenize(_Counting()).parallel_batches == batches
    assert Tokenize(_Counting(), parallel_batches=2).parallel_batches == 2
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS: the CPUs there are
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert Tokenize(_Counting()).parallel_batches == batches


# -- ids that do not fit, outputs that are not ids (issue 31, findings 5 and 11) -----------


BIG = 2**31 + 5


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (lambda t: [np.array([1, 2]), np.array([3, BIG], np.int64)], rf"id {BIG} is out of range"),
        (lambda t: [[1, 2], [3, BIG]], rf"id {BIG} is out of range"),
        (lambda t: [[1, 2], [3, 2**70]], r"id 1180591620717411303424 is out of range"),
        (lambda t: [np.array([1], np.uint64), np.array([2**63], np.uint64)], rf"id {2**63} is"),
        (lambda t: [[1, 2], [3, -4]], r"id -4 is out of range"),
        (lambda t: [np.array([1, 2]), np.array([-4])], r"id -4 is out of range"),
        (lambda t: [[1, 2], [3, 4.5]], r"id 4\.5 is not an integer"),
        (lambda t: [np.array([1, 2]), np.array([3.0, 4.5])], r"ids are float64"),
    ],
    ids=[
        "int64-array",
        "list",
        "list-past-int64",
        "uint64",
        "negative",
        "negative-array",
        "float",
        "float-array",
    ],
)
def test_ids_that_are_not_int32_token_ids_are_refused_naming_the_document(
    ids: Any, message: str
) -> None:
    """Ids past int32 wrapped to negative ones silently (-2147483643), or raised a bare
    OverflowError; float ids were truncated, negative ones passed."""
    with pytest.raises(ConfigError, match=rf"row 1 of the batch: the tokenizer's {message}.*"):
        Tokenize(ids)(pa.table({"text": ["ab", "cd"]}))


class _Lists:
    """A batch encoder like a Rust tokenizer's (``encode_batch_fast``, encodings with
    ``ids``), handing out the same id lists every call (they must come back unchanged)."""

    def __init__(self, ids: list[list[Any]]) -> None:
        self.ids = ids

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
        return [SimpleNamespace(ids=i) for i in self.ids[: len(texts)]]


@pytest.mark.parametrize("eos", [None, 9])
@pytest.mark.parametrize(
    ("bad", "message"),
    [(BIG, rf"id {BIG} is out of range"), (-4, r"id -4 is out of range")],
    ids=["past-int32", "negative"],
)
def test_a_batch_encoders_ids_out_of_range_are_refused_naming_the_document(
    bad: int, message: str, eos: int | None
) -> None:
    """The lists of a Rust tokenizer's encodings are joined with the end-of-text ids and
    converted to int32 at once: the id that does not fit still names its document."""
    stage = Tokenize(_Lists([[1, 2], [3], [4, bad, 5]]), eos_id=eos)
    with pytest.raises(ConfigError, match=rf"row 2 of the batch: the tokenizer's {message}"):
        stage(pa.table({"text": ["ab", "c", "def"]}))


@pytest.mark.parametrize("eos", [None, 9])
def test_a_batch_encoders_lists_come_back_unchanged_with_every_end_of_text(
    eos: int | None,
) -> None:
    ids = [[1, 2], [], [3, 4, 5]]
    got = Tokenize(_Lists(ids), eos_id=eos)(pa.table({"text": ["ab", "", "cde"]})).table
    end = [] if eos is None else [eos]
    assert got.column("input_ids").to_pylist() == [[1, 2, *end], end, [3, 4, 5, *end]]
    assert got.column("num_tokens").to_pylist() == [2 + len(end), len(end), 3 + len(end)]
    assert ids == [[1, 2], [], [3, 4, 5]]


def test_an_id_out_of_range_names_its_shard_and_row_through_a_stream(tmp_path: Path) -> None:
    import json

    import ingest

    lines = [json.dumps({"text": "ok"}) for _ in range(5)] + [json.dumps({"text": "BIG"})]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")

    def ids(texts: list[str]) -> list[np.ndarray]:
        return [np.array([BIG if t == "BIG" else 7], np.int64) for t in texts]

    stream = ingest.Stream(str(tmp_path), batch_size=6, transform=Tokenize(ids))
    with pytest.raises(ConfigError, match=rf"a\.jsonl row 5: the tokenizer's id {BIG} is out"):
        next(iter(stream))
    stream.close()


def test_a_null_text_names_its_shard_and_row_through_a_stream(tmp_path: Path) -> None:
    """A document whose text is null (or missing from its JSON line) was refused naming
    neither its shard nor its row, where every other error of a document names both."""
    import json

    import ingest

    lines = [json.dumps({"text": "ok"}) for _ in range(5)] + [json.dumps({"text": None})]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    stream = ingest.Stream(
        str(tmp_path), batch_size=6, transform=Tokenize(lambda t: [[7]] * len(t))
    )
    with pytest.raises(ConfigError, match=r"a\.jsonl row 5: column 'text' holds a null text"):
        next(iter(stream))
    stream.close()


@pytest.mark.parametrize("eos", [-7, 2**31, 1.0, True, "2"])
def test_an_eos_id_that_is_no_token_id_is_refused(eos: Any) -> None:
    with pytest.raises(ConfigError, match=rf"Tokenize\(eos_id={eos!r}\) must be a token id"):
        Tokenize(lambda t: [[1]] * len(t), eos_id=eos)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (lambda t: None, r"returned NoneType for 2 texts"),
        (lambda t: 7, r"returned int for 2 texts"),
        (lambda t: "ab", r"returned str for 2 texts"),
        (lambda t: [[1]], r"returned 1 id lists for 2 texts"),
        (lambda t: [[1], [2], [3]], r"returned 3 id lists for 2 texts"),
        (lambda t: [[1], 5], r"row 1 of the batch: tokenizer .* returned int \(5\)"),
        (lambda t: ["ab", "cd"], r"row 0 of the batch: tokenizer .* returned str \('ab'\)"),
        (lambda t: {"input_ids": None}, r"returned NoneType"),
        (lambda t: [np.zeros((2, 2), int)] * 2, r"row 0 of the batch: .*array of shape \(2, 2\)"),
    ],
    ids=["None", "int", "str", "too-few", "too-many", "int-in-list", "strings", "dict-None", "2d"],
)
def test_a_callable_that_returns_no_id_lists_is_refused(out: Any, message: str) -> None:
    """These raised TypeError, ArrowInvalid or ValueError from deep inside."""
    with pytest.raises(ConfigError, match=message):
        Tokenize(out)(pa.table({"text": ["ab", "cd"]}))


def test_a_tokenizers_tokenizer_refuses_a_column_that_is_not_text(tokenizer: Tokenizer) -> None:
    """A TypeError from the Rust encoder before."""
    with pytest.raises(ConfigError, match=r"Tokenize\(column='text'\) is int64, not text"):
        Tokenize(tokenizer)(pa.table({"text": [1, 2]}))
    got = Tokenize(tokenizer)(pa.table({"text": pa.array(["the a"], pa.large_string())}))
    assert got.table.column("num_tokens").to_pylist() == [2]


def test_a_stages_refusal_of_a_batch_names_the_shards_it_was_read_from(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """Found by a probe: an error a stage raises of a whole batch (a column that is not
    text, a callable's wrong count of id lists) named no shard, so a user of many shards or
    sources could not tell which holds the bad column. A note names them."""
    import ingest

    (tmp_path / "a.jsonl").write_text('{"text": "the a"}\n' * 3)
    (tmp_path / "b.jsonl").write_text('{"text": 7}\n' * 3)
    s = ingest.Stream(str(tmp_path / "b.jsonl"), batch_size=3, transform=Tokenize(tokenizer))
    with pytest.raises(ConfigError, match="not text") as err:
        next(iter(s))
    notes = " ".join(getattr(err.value, "__notes__", []))
    assert f"file://{tmp_path}/b.jsonl" in notes, notes


# -- a fork while an encoding runs; close() ends the encodings (issue 31, finding 3) -------


class _Blocking:
    """A batch encoder whose calls in the process that made it wait for ``release``."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.started = threading.Event()
        self.release = threading.Event()

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
        if os.getpid() == self.pid:
            self.started.set()
            self.release.wait(60)
        return [SimpleNamespace(ids=[len(t)]) for t in texts]


def test_a_process_forked_while_an_encoding_holds_the_lock_encodes() -> None:
    """The encoding lock is the process's: a child forked while a thread held it (a
    DataLoader forking its workers while a closed stream's encoding ran) inherited it held,
    by no thread of its own, and its first encoding waited for ever."""
    blocking = _Blocking()
    table = pa.table({"text": ["ab", "c"]})
    holder = threading.Thread(target=Tokenize(blocking), args=(table,), daemon=True)
    holder.start()
    try:
        assert blocking.started.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: encode with the lock as forked
            code = 1
            try:
                got = Tokenize(blocking)(table).table.column("input_ids").to_pylist()
                code = 0 if got == [[2], [1]] else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's encoding waited 20 s on the lock it inherited held")
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        blocking.release.set()
        holder.join(10)


class _Slow:
    """A batch encoder taking ``seconds`` a call, counting the calls running."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = 0
        self.calls = 0

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
        self.running += 1
        self.calls += 1
        time.sleep(self.seconds)
        self.running -= 1
        return [SimpleNamespace(ids=[len(t)]) for t in texts]


def test_closing_a_stream_ends_its_encodings_and_their_threads(tmp_path: Path) -> None:
    """close() left the batch being encoded (and the next one's) running in the pool's
    threads after it returned: the encoding held the process's lock across whatever came
    next (a fork)."""
    import json

    import ingest

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": "ab"}) + "\n" for _ in range(40)))
    slow = _Slow(0.5)
    before = set(threading.enumerate())  # other tests' streams may still hold theirs
    stream = ingest.Stream(str(tmp_path), batch_size=4, transform=Tokenize(slow))
    assert next(iter(stream))["input_ids"][0].tolist() == [2]
    began = time.monotonic()
    stream.close()
    assert time.monotonic() - began < 10 + 1  # bounded: in_order's END_S
    assert slow.running == 0, "an encoding still ran after close()"
    alive = [
        t.name for t in set(threading.enumerate()) - before if t.name.startswith("ingest-transform")
    ]
    assert not alive, f"close() left threads running: {alive}"


def test_a_dataloader_after_a_closed_stream_whose_encoding_ran(tmp_path: Path) -> None:
    """The issue's reproduction: the first batch of a stream whose later batches take long to
    encode, close(), then a DataLoader forking a worker over a new stream: its first batch
    comes (it waited for StreamTimeoutError)."""
    import json

    import ingest

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": "ab"}) + "\n" for _ in range(40)))
    first = ingest.Stream(str(tmp_path), batch_size=4, transform=Tokenize(_Slow(0.5)))
    next(iter(first))
    first.close()
    second = ingest.Stream(
        str(tmp_path),
        batch_size=4,
        transform=Tokenize(_Slow(0.0)),
        read=ingest.ReadOptions(timeout_s=20),
    )
    loader = ingest.DataLoader(second, num_workers=1)
    try:
        assert next(iter(loader))["input_ids"][0].tolist() == [2]
    finally:
        loader.close() if hasattr(loader, "close") else None


def test_a_refused_output_is_raised_at_once_not_after_the_wait_for_encodings(
    tmp_path: Path,
) -> None:
    """Closing in_order waited for every call not done, and a call cancelled before it
    started is never done to futures.wait: an error came after the whole 10 s."""
    import json

    import ingest

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": "ab"}) + "\n" for _ in range(6)))
    stream = ingest.Stream(str(tmp_path), batch_size=6, transform=Tokenize(lambda t: None))
    began = time.monotonic()
    with pytest.raises(ConfigError, match="returned NoneType"):
        next(iter(stream))
    stream.close()
    assert time.monotonic() - began < 5
