"""The privacy budget ledger: every release of a table is checked and recorded.

>>> from sparkpriv.ledger import open_ledger
>>> with open_ledger("sqlite:////var/lib/sparkpriv/ledger.sqlite") as ledger:  # doctest: +SKIP
...     ledger.set_budget("cdr.daily_towers", epsilon=3.0, delta=1e-6)
...     res = ledger.reserve("cdr.daily_towers", event=event, mechanism="jl_laplace",
...                          parameters={"k": 64}, output_path="s3://out/2024-05-01")
...     ...  # read, release, write
...     ledger.commit(res.id)

A release reserves its spend before it reads data, commits it when the output
is published and aborts it if the job fails first. See docs/ledger.md.

Ledger URLs: ``sqlite:///relative/path.sqlite``, ``sqlite:////absolute/path.sqlite``
(``~`` is expanded; ``?mode=ro`` opens it read-only), ``postgresql://user@host:5432/db``
(or ``postgres://``). Without a URL, ``$SPARKPRIV_LEDGER`` or
``sqlite:///~/.sparkpriv/ledger.sqlite``.
"""

from __future__ import annotations

import os

from sparkpriv.errors import LedgerError
from sparkpriv.ledger.base import (
    DEFAULT_LEDGER_ENV,
    DEFAULT_LEDGER_URL,
    EVENT_FORMAT,
    SCHEMA_VERSION,
    Ledger,
    Reservation,
    BudgetSpend,
    TableStatus,
    UnitStatus,
    default_ledger_url,
    redact_url,
)
from sparkpriv.ledger.chain import KEY_FILE_ENV, VerifyReport
from sparkpriv.ledger.checks import JOB_ID_ENV, job_context

__all__ = [
    "DEFAULT_LEDGER_ENV",
    "DEFAULT_LEDGER_URL",
    "EVENT_FORMAT",
    "SCHEMA_VERSION",
    "Ledger",
    "Reservation",
    "TableStatus",
    "UnitStatus",
    "BudgetSpend",
    "VerifyReport",
    "KEY_FILE_ENV",
    "JOB_ID_ENV",
    "default_ledger_url",
    "job_context",
    "open_ledger",
    "upgrade_ledger",
]


def open_ledger(url: str | None = None, *, read_only: bool = False, add_to_existing: bool = False,
                key_file: str | None = None, _upgrade: bool = False) -> Ledger:
    """Open (creating its schema if needed) the ledger at ``url``.

    Parameters
    ----------
    url : str or None
        ``sqlite:///<path>`` (``sqlite:///<path>?mode=ro`` opens it read-only)
        or ``postgresql://...``; None means ``$SPARKPRIV_LEDGER``, else
        ``sqlite:///~/.sparkpriv/ledger.sqlite``.
    read_only : bool, default False
        Open an existing ledger for reading only (``ledger show``, reports):
        nothing is created or changed, and every write raises ``LedgerError``.
    add_to_existing : bool, default False
        Let a new ledger be created inside an SQLite database that already
        holds other tables (refused by default: it is usually a wrong URL).
    key_file : str or None
        A file holding the journal's key (HMAC; docs/ledger.md, "Tamper
        evidence"); None means ``$SPARKPRIV_LEDGER_KEY_FILE``, else no key.

    Returns
    -------
    ledger : Ledger
        Also a context manager that closes it.
    """
    if url is None:
        url = default_ledger_url()
    if not isinstance(url, str) or not url:
        raise LedgerError(f"A ledger URL must be a non-empty string. Got a {type(url).__name__} instead.")
    if url.startswith("sqlite:///"):
        path, _, query = url[len("sqlite:///"):].partition("?")
        if query:
            if query != "mode=ro":
                raise LedgerError(
                    f"Unsupported query {redact_url(query)!r} in the SQLite ledger URL {redact_url(url)!r}: the "
                    "only one understood is '?mode=ro' (open read-only). A path cannot contain '?'."
                )
            read_only = True
        if not path:
            raise LedgerError(f"The SQLite ledger URL {url!r} names no file; use sqlite:///path/to/ledger.sqlite.")
        from sparkpriv.ledger.sqlite import SQLiteLedger

        return SQLiteLedger(url, os.path.expanduser(path), read_only=read_only, add_to_existing=add_to_existing,
                            key_file=key_file, upgrade=_upgrade)
    if url.startswith(("postgresql://", "postgres://")):
        from sparkpriv.ledger.postgres import PostgresLedger

        return PostgresLedger(url, read_only=read_only, key_file=key_file, upgrade=_upgrade)
    raise LedgerError(
        f"Unsupported ledger URL {redact_url(url)!r}: use sqlite:///path/to/ledger.sqlite "
        "(sqlite:////abs/path for an absolute path) or postgresql://user@host:port/database."
    )


def upgrade_ledger(url: str | None = None, *, key_file: str | None = None) -> str:
    """Upgrade a ledger of schema version 1 to this version's, in one transaction; says what it did.

    Back the ledger up and stop its writers first: afterwards sparkpriv
    versions that write version 1 refuse it. What the ledger held (budgets and
    entries, as found) becomes the first records of its journal. A ledger that
    is already current is left as it is.
    """
    with open_ledger(url, key_file=key_file, _upgrade=True) as ledger:
        change = ledger.schema_change
        return (f"Ledger {ledger.url}: {change}." if change and change.startswith("upgraded") else
                f"Ledger {ledger.url} is already at schema version {SCHEMA_VERSION}; nothing to do."
                if change is None else f"Ledger {ledger.url}: {change} at schema version {SCHEMA_VERSION}.")
