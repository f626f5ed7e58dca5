"""AdaSSP regression (method="ssp", docs/math.md section 6.1) on the local engine and its numpy core.

References are independent of the code under test: the statistics against numpy written out here
(clipping, centring, cross-products), the sensitivities against enumeration of neighbour pairs on
small domains, the accounting against dp_accounting's PLD accountant built here, the intervals
against the coefficients that generated the data.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pytest

from sparkpriv.api import release_regression
from sparkpriv.errors import ParameterError, SparkPrivError
from sparkpriv.local.engine import LocalEngine
from sparkpriv.mechanisms import regression as reg
from sparkpriv.mechanisms.regression import RegressionParams
from sparkpriv.privacy.random import insecure_fixed_seed

COLS = ["a", "b", "c"]
BASE = dict(columns=COLS, target="y", lower=-1.0, upper=1.0, target_lower=-3.0, target_upper=3.0, epsilon=1.0,
            delta=1e-6)


def _table(X, y):
    return pa.table({**{c: X[:, j] for j, c in enumerate(COLS[:X.shape[1]])}, "y": y})


def _data(n=3000, seed=0, noise=0.2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, 3))
    y = X @ np.array([0.8, -0.5, 0.25]) + 0.4 + noise * rng.standard_normal(n)
    return X, y


def _domain(**kw):
    p = RegressionParams(**dict(BASE, **kw))
    p.validate("test")
    return reg.ssp_domain(p, len(p.columns), "test")


def _reference_statistics(X, y, *, lower=None, upper=None, row_bound=None, centre=None, t_range=(-3.0, 3.0),
                          intercept=True, logistic=False, positive=1.0):
    """numpy, written out: box clip, then the L2 ball, centre, cross-products of [u, 1, y~] and n."""
    X = np.array(X, dtype=float)
    if lower is not None:
        X = np.minimum(np.maximum(X, lower), upper)
    if row_bound is not None:
        norms = np.sqrt((X * X).sum(axis=1))
        X = X * np.minimum(1.0, row_bound / np.maximum(norms, 1e-300))[:, None]
    U = X - (0.0 if centre is None else np.asarray(centre))
    if logistic:
        t = np.where(y == positive, 1.0, -1.0)
    else:
        lo, hi = t_range
        t = np.clip(y, lo, hi) - (0.5 * (lo + hi) if intercept else 0.0)
    Z = np.column_stack([U] + ([np.ones(len(U))] if intercept else []) + [t])
    return np.concatenate([(Z.T @ Z).ravel(), [len(U)]])


# ----------------------------------------------------------------------------- statistics before noise


@pytest.mark.parametrize("block_rows", [7, 250, 1_000_000])
def test_statistics_equal_the_numpy_reference_for_any_blocking(block_rows):
    X, y = _data(1000)
    X[5] *= 3.0  # clipped by the box
    y[7] = 10.0  # clipped by the target range
    eng = LocalEngine(block_rows=block_rows)
    for kw, ref_kw in (
        ({}, dict(lower=-1.0, upper=1.0, centre=np.zeros(3))),
        ({"row_bound": 1.2, "lower": None, "upper": None}, dict(row_bound=1.2)),
        ({"lower": [0.0, -1.0, -1.0], "upper": [2.0, 1.0, 1.0]},
         dict(lower=np.array([0.0, -1, -1]), upper=np.array([2.0, 1, 1]), centre=np.array([1.0, 0, 0]))),
        ({"fit_intercept": False}, dict(lower=-1.0, upper=1.0, intercept=False)),
    ):
        dom = _domain(**kw)
        src = eng.open(_table(X, y), columns=COLS + ["y"], fill=None, caller="t", missing=True)
        got = eng.aggregate(src, reg.statistics_fn(dom), reg.stats_size(dom))
        np.testing.assert_allclose(got, _reference_statistics(X, y, **ref_kw), rtol=1e-12, atol=1e-9)


def test_logistic_statistics_use_plus_minus_one():
    X, _ = _data(500)
    y = (X[:, 0] > 0).astype(float) * 2.0 + 1.0  # classes 1 and 3
    dom = _domain(model="logistic", positive=3.0, target_lower=None, target_upper=None)
    got = reg.statistics_fn(dom)(np.column_stack([X, y]))
    np.testing.assert_allclose(got, _reference_statistics(X, y, lower=-1, upper=1, logistic=True, positive=3.0),
                               rtol=1e-12)


def test_missing_values_are_replaced_by_the_public_centre_and_counted():
    X, y = _data(200)
    M = np.column_stack([X, y])
    M[3, 1] = np.nan
    M[4, 3] = np.inf
    M[5, 0] = -np.inf
    dom = _domain(lower=[0.0, -1.0, -1.0], upper=[2.0, 1.0, 1.0])
    counters = [type("C", (), {"value": 0, "add": lambda self, v: setattr(self, "value", self.value + v)})()
                for _ in reg.COUNTERS]
    got = reg.statistics_fn(dom, counters)(M)
    R = np.column_stack([X, y])
    R[3, 1] = 0.0  # the box's centre of feature b
    R[4, 3] = 0.0  # the target range's centre
    R[5, 0] = 1.0  # the box's centre of feature a
    ref = _reference_statistics(R[:, :3], R[:, 3], lower=np.array([0.0, -1, -1]), upper=np.array([2.0, 1, 1]),
                                centre=np.array([1.0, 0, 0]))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-9)
    counts = dict(zip(reg.COUNTERS, (c.value for c in counters)))
    assert counts["values_replaced"] == 3 and counts["rows_with_replaced_values"] == 3 and counts["rows"] == 200
    # a declared fill replaces them instead
    dom = _domain(fill=0.5)
    got = reg.statistics_fn(dom)(M)
    R[3, 1] = R[4, 3] = R[5, 0] = 0.5
    np.testing.assert_allclose(got, _reference_statistics(R[:, :3], R[:, 3], lower=-1, upper=1), rtol=1e-12)


# ----------------------------------------------------------------------------- sensitivities


def _triu(D):
    return D[np.triu_indices(D.shape[0])]


def _ball_points(R, d=2, rings=(0.0, 0.5, 1.0), k=48):
    pts = [np.zeros(d)]
    for r in rings[1:]:
        for a in np.linspace(0, 2 * np.pi, k, endpoint=False):
            pts.append(r * R * np.array([math.cos(a), math.sin(a)]))
    return np.array(pts)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("neighbors", ["replace-one", "add-remove"])
def test_gram_and_moment_sensitivities_against_enumeration(intercept, neighbors):
    R = 1.5
    dom = _domain(row_bound=R, lower=None, upper=None, fit_intercept=intercept, target_lower=-2.0,
                  target_upper=2.0 if intercept else 2.0)
    pts = _ball_points(R, k=24)
    xs = [np.concatenate([p, [1.0]]) if intercept else p for p in pts]
    ys = np.linspace(-dom.by, dom.by, 5)
    w_yy, w_n = reg.moment_weights(dom)

    def gram(x):
        return _triu(np.outer(x, x))

    def mom(x, t):
        return np.concatenate([x * t, [w_yy * t * t, w_n]])

    if neighbors == "add-remove":
        g = max(np.linalg.norm(gram(x)) for x in xs)
        m = max(np.linalg.norm(mom(x, t)) for x in xs for t in ys)
    else:
        g = max(np.linalg.norm(gram(a) - gram(b)) for a, b in itertools.product(xs, repeat=2))
        m = max(np.linalg.norm(mom(a, s) - mom(b, t)) for a, b in itertools.product(xs, repeat=2)
                for s, t in itertools.product(ys, repeat=2))
    g_claim, m_claim = reg.gram_sensitivity(dom, neighbors), reg.moment_sensitivity(dom, neighbors)
    assert g <= g_claim * (1 + 1e-12) and m <= m_claim * (1 + 1e-12)
    if not intercept:  # exact there: the grid holds the worst pairs (on the axes)
        assert g >= g_claim * (1 - 1e-9)
    assert g >= 0.85 * g_claim
    # moments: exact under add-remove, within sqrt(4 / 4.25) under replace-one (y^T y's share)
    assert m >= m_claim * (1 - 1e-9 if neighbors == "add-remove" else math.sqrt(4 / 4.25) * (1 - 1e-9))


def test_box_sensitivity_uses_the_centred_box():
    dom = _domain(lower=[0.0, 0.0], upper=[1.0, 2.0], columns=["a", "b"])
    assert dom.centre == (0.5, 1.0) and dom.radius_sq == pytest.approx(0.25 + 1.0)
    corners = [np.array([a, b]) - np.array(dom.centre) for a in (0.0, 0.5, 1.0) for b in (0.0, 1.0, 2.0)]
    xs = [np.concatenate([u, [1.0]]) for u in corners]
    worst = max(np.linalg.norm(_triu(np.outer(a, a) - np.outer(b, b))) for a, b in itertools.product(xs, repeat=2))
    assert worst <= reg.gram_sensitivity(dom, "replace-one")
    # without an intercept nothing is centred: the bound is the uncentred box's
    dom = _domain(lower=[0.0, 0.0], upper=[1.0, 2.0], columns=["a", "b"], fit_intercept=False)
    assert dom.centre == (0.0, 0.0) and dom.radius_sq == pytest.approx(1.0 + 4.0)
    # a ball and a box: the smaller bound (centring would not shrink it here)
    dom = _domain(lower=0.0, upper=1.0, row_bound=0.5)
    assert dom.centre == (0.0, 0.0, 0.0) and dom.radius_sq == pytest.approx(0.25)


def test_smallest_eigenvalue_moves_by_at_most_the_bound():
    """Replace-one and add-remove, enumerated over a grid of records with random other rows."""
    rng = np.random.default_rng(3)
    R = 1.2
    for intercept in (False, True):
        dom = _domain(row_bound=R, lower=None, upper=None, fit_intercept=intercept, columns=["a", "b"])
        claim = reg.eigen_sensitivity(dom)
        xs = [np.concatenate([p, [1.0]]) if intercept else p for p in _ball_points(R, k=16)]
        worst = 0.0
        for _ in range(5):
            rest = rng.uniform(-0.5, 0.5, (6, 2))
            rest = np.column_stack([rest, np.ones(6)]) if intercept else rest
            G = rest.T @ rest
            base = np.linalg.eigvalsh(G)[0]
            lam = [np.linalg.eigvalsh(G + np.outer(x, x))[0] for x in xs]
            worst = max(worst, max(abs(a - b) for a, b in itertools.product(lam, repeat=2)),
                        max(abs(a - base) for a in lam))
        assert worst <= claim * (1 + 1e-12)
    # attained in one dimension without an intercept: lambda_min = sum x^2
    dom = _domain(row_bound=R, lower=None, upper=None, fit_intercept=False, columns=["a"])
    assert reg.eigen_sensitivity(dom) == pytest.approx(R * R)


# ----------------------------------------------------------------------------- accounting and noise


def _pld_epsilon(events, delta):
    """dp_accounting's PLD accountant, built here (add-or-remove mode: every event is normalised to
    the sensitivity of its relation)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4)
    acc.compose(dp_accounting.ComposedDpEvent(list(events)))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("kw", [{}, {"neighbors": "add-remove"}, {"budget_split": (0.1, 0.5, 0.4)},
                                {"target_quantile": 0.98, "target_lower": None, "target_upper": None},
                                {"epsilon": 4.0, "delta": 1e-9}])
