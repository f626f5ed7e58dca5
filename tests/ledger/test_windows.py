"""Privacy units and windows against a brute-force reference over random schedules, on both backends.

A schedule is a random sequence of release attempts on several tables at
random times over about four months (on a grid of half days, so that spends
exactly 30 days apart occur: they share no window of 30 days). The ledger's
clock is replaced by the schedule's. The reference knows nothing of the
ledger's shortcut (checking only the fullest window): for every budget that
covers an attempt's table it enumerates the windows that contain the attempt,
one per start at which the set of spends inside changes, and composes each;
the attempt must be admitted exactly when every such window fits. At the end
every window of every budget, anywhere in time, is checked to fit.

Pure releases (Laplace at delta 0) compose to the exact sum of their epsilons
(Fractions); Gaussian releases compose to one Gaussian with
``1 / z**2 = sum 1 / z_i**2``, whose epsilon at delta solves Balle & Wang's
exact ``delta(epsilon)``: both closed forms, independent of the ledger.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting import dp_event as ev

import sparkpriv.ledger.base as ledger_base
from sparkpriv.errors import BudgetExceededError, ParameterError
from sparkpriv.ledger import open_ledger
from tests.ledger.test_hardening import exact_gaussian_epsilon

START = datetime(2026, 1, 20, tzinfo=timezone.utc)
HALF_DAY = timedelta(hours=12)
US = timedelta(microseconds=1)


class Clock:
    def __init__(self):
        self.now = START

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(ledger_base, "_clock", c)
    return c


# -- the reference ---------------------------------------------------------------------------


class RefBudget:
    def __init__(self, name, covers, epsilon, window):
        self.name, self.covers, self.epsilon, self.window = name, covers, epsilon, window

    def windows_containing(self, t: datetime, times: list) -> list:
        """Each window (a predicate on a time) containing ``t``, one per distinct set of ``times`` inside."""
        if self.window == "lifetime":
            return [lambda u: True]
        if self.window == "month":
            return [lambda u: (u.year, u.month) == (t.year, t.month)]
        n = timedelta(days=int(self.window[:-1]))
        # [s, s + n) contains t for s in (t - n, t]; its set of spends changes only at s = a spend time
        # or just after t - n: enumerate those starts
        starts = {t - n + US, t} | {u for u in times if t - n < u <= t} | {u + US for u in times if t - n < u < t}
        return [lambda u, s=s: s <= u < s + n for s in starts]

    def every_window(self, times: list) -> list:
        """Every distinct window over the whole schedule (for the final audit)."""
        if self.window == "lifetime":
            return [lambda u: True]
        if self.window == "month":
            return [lambda u, m=(t.year, t.month): (u.year, u.month) == m for t in times]
        n = timedelta(days=int(self.window[:-1]))
        return [lambda u, s=s: s <= u < s + n for s in set(times)]


def compose(kind: str, spends: list, delta: float) -> float | Fraction:
    if not spends:
        return Fraction(0) if kind == "laplace" else 0.0
    if kind == "laplace":
        return sum((Fraction(1) / Fraction(b) for b in spends), Fraction(0))
    return exact_gaussian_epsilon(spends, delta)


def reference_admits(budgets, kind, delta, counted, attempt) -> tuple[bool, float]:
    """Whether every window of every budget covering the attempt fits it; and the closest margin."""
    t, table, param = attempt
    margin = math.inf
    for b in budgets:
        if not b.covers(table):
            continue
        mine = [(u, p) for (u, tab, p) in counted if b.covers(tab)]
        for inside in b.windows_containing(t, [u for u, _ in mine]):
            total = compose(kind, [p for u, p in mine if inside(u)] + [param], delta)
            margin = min(margin, float(Fraction(b.epsilon) - Fraction(total)) if kind == "laplace"
                         else b.epsilon - total)
    return margin >= 0, margin


# -- the schedules ---------------------------------------------------------------------------

TABLES = ("cdr.calls", "cdr.sms", "billing.invoices", "census.adult")


def configure(ledger, kind: str, delta: float) -> list:
    """The budgets of the schedule, set in the ledger and returned as reference budgets."""
    scale = 1.0 if kind == "laplace" else 0.9
    unit_eps, table_eps, census_eps = 2.0 * scale, 1.5 * scale, 2.5 * scale
    ledger.set_unit("subscribers", tables="cdr.*,billing.*", epsilon=unit_eps, delta=delta, window="30d",
                    reason="the same subscribers")
    ledger.set_budget("cdr.calls", epsilon=table_eps, delta=delta, window="month", reason="policy 12")
    ledger.set_budget("census.adult", epsilon=census_eps, delta=delta, reason="lifetime")
    return [RefBudget("subscribers", lambda t: t.startswith(("cdr.", "billing.")), unit_eps, "30d"),
            RefBudget("cdr.calls", lambda t: t == "cdr.calls", table_eps, "month"),
            RefBudget("census.adult", lambda t: t == "census.adult", census_eps, "lifetime")]


def schedule(seed: int, n: int, kind: str) -> list:
    rng = np.random.default_rng(seed)
    t = START
    out = []
    for _ in range(n):
        t = t + HALF_DAY * int(rng.integers(0, 6))  # several on the same half day, and exact 30-day gaps
        table = TABLES[int(rng.integers(len(TABLES)))]
        if kind == "laplace":
            param = float(rng.choice([2.0, 4.0, 8.0]))  # epsilon 0.5, 0.25, 0.125: exact in binary
        else:
            param = float(rng.uniform(4.0, 12.0))
        out.append((t, table, param, bool(rng.random() < 0.2)))  # the last: the job fails and aborts
    return out


@pytest.mark.parametrize("kind,seed,n", [("laplace", 1, 70), ("laplace", 2, 70), ("gaussian", 3, 45)])
def test_units_and_windows_admit_exactly_what_the_brute_force_reference_admits(ledger_url, clock, kind, seed, n):
    delta = 0.0 if kind == "laplace" else 1e-6
    counted: list = []  # (time, table, parameter) of the spends counted now
    decisions = []
    with open_ledger(ledger_url) as ledger:
        budgets = configure(ledger, kind, delta)
        for t, table, param, fails in schedule(seed, n, kind):
            clock.now = t
            event = ev.LaplaceDpEvent(param) if kind == "laplace" else ev.GaussianDpEvent(param)
            want, margin = reference_admits(budgets, kind, delta, counted, (t, table, param))
            if table == "census.adult" or any(b.covers(table) for b in budgets):
                try:
                    res = ledger.reserve(table, event=event, mechanism="m", parameters={}, output_path="/o")
                    got = True
                except BudgetExceededError:
                    got = False
            if abs(margin) > 1e-9 or kind == "laplace":  # a Gaussian total within 1e-9 of a budget: too close
                assert got == want, (t, table, param, margin, decisions[-5:])
            decisions.append((t.isoformat(), table, param, got))
            if got:
                if fails:
                    ledger.abort(res.id, reason="the job failed before publishing")
                else:
                    ledger.commit(res.id)
                    counted.append((t, table, param))
                # the reservation's figures are the ledger's composition of the budget's fullest window
                first = res.budgets[0]
                assert first.spent_after <= first.epsilon
        assert 0.2 * n < sum(d[-1] for d in decisions) < 0.9 * n, "the schedule must reach the budgets"
        # the status states the fullest window at the end: against the reference
        end = clock.now
        unit = ledger.unit_status("subscribers")
        inside = [p for u, tab, p in counted if tab.startswith(("cdr.", "billing.")) and u > end - timedelta(days=30)]
        assert unit.spent_epsilon == pytest.approx(float(compose(kind, inside, delta)), rel=1e-8, abs=1e-12)
        assert set(unit.members) <= {"cdr.calls", "cdr.sms", "billing.invoices"}
        assert ledger.verify().ok
    # the audit: every window of every budget, anywhere in the schedule, fits
    for b in budgets:
        mine = [(u, p) for u, tab, p in counted if b.covers(tab)]
        for inside in b.every_window([u for u, _ in mine]):
            total = compose(kind, [p for u, p in mine if inside(u)], delta)
            assert total <= b.epsilon * (1 + 1e-9), (b.name, total)


def test_a_spend_exactly_a_window_length_earlier_shares_no_window(ledger_url, clock):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget("cdr.calls", epsilon=1.0, delta=0.0, window="30d")
        ledger.reserve("cdr.calls", event=ev.LaplaceDpEvent(1.0), mechanism="m", parameters={}, output_path="/o")
        clock.now = START + timedelta(days=30) - US  # still inside the first spend's window
        with pytest.raises(BudgetExceededError, match="oldest counted spend in this window was made at "
                                                      "2026-01-20 00:00:00 UTC; each spend stops counting 30 days"):
            ledger.reserve("cdr.calls", event=ev.LaplaceDpEvent(1e6), mechanism="m", parameters={},
                           output_path="/o")
        clock.now = START + timedelta(days=30)
        ledger.reserve("cdr.calls", event=ev.LaplaceDpEvent(1.0), mechanism="m", parameters={}, output_path="/o")
        status = ledger.status("cdr.calls")
    assert (status.spent_epsilon, status.counted, status.window) == (1.0, 1, "30d")


def test_calendar_months_start_empty_and_a_late_unit_counts_earlier_releases(ledger_url, clock):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget("cdr.calls", epsilon=1.0, delta=0.0, window="month")
        ledger.set_budget("billing.invoices", epsilon=5.0, delta=0.0)
        clock.now = datetime(2026, 3, 31, 23, 59, 59, tzinfo=timezone.utc)
        ledger.reserve("cdr.calls", event=ev.LaplaceDpEvent(1.0), mechanism="m", parameters={}, output_path="/o")
        ledger.reserve("billing.invoices", event=ev.LaplaceDpEvent(2.0), mechanism="m", parameters={},
                       output_path="/o")
        with pytest.raises(BudgetExceededError, match="(?s)in any calendar month.*calendar month 2026-03 .UTC."):
            ledger.check_admission("cdr.calls", ev.LaplaceDpEvent(1e6))
        clock.now = datetime(2026, 4, 1, tzinfo=timezone.utc)
        ledger.check_admission("cdr.calls", ev.LaplaceDpEvent(1.0))  # April starts with nothing spent
        # a unit set now over both tables counts what they spent before it existed
        ledger.set_unit("subscribers", tables=["cdr.*", "billing.*"], epsilon=1.75, delta=0.0, window="60d")
        assert ledger.unit_status("subscribers").spent_epsilon == 1.5
        with pytest.raises(BudgetExceededError, match="privacy unit 'subscribers' .tables cdr.., billing... in any "
                                                      "60 consecutive days"):
            ledger.reserve("cdr.calls", event=ev.LaplaceDpEvent(2.0), mechanism="m", parameters={}, output_path="/o")
        # a table without a budget of its own is admitted by the unit that covers it alone
        res = ledger.reserve("billing.refunds", event=ev.LaplaceDpEvent(4.0), mechanism="m", parameters={},
                             output_path="/o")
        assert [(b.kind, b.name) for b in res.budgets] == [("unit", "subscribers")]
        assert res.epsilon_spent_after == 1.75 and res.budget_epsilon == 1.75
        with pytest.raises(BudgetExceededError, match="No privacy budget is set for table 'other.t'"):
            ledger.reserve("other.t", event=ev.LaplaceDpEvent(4.0), mechanism="m", parameters={}, output_path="/o")
        assert ledger.budgets_for("billing.refunds")[0].name == "subscribers" and not ledger.budgets_for("other.t")


def test_bad_units_and_windows_are_refused_with_the_fix(ledger_url):
    with open_ledger(ledger_url) as ledger:
        for window in ("30", "0d", "month ", "weekly", "99999d", 30):
            with pytest.raises(ParameterError, match="'window' parameter of Ledger.set_budget must be 'lifetime', "
                                                     "'month'"):
                ledger.set_budget("t", epsilon=1.0, delta=0.0, window=window)
        for tables in ("", "cdr.[ab]", "cdr a", ["cdr.*", 3], ",,"):
            with pytest.raises(ParameterError, match="'tables' parameter of Ledger.set_unit"):
                ledger.set_unit("u", tables=tables, epsilon=1.0, delta=0.0)
        with pytest.raises(ParameterError, match="does not exist yet: give the tables"):
            ledger.set_unit("u", epsilon=1.0, delta=0.0)
        with pytest.raises(ParameterError, match="'unit' parameter of Ledger.set_unit"):
            ledger.set_unit("sub scribers", tables="cdr.*", epsilon=1.0, delta=0.0)
        ledger.set_unit("u", tables="cdr.*", epsilon=1.0, delta=0.0, window="7d")
        ledger.set_unit("u", epsilon=2.0, delta=0.0)  # tables and window kept
        status = ledger.unit_status("u")
    assert (status.patterns, status.window, status.budget_epsilon) == (("cdr.*",), "7d", 2.0)
