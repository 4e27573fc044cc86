"""Tools: the ``ingest`` command, ``ingest bench`` and the loopback helpers for tests."""
