"""What the independent stress review of the ledger found, one test per finding, on both backends.

Expected epsilons come from closed forms or from dp_accounting composing the
events itself, never from the ledger.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import sqlite3
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event as ev
from dp_accounting.pld import pld_privacy_accountant
from scipy.optimize import brentq

from sparkpriv.errors import BudgetExceededError, LedgerError, ParameterError
from sparkpriv.ledger import open_ledger
from sparkpriv.privacy.accounting import events_to_json
from sparkpriv.privacy.calibration import gaussian_delta
from tests.ledger.test_ledger import TABLE, cli, laplace, reserve

OTHER = "other.table"


def exact_gaussian_epsilon(zs, delta: float) -> float:
    """Exact epsilon of the composition of Gaussians with multipliers ``zs`` (one Gaussian, 1/z^2 = sum 1/z_i^2)."""
    z = 1.0 / math.sqrt(math.fsum(1.0 / (x * x) for x in zs))
    return brentq(lambda e: gaussian_delta(z, e) - delta, 1e-12, 500.0, xtol=1e-13)


def dp_accounting_epsilon(events, delta: float) -> float:
    """dp_accounting's own PLD epsilon of the composition of ``events`` (composed one by one)."""
    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4)
    for e in events:
        acc.compose(e)
    return acc.get_epsilon(delta)


def raw_sql(ledger, sql: str, params=()):
    """Run SQL on the ledger's own connection, as a hand-editing operator would."""
    with ledger._transaction(write=True) as tx:
        return tx.execute(sql, params)


def deep_event(depth: int) -> ev.DpEvent:
    e = laplace(1.0)
    for _ in range(depth):
        e = ev.ComposedDpEvent([e])
    return e


# -- overspending: negative or fractional spends ------------------------------------------

BAD_EVENTS = {
    "negative discrete Laplace": ev.DiscreteLaplaceDpEvent(-1, 1),
    "negative count": ev.SelfComposedDpEvent(laplace(1.0), -3),
    "fractional count": ev.SelfComposedDpEvent(laplace(1.0), 0.5),
    "zero count": ev.SelfComposedDpEvent(laplace(1.0), 0),
    "count 2.0 (a float)": ev.SelfComposedDpEvent(laplace(1.0), 2.0),
    "negative Laplace": ev.LaplaceDpEvent(-1.0),
    "zero Laplace": ev.LaplaceDpEvent(0.0),
    "NaN Laplace": ev.LaplaceDpEvent(math.nan),
    "negative Gaussian": ev.GaussianDpEvent(-2.0),
    "infinite Gaussian": ev.GaussianDpEvent(math.inf),
    "string Gaussian": ev.GaussianDpEvent("4"),
    "None Laplace": ev.LaplaceDpEvent(None),
    "string inside a composition": ev.ComposedDpEvent([laplace(1.0), "laplace"]),
    "fractional sensitivity": ev.DiscreteLaplaceDpEvent(1.0, 0.5),
    "bool count": ev.SelfComposedDpEvent(laplace(1.0), True),
    "class the ledger cannot account": ev.ZCDpEvent(0.1),
    "Poisson sampling of a Laplace": ev.PoissonSampledDpEvent(0.5, laplace(4.0)),
    "Poisson sampling probability above 1": ev.PoissonSampledDpEvent(1.5, ev.GaussianDpEvent(4.0)),
    "nested 100,000 deep": deep_event(100_000),
}


@pytest.mark.parametrize("delta", [0.0, 1e-6])
def test_invalid_events_are_refused_before_anything_is_composed_or_stored(ledger_url, delta):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=2.0, delta=delta)
        for what, event in BAD_EVENTS.items():
            with pytest.raises(ParameterError, match="'event' parameter of Ledger.reserve") as refused:
                reserve(ledger, event)
            assert refused.value.exit_code == 2, what
        assert ledger.status(TABLE).entries == []
        # Before: the negative events lowered the recorded spend, and 5 releases of epsilon 1 fitted a budget of 2.
        admitted = 0
        for _ in range(5):
            with contextlib.suppress(BudgetExceededError):
                reserve(ledger, laplace(1.0))
                admitted += 1
        assert admitted == 2
        assert 1.99 <= ledger.status(TABLE).spent_epsilon <= 2.0 + 1e-9


def test_numpy_scalars_in_an_event_are_stored_as_plain_numbers(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=2.0, delta=0.0)
        res = reserve(ledger, ev.SelfComposedDpEvent(ev.LaplaceDpEvent(np.float32(4.0)), np.int64(2)))
        assert res.epsilon_requested == 0.5
        (entry,) = ledger.status(TABLE).entries
    assert json.loads(entry["events"]) == {"class_name": "SelfComposedDpEvent", "count": 2,
                                           "event": {"class_name": "LaplaceDpEvent", "noise_multiplier": 4.0}}


