"""Quarantine: the rows skipped under ``ReadOptions(on_error="skip")``, and why.

A line of a line format (JSONL, CSV) that does not parse is quarantined alone: the reader
finds it by bisection and goes on with the next line (:class:`ingest.formats.base.BadRows`).
A shard span that cannot be read from some row on (a corrupt or truncated row group, a
truncated compressed stream, a tar member that breaks a rule, a shard gone since the
listing) is quarantined from the first row not yet read to the end of the span: those
formats read in blocks, so the rows after the bad one in the same span are not tried again.
Either way the record says exactly which rows were skipped.

Quarantined rows become *holes*: positions in the shuffle window that are consumed (acked
with their batch, so no resume reads them again, and counted in the state's consumed sets)
but not delivered. Holes keep their place, so every rank cuts its batches at the same steps
as a run without errors: a batch that holds holes is short, and a rank never takes fewer
steps than the others. A batch whose transform raises a data error (a
:class:`~ingest.core.errors.ShardError`: :mod:`ingest.decode`'s file that does not decode) is
split to find the rows it fails on, and those alone are quarantined, by shard and row; the
others are delivered. A batch whose transform raises anything else is quarantined whole: its
step delivers an empty batch (one-process :class:`ingest.Stream` leaves empty batches out).

A store that does not answer within the retry deadline (:class:`~ingest.core.errors.StoreError`)
is never skipped: that is not the data's fault, and a restart resumes where it stopped.
Each quarantine counts against ``ReadOptions.max_errors`` per rank and epoch; the one over
the bound fails the run with the list of what was skipped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ingest.core.errors import IngestError, ShardError, SourceError, StateError, StoreError, redact

_REASON_CHARS = 500
SKIPPED = "skipped on request"
"""The reason of a skip's record (``ingest.skip``, :mod:`ingest.core.skipping`): rows left
out on request, listed with the quarantines but not a data error."""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """Rows skipped under ``on_error="skip"``.

    Attributes:
        reason: The error, as it would have been raised (first line, redacted).
        epoch: The epoch it happened in.
        rank: The rank whose share held the rows.
        url: The shard; None for a batch whose transform raised.
        start: First row skipped in the shard.
        stop: The row after the last one skipped; None: to the end of a shard whose row
            count is unknown.
        step: The batch whose transform raised (``url`` None).
        rows: Rows skipped, when known.
    """

    reason: str
    epoch: int
    rank: int
    url: str | None = None
    start: int = 0
    stop: int | None = None
    step: int | None = None
    rows: int | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two records the same quarantine (a resumed rank records it again).

        A shard's rows are one rank's in an epoch, so the rows name it whatever the rank (a
        resume at another world size may meet them on another rank). A step is every
        rank's: ranks 0 and 1 failing their transforms at step 3 are two batches skipped.
        """
        if self.reason.startswith(SKIPPED):  # a skip is what it asked
            return (self.epoch, self.reason)
        if self.url is None:
            return (self.epoch, self.rank, self.step)
        return (self.epoch, self.url, self.start)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason, "epoch": self.epoch, "rank": self.rank}
        for name in ("url", "start", "stop", "step", "rows"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Quarantined:
        def number(name: str, default: int | None) -> int | None:
            value = data.get(name, default)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StateError(
                    f"{where}.{name} is {value!r}, not a row or step number; the state was "
                    "edited: save it again"
                )
            return value

        if not isinstance(data, Mapping) or not isinstance(data.get("reason"), str):
            raise StateError(f"{where} is not a quarantine record; the state was edited")
        url = data.get("url")
        if url is not None and not isinstance(url, str):
            raise StateError(f"{where}.url is {url!r}, not a URL; the state was edited")
        out = cls(
            reason=data["reason"],
            epoch=number("epoch", 0) or 0,
            rank=number("rank", 0) or 0,
            url=url,
            start=number("start", 0) or 0,
            stop=number("stop", None),
            step=number("step", None),
            rows=number("rows", None),
        )
        if out.stop is not None and out.stop < out.start:
            raise StateError(f"{where} ends (row {out.stop}) before it starts ({out.start})")
        return out

    def describe(self) -> str:
        if is_skip(self):
            return f"{self.rows} rows {self.reason}"
        if self.url is None:
            return f"step {self.step} ({self.rows} rows): {self.reason}"
        stop = "end" if self.stop is None else self.stop
        reason = self.reason.removeprefix(f"{self.url} ").removeprefix(f"{self.url}: ")
        return f"{self.url} rows [{self.start}, {stop}): {reason}"


def check_saved(
    records: Sequence[Quarantined],
    where: str,
    *,
    epoch: int,
    steps: range,
    batch_size: int,
    rows_of: Mapping[str, int | None],
) -> None:
    """Refuse saved records that disagree with the state holding them (an edited state),
    so that the rows reported skipped are the rows that were.

    A state holds the records of its own epoch. A shard's record names a shard of the
    state's dataset, rows within its row count, and as ``rows`` exactly the rows from
    ``start`` to ``stop`` (none known when it runs to the end of a shard of unknown length).
    A transform's record names a step of the epoch so far and at most a batch of rows.
    Whether a record's rows are in the consumed sets is not checked: a record is acked with
    the batch cut after the read that met the error, and its rows, spread over the shuffle
    window as holes, with the batches after.

    Args:
        records: The records, as parsed.
        where: Their field in the state (``progress.quarantined``).
        epoch: The state's epoch.
        steps: The steps of the epoch the state covers.
        batch_size: Rows per batch (0: unknown).
        rows_of: Row count (None: unknown) of each shard URL of the dataset.

    Raises:
        StateError: Naming the record, the field and what it disagrees with.
    """
    for i, q in enumerate(records):
        at = f"{where}[{i}]"
        if q.epoch != epoch:
            _refuse(f"{at}.epoch is {q.epoch}, but the state is in epoch {epoch}")
        if is_skip(q):  # ingest.skip's record: its rows are in the consumed sets
            if q.url is not None or q.step is not None or q.rows is None:
                _refuse(f"{at} is a skip that names a shard or a step, or no rows")
        elif q.url is None:
            _check_step_record(q, at, steps, batch_size)
        else:
            _check_shard_record(q, q.url, at, rows_of)


def _check_step_record(q: Quarantined, at: str, steps: range, batch_size: int) -> None:
    """A transform's record: no rows of a shard, a step of the epoch so far, a batch at most."""
    if q.start or q.stop is not None:
        _refuse(f"{at} names rows from {q.start} but no shard")
    if q.step not in steps:
        _refuse(
            f"{at}.step is {q.step}, not a step of the epoch so far ({steps.start} "
            f"to {steps.stop - 1})"
        )
    if q.rows is None or (batch_size and q.rows > batch_size):
        _refuse(f"{at}.rows is {q.rows}, more than a batch (batch_size {batch_size})")


def _check_shard_record(
    q: Quarantined, url: str, at: str, rows_of: Mapping[str, int | None]
) -> None:
    """A shard's record (of ``url``): a shard of the dataset, rows within its count, and
    ``rows`` exact."""
    if q.step is not None:
        _refuse(f"{at} names both a shard and a step ({q.step})")
    if url not in rows_of:
        _refuse(f"{at}.url {redact(url)} names no shard of the state's dataset")
    count = rows_of[url]
    end = q.start if q.stop is None else q.stop
    if count is not None and end > count:
        _refuse(f"{at} ends at row {end}, past the end of {redact(url)} ({count} rows)")
    expected = None if q.stop is None else q.stop - q.start
    if q.rows != expected:
        stop = "end" if q.stop is None else q.stop
        _refuse(
            f"{at}.rows is {q.rows}, but the record skips rows [{q.start}, {stop}) "
            f"({'an unknown number' if expected is None else expected})"
        )


def _refuse(problem: str) -> None:
    raise StateError(
        f"{problem}: the quarantine record disagrees with the state that holds it, so it "
        "would misreport the rows skipped; the state was edited: save it again, or start "
        "without it"
    )


def skippable(error: BaseException) -> bool:
    """Whether ``on_error="skip"`` may quarantine the rows that ``error`` stopped."""
    return isinstance(error, (ShardError, SourceError)) and not isinstance(error, StoreError)


def reason_of(error: BaseException) -> str:
    """The one-line, redacted reason recorded for ``error``."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if not isinstance(error, IngestError):
        text = f"{type(error).__name__}: {text}"
    text = redact(text)
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


class Quarantine:
    """One feed's quarantines: recorded from reader threads, handed out with the batches.

    Args:
        max_errors: Quarantines allowed; the next one raises.
        epoch: The feed's epoch.
        rank: The feed's rank.
    """

    def __init__(self, max_errors: int, epoch: int, rank: int) -> None:
        self.max_errors = max_errors
        self.epoch = epoch
        self.rank = rank
        self._all: list[Quarantined] = []
        self._new: list[Quarantined] = []
        self._lock = threading.Lock()

    def add(self, error: BaseException, **where: Any) -> Quarantined:
        """Record the rows ``error`` stopped (``where``: the :class:`Quarantined` fields),
        for the next :meth:`take`.

        Raises:
            IngestError: If this is one more than ``max_errors``, listing what was skipped.
        """
        return self.record(error, taken=False, **where)

    def record(self, error: BaseException, *, taken: bool = True, **where: Any) -> Quarantined:
        """As :meth:`add`; ``taken``: the caller hands the record out itself (a batch
        transformed in another thread carries its own), so :meth:`take` leaves it out."""
        record = Quarantined(reason_of(error), self.epoch, self.rank, **where)
        with self._lock:
            check_bound([*self._all, record], self.max_errors, error)
            self._all.append(record)
            if not taken:
                self._new.append(record)
        return record

    def take(self) -> tuple[Quarantined, ...]:
        """The records made since the last call."""
        with self._lock:
            out, self._new = tuple(self._new), []
        return out


def is_skip(record: Quarantined) -> bool:
    """Whether ``record`` is a skip (:data:`SKIPPED`): not counted against
    ``ReadOptions.max_errors``, counted apart in ``stream.stats``."""
    return record.reason.startswith(SKIPPED)


def check_bound(
    records: Sequence[Quarantined], bound: int, cause: BaseException | None = None
) -> None:
    """Raise the clear error when ``records``, one rank's in one epoch, are over ``bound``.

    Raises:
        IngestError: Naming the rank, the epoch, the bound and the first records.
    """
    records = [r for r in records if not is_skip(r)]
    if len(records) <= bound:
        return
    first = records[0]
    listed = "; ".join(r.describe() for r in records[:5])
    raise IngestError(
        f"rank {first.rank} quarantined more than ReadOptions.max_errors={bound} times in "
        f"epoch {first.epoch} (first: {listed}); the data is broken beyond a few bad "
        "records: fix the shards or the transform, or raise max_errors"
    ) from cause


def merge(known: Sequence[Quarantined], new: Iterable[Quarantined]) -> list[Quarantined]:
    """``known`` and the records of ``new`` not in it yet (a resumed rank records again)."""
    out = list(known)
    for record in new:
        if not any(_covers(old, record) for old in out):
            out.append(record)
    return out


def _covers(old: Quarantined, new: Quarantined) -> bool:
    """Whether ``old`` already says what ``new`` says (a resumed rank met the same error
    again, maybe from a later row of the same span)."""
    if old.key == new.key:
        return True
    if old.epoch != new.epoch or old.url is None or old.url != new.url:
        return False
    if old.stop is None:
        return old.start <= new.start
    return old.start <= new.start and new.stop is not None and new.stop <= old.stop


def summary(records: Sequence[Quarantined]) -> dict[str, int]:
    """``{"quarantined": records, "rows_skipped": rows known to be skipped}`` for the data
    errors, and ``{"skips", "rows_skipped_on_request"}`` for the skips (:func:`is_skip`)."""
    errors = [r for r in records if not is_skip(r)]
    skips = [r for r in records if is_skip(r)]
    return {
        "quarantined": len(errors),
        "rows_skipped": sum(_rows(r) for r in errors),
        "skips": len(skips),
        "rows_skipped_on_request": sum(_rows(r) for r in skips),
    }


def _rows(r: Quarantined) -> int:
    return r.rows if r.rows is not None else (r.stop - r.start if r.stop is not None else 0)


__all__ = [
    "SKIPPED",
    "Quarantine",
    "Quarantined",
    "check_bound",
    "check_saved",
    "is_skip",
    "merge",
    "reason_of",
    "skippable",
    "summary",
]
