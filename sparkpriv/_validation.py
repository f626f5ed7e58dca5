"""Declarative parameter validation with one error template.

Public functions validate their parameters with :func:`check_params`; private
helpers assume validated input. The message template follows scikit-learn's:

    The 'epsilon' parameter of release_projection must be a float in the range
    (0, inf). Got -1 instead.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from sparkpriv.errors import ParameterError

__all__ = ["Interval", "Options", "check_params", "check_param", "refuse_row_level_add_remove"]


@dataclass(frozen=True)
class Interval:
    """A numeric range constraint.

    ``closed`` is one of ``"both"``, ``"left"``, ``"right"``, ``"neither"``.
    ``kind`` is ``"real"`` or ``"integer"``.
    """

    kind: str
    low: float | None
    high: float | None
    closed: str = "both"

    def describe(self) -> str:
        lo = "-inf" if self.low is None else _fmt(self.low)
        hi = "inf" if self.high is None else _fmt(self.high)
        left = "[" if self.closed in ("both", "left") and self.low is not None else "("
        right = "]" if self.closed in ("both", "right") and self.high is not None else ")"
        noun = "an int" if self.kind == "integer" else "a float"
        return f"{noun} in the range {left}{lo}, {hi}{right}"

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind == "integer":
            if not isinstance(value, numbers.Integral):
                return False
        elif not isinstance(value, numbers.Real):
            return False
        v = float(value)
        if math.isnan(v):
            return False
        if self.low is not None:
            if v < self.low or (v == self.low and self.closed in ("right", "neither")):
                return False
        if self.high is not None:
            if v > self.high or (v == self.high and self.closed in ("left", "neither")):
                return False
        if self.kind == "real" and math.isinf(v) and (self.low is None or self.high is None):
            # infinity is only accepted where the interval is explicitly unbounded
            # *and* closed on that side, which never happens: reject.
            return False
        return True


@dataclass(frozen=True)
class Options:
    """A constraint that the value is one of a fixed set."""

    values: tuple

    def describe(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)

    def accepts(self, value: Any) -> bool:
        return value in self.values


def _fmt(x: float) -> str:
    if float(x).is_integer():
        return str(int(x))
    return repr(float(x))


def check_param(name: str, value: Any, constraints: Iterable[Any], caller: str) -> None:
    """Raise :class:`ParameterError` unless ``value`` meets one constraint.

    ``constraints`` holds :class:`Interval`, :class:`Options`, ``None`` (the
    value may be None) or a type (``isinstance``).
    """
    constraints = list(constraints)
    for c in constraints:
        if c is None:
            if value is None:
                return
        elif isinstance(c, type):
            if isinstance(value, c) and not (c is not bool and isinstance(value, bool)):
                return
        elif c.accepts(value):
            return
    parts = []
    for c in constraints:
        if c is None:
            parts.append("None")
        elif isinstance(c, type):
            parts.append(f"an instance of {c.__name__}")
        else:
            parts.append(c.describe())
    if len(parts) == 1:
        expected = parts[0]
    else:
        expected = ", ".join(parts[:-1]) + " or " + parts[-1]
    raise ParameterError(
        f"The {name!r} parameter of {caller} must be {expected}. Got {value!r} instead."
    )


def check_params(caller: str, spec: Mapping[str, Iterable[Any]], values: Mapping[str, Any]) -> None:
    """Validate several parameters at once against ``spec``."""
    for name, constraints in spec.items():
        check_param(name, values[name], constraints, caller)


def refuse_row_level_add_remove(neighbors: Any, *, release: str, caller: str) -> None:
    """Refuse ``neighbors="add-remove"`` for a release with one output row per input record.

    Adding or removing a person adds or removes an output row, and no noise
    on the values hides the number of rows: the add-remove guarantee cannot
    hold for a row-level release (dense or event-table projection, DPRP
    rows). Replace-one (the number of records is public) is what such a
    release can state. The check uses the parameter only, so it runs before
    any data is read; call it first in every row-level entry point.
    """
    if isinstance(neighbors, str) and neighbors == "add-remove":
        raise ParameterError(
            f"The 'neighbors' parameter of {caller} cannot be 'add-remove' for {release}: the "
            "output has one row per input record, so adding or removing a person changes the "
            "number of output rows, which no noise hides. Use neighbors='replace-one' (one "
            "person replaced; the number of records is public), or an aggregate release "
            "(e.g. k-means) where adding or removing a person is meaningful."
        )
