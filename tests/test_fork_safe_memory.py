"""Arrow allocates with a fork-safe allocator once ingest reads (ingest.formats.memory).

pyarrow 26's default allocator, its bundled mimalloc, has no fork handlers: a process that
forks while one of its threads is inside mimalloc (ingest's read-ahead and lane threads
allocate Arrow buffers all the time) leaves the child holding that lock, and the child's
first Arrow allocation waits forever. Seen as DataLoader workers stuck in
``mi_page_map_set_range_prim`` -> ``pthread_mutex_lock`` under ``iter_batches``: the
abandoned-loop script of ``test_loader_workers`` hung in 7 of about 150 runs under load,
and in none of 75 with jemalloc. jemalloc and glibc's malloc take their locks around a fork.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = "import ingest.formats.base, pyarrow as pa; print(pa.default_memory_pool().backend_name)"


def backend(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_reading_switches_arrow_to_a_fork_safe_allocator() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    assert backend(env) in ("jemalloc", "system")


@pytest.mark.parametrize("chosen", ["mimalloc", "system"])
def test_an_allocator_the_user_chose_is_kept(chosen: str) -> None:
    assert backend({**os.environ, "ARROW_DEFAULT_MEMORY_POOL": chosen}) == chosen
