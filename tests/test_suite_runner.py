"""``make test`` ends when a pytest-xdist worker dies, with the test it died in named.

A worker can die under a test (a signal handler left by another library calling
``sys.exit``, a segfault, the kernel's OOM killer). pytest-xdist 3.8.0 then starts a new
worker, and under ``--dist loadgroup`` its scheduler can hand the new worker a unit that
never ends (pytest-xdist issues 1323 and 1327, fixed after 3.8.0): the run waited for ever,
and CI only at its 90-minute limit. This runs pytest with the Makefile's own ``XDIST``
flags over a file whose first test kills its worker, and checks that the run ends, fails
and names that test.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CRASHING = """
import os
import time


def test_dies():
    time.sleep(1)
    os._exit(1)


def test_after():
    pass
"""


def makefile_xdist() -> list[str]:
    """The flags of the Makefile's ``XDIST ?=`` line, which ``make test`` passes to pytest."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(r"^XDIST \?= (.+)$", text, re.MULTILINE)
    assert match, "the Makefile has no `XDIST ?= ...` line"
    return shlex.split(match.group(1))


def test_a_worker_that_dies_ends_the_run_and_names_its_test(tmp_path: Path) -> None:
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["--rootdir", str(tmp_path), *makefile_xdist(), "test_crashing.py", "test_other.py"]
    try:
        done = subprocess.run(
            command,
            check=False,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(f"the run did not end in 60 s after its worker died:\n{out}") from None
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "crashed while running 'test_crashing.py::test_dies" in out, out
