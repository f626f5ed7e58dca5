"""The PostgreSQL ledger: one database shared by schedulers on several hosts.

Check-and-spend is one transaction that first takes the journal's lock (a
transaction-level advisory lock: every write appends to the one hash chain, so
writes are serialized by the server, from any host), locks the table's budget
row (``SELECT ... FOR UPDATE``) and only then reads the entries. Every write
transaction sets READ COMMITTED itself, whatever the server's or the URL's
``default_transaction_isolation``: each statement then sees every transaction
committed before it started, so the second reserver, once it holds the lock,
sees the first one's entry (under REPEATABLE READ it would keep the snapshot
taken before it waited, and admit itself on a stale spend). Read transactions
set REPEATABLE READ, READ ONLY (one snapshot for a budget and its entries).
Serialization failures and deadlocks (SQLSTATE 40001, 40P01) are retried a
bounded number of times (:meth:`Ledger._atomic`).

psycopg 3 is imported only when a ``postgresql://`` ledger is opened
(``pip install 'sparkpriv[postgres]'``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from sparkpriv.errors import LedgerError
from sparkpriv.ledger.base import Ledger, TransientLedgerError

__all__ = ["PostgresLedger"]

#: How long a statement waits for another transaction's lock before failing.
LOCK_TIMEOUT_S = 60
CONNECT_TIMEOUT_S = 30
#: pg_advisory_xact_lock key that serializes concurrent schema creation ("SPLG").
_SCHEMA_LOCK_KEY = 0x53504C47
#: pg_advisory_xact_lock key that serializes appends to the journal ("SPCH").
_CHAIN_LOCK_KEY = 0x53504348
#: SQLSTATEs after which running the whole transaction again may succeed.
_TRANSIENT = ("40001", "40P01")


def _import_psycopg():
    try:
        import psycopg
    except ImportError as exc:
        raise LedgerError(
            "A postgresql:// ledger needs psycopg 3, which is not installed. "
            "Install it with `pip install 'sparkpriv[postgres]'`."
        ) from exc
    return psycopg


class _PostgresTx:
    def __init__(self, conn, pipelined: bool):
        self._conn = conn
        self._pipelined = pipelined
        self._cursor = conn.cursor()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        # The shared SQL uses '?' placeholders and contains no literal '?' or '%'.
        if self._pipelined:
            # In pipeline mode a statement's result is read (one round trip for everything queued before
            # it) only when it has rows: the shared SQL returns rows from SELECT statements only (no
            # RETURNING). A cursor of its own: a cursor that already holds a result does not wait for
            # the next one.
            cursor = self._conn.cursor()
            cursor.execute(sql.replace("?", "%s"), tuple(params))
            return cursor.fetchall() if sql.lstrip()[:6].upper() == "SELECT" else []
        self._cursor.execute(sql.replace("?", "%s"), tuple(params))
        return self._cursor.fetchall() if self._cursor.description is not None else []

    def send(self, sql: str, params: Sequence[Any] = ()) -> None:
        """A statement whose result is not needed: queued, sent with the next one that is read."""
        self._cursor.execute(sql.replace("?", "%s"), tuple(params))

    def defer(self, sql: str, params: Sequence[Any] = ()):
        """A SELECT queued now whose rows the returned callable reads: queries deferred one after another
        travel in one round trip (pipeline mode; without it, each is run at once)."""
        if not self._pipelined:
            rows = self.execute(sql, params)
            return lambda: rows
        cursor = self._conn.cursor()
        cursor.execute(sql.replace("?", "%s"), tuple(params))
        return cursor.fetchall


class PostgresLedger(Ledger):
    """A ledger in the PostgreSQL database of ``url`` (tables ``sparkpriv_*``)."""

    _FOR_UPDATE = " FOR UPDATE"

    def __init__(self, url: str, *, read_only: bool = False, key_file: str | None = None, upgrade: bool = False):
        super().__init__(url, read_only=read_only, key_file=key_file, upgrade=upgrade)
        self._psycopg = _import_psycopg()
        self._pipeline = bool(self._psycopg.Pipeline.is_supported())
        try:
            self._conn = self._psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
            self._conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
        except self._psycopg.Error as exc:
            raise LedgerError(
                f"Cannot connect to the PostgreSQL ledger {self.url}: {str(exc).strip()}. "
                "Check the URL, that the server is up, and the user's rights."
            ) from exc
        try:
            self._ensure_schema()
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        self._conn.close()

    def _lock_schema(self, tx: _PostgresTx) -> None:
        # CREATE TABLE IF NOT EXISTS is not safe against a concurrent one in PostgreSQL.
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK_KEY,))

    def _lock_chain(self, tx: _PostgresTx) -> None:
        # Every append to the journal reads its head and writes the next record: one at a time. Queued
        # with the head's query (one round trip): under READ COMMITTED that query takes its snapshot
        # once the lock is granted, so it sees the last committed record.
        tx.send("SELECT pg_advisory_xact_lock(?)", (_CHAIN_LOCK_KEY,))

    def _has_table(self, tx: _PostgresTx, name: str) -> bool:
        return tx.execute("SELECT to_regclass(?)", (name,))[0][0] is not None

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_PostgresTx]:
        try:
            # Never the server's default (see the module docstring): BEGIN names the level and the access
            level = self._psycopg.IsolationLevel.READ_COMMITTED if write else \
                self._psycopg.IsolationLevel.REPEATABLE_READ
            if self._conn.isolation_level != level:
                self._conn.isolation_level = level
            if self._conn.read_only is not (not write):
                self._conn.read_only = not write
            # pipeline mode: statements whose result is not read (BEGIN, the lock, the inserts, COMMIT)
            # travel with the next one that is, so a reservation costs a few round trips
            with (self._conn.pipeline() if self._pipeline else contextlib.nullcontext()), self._conn.transaction():
                yield _PostgresTx(self._conn, self._pipeline)
        except self._psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) in _TRANSIENT:
                raise TransientLedgerError(
                    f"The PostgreSQL ledger {self.url} aborted a transaction: {str(exc).strip()}."
                ) from exc
            raise LedgerError(f"The PostgreSQL ledger {self.url} failed: {str(exc).strip()}.") from exc
