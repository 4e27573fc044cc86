"""Security (issue 8): a secret given to a stream reaches nothing a run writes; token
authentication stays on in every script and config shipped.

The other security cases have their tests beside the code they guard: pickled tar members
(tests/test_bad_input.py), states parsed as JSON, validated and size-limited
(tests/test_state*.py), owner-only index directories with hashed entry names
(tests/test_index.py), credentials in URLs and queries (tests/test_storage_faults.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import ray

import ingest
from ingest.testing import LoopbackS3, write_dataset
from ingest.tools import cli

ROOT = Path(__file__).resolve().parent.parent
SECRET = "TopS3cret-d41d8cd98f00b204"
ROWS, BATCH = 200, 50


@ray.remote(num_cpus=0)
def _drain(it: Any) -> list[int]:
    return [int(v) for batch in it for v in batch["id"].tolist()]


def _session_logs() -> str:
    """Everything the local Ray session's processes logged so far."""
    from ray._private.worker import global_worker

    node = global_worker.node
    assert node is not None, "a connected Ray session"
    logs = Path(node.get_session_dir_path()) / "logs"
    texts = []
    for path in logs.rglob("*"):
        if path.is_file():
            with contextlib.suppress(OSError):
                texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def test_a_secret_reaches_nothing_a_distributed_run_writes(
    ray_session: None,
    s3: LoopbackS3,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    fs = s3.filesystem()
    data = "s3://ingest-test/security"
    write_dataset(fs, data, "parquet", 4, ROWS)
    # The loopback server takes any key; the secret rides where users put theirs.
    options = {**s3.storage_options(), "key": s3.key, "secret": SECRET}
    in_url = data.replace("s3://", f"s3://{s3.key}:{SECRET}@")
    seen: dict[str, str] = {}
    for name, url, opts in [("options", data, options), ("url", in_url, {})]:
        opts = opts or {"client_kwargs": s3.storage_options()["client_kwargs"]}
        with ingest.RayStream(
            url, columns=["id"], batch_size=BATCH, world_size=2, storage_options=opts
        ) as stream:
            ids = ray.get([_drain.remote(stream.rank_iterator(r)) for r in range(2)], timeout=300)
            assert sorted(i for rank in ids for i in rank) == list(range(4 * ROWS))
            seen[f"{name} state"] = json.dumps(stream.state_dict())
            seen[f"{name} stats"] = repr(stream.stats())
            actors = ray._private.state.actors()  # the GCS actor table: names, classes
            seen[f"{name} actors"] = json.dumps(actors, default=str)
        # A shard that vanished after the listing fails in a reader: its message travels.
        with ingest.RayStream(
            url, columns=["id"], batch_size=BATCH, world_size=1, storage_options=opts
        ) as stream:
            fs.rm(f"{data}/part-00002.parquet")
            with pytest.raises(ingest.IngestError) as err:
                ray.get(_drain.remote(stream.rank_iterator(0)), timeout=300)
            seen[f"{name} error"] = str(err.value)
            write_dataset(fs, data, "parquet", 4, ROWS)  # back for the next round
        assert "part-00002.parquet" in seen[f"{name} error"]
    # The command line, with the secret as an option.
    argv = ["ls", data, "-o", f"client_kwargs.endpoint_url={s3.endpoint}", "--count"]
    assert cli.main([*argv, "-o", f"key={s3.key}", "-o", f"secret={SECRET}"]) == 0
    out = capsys.readouterr()
    assert "part-00000.parquet" in out.out
    seen.update({"ls stdout": out.out, "stderr": out.err, "logging": caplog.text})
    seen["ray logs"] = _session_logs()
    leaks = {where: text[max(0, text.find(SECRET) - 100) :][:200] for where, text in seen.items()}
    leaks = {where: text for where, text in leaks.items() if SECRET in text}
    assert not leaks, leaks


_DISABLED = re.compile(r"RAY_AUTH_MODE\s*[=:]\s*[\"']?(disabled|off|none|false)", re.IGNORECASE)


def test_token_authentication_stays_on_in_everything_shipped(ray_session: None) -> None:
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    assert is_token_auth_enabled(), "the test session itself runs with token authentication"
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    shipped = [p for p in tracked if not p.startswith("tests/")]
    assert any(p.startswith("cluster/") for p in shipped) and "Makefile" in shipped
    turned_off = []
    for path in shipped:
        with contextlib.suppress(UnicodeDecodeError, IsADirectoryError):
            text = (ROOT / path).read_text()
            turned_off += [f"{path}: {m.group(0)}" for m in _DISABLED.finditer(text)]
    assert not turned_off, turned_off
