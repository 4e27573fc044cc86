"""What names a derived copy (:class:`DerivedKey`), and the fingerprint of a stage chain
(:func:`chain_fingerprint`) that keeps a copy from outliving the stages that made it.

A key holds everything the copy's rows are a function of: the source shard as the listing saw
it (URL, size, version: a rewritten shard is another key, as for the shard cache), the unit
of it (rows ``[start, stop)``), how its bytes were made rows (``read``: format and columns)
and the stage chain. A stage that cannot say what it computes (a user's function with no
``version=``) has no fingerprint, and a chain holding one is not cached at all: a stale copy
is a wrong answer, a miss is only a cost.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from ingest.core.errors import ConfigError
from ingest.engine.stage import checked_version
from ingest.engine.transform import Chain
from ingest.storage.sources.partitions import Partition

KEY_VERSION = 1
"""Part of every key's name: bump it when what a copy holds changes meaning (the codec, what
a key covers), so that copies written before are never read."""


class DerivedWarning(UserWarning):
    """A stage chain is not cached (a stage without a fingerprint): it runs every epoch."""


@runtime_checkable
class Fingerprinted(Protocol):
    """A stage that says what it computes: equal fingerprints, equal outputs for equal
    inputs. Its fingerprint changes with anything that changes its output (a tokenizer, an
    option, a version of the code)."""

    def fingerprint(self) -> str | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class DerivedKey:
    """The name of a derived copy: one source unit through one stage chain.

    Attributes:
        url: The source shard's URL (a folder dataset's work unit: its URL).
        size: The shard's size in bytes, as listed.
        version: The shard's ETag, modification time or generation, as listed (``Shard.version``;
            empty where the store gives none: then size and URL alone tell a change), and
            its deletion vector's id where it has one (a Delta file's: its rows are those
            the vector keeps).
        start: The unit's first row in the shard.
        stop: The row after the unit's last; None: to the shard's end.
        chain: The stage chain's fingerprint (:func:`chain_fingerprint`).
        read: How the shard's bytes became the rows the chain was given: the format's name
            and the columns read (:func:`read_fingerprint`); the chain's input changes with
            either.
    """

    url: str
    size: int
    version: str
    start: int
    stop: int | None
    chain: str
    read: str = ""

    def __post_init__(self) -> None:
        for name in ("url", "version", "chain", "read"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(
                    f"DerivedKey.{name} must be a str, got {type(getattr(self, name)).__name__}"
                )
        if not self.url or not self.chain:
            raise ConfigError(
                f"DerivedKey(url={self.url!r}, chain={self.chain!r}) needs a shard URL and a "
                "chain fingerprint (chain_fingerprint(stages); None there means: not cacheable)"
            )
        for name in ("size", "start"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"DerivedKey.{name}={value!r} must be an int >= 0")
        stop = self.stop
        if stop is not None and (
            isinstance(stop, bool) or not isinstance(stop, int) or stop < self.start
        ):
            raise ConfigError(
                f"DerivedKey(start={self.start}, stop={stop!r}): stop must be an int >= start, "
                "or None for the shard's end"
            )

    def name(self) -> str:
        """The copy's file name: a hash of every field and :data:`KEY_VERSION` (40 hex
        characters). Equal keys, equal names; any field changed, another name."""
        fields = {"key_version": KEY_VERSION, **asdict(self)}
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:40]


def read_fingerprint(
    format: str,
    columns: Sequence[str] | None,
    partition: Partition = (),
    casts: Mapping[str, pa.DataType] | None = None,
    names: Sequence[str] | None = None,
    declared: pa.Schema | None = None,
) -> str:
    """The ``read`` part of a :class:`DerivedKey`: the format that reads the shard, the
    columns it reads (None: all), the hive partition columns its rows get (the shard's
    ``partition``: empty when read with ``ReadOptions(partitioning=None)``) and the types
    its columns are cast to (``casts``, :func:`ingest.formats.read_casts`: a copy made of
    ``int32`` rows is not read once the stream reads them as ``int64``) and the names given
    to columns a file does not name (``names``, :func:`ingest.formats.given_names`: CSV
    without a header) and a declared schema (``ReadOptions.schema``: the types JSON Lines
    and CSV are parsed in, the columns read as nulls where a shard lacks them), which
    together make the rows the chain is given. Without any of them, the key it was before
    any of them was read."""
    fields: dict[str, Any] = {
        "format": format,
        "columns": None if columns is None else list(columns),
    }
    if partition:
        fields["partition"] = [list(pair) for pair in partition]
    if casts:
        fields["casts"] = {name: str(t) for name, t in casts.items()}
    if names:
        fields["names"] = list(names)
    if declared is not None:
        fields["declared"] = [[f.name, str(f.type)] for f in declared]
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def chain_fingerprint(stages: Any) -> str | None:
    """The fingerprint of a stage chain, or None when it is not cacheable.

    ``stages`` is what a stream's ``transform`` was built into (a callable, an
    :class:`ingest.engine.transform.Chain` of them) or a sequence of built callables. Each
    gives its part (:func:`stage_fingerprint`); one without any makes the whole chain
    uncacheable, with a :class:`DerivedWarning` naming it and the fix.
    """
    if isinstance(stages, (list, tuple)):
        parts = list(stages)
    elif isinstance(stages, Chain):
        parts = list(stages.stages)
    else:
        parts = [stages]
    if not parts:
        raise ConfigError("chain_fingerprint([]): a chain of no stages has nothing to cache")
    prints = []
    for stage in parts:
        got = stage_fingerprint(stage)
        if got is None:
            warnings.warn(
                DerivedWarning(
                    f"stage {_name(stage)} has no fingerprint, so the output of its chain is "
                    "not cached and runs every epoch. Give it version='...' (a str you change "
                    "whenever what it computes changes), or a fingerprint() method"
                ),
                stacklevel=2,
            )
            return None
        prints.append(got)
    return _digest({"stages": prints})


def stage_fingerprint(stage: Any) -> str | None:
    """One stage's fingerprint: its own ``fingerprint()`` (:class:`ingest.Tokenize`'s: its
    tokenizer's serialized form, ``eos_id`` and options); else its ``version`` (a str); with
    its class or function name. None: none."""
    if isinstance(stage, Fingerprinted):
        got = stage.fingerprint()
        if got is not None:  # None: unknown (ingest.Stage's default), see below
            if not isinstance(got, str) or not got:
                raise ConfigError(
                    f"stage {_name(stage)}.fingerprint() returned {got!r}; return a non-empty "
                    "str that changes whenever what the stage computes changes, or None"
                )
            return _digest({"stage": _name(stage), "fingerprint": got})
    version = getattr(stage, "version", None)
    if version is None:
        return None
    return _digest({"stage": _name(stage), "version": checked_version(_name(stage), version)})


def _digest(fields: dict[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _name(stage: Any) -> str:
    """``module.QualName`` of a stage's class, or of a function."""
    kind = stage if callable(stage) and hasattr(stage, "__qualname__") else type(stage)
    return f"{kind.__module__}.{kind.__qualname__}"


__all__ = [
    "KEY_VERSION",
    "DerivedKey",
    "DerivedWarning",
    "Fingerprinted",
    "chain_fingerprint",
    "read_fingerprint",
    "stage_fingerprint",
]
