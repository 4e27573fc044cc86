"""The README's Ray blocks run as written on a laptop-sized Ray: ``ray.init(num_cpus=2)``;
and its DataLoader block, whose checkpoint ``torch.load`` must load.

Each block is read from README.md (never copied here, so the two cannot drift) and run in
a subprocess of its own that starts a fresh local Ray of 2 CPUs (the session's Ray of the
other tests is another instance), on small generated data. Two things are added around a
block, nothing inside it: the names it leaves to the reader (a tokenizer, a model, a
transform class), defined before it; and its URLs, which name buckets, replaced by local
directories holding the data each names (a URL the table below lacks fails the test). After
the block, a few lines check what it made (every rank's first batch, a checkpoint). Issue
31: with readers and index tasks reserving a whole CPU each, these blocks hung (the index
tasks waited for the CPUs the readers held; the trainers for those too).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

WORDS = [f"w{i}" for i in range(200)]

BLOCKS = {
    # name: (text that marks the block, seconds it may take)
    "raystream": ("stream.rank_iterator(rank) for rank in range(4)", 240),
    "pack": ("pack=ingest.Pack(seq_len=2048, provenance=True)", 300),
    "mix": ('weights={"web": 0.7, "code": 0.3}', 360),
    "ray_train": ("TorchTrainer(", 480),
    "dataloader": ("ingest.DataLoader(stream, num_workers=4", 240),
}
NO_RAY = {"dataloader"}
"""Blocks that run without Ray (the preamble starts none for them)."""

PREAMBLE = """\
import json, os, sys, ray, torch, ingest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

if START_RAY:
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # a laptop

tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
tokenizer.train_from_iterator(
    [" ".join(f"w{i}" for i in range(200))],
    trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]),
)


class Tokenize:  # the Ray block's transform: a class built once per pool actor
    def __call__(self, table):
        return table


model = torch.nn.Linear(16, 1)
loss = torch.zeros(())
"""

FIRST_BATCHES = """
@ray.remote(num_cpus=0)
def _first(it):
    batch = next(iter(it))
    return {k: list(v.shape) for k, v in batch.items() if hasattr(v, "shape")}

shapes = ray.get([_first.remote(stream.rank_iterator(r)) for r in range(4)], timeout=240)
print("SHAPES", json.dumps(shapes))
assert all(s["input_ids"] == [8, 2048] for s in shapes), shapes
stream.shutdown()
"""

CHECKS = {
    "raystream": """
assert state["version"] >= 2 and state["distributed"], state.keys()
stream.shutdown()
print("STATE OK")
""",
    "pack": FIRST_BATCHES,
    "mix": FIRST_BATCHES,
    "ray_train": """
found = [d for d, _, files in os.walk(RUNS) if "ingest_stream_state.json" in files]
print("CHECKPOINTS", len(found))
assert found, "no checkpoint with the stream state under " + RUNS
""",
    "dataloader": """
assert torch.load("ckpt.pt")["data"]["version"] >= 2  # torch.load's weights_only default
print("LOADED")
""",
}


def python_blocks(text: str) -> list[str]:
    """The README's ```python blocks, dedented (some sit in list items)."""
    found = re.finditer(r"^( *)```python\n(.*?)^\1```", text, flags=re.MULTILINE | re.DOTALL)
    return [textwrap.dedent(m.group(2)) for m in found]


def block(name: str) -> str:
    mark = BLOCKS[name][0]
    hits = [b for b in python_blocks(README.read_text()) if mark in b]
    assert len(hits) == 1, f"README.md holds {len(hits)} python blocks with {mark!r}, not 1"
    return hits[0]


def _parquet(path: Path, shards: int, rows: int) -> None:
    path.mkdir(parents=True)
    for s in range(shards):
        ids = np.arange(s * rows, (s + 1) * rows, dtype=np.int64)
        tokens = pa.FixedSizeListArray.from_arrays(
            pa.array(np.arange(rows * 16, dtype=np.int32) % 1000), 16
        )
        pq.write_table(pa.table({"id": ids, "tokens": tokens}), path / f"part-{s}.parquet")


def _jsonl(path: Path, shards: int, docs: int, seed: int) -> None:
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for s in range(shards):
        with open(path / f"part-{s}.jsonl", "w") as f:
            for i in range(docs):
                words = rng.choice(WORDS, int(rng.integers(20, 400)))
                f.write(json.dumps({"id": s * docs + i, "text": " ".join(words)}) + "\n")


def urls(tmp: Path) -> dict[str, str]:
    """Each bucket URL of the README's Ray blocks, and the local data it stands for."""
    _parquet(tmp / "train", 4, 2048)  # 2 steps of 1024 rows on each of 4 ranks
    _parquet(tmp / "tokens", 4, 3300)  # 51 steps of 64 rows on 4 ranks: a report at 49
    _jsonl(tmp / "web", 4, 500, seed=1)  # ~100k tokens a rank: a few batches of 8 x 2048
    _jsonl(tmp / "code", 4, 500, seed=2)
    return {
        "s3://bucket/train/*.parquet": f"{tmp}/train/*.parquet",
        "s3://bucket/train/": f"{tmp}/train/",
        "s3://bucket/tokens/": f"{tmp}/tokens/",
        "s3://bucket/runs": f"{tmp}/runs",
        "s3://corpora/web/*.jsonl": f"{tmp}/web/*.jsonl",
        "s3://corpora/code/*.jsonl": f"{tmp}/code/*.jsonl",
    }


