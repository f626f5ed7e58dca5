"""Audit of the DP quantile for the row bound (sparkpriv.privacy.quantile).

The release is the noisy histogram of row norms over the public power-of-two
candidates (the chosen bound is post-processing of it), discrete Laplace noise
from ``histogram_noise``, added once by ``add_noise`` as the Spark path does.
Worst-case neighbours: replace-one moves one row from one bucket to another
(L1 change 2); add-remove adds one row (L1 change 1). Counts come from the
core ``norm_bucket_counts`` on the rows' norms.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.quantile import candidate_bounds, histogram_noise, norm_bucket_counts
from sparkpriv.privacy.random import stream

from ._audit import N_LAPLACE, check, grid_integers, laplace_game, trials_of, weaken_noise

pytestmark = pytest.mark.audit

EPS = 1.0
N = N_LAPLACE
REST_NORMS = np.array([0.3, 0.3, 2.0, 5.0, 5.5, 100.0, 1e4])


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("relation", ["replace-one", "add-remove"])
def test_row_bound_histogram(relation, control, monkeypatch):
    if control:
        weaken_noise(monkeypatch)
    cand = candidate_bounds()
    noise = histogram_noise(epsilon=EPS, neighbors=relation, buckets=cand.size + 1)
    c_d = norm_bucket_counts(np.append(REST_NORMS, 0.01), cand)
    if relation == "replace-one":
        c_dp = norm_bucket_counts(np.append(REST_NORMS, 3e8), cand)  # another bucket (overflow side)
    else:
        c_dp = norm_bucket_counts(REST_NORMS, cand)
    g = noise.grid
    u = np.rint(c_d / g).astype(np.int64)
    up = np.rint(c_dp / g).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(c_d, N), noise, stream(61, 0)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(c_dp, N), noise, stream(62, 0)), g)
    res = laplace_game(f"row-bound quantile histogram {relation}", I_d, I_dp, u, up, EPS, control=control)
    if not control:
        from sparkpriv.privacy.accounting import epsilon_of

        assert epsilon_of(noise.dp_event(), 0.0) <= EPS
    check(res)
