"""The ledger's SQL schema (version 2) and the upgrade of a version-1 ledger (docs/ledger-internals.md).

The same statements run on SQLite and PostgreSQL (``?`` placeholders; a
backend translates them). Version 1 (sparkpriv before the journal) had
``sparkpriv_meta``, ``sparkpriv_budgets`` (one budget per table) and
``sparkpriv_releases`` (with a foreign key to the budgets). Version 2 adds a
window and who/why to budgets, privacy units (``sparkpriv_units``), the user,
job and sparkpriv version to entries (whose table need no budget of its own
any more: a unit may cover it), and the journal (``sparkpriv_journal``, the
hash chain of every change: :mod:`sparkpriv.ledger.chain`).

A version-1 ledger is not changed behind its users' backs: opening it raises a
:class:`~sparkpriv.errors.LedgerError` that says to run ``sparkpriv ledger
upgrade`` once, which converts it in one transaction and journals what it held
(one ``budget`` record per budget, one ``import`` record per entry, as found).
"""

from __future__ import annotations

SCHEMA_VERSION = 2


def releases_table(name: str = "sparkpriv_releases") -> str:
    return f"""CREATE TABLE IF NOT EXISTS {name} (
        id TEXT PRIMARY KEY,
        table_id TEXT NOT NULL,
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
        pid INTEGER NOT NULL,
        user_name TEXT NOT NULL DEFAULT '',
        job_id TEXT,
        sparkpriv_version TEXT NOT NULL DEFAULT '')"""


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sparkpriv_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sparkpriv_budgets (
        table_id TEXT PRIMARY KEY,
        epsilon DOUBLE PRECISION NOT NULL CHECK (epsilon > 0),
        delta DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
        updated_at TEXT NOT NULL,
        time_window TEXT NOT NULL DEFAULT 'lifetime',
        updated_by TEXT,
        reason TEXT)""",
    """CREATE TABLE IF NOT EXISTS sparkpriv_units (
        unit TEXT PRIMARY KEY,
        patterns TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL CHECK (epsilon > 0),
        delta DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
        time_window TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        updated_by TEXT,
        reason TEXT)""",
    releases_table(),
    """CREATE TABLE IF NOT EXISTS sparkpriv_journal (
        seq BIGINT PRIMARY KEY,
        kind TEXT NOT NULL,
        at TEXT NOT NULL,
        body TEXT NOT NULL,
        prev TEXT NOT NULL,
        hash TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS sparkpriv_releases_by_table ON sparkpriv_releases (table_id, state)",
    "CREATE INDEX IF NOT EXISTS sparkpriv_releases_by_state ON sparkpriv_releases (state, created_at)",
)

#: Columns of a version-1 entry (what the upgrade copies).
V1_RELEASE_COLUMNS = ("id", "table_id", "state", "mechanism", "parameters", "events", "epsilon", "epsilon_delta",
                      "output_path", "receipt_summary", "created_at", "published_at", "aborted_at", "abort_reason",
                      "host", "pid")

#: The statements that turn a version-1 ledger's tables into version 2's (the new tables come from SCHEMA).
UPGRADE_FROM_1 = (
    "ALTER TABLE sparkpriv_budgets ADD COLUMN time_window TEXT NOT NULL DEFAULT 'lifetime'",
    "ALTER TABLE sparkpriv_budgets ADD COLUMN updated_by TEXT",
    "ALTER TABLE sparkpriv_budgets ADD COLUMN reason TEXT",
    # entries: without the foreign key to a table budget (a unit may cover the table), with the new columns
    releases_table("sparkpriv_releases_v2"),
    f"INSERT INTO sparkpriv_releases_v2 ({', '.join(V1_RELEASE_COLUMNS)}) "
    f"SELECT {', '.join(V1_RELEASE_COLUMNS)} FROM sparkpriv_releases",
    "DROP TABLE sparkpriv_releases",
    "ALTER TABLE sparkpriv_releases_v2 RENAME TO sparkpriv_releases",
)
