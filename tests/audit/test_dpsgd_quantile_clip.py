"""Audit of one quantile-clipping DP-SGD step (sparkpriv.mechanisms.dpsgd.dp_step_quantile;
docs/math.md section 5.1): the noisy clipped sum and the noisy count of unclipped gradients,
released together.

Identity model (a record's gradient is the record), clip ``C``, full batch (``q = 1``, where the
recorded event ``Gaussian(z_eff)`` is exact for the worst pair), five records of zero gradient
(counted). The canary ``x = C e1`` has norm exactly ``C``: unclipped and counted; its replacement
``x' = -3 C e1`` is clipped to ``-C e1`` and not counted. So the sum moves by ``2C`` and the count
by 1: the worst replace-one pair, ``mu = sqrt(4/sigma^2 + 1/sigma_b^2) = 1 / z_eff``.
``dp_step_quantile`` is checked bit for bit against the auditor's own computation, then ``n``
trials per side are drawn at once. The statistic is the likelihood-ratio direction of the two
independent discrete Gaussians (sum and count, each in its own grid units, scaled by its sigma);
the threshold is fixed from the known ``mu`` before the trials.

* mechanism: the measured lower bounds stay below the claim;
* control (noise x0.7, the claim kept): detected;
* the count left out of the claim (the gradient's ``Gaussian(sigma / 2)`` alone): detected, so
  the audit sees the count's share of the privacy (20 % of ``mu^2`` here).

At ``q = 0.5`` (the canary alone; one coin samples its gradient and its count) the recorded
event dominates the true pair with slack, as for the declared clip: the mechanism side only.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparkpriv.mechanisms import dpsgd
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.calibration import gdp_epsilon_delta
from sparkpriv.privacy.random import stream
from tests.dpsgd_models import Identity as _Identity

from ._audit import (N_GAUSS, AuditResult, best_gaussian_threshold, check, eps_lower_bound, grid_integers,
                     mu_lower_bound, trials_of, weaken_noise)

pytestmark = pytest.mark.audit

DELTA = 1e-3
C = 1.0
P_DIM = 3
N = N_GAUSS
SHARE = 0.2  # the count's share of the step's 1/z^2: large enough to be seen
Z_EFF = 1.0 / 0.388
SIGMA = 2.0 * Z_EFF / math.sqrt(1.0 - SHARE)  # the gradient multiplier (noise SIGMA C)
SIGMA_B = dpsgd.count_noise_std(SIGMA, SHARE)
REST = np.zeros((5, P_DIM))
CANARY = np.array([C, 0.0, 0.0])  # norm exactly C: unclipped, counted
REPLACEMENT = np.array([-3.0 * C, 0.0, 0.0])  # clipped to -C e1, not counted


def Identity():
    """The per-example gradient is the record itself (``P_DIM`` columns)."""
    return _Identity(P_DIM)


def _adaptive():
    return dpsgd.QuantileClip(0.5, 0.2, dpsgd.gradient_noise(noise_multiplier=SIGMA, dim=P_DIM, max_rows=100),
                              dpsgd.count_noise(count_std=SIGMA_B, max_rows=100))


def _check_step_matches(ad: dpsgd.QuantileClip, canary: np.ndarray, count: int):
    """dp_step_quantile's release is the auditor's clipped sum and count plus the keyed noises."""
    X = np.vstack([REST, canary])
    g, _, b, cnt = dpsgd.dp_step_quantile(Identity(), X, np.zeros(P_DIM), None, clip=C, sampling_rate=1.0,
                                          adaptive=ad, n_pub=6.0, seed=9, cluster=0, step=1)
    gn = ad.gradient_noise
    s = canary * min(1.0, C / float(np.linalg.norm(canary)))
    assert b == 6
    assert np.array_equal(g, C * nz.add_noise(s / C, gn, stream(9, dpsgd.NOISE_STAGE, 0, 1)) / 6.0)
    assert cnt == nz.add_noise(np.array([float(count)]), ad.count_noise, stream(9, dpsgd.COUNT_STAGE, 0, 1))[0]
    return gn


def _trials(gn, cn, v, count, seed):
    """``n`` releases of one side: the integers of the noisy sum over C (n, p) and of the noisy
    count (n,)."""
    I_s = grid_integers(nz.add_noise(trials_of(v / C, N), gn, stream(seed, dpsgd.NOISE_STAGE)), gn.grid)
    I_c = grid_integers(nz.add_noise(np.full(N, float(count)), cn, stream(seed, dpsgd.COUNT_STAGE)), cn.grid)
    return I_s, I_c


def _statistic(I_s, I_c, us, ups, uc, upc, gn, cn):
    """``(T, mu)``: the projection on the (scaled) difference of the two sides' centres."""
    d = np.concatenate([(us - ups) / gn.sigma, [(uc - upc) / cn.sigma]])
    mu = float(np.linalg.norm(d))
    Y = np.column_stack([(I_s - ups) / gn.sigma, (I_c - upc) / cn.sigma])
    return (Y @ d) / mu, mu


