"""Integrations: Ray Train, ``ingest.DataLoader``, the Hugging Face Trainer and Ray Data (the
metrics are the Ray service's: ingest.distributed; the training jobs' harness is not part of
the library: ``train/harness.py``)."""
