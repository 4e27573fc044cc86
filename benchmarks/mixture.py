"""The figures of a weighted mixture of sources (ingest.Mix): how far each source is from its
weight at every prefix, and the size of the mixture's state.

Every corpus is generated here as JSONL shards on local disk (a temporary folder
``/tmp/mixbench_*``, removed at the end); a document's text is ``"<d> <k>"`` and a function
stands in for the tokenizer: its ``k`` tokens are ``d * 10_000 + j + 1`` (0 is the padding),
so that every token names its document, and so its source: the script checks that each
batch's ``source`` agrees with the tokens or rows it labels. Document lengths are lognormal
(median 100 tokens, sigma 1.0), capped at 2,048. Four measurements:

1. **Packed, in tokens**: ``web`` (3,000 documents) and ``code`` (600), weights 0.7 / 0.3,
   ``Pack(seq_len=512)``, batches of 8 sequences, one epoch of the mixture. A draw is one
   sequence, counted as ``seq_len`` tokens (its padding included): the largest
   ``|count_s - w_s n|`` over every prefix of the draws and every step (batch) prefix, in
   sequences and in tokens (the bound: one draw, ``seq_len`` tokens); the same for the real
   (non-padding) tokens, which have no bound of their own (they follow the weights within
   the sources' padding); each source's packing efficiency.
2. **Unpacked, in documents**: the same corpora as rows, batches of 64: the largest
   ``|rows_s - w_s n|`` over every row prefix and step prefix (the bound: 1 document).
3. **16 sources**, seeded random weights, 40 to 100 documents each, rows: the same, and the
   rule alone (``ingest.core.mixture.Mixture``) over many more draws.
4. **The state's size** (``len(json.dumps(stream.state_dict()))``) against the number of
   sources (2, 16, 128; one shard of 16 to 32 documents each; a few batches in, rows and
   packed) and against ``seq_len`` for the two-source packed mixture at mid-epoch. A
   mixture's state is each source's whole one-source state side by side, plus a few
   numbers per source (its weight, count, draws): the table splits it so.

In the tables, ``epochs`` is a source's epochs begun within the mixture's epoch (the
mixture's ends with the batch in which every source began its next one). The shuffle is
keyed by the shards' URLs, so the packed figures change a little with the temporary
folder's name from run to run; the bounds hold on every run. Exits 1 if a bound in
sequences or documents is broken, or a batch's ``source`` disagrees with its tokens: that
is a bug.

    .venv/bin/python benchmarks/mixture.py [--quick] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import ingest
from ingest.core.mixture import Mixture

SEQ_LEN = 512
PER_DOC = 10_000
"""Token ``j`` of document ``d`` is ``d * PER_DOC + j + 1``: under 2**31 (``Tokenize``'s
int32) for documents below 214,748."""
CAP = 2048
READ_ROWS = 100
EPS = 1e-9


@dataclass(frozen=True)
class Source:
    """A generated corpus: its documents are ``first`` to ``first + len(lengths) - 1``."""

    name: str
    first: int
    lengths: npt.NDArray[np.int64]
    url: str

    @property
    def docs(self) -> int:
        return len(self.lengths)


def tokenize(texts: list[str]) -> list[list[int]]:
    """Text ``"<d> <k>"`` -> the ``k`` tokens of document ``d``."""
    out = []
    for text in texts:
        d, k = map(int, text.split())
        base = d * PER_DOC + 1
        out.append(list(range(base, base + k)))
    return out


def write_sources(
    root: Path, sizes: Mapping[str, int], seed: int, shards: int = 2
) -> dict[str, Source]:
    """Each named corpus of ``sizes[name]`` documents as ``shards`` JSONL shards under
    ``root/name``; the documents of all are numbered one after another."""
    rng = np.random.default_rng(seed)
    out, first = {}, 0
    for name, docs in sizes.items():
        lengths = np.clip(rng.lognormal(np.log(100), 1.0, docs).astype(np.int64), 1, CAP)
        folder = root / name
        folder.mkdir(parents=True)
        per = -(-docs // shards)
        for s in range(shards):
            lines = [
                json.dumps({"text": f"{first + i} {lengths[i]}"})
                for i in range(s * per, min((s + 1) * per, docs))
            ]
            if lines:
                (folder / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
        out[name] = Source(name, first, lengths, str(folder / "*.jsonl"))
        first += docs
    if first >= 2**31 // PER_DOC:
        raise SystemExit(f"{first} documents: token ids would pass int32")
    return out


def stream(
    sources: Mapping[str, Source],
    weights: Mapping[str, float],
    batch_size: int,
    seq_len: int | None,
    read_rows: int = READ_ROWS,
) -> ingest.Stream:
    """A mixed stream over ``sources`` (packed with ``seq_len``; rows without)."""
    mix = ingest.Mix({n: s.url for n, s in sources.items()}, weights=dict(weights))
    if seq_len is None:
        return ingest.Stream(mix, batch_size=batch_size, shuffle_seed=0)
    return ingest.Stream(
        mix,
        batch_size=batch_size,
        transform=ingest.Tokenize(tokenize),
        pack=ingest.Pack(seq_len=seq_len, read_rows=read_rows),
        shuffle_seed=0,
    )


# -- the draws of an epoch -------------------------------------------------------------------


@dataclass(frozen=True)
class Drawn:
    """One epoch of a mixture's draws, in order."""

    source: npt.NDArray[np.int64]
    """Each draw's source (index in the Mix's names)."""
    epoch: npt.NDArray[np.int64]
    """Each draw's epoch of its source."""
    real: npt.NDArray[np.int64]
    """Each draw's real tokens (packed) or 1 (rows)."""
    ends: npt.NDArray[np.int64]
    """The number of draws at the end of each batch."""
    seconds: float


