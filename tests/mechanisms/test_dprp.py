"""DPRP numpy core: sensitivities, budget split, Gram, reconstruction, noise, labels, errors."""

import logging
import math
import subprocess
import sys

import numpy as np
import pytest
from dp_accounting import dp_event

from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms import dprp as core
from sparkpriv.mechanisms import dprp_records as rcore
from sparkpriv.api import release_dprp_array, table_arrays
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.privacy.accounting import compose, epsilon_of
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.random import stream


def _plan(d=6, k1=None, k2=None, row_bound=None, epsilon=2.0, delta=1e-5, labels=None, classes=None,
          fill=None, seed=3, lower=None, upper=None, label_scale=1.0):
    lower = [0.0] * d if lower is None else lower
    upper = [1.0] * d if upper is None else upper
    v = core.validate_params(d=d, epsilon=epsilon, delta=delta, lower=lower, upper=upper, k1=k1, k2=k2,
                             row_bound=row_bound, budget_split=(0.8, 0.2), labels=labels, classes=classes,
                             label_scale=label_scale, fill=fill, impute_share=0.05,
                             neighbors="replace-one", caller="t")
    R = draw_projection_matrix(d + v["n_label_columns"], v["k1"], seed)
    plan = core.plan_dprp(R, d=d, epsilon=epsilon, delta=delta, lower=v["lower"], upper=v["upper"],
                          k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"],
                          labels=labels, classes=classes, label_scale=label_scale, fill=fill,
                          impute_share=0.05)
    return plan, R


def _release(X, y=None, *, _noise_free=False, **params):
    """``(X', y', release)`` of the DPRP release of in-memory ``X`` (and labels ``y``).

    ``_noise_free``: the same passes on the local engine without any noise (the
    plan's state marked by hand; no public parameter turns the noise off).
    """
    if not _noise_free:
        rel = release_dprp_array(X, y, **params)
        return (*table_arrays(rel), rel)
    import dataclasses

    from sparkpriv.api import _with_labels
    from sparkpriv.local.engine import LocalEngine
    from sparkpriv.mechanisms.protocol import Progress, get_mechanism
    from sparkpriv.release import Release

    data = X
    if y is not None:
        data, params = _with_labels(X, y, params)
    mech = get_mechanism("dprp")
    p = mech.Params.from_mapping(params, "t")
    p.validate("t")
    eng = LocalEngine()
    src = eng.open(data, caller="t", **mech.open_args(p))
    plan = mech.plan(p, src.facts, "t")
    plan.state = dataclasses.replace(plan.state, noise_free=True)
    out = mech.run(eng, src, plan, Progress("t", logging.getLogger("t")))
    parameters = {**src.public_params(), **p.public_dict(), **plan.parameters}
    rel = Release(df=out.table, mechanism="dprp", event=plan.events, epsilon=plan.epsilon, delta=plan.delta,
                  public=dict(plan.public, parameters=parameters, **out.public), input_info={}, engine="local")
    return (*table_arrays(rel), rel)


def test_core_does_not_import_pyspark():
    code = "import sys, sparkpriv.mechanisms.dprp; assert 'pyspark' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- sensitivities ---------------------------------------------------------------------------

def _domain_points(d, n_classes, row_bound, *, grid=(0.0, 0.5, 1.0), n_random=150, seed=0,
                   label_scale=1.0):
    """Prepared rows of a brute-force domain: every grid point of the box (all vertices
    among them) and random interior points, each with every class (private labels),
    through the code's own preparation (scaling from [-1, 3], one-hot, norm clip)."""
    import itertools
    rng = np.random.default_rng(seed)
    U = np.array(list(itertools.product(grid, repeat=d)) + list(rng.uniform(0, 1, (n_random, d))))
    X = -1.0 + 4.0 * U  # declared bounds [-1, 3]
    classes = list(range(n_classes)) if n_classes else None
    plan, R = _plan(d=d, row_bound=row_bound, lower=[-1.0] * d, upper=[3.0] * d,
                    labels="private" if n_classes else None, classes=classes, label_scale=label_scale)
    if n_classes:
        Xs = np.repeat(X, n_classes, axis=0)
        codes = np.tile(np.arange(n_classes), X.shape[0])
        P, _ = core.prepare_rows(Xs, plan, codes)
    else:
        P, _ = core.prepare_rows(X, plan)
    return P, plan, R


