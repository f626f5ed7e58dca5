"""The query of an aggregates release: aggregates, value clamps, the statistics measured per key, and
their sensitivities (docs/math.md section 11).

A query asks, per key, for any of ``count`` (events), ``count_distinct`` (people), ``sum(col)``,
``mean(col)``, ``variance(col)``, ``quantile(col, p, ...)`` (``median(col)`` is ``quantile(col,
0.5)``). They are answered from a few **statistics** measured per key (a *group* each, noised
once):

=============== ======================================= ===================== =============
group            per person and kept key                  a: bound per key      used by
=============== ======================================= ===================== =============
``people``       1                                        1                     count_distinct, key selection
``events``       m = min(n, c)                            c                     count, sum, mean, variance
``sum(col)``     (m / n) sum (x - mid)                    c h                   sum, mean, variance
``sumsq(col)``   (m / n) sum (x - mid)^2                  c h^2                 variance
``histogram``    (m / n) events per bucket (B buckets)    c (its L1 norm)       quantile
=============== ======================================= ===================== =============

``n``: the person's events at the key, ``c``: the cap of events per key and person, ``x``: a value
clamped to ``[lo, hi]``, ``mid = (lo + hi) / 2``, ``h = (hi - lo) / 2``. Scaling the person's events at
a key by ``m / n`` is the expectation of keeping a uniformly random ``m`` of them: the same bound as
sampling, no randomness. Sums are centred at ``mid``: a sum is released as ``sum(col) + mid events``
and a mean as ``mid + sum(col) / events``, so the three agree by construction.

Sensitivities (``L``: keys per person, ``d``: keys of the domain, ``K = min(L, d)``)::

                  add-remove       replace-one
    L1 people,
       events,
       sumsq:     K a              min(2L, d) a         (non-negative per key)
    L1 sum, hist: K a              2 K a                (signed / a vector per key)
    L2 people,
       events,
       sumsq:     sqrt(K) a        sqrt(min(2L, d)) a
    L2 sum:       sqrt(K) a        2 sqrt(K) a
    L2 hist:      sqrt(K) a        sqrt(2 K) a

``tests/mechanisms/test_aggregates.py`` checks each by brute force over every record of small
domains. Numpy only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

from sparkpriv.errors import ParameterError

__all__ = ["KINDS", "GROUP_KINDS", "Aggregate", "Group", "parse_aggregates", "parse_clamps", "parse_split",
           "groups_of", "group_bound", "group_sensitivity", "output_columns"]

KINDS = ("count", "count_distinct", "sum", "mean", "variance", "quantile")
GROUP_KINDS = ("people", "events", "sum", "sumsq", "histogram")
NONNEGATIVE = ("people", "events", "sumsq")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\((.*)\))?\s*$", re.S)


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of a query (``kind``, its value ``column``, quantile levels ``ps``)."""

    kind: str
    column: str | None = None
    ps: tuple = ()

    def output_names(self) -> list[str]:
        """The base names of its output columns (one per quantile level)."""
        if self.kind in ("count", "count_distinct"):
            return [self.kind]
        if self.kind == "quantile":
            return [f"{_level_name(p)}_{self.column}" for p in self.ps]
        return [f"{self.kind}_{self.column}"]

    def __str__(self) -> str:
        if self.kind in ("count", "count_distinct"):
            return self.kind
        if self.kind == "quantile":
            return f"quantile({self.column}, {', '.join(f'{p:g}' for p in self.ps)})"
        return f"{self.kind}({self.column})"