def test_accounting_against_dp_accounting(kw):
    from dp_accounting import dp_event as ev

    from sparkpriv.privacy.calibration import gdp_mu_for

    p = RegressionParams(**dict(BASE, **kw))
    p.validate("test")
    plan = reg.plan_ssp(p, 3, "test")
    events = plan.events()
    assert _pld_epsilon(events, p.delta) <= p.epsilon * (1 + 1e-9)
    gauss = [e for e in events if isinstance(e, ev.GaussianDpEvent)]
    assert len(gauss) == 3
    mu2 = sum(1.0 / e.noise_multiplier**2 for e in gauss)
    eps_g = p.epsilon * (1 - p.target_epsilon_share) if p.target_quantile else p.epsilon
    assert math.sqrt(mu2) <= gdp_mu_for(eps_g, p.delta) * (1 + 1e-12)
    # the shares as declared (mu_i^2 proportional to them)
    w = np.array([1.0 / e.noise_multiplier**2 for e in gauss])
    np.testing.assert_allclose(w / w.sum(), np.asarray(p.split) / sum(p.split), rtol=1e-9)
    if p.target_quantile:
        lap = [e for e in events if isinstance(e, ev.LaplaceDpEvent)]
        assert len(lap) == 1 and 1.0 / lap[0].noise_multiplier <= p.epsilon * p.target_epsilon_share
    else:
        # the noise drawn is at least the recorded noise (grid and samplers' slack included)
        for nz, e in zip(plan.noises(), gauss):
            assert nz.dp_event().noise_multiplier >= e.noise_multiplier


