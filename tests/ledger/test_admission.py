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


# -- one figure: admitted by, shown, and stated in refusals -------------------------------------


def _pld_reference(events, delta: float) -> float:
    """dp_accounting's PLD epsilon (add/remove, pessimistic), capped by the exact pure sum."""
    from tests.ledger.test_hardening import dp_accounting_epsilon

    pure = sum(1.0 / e.noise_multiplier for e in events if isinstance(e, ev.LaplaceDpEvent))
    pld = dp_accounting_epsilon(events, delta)
    return min(pld, pure) if all(isinstance(e, ev.LaplaceDpEvent) for e in events) else pld


def _fill(ledger, table, event, limit=40):
    """Reserve ``event`` on ``table`` until refused; the reservations and the refusal's message."""
    admitted = []
    for _ in range(limit):
        try:
            admitted.append(ledger.reserve(table, event=event, mechanism="m", parameters={}, output_path="/o"))
        except BudgetExceededError as exc:
            return admitted, str(exc)
    raise AssertionError(f"{limit} releases admitted")


def _figure(message: str, label: str) -> float:
    """The number after ``label`` in a refusal message."""
    import re

    return float(re.search(re.escape(label) + r" ([0-9.e+-]+|inf)", message).group(1))


def test_pure_releases_at_delta_above_zero_are_admitted_by_the_figure_that_is_shown(ledger_url):
    """A Laplace-only table at delta 1e-6 was admitted by the plain sum of epsilons, while `show`
    and the refusal stated dp_accounting's (smaller) composition: 60 releases of 0.05 fitted a
    budget of 3, then `show` said 1.64 spent and the refusal "would be 1.6547" of 3; with one
    negligible Gaussian in the history 174 fitted. Now both use the one figure."""
    budget, delta, step = 2.0, 1e-6, ev.LaplaceDpEvent(10.0)  # epsilon 0.1 each: the sum fits 20
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=budget, delta=delta)
        admitted, refusal = _fill(ledger, TABLE, step)
        status = ledger.status(TABLE)
        ledger.set_budget("with.gaussian", epsilon=budget, delta=delta)
        reserve(ledger, ev.GaussianDpEvent(1e4), table_id="with.gaussian")  # adds epsilon ~ 1e-3
        mixed, mixed_refusal = _fill(ledger, "with.gaussian", step)
    n = len(admitted)
    assert n > 20  # the composition, not the sum (2 / 0.1 = 20), admitted them
    # the count agrees with dp_accounting's own composition (up to its discretization)
    assert _pld_reference([step] * n, delta) <= budget + 2e-3
    assert _pld_reference([step] * (n + 1), delta) > budget - 2e-3
    # what is admitted, shown and refused is the same figure
    assert all(r.epsilon_spent_after <= budget for r in admitted)
    assert status.spent_epsilon == admitted[-1].epsilon_spent_after
    assert _figure(refusal, "spent:     epsilon =") == pytest.approx(status.spent_epsilon, rel=1e-5)
    assert _figure(refusal, "composed total would be") > budget
    assert status.remaining_epsilon == pytest.approx(budget - status.spent_epsilon)
    # a negligible Gaussian changes the count by at most one, not from 60 to 174
    assert abs(len(mixed) - n) <= 1
    assert _figure(mixed_refusal, "composed total would be") > budget


# -- hand-edited budgets, non-finite parameters -------------------------------------------------


def test_a_hand_edited_budget_row_gives_a_clear_error_not_a_traceback(ledger_url, capsys):
    """Epsilon 'abc' (SQLite stores text in a DOUBLE PRECISION column, and 'abc' > 0 there) or NaN
    (PostgreSQL: NaN > 0) passed the schema's CHECK and made `ledger show` crash with a traceback."""
    import json

    from tests.ledger.test_hardening import OTHER, raw_sql
    from tests.ledger.test_ledger import cli

    bad = "'abc'" if ledger_url.startswith("sqlite") else "'NaN'"
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=2.0, delta=1e-6)
        ledger.set_budget(OTHER, epsilon=2.0, delta=1e-6)
        reserve(ledger, laplace(0.5))
        raw_sql(ledger, f"UPDATE sparkpriv_budgets SET epsilon = {bad} WHERE table_id = ?", (TABLE,))
        for call in (lambda: reserve(ledger, laplace(0.1)), lambda: ledger.status(TABLE),
                     lambda: ledger.check_admission(TABLE, laplace(0.1))):
            with pytest.raises(LedgerError, match=f"The budget of table '{TABLE}' .* is corrupt: its epsilon is"):
                call()
        reserve(ledger, laplace(0.5), table_id=OTHER)  # other tables work
    capsys.readouterr()
    assert cli("ledger", "show", "--ledger", ledger_url) == 1
    out, err = capsys.readouterr()
    assert f"Table {OTHER}" in out and "is corrupt" in err and "Traceback" not in err
    assert cli("ledger", "show", "--ledger", ledger_url, "--json") == 1
    assert [t["table_id"] for t in json.loads(capsys.readouterr().out)["tables"]] == [OTHER]
    assert cli("ledger", "set-budget", "--ledger", ledger_url, "--table-id", TABLE, "--epsilon", "2",
               "--delta", "1e-6") == 0  # setting it again repairs it
    with open_ledger(ledger_url) as ledger:
        assert ledger.status(TABLE).spent_epsilon == pytest.approx(0.5, abs=1e-5)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_refused_in_recorded_parameters(ledger_url, value, capsys):
    """NaN was accepted in recorded parameters; `ledger show --json` then printed NaN, which strict
    JSON parsers reject."""
    import json

    import numpy as np

    from tests.ledger.test_hardening import raw_sql
    from tests.ledger.test_ledger import cli

    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=2.0, delta=0.0)
        for params, name in (({"fill": value}, "parameters.fill"), ({"b": [1.0, np.float32(value)]}, r"parameters.b\[1\]"),
                             ({"x": {"y": np.float64(value)}}, "parameters.x.y")):
            with pytest.raises(ParameterError, match=f"'{name}' parameter of Ledger.reserve must be a finite"):
                reserve(ledger, laplace(0.5), parameters=params)
        res = reserve(ledger, laplace(0.5), parameters={"fill": 0.0})
        with pytest.raises(ParameterError, match="'receipt_summary.epsilon' parameter of Ledger.commit"):
            ledger.commit(res.id, receipt_summary={"epsilon": value})
        assert ledger.status(TABLE).entries[0]["parameters"] == {"fill": 0.0}
        # an entry stored before the refusal: shown as strict JSON all the same
        raw_sql(ledger, "UPDATE sparkpriv_releases SET parameters = ? WHERE id = ?",
                (json.dumps({"fill": value}), res.id))
    capsys.readouterr()
    assert cli("ledger", "show", "--ledger", ledger_url, "--json") == 0
    text = capsys.readouterr().out
    strict = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    shown = strict["tables"][0]["entries"][0]["parameters"]["fill"]
    assert shown == ("nan" if value != value else "inf" if value > 0 else "-inf")