def _brute_force_max(P):
    """Largest ||x - y||_2 and ||triu(x x^T - y y^T)||_2 (each unique entry once) over all pairs."""
    iu = np.triu_indices(P.shape[1])
    T = P[:, iu[0]] * P[:, iu[1]]
    best_x = best_g = 0.0
    for i in range(P.shape[0]):
        best_x = max(best_x, float(np.sqrt(((P[i] - P) ** 2).sum(1).max())))
        best_g = max(best_g, float(np.sqrt(((T[i] - T) ** 2).sum(1).max())))
    return best_x, best_g


@pytest.mark.parametrize("d", [1, 2, 3, 4])
@pytest.mark.parametrize("n_classes", [0, 2, 3])
def test_sensitivities_equal_the_brute_force_maximum_at_the_default_row_bound(d, n_classes):
    """Calibration >= the true worst change over the declared domain, and equal to it
    (a future over-noising fails too). Default Z: no row is norm-clipped."""
    P, plan, R = _domain_points(d, n_classes, None, grid=(0.0, 0.5, 1.0) if d <= 3 else (0.0, 1.0))
    bx, bg = _brute_force_max(P)
    smax = float(np.linalg.norm(R, 2))
    # closed forms, independent of the code: sqrt(d) and sqrt(d (d + 1) / 2) without labels;
    # sqrt(d + 2) and sqrt(d (d + 1) / 2 + d + 2) with a one-hot block of value 1
    want_x = math.sqrt(d + 2) if n_classes else math.sqrt(d)
    want_g = math.sqrt(d * (d + 1) / 2 + d + 2) if n_classes else math.sqrt(d * (d + 1) / 2)
    assert bx == pytest.approx(want_x, rel=1e-12)
    assert bg == pytest.approx(want_g, rel=1e-12)
    assert plan.projection_sensitivity >= bx * smax
    assert plan.projection_sensitivity == pytest.approx(bx * smax, rel=1e-8)
    assert plan.gram_sensitivity >= bg
    assert plan.gram_sensitivity == pytest.approx(bg, rel=1e-8)
    # the released change itself: one row of X R moves by (x - y) R
    i, j = np.unravel_index(np.argmax(((P[:, None] - P[None]) ** 2).sum(-1)), (P.shape[0],) * 2)
    assert np.linalg.norm((P[i] - P[j]) @ R) <= plan.projection_sensitivity


@pytest.mark.parametrize("d, n_classes, z2", [(4, 0, 2.0), (4, 0, 1.0), (3, 0, 2.0), (3, 0, 1.5),
                                              (2, 2, 1.5), (3, 2, 2.0), (3, 2, 3.0), (2, 3, 0.5)])
def test_sensitivities_cover_the_brute_force_maximum_with_a_norm_clip(d, n_classes, z2):
    """A row_bound below the box's largest norm: the projection bound stays exact; the Gram
    bound is >= the brute force and exact where two largest rows fit on disjoint supports."""
    P, plan, R = _domain_points(d, n_classes, math.sqrt(z2), grid=(0.0, 0.25, 0.5, 0.75, 1.0),
                                n_random=100 if d == 4 else 300)
    bx, bg = _brute_force_max(P)
    smax = float(np.linalg.norm(R, 2))
    assert plan.projection_sensitivity >= bx * smax
    assert plan.projection_sensitivity == pytest.approx(bx * smax, rel=1e-8)
    assert plan.gram_sensitivity >= bg
    if n_classes == 0 and z2 == int(z2) and 2 * z2 <= d:  # disjoint 0/1 rows of norm Z exist
        assert plan.gram_sensitivity == pytest.approx(math.sqrt(z2 * z2 + z2), rel=1e-8)
        assert plan.gram_sensitivity == pytest.approx(bg, rel=1e-8)
    assert plan.gram_sensitivity <= math.sqrt(2) * z2 * (1 + 1e-8)  # never above the general bound


