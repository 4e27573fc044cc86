"""The size of a packing Stream's state against ``seq_len`` (issue 19's goal).

A corpus of ``--docs`` documents whose token counts are lognormal (median ``--median``,
sigma 1.0), as JSONL shards on local disk; a function stands in for the tokenizer (a
document's text is its token count), so only lengths matter. For each ``seq_len``, one
shuffled epoch of a ``Stream(transform=Tokenize, pack=Pack(seq_len))`` with batches of
``--batch`` sequences takes its state every ``--every`` batches. Prints, per ``seq_len``:
the packing efficiency, and the states' JSON bytes and ``pack.tokens`` entries (the
documents of read steps not acked whole that reached a batch), median and largest, beside
the same stream's state without packing (the listing and consumed rows alone).

    .venv/bin/python benchmarks/pack_state.py [--docs 20000] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

import ingest


def write_corpus(docs: int, median: float, shards: int = 8) -> Path:
    root = Path(tempfile.mkdtemp(prefix="pack_state_"))
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(np.log(median), 1.0, docs).astype(int))
    per = -(-docs // shards)
    for n in range(shards):
        lines = (json.dumps({"text": str(k)}) for k in lengths[n * per : (n + 1) * per])
        (root / f"part-{n}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def tokenize(texts: list[str]) -> list[list[int]]:
    return [[1] * int(t) for t in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--median", type=float, default=400.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--read-rows", type=int, default=256)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    url = str(write_corpus(args.docs, args.median) / "*.jsonl")
    plain = ingest.Stream(url, batch_size=args.read_rows, shuffle_seed=0)
    sizes = []
    for n, _ in enumerate(plain):
        if n % 4 == 3:
            sizes.append(len(json.dumps(plain.state_dict())))
    print(
        f"{args.docs:,} documents (median {args.median:.0f} tokens); batches of {args.batch} "
        f"sequences, read steps of {args.read_rows}; state every {args.every} batches"
    )
    print(f"without packing: state {statistics.median(sizes):,.0f} bytes (median)")
    print(f"{'seq_len':>8}{'efficiency':>12}{'states':>8}{'bytes med':>11}{'bytes max':>11}"
          f"{'docs med':>10}{'docs max':>10}")  # fmt: skip
    for seq_len in (512, 2048, 8192):
        s = ingest.Stream(
            url,
            batch_size=args.batch,
            shuffle_seed=0,
            transform=ingest.Tokenize(tokenize),
            pack=ingest.Pack(seq_len=seq_len, read_rows=args.read_rows),
        )
        nbytes, entries = [], []
        for n, _ in enumerate(s):
            if n % args.every == args.every - 1:
                state = s.state_dict()
                nbytes.append(len(json.dumps(state)))
                entries.append(len(state.get("pack", {}).get("tokens", [])))
        stats = s.stats
        efficiency = stats["tokens"] / (stats["tokens"] + stats["padding_tokens"])
        print(
            f"{seq_len:>8}{efficiency:>12.4f}{len(nbytes):>8}{statistics.median(nbytes):>11,.0f}"
            f"{max(nbytes):>11,}{statistics.median(entries):>10,.0f}{max(entries):>10,}"
        )


if __name__ == "__main__":
    main()
