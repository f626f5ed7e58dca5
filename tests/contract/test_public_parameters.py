"""Public parameters that would overflow, and releases without bounds, are refused before anything
is reserved or read, on every registered mechanism and estimator (docs/privacy.md, "Failures").

Each case takes the contract suite's valid parameters (tests/contract/test_contract.py) and
changes one public number. The ledger must hold no entry afterwards and no value of the input
may have been read (the local engine's blocks raise if asked for one).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.api import release
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.protocol import get_mechanism
from tests.contract.test_contract import CASES, _local_colparams

# the declared bounds, fills and scales of the data (or of a gradient); shares, rates and counts
# have their own ranges
MAGNITUDES = ("row_bound", "lower", "upper", "element_bound", "clip", "kernel_width", "fill", "label_scale",
              "learning_rate", "target_lower", "target_upper", "positive")


def _no_reads(monkeypatch):
    from sparkpriv.local.engine import LocalSource

    def refuse(self, *a, **k):
        raise AssertionError("a value of the input was read")
        yield  # pragma: no cover

    monkeypatch.setattr(LocalSource, "blocks", refuse)


def _ledger(tmp_path):
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=1e5, delta=1e-3)
    return url


def _entries(url):
    from sparkpriv.ledger import open_ledger

    with open_ledger(url) as led:
        return led.status("t").entries


def _changes(name):
    fields = {s.name for s in get_mechanism(name).specs()}
    out = [("epsilon", 1e-300), ("epsilon", 1e300), ("epsilon", float("nan"))]
    if "delta" in fields:
        out += [("delta", 1e-300), ("delta", 1e-20)]
    for f in MAGNITUDES:
        if f in fields:
            out += [(f, 1e300), (f, -1e300), (f, float("inf"))]
            if f in ("lower", "upper"):
                out.append((f, (0.0, 1e300, 0.0)))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_numbers_out_of_range_are_refused_naming_the_parameter_before_the_reservation(name, tmp_path,
                                                                                     monkeypatch):
    case = CASES[name]
    X = case.data()
    url = _ledger(tmp_path)
    _no_reads(monkeypatch)
    changes = _changes(name)
    assert len(changes) >= 5
    for field, value in changes:
        params = dict(case.params, **{field: value})
        with pytest.raises(ParameterError, match=f"'{field}'"):
            release(name, X, ledger=url, table_id="t", **_local_colparams(case, X), **params)
    assert _entries(url) == []


EDGES = [("row_bound", 1e15), ("row_bound", 1e-3), ("clip", 1e15), ("clip", 1e-12), ("kernel_width", 1e15),
         ("epsilon", 1e-4), ("epsilon", 1e6), ("delta", 1e-12), ("fill", 1e15)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_numbers_at_the_edges_of_the_range_release_or_are_refused_cleanly(name):
    """Inside the range no raw error (OverflowError, ZeroDivisionError, ...) escapes: the release is made,
    or refused with a ParameterError before anything is read."""
    case = CASES[name]
    X = case.data()
    fields = {s.name for s in get_mechanism(name).specs()}
    tried = 0
    for field, value in EDGES:
        if field not in fields:
            continue
        tried += 1
        try:
            rel = release(name, X, **_local_colparams(case, X), **dict(case.params, **{field: value}))
        except ParameterError:
            continue
        assert np.isfinite(rel.epsilon) and rel.epsilon <= dict(case.params, **{field: value})["epsilon"] * (1 + 1e-9)
    assert tried >= 2


# -------------------------------------------------------------------------------- no default bound

# the public parameters that bound the data of each mechanism (one of them must be declared); DPGM's
# records are values in [0, 1] by its definition (binary items or shares), a declared domain
BOUNDS = {
    "projection": ("row_bound", "lower", "upper", "element_bound", "row_bound_quantile"),
    "kmeans": ("row_bound", "lower", "upper"),
    "dprp": ("lower", "upper"),
    "regression": ("row_bound", "lower", "upper", "target_lower", "target_upper"),
}


def test_every_mechanism_states_its_bounds_or_why_it_has_none():
    assert sorted(BOUNDS) == sorted(set(CASES) - {"dpgm"})


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_a_release_without_bounds_is_refused_naming_the_bound(name, tmp_path, monkeypatch):
    case = CASES[name]
    X = case.data()
    url = _ledger(tmp_path)
    _no_reads(monkeypatch)
    params = {k: v for k, v in case.params.items() if k not in BOUNDS[name]}
    with pytest.raises(ParameterError, match="bound") as e:
        release(name, X, ledger=url, table_id="t", **_local_colparams(case, X), **params)
    assert any(b in str(e.value) for b in BOUNDS[name])
    assert _entries(url) == []


def test_estimators_have_no_default_bound(monkeypatch):
    from sparkpriv.estimators import DPKMeans, DPLinearRegression, DPLogisticRegression

    X = np.random.default_rng(0).uniform(-1, 1, (200, 3))
    _no_reads(monkeypatch)
    with pytest.raises(ParameterError, match="row_bound"):
        DPLinearRegression(epsilon=1.0, delta=1e-6).fit(X[:, :2], X[:, 2])
    with pytest.raises(ParameterError, match="target_lower"):
        DPLinearRegression(epsilon=1.0, delta=1e-6, row_bound=2.0).fit(X[:, :2], X[:, 2])
    with pytest.raises(ParameterError, match="row_bound"):
        DPLogisticRegression(epsilon=1.0, delta=1e-6).fit(X[:, :2], X[:, 2] > 0)
    with pytest.raises(ParameterError, match="bound"):
        DPKMeans(n_clusters=2, epsilon=1.0, delta=1e-5, variant="linear").fit(X)
