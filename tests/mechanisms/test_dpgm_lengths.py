"""DPGM's record lengths: the conditional Bernoulli sampler, the length histograms' plan and
noise, their release on both paths, the model file and synthesis (docs/research/dpgm.md, "Record lengths")."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats
from scipy.sparse import csr_matrix

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpgm
from sparkpriv.mechanisms.rbm import RBM, conditional_bernoulli
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.random import stream

P = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, sampling_rate=0.1, epochs=1, hidden=4, accountant="rdp",
                    kmeans_iterations=3)


# ----------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_conditional_bernoulli_is_the_conditional_distribution(m):
    """Against the enumeration of every subset of size m: P(S) ∝ prod_{i in S} exp(L_i)."""
    L = np.array([0.5, -1.0, 2.0, 0.0, -2.5, 1.0])
    n = 40_000
    V = conditional_bernoulli(np.tile(L, (n, 1)), np.full(n, m), np.random.default_rng(m))
    assert np.array_equal(V.sum(axis=1), np.full(n, m))
    subsets = list(itertools.combinations(range(6), m))
    p = np.array([math.exp(L[list(s)].sum()) for s in subsets])
    p /= p.sum()
    code = {s: i for i, s in enumerate(subsets)}
    observed = np.bincount([code[tuple(np.flatnonzero(r))] for r in V], minlength=len(subsets))
    if len(subsets) > 1:
        assert stats.chisquare(observed, p * n).pvalue > 1e-3


def test_conditional_bernoulli_ends_and_a_biased_row():
    rng = np.random.default_rng(0)
    L = np.array([[0.0, 0.0, 0.0], [5.0, -5.0, 0.0], [1.0, 1.0, 1.0]])
    V = conditional_bernoulli(L, np.array([0, 1, 3]), rng)
    assert V[0].sum() == 0 and V[2].sum() == 3 and V[1].sum() == 1
    # a row whose tilted sum is rarely m still gets exactly m ones (the fallback, if reached)
    V = conditional_bernoulli(np.tile(np.linspace(-30, 30, 50), (20, 1)), np.full(20, 7), rng, tries=1)
    assert np.array_equal(V.sum(axis=1), np.full(20, 7))


def test_rbm_sample_with_lengths_has_exactly_them():
    gen = RBM(12, 3)
    theta = gen.init(np.random.default_rng(1), visible_logit=-1.0)
    lengths = np.random.default_rng(2).integers(0, 13, 500)
    V = gen.sample(theta, 500, np.random.default_rng(3), lengths=lengths)
    assert np.array_equal(V.sum(axis=1), lengths) and set(np.unique(V)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="lengths"):
        gen.sample(theta, 5, np.random.default_rng(3), lengths=np.ones(4))


# ----------------------------------------------------------------------------- the plan


def test_length_edges_closed_form():
    assert dpgm.length_edges(128).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 17, 22, 28, 35, 44, 55, 69, 87,
                                               109, 129]
    assert dpgm.length_edges(3).tolist() == [0, 1, 2, 3, 4]
    assert dpgm.max_length(dpgm.DPGMParams(epsilon=1, delta=1e-5, row_bound=math.sqrt(3)), 10) == 3
    assert dpgm.max_length(dpgm.DPGMParams(epsilon=1, delta=1e-5), 10) == 10


def test_length_noise_is_calibrated_alone_to_its_share():
    lp = dpgm.length_plan(P, 10)
    assert lp.share == 0.1 and lp.edges.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11]  # lengths 0 .. 10
    # a Gaussian of L2 sensitivity sqrt(2) at (0.1 epsilon, delta) alone: std >= sqrt(2) / mu
    assert lp.noise.std >= math.sqrt(2.0) / gdp_mu_for(0.2, 1e-5) * (1 - 1e-9)
    assert lp.noise.sensitivity == pytest.approx(math.sqrt(2.0))
    spent = epsilon_of(lp.dp_event(), 1e-5)
    assert 0.19 < spent <= 0.2
    # DP-SGD gets less: the same release without the histograms has a smaller multiplier
    plan = dpgm.plan_dpgm(P, n=400, d=10)
    none = dpgm.plan_dpgm(dpgm.DPGMParams(**{**P.public_dict(), "length_share": 0.0}), n=400, d=10)
    assert none.lengths is None and plan.noise_multiplier > none.noise_multiplier
    assert plan.epsilon_spent() <= 2.0 and none.epsilon_spent() <= 2.0


@pytest.mark.parametrize("change,match", [
    (dict(model="vae", length_share=0.1), "length_share"),
    (dict(kmeans_share=0.6, length_share=0.4), "kmeans_share \\+ length_share"),
    (dict(length_share=1.0), "length_share"),
])
def test_bad_length_share_is_refused(change, match):
    with pytest.raises(ParameterError, match=match):
        dpgm.plan_dpgm(dpgm.DPGMParams(**{**P.public_dict(), **change}), n=400, d=10)


def test_vae_releases_no_lengths_by_default():
    vp = dpgm.DPGMParams(**{**P.public_dict(), "model": "vae"})
    assert vp.lengths_share == 0.0 and dpgm.length_plan(vp, 10) is None


def test_histogram_counts_dense_and_sparse():
    lp = dpgm.length_plan(dpgm.DPGMParams(epsilon=1, delta=1e-5, k=2, row_bound=math.sqrt(40)), 40)
    assert lp.edges.tolist()[:11] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 13]
    X = np.zeros((6, 40))
    for r, m in enumerate([0, 1, 1, 9, 11, 40]):
        X[r, :m] = 1.0
    want = np.zeros(lp.bins)
    want[[0, 1, 8, 9]] += [1, 2, 1, 1]  # 9 is in [8, 10), 11 in [10, 13)
    want[-1] += 1  # 40 in the last bin
    np.testing.assert_array_equal(lp.histogram(X), want)
    np.testing.assert_array_equal(lp.histogram(csr_matrix(X)), want)


# ----------------------------------------------------------------------------- release and synthesis


def _two_groups(n=600, d=10, seed=0):
    rng = np.random.default_rng(seed)
    X = np.zeros((n, d))
    X[: n // 2, :3] = rng.random((n // 2, 3)) < 0.9  # short records on the first columns
    X[n // 2:, 3:] = rng.random((n - n // 2, d - 3)) < 0.7  # long records on the others
    return X


def _last_round_labels(X, params, plan, seed):
    """The auditor's training clusters: the library's k-means (tested on its own) rerun with the
    release's plan and test seed, keeping the centres its last round assigned with, and each row's
    nearest of them by its own arithmetic."""
    from sparkpriv.mechanisms.kmeans import cluster_stats, fit_from_stats, initial_centres, make_feature_map

    fmap = make_feature_map("linear", dpgm._bounds(params, X.shape[1], "t"), caller="t")
    Z = fmap.features(X)[0]
    seen = []

    def stats(c):
        seen.append(np.array(c))
        return cluster_stats(Z, c)

    fit_from_stats(plan.kmeans, fmap, initial_centres(fmap, params.k, stream(seed, 1), None, "t"), stats, None, seed)
    c = seen[-1]
    return np.argmin((c * c).sum(1)[None, :] - 2 * X @ c.T, axis=1)


def test_in_memory_release_adds_the_noise_to_the_exact_histograms():
    X = _two_groups()
    model, plan = dpgm.fit_dpgm_array(X, P, seed=11)
    # the auditor's histograms: the last k-means round's clusters and its own lengths
    labels = _last_round_labels(X, P, plan, 11)
    m = X.sum(axis=1).astype(int)
    exact = np.zeros((2, plan.lengths.bins))
    for j in range(2):
        for v in m[labels == j]:
            exact[j, np.searchsorted(plan.lengths.edges, v, side="right") - 1] += 1
    noise = plan.lengths.release(np.zeros_like(exact), 11)  # the same stream, on zeros
    np.testing.assert_allclose(model.lengths, exact + noise, atol=1e-9)
    # each cluster's size: the inverse-variance mean of the k-means' count and the auditor's count plus
    # the noise
    km = model.plan_public["kmeans_sizes"]
    K, H = np.array(km["values"]), exact.sum(axis=1) + noise.sum(axis=1)
    vk, vh = km["count_std"] ** 2, plan.lengths.bins * plan.lengths.noise.std ** 2
    np.testing.assert_allclose(model.sizes, np.maximum((K * vh + H * vk) / (vk + vh), 0), atol=1e-9)
    assert model.length_std == plan.lengths.noise.std
    assert model.plan_public["lengths"]["edges"] == plan.lengths.edges.tolist()


def test_cluster_sizes_closed_form():
    """Without histograms: the k-means' counts, clamped at 0. With them: the inverse-variance mean
    ``(K / v_K + H / v_H) / (1 / v_K + 1 / v_H)`` of the k-means' count ``K`` (variance
    ``kmeans_std^2``) and the histogram sum ``H`` (variance ``B lengths_std^2``), clamped at 0."""
    counts = np.array([10.0, -3.0, 7.0])
    np.testing.assert_array_equal(dpgm.cluster_sizes(counts, None, 1.0, 1.0), [10.0, 0.0, 7.0])
    H = np.array([[3.0, -1.0, 4.5], [-2.0, 0.5, -0.25], [2.0, 3.0, 2.0]])  # sums 6.5, -1.75, 7
    # v_K = 1, v_H = 3 * 1 = 3: weights 3/4 and 1/4
    np.testing.assert_allclose(dpgm.cluster_sizes(counts, H, 1.0, 1.0),
                               [0.75 * 10 + 0.25 * 6.5, 0.0, 7.0])
    # v_K = 4, v_H = 3 * 4 = 12 (stds 2 and 2): the same weights; v_K = 1, v_H = 3 / 12: 0.2 and 0.8
    np.testing.assert_allclose(dpgm.cluster_sizes(counts, H, 2.0, 2.0), [0.75 * 10 + 0.25 * 6.5, 0.0, 7.0])
    np.testing.assert_allclose(dpgm.cluster_sizes(counts, H, 1.0, math.sqrt(1 / 12)),
                               [0.2 * 10 + 0.8 * 6.5, 0.0, 7.0])
    # an exact count is the size: the histogram sums when they alone are noise free, else the k-means'
    np.testing.assert_array_equal(dpgm.cluster_sizes(counts, H, 1.0, 0.0), [6.5, 0.0, 7.0])
    np.testing.assert_array_equal(dpgm.cluster_sizes(counts, H, 0.0, 1.0), [10.0, 0.0, 7.0])
    np.testing.assert_array_equal(dpgm.cluster_sizes(counts, H), [10.0, 0.0, 7.0])


def test_a_model_trains_on_the_last_kmeans_rounds_cluster():
    """The rows each model trains on are the k-means' last round's cluster (nearest to the centres
    that round assigned with), so the released count is their noisy size. With one round those
    centres are the data-independent initial ones, which the auditor draws from the same test
    seed; the released centres would give other clusters (the test's power)."""
    from sparkpriv.mechanisms.kmeans import initial_centres, make_feature_map

    rng = np.random.default_rng(3)
    X = (rng.random((4000, 8)) < np.linspace(0.1, 0.6, 8)).astype(float)
    p = dpgm.DPGMParams(epsilon=1e6, delta=1e-5, k=3, sampling_rate=0.05, epochs=0.05, hidden=2,
                        kmeans_iterations=1, length_share=0.0)
    trained = {}
    model, _ = dpgm.fit_dpgm_array(X, p, seed=5, log=lambda j, n: trained.__setitem__(j, n))
    c0 = initial_centres(make_feature_map("linear", dpgm._bounds(p, 8, "t"), caller="t"), 3, stream(5, 1), None, "t")
    d0 = (c0 * c0).sum(1)[None, :] - 2 * X @ c0.T
    want = np.bincount(np.argmin(d0, axis=1), minlength=3)
    got = np.array([trained[j] for j in range(3)])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(model.sizes, want, atol=0.01)  # epsilon 1e6: the noisy count is exact
    c = np.asarray(model.centers)
    by_released = np.bincount(np.argmin((c * c).sum(1)[None, :] - 2 * X @ c.T, axis=1), minlength=3)
    assert np.abs(by_released - want).sum() > 200


def test_the_sizes_weigh_the_data_part_of_the_rbm_gradient():
    """Why the sizes must be those of the trained cluster: DP-SGD divides the noisy sum by ``q
    n_pub``, so a size ``r`` times too large weighs the data part of the RBM's gradient by ``1 /
    r`` against the chains' part, and the visible marginals it learns fall to about ``1 / r``
    of the data's (epsilon 1e6, one cluster, independent items, one hidden unit)."""
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.8])
    X = (rng.random((4000, 6)) < p).astype(float)
    params = dpgm.DPGMParams(k=2, hidden=1, sampling_rate=0.2, epochs=80, clip=4.0, epsilon=1e6, delta=1e-5,
                             accountant="rdp", length_share=0, marginal_share=0, learning_rate=0.01, average_tail=0.5)
    plan = dpgm.plan_dpgm(params, n=4000, d=6)
    assert plan.noise_multiplier < 0.1  # noise std sigma C / (q n) < 5e-4: negligible; no record is clipped
    labels = np.zeros(4000, dtype=np.int64)
    gen = RBM(6, 1)
    marg = {}
    for r in (1.0, 1.5):
        theta = dpgm.train_clusters(X, labels, np.array([4000.0 * r, 0.0]), np.stack([X.mean(axis=0)] * 2), plan, 3,
                                    clusters=[0])[0]
        marg[r] = gen.sample(theta, 40_000, np.random.default_rng(4)).mean(axis=0)
    np.testing.assert_allclose(marg[1.0], X.mean(axis=0), atol=0.03)
    np.testing.assert_allclose(marg[1.5], X.mean(axis=0) / 1.5, atol=0.05)