def test_noise_has_the_stated_scale_and_n_is_exact_under_replace_one():
    X, y = _data(2000)
    p = RegressionParams(**BASE)
    p.validate("test")
    plan = reg.plan_ssp(p, 3, "test")
    dom = plan.domain
    total = reg.statistics_fn(dom)(np.column_stack([X, y]))
    k = dom.dz + 1
    C = total[:-1].reshape(k, k)
    gram_err, xy_err, yy_err = [], [], []
    for s in range(200):
        st, clamped = reg.finalize_ssp(total, plan, dom, 1000 + s, ("a", "b", "c", "_intercept"))
        assert clamped == 0 and st.n == 2000
        gram_err.append(_triu(st.gram - C[:4, :4]))
        xy_err.append(st.xy - C[:4, 4])
        yy_err.append(st.yy - C[4, 4])
    for err, var in ((gram_err, st.var_gram), (xy_err, st.var_xy), (yy_err, st.var_yy)):
        e = np.asarray(err).ravel()
        assert abs(e.mean()) < 4 * math.sqrt(var / e.size)
        assert e.std() == pytest.approx(math.sqrt(var), rel=4 / math.sqrt(2 * e.size))
    nz = plan.noises()
    assert st.var_gram == pytest.approx(nz[1].variance) and st.var_xy == pytest.approx(nz[2].variance)
    assert nz[1].sensitivity == pytest.approx(math.sqrt((dom.radius_sq + 1) ** 2 + dom.radius_sq**2))