@pytest.mark.parametrize("d, L", [(6, 2), (7, 3), (5, 1), (4, 3)])
def test_sensitivities_of_binary_event_records_by_brute_force(d, L):
    """Binary records with at most L ones (Z = sqrt(L)): every pair of records."""
    import itertools
    rows = [r for r in itertools.product((0.0, 1.0), repeat=d) if sum(r) <= L]
    P = np.array(rows)
    bx, bg = _brute_force_max(P)
    assert bx**2 == pytest.approx(min(2 * L, d))
    R = draw_projection_matrix(d, 8, 5)
    smax = float(np.linalg.norm(R, 2))
    ps = core.projection_sensitivity(R, math.sqrt(L))
    gs = core.gram_sensitivity(d, math.sqrt(L))
    assert ps >= bx * smax and ps == pytest.approx(bx * smax, rel=1e-8)
    assert gs >= bg
    if d >= 2 * L:
        assert bg**2 == pytest.approx(L * (L + 1))
        assert gs == pytest.approx(bg, rel=1e-8)


def test_sensitivity_is_below_the_old_loose_bounds():
    """2 Z and sqrt(2) Z^2 (any real rows) are the general bounds; the box gives about half."""
    for d in (2, 10, 30):
        z = math.sqrt(d)
        assert core.difference_bound_sq(d, z) == pytest.approx(d)
        assert core.gram_bound_sq(d, z) == pytest.approx(d * (d + 1) / 2)
        assert math.sqrt(core.gram_bound_sq(d, z)) < math.sqrt(2) * z**2
        z = math.sqrt(d + 1)
        assert core.difference_bound_sq(d, z, 2, 1.0) == pytest.approx(d + 2)
        assert core.gram_bound_sq(d, z, 2, 1.0) == pytest.approx(d * (d + 1) / 2 + d + 2)


@pytest.mark.parametrize("d, scale", [(3, 2.0), (2, 0.5), (3, 1.5)])
def test_gram_sensitivity_with_other_label_scales_by_brute_force(d, scale):
    """label_scale != 1: the worst pair can share features (s = 2, d = 3: x and y all ones,
    different classes: 2 s^2 d + 2 s^4 = 56)."""
    P, plan, R = _domain_points(d, 2, None, label_scale=scale)
    bx, bg = _brute_force_max(P)
    assert plan.gram_sensitivity >= bg and plan.gram_sensitivity == pytest.approx(bg, rel=1e-8)
    assert bx**2 == pytest.approx(d + 2 * scale**2)
    assert plan.projection_sensitivity == pytest.approx(bx * np.linalg.norm(R, 2), rel=1e-8)
    if (d, scale) == (3, 2.0):
        assert bg**2 == pytest.approx(56.0)


def test_clipping_enforces_sensitivities_on_neighbours():
    d = 5
    plan, R = _plan(d=d, row_bound=1.2, lower=[-1.0] * d, upper=[3.0] * d)
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 3, size=(50, d))
    iu = np.triu_indices(d)
    for bad in (np.full(d, 1e6), np.full(d, -1e6), rng.normal(0, 100, d), np.array([3, -1, 3, -1, 3.0])):
        Y = X.copy()
        Y[7] = bad
        Xp, _ = core.prepare_rows(X, plan)
        Yp, counts = core.prepare_rows(Y, plan)
        assert np.linalg.norm(Yp, axis=1).max() <= 1.2 * (1 + 1e-12)
        gdiff = (Xp.T @ Xp - Yp.T @ Yp)[iu]
        assert np.linalg.norm(gdiff) <= plan.gram_sensitivity
        pdiff = Xp @ R - Yp @ R
        assert np.linalg.norm(pdiff) <= plan.projection_sensitivity
        assert np.count_nonzero(np.abs(pdiff).sum(1) > 1e-12) == 1
        assert counts.norm_clipped > 0


# ---- budget and accounting -------------------------------------------------------------------

