"""The state of a stream over several named sources: each source's own state, side by side,
and the count of what was drawn from each. Pure.

A stream that draws from several datasets (a weighted mixture, for instance) keeps for every
source exactly what a one-source stream keeps: its listing and that listing's fingerprint,
its epoch and the rows it consumed, its readers' position (one :class:`StreamState`, under
the source's name). Each source is restored as a one-source stream is, and checked against
its own listing: a shard changed in one source names that source. Beside them, what the
drawing needs to go on exactly where it stopped: ``drawn``, the items drawn from all the
sources together (a choice of the next source that is a pure function of a seed and this
counter resumes with the same choices), and ``taken``, how many of them each source gave::

    {"version": 7,
     "sources": {"web": {"version": 7, "dataset": ..., "progress": ..., ...},
                 "code": {"version": 7, ...}},
     "mix": {"drawn": 120,
             "taken": {"web": 90, "code": 30},
             "mixture": {"unit": "tokens", "counts": [...], "stages": [...], "epoch": 0}}}

``mix`` is the mix node's part of the state; its ``mixture``, written by a mixed stream
(:mod:`ingest.engine.mix`), is the rule's counts and stages and the mixture's epoch; it is
checked by the mixture that loads it. Version 4 (written before version 7) held ``drawn``,
``taken`` and ``mixture`` beside ``sources``; it still loads.

Every source's part is a whole state of one source, read by :meth:`StreamState.from_json`
with its own checks. :func:`read_state` reads either kind.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.core.errors import StateError
from ingest.core.state.checks import (
    FIX,
    MAX_STATE_BYTES,
    STATE_VERSION,
    check_size,
    checked_int,
    refuse,
)
from ingest.core.state.schema import StreamState

SOURCES_VERSION = STATE_VERSION
"""The version of a state of several sources this ingest writes (every state's)."""
READ_SOURCES_VERSIONS = (4, STATE_VERSION)
"""The versions of a state of several sources it reads (4: its mix part at the top)."""
MAX_SOURCES = 1024
"""The most sources one state holds (a mixture of a few to a few hundred datasets)."""


@dataclass(slots=True)
class SourcesState:
    """The state of a stream over several named sources (see the module docstring).

    Attributes:
        parts: Each source's state, by name, in the stream's order of sources.
        drawn: Items drawn from the sources together.
        taken: Items drawn from each source; they add up to ``drawn``.
        mixture: The drawing rule's own state (:meth:`ingest.engine.mix.Mixer.state`), if any.
    """

    parts: dict[str, StreamState]
    drawn: int = 0
    taken: dict[str, int] = field(default_factory=dict)
    mixture: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.taken:
            self.taken = dict.fromkeys(self.parts, 0)
        _check_names(list(self.parts), "sources")
        if list(self.taken) != list(self.parts):
            raise refuse(
                "taken",
                sorted(self.taken),
                f"it must name the sources {sorted(self.parts)}, each once",
            )
        if sum(self.taken.values()) != self.drawn:
            raise refuse(
                "drawn",
                self.drawn,
                f"the items taken from each source add up to {sum(self.taken.values())}",
            )

    def to_json(self) -> dict[str, Any]:
        mix: dict[str, Any] = {"drawn": self.drawn, "taken": dict(self.taken)}
        if self.mixture is not None:
            mix["mixture"] = dict(self.mixture)
        return {
            "version": SOURCES_VERSION,
            "sources": {name: part.to_json() for name, part in self.parts.items()},
            "mix": mix,
        }

    @classmethod
    def from_json(cls, data: object, *, max_bytes: int = MAX_STATE_BYTES) -> SourcesState:
        """Parse and check a state produced by :meth:`to_json`.

        Raises:
            StateError: On a state too large, of another version, malformed or edited; a
                source's part that fails its checks is named.
        """
        data = _as_mapping(data, max_bytes)
        version = data.get("version")
        if version not in READ_SOURCES_VERSIONS or not isinstance(data.get("sources"), Mapping):
            raise StateError(
                f"this is not a state of several sources (version {version!r}, "
                "no 'sources' object): load it into a stream of one source"
            )
        if version == 4:  # the mix part beside the sources
            mix: Any = {k: data[k] for k in ("drawn", "taken", "mixture") if k in data}
        else:
            unknown = sorted(str(k) for k in data if k not in ("version", "sources", "mix"))
            mix = data.get("mix")
            if unknown or not isinstance(mix, Mapping):
                raise refuse(
                    "the state of several sources",
                    sorted(map(str, data)),
                    "it holds version, sources and the mix part (written by a newer ingest, "
                    "or edited)",
                )
        sources = data["sources"]
        names = list(sources)
        _check_names(names, "sources")
        parts: dict[str, StreamState] = {}
        for name in names:
            part = sources[name]
            if isinstance(part, Mapping) and "sources" in part:
                raise refuse(f"sources[{name!r}]", "a state of several sources", "they nest once")
            try:
                parts[name] = StreamState.from_json(part, max_bytes=max_bytes)
            except StateError as e:
                raise StateError(f"source {name!r} of the state: {e}") from None
        taken = mix.get("taken")
        if not isinstance(taken, Mapping):
            raise refuse("taken", taken, "it must map each source to the items taken from it")
        mixture = mix.get("mixture")
        if mixture is not None and not isinstance(mixture, Mapping):
            raise refuse("mixture", mixture, "it must be the mixture's object")
        return cls(
            parts,
            checked_int(mix.get("drawn"), "drawn"),
            {str(name): checked_int(n, f"taken[{name!r}]") for name, n in taken.items()},
            None if mixture is None else dict(mixture),
        )


def read_state(data: object, *, max_bytes: int = MAX_STATE_BYTES) -> StreamState | SourcesState:
    """A state of one source (:class:`StreamState`) or of several (:class:`SourcesState`),
    from its JSON object or text, checked."""
    parsed = _as_mapping(data, max_bytes)
    if "sources" in parsed:
        return SourcesState.from_json(parsed, max_bytes=max_bytes)
    return StreamState.from_json(parsed, max_bytes=max_bytes)


def _as_mapping(data: object, max_bytes: int) -> Mapping[str, Any]:
    if isinstance(data, (str, bytes)):
        check_size(data, max_bytes, "the state")
        try:
            data = json.loads(data)
        except ValueError as e:
            raise StateError(f"the state is not JSON ({e}); {FIX}") from None
        except RecursionError:
            raise StateError(
                f"the state is nested too deep to be a stream state (more than "
                f"{sys.getrecursionlimit()} levels); {FIX}"
            ) from None
    if not isinstance(data, Mapping):
        raise StateError(f"a stream state is a JSON object, got {type(data).__name__}")
    return data


def _check_names(names: list[Any], what: str) -> None:
    if not names:
        raise refuse(what, {}, "a state of several sources names at least one")
    if len(names) > MAX_SOURCES:
        raise refuse(what, f"{len(names)} sources", f"a state holds at most {MAX_SOURCES}")
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise refuse(f"{what} name", name, "each is a string of 1 to 200 characters")


__all__ = ["MAX_SOURCES", "SOURCES_VERSION", "SourcesState", "read_state"]
