"""No single record value decides whether a release succeeds or what it costs (docs/privacy.md,
"Failures").

For every registered mechanism: a clean table D, and tables D' that differ from it in ONE value
of one record (NaN, +-inf, a null, +-1e308; for event tables a malformed key, a key outside the
domain, a null key or person). Under replace-one these are neighbours, so if one of them failed
while D succeeded (or cost a different epsilon) the outcome alone would tell D from D' with
certainty, for free. The test runs each release with a budget ledger and asserts the same
outcome (success, and the same recorded epsilon) for D and every D'.

Positive control: the rule this replaced (a non-finite value raised an InputError, naming the
column) is put back for one run, and the same check must then see the outcome change: the test
can fail.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sparkpriv.api import release
from sparkpriv.errors import InputError
from tests.contract.test_contract import CASES, _colparams

pytestmark = pytest.mark.audit

BAD_VALUES = [float("nan"), float("inf"), -float("inf"), None, 1e308, -1e308]


def _table(X, row=None, col=0, value=0.0):
    cols = {f"c{j}": pa.array(X[:, j].tolist(), pa.float64()) for j in range(X.shape[1])}
    if row is not None:
        vals = X[:, col].tolist()
        vals[row] = value
        cols[f"c{col}"] = pa.array(vals, pa.float64())
    return pa.table(cols)


def _outcome(name, data, tmp_path, tag, colparams, params):
    """(succeeded, the epsilon the ledger recorded) of one release of ``data``."""
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path}/{tag}.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=1e4, delta=1e-3)
    try:
        rel = release(name, data, ledger=url, table_id="t", **colparams, **params)
        if hasattr(rel.df, "count"):  # a lazy Spark table: the row pass runs here
            rel.df.count()
        ok = True
    except InputError:
        ok = False
    with open_ledger(url) as led:
        entries = led.status("t").entries
    return ok, [round(e["epsilon"], 12) for e in entries]


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_value_changes_neither_success_nor_spend_local(name, tmp_path):
    case = CASES[name]
    X = case.data()
    cols = (1, X.shape[1] - 1) if name == "regression" else (0,)  # regression: a feature and the target
    base = _outcome(name, _table(X), tmp_path, "clean", _colparams(case, X), case.params)
    assert base[0] and len(base[1]) == 1
    for col in cols:
        for i, v in enumerate(BAD_VALUES):
            got = _outcome(name, _table(X, row=7, col=col, value=v), tmp_path, f"bad{col}-{i}",
                           _colparams(case, X), case.params)
            assert got == base, f"{name}: one record holding {v!r} changed the outcome: {got} against {base}"


def test_positive_control_the_old_rule_is_detected(tmp_path, monkeypatch):
    """With the old rule (a non-finite value is an InputError, after the reservation) the check sees
    the outcome change: the test above has power."""
    import sparkpriv.local.engine as local

    def old_rule(X, bad, fill):
        if bad.any():
            raise InputError("column 'c0' has NaN or infinite values")
        return X

    case = CASES["kmeans"]
    X = case.data()
    base = _outcome("kmeans", _table(X), tmp_path, "clean", _colparams(case, X), case.params)
    monkeypatch.setattr(local, "_filled", old_rule)
    got = _outcome("kmeans", _table(X, row=7, value=float("nan")), tmp_path, "bad", _colparams(case, X),
                   case.params)
    assert got != base
    assert got[0] is False and got[1] == base[1]  # failed, and (the new release path) charged all the same


@pytest.mark.spark
@pytest.mark.parametrize("name", ["projection", "kmeans", "regression"])
def test_one_value_changes_neither_success_nor_spend_spark(name, spark, tmp_path):
    case = CASES[name]
    X = case.data()[:300]
    col = X.shape[1] - 1 if name == "regression" else 0  # regression: the target

    def frame(t):
        return spark.createDataFrame(t.to_pandas()).repartition(2)

    base = _outcome(name, frame(_table(X)), tmp_path, "clean", _colparams(case, X), case.params)
    assert base[0]
    for i, v in enumerate([float("nan"), float("inf"), None, 1e308]):
        got = _outcome(name, frame(_table(X, row=7, col=col, value=v)), tmp_path, f"bad{i}", _colparams(case, X),
                       case.params)
        assert got == base, f"{name} on Spark: one record holding {v!r} changed the outcome"


@pytest.mark.spark
def test_one_key_changes_neither_success_nor_spend_counts(spark, tmp_path):
    """Counts over a STRING key column with an integer domain: a malformed key ('x', formerly Spark's
    raw NumberFormatException after the reservation), a key outside the domain, a null key and a null
    person are all dropped or grouped like any other: the same success and spend."""
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.counts import bound_keys

    rng = np.random.default_rng(5)
    rows = [(int(p), str(int(t))) for p in range(200) for t in rng.choice(6, rng.integers(1, 4), replace=False)]
    dom = KeyDomain.product("tower", range(0, 6))

    def outcome(rows, tag):
        df = spark.createDataFrame(rows, "caller long, tower string").repartition(2)
        rec = bound_keys(df, person="caller", domain=dom, max_keys=2)
        ok, eps = _outcome("counts", rec, tmp_path, tag, {}, dict(epsilon=1.0, domain=dom))
        return ok, eps

    base = outcome(rows, "clean")
    assert base[0]
    for i, (person, key) in enumerate([(3, "x"), (3, "999"), (3, None), (None, "2"), (3, "1.5")]):
        bad = list(rows)
        bad[0] = (person, key)
        assert outcome(bad, f"bad{i}") == base, f"one event ({person!r}, {key!r}) changed the outcome"
