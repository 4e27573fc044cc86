"""The test session's Ray shares the machine with the other pytest-xdist worker fairly:
its workers run at the niceness of the processes around them (tests/conftest.py says why).
"""

from __future__ import annotations

import os

import pytest
import ray


@ray.remote(num_cpus=0)
def niceness() -> int:
    return os.nice(0)


@pytest.mark.usefixtures("ray_session")
def test_the_sessions_ray_workers_run_at_the_niceness_of_the_tests() -> None:
    """At Ray's default (15) a Ray worker weighs 36 against a test process's 1,024: a
    RayStream's first batch came 72 s after its start beside two busy loops (2.4 s at 0)."""
    assert ray.get(niceness.remote(), timeout=60) == os.nice(0) == 0
