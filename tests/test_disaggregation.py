"""Read tasks and decode actors run only on the ingest node, trainers only on the trainer node.

A 3-node ``ray.cluster_utils.Cluster`` on this machine, in its own process (the session's
local Ray is a different cluster).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ingest_and_training_run_on_their_own_nodes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "disaggregation_run.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    ingest_node, trainer_node = found["ingest_node"], found["trainer_node"]
    ids = []
    for rank in found["ranks"]:
        assert rank["worker_node"] == trainer_node
        assert rank["read_nodes"] == [ingest_node]
        assert rank["decode_nodes"] == [ingest_node]
        assert rank["ids"], "every rank got data"
        ids += rank["ids"]
    assert len(ids) == len(set(ids)) == 1200
