"""Backend-independent logic of the privacy budget ledger (docs/ledger.md).

A ledger holds, per logical table id, a budget ``(epsilon, delta)`` and one
entry per release with the release's dp_accounting events. What a table has
spent is dp_accounting's PLD epsilon, at the budget's delta, of the composition
of the events of every counted entry (states ``reserved`` and ``committed``);
epsilons are never added up (except for pure Laplace events at ``delta = 0``,
where the sum is the exact answer).

This module holds everything the backends share: the schema, the SQL (written
with ``?`` placeholders; a backend translates them), the budget arithmetic and
the messages. A backend only supplies a connection and a transaction that
serializes check-and-spend per table (:meth:`Ledger._transaction`).
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import math
import numbers
import os
import re
import socket
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping, Protocol, Sequence

import dp_accounting
from dp_accounting import dp_event as _ev

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import BudgetExceededError, LedgerError, ParameterError
from sparkpriv.privacy.accounting import compose, epsilon_of, events_from_json, events_to_json, pure_epsilon_of

__all__ = ["DEFAULT_LEDGER_ENV", "DEFAULT_LEDGER_URL", "SCHEMA_VERSION", "Ledger", "Reservation", "TableStatus",
           "default_ledger_url", "composed_epsilon", "event_epsilon", "redact_url"]

log = logging.getLogger(__name__)

DEFAULT_LEDGER_ENV = "SPARKPRIV_LEDGER"
DEFAULT_LEDGER_URL = "sqlite:///~/.sparkpriv/ledger.sqlite"
SCHEMA_VERSION = 1

#: Relative slack on the budget comparison, so that float rounding of an exact
#: split (e.g. three releases of epsilon 1/3) is not refused.
_TOLERANCE = 1e-9
_TABLE_ID = re.compile(r"[A-Za-z0-9_.:/-]+")
_SECRET_WORDS = ("seed", "secret", "key", "matrix")
COUNTED_STATES = ("reserved", "committed")
_POS_FINITE = Interval("real", 0, None, closed="neither")  # rejects inf
_DELTA = Interval("real", 0, 1, closed="left")

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
               "aborted_at", "abort_reason", "output_path", "parameters", "receipt_summary", "events", "host", "pid")
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

    ``spent_epsilon`` is the PLD epsilon at ``budget_delta`` of every counted
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
            entries.append(e)
        return {
            "table_id": self.table_id,
            "budget": {"epsilon": self.budget_epsilon, "delta": self.budget_delta, "updated_at": self.budget_updated_at},
            "spent_epsilon": _json_float(self.spent_epsilon),
            "remaining_epsilon": self.remaining_epsilon,
            "counted": sum(1 for e in self.entries if e["state"] in COUNTED_STATES),
            "unfinished": self.unfinished,
            "entries": entries,
        }


class _Tx(Protocol):
    """What a backend's transaction offers: run one statement, get its rows."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...


