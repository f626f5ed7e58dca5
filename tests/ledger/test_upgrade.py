"""A ledger written by the previous schema (version 1) is refused with the fix, then upgraded explicitly.

The version-1 tables and rows are made here exactly as sparkpriv before the
journal made them (its schema statements, frozen below), on both backends.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3

import pytest
from dp_accounting import dp_event as ev

from sparkpriv.errors import LedgerError
from sparkpriv.ledger import open_ledger, upgrade_ledger
from sparkpriv.privacy.accounting import events_to_json
from tests.ledger.test_ledger import cli

V1_SCHEMA = (
    "CREATE TABLE sparkpriv_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE sparkpriv_budgets (
        table_id TEXT PRIMARY KEY,
        epsilon DOUBLE PRECISION NOT NULL CHECK (epsilon > 0),
        delta DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
        updated_at TEXT NOT NULL)""",
    """CREATE TABLE sparkpriv_releases (
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
    "CREATE INDEX sparkpriv_releases_by_table ON sparkpriv_releases (table_id, state)",
    "INSERT INTO sparkpriv_meta (key, value) VALUES ('schema_version', '1')",
)

STAMPED = json.dumps({"dp_accounting": "0.6.0", "event_format": 2,
                      "event": {"class_name": "LaplaceDpEvent", "noise_multiplier": 4.0}}, sort_keys=True)
ROWS = (
    ("a1", "cdr.calls", "committed", STAMPED, "2026-05-01T03:00:00.000000+00:00"),
    ("a2", "cdr.calls", "aborted", STAMPED, "2026-05-02T03:00:00.000000+00:00"),
    ("a3", "cdr.calls", "reserved", events_to_json(ev.LaplaceDpEvent(2.0)), "2026-05-03T03:00:00.000000+00:00"),
    ("b1", "census.adult", "committed", events_to_json(ev.GaussianDpEvent(5.0)), "2026-05-04T03:00:00.000000+00:00"),
)


@contextlib.contextmanager
def _connect(url: str):
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None)
        try:
            yield lambda sql, params=(): conn.execute(sql, params).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            yield lambda sql, params=(): (lambda c: c.fetchall() if c.description else [])(
                conn.execute(sql.replace("?", "%s"), params))


def make_v1(url: str) -> None:
    with _connect(url) as run:
        for statement in V1_SCHEMA:
            run(statement)
        run("INSERT INTO sparkpriv_budgets VALUES ('cdr.calls', 2.0, 0.0, '2026-04-30T00:00:00+00:00')")
        run("INSERT INTO sparkpriv_budgets VALUES ('census.adult', 3.0, 1e-6, '2026-04-30T00:00:00+00:00')")
        for rid, table, state, events, created in ROWS:
            run("INSERT INTO sparkpriv_releases (id, table_id, state, mechanism, parameters, events, epsilon, "
                "epsilon_delta, output_path, receipt_summary, created_at, published_at, aborted_at, abort_reason, "
                "host, pid) VALUES (?, ?, ?, 'm', '{\"k\": 4}', ?, 0.25, 0.0, '/o', NULL, ?, NULL, NULL, ?, 'h', 7)",
                (rid, table, state, events, created, "failed" if state == "aborted" else None))


def _tables(url: str) -> set:
    with _connect(url) as run:
        if url.startswith("sqlite"):
            return {r[0] for r in run("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {r[0] for r in run("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}


def test_a_version_1_ledger_is_refused_with_the_fix_then_upgraded_once(ledger_url, capsys):
    make_v1(ledger_url)
    before = _tables(ledger_url)
    for read_only in (False, True):
        with pytest.raises(LedgerError, match="schema version 1 .* Nothing was changed.* `sparkpriv ledger upgrade "
                                              "--ledger '"):
            open_ledger(ledger_url, read_only=read_only)
    assert cli("ledger", "show", "--ledger", ledger_url) == 1
    assert "sparkpriv ledger upgrade" in capsys.readouterr().err
    assert _tables(ledger_url) == before  # nothing created or changed

    assert cli("ledger", "upgrade", "--ledger", ledger_url) == 0
    assert "upgraded from version 1: 2 budget(s), 4 entr" in capsys.readouterr().out
    with open_ledger(ledger_url) as ledger:
        calls, census = ledger.status("cdr.calls"), ledger.status("census.adult")
        assert [(e["id"], e["state"]) for e in calls.entries] == [("a1", "committed"), ("a2", "aborted"),
                                                                 ("a3", "reserved")]
        assert calls.spent_epsilon == 0.75 and calls.window == "lifetime"  # 1/4 + 1/2, as before the upgrade
        assert census.entries[0]["parameters"] == {"k": 4} and census.budget_delta == 1e-6
        report = ledger.verify()
        assert report.ok, report.problems
        kinds = [h["kind"] for h in ledger.history()]
        assert kinds == ["upgrade", "budget", "budget", "import", "import", "import", "import"]
        # it works as a version-2 ledger: a unit covers a table without a budget of its own
        ledger.set_unit("subscribers", tables="cdr.*", epsilon=1.0, delta=0.0)
        res = ledger.reserve("cdr.sms", event=ev.LaplaceDpEvent(8.0), mechanism="m", parameters={}, output_path="/o")
        assert res.epsilon_spent_before == 0.75 and res.epsilon_spent_after == 0.875
        ledger.abort("a3", reason="killed before the upgrade")
        assert ledger.verify().ok
    assert upgrade_ledger(ledger_url).endswith("is already at schema version 2; nothing to do.")