@pytest.mark.parametrize("eps", [1.0, 4.0, 8.0])
def test_budget_split_is_exact_and_composes_to_epsilon(eps):
    delta = 1e-4
    mu = core.split_budget(eps, delta, (0.8, 0.2))
    assert mu["total"] == pytest.approx(gdp_mu_for(eps, delta))
    assert mu["projection"] ** 2 + mu["gram"] ** 2 <= mu["total"] ** 2
    assert mu["projection"] ** 2 / mu["total"] ** 2 == pytest.approx(0.8, rel=1e-9)
    plan, _ = _plan(epsilon=eps, delta=delta)
    got = epsilon_of(plan.dp_event(), delta)
    assert got <= eps * (1 + 1e-3)
    assert got >= eps * 0.97  # the budget is not wasted either
    # the noise objects themselves are at least as noisy as the recorded events
    g = plan.gram_noise(10_000)
    real = compose([plan.projection_noise.dp_event(), g.dp_event()])
    assert epsilon_of(real, delta) <= eps * (1 + 1e-3)
    assert plan.projection_noise.dp_event().noise_multiplier >= 1 / mu["projection"]
    assert g.dp_event().noise_multiplier >= 1 / mu["gram"]


def test_noise_scales_match_sensitivity_over_mu():
    plan, R = _plan(d=6, epsilon=3.0, delta=1e-6, row_bound=1.5)
    smax = np.linalg.norm(R, 2)
    # Z^2 = 2.25 <= d / 2: two disjoint rows of norm Z, ||x - y|| = sqrt(2) Z;
    # Gram: 2 ||triu(x x^T)||^2 = Z^4 + (1 + 1 + 0.25^2) for x = (1, 1, 0.5, 0, ...)
    assert plan.projection_noise.std == pytest.approx(math.sqrt(2) * 1.5 * smax / plan.mu["projection"],
                                                      rel=1e-6)
    g = plan.gram_noise(1000)
    assert g.std == pytest.approx(math.sqrt(1.5**4 + 2.0625) / plan.mu["gram"], rel=1e-6)


def test_gram_noise_grid_holds_large_tables():
    plan, _ = _plan(d=8, epsilon=1.0, delta=1e-6)
    n = 10**9
    g = plan.gram_noise(n)
    assert g.max_abs_value >= n * plan.row_bound**2
    assert g.dp_event().noise_multiplier >= 1 / plan.mu["gram"]
    assert g.std == pytest.approx(plan.gram_sensitivity / plan.mu["gram"], rel=1e-6)
    C = np.full((8, 8), n * plan.row_bound**2 * 0.99)
    out = core.noisy_grams([C], g, stream(1, 2))[0]
    assert np.all(out == out.T)


def test_dp_mean_adds_a_third_event():
    plan, _ = _plan(epsilon=2.0, delta=1e-5, fill="dp-mean")
    ev = plan.dp_event()
    assert len(ev.events) == 3
    assert sum(m ** -2 for m in (e.noise_multiplier for e in ev.events)) <= plan.mu["total"] ** 2 * (1 + 1e-9)
    assert epsilon_of(ev, 1e-5) <= 2.0 * (1 + 1e-3)


# ---- statistics, reconstruction ---------------------------------------------------------------

def test_gram_partial_equals_numpy_per_group():
    rng = np.random.default_rng(2)
    X = rng.random((300, 4))
    groups = rng.integers(0, 3, 300)
    tot = core.gram_partial(X[:100], groups[:100], 3) + core.gram_partial(X[100:], groups[100:], 3)
    counts, grams = core.gram_from_partial(tot, 4, 3)
    for g in range(3):
        Xg = X[groups == g]
        assert counts[g] == len(Xg)
        np.testing.assert_allclose(grams[g], Xg.T @ Xg, rtol=1e-13)


