"""The loopback GCS server: ``gcp-storage-emulator`` as a child process on 127.0.0.1.

:class:`LoopbackGCS` runs the emulator (``pip install gcp-storage-emulator``, in the
``[dev]`` extra) in memory; gcsfs reaches it with ``endpoint_url`` and anonymous
credentials (:meth:`LoopbackGCS.storage_options`). With an ``endpoint_url``, a
:class:`~ingest.storage.sources.Source` uses gcsfs's core filesystem, which does not ask the
bucket's layout over gRPC (an emulator does not serve it).
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from typing import Any

import fsspec

from ingest.tools.child import ChildServer


class LoopbackGCS(ChildServer):
    """A GCS JSON-API server on 127.0.0.1 for the life of a ``with`` block."""

    name = "gcp-storage-emulator"
    hint = "; install it with pip install gcp-storage-emulator"

    def command(self) -> list[str]:
        exe = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable))
        cmd = [exe] if exe else [sys.executable, "-m", "gcp_storage_emulator"]
        return [*cmd, "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory"]

    def ping(self) -> None:
        urllib.request.urlopen(f"{self.endpoint}/storage/v1/b?project=test", timeout=1).close()

    def storage_options(self) -> dict[str, Any]:
        """gcsfs options that reach this server (anonymous: the emulator checks none)."""
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "test"}

    def filesystem(self) -> fsspec.AbstractFileSystem:
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(**self.storage_options(), skip_instance_cache=True)

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (if missing) and return its ``gs://`` URL."""
        fs = self.filesystem()
        if not fs.exists(name):
            fs.mkdir(name)
        return f"gs://{name}"
