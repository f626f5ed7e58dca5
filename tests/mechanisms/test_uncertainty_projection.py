"""Uncertainty of the projection release: the stated value std and the squared-distance intervals.

The squared-distance interval's claim (docs/math.md section 2): for a FIXED pair of clipped
input rows, over the draw of the secret matrix ``P`` and of the noise, the interval covers the
true squared distance with probability ``confidence``. The simulations below draw exactly that
randomness, on the code path a release runs (``draw_projection_matrix``, ``plan_projection``
calibrated to the realized ``P``, ``project_rows``, ``add_noise``), and compare with the truth,
never with the code's own output.
"""

import math

import numpy as np
import pytest
from scipy import stats

from sparkpriv.api import release_dprp, release_projection_array
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import projection as pj
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.random import stream

D_IN = 12
ROW_BOUND = 5.0


def _pairs(deltas):
    """Rows 2i, 2i+1 = +-(delta_i / 2) e_i: pairs with orthogonal differences (so their ``x P`` are
    independent and every pair is an independent trial), all inside the ball (no clipping)."""
    X = np.zeros((2 * len(deltas), D_IN))
    for i, dl in enumerate(deltas):
        X[2 * i, i], X[2 * i + 1, i] = dl / 2, -dl / 2
    return X, np.asarray(deltas, float) ** 2


def _epsilon_for(kind, k, s2_target):
    """An epsilon at which the noise variance per entry is about ``s2_target`` (a few fixed-point steps)."""
    P = pj.draw_projection_matrix(D_IN, k, 1)
    delta = 1e-6 if kind == "gaussian" else 0.0
    eps = 10.0
    for _ in range(4):
        s2 = pj.plan_projection(P, Bounds(D_IN, row_bound=ROW_BOUND), epsilon=eps, delta=delta,
                                noise=kind).noise_variance
        eps *= math.sqrt(s2 / s2_target)
    return eps


def _simulate(kind, k, eps, ratios, trials, seed0, per_trial_plan):
    """Coverage of the stated interval and of the naive ``estimate +- 1.96 std`` per pair.

    Laplace: every trial calibrates to its own ``P`` (as a release does). Gaussian: the
    calibration (0.3 s each) is made once and its noise used for every ``P``; the stated
    interval takes the noise variance as given, and a check with noise std proportional to
    ``s_max(P)`` (what the per-P calibration does) gave the same coverage.
    """
    bounds = Bounds(D_IN, row_bound=ROW_BOUND)
    delta = 1e-6 if kind == "gaussian" else 0.0
    plan = pj.plan_projection(pj.draw_projection_matrix(D_IN, k, seed0), bounds, epsilon=eps, delta=delta,
                              noise=kind)
    # true squared distances at the given multiples of the noise term 2 k s2
    X, truth = _pairs([math.sqrt(r * 2 * k * plan.noise_variance) for r in ratios])
    assert np.abs(X).max() <= ROW_BOUND  # inside the ball: the true distance is the input's
    hit, naive = np.zeros(len(ratios)), np.zeros(len(ratios))
    for t in range(trials):
        P = pj.draw_projection_matrix(D_IN, k, seed0 + t)
        if per_trial_plan:
            plan = pj.plan_projection(P, bounds, epsilon=eps, delta=delta, noise=kind)
        Y, _ = pj.project_rows(X, P, bounds, plan.value_bound)
        Z = nz.add_noise(Y, plan.noise, stream(seed0 + t, 1))
        r = pj.sq_distance_intervals(Z[0::2], Z[1::2], noise_variance=plan.noise_variance, noise_kind=kind)
        hit += (r.low <= truth) & (truth <= r.high)
        naive += np.abs(r.estimate - truth) <= 1.96 * r.std
    return hit / trials, naive / trials, plan.noise_variance, truth


@pytest.mark.parametrize("kind,k", [("laplace", 2), ("laplace", 8), ("gaussian", 2), ("gaussian", 8)])
def test_stated_interval_covers_95_percent_by_simulation(kind, k):
    """93-97% coverage, pooled over pairs from 1x to 20x the noise term ``2 k s2`` (Laplace)
    or 0.2x to 20x (Gaussian: exact there). The naive normal interval under-covers where the
    projection dominates (small k): the reason for the chi-square interval."""
    eps = _epsilon_for(kind, k, 100.0 / (20 * 2 * 8) / 2)  # the largest pair (ratio 20 at k = 8) fits
    ratios = (1.0, 2.0, 5.0, 20.0) if kind == "laplace" else (0.2, 1.0, 5.0, 20.0)
    trials = 700
    cov, naive, _, _ = _simulate(kind, k, eps, ratios, trials, 1000 * k, per_trial_plan=kind == "laplace")
    pooled = cov.mean()  # 4 * trials independent intervals: binomial sd 0.004
    assert 0.93 <= pooled <= 0.97, cov
    assert cov.min() >= 0.92, cov  # no regime far off (sd 0.008 each)
    if k == 2:  # projection-dominated pairs (ratio 5 and 20)
        assert naive[2:].mean() < 0.85, naive