def test_reconstruction_matrix_matches_pinv_formula():
    rng = np.random.default_rng(4)
    d, k1, k2 = 6, 16, 4
    A = rng.standard_normal((40, d))
    C = A.T @ A
    R = draw_projection_matrix(d, k1, 5)
    M, smin = core.reconstruction_matrix(C, R, k2)
    U, s, _ = np.linalg.svd(C)
    Vk = U[:, :k2]
    ref = np.linalg.pinv(Vk.T @ R) @ Vk.T
    np.testing.assert_allclose(M, ref, atol=1e-10)
    assert smin == pytest.approx(np.linalg.svd(Vk.T @ R, compute_uv=False)[-1])


@pytest.mark.parametrize("rank,k2", [(2, 3), (3, 3)])
def test_reconstruction_exact_without_noise_on_low_rank_data(rank, k2):
    rng = np.random.default_rng(rank)
    d = 6
    W = rng.random((rank, d))
    X = rng.random((500, rank)) @ W
    X /= X.max()  # inside [0, 1]: no clipping
    Xo, _, _ = _release(X, epsilon=1.0, delta=1e-5, lower=[0.0] * d, upper=[1.0] * d, k2=k2,
                        _noise_free=True)
    np.testing.assert_allclose(Xo, X, atol=1e-9)
    # rank above k2 is not reproduced: the test can fail
    X3 = rng.random((500, d))
    X3o, _, _ = _release(X3, epsilon=1.0, delta=1e-5, lower=[0.0] * d, upper=[1.0] * d, k2=2, _noise_free=True)
    assert np.abs(X3o - X3).max() > 0.05


def test_scaling_round_trip_integer_columns_and_private_labels():
    rng = np.random.default_rng(8)
    n, d = 400, 4
    lower, upper = [-5.0, 10.0, 0.0, 18.0], [5.0, 20.0, 1.0, 90.0]
    X = np.column_stack([rng.uniform(-5, 5, n), rng.uniform(10, 20, n), rng.random(n),
                         rng.integers(18, 91, n).astype(float)])
    y = np.where(X[:, 0] > 0, "sick", "well")
    Xo, yo, rel = _release(X, y, labels="private", classes=["well", "sick"], epsilon=1.0, delta=1e-5,
                           lower=lower, upper=upper, k2=d + 2, integer_columns=[3], _noise_free=True)
    np.testing.assert_allclose(Xo, X, atol=1e-9)
    assert np.all(Xo[:, 3] == np.rint(Xo[:, 3]))
    assert (yo == y).all()
    assert rel.public["k2"] == d + 2 and rel.public["integer_columns_rounded"] == [3]
    assert rel.public["row_bound"] == pytest.approx(math.sqrt(d + 1))


def test_private_label_block_inside_row_bound():
    plan, _ = _plan(d=3, labels="private", classes=(0, 1, 2), label_scale=2.0)
    Xp, counts = core.prepare_rows(np.ones((4, 3)), plan, np.array([0, 1, 2, 1]))
    assert np.allclose(np.linalg.norm(Xp, axis=1), math.sqrt(3 + 4))
    assert plan.row_bound == pytest.approx(math.sqrt(7)) and counts.norm_clipped == 0
    np.testing.assert_array_equal(Xp[:, 3:], [[2, 0, 0], [0, 2, 0], [0, 0, 2], [0, 2, 0]])


def test_public_labels_run_per_class_and_release_sizes():
    rng = np.random.default_rng(9)
    X = np.vstack([rng.random((300, 5)) * 0.3, 0.7 + rng.random((200, 5)) * 0.3])
    y = np.array([0] * 300 + [1] * 200)
    _, yo, rel = _release(X, y, labels="public", epsilon=4.0, delta=1e-4, lower=[0.0] * 5, upper=[1.0] * 5)
    assert rel.public["class_sizes"] == {"0": 300, "1": 200}
    assert (yo == y).all()
    nolab = release_dprp_array(X, epsilon=4.0, delta=1e-4, lower=[0.0] * 5, upper=[1.0] * 5)
    # parallel composition: the event of the labelled release is that of ONE run
    assert rel.event == nolab.event
    assert rel.epsilon == pytest.approx(nolab.epsilon) and rel.epsilon <= 4.0 * (1 + 1e-3)
    # noise-free per-class reconstruction of rank-1-per-class data is exact
    Z = np.vstack([np.outer(rng.random(300), rng.random(5)), np.outer(rng.random(200), rng.random(5))])
    Zo, _, _ = _release(Z, y, labels="public", epsilon=4.0, delta=1e-4, lower=[0.0] * 5,
                        upper=[1.0] * 5, k2=1, _noise_free=True)
    np.testing.assert_allclose(Zo, Z, atol=1e-9)