def test_synthesis_draws_the_lengths_from_the_histograms(tmp_path):
    gen = RBM(6, 2)
    thetas = np.stack([gen.init(np.random.default_rng(j)) for j in range(2)])
    edges = dpgm.length_edges(6)
    std = 10.0
    H = np.array([[0, 0, 500, 0, 0, 0, 15],  # cluster 0: length 2; 15 < 2 std: empty
                  [0, 0, 0, 0, 0, 0, 0.0]])  # cluster 1: nothing left: the model's own lengths
    model = dpgm.DPGMModel(dpgm.DPGMParams(k=2, hidden=2, length_strata=0), 6, thetas, np.array([700.0, 300.0]), np.zeros((2, 6)),
                           lengths=H, length_edges=edges, length_std=std)
    rng = np.random.default_rng(0)
    S = model.sample_cluster(gen, 0, 400, rng)
    assert np.all(S.sum(axis=1) == 2)
    S1 = model.sample_cluster(gen, 1, 2000, np.random.default_rng(1))
    assert len(np.unique(S1.sum(axis=1))) > 2  # not conditioned
    # within a wide bin the length is uniform
    e = dpgm.length_edges(128)
    w = np.zeros(e.size - 1)
    w[-1] = 1000.0  # [109, 129)
    lens = dpgm.synthetic_lengths(w, e, 1.0, 40_000, np.random.default_rng(2))
    counts = np.bincount(lens - 109, minlength=20)
    assert lens.min() >= 109 and lens.max() <= 128
    assert stats.chisquare(counts).pvalue > 1e-3
    assert dpgm.synthetic_lengths(np.full(5, 1.0), np.arange(6), 1.0, 3, rng) is None
    # the file keeps them; synthesis of the loaded model is the same
    path = tmp_path / "m.npz"
    model.save(path)
    back = dpgm.DPGMModel.load(path)
    np.testing.assert_array_equal(back.lengths, H)
    assert back.length_edges.tolist() == edges.tolist() and back.length_std == std
    np.testing.assert_array_equal(dpgm.synthesize(back, 300, 4), dpgm.synthesize(model, 300, 4))


