"""`make demo`: exact resume, from a single process to a TorchTrainer job that loses a worker.

Part 1, ``ingest.Stream`` without Ray:
1. Starts an S3-protocol server on 127.0.0.1 and writes a generated parquet dataset to it.
2. A child process streams it, stops half way through the epoch and saves the state.
3. A second child process loads that state and streams the rest.
4. This process checks that every row arrived exactly once.

Part 2, the language-model job (``python train/lm.py``) under Ray Train's
TorchTrainer on a laptop-local Ray, reading token shards from the same S3 server through
``ingest.RayStream``: one training worker exits mid-epoch, Ray Train restarts the worker
group from the last checkpoint (model + stream state), and the job prints its per-epoch
throughput, its data-stall share and the exactly-once check.

Part 3, ``python train/pretrain.py``: a weighted mixture (60/40 in tokens) of two raw-text
JSONL corpora on the same S3 server, tokenized in the reader pool and packed into sequences
on the workers. A worker exits, the run fails; the same run goes on with 3 workers from its
last checkpoint, and the job prints the token-level exactly-once check, each corpus's share
of the tokens against its weight and the mixture's largest deviation at any step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

# 160 full batches of 1,024: an epoch's rows that cannot fill a last batch would be carried
# into the next epoch (Stream(remainder="carry")), which this one-epoch check leaves out.
SHARDS, ROWS, ROW_GROUP = 8, 20_480, 2_560
URL = "s3://demo/train/*.parquet"
LM_JOB = Path(__file__).resolve().parent.parent / "train" / "lm.py"
PRETRAIN_JOB = LM_JOB.parent / "pretrain.py"


def consume(args: argparse.Namespace) -> None:
    """Child process: stream, optionally stop half way and save, or resume from a state."""
    import ingest

    options = json.loads(args.storage_options)
    stream = ingest.Stream(
        URL, columns=["id", "tokens"], batch_size=1024, shuffle_seed=0, storage_options=options
    )
    start = time.perf_counter()
    if args.resume:
        stream.load_state_dict(json.loads(Path(args.resume).read_text()))
    ids: list[np.ndarray] = []
    first_batch_s = None
    total = SHARDS * ROWS
    for batch in stream:
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - start
        ids.append(batch["id"].numpy().copy())
        if args.stop_half and sum(len(i) for i in ids) >= total // 2:
            state = stream.state_dict()
            Path(args.save).write_text(json.dumps(state))
            print(
                f"  stopped after {sum(len(i) for i in ids):,} rows; state saved to "
                f"{args.save} ({len(json.dumps(state)):,} bytes, "
                f"epoch {state['progress']['epoch']})"
            )
            break
    np.save(args.ids, np.concatenate(ids))
    what = "resumed" if args.resume else "started"
    stats = stream.stats
    kinds = (("listing", "listings"), ("open", "opens"), ("read", "reads"))
    sent = ", ".join(f"{stats[k]:,} {one if stats[k] == 1 else k}" for one, k in kinds if stats[k])
    print(
        f"  {what}: first batch after {first_batch_s:.3f} s, {sum(len(i) for i in ids):,} "
        f"rows; requests: {sent}, {stats['bytes_read'] / 2**20:.1f} MiB read, "
        f"{stats['retries']} retries"
    )


def main() -> int:
    from ingest.testing import LoopbackS3, write_dataset

    out = Path("demo-out")
    out.mkdir(exist_ok=True)
    with LoopbackS3() as s3:
        print(f"S3-protocol server on {s3.endpoint}")
        s3.create_bucket("demo")
        write_dataset(
            s3.filesystem(), "demo/train", "parquet", SHARDS, ROWS, row_group_rows=ROW_GROUP
        )
        print(f"wrote {SHARDS} parquet shards x {ROWS:,} rows to {URL}")
        options = json.dumps(s3.storage_options())
        base = [sys.executable, __file__, "consume", "--storage-options", options]
        print("process 1: stream with shuffle_seed=0 and stop half way")
        subprocess.run(
            [
                *base,
                "--stop-half",
                "--save",
                str(out / "state.json"),
                "--ids",
                str(out / "ids-1.npy"),
            ],
            check=True,
            timeout=600,
        )
        print("process 2: a new process loads the state and streams the rest")
        subprocess.run(
            [*base, "--resume", str(out / "state.json"), "--ids", str(out / "ids-2.npy")],
            check=True,
            timeout=600,
        )
    first, second = np.load(out / "ids-1.npy"), np.load(out / "ids-2.npy")
    counts = Counter(np.concatenate([first, second]).tolist())
    expected = SHARDS * ROWS
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    missing = expected - len(set(counts) & set(range(expected)))
    print(
        f"{len(first):,} rows before the stop + {len(second):,} after the resume = "
        f"{len(first) + len(second):,} of {expected:,}; {duplicates} duplicated, "
        f"{missing} missing"
    )
    if duplicates or missing or len(first) + len(second) != expected:
        print("FAILED: rows were not delivered exactly once")
        return 1
    print("exactly once: every row arrived once across the stop and the resume")
    return language_model_job(out) or pretrain_job(out)


def language_model_job(out: Path) -> int:
    """Part 2: the LM job under TorchTrainer with one injected worker failure."""
    from ingest.testing import LoopbackS3

    stamp = time.strftime("%Y%m%d-%H%M%S")
    print(
        "\npart 2: train/lm.py under Ray Train's TorchTrainer, 2 workers, token shards "
        "on S3; rank 1 exits at step 11 (FailureConfig(max_failures=1))"
    )
    with LoopbackS3() as s3:
        s3.create_bucket("demo")
        overrides = [
            "data.url=s3://demo/tokens/",
            f"data.storage_options={json.dumps(s3.storage_options())}",
            f"run.storage_path={out.resolve()}/runs",
            f"run.name=lm-{stamp}",
            "fault.die_at_step=11",
            f"fault.marker={out.resolve()}/died-{stamp}",
        ]
        job = subprocess.run(
            [sys.executable, str(LM_JOB), *overrides],
            text=True,
            capture_output=True,
            timeout=900,
            check=False,
        )
    _lines(job, "[lm]")
    if job.returncode != 0:
        print(job.stderr[-3000:])
        print("FAILED: the language-model job did not pass its exactly-once check")
    return job.returncode


def _lines(job: subprocess.CompletedProcess[str], tag: str) -> None:
    """Print a job's lines from ``tag`` on, each once (Ray repeats a worker's lines)."""
    seen: set[str] = set()
    for line in job.stdout.splitlines() + job.stderr.splitlines():
        if tag in line:
            text = line[line.index(tag) :]
            if text not in seen:
                seen.add(text)
                print("  " + text)


def pretrain_job(out: Path) -> int:
    """Part 3: train/pretrain.py on two raw-text corpora, tokenized in the readers and packed
    on the workers; a worker dies (the run fails), the same run again with 3 workers."""
    from ingest.testing import LoopbackS3

    stamp = time.strftime("%Y%m%d-%H%M%S")
    print(
        "\npart 3: train/pretrain.py: two JSONL corpora on S3 mixed 60/40 by tokens, tokenized "
        "in the reader pool (a BPE trained on the spot) and packed into sequences of 128 "
        "tokens on 2 workers; "
        "rank 1 exits at step 8 and the run fails, then the same run goes on with 3 workers"
    )
    with LoopbackS3() as s3:
        s3.create_bucket("demo")
        overrides = [
            "data.corpora.web=s3://demo/corpora/web",
            "data.corpora.code=s3://demo/corpora/code",
            f"data.storage_options={json.dumps(s3.storage_options())}",
            f"run.storage_path={out.resolve()}/runs",
            f"run.name=pretrain-{stamp}",
        ]
        command = [sys.executable, str(PRETRAIN_JOB), *overrides]
        first = subprocess.run(
            [*command, "fault.die_at_step=8", f"fault.marker={out.resolve()}/died-pt-{stamp}"],
            text=True,
            capture_output=True,
            timeout=900,
            check=False,
        )
        _lines(first, "[pretrain]")
        if first.returncode == 0:
            print("FAILED: the first run was to lose a worker and stop")
            return 1
        second = subprocess.run(
            [*command, "train.workers=3"], text=True, capture_output=True, timeout=900, check=False
        )
        _lines(second, "[pretrain]")
    if second.returncode != 0:
        print(second.stderr[-3000:])
        print("FAILED: the pretraining job did not pass its token-level exactly-once check")
    return second.returncode


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("consume")
    child.add_argument("--storage-options", required=True)
    child.add_argument("--stop-half", action="store_true")
    child.add_argument("--save")
    child.add_argument("--resume")
    child.add_argument("--ids", required=True)
    parsed = parser.parse_args()
    if parsed.command == "consume":
        consume(parsed)
        sys.exit(0)
    sys.exit(main())
