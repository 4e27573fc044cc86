"""The loopback S3 server: ``moto_server`` as a child process on 127.0.0.1.

:class:`LoopbackS3` runs ``moto_server`` (``pip install "moto[server]"``) bound to 127.0.0.1,
so clients talk real S3 over HTTP and the server does not share their GIL;
:func:`credential_checking_s3` runs one that checks credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import fsspec

from ingest.tools.child import ChildServer
from ingest.tools.loopback.shards import encode, make_table


class LoopbackS3(ChildServer):
    """An S3-protocol server on 127.0.0.1 for the life of a ``with`` block.

    Args:
        port: Port to bind; 0 picks a free one.
        env: Extra environment for the server (e.g. ``INITIAL_NO_AUTH_ACTION_COUNT`` to turn
            on moto's credential checks).
        start_timeout_s: Longest wait for the server to answer.
    """

    name = "moto_server"
    hint = '; install it with pip install "moto[server]"'
    key = "testing"
    secret = "testing-secret"

    def command(self) -> list[str]:
        exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        return [*cmd, "-H", "127.0.0.1", "-p", str(self.port)]

    def ping(self) -> None:
        urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()

    def storage_options(
        self, key: str | None = None, secret: str | None = None, *, endpoint: str | None = None
    ) -> dict[str, Any]:
        """s3fs options that reach this server, or reach it through a proxy at ``endpoint``
        (a :class:`FaultProxy`'s)."""
        return {
            "key": key or self.key,
            "secret": secret or self.secret,
            "client_kwargs": {
                "endpoint_url": endpoint or self.endpoint,
                "region_name": "us-east-1",
            },
            "skip_instance_cache": True,
        }

    def filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("s3", **self.storage_options())

    def create_bucket(self, name: str, key: str | None = None, secret: str | None = None) -> str:
        """Create bucket ``name`` (if missing) and return its ``s3://`` URL."""
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=key or self.key,
            aws_secret_access_key=secret or self.secret,
        )
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def reset(self) -> None:
        """Delete every bucket and object (moto's reset endpoint)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()


@contextlib.contextmanager
def credential_checking_s3() -> Iterator[tuple[LoopbackS3, dict[str, str]]]:
    """A loopback S3 server that checks credentials, with bucket ``private`` holding one
    10-row Parquet shard ``a.parquet``, for the life of a ``with`` block.

    moto lets the first three requests through unchecked (``INITIAL_NO_AUTH_ACTION_COUNT``):
    they make an IAM user allowed everything, and its access key. Every later request needs
    that key, the bucket and the shard's included.

    Yields:
        The server and the user's credentials, ``{"key": ..., "secret": ...}``.
    """
    import boto3

    with LoopbackS3(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"}) as server:
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        allow_all = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        iam.put_user_policy(
            UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(allow_all)
        )
        creds = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
        server.create_bucket("private", creds["key"], creds["secret"])
        fs = fsspec.filesystem("s3", **server.storage_options(creds["key"], creds["secret"]))
        fs.pipe("private/a.parquet", encode(make_table(0, 10), "parquet"))
        yield server, creds


__all__ = [
    "LoopbackS3",
    "credential_checking_s3",
]
