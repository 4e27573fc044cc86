"""Shared fixtures: one loopback S3 server per session, stores to write shards to."""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
from hypothesis import settings

from ingest.testing import LoopbackS3, Store

_names = itertools.count()

# Hypothesis profiles. Neither has a deadline: a property test's examples take milliseconds,
# but one of them running while the machine is busy (a CI runner, Ray starting) took over
# the default 200 ms and failed with DeadlineExceeded. "ci" (the default) draws the same
# examples on every run and prints the blob that replays a failure; "dev" draws new ones
# each run (HYPOTHESIS_PROFILE=dev). Tests that set max_examples keep theirs (60, 80).
settings.register_profile(
    "ci", deadline=None, derandomize=True, print_blob=True, max_examples=100, database=None
)
settings.register_profile("dev", deadline=None, print_blob=True, max_examples=100)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The persistent shard index (default: the user's cache directory) goes to a directory of
# this test session, set before Ray starts so that its workers see it too.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="ingest-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """The running test, for scripts/why_tests_died.py when Ray takes the run down with it."""
    with open(os.path.join(tempfile.gettempdir(), "ingest-test-current"), "w") as f:
        f.write(nodeid + "\n")


@pytest.fixture(scope="session")
def s3() -> Iterator[LoopbackS3]:
    """A real S3-protocol server (moto_server) on 127.0.0.1 for the whole session."""
    with LoopbackS3() as server:
        server.create_bucket("ingest-test")
        yield server


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    """The same test on the local disk and on the loopback S3 server."""
    if request.param == "local":
        return Store("local", fsspec.filesystem("file"), f"file://{tmp_path}", {})
    server: LoopbackS3 = request.getfixturevalue("s3")
    return Store(
        "s3", server.filesystem(), f"s3://ingest-test/t{next(_names)}", server.storage_options()
    )


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole test session (more logical CPUs than cores is fine)."""
    import os

    import ray

    # The workers import this repository's tests (functions defined there), so they need it
    # on their path. Set in the environment the local Ray inherits, not as the job's
    # runtime_env: a runtime_env makes every worker wait on the runtime env agent and leaves
    # the workers Ray starts ahead unused (an actor started in ~2 s instead of ~0.4-1.3 s).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    ray.init(
        # Always a new local instance, never a `ray start` cluster found on this machine
        # (the job-submit tests start one).
        address="local",
        num_cpus=8,
        # One slot a test can hold to keep a pool from starting (test_pool_sizing).
        resources={"test_slot": 1.0},
        include_dashboard=False,
        log_to_driver=False,
        # Metrics reach the node's Prometheus endpoint within a second (test_metrics.py).
        _system_config={"metrics_report_interval_ms": 1000},
    )
    yield
    ray.shutdown()


@pytest.fixture
def local(tmp_path: Any) -> Store:
    return Store("local", fsspec.filesystem("file"), f"file://{tmp_path}", {})


@pytest.fixture
def s3_store(s3: LoopbackS3) -> Store:
    return Store("s3", s3.filesystem(), f"s3://ingest-test/t{next(_names)}", s3.storage_options())
