"""The admission rule, one for every figure the ledger states, and its dry run, on both backends.

Expected figures come from closed forms (pure epsilons add up) or from
dp_accounting composing the events itself, never from the ledger.
"""

from __future__ import annotations

import pytest
from dp_accounting import dp_event as ev

from sparkpriv.errors import BudgetExceededError, LedgerError, ParameterError
from sparkpriv.ledger import open_ledger
from tests.ledger.test_ledger import TABLE, laplace, reserve


def _rows(ledger) -> int:
    with ledger._transaction(write=False) as tx:
        return tx.execute("SELECT COUNT(*) FROM sparkpriv_releases")[0][0]


def _refusal(call) -> str:
    with pytest.raises(BudgetExceededError) as refused:
        call()
    assert refused.value.exit_code == 3
    return str(refused.value)


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_check_admission_refuses_as_reserve_would_and_writes_nothing(ledger_url, delta):
    with open_ledger(ledger_url) as ledger:
        no_budget = _refusal(lambda: ledger.check_admission(TABLE, laplace(0.5)))
        assert no_budget == _refusal(lambda: reserve(ledger, laplace(0.5)))
        ledger.set_budget(TABLE, epsilon=1.0, delta=delta)
        assert ledger.check_admission(TABLE, laplace(0.5)) is None
        if delta > 0:
            assert ledger.check_admission(TABLE, ev.GaussianDpEvent(50.0)) is None
        else:  # approximate DP never fits delta = 0
            assert "cannot fit a budget with delta = 0" in _refusal(
                lambda: ledger.check_admission(TABLE, ev.GaussianDpEvent(50.0)))
        reserve(ledger, laplace(0.75))
        rows = _rows(ledger)
        dry = _refusal(lambda: ledger.check_admission(TABLE, laplace(0.5)))
        assert _rows(ledger) == rows  # nothing written
        assert dry == _refusal(lambda: reserve(ledger, laplace(0.5)))  # the same words as the reservation's
        assert ledger.check_admission(TABLE, laplace(0.2)) is None
        with pytest.raises(ParameterError, match="'event' parameter of Ledger.check_admission"):
            ledger.check_admission(TABLE, ev.LaplaceDpEvent(-1.0))
        with pytest.raises(ParameterError, match="table_id"):
            ledger.check_admission("no such table", laplace(0.1))
    with open_ledger(ledger_url, read_only=True) as ledger:  # a dry run needs no write access
        assert dry == _refusal(lambda: ledger.check_admission(TABLE, laplace(0.5)))
        assert ledger.check_admission(TABLE, laplace(0.2)) is None


def test_check_admission_reports_a_corrupt_entry(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=4.0, delta=0.0)
        bad = reserve(ledger, laplace(1.0))
        with ledger._transaction(write=True) as tx:
            tx.execute("UPDATE sparkpriv_releases SET events = ? WHERE id = ?", ("{not json", bad.id))
        with pytest.raises(LedgerError, match=f"Ledger entry {bad.id} .* is corrupt"):
            ledger.check_admission(TABLE, laplace(1.0))
