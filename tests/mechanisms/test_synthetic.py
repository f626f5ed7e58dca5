"""The synthetic person x item table release (sparkpriv.mechanisms.synthetic) on the local engine:
post-processing against closed forms, the model's union answers against Monte Carlo, sensitivities
by brute force, accounting against dp_accounting, the release end to end, refusals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import sparse

from sparkpriv.api import release
from sparkpriv.errors import ParameterError
from sparkpriv.local.records import bound_items
from sparkpriv.mechanisms.auto_bound import length_edges
from sparkpriv.mechanisms.synthetic import (CALIBRATE_LOSS, CALIBRATE_STDS, SyntheticModel, calibrate, expand_bins,
                                            plan_synthetic, pooled_lengths, shifted_draws, shrunk_counts,
                                            SyntheticParams)
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.random import insecure_fixed_seed


def test_shrunk_counts_approach_the_bayes_posterior_mean():
    """A two-point prior (0 w.p. 0.8, 100 w.p. 0.2), Gaussian noise of std 20: the empirical-Bayes means
    fitted from the noisy counts alone are close to the oracle posterior mean, and beat clamping."""
    rng = np.random.default_rng(0)
    d, sigma = 20_000, 20.0
    true = np.where(rng.random(d) < 0.2, 100.0, 0.0)
    noisy = true + rng.normal(0, sigma, d)
    eb = shrunk_counts(noisy, sigma)
    l0 = 0.8 * np.exp(-0.5 * (noisy / sigma) ** 2)
    l1 = 0.2 * np.exp(-0.5 * ((noisy - 100.0) / sigma) ** 2)
    oracle = 100.0 * l1 / (l0 + l1)
    assert np.mean((eb - oracle) ** 2) < 0.05 * np.mean((oracle - true) ** 2)
    assert np.mean((eb - true) ** 2) < 0.5 * np.mean((np.maximum(noisy, 0) - true) ** 2)
    assert np.all(eb >= 0) and shrunk_counts(np.array([5.0, -3.0]), 0.0).tolist() == [5.0, 0.0]


def test_pooled_lengths_cut_the_noise_tail_and_are_non_increasing_beyond_the_mode():
    rng = np.random.default_rng(1)
    true = np.zeros(40)
    true[:6] = [0, 300, 500, 400, 200, 50]
    cut_ok = 0
    for s in range(50):
        noisy = true + rng.laplace(0, 5.0, true.size)
        out = pooled_lengths(noisy, 5.0 * math.sqrt(2))
        assert np.all(out >= 0)
        m = int(np.argmax(out))
        assert np.all(np.diff(out[m:]) <= 1e-9)  # non-increasing beyond the mode
        cut_ok += out[12:].sum() == 0  # nothing but noise beyond length 5
    assert cut_ok >= 45


def test_the_tail_ends_at_the_first_bin_within_the_noise():
    """A positive noise excursion far beyond the real lengths, after bins that hold only noise, does not
    extend the tail: the suffix from bin 6 (75 people over 34 bins) is within 2 noise stds
    (2 x 10 x sqrt(34) = 117), so the tail ends at bin 5, though bins 37-39 alone pass the test
    (75 > 2 x 10 x sqrt(3) = 35) and the largest passing bin, 39, would keep people at 37-39 items."""
    std = 10.0
    h = np.zeros(40)
    h[:6] = [0, 300, 500, 400, 200, 50]
    h[37:40] = 25.0
    out = pooled_lengths(h, std)
    assert out[6:].sum() == 0
    np.testing.assert_allclose(out[:6], h[:6])  # already non-increasing beyond the mode: kept
    # a histogram whose every suffix beyond the mode is real keeps its whole length
    full = np.linspace(1000.0, 400.0, 40)
    np.testing.assert_allclose(pooled_lengths(full, std), full)


def test_expand_bins_spreads_each_bin_evenly():
    e = length_edges(20)
    binned = np.arange(1.0, e.size + 1.0)
    out = expand_bins(binned, e, 20)
    assert out.sum() == pytest.approx(binned.sum()) and out.size == 21
    for j, lo in enumerate(e):
        hi = e[j + 1] if j + 1 < e.size else 21
        np.testing.assert_allclose(out[lo:hi], binned[j] / (hi - lo))


def test_expand_bins_spreads_each_bin_like_a_shape():
    """With a shape, a bin's mass goes to its lengths in the shape's proportions (even where the
    shape has no mass in the bin)."""
    e = np.array([0, 1, 3, 6])
    shape = np.array([5.0, 1.0, 3.0, 0.0, 0.0, 0.0, 2.0, 2.0])  # lengths 0..7; bin [3, 6) has no mass
    out = expand_bins(np.array([10.0, 8.0, 6.0, 4.0]), e, 7, shape=shape)
    np.testing.assert_allclose(out, [10.0, 2.0, 6.0, 2.0, 2.0, 2.0, 2.0, 2.0])


def _model(d=30, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.zeros(11)
    lengths[1:] = rng.random(10)
    counts = rng.gamma(0.7, 100.0, d)
    return SyntheticModel(d, n, lengths, counts, counts)


def _holders(draws, p, n):
    """Expected holders of each item, written out: ``n sum_m draws[m] (1 - (1 - p)^m)``."""
    m = np.arange(len(draws))
    return n * ((1.0 - (1.0 - p[:, None]) ** m[None, :]) * np.asarray(draws)[None, :]).sum(axis=1)


@pytest.mark.parametrize("shift", [-1.5, -0.4, 0.0, 0.3, 1.0, 2.7])
def test_shifted_draws_move_the_mean_by_the_shift(shift):
    lam = np.zeros(40)
    lam[1:12] = np.exp(-0.3 * np.arange(11))
    out = shifted_draws(lam, shift)
    mean = (lam / lam.sum() * np.arange(40)).sum()
    assert np.all(out >= 0) and out.sum() == pytest.approx(1.0)
    assert (out * np.arange(40)).sum() == pytest.approx(mean + shift, abs=1e-9)


def test_calibrate_rakes_the_well_measured_items_to_their_counts():
    """Lengths whose released mean is 15 % low (the noisy tail cut) and exact counts: the calibrated
    model's expected holders of every well-measured item equal its count (scaled by E[m] / E[min(m, L)]),
    the rare items keep about the uncalibrated model's, and the items per person come back to the truth
    (uncalibrated: 8 % off)."""
    rng = np.random.default_rng(3)
    d, n, std = 60, 20_000.0, 10.0
    lam = np.zeros(31)
    lam[1:31] = np.exp(-0.25 * np.arange(30))
    lam /= lam.sum()
    p_true = rng.pareto(1.5, d) + 0.05
    p_true /= p_true.sum()
    counts = _holders(lam, p_true, n)
    counts[-5:] = [3.0, 8.0, 12.0, 20.0, 35.0]  # below CALIBRATE_STDS noise stds: not targets
    low = shifted_draws(lam, -0.15 * (lam * np.arange(31)).sum())
    for L, scale in ((30, 1.0), (12, None)):
        m = np.arange(31)
        ratio = (low * m).sum() / (low * np.minimum(m, L)).sum()
        assert ratio <= 1.0 + CALIBRATE_LOSS
        capped = counts / ratio  # the counts of the records bounded at L
        draws, p = calibrate(low, capped, capped, std, n, L)
        assert draws.sum() == pytest.approx(1.0) and p.sum() == pytest.approx(1.0) and np.all(draws >= 0)
        got = _holders(draws, p, n)
        well = capped >= CALIBRATE_STDS * std
        assert 0 < (~well).sum() < d
        np.testing.assert_allclose(got[well], counts[well], rtol=0.01)
        base = _holders(low / low.sum(), capped / capped.sum(), n)
        np.testing.assert_allclose(got[~well], base[~well], rtol=0.15)
        assert got.sum() == pytest.approx(counts.sum(), rel=0.01)
        assert abs(base.sum() / counts.sum() - 1.0) > 0.05  # what the calibration repairs


def test_calibrate_leaves_the_model_when_the_cap_drops_many_items():
    lam = np.zeros(31)
    lam[1:31] = np.exp(-0.1 * np.arange(30))
    m = np.arange(31)
    L = 4
    assert (lam * m).sum() / (lam * np.minimum(m, L)).sum() > 1.0 + CALIBRATE_LOSS
    counts = np.array([500.0, 300.0, 200.0])
    draws, p = calibrate(lam, counts, counts, 1.0, 1000.0, L)
    np.testing.assert_allclose(draws, lam / lam.sum())
    np.testing.assert_allclose(p, counts / counts.sum())


def test_union_and_pair_answers_match_monte_carlo():
    m = _model()
    rng = np.random.default_rng(3)
    Q = sparse.csr_matrix((rng.random((40, m.d)) < 0.15).astype(float))
    pairs = np.array([(0, 1), (2, 7), (5, 29)])
    reps = [m.sample(m.n, seed=s) for s in range(60)]
    mc = np.mean([np.asarray(((Y @ Q.T) > 0).sum(axis=0)).ravel() for Y in reps], axis=0)
    np.testing.assert_allclose(mc, m.union_answers(Q), rtol=0.03, atol=3.0)
    mcp = np.mean([np.asarray(Y[:, pairs[:, 0]].multiply(Y[:, pairs[:, 1]]).sum(axis=0)).ravel() for Y in reps],
                  axis=0)
    np.testing.assert_allclose(mcp, m.pair_answers(pairs), rtol=0.06, atol=2.0)


def test_samples_are_reproducible_by_key_and_hold_distinct_sorted_items():
    m = _model()
    a = m.sample_sparse(500, 7, 0, 1)
    b = m.sample_sparse(500, 7, 0, 1)
    c = m.sample_sparse(500, 7, 0, 2)
    assert np.array_equal(a[1], b[1]) and not np.array_equal(a[1], c[1])
    off, idx = a
    for r in range(500):
        row = idx[off[r]:off[r + 1]]
        assert np.all(np.diff(row) > 0) and row.size <= m.limit


def test_balanced_draws_hit_every_outcome_its_expected_number_of_times_each_draw_unbiased():
    from sparkpriv.mechanisms.synthetic._model import balanced_draws

    p = np.array([0.37, 0.01, 0.22, 0.0, 0.4])
    cdf = np.cumsum(p) * 3.0  # unnormalised: only the shares count
    k = 53
    firsts = []
    for seed in range(4000):
        x = balanced_draws(np.random.default_rng(seed), cdf, k)
        c = np.bincount(x, minlength=p.size)
        assert np.all((c == np.floor(k * p)) | (c == np.ceil(k * p))), c  # i.i.d. draws would not
        firsts.append(x[[0, 17, 52]])
    # any single draw (first, middle, last) has the distribution p: chi-square against p, 4000 draws each
    for col in np.array(firsts).T:
        obs = np.bincount(col, minlength=p.size)[p > 0]
        exp = 4000 * p[p > 0]
        assert ((obs - exp) ** 2 / exp).sum() < 16.3  # chi-square, 3 degrees of freedom, p = 0.001


def test_a_sampled_table_holds_each_item_as_often_as_the_model_says():
    # one draw per person: the sampled holders of item i are floor or ceil of n p_i (independent
    # draws: Binomial(n, p_i), std up to 22 here); with longer records, the holders' spread over
    # seeds is a fraction of independent sampling's (duplicate draws within a person still vary)
    m = _model()
    one = SyntheticModel(m.d, 2000, np.eye(1, 11, 1).ravel(), m.counts, m.counts)
    off, idx = one.sample_sparse(2000, 5, 0)
    c = np.bincount(idx, minlength=m.d)
    k = 2000 * one.profile
    assert np.all((c == np.floor(k)) | (c == np.ceil(k)))
    counts = np.array([np.bincount(m.sample_sparse(m.n, s, 0)[1], minlength=m.d) for s in range(40)])
    expected = _holders(m.lengths, m.profile, m.n)
    np.testing.assert_allclose(counts.mean(axis=0), expected, rtol=0.02, atol=2.0)
    binomial_sd = np.sqrt(expected * (1 - expected / m.n))
    big = expected > 100
    ratio = counts.std(axis=0)[big] / binomial_sd[big]  # independent people: median 1.00 (max 1.23)
    assert big.sum() >= 10 and np.median(ratio) < 0.5


def test_sensitivities_by_brute_force():
    """Every pair of binary records of at most L items over d items: the count vector moves by at most
    sqrt(2 L) in L2 (replace-one; sqrt(L) add-remove) and the length histogram by 2 in L1 (1)."""
    d, L = 6, 3
    recs = [np.array(r, float) for r in itertools.product((0, 1), repeat=d) if sum(r) <= L]
    worst = max(np.linalg.norm(a - b) for a in recs for b in recs)
    plan = plan_synthetic(SyntheticParams(epsilon=1.0, delta=1e-6), d, L, lengths_given=False, caller="t")
    assert worst == pytest.approx(plan.counts_sensitivity) == pytest.approx(math.sqrt(2 * L))
    add = max(np.linalg.norm(a) for a in recs)
    plan_ar = plan_synthetic(SyntheticParams(epsilon=1.0, delta=1e-6, neighbors="add-remove"), d, L,
                             lengths_given=False, caller="t")
    assert add == pytest.approx(plan_ar.counts_sensitivity)
    e = length_edges(plan.limit)
    hist = [np.bincount([np.searchsorted(e, int(r.sum()), side="right") - 1], minlength=e.size) for r in recs]
    assert max(np.abs(a - b).sum() for a in hist for b in hist) == 2 == plan.length_noise.sensitivity


@pytest.mark.parametrize("eps,delta", [(0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-7)])
def test_accounting_against_dp_accounting(eps, delta):
    import dp_accounting as dpa

    plan = plan_synthetic(SyntheticParams(epsilon=eps, delta=delta), 500, 8, lengths_given=False, caller="t")
    ev = plan.dp_event()
    assert isinstance(ev, dpa.ComposedDpEvent) and len(ev.events) == 3
    assert isinstance(ev.events[0], dpa.LaplaceDpEvent)
    g1, g2 = ev.events[1:]  # the per-item counts' Gaussian and the anchor strata's
    assert isinstance(g1, dpa.GaussianDpEvent) and isinstance(g2, dpa.GaussianDpEvent)
    acc = dpa.pld.PLDAccountant()
    acc.compose(dpa.ComposedDpEvent([ev.events[0], g1, g2]))
    assert acc.get_epsilon(delta) <= eps * (1 + 1e-9)
    assert epsilon_of(ev, delta) == pytest.approx(acc.get_epsilon(delta), rel=1e-6)
    # the Laplace's epsilon is length_share of the whole (pure: 1 / its multiplier)
    assert 1.0 / ev.events[0].noise_multiplier == pytest.approx(0.15 * eps, rel=1e-9)
    # the two Gaussians split one Gaussian's budget: 1/z^2 = 1/z1^2 + 1/z2^2, the strata anchor_share of it
    one = plan_synthetic(SyntheticParams(epsilon=eps, delta=delta, anchors=0), 500, 8, lengths_given=False,
                         caller="t").dp_event().events[1]
    assert isinstance(one, dpa.GaussianDpEvent)
    z = one.noise_multiplier
    assert 1 / g1.noise_multiplier ** 2 + 1 / g2.noise_multiplier ** 2 == pytest.approx(1 / z ** 2, rel=1e-3)
    assert (z / g2.noise_multiplier) ** 2 == pytest.approx(0.2, rel=1e-3)
    # each Gaussian's sigma is at least its multiplier times the L2 sensitivity sqrt(2 L)
    assert plan.counts_noise.std >= g1.noise_multiplier * math.sqrt(16) * (1 - 1e-9)
    assert plan.strata_noise.std >= g2.noise_multiplier * math.sqrt(16) * (1 - 1e-9)


def _structured(n=6000, d=50, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.integers(1, 13, n)
    p = rng.dirichlet(np.full(d, 0.5))
    rows = [np.unique(rng.choice(d, k, p=p)) for k in m]
    off = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    return sparse.csr_matrix((np.ones(off[-1]), np.concatenate(rows), off), shape=(n, d))


def test_release_end_to_end_on_the_local_engine(tmp_path):
    X = _structured()
    rel = release("synthetic", bound_items(X, max_items="auto"), epsilon=4.0, delta=1e-6)
    m = rel.model
    assert m.n == X.shape[0]  # replace-one: n is public, released exactly
    true_len = np.bincount(np.diff(X.indptr), minlength=m.limit + 1)[:m.limit + 1] / X.shape[0]
    # the released length distribution (public mean), and the model's expected items per person (its
    # draws are calibrated to the counts: a draw that repeats an item adds none)
    mean_len = float((np.arange(true_len.size) * true_len).sum())
    assert rel.public["model"]["length_distribution_mean"] == pytest.approx(mean_len, rel=0.05)
    held = m.union_answers(sparse.identity(50, format="csr"), X.shape[0]).sum() / X.shape[0]
    assert held == pytest.approx(mean_len, rel=0.03)
    true_counts = np.asarray(X.sum(axis=0)).ravel()
    # the model's expected holders of each item follow the true counts (0.9992-0.9996 over 40 seeds);
    # its stored counts are the raked per-draw profile times the total, which a person's repeated
    # draws of popular items bend away from the holders (0.980-0.982 over the same seeds)
    holders = m.union_answers(sparse.identity(50, format="csr"), X.shape[0])
    assert np.corrcoef(true_counts, holders)[0, 1] > 0.995
    assert np.corrcoef(true_counts, m.counts)[0, 1] > 0.95
    assert rel.epsilon <= 4.0 and rel.epsilon == pytest.approx(epsilon_of(rel.event, 1e-6))
    est = rel.public["contribution_bound_estimation"]
    assert 6 <= est["chosen_max_items"] <= 13 and est["epsilon_share"] == 0.15
    assert rel.df.column_names == ["item_index", "noisy_count", "count"] and rel.df.num_rows == 50
    rel.write(str(tmp_path / "rel"))
    again = SyntheticModel.load(tmp_path / "rel" / "_synthetic_model.npz")
    np.testing.assert_array_equal(again.counts, m.counts)
    np.testing.assert_array_equal(again.lengths, m.lengths)


def test_a_declared_bound_measures_its_own_length_histogram():
    X = _structured(n=3000)
    with insecure_fixed_seed(5):
        rel = release("synthetic", bound_items(X, max_items=4), epsilon=2.0, delta=1e-6)
    ev = rel.event
    # the length histogram's Laplace, the counts' and the anchor strata's Gaussians
    assert len(ev.events) == 3 and rel.public["lengths"]["epsilon"] == pytest.approx(0.3)
    assert rel.public["max_items"] == 4 and rel.model.limit == 50  # lengths up to the vocabulary, past L
    assert (rel.model.lengths * np.arange(51)).sum() > 5  # the real lengths (about 6.3), not the capped ones


@pytest.mark.parametrize("kw,msg", [({"delta": 0.0}, "'delta'"), ({"length_share": 0.95}, "'length_share'"),
                                    ({"neighbors": "element"}, "neighbors"), ({"shrink": "median"}, "'shrink'")])
def test_refusals_come_before_anything(kw, msg):
    X = _structured(n=100)
    with pytest.raises(ParameterError, match=msg):
        release("synthetic", bound_items(X, max_items=3), **{"epsilon": 1.0, "delta": 1e-6, **kw})


def test_a_large_epsilon_lowers_the_public_count_clamp_instead_of_failing():
    """With epsilon in the hundreds the Gaussian's grid cannot hold counts up to 2^33: the public clamp
    is lowered (and stated) and the release runs."""
    X = _structured(n=2000)
    with insecure_fixed_seed(3):
        rel = release("synthetic", bound_items(X, max_items=12), epsilon=200.0, delta=1e-6)
    clamp = rel.public["count_clamp"]
    assert 2.0 ** 20 <= clamp < 2.0 ** 33
    true_counts = np.asarray(X.sum(axis=0)).ravel()
    assert np.abs(rel.model.noisy_counts - true_counts).max() < 5  # almost no noise; 12 items keep every record
    top = plan_synthetic(SyntheticParams(epsilon=1e6, delta=1e-6), 50, 6, lengths_given=True, caller="t")
    assert top.count_clamp >= 2.0 ** 20  # the largest epsilon accepted still holds a million people per item