# ----------------------------------------------------------------------------- fits and intervals


def test_intervals_cover_the_generating_coefficients():
    """95% intervals of 300 releases (fresh data and noise each) cover the coefficients that generated
    the data in 92-98% of cases, for each coefficient and the intercept (numpy path of the release)."""
    rng = np.random.default_rng(11)
    w, b0, n = np.array([0.8, -0.5]), 0.3, 2000
    p = RegressionParams(**dict(BASE, columns=["a", "b"], target_lower=-4.0, target_upper=4.0))
    p.validate("test")
    plan = reg.plan_ssp(p, 2, "test")
    dom = plan.domain
    stats_fn = reg.statistics_fn(dom)
    reps, hits = 300, np.zeros(3)
    for r in range(reps):
        X = rng.uniform(-1, 1, (n, 2))
        y = X @ w + b0 + 0.3 * rng.standard_normal(n)
        st, _ = reg.finalize_ssp(stats_fn(np.column_stack([X, y])), plan, dom, 77 + r, ("a", "b", "_intercept"))
        f = reg.fit_from_statistics(st, confidence=0.95, bootstrap=400)
        hits[:2] += (f.ci_low <= w) & (w <= f.ci_high)
        hits[2] += f.intercept_ci[0] <= b0 <= f.intercept_ci[1]
    cover = hits / reps
    assert np.all((0.92 <= cover) & (cover <= 0.98)), cover