def owner(sources: Sequence[Source], docs: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The index of the source of each document."""
    firsts = np.array([s.first for s in sources])
    return np.searchsorted(firsts, docs, side="right") - 1


def read_epoch(s: ingest.Stream, sources: Sequence[Source], packed: bool) -> Drawn:
    """One epoch of the mixture; checks each draw's source against its tokens (or row)."""
    source, epoch, real, ends, wrong = [], [], [], [0], 0
    start = time.perf_counter()
    for batch in s:
        src = batch["source"].numpy().astype(np.int64)
        if packed:
            ids = batch["input_ids"].numpy().astype(np.int64)
            real.append((ids != 0).sum(axis=1))
            docs = np.where(ids != 0, (ids - 1) // PER_DOC, -1)
            of = np.where(docs >= 0, owner(sources, np.maximum(docs, 0)), -1)
            wrong += int(((of != src[:, None]) & (of >= 0)).sum())
        else:
            real.append(np.ones(len(src), dtype=np.int64))
            docs = np.array([int(t.split()[0]) for t in batch["text"]])
            wrong += int((owner(sources, docs) != src).sum())
        source.append(src)
        epoch.append(batch["source_epoch"].numpy().astype(np.int64))
        ends.append(ends[-1] + len(src))
    seconds = time.perf_counter() - start
    if wrong:
        fail(f"{wrong} tokens or rows labelled with another source than theirs")
    return Drawn(
        np.concatenate(source),
        np.concatenate(epoch),
        np.concatenate(real),
        np.array(ends[1:]),
        seconds,
    )


def deviation(
    source: npt.NDArray[np.int64],
    size: npt.NDArray[np.int64],
    weights: Sequence[float],
    ends: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.float64]:
    """Each source's largest ``|count_s - w_s * total|`` over every prefix of the draws (or
    the prefixes ending at ``ends``), counting ``size`` per draw."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    onehot = source[:, None] == np.arange(len(w))[None, :]
    counts = np.cumsum(onehot * size[:, None], axis=0)
    off = np.abs(counts - np.cumsum(size)[:, None] * w[None, :])
    if ends is not None:
        off = off[ends - 1]
    return np.asarray(off.max(axis=0), dtype=np.float64)


FAILURES: list[str] = []


def fail(message: str) -> None:
    print(f"  BUG: {message}")
    FAILURES.append(message)


def bound(what: str, got: float, most: float) -> str:
    """'ok' or 'BROKEN' (recorded) for a deviation ``got`` against its bound."""
    if got <= most + EPS:
        return "ok"
    fail(f"{what}: {got:.4f} > {most:g}")
    return "BROKEN"


# -- 1 and 2: two sources ----------------------------------------------------------------------


def packed_two(sources: dict[str, Source], weights: dict[str, float], batch: int) -> None:
    names = list(sources)
    w = [weights[n] for n in names]
    s = stream(sources, weights, batch, SEQ_LEN)
    got = read_epoch(s, list(sources.values()), packed=True)
    s.close()
    slots = np.ones_like(got.real)
    n = len(got.source)
    print(
        f"\n1. Packed: seq_len {SEQ_LEN}, batches of {batch}, weights "
        + ", ".join(f"{k} {v}" for k, v in weights.items())
        + f"; one epoch of the mixture: {n:,} sequences in {len(got.ends)} batches "
        f"({got.seconds:.1f} s, {int(got.real.sum()) / got.seconds:,.0f} real tokens/s)"
    )
    print(
        f"  {'source':<8}{'docs':>7}{'tokens':>10}{'epochs':>8}{'seqs':>7}{'share':>8}"
        f"{'real share':>12}{'efficiency':>12}"
    )
    for i, name in enumerate(names):
        mine = got.source == i
        real = int(got.real[mine].sum())
        print(
            f"  {name:<8}{sources[name].docs:>7,}{int(sources[name].lengths.sum()):>10,}"
            f"{int(got.epoch[mine].max()) + 1:>8}{int(mine.sum()):>7,}"
            f"{mine.sum() / n:>8.4f}{real / got.real.sum():>12.4f}"
            f"{real / (mine.sum() * SEQ_LEN):>12.4f}"
        )
    print(
        f"  largest |count_s - w_s n| over prefixes (a sequence counts {SEQ_LEN} tokens; "
        "bound: 1 draw):"
    )
    print(f"  {'counted':<34}{'prefixes':<10}{'tokens':>8}{'draws':>8}  bound")
    for label, ends in (("draws", None), ("steps", got.ends)):
        off = float(deviation(got.source, slots, w, ends).max())
        verdict = bound(f"packed, {label} prefixes, sequences", off, 1.0)
        print(
            f"  {'sequence slots (the rule counts)':<34}{label:<10}{off * SEQ_LEN:>8.0f}"
            f"{off:>8.4f}  <= 1 draw ({SEQ_LEN} tokens): {verdict}"
        )
    for label, ends in (("draws", None), ("steps", got.ends)):
        off = float(deviation(got.source, got.real, w, ends).max())
        pad = float(deviation(got.source, SEQ_LEN - got.real, w, ends).max())
        print(
            f"  {'real (non-padding) tokens':<34}{label:<10}{off:>8.0f}{off / SEQ_LEN:>8.4f}"
            f"  none: within the slots' + the padding's ({pad:.0f} tokens)"
        )


def rows_two(sources: dict[str, Source], weights: dict[str, float], batch: int) -> None:
    w = [weights[n] for n in sources]
    s = stream(sources, weights, batch, None)
    got = read_epoch(s, list(sources.values()), packed=False)
    s.close()
    n = len(got.source)
    shares = ", ".join(
        f"{name} {int((got.source == i).sum()):,} ({int(got.epoch[got.source == i].max()) + 1} "
        "epochs)"
        for i, name in enumerate(sources)
    )
    print(
        f"\n2. Rows (no packing): batches of {batch}; one epoch of the mixture: {n:,} rows in "
        f"{len(got.ends)} batches ({got.seconds:.1f} s): {shares}"
    )
    print(f"  {'prefixes':<10}{'documents':>10}  bound")
    for label, ends in (("rows", None), ("steps", got.ends)):
        off = float(deviation(got.source, got.real, w, ends).max())
        print(f"  {label:<10}{off:>10.4f}  <= 1: {bound(f'rows, {label} prefixes', off, 1.0)}")


# -- 3: many sources ---------------------------------------------------------------------------


def many(root: Path, count: int, seed: int, batch: int, rule_draws: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = {f"s{i:02d}": int(rng.integers(40, 101)) for i in range(count)}
    weights = {name: round(float(rng.uniform(0.2, 1.0)), 3) for name in sizes}
    sources = write_sources(root / "many", sizes, seed, shards=1)
    s = stream(sources, weights, batch, None)
    got = read_epoch(s, list(sources.values()), packed=False)
    s.close()
    w = list(weights.values())
    print(
        f"\n3. {count} sources (rows), weights {min(w):.3f} to {max(w):.3f} (seed {seed}), "
        f"{min(sizes.values())} to {max(sizes.values())} documents each; batches of {batch}; "
        f"one epoch of the mixture: {len(got.source):,} rows ({got.seconds:.1f} s)"
    )
    print(f"  {'prefixes':<34}{'documents':>10}  {'worst source':<14}bound")
    for label, ends in (("rows", None), ("steps", got.ends)):
        off = deviation(got.source, got.real, w, ends)
        worst = list(sources)[int(off.argmax())]
        verdict = bound(f"{count} sources, {label} prefixes", float(off.max()), 1.0)
        print(f"  {label:<34}{off.max():>10.4f}  {worst:<14}<= 1: {verdict}")
    rule = Mixture(weights, seed=seed)
    chosen = np.empty(rule_draws, dtype=np.int64)
    index = {name: i for i, name in enumerate(weights)}
    for k in range(rule_draws):
        name = rule.choose()
        rule.record(name)
        chosen[k] = index[name]
    off = deviation(chosen, np.ones_like(chosen), w)
    label = f"rule alone, {rule_draws:,} draws"
    verdict = bound(f"{count} sources, the rule alone", float(off.max()), 1.0)
    print(f"  {label:<34}{off.max():>10.4f}  {list(weights)[int(off.argmax())]:<14}<= 1: {verdict}")


# -- 4: the state's size -----------------------------------------------------------------------


def sizes_of(state: Mapping[str, Any]) -> tuple[int, int, int]:
    """The state's JSON bytes, its sources' states' bytes, and the rest (the draws' counts)."""
    whole = len(json.dumps(state))
    parts = sum(len(json.dumps(p)) for p in state["sources"].values())
    return whole, parts, whole - parts


def state_after(s: ingest.Stream, batches: int) -> dict[str, Any]:
    for n, _ in enumerate(s, 1):
        if n >= batches:
            break
    state = s.state_dict()
    s.close()
    return state


def state_sizes(root: Path, counts: Iterable[int], seed: int, two: dict[str, Source]) -> None:
    print(
        "\n4. State size, len(json.dumps(stream.state_dict())) bytes. A mixture's state is each "
        "source's whole\n   one-source state side by side, plus a few numbers per source "
        "(weight, count, draws): 'rest'."
    )
    print(
        f"  {'sources':>7}  {'mode':<18}{'batches':>8}{'bytes':>10}{'per source':>12}"
        f"{'sources part':>14}{'rest':>8}{'rest/source':>13}"
    )
    for count in counts:
        rng = np.random.default_rng(seed + count)
        sizes = {f"s{i:03d}": int(rng.integers(16, 33)) for i in range(count)}
        sources = write_sources(root / f"state{count}", sizes, seed, shards=1)
        weights = {name: float(rng.uniform(0.2, 1.0)) for name in sizes}
        for mode, seq_len, batch in (("rows", None, 16), ("packed seq_len 128", 128, 8)):
            batches = max(3, -(-2 * count // batch))  # about 2 draws a source
            s = stream(sources, weights, batch, seq_len, read_rows=16)
            whole, parts, rest = sizes_of(state_after(s, batches))
            print(
                f"  {count:>7}  {mode:<18}{batches:>8}{whole:>10,}{whole / count:>12,.0f}"
                f"{parts:>14,}{rest:>8,}{rest / count:>13.1f}"
            )
    web = int(two["web"].lengths.sum())
    print(
        "  2 sources (web, code) packed, 0.7 / 0.3, batches of 8, at mid-epoch "
        "(half of web's tokens drawn):"
    )
    print(
        f"  {'seq_len':>7}  {'batches':>8}{'bytes':>10}{'web part':>10}{'code part':>11}{'rest':>8}"
    )
    for seq_len in (128, 512, 2048, 8192):
        batches = max(1, round(0.5 * web / (0.7 * seq_len * 8)))
        s = stream(two, {"web": 0.7, "code": 0.3}, 8, seq_len)
        state = state_after(s, batches)
        whole, parts, rest = sizes_of(state)
        part = {n: len(json.dumps(p)) for n, p in state["sources"].items()}
        print(
            f"  {seq_len:>7}  {batches:>8}{whole:>10,}{part['web']:>10,}{part['code']:>11,}"
            f"{rest:>8,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="corpora a fifth the size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scale = 5 if args.quick else 1
    start = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="mixbench_"))
    try:
        two = write_sources(root / "two", {"web": 3000 // scale, "code": 600 // scale}, args.seed)
        print(
            "Corpora: "
            + "; ".join(
                f"{s.name} {s.docs:,} documents, {int(s.lengths.sum()):,} tokens (median "
                f"{int(np.median(s.lengths))}, largest {int(s.lengths.max()):,})"
                for s in two.values()
            )
            + f"; read steps of {READ_ROWS}"
        )
        weights = {"web": 0.7, "code": 0.3}
        packed_two(two, weights, batch=8)
        rows_two(two, weights, batch=64)
        many(root, 16, args.seed, batch=64, rule_draws=50_000 // scale)
        state_sizes(root, (2, 16, 128) if not args.quick else (2, 16, 64), args.seed, two)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{time.perf_counter() - start:.1f} s in all")
    if FAILURES:
        raise SystemExit(f"{len(FAILURES)} bound(s) broken: {'; '.join(FAILURES)}")


if __name__ == "__main__":
    main()
