"""Pretrain a small causal LM on raw-text JSONL corpora, tokenized and packed on the fly.

    python train/pretrain.py [--config PATH] [KEY=VALUE ...]
    ray job submit --working-dir . -- python train/pretrain.py [KEY=VALUE ...]

The config is train/configs/pretrain.yaml unless --config names another. The readers of an
``ingest.RayStream`` read the corpora (``{"text": ...}`` per line) and tokenize them (a
``tokenizers`` BPE trained here on the corpora, or ``tokenizer.path``: a tokenizers JSON file
or a ``transformers`` tokenizer directory); each training worker packs its documents into
sequences of ``pack.seq_len`` (best-fit, ``ingest.Pack``) under Ray Train's TorchTrainer.

The token witness: one counter per token of the corpora, summed over the workers at every
step from the batches' ``pieces`` (``Pack(provenance=True)``) and checkpointed with the
model, so it survives restarts as the model does. At the end every token must have been
trained on once per epoch, but the ones the last epoch carried into the next (once less).
The job prints that check and each corpus's share of the tokens trained on.

The corpora are read as one source (their shards side by side), so each one's share is its
share of the tokens; weighted mixtures are not wired into the streams yet.
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
from torch import nn

import ingest
import ingest.train
from ingest.core.state import StreamState
from ingest.integrations.jobs import Config, _Fault, _init_ray, _reader_pool, parse_args

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


def sources(config: Config) -> list[str]:
    return [f"{url.rstrip('/')}/*.jsonl" for url in config["data"]["corpora"].values()]


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
    """The shard URLs in listing order, and each shard's texts."""
    data = config["data"]
    listing = ingest.list_shards(sources(config), storage_options=data.get("storage_options"))
    urls = [s.url for s in listing.shards]
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
    base = torch.tensor(config["base"], dtype=torch.int64)  # first token of (shard, row)
    shard_base = torch.tensor(config["shard_base"], dtype=torch.int64)
    m, pack = cfg["model"], cfg["pack"]
    model = CausalLM(int(config["vocab"]), int(m["dim"]), int(m["heads"]), int(pack["seq_len"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg["train"]["lr"]))
    seen = torch.zeros(int(config["tokens"]), dtype=torch.int32)
    if checkpoint:
        with checkpoint.as_directory() as directory:
            saved = torch.load(os.path.join(directory, "model.pt"))
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        seen = saved["seen"]
    ddp = DistributedDataParallel(model) if dist.get_world_size() > 1 else model
    rank = ray.train.get_context().get_world_rank()
    fault = _Fault.from_config("pretrain", cfg)
    every = int(cfg["train"]["checkpoint_every"])

    def save(directory: str) -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "seen": seen}
        torch.save(state, os.path.join(directory, "model.pt"))

    loss = torch.zeros(())
    while it.upcoming_epoch() < int(cfg["train"]["epochs"]):
        epoch, start, tokens = it.upcoming_epoch(), time.perf_counter(), 0
        for batch in it:
            loss = loss_of(ddp, batch)
            optimizer.zero_grad()
            torch.autograd.backward(loss)
            optimizer.step()
            _, shard, row, first, stop = batch["pieces"].unbind(1)
            where = base[shard_base[shard] + row] + first
            lengths = stop - first
            index = torch.repeat_interleave(where - torch.cumsum(lengths, 0) + lengths, lengths)
            index += torch.arange(int(lengths.sum()))
            delta = torch.zeros(len(seen), dtype=torch.int32)
            delta.index_add_(0, index, torch.ones(len(index), dtype=torch.int32))
            dist.all_reduce(delta)
            seen += delta
            tokens += int(lengths.sum())
            fault.maybe_exit(rank, it.step)
            if it.step % every == every - 1:
                ingest.train.report(it, {"loss": float(loss), "epoch": epoch}, save=save)
        if rank == 0:
            took = time.perf_counter() - start
            print(
                f"[pretrain] epoch {epoch}: loss {float(loss):.3f}, {tokens / took:,.0f} "
                "tokens/s on rank 0",
                flush=True,
            )
    ingest.train.report(it, {"loss": float(loss), "done": True}, save=save)


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
    _init_ray(config)
    data = config["data"]
    with ingest.RayStream(
        sources(config),
        batch_size=int(train_cfg["batch_size"]),
        shuffle_seed=train_cfg.get("seed", 0),
        shuffle_window=int(train_cfg.get("shuffle_window", 16_384)),
        world_size=int(train_cfg["workers"]),
        storage_options=data.get("storage_options"),
        readers=_reader_pool(config),
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
        seen = torch.load(os.path.join(d, "model.pt"))["seen"]
        state = json.loads(Path(d, ingest.train.STATE_FILE).read_text())
    return {
        "seen": seen,
        "state": state,
        "urls": urls,
        "lengths": lengths,
        "base": base,
        "shard_base": shard_base,
    }


def check(config: Config, found: dict[str, Any]) -> bool:
    """Print the token-level exactly-once check and each corpus's share; True if exact."""
    seen, state, urls = found["seen"], found["state"], found["urls"]
    lengths, base = found["lengths"], found["base"]
    epochs = int(config["train"]["epochs"])
    expected = torch.full_like(seen, epochs)
    parsed = StreamState.from_json(state)
    where = {url: n for n, url in enumerate(urls)}
    shard_first = found["shard_base"]  # the first document of each shard
    offsets = {(s, r): o for seg, s, r, o in parsed.progress.tokens if seg == 0}
    carried = 0
    for shard, start, stop in parsed.distributed.carry:
        n = where[parsed.shards[shard].url]
        for row in range(start, stop):
            first = base[shard_first[n] + row]
            skip = offsets.get((shard, row), 0)
            expected[first + skip : first + lengths[n][row]] -= 1
            carried += lengths[n][row] - skip
    lost = int((seen < expected).sum())
    repeated = int((seen > expected).sum())
    total = len(seen)
    dropped = parsed.progress.dropped
    print(
        f"[pretrain] token-level exactly once: {total:,} tokens of the corpora, each trained "
        f"on {epochs}x but the {carried:,} the last epoch carried into the next (once less); "
        f"{lost} lost, {repeated} repeated, {dropped} carried rows dropped -> "
        f"{'OK' if lost == repeated == dropped == 0 else 'FAILED'}"
    )
    trained = int(seen.sum())
    options = config["data"].get("storage_options")
    for name, pattern in zip(config["data"]["corpora"], sources(config), strict=True):
        mine = {s.url for s in ingest.list_shards(pattern, storage_options=options).shards}
        spans = [
            (base[shard_first[n]], sum(lengths[n])) for n, url in enumerate(urls) if url in mine
        ]
        got = sum(int(seen[a : a + n].sum()) for a, n in spans)
        own = sum(n for _, n in spans)
        print(
            f"[pretrain] {name}: {got / max(trained, 1):.1%} of the tokens trained on "
            f"({own / total:.1%} of the corpora's tokens)"
        )
    return lost == repeated == dropped == 0


def main(argv: list[str] | None = None) -> int:
    config = parse_args(CONFIG, argv, description=__doc__)
    return 0 if check(config, run(config)) else 1


if __name__ == "__main__":
    sys.exit(main())