class Ledger(abc.ABC):
    """A privacy budget ledger. Open one with :func:`sparkpriv.ledger.open_ledger`.

    One object per process and thread; use it as a context manager or call
    :meth:`close`. Every method is one database transaction.
    """

    #: Suffix of a SELECT that must lock the rows it reads until commit.
    _FOR_UPDATE = ""

    def __init__(self, url: str):
        #: The URL without its password, for messages, receipts and ``ledger show``.
        self.public_url = self.url = redact_url(url)

    # -- what a backend provides ------------------------------------------------

    @abc.abstractmethod
    def _transaction(self, *, write: bool) -> contextlib.AbstractContextManager[_Tx]:
        """A transaction; ``write=True`` ones serialize check-and-spend."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection."""

    def _lock_schema(self, tx: _Tx) -> None:
        """Serialize concurrent schema creation (when the write lock does not)."""

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
        with self._transaction(write=True) as tx:
            tx.execute("INSERT INTO sparkpriv_budgets (table_id, epsilon, delta, updated_at) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT (table_id) DO UPDATE SET epsilon = excluded.epsilon, delta = excluded.delta, "
                       "updated_at = excluded.updated_at", (table_id, float(epsilon), float(delta), _now()))
        log.info("ledger %s: budget of %r set to epsilon=%g, delta=%g", self.url, table_id, epsilon, delta)

    def reserve(self, table_id: str, *, event: _ev.DpEvent, mechanism: str, parameters: Mapping[str, Any],
                output_path: str, receipt_summary: Mapping[str, Any] | None = None) -> Reservation:
        """Check the budget and reserve this release's spend, atomically.

        Call it before reading any data. The composed PLD epsilon (at the
        budget's delta) of every counted entry plus ``event`` must not exceed
        the budget's epsilon; otherwise :class:`BudgetExceededError` (exit
        code 3) says what was spent, requested and remains.
        """
        caller = "Ledger.reserve"
        _check_table_id(table_id, caller)
        if not isinstance(event, _ev.DpEvent):
            raise ParameterError(
                f"The 'event' parameter of {caller} must be a dp_accounting DpEvent. Got {event!r} instead."
            )
        check_param("mechanism", mechanism, [str], caller)
        check_param("output_path", output_path, [str], caller)
        params_json = _json_without_secrets(parameters, "parameters", caller)
        summary_json = _json_without_secrets(receipt_summary, "receipt_summary", caller)
        events_json = events_to_json(event)
        events_from_json(events_json)  # what is stored must be readable back (allow-list)
        entry_id = str(uuid.uuid4())
        with self._transaction(write=True) as tx:
            budget = self._budget(tx, table_id, lock=True)
            if budget is None:
                raise BudgetExceededError(_no_budget_message(self.url, table_id))
            budget_eps, budget_delta, _ = budget
            rows = tx.execute("SELECT events, state FROM sparkpriv_releases "
                              "WHERE table_id = ? AND state IN ('reserved', 'committed')", (table_id,))
            counted = [r[0] for r in rows]
            before = composed_epsilon(counted, budget_delta)
            own = event_epsilon(events_from_json(events_json), budget_delta)
            after = composed_epsilon(counted + [events_json], budget_delta) if counted else own
            if not after <= budget_eps * (1.0 + _TOLERANCE):
                pending = sum(1 for r in rows if r[1] == "reserved")
                raise BudgetExceededError(_refusal_message(
                    self.url, table_id, budget_eps, budget_delta, before, own, after, len(rows), pending))
            tx.execute(
                "INSERT INTO sparkpriv_releases (id, table_id, state, mechanism, parameters, events, "
                "epsilon, epsilon_delta, output_path, receipt_summary, created_at, host, pid) "
                "VALUES (?, ?, 'reserved', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry_id, table_id, mechanism, params_json, events_json, own, budget_delta,
                 output_path, summary_json, _now(), socket.gethostname(), os.getpid()),
            )
        log.info("ledger %s: reserved %s on %r: epsilon %.6g requested, spent %.6g -> %.6g of %.6g (delta=%g)",
                 self.url, entry_id, table_id, own, before, after, budget_eps, budget_delta)
        return Reservation(entry_id, table_id, own, before, after, budget_eps, budget_delta)

    def commit(self, reservation_id: str, *, output_path: str | None = None,
               receipt_summary: Mapping[str, Any] | None = None) -> None:
        """Mark a reservation published (``committed``); idempotent."""
        caller = "Ledger.commit"
        check_param("output_path", output_path, [str, None], caller)
        summary_json = _json_without_secrets(receipt_summary, "receipt_summary", caller)
        with self._transaction(write=True) as tx:
            state, reason = self._entry_state(tx, reservation_id, caller)
            if state == "committed":
                return
            if state == "aborted":
                raise LedgerError(
                    f"Reservation {reservation_id} in ledger {self.url} was aborted ({reason}) and its "
                    "budget released, so its output must not be published. Reserve again."
                )
            tx.execute(
                "UPDATE sparkpriv_releases SET state = 'committed', published_at = ?, "
                "output_path = COALESCE(?, output_path), receipt_summary = COALESCE(?, receipt_summary) "
                "WHERE id = ?",
                (_now(), output_path, summary_json, reservation_id),
            )
        log.info("ledger %s: committed %s", self.url, reservation_id)

    def abort(self, reservation_id: str, *, reason: str) -> None:
        """Release a reservation whose output was not published; idempotent."""
        check_param("reason", reason, [str], "Ledger.abort")
        with self._transaction(write=True) as tx:
            state, _ = self._entry_state(tx, reservation_id, "Ledger.abort")
            if state == "aborted":
                return
            if state == "committed":
                raise LedgerError(
                    f"Reservation {reservation_id} in ledger {self.url} is committed: its output was "
                    "published, so its spend cannot be released."
                )
            tx.execute(
                "UPDATE sparkpriv_releases SET state = 'aborted', aborted_at = ?, abort_reason = ? WHERE id = ?",
                (_now(), reason, reservation_id),
            )
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
        ``host, pid``.
        """
        _check_table_id(table_id, "Ledger.status")
        with self._transaction(write=False) as tx:
            budget = self._budget(tx, table_id, lock=False)
            if budget is None:
                raise LedgerError(_no_budget_message(self.url, table_id))
            rows = tx.execute(f"SELECT {', '.join(_ENTRY_FIELDS)} FROM sparkpriv_releases WHERE table_id = ? "
                              "ORDER BY created_at, id", (table_id,))
        budget_eps, budget_delta, updated_at = budget
        entries = [_entry(table_id, row, budget_delta) for row in rows]
        spent = composed_epsilon([e["events"] for e in entries if e["state"] in COUNTED_STATES], budget_delta)
        return TableStatus(table_id, budget_eps, budget_delta, updated_at, spent, max(0.0, budget_eps - spent),
                           entries)

    def tables(self) -> list[str]:
        """Table ids that have a budget, sorted."""
        with self._transaction(write=False) as tx:
            return [r[0] for r in tx.execute("SELECT table_id FROM sparkpriv_budgets ORDER BY table_id")]

    # -- shared helpers (validated input) --------------------------------------

    def _ensure_schema(self) -> None:
        with self._transaction(write=True) as tx:
            self._lock_schema(tx)
            for statement in SCHEMA:
                tx.execute(statement)
            rows = tx.execute("SELECT value FROM sparkpriv_meta WHERE key = 'schema_version'")
            if not rows:
                tx.execute("INSERT INTO sparkpriv_meta (key, value) VALUES ('schema_version', ?)",
                           (str(SCHEMA_VERSION),))
            elif rows[0][0] != str(SCHEMA_VERSION):
                raise LedgerError(
                    f"The ledger {self.url} has schema version {rows[0][0]}; this sparkpriv reads version "
                    f"{SCHEMA_VERSION}. Use the sparkpriv version that wrote it (or newer)."
                )

    def _budget(self, tx: _Tx, table_id: str, *, lock: bool) -> tuple[float, float, str] | None:
        sql = "SELECT epsilon, delta, updated_at FROM sparkpriv_budgets WHERE table_id = ?"
        rows = tx.execute(sql + (self._FOR_UPDATE if lock else ""), (table_id,))
        return (float(rows[0][0]), float(rows[0][1]), rows[0][2]) if rows else None

    def _entry_state(self, tx: _Tx, reservation_id: str, caller: str) -> tuple[str, str | None]:
        check_param("reservation_id", reservation_id, [str], caller)
        sql = "SELECT state, abort_reason FROM sparkpriv_releases WHERE id = ?" + self._FOR_UPDATE
        rows = tx.execute(sql, (reservation_id,))
        if not rows:
            raise LedgerError(f"There is no reservation with id {reservation_id!r} in ledger {self.url}.")
        return rows[0][0], rows[0][1]


# -- accounting ------------------------------------------------------------------


def event_epsilon(event: _ev.DpEvent, delta: float) -> float:
    """PLD epsilon of ``event`` at ``delta``; ``inf`` for approximate-DP events at delta 0."""
    if delta == 0.0 and pure_epsilon_of(event) is None:
        return math.inf
    try:
        return epsilon_of(event, delta)
    except dp_accounting.UnsupportedEventError as exc:
        raise ParameterError(f"dp_accounting's PLD accountant cannot account this event: {exc}") from exc


def composed_epsilon(events_json: Sequence[str], delta: float) -> float:
    """PLD epsilon at ``delta`` of the composition of the stored events.

    Identical events (the same nightly job) are grouped into one
    ``SelfComposedDpEvent``, which PLD composes by FFT in one step.
    """
    if not events_json:
        return 0.0
    parts = []
    for text, count in sorted(Counter(events_json).items()):
        event = events_from_json(text)
        parts.append(event if count == 1 else _ev.SelfComposedDpEvent(event, count))
    return event_epsilon(compose(parts), delta)


# -- helpers -----------------------------------------------------------------------


def default_ledger_url() -> str:
    """``$SPARKPRIV_LEDGER`` if set, else ``sqlite:///~/.sparkpriv/ledger.sqlite``."""
    return os.environ.get(DEFAULT_LEDGER_ENV) or DEFAULT_LEDGER_URL


