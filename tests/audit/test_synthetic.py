"""Audit of the synthetic table release's per-item counts (sparkpriv.mechanisms.synthetic).

The counts of the records bounded at ``L`` items get discrete Gaussian noise once, on the driver.
Worst-case replace-one neighbours: the replaced person holds ``L`` items and the replacement ``L``
others, so ``2 L`` counts move by one (``sqrt(2 L)``, the calibrated sensitivity); add-remove: one
person of ``L`` items (``sqrt(L)``). The length histogram is the contribution bound's
(tests/audit/test_quantile.py::test_contribution_bound_histogram). The auditor counts the items
with the library's own per-block function and runs ``add_noise`` with the plan's noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparkpriv.mechanisms.protocol import SparseRows
from sparkpriv.mechanisms.synthetic import SyntheticParams, item_sums_fn, plan_synthetic
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.calibration import gdp_epsilon_delta
from sparkpriv.privacy.random import stream

from ._audit import CONTROL_FACTOR, N_GAUSS, _scaled, check, gaussian_game, grid_integers, trials_of

pytestmark = pytest.mark.audit

DELTA = 1e-3
L, D = 3, 8


def _sums(rows):
    off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    idx = np.asarray([i for r in rows for i in r], np.int32)
    return item_sums_fn(D)(SparseRows(off, idx, None, D))[:D]


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("relation", ["replace-one", "add-remove"])
def test_item_counts(relation, control):
    plan = plan_synthetic(SyntheticParams(epsilon=1.0, delta=DELTA, neighbors=relation), D, L,
                          lengths_given=True, caller="audit")
    rest = [[0, 1], [3, 6, 7], []]
    c_d = _sums(rest + [[0, 1, 2]])
    c_dp = _sums(rest + [[3, 4, 5]]) if relation == "replace-one" else _sums(rest)
    assert np.linalg.norm(c_d - c_dp) == pytest.approx(plan.counts_sensitivity) == pytest.approx(
        math.sqrt((2 if relation == "replace-one" else 1) * L))
    noise = _scaled(plan.counts_noise, CONTROL_FACTOR) if control else plan.counts_noise
    g = noise.grid
    u, up = np.rint(c_d / g).astype(np.int64), np.rint(c_dp / g).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(c_d, N_GAUSS), noise, stream(81, 1)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(c_dp, N_GAUSS), noise, stream(82, 1)), g)
    mu = 1.0 / plan.counts_noise.dp_event().noise_multiplier
    res = gaussian_game(f"synthetic item counts {relation}", I_d, I_dp, u, up, noise.sigma,
                        gdp_epsilon_delta(mu, DELTA), DELTA, mu, control=control)
    check(res)


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("relation", ["replace-one", "add-remove"])
def test_anchor_strata(relation, control):
    """The anchor strata's vector (sparkpriv.mechanisms.synthetic._anchors.strata_fn): worst-case
    neighbours move it by the calibrated sqrt(2 L) (replace-one: a person of anchor 0 with L - 1 other
    measured items replaced by a person of no anchor, another length, L - 1 other items; add-remove:
    one of them), checked by the library's own block function, noise from the plan's strata Gaussian."""
    from sparkpriv.mechanisms.synthetic._anchors import strata_fn, strata_length_edges

    plan = plan_synthetic(SyntheticParams(epsilon=1.0, delta=DELTA, neighbors=relation), D, L,
                          lengths_given=True, caller="audit")
    K, M = 2, 6
    fn = strata_fn(np.arange(D), K, M, L, strata_length_edges(D))  # the bins the release measures

    def vec(rows):
        off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
        idx = np.asarray([i for r in rows for i in r], np.int32)
        return fn(SparseRows(off, idx, None, D))

    rest = [[0, 1], [3, 6, 7], [], [1, 4]]
    c_d = vec(rest + [[0, 2, 3]])
    c_dp = vec(rest + [[4, 5, 6, 7]]) if relation == "replace-one" else vec(rest)
    assert np.linalg.norm(c_d - c_dp) == pytest.approx(plan.counts_sensitivity)
    noise = _scaled(plan.strata_noise, CONTROL_FACTOR) if control else plan.strata_noise
    g = noise.grid
    u, up = np.rint(c_d / g).astype(np.int64), np.rint(c_dp / g).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(c_d, N_GAUSS), noise, stream(83, 1)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(c_dp, N_GAUSS), noise, stream(84, 1)), g)
    mu = 1.0 / plan.strata_noise.dp_event().noise_multiplier
    res = gaussian_game(f"synthetic anchor strata {relation}", I_d, I_dp, u, up, noise.sigma,
                        gdp_epsilon_delta(mu, DELTA), DELTA, mu, control=control)
    check(res)
