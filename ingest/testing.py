"""Helpers for tests, demos and benchmarks, the public namespace: a loopback S3 server, a
fault-injecting proxy and generated datasets (the code is in :mod:`ingest.tools.loopback`)."""

from ingest.tools.loopback import (
    FAULT_KINDS,
    TOKENS,
    FaultProxy,
    Faults,
    LoopbackS3,
    Store,
    credential_checking_s3,
    date_time_table,
    encode,
    free_port,
    make_table,
    tar_link,
    tar_of,
    write_audio_folder,
    write_dataset,
    write_image_folder,
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