# -- corrupt stored rows, format stamp ----------------------------------------------------------


CORRUPT_EVENTS = {
    "negative": json.dumps({"class_name": "LaplaceDpEvent", "noise_multiplier": -1.0}),
    "fractional count": json.dumps({"class_name": "SelfComposedDpEvent", "count": 0.5,
                                    "event": {"class_name": "LaplaceDpEvent", "noise_multiplier": 1.0}}),
    "not JSON": "{not json",
    "nested": "[" * 100_000 + "]" * 100_000,
    "unknown class": json.dumps({"class_name": "os.system", "noise_multiplier": 1.0}),
    "string parameter": json.dumps({"class_name": "GaussianDpEvent", "noise_multiplier": "1"}),
}


@pytest.mark.parametrize("what", list(CORRUPT_EVENTS))
def test_a_corrupt_stored_row_blocks_its_table_only(ledger_url, what, capsys):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=4.0, delta=0.0)
        ledger.set_budget(OTHER, epsilon=4.0, delta=0.0)
        bad = reserve(ledger, laplace(1.0))
        reserve(ledger, laplace(1.0), table_id=OTHER)
        raw_sql(ledger, "UPDATE sparkpriv_releases SET events = ? WHERE id = ?", (CORRUPT_EVENTS[what], bad.id))
        for call in (lambda: reserve(ledger, laplace(1.0)), lambda: ledger.status(TABLE)):
            with pytest.raises(LedgerError, match=f"Ledger entry {bad.id} of table '{TABLE}'.* is corrupt"):
                call()
        assert reserve(ledger, laplace(1.0), table_id=OTHER).epsilon_spent_before == 1.0  # nothing else
    capsys.readouterr()
    assert cli("ledger", "show", "--ledger", ledger_url, "--table-id", TABLE) == 1
    err = capsys.readouterr().err
    assert "is corrupt" in err and "Traceback" not in err
    assert cli("ledger", "show", "--ledger", ledger_url) == 1  # the other table is still shown
    shown = capsys.readouterr()
    assert f"Table {OTHER}" in shown.out and f"Table {TABLE}" not in shown.out and bad.id in shown.err


def test_events_carry_a_format_stamp_and_old_entries_read_as_format_1(ledger_url):
    version = importlib.metadata.version("dp-accounting")
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=4.0, delta=0.0)
        new = reserve(ledger, ev.LaplaceDpEvent(2.0))
        (stored,) = raw_sql(ledger, "SELECT events FROM sparkpriv_releases WHERE id = ?", (new.id,))[0]
        assert json.loads(stored) == {"event": {"class_name": "LaplaceDpEvent", "noise_multiplier": 2.0},
                                      "event_format": 2, "dp_accounting": version}
        old = reserve(ledger, ev.LaplaceDpEvent(4.0))  # made to look like an entry of an older sparkpriv
        raw_sql(ledger, "UPDATE sparkpriv_releases SET events = ? WHERE id = ?",
                (events_to_json(ev.LaplaceDpEvent(4.0)), old.id))
        status = ledger.status(TABLE)
        assert status.spent_epsilon == 0.75
        got = {e["id"]: (e["event_format"], e["dp_accounting_version"]) for e in status.entries}
        assert got == {new.id: (2, version), old.id: (1, None)}
        assert reserve(ledger, ev.LaplaceDpEvent(4.0)).epsilon_spent_before == 0.75

        future = json.dumps({"event": {"class_name": "LaplaceDpEvent", "noise_multiplier": 4.0},
                             "event_format": 3, "dp_accounting": "9.0"})
        raw_sql(ledger, "UPDATE sparkpriv_releases SET events = ? WHERE id = ?", (future, old.id))
        for call in (lambda: reserve(ledger, laplace(0.1)), lambda: ledger.status(TABLE)):
            with pytest.raises(LedgerError, match="event format 3.*reads event formats 1, 2"):
                call()


# -- clear errors, honest display ---------------------------------------------------------------


def test_bad_text_and_deep_parameters_give_ledger_errors(ledger_url):
    deep: dict = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=4.0, delta=1e-6)
        for kw, name in (({"output_path": "/out/\udc80"}, "output_path"), ({"mechanism": "jl\udcff"}, "mechanism"),
                         ({"output_path": "/out/\x00"}, "output_path"),
                         ({"parameters": {"k": "\ud800"}}, "parameters.k"),
                         ({"parameters": deep}, "parameters"), ({"receipt_summary": deep}, "receipt_summary"),
                         ({"parameters": {1.5: 2}}, "parameters")):
            with pytest.raises(ParameterError, match=f"'{name}'"):
                reserve(ledger, laplace(0.5), **kw)
        res = reserve(ledger, laplace(0.5))
        with pytest.raises(ParameterError, match="'reservation_id'"):
            ledger.commit("\udc80")
        with pytest.raises(ParameterError, match="'reason'"):
            ledger.abort(res.id, reason="\udc80")
        with pytest.raises(ParameterError, match="'output_path'"):
            ledger.commit(res.id, output_path="\udc80")
        ledger.commit(res.id)
        assert [e["state"] for e in ledger.status(TABLE).entries] == ["committed"]


