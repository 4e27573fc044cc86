"""Example jobs: ingest.RayStream under Ray Train's TorchTrainer (CPU or GPU, unchanged).

    python -m ingest.examples.lm [--config PATH] [KEY=VALUE ...]
    python -m ingest.examples.image [--config PATH] [KEY=VALUE ...]

Each job's default config ships with the package (``ingest/examples/configs/``), so
``--config`` is needed only to use another file; ``KEY=VALUE`` overrides apply either way.
"""
