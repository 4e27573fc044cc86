"""Pretrain a small causal LM on raw-text JSONL corpora, tokenized and packed on the fly.

    python train/pretrain.py [--config PATH] [KEY=VALUE ...]
    ray job submit --working-dir . -- python train/pretrain.py [KEY=VALUE ...]

The config is train/configs/pretrain.yaml unless --config names another. The readers of an
``ingest.RayStream`` read the corpora (``{"text": ...}`` per line) and tokenize them (a
``tokenizers`` BPE trained here on the corpora, or ``tokenizer.path``: a tokenizers JSON file
or a ``transformers`` tokenizer directory); each training worker packs its documents into
sequences of ``pack.seq_len`` (best-fit, ``ingest.Pack``) under Ray Train's TorchTrainer.

The corpora are a weighted mixture (``ingest.Mix``, ``data.weights``, in tokens): every
sequence is drawn from one corpus, each corpus within one sequence of its weight at every
step on every rank, and each corpus has its own epochs (the smaller one against its weight
repeats, in a new order each time); an epoch of the mixture ends once each corpus ended one.

The token witness: one counter per token of the corpora, summed over the workers at every
step from the batches' ``pieces`` (``Pack(provenance=True)``) and ``source``, and
checkpointed with the model, so it survives restarts as the model does. At the end every
token must have been trained on once per epoch of its corpus: the epochs it finished, and
what the last state says of the one in progress (its rows consumed, the tokens of rows cut,
the rows carried into it). The job prints that check, each corpus's share of the tokens
trained on against its weight, and the largest deviation from the weights at any step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import torch
from harness import Config, Fault, init_ray, parse_args, reader_pool
from torch import nn

import ingest
import ingest.train
from ingest.core.state import SourcesState, StreamState

CONFIG = Path(__file__).parent / "configs" / "pretrain.yaml"
EOS = "<eos>"


class CausalLM(nn.Module):
    """Embedding, one causal Transformer layer, a tied output projection; positions restart
    at every document (``position_ids``)."""

    def __init__(self, vocab: int, dim: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.block = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.norm = nn.LayerNorm(dim)
        self.mask: torch.Tensor
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.embed(ids) + self.pos(positions)
        x = self.block(x, src_mask=self.mask[:n, :n], is_causal=True)
        logits: torch.Tensor = self.norm(x) @ self.embed.weight.T
        return logits


def loss_of(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Next-token loss; ``labels`` are -100 on each document's first token and on padding,
    so no target crosses a document boundary."""
    ids, labels = batch["input_ids"].long(), batch["labels"].long()
    logits = model(ids, batch["position_ids"].long())
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


# -- the corpora, the tokenizer and the witness's map of tokens ----------------------------

WORDS = (  # noqa: SIM905 - one line of prose words reads better than a column
    "the of and to in a is that for it as was with be by on not he this are or his data model "
    "train stream shard token epoch rank step state resume exactly once"
).split()


