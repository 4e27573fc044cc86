"""Integrations: Ray Train, ``ingest.DataLoader``, the Hugging Face Trainer, and the harness
of the training jobs in ``train/`` (the metrics are the Ray service's: ingest.distributed)."""
