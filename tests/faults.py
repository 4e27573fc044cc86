"""Fault injection for the distributed tests: things that kill their own Ray worker once.

A marker file makes each fault fire once per test, whichever process gets there first.
"""

from __future__ import annotations

import hashlib
import os
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ingest.formats.base import ReadContext, RowBatch, Seek, ShardReader
from ingest.formats.parquet import ParquetFormat


def fire_once(marker: str) -> bool:
    """True exactly once per marker path, across processes."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


class Identity:
    """A decode-pool transform that changes nothing (constructed once per actor)."""

    def __call__(self, table: pa.Table) -> pa.Table:
        return table


class KillActorOnce:
    """A decode-pool transform whose actor dies on its ``at``-th block (the third), once.

    ``how`` is ``"os.kill"`` (SIGKILL to its own process) or ``"ray.kill"`` (ray.kill of its
    own actor handle, restart allowed).
    """

    def __init__(self, marker: str, how: str = "os.kill", at: int = 3) -> None:
        self.marker, self.how, self.at, self.calls = marker, how, at, 0

    def __call__(self, table: pa.Table) -> pa.Table:
        self.calls += 1
        if self.calls == self.at and fire_once(self.marker):
            if self.how == "ray.kill":
                import ray

                ray.kill(ray.get_runtime_context().current_actor, no_restart=False)
            os.kill(os.getpid(), signal.SIGKILL)
        return table


class _KillingReader(ShardReader):
    def __init__(self, ctx: ReadContext, inner: ShardReader, marker: str) -> None:
        super().__init__(ctx)
        self.inner, self.marker, self.batches = inner, marker, 0

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        for batch in self.inner.read(start, stop, seek):
            self.batches += 1
            if self.batches == 2 and fire_once(self.marker):
                os.kill(os.getpid(), signal.SIGKILL)  # the read task's worker, mid-read
            yield batch

    def close(self) -> None:
        self.inner.close()


class KillReadTaskParquet(ParquetFormat):
    """Parquet whose read task kills its worker process once, after its first batch.

    Use it as ``format="tests.faults:KillReadTaskParquet"``; the marker is per dataset.
    """

    name = "kill-read-parquet"

    def open(self, ctx: ReadContext) -> ShardReader:
        parent = ctx.shard.url.rsplit("/", 1)[0]
        marker = (
            f"{tempfile.gettempdir()}/ingest-kill-read-{hashlib.md5(parent.encode()).hexdigest()}"
        )
        return _KillingReader(ctx, super().open(ctx), marker)


def _node() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


class _NodeTaggingReader(ShardReader):
    def __init__(self, ctx: ReadContext, inner: ShardReader) -> None:
        super().__init__(ctx)
        self.inner = inner

    def read(self, start: int, stop: int | None, seek: Seek | None) -> Iterator[RowBatch]:
        node = _node()
        for batch in self.inner.read(start, stop, seek):
            column = pa.array([node] * batch.data.num_rows)
            yield RowBatch(batch.row, batch.data.append_column("read_node", column), batch.seek)

    def close(self) -> None:
        self.inner.close()


class NodeTaggingParquet(ParquetFormat):
    """Parquet whose rows say which node's read task read them (``read_node``)."""

    name = "node-tagging-parquet"

    def open(self, ctx: ReadContext) -> ShardReader:
        return _NodeTaggingReader(ctx, super().open(ctx))


class TagDecodeNode:
    """A decode-pool transform that records which node decoded each row (``decode_node``)."""

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.append_column("decode_node", pa.array([_node()] * table.num_rows))


def kill_coordinator(handle: Any, how: str) -> None:
    """Kill a stream's coordinator actor as a crash would: Ray may restart it.

    ``how`` is ``"sigkill"`` (SIGKILL to the actor's process, found in the GCS actor table;
    same machine only) or ``"ray.kill"`` (``ray.kill(handle, no_restart=False)``).
    """
    import ray

    if how == "ray.kill":
        ray.kill(handle, no_restart=False)
        return
    if how != "sigkill":
        raise ValueError(f"how={how!r}: use 'sigkill' or 'ray.kill'")
    from ray._private import state

    actor_id = handle._actor_id.hex()  # type: ignore[attr-defined]
    info = state.actors(actor_id=actor_id)
    os.kill(int(info["Pid"]), signal.SIGKILL)