def write_corpora(config: Config) -> None:
    """Write synthetic corpora where ``data.corpora`` has none: prose and code-like lines,
    documents of lognormal length (some far longer than ``pack.seq_len`` tokens)."""
    data = config["data"]
    gen = data.get("generate") or {}
    options = data.get("storage_options") or {}
    rng = np.random.default_rng(int(gen.get("seed", 0)))
    for name, url in data["corpora"].items():
        fs, root = fsspec.core.url_to_fs(url, **options)
        if fs.exists(root) and fs.glob(f"{root.rstrip('/')}/*.jsonl"):
            continue
        docs = int(gen.get(name, 0))
        if not docs:
            raise SystemExit(f"corpus {name!r} at {url} has no *.jsonl and none is generated")
        fs.makedirs(root, exist_ok=True)
        lines = []
        for _ in range(docs):
            words = max(1, int(rng.lognormal(np.log(40), 0.9)))
            if name == "code":
                text = "\n".join(
                    f"def f{rng.integers(100)}(x): return x * {rng.integers(9)} + {rng.integers(9)}"
                    for _ in range(max(1, words // 8))
                )
            else:
                text = " ".join(WORDS[i] for i in rng.integers(len(WORDS), size=words)) + "."
            lines.append(json.dumps({"text": text}))
        per = -(-len(lines) // int(gen.get("shards", 8)))
        for n in range(0, len(lines), per):
            with fs.open(f"{root.rstrip('/')}/part-{n // per:03d}.jsonl", "w") as f:
                f.write("\n".join(lines[n : n + per]) + "\n")


def sources(config: Config) -> dict[str, str]:
    return {name: f"{url.rstrip('/')}/*.jsonl" for name, url in config["data"]["corpora"].items()}


def tokenizer_of(config: Config, texts: list[str]) -> Any:
    """``tokenizer.path`` (a tokenizers JSON file, or a transformers tokenizer directory),
    or a byte-level BPE trained on ``texts`` (nothing is downloaded) and kept with the run,
    so that a rerun of the run (another worker count) tokenizes as the first did."""
    path = config["tokenizer"].get("path")
    if path and os.path.isdir(path):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    run = config["run"]
    kept = Path(run["storage_path"], run["name"], "tokenizer.json")
    path = path or (str(kept) if kept.exists() else "")
    if path:
        return Tokenizer.from_file(path)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    vocab = int(config["tokenizer"].get("vocab", 512))
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<unk>", EOS])
    tok.train_from_iterator(texts, trainer)
    kept.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(kept))
    return tok


def corpus(config: Config) -> tuple[list[str], list[list[str]]]:
    """The shard URLs, corpus after corpus, each in listing order; and each shard's texts."""
    data = config["data"]
    options = data.get("storage_options")
    urls = [
        s.url
        for pattern in sources(config).values()
        for s in ingest.list_shards(pattern, storage_options=options).shards
    ]
    texts = []
    for url in urls:
        with fsspec.open(url, "r", **(data.get("storage_options") or {})) as f:
            texts.append([json.loads(line)["text"] for line in f if line.strip()])
    return urls, texts


# -- the training loop ---------------------------------------------------------------------


def train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cfg: Config = config["config"]
    it, checkpoint = ingest.train.rank_iterator(config["stream"])
    maps = {
        key: torch.tensor(config[key], dtype=torch.float64 if key == "weights" else torch.int64)
        for key in ("base", "shard_base", "first_shard", "weights")
    }
    weights = maps["weights"]
    m, pack = cfg["model"], cfg["pack"]
    model = CausalLM(int(config["vocab"]), int(m["dim"]), int(m["heads"]), int(pack["seq_len"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg["train"]["lr"]))
    seen = torch.zeros(int(config["tokens"]), dtype=torch.int32)
    # Per corpus: sequences drawn on each rank (the same on all), real tokens on all ranks;
    # and the largest deviation from the weights at any step (sequences, real tokens).
    mix = {
        "drawn": torch.zeros(len(weights), dtype=torch.int64),
        "real": torch.zeros(len(weights), dtype=torch.int64),
        "worst": torch.zeros(2, dtype=torch.float64),
    }
    if checkpoint:
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "model.pt"))
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        seen, mix = saved["seen"], saved["mix"]
    ddp = DistributedDataParallel(model) if dist.get_world_size() > 1 else model
    rank = ray.train.get_context().get_world_rank()
    fault = Fault.from_config("pretrain", cfg)
    every = int(cfg["train"]["checkpoint_every"])

    def save(directory: str) -> None:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "seen": seen,
            "mix": mix,
        }
        torch.save(state, os.path.join(directory, "model.pt"))

    loss = torch.zeros(())
    while it.upcoming_epoch() < int(cfg["train"]["epochs"]):
        epoch, start, tokens = it.upcoming_epoch(), time.perf_counter(), 0
        for batch in it:
            loss = loss_of(ddp, batch)
            optimizer.zero_grad()
            torch.autograd.backward(loss)
            optimizer.step()
            tokens += count(batch, maps, seen, mix)
            fault.maybe_exit(rank, it.step)
            if it.step % every == every - 1:
                ingest.train.report(it, {"loss": loss.item(), "epoch": epoch}, save=save)
        if rank == 0:
            took = time.perf_counter() - start
            print(
                f"[pretrain] epoch {epoch}: loss {loss.item():.3f}, {tokens / took:,.0f} "
                "tokens/s on rank 0",
                flush=True,
            )
    ingest.train.report(it, {"loss": loss.item(), "done": True}, save=save)


