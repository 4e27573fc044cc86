"""The environment of a test's Ray run in a process of its own (a multi-node ``Cluster``
started by a script), apart from the session's local Ray."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RAY_NICENESS = "RAY_worker_niceness"
"""The variable that sets the niceness of the Ray workers a raylet starts (Ray's default:
15); tests/conftest.py sets it to 0 for every Ray of the tests, and says why."""


def minimal_env() -> dict[str, str]:
    """This repository on the path, the system's binaries, the home directory, and the Ray
    workers' niceness as the tests' own Ray has it: nothing else of the test's environment
    (no ``RAY_ADDRESS`` of the session's Ray, no variable a test set)."""
    return {
        "PYTHONPATH": str(ROOT),
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
        RAY_NICENESS: os.environ.get(RAY_NICENESS, "0"),
    }
