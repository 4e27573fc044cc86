"""The settings every stream entry point shares, in frozen configs defined once.

A stream's settings come in groups, each a frozen config: :class:`Shuffle` (the order and
its windows), :class:`~ingest.formats.base.ReadOptions` (how shards are read),
:class:`~ingest.engine.pack_settings.Pack` (packing) and, on Ray,
:class:`~ingest.distributed.pool.ReaderPool` (the pool). :class:`StreamOptions` holds what
:class:`ingest.Stream` and :class:`ingest.RayStream` both take; each constructor makes it
once from its keywords (the ``shuffle_*`` keywords of earlier releases keep working) and
everything after reads it: the stream's :class:`~ingest.engine.spec.StreamSpec`, and the
options of a mixture's source streams.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ingest.core.book import Remainder
from ingest.core.errors import ConfigError
from ingest.core.validate import BYTES_OR_NONE, COUNT, check_numbers, check_values
from ingest.engine.derived.store import DerivedConfig
from ingest.engine.grouping import Grouping
from ingest.engine.mix_provenance import source_log
from ingest.engine.pack_settings import Pack, check_read
from ingest.engine.transform import Transform
from ingest.formats.base import ReadOptions
from ingest.storage.follow import Follow

_RULES = {"window": COUNT, "bytes": BYTES_OR_NONE, "lanes": COUNT}
"""Each :class:`Shuffle` number's rule."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Shuffle:
    """How a stream orders its rows: seeded shard, block and row order within windows.

    ``Stream(url, shuffle=ingest.Shuffle(seed=0, window=32_768))`` is the same stream as
    ``Stream(url, shuffle_seed=0, shuffle_window=32_768)``.

    Attributes:
        seed: Seed for shard, block and row order; None reads in listing order.
        window: Rows per shuffle window, at most: rows are permuted within a window.
        bytes: Bytes per shuffle window, about (default 256 MiB): large rows make windows
            of fewer rows, fixed for each epoch from the listing's bytes per row (and saved
            in the state). None: ``window`` rows whatever their size.
        lanes: Shards read side by side into each window, so that a window mixes rows of
            up to this many shards even when every shard is sorted.
    """

    seed: int | None = None
    window: int = 16_384
    bytes: int | None = 256 << 20
    lanes: int = 16

    def __post_init__(self) -> None:
        check_numbers(self, "Shuffle", **_RULES)
        _check_seed(self.seed, "Shuffle(seed={!r})")

    @classmethod
    def of(
        cls,
        shuffle: Shuffle | None,
        seed: int | None,
        window: int,
        window_bytes: int | None,
        lanes: int,
    ) -> Shuffle:
        """``shuffle``, or the one the ``shuffle_*`` keywords of a stream make.

        Raises:
            ConfigError: If ``shuffle`` is given with a ``shuffle_*`` keyword that is not at
                its default, or a keyword's value is out of range (named as passed).
        """
        given = {"seed": seed, "window": window, "bytes": window_bytes, "lanes": lanes}
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        if shuffle is not None:
            also = [f"shuffle_{k}={v!r}" for k, v in given.items() if v != defaults[k]]
            if also:
                raise ConfigError(
                    f"shuffle={shuffle!r} and {', '.join(also)} both set the order; pass "
                    "the settings in shuffle=ingest.Shuffle(...) alone"
                )
            return shuffle
        keywords = {f"shuffle_{k}": v for k, v in given.items()}
        check_values(
            keywords,
            {f"shuffle_{k}": defaults[k] for k in given},
            "",
            {f"shuffle_{k}": rule for k, rule in _RULES.items()},
        )
        _check_seed(seed, "shuffle_seed={!r}")
        return cls(seed=seed, window=window, bytes=window_bytes, lanes=lanes)


def _check_seed(seed: object, shown: str) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(f"{shown.format(seed)} must be a non-negative int or None")


