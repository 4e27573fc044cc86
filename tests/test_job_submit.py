"""`ray job submit --runtime-env cluster/runtime_env.yaml` against a real `ray start --head`,
token authentication on: the README's cluster command, with the shipped runtime env.

The head gets its own TMPDIR, so its temp files and "current cluster" record cannot mix
with the test session's Ray; its processes all carry that path, which is how the test stops
exactly them at the end (``ray stop`` would stop every Ray on the machine).
"""

from __future__ import annotations

import contextlib
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

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))


def processes_under(tmp: str, root: int) -> list[psutil.Process]:
    """Every process of the head in ``tmp`` that ``root`` (``ray start``) started: its
    descendants, and any process whose command line names ``tmp`` or that holds a file
    open under it (a session log). Ray's agents rename their command line
    (``ray::DashboardAgent``) and overwrite their environment, and once their raylet is
    killed their parent is init: one left running that way spun at 75% of a core for
    minutes of the test session."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess):
        head = psutil.Process(root)
        found.update((p.pid, p) for p in [head, *head.children(recursive=True)])
    for p in psutil.process_iter(["cmdline"]):
        if p.pid == os.getpid() or p.pid in found:
            continue
        with contextlib.suppress(psutil.Error):
            named = any(tmp in part for part in (p.info["cmdline"] or []))
            if named or any(f.path.startswith(tmp + os.sep) for f in p.open_files()):
                found[p.pid] = p
    return list(found.values())


def stop_processes_under(tmp: str, root: int) -> None:
    """SIGKILL every process of the head in ``tmp`` (see :func:`processes_under`): the head
    is the test's alone, its files are removed next, and a graceful stop cost ~20 s of the
    test's time. Raises if any is still alive 10 s later."""
    procs = processes_under(tmp, root)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _, alive = psutil.wait_procs(procs, timeout=10)
    left = [p for p in processes_under(tmp, root) if _running(p)]
    if alive or left:
        names = sorted({f"{p.pid} {_name(p)}" for p in alive + left})
        raise RuntimeError(f"processes of the head in {tmp} still run after SIGKILL: {names}")


def _running(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    return False


def _name(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(p.cmdline())[:80]
    return "?"


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
        stop_processes_under(tmp, proc.pid)
        proc.kill()
        log.close()
        # The runtime env's virtualenv (a clone of this one: GBs, ~20 s to delete) and the
        # session logs live here: removed by a process of its own while the next tests run.
        subprocess.run(["sh", "-c", 'rm -rf "$0" >/dev/null 2>&1 &', tmp], check=False, timeout=10)


def ray_job(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``ray job ARGS`` from the repository root, as a user runs it there."""
    return subprocess.run(
        [RAY, "job", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def submit(address: str, env: dict[str, str], job_id: str, entrypoint: list[str]) -> None:
    """Submit with the shipped runtime env; retry while the job agent is still starting."""
    for _ in range(20):  # the job agent starts a few seconds after the job server
        submitted = ray_job(
            env,
            "submit",
            "--address",
            address,
            "--runtime-env",
            "cluster/runtime_env.yaml",
            "--submission-id",
            job_id,
            "--no-wait",
            "--",
            *entrypoint,
            timeout=120,
        )
        if "No available agent" not in submitted.stderr:
            break
        time.sleep(3)
    assert submitted.returncode == 0, submitted.stderr[-3000:]


def wait_for(address: str, env: dict[str, str], job_id: str, seconds: float) -> str:
    """The job's final status line, lower case (or the last one seen when time ran out)."""
    status = ""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        polled = ray_job(env, "status", "--address", address, job_id)
        # e.g. "Job 'ingest-test-1' succeeded"; the CLI logger may write to either stream.
        status = (polled.stdout + polled.stderr).lower()
        if any(f"' {word}" in status for word in ("succeeded", "failed", "stopped")):
            break
        time.sleep(3)
    return status


@pytest.mark.timeout(900)
def test_submit_the_lm_job_with_the_shipped_runtime_env(
    head: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """The README's cluster command: the runtime env uploads the working dir (the library and
    the job script with its default config, train/) and pip-installs the dependencies into a
    virtualenv."""
    address, env = head
    job_id = f"ingest-test-{int(time.time())}"
    entrypoint = [
        "python",  # the runtime env's virtualenv python, as in the README
        "train/lm.py",  # relative to the uploaded working dir, where the job starts
        f"data.url={tmp_path}/tokens",
        f"run.storage_path={tmp_path}/runs",
        "run.name=job",
        f"fault.marker={tmp_path}/died",
        "train.epochs=1",
        "data.generate.shards=4",
        "data.generate.rows=512",
    ]
    submit(address, env, job_id, entrypoint)
    status = wait_for(address, env, job_id, seconds=720)
    logs = ray_job(env, "logs", "--address", address, job_id).stdout
    assert f"job '{job_id}' succeeded" in status, f"{status}\n{logs[-4000:]}"
    assert "exactly once: 2,048 of 2,048 rows seen 1x" in logs
    # It ran inside the shipped env: the uploaded code and the pip virtualenv are on the head.
    resources = Path(env["TMPDIR"], "ray", "session_latest", "runtime_resources")
    uploaded = [p.parent for p in resources.glob("working_dir_files/*/train/lm.py")]
    assert uploaded, resources
    assert all((d / "configs" / "lm.yaml").is_file() for d in uploaded), uploaded
    assert all((d.parent / "ingest" / "__init__.py").is_file() for d in uploaded), uploaded
    assert list(resources.glob("pip/*/virtualenv/bin/python")), resources
    states = sorted((tmp_path / "runs" / "job").glob("checkpoint_*/ingest_stream_state.json"))
    assert states, "the job's checkpoints hold the stream state"
    final = json.loads(states[-1].read_text())
    assert final["version"] == 7 and final["progress"]["epoch"] == 1
    assert final["distributed"]["world_size"] == 2
