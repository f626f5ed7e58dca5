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


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("relation", ["replace-one", "add-remove"])
def test_contribution_bound_histogram(relation, control, monkeypatch):
    """max_items='auto' (sparkpriv.mechanisms.auto_bound): the noisy histogram of items per person over
    0 .. limit, from the core ``items_histogram_fn`` on bounded records. Worst case: a person with no
    item replaced by one with ``limit`` or more (the two ends), or a person with ``limit`` items added."""
    from sparkpriv.mechanisms.auto_bound import histogram_noise_for, items_histogram_fn
    from sparkpriv.mechanisms.protocol import SparseRows

    if control:
        weaken_noise(monkeypatch)
    limit = 16
    noise = histogram_noise_for(epsilon=EPS, neighbors=relation, limit=limit)
    rest = [0, 1, 1, 3, 5, 16, 16]

    def hist(lengths):
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        block = SparseRows(offsets, np.zeros(offsets[-1], np.int32), None, limit)
        return items_histogram_fn(limit)(block)

    c_d = hist(rest + [0])
    c_dp = hist(rest + [limit]) if relation == "replace-one" else hist(rest)
    if relation == "add-remove":
        c_d, c_dp = hist(rest + [limit]), hist(rest)
    g = noise.grid
    u = np.rint(c_d / g).astype(np.int64)
    up = np.rint(c_dp / g).astype(np.int64)
    I_d = grid_integers(nz.add_noise(trials_of(c_d, N), noise, stream(63, 0)), g)
    I_dp = grid_integers(nz.add_noise(trials_of(c_dp, N), noise, stream(64, 0)), g)
    res = laplace_game(f"contribution-bound histogram {relation}", I_d, I_dp, u, up, EPS, control=control)
    if not control:
        from sparkpriv.privacy.accounting import epsilon_of

        assert epsilon_of(noise.dp_event(), 0.0) <= EPS
    check(res)
