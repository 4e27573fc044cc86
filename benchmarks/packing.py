"""Packing efficiency of ingest.core.packing on a lognormal corpus (issue 19's goal).

Document lengths are lognormal (median about 400 tokens, ``--sigma`` 1.0: about 1 in 20
beyond 2,048, the longest tens of thousands). Prints, per method, the efficiency (tokens
that are not padding / all tokens), the sequences, the documents cut (a document whose
tokens land in more than one sequence) and the packing time. Only lengths matter here: the
tokens are zeros.

    .venv/bin/python benchmarks/packing.py [--docs 50000] [--seq-len 2048] [--sigma 1.0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ingest.core.packing import Packer


def run(
    lengths: np.ndarray, seq_len: int, method: str, max_open: int
) -> tuple[float, int, int, float]:
    """Efficiency, sequences, documents cut and seconds of one packing of ``lengths``."""
    zeros = np.zeros(int(lengths.max()), dtype=np.int64)
    packer = Packer(seq_len, method, max_open)  # type: ignore[arg-type]
    start = time.perf_counter()
    sequences = [s for key, n in enumerate(lengths) for s in packer.add(key, zeros[:n])]
    sequences += packer.flush()
    seconds = time.perf_counter() - start
    real = sum(s.size for s in sequences)
    if real != int(lengths.sum()):
        raise SystemExit(f"{method}: {real} tokens packed of {int(lengths.sum())}")
    cut = {p.key for s in sequences for p in s.pieces if not (p.start == 0 and p.last)}
    return real / (seq_len * len(sequences)), len(sequences), len(cut), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--median", type=float, default=400.0)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    lengths = np.maximum(1, rng.lognormal(np.log(args.median), args.sigma, args.docs).astype(int))
    print(
        f"{args.docs:,} documents, {int(lengths.sum()):,} tokens; length median "
        f"{int(np.median(lengths))}, mean {lengths.mean():.0f}, max {lengths.max():,}, "
        f"{int((lengths > args.seq_len).sum()):,} longer than seq_len {args.seq_len}"
    )
    print(f"{'method':<22}{'efficiency':>11}{'sequences':>11}{'docs cut':>10}{'seconds':>9}")
    for method, max_open in (("best_fit", 16), ("best_fit", 64), ("best_fit", 256), ("greedy", 1)):
        name = f"{method} (open {max_open})" if method == "best_fit" else method
        eff, seqs, cut, seconds = run(lengths, args.seq_len, method, max_open)
        print(f"{name:<22}{eff:>11.4f}{seqs:>11,}{cut:>10,}{seconds:>9.2f}")


if __name__ == "__main__":
    main()
