"""The synthetic release's automatic ``L`` (an error estimate minimised on the DP length histogram)
and the second measurement of the per-item counts when no anchor qualifies
(docs/math/10-synthetic.md, "Automatic L" and "Anchor strata"): closed forms, brute force,
accounting unchanged (dp_accounting)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import sparse

from sparkpriv.api import release
from sparkpriv.local.records import bound_items
from sparkpriv.mechanisms.auto_bound import AutoCap, choose_max_items, length_edges
from sparkpriv.mechanisms.synthetic import (CALIBRATE_LOSS, SYNTHETIC, SyntheticParams, expand_bins, plan_synthetic,
                                            pooled_lengths)
from sparkpriv.mechanisms.synthetic._post import choose_max_items_error, max_items_error
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.random import insecure_fixed_seed


def _brute_error(people_lengths, L, d, z, factor):
    """The error estimate from one length per person (an independent loop over people)."""
    kept = sum(min(m, L) for m in people_lengths)
    total = sum(people_lengths)
    sigma = z * math.sqrt(factor * L)
    return (1 - kept / total) ** 2 + (sigma / (kept / d)) ** 2


def test_max_items_error_against_a_loop_over_people():
    rng = np.random.default_rng(0)
    people = list(rng.geometric(0.25, 400))
    lam = np.bincount(people).astype(float)
    for L in (1, 2, 3, 5, 8, 13, 40):
        for d, z, f in ((50, 0.7, 2.0), (3000, 3.0, 1.0)):
            assert max_items_error(lam, L, d, z, f)[0] == pytest.approx(_brute_error(people, L, d, z, f), rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_chosen_L_is_the_brute_force_minimiser_on_the_pooled_histogram(seed):
    rng = np.random.default_rng(seed)
    limit = 64
    edges = length_edges(limit)
    people = np.minimum(rng.geometric(rng.uniform(0.1, 0.4), 5000), limit)
    exact = np.bincount(np.searchsorted(edges, people, side="right") - 1, minlength=edges.size).astype(float)
    noisy = exact + rng.laplace(0, 10.0, edges.size)
    std = 10.0 * math.sqrt(2)
    d, z = int(rng.integers(20, 2000)), float(rng.uniform(0.5, 5.0))
    lam = expand_bins(pooled_lengths(noisy, std), edges, limit)
    m = np.arange(lam.size)
    errs = []
    for L in range(1, limit + 1):  # the same estimate, written out per L
        kept, total = (lam * np.minimum(m, L)).sum(), (lam * m).sum()
        errs.append((1 - kept / total) ** 2 + (z * math.sqrt(2 * L) * d / kept) ** 2)
    assert choose_max_items_error(noisy, std, edges, limit, d, z, 2.0) == 1 + int(np.argmin(errs))


def test_more_noise_or_more_items_never_chooses_a_larger_L():
    rng = np.random.default_rng(3)
    limit = 64
    edges = length_edges(limit)
    people = np.minimum(rng.geometric(0.15, 20000), limit)
    h = np.bincount(np.searchsorted(edges, people, side="right") - 1, minlength=edges.size).astype(float)
    Ls = [choose_max_items_error(h, 1.0, edges, limit, 500, z, 2.0) for z in (0.05, 0.5, 2.0, 8.0)]
    assert Ls == sorted(Ls, reverse=True) and Ls[0] > Ls[-1]
    Ld = [choose_max_items_error(h, 1.0, edges, limit, d, 1.0, 2.0) for d in (10, 100, 1000, 10000)]
    assert Ld == sorted(Ld, reverse=True)


class _Facts:
    def __init__(self, d):
        self.d = d


def _hist(people, limit):
    edges = length_edges(limit)
    return np.bincount(np.searchsorted(edges, people, side="right") - 1, minlength=edges.size).astype(float)


def _smallest_raked_L(lam, top):
    """The smallest L in 1 .. top whose cap keeps at least 1 - CALIBRATE_LOSS of the items, E[m] /
    E[min(m, L)] <= 1 + CALIBRATE_LOSS, written out per L; None when there is none."""
    m = np.arange(lam.size)
    for L in range(1, top + 1):
        if (lam * m).sum() / (lam * np.minimum(m, L)).sum() <= 1.0 + CALIBRATE_LOSS:
            return L
    return None


def test_the_mechanism_rule_uses_the_counts_public_noise_multiplier():
    """Synthetic.choose_max_items: the brute-force minimiser with ``z`` = the counts' std / sqrt(2 L) at
    any L (the events do not depend on L), at most the DP 0.95 quantile; on this table (5 % of the people
    hold 30-64 items, like web crawlers) the calibration rakes at no L up to the quantile, so the rule
    binds."""
    p = SyntheticParams(epsilon=0.7, delta=1e-6)
    d, limit = 300, 64
    z = plan_synthetic(p, d, 3, lengths_given=True, caller="t").counts_noise.std / math.sqrt(6)
    assert z == pytest.approx(plan_synthetic(p, d, 40, lengths_given=True, caller="t").counts_noise.std
                              / math.sqrt(80), rel=1e-6)
    edges = length_edges(limit)
    rng = np.random.default_rng(4)
    h = _hist(np.concatenate([np.minimum(rng.geometric(0.3, 7600), limit), rng.integers(30, 65, 400)]), limit)
    got = SYNTHETIC.choose_max_items(p, _Facts(d), h, 3.0, limit, "t")
    z_limit = plan_synthetic(p, d, limit, lengths_given=True, caller="t").counts_noise.std / math.sqrt(2 * limit)
    q95 = choose_max_items(h, 0.95, limit)
    assert _smallest_raked_L(expand_bins(pooled_lengths(h, 3.0), edges, limit), q95) is None
    assert got == min(choose_max_items_error(h, 3.0, edges, limit, d, z_limit, 2.0), q95)
    assert abs(got - min(choose_max_items_error(h, 3.0, edges, limit, d, z, 2.0), q95)) <= 1
    assert got < q95  # on this table the rule binds (the test has power)


def test_the_rule_never_gives_up_the_calibration():
    """Where a cap at or below the 0.95 quantile keeps 97 % of the items (the calibration rakes there),
    the rule's L is raised to the smallest such cap: short records (lengths 1-12, the 0.95 quantile 10)
    and much noise, where the error estimate alone picks a smaller L."""
    p = SyntheticParams(epsilon=0.2, delta=1e-6)
    d, limit = 2000, 64
    edges = length_edges(limit)
    rng = np.random.default_rng(6)
    h = _hist(rng.integers(1, 13, 20000), limit)
    lam = expand_bins(pooled_lengths(h, 3.0), edges, limit)
    q95 = choose_max_items(h, 0.95, limit)
    z = plan_synthetic(p, d, limit, lengths_given=True, caller="t").counts_noise.std / math.sqrt(2 * limit)
    alone = min(choose_max_items_error(h, 3.0, edges, limit, d, z, 2.0), q95)
    raked = _smallest_raked_L(lam, q95)
    assert raked is not None and alone < raked <= q95  # the test has power
    assert SYNTHETIC.choose_max_items(p, _Facts(d), h, 3.0, limit, "t") == raked


def _table(n=6000, d=60, seed=0):
    rng = np.random.default_rng(seed)
    m = np.minimum(rng.geometric(0.22, n), d)
    p = rng.dirichlet(np.full(d, 0.4))
    rows = [np.sort(rng.choice(d, k, replace=False, p=p)) for k in m]
    off = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    return sparse.csr_matrix((np.ones(off[-1]), np.concatenate(rows), off), shape=(n, d))


def test_auto_L_by_the_rule_spends_what_the_quantile_spends():
    """The rule is post-processing: the same events (dp_accounting) whichever way L is chosen, and an
    explicit quantile still chooses by the quantile; the receipt says which."""
    import dp_accounting as dpa

    X = _table(n=3000)
    with insecure_fixed_seed(9):
        a = release("synthetic", bound_items(X, max_items="auto"), epsilon=1.0, delta=1e-6)
    with insecure_fixed_seed(9):
        b = release("synthetic", bound_items(X, max_items="auto", auto=AutoCap(quantile=0.95)), epsilon=1.0,
                    delta=1e-6)
    assert a.event == b.event and a.epsilon == b.epsilon
    acc = dpa.pld.PLDAccountant()
    acc.compose(a.event)
    assert acc.get_epsilon(1e-6) <= 1.0 * (1 + 1e-9)
    assert a.epsilon == pytest.approx(epsilon_of(a.event, 1e-6))
    ea, eb = a.public["contribution_bound_estimation"], b.public["contribution_bound_estimation"]
    assert "quantile" not in ea and "minimising" in ea["method"]
    assert "minimising" not in eb["method"] and eb["quantile"] == 0.95
    assert 1 <= ea["chosen_max_items"] <= eb["chosen_max_items"]
    # the parameters (what the ledger reserved, before the data) say the same: the rule that chose L and
    # the share the histogram spent (the synthetic release's own, 0.15), not the generic quantile's
    pa, pb = a.public["parameters"]["contribution_bound"], b.public["parameters"]["contribution_bound"]
    assert pa["max_items"] == pb["max_items"] == "auto"
    assert "quantile" not in pa and pa["method"] == ea["method"] and "rule of its own" not in pa["method"]
    assert pb["quantile"] == 0.95 and pb["method"] == eb["method"] and "rule of its own" not in pb["method"]
    assert pa["epsilon_share"] == ea["epsilon_share"] == 0.15 == pb["epsilon_share"]
    assert pa["weights"] == "binary" and pa["limit"] == ea["limit"]


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