def test_large_budget_gives_least_squares_and_logistic_direction():
    X, y = _data(20000, noise=0.05)
    with insecure_fixed_seed(3):
        rel = release_regression(_table(X, y), **dict(BASE, epsilon=1e4))
    ls = np.linalg.lstsq(np.column_stack([X, np.ones(len(X))]), y, rcond=None)[0]
    np.testing.assert_allclose(rel.model.coef, ls[:3], atol=2e-3)
    assert rel.model.intercept == pytest.approx(ls[3], abs=2e-3)
    assert np.all(rel.model.ci_low <= ls[:3]) and np.all(ls[:3] <= rel.model.ci_high)
    # logistic, the one-pass approximation (logistic_steps=0): labels from a logistic model; the
    # direction of the coefficients, and kappa (the refined model: tests/mechanisms/test_regression_logistic.py)
    rng = np.random.default_rng(5)
    w = np.array([2.0, -1.0, 0.5])
    lab = (rng.random(len(X)) < 1 / (1 + np.exp(-(X @ w)))).astype(float)
    rel = release_regression(_table(X, lab), columns=COLS, target="y", lower=-1.0, upper=1.0, model="logistic",
                             epsilon=1e4, delta=1e-6, logistic_steps=0)
    c = rel.model.coef
    assert c @ w / (np.linalg.norm(c) * np.linalg.norm(w)) > 0.99
    assert reg.logistic_kappa(1e-3) == pytest.approx(2.0, rel=1e-5)  # Taylor's limit: -(-1/2) / (2 / 8)
    np.testing.assert_allclose(c, reg.logistic_kappa() * rel.model.theta[:3], rtol=1e-12)


def test_refit_from_the_model_file_is_the_model():
    X, y = _data()
    rel = release_regression(_table(X, y), **BASE)
    doc = json.loads(rel.files[reg.MODEL_FILE])
    st = reg.SSPStatistics.from_public_dict(doc["statistics"])
    f = reg.fit_from_statistics(st, confidence=0.95, bootstrap=1000)
    np.testing.assert_array_equal(f.coef, rel.model.coef)
    np.testing.assert_array_equal(f.ci_low, rel.model.ci_low)
    assert f.intercept == rel.model.intercept == doc["intercept"]
    # the released table is the same matrix
    T = np.column_stack([rel.df.column(c).to_numpy() for c in ["a", "b", "c", "_intercept", "y"]])
    np.testing.assert_array_equal(T[:4, :4], st.gram)
    np.testing.assert_array_equal(T[:4, 4], st.xy)
    assert rel.df.column("statistic").to_pylist() == ["a", "b", "c", "_intercept", "y"]


