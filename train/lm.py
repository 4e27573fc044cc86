"""A small causal language model over token shards (Parquet columns id and tokens).

    python train/lm.py [--config PATH] [KEY=VALUE ...]
    ray job submit --working-dir . -- python train/lm.py [KEY=VALUE ...]

The config is train/configs/lm.yaml unless --config names another. With data.generate
set and no shards at data.url, synthetic token shards are written there first (sequences of
a noisy affine recurrence, so the loss visibly falls).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from harness import Config, Job, main
from torch import nn

CONFIG = Path(__file__).parent / "configs" / "lm.yaml"
"""The default config."""


class TinyLM(nn.Module):
    """Embedding, one causal Transformer layer, and a tied output projection."""

    def __init__(self, vocab: int, dim: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.block = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.norm = nn.LayerNorm(dim)
        self.mask: torch.Tensor
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, n, vocab)`` for token ids ``(batch, n)``, causally masked."""
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:n]
        x = self.block(x, src_mask=self.mask[:n, :n], is_causal=True)
        logits: torch.Tensor = self.norm(x) @ self.embed.weight.T
        return logits


def build(config: Config) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A :class:`TinyLM` sized by ``model`` and ``data.generate``, with AdamW at ``train.lr``."""
    m, data = config["model"], config["data"]["generate"]
    model = TinyLM(int(data["vocab"]), int(m["dim"]), int(m["heads"]), int(data["seq_len"]))
    return model, torch.optim.AdamW(model.parameters(), lr=float(config["train"]["lr"]))


def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, Any]) -> torch.Tensor:
    """One next-token training step on ``batch["tokens"]``; returns the detached loss."""
    tokens = batch["tokens"].long()
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
    )
    optimizer.zero_grad()
    torch.autograd.backward(loss)
    optimizer.step()
    return loss.detach()


def write_token_shards(
    url: str,
    storage_options: dict[str, Any],
    shards: int,
    rows: int,
    seq_len: int,
    vocab: int,
    seed: int = 0,
) -> None:
    """Write synthetic token shards: ``id`` and ``tokens`` (seq_len + 1 int32 per row).

    Args:
        url: Directory URL to write ``tokens-NNNNN.parquet`` files to.
        storage_options: fsspec options for that URL's store.
        shards: Number of files.
        rows: Rows per file (ids run on across files).
        seq_len: Tokens per row, plus one for the shifted target.
        vocab: Token ids are in ``range(vocab)``.
        seed: Seed of the generator.
    """
    fs, root = fsspec.core.url_to_fs(url, **storage_options)
    fs.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for n in range(shards):
        ids = np.arange(n * rows, (n + 1) * rows, dtype=np.int64)
        seqs = np.empty((rows, seq_len + 1), dtype=np.int64)
        seqs[:, 0] = rng.integers(0, vocab, rows)
        for t in range(1, seq_len + 1):
            noise = rng.random(rows) < 0.1
            seqs[:, t] = np.where(
                noise, rng.integers(0, vocab, rows), (seqs[:, t - 1] * 7 + 3) % vocab
            )
        tokens = pa.FixedSizeListArray.from_arrays(
            pa.array(seqs.ravel().astype(np.int32)), seq_len + 1
        )
        with fs.open(f"{root.rstrip('/')}/tokens-{n:05d}.parquet", "wb") as f:
            pq.write_table(pa.table({"id": ids, "tokens": tokens}), f, row_group_size=rows // 4)


JOB = Job("lm", build, step, columns=["id", "tokens"])


def _generate(url: str, storage_options: dict[str, Any], gen: dict[str, Any]) -> None:
    write_token_shards(
        url,
        storage_options,
        int(gen["shards"]),
        int(gen["rows"]),
        int(gen["seq_len"]),
        int(gen["vocab"]),
    )


if __name__ == "__main__":
    sys.exit(main(JOB, CONFIG, "*.parquet", _generate, description=__doc__))