def test_bin_slopes_closed_form():
    """Central differences of the log densities; one-sided next to an empty bin; 0 for a bin of
    width 1, an empty bin, or one with no neighbour; clipped to SLOPE_MAX."""
    edges = np.array([0, 1, 3, 6, 10, 12])  # widths 1, 2, 3, 4, 2
    w = np.array([10.0, 40.0, 30.0, 0.0, 8.0])  # densities 10, 20, 10, -, 4
    beta = dpgm.bin_slopes(w, edges)
    assert beta[0] == 0.0 and beta[3] == 0.0  # width 1; empty
    assert beta[1] == pytest.approx((math.log(10) - math.log(10)) / (4.0 - 0.0))
    assert beta[2] == pytest.approx((math.log(10) - math.log(20)) / (4.0 - 1.5))  # right neighbour empty
    assert beta[4] == 0.0  # no neighbour left (bin 3 is empty, none to the right)
    steep = dpgm.bin_slopes(np.array([1000.0, 10.0, 1.0]), np.array([0, 1, 3, 5]))
    assert steep[1] == -dpgm.SLOPE_MAX  # (log 0.5 - log 1000) / 3 = -2.5, clipped


def test_lengths_within_a_bin_follow_the_exponential_shape():
    """Within a bin, ``length - lo`` has probabilities proportional to ``exp(beta i)`` (chi-square
    against that closed form), and :func:`expected_length` is the closed-form mean."""
    edges = np.array([0, 1, 3, 6, 10, 12])
    w = np.array([10.0, 40.0, 30.0, 0.0, 8.0]) * 1000
    beta = math.log(0.5) / 2.5
    lens = dpgm.synthetic_lengths(w, edges, 1.0, 200_000, np.random.default_rng(3))
    inside = lens[(lens >= 3) & (lens < 6)] - 3
    p = np.exp(beta * np.arange(3))
    p /= p.sum()
    counts = np.bincount(inside, minlength=3)
    assert stats.chisquare(counts, p * counts.sum()).pvalue > 1e-3
    assert stats.chisquare(np.bincount(lens[(lens >= 1) & (lens < 3)] - 1)).pvalue > 1e-3  # beta 0: flat
    want = (10 * 0 + 40 * 1.5 + 30 * (3 + np.dot(p, np.arange(3))) + 8 * 10.5) / 88
    assert dpgm.expected_length(w, edges, 1.0) == pytest.approx(want)
    assert dpgm.expected_length(w, edges, 1.0, "uniform") == pytest.approx((40 * 1.5 + 30 * 4 + 8 * 10.5) / 88)
    with pytest.raises(ParameterError, match="within"):
        dpgm.synthetic_lengths(w, edges, 1.0, 5, np.random.default_rng(0), "linear")