def test_add_remove_releases_only_a_noisy_n():
    X, y = _data(1500)
    rel = release_regression(_table(X, y), **dict(BASE, neighbors="add-remove"))
    r = rel.receipt()
    assert r["guarantee"]["neighbors"] == "add-remove" and "n" not in r["mechanism_details"]
    st = rel.extras["statistics"]
    assert st.n != 1500 and abs(st.n - 1500) < 8 * math.sqrt(st.var_n) and st.var_n > 0
    def numbers(v):
        if isinstance(v, dict):
            for x in v.values():
                yield from numbers(x)
        elif isinstance(v, list):
            for x in v:
                yield from numbers(x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield v

    assert 1500 not in set(numbers(r))  # the exact n is nowhere in the receipt


# ----------------------------------------------------------------------------- the target range


def test_target_range_from_an_exact_histogram():
    cands = 2.0 ** np.arange(-2, 4)  # 0.25 .. 8
    edges = reg.signed_edges(cands)
    y = np.concatenate([np.full(10, -0.5), np.full(980, 1.5), np.full(10, 5.0)])
    counts = np.bincount(np.searchsorted(edges, y, side="right"), minlength=edges.size + 1).astype(float)
    # coverage 0.99: at most 5 values below the lower edge, at least 995 below the upper one
    assert reg.choose_target_range(counts, cands, 0.99) == (-0.5, 8.0)
    # 0.98: up to 10 below (the 10 at -0.5) and 990 below 2 (the 10 at 5.0 are the other 1%)
    assert reg.choose_target_range(counts, cands, 0.98) == (1.0, 2.0)
    assert reg.choose_target_range(np.zeros_like(counts), cands, 0.9) == (-8.0, 8.0)
    # bins below the occupancy threshold outside the data's region do not count (their noise would
    # add up to more than a tail): 8 in every empty bin, threshold 9
    assert reg.choose_target_range(np.where(counts > 0, counts, 8.0), cands, 0.99, threshold=9.0) == (-0.5, 8.0)
    assert reg.choose_target_range(np.where(counts > 0, counts, 8.0), cands, 0.99) == (-8.0, 8.0)



def test_occupancy_threshold_passes_pure_noise_in_one_release_in_a_thousand():
    """The bar a noisy bin must clear to count as holding data: pure Laplace noise of the target's
    histogram (46 bins) clears it in some bin in about 0.1 % of releases (Monte Carlo, 400,000
    histograms). At 1 % one release in about 150 chose a bound of 2^11 or more on a target within
    +-1 (tests/spark/test_regression_ssp_spark.py::test_target_quantile_on_spark, unseeded, failed so)."""
    from sparkpriv.privacy.noise import calibrate_laplace_noise

    hist = calibrate_laplace_noise(sensitivity=2.0, epsilon=0.2, dim=46, max_abs=1e6)
    t = reg.occupancy_threshold(hist)
    b = hist.scale * hist.grid
    rng = np.random.default_rng(3)
    hits = sum(int((rng.laplace(0.0, b, (50_000, 46)).max(axis=1) > t).sum()) for _ in range(8))
    assert 0.0006 < hits / 400_000 < 0.0012

def test_target_quantile_release():
    X, y = _data(20000)
    y = y * 10 + 100  # about 100 +- 12
    rel = release_regression(_table(X, y), **dict(BASE, target_lower=None, target_upper=None, target_quantile=0.98,
                                                  epsilon=4.0))
    lo, hi = rel.public["target_range"]["lower"], rel.public["target_range"]["upper"]
    assert lo <= np.quantile(y, 0.01) and np.quantile(y, 0.99) <= hi and (lo, hi) == (64.0, 128.0)
    np.testing.assert_allclose(rel.model.coef, [8.0, -5.0, 2.5], atol=0.5)
    assert rel.epsilon <= 4.0 and len(rel.events.events) == 4


# ----------------------------------------------------------------------------- refusals


POISON = pa.table({"a": ["x"], "y": ["y"]})  # any read of a value would fail differently


@pytest.mark.parametrize("kw,name", [
    ({"lower": None, "upper": None}, "row_bound"),
    ({"target_lower": None, "target_upper": None}, "target_lower"),
    ({"upper": None}, "lower"),
    ({"row_bound": 1e300}, "row_bound"),
    ({"row_bound": 1e-300}, "row_bound"),
    ({"lower": -1e300}, "lower"),
    ({"target_upper": 1e300}, "target_upper"),
    ({"fill": 1e300}, "fill"),
    ({"delta": 1e-300}, "delta"),
    ({"delta": 1e-13}, "delta"),
    ({"delta": 0.0}, "delta"),
    ({"row_bound": 2e15}, "row_bound"),
    ({"row_bound": 1e-13}, "row_bound"),
    ({"lower": 0.0, "upper": 1e-13}, "upper"),
    ({"target_lower": 0.0, "target_upper": 1e-13}, "target_upper"),
    ({"epsilon": 5e-5}, "epsilon"),
    ({"delta": 0.9}, "delta"),
    ({"epsilon": 1e-300}, "epsilon"),
    ({"epsilon": 1e300}, "epsilon"),
    ({"epsilon": float("inf")}, "epsilon"),
    ({"sketch_rows": 10}, "sketch_rows"),
    ({"ridge": 0.5}, "ridge"),
    ({"scheme": "additive"}, "scheme"),
    ({"model": "logistic"}, "target_lower"),
    ({"positive": 1.0}, "positive"),
    ({"budget_split": (0.5, 0.6, 0.2)}, "budget_split"),
    ({"budget_split": (0.5, 0.5)}, "budget_split"),
    ({"target_quantile": 0.9}, "target_quantile"),
    ({"target_quantile": 0.9, "target_lower": None, "target_upper": None, "target_search": (0, 400)},
     "target_search"),
    ({"neighbors": "element"}, "element"),
    ({"method": "sketch", "row_bound": 1.0}, "lower"),
    ({"method": "sketch", "lower": None, "upper": None, "target_lower": None, "target_upper": None,
      "neighbors": "add-remove", "row_bound": 1.0}, "add-remove"),
    ({"method": "sketch", "lower": None, "upper": None, "target_lower": None, "target_upper": None}, "row_bound"),
    ({"bootstrap": 10}, "bootstrap"),
])
def test_refusals_name_the_parameter_before_anything_is_read_or_reserved(kw, name, tmp_path):
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=10.0, delta=1e-4)
    with pytest.raises(ParameterError, match=name):
        release_regression(POISON, ledger=url, table_id="t", **dict(BASE, columns=["a"], **kw))
    with open_ledger(url) as led:
        assert led.status("t").entries == [] and led.status("t").spent_epsilon == 0.0