def _level_name(p: float) -> str:
    """``p50`` for 0.5, ``p99_5`` for 0.995, ``p0_1`` for 0.001."""
    s = f"{100 * p:.10g}".replace(".", "_")
    return f"p{s}"


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def parse_aggregates(spec, caller: str = "release_aggregates") -> tuple[Aggregate, ...]:
    """Aggregates from a string (``"count, sum(duration), median(duration)"``), a list of such strings,
    or :class:`Aggregate` objects. Duplicates are refused; quantile levels are merged per column."""
    if spec is None:
        raise ParameterError(f"The 'aggregates' parameter of {caller} is required: e.g. "
                             "'count, count_distinct, sum(duration), mean(duration), median(duration)'.")
    items = _split_top(spec) if isinstance(spec, str) else list(spec)
    if not items:
        raise ParameterError(f"The 'aggregates' parameter of {caller} is empty: name at least one aggregate.")
    out: list[Aggregate] = []
    for it in items:
        if isinstance(it, Aggregate):
            a = it
        elif isinstance(it, str):
            a = _parse_one(it, caller)
        else:
            raise ParameterError(f"The 'aggregates' parameter of {caller} must hold strings such as "
                                 f"'mean(duration)'. Got {it!r}.")
        if a.kind not in KINDS:
            raise ParameterError(f"{caller}: unknown aggregate {a.kind!r}; known: {', '.join(KINDS)}, median.")
        out.append(a)
    merged: list[Aggregate] = []
    for a in out:
        if a.kind == "quantile":
            prev = next((m for m in merged if m.kind == "quantile" and m.column == a.column), None)
            if prev is not None:
                dup = set(prev.ps) & set(a.ps)
                if dup:
                    raise ParameterError(f"{caller}: the quantile {sorted(dup)[0]:g} of {a.column!r} is asked twice.")
                merged[merged.index(prev)] = Aggregate("quantile", a.column, tuple(sorted(prev.ps + a.ps)))
                continue
        elif a in merged:
            raise ParameterError(f"{caller}: the aggregate {a} is asked twice.")
        merged.append(a)
    return tuple(merged)


def _parse_one(text: str, caller: str) -> Aggregate:
    m = _CALL.match(text)
    if not m:
        raise ParameterError(f"{caller}: cannot read the aggregate {text!r}; write e.g. 'count', "
                             "'sum(duration)' or 'quantile(duration, 0.5, 0.9)'.")
    kind, args = m.group(1).lower(), m.group(2)
    args = [a.strip() for a in args.split(",")] if args is not None and args.strip() else []
    if kind in ("count", "count_distinct"):
        if kind == "count" and args:
            raise ParameterError(f"{caller}: 'count' counts events and takes no column. Got {text!r}.")
        if len(args) > 1:
            raise ParameterError(f"{caller}: 'count_distinct' counts distinct people; write 'count_distinct' "
                                 f"or 'count_distinct(person)'. Got {text!r}.")
        return Aggregate(kind)
    if kind == "median":
        if len(args) != 1:
            raise ParameterError(f"{caller}: median takes one value column, e.g. median(duration). Got {text!r}.")
        kind, args = "quantile", [args[0], "0.5"]
    if not args or not _NAME.match(args[0]):
        raise ParameterError(f"{caller}: the aggregate {text!r} needs a value column, e.g. {kind}(duration).")
    col = args[0]
    if kind == "quantile":
        if len(args) < 2:
            raise ParameterError(f"{caller}: {text!r} needs at least one level, e.g. quantile({col}, 0.5, 0.9).")
        ps = []
        for a in args[1:]:
            try:
                p = float(a)
            except ValueError:
                p = float("nan")
            if not 0.0 < p < 1.0:
                raise ParameterError(f"{caller}: a quantile level must be a number in (0, 1). Got {a!r} in "
                                     f"{text!r}.")
            ps.append(p)
        if len(set(ps)) != len(ps):
            raise ParameterError(f"{caller}: {text!r} lists a level twice.")
        return Aggregate("quantile", col, tuple(sorted(ps)))
    if len(args) != 1:
        raise ParameterError(f"{caller}: {kind} takes one value column. Got {text!r}.")
    return Aggregate(kind, col)


