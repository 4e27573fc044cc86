"""Tokenize-and-pack against the tokenizer's own batch encoding, same texts, same process.

It measures the per-token cost of everything beside the tokenizer: the tokenizer's own
batch encoding (``encode_batch_fast``, its ids as lists) against ``ingest.Tokenize`` alone,
then with packing, then the whole ``ingest.Stream(transform=Tokenize, pack=Pack)`` (reading,
JSON decoding, tokenizing, packing, collating, torch tensors). The figure that issue 32's
goal names is the last line: the Stream's tokens per CPU second over the tokenizer's
(goal: >= 0.9x), for each tokenizer.

A tokenizer is trained here (nothing is downloaded), on generated text, or loaded from a
local path. ``--tokenizer`` (several, comma-separated, run in turn; default
``toy,byte-level``):

- ``byte-level``: a GPT-2-style byte-level BPE (ByteLevel pre-tokenizer, a
  16,000-token vocabulary) over documents of words drawn from 50,000 generated words by a
  Zipf law (1.22 tokens per word, near the 1.3 GPT-2's tokenizer gives on English prose);
- ``toy``: a BPE of 400 tokens with a whitespace pre-tokenizer over documents drawn from 150
  words. Its encoding is about 3 times cheaper per token (every word hits the BPE's word
  cache): the worst case for the ratio, as everything beside the encoding weighs more;
- a path: ``tokenizer.json``, or a ``transformers`` tokenizer's folder (its fast tokenizer),
  over the Zipf documents.

Document lengths are lognormal (a median of 300 words). Loops over the same batches of
texts, in turn, ``--repeat`` times (medians):

- the tokenizer alone: ``Tokenizer.encode_batch_fast`` on each batch, its ids as lists
  (what ``Tokenize`` calls: every ratio is to it);
- ``Tokenizer.encode_batch``, which computes each token's offsets too: the call issue 32's
  goal names, which a loop of one's own over the tokenizer would make (1.6x the CPU of
  ``encode_batch_fast`` with the toy tokenizer, 1.25x with the byte-level one);
- ``ingest.engine.tokenize.Tokenize`` on each batch as an Arrow table (ids as ``list<int32>``);
- the same, then packed into ``--seq-len`` sequences (``ingest.core.packing``, best-fit) and
  collated into batches;
- the whole engine: an ``ingest.Stream`` over the corpus as JSONL shards on local disk (in
  the page cache), ``transform=Tokenize``, ``pack=Pack(seq_len)``, batches of 8 sequences as
  torch tensors (reading, decoding JSON, read-ahead, acks included); its tokenizing runs in
  the feed's thread, beside the loop. One Stream, made before the rounds, iterated for an
  epoch each round, as a training job iterates one Stream for all its epochs (its first
  epoch's listing and schema inference are not counted again every round);
- the same through one ``ingest.DataLoader`` with 2 worker processes (kept across epochs),
  which read and tokenize while the main process packs;
- with ``--ray``, the same through an ``ingest.RayStream``: ``--readers`` actors read and
  tokenize, one rank iterated in this process packs (a warm epoch of a stream made once;
  its epoch carries its last short batch on; the rank's own count of real tokens).

``--docs`` is a multiple of 2 x ``--batch`` (the read steps), so that no epoch carries a
remainder: every loop hands out every token once, and the loaders' token count is the
corpus's.

It also prints the Stream's packing efficiency (non-padding tokens / all tokens).

The DataLoader and the RayStream are measured apart, after the other loops: their processes
go on between epochs (the workers read the next epoch's first window as one ends; Ray's
processes poll), so taking turns with the others would count their CPU in the others' and
find their own batches made. Each runs ``--repeat`` epochs in a row after a warm-up, is
stopped, and the tokenizer alone runs ``--repeat`` times after it: their ratios are of
these medians.

Prints tokens/s, tokens per CPU second (every process of the loop: this one and its
threads, the tokenizer's included; a DataLoader's workers; a local Ray's processes, its
reader actors among them, which also count their idle polling) and each loop's ratios to
the tokenizer alone, the medians over rounds of its figure over the tokenizer's in the same
round, seconds apart: ``ratio`` of tokens/s (issue 19's goal: >= 0.8x), ``CPU ratio`` of
tokens per CPU second (issue 32's goal for the Stream: >= 0.9x; the tokenizer's CPU is the
same in both, so it shows what the rest costs per token, on a busy machine too).

    .venv/bin/python benchmarks/tokenize_pack.py [--tokenizer toy,byte-level|PATH]
        [--docs 4000] [--batch 1000] [--repeat 5] [--no-loader] [--ray [--readers 2]]
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import ingest
from ingest.core.packing import Packer, collate
from ingest.distributed.rank import RankIterator
from ingest.engine.tokenize import Tokenize

WORDS = [
    "stream", "shard", "row", "token", "epoch", "resume", "exactly", "once", "reader",
    "rank", "window", "shuffle", "batch", "mixture", "weight", "sequence", "document",
    "the", "a", "of", "and", "to", "in", "is", "that", "for", "on", "with", "as", "by",
]  # fmt: skip
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
"""By English frequency: the generated words' letters are drawn with weights 1/rank."""
STREAM = "Stream(Tokenize, Pack)"
ENCODE_BATCH = "encode_batch, offsets too"
GOAL = 0.9
"""Issue 32's goal: the Stream's tokens per CPU second over the tokenizer's alone."""


