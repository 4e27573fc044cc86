"""Weighted mixtures of named sources: which source feeds the next draw, exact at every prefix.

The rule is Balinski and Young's quota method, applied to draws of at most ``S`` units (1
document; in tokens, ``max_draw``, the sequence length when documents are cut at it first):
a source may take the next draw only while it is below its share of the total counting a
draw of ``S`` more (``c_i < w_i (T + S)``, where ``c_i`` is what source ``i`` gave in this
stage and ``T`` their sum), and of those the one with the largest ``w_i / (c_i + S)`` takes
it; ties go to the source first in an order shuffled by ``(seed, stage)``. Megatron's rule
(the largest ``w_i (T + 1) - c_i``) drifts past one document with several sources and ties
(1.04 with weights 1, 1, 7, 7, 7, 3), and past ``S`` in tokens.

So the choice is a pure function of ``(seed, counts)``: a state that holds the counts resumes
with the same choices, on any number of ranks. Every source stays within ``S`` of its weight
at every prefix: within one document, or within ``max_draw`` tokens (tested with Hypothesis
in ``tests/test_mixture.py``).

Stages. Weights may change along the run: a stage begins at a global count (documents or
tokens drawn since the start) with new weights, and the shares are counted from there. A
state loaded with other weights begins a new stage at its exact count, so nothing drawn
before is drawn again or skipped: only the choices from there on follow the new weights.

Pure: no I/O.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ingest.core.errors import ConfigError, StateError
from ingest.core.plan import permutation

Unit = Literal["documents", "tokens"]


@dataclass(frozen=True, slots=True)
class Stage:
    """Weights from global count ``start`` on (normalised to sum to 1)."""

    start: int
    weights: tuple[float, ...]


def _normalised(
    names: Sequence[str], weights: Mapping[str, float], where: str = "mixture weights"
) -> tuple[float, ...]:
    if not isinstance(weights, Mapping):
        raise ConfigError(
            f"{where} {weights!r} must be a dict of source name -> weight, over {list(names)}"
        )
    unknown = sorted(set(weights) - set(names), key=repr)
    if unknown:
        raise ConfigError(
            f"{where} name {unknown}, which are not sources of the mixture {list(names)}; "
            "give a weight per named source"
        )
    missing = [name for name in names if name not in weights]
    if missing:
        raise ConfigError(
            f"{where} {dict(weights)} give no weight to {missing}: give every source of the "
            f"mixture {list(names)} a weight (0 to leave one out)"
        )
    for name in names:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(
                f"{where}: {name!r} has weight {value!r} ({type(value).__name__}); a weight "
                "is a number, at least 0"
            )
    values = [float(weights[name]) for name in names]
    if any(not np.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise ConfigError(
            f"{where} {dict(zip(names, values, strict=True))} must be finite, at least "
            "0, and not all 0"
        )
    total = sum(values)
    return tuple(v / total for v in values)


class Mixture:
    """The draws of a weighted mixture (see the module docstring).

    Args:
        weights: Weight per source name, in the order the sources are listed.
        unit: What the weights count: ``"documents"`` or ``"tokens"``.
        max_draw: In tokens, the most one draw may count (the sequence length, when documents
            are cut at it before they are drawn); the bound on every source's deviation.
        seed: Orders the ties.
        schedule: Later stages: ``(global count, weights)`` pairs, counts increasing.
        ranks: Ranks that draw alike (every rank the same sources, :mod:`ingest.engine.mix`):
            a draw counts this many times towards the global count the stages begin at.
    """

    def __init__(
        self,
        weights: Mapping[str, float],
        *,
        unit: Unit = "documents",
        max_draw: int | None = None,
        seed: int = 0,
        schedule: Sequence[tuple[int, Mapping[str, float]]] = (),
        ranks: int = 1,
    ) -> None:
        if unit not in ("documents", "tokens"):
            raise ConfigError(f'unit={unit!r} must be "documents" or "tokens"')
        self.names: tuple[str, ...] = tuple(weights)
        if not self.names:
            raise ConfigError("a mixture needs at least one source")
        self.unit = unit
        if unit == "tokens" and (max_draw is None or max_draw < 1):
            raise ConfigError(
                f"a mixture counted in tokens needs max_draw >= 1 (got {max_draw}): the most "
                "tokens one draw counts, the sequence length when documents are cut at it"
            )
        self.max_draw = 1 if unit == "documents" else int(max_draw or 1)
        self.seed = seed
        if ranks < 1:
            raise ConfigError(f"ranks={ranks} must be >= 1")
        self.ranks = ranks
        self.stages: list[Stage] = [Stage(0, _normalised(self.names, weights))]
        for entry in schedule:
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise ConfigError(
                    f"schedule entry {entry!r} must be a pair (global count, weights)"
                )
            start, later = entry
            if isinstance(start, bool) or not isinstance(start, numbers.Integral) or start < 0:
                raise ConfigError(
                    f"the schedule's stage at {start!r} must begin at a global count, a whole "
                    f"number >= 0 (in {unit}, every rank's draws), not {type(start).__name__}"
                )
            if start <= self.stages[-1].start:
                raise ConfigError(
                    f"the schedule's stage at {start} does not come after the one at "
                    f"{self.stages[-1].start}; give the stages in increasing order"
                )
            where = f"the schedule's stage at {start}: weights"
            self.stages.append(Stage(int(start), _normalised(self.names, later, where)))
        self.total = 0
        """Documents or tokens drawn since the start, all stages, by all ranks."""
        self._stage = 0
        self._counts = np.zeros(len(self.names), dtype=np.int64)
        self._ties = self._order()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled by Ray, the counts' array is a read-only view of the object store's copy.
        self.__dict__.update(state)
        self._counts = self._counts.copy()

    def _order(self) -> np.ndarray:
        """Tie rank of each source in this stage (lower wins)."""
        order = permutation(len(self.names), "mixture", self.seed, self._stage, 0, 0)
        rank = np.empty(len(self.names), dtype=np.int64)
        rank[order] = np.arange(len(self.names))
        return rank

    @property
    def stage(self) -> Stage:
        return self.stages[self._stage]

    @property
    def counts(self) -> dict[str, int]:
        """What each source gave in this stage."""
        return dict(zip(self.names, self._counts.tolist(), strict=True))

    def choose(self) -> str:
        """The source of the next draw."""
        weights = np.asarray(self.stage.weights)
        counts, most = self._counts, self.max_draw
        total = int(counts.sum()) + most
        # Eligible: below its share of the total with a draw of the most counted.
        eligible = weights * total - counts > 1e-12 * total
        priority = np.where(eligible, weights / (counts + most), -np.inf)
        best = np.flatnonzero(priority == priority.max())
        return self.names[int(best[np.argmin(self._ties[best])])]

    def record(self, name: str, size: int = 1) -> None:
        """Count a draw of ``size`` (1 document, or its tokens) from source ``name``."""
        if self.unit == "documents" and size != 1:
            raise ConfigError(f"a mixture counted in documents records 1 a draw, not {size}")
        if not 0 <= size <= self.max_draw:
            raise ConfigError(
                f"a draw of {size} tokens from {name!r} is more than max_draw={self.max_draw}; "
                "cut documents at the sequence length before they are drawn"
            )
        self._counts[self.names.index(name)] += size
        self.total += size * self.ranks
        following = self._stage + 1
        if following < len(self.stages) and self.total >= self.stages[following].start:
            self._begin(following)

    def _begin(self, stage: int) -> None:
        self._stage = stage
        self._counts[:] = 0
        self._ties = self._order()

    def deviation(self) -> dict[str, float]:
        """Each source's count in this stage less its weight's share of the stage's total
        (in documents or tokens): how far the mixture is from its weights now."""
        weights = np.asarray(self.stage.weights)
        off = self._counts - weights * int(self._counts.sum())
        return dict(zip(self.names, off.tolist(), strict=True))

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The counts and the stages: a few numbers per source, whatever the run's length."""
        return {
            "unit": self.unit,
            "max_draw": self.max_draw,
            "seed": self.seed,
            "names": list(self.names),
            "total": self.total,
            "stage": self._stage,
            "stages": [{"start": s.start, "weights": list(s.weights)} for s in self.stages],
            "counts": self._counts.tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``. Where this mixture's weights for the stage reached differ
        from the state's, a new stage with this mixture's weights begins at the state's
        count: the draws from there follow them, none is repeated or skipped.

        Raises:
            StateError: If the state's sources, unit or seed are not this mixture's.
        """
        for key, ours in (
            ("names", list(self.names)),
            ("unit", self.unit),
            ("max_draw", self.max_draw),
            ("seed", self.seed),
        ):
            if state.get(key) != ours:
                raise StateError(
                    f"the state's mixture has {key} {state.get(key)!r}, this one {ours!r}; "
                    f"resume with the {key} the state was saved with"
                )
        total, stage, saved, counts = self._parsed(state)
        mine = max((s for s in self.stages if s.start <= total), key=lambda s: s.start)
        later = [s for s in self.stages if s.start > total]
        self.total = total
        if saved[stage].weights == mine.weights:
            self.stages = [*saved[: stage + 1], *later]
            self._stage = stage
            self._counts = np.asarray(counts, dtype=np.int64)
            self._ties = self._order()
            return
        # Other weights: a stage of them begins here; this mixture's later stages follow.
        self.stages = [*saved[: stage + 1], Stage(total, mine.weights), *later]
        self._begin(stage + 1)

    def _parsed(self, state: Mapping[str, Any]) -> tuple[int, int, list[Stage], list[int]]:
        """The state's ``(total, stage, stages, counts)``, checked against each other.

        Raises:
            StateError: Naming the field, its value and the rule (an edited or damaged state).
        """
        n = len(self.names)

        def bad(key: str, rule: str) -> StateError:
            value = repr(state.get(key, "(missing)"))
            value = value if len(value) <= 80 else value[:77] + "..."
            return StateError(
                f"the state's mixture has {key} {value}: {rule}; resume from a state saved by "
                "the stream (it was edited or damaged)"
            )

        def count(value: Any) -> bool:
            ints = (int, np.integer)
            return isinstance(value, ints) and not isinstance(value, bool) and bool(value >= 0)

        total: Any = state.get("total")
        if not count(total):
            raise bad("total", "the draws counted since the start are a whole number >= 0")
        stages = state.get("stages")
        saved: list[Stage] = []
        if not isinstance(stages, list) or not stages:
            raise bad("stages", "a list of the stages, each {'start', 'weights'}")
        for entry in stages:
            weights = entry.get("weights") if isinstance(entry, Mapping) else None
            if (
                not isinstance(entry, Mapping)
                or not count(entry.get("start"))
                or not isinstance(weights, list)
                or len(weights) != n
                or not all(_weight(w) for w in weights)
                or (saved and entry["start"] <= saved[-1].start)
            ):
                raise bad(
                    "stages",
                    f"each stage is {{'start': a count after the last one's, 'weights': {n} "
                    "numbers >= 0}",
                )
            saved.append(Stage(int(entry["start"]), tuple(float(w) for w in weights)))
        stage: Any = state.get("stage")
        if not count(stage) or stage >= len(saved):
            raise bad("stage", f"the stage reached is a position in its {len(saved)} stages")
        if saved[stage].start > total:
            raise bad("stage", f"its stage begins at {saved[stage].start}, after total {total}")
        counts = state.get("counts")
        if not isinstance(counts, list) or len(counts) != n or not all(map(count, counts)):
            raise bad("counts", f"one whole number >= 0 per source ({n})")
        return int(total), int(stage), saved, [int(c) for c in counts]


def _weight(value: Any) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and bool(np.isfinite(value))
        and bool(value >= 0)
    )
