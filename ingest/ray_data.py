"""Ray Data in, the public namespace: ``ingest.ray_data.read(url, ...)`` returns a
``ray.data.Dataset`` over this project's listing, formats and stores. The code is in
:mod:`ingest.integrations.ray_data`."""

from ingest.integrations.ray_data import read

__all__ = ["read"]
