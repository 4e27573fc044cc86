"""The Hugging Face ``Trainer`` over an :class:`ingest.Stream`, the public namespace.

``ingest.hf.Trainer`` is ``transformers.Trainer`` with ``train_stream=``; the code is in
:mod:`ingest.integrations.hf_trainer` (``pip install "ingest[hf]"``).
"""

from ingest.integrations.hf_trainer import (
    Trainer,
    state_file,
)

__all__ = [
    "Trainer",
    "state_file",
]
