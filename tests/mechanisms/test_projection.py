"""The projection mechanism on numpy arrays: calibration, clipping, distance recovery."""

import itertools

import numpy as np
import pytest

from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms.projection import (
    distance_variance,
    draw_projection_matrix,
    plan_projection,
    project_rows,
    recover_sq_distances,
)
from sparkpriv.api import release_projection_array
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import Bounds


def _brute_l1(P, r):
    return r * max(np.linalg.norm(P @ np.array(s)) for s in itertools.product([-1.0, 1.0], repeat=P.shape[1]))


def test_matrix_distribution():
    P = draw_projection_matrix(400, 50, seed=7)
    assert P.shape == (400, 50)
    assert P.mean() == pytest.approx(0.0, abs=0.01)
    assert P.var() == pytest.approx(1 / 50, rel=0.03)
    np.testing.assert_array_equal(P, draw_projection_matrix(400, 50, seed=7))
    assert not np.array_equal(P, draw_projection_matrix(400, 50, seed=8))


@pytest.mark.parametrize("neighbors,factor", [("replace-one", 2.0), ("add-remove", 1.0)])
def test_laplace_plan_uses_exact_sensitivity_of_realized_matrix(neighbors, factor):
    P = draw_projection_matrix(6, 3, seed=1)
    plan = plan_projection(P, Bounds(6, row_bound=1.5), epsilon=0.7, neighbors=neighbors)
    assert plan.sensitivity == pytest.approx(_brute_l1(P, factor * 1.5), rel=1e-12)
    # the event gives the requested epsilon (rounded down, never up)
    eps = epsilon_of(plan.dp_event(), 0.0)
    assert 0.7 * (1 - 1e-9) <= eps <= 0.7 * (1 + 1e-12)


def test_element_wise_plan_is_labelled_and_exact():
    P = draw_projection_matrix(5, 2, seed=2)
    plan = plan_projection(P, Bounds(5, element_bound=3.0), epsilon=1.0, neighbors="element")
    assert plan.sensitivity == pytest.approx(3.0 * np.abs(P).sum(axis=1).max())
    assert "NOT a person" in plan.to_public_dict()["protects"]


def test_paper_calibration_is_noisier_than_exact_elementwise():
    # docs/math.md: exact element-wise calibration needs 0.57-0.68x of the paper's c = 2 sqrt(k) noise
    ratios = []
    for seed in range(30):
        P = draw_projection_matrix(50, 10, seed=seed)
        exact = plan_projection(P, Bounds(50, element_bound=1.0), epsilon=1.0, neighbors="element").sensitivity
        ratios.append(exact / (2 * np.sqrt(10)))
    assert 0.45 < np.mean(ratios) < 0.8


def test_gaussian_plan_uses_smax():
    P = draw_projection_matrix(8, 4, seed=3)
    plan = plan_projection(P, Bounds(8, row_bound=1.0), epsilon=1.0, delta=1e-6, noise="gaussian")
    assert plan.sensitivity == pytest.approx(2.0 * np.linalg.svd(P, compute_uv=False)[0])
    assert epsilon_of(plan.dp_event(), 1e-6) <= 1.0 * (1 + 2e-3)


def test_clipping_bounds_one_records_influence():
    rng = np.random.default_rng(0)
    d, k = 12, 4
    P = draw_projection_matrix(d, k, seed=4)
    bounds = Bounds(d, (-1.0,) * d, (1.0,) * d, row_bound=2.0)
    plan = plan_projection(P, bounds, epsilon=1.0)
    worst = 0.0
    for _ in range(2000):
        x = rng.standard_normal(d) * rng.choice([0.1, 1.0, 100.0])
        y = rng.standard_normal(d) * rng.choice([0.1, 1.0, 100.0])
        zx, _ = project_rows(x[None, :], P, bounds)
        zy, _ = project_rows(y[None, :], P, bounds)
        worst = max(worst, np.abs(zx - zy).sum())
    assert worst <= plan.sensitivity * (1 + 1e-9)
    assert worst > 0.5 * plan.sensitivity  # the bound is not vacuous


def test_release_array_adds_noise_of_the_planned_scale(test_seed):
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(20000, 10))
    rel = release_projection_array(X, k=5, epsilon=1.0, row_bound=1.0)
    from sparkpriv.privacy.random import derive_seed

    P = draw_projection_matrix(10, 5, derive_seed(test_seed, "projection-matrix#1"))
    Y, _ = project_rows(X, P, Bounds(10, row_bound=1.0))
    resid = rel.to_numpy() - Y
    assert resid.var() == pytest.approx(rel.plan.noise_variance, rel=0.03)
    assert abs(resid.mean()) < 4 * np.sqrt(rel.plan.noise_variance / resid.size)


