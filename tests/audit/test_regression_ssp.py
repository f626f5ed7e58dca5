"""Audit of AdaSSP regression (method="ssp", docs/math.md section 6.1), replace-one and add-remove.

Each of the release's noise additions is audited against its own recorded event, with a pair of
neighbouring tables that reaches (or, for the moments under replace-one, comes within
``sqrt(4 / 4.25)`` of) the claimed sensitivity. The domain is the L2 ball of radius ``R`` without an
intercept, where the worst pairs are known exactly (tests/mechanisms/test_regression_ssp.py
enumerates the others):

* smallest eigenvalue (one feature): ``x = R`` against ``x = 0`` (replace-one) or against the
  record removed (add-remove) moves ``lambda_min = sum x^2`` by ``R^2 = B_X^2``;
* Gram matrix (two features): ``R e_1`` against ``R e_2`` (replace-one: ``sqrt(2) R^2``) or removed
  (add-remove: ``R^2``);
* moments (one feature): ``(x, y) = (R, B_Y)`` against ``(R, -B_Y)`` (replace-one: ``2 R B_Y``) or
  removed (add-remove: ``sqrt(1.5) R B_Y``, exact), for the linear and the logistic target;
* the target range's histogram (``target_quantile``): one target moved between two bins
  (replace-one, L1 2) or removed (add-remove, L1 1);
* the logistic passes (``logistic_steps``, docs/math.md section 6.2): the gradient at a steep public
  ``theta`` (two features), ``R v`` with ``s = +1`` against ``R w`` with ``s = -1``, ``v, w`` at
  +-0.02 rad from the axis ``theta`` is orthogonal to (replace-one: ``2 R cos 0.02 ~ 0.9998 (2 R)``),
  or ``R e_1`` removed at ``theta = -50 e_1`` (add-remove: ``R``); the Hessian at ``theta = 0``
  (``w = 1/4``), ``R e_1`` against ``R e_2`` (replace-one: ``sqrt(2) R^2 / 4``, exact) or removed
  (add-remove: ``R^2 / 4``, exact).

The exact values come from the mechanism's own per-block function and :func:`exact_steps`; the
released values are made as :func:`finalize_ssp` makes them (checked draw for draw), then the
release's noise runs ``n`` trials at once. Positive controls: the noise scale cut by 30 %.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.mechanisms import regression as reg
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.random import stream

from ._audit import (N_GAUSS, N_LAPLACE, check, gaussian_game, gaussian_step_claim, grid_integers, laplace_game,
                     trials_of, weaken_noise)

pytestmark = pytest.mark.audit

DELTA = 1e-3
EPS = 3.0
R = 1.0
BY = 1.0
REST2 = np.array([[0.1, -0.2, 0.3], [-0.3, 0.1, -0.1], [0.2, 0.2, 0.05]])  # (x1, x2, y) rows of the others


def _plan(d: int, neighbors: str, model: str = "linear"):
    kw = dict(columns=tuple(f"x{j}" for j in range(d)), target="y", row_bound=R, fit_intercept=False,
              epsilon=EPS, delta=DELTA, neighbors=neighbors, model=model)
    if model == "linear":
        kw.update(target_lower=-BY, target_upper=BY)
    p = reg.RegressionParams(**kw)
    p.validate("audit")
    return reg.plan_ssp(p, d, "audit")


def _tables(step: str, neighbors: str, model: str):
    """``(D, D')`` as ``(rows, d + 1)`` arrays (features, then the target)."""
    if step == "eigenvalue":
        rest = REST2[:, [0, 2]] * 0.0  # the others at 0: lambda_min = sum x^2 moves by R^2
        a, b = np.array([[R, 0.0]]), np.array([[0.0, 0.0]])
    elif step == "gram":
        rest = REST2
        a, b = np.array([[R, 0.0, 0.0]]), np.array([[0.0, R, 0.0]])
    else:
        rest = REST2[:, [0, 2]]
        if model == "logistic":
            rest = np.column_stack([rest[:, 0], np.where(rest[:, 1] > 0, 1.0, 0.0)])
            a, b = np.array([[R, 1.0]]), np.array([[R, 0.0]])  # s = +1 against s = -1
        else:
            a, b = np.array([[R, BY]]), np.array([[R, -BY]])
    D = np.vstack([rest, a])
    Dp = rest if neighbors == "add-remove" else np.vstack([rest, b])
    return D, Dp


STEPS = {"eigenvalue": (1, 0), "gram": (2, 1), "moments": (1, 2)}


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("neighbors", ["replace-one", "add-remove"])
@pytest.mark.parametrize("step,model", [("eigenvalue", "linear"), ("gram", "linear"), ("moments", "linear"),
                                        ("moments", "logistic")])
def test_ssp_statistics(step, model, neighbors, control, monkeypatch):
    if control:
        weaken_noise(monkeypatch)
    d, k = STEPS[step]
    plan = _plan(d, neighbors, model)
    dom = plan.domain
    noises = plan.noises()
    noise = noises[k]
    D, Dp = _tables(step, neighbors, model)
    fn = reg.statistics_fn(dom)
    v_d, v_dp = (reg.exact_steps(fn(T), dom)[k] for T in (D, Dp))
    if step == "gram":  # the released values: the upper triangle, one draw per entry
        iu = np.triu_indices(v_d.shape[0])
        v_d, v_dp = v_d[iu], v_dp[iu]
    claimed = (reg.eigen_sensitivity(dom), reg.gram_sensitivity(dom, neighbors),
               reg.moment_sensitivity(dom, neighbors))[k]
    assert noise.sensitivity == pytest.approx(claimed, rel=1e-12)
    gap = float(np.linalg.norm(v_d - v_dp))
    floor = np.sqrt(4 / 4.25) if (step == "moments" and neighbors == "replace-one") else 1.0
    assert claimed * floor * (1 - 1e-9) <= gap <= claimed * (1 + 1e-12)
    # the release's values are these, noised draw for draw as finalize_ssp noises them
    st, _ = reg.finalize_ssp(fn(D), plan, dom, 5, tuple(f"x{j}" for j in range(d)))
    got = (np.array([st.lambda_min]), st.gram[np.triu_indices(d)], st.xy)[k]
    stage = (reg._ssp.EIGEN_STAGE, reg._ssp.GRAM_STAGE, reg._ssp.MOMENT_STAGE)[k]
    ref = nz.add_noise(v_d, noise, stream(5, stage))
    np.testing.assert_array_equal(got, ref[:got.size])
    g = noise.grid
    u = np.rint(v_d / g).astype(np.int64)
    up = np.rint(v_dp / g).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(v_d, N_GAUSS), noise, stream(61, 1)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(v_dp, N_GAUSS), noise, stream(62, 1)), g)
    event = plan.events()[k]
    eps_claim, mu_claim = gaussian_step_claim(event, DELTA)
    res = gaussian_game(f"regression ssp {step} ({model}), {neighbors}", I_d, I_dp, u, up, noise.sigma, eps_claim,
                        DELTA, mu_claim, control=control)
    check(res)


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("neighbors", ["replace-one", "add-remove"])
def test_ssp_target_histogram(neighbors, control, monkeypatch):
    p = reg.RegressionParams(columns=("x0",), target="y", row_bound=R, target_quantile=0.9, epsilon=EPS,
                             delta=DELTA, neighbors=neighbors, target_search=(-3, 6))
    p.validate("audit")
    plan = reg.plan_ssp(p, 1, "audit")
    eps_claim = 1.0 / plan.events()[0].noise_multiplier  # the recorded event (before any weakening)
    if control:
        weaken_noise(monkeypatch)
        plan = reg.plan_ssp(p, 1, "audit")
    noise = plan.histogram
    assert noise.sensitivity == (1.0 if neighbors == "add-remove" else 2.0)
    fn = reg.target_histogram_fn(plan.domain, plan.candidates)
    rest = np.array([[0.0, 0.3], [0.1, -2.0], [0.2, 5.0]])
    D = np.vstack([rest, [[0.0, 0.6]]])
    Dp = rest if neighbors == "add-remove" else np.vstack([rest, [[0.0, -40.0]]])
    v_d, v_dp = fn(D), fn(Dp)
    assert np.abs(v_d - v_dp).sum() == noise.sensitivity
    g = noise.grid
    u = np.rint(v_d / g).astype(np.int64)
    up = np.rint(v_dp / g).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(v_d, N_LAPLACE), noise, stream(63, 1)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(v_dp, N_LAPLACE), noise, stream(64, 1)), g)
    res = laplace_game(f"regression ssp target range histogram, {neighbors}", I_d, I_dp, u, up, eps_claim,
                       control=control)
    check(res)