def redact_url(url: str) -> str:
    """``url`` without its password (for messages and ``ledger show``)."""
    url = re.sub(r"(?i)(password=)[^&\s]*", r"\1***", url)
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/:@]*):[^/@]*@", r"\1:***@", url)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _check_table_id(table_id: Any, caller: str) -> None:
    if not isinstance(table_id, str) or not _TABLE_ID.fullmatch(table_id) or len(table_id) > 256:
        raise ParameterError(
            f"The 'table_id' parameter of {caller} must be a non-empty string of letters, digits "
            f"and _ . : / - (at most 256 characters), e.g. 'cdr.daily_towers'. Got {table_id!r} instead."
        )


def _secret_keys(value: Any, prefix: str) -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            name = f"{prefix}.{k}"
            if any(word in str(k).lower() for word in _SECRET_WORDS):
                yield name
            yield from _secret_keys(v, name)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _secret_keys(v, f"{prefix}[{i}]")


def _json_without_secrets(value: Any, name: str, caller: str) -> str | None:
    """JSON text of a parameters dict (None stays None), refusing what looks like a secret."""
    if value is None and name != "parameters":
        return None
    if not isinstance(value, Mapping):
        raise ParameterError(f"The {name!r} parameter of {caller} must be a dict. Got {value!r} instead.")
    secret = list(_secret_keys(value, name))
    if secret:
        raise LedgerError(
            f"{caller} refuses to store {', '.join(secret)}: keys containing "
            f"{', '.join(_SECRET_WORDS)} look like secrets (seeds, keys, projection matrices), and the "
            "ledger is not a place for secrets. Leave them out of the recorded parameters."
        )

    def scalar(v: Any) -> Any:  # numpy scalars and other numbers
        if isinstance(v, numbers.Number) or getattr(v, "ndim", None) == 0:
            return v.item() if hasattr(v, "item") else float(v)
        raise LedgerError(
            f"{caller} cannot store {type(v).__name__} values in {name!r}; record plain numbers, "
            "strings, lists and dicts."
        )

    return json.dumps(value, sort_keys=True, default=scalar)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return True


