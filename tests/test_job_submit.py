"""`ray job submit` against a real `ray start --head`, token authentication on.

The head gets its own TMPDIR, so its temp files and "current cluster" record cannot mix
with the test session's Ray; its processes all carry that path, which is how the test stops
exactly them at the end (``ray stop`` would stop every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ingest.testing import free_port

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))


def stop_processes_under(marker: str) -> None:
    procs = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(marker in part for part in (p.info["cmdline"] or []))
    ]
    for p in procs:
        p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        p.kill()


@pytest.fixture
def head() -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head on 127.0.0.1 (dashboard and job server), stopped afterwards."""
    tmp = tempfile.mkdtemp(prefix="rjob", dir="/tmp")  # short: Ray's socket paths are long
    env = {
        **os.environ,
        "TMPDIR": tmp,
        "RAY_AUTH_MODE": "token",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    dashboard = free_port()
    address = f"http://127.0.0.1:{dashboard}"
    log = open(Path(tmp) / "head.log", "w")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--block",
            f"--port={free_port()}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            # Every port explicit: another Ray on this machine may hold the defaults.
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            "--num-cpus=8",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            ready = subprocess.run(
                [RAY, "job", "list", "--address", address],
                env=env,
                capture_output=True,
                timeout=60,
                check=False,
            )
            if ready.returncode == 0:
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the head did not come up: {ready.stderr[-2000:]!r}")
            time.sleep(2)
        yield address, env
    finally:
        proc.terminate()
        stop_processes_under(tmp)
        log.close()


def test_submit_the_lm_job_and_find_the_stream_state_in_its_checkpoint(
    head: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    address, env = head
    job_id = f"ingest-test-{int(time.time())}"
    for _ in range(20):  # the job agent starts a few seconds after the job server
        submitted = subprocess.run(
            [
                RAY,
                "job",
                "submit",
                "--address",
                address,
                "--working-dir",
                str(ROOT),
                "--submission-id",
                job_id,
                "--no-wait",
                "--",
                sys.executable,
                "-m",
                "train.lm",
                "--config",
                "train/configs/lm.yaml",
                f"data.url={tmp_path}/tokens",
                f"run.storage_path={tmp_path}/runs",
                "run.name=job",
                f"fault.marker={tmp_path}/died",
                "train.epochs=1",
                "data.generate.shards=4",
                "data.generate.rows=512",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )
        if "No available agent" not in submitted.stderr:
            break
        time.sleep(3)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    status = ""
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        polled = subprocess.run(
            [RAY, "job", "status", "--address", address, job_id],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # e.g. "Job 'ingest-test-1' succeeded"; the CLI logger may write to either stream.
        status = (polled.stdout + polled.stderr).lower()
        if any(f"' {word}" in status for word in ("succeeded", "failed", "stopped")):
            break
        time.sleep(3)
    logs = subprocess.run(
        [RAY, "job", "logs", "--address", address, job_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    assert f"job '{job_id}' succeeded" in status, f"{status}\n{logs[-4000:]}"
    assert "exactly once: 2,048 of 2,048 rows seen 1x" in logs
    states = sorted((tmp_path / "runs" / "job").glob("checkpoint_*/ingest_stream_state.json"))
    assert states, "the job's checkpoints hold the stream state"
    final = json.loads(states[-1].read_text())
    assert final["version"] == 2 and final["progress"]["epoch"] == 1
    assert final["distributed"]["world_size"] == 2