def script(name: str, tmp: Path) -> str:
    code = block(name)
    table = urls(tmp)
    for url in re.findall(r"[a-z0-9]+://[^\"' ]+", code):
        assert url in table, f"the README's {name} block reads {url}: give the test its data"
    for url, path in table.items():
        code = code.replace(f'"{url}"', repr(path))
    runs = f"RUNS = {str(tmp / 'runs')!r}\nSTART_RAY = {name not in NO_RAY}\n"
    return runs + PREAMBLE + "\n# -- README.md --\n" + code + "\n# -- checks --\n" + CHECKS[name]


@pytest.mark.system
@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_readmes_blocks_run_as_written_on_a_2_cpu_laptop(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"readme_{name}.py"
    path.write_text(script(name, tmp_path))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    limit = BLOCKS[name][1]
    out, code = run_bounded([sys.executable, str(path)], tmp_path, env, limit)
    assert code is not None, f"the README's {name} block did not end within {limit} s:\n{out}"
    assert code == 0, f"the README's {name} block failed:\n{out}"


def run_bounded(
    argv: list[str], cwd: Path, env: dict[str, str], limit_s: float
) -> tuple[str, int | None]:
    """Run ``argv`` in a session of its own; its output's tail and exit code, or None for
    the code if it ran past ``limit_s`` (then the session, with the Ray it started, is
    killed)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit_s)
        return out[-4000:], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        return out[-4000:], None


EXIT_SCRIPT = """\
import sys, ray, ingest

ray.init(address="local", num_cpus=2, include_dashboard=False)
mix = ingest.Mix({"a": sys.argv[1], "b": sys.argv[2]}, weights={"a": 0.5, "b": 0.5})
stream = ingest.RayStream(mix, batch_size=4, world_size=1)
batches = iter(stream.rank_iterator(0))
next(batches)  # a loop left suspended: its generator is closed at exit
left = iter(stream.rank_iterator(0))
next(left)
if sys.argv[3] == "shutdown":  # Ray shut down first, then the loop closed
    ray.shutdown()
    left.close()
    assert not ray.is_initialized(), "closing a loop after ray.shutdown() started Ray again"
print("END OF SCRIPT", flush=True)
"""


@pytest.mark.system
@pytest.mark.parametrize("how", ["exit", "shutdown"])
def test_a_script_ends_after_a_mixture_stream_without_starting_ray_again(
    how: str, tmp_path: Path
) -> None:
    """Issue 31: at interpreter exit, a rank iterator's generator closed after Ray's own
    shutdown sent its acks, and Ray started a new local cluster (dashboard and all): the
    process never ended. Nothing may call Ray once it is shut down."""
    for name in ("a", "b"):
        _parquet(tmp_path / name, 2, 200)
    path = tmp_path / "exit.py"
    path.write_text(EXIT_SCRIPT)
    argv = [sys.executable, str(path), f"{tmp_path}/a/", f"{tmp_path}/b/", how]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    out, code = run_bounded(argv, tmp_path, env, 120)
    assert code is not None, f"the script did not end within 120 s:\n{out}"
    assert code == 0 and "END OF SCRIPT" in out, out
    assert out.count("Started a local Ray instance") <= 1, f"Ray started again:\n{out}"


LOG_SCRIPT = """\
import sys, ray, ingest

ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=sys.argv[2])
with ingest.RayStream(sys.argv[1], batch_size=1000, world_size=2) as stream:
    print("batches", [sum(1 for _ in stream.rank_iterator(r)) for r in range(2)], flush=True)
"""


@pytest.mark.system
def test_a_raystreams_log_says_why_an_epoch_gave_no_batch_and_nothing_else(
    tmp_path: Path,
) -> None:
    """What a RayStream's actors write to the driver's log: a batch larger than the dataset
    (400 rows, 2 ranks of 1,000) gives each rank an empty epoch, and the coordinator says
    why; it said nothing. And no RayDeprecationWarning: every coordinator wrote one (Ray's
    own was_current_actor_reconstructed reads its deprecated actor_id). Read from the
    session's log files, which the actors write themselves (what reaches the driver's
    console is forwarded from them, after a delay)."""
    _parquet(tmp_path / "data", 2, 200)
    ray_tmp = tempfile.mkdtemp(prefix="rlog", dir="/tmp")  # short: Ray's socket paths
    try:
        path = tmp_path / "log.py"
        path.write_text(LOG_SCRIPT)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.pop("RAY_ADDRESS", None)
        argv = [sys.executable, str(path), f"{tmp_path}/data/", ray_tmp]
        out, code = run_bounded(argv, tmp_path, env, 120)
        assert code == 0 and "batches [0, 0]" in out, out
        logs = "".join(
            p.read_text(errors="replace") for p in Path(ray_tmp).glob("session_*/logs/*.err")
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert "epoch 0 gave no batch: the dataset (400 rows listed)" in logs, logs[-3000:]
    assert "DeprecationWarning" not in logs, logs[-3000:]
