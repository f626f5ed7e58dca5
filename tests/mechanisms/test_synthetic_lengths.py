"""The synthetic release's second measurement of the per-item counts when no anchor qualifies
(docs/math/10-synthetic.md, "Anchor strata"): the combined noise against its closed form,
accounting unchanged (dp_accounting)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import sparse

from sparkpriv.api import release
from sparkpriv.local.records import bound_items
from sparkpriv.mechanisms.synthetic import SyntheticParams, plan_synthetic
from sparkpriv.privacy.random import insecure_fixed_seed


def test_without_anchors_the_strata_budget_measures_the_counts_again():
    """When no anchor passes the threshold, the strata's Gaussian measures the per-item counts a second
    time: the released noisy counts' error has the std of one Gaussian of the whole budget,
    ``(sigma_1^-2 + sigma_2^-2)^(-1/2)`` (not the first measurement's ``sigma_1``), and the events are
    those of the plan (dp_accounting)."""
    import dp_accounting as dpa

    rng = np.random.default_rng(11)
    n, d, L = 400, 3000, 3
    rows = [np.sort(rng.choice(d, int(k), replace=False)) for k in rng.integers(1, L + 1, n)]
    off = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    X = sparse.csr_matrix((np.ones(off[-1]), np.concatenate(rows), off), shape=(n, d))
    exact = np.asarray(X.sum(axis=0)).ravel()  # nobody holds more than L: the capped counts
    params = dict(epsilon=0.5, delta=1e-6)
    with insecure_fixed_seed(12):
        rel = release("synthetic", bound_items(X, max_items=L), **params)
    plan = plan_synthetic(SyntheticParams(**params), d, L, lengths_given=False, caller="t")
    assert rel.public["model"]["anchors"]["chosen"] == 0
    s1, s2 = plan.counts_noise.std, plan.strata_noise.std
    combined = (s1 ** -2 + s2 ** -2) ** -0.5
    assert rel.public["uncertainty"]["noisy_count_std"] == pytest.approx(combined, rel=1e-12)
    err = np.asarray(rel.df.column("noisy_count")) - exact
    assert np.std(err) == pytest.approx(combined, rel=0.04) and np.std(err) < 0.93 * s1
    assert rel.event == plan.dp_event()
    acc = dpa.pld.PLDAccountant()
    acc.compose(rel.event)
    assert acc.get_epsilon(1e-6) <= 0.5 * (1 + 1e-9)
