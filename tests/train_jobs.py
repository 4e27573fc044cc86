"""The training jobs' harness (``train/harness.py``) for the tests and the runner scripts.

The job scripts import it as their sibling module ``harness`` (``python train/lm.py`` puts
``train/`` first on ``sys.path``); importing this module puts ``train/`` on ``sys.path`` the
same way, so a test and a job script loaded by it share one ``harness`` (one ``Job`` class).
"""

from __future__ import annotations

import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "train"
"""The job scripts' folder."""

if str(TRAIN) not in sys.path:
    sys.path.insert(0, str(TRAIN))

import harness  # noqa: E402 - found through the line above

__all__ = ["TRAIN", "harness"]
