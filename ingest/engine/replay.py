"""Replay (issue 35 item 2): the batches of some steps again, as the ranks got them, for a
debugging session. Reads only those rows.

The provenance log (:mod:`ingest.engine.provenance`) gives each rank's step as runs of rows
in the batch's order. Replay reads every shard named once, only the rows named (the runs of
a shard merged into spans, read as a stream's lane reads spans: coalesced ranges, seeks),
puts each step's rows back in its order and runs the stream's transform on them, as the
rank's feed ran it on that batch: stages are batch-local (:mod:`ingest.engine.stage`), so a
deterministic chain makes the same outputs. A batch a transform changed since the run is
replayed as the transform is now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ingest.core.errors import ConfigError, IngestError
from ingest.core.intervals import IntervalSet
from ingest.core.packing import Packed, Piece
from ingest.engine.convert import Batch, to_torch
from ingest.engine.grouping import Grouping
from ingest.engine.pack import packed_torch, pad_of, tokens_of
from ingest.formats import open_reader
from ingest.formats.base import BadRows, ReadOptions
from ingest.planner.catalog import Listing
from ingest.storage.sources import Source


@dataclass(frozen=True, slots=True)
class Replayed:
    """One rank's batch of one step, read again.

    Attributes:
        step: The step.
        rank: The rank that got it.
        table: Its rows as the transform made them (Arrow), before conversion to torch.
    """

    step: int
    rank: int
    table: pa.Table


def replay(
    log: pa.Table,
    listing: Listing,
    source: Source,
    read: ReadOptions,
    columns: tuple[str, ...] | None,
    transform: Callable[[pa.Table], pa.Table] | None,
) -> Iterator[Replayed]:
    """The batches ``log`` (:meth:`ingest.engine.provenance.ProvenanceLog.which`) names, by
    step then rank, read from ``listing``'s shards.

    Raises:
        IngestError: If a URL of the log is not in the listing (the source changed), or a
            row no longer reads.
    """
    if not log.num_rows:
        return
    by_url = {s.url: i for i, s in enumerate(listing.shards)}
    records = log.to_pylist()
    wanted: dict[str, IntervalSet] = {}
    for r in records:
        wanted.setdefault(r["url"], IntervalSet()).add(r["start"], r["stop"])
    rows: dict[str, list[tuple[int, int, pa.Table]]] = {}
    for url, spans in wanted.items():
        index = by_url.get(url)
        if index is None:
            raise IngestError(
                f"{url}: the provenance log names it, and the source's listing has no such "
                "shard now; replay with the run's source (the shard was moved or deleted)"
            )
        rows[url] = list(_read(listing.context(index, source, read, columns), list(spans)))
    key = None
    parts: list[pa.Table] = []
    for r in records:
        if (r["step"], r["rank"]) != key:
            if key is not None:
                yield _batch(key, parts, transform)
            key, parts = (r["step"], r["rank"]), []
        parts.append(_rows_of(rows[r["url"]], r["url"], r["start"], r["stop"]))
    if key is not None:
        yield _batch(key, parts, transform)


def replayed(
    log: pa.Table,
    listing: Listing,
    source: Source,
    read: ReadOptions,
    columns: tuple[str, ...] | None,
    transform: Callable[[pa.Table], pa.Table] | None,
    pack: Grouping | None,
) -> Iterator[tuple[int, int, Batch]]:
    """The batches ``log`` names as torch tensors, ``(step, rank, batch)``: a plain stream's
    (:func:`replay`), or a packing stream's (:func:`replay_packed`, its log holds pieces).

    Raises:
        ConfigError: If the log is a packing stream's and ``pack`` is None.
    """
    if "sequence" not in log.column_names:
        for got in replay(log, listing, source, read, columns, transform):
            yield got.step, got.rank, to_torch(got.table)
        return
    if pack is None:
        raise ConfigError(
            "the log is a packing stream's (pack=): replay it with a stream made with the "
            "run's pack= and transform="
        )
    for step, rank, arrays in replay_packed(log, listing, source, read, columns, transform, pack):
        yield step, rank, packed_torch(arrays)


def replay_packed(
    log: pa.Table,
    listing: Listing,
    source: Source,
    read: ReadOptions,
    columns: tuple[str, ...] | None,
    transform: Callable[[pa.Table], pa.Table] | None,
    pack: Grouping,
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """A packing stream's batches that ``log`` names (its pieces: :meth:`ingest.engine.
    provenance.ProvenanceLog.which` of a log kept with ``pack=``), as ``(step, rank,
    arrays)``: each step's documents read and tokenized again (``transform``, the stream's
    with :data:`~ingest.engine.pack.ORIGIN`), the pieces' tokens put back into their
    sequences in the batch's order, and the sequences collated as the rank collated them.

    Raises:
        IngestError: As :func:`replay`, or if a document has fewer tokens now than a piece
            names (the data or the tokenizer changed since the run).
    """
    if not log.num_rows:
        return
    step = log["step"].to_numpy()
    rank = log["rank"].to_numpy()
    cuts = np.flatnonzero((np.diff(step) != 0) | (np.diff(rank) != 0)) + 1
    starts = [0, *cuts.tolist()]
    stops = [*cuts.tolist(), log.num_rows]
    pad = pack.pad_id
    for a, b in zip(starts, stops, strict=True):
        pieces = log.slice(a, b - a).to_pylist()
        docs = list(dict.fromkeys((p["url"], p["start"]) for p in pieces))  # in batch order
        rows = pa.table(
            {
                "step": [pieces[0]["step"]] * len(docs),
                "rank": [pieces[0]["rank"]] * len(docs),
                "url": [u for u, _ in docs],
                "start": [r for _, r in docs],
                "stop": [r + 1 for _, r in docs],
            }
        )
        (got,) = replay(rows, listing, source, read, columns, transform)
        if pad is None:
            pad = pad_of(pack, got.table)
        lengths, flat = tokens_of(got.table, pack)
        ends = np.cumsum(lengths)
        index = {doc: k for k, doc in enumerate(docs)}
        sequences: dict[int, Packed] = {}
        for p in pieces:
            k = index[(p["url"], p["start"])]
            first, n = int(ends[k] - lengths[k]), int(lengths[k])
            start, stop = p["token_start"], p["token_stop"]
            if stop > n:
                raise IngestError(
                    f"{p['url']} row {p['start']} has {n} tokens now, and step {p['step']} "
                    f"packed its tokens [{start}, {stop}): the data or the tokenizer changed "
                    "since the run; replay with the same ones"
                )
            seq = sequences.setdefault(p["sequence"], Packed())
            if start == stop:  # a document without a token left: a piece, no span (as packed)
                seq.pieces.append(Piece(k, start, stop, stop == n))
            else:
                seq.put(k, flat[first + start : first + stop], start, stop == n)
        batch = pack.collate([sequences[s] for s in sorted(sequences)], pad or 0)
        yield pieces[0]["step"], pieces[0]["rank"], dict(batch.arrays)


def _batch(
    key: tuple[int, int], parts: list[pa.Table], transform: Callable[[pa.Table], Any] | None
) -> Replayed:
    table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    table = table.combine_chunks()
    return Replayed(key[0], key[1], transform(table) if transform is not None else table)


def _read(ctx: Any, spans: list[tuple[int, int]]) -> Iterator[tuple[int, int, pa.Table]]:
    """``(start, stop, rows)`` of each span of one shard, the shard opened once."""
    got: dict[int, list[pa.RecordBatch]] = {}
    with open_reader(ctx) as reader:
        for j, batch in reader.read_spans(spans, None):
            if isinstance(batch, BadRows):
                raise IngestError(
                    f"{ctx.shard.url} rows [{batch.row}, {batch.stop}) do not read now "
                    f"({batch.error}); they were quarantined in the run, or the shard changed"
                )
            got.setdefault(j, []).append(batch.data)
    for j, (start, stop) in enumerate(spans):
        parts = got.get(j, [])
        table = pa.Table.from_batches(parts) if parts else None
        if table is None or table.num_rows != stop - start:
            raise IngestError(
                f"{ctx.shard.url} rows [{start}, {stop}): read "
                f"{0 if table is None else table.num_rows} rows; the shard changed since the run"
            )
        yield start, stop, table


def _rows_of(spans: list[tuple[int, int, pa.Table]], url: str, start: int, stop: int) -> pa.Table:
    for a, b, table in spans:
        if a <= start and stop <= b:
            return table.slice(start - a, stop - start)
    raise IngestError(f"{url} rows [{start}, {stop}) were not read")  # pragma: no cover


__all__ = ["Replayed", "replay", "replay_packed", "replayed"]
