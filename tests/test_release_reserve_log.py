"""The ledger's log line says at which delta it states the release's epsilon."""

from __future__ import annotations

import logging

from dp_accounting import dp_event as ev

from sparkpriv.ledger import open_ledger
from sparkpriv.release import reserve


def test_reservation_log_names_the_budgets_delta(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    with open_ledger(url) as led:
        led.set_budget("t.log", epsilon=10.0, delta=1e-6)
    caplog.set_level(logging.INFO, logger="sparkpriv.release")
    hold = reserve(event=ev.GaussianDpEvent(2.0), mechanism="m", parameters={}, ledger=url, table_id="t.log")
    try:
        line = next(r.getMessage() for r in caplog.records if "ledger: reserved" in r.getMessage())
        assert "at the budget's delta 1e-06" in line and "receipt states the release at its own" in line
    finally:
        hold.abort("test")
        hold.close()
