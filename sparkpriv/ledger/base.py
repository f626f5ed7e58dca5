"""Backend-independent logic of the privacy budget ledger (docs/ledger.md).

A ledger holds budgets ``(epsilon, delta)`` over a window (a table's own, or a
privacy unit's, covering the tables whose ids match its patterns:
:mod:`sparkpriv.ledger.windows`), one entry per release with the release's
dp_accounting events, and a journal of every change in a hash chain
(:mod:`sparkpriv.ledger.chain`). What a budget has spent is the one figure of
:meth:`Spend.figure <sparkpriv.ledger.events.Spend.figure>` at its delta, of
the composition of the events of every counted entry (states ``reserved`` and
``committed``) it covers in its window; a release is admitted when that figure
with the release stays within every budget that covers its table.

This module holds everything the backends share: the SQL (written with ``?``
placeholders; a backend translates them), the budget check, the journal writes
and the messages. A backend only supplies a connection, a transaction that
serializes check-and-spend (:meth:`Ledger._transaction`) and a lock on the
journal's head (:meth:`Ledger._lock_chain`).
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import math
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fractions import Fraction
from typing import Any, Mapping, Protocol, Sequence

from dp_accounting import dp_event as _ev

from sparkpriv._validation import Interval, check_param
from sparkpriv._version import __version__
from sparkpriv.errors import BudgetExceededError, LedgerError, ParameterError
from sparkpriv.ledger import chain as _chain
from sparkpriv.ledger.checks import (DEFAULT_LEDGER_ENV, DEFAULT_LEDGER_URL, default_ledger_url, redact_url,
                                     current_job, current_user, _check_table_id, _check_text, _json_without_secrets,
                                     _printable, _corrupt_message, _label, _json_float, _strict_json,
                                     _budget_values, _no_budget_message, _refusal_message)
from sparkpriv.ledger.events import (EVENT_FORMAT, InvalidEvent, Spend, UnknownFormat, encode_event,
                                     spend_of_stored)
from sparkpriv.ledger.schema import SCHEMA, SCHEMA_VERSION, UPGRADE_FROM_1, V1_RELEASE_COLUMNS
from sparkpriv.ledger.windows import Budget, Window, format_time, parse_patterns, parse_time, pattern_sql

__all__ = ["DEFAULT_LEDGER_ENV", "DEFAULT_LEDGER_URL", "EVENT_FORMAT", "SCHEMA_VERSION", "Ledger", "Reservation",
           "BudgetSpend", "TableStatus", "UnitStatus", "default_ledger_url", "composed_epsilon", "event_epsilon",
           "redact_url"]

log = logging.getLogger(__name__)

COUNTED_STATES = ("reserved", "committed")
_POS_FINITE = Interval("real", 0, None, closed="neither")  # rejects inf
_DELTA = Interval("real", 0, 1, closed="left")
#: Optimistic rounds of reserve (compose without a lock, then lock and check the
#: history did not change) before the last round composes under the lock.
_OPTIMISTIC_ROUNDS = 6
#: A table whose counted history (summed over its covering budgets) had at most this many entries
#: when this process last reserved on it composes under the lock at once: one write transaction
#: instead of a snapshot read and a write (the composition of so few entries takes about a
#: millisecond, less than the extra transaction; a longer history composes outside the lock).
_SMALL_HISTORY = 256
#: Attempts of one transaction that the server aborted as a serialization failure or deadlock.
_TRANSIENT_ATTEMPTS = 10

_ENTRY_KEYS = ("id", "table_id", "state", "label", "mechanism", "epsilon", "created_at", "published_at",
               "aborted_at", "abort_reason", "output_path", "parameters", "receipt_summary", "events",
               "event_format", "dp_accounting_version", "host", "pid", "user_name", "job_id", "sparkpriv_version")
_ENTRY_FIELDS = ("id", "state", "mechanism", "parameters", "events", "epsilon", "epsilon_delta", "output_path",
                 "receipt_summary", "created_at", "published_at", "aborted_at", "abort_reason", "host", "pid",
                 "user_name", "job_id", "sparkpriv_version", "table_id")
_COUNTED_SQL = "state IN ('reserved', 'committed')"


def _clock() -> datetime:
    """Now, in UTC (the tests replace it to run schedules over months)."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class BudgetSpend:
    """How one budget that covers a release stood when the release was admitted (epsilons at ``delta``)."""

    kind: str  # "table" or "unit"
    name: str
    window: str
    epsilon: float
    delta: float
    spent_before: float
    requested: float
    spent_after: float
    window_start: str | None = None


@dataclass(frozen=True)
class Reservation:
    """A spend that the ledger admitted; commit it on publish, abort it on failure.

    ``id`` names the ledger entry (the release's receipt records it). The
    epsilons are those of the first budget that covers the table (its own
    budget if it has one, else the first privacy unit by name), at that
    budget's delta, ``budget_delta``, in its window; ``budgets`` holds every
    covering budget's figures. ``chain_head`` is the journal's head after the
    reservation (``seq:hash``): a copy kept elsewhere pins the chain up to it.
    """

    id: str
    table_id: str
    epsilon_requested: float
    epsilon_spent_before: float
    epsilon_spent_after: float
    budget_epsilon: float
    budget_delta: float
    budgets: tuple = field(default=(), compare=False)
    chain_head: str | None = field(default=None, compare=False)

    @property
    def epsilon_remaining_after(self) -> float:
        return max(0.0, self.budget_epsilon - self.epsilon_spent_after)


def _entries_dict(entries: list) -> list:
    out = []
    for e in entries:
        e = dict(e)
        e["events"] = json.loads(e["events"])
        e["epsilon"] = _json_float(e["epsilon"])
        e["parameters"] = _strict_json(e["parameters"])
        e["receipt_summary"] = _strict_json(e["receipt_summary"])
        out.append(e)
    return out


def _unfinished(entries: list) -> int:
    return sum(1 for e in entries if e["label"] != "reserved" and e["state"] == "reserved")


@dataclass(frozen=True)
class TableStatus:
    """Budget, spend and entries of one table, as :meth:`Ledger.status` found them.

    ``spent_epsilon`` is the figure at ``budget_delta`` of every counted entry
    (``reserved`` or ``committed``) of the table in its budget's current
    window (every entry for a ``lifetime`` budget; since ``window_start``
    otherwise); ``entries`` (dicts, see :meth:`Ledger.status`) are all of the
    table's entries, in creation order. ``units`` names the privacy units that
    also cover the table (each with its own budget: :meth:`Ledger.unit_status`).
    """

    table_id: str
    budget_epsilon: float
    budget_delta: float
    budget_updated_at: str
    spent_epsilon: float
    remaining_epsilon: float
    entries: list = field(default_factory=list)
    window: str = "lifetime"
    window_start: str | None = None
    units: tuple = ()
    budget_updated_by: str | None = None
    budget_reason: str | None = None

    @property
    def unfinished(self) -> int:
        """Entries reserved by a job that did not publish or abort (still counted)."""
        return _unfinished(self.entries)

    @property
    def counted(self) -> int:
        """Counted entries in the current window."""
        return sum(1 for e in self.entries if e["state"] in COUNTED_STATES
                   and (self.window_start is None or e["created_at"] >= self.window_start))

    def to_dict(self) -> dict:
        """A JSON-ready dict (events are parsed; non-finite floats become ``"inf"``, ``"nan"``)."""
        return {
            "table_id": self.table_id,
            "budget": {"epsilon": self.budget_epsilon, "delta": self.budget_delta, "window": self.window,
                       "updated_at": self.budget_updated_at, "updated_by": self.budget_updated_by,
                       "reason": self.budget_reason},
            "window_start": self.window_start,
            "units": list(self.units),
            "spent_epsilon": _json_float(self.spent_epsilon),
            "remaining_epsilon": _json_float(self.remaining_epsilon),
            "counted": self.counted,
            "unfinished": self.unfinished,
            "entries": _entries_dict(self.entries),
        }