def lengths(docs: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Words per document: lognormal, a median of 300."""
    return np.maximum(1, rng.lognormal(np.log(300), 1.0, docs).astype(np.int64))


def toy_corpus(docs: int, seed: int) -> list[str]:
    """Documents of the 150 words of ``WORDS`` and their inflections, drawn uniformly."""
    rng = np.random.default_rng(seed)
    vocab = np.array(WORDS + [w + s for w in WORDS for s in ("s", "ed", "ing", "er")])
    return [" ".join(rng.choice(vocab, n)) for n in lengths(docs, rng)]


def zipf_corpus(docs: int, seed: int, words: int = 50_000) -> list[str]:
    """Documents of ``words`` generated words (2 to 10 letters), drawn by a Zipf law
    (exponent 1.05, as English word counts follow), each ending with a full stop."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, len(LETTERS) + 1)
    letters = rng.choice(list(LETTERS), (words, 10), p=weights / weights.sum())
    vocab = ["".join(row[:n]) for row, n in zip(letters, rng.integers(2, 11, words), strict=True)]
    zipf = 1 / np.arange(1, words + 1) ** 1.05
    counts = lengths(docs, rng)
    picks = rng.choice(words, int(counts.sum()), p=zipf / zipf.sum()).tolist()
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    return [" ".join([vocab[i] for i in picks[a:b]]) + "." for a, b in itertools.pairwise(bounds)]


def trained(texts: list[str], kind: str = "toy") -> Tokenizer:
    """A BPE trained on the first texts (2,000 for ``toy``, 3,000 for ``byte-level``; see
    the module docstring)."""
    if kind == "toy":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(
            texts[:2000], trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]", "[EOS]"])
        )
        return tok
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=16_000,
        special_tokens=["[EOS]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts[:3000], trainer)
    return tok


def loaded(path: str) -> Any:
    """A tokenizer from a local path: ``tokenizer.json``, or a transformers folder."""
    if Path(path).is_file():
        return Tokenizer.from_file(path)
    from transformers import AutoTokenizer  # an optional extra (ingest[hf])

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def cpu_seconds() -> float:
    """CPU seconds of this process and all its descendants: the live ones (a local Ray's
    raylet and workers, the reader actors among them) and the ones ended and waited for
    (a DataLoader's workers)."""
    me = psutil.Process()
    live = 0.0
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # ended meanwhile: counted below once waited for
            continue
        live += times.user + times.system
    ended = os.times()
    return time.process_time() + live + ended.children_user + ended.children_system


def rates(loop: Callable[[], int]) -> tuple[float, float]:
    """Tokens/s and tokens per CPU second (every process of the loop) of one call."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    tokens = loop()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return tokens / wall, tokens / cpu


def timed(
    loops: dict[str, Callable[[], int]], repeat: int
) -> dict[str, tuple[float, float, float, float]]:
    """Median tokens/s and tokens per CPU second (every process of the loop: this one, its
    DataLoader workers, the local Ray's processes) of each loop, the loops taking turns; and
    the medians of its ratios to the first loop's tokens/s and tokens per CPU second of the
    same round (this machine's speed drifts by a third over minutes: a ratio of rounds taken
    seconds apart holds)."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in loops}
    for _ in range(repeat):
        for name, loop in loops.items():
            runs[name].append(rates(loop))
    base = runs[next(iter(loops))]
    return {
        name: (
            statistics.median(r for r, _ in got),
            statistics.median(c for _, c in got),
            statistics.median(r / b for (r, _), (b, _) in zip(got, base, strict=True)),
            statistics.median(c / b for (_, c), (_, b) in zip(got, base, strict=True)),
        )
        for name, got in runs.items()
    }


class Loop:
    """An epoch per call (its tokens handed out), and how to stop what it keeps running."""

    def __init__(self, epoch: Callable[[], int], close: Callable[[], None]) -> None:
        self.epoch = epoch
        self.close = close

    def __call__(self) -> int:
        return self.epoch()


def timed_apart(
    loop: Loop, base: Callable[[], int], repeat: int
) -> tuple[float, float, float, float]:
    """:func:`timed`'s figures for a loader whose processes go on between its epochs (a
    DataLoader's workers read the next epoch's first window as one ends; a Ray's processes
    poll): ``repeat`` epochs of it in a row, then it is closed, then ``repeat`` runs of
    ``base``; its ratios are of the medians. Taking turns with the other loops, its workers
    read ahead while those ran: their CPU was counted in the others' and its epochs found
    their batches made (44 million tokens/s against 4.7 for the tokenizer alone)."""
    runs = [rates(loop) for _ in range(repeat)]
    loop.close()
    bases = [rates(base) for _ in range(repeat)]
    rate, per_cpu = (statistics.median(r[i] for r in runs) for i in (0, 1))
    base_rate, base_cpu = (statistics.median(r[i] for r in bases) for i in (0, 1))
    return rate, per_cpu, rate / base_rate, per_cpu / base_cpu


def write_jsonl(texts: list[str], shards: int = 8) -> Path:
    """``texts`` as JSONL shards of ``{"text": ...}`` in a new folder, removed when this
    process exits (each run left 13.5 MB or more behind in the temp folder)."""
    root = Path(tempfile.mkdtemp(prefix="tokenize_pack_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    per = -(-len(texts) // shards)
    for n in range(shards):
        lines = (json.dumps({"text": t}) for t in texts[n * per : (n + 1) * per])
        (root / f"part-{n}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def stream_loop(
    root: Path,
    stage: Tokenize,
    seq_len: int,
    read_rows: int,
    packed: dict[str, int],
    workers: int | None = None,
) -> Loop:
    """Each call an epoch of one packing Stream over ``root``'s shards, made once (``workers``:
    through one ``ingest.DataLoader`` with that many worker processes, kept across epochs);
    ``packed`` gets the epoch's token counts."""
    s = ingest.Stream(
        str(root / "*.jsonl"),
        batch_size=8,
        transform=stage,
        pack=ingest.Pack(seq_len=seq_len, read_rows=read_rows),
    )
    loader = None if workers is None else ingest.DataLoader(s, num_workers=workers)

    def loop() -> int:
        if loader is not None:  # every token of the corpus, once (no remainder: see main)
            for _ in loader:
                pass
            return packed["real"]
        real, padding = s.stats["tokens"], s.stats["padding_tokens"]
        for _ in s:
            pass
        real, padding = s.stats["tokens"] - real, s.stats["padding_tokens"] - padding
        packed.update(real=real, all=real + padding)
        return real

    return Loop(loop, loader.close if loader is not None else s.close)


def ray_loop(root: Path, stage: Tokenize, seq_len: int, read_rows: int, readers: int) -> Loop:
    """A warm epoch of a packing ``ingest.RayStream`` (1 rank, iterated here; ``readers``
    reader actors read and tokenize, this process packs); the tokens its batches hand out
    (the epoch's last short batch is carried into the next, so a few fewer than the corpus)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    stream = ingest.RayStream(
        str(root / "*.jsonl"),
        batch_size=8,
        transform=stage,
        pack=ingest.Pack(seq_len=seq_len, read_rows=read_rows),
        readers=ingest.ReaderPool(min_size=readers, max_size=readers, num_cpus=1),
    )
    it = stream.rank_iterator(0)
    assert isinstance(it, RankIterator)

    def loop() -> int:
        # The rank's own count of real tokens handed out (no provenance asked: the rank does
        # what a training rank does).
        before = it.counts.get("tokens", 0)
        for _ in it:
            pass
        return it.counts["tokens"] - before

    def close() -> None:  # its actors and the local Ray's processes stop taking CPU
        stream.shutdown()
        ray.shutdown()

    return Loop(loop, close)


def packer_loop(stage: Tokenize, tables: list[pa.Table], seq_len: int) -> Callable[[], int]:
    """Tokenize each table, pack its documents and collate the sequences closed, in order."""

    def loop() -> int:
        packer, tokens, key = Packer(seq_len), 0, 0
        for t in tables:
            ids = stage(t).table.column("input_ids").combine_chunks()
            flat, offsets = ids.values.to_numpy(), ids.offsets.to_numpy()
            done = []
            for i in range(len(ids)):
                done += packer.add(key, flat[offsets[i] : offsets[i + 1]])
                key += 1
            if done:
                tokens += collate(done, seq_len).real_tokens
        return tokens + collate(packer.flush(), seq_len).real_tokens

    return loop


def encoded(encode: Any, batches: list[list[str]], extra: int) -> Callable[[], int]:
    """The tokenizer alone: ``encode`` (a ``Tokenizer``'s batch call) on each batch, its ids
    as lists; the tokens, with ``extra`` more per document (Tokenize's end-of-text token)."""

    def loop() -> int:
        return sum(len(e.ids) + extra for b in batches for e in encode(b, add_special_tokens=False))

    return loop


def run(kind: str, args: argparse.Namespace) -> tuple[float, float]:
    """Every loop over ``kind``'s corpus and tokenizer; prints their figures, returns the
    Stream's tokens per CPU second over the tokenizer's (``encode_batch_fast``: the median of
    the rounds' ratios) and over ``encode_batch``'s (the ratio of the two medians)."""
    texts = (toy_corpus if kind == "toy" else zipf_corpus)(args.docs, 0)
    if kind in ("toy", "byte-level"):
        tok = trained(texts, kind)
        eos_id = tok.token_to_id("[EOS]")
    else:
        tok = loaded(kind)
        eos_id = getattr(tok, "eos_token_id", None)
    rust: Tokenizer = getattr(tok, "backend_tokenizer", tok)  # a transformers tokenizer's own
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    tables = [pa.table({"text": b}) for b in batches]
    stage = Tokenize(tok, eos_id=eos_id)
    extra = 0 if eos_id is None else 1  # Tokenize's end-of-text token per document

    alone = encoded(rust.encode_batch_fast, batches, extra)
    offsets_too = encoded(rust.encode_batch, batches, extra)

    def tokenize() -> int:
        return sum(int(pa.compute.sum(stage(t).table.column("num_tokens")).as_py()) for t in tables)

    packed: dict[str, int] = {}
    root = write_jsonl(texts)
    stream = stream_loop(root, stage, args.seq_len, args.batch, packed)

    loops: dict[str, Callable[[], int]] = {
        "tokenizer alone": alone,
        ENCODE_BATCH: offsets_too,
        "Tokenize stage": tokenize,
        "Tokenize + pack + collate": packer_loop(stage, tables, args.seq_len),
        STREAM: stream,
    }
    for loop in loops.values():
        loop()  # warm up
    total = tokenize()  # an epoch of tokenizing: once
    if packed["real"] != total:
        raise SystemExit(f"the Stream packed {packed['real']} tokens of {total}")
    words = sum(t.count(" ") + 1 for t in texts)
    print(
        f"\n{args.docs:,} documents ({total / args.docs:,.0f} tokens and "
        f"{total / words:.2f} tokens per word on average; tokenizer {kind}) "
        f"in batches of {args.batch}; median of {args.repeat}, in turn"
    )
    figures = timed(loops, args.repeat)
    # The loaders whose processes go on between epochs, each made, warmed up and measured
    # after the loops above, alone (timed_apart), then stopped.
    apart: dict[str, Callable[[], Loop]] = {}
    if not args.no_loader:
        apart["DataLoader, 2 workers"] = lambda: stream_loop(
            root, stage, args.seq_len, args.batch, packed, workers=2
        )
    if args.ray:
        name = f"RayStream, {args.readers} reader{'s' if args.readers > 1 else ''}"
        apart[name] = lambda: ray_loop(root, stage, args.seq_len, args.batch, args.readers)
    for name, make in apart.items():
        loop = make()
        loop()  # warm up: the workers' start, imports
        figures[name] = timed_apart(loop, alone, args.repeat)
    print(
        f"{'':<28}{'tokens/s':>14}{'tokens/CPU s':>16}{'ratio':>8}{'CPU ratio':>11}"
        "  (medians; ratios: per round)"
    )
    for name, (rate, per_cpu, ratio, cpu_ratio) in figures.items():
        print(f"{name:<28}{rate:>14,.0f}{per_cpu:>16,.0f}{ratio:>7.2f}x{cpu_ratio:>10.2f}x")
    efficiency = packed["real"] / packed["all"]
    print(f"Stream packing efficiency (non-padding / all tokens): {efficiency:.4f}")
    return figures[STREAM][3], figures[STREAM][3] / figures[ENCODE_BATCH][3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tokenizer",
        default="toy,byte-level",
        help="toy, byte-level, or a local tokenizer.json / transformers folder; several, "
        "comma-separated, run in turn (default: toy,byte-level)",
    )
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-loader", action="store_true", help="leave the DataLoader out")
    parser.add_argument("--ray", action="store_true", help="also an ingest.RayStream")
    parser.add_argument("--readers", type=int, default=2, help="its reader actors")
    args = parser.parse_args()
    if args.docs % (2 * args.batch):
        raise SystemExit("--docs must be a multiple of 2 x --batch: no epoch remainder")
    ratios = {kind: run(kind, args) for kind in args.tokenizer.split(",")}
    print(
        f"\n{STREAM} tokens per CPU second (issue 32's goal: >= {GOAL}x the tokenizer's), over"
        "\n  encode_batch_fast's (the call Tokenize makes: what the rest costs)"
        "\n  and encode_batch's (the call the issue names; offsets computed too):"
    )
    for kind, (fast, full) in ratios.items():
        verdicts = ["ok" if ratio >= GOAL else "BELOW THE GOAL" for ratio in (fast, full)]
        print(f"  {kind:<12}{fast:6.2f}x  {verdicts[0]:<16}{full:6.2f}x  {verdicts[1]}")


if __name__ == "__main__":
    main()
