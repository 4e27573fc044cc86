"""The exploration notebook runs top to bottom on generated data (as `make test` runs it)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "explore.ipynb"

pytestmark = pytest.mark.system


def test_explore_notebook_runs(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "6 shards, 24,000 rows" in outputs
    assert "duplicates: 0" in outputs
    assert "... the same batch again" in outputs  # a loss spike's steps replayed
    assert "0 of them delivered after the resume" in outputs  # and skipped
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the throughput plot was drawn"
