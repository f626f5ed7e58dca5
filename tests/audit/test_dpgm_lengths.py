"""Audit of DPGM's length histograms (docs/research/dpgm.md, "Record lengths").

The release noises the ``k`` clusters' histograms of record lengths once, on the driver
(``LengthPlan.release``), as one vector of ``k B`` counts. Worst-case replace-one neighbours:
the replaced record is the only one of its (cluster, length bin) cell and its replacement the
only one of another cell (different cluster, different length), so two counts move by one:
``||h(D) - h(D')|| = sqrt(2)``, the sensitivity the noise is calibrated to. The auditor builds
the histograms itself (its own assignment and bins), checks that the library's histogram of the
same rows is equal, then runs ``add_noise`` with the plan's noise ``n`` times per side.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.mechanisms import dpgm
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.calibration import gdp_epsilon_delta
from sparkpriv.privacy.random import stream

from ._audit import CONTROL_FACTOR, N_GAUSS, _scaled, check, gaussian_game, grid_integers, trials_of

pytestmark = pytest.mark.audit

DELTA = 1e-3
# length_share * epsilon = 1: the audited histogram alone is about (1, 1e-3)
PARAMS = dpgm.DPGMParams(epsilon=2.0, delta=DELTA, k=2, kmeans_share=0.3, length_share=0.5, marginal_share=0.1,
                         hidden=2)
D = 6


def _rows(lengths):
    X = np.zeros((len(lengths), D))
    for r, m in enumerate(lengths):
        X[r, :m] = 1.0
    return X


def _histograms(lp, clusters):
    """The auditor's (k, B) histograms: rows per cluster by their number of ones, its own bins."""
    out = np.zeros((PARAMS.k, lp.bins))
    for j, X in enumerate(clusters):
        for m in X.sum(axis=1).astype(int):
            out[j, int(np.flatnonzero(lp.edges <= m)[-1])] += 1
        np.testing.assert_array_equal(out[j], lp.histogram(X))  # the library's histogram of the same rows
    return out


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
def test_length_histograms(control):
    lp = dpgm.length_plan(PARAMS, D, "audit")
    rest0, rest1 = _rows([1, 2, 2]), _rows([5, 6])
    h_d = _histograms(lp, [np.vstack([rest0, _rows([3])]), rest1])  # x: cluster 0, length 3
    h_dp = _histograms(lp, [rest0, np.vstack([rest1, _rows([4])])])  # x': cluster 1, length 4
    assert np.linalg.norm(h_d - h_dp) == pytest.approx(np.sqrt(2.0))
    # control: the noise drawn is cut by 30 % while the recorded claim stays (the bug to catch; the
    # calibration itself would re-fit a weakened noise to the request, so it is weakened after it)
    noise = _scaled(lp.noise, CONTROL_FACTOR) if control else lp.noise
    g = noise.grid
    v_d, v_dp = h_d.ravel(), h_dp.ravel()
    u, up = np.rint(v_d / g).astype(np.int64), np.rint(v_dp / g).astype(np.int64)
    # the auditor's draw is the release's: the same call on the same stream
    np.testing.assert_array_equal(lp.release(h_d, 9), nz.add_noise(h_d, lp.noise, stream(9, dpgm.LENGTH_STAGE)))
    I_d = grid_integers(nz.add_noise(trials_of(v_d, N_GAUSS), noise, stream(61, dpgm.LENGTH_STAGE)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(v_dp, N_GAUSS), noise, stream(62, dpgm.LENGTH_STAGE)), g)
    mu = 1.0 / lp.dp_event().noise_multiplier  # the recorded event's Gaussian-DP parameter
    res = gaussian_game("dpgm length histograms replace-one", I_d, I_dp, u, up, noise.sigma,
                        gdp_epsilon_delta(mu, DELTA), DELTA, mu, control=control)
    check(res)
