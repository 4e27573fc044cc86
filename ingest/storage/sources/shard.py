"""What a listing gives (:class:`Shard`) and what it asks of its caller: which files are data
(:class:`FormatResolver`) and where listings that never change are kept
(:class:`ListingStore`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ingest.storage.sources.deletion_vectors import DeletionVector
from ingest.storage.sources.partitions import Partition


@dataclass(frozen=True, slots=True)
class Shard:
    """One file of the dataset, as one listing saw it.

    Attributes:
        url: Full URL with protocol (``s3://bucket/a.parquet``, ``file:///data/a.jsonl``).
        size: Size in bytes.
        version: ETag (object stores) or modification time (file systems): what tells a
            changed object from the one a state was saved against. Empty if the store gives
            neither.
        format: Registry name of the format that reads it.
        members: The files of a work unit of a folder dataset (:mod:`ingest.formats.folder`),
            each one row; empty for a file. A unit's size is theirs added up, its version a
            hash of theirs, and its URL its first member's with ``+N`` (the N after it).
        labels: The class index of each member (folder datasets).
        partition: The ``key=value`` directories of its path below the listed root, in
            order (:mod:`ingest.storage.sources.partitions`): hive-style partitions, which
            the stream reads as columns. Empty for a file named explicitly.
        metadata: The metadata files (``metadata.jsonl``...) that give a folder unit's
            members their columns by ``file_name``, each member's the nearest above it
            (:mod:`ingest.formats.folder`); empty without.
        deletions: A Delta table's file's deletion vector: rows of it the table's version
            deleted, never read (:mod:`ingest.storage.sources.deletion_vectors`; its
            ``path`` a URL); None: none.
    """

    url: str
    size: int
    version: str
    format: str
    members: tuple[Shard, ...] = ()
    labels: tuple[int, ...] = ()
    partition: Partition = ()
    metadata: tuple[Shard, ...] = ()
    deletions: DeletionVector | None = None

    @property
    def rows_version(self) -> str:
        """What tells its rows from those of another listing of it: its ``version``, and a
        digest of its deletion vector's id where it has one (the same file keeps other rows
        under another; an inline vector's id is the vector, kilobytes, and a state records
        this of every shard)."""
        if self.deletions is None:
            return self.version
        digest = hashlib.sha256(self.deletions.unique_id.encode()).hexdigest()[:16]
        return f"{self.version} deletions {digest}"


class FormatResolver(Protocol):
    """Which listed files are data, and the name of the format that reads each one.

    A :class:`Source` lists files and knows no formats; the format registry implements this
    (:data:`ingest.formats.FORMAT_RESOLVER`) and is handed to :meth:`Source.list_shards`.
    """

    def format_of(self, path: str, *, chosen: str | None, explicit: bool) -> str | None:
        """The name of the format that reads ``path``, or None to leave the file out.

        Args:
            path: A listed file.
            chosen: The format the user named for every file (checked, then used), or None
                to tell it from the file's name.
            explicit: Whether the user named this very file rather than a glob or a
                directory; a file that no format reads is then an error, not left out.

        Raises:
            ConfigError: If ``chosen`` names no format, or ``explicit`` and no format reads
                the file.
        """
        ...

    def describe(self) -> str:
        """Which files it takes as data, for the fix of a listing that matched none."""
        ...

    def unread(self, paths: Sequence[str], listed: Sequence[str]) -> str | None:
        """What to tell the user of ``paths``, the files of a listing that no format reads
        unless named, beside data files of the formats ``listed`` (none: the listing found
        no data): which format reads them (``format="imagefolder"``), where they are a
        folder dataset's and nothing but documents was listed; None to say nothing."""
        ...


class ListingStore(Protocol):
    """Keeps listings that never change (an ``hf://`` glob at a commit) across jobs; the
    shard index implements it (:class:`ingest.IndexStore`)."""

    def get_listing(self, key: str) -> list[tuple[str, int, str]] | None:
        """The files ``(name, size, version)`` stored under ``key``, or None."""
        ...

    def put_listing(self, key: str, files: Sequence[tuple[str, int, str]]) -> None:
        """Store the files of the listing ``key``."""
        ...
