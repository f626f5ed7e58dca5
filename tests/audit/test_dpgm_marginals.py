"""Audit of DPGM's per-item counts (docs/research/dpgm.md, "Calibrating the marginals").

The release noises the ``d`` column sums of the bounded records once, on the driver
(``MarginalPlan.release``). Worst-case replace-one neighbours: the replaced record has ``L``
items and its replacement ``L`` other items, so ``2 L`` counts move by one:
``||c(D) - c(D')|| = sqrt(2 L)``, the sensitivity the noise is calibrated to. The auditor
counts the items itself, checks that the library's release draws the same noise on the same
stream, then runs ``add_noise`` with the plan's noise ``n`` times per side.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparkpriv.mechanisms import dpgm
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.calibration import gdp_epsilon_delta
from sparkpriv.privacy.random import stream

from ._audit import CONTROL_FACTOR, N_GAUSS, _scaled, check, gaussian_game, grid_integers, trials_of

pytestmark = pytest.mark.audit

DELTA = 1e-3
L, D = 3, 8
# marginal_share * epsilon = 1: the audited counts alone are about (1, 1e-3)
PARAMS = dpgm.DPGMParams(epsilon=2.0, delta=DELTA, k=2, kmeans_share=0.3, length_share=0.0, marginal_share=0.5,
                         hidden=2, row_bound=math.sqrt(L))


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
def test_item_counts(control):
    mp = dpgm.marginal_plan(PARAMS, D, "audit")
    rest = np.array([[1, 1, 0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]], float)
    x, xp = np.zeros(D), np.zeros(D)
    x[:L], xp[L:2 * L] = 1.0, 1.0  # L items each, none shared
    c_d = np.vstack([rest, x]).sum(axis=0)
    c_dp = np.vstack([rest, xp]).sum(axis=0)
    assert np.linalg.norm(c_d - c_dp) == pytest.approx(math.sqrt(2 * L)) == pytest.approx(mp.sensitivity)
    # control: the noise drawn is cut by 30 % while the recorded claim stays
    noise = _scaled(mp.noise, CONTROL_FACTOR) if control else mp.noise
    g = noise.grid
    u, up = np.rint(c_d / g).astype(np.int64), np.rint(c_dp / g).astype(np.int64)
    # the auditor's draw is the release's: the same call on the same stream
    np.testing.assert_array_equal(mp.release(c_d, 9), nz.add_noise(c_d, mp.noise, stream(9, dpgm.MARGINAL_STAGE)))
    I_d = grid_integers(nz.add_noise(trials_of(c_d, N_GAUSS), noise, stream(71, dpgm.MARGINAL_STAGE)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(c_dp, N_GAUSS), noise, stream(72, dpgm.MARGINAL_STAGE)), g)
    mu = 1.0 / mp.dp_event().noise_multiplier  # the recorded event's Gaussian-DP parameter
    res = gaussian_game("dpgm item counts replace-one", I_d, I_dp, u, up, noise.sigma,
                        gdp_epsilon_delta(mu, DELTA), DELTA, mu, control=control)
    check(res)