def test_a_geometric_length_distribution_is_kept_within_the_bins():
    """Lengths ``P(m) ~ 0.85^m`` (1..128) binned as the release bins them (exact counts): drawn
    with the exponential shape the distribution is back to within 0.006 in total variation (0.003
    measured, 400,000 draws), where uniform within the bins is 0.023 off."""
    m = np.arange(1, 129)
    pm = 0.85 ** m
    pm /= pm.sum()
    edges = dpgm.length_edges(128)
    hist = np.array([pm[(m >= lo) & (m < hi)].sum() for lo, hi in zip(edges[:-1], edges[1:])]) * 1e6
    tv = {}
    for within in dpgm.WITHIN_BIN:
        lens = dpgm.synthetic_lengths(hist, edges, 1.0, 400_000, np.random.default_rng(5), within)
        got = np.bincount(lens, minlength=129)[1:] / lens.size
        tv[within] = 0.5 * np.abs(got - pm).sum()
    assert tv["exponential"] < 0.006 and tv["uniform"] > 0.018, tv


def test_lengths_bring_the_synthetic_lengths_to_the_data():
    """Two groups with 2.7 and 4.9 ones on average: the synthetic lengths' distribution with the
    histograms is within noise of the data's (chi-square on the exact lengths), the model's own
    is not required to be."""
    X = _two_groups(4000, seed=3)
    params = dpgm.DPGMParams(**{**P.public_dict(), "epsilon": 8.0, "accountant": "pld"})
    model, _ = dpgm.fit_dpgm_array(X, params, seed=5)
    S = dpgm.synthesize(model, 4000, seed=6)
    real = np.bincount(X.sum(1).astype(int), minlength=11)
    syn = np.bincount(S.sum(1).astype(int), minlength=11)
    keep = real > 20
    tv = 0.5 * np.abs(real / real.sum() - syn / syn.sum()).sum()
    assert tv < 0.05, (real, syn)
    assert syn[~keep].sum() < 0.02 * syn.sum()