@pytest.mark.parametrize("kind", ["mechanism", "control", "count-unaccounted"])
def test_quantile_clip_step_full_batch_replace_one(kind, monkeypatch):
    z = dpsgd.quantile_step_multiplier(SIGMA, SIGMA_B)
    assert z == pytest.approx(Z_EFF, rel=1e-12)
    event = dpsgd.quantile_event(1.0, SIGMA, SIGMA_B, 1)  # what a release records for the step
    if kind == "count-unaccounted":  # the claim a release would make if it forgot the count
        event = dpsgd.dpsgd_event(1.0, SIGMA, 1, "replace-one")
        mu_claim = 2.0 / SIGMA
    else:
        mu_claim = 1.0 / z
    eps_claim = epsilon_of(event, DELTA)
    assert eps_claim == pytest.approx(gdp_epsilon_delta(mu_claim, DELTA), rel=2e-3)
    if kind == "control":  # the claim stays; the noises drawn are 0.7x
        weaken_noise(monkeypatch)
    ad = _adaptive()
    gn = _check_step_matches(ad, CANARY, 6)
    _check_step_matches(ad, REPLACEMENT, 5)
    cn = ad.count_noise
    v_d, v_dp = CANARY, -CANARY  # the clipped canary and the clipped replacement
    us, ups = np.rint(v_d / C / gn.grid), np.rint(v_dp / C / gn.grid)
    uc, upc = np.rint(6.0 / cn.grid), np.rint(5.0 / cn.grid)
    I_s, I_c = _trials(gn, cn, v_d, 6, 71)
    J_s, J_c = _trials(gn, cn, v_dp, 5, 72)
    T_d, mu = _statistic(I_s, I_c, us, ups, uc, upc, gn, cn)
    T_dp, _ = _statistic(J_s, J_c, us, ups, uc, upc, gn, cn)
    c = best_gaussian_threshold(mu, N, DELTA)
    eps_lb = eps_lower_bound(int((T_d >= c).sum()), int((T_dp >= c).sum()), N, DELTA)
    mu_lb = mu_lower_bound(int((T_d >= mu / 2).sum()), int((T_dp >= mu / 2).sum()), N)
    res = AuditResult("DP-SGD quantile-clipping step (sum + count), q = 1, replace-one (canary)", N,
                      float(eps_claim), eps_lb, DELTA, float(mu_claim), mu_lb, control=kind != "mechanism",
                      extra={"mu_true": mu, "threshold": c},
                      control_kind="noise x0.7" if kind == "control" else "count left out of the claim")
    check(res)


def test_quantile_clip_step_sampled_replace_one_within_claim():
    """q = 0.5, the canary alone (the same coin samples its gradient and its count): the recorded
    event (add/remove PoissonSampled(q, Gaussian(z_eff))) dominates the true pair with slack, as for
    the declared clip, so only the mechanism side is asserted. The statistic is the projection on
    the difference of the two sampled centres (scaled units: unit noise); its mixtures are known
    (centres 0 and the projections of the sampled centres, weights 1 - q and q)."""
    from .test_dpsgd import mixture_game

    q = 0.5
    ad = _adaptive()
    gn, cn = ad.gradient_noise, ad.count_noise
    eps_claim = epsilon_of(dpsgd.quantile_event(q, SIGMA, SIGMA_B, 1), DELTA)
    # dp_step_quantile on the canary alone is the auditor's computation (sampled or not)
    for canary, counted in ((CANARY, 1), (REPLACEMENT, 0)):
        g, _, b, cnt = dpsgd.dp_step_quantile(Identity(), canary[None, :], np.zeros(P_DIM), None, clip=C,
                                              sampling_rate=q, adaptive=ad, n_pub=1.0, seed=9, cluster=0, step=1)
        s = canary * min(1.0, C / float(np.linalg.norm(canary))) * b
        assert np.array_equal(g, C * nz.add_noise(s / C, gn, stream(9, dpsgd.NOISE_STAGE, 0, 1)) / q)
        assert cnt == nz.add_noise(np.array([float(counted * b)]), cn, stream(9, dpsgd.COUNT_STAGE, 0, 1))[0]

    def side(v, count, seed):
        sampled = stream(seed, dpsgd.SAMPLE_STAGE).random(N) < q
        vals = np.where(sampled[:, None], trials_of(v / C, N), 0.0)
        I_s = grid_integers(nz.add_noise(vals, gn, stream(seed, dpsgd.NOISE_STAGE)), gn.grid)
        I_c = grid_integers(nz.add_noise(np.where(sampled, float(count), 0.0), cn, stream(seed, dpsgd.COUNT_STAGE)),
                            cn.grid)
        return np.column_stack([I_s / gn.sigma, I_c / cn.sigma])  # unit noise per coordinate

    b_d = np.concatenate([CANARY / C / gn.grid / gn.sigma, [1.0 / cn.grid / cn.sigma]])  # sampled centres
    b_dp = np.concatenate([-CANARY / C / gn.grid / gn.sigma, [0.0]])
    d = (b_d - b_dp) / np.linalg.norm(b_d - b_dp)
    T_d, T_dp = side(CANARY, 1, 73) @ d, side(-CANARY, 0, 74) @ d
    res = mixture_game("DP-SGD quantile-clipping step (sum + count), q = 0.5, replace-one (canary; claim "
                       "dominates with slack)", T_d, T_dp, ([float(b_d @ d), 0.0], [q, 1 - q]),
                       ([float(b_dp @ d), 0.0], [q, 1 - q]), 1.0, eps_claim, DELTA, False)
    check(res)
