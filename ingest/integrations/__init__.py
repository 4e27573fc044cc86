"""Integrations: Ray Train, ``ingest.DataLoader``, the Hugging Face Trainer and metrics."""