def count(
    batch: dict[str, Any],
    maps: dict[str, torch.Tensor],
    seen: torch.Tensor,
    mix: dict[str, torch.Tensor],
) -> int:
    """Count the batch's tokens, every rank's, in the witness ``seen`` and the mixture's
    figures ``mix``; returns this rank's tokens. ``maps``: the first token of each document
    (``base``, by ``shard_base`` of each shard, by ``first_shard`` of each corpus), and the
    corpora's weights."""
    import torch.distributed as dist

    weights = maps["weights"]
    seq, shard, row, first, stop = batch["pieces"].unbind(1)
    source = batch["source"][seq]
    where = maps["base"][maps["shard_base"][maps["first_shard"][source] + shard] + row] + first
    lengths = stop - first
    index = torch.repeat_interleave(where - torch.cumsum(lengths, 0) + lengths, lengths)
    index += torch.arange(int(lengths.sum()))
    delta = torch.zeros(len(seen), dtype=torch.int32)
    delta.index_add_(0, index, torch.ones(len(index), dtype=torch.int32))
    real = torch.zeros(len(weights), dtype=torch.int64).index_add_(0, source, lengths)
    dist.all_reduce(delta)
    dist.all_reduce(real)
    seen += delta
    mix["drawn"] += torch.bincount(batch["source"], minlength=len(weights))
    mix["real"] += real
    for n, counts in enumerate((mix["drawn"], mix["real"])):
        off = (counts - weights * counts.sum()).abs().max()
        mix["worst"][n] = max(float(mix["worst"][n]), float(off))
    return int(lengths.sum())