@dataclass(frozen=True)
class UnitStatus:
    """A privacy unit's budget, spend and entries, as :meth:`Ledger.unit_status` found them.

    ``spent_epsilon`` is the figure at ``budget_delta`` of every counted entry
    of the tables it covers (``members``, the table ids seen in the ledger
    that match ``patterns``) in its current window (since ``window_start``);
    ``entries`` are all their entries, in creation order.
    """

    unit: str
    patterns: tuple
    budget_epsilon: float
    budget_delta: float
    window: str
    budget_updated_at: str
    spent_epsilon: float
    remaining_epsilon: float
    window_start: str | None
    members: tuple = ()
    entries: list = field(default_factory=list)
    budget_updated_by: str | None = None
    budget_reason: str | None = None

    @property
    def unfinished(self) -> int:
        return _unfinished(self.entries)

    @property
    def counted(self) -> int:
        return sum(1 for e in self.entries if e["state"] in COUNTED_STATES
                   and (self.window_start is None or e["created_at"] >= self.window_start))

    def to_dict(self) -> dict:
        return {
            "unit": self.unit,
            "tables": list(self.patterns),
            "budget": {"epsilon": self.budget_epsilon, "delta": self.budget_delta, "window": self.window,
                       "updated_at": self.budget_updated_at, "updated_by": self.budget_updated_by,
                       "reason": self.budget_reason},
            "window_start": self.window_start,
            "members": list(self.members),
            "spent_epsilon": _json_float(self.spent_epsilon),
            "remaining_epsilon": _json_float(self.remaining_epsilon),
            "counted": self.counted,
            "unfinished": self.unfinished,
            "entries": _entries_dict(self.entries),
        }


class _Tx(Protocol):
    """What a backend's transaction offers: run one statement, get its rows; send one whose result is
    not needed (a backend may queue it and send it with the next statement whose rows are read); or
    defer a query whose rows are read later."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...

    def send(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    def defer(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Queue a query; the returned callable gives its rows (queries deferred together may share one
        round trip)."""


class TransientLedgerError(LedgerError):
    """The server aborted a transaction that may succeed if run again (serialization failure, deadlock)."""


