"""Checks of numeric options, one helper for every config. Pure: no I/O.

Every config (:class:`ingest.Follow`, :class:`ingest.RankOptions`, the stream's
:class:`ingest.engine.spec.StreamSpec`, :class:`ingest.ReadOptions`) checks its numbers here when
it is made, so that a value that cannot work is a :class:`~ingest.core.errors.ConfigError` naming
the option, the value, the rule and a fix at once: not a wait of ``timeout_s`` blamed on the
store, nor a bare ``TypeError`` from deep inside a reader. NaN passes every comparison
unnoticed (``nan <= 0`` is false) and ``inf`` turns a timeout into a hang, so float options
must be finite; a ``bool`` is an ``int`` to Python but never a count or a duration here.

Written here rather than taken from a validation library: the configs are plain frozen
dataclasses (one per component), and a library such as pydantic would replace them and
phrase its own messages, not the option, value, rule and fix that every error of this
package gives.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

from ingest.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Number:
    """What values a numeric option takes.

    Attributes:
        least: The smallest value allowed (or the bound it must be above, with ``above``).
        above: The value must be greater than ``least``, not equal to it.
        whole: The value is a count: an ``int`` (numpy integers too), not a float.
        unit: What the number counts, said in the message (``"seconds"``, ``"bytes"``).
        optional: None is allowed too (the bound is off).
    """

    least: float
    above: bool = False
    whole: bool = False
    unit: str = ""
    optional: bool = False

    def problem(self, value: object) -> str | None:
        """Why ``value`` breaks this rule (empty: out of range), or None when it does not."""
        if value is None and self.optional:
            return None
        if isinstance(value, bool):
            return "got a bool"
        kind = numbers.Integral if self.whole else numbers.Real
        if not isinstance(value, kind):
            return f"got {type(value).__name__}"
        if not math.isfinite(float(value)):  # type: ignore[arg-type]
            return "got a number that is not finite"
        too_small = value <= self.least if self.above else value < self.least  # type: ignore[operator]
        return "" if too_small else None

    def describe(self) -> str:
        bound = f"{'>' if self.above else '>='} {self.least:g}"
        unit = f" {self.unit}" if self.unit else ""
        kind = "a whole number" if self.whole else "a finite number"
        return f"{bound}{unit}, {kind}" + (", or None" if self.optional else "")


COUNT = Number(1, whole=True)
"""A count of at least one (batches, rows, lanes, files)."""
SECONDS = Number(0, above=True, unit="seconds")
"""A duration that must pass: a timeout, a poll period."""
BYTES_OR_NONE = Number(1, whole=True, unit="bytes", optional=True)
"""A byte budget, or None for none."""


def check_numbers(options: object, owner: str, **rules: Number) -> None:
    """Check each named field of the dataclass ``options`` against its rule.

    Args:
        options: A config dataclass, made just now (called from its ``__post_init__``).
        owner: How the user names the config in code (``"Follow"``); empty for the options
            of a stream, given as arguments of ``Stream(...)``/``RayStream(...)``.
        rules: Field name -> rule.

    Raises:
        ConfigError: For the first field whose value breaks its rule, naming the option, the
            value, the rule and the default as the fix.
    """
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(options)  # type: ignore[arg-type]
        if f.default is not dataclasses.MISSING
    }
    check_values({name: getattr(options, name) for name in rules}, defaults, owner, rules)


def check_values(
    values: Mapping[str, object],
    defaults: Mapping[str, object],
    owner: str,
    rules: Mapping[str, Number],
) -> None:
    """:func:`check_numbers` over named ``values`` (keywords not yet a config), with their
    ``defaults`` for the fix.

    Raises:
        ConfigError: For the first value that breaks its rule.
    """
    for name, rule in rules.items():
        value = values[name]
        problem = rule.problem(value)
        if problem is None:
            continue
        option = f"{owner}({name}={value!r})" if owner else f"{name}={value!r}"
        fix = f"pass {name}={defaults[name]!r} (the default)" if name in defaults else ""
        got = f" ({problem})" if problem else ""
        raise ConfigError(f"{option} must be {rule.describe()}{got}; {fix}".rstrip("; "))


def check_remainder(remainder: str) -> None:
    """Refuse a ``remainder`` that is not an option.

    Raises:
        ConfigError: Naming the value and the two options.
    """
    if remainder not in ("carry", "drop"):
        raise ConfigError(
            f"remainder={remainder!r} is not an option; use 'carry' (default: "
            "rows that cannot fill a step on every rank start the next epoch) or 'drop'"
        )


__all__ = [
    "BYTES_OR_NONE",
    "COUNT",
    "SECONDS",
    "Number",
    "check_numbers",
    "check_remainder",
    "check_values",
]