def test_dp_mean_fill_noise_free_is_the_mean_and_noisy_is_not():
    rng = np.random.default_rng(10)
    X = rng.random((1000, 3))
    X[::7, 1] = np.nan
    mean = np.nanmean(X[:, 1])
    Xo, _, _ = _release(X, epsilon=1.0, delta=1e-5, lower=[0.0] * 3, upper=[1.0] * 3, k2=3,
                        fill="dp-mean", _noise_free=True)
    np.testing.assert_allclose(Xo[::7, 1], mean, atol=1e-9)
    plan, _ = _plan(d=3, fill="dp-mean", epsilon=1.0)
    nz = plan.impute_noise(1000)
    assert nz.std == pytest.approx(math.sqrt(6) / plan.mu["impute"], rel=1e-6)
    tot = core.impute_partial(np.nan_to_num(X), np.isnan(X), plan)
    assert tot[-1] == 1000 and tot[3 + 1] == np.count_nonzero(~np.isnan(X[:, 1]))
    means = [core.dp_column_means(tot, nz, stream(s, 3), plan)[1] for s in range(200)]
    assert np.std(means) > 1e-4  # noise is added (never the plain data mean)


# ---- noise --------------------------------------------------------------------------------------

def test_gram_noise_is_symmetric_with_the_planned_variance():
    plan, _ = _plan(d=12, epsilon=2.0)
    g = plan.gram_noise(100)
    iu = np.triu_indices(12)
    draws = []
    for s in range(30):
        N = core.noisy_grams([np.zeros((12, 12))], g, stream(s, 2))[0]
        np.testing.assert_array_equal(N, N.T)
        draws.append(N[iu])
    draws = np.concatenate(draws)  # 2340 independent draws
    assert draws.var() == pytest.approx(g.variance, rel=0.1)
    assert abs(draws.mean()) < 4 * g.std / math.sqrt(draws.size)


def test_row_noise_has_the_planned_variance():
    plan, R = _plan(d=5)
    Ms = [np.eye(plan.k1)]  # identity read-out: the noisy projection itself
    Xp = np.zeros((2000, plan.d_aug))
    P = core.reconstruct_rows(Xp, R, Ms, None, plan.projection_noise, stream(1, 1, 0))
    assert P.var() == pytest.approx(plan.projection_noise.variance, rel=0.05)


# ---- defaults, warnings, errors ------------------------------------------------------------------

def test_defaults():
    assert core.default_k2(11) == 7 and core.default_k2(1) == 1 and core.default_k2(64) == 38
    assert core.default_k1(7) == 28
    plan, _ = _plan(d=10)
    assert (plan.k2, plan.k1) == (6, 24)


def test_warns_when_k1_amplifies_noise(caplog):
    with caplog.at_level(logging.WARNING, logger="sparkpriv.mechanisms.dprp"):
        _plan(d=10, k1=6, k2=6)
    assert any("k1 = 6 < 4 k2" in r.getMessage() for r in caplog.records)


_BASE = dict(epsilon=1.0, delta=1e-5, lower=[0.0] * 3, upper=[1.0] * 3)


