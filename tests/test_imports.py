"""What each process imports: torch (1-2 s and hundreds of MB) only where batches become
tensors. A driver making a RayStream, the coordinator and the reader pool never need it."""

from __future__ import annotations

import subprocess
import sys

import pytest

NO_TORCH = [
    "import ingest; ingest.RayStream; ingest.ReaderPool; ingest.RankOptions",
    "import ingest.distributed.ray_stream",
    "import ingest.distributed.coordinator",
    "import ingest.distributed.pool",
    "import ingest.distributed.index_tasks",
    "import ingest.distributed.rank",
]


@pytest.mark.parametrize("code", NO_TORCH)
def test_the_driver_and_the_ray_actors_do_not_import_torch(code: str) -> None:
    check = f"{code}\nimport sys\nassert 'torch' not in sys.modules, 'torch was imported'"
    done = subprocess.run(
        [sys.executable, "-c", check], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