@pytest.mark.parametrize("kw,msg", [
    ({"k": 0}, "'k' parameter"),
    ({"k": 11}, "'k' parameter"),
    ({"epsilon": 0.0}, "'epsilon' parameter"),
    ({"epsilon": -1.0}, "'epsilon' parameter"),
    ({"delta": 1.0, "noise": "gaussian"}, "'delta' parameter"),
    ({"delta": -0.1, "noise": "gaussian"}, "'delta' parameter"),
    ({"noise": "gaussian"}, "Gaussian noise"),
    ({"delta": 1e-6}, "must be 0 with Laplace"),
    ({"row_bound": None}, "declared public bounds"),
    ({"noise": "uniform"}, "'noise' parameter"),
])
def test_bad_parameters(kw, msg):
    args = dict(k=3, epsilon=1.0, row_bound=1.0)
    args.update(kw)
    with pytest.raises(ParameterError, match=msg):
        release_projection_array(np.ones((5, 10)), **args)


def test_nan_input_is_replaced_and_counted():
    from sparkpriv.privacy.random import insecure_fixed_seed

    X = np.ones((4, 3))
    X[2, 1] = np.nan
    with insecure_fixed_seed(5):
        a = release_projection_array(X, k=2, epsilon=1.0, row_bound=1.0)
    X[2, 1] = 0.0  # no box: the centre of the norm ball
    with insecure_fixed_seed(5):
        b = release_projection_array(X, k=2, epsilon=1.0, row_bound=1.0)
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    assert a.diagnostics()["missing_values_replaced"] == 1


def test_distance_recovery_is_unbiased_with_corrected_variance():
    """Monte Carlo over P and Laplace noise (independent numpy draws, fixed seed)."""
    rng = np.random.default_rng(2024)
    d, k, trials = 20, 8, 200_000
    x = rng.standard_normal(d)
    x *= 2.0 / np.linalg.norm(x)  # ||x||^2 = 4
    b = 0.8
    s2 = 2 * b * b
    D = np.empty(trials)
    for start in range(0, trials, 20_000):
        m = 20_000
        P = rng.standard_normal((m, d, k)) / np.sqrt(k)
        y = np.einsum("d,mdk->mk", x, P)  # (x_i - x_j) P
        e = rng.laplace(0, b, (m, k)) - rng.laplace(0, b, (m, k))
        Zi_minus_Zj = y + e
        D[start:start + m], _ = recover_sq_distances(Zi_minus_Zj, np.zeros_like(Zi_minus_Zj),
                                                     noise_variance=s2, noise_kind="laplace")
    assert D.mean() == pytest.approx(4.0, abs=4 * D.std() / np.sqrt(trials))
    predicted = distance_variance(4.0, k=k, noise_variance=s2, noise_kind="laplace")
    assert D.var() == pytest.approx(predicted, rel=0.03)
    # the Gaussian constant (8 instead of 14) or the paper's Claim 7 would not match
    wrong = distance_variance(4.0, k=k, noise_variance=s2, noise_kind="gaussian")
    assert abs(D.var() - wrong) / wrong > 0.1
    paper = (2 / k) * 16 + 2 * k * (7 * s2 ** 2 - s2) + 4 * s2 * 4
    assert abs(D.var() - paper) / paper > 0.1


def test_distance_recovery_gaussian_noise_constant():
    rng = np.random.default_rng(7)
    d, k, m = 10, 6, 200_000
    x = np.zeros(d)
    x[0] = 1.5
    P = rng.standard_normal((m, d, k)) / np.sqrt(k)
    s2 = 0.5
    y = np.einsum("d,mdk->mk", x, P) + rng.normal(0, np.sqrt(s2), (m, k)) - rng.normal(0, np.sqrt(s2), (m, k))
    D, _ = recover_sq_distances(y, np.zeros_like(y), noise_variance=s2, noise_kind="gaussian")
    assert D.mean() == pytest.approx(2.25, abs=4 * D.std() / np.sqrt(m))
    assert D.var() == pytest.approx(distance_variance(2.25, k=k, noise_variance=s2, noise_kind="gaussian"), rel=0.03)


def test_no_pyspark_import_in_core():
    import subprocess
    import sys

    code = ("import sys, sparkpriv.mechanisms.projection, sparkpriv.privacy.sensitivity, "
            "sparkpriv.privacy.accounting, sparkpriv.privacy.bounds, sparkpriv.privacy.calibration;"
            "import sparkpriv.privacy.noise;"
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
def test_values_far_from_origin_fit_the_noise_grid(noise, delta):
    # a narrow box far from the origin: tiny sensitivity, huge values; the grid must be
    # coarsened from the declared bounds (before any data is read), not fail on the data
    rng = np.random.default_rng(3)
    X = rng.uniform(1000.0, 1001.0, size=(2000, 6))
    rel = release_projection_array(X, k=3, epsilon=8.0, delta=delta, noise=noise,
                                   lower=[1000.0] * 6, upper=[1001.0] * 6)
    assert np.isfinite(rel.to_numpy()).all()
    assert rel.plan.noise.max_abs_value >= np.abs(X @ np.ones((6, 1))).max() / 10
