"""The embedded SQLite ledger: one file, for schedulers that run on one host.

Check-and-spend runs in a ``BEGIN IMMEDIATE`` transaction: it takes the
database's single write lock before reading the budget and the entries, so two
processes reserving on the same file are serialized (the second waits up to the
busy timeout). The composition itself runs before, on a snapshot, without the
lock (:meth:`Ledger.reserve`). WAL mode lets ``ledger show`` read while a job
writes. Do not put the file on a network file system (SQLite's locks are not
reliable there); use the PostgreSQL ledger for several hosts.

A file that already holds tables but no ledger is refused (the ledger would add
its tables and switch the file to WAL mode) unless ``add_to_existing=True``.
``read_only=True`` (``sqlite:///path?mode=ro``) opens an existing ledger
without changing anything: no schema creation, no journal-mode switch.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from typing import Any, Iterator, Sequence

from sparkpriv.errors import LedgerError
from sparkpriv.ledger.base import Ledger

__all__ = ["SQLiteLedger"]

#: How long a transaction waits for another process's write lock.
BUSY_TIMEOUT_S = 60.0


class _SQLiteTx:
    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._conn.execute(sql, tuple(params)).fetchall()

    def send(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.execute(sql, tuple(params))

    def defer(self, sql: str, params: Sequence[Any] = ()):
        """A query whose rows are read later (:meth:`_PostgresTx.defer`); here: at once."""
        rows = self.execute(sql, params)
        return lambda: rows


class SQLiteLedger(Ledger):
    """A ledger in the SQLite file ``path`` (created with its parent directories)."""

    def __init__(self, url: str, path: str, *, read_only: bool = False, add_to_existing: bool = False,
                 key_file: str | None = None, upgrade: bool = False):
        super().__init__(url, read_only=read_only, key_file=key_file, upgrade=upgrade)
        self.path = path
        try:
            if read_only:
                if not os.path.isfile(path):
                    raise LedgerError(
                        f"There is no SQLite ledger at {path} to open read-only. Check the path; a new ledger is "
                        "created by its first `sparkpriv ledger set-budget`."
                    )
                uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                self._conn.execute("PRAGMA query_only = ON")
            else:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                # isolation_level=None: no implicit transactions; we issue BEGIN ourselves.
                self._conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
                self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                if not add_to_existing:
                    self._refuse_foreign_database()
                self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute("PRAGMA synchronous = FULL")  # a committed spend survives a power cut
                self._conn.execute("PRAGMA foreign_keys = ON")
        except (OSError, sqlite3.Error) as exc:
            self._close_quietly()
            raise LedgerError(f"Cannot open the SQLite ledger {path}: {exc}. Check the path and permissions.") from exc
        except BaseException:
            self._close_quietly()
            raise
        try:
            self._ensure_schema()
        except BaseException:
            self._conn.close()
            raise

    def _close_quietly(self) -> None:
        conn = getattr(self, "_conn", None)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _refuse_foreign_database(self) -> None:
        names = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if names and "sparkpriv_meta" not in names:
            shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            raise LedgerError(
                f"{self.path} is an SQLite database with other tables ({shown}) and no sparkpriv ledger. "
                "Refusing to add the ledger's tables to it and switch it to WAL mode: check the URL, or pass "
                "add_to_existing=True to open_ledger if the ledger really belongs in this database."
            )

    def _has_table(self, tx: _SQLiteTx, name: str) -> bool:
        return bool(tx.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)))

    def close(self) -> None:
        self._conn.close()

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # nothing to roll back if SQLite already did
            self._conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_SQLiteTx]:
        try:
            self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise LedgerError(f"Cannot start a transaction on the SQLite ledger {self.path}: {exc}.") from exc
        try:
            yield _SQLiteTx(self._conn)
        except sqlite3.Error as exc:
            self._rollback()
            raise LedgerError(f"The SQLite ledger {self.path} failed: {exc}.") from exc
        except BaseException:
            self._rollback()
            raise
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise LedgerError(f"Cannot commit to the SQLite ledger {self.path}: {exc}.") from exc