def test_show_escapes_what_it_displays(ledger_url, capsys):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=4.0, delta=0.0)
        res = reserve(ledger, laplace(0.5), output_path="/out\n  forged-id  2024-01-01 00:00:00  x  committed  0",
                      mechanism="m\r\x1b[2J")
    capsys.readouterr()
    assert cli("ledger", "show", "--ledger", ledger_url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not any("forged-id" in line and res.id not in line for line in lines)  # no fake row
    (row,) = [line for line in lines if res.id in line]
    assert "/out\\n  forged-id" in row and "m\\r\\x1b[2J" in row
    assert len(lines) == 9  # "Ledger ...", "Journal head ...", blank, 4 lines of budget, the header and the row


# -- SQLite: foreign databases and read-only opening --------------------------------------------


def test_sqlite_refuses_a_foreign_database(tmp_path):
    path = tmp_path / "app.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.commit()
    with pytest.raises(LedgerError, match="other tables \\(customers\\) and no sparkpriv ledger"):
        open_ledger(f"sqlite:///{path}")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["customers"]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    with open_ledger(f"sqlite:///{path}", add_to_existing=True) as ledger:  # asked for: added
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
    with open_ledger(f"sqlite:///{path}") as ledger:  # now it is a ledger
        assert ledger.tables() == [TABLE]


def test_sqlite_read_only_url(tmp_path, capsys):
    path = tmp_path / "ledger.sqlite"
    with open_ledger(f"sqlite:///{path}") as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        res = reserve(ledger, laplace(0.5))
    before = sorted(p.name for p in tmp_path.iterdir())
    with open_ledger(f"sqlite:///{path}?mode=ro") as ledger:
        assert ledger.read_only and ledger.tables() == [TABLE]
        assert ledger.status(TABLE).spent_epsilon == 0.5
        for write in (lambda: ledger.set_budget(TABLE, epsilon=2.0, delta=0.0),
                      lambda: reserve(ledger, laplace(0.1)), lambda: ledger.commit(res.id)):
            with pytest.raises(LedgerError, match="read-only"):
                write()
    assert cli("ledger", "show", "--ledger", f"sqlite:///{path}?mode=ro") == 0
    assert res.id in capsys.readouterr().out
    assert not any("?" in p.name for p in tmp_path.iterdir())
    with pytest.raises(LedgerError, match="no SQLite ledger"):
        open_ledger(f"sqlite:///{tmp_path}/missing.sqlite?mode=ro")
    with pytest.raises(LedgerError, match="only one understood is '\\?mode=ro'"):
        open_ledger(f"sqlite:///{path}?mode=rwc")
    assert sorted(p.name for p in tmp_path.iterdir() if "-" not in p.name) == \
        sorted(p for p in before if "-" not in p)
    with open_ledger(f"sqlite:///{path}") as ledger:
        assert ledger.status(TABLE).budget_epsilon == 1.0


def test_read_only_ledger_must_exist_and_be_a_ledger(ledger_url):
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=1.0, delta=0.0)
        raw_sql(ledger, "DROP TABLE sparkpriv_meta")
    with pytest.raises(LedgerError, match="not a sparkpriv ledger"):
        open_ledger(ledger_url, read_only=True)


# -- composition out of the lock, history check -------------------------------------------------