class Ledger(abc.ABC):
    """A privacy budget ledger. Open one with :func:`sparkpriv.ledger.open_ledger`.

    One object per process and thread; use it as a context manager or call
    :meth:`close`. Every method is one database transaction, except
    :meth:`reserve`, which composes outside the lock (docs/ledger.md), and a
    refused reservation, which journals the refusal in a second one.
    """

    #: Suffix of a SELECT that must lock the rows it reads until commit.
    _FOR_UPDATE = ""

    def __init__(self, url: str, *, read_only: bool = False, key_file: str | None = None, upgrade: bool = False):
        #: The URL without its password, for messages, receipts and ``ledger show``.
        self.public_url = self.url = redact_url(url)
        #: Opened for reading only (``ledger show``, reports): every write is refused.
        self.read_only = bool(read_only)
        self._key = _chain.load_key(key_file)
        self._upgrade = bool(upgrade)
        #: What opening the ledger did to its schema ("created", "upgraded from 1", or None).
        self.schema_change: str | None = None
        self._ledger_id: str | None = None
        self._history_size: dict[str, int] = {}  # table id -> counted entries at this process's last reserve

    # -- what a backend provides ------------------------------------------------

    @abc.abstractmethod
    def _transaction(self, *, write: bool) -> contextlib.AbstractContextManager[_Tx]:
        """A transaction; ``write=True`` ones serialize check-and-spend.

        A backend raises :class:`TransientLedgerError` for a failure that a
        retry of the whole transaction may not meet again.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection."""

    def _lock_schema(self, tx: _Tx) -> None:
        """Serialize concurrent schema creation (when the write lock does not)."""

    def _lock_chain(self, tx: _Tx) -> None:
        """Serialize appends to the journal (when the write lock does not)."""

    @abc.abstractmethod
    def _has_table(self, tx: _Tx, name: str) -> bool:
        """Whether the ledger's database (schema) holds a table ``name``."""

    # -- public API ------------------------------------------------------------

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def set_budget(self, table_id: str, *, epsilon: float, delta: float, window: str | None = None,
                   reason: str | None = None, job_id: str | None = None) -> None:
        """Create or change the budget of ``table_id``; the change is journalled (who, when, why).

        ``window``: ``"lifetime"`` (every spend ever), ``"30d"`` (any 30
        consecutive days) or ``"month"`` (any calendar month, UTC); None keeps
        the current window (``lifetime`` for a new budget). A budget smaller
        than what is already spent is accepted; every further release of the
        table is then refused.
        """
        caller = "Ledger.set_budget"
        _check_table_id(table_id, caller)
        check_param("epsilon", epsilon, [_POS_FINITE], caller)
        check_param("delta", delta, [_DELTA], caller)
        new_window = None if window is None else Window.parse(window, caller)
        if reason is not None:
            _check_text(reason, "reason", caller, 4096)
        job = current_job(job_id, caller)
        self._check_writable(caller)

        def run(tx: _Tx) -> None:
            head, at = self._chain_start(tx)
            old = tx.execute("SELECT time_window FROM sparkpriv_budgets WHERE table_id = ?", (table_id,))
            spec = new_window.spec if new_window is not None else (str(old[0][0]) if old else "lifetime")
            row = {"table_id": table_id, "epsilon": float(epsilon), "delta": float(delta), "updated_at": at,
                   "time_window": spec, "updated_by": current_user(), "reason": reason}
            tx.execute("INSERT INTO sparkpriv_budgets (table_id, epsilon, delta, updated_at, time_window, updated_by, "
                       "reason) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (table_id) DO UPDATE SET "
                       "epsilon = excluded.epsilon, delta = excluded.delta, updated_at = excluded.updated_at, "
                       "time_window = excluded.time_window, updated_by = excluded.updated_by, "
                       "reason = excluded.reason", tuple(row[c] for c in _chain.BUDGET_COLUMNS))
            self._chain_append(tx, head, "budget", at, {**row, **self._who(job)})

        self._atomic(run, write=True)
        log.info("ledger %s: budget of %r set to epsilon=%g, delta=%g%s (%s); chain head %s", self.url, table_id,
                 epsilon, delta, "" if window is None else f", window {window}", reason or "no reason given",
                 self._last_head)

    def set_unit(self, unit: str, *, epsilon: float, delta: float, tables: Any = None, window: str | None = None,
                 reason: str | None = None, job_id: str | None = None) -> None:
        """Create or change the privacy unit ``unit``: one budget over every table whose id matches ``tables``.

        ``tables``: glob patterns of table ids (``"cdr.*,billing.*"`` or a
        list), required when the unit is created, None keeps them. ``window``
        as in :meth:`set_budget` (None keeps it; ``lifetime`` for a new unit).
        Every release of a covered table must then also fit the unit's budget,
        composed with every release of every covered table in its window,
        including those made before the unit existed.
        """
        caller = "Ledger.set_unit"
        _check_table_id(unit, caller, "unit", "subscribers")
        check_param("epsilon", epsilon, [_POS_FINITE], caller)
        check_param("delta", delta, [_DELTA], caller)
        patterns = None if tables is None else parse_patterns(tables, caller)
        new_window = None if window is None else Window.parse(window, caller)
        if reason is not None:
            _check_text(reason, "reason", caller, 4096)
        job = current_job(job_id, caller)
        self._check_writable(caller)

        def run(tx: _Tx) -> None:
            head, at = self._chain_start(tx)
            old = tx.execute("SELECT patterns, time_window FROM sparkpriv_units WHERE unit = ?", (unit,))
            if patterns is None and not old:
                raise ParameterError(f"The privacy unit {unit!r} does not exist yet: give the tables it covers "
                                     "(--tables 'cdr.*,billing.*').")
            row = {"unit": unit,
                   "patterns": json.dumps(list(patterns)) if patterns is not None else str(old[0][0]),
                   "epsilon": float(epsilon), "delta": float(delta),
                   "time_window": new_window.spec if new_window is not None else (str(old[0][1]) if old
                                                                                  else "lifetime"),
                   "updated_at": at, "updated_by": current_user(), "reason": reason}
            tx.execute("INSERT INTO sparkpriv_units (unit, patterns, epsilon, delta, time_window, updated_at, "
                       "updated_by, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (unit) DO UPDATE SET "
                       "patterns = excluded.patterns, epsilon = excluded.epsilon, delta = excluded.delta, "
                       "time_window = excluded.time_window, updated_at = excluded.updated_at, "
                       "updated_by = excluded.updated_by, reason = excluded.reason",
                       tuple(row[c] for c in _chain.UNIT_COLUMNS))
            self._chain_append(tx, head, "unit", at, {**row, **self._who(job)})

        self._atomic(run, write=True)
        log.info("ledger %s: privacy unit %r set to epsilon=%g, delta=%g (%s); chain head %s", self.url, unit,
                 epsilon, delta, reason or "no reason given", self._last_head)

    def reserve(self, table_id: str, *, event: _ev.DpEvent, mechanism: str, parameters: Mapping[str, Any],
                output_path: str, receipt_summary: Mapping[str, Any] | None = None,
                job_id: str | None = None) -> Reservation:
        """Check every budget that covers ``table_id`` and reserve this release's spend, atomically.

        Call it before reading any data. For each budget that covers the table
        (its own, and every privacy unit whose patterns match it), the figure
        at the budget's delta of every counted entry it covers in its window
        containing now, plus ``event``, must not exceed the budget's epsilon;
        otherwise :class:`BudgetExceededError` (exit code 3) says which budget,
        what was spent, requested and remains, and the refused attempt is
        journalled. ``event`` is validated first (known classes, finite
        positive parameters, positive integer counts; :class:`ParameterError`
        otherwise). The entry records the user, the job id (``job_id``, else
        the scheduler's: :func:`sparkpriv.ledger.checks.current_job`) and the
        sparkpriv version.

        The composition runs outside the write lock on a snapshot of the
        history; under the lock the history is read again and, if it changed,
        the round starts over (the last round composes under the lock).
        """
        caller = "Ledger.reserve"
        _check_table_id(table_id, caller)
        events_json, own_spend = _encode_given_event(event, caller)
        _check_text(mechanism, "mechanism", caller, 256)
        _check_text(output_path, "output_path", caller, 4096)
        params_json = _json_without_secrets(parameters, "parameters", caller)
        summary_json = _json_without_secrets(receipt_summary, "receipt_summary", caller)
        job = current_job(job_id, caller)
        self._check_writable(caller)
        entry_id = str(uuid.uuid4())
        row = {"id": entry_id, "table_id": table_id, "state": "reserved", "mechanism": mechanism,
               "parameters": params_json, "events": events_json, "output_path": output_path,
               "receipt_summary": summary_json, "published_at": None, "aborted_at": None, "abort_reason": None,
               "host": socket.gethostname(), "pid": os.getpid(), "user_name": current_user(), "job_id": job,
               "sparkpriv_version": __version__}
        insert = (f"INSERT INTO sparkpriv_releases ({', '.join(_chain.RELEASE_COLUMNS)}) "
                  f"VALUES ({', '.join('?' for _ in _chain.RELEASE_COLUMNS)})")

        small = self._history_size.get(table_id, _SMALL_HISTORY + 1) <= _SMALL_HISTORY
        try:
            for round_ in range(_OPTIMISTIC_ROUNDS if small else 0, _OPTIMISTIC_ROUNDS + 1):
                under_lock = round_ == _OPTIMISTIC_ROUNDS
                if not under_lock:  # compose on a snapshot, holding no lock
                    t0 = _clock()
                    seen = self._atomic(lambda tx: self._history(tx, table_id, t0, lock=False), write=False)
                    self._history_size[table_id] = sum(len(rows) for _, rows in seen)
                    verdict = self._verdict(table_id, seen, own_spend, t0)

                def write(tx: _Tx):
                    head, at = self._chain_start(tx)
                    if under_lock:
                        history = self._history(tx, table_id, parse_time(at), lock=True)
                        self._history_size[table_id] = sum(len(rows) for _, rows in history)
                        v = self._verdict(table_id, history, own_spend, parse_time(at))
                    else:
                        now = self._history(tx, table_id, t0, lock=True, ids_only=True)
                        if now != [(b.key, [r[0] for r in rows]) for b, rows in seen]:
                            return None  # a budget or the set of counted entries changed since the snapshot
                        at = max(at, format_time(t0))  # the window checked is the one at t0: the spend is later
                        v = verdict
                    first = v[0]
                    row.update(epsilon=first.requested, epsilon_delta=first.delta, created_at=at)
                    tx.send(insert, tuple(row[c] for c in _chain.RELEASE_COLUMNS))
                    rec = self._chain_append(tx, head, "reserve", at,
                                             {"row": {c: _chain.value(row[c]) for c in _chain.RELEASE_COLUMNS}})
                    return v, rec

                result = self._atomic(write, write=True)
                if result is not None:
                    break
                time.sleep(random.uniform(0.0, 0.005 * (round_ + 1)))
        except BudgetExceededError as exc:
            self._record_refusal(table_id, mechanism, events_json, output_path, str(exc), job)
            raise
        verdict, rec = result
        first = verdict[0]
        log.info("ledger %s: reserved %s on %r: epsilon %.6g requested, spent %.6g -> %.6g of %.6g (delta=%g, %s "
                 "%s); chain head %s", self.url, entry_id, table_id, first.requested, first.spent_before,
                 first.spent_after, first.epsilon, first.delta, first.kind, first.name, rec.head)
        return Reservation(entry_id, table_id, first.requested, first.spent_before, first.spent_after, first.epsilon,
                           first.delta, tuple(verdict), rec.head)

    def check_admission(self, table_id: str, event: _ev.DpEvent) -> None:
        """Whether :meth:`reserve` would admit ``event`` on ``table_id`` now; writes nothing.

        A dry run of the admission check for a caller that wants to refuse an
        over-budget release before it starts any work (the command line, before
        Spark starts): it raises the :class:`BudgetExceededError` (same message,
        exit code 3) that :meth:`reserve` would raise on the ledger as it is
        now, :class:`ParameterError` for an event the ledger cannot account and
        :class:`LedgerError` for a table with a corrupt entry or budget, and
        returns None when the release would be admitted. Nothing is recorded
        (not even the refusal; a read-only ledger works too), so it is no
        reservation: other releases may spend the budget before this one
        reserves, and only :meth:`reserve` admits.
        """
        caller = "Ledger.check_admission"
        _check_table_id(table_id, caller)
        _, own_spend = _encode_given_event(event, caller)
        at = _clock()
        history = self._atomic(lambda tx: self._history(tx, table_id, at, lock=False), write=False)
        self._verdict(table_id, history, own_spend, at)

    def commit(self, reservation_id: str, *, output_path: str | None = None,
               receipt_summary: Mapping[str, Any] | None = None) -> None:
        """Mark a reservation published (``committed``); idempotent; journalled."""
        caller = "Ledger.commit"
        _check_text(reservation_id, "reservation_id", caller, 256)
        if output_path is not None:
            _check_text(output_path, "output_path", caller, 4096)
        summary_json = _json_without_secrets(receipt_summary, "receipt_summary", caller)
        job = current_job(None, caller)
        self._check_writable(caller)

        def run(tx: _Tx) -> bool:
            head, at, rows = self._chain_start_and(tx, *self._entry_state_query(reservation_id))
            state, reason, path, summary = self._entry_state_of(rows, reservation_id)
            if state == "committed":
                return False
            if state == "aborted":
                raise LedgerError(
                    f"Reservation {reservation_id} in ledger {self.url} was aborted ({_printable(reason)}) and "
                    "its budget released, so its output must not be published. Reserve again."
                )
            path = output_path if output_path is not None else path
            summary = summary_json if summary_json is not None else summary
            tx.send(
                "UPDATE sparkpriv_releases SET state = 'committed', published_at = ?, output_path = ?, "
                "receipt_summary = ? WHERE id = ?", (at, path, summary, reservation_id))
            self._chain_append(tx, head, "commit", at, {"id": reservation_id, "published_at": at,
                                                        "output_path": path, "receipt_summary": summary,
                                                        **self._who(job)})
            return True

        if self._atomic(run, write=True):
            log.info("ledger %s: committed %s; chain head %s", self.url, reservation_id, self._last_head)

    def abort(self, reservation_id: str, *, reason: str) -> None:
        """Release a reservation whose output was not published; idempotent; journalled (who, when, why)."""
        caller = "Ledger.abort"
        _check_text(reservation_id, "reservation_id", caller, 256)
        _check_text(reason, "reason", caller, 4096)
        job = current_job(None, caller)
        self._check_writable(caller)

        def run(tx: _Tx) -> bool:
            head, at = self._chain_start(tx)
            state = self._entry_state(tx, reservation_id, caller)[0]
            if state == "aborted":
                return False
            if state == "committed":
                raise LedgerError(
                    f"Reservation {reservation_id} in ledger {self.url} is committed: its output was "
                    "published, so its spend cannot be released."
                )
            tx.send(
                "UPDATE sparkpriv_releases SET state = 'aborted', aborted_at = ?, abort_reason = ? WHERE id = ?",
                (at, reason, reservation_id))
            self._chain_append(tx, head, "abort", at, {"id": reservation_id, "aborted_at": at, "reason": reason,
                                                       **self._who(job)})
            return True

        if self._atomic(run, write=True):
            log.info("ledger %s: aborted %s (%s); chain head %s", self.url, reservation_id, reason, self._last_head)

    def status(self, table_id: str) -> TableStatus:
        """The budget of ``table_id``, its spend in the budget's current window, and every entry of the table.

        Each entry is a dict with ``id, table_id, state`` (stored: reserved,
        committed, aborted), ``label`` (``state``, except that a reserved entry
        reads ``unfinished`` when its process on this host is gone and
        ``reserved (unfinished?)`` when it was made on another host),
        ``mechanism, epsilon`` (its own, at the budget's delta), ``created_at,
        published_at, aborted_at, abort_reason, output_path, parameters,
        receipt_summary, events`` (JSON text for ``events_from_json``),
        ``event_format`` (1 for entries stored before the format stamp),
        ``dp_accounting_version`` (None for format 1), ``host, pid, user_name,
        job_id, sparkpriv_version``.

        A stored entry or budget that fails validation raises
        :class:`LedgerError` naming it (the table is blocked until it is
        repaired).
        """
        _check_table_id(table_id, "Ledger.status")
        at = _clock()

        def run(tx: _Tx):
            budget = self._table_budget(tx, table_id, lock=False)
            if budget is None:
                raise LedgerError(_no_budget_message(self.url, table_id))
            units = [u.name for u in self._units(tx) if u.covers(table_id)]
            rows = tx.execute(f"SELECT {', '.join(_ENTRY_FIELDS)} FROM sparkpriv_releases WHERE table_id = ? "
                              "ORDER BY created_at, id", (table_id,))
            who = tx.execute("SELECT updated_by, reason FROM sparkpriv_budgets WHERE table_id = ?", (table_id,))
            return budget, units, rows, who[0]

        budget, units, rows, who = self._atomic(run, write=False)
        entries, spent = self._spent(budget, rows, at)
        start = budget.window.start(at)
        return TableStatus(table_id, budget.epsilon, budget.delta, budget.updated_at, spent,
                           max(0.0, budget.epsilon - spent), entries, budget.window.spec,
                           None if start is None else format_time(start), tuple(units), who[0], who[1])

    def unit_status(self, unit: str) -> UnitStatus:
        """A privacy unit's budget, its spend in the current window, and every entry of the tables it covers."""
        _check_table_id(unit, "Ledger.unit_status", "unit", "subscribers")
        at = _clock()

        def run(tx: _Tx):
            (budget,) = [u for u in self._units(tx) if u.name == unit] or [None]
            if budget is None:
                raise LedgerError(f"There is no privacy unit {unit!r} in ledger {self.url}; `sparkpriv ledger show` "
                                  "lists them.")
            where, params = self._covered_sql(budget)
            rows = tx.execute(f"SELECT {', '.join(_ENTRY_FIELDS)} FROM sparkpriv_releases WHERE {where} "
                              "ORDER BY created_at, id", params)
            who = tx.execute("SELECT updated_by, reason FROM sparkpriv_units WHERE unit = ?", (unit,))
            return budget, [r for r in rows if budget.covers(r[-1])], who[0]

        budget, rows, who = self._atomic(run, write=False)
        entries, spent = self._spent(budget, rows, at)
        start = budget.window.start(at)
        return UnitStatus(unit, budget.patterns, budget.epsilon, budget.delta, budget.window.spec,
                          budget.updated_at, spent, max(0.0, budget.epsilon - spent),
                          None if start is None else format_time(start),
                          tuple(sorted({e["table_id"] for e in entries})), entries, who[0], who[1])

    def tables(self) -> list[str]:
        """Table ids that have a budget of their own, sorted."""
        return self._atomic(
            lambda tx: [r[0] for r in tx.execute("SELECT table_id FROM sparkpriv_budgets ORDER BY table_id")],
            write=False)

    def units(self) -> list[str]:
        """Names of the privacy units, sorted."""
        return self._atomic(lambda tx: [r[0] for r in tx.execute("SELECT unit FROM sparkpriv_units ORDER BY unit")],
                            write=False)

    def budgets_for(self, table_id: str) -> list[Budget]:
        """The budgets that cover ``table_id``: its own (if any) first, then the privacy units' by name."""
        _check_table_id(table_id, "Ledger.budgets_for")
        return self._atomic(lambda tx: self._covering(tx, table_id, lock=False), write=False)

    def unfinished(self) -> list[dict]:
        """Every entry still ``reserved`` (running, or whose job died: still counted), oldest first."""
        rows = self._atomic(lambda tx: tx.execute(f"SELECT {', '.join(_ENTRY_FIELDS)} FROM sparkpriv_releases "
                                                  "WHERE state = 'reserved' ORDER BY created_at, id"), write=False)
        out = []
        for row in rows:
            d = dict(zip(_ENTRY_FIELDS, row))
            with contextlib.suppress(TypeError, ValueError):
                d["pid"] = int(d["pid"])
            d["label"] = _label(d["state"], d["host"], d["pid"])
            out.append(d)
        return out

    def entry(self, entry_id: str) -> dict:
        """One entry (as in :meth:`status`, its own epsilon at the delta it was reserved at)."""
        _check_text(entry_id, "entry_id", "Ledger.entry", 256)
        rows = self._atomic(lambda tx: tx.execute(f"SELECT {', '.join(_ENTRY_FIELDS)} FROM sparkpriv_releases "
                                                  "WHERE id = ?", (entry_id,)), write=False)
        if not rows:
            raise LedgerError(f"There is no entry with id {entry_id!r} in ledger {self.url}.")
        row = rows[0]
        return self._entry(row[-1], row, float(row[_ENTRY_FIELDS.index("epsilon_delta")]))[0]

    def history(self, *, kinds: Sequence[str] | None = None, since_seq: int = 0) -> list[dict]:
        """The journal: one dict per record (``seq, kind, at, hash`` and its body's fields), oldest first.

        ``kinds`` keeps those kinds only (``budget``, ``unit``, ``reserve``,
        ``commit``, ``abort``, ``refuse``, ...). The journal is not verified
        here: :meth:`verify` does that.
        """
        rows = self._atomic(lambda tx: tx.execute(
            "SELECT seq, kind, at, body, hash FROM sparkpriv_journal WHERE seq > ? ORDER BY seq", (since_seq,)),
            write=False)
        out = []
        for seq, kind, at, body, hash_ in rows:
            if kinds is not None and kind not in kinds:
                continue
            try:
                fields = json.loads(body)
            except (TypeError, ValueError, RecursionError):
                fields = {"unreadable": True}
            if not isinstance(fields, dict):
                fields = {"unreadable": True}
            out.append({**fields, "seq": seq, "kind": kind, "at": at, "hash": hash_})
        return out

    def head(self) -> str | None:
        """The journal's head, ``seq:hash`` (None for an empty journal)."""
        head = self._atomic(self._head, write=False)
        return None if head is None else head.head

    def verify(self, *, pins: Sequence[str] = (), key_file: str | None = None) -> _chain.VerifyReport:
        """Recompute the journal's hash chain, replay it, and compare it with what admission reads.

        ``pins``: heads (``seq:hash``) copied elsewhere (receipts, logs) that
        the chain must still hold. ``key_file``: the chain's key (default: the
        ledger's, from ``$SPARKPRIV_LEDGER_KEY_FILE``); a keyed chain cannot be
        fully verified without it. Returns a
        :class:`~sparkpriv.ledger.chain.VerifyReport` (``ok``, ``first``
        broken record or entry, every problem).
        """
        key = _chain.load_key(key_file) if key_file is not None else self._key

        def run(tx: _Tx):
            meta = dict(tx.execute("SELECT key, value FROM sparkpriv_meta"))
            records = [_chain.Record(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in tx.execute(
                "SELECT seq, kind, at, body, prev, hash FROM sparkpriv_journal ORDER BY seq")]
            state = {
                "releases": self._rows(tx, "sparkpriv_releases", _chain.RELEASE_COLUMNS),
                "budgets": self._rows(tx, "sparkpriv_budgets", _chain.BUDGET_COLUMNS),
                "units": self._rows(tx, "sparkpriv_units", _chain.UNIT_COLUMNS),
            }
            return meta, records, state

        meta, records, state = self._atomic(run, write=False)
        rep = _chain.verify(meta.get("ledger_id"), records, state, key=key, pins=pins)
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            rep.problems.append(_chain.Problem(f"sparkpriv_meta says schema version "
                                               f"{_printable(meta.get('schema_version'))[:20]}"))
        return rep

    def _journalled_events(self, entry_id: str) -> str | None:
        """The stored events of ``entry_id`` as its reservation's journal record holds them (None if none does)."""
        like = "%" + _chain.canonical({"id": entry_id})[1:-1].replace("\\", "\\\\").replace("%", "\\%") \
            .replace("_", "\\_") + "%"
        rows = self._atomic(lambda tx: tx.execute(
            "SELECT body FROM sparkpriv_journal WHERE kind IN ('reserve', 'import') AND body LIKE ? ESCAPE '\\'",
            (like,)), write=False)
        for (body,) in rows:
            with contextlib.suppress(TypeError, ValueError, AttributeError, RecursionError):
                row = json.loads(body)["row"]
                if row["id"] == entry_id:
                    return row["events"]
        return None

    def _record_hash(self, seq: int) -> str | None:
        rows = self._atomic(lambda tx: tx.execute("SELECT hash FROM sparkpriv_journal WHERE seq = ?", (seq,)),
                            write=False)
        return str(rows[0][0]) if rows else None

    # -- shared helpers (validated input) --------------------------------------

    _last_head: str | None = None

    def _atomic(self, fn, *, write: bool):
        """``fn(tx)`` in one transaction, run again (a bounded number of times) after a transient failure."""
        for attempt in range(_TRANSIENT_ATTEMPTS):
            try:
                with self._transaction(write=write) as tx:
                    return fn(tx)
            except TransientLedgerError as exc:
                last = exc
                time.sleep(random.uniform(0.0, min(0.2, 0.01 * 2 ** attempt)))
        raise LedgerError(f"{last} It failed {_TRANSIENT_ATTEMPTS} times in a row; try again later.") from last

    def _check_writable(self, caller: str) -> None:
        if self.read_only:
            raise LedgerError(f"{caller}: the ledger {self.url} was opened read-only; open it without "
                              "'?mode=ro' / read_only=True to change it.")

    def _who(self, job: str | None) -> dict:
        return {"by": current_user(), "job": job, "host": socket.gethostname(), "pid": os.getpid(),
                "version": __version__}

    def _rows(self, tx: _Tx, table: str, columns: Sequence[str]) -> dict:
        return {r[0]: dict(zip(columns, r)) for r in tx.execute(f"SELECT {', '.join(columns)} FROM {table}")}

    # -- the journal -----------------------------------------------------------

    _HEAD_SQL = "SELECT seq, at, prev, hash FROM sparkpriv_journal ORDER BY seq DESC LIMIT 1"

    def _head(self, tx: _Tx) -> _chain.Record | None:
        return self._head_of(tx.execute(self._HEAD_SQL))

    @staticmethod
    def _head_of(rows: list) -> _chain.Record | None:
        if not rows:
            return None
        seq, at, prev, hash_ = rows[0]
        return _chain.Record(int(seq), "", str(at), "", str(prev), str(hash_))

    def _locked_head_rows(self, tx: _Tx) -> list:
        """Lock the journal (:meth:`_lock_chain`), then read its head's row."""
        self._lock_chain(tx)
        return tx.execute(self._HEAD_SQL)

    def _chain_start(self, tx: _Tx) -> tuple[_chain.Record | None, str]:
        """Lock the journal; its head and the time of the next record (never before the head's)."""
        head = self._head_of(self._locked_head_rows(tx))
        at = format_time(_clock())
        return head, (max(at, head.at) if head is not None else at)

    def _chain_start_and(self, tx: _Tx, sql: str, params: Sequence[Any]) -> tuple[_chain.Record | None, str, list]:
        """:meth:`_chain_start`, and the rows of one more query read after the lock, sent with the head's
        query (one round trip where the backend pipelines)."""
        self._lock_chain(tx)
        head_rows = tx.defer(self._HEAD_SQL)
        rows = tx.defer(sql, params)
        head = self._head_of(head_rows())
        rows = rows()
        at = format_time(_clock())
        return head, (max(at, head.at) if head is not None else at), rows

    def _chain_append(self, tx: _Tx, head: _chain.Record | None, kind: str, at: str, body: dict) -> _chain.Record:
        """Append a record after ``head`` (read under :meth:`_chain_start`'s lock, in this transaction)."""
        if head is None:
            seq, prev = 1, _chain.genesis_prev(self._ledger_id or "")
        else:
            seq, prev = head.seq + 1, head.hash
        keyed = _chain.key_id_of(prev)
        if keyed is not None and (self._key is None or self._key.id != keyed):
            raise LedgerError(
                f"The journal of ledger {self.url} is keyed (key {keyed}); "
                + ("this process has no key" if self._key is None else f"this process's key is {self._key.id}")
                + f". Set {_chain.KEY_FILE_ENV} to the file that holds the ledger's key (docs/ledger.md, "
                "'Tamper evidence'); nothing was written."
            )
        if keyed is None and self._key is not None and kind != "genesis" and head is not None:
            # this process holds a key and the chain is not keyed yet: key it from here on
            text = _chain.canonical({"key_id": self._key.id, **self._who(current_job())})
            rec = _chain.Record(seq, "key", at, text, prev, _chain.record_hash(seq, "key", at, prev, text, self._key))
            self._insert_record(tx, rec)
            seq, prev = seq + 1, rec.hash
        text = _chain.canonical(body)
        rec = _chain.Record(seq, kind, at, text, prev, _chain.record_hash(seq, kind, at, prev, text, self._key))
        self._insert_record(tx, rec)
        self._last_head = rec.head
        return rec

    def _insert_record(self, tx: _Tx, rec: _chain.Record) -> None:
        tx.send("INSERT INTO sparkpriv_journal (seq, kind, at, body, prev, hash) VALUES (?, ?, ?, ?, ?, ?)",
                   (rec.seq, rec.kind, rec.at, rec.body, rec.prev, rec.hash))

    def _record_refusal(self, table_id: str, mechanism: str, events_json: str, output_path: str, message: str,
                        job: str | None) -> None:
        """Journal a refused reservation (its own transaction); a failure to do so is logged, not raised."""
        def run(tx: _Tx) -> None:
            head, at = self._chain_start(tx)
            self._chain_append(tx, head, "refuse", at, {"table_id": table_id, "mechanism": mechanism,
                                                        "events": events_json, "output_path": output_path,
                                                        "reason": message[:8000], **self._who(job)})
        try:
            self._atomic(run, write=True)
        except Exception:  # the refusal itself must reach the caller
            log.exception("ledger %s: the refused release of %r could not be journalled", self.url, table_id)

    # -- schema ----------------------------------------------------------------

    def _ensure_schema(self) -> None:
        if self.read_only:
            self._atomic(self._check_schema, write=False)
            return

        def run(tx: _Tx) -> None:
            self._lock_schema(tx)
            found = self._schema_version(tx)
            if found == "1" and self._upgrade:
                self._upgrade_from_1(tx)
                return
            if found is not None and found != str(SCHEMA_VERSION):
                raise LedgerError(self._version_message(found))
            for statement in SCHEMA:
                tx.execute(statement)
            self._check_schema(tx, create=True)

        self._atomic(run, write=True)

    def _schema_version(self, tx: _Tx) -> str | None:
        if not self._has_table(tx, "sparkpriv_meta"):
            return None
        rows = tx.execute("SELECT value FROM sparkpriv_meta WHERE key = 'schema_version'")
        return str(rows[0][0]) if rows else None

    def _version_message(self, found: str) -> str:
        if found == "1":
            return (
                f"The ledger {self.url} has schema version 1 (written by an older sparkpriv); this sparkpriv uses "
                f"version {SCHEMA_VERSION} (privacy units, windows, a tamper-evident journal). Nothing was changed. "
                "Back it up, stop the jobs that write to it, and upgrade it once with `sparkpriv ledger upgrade "
                f"--ledger '{self.url}'` (from Python: sparkpriv.ledger.upgrade_ledger(url)); older sparkpriv "
                "versions cannot write to it afterwards."
            )
        return (f"The ledger {self.url} has schema version {_printable(found)[:40]}; this sparkpriv reads "
                f"version {SCHEMA_VERSION}. Use the sparkpriv version that wrote it (or newer).")

    def _check_schema(self, tx: _Tx, create: bool = False) -> None:
        if not create and not self._has_table(tx, "sparkpriv_meta"):
            raise LedgerError(f"{self.url} is not a sparkpriv ledger (it has no sparkpriv_meta table); "
                              "check the URL. A read-only ledger must have been created before.")
        found = self._schema_version(tx)
        if found is None and create:
            self._ledger_id = str(uuid.uuid4())
            tx.execute("INSERT INTO sparkpriv_meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            tx.execute("INSERT INTO sparkpriv_meta (key, value) VALUES ('ledger_id', ?)", (self._ledger_id,))
            head, at = self._chain_start(tx)
            self._chain_append(tx, head, "genesis", at, {"ledger_id": self._ledger_id, "schema_version":
                                                         SCHEMA_VERSION, **self._who(current_job())})
            self.schema_change = "created"
            return
        if found != str(SCHEMA_VERSION):
            raise LedgerError(self._version_message(found if found is not None else "(none)"))
        rows = tx.execute("SELECT value FROM sparkpriv_meta WHERE key = 'ledger_id'")
        self._ledger_id = str(rows[0][0]) if rows else None

    def _upgrade_from_1(self, tx: _Tx) -> None:
        """Convert a version-1 ledger (in the caller's transaction) and journal what it held, as found."""
        for statement in UPGRADE_FROM_1:
            tx.execute(statement)
        for statement in SCHEMA:
            tx.execute(statement)
        self._ledger_id = str(uuid.uuid4())
        tx.execute("UPDATE sparkpriv_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        tx.execute("INSERT INTO sparkpriv_meta (key, value) VALUES ('ledger_id', ?)", (self._ledger_id,))
        budgets = tx.execute(f"SELECT {', '.join(_chain.BUDGET_COLUMNS)} FROM sparkpriv_budgets ORDER BY table_id")
        releases = tx.execute(f"SELECT {', '.join(_chain.RELEASE_COLUMNS)} FROM sparkpriv_releases "
                              "ORDER BY created_at, id")
        head, at = self._chain_start(tx)
        head = self._chain_append(tx, head, "upgrade", at, {"from": 1, "to": SCHEMA_VERSION, "ledger_id":
                                                            self._ledger_id, "budgets": len(budgets),
                                                            "releases": len(releases), **self._who(current_job())})
        for b in budgets:
            head = self._chain_append(tx, head, "budget", at, {**{c: _chain.value(v) for c, v in
                                                                  zip(_chain.BUDGET_COLUMNS, b)}, "imported": True})
        for r in releases:
            head = self._chain_append(tx, head, "import", at, {"row": {c: _chain.value(v) for c, v in
                                                                       zip(_chain.RELEASE_COLUMNS, r)}})
        self.schema_change = f"upgraded from version 1: {len(budgets)} budget(s), {len(releases)} entr(y/ies)"

    # -- budgets and admission -------------------------------------------------

    def _table_budget(self, tx: _Tx, table_id: str, *, lock: bool) -> Budget | None:
        sql = "SELECT epsilon, delta, updated_at, time_window FROM sparkpriv_budgets WHERE table_id = ?"
        rows = tx.execute(sql + (self._FOR_UPDATE if lock else ""), (table_id,))
        if not rows:
            return None
        return self._budget_of((table_id, None, rows[0][0], rows[0][1], rows[0][3], rows[0][2]))

    def _units(self, tx: _Tx) -> list[Budget]:
        return [self._unit_of(r) for r in tx.execute(
            "SELECT unit, patterns, epsilon, delta, time_window, updated_at FROM sparkpriv_units ORDER BY unit")]

    def _unit_of(self, row: tuple) -> Budget:
        unit, patterns, eps, delta, window, updated = row
        what = f"privacy unit '{_printable(unit)[:256]}'"
        epsilon, delta = _budget_values(self.url, what, eps, delta)
        try:
            pats = parse_patterns(json.loads(patterns), "the ledger")
        except (TypeError, ValueError, RecursionError, ParameterError):
            raise LedgerError(f"The budget of {what} in ledger {self.url} is corrupt: its tables are not a list "
                              "of table-id patterns. No release is admitted until it is set again "
                              "(`sparkpriv ledger set-budget --unit ... --tables ...`).") from None
        return Budget("unit", str(unit), pats, epsilon, delta, self._window(window, what), str(updated))

    def _budget_of(self, row: tuple) -> Budget:
        table_id, _, eps, delta, window, updated = row
        what = f"table '{table_id}'"
        epsilon, delta = _budget_values(self.url, what, eps, delta)
        return Budget("table", table_id, (table_id,), epsilon, delta, self._window(window, what), str(updated))

    def _window(self, spec: Any, what: str) -> Window:
        try:
            return Window.parse(spec)
        except ParameterError:
            raise LedgerError(f"The budget of {what} in ledger {self.url} is corrupt: its window is "
                              f"{_printable(repr(spec))[:40]}. No release it covers is admitted until it is set "
                              "again (`sparkpriv ledger set-budget ... --window`).") from None

    def _covering(self, tx: _Tx, table_id: str, *, lock: bool) -> list[Budget]:
        """The table's own budget and the units covering it, in one query.

        ``lock`` is for the reader's information: a write transaction holds the
        journal's lock (:meth:`_chain_start`), which every change of a budget,
        a unit or an entry takes first, so nothing it reads can change under it.
        """
        rows = tx.execute(
            "SELECT 0, table_id, NULL, epsilon, delta, time_window, updated_at FROM sparkpriv_budgets "
            "WHERE table_id = ? UNION ALL SELECT 1, unit, patterns, epsilon, delta, time_window, updated_at FROM sparkpriv_units "
            "ORDER BY 1, 2", (table_id,))
        own = [self._budget_of(r[1:]) for r in rows if r[0] == 0]
        return own + [u for u in (self._unit_of(r[1:]) for r in rows if r[0] == 1) if u.covers(table_id)]

    def _covered_sql(self, budget: Budget) -> tuple[str, list]:
        """A WHERE clause matching (at least) the entries of the tables ``budget`` covers."""
        if budget.kind == "table":
            return "table_id = ?", [budget.name]
        return ("(" + " OR ".join("table_id LIKE ? ESCAPE '\\'" for _ in budget.patterns) + ")",
                [pattern_sql(p) for p in budget.patterns])

    def _history(self, tx: _Tx, table_id: str, at: datetime, *, lock: bool, ids_only: bool = False):
        """``[(budget, [(id, table_id, events, state, created_at), ...] by id), ...]`` for every budget covering
        ``table_id``: the counted entries it covers in its window containing ``at`` (``table_id`` None for a
        table's own budget, ``created_at`` None unless its window is rolling).

        With ``lock``, the caller holds the journal's lock (every write takes it
        first: nothing read here can change until the transaction ends).
        With ``ids_only`` each budget is its ``key`` and its entries their ids
        (the check under the lock: the ledger never changes a stored entry's
        events or time, only its state).
        """
        budgets = self._covering(tx, table_id, lock=lock)
        if not budgets:
            raise BudgetExceededError(_no_budget_message(self.url, table_id))
        out = []
        for b in budgets:
            where, params = self._covered_sql(b)
            start = b.window.start(at)
            if start is not None:
                where += " AND created_at >= ?"
                params.append(format_time(start))
            # a table's own budget needs no table ids; only a rolling window's refusal states the oldest time
            table = "table_id" if b.kind == "unit" else "NULL"
            cols = f"id, {table}" if ids_only else \
                f"id, {table}, events, state, {'created_at' if b.window.kind == 'rolling' else 'NULL'}"
            rows = tx.execute(f"SELECT {cols} FROM sparkpriv_releases WHERE {_COUNTED_SQL} AND {where} ORDER BY id",
                              params)
            if b.kind == "unit":  # LIKE matched a superset (SQLite's ignores case): the patterns decide
                rows = [r for r in rows if b.covers(r[1])]
            out.append((b.key, [r[0] for r in rows]) if ids_only else (b, rows))
        return out

    def _verdict(self, table_id: str, history, own_spend: Spend, at: datetime) -> list[BudgetSpend]:
        """Every covering budget's figures with this release, or BudgetExceededError for the first it exceeds."""
        out = []
        for budget, rows in history:
            spent = Spend.total(self._stored(r[1] or budget.name, r[0], r[2]).spend for r in rows)
            before = spent.epsilon(budget.delta)
            own = own_spend.epsilon(budget.delta)
            # One figure (Spend.figure) is admitted by and stated: no tolerance; an exact sum of
            # pure epsilons is compared in rational arithmetic, any other figure is an upper bound
            # (the Gaussian part is rounded up, PLD is pessimistic).
            after, exact = (spent + own_spend).figure(budget.delta)
            within = exact <= Fraction(budget.epsilon) if exact is not None else after <= budget.epsilon
            if not within:
                pending = sum(1 for r in rows if r[3] == "reserved")
                oldest = min((r[4] for r in rows if r[4] is not None), default=None)
                raise BudgetExceededError(_refusal_message(
                    self.url, table_id, budget, before, own, after, len(rows), pending, at, oldest))
            start = budget.window.start(at)
            out.append(BudgetSpend(budget.kind, budget.name, budget.window.spec, budget.epsilon, budget.delta,
                                   before, own, after, None if start is None else format_time(start)))
        return out

    def _spent(self, budget: Budget, rows, at: datetime) -> tuple[list, float]:
        """Entries (dicts) of ``rows`` and the figure of those counted in ``budget``'s window at ``at``."""
        start = budget.window.start(at)
        start_text = None if start is None else format_time(start)
        entries, spends = [], []
        for row in rows:
            entry, stored = self._entry(row[-1], row, budget.delta)
            entries.append(entry)
            if entry["state"] in COUNTED_STATES and (start_text is None or entry["created_at"] >= start_text):
                spends.append(stored.spend)
        return entries, Spend.total(spends).epsilon(budget.delta)

    def _stored(self, table_id: str, entry_id: Any, text: Any):
        try:
            return spend_of_stored(text)
        except UnknownFormat as exc:
            raise LedgerError(
                f"Entry {_printable(str(entry_id))[:64]} of table '{table_id}' in ledger {self.url} cannot be "
                f"read: {exc}. No release of '{table_id}' is admitted until it can be accounted."
            ) from None
        except InvalidEvent as exc:
            raise LedgerError(_corrupt_message(self.url, table_id, entry_id, f"its events are invalid: {exc}")) \
                from None

    def _entry(self, table_id: str, row: tuple, budget_delta: float):
        e = dict(zip(_ENTRY_FIELDS, row))
        e["table_id"] = table_id
        stored = self._stored(table_id, e["id"], e["events"])
        try:
            e["pid"] = int(e["pid"])
            e["parameters"] = json.loads(e["parameters"])
            if e["receipt_summary"] is not None:
                e["receipt_summary"] = json.loads(e["receipt_summary"])
            own = float(e["epsilon"])
            own_delta = float(e["epsilon_delta"])
            if not isinstance(e["created_at"], str):
                raise TypeError
        except (TypeError, ValueError, RecursionError) as exc:
            raise LedgerError(_corrupt_message(self.url, table_id, e["id"], f"a field is unreadable "
                                               f"({type(exc).__name__})")) from None
        if own_delta != budget_delta or math.isnan(own) or own < 0:  # e.g. the budget's delta changed since
            own = stored.spend.epsilon(budget_delta)
        e.update(epsilon=own, label=_label(e["state"], e["host"], e["pid"]), events=stored.event_json,
                 event_format=stored.event_format, dp_accounting_version=stored.dp_accounting)
        return {k: e[k] for k in _ENTRY_KEYS}, stored

    def _entry_state(self, tx: _Tx, reservation_id: str, caller: str) -> tuple:
        return self._entry_state_of(tx.execute(*self._entry_state_query(reservation_id)), reservation_id)

    def _entry_state_query(self, reservation_id: str) -> tuple[str, tuple]:
        return ("SELECT state, abort_reason, output_path, receipt_summary FROM sparkpriv_releases WHERE id = ?"
                + self._FOR_UPDATE, (reservation_id,))

    def _entry_state_of(self, rows: list, reservation_id: str) -> tuple:
        if not rows:
            raise LedgerError(f"There is no reservation with id {reservation_id!r} in ledger {self.url}.")
        return tuple(rows[0])


def _encode_given_event(event: Any, caller: str) -> tuple[str, Spend]:
    """Stored text and spend of a caller's event, or :class:`ParameterError` saying what is wrong."""
    if not isinstance(event, _ev.DpEvent):
        raise ParameterError(
            f"The 'event' parameter of {caller} must be a dp_accounting DpEvent. "
            f"Got a {type(event).__name__} instead."
        )
    try:
        return encode_event(event)
    except InvalidEvent as exc:
        raise ParameterError(
            f"The 'event' parameter of {caller} cannot be accounted: {exc}. The ledger accounts "
            "Gaussian, Laplace and discrete Laplace events with finite positive parameters, Poisson-sampled "
            "Gaussian events, composed with ComposedDpEvent and SelfComposedDpEvent (positive integer "
            "counts)."
        ) from None


# -- accounting ------------------------------------------------------------------


def event_epsilon(event: _ev.DpEvent, delta: float) -> float:
    """Epsilon of ``event`` at ``delta`` as the ledger counts it; ``inf`` for approximate-DP events at delta 0."""
    try:
        return encode_event(event)[1].epsilon(delta)
    except InvalidEvent as exc:
        raise ParameterError(f"This event cannot be accounted by the ledger: {exc}.") from None


def composed_epsilon(events_json: Sequence[str], delta: float) -> float:
    """The ledger's figure at ``delta`` for the composition of stored events (each as the ledger stores it).

    Gaussian leaves collapse exactly into one equivalent Gaussian and Laplace
    leaves are grouped by parameter (:mod:`sparkpriv.ledger.events`).
    """
    try:
        return Spend.total(spend_of_stored(t).spend for t in events_json).epsilon(delta)
    except InvalidEvent as exc:
        raise LedgerError(f"A stored event cannot be accounted: {exc}.") from None
