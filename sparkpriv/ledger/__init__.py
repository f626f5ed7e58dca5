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
(``~`` is expanded), ``postgresql://user@host:5432/db`` (or ``postgres://``).
Without a URL, ``$SPARKPRIV_LEDGER`` or ``sqlite:///~/.sparkpriv/ledger.sqlite``.
"""

from __future__ import annotations

import os

from sparkpriv.errors import LedgerError
from sparkpriv.ledger.base import (
    DEFAULT_LEDGER_ENV,
    DEFAULT_LEDGER_URL,
    SCHEMA_VERSION,
    Ledger,
    Reservation,
    TableStatus,
    default_ledger_url,
    redact_url,
)

__all__ = [
    "DEFAULT_LEDGER_ENV",
    "DEFAULT_LEDGER_URL",
    "SCHEMA_VERSION",
    "Ledger",
    "Reservation",
    "TableStatus",
    "default_ledger_url",
    "open_ledger",
]


def open_ledger(url: str | None = None) -> Ledger:
    """Open (creating its schema if needed) the ledger at ``url``.

    Parameters
    ----------
    url : str or None
        ``sqlite:///<path>`` or ``postgresql://...``; None means
        ``$SPARKPRIV_LEDGER``, else ``sqlite:///~/.sparkpriv/ledger.sqlite``.

    Returns
    -------
    ledger : Ledger
        Also a context manager that closes it.
    """
    if url is None:
        url = default_ledger_url()
    if not isinstance(url, str) or not url:
        raise LedgerError(f"A ledger URL must be a non-empty string. Got {url!r} instead.")
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path:
            raise LedgerError(f"The SQLite ledger URL {url!r} names no file; use sqlite:///path/to/ledger.sqlite.")
        from sparkpriv.ledger.sqlite import SQLiteLedger

        return SQLiteLedger(url, os.path.expanduser(path))
    if url.startswith(("postgresql://", "postgres://")):
        from sparkpriv.ledger.postgres import PostgresLedger

        return PostgresLedger(url)
    raise LedgerError(
        f"Unsupported ledger URL {redact_url(url)!r}: use sqlite:///path/to/ledger.sqlite "
        "(sqlite:////abs/path for an absolute path) or postgresql://user@host:port/database."
    )
