"""The logistic model refined by noisy gradient passes (model="logistic", logistic_steps > 0; docs/math.md
section 6.2) on the local engine and its numpy core.

References: the passes' statistics against numpy written out here, the gradient's and Hessian's
sensitivities against enumeration of neighbour pairs (and records chosen to approach the supremum),
the accounting against dp_accounting's PLD accountant, the large-budget model against scikit-learn's
unpenalised maximum likelihood, the intervals against the coefficients that generated the data.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pytest
from scipy.special import expit

from sparkpriv.api import release_regression
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import regression as reg
from sparkpriv.mechanisms.regression import RegressionParams
from sparkpriv.privacy.random import insecure_fixed_seed

COLS = ["a", "b"]
BASE = dict(columns=COLS, target="y", model="logistic", lower=-1.0, upper=1.0, epsilon=1.0, delta=1e-6)
W, B0 = np.array([1.5, -1.0]), 0.3


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, 2))
    y = (rng.random(n) < expit(X @ W + B0)).astype(float)
    return X, y


def _table(X, y):
    return pa.table({"a": X[:, 0], "b": X[:, 1], "y": y})


def _plan(**kw):
    p = RegressionParams(**dict(BASE, **kw))
    p.validate("test")
    return p, reg.plan_ssp(p, len(p.columns), "test")


# ----------------------------------------------------------------------------- the passes before noise


@pytest.mark.parametrize("hessian", [False, True])
def test_pass_statistics_equal_numpy_for_any_blocking(hessian):
    from sparkpriv.local.engine import LocalEngine

    X, y = _data(1000)
    y[5] = 7.0  # any value but `positive` is the negative class
    _, plan = _plan(lower=[0.0, -1.0], upper=[2.0, 1.0])
    dom = plan.domain
    theta = np.array([0.7, -1.1, 0.2])
    # numpy, written out: box clip, centre (the box's centre, with an intercept), s = +-1
    U = np.clip(X, [0.0, -1.0], [2.0, 1.0]) - np.array([1.0, 0.0])
    Z = np.column_stack([U, np.ones(len(U))])
    s = np.where(y == 1.0, 1.0, -1.0)
    m = Z @ theta
    g = Z.T @ (-s / (1.0 + np.exp(s * m)))
    p = 1.0 / (1.0 + np.exp(-m))
    H = (Z * (p * (1 - p))[:, None]).T @ Z
    ref = np.concatenate([g, H.ravel()]) if hessian else g
    fn = reg.logistic_pass_fn(dom, theta, hessian)
    for rows in (7, 333, 10_000):
        eng = LocalEngine(block_rows=rows)
        src = eng.open(_table(X, y), columns=["a", "b", "y"], fill=None, caller="t", missing=True)
        got = eng.aggregate(src, fn, reg.logistic_pass_size(dom, hessian))
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-9)


# ----------------------------------------------------------------------------- sensitivities


def _records(R, intercept, k=16):
    pts = [np.zeros(2)] + [r * R * np.array([math.cos(a), math.sin(a)])
                           for r in (0.5, 1.0) for a in np.linspace(0, 2 * np.pi, k, endpoint=False)]
    return [np.concatenate([q, [1.0]]) if intercept else q for q in pts]


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("neighbors", ["replace-one", "add-remove"])
def test_gradient_and_hessian_sensitivities_against_enumeration(intercept, neighbors):
    R = 1.3
    _, plan = _plan(row_bound=R, lower=None, upper=None, fit_intercept=intercept, neighbors=neighbors)
    dom = plan.domain
    xs = _records(R, intercept)
    thetas = [np.zeros(dom.dz)] + [np.random.default_rng(i).normal(0, 3, dom.dz) for i in range(6)]

    def grad(x, s, th):
        return -s * expit(-s * (x @ th)) * x

    def hess(x, th):
        p = expit(x @ th)
        return (p * (1 - p) * np.outer(x, x))[np.triu_indices(dom.dz)]

    if neighbors == "add-remove":
        g = max(np.linalg.norm(grad(x, s, th)) for x in xs for s in (-1.0, 0.0, 1.0) for th in thetas)
        h = max(np.linalg.norm(hess(x, th)) for x in xs for th in thetas)
    else:
        g = max(np.linalg.norm(grad(a, s, th) - grad(b, t, th)) for th in thetas
                for a, b in itertools.product(xs, repeat=2) for s, t in itertools.product((-1.0, 0.0, 1.0), repeat=2))
        h = max(np.linalg.norm(hess(a, th) - hess(b, th)) for th in thetas for a, b in itertools.product(xs, repeat=2))
    g_claim, h_claim = reg.gradient_sensitivity(dom, neighbors), reg.hessian_sensitivity(dom, neighbors)
    assert g <= g_claim * (1 + 1e-12) and h <= h_claim * (1 + 1e-12)
    assert h >= 0.7 * h_claim
    if not intercept:  # the Hessian's bound is attained at theta = 0 (w = 1/4) on the axes
        assert h >= h_claim * (1 - 1e-9)
    # the gradient's supremum is approached as |theta| grows: two records on either side of a steep theta
    a_ = 0.02
    v, w = R * np.array([math.cos(a_), math.sin(a_)]), R * np.array([math.cos(a_), -math.sin(a_)])
    th = np.array([0.0, -5000.0])
    if intercept:
        v, w = np.append(v, 1.0), np.append(w, 1.0)  # ||x~||^2 = R^2 + 1 = B_X^2
        th = np.append(th, 0.0)
    far = (np.linalg.norm(grad(v, 1.0, th)) if neighbors == "add-remove"
           else np.linalg.norm(grad(v, 1.0, th) - grad(w, -1.0, th)))
    assert 0.99 * g_claim <= far <= g_claim * (1 + 1e-12)


# ----------------------------------------------------------------------------- accounting and noise


def _pld_epsilon(events, delta):
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4)
    acc.compose(dp_accounting.ComposedDpEvent(list(events)))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("kw", [{}, {"neighbors": "add-remove"}, {"logistic_steps": 1}, {"logistic_steps": 20},
                                {"budget_split": (0.2, 0.2, 0.2, 0.2, 0.2)}, {"epsilon": 4.0, "delta": 1e-9}])
def test_accounting_against_dp_accounting(kw):
    from dp_accounting import dp_event as ev

    from sparkpriv.privacy.calibration import gdp_mu_for

    p, plan = _plan(**kw)
    events = plan.events()
    k = p.logistic_steps
    assert len(events) == 3 + k + 1 and all(isinstance(e, ev.GaussianDpEvent) for e in events)
    assert _pld_epsilon(events, p.delta) <= p.epsilon * (1 + 1e-9)
    mu2 = np.array([1.0 / e.noise_multiplier**2 for e in events])
    assert math.sqrt(mu2.sum()) <= gdp_mu_for(p.epsilon, p.delta) * (1 + 1e-12)
    split = np.asarray(p.budget_split or reg._params.DEFAULT_LOGISTIC_SPLIT)
    got = np.concatenate([mu2[:3], [mu2[3:3 + k].sum(), mu2[-1]]])
    np.testing.assert_allclose(got / got.sum(), split / split.sum(), rtol=1e-9)
    np.testing.assert_allclose(mu2[3:3 + k], mu2[3], rtol=1e-12)  # every gradient pass the same share
    ng, nh = plan.step_noises()
    assert ng.dp_event().noise_multiplier >= events[3].noise_multiplier
    assert nh.dp_event().noise_multiplier >= events[-1].noise_multiplier
    assert ng.sensitivity == pytest.approx(reg.gradient_sensitivity(plan.domain, p.neighbors))


def test_pass_noise_has_the_stated_scale():
    X, y = _data(2000)
    _, plan = _plan()
    dom = plan.domain
    theta = np.array([0.5, -0.5, 0.1])
    total = reg.logistic_pass_fn(dom, theta, True)(np.column_stack([X, y]))
    dz = dom.dz
    ge, he = [], []
    for s in range(300):
        g, H, clamped = reg.finalize_logistic_pass(total, plan, dom, 500 + s, 0, True)
        assert clamped == 0 and np.array_equal(H, H.T)
        ge.append(g - total[:dz])
        he.append((H - total[dz:].reshape(dz, dz))[np.triu_indices(dz)])
    ng, nh = plan.step_noises()
    for err, nz in ((ge, ng), (he, nh)):
        e = np.asarray(err).ravel()
        assert abs(e.mean()) < 4 * nz.std / math.sqrt(e.size)
        assert e.std() == pytest.approx(nz.std, rel=4 / math.sqrt(2 * e.size))
    # a different pass draws different noise; the same pass the same
    a = reg.finalize_logistic_pass(total, plan, dom, 9, 0, False)[0]
    assert np.array_equal(a, reg.finalize_logistic_pass(total, plan, dom, 9, 0, False)[0])
    assert not np.array_equal(a, reg.finalize_logistic_pass(total, plan, dom, 9, 1, False)[0])


# ----------------------------------------------------------------------------- fits and intervals


def test_large_budget_gives_the_maximum_likelihood():
    from sklearn.linear_model import LogisticRegression

    X, y = _data(20000, seed=3)
    mle = LogisticRegression(C=1e8, tol=1e-10, max_iter=1000).fit(X, y)
    with insecure_fixed_seed(2):
        rel = release_regression(_table(X, y), **dict(BASE, epsilon=1e4))
    np.testing.assert_allclose(rel.model.coef, mle.coef_[0], atol=5e-3)
    assert rel.model.intercept == pytest.approx(mle.intercept_[0], abs=5e-3)
    assert np.all(rel.model.ci_low <= mle.coef_[0]) and np.all(mle.coef_[0] <= rel.model.ci_high)
    # the one-pass approximation is not the maximum likelihood: the passes are what moves it there
    with insecure_fixed_seed(2):
        one = release_regression(_table(X, y), **dict(BASE, epsilon=1e4, logistic_steps=0))
    assert np.abs(one.model.coef - mle.coef_[0]).max() > 0.1


def test_intervals_cover_the_generating_coefficients():
    """95% intervals of 200 releases (fresh data and noise each; n = 3000, epsilon 1) cover the
    coefficients of the logistic model that generated the data in 91-99% of cases."""
    rng = np.random.default_rng(11)
    reps, hits = 200, np.zeros(3)
    for r in range(reps):
        X = rng.uniform(-1, 1, (3000, 2))
        y = (rng.random(3000) < expit(X @ W + B0)).astype(float)
        with insecure_fixed_seed(100 + r):
            f = release_regression(_table(X, y), **dict(BASE, bootstrap=300)).model
        hits[:2] += (f.ci_low <= W) & (W <= f.ci_high)
        hits[2] += f.intercept_ci[0] <= B0 <= f.intercept_ci[1]
    cover = hits / reps
    assert np.all((0.91 <= cover) & (cover <= 0.99)), cover


def test_refit_from_the_model_file_is_the_model():
    X, y = _data(3000)
    rel = release_regression(_table(X, y), **BASE)
    doc = json.loads(rel.files[reg.MODEL_FILE])
    assert len(doc["logistic_steps"]["gradients"]) == 5
    f = reg.refit_model_file(doc)
    np.testing.assert_array_equal(f.coef, rel.model.coef)
    np.testing.assert_array_equal(f.ci_low, rel.model.ci_low)
    assert f.intercept == rel.model.intercept == doc["intercept"]
    # the same path as the release's passes took (each pass at the coefficients the earlier ones gave)
    st = reg.SSPStatistics.from_public_dict(doc["statistics"])
    steps = reg.LogisticSteps.from_public_dict(doc["logistic_steps"])
    path = reg.logistic_path(st, steps)
    np.testing.assert_array_equal(path[-1], rel.model.theta)
    r = rel.receipt()
    text = json.dumps(r)
    assert "logistic_steps" in text and "hessian" in text
    # a linear release refits the same way
    lin = release_regression(_table(X, X @ W), columns=COLS, target="y", lower=-1.0, upper=1.0, target_lower=-3.0,
                             target_upper=3.0, epsilon=1.0, delta=1e-6)
    np.testing.assert_array_equal(reg.refit_model_file(json.loads(lin.files[reg.MODEL_FILE])).coef, lin.model.coef)


def test_passes_read_each_value_through_the_public_fill():
    """A missing class (null) adds nothing to a gradient (s = 0); a missing feature takes the box's
    centre in every pass: the release equals the one with those values in place."""
    X, y = _data(1500)
    Xn = X.copy()
    Xn[3, 0] = np.nan
    Xr = X.copy()
    Xr[3, 0] = 0.0
    yn = pa.array(y, mask=np.arange(1500) == 4)
    with insecure_fixed_seed(4):
        a = release_regression(pa.table({"a": Xn[:, 0], "b": Xn[:, 1], "y": yn}), **BASE)
    assert a.diagnostics()["missing_values_replaced"] == 2
    # the reference: the feature's centre in place, and the class missing in a numpy array (NaN)
    with insecure_fixed_seed(4):
        b = release_regression(np.column_stack([Xr, np.where(np.arange(1500) == 4, np.nan, y)]), **BASE)
    np.testing.assert_array_equal(a.model.coef, b.model.coef)
    # s = 0 adds nothing to a gradient: the pass over the table without that record's class is the pass
    # over the table without the record, plus its x~ x~^T in the Hessian
    dom = a.extras["statistics"].domain
    theta = np.array([0.4, -0.2, 0.1])
    M = np.column_stack([Xr, np.where(np.arange(1500) == 4, np.nan, y)])
    full = reg.logistic_pass_fn(dom, theta, False)(M)
    drop = reg.logistic_pass_fn(dom, theta, False)(np.delete(M, 4, axis=0))
    np.testing.assert_allclose(full, drop, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kw,name", [
    ({"logistic_steps": 51}, "logistic_steps"),
    ({"logistic_steps": -1}, "logistic_steps"),
    ({"logistic_steps": 2.5}, "logistic_steps"),
    ({"budget_split": (0.5, 0.5, 0.0)}, "budget_split"),
    ({"budget_split": (0.3, 0.3, 0.3)}, "budget_split"),
    ({"budget_split": (0.2, 0.2, 0.2, 0.2, 0.3)}, "budget_split"),
    ({"logistic_steps": 0, "budget_split": (0.2, 0.2, 0.2, 0.2, 0.2)}, "budget_split"),
    ({"logistic_steps": 50, "budget_split": (0.2, 0.2, 0.2, 0.04, 0.2)}, "budget_split"),
    ({"model": "linear", "logistic_steps": 3, "target_lower": 0.0, "target_upper": 1.0}, "logistic_steps"),
])
def test_refusals_name_the_parameter(kw, name):
    with pytest.raises(ParameterError, match=name):
        release_regression(pa.table({"a": ["x"], "b": ["x"], "y": ["x"]}), **dict(BASE, **kw))


def test_estimator_and_its_steps():
    from sklearn.base import clone

    from sparkpriv.estimators import DPLogisticRegression

    X, y = _data(20000, seed=5)
    est = DPLogisticRegression(epsilon=1.0, delta=1e-6, lower=-1, upper=1, logistic_steps=3)
    assert clone(est).get_params()["logistic_steps"] == 3
    with insecure_fixed_seed(1):
        est.fit(X, y)
    assert est.release_.public["model"]["logistic_fit"].startswith("the one-pass approximation refined by 3")
    assert np.all(est.ci_low_ <= W) and np.all(W <= est.ci_high_)