@pytest.mark.parametrize("neighbors", ["replace-one", "add-remove"])
def test_ssp_accounted_epsilon_within_request(neighbors):
    from sparkpriv.privacy.accounting import epsilon_of

    plan = _plan(2, neighbors)
    assert epsilon_of(plan.dp_event(), DELTA) <= EPS


def _logistic_pass_tables(step: str, neighbors: str):
    """``(D, D', theta)`` of a logistic pass: rows ``(x1, x2, class)``."""
    rest = np.array([[0.1, -0.2, 1.0], [-0.3, 0.1, 0.0], [0.2, 0.2, 1.0]])
    if step == "gradient":
        if neighbors == "add-remove":
            a, b, theta = np.array([[R, 0.0, 1.0]]), None, np.array([-50.0, 0.0])
        else:
            c, s_ = np.cos(0.02), np.sin(0.02)
            a, b, theta = np.array([[R * c, R * s_, 1.0]]), np.array([[R * c, -R * s_, 0.0]]), np.array([0.0, -5000.0])
    else:
        a, b, theta = np.array([[R, 0.0, 1.0]]), np.array([[0.0, R, 1.0]]), np.zeros(2)
    D = np.vstack([rest, a])
    Dp = rest if neighbors == "add-remove" else np.vstack([rest, b])
    return D, Dp, theta


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("neighbors", ["replace-one", "add-remove"])
@pytest.mark.parametrize("step", ["gradient", "hessian"])
def test_ssp_logistic_passes(step, neighbors, control, monkeypatch):
    if control:
        weaken_noise(monkeypatch)
    plan = _plan(2, neighbors, "logistic")
    assert plan.steps == 5
    dom = plan.domain
    ng, nh = plan.step_noises()
    noise = ng if step == "gradient" else nh
    D, Dp, theta = _logistic_pass_tables(step, neighbors)
    fn = reg.logistic_pass_fn(dom, theta, True)
    dz = dom.dz
    iu = np.triu_indices(dz)

    def values(T):
        v = fn(T)
        return v[:dz] if step == "gradient" else v[dz:].reshape(dz, dz)[iu]

    v_d, v_dp = values(D), values(Dp)
    claimed = (reg.gradient_sensitivity if step == "gradient" else reg.hessian_sensitivity)(dom, neighbors)
    assert noise.sensitivity == pytest.approx(claimed, rel=1e-12)
    gap = float(np.linalg.norm(v_d - v_dp))
    floor = 0.999 if (step == "gradient" and neighbors == "replace-one") else 1.0
    assert claimed * floor * (1 - 1e-9) <= gap <= claimed * (1 + 1e-12)
    # the release's values are these, noised draw for draw as finalize_logistic_pass noises them
    g, H, _ = reg.finalize_logistic_pass(fn(D), plan, dom, 5, 4, True)
    got = g if step == "gradient" else H[iu]
    ref = (nz.add_noise(v_d, noise, stream(5, reg._ssp.GRADIENT_STAGE, 4)) if step == "gradient" else
           nz.add_noise_symmetric(fn(D)[dz:].reshape(dz, dz), noise, stream(5, reg._ssp.HESSIAN_STAGE))[iu])
    np.testing.assert_array_equal(got, ref)
    gr = noise.grid
    u = np.rint(v_d / gr).astype(np.int64)
    up = np.rint(v_dp / gr).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(v_d, N_GAUSS), noise, stream(65, 1)), gr)
    I_dp = grid_integers(nz.add_noise(trials_of(v_dp, N_GAUSS), noise, stream(66, 1)), gr)
    event = plan.events()[3 if step == "gradient" else -1]
    eps_claim, mu_claim = gaussian_step_claim(event, DELTA)
    res = gaussian_game(f"regression ssp logistic {step} pass, {neighbors}", I_d, I_dp, u, up, noise.sigma,
                        eps_claim, DELTA, mu_claim, control=control)
    check(res)