def test_limits_are_accepted_at_their_edges():
    X, y = _data(500)
    for kw in ({"epsilon": 1e-4}, {"epsilon": 1e4}, {"delta": 1e-12}, {"delta": 0.5}, {"row_bound": 1e15},
               {"lower": -1e15, "upper": 1e15, "epsilon": 1e-4, "delta": 1e-12, "target_lower": -1e15,
                "target_upper": 1e15, "budget_split": (0.001, 0.001, 0.001)}, {"row_bound": 1e-12},
               {"lower": 0.0, "upper": 1e-12, "target_lower": 0.0, "target_upper": 1e-12, "fill": 1e15},
               {"target_quantile": 0.9, "target_lower": None, "target_upper": None, "epsilon": 1e-4}):
        release_regression(_table(X, y), **dict(BASE, **kw))


def test_a_target_of_the_wrong_type_is_named():
    X, _ = _data(50)
    t = _table(X, np.zeros(50)).set_column(3, "y", pa.array(["p"] * 50))
    with pytest.raises(SparkPrivError, match="'y'"):
        release_regression(t, **BASE)


def test_estimators_have_no_default_bound():
    from sparkpriv.estimators import DPLinearRegression, DPLogisticRegression

    X, y = _data(100)
    with pytest.raises(ParameterError, match="row_bound"):
        DPLinearRegression(epsilon=1.0, delta=1e-6).fit(X, y)
    with pytest.raises(ParameterError, match="target_lower"):
        DPLinearRegression(epsilon=1.0, delta=1e-6, lower=-1, upper=1).fit(X, y)
    with pytest.raises(ParameterError, match="row_bound"):
        DPLinearRegression(epsilon=1.0, delta=1e-6, method="sketch").fit(X, y)
    with pytest.raises(ParameterError, match="row_bound"):
        DPLogisticRegression(epsilon=1.0, delta=1e-6).fit(X, y > 0)


