"""Which split a shard's path names, as Hugging Face ``datasets`` tells them apart.

A dataset on the Hub, or laid out as one, keeps its splits side by side:
``data/train-00000-of-00004.parquet`` beside ``data/test-00000-of-00001.parquet``, or
``train/`` and ``validation/`` folders. Listed from its root, a stream would read them all
and train on the test rows. A listing of one URL whose files name more than one split
warns (:class:`MixedSplitsWarning`, from :func:`ingest.storage.sources.listing.list_url`).

The names and where they count are ``datasets``' (``datasets.data_files``): ``train``,
``training``; ``validation``, ``valid``, ``dev``, ``val``; ``test``, ``testing``, ``eval``,
``evaluation``; as a file name's word (after the start, a ``/`` or one of ``-._`` , a space
or a digit, and before one of those) or as a directory's last word. Only the path below the
listed root counts. Pure functions over paths.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

from ingest.core.errors import redact

SPLITS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
"""Each split and the words that name it (``datasets``')."""

_SPLIT_OF = {word: split for split, words in SPLITS.items() for word in words}
_WORD = re.compile(
    r"(?:^|[-._ 0-9/])(" + "|".join(sorted(_SPLIT_OF, key=len, reverse=True)) + r")(?=[-._ 0-9/])"
)

_ANY = re.compile("train|val|dev|test|eval")
"""Every split word holds one of these: a listing without any names no split."""


class MixedSplitsWarning(UserWarning):
    """A listing holds the files of several splits by their names (train and test): a
    stream over it trains on them all. List one split (a glob, a folder), or name the files;
    ``warnings.simplefilter("error", MixedSplitsWarning)`` makes it an error."""


def split_of(path: str) -> str | None:
    """The split ``path`` (below a listed root) names, or None: ``train``, ``validation`` or
    ``test``, by the first word that names one."""
    found = _WORD.search(path)
    return None if found is None else _SPLIT_OF[found.group(1)]


def warn_mixed_splits(url: str, paths: Sequence[str], shown: Sequence[str]) -> None:
    """Warn if ``paths`` (below the root ``url`` lists; ``shown``: their URLs) name more than
    one split, naming each split's count and first file."""
    if _ANY.search("\n".join(paths)) is None:  # one pass for the lot: most name none
        return
    first: dict[str, str] = {}
    counts: dict[str, int] = {}
    for path, name in zip(paths, shown, strict=True):
        split = split_of(path)
        if split is not None:
            counts[split] = counts.get(split, 0) + 1
            first.setdefault(split, name)
    if len(counts) < 2:
        return
    named = "; ".join(f"{s}: {counts[s]} ({redact(first[s])}...)" for s in SPLITS if s in counts)
    warnings.warn(
        f"{redact(url)} lists the files of {len(counts)} splits by their names ({named}): a "
        "stream over it trains on every one of them, the test rows too. List one split (a "
        "glob such as .../train-*.parquet, or its folder), or name the files one by one if "
        "this is meant",
        MixedSplitsWarning,
        stacklevel=3,
    )


__all__ = ["SPLITS", "MixedSplitsWarning", "split_of", "warn_mixed_splits"]