def test_stream_of_the_length_noise_is_its_own():
    lp = dpgm.length_plan(P, 10)
    a = lp.release(np.zeros((2, lp.bins)), 3)
    b = lp.release(np.zeros((2, lp.bins)), 3)
    c = lp.release(np.zeros((2, lp.bins)), 4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    from sparkpriv.privacy import noise as nz

    np.testing.assert_array_equal(a, nz.add_noise(np.zeros((2, lp.bins)), lp.noise, stream(3, dpgm.LENGTH_STAGE)))


def test_a_format_3_model_loads_without_lengths(tmp_path):
    """Written before the length histograms: it loads, and synthesizes with the model's own lengths."""
    import io
    import json

    gen = RBM(6, 2)
    thetas = np.stack([gen.init(np.random.default_rng(j)) for j in range(2)])
    m = dpgm.DPGMModel(dpgm.DPGMParams(k=2, hidden=2, length_strata=0), 6, thetas, np.array([7.0, 3.0]),
                       np.zeros((2, 6)))
    z = np.load(io.BytesIO(m.to_bytes()))
    header = json.loads(bytes(z["header"]).decode())
    assert header["format_version"] == 7 and header["lengths"] is None
    header["format_version"] = 3
    del header["lengths"], header["length_strata"]
    header["params"].pop("length_strata")
    path = tmp_path / "v3.npz"
    np.savez(path, header=np.frombuffer(json.dumps(header).encode(), np.uint8), thetas=z["thetas"],
             sizes=z["sizes"], centers=z["centers"])
    back = dpgm.DPGMModel.load(path)
    assert back.lengths is None and back.length_edges is None
    np.testing.assert_array_equal(dpgm.synthesize(back, 200, 1), dpgm.synthesize(m, 200, 1))
    # written before format 6 with histograms: lengths uniform within a bin, as when it was written
    H = np.array([[0, 0, 0, 0, 0.0], [0, 9000, 0, 5000, 400]])  # bin [3, 5) before a steep fall
    mh = dpgm.DPGMModel(m.params, 6, thetas, m.sizes, m.centers, lengths=H, length_edges=np.array([0, 1, 2, 3, 5, 7]),
                        length_std=1.0)
    assert mh.length_within == "exponential"
    z = np.load(io.BytesIO(mh.to_bytes()))
    header = json.loads(bytes(z["header"]).decode())
    assert header["lengths"]["within_bin"] == "exponential"
    header["format_version"] = 5
    del header["lengths"]["within_bin"]
    np.savez(tmp_path / "v5.npz", header=np.frombuffer(json.dumps(header).encode(), np.uint8), thetas=z["thetas"],
             sizes=z["sizes"], centers=z["centers"], lengths=z["lengths"])
    old = dpgm.DPGMModel.load(tmp_path / "v5.npz")
    assert old.length_within == "uniform"
    assert dpgm.DPGMModel.load(io.BytesIO(mh.to_bytes())).length_within == "exponential"
    for model, flat in ((old, True), (mh, False)):
        lens = model.sample_cluster(RBM(6, 2), 1, 20_000, np.random.default_rng(2)).sum(axis=1)
        upper = np.bincount(lens[(lens >= 3) & (lens < 5)].astype(int) - 3, minlength=2)
        assert (stats.chisquare(upper).pvalue > 1e-3) == flat, upper
    # a histogram of the wrong shape is refused
    bad = dpgm.DPGMModel(m.params, 6, thetas, m.sizes, m.centers, lengths=np.zeros((3, 7)),
                         length_edges=dpgm.length_edges(6), length_std=1.0)
    with pytest.raises(ParameterError, match="length histograms"):
        dpgm.DPGMModel.load(io.BytesIO(bad.to_bytes()))
