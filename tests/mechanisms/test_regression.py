"""Private linear regression on a sample-mixing sketch (docs/math.md section 6).

References are independent of the code under test: brute force over neighbour
pairs for the sensitivity, the analytic Gaussian privacy curve (Balle & Wang,
Thm 8) for the calibration, Monte Carlo moments for the debiasing and coverage.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from scipy import special

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import regression as reg
from sparkpriv.mechanisms.regression import (
    RegressionFacts,
    RegressionParams,
    clip_regression_rows,
    finalize_sketch,
    pack_partial,
    plan_regression,
    release_regression_array,
    sketch_matrix,
    sketch_partial,
)
from sparkpriv.privacy.random import stream


def _data(n, d=3, seed=0, noise=0.1):
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (n, d)) / math.sqrt(d)
    b = A @ np.linspace(0.5, -0.3, d) + noise * rng.standard_normal(n)
    M, _ = clip_regression_rows(A, b, 1.0)
    return M[:, :-1], M[:, -1], M


def _delta_of(s, eps):
    """Balle & Wang (2018) Thm 8, written out here: delta of N(0, s^2) for sensitivity 1."""
    return special.ndtr(-eps * s + 1 / (2 * s)) - math.exp(eps) * special.ndtr(-eps * s - 1 / (2 * s))


# ----------------------------------------------------------------------------- sensitivity


def test_sensitivity_of_realized_sketch_matches_brute_force():
    """max over replace-one neighbours of ||S M - S M'||_F, by enumeration, is 2B max_i ||S_:,i||."""
    B = 1.5
    m, n = 2, 3
    S = sketch_matrix(99, m, n)
    angles = np.linspace(0, 2 * np.pi, 72, endpoint=False)
    pts = [np.zeros(2)] + [r * B * np.array([math.cos(a), math.sin(a)]) for r in (0.5, 1.0) for a in angles]
    pts = np.array(pts)
    base = np.array([[0.3, 0.1], [-0.2, 0.4], [0.0, -0.5]])
    worst = 0.0
    for i in range(n):
        for u, v in itertools.product(range(len(pts)), repeat=2):
            M1 = base.copy()
            M2 = base.copy()
            M1[i] = pts[u]
            M2[i] = pts[v]
            worst = max(worst, float(np.linalg.norm(S @ M1 - S @ M2)))
    claimed = reg.sketch_sensitivity(S, B)
    assert worst <= claimed * (1 + 1e-12)
    assert worst >= claimed * (1 - 1e-9)  # antipodal points on the grid reach it


def test_finalize_uses_realized_column_norms():
    n, m = 500, 7
    _, _, M = _data(n)
    plan = plan_regression(RegressionParams(method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-5, sketch_rows=m),
                           RegressionFacts(n), d=3)
    plan = dataclasses.replace(plan, sketch_seed=5, noise_seed=6)
    rel = finalize_sketch(pack_partial(*sketch_partial(M, 5, m, 0)), plan)
    S = sketch_matrix(5, m, n)
    assert rel.sensitivity == pytest.approx(2.0 * np.linalg.norm(S, axis=0).max(), rel=1e-12)
    # the noise is calibrated to it: discrete Gaussian sigma / sensitivity meets the analytic curve
    s = rel.noise.std / rel.sensitivity
    assert _delta_of(s, 1.0) <= 1e-5
    assert _delta_of(s * 0.97, 1.0) > 1e-5  # and is not wastefully large
    assert rel.epsilon() <= 1.0


# ----------------------------------------------------------------------------- the sketch


def test_sketch_partials_add_up_over_any_split():
    n, m = 1000, 40  # block_rows(40) = 6553: one block; use m large for several blocks too
    for m in (40, 3000):
        _, _, M = _data(n)
        S = sketch_matrix(11, m, n)
        whole = S @ M
        cuts = [0, 1, 137, 138, 600, n]
        SM = np.zeros_like(whole)
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            SM += sketch_partial(M[lo:hi], 11, m, lo)[0]
        np.testing.assert_allclose(SM, whole, rtol=1e-10, atol=1e-10)