class StreamKeywords(TypedDict, total=False):
    """The keywords :class:`ingest.Stream` and :class:`ingest.RayStream` both take, typed
    once (``**options: Unpack[StreamKeywords]``); each one's docstring says what they do."""

    format: str | None
    columns: Sequence[str] | None
    batch_size: int
    shuffle: Shuffle | None
    shuffle_seed: int | None
    shuffle_window: int
    shuffle_bytes: int | None
    shuffle_lanes: int
    remainder: Remainder
    storage_options: Mapping[str, Any] | None
    read: ReadOptions | None
    transform: Transform | None
    progress: bool
    follow: Follow | None
    pack: Grouping | None
    derived: DerivedConfig | str | None
    provenance: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOptions:
    """What :class:`ingest.Stream` and :class:`ingest.RayStream` both take, made once from
    their keywords (see their docstrings for each)."""

    format: str | None = None
    columns: Sequence[str] | None = None
    batch_size: int = 1024
    shuffle: Shuffle = field(default_factory=Shuffle)
    remainder: Remainder = "carry"
    storage_options: Mapping[str, Any] | None = None
    read: ReadOptions | None = None
    transform: Transform | None = None
    progress: bool = False
    follow: Follow | None = None
    pack: Grouping | None = None
    derived: DerivedConfig | None = None
    provenance: str | None = None

    def __post_init__(self) -> None:
        _check_kinds(self)
        check_read(self.pack, self.read)
        object.__setattr__(self, "derived", derived_config(self.derived))
        if self.derived is not None and self.transform is None:
            raise ConfigError(
                f"derived={self.derived!r} keeps what transform= makes of each unit, and "
                "there is no transform; give the stages (e.g. transform=ingest.Tokenize(...)) "
                "or leave derived out"
            )

    @classmethod
    def of(cls, owner: str, keywords: StreamKeywords) -> StreamOptions:
        """The options ``keywords`` give ``owner`` (``"Stream"``), defaults for the others.

        Raises:
            TypeError: For a keyword neither stream takes, as Python names one.
            ConfigError: For a value out of range (see :class:`Shuffle`).
        """
        unknown = sorted(set(keywords) - StreamKeywords.__optional_keys__)
        if unknown:
            raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
        given: dict[str, Any] = dict(keywords)
        default = {f.name: f.default for f in dataclasses.fields(Shuffle)}
        shuffle = Shuffle.of(
            given.pop("shuffle", None),
            given.pop("shuffle_seed", default["seed"]),
            given.pop("shuffle_window", default["window"]),
            given.pop("shuffle_bytes", default["bytes"]),
            given.pop("shuffle_lanes", default["lanes"]),
        )
        return cls(shuffle=shuffle, **given)

    def of_sources(self, name: str) -> StreamOptions:
        """The options of a mixture's source stream ``name``: batches of one row (a draw),
        and with ``provenance``, its own log at ``URL/sources/<name>`` (its steps are its
        draws; the mixture logs which draw each slot was, :mod:`ingest.engine.mix_provenance`)."""
        self.draw_tokens()
        log = None if self.provenance is None else source_log(self.provenance, name)
        return dataclasses.replace(self, batch_size=1, provenance=log)

    def draw_tokens(self) -> int | None:
        """The tokens a mixture's draw counts: with ``pack``, a sequence (its ``seq_len``);
        None without (a draw is a row).

        Raises:
            ConfigError: For a ``pack`` whose batches a mixture cannot draw from.
        """
        if self.pack is None:
            return None
        if not isinstance(self.pack, Pack):
            raise ConfigError(
                f"pack={type(self.pack).__name__}(...) over an ingest.Mix: a mixture draws "
                "sequences of seq_len tokens from its sources, so it packs with "
                "ingest.Pack(seq_len=...) only; read each source on its own, or pack"
            )
        return self.pack.seq_len

    def spec_options(self) -> dict[str, Any]:
        """The keywords of :meth:`ingest.engine.spec.StreamSpec.of` these options give:
        with ``pack``, the stream's steps are read steps of ``pack.read_rows`` documents."""
        return {
            "storage_options": self.storage_options,
            "columns": self.columns,
            "read": self.read,
            "format": self.format,
            "batch_size": self.batch_size if self.pack is None else self.pack.read_rows,
            "shuffle": self.shuffle,
            "remainder": self.remainder,
            "follow": self.follow,
            "derived": self.derived,
            "provenance": self.provenance,
        }


_KINDS: tuple[tuple[str, type, str], ...] = (
    ("shuffle", Shuffle, "an ingest.Shuffle: pass ingest.Shuffle(seed=..., window=...)"),
    ("read", ReadOptions, "an ingest.ReadOptions: pass ingest.ReadOptions(...)"),
    ("follow", Follow, "an ingest.Follow: pass ingest.Follow(poll_s=..., idle_timeout_s=...)"),
    ("storage_options", Mapping, "a mapping: pass the filesystem's options as a dict"),
)
"""The options that take a config object: its kind, and what to pass."""
_GROUPING = ("column", "pad_id", "read_rows", "max_lag", "provenance")
"""What a ``pack=`` setting has (:class:`~ingest.engine.grouping.Grouping`)."""


def _check_kinds(options: StreamOptions) -> None:
    """Refuse an option given an object of another kind (a dict for a ReadOptions, a
    CacheOptions passed as ``read=``), which failed deep inside, naming no option."""
    for name, kind, want in _KINDS:
        value = getattr(options, name)
        if value is not None and not isinstance(value, kind):
            raise ConfigError(f"{name}={value!r} ({type(value).__name__}) is not {want}")
    pack = options.pack
    if pack is not None and not all(hasattr(pack, a) for a in _GROUPING):
        raise ConfigError(
            f"pack={pack!r} ({type(pack).__name__}) is not an ingest.Pack or "
            "ingest.TokenBatches: pass ingest.Pack(seq_len=...) or ingest.TokenBatches(...)"
        )


def derived_config(derived: object) -> DerivedConfig | None:
    """A stream's ``derived=``: a :class:`ingest.DerivedConfig`, a URL or path (a store
    every job shares: ``DerivedConfig(url=...)``), or None.

    Raises:
        TypeError: For anything else.
    """
    if derived is None or isinstance(derived, DerivedConfig):
        return derived
    if isinstance(derived, str):
        return DerivedConfig(url=derived)
    raise TypeError(
        f"derived={derived!r}: pass an ingest.DerivedConfig(local=ingest.CacheOptions(...)) "
        "for a node's directory, a URL or path for a store every job shares, or None"
    )


__all__ = ["Shuffle", "StreamKeywords", "StreamOptions", "derived_config"]