@pytest.mark.parametrize("kw,msg", [
    ({"delta": 0.0}, "'delta' parameter of release_dprp must be in \\(0, 1\\)"),
    ({"delta": 1.0}, "'delta'"),
    ({"epsilon": -1.0}, "'epsilon'"),
    ({"lower": None}, "needs declared public per-column bounds"),
    ({"upper": None}, "needs declared public per-column bounds"),
    ({"k2": 4}, "'k2' parameter .* range \\[1, 3\\]"),
    ({"k2": 3, "k1": 2}, "'k1' parameter .* at least k2 = 3"),
    ({"budget_split": (0.8, 0.3)}, "'budget_split'"),
    ({"budget_split": (1.0, 0.0)}, "'budget_split'"),
    ({"budget_split": (0.5, 0.25, 0.25)}, "'budget_split'"),
    ({"budget_split": "0.8"}, "'budget_split'"),
    ({"fill": "mean"}, "'fill'"),
    ({"row_bound": 0.0}, "'row_bound'"),
    ({"neighbors": "add-remove"}, "'neighbors'"),
    ({"lower": [0.0, 0.0, 1.0]}, "upper bound .* must exceed"),
])
def test_bad_parameters(kw, msg):
    X = np.random.default_rng(0).random((20, 3))
    with pytest.raises(ParameterError, match=msg):
        release_dprp_array(X, **{**_BASE, **kw})


def test_label_errors():
    X = np.random.default_rng(0).random((20, 3))
    with pytest.raises(ParameterError, match="one class only"):
        release_dprp_array(X, np.zeros(20), labels="public", **_BASE)
    with pytest.raises(ParameterError, match="at least two distinct"):
        release_dprp_array(X, np.zeros(20), labels="private", classes=[0], **_BASE)
    with pytest.raises(ParameterError, match="'classes' parameter .* required with a label column"):
        release_dprp_array(X, np.arange(20) % 2, labels="private", **_BASE)
    with pytest.raises(ParameterError, match="declare them labels='public'"):
        release_dprp_array(X, np.arange(20) % 2, **_BASE)
    with pytest.raises(InputError, match="not a declared class"):
        release_dprp_array(X, np.arange(20) % 3, labels="private", classes=[0, 1], **_BASE)


def test_missing_values_are_replaced_by_the_centre_of_the_box_or_the_fill():
    from sparkpriv.privacy.random import insecure_fixed_seed

    X = np.random.default_rng(0).random((20, 3))
    for bad in (np.nan, np.inf):
        Xb = X.copy()
        Xb[3, 2] = bad
        for fill, expect in ((None, 0.5), (0.25, 0.25)):  # the box is [0, 1]: its centre is 0.5
            Xe = X.copy()
            Xe[3, 2] = expect
            with insecure_fixed_seed(3):
                a = release_dprp_array(Xb, **_BASE, **({} if fill is None else {"fill": fill}))
            with insecure_fixed_seed(3):
                b = release_dprp_array(Xe, **_BASE, **({} if fill is None else {"fill": fill}))
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
            assert np.isfinite(a.to_numpy()).all()


def test_nominal_event_is_gaussian_per_step():
    plan, _ = _plan(epsilon=1.0)
    ev = plan.dp_event()
    assert [type(e) for e in ev.events] == [dp_event.GaussianDpEvent] * 2
    assert ev.events[0].noise_multiplier == pytest.approx(1 / plan.mu["projection"])


# ---- sparse event records --------------------------------------------------------------------------

def _sparse_records(n, d, max_items, seed):
    from sparkpriv.mechanisms.sparse import sparse_rows_from_lists

    rng = np.random.default_rng(seed)
    lists = [sorted(rng.choice(d, int(rng.integers(0, max_items + 1)), replace=False).tolist())
             for _ in range(n)]
    return sparse_rows_from_lists(lists)