def test_interval_at_distance_zero_is_conservative():
    """Identical rows: the interval includes 0 unless the draw is in the upper tail: 97.5%
    (Gaussian, exact: the lower tail gives [0, 0]); Laplace about the same."""
    for kind in ("laplace", "gaussian"):
        cov, _, _, _ = _simulate(kind, 3, _epsilon_for(kind, 3, 0.5), [0.0] * 6, 250, 77,
                                 per_trial_plan=False)
        assert 0.95 <= cov.mean() <= 0.99, (kind, cov)


def test_gaussian_interval_is_the_exact_chi_square_pivot():
    """Independent closed form: ||Zi - Zj||^2 = (x2/k + 2 s2) chi2_k; invert its quantiles."""
    rng = np.random.default_rng(3)
    k, s2 = 4, 0.7
    Zi, Zj = rng.normal(size=(50, k)) * 2, rng.normal(size=(50, k))
    S = ((Zi - Zj) ** 2).sum(1)
    r = pj.sq_distance_intervals(Zi, Zj, noise_variance=s2, noise_kind="gaussian", confidence=0.9)
    np.testing.assert_allclose(r.high, np.maximum(k * (S / stats.chi2.ppf(0.05, k) - 2 * s2), 0), rtol=1e-12)
    np.testing.assert_allclose(r.low, np.maximum(k * (S / stats.chi2.ppf(0.95, k) - 2 * s2), 0), rtol=1e-12)
    np.testing.assert_allclose(r.estimate, S - 2 * k * s2, rtol=1e-12)
    np.testing.assert_allclose(r.std ** 2, pj.distance_variance(np.maximum(S - 2 * k * s2, 0), k=k,
                                                                 noise_variance=s2, noise_kind="gaussian"))
    # Laplace: the moment-matched chi-square has fewer degrees of freedom, so wider intervals
    rl = pj.sq_distance_intervals(Zi, Zj, noise_variance=s2, noise_kind="laplace", confidence=0.9)
    assert np.all(rl.high >= r.high - 1e-9) and np.all(rl.high - rl.low >= r.high - r.low - 1e-9)


@pytest.mark.parametrize("kind,mult", [("gaussian", 1.96), ("laplace", 2.12)])
def test_value_std_and_stated_multiplier_by_simulation(kind, mult):
    P = pj.draw_projection_matrix(D_IN, 4, 5)
    plan = pj.plan_projection(P, Bounds(D_IN, row_bound=ROW_BOUND), epsilon=3.0,
                              delta=1e-6 if kind == "gaussian" else 0.0, noise=kind)
    u = plan.uncertainty()
    e = nz.add_noise(np.zeros((50_000, 4)), plan.noise, stream(9, 1))
    assert e.std() == pytest.approx(u["value_std"], rel=0.01)
    assert u["value_variance"] == pytest.approx(u["value_std"] ** 2, rel=1e-12)
    assert f"+- {mult}" in u["value_note"]
    assert np.mean(np.abs(e) <= mult * u["value_std"]) == pytest.approx(0.95, abs=0.004)


def test_release_states_uncertainty_and_recovers_distances(test_seed):
    X = np.random.default_rng(2).normal(size=(40, 6))
    rel = release_projection_array(X, k=3, epsilon=2.0, row_bound=4.0)
    u = rel.uncertainty()
    assert u == rel.receipt()["mechanism_details"]["uncertainty"]
    assert u["value_variance"] == pytest.approx(rel.public["noise_variance_per_entry"], rel=1e-12)
    Z = rel.to_numpy()
    r = rel.squared_distances(Z[:20], Z[20:], confidence=0.9)
    ref = pj.sq_distance_intervals(Z[:20], Z[20:], noise_variance=u["value_variance"], noise_kind="laplace",
                                   confidence=0.9)
    for name in ("estimate", "std", "low", "high"):
        np.testing.assert_array_equal(getattr(r, name), getattr(ref, name))
    np.testing.assert_allclose(r.estimate, ((Z[:20] - Z[20:]) ** 2).sum(1) - 2 * 3 * u["value_variance"])
    assert np.all((r.low <= np.maximum(r.estimate, 0)) & (np.maximum(r.estimate, 0) <= r.high))
    one = rel.squared_distances(Z[0], Z[1])
    assert np.ndim(one.estimate) == 0 and one.confidence == 0.95
    with pytest.raises(ParameterError, match="k = 3"):
        rel.squared_distances(Z[0, :2], Z[1, :2])


def test_squared_distances_refused_for_other_mechanisms(test_seed):
    X = np.random.default_rng(2).normal(size=(10, 3))
    rel = release_dprp(X, epsilon=1.0, delta=1e-6, lower=-3.0, upper=3.0)
    with pytest.raises(ParameterError, match="projection releases"):
        rel.squared_distances(X[0], X[1])