def run(config: Config) -> dict[str, Any]:
    """Train; returns the final checkpoint's witness and stream state, and the corpus map."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer

    write_corpora(config)
    urls, texts = corpus(config)
    run_cfg, train_cfg, pack = config["run"], config["train"], config["pack"]
    tokenizer = tokenizer_of(config, [t for shard in texts for t in shard])
    eos = tokenizer.token_to_id(EOS) if hasattr(tokenizer, "token_to_id") else None
    tokenize = ingest.Tokenize(tokenizer, eos_id=eos)
    # Every document's tokens, as the readers will make them: the witness's map.
    lengths = [[len(ids) + (eos is not None) for ids in tokenize.encode(shard)] for shard in texts]
    flat = [n for shard in lengths for n in shard]
    base = np.concatenate([[0], np.cumsum(flat)[:-1]]).astype(np.int64).tolist()
    shard_base = np.concatenate([[0], np.cumsum([len(s) for s in lengths])[:-1]]).tolist()
    data = config["data"]
    names = list(sources(config))
    weights = {name: float(w) for name, w in (data.get("weights") or {}).items()}
    mix = ingest.Mix(sources(config), weights=weights or None)
    total = sum(weights.values()) if weights else len(names)
    options = data.get("storage_options")
    counts = [
        len(ingest.list_shards(p, storage_options=options).shards) for p in mix.sources.values()
    ]
    first_shard = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    init_ray(config)
    with ingest.RayStream(
        mix,
        batch_size=int(train_cfg["batch_size"]),
        shuffle_seed=train_cfg.get("seed", 0),
        shuffle_window=int(train_cfg.get("shuffle_window", 16_384)),
        world_size=int(train_cfg["workers"]),
        storage_options=data.get("storage_options"),
        readers=reader_pool(config),
        transform=tokenize,
        pack=ingest.Pack(
            seq_len=int(pack["seq_len"]),
            read_rows=int(pack["read_rows"]),
            max_open=int(pack.get("max_open", 64)),
            provenance=True,
        ),
    ) as stream:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={
                "config": config,
                "stream": stream,
                "base": base,
                "shard_base": shard_base,
                "first_shard": first_shard,
                "weights": [weights.get(n, 1.0) / total for n in names],
                "tokens": int(sum(flat)),
                "vocab": tokenizer.get_vocab_size()
                if hasattr(tokenizer, "get_vocab_size")
                else len(tokenizer),
            },
            scaling_config=ScalingConfig(num_workers=int(train_cfg["workers"])),
            run_config=RunConfig(
                name=run_cfg["name"],
                storage_path=run_cfg["storage_path"],
                failure_config=FailureConfig(max_failures=int(run_cfg.get("max_failures", 0))),
            ),
        )
        try:
            result = trainer.fit()
        except TrainingFailedError as e:
            raise SystemExit(
                f"[pretrain] the run failed ({type(e).__name__}); run it again (any "
                "train.workers) to go on from its last checkpoint"
            ) from None
    if result.checkpoint is None:
        raise SystemExit("[pretrain] the run finished without a checkpoint")
    with result.checkpoint.as_directory() as d:
        saved = torch.load(os.path.join(d, "model.pt"))
        state = json.loads(Path(d, ingest.train.STATE_FILE).read_text())
    return {
        "seen": saved["seen"],
        "mix": saved["mix"],
        "first_shard": first_shard,
        "state": state,
        "urls": urls,
        "lengths": lengths,
        "base": base,
        "shard_base": shard_base,
    }


def check(config: Config, found: dict[str, Any]) -> bool:
    """Print the token-level exactly-once check, each corpus's share against its weight and
    the largest deviation at any step; True if exact."""
    seen, state = found["seen"], found["state"]
    names = list(sources(config))
    expected = torch.zeros_like(seen)
    own: dict[str, int] = {}
    epochs: dict[str, int] = {}
    dropped = 0
    mixed = SourcesState.from_json(state)  # each source's state, and the mix part's counts
    for k, name in enumerate(names):
        part = mixed.parts[name]
        shards = range(found["first_shard"][k], found["first_shard"][k] + len(part.shards))
        own[name], epochs[name] = _expect(part, found, shards, expected), part.progress.epoch
        dropped += part.progress.dropped
    lost = int((seen < expected).sum())
    repeated = int((seen > expected).sum())
    print(
        f"[pretrain] token-level exactly once: {len(seen):,} tokens of the corpora, each "
        "trained on once per epoch of its corpus (and the epoch in progress as its state "
        f"says): {lost} lost, {repeated} repeated, {dropped} carried rows dropped -> "
        f"{'OK' if lost == repeated == dropped == 0 else 'FAILED'}"
    )
    weights = config["data"].get("weights") or dict.fromkeys(names, 1.0)
    total_w = sum(float(weights[n]) for n in names)
    trained = int(seen.sum())
    mix = found["mix"]
    for name in names:
        print(
            f"[pretrain] {name}: {own[name] / max(trained, 1):.1%} of the tokens trained on, "
            f"weight {float(weights[name]) / total_w:.1%}; {mixed.taken[name]:,} sequences "
            f"on each rank; epoch {epochs[name]} of its own in progress"
        )
    seq_len = int(config["pack"]["seq_len"])
    print(
        f"[pretrain] mixture: at every step within {float(mix['worst'][0]):.2f} sequences of "
        f"the weights on each rank (the bound: 1), and within "
        f"{float(mix['worst'][1]):,.0f} real tokens ({float(mix['worst'][1]) / seq_len:.1f} "
        "sequences' worth: padding counts as its corpus's) on all ranks together"
    )
    return lost == repeated == dropped == 0


def _expect(part: StreamState, found: dict[str, Any], shards: range, expected: torch.Tensor) -> int:
    """Add to ``expected`` the times each token of one corpus (its flat ``shards``) was due:
    once per epoch it finished, less its rows carried into the epoch in progress (not yet
    handed out), plus what that epoch consumed (whole rows; cut rows up to their offsets).
    Returns the corpus's tokens trained on, by the witness."""
    lengths, base, shard_first = found["lengths"], found["base"], found["shard_base"]
    by_url = {found["urls"][n]: n for n in shards}
    cut = {(seg, s, r): o for seg, s, r, o in part.progress.tokens}
    trained = 0
    for shard, info in enumerate(part.shards):
        n = by_url[info.url]
        first = base[shard_first[n]]
        size = sum(lengths[n])
        expected[first : first + size] += part.progress.epoch
        trained += int(found["seen"][first : first + size].sum())
        for row, length in enumerate(lengths[n]):
            at = base[shard_first[n] + row]
            for segment in (0, 1):
                if part.consumed_whole(segment, shard, row):
                    expected[at : at + length] += 1
                elif (segment, shard, row) in cut:
                    expected[at : at + cut[segment, shard, row]] += 1
    for shard, start, stop in part.distributed.carry:  # due in the epoch before
        n = by_url[part.shards[shard].url]
        for row in range(start, stop):
            at = base[shard_first[n] + row]
            expected[at : at + lengths[n][row]] -= 1
    for shard, row, offset in part.distributed.owed:  # due before, but for [0, offset)
        n = by_url[part.shards[shard].url]
        at = base[shard_first[n] + row]
        expected[at + offset : at + lengths[n][row]] -= 1
    return trained


def main(argv: list[str] | None = None) -> int:
    config = parse_args(CONFIG, argv, description=__doc__)
    return 0 if check(config, run(config)) else 1


if __name__ == "__main__":
    sys.exit(main())
