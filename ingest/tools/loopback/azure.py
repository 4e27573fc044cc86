"""The loopback Azure Blob server: Azurite (npm ``azurite@3``) as a child process on 127.0.0.1.

``make setup`` installs Azurite under ``.venv/azurite`` when ``npm`` is there.
:class:`LoopbackAzure` runs its blob service in memory, without telemetry (it would call
out to the internet) and without the API version check (adlfs's azure-storage-blob speaks
a newer version than Azurite 3 knows; the blob calls it makes are the same). adlfs reaches it
with Azurite's documented development account (:meth:`LoopbackAzure.storage_options`).
"""

from __future__ import annotations

import shutil
import sys
import urllib.request
from pathlib import Path
from typing import Any

import fsspec

from ingest.tools.child import ChildServer

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account and key (public: they only open Azurite)."""


def azurite() -> str | None:
    """The ``azurite-blob`` command: under ``.venv/azurite`` (``make setup``), or on PATH."""
    local = Path(sys.prefix) / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    return shutil.which("azurite-blob")


class LoopbackAzure(ChildServer):
    """An Azure Blob server on 127.0.0.1 for the life of a ``with`` block."""

    name = "azurite-blob"
    hint = "; install it with npm install --prefix .venv/azurite azurite@3 (make setup does)"

    def command(self) -> list[str]:
        exe = azurite()
        if exe is None:
            raise FileNotFoundError(f"azurite-blob is not installed{self.hint}")
        return [
            exe,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.port),
            "--inMemoryPersistence",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ]

    def ping(self) -> None:
        try:
            urllib.request.urlopen(f"{self.endpoint}/{ACCOUNT}?comp=list", timeout=1).close()
        except urllib.error.HTTPError:  # answered (unauthenticated): it is up
            return

    def connection_string(self, key: str = KEY) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={self.endpoint}/{ACCOUNT};"
        )

    def storage_options(self, *, endpoint: str | None = None, key: str = KEY) -> dict[str, Any]:
        """adlfs options that reach this server (or it through a proxy at ``endpoint``)."""
        text = self.connection_string(key)
        if endpoint is not None:
            text = text.replace(self.endpoint, endpoint)
        return {"connection_string": text}

    def filesystem(self) -> fsspec.AbstractFileSystem:
        import adlfs

        return adlfs.AzureBlobFileSystem(**self.storage_options(), skip_instance_cache=True)

    def create_container(self, name: str) -> str:
        """Create container ``name`` (if missing) and return its ``az://`` URL."""
        fs = self.filesystem()
        if not fs.exists(name):
            fs.mkdir(name)
        return f"az://{name}"