def test_sketch_columns_come_from_the_keyed_block_streams():
    m = 3000
    br = reg.block_rows(m)
    S = sketch_matrix(21, m, 2 * br + 5)
    for k in (0, 2):
        ref = stream(21, reg.SKETCH_STAGE, k).standard_normal((br, m)) / math.sqrt(m)
        np.testing.assert_allclose(S[:, k * br: k * br + 5], ref[:5].T, rtol=1e-14, atol=0)


def test_sketch_entries_are_standard_normal_over_m():
    m, n = 50, 4000
    S = sketch_matrix(3, m, n)
    assert abs(S.mean()) < 4 / math.sqrt(m * n) / math.sqrt(m)
    assert S.var() * m == pytest.approx(1.0, abs=4 * math.sqrt(2 / (m * n)))
    # E[S^T S] = I: column norms^2 average 1
    assert (S * S).sum(axis=0).mean() == pytest.approx(1.0, abs=0.01)


# ----------------------------------------------------------------------------- moments and fits


def test_debiased_gram_is_unbiased_for_sketch_and_additive():
    n, d = 300, 2
    A, b, M = _data(n, d)
    G = M.T @ M
    for scheme, m, trials in (("sketch", 60, 400), ("additive", None, 200)):
        plan = plan_regression(RegressionParams(method="sketch", row_bound=1.0, epsilon=2.0, delta=1e-5, scheme=scheme,
                                                sketch_rows=m), RegressionFacts(n), d=d)
        acc = np.zeros_like(G)
        for t in range(trials):
            pl = dataclasses.replace(plan, sketch_seed=100 + t, noise_seed=900 + t)
            if scheme == "sketch":
                rel = finalize_sketch(pack_partial(*sketch_partial(M, pl.sketch_seed, pl.m, 0)), pl)
                R, s2 = rel.R, rel.noise.variance
            else:
                s2 = pl.additive_noise().variance
                R = reg.additive_noise_rows(M, pl, stream(pl.noise_seed, reg.ADDITIVE_STAGE, 0))
            acc += R.T @ R - R.shape[0] * s2 * np.eye(d + 1)
        mean = acc / trials
        scale = np.sqrt(np.outer(np.diag(G), np.diag(G))).max() + R.shape[0] * s2
        assert np.abs(mean - G).max() < 0.08 * scale, (scheme, mean, G)


def test_noiseless_limit_recovers_least_squares():
    A, b, _ = _data(3000, 4)
    xs = np.linalg.lstsq(A, b, rcond=None)[0]
    rel = release_regression_array(A, b, RegressionParams(method="sketch", row_bound=1.0, epsilon=1e4, delta=1e-5,
                                                          sketch_rule="full"))
    np.testing.assert_allclose(rel.fit.coef, xs, atol=0.02)
    assert reg.relative_objective_error(A, b, rel.fit.coef) < 0.01


def test_confidence_intervals_cover_the_least_squares_solution():
    """The 95% intervals cover x* (non-private LS on the clipped data) in 93-97% of trials."""
    n, d, m = 4000, 3, 100
    A, b, M = _data(n, d)
    xs = np.linalg.lstsq(A, b, rcond=None)[0]
    plan = plan_regression(RegressionParams(method="sketch", row_bound=1.0, epsilon=20.0, delta=1e-5, sketch_rows=m),
                           RegressionFacts(n), d=d)
    trials, hits = 300, 0
    for t in range(trials):
        pl = dataclasses.replace(plan, sketch_seed=5000 + t, noise_seed=7000 + t)
        f = finalize_sketch(pack_partial(*sketch_partial(M, pl.sketch_seed, m, 0)), pl).fit
        hits += int(np.sum((f.ci_low <= xs) & (xs <= f.ci_high)))
    assert 0.93 <= hits / (trials * d) <= 0.97


# ----------------------------------------------------------------------------- plan and errors


def test_plan_accounts_at_most_the_request_and_holds_no_secrets():
    plan = plan_regression(RegressionParams(method="sketch", columns=("a", "b"), target="y", row_bound=2.0, epsilon=0.5,
                                            delta=1e-6), RegressionFacts(10_000))
    assert plan.accounted_epsilon() <= 0.5
    assert plan.accounted_epsilon() > 0.5 * 0.999
    pub = repr(plan.to_public_dict()) + repr(plan)
    assert str(plan.sketch_seed) not in pub and str(plan.noise_seed) not in pub
    assert plan.m == max(3 + 10, math.ceil(10 * math.log(10_000)))