# ----------------------------------------------------------------------------- values that must not decide


def test_a_nan_or_null_is_replaced_not_refused_and_charged(tmp_path):
    """A record holding NaN (numpy) or null (Arrow) gives exactly the release of the same table with
    the public replacement in its place (same secrets), and the spend is committed."""
    from sparkpriv.ledger import open_ledger

    X, y = _data(800)
    Xn, yn = X.copy(), y.copy()
    Xn[10, 2] = np.nan
    yn[11] = np.nan
    Xr, yr = X.copy(), y.copy()
    Xr[10, 2] = 0.0  # the box's centre
    yr[11] = 0.0  # the target range's centre
    with insecure_fixed_seed(9):
        a = release_regression(np.column_stack([Xn, yn]), **BASE)  # numpy: NaN is a missing value
    with insecure_fixed_seed(9):
        b = release_regression(_table(Xr, yr), **BASE)
    nulls = _table(X, y).set_column(2, "c", pa.array(X[:, 2], mask=np.arange(800) == 10)) \
        .set_column(3, "y", pa.array(y, mask=np.arange(800) == 11))
    with insecure_fixed_seed(9):
        c = release_regression(nulls, **BASE)  # Arrow: nulls
    for r in (a, c):
        np.testing.assert_array_equal(r.extras["statistics"].gram, b.extras["statistics"].gram)
        np.testing.assert_array_equal(r.extras["statistics"].xy, b.extras["statistics"].xy)
        np.testing.assert_array_equal(r.model.coef, b.model.coef)
        assert r.diagnostics()["missing_values_replaced"] == 2
        assert r.diagnostics()["rows_with_replaced_values"] == 2
        assert "values_replaced" not in json.dumps(r.receipt())
    assert "missing_values_replaced" not in b.diagnostics()
    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=10.0, delta=1e-4)
    rel = release_regression(np.column_stack([Xn, yn]), ledger=url, table_id="t", **BASE)
    rel.write(str(tmp_path / "out"))
    from sparkpriv.privacy.accounting import epsilon_of

    with open_ledger(url) as led:  # the ledger states spends at the budget's delta
        spent = led.status("t").spent_epsilon
    assert spent > 0 and spent == pytest.approx(epsilon_of(rel.events, 1e-4), rel=1e-6)


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_an_infinity_or_an_arrow_nan_is_replaced_not_refused(value):
    """Through the engine (an Arrow column): the same release as the box's centre in its place."""
    X, y = _data(300)
    Xr = X.copy()
    X[4, 0] = value
    Xr[4, 0] = 0.0  # the box's centre
    with insecure_fixed_seed(5):
        rel = release_regression(_table(X, y), **BASE)
    with insecure_fixed_seed(5):
        ref = release_regression(_table(Xr, y), **BASE)
    assert rel.diagnostics()["missing_values_replaced"] == 1
    np.testing.assert_array_equal(rel.extras["statistics"].gram, ref.extras["statistics"].gram)


def test_logistic_estimator():
    from sklearn.base import clone

    from sparkpriv.estimators import DPLogisticRegression

    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, (30000, 2))
    y = (rng.random(len(X)) < 1 / (1 + np.exp(-(3 * X[:, 0] - 2 * X[:, 1] + 0.5)))).astype(int)
    est = DPLogisticRegression(epsilon=2.0, delta=1e-6, lower=-1, upper=1)
    assert clone(est).get_params() == est.get_params()
    with insecure_fixed_seed(1):
        est.fit(X, y)
    assert est.score(X, y) > 0.75 and set(est.predict(X[:50])) <= {0.0, 1.0}
    P = est.predict_proba(X[:5])
    assert P.shape == (5, 2)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
