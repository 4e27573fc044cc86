"""What a stream reads and how it orders and batches it: one picklable spec, and the parts
the layers below take from it (the planner's catalog, the book's config, the feed's config).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsspec.utils import get_protocol

from ingest.core.book import BookConfig, EpochBook, Remainder
from ingest.core.errors import ConfigError, redact
from ingest.core.validate import COUNT, check_numbers, check_remainder
from ingest.engine.derived.store import DerivedConfig
from ingest.engine.feed import FeedConfig
from ingest.engine.options import Shuffle
from ingest.engine.provenance import ProvenanceWriter
from ingest.formats import get_format
from ingest.formats.base import ReadOptions
from ingest.planner.catalog import Catalog, Listing
from ingest.planner.index import IndexConfig, Indexer, IndexStore
from ingest.planner.planner import Planner
from ingest.storage.follow import Follow
from ingest.storage.sources import Source, URLs, as_urls


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSpec:
    """What a stream reads and how it orders and batches it. Picklable.

    Attributes:
        urls: Source URLs, globs or directories.
        storage_options: fsspec options (never saved in the state).
        format: Format name for every shard, or None to infer from extensions.
        columns: Columns to read, or None for all.
        batch_size: Rows per batch on every rank.
        shuffle: The order (:class:`ingest.Shuffle`): seed, window rows and bytes, lanes.
            Each epoch's window holds ``min(window, bytes // bytes per row)`` rows, one at
            least, with the bytes per row estimated from the listing when the epoch is
            planned (:mod:`ingest.planner.budget`), so that the order stays a pure function
            of the plan.
        read: How shards are read.
        remainder: What happens to the rows of an epoch that cannot fill one more step on
            every rank: ``"carry"`` them into the next epoch's first steps, or ``"drop"``
            them. Counted in the state either way.
        index: Where the persistent shard index lives (row counts and seek points of shards
            whose footer has none, keyed by url, size and version, reused by later jobs);
            None keeps indexes in memory only.
        follow: Read a dataset that grows while the stream runs: each epoch is a round over
            the shards that appeared since the last (:mod:`ingest.storage.follow`). None: every
            epoch reads the whole listing.
        derived: Where the transform's outputs of each unit read whole are kept, so that
            later epochs, restarts and other jobs read them and run no stage
            (:mod:`ingest.engine.derived`); None: the transform runs on every batch.
        provenance: Where the book keeps which rows each rank's step consumed, for
            ``ingest which`` and ``ingest.skip`` (:mod:`ingest.engine.provenance`): a
            directory or an fsspec URL; None: nowhere.
    """

    urls: tuple[str, ...]
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    format: str | None = None
    columns: tuple[str, ...] | None = None
    batch_size: int = 1024
    shuffle: Shuffle = field(default_factory=Shuffle)
    read: ReadOptions = field(default_factory=ReadOptions)
    remainder: Remainder = "carry"
    index: IndexConfig | None = field(default_factory=IndexConfig)
    follow: Follow | None = None
    derived: DerivedConfig | None = None
    provenance: str | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise ConfigError("a stream needs at least one source URL")
        check_numbers(self, "", batch_size=COUNT)
        if self.columns is not None and not self.columns:
            raise ConfigError("columns=[] selects nothing; pass None for all columns")
        check_remainder(self.remainder)
        if self.format is not None:
            get_format(self.format)
        hub = next((u for u in self.urls if u.startswith("hf://")), None)
        if self.follow is not None and hub is not None:
            raise ConfigError(
                f"follow= over the Hub ({hub}): each round lists the branch at its newest "
                "commit, where the files a round read have other URLs (they name the commit), "
                "so a round after a push cannot tell them from new ones; read the new commit "
                "as a new stream (or epoch), or follow a store that files are added to"
            )

    @classmethod
    def of(
        cls,
        source: URLs,
        *,
        storage_options: Mapping[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        read: ReadOptions | None = None,
        **options: Any,
    ) -> StreamSpec:
        """The spec of a stream made with these arguments (``Stream(...)``,
        ``RayStream(...)``): one URL or several, columns as a list, default read options.

        Raises:
            ConfigError: If an option is out of range, or ``columns`` is a string or empty.
        """
        if columns is not None and (isinstance(columns, str) or not columns):
            raise ConfigError(f"columns={columns!r} must be a non-empty list of names, or None")
        return cls(
            urls=as_urls(source),
            storage_options=dict(storage_options or {}),
            columns=tuple(columns) if columns is not None else None,
            read=read or ReadOptions(),
            **options,
        )

    def source(self) -> Source:
        """A new :class:`~ingest.storage.sources.Source` of this stream's URLs."""
        return Source(
            self.urls,
            storage_options=self.storage_options,
            format=self.format,
            retry=self.read.retry,
            cache=self.read.cache,
        )

    def catalog(self, indexer: Indexer | None = None) -> Catalog:
        """A catalog of this stream's source, with its index store and ``indexer``."""
        source = self.source()
        store = IndexStore(self.index) if self.index is not None else None
        return Catalog(source, self.read, self.columns, index_store=store, indexer=indexer)

    def feed_config(self) -> FeedConfig:
        return FeedConfig(
            batch_size=self.batch_size,
            seed=self.shuffle.seed,
            window=self.shuffle.window,
            lanes=self.shuffle.lanes,
            columns=self.columns,
            read=self.read,
            window_bytes=self.shuffle.bytes,
            derived=self.derived,
        )

    def planner(self, indexer: Indexer | None = None, *, progress: bool = False) -> Planner:
        """A planner over a new catalog of this stream's source (one per stream)."""
        return Planner(
            self.catalog(indexer),
            follow=self.follow,
            columns=self.columns,
            shuffle_window=self.shuffle.window,
            shuffle_bytes=self.shuffle.bytes,
            progress=progress,
        )

    def book_config(self) -> BookConfig:
        return BookConfig(
            # The sources as saved in every state: credentials and query values never are.
            sources=tuple(redact(u) for u in self.urls),
            batch_size=self.batch_size,
            seed=self.shuffle.seed,
            lanes=self.shuffle.lanes,
            remainder=self.remainder,
            max_errors=self.read.max_errors,
            follows=self.follow is not None,
        )

    def book(
        self, world_size: int, planner: Planner | None = None, *, packs: bool = False
    ) -> EpochBook[Listing]:
        """A book of ``world_size`` ranks listing with ``planner`` (default: a new one);
        ``packs``: the stream has ``pack=`` (its provenance log numbers its batches)."""
        book = EpochBook(self.book_config(), world_size, planner or self.planner())
        book.logs_batches = packs
        if self.provenance is not None:
            log = ProvenanceWriter(self.provenance, self.options_for(self.provenance))
            log.start(0, world_size)
            book.log = log
        return book

    def options_for(self, url: str) -> Mapping[str, Any]:
        """The stream's storage options for another URL of the same protocol (a log kept
        on the source's store); none for another protocol."""
        same = get_protocol(url) == get_protocol(self.urls[0])
        return self.storage_options if same else {}


__all__ = ["StreamSpec"]