@pytest.mark.parametrize("cap", [None, 4.0, 3.0])  # binary; counts capped at 4 (dyadic) and at 3
def test_gram_partial_sparse_equals_gram_partial_of_densified_rows(cap):
    from sparkpriv.mechanisms.sparse import densify_rows

    d = 40
    off, idx = _sparse_records(250, d, 7, seed=11)  # includes empty records
    vals = None if cap is None else np.random.default_rng(12).integers(1, int(cap) + 1, idx.size).astype(float)
    c = 1.0 if cap is None else cap
    got = rcore.gram_partial_sparse(off, idx, vals, d, c)
    ref = core.gram_partial(densify_rows(off, idx, vals, d) / c, None, 1)
    assert got.shape == ref.shape == (1 + d * (d + 1) // 2,)
    if c in (1.0, 4.0):  # every product and sum is exact: equal in every bit
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-14, atol=0)
    # and an independent hand count for binary records: entry (i, j) = people with both items
    if cap is None:
        sets = [set(idx[off[r]:off[r + 1]].tolist()) for r in range(off.size - 1)]
        _, (G,) = core.gram_from_partial(got, d, 1)
        for i, j in ((0, 0), (3, 17), (17, 3), (39, 39), (5, 38)):
            assert G[i, j] == sum(i in s and j in s for s in sets)
    # batches sum, an empty batch adds nothing but its zero count
    half = int(off[125])
    two = (rcore.gram_partial_sparse(off[:126], idx[:half], None if vals is None else vals[:half], d, c)
           + rcore.gram_partial_sparse(off[125:] - half, idx[half:], None if vals is None else vals[half:], d, c))
    np.testing.assert_allclose(two, got, rtol=1e-14)
    empty = rcore.gram_partial_sparse(np.zeros(1, np.int64), np.zeros(0, np.int32), None, d)
    assert not empty.any()


@pytest.mark.parametrize("counts", [False, True])
def test_reconstruct_sparse_items_equals_dense_threshold_in_chunks(counts):
    from sparkpriv.mechanisms.sparse import densify_rows

    d, k1, c = 30, 48, (3.0 if counts else 1.0)
    off, idx = _sparse_records(90, d, 6, seed=13)
    vals = np.random.default_rng(14).integers(1, 4, idx.size).astype(float) if counts else None
    R = draw_projection_matrix(d, k1, 15)
    M = np.random.default_rng(16).standard_normal((k1, d)) * 0.6
    thr = 0.5
    o, items = rcore.reconstruct_sparse_items(off, idx, vals, R, M, None, None, value_cap=c,
                                             threshold=thr, chunk_rows=7)
    # independent: dense rows on the [0, 1] scale, X' = c (X R) M in record units, thresholded
    Xr = c * ((densify_rows(off, idx, vals, d) / c) @ R @ M)
    assert np.abs(Xr - thr).min() > 1e-9  # no value so close to the threshold that rounding decides
    assert o.dtype == np.int64 and items.dtype == np.int32 and o.size == 91
    for r in range(90):
        np.testing.assert_array_equal(items[o[r]:o[r + 1]], np.flatnonzero(Xr[r] >= thr))
    assert 0 < items.size < 90 * d


def test_reconstruct_sparse_items_returns_the_records_through_a_full_rank_readout():
    d, k1 = 25, 60
    off, idx = _sparse_records(120, d, 5, seed=17)
    R = draw_projection_matrix(d, k1, 18)
    M = np.linalg.pinv(R)  # (k1, d): R M = I_d, so X R M = X
    o, items = rcore.reconstruct_sparse_items(off, idx, None, R, M, None, None)
    np.testing.assert_array_equal(o, off)
    np.testing.assert_array_equal(items, idx)


def test_reconstruct_sparse_items_adds_the_row_noise_of_the_table_path():
    from sparkpriv.mechanisms.sparse import densify_rows

    d = 20
    plan, R = _plan(d=d, k2=5, k1=20, row_bound=math.sqrt(4), epsilon=50.0)
    off, idx = _sparse_records(200, d, 4, seed=19)
    M = np.linalg.pinv(R)
    o, items = rcore.reconstruct_sparse_items(off, idx, None, R, M, plan.projection_noise, stream(9, 1, 0),
                                             chunk_rows=64)
    ref = core.reconstruct_rows(densify_rows(off, idx, None, d), R, [M], None, plan.projection_noise,
                                stream(9, 1, 0))
    assert np.abs(ref - 0.5).min() > 1e-9
    for r in range(200):
        np.testing.assert_array_equal(items[o[r]:o[r + 1]], np.flatnonzero(ref[r] >= 0.5))
    assert not np.array_equal(items, idx)  # the noise changed some records


def test_default_k2_of_event_records():
    assert rcore.default_k2_records(1303) == 64 and rcore.default_k2_records(30) == 30
    assert core.default_k2(1303) == 782  # the table default, far too large for a vocabulary
