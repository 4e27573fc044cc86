"""`ingest bench` with the peers that read their own format: Mosaic Streaming and LitData.

Both run end to end on tiny data (conversion with their own writer, 2 ranks of 2 workers,
shuffle on, resume at 45%). `make setup` installs them (`make peers`).
"""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from pathlib import Path

import pytest

from ingest.tools.bench import main
from ingest.tools.bench.contenders import CONTENDERS
from ingest.tools.bench.report import FIGURES

SHARDS, ROWS = 4, 256
PEERS = ("mosaic", "litdata")
# Both peers promise the rest of the epoch exactly once after a resume: Mosaic's state is the
# global sample offset into a deterministic order (every rank and worker recomputes it),
# LitData's the samples each worker has yielded of its chunks. Whether a run kept the promise
# is the peer's behaviour, which the bench measures and reports (with the counts and the
# states loaded); this test checks that it was measured. In CI, one run of about twenty saw
# Mosaic's resume give 84 of 1,024 ids twice and miss 84, from states alike on both ranks and
# right for the checkpoint (448 samples seen); ten runs here, four of them beside three
# busy loops, did not repeat it. The bench's own check is tested on a contender whose resume
# is wrong by construction (test_bench::test_a_resume_that_delivers_rows_again_is_reported_...).
MOSAIC_NAME = re.compile(r"\d{6}_\w+")
"""How Mosaic names its shared memory segments (``000042_barrier``) and its file locks
(``000042_barrier_filelock``, in the temporary directory): nothing else here does."""


def mosaic_leftovers() -> set[str]:
    """Mosaic's shared memory segments and its file locks in the temporary directory."""
    places = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    return {
        str(p) for place in places if place.is_dir() for p in place.iterdir()
        if MOSAIC_NAME.fullmatch(p.name)
    }  # fmt: skip


# Two conversions each, then epochs through worker processes that import torch: minutes on
# 2 busy cores.
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("ray_session")
def test_peers_convert_read_and_resume(tmp_path, capsys):
    for name in PEERS:
        assert not CONTENDERS[name].missing(), f"{name}: run `make peers`"
    out = tmp_path / "bench.json"
    argv = [
        *("--contenders", ",".join(PEERS), "--shards", str(SHARDS)),
        *("--rows", str(ROWS), "--row-group", "64", "--batch-size", "32"),
        *("--ranks", "2", "--workers", "2", "--epochs", "2", "--labels", "2"),
        *("--shuffle-window", "128", "--json", str(out), "--no-progress"),
    ]
    before = mosaic_leftovers()
    assert main(argv) == 0
    # Its rank processes were killed (ray.kill) before their exit handlers ran: every run
    # left 19 segments in /dev/shm (the machine's memory until a reboot) and 4 file locks.
    left = sorted(mosaic_leftovers() - before)
    assert not left, f"the bench left Mosaic's shared memory or file locks: {left}"

    doc = json.loads(out.read_text())
    by_name = {c["name"]: c for c in doc["contenders"]}
    for name in PEERS:
        report = by_name[name]
        assert report["status"] == "ok", report["reason"]
        figures = report["figures"]
        assert set(figures) == {f.key for f in FIGURES}
        assert figures["convert_s"] > 0 and figures["convert_cpu_s"] > 0
        assert report["ranks"] == 2
        assert [e["rows"] for e in report["epochs"]] == [SHARDS * ROWS] * 2
        assert figures["exactly_once"] is True
        if name == "litdata":  # its obstore refuses http://: chunks on local disk, said so
            assert figures["epoch1_requests"] == 0
            assert "local disk" in report["notes"]["epoch1_requests"]
        else:
            assert figures["epoch1_requests"] > 0, f"{name} did not read through the S3 proxy"
        assert figures["resume_first_batch_s"] > 0, report["notes"]
        once = figures["resume_exactly_once"]
        assert isinstance(once, bool), (name, report["notes"])
        if not once:
            note = report["notes"]["resume_exactly_once"]
            assert "duplicated" in note and "the states loaded" in note, note
            warnings.warn(f"{name}'s own resume was not exactly once: {note}", stacklevel=1)
        # LitData mixes items inside a chunk only: on label-sorted shards (a chunk each)
        # every batch holds one label, quality 0.
        assert 0 <= figures["shuffle_quality"] <= 1.05

    printed = capsys.readouterr().out
    assert "Mosaic Streaming (MDS)" in printed and "LitData (optimize)" in printed
    assert "convert s" in printed


def test_a_missing_peer_is_skipped_with_the_install_command(monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec

    def without_streaming(name: str, *args: object):
        return None if name == "streaming" else find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", without_streaming)
    assert CONTENDERS["mosaic"].missing() == ["streaming"]
    assert "make peers" in (CONTENDERS["mosaic"].install or "")
