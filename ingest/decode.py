"""Decode transforms for folder datasets, the public namespace: ``ingest.decode.Images``
and ``ingest.decode.Audio`` (the code is in :mod:`ingest.engine.decoders`)."""

from ingest.engine.decoders import (
    Audio,
    Images,
)

__all__ = [
    "Audio",
    "Images",
]