def _label(state: str, host: str, pid: int) -> str:
    if state != "reserved":
        return state
    if host != socket.gethostname():
        return "reserved (unfinished?)"  # no reliable liveness check across hosts
    return "reserved" if _pid_alive(pid) else "unfinished"


def _entry(table_id: str, row: tuple, budget_delta: float) -> dict:
    e = dict(zip(_ENTRY_FIELDS, row), table_id=table_id, pid=int(row[-1]))
    if float(e["epsilon_delta"]) != budget_delta:  # the budget's delta changed since the reservation
        e["epsilon"] = event_epsilon(events_from_json(e["events"]), budget_delta)
    e.update(epsilon=float(e["epsilon"]), label=_label(e["state"], e["host"], e["pid"]),
             parameters=json.loads(e["parameters"]),
             receipt_summary=None if e["receipt_summary"] is None else json.loads(e["receipt_summary"]))
    return {k: e[k] for k in _ENTRY_KEYS}


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def _g(x: float) -> str:
    return f"{x:.6g}"


def _set_budget_hint(url: str, table_id: str) -> str:
    return f"sparkpriv ledger set-budget --ledger '{url}' --table-id {table_id} --epsilon E --delta D"


def _no_budget_message(url: str, table_id: str) -> str:
    return (
        f"No privacy budget is set for table '{table_id}' in ledger {url}, so no release of it can be "
        f"accounted. Set one first: `{_set_budget_hint(url, table_id)}`."
    )


def _refusal_message(url, table_id, budget_eps, budget_delta, before, own, after, counted, pending) -> str:
    d = _g(budget_delta)
    lines = [
        f"Release refused for table '{table_id}' (ledger {url}): it would exceed the table's privacy budget.",
        f"  budget:    epsilon = {_g(budget_eps)}, delta = {d}",
        f"  spent:     epsilon = {_g(before)} at delta = {d} ({counted} counted release(s), composed)",
        f"  requested: epsilon = {_g(own)} at delta = {d} (this release alone)",
        f"  remaining: epsilon = {_g(max(0.0, budget_eps - before))} at delta = {d} "
        f"(with this release the composed total would be {_g(after)})",
    ]
    if math.isinf(own) and budget_delta == 0.0:
        lines.append("A Gaussian (approximate-DP) release cannot fit a budget with delta = 0.")
    if pending:
        lines.append(
            f"Counted but not published: {pending} reservation(s) of running or killed jobs (see `sparkpriv "
            "ledger show`); a killed job's reservation stays counted until it is aborted (docs/ledger.md)."
        )
    lines.append(
        "Fix: request a smaller epsilon, or, if the table's policy allows, raise its budget with "
        f"`{_set_budget_hint(url, table_id)}`."
    )
    return "\n".join(lines)