def parse_clamps(spec, caller: str = "release_aggregates") -> dict:
    """``{column: (lo, hi) or "auto"}`` from ``"duration=0:3600,size=auto"``, a list of such items, or a
    mapping ``{column: (lo, hi) | "auto"}``."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        parts = [p.strip() for p in spec.split(",")] if isinstance(spec, str) else list(spec)
        items = []
        for p in parts:
            if not isinstance(p, str) or "=" not in p:
                raise ParameterError(f"{caller}: a clamp is written column=lo:hi or column=auto. Got {p!r}.")
            col, v = (x.strip() for x in p.split("=", 1))
            items.append((col, v))
    out: dict = {}
    for col, v in items:
        if not isinstance(col, str) or not _NAME.match(col):
            raise ParameterError(f"{caller}: {col!r} is not a column name (in the clamps).")
        if col in out:
            raise ParameterError(f"{caller}: the column {col!r} is clamped twice.")
        if isinstance(v, str) and v.strip().lower() == "auto":
            out[col] = "auto"
            continue
        if isinstance(v, str):
            bits = v.split(":")
            if len(bits) != 2:
                raise ParameterError(f"{caller}: the clamp of {col!r} is written lo:hi (e.g. 0:3600) or auto. "
                                     f"Got {v!r}.")
            v = bits
        try:
            lo, hi = (float(x) for x in v)
        except (TypeError, ValueError):
            raise ParameterError(f"{caller}: the clamp of {col!r} must be two numbers lo < hi or 'auto'. "
                                 f"Got {v!r}.") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ParameterError(f"{caller}: the clamp of {col!r} needs finite lo < hi. Got [{lo}, {hi}].")
        out[col] = (lo, hi)
    return out


def parse_split(spec, caller: str = "release_aggregates") -> dict:
    """Budget weights ``{group name: weight}`` from ``"count_distinct=1,sum(duration)=2"`` or a mapping."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        items = []
        for p in (_split_top(spec) if isinstance(spec, str) else list(spec)):
            if not isinstance(p, str) or "=" not in p:
                raise ParameterError(f"{caller}: a budget weight is written group=weight, e.g. "
                                     f"'histogram(duration)=2'. Got {p!r}.")
            k, v = p.rsplit("=", 1)
            items.append((k.strip(), v.strip()))
    out = {}
    for k, v in items:
        try:
            w = float(v)
        except (TypeError, ValueError):
            w = float("nan")
        if not (math.isfinite(w) and w > 0):
            raise ParameterError(f"{caller}: the budget weight of {k!r} must be a positive number. Got {v!r}.")
        out[str(k).replace(" ", "")] = w
    return out


@dataclass(frozen=True)
class Group:
    """A statistic measured per key and noised once (see the module docstring)."""

    kind: str
    column: str | None = None
    width: int = 1

    @property
    def name(self) -> str:
        if self.kind == "people":
            return "count_distinct"
        if self.kind == "events":
            return "count"
        return f"{self.kind}({self.column})"


def groups_of(aggregates, *, private_keys: bool, buckets: int) -> tuple[Group, ...]:
    """The groups a query measures, in a fixed order (people, events, then per column sum, sumsq,
    histogram)."""
    kinds = {a.kind for a in aggregates}
    out = []
    if "count_distinct" in kinds or private_keys:
        out.append(Group("people"))
    if kinds & {"count", "sum", "mean", "variance"}:
        out.append(Group("events"))
    cols = []
    for a in aggregates:
        if a.column is not None and a.column not in cols:
            cols.append(a.column)
    for col in cols:
        ks = {a.kind for a in aggregates if a.column == col}
        if ks & {"sum", "mean", "variance"}:
            out.append(Group("sum", col))
        if "variance" in ks:
            out.append(Group("sumsq", col))
        if "quantile" in ks:
            out.append(Group("histogram", col, int(buckets)))
    return tuple(out)


def group_bound(group: Group, c: int, half: float | None) -> float:
    """``a``: the largest magnitude of one person's statistic at one key (its L1 norm for a histogram)."""
    c = float(c)
    if group.kind == "people":
        return 1.0
    if group.kind in ("events", "histogram"):
        return c
    if group.kind == "sum":
        return c * float(half)
    return c * float(half) ** 2


def group_sensitivity(group: Group, *, L: int, c: int, half: float | None, d: int, neighbors: str) -> dict:
    """``{"l1", "l2", "changed", "a"}`` of one group (the module docstring's table). ``changed``: the
    coordinates one neighbour can change (every bucket of a changed key for a histogram)."""
    a = group_bound(group, c, half)
    K = min(int(L), int(d))
    K2 = min(2 * int(L), int(d))
    if neighbors == "add-remove":
        l1, l2, keys = K * a, math.sqrt(K) * a, K
    elif group.kind in NONNEGATIVE:
        l1, l2, keys = K2 * a, math.sqrt(K2) * a, K2
    elif group.kind == "sum":
        l1, l2, keys = 2 * K * a, 2 * math.sqrt(K) * a, K2
    else:  # histogram
        l1, l2, keys = 2 * K * a, math.sqrt(2 * K) * a, K2
    return {"l1": float(l1), "l2": float(l2), "changed": int(keys * group.width), "a": float(a)}


def output_columns(aggregates) -> list[str]:
    """Every output column after the key columns: per aggregate (and quantile level) the value, its
    ``_std``, ``_ci_low`` and ``_ci_high``."""
    out = []
    for a in aggregates:
        for n in a.output_names():
            out += [n, f"{n}_std", f"{n}_ci_low", f"{n}_ci_high"]
    return out
