"""Backend-independent logic of the privacy budget ledger (docs/ledger.md).

A ledger holds, per logical table id, a budget ``(epsilon, delta)`` and one
entry per release with the release's dp_accounting events. What a table has
spent is the epsilon, at the budget's delta, of the composition of the events
of every counted entry (states ``reserved`` and ``committed``), computed by
:mod:`sparkpriv.ledger.events` (exact for Gaussian events, dp_accounting's PLD
otherwise); epsilons are never added up (except for pure Laplace events at
``delta = 0``, where the sum is the exact answer).

This module holds everything the backends share: the schema, the SQL (written
with ``?`` placeholders; a backend translates them), the budget check and the
messages. A backend only supplies a connection and a transaction that
serializes check-and-spend per table (:meth:`Ledger._transaction`).
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
from fractions import Fraction
from typing import Any, Mapping, Protocol, Sequence

from dp_accounting import dp_event as _ev

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import BudgetExceededError, LedgerError, ParameterError
from sparkpriv.ledger.events import (EVENT_FORMAT, InvalidEvent, Spend, UnknownFormat, encode_event,
                                     spend_of_stored)
from sparkpriv.ledger.checks import (DEFAULT_LEDGER_ENV, DEFAULT_LEDGER_URL, default_ledger_url, redact_url, _now,
                                     _check_table_id, _check_text, _json_without_secrets, _printable,
                                     _corrupt_message, _label, _json_float, _strict_json, _budget_values, _no_budget_message, _refusal_message)

__all__ = ["DEFAULT_LEDGER_ENV", "DEFAULT_LEDGER_URL", "EVENT_FORMAT", "SCHEMA_VERSION", "Ledger", "Reservation",
           "TableStatus", "default_ledger_url", "composed_epsilon", "event_epsilon", "redact_url"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

COUNTED_STATES = ("reserved", "committed")
_POS_FINITE = Interval("real", 0, None, closed="neither")  # rejects inf
_DELTA = Interval("real", 0, 1, closed="left")
#: Optimistic rounds of reserve (compose without a lock, then lock and check the
#: history did not change) before the last round composes under the lock.
_OPTIMISTIC_ROUNDS = 6
#: Attempts of one transaction that the server aborted as a serialization failure or deadlock.
_TRANSIENT_ATTEMPTS = 10

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sparkpriv_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sparkpriv_budgets (
        table_id TEXT PRIMARY KEY,
        epsilon DOUBLE PRECISION NOT NULL CHECK (epsilon > 0),
        delta DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
        updated_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sparkpriv_releases (
        id TEXT PRIMARY KEY,
        table_id TEXT NOT NULL REFERENCES sparkpriv_budgets (table_id),
        state TEXT NOT NULL CHECK (state IN ('reserved', 'committed', 'aborted')),
        mechanism TEXT NOT NULL,
        parameters TEXT NOT NULL,
        events TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL,
        epsilon_delta DOUBLE PRECISION NOT NULL,
        output_path TEXT NOT NULL,
        receipt_summary TEXT,
        created_at TEXT NOT NULL,
        published_at TEXT,
        aborted_at TEXT,
        abort_reason TEXT,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS sparkpriv_releases_by_table ON sparkpriv_releases (table_id, state)",
)

_ENTRY_KEYS = ("id", "table_id", "state", "label", "mechanism", "epsilon", "created_at", "published_at",
               "aborted_at", "abort_reason", "output_path", "parameters", "receipt_summary", "events",
               "event_format", "dp_accounting_version", "host", "pid")
_ENTRY_FIELDS = ("id", "state", "mechanism", "parameters", "events", "epsilon", "epsilon_delta", "output_path",
                 "receipt_summary", "created_at", "published_at", "aborted_at", "abort_reason", "host", "pid")


@dataclass(frozen=True)
class Reservation:
    """A spend that the ledger admitted; commit it on publish, abort it on failure.

    ``id`` names the ledger entry (the release's receipt records it). All
    epsilons are at the budget's delta, ``budget_delta``.
    """

    id: str
    table_id: str
    epsilon_requested: float
    epsilon_spent_before: float
    epsilon_spent_after: float
    budget_epsilon: float
    budget_delta: float

    @property
    def epsilon_remaining_after(self) -> float:
        return max(0.0, self.budget_epsilon - self.epsilon_spent_after)


@dataclass(frozen=True)
class TableStatus:
    """Budget, spend and entries of one table, as :meth:`Ledger.status` found them.

    ``spent_epsilon`` is the composed epsilon at ``budget_delta`` of every counted
    entry (``reserved`` or ``committed``); ``entries`` are dicts in creation
    order, see :meth:`Ledger.status`.
    """

    table_id: str
    budget_epsilon: float
    budget_delta: float
    budget_updated_at: str
    spent_epsilon: float
    remaining_epsilon: float
    entries: list = field(default_factory=list)

    @property
    def unfinished(self) -> int:
        """Entries reserved by a job that did not publish or abort (still counted)."""
        return sum(1 for e in self.entries if e["label"] != "reserved" and e["state"] == "reserved")

    def to_dict(self) -> dict:
        """A JSON-ready dict (events are parsed; non-finite floats become ``"inf"``)."""
        entries = []
        for e in self.entries:
            e = dict(e)
            e["events"] = json.loads(e["events"])
            e["epsilon"] = _json_float(e["epsilon"])
            e["parameters"] = _strict_json(e["parameters"])
            e["receipt_summary"] = _strict_json(e["receipt_summary"])
            entries.append(e)
        return {
            "table_id": self.table_id,
            "budget": {"epsilon": self.budget_epsilon, "delta": self.budget_delta, "updated_at": self.budget_updated_at},
            "spent_epsilon": _json_float(self.spent_epsilon),
            "remaining_epsilon": _json_float(self.remaining_epsilon),
            "counted": sum(1 for e in self.entries if e["state"] in COUNTED_STATES),
            "unfinished": self.unfinished,
            "entries": entries,
        }


class _Tx(Protocol):
    """What a backend's transaction offers: run one statement, get its rows."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...


class TransientLedgerError(LedgerError):
    """The server aborted a transaction that may succeed if run again (serialization failure, deadlock)."""


class Ledger(abc.ABC):
    """A privacy budget ledger. Open one with :func:`sparkpriv.ledger.open_ledger`.

    One object per process and thread; use it as a context manager or call
    :meth:`close`. Every method is one database transaction, except
    :meth:`reserve`, which composes outside the lock (docs/ledger.md).
    """

    #: Suffix of a SELECT that must lock the rows it reads until commit.
    _FOR_UPDATE = ""

    def __init__(self, url: str, *, read_only: bool = False):
        #: The URL without its password, for messages, receipts and ``ledger show``.
        self.public_url = self.url = redact_url(url)
        #: Opened for reading only (``ledger show``, reports): every write is refused.
        self.read_only = bool(read_only)

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

    def set_budget(self, table_id: str, *, epsilon: float, delta: float) -> None:
        """Create or change the budget of ``table_id``.

        A budget smaller than what is already spent is accepted; every further
        release of the table is then refused.
        """
        caller = "Ledger.set_budget"
        _check_table_id(table_id, caller)
        check_param("epsilon", epsilon, [_POS_FINITE], caller)
        check_param("delta", delta, [_DELTA], caller)
        self._check_writable(caller)

        def run(tx: _Tx) -> None:
            tx.execute("INSERT INTO sparkpriv_budgets (table_id, epsilon, delta, updated_at) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT (table_id) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta, "
                       "updated_at = excluded.updated_at", (table_id, float(epsilon), float(delta), _now()))

        self._atomic(run, write=True)
        log.info("ledger %s: budget of %r set to epsilon=%g, delta=%g", self.url, table_id, epsilon, delta)

    def reserve(self, table_id: str, *, event: _ev.DpEvent, mechanism: str, parameters: Mapping[str, Any],
                output_path: str, receipt_summary: Mapping[str, Any] | None = None) -> Reservation:
        """Check the budget and reserve this release's spend, atomically.

        Call it before reading any data. The composed epsilon (at the budget's
        delta) of every counted entry plus ``event`` must not exceed the
        budget's epsilon; otherwise :class:`BudgetExceededError` (exit code 3)
        says what was spent, requested and remains. ``event`` is validated
        first (known classes, finite positive parameters, positive integer
        counts; :class:`ParameterError` otherwise).

        The composition runs outside the write lock on a snapshot of the
        table's history; under the lock the history is read again and, if it
        changed, the round starts over (the last round composes under the lock).
        """
        caller = "Ledger.reserve"
        _check_table_id(table_id, caller)
        events_json, own_spend = _encode_given_event(event, caller)
        _check_text(mechanism, "mechanism", caller, 256)
        _check_text(output_path, "output_path", caller, 4096)
        params_json = _json_without_secrets(parameters, "parameters", caller)
        summary_json = _json_without_secrets(receipt_summary, "receipt_summary", caller)
        self._check_writable(caller)
        entry_id = str(uuid.uuid4())
        insert = (
            "INSERT INTO sparkpriv_releases (id, table_id, state, mechanism, parameters, events, "
            "epsilon, epsilon_delta, output_path, receipt_summary, created_at, host, pid) "
            "VALUES (?, ?, 'reserved', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )

        for round_ in range(_OPTIMISTIC_ROUNDS + 1):
            under_lock = round_ == _OPTIMISTIC_ROUNDS
            if not under_lock:  # compose on a snapshot, holding no lock
                seen = self._atomic(lambda tx: self._history(tx, table_id, lock=False), write=False)
                verdict = self._verdict(table_id, seen, own_spend)

            def write(tx: _Tx):
                if under_lock:
                    v = self._verdict(table_id, self._history(tx, table_id, lock=True), own_spend)
                else:
                    now = self._history(tx, table_id, lock=True, ids_only=True)
                    if now[:2] != seen[:2] or now[2] != [r[0] for r in seen[2]]:
                        return None  # the budget or the set of counted entries changed since the snapshot
                    v = verdict
                tx.execute(insert, (entry_id, table_id, mechanism, params_json, events_json, v[1], v[4],
                                    output_path, summary_json, _now(), socket.gethostname(), os.getpid()))
                return v

            result = self._atomic(write, write=True)
            if result is not None:
                break
            time.sleep(random.uniform(0.0, 0.005 * (round_ + 1)))
        before, own, after, budget_eps, budget_delta = result
        log.info("ledger %s: reserved %s on %r: epsilon %.6g requested, spent %.6g -> %.6g of %.6g (delta=%g)",
                 self.url, entry_id, table_id, own, before, after, budget_eps, budget_delta)
        return Reservation(entry_id, table_id, own, before, after, budget_eps, budget_delta)

    def check_admission(self, table_id: str, event: _ev.DpEvent) -> None:
        """Whether :meth:`reserve` would admit ``event`` on ``table_id`` now; writes nothing.

        A dry run of the admission check for a caller that wants to refuse an
        over-budget release before it starts any work (the command line, before
        Spark starts): it raises the :class:`BudgetExceededError` (same message,
        exit code 3) that :meth:`reserve` would raise on the ledger as it is
        now, :class:`ParameterError` for an event the ledger cannot account and
        :class:`LedgerError` for a table with a corrupt entry, and returns None
        when the release would be admitted. Nothing is recorded (a read-only
        ledger works too), so it is no reservation: other releases may spend
        the budget before this one reserves, and only :meth:`reserve` admits.
        """
        caller = "Ledger.check_admission"
        _check_table_id(table_id, caller)
        _, own_spend = _encode_given_event(event, caller)
        history = self._atomic(lambda tx: self._history(tx, table_id, lock=False), write=False)
        self._verdict(table_id, history, own_spend)

    def commit(self, reservation_id: str, *, output_path: str | None = None,
               receipt_summary: Mapping[str, Any] | None = None) -> None:
        """Mark a reservation published (``committed``); idempotent."""
        caller = "Ledger.commit"
        _check_text(reservation_id, "reservation_id", caller, 256)
        if output_path is not None:
            _check_text(output_path, "output_path", caller, 4096)
        summary_json = _json_without_secrets(receipt_summary, "receipt_summary", caller)
        self._check_writable(caller)

        def run(tx: _Tx) -> bool:
            state, reason = self._entry_state(tx, reservation_id, caller)
            if state == "committed":
                return False
            if state == "aborted":
                raise LedgerError(
                    f"Reservation {reservation_id} in ledger {self.url} was aborted ({_printable(reason)}) and "
                    "its budget released, so its output must not be published. Reserve again."
                )
            tx.execute(
                "UPDATE sparkpriv_releases SET state = 'committed', published_at = ?, "
                "output_path = COALESCE(?, output_path), receipt_summary = COALESCE(?, receipt_summary) "
                "WHERE id = ?",
                (_now(), output_path, summary_json, reservation_id),
            )
            return True

        if self._atomic(run, write=True):
            log.info("ledger %s: committed %s", self.url, reservation_id)

    def abort(self, reservation_id: str, *, reason: str) -> None:
        """Release a reservation whose output was not published; idempotent."""
        caller = "Ledger.abort"
        _check_text(reservation_id, "reservation_id", caller, 256)
        _check_text(reason, "reason", caller, 4096)
        self._check_writable(caller)

        def run(tx: _Tx) -> bool:
            state, _ = self._entry_state(tx, reservation_id, caller)
            if state == "aborted":
                return False
            if state == "committed":
                raise LedgerError(
                    f"Reservation {reservation_id} in ledger {self.url} is committed: its output was "
                    "published, so its spend cannot be released."
                )
            tx.execute(
                "UPDATE sparkpriv_releases SET state = 'aborted', aborted_at = ?, abort_reason = ? WHERE id = ?",
                (_now(), reason, reservation_id),
            )
            return True

        if self._atomic(run, write=True):
            log.info("ledger %s: aborted %s (%s)", self.url, reservation_id, reason)

    def status(self, table_id: str) -> TableStatus:
        """Budget, spend and every entry of ``table_id``.

        Each entry is a dict with ``id, table_id, state`` (stored: reserved,
        committed, aborted), ``label`` (``state``, except that a reserved entry
        reads ``unfinished`` when its process on this host is gone and
        ``reserved (unfinished?)`` when it was made on another host),
        ``mechanism, epsilon`` (its own, at the budget's delta), ``created_at,
        published_at, aborted_at, abort_reason, output_path, parameters,
        receipt_summary, events`` (JSON text for ``events_from_json``),
        ``event_format`` (1 for entries stored before the format stamp),
        ``dp_accounting_version`` (None for format 1), ``host, pid``.

        A stored entry that fails validation raises :class:`LedgerError`
        naming it (the table is blocked until it is repaired).
        """
        _check_table_id(table_id, "Ledger.status")

        def run(tx: _Tx):
            budget = self._budget(tx, table_id, lock=False)
            if budget is None:
                raise LedgerError(_no_budget_message(self.url, table_id))
            rows = tx.execute(f"SELECT {', '.join(_ENTRY_FIELDS)} FROM sparkpriv_releases WHERE table_id = ? "
                              "ORDER BY created_at, id", (table_id,))
            return budget, rows

        (budget_eps, budget_delta, updated_at), rows = self._atomic(run, write=False)
        entries, spends = [], []
        for row in rows:
            entry, stored = self._entry(table_id, row, budget_delta)
            entries.append(entry)
            if entry["state"] in COUNTED_STATES:
                spends.append(stored.spend)
        spent = Spend.total(spends).epsilon(budget_delta)
        return TableStatus(table_id, budget_eps, budget_delta, updated_at, spent, max(0.0, budget_eps - spent),
                           entries)

    def tables(self) -> list[str]:
        """Table ids that have a budget, sorted."""
        return self._atomic(
            lambda tx: [r[0] for r in tx.execute("SELECT table_id FROM sparkpriv_budgets ORDER BY table_id")],
            write=False)

    # -- shared helpers (validated input) --------------------------------------

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

    def _ensure_schema(self) -> None:
        if self.read_only:
            self._atomic(self._check_schema, write=False)
            return

        def run(tx: _Tx) -> None:
            self._lock_schema(tx)
            for statement in SCHEMA:
                tx.execute(statement)
            self._check_schema(tx, create=True)

        self._atomic(run, write=True)

    def _check_schema(self, tx: _Tx, create: bool = False) -> None:
        if not create and not self._has_table(tx, "sparkpriv_meta"):
            raise LedgerError(f"{self.url} is not a sparkpriv ledger (it has no sparkpriv_meta table); "
                              "check the URL. A read-only ledger must have been created before.")
        rows = tx.execute("SELECT value FROM sparkpriv_meta WHERE key = 'schema_version'")
        if not rows and create:
            tx.execute("INSERT INTO sparkpriv_meta (key, value) VALUES ('schema_version', ?)",
                       (str(SCHEMA_VERSION),))
        elif not rows or rows[0][0] != str(SCHEMA_VERSION):
            found = rows[0][0] if rows else "(none)"
            raise LedgerError(
                f"The ledger {self.url} has schema version {_printable(str(found))[:40]}; this sparkpriv reads "
                f"version {SCHEMA_VERSION}. Use the sparkpriv version that wrote it (or newer)."
            )

    def _budget(self, tx: _Tx, table_id: str, *, lock: bool) -> tuple[float, float, str] | None:
        sql = "SELECT epsilon, delta, updated_at FROM sparkpriv_budgets WHERE table_id = ?"
        rows = tx.execute(sql + (self._FOR_UPDATE if lock else ""), (table_id,))
        if not rows:
            return None
        epsilon, delta = _budget_values(self.url, f"table '{table_id}'", rows[0][0], rows[0][1])
        return epsilon, delta, rows[0][2]

    def _history(self, tx: _Tx, table_id: str, *, lock: bool, ids_only: bool = False):
        """``(budget epsilon, budget delta, [(id, events, state), ...] by id)`` of the counted entries.

        With ``lock``, the budget row is locked first (``FOR UPDATE`` on
        PostgreSQL; SQLite's write transaction already holds the database lock).
        With ``ids_only`` the list holds the entry ids only (the check under the
        lock: the ledger never changes a stored entry's events, only its state).
        """
        budget = self._budget(tx, table_id, lock=lock)
        if budget is None:
            raise BudgetExceededError(_no_budget_message(self.url, table_id))
        where = "FROM sparkpriv_releases WHERE table_id = ? AND state IN ('reserved', 'committed') ORDER BY id"
        if ids_only:
            return budget[0], budget[1], [r[0] for r in tx.execute("SELECT id " + where, (table_id,))]
        rows = tx.execute("SELECT id, events, state " + where, (table_id,))
        return budget[0], budget[1], [tuple(r) for r in rows]

    def _verdict(self, table_id: str, history, own_spend: Spend):
        """``(before, own, after, budget epsilon, budget delta)``, or BudgetExceededError."""
        budget_eps, budget_delta, rows = history
        spent = Spend.total(self._stored(table_id, r[0], r[1]).spend for r in rows)
        before = spent.epsilon(budget_delta)
        own = own_spend.epsilon(budget_delta)
        # One figure (Spend.figure) is admitted by and stated: no tolerance; an exact sum of
        # pure epsilons is compared in rational arithmetic, any other figure is an upper bound
        # (the Gaussian part is rounded up, PLD is pessimistic).
        after, exact = (spent + own_spend).figure(budget_delta)
        within = exact <= Fraction(budget_eps) if exact is not None else after <= budget_eps
        if not within:
            pending = sum(1 for r in rows if r[2] == "reserved")
            raise BudgetExceededError(_refusal_message(
                self.url, table_id, budget_eps, budget_delta, before, own, after, len(rows), pending))
        return before, own, after, budget_eps, budget_delta

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
        e = dict(zip(_ENTRY_FIELDS, row), table_id=table_id)
        stored = self._stored(table_id, e["id"], e["events"])
        try:
            e["pid"] = int(e["pid"])
            e["parameters"] = json.loads(e["parameters"])
            if e["receipt_summary"] is not None:
                e["receipt_summary"] = json.loads(e["receipt_summary"])
            own = float(e["epsilon"])
            own_delta = float(e["epsilon_delta"])
        except (TypeError, ValueError, RecursionError) as exc:
            raise LedgerError(_corrupt_message(self.url, table_id, e["id"], f"a field is unreadable "
                                               f"({type(exc).__name__})")) from None
        if own_delta != budget_delta or math.isnan(own) or own < 0:  # e.g. the budget's delta changed since
            own = stored.spend.epsilon(budget_delta)
        e.update(epsilon=own, label=_label(e["state"], e["host"], e["pid"]), events=stored.event_json,
                 event_format=stored.event_format, dp_accounting_version=stored.dp_accounting)
        return {k: e[k] for k in _ENTRY_KEYS}, stored

    def _entry_state(self, tx: _Tx, reservation_id: str, caller: str) -> tuple[str, str | None]:
        sql = "SELECT state, abort_reason FROM sparkpriv_releases WHERE id = ?" + self._FOR_UPDATE
        rows = tx.execute(sql, (reservation_id,))
        if not rows:
            raise LedgerError(f"There is no reservation with id {reservation_id!r} in ledger {self.url}.")
        return rows[0][0], rows[0][1]


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
    """Epsilon at ``delta`` of the composition of stored events (each as the ledger stores it).

    Gaussian leaves collapse exactly into one equivalent Gaussian and Laplace
    leaves are grouped by parameter (:mod:`sparkpriv.ledger.events`).
    """
    try:
        return Spend.total(spend_of_stored(t).spend for t in events_json).epsilon(delta)
    except InvalidEvent as exc:
        raise LedgerError(f"A stored event cannot be accounted: {exc}.") from None


# -- helpers -----------------------------------------------------------------------


