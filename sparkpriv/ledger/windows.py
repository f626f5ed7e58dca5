"""Budgets of the ledger: what they cover (a table, or a privacy unit of tables) and over which window.

A budget ``(epsilon, delta)`` covers either one table id (``kind = "table"``)
or a **privacy unit**: the tables whose ids match one of its glob patterns
(``cdr.*``, ``billing.*``), which hold the same people. Its **window** says
over which time its spends are composed:

* ``lifetime``: every spend ever made (the default);
* ``Nd`` (e.g. ``30d``): every interval of N days, ``[s, s + N days)`` for
  every ``s`` (a rolling window);
* ``month``: every calendar month, in UTC.

A spend's time is its ledger entry's ``created_at`` (when it was reserved; the
ledger keeps these times non-decreasing in the order of its journal). A
release at time ``T`` is admitted when, for every window containing ``T``, the
composition of the window's counted spends on the budget plus this release
stays within the budget. Every earlier spend is at or before ``T``, so of the
windows containing ``T`` the one with the most spends is ``(T - N days, T]``
(rolling) or ``[first of T's month, T]`` (month): :meth:`Window.start` gives its
first instant, and checking it checks them all (composition only grows with
more events). docs/ledger.md states what this guarantees.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sparkpriv.errors import ParameterError

__all__ = ["Window", "Budget", "parse_patterns", "pattern_sql"]

_PATTERN = re.compile(r"[A-Za-z0-9_.:/*?-]+")
_ROLLING = re.compile(r"([1-9][0-9]{0,4})d")
MAX_PATTERNS = 64
MAX_DAYS = 36_600


@dataclass(frozen=True)
class Window:
    """``lifetime``, a rolling window of ``days`` days, or the calendar ``month`` (UTC)."""

    kind: str = "lifetime"
    days: int = 0

    @classmethod
    def parse(cls, text: Any, caller: str = "the ledger") -> "Window":
        """``None``/``"lifetime"``, ``"30d"`` (1 to 36,600 days) or ``"month"``; :class:`ParameterError` else."""
        if text is None or text == "lifetime":
            return cls()
        if text == "month":
            return cls("month")
        m = _ROLLING.fullmatch(text) if isinstance(text, str) else None
        if m is None or int(m.group(1)) > MAX_DAYS:
            raise ParameterError(
                f"The 'window' parameter of {caller} must be 'lifetime', 'month' (each calendar month, UTC) "
                f"or a number of days such as '30d' (every 30 consecutive days; at most {MAX_DAYS}d). "
                f"Got {text!r} instead."
            )
        return cls("rolling", int(m.group(1)))

    @property
    def spec(self) -> str:
        """The stored text: ``lifetime``, ``month`` or ``30d``."""
        return f"{self.days}d" if self.kind == "rolling" else self.kind

    def start(self, at: datetime) -> datetime | None:
        """First instant of the fullest window containing ``at`` when no spend is later than ``at``.

        None for ``lifetime`` (every spend counts). Rolling: ``at - days + 1 us``
        (times have microsecond resolution, and a spend exactly ``days`` before
        shares no window of ``days`` days with ``at``); month: the first of
        ``at``'s month, 00:00 UTC.
        """
        if self.kind == "lifetime":
            return None
        at = at.astimezone(timezone.utc)
        if self.kind == "month":
            return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        return at - timedelta(days=self.days) + timedelta(microseconds=1)

    def describe(self) -> str:
        """For messages: ``over its lifetime``, ``in any 30 days``, ``in any calendar month (UTC)``."""
        if self.kind == "lifetime":
            return "over its lifetime"
        if self.kind == "month":
            return "in any calendar month (UTC)"
        return f"in any {self.days} consecutive days"

    def current(self, at: datetime) -> str:
        """For messages: the window a spend at ``at`` is checked in (no time of day: a dry run and the
        reservation that follows it state the same words)."""
        if self.kind == "lifetime":
            return "all its spends"
        if self.kind == "month":
            return f"the calendar month {at.astimezone(timezone.utc):%Y-%m} (UTC)"
        return f"the {self.days} days up to now"


@dataclass(frozen=True)
class Budget:
    """A budget as the ledger stores it: a table's own, or a privacy unit's (see the module docstring)."""

    kind: str  # "table" or "unit"
    name: str  # the table id, or the unit's name
    patterns: tuple  # the table ids it covers, as glob patterns; (name,) for a table's own budget
    epsilon: float
    delta: float
    window: Window
    updated_at: str

    def covers(self, table_id: str) -> bool:
        if self.kind == "table":
            return table_id == self.name
        return any(fnmatch.fnmatchcase(table_id, p) for p in self.patterns)

    @property
    def label(self) -> str:
        """``table 'cdr.daily'`` or ``privacy unit 'subscribers' (tables cdr.*, billing.*)``."""
        if self.kind == "table":
            return f"table '{self.name}'"
        return f"privacy unit '{self.name}' (tables {', '.join(self.patterns)})"

    @property
    def key(self) -> tuple:
        """What admission depends on (compared before and under the lock)."""
        return (self.kind, self.name, self.patterns, self.epsilon, self.delta, self.window.spec)


def parse_patterns(value: Any, caller: str) -> tuple:
    """Glob patterns of table ids from a list or a comma-separated string (``'cdr.*,billing.*'``)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ParameterError(f"The 'tables' parameter of {caller} must be a list of table-id patterns or a "
                             f"comma-separated string such as 'cdr.*,billing.*'. Got a {type(value).__name__}.")
    patterns = tuple(p.strip() for p in items if isinstance(p, str) and p.strip())
    bad = [p for p in items if not isinstance(p, str) or (p.strip() and not _PATTERN.fullmatch(p.strip()))]
    bad += [p for p in patterns if len(p) > 256]
    if bad or not patterns or len(patterns) > MAX_PATTERNS:
        raise ParameterError(
            f"The 'tables' parameter of {caller} must name 1 to {MAX_PATTERNS} table ids or glob patterns of "
            "letters, digits, _ . : / - and the wildcards * (any characters) and ? (one character), at most "
            f"256 characters each, e.g. 'cdr.*,billing.*'. Got {value!r} instead."
        )
    return tuple(dict.fromkeys(patterns))  # in order, without repeats


def pattern_sql(pattern: str) -> str:
    """A LIKE pattern (escape character ``\\``) matching at least the table ids ``pattern`` matches.

    SQLite's LIKE ignores ASCII case, so the rows it returns are filtered
    with :meth:`Budget.covers` again.
    """
    out = []
    for c in pattern:
        out.append("%" if c == "*" else "_" if c == "?" else "\\" + c if c in "%_\\" else c)
    return "".join(out)


def parse_time(text: str) -> datetime:
    """A stored UTC time (ISO 8601)."""
    t = datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def format_time(t: datetime) -> str:
    """The stored form of a time: UTC, microseconds, ``+00:00`` (so that text order is time order)."""
    return t.astimezone(timezone.utc).isoformat(timespec="microseconds")
