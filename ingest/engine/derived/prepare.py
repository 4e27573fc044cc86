"""Filling the derived cache ahead (issue 34, item 4): :func:`prepare` runs a stage chain over
every unit of a source and keeps the copies that a stream with the same transform and
``derived=`` reads, so that it runs no stage (``ingest prepare URL --transform ...``).

What a unit is. A stream's lanes read its epoch's spans, and a span read whole is derived and
kept under its own key (:mod:`ingest.engine.derived.reading`). The spans are the plan's work
units (:func:`ingest.core.plan.epoch_units`: a Parquet row group; a whole shard for formats
without blocks), the same in every epoch and for every seed, shuffle window and lane count,
except where a rank's share or the epoch's remainder ends inside one: :func:`ingest.core.
assign.split` cuts that unit in two, and each piece is a key of its own (the remainder's
second piece is read in the next epoch, with the rows carried into it). So prepare keeps a
copy of every plan unit, and a stream derives at read time the pieces of at most one cut unit
per rank and epoch (none when every share ends on a unit's end: steps of whole units, and a
row count that fills the last step on every rank).

A shard whose footer has no row count (JSONL, CSV, tar) is one unit to its end: one key,
whether the stream that reads it knows the count (several ranks: :class:`ingest.RayStream`,
an :class:`ingest.DataLoader` with workers) or not (:class:`ingest.Stream`).

The units run through a :data:`~ingest.engine.derived.units.Deriver` (:mod:`.units`):
:func:`~ingest.engine.derived.units.local_deriver` in threads of this process, or
:func:`ingest.distributed.prepare_tasks.ray_deriver` in Ray tasks on the pool's nodes.
"""

from __future__ import annotations

import importlib
import inspect
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from tqdm.auto import tqdm

from ingest.core.assign import TO_END
from ingest.core.errors import ConfigError, IngestError, redact
from ingest.core.plan import epoch_units
from ingest.engine.derived.keys import DerivedWarning, chain_fingerprint
from ingest.engine.derived.reading import Deriving
from ingest.engine.derived.store import DerivedConfig
from ingest.engine.derived.units import Derivation, Deriver, ShardJob, UnitJob, local_deriver
from ingest.engine.options import derived_config
from ingest.engine.spec import StreamSpec
from ingest.engine.transform import Transform, build_transform
from ingest.formats.base import ReadContext, ReadOptions
from ingest.planner.catalog import Listing
from ingest.storage.sources import Source, URLs

OnError = Literal["raise", "skip"]


class PrepareError(IngestError):
    """A unit could not be derived (its rows did not read, or the chain raised on them) and
    ``on_error="raise"``. Its message names the shard's URL, its credentials left out."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


@dataclass(frozen=True, slots=True, kw_only=True)
class PrepareReport:
    """What :func:`prepare` did.

    Attributes:
        units: Units of the source (every one was looked at).
        derived: Units derived and written now.
        present: Units whose copy was there already (not read).
        unkept: Units derived but not written: another writer got there first, or a node's
            directory had no room.
        failed: Units that could not be derived (see ``failures``); a stream runs the chain
            on their batches, as without the cache.
        rows: Input rows the chain ran on.
        bytes_written: Bytes of the copies written (framed, compressed).
        seconds: Wall time, listing included.
        failures: Each failed unit and why.
    """

    units: int
    derived: int
    present: int
    unkept: int
    failed: int
    rows: int
    bytes_written: int
    seconds: float
    failures: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: what was written, what was there, what failed."""
        unkept = f", {self.unkept} not kept" if self.unkept else ""
        return (
            f"{self.units} units: {self.derived} derived ({self.rows:,} rows), "
            f"{self.present} already there, {self.failed} failed{unkept}; "
            f"{self.bytes_written:,} bytes written in {self.seconds:.1f} s"
        )