def test_composition_runs_outside_the_write_lock_and_rechecks_the_history(ledger_url, monkeypatch):
    """Compose (dp_accounting's PLD, Laplace at delta > 0) without the lock; a reserve in between is seen.

    The first composition of ``first`` lets another connection reserve; ``first``
    must then find the history changed under the lock, compose again, and be
    refused, since only one of the two releases fits.
    """
    delta = 1e-6
    one = dp_accounting_epsilon([laplace(0.6)], delta)
    two = dp_accounting_epsilon([laplace(0.6)] * 2, delta)
    assert two > 1.0 >= one
    calls = []
    with open_ledger(ledger_url) as first, open_ledger(ledger_url) as second:
        first.set_budget(TABLE, epsilon=1.0, delta=delta)
        in_write = [0]
        original = first._transaction

        @contextlib.contextmanager
        def tracked(*, write):
            in_write[0] += write
            try:
                with original(write=write) as tx:
                    yield tx
            finally:
                in_write[0] -= write

        monkeypatch.setattr(first, "_transaction", tracked)
        for module in ("sparkpriv.ledger.base", "sparkpriv.ledger.events"):
            target = __import__(module, fromlist=["x"])
            real = getattr(target, "epsilon_of", None)
            if real is None:
                continue

            def spy(event, d, _real=real):
                calls.append(in_write[0])
                if len(calls) == 1 and not in_write[0]:
                    reserve(second, laplace(0.6), mechanism="in-between")
                return _real(event, d)

            monkeypatch.setattr(target, "epsilon_of", spy)
        with pytest.raises(BudgetExceededError, match="1 counted release"):
            reserve(first, laplace(0.6))
        status = second.status(TABLE)
    assert calls and not any(calls), "composed while holding the write lock"
    assert [e["mechanism"] for e in status.entries] == ["in-between"]


@pytest.mark.parametrize("kind", ["gaussian", "mixed"])
def test_long_history_of_distinct_events_composes_to_the_reference(ledger_url, kind):
    """150 distinct Gaussian multipliers (and some Laplace): the spend against closed form and dp_accounting."""
    delta = 1e-6
    rng = np.random.default_rng(7)
    zs = [float(z) for z in rng.uniform(40.0, 80.0, size=150)]
    events = [ev.GaussianDpEvent(z) for z in zs]
    if kind == "mixed":
        events += [ev.LaplaceDpEvent(float(b)) for b in rng.uniform(40.0, 80.0, size=5)]
    reference = dp_accounting_epsilon(events, delta)
    exact = exact_gaussian_epsilon(zs, delta) if kind == "gaussian" else None
    with open_ledger(ledger_url) as ledger:
        ledger.set_budget(TABLE, epsilon=50.0, delta=delta)
        with ledger._transaction(write=True) as tx:  # a history written fast, one entry per event
            for i, e in enumerate(events):
                tx.execute(
                    "INSERT INTO sparkpriv_releases (id, table_id, state, mechanism, parameters, events, epsilon, "
                    "epsilon_delta, output_path, created_at, host, pid) VALUES (?, ?, 'committed', 'm', '{}', ?, "
                    "0.1, ?, '/o', ?, 'h', 1)", (f"e{i:05d}", TABLE, events_to_json(e), delta, f"2024-{i:05d}"))
        res = reserve(ledger, ev.GaussianDpEvent(1e9))  # adds (almost) nothing
        spent = ledger.status(TABLE).spent_epsilon
    assert spent == pytest.approx(res.epsilon_spent_before, rel=1e-9)
    if exact is not None:  # the exact value, never below it
        assert exact <= spent <= exact * (1 + 1e-8) + 1e-12
        assert spent <= reference + 1e-12  # dp_accounting's PLD is an upper bound of the exact value
    else:  # never below dp_accounting's composition by more than its discretization
        assert reference - 2e-3 <= spent <= reference + 1e-9


# ----------------------------------------------------------------------------- no tolerance


def test_budget_comparison_has_no_tolerance(tmp_path):
    """Pure tables are compared with the budget in exact arithmetic. An exact split
    (three releases with multiplier 3) fits a budget of 1 and nothing more does; ten
    releases
    releases with a multiplier just below 3 exceed 1 by 1.5e-16, which a float sum
    rounds away: the third is refused; a release of
    1 + 5e-10 on a budget of 1 is refused (the relative slack of 1e-9 admitted it)."""
    from dp_accounting import dp_event as ev

    from sparkpriv.errors import BudgetExceededError
    from sparkpriv.ledger import open_ledger

    def reserve(led, table, b):
        return led.reserve(table, event=ev.LaplaceDpEvent(b), mechanism="m", parameters={}, output_path="")

    led = open_ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    try:
        led.set_budget("t.exact", epsilon=1.0, delta=0.0)
        for _ in range(3):
            reserve(led, "t.exact", 3.0)
        with pytest.raises(BudgetExceededError):
            reserve(led, "t.exact", 1e12)

        b = math.nextafter(3.0, 0.0)  # just below 3: three releases spend 1 + 1.5e-16,
        assert math.fsum([1 / b] * 3) <= 1.0 and Fraction(3) / Fraction(b) > 1  # which floats round away
        led.set_budget("t.third", epsilon=1.0, delta=0.0)
        for _ in range(2):
            reserve(led, "t.third", b)
        with pytest.raises(BudgetExceededError):
            reserve(led, "t.third", b)

        led.set_budget("t.over", epsilon=1.0, delta=0.0)
        with pytest.raises(BudgetExceededError):
            reserve(led, "t.over", 1 / (1 + 5e-10))
    finally:
        led.close()
