"""The state's ``dataset`` part: what was listed, as plain records or packed (version 3).
Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ingest.core.errors import StateError
from ingest.core.state.checks import FIX, STATE_VERSION, checked_int, checked_list
from ingest.core.state.packed import PackedFingerprint, pack_listing, unpack_listing
from ingest.core.state.shards import ShardColumns, ShardRecord, ShardTable, digest, row_counts

PACK_FROM_SHARDS = 10_000
"""Listings of this many shards or more are written packed (version 3)."""


@dataclass(slots=True)
class DatasetState:
    """What was listed: the source URLs and every shard's identity (the fingerprint).

    A state read from the packed form (version 3) keeps each shard's URL and row count; its
    sizes and versions are in ``fingerprint`` (the records say 0 and ""). Its JSON is made
    once and kept (a listing of a million shards takes a second to write): change
    ``shards`` only through a new object.
    """

    sources: list[str]
    shards: Sequence[ShardRecord]
    """A list, or a :class:`ShardTable` (a listing's columns)."""
    fingerprint: PackedFingerprint | None = None
    classes: tuple[str, ...] = ()
    """Folder datasets: the class names the ``label`` indices stand for (``"classes"`` in
    the JSON, absent when empty)."""
    tables: tuple[tuple[str, int], ...] = ()
    """Delta tables: each root's URL with a version listed, sorted (``"tables"`` in the
    JSON, an object of each root's versions, absent when empty): the rest of the state's
    epoch is read at them (two where it reads rows carried from files a compaction
    replaced beside the newest version's)."""
    formats: tuple[str, ...] = ()
    """The formats the shards were read as, sorted (``"formats"`` in the JSON; absent in a
    state saved before they were recorded): rows are numbered per format (a CSV file's
    header is no row, a text file's first line is one)."""
    _json: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _counts: npt.NDArray[np.int64] | None = field(default=None, repr=False, compare=False)

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        """Every shard's row count, -1 where unknown (read-only; kept, like the JSON)."""
        if self._counts is None and isinstance(self.shards, ShardTable):
            self._counts = self.shards.counts
        if self._counts is None:
            counts = row_counts(self.shards)
            counts.setflags(write=False)
            self._counts = counts
        return self._counts

    def with_counts_of(self, other: DatasetState) -> DatasetState:
        """These shards with the row counts ``other`` knew where these say none (``other``
        is a state's listing that this one matched: the same shards, unchanged). A stream
        of one rank lists without counting, so a state it loaded and saved again before a
        batch said "unknown" for counts the state knew, and the next load at several ranks
        counted every shard again: a whole read of an unindexed dataset."""
        mine = self.counts
        if not (mine < 0).any() or not (other.counts >= 0).any():
            return self
        theirs = zip(other.shards, other.counts.tolist(), strict=True)
        known = {r.url: n for r, n in theirs if n >= 0}
        records = [
            r._replace(rows=known[r.url]) if n < 0 and r.url in known else r
            for r, n in zip(self.shards, mine.tolist(), strict=True)
        ]
        return DatasetState(
            list(self.sources),
            records,
            classes=self.classes,
            tables=self.tables,
            formats=self.formats,
        )

    @property
    def packed(self) -> bool:
        """Whether the JSON is the packed form (version 3)."""
        return self.fingerprint is not None or len(self.shards) >= PACK_FROM_SHARDS

    def to_json(self) -> dict[str, Any]:
        if self._json is None:
            made: dict[str, Any]
            if self.packed:
                columns = ShardColumns.of(self.shards)
                if self.fingerprint is None:
                    self.fingerprint = PackedFingerprint.of_columns(columns)
                made = {
                    "digest": self.fingerprint.digest,
                    "packed": pack_listing(columns.urls, self.counts, self.fingerprint),
                }
            else:
                made = {
                    "digest": digest(self.shards),
                    "shards": [s.to_json() for s in self.shards],
                }
            self._json = {"sources": list(self.sources), **made}
            if self.classes:
                self._json["classes"] = list(self.classes)
            if self.tables:
                self._json["tables"] = {u: list(v) for u, v in versions_of(self.tables).items()}
            if self.formats:
                self._json["formats"] = list(self.formats)
        return dict(self._json)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int = STATE_VERSION) -> DatasetState:
        sources = [str(s) for s in checked_list(data.get("sources", []), "dataset.sources")]
        classes = tuple(_classes(data.get("classes", [])))
        tables = _tables(data.get("tables", {}))
        formats = tuple(str(f) for f in checked_list(data.get("formats", []), "dataset.formats"))
        if version >= 3 and "packed" in data:
            shards, fingerprint = unpack_listing(data["packed"], data.get("digest"))
            return cls(sources, shards, fingerprint, classes, tables, formats)
        shards = []
        for n, entry in enumerate(checked_list(data["shards"], "dataset.shards")):
            if not isinstance(entry, list) or len(entry) != 4:
                raise StateError(
                    f"dataset.shards[{n}] is {entry!r}, not [url, size, version, rows]"
                )
            url, size, version_, rows = entry
            shards.append(
                ShardRecord(
                    str(url),
                    checked_int(size, f"dataset.shards[{n}] size"),
                    str(version_),
                    None if rows is None else checked_int(rows, f"dataset.shards[{n}] rows"),
                )
            )
        if data.get("digest") not in (None, digest(shards)):
            raise StateError(
                "dataset.digest does not match dataset.shards: the state was "
                "edited or corrupted; save it again"
            )
        return cls(sources, shards, None, classes, tables, formats)


def versions_of(tables: Iterable[tuple[str, int]]) -> dict[str, tuple[int, ...]]:
    """``(root URL, version)`` pairs (:attr:`DatasetState.tables`, a listing's) as each
    root's versions, sorted."""
    out: dict[str, set[int]] = {}
    for url, version in tables:
        out.setdefault(url, set()).add(version)
    return {url: tuple(sorted(v)) for url, v in sorted(out.items())}


def _tables(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(u, str) and isinstance(v, list) and v for u, v in value.items()
    ):
        raise StateError(
            f"dataset.tables is {value!r:.80}: not an object of Delta tables' URLs, each with "
            f"a list of versions; the state was edited or corrupted; {FIX}"
        )
    return tuple(
        sorted(
            (u, checked_int(v, f"dataset.tables[{u!r}]"))
            for u, versions in value.items()
            for v in versions
        )
    )


def _classes(value: Any) -> list[str]:
    names = checked_list(value, "dataset.classes")
    if not all(isinstance(n, str) for n in names) or names != sorted(set(names)):
        raise StateError(
            f"dataset.classes is {names[:5]!r}...: not a sorted list of distinct class names; "
            f"the state was edited or corrupted; {FIX}"
        )
    return names
