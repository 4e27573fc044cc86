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
from tests.own_process import RAY_NICENESS

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

# Every Ray the tests start (the session's, a Cluster's nodes, `ray start --head`, the
# subprocesses that inherit this environment) runs its workers at the niceness of the
# processes around them, 0, not Ray's default of 15. The two pytest-xdist workers share two
# cores: at 15, a Ray worker weighs 36 against the 1,024 of a process at 0 (Linux's CFS),
# so whatever the other xdist worker ran in its own process (a Stream, a loopback server,
# Hypothesis) starved this one's readers and ranks: a RayStream's first batch came 72 s
# after its start beside two busy loops, 2.4 s with the workers at 0 (1.0 s alone), and
# the system tests, which run one after the other on one xdist worker, took their time
# from how busy the other one was (CI: 26 minutes one day, 56 the next, and a sizing test
# whose ranks waited on starved calls). Ray's default keeps its own daemons responsive on
# a node of many workers; here the tests, not the daemons, share the machine.
os.environ.setdefault(RAY_NICENESS, "0")

# The persistent shard index (default: the user's cache directory) goes to a directory of
# this test session, set before Ray starts so that its workers see it too.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="ingest-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after xdist's own hook, which the lines below stand in for
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``make unit`` and ``make unit-fast``,
    see the Makefile); without it (``make unit XDIST=``), nothing changes.

    Every system test is in one group, so one worker runs them one after the other: two
    whole systems at once (multi-node clusters, Ray Train runs, a ``ray start --head`` and
    its pip virtualenv) would share two cores and 24 GiB, past what each test's limits were
    sized for. That group comes first (with ``--no-loadscope-reorder``, xdist hands out the
    groups in the order of their first test): it is the longest, and started last it would
    run alone at the end. Every other test is in the group of its file, so a module-scoped
    fixture (a generated dataset, a loopback server) is made once, on one worker, as without
    xdist. Each worker has its own session Ray, moto server, shard index cache and tmp_path.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is None:
            path = item.nodeid.partition("::")[0]
            group = "system" if item.get_closest_marker("system") else path
            item.add_marker(pytest.mark.xdist_group(group))
        else:
            group = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        if "@" not in item.nodeid:
            _name_group(item, group)
    items.sort(key=lambda item: not item.nodeid.endswith("@system"))


def _name_group(item: pytest.Item, group: str) -> None:
    """Append ``@group`` to the test's id, as xdist 3.8 does for a test marked before its
    hook runs: the id is how its controller learns the group. xdist sets Item._nodeid,
    which pytest 9.2 no longer reads (the id is a NodeId in Item._id): left to it, each
    test was a group of its own, module fixtures were made on both workers and two system
    tests ran at once."""
    nodeid = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest >= 9.2
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)
    else:
        setattr(item, "_nodeid", nodeid)  # noqa: B010 - pytest < 9.2's attribute
    if item.nodeid != nodeid:
        raise RuntimeError(
            f"{item.nodeid}: its xdist group {group!r} did not reach its id, which this pytest "
            "keeps elsewhere: run without -n (make unit XDIST=), or update tests/conftest.py"
        )


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    """The running test, for scripts/why_tests_died.py when Ray takes the run down with it:
    a file per pytest-xdist worker (``-gw0``, ``-gw1``), one without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    name = "ingest-test-current" + (f"-{worker}" if worker else "")
    with open(os.path.join(tempfile.gettempdir(), name), "w") as f:
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
