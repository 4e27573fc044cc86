"""Helpers for tests, demos and benchmarks: a loopback S3 server, a fault-injecting proxy
in front of it, and generated datasets.

- :mod:`~ingest.tools.loopback.s3`: :class:`LoopbackS3` runs ``moto_server``
  (``pip install "moto[server]"``) as a child process bound to 127.0.0.1, so clients talk
  real S3 over HTTP and the server does not share their GIL.
- :mod:`~ingest.tools.loopback.fault_proxy`: :class:`FaultProxy` sits between a client and
  that server and misbehaves as storage does (:class:`Faults`), seeded and bounded, so that
  a failure seen once can be reproduced.
- :mod:`~ingest.tools.loopback.shards`: generated shards in every generated format
  (:func:`make_table`, :func:`encode`, :func:`write_dataset`...) and :class:`Store`.
- :mod:`~ingest.tools.loopback.folders`: generated ImageFolder and AudioFolder datasets.

Nothing here reaches beyond the loopback interface.
"""

from ingest.tools.child import free_port
from ingest.tools.loopback.fault_proxy import FAULT_KINDS, FaultProxy, Faults
from ingest.tools.loopback.folders import write_audio_folder, write_image_folder
from ingest.tools.loopback.s3 import LoopbackS3, credential_checking_s3
from ingest.tools.loopback.shards import (
    TOKENS,
    Store,
    date_time_table,
    encode,
    make_table,
    tar_link,
    tar_of,
    write_dataset,
    write_large_rows,
)

__all__ = [
    "FAULT_KINDS",
    "TOKENS",
    "FaultProxy",
    "Faults",
    "LoopbackS3",
    "Store",
    "credential_checking_s3",
    "date_time_table",
    "encode",
    "free_port",
    "make_table",
    "tar_link",
    "tar_of",
    "write_audio_folder",
    "write_dataset",
    "write_image_folder",
    "write_large_rows",
]
