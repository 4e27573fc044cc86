"""Ray Train glue, the public namespace: ``ingest.train.rank_iterator`` and ``report``.

Inside ``train_loop_per_worker`` of a ``TorchTrainer``, :func:`rank_iterator` gives the rank
its iterator (restored from the checkpoint Ray Train resumes from) and :func:`report` saves
the stream's state beside the model in every checkpoint. The code is in
:mod:`ingest.integrations.ray_train`.
"""

from ingest.integrations.ray_train import (
    STATE_FILE,
    load_state,
    rank_iterator,
    report,
)

__all__ = [
    "STATE_FILE",
    "load_state",
    "rank_iterator",
    "report",
]