def prepare(
    source: URLs,
    transform: Transform,
    derived: DerivedConfig | str,
    *,
    format: str | None = None,
    columns: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    read: ReadOptions | None = None,
    deriver: Deriver | None = None,
    on_error: OnError = "raise",
    progress: bool = False,
) -> PrepareReport:
    """Derive every unit of ``source`` through ``transform`` and keep the copies in ``derived``,
    so that a stream with the same source, ``format``, ``columns``, ``read``, ``transform`` and
    ``derived`` runs no stage (see the module docstring for the units and their limit).

    Args:
        source: URL, glob or directory, or a list of them, as the stream's.
        transform: As the stream's ``transform=``: a stage, a class, a list of them. Its chain
            must have a fingerprint (:func:`ingest.engine.derived.chain_fingerprint`).
        derived: As the stream's ``derived=``: an :class:`ingest.DerivedConfig`, or a URL.
        format, columns, storage_options, read: As the stream's.
        deriver: Where the units run; default :func:`local_deriver`.
        on_error: ``"raise"`` at the first unit that fails (the units running finish first),
            or ``"skip"`` it, counted in the report.
        progress: Show progress bars (listing, units).

    Returns:
        What was derived, found, failed and written.

    Raises:
        ConfigError: If the chain has no fingerprint, or an argument is out of range.
        PrepareError: If a unit fails and ``on_error="raise"``.
        DerivedStoreError: If the store cannot be read or written.
    """
    began = time.monotonic()
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"prepare on_error={on_error!r} must be 'raise' or 'skip'")
    config = derived_config(derived)
    if config is None:
        raise ConfigError("prepare needs derived=: the URL or DerivedConfig the streams read")
    fn = build_transform(transform)
    if fn is None:
        raise ConfigError("prepare needs transform=: the stages the streams run")
    fingerprint = _fingerprint(fn)
    spec = StreamSpec.of(
        source, storage_options=storage_options, columns=columns, read=read, format=format,
        derived=config,
    )  # fmt: skip
    planner = spec.planner(progress=progress)
    listing = planner.scan()
    keys = Deriving(config, fn, fingerprint, spec.columns)
    jobs = shard_jobs(listing, keys, planner.source, spec.read, spec.columns)
    derivation = Derivation(transform, fingerprint, config, built=fn)
    run = deriver or local_deriver()
    total = sum(len(j.units) for j in jobs)
    counts: dict[str, int] = defaultdict(int)
    failures: list[str] = []
    with tqdm(total=total, desc="deriving", unit="unit", disable=not progress) as bar:
        for results in run(derivation, jobs):
            for r in results:
                counts[r.outcome] += 1
                counts["rows"] += r.rows
                counts["bytes"] += r.bytes_written
                if r.outcome == "failed":
                    failures.append(f"{r.where()}: {r.error}")
                    if on_error == "raise":
                        raise PrepareError(
                            f"{failures[-1]}; fix the stage or the data, or pass "
                            "on_error='skip' (--on-error skip) to derive the other units "
                            "(a stream runs the chain on this one's batches)"
                        )
            bar.update(len(results))
    return PrepareReport(
        units=total,
        derived=counts["derived"],
        present=counts["present"],
        unkept=counts["unkept"],
        failed=counts["failed"],
        rows=counts["rows"],
        bytes_written=counts["bytes"],
        seconds=time.monotonic() - began,
        failures=tuple(failures),
    )


def _fingerprint(fn: Callable[[pa.Table], Any]) -> str:
    """The chain's fingerprint; a chain without one is refused, naming the fix."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DerivedWarning)
        found = chain_fingerprint(fn)
    if found is None:
        why = "; ".join(str(w.message) for w in caught) or "a stage has no fingerprint"
        raise ConfigError(
            f"prepare: nothing to keep, a stream would not cache this chain ({why}). A stream "
            "runs such a chain on every batch, so preparing it would write copies no stream reads"
        )
    return found


def shard_jobs(
    listing: Listing,
    deriving: Deriving,
    source: Source,
    read: ReadOptions,
    columns: Sequence[str] | None,
) -> list[ShardJob]:
    """The plan's units of ``listing``, a job per shard (read with ``source``, ``read`` and
    ``columns``, as a stream's lane reads it), each unit keyed as a lane keys the span it
    reads whole (``deriving.key``, the same call; a shard of unknown count: to its end)."""
    units = epoch_units(listing.plan_shards(), None, 0)
    rows = [TO_END if i.rows is None else i.rows for i in listing.infos]
    by_shard: dict[int, list[UnitJob]] = defaultdict(list)
    contexts: dict[int, ReadContext] = {}
    for u in units:
        ctx = contexts.get(u.shard)
        if ctx is None:
            ctx = contexts[u.shard] = listing.context(u.shard, source, read, columns)
        stop = rows[u.shard] if u.stop is None else u.stop
        key = deriving.key(ctx, u.start, stop)
        by_shard[u.shard].append(UnitJob(u.start, None if stop >= TO_END else stop, key))
    return [ShardJob(contexts[n], tuple(found)) for n, found in by_shard.items()]


def load_transform(spec: str) -> Transform:
    """The transform ``MODULE:NAME`` names (``mypkg.tok:make_tokenize``): a stage, a class
    or a list of them as is; a function that takes no argument is a factory, called for its
    result; a function of one argument is the transform itself.

    Raises:
        ConfigError: If ``spec`` is not ``MODULE:NAME``, does not import, or names nothing
            callable.
    """
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(
            f"--transform {spec!r} must be MODULE:NAME, e.g. mypkg.tok:make_tokenize (a stage, "
            "a class, or a function of no arguments that returns the stages)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"--transform {spec!r}: module {module_name!r} does not import ({e}); install it "
            "or run from the directory that holds it (it must import on every Ray node too)"
        ) from None
    found: Any = module
    for part in name.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"--transform {spec!r}: {module_name} has no {name!r}")
        found = getattr(found, part)
    if isinstance(found, (list, tuple, type)):
        return found  # type: ignore[no-any-return]
    if not callable(found):
        raise ConfigError(
            f"--transform {spec!r} is a {type(found).__name__}, not a stage: pass MODULE:NAME "
            "of a stage or transform (a function of a table, a stage class, or a function of "
            "no arguments that returns the stages, as mypkg.tok:make_tokenize)"
        )
    if inspect.isfunction(found) and _takes_nothing(found):
        return found()  # type: ignore[no-any-return]
    return found  # type: ignore[no-any-return]


def _takes_nothing(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return False
    return True


__all__ = [
    "PrepareError",
    "PrepareReport",
    "load_transform",
    "prepare",
    "shard_jobs",
]