@pytest.mark.parametrize("row_bound", [None, 0, -1.0, float("inf"), float("nan")])
def test_bad_row_bound_is_refused(row_bound):
    with pytest.raises(ParameterError, match="row_bound"):
        plan_regression(RegressionParams(method="sketch", row_bound=row_bound, epsilon=1.0, delta=1e-6), RegressionFacts(100), d=2)


def test_more_sketch_rows_than_records_is_refused():
    with pytest.raises(ParameterError, match="at most the number of rows n = 50"):
        plan_regression(RegressionParams(method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-6, sketch_rows=51), RegressionFacts(50), d=2)
    assert plan_regression(RegressionParams(method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-6, sketch_rule="full"), RegressionFacts(50), d=2).m == 50


@pytest.mark.parametrize("neighbors,reason", [("add-remove", "realized columns"), ("element", "rescales the whole row")])
def test_other_neighbour_relations_are_refused_with_the_reason(neighbors, reason):
    with pytest.raises(ParameterError, match=reason):
        plan_regression(RegressionParams(method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-6, neighbors=neighbors), RegressionFacts(100), d=2)


def test_target_among_features_is_refused():
    with pytest.raises(ParameterError, match="also listed as a feature"):
        RegressionParams(method="sketch", columns=("a", "y"), target="y", row_bound=1.0, epsilon=1.0, delta=1e-6).validate()


def test_bad_arrays_are_refused():
    from sparkpriv.errors import InputError

    with pytest.raises(InputError, match="column index 1"):
        release_regression_array(np.array([[1.0, np.nan]] * 20), np.zeros(20), RegressionParams(method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-6))
    with pytest.raises(InputError, match="one value per row"):
        release_regression_array(np.ones((20, 2)), np.zeros(19), RegressionParams(method="sketch", row_bound=1.0, epsilon=1.0, delta=1e-6))


def test_additive_release_on_the_local_engine_is_the_numpy_reference():
    """The additive baseline through the one release path (in memory): the same noisy rows as the
    numpy reference for a test seed, the stated per-entry noise, and the model of those rows."""
    import pandas as pd

    from sparkpriv.api import release_regression
    from sparkpriv.privacy.random import insecure_fixed_seed

    rng = np.random.default_rng(8)
    n, d = 3000, 3
    A = rng.normal(size=(n, d)) / 2
    b = A @ np.array([0.5, -0.3, 0.2]) + 0.05 * rng.normal(size=n)
    df = pd.DataFrame(A, columns=["a", "b", "c"]).assign(y=b)
    kw = dict(method="sketch", row_bound=1.5, epsilon=3.0, delta=1e-6, scheme="additive")
    with insecure_fixed_seed(21):
        ref = release_regression_array(A, b, RegressionParams(**kw))
    with insecure_fixed_seed(21):
        rel = release_regression(df, columns=["a", "b", "c"], target="y", **kw)
    R = np.column_stack([rel.df.column(c).to_numpy() for c in ["a", "b", "c", "y"]])
    assert R.shape == (n, 4)
    np.testing.assert_array_equal(R, ref.R)
    # the noise: R - clip(M) has the per-entry std of the Gaussian mechanism at sensitivity 2B
    M, _ = reg.clip_regression_rows(A, b, 1.5)
    W = R - M
    z = rel.public["noise_multiplier"]
    assert W.std() == pytest.approx(z * 2 * 1.5, rel=0.03)
    assert rel.public["sensitivity_value"] == 3.0 and rel.public["scheme"] == "additive"
    # the model is the fit of the released rows (here recomputed in one numpy call)
    np.testing.assert_allclose(rel.model.coef, ref.fit.coef, rtol=1e-9)
    np.testing.assert_allclose(rel.model.stderr, ref.fit.stderr, rtol=1e-9)
    assert rel.diagnostics()["rows"] == n
