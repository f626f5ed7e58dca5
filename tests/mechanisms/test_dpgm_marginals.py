"""DPGM's per-item counts and the shift of the mixture's marginals towards them: the plan and its
noise, the composed event, the release on both engines, the closed forms of the shift, and the
model file (docs/research/dpgm.md, "Calibrating the marginals")."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpgm
from sparkpriv.mechanisms.rbm import RBM
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.accounting import compose, epsilon_of
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.random import stream

L = 4
P = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, sampling_rate=0.1, epochs=1, hidden=4, accountant="rdp",
                    kmeans_iterations=3, row_bound=math.sqrt(L), marginal_share=0.1, marginal_samples=4000)


def _records(n=600, d=10, seed=0):
    """Binary rows of at most L items: half on the first columns, half on the last."""
    rng = np.random.default_rng(seed)
    X = np.zeros((n, d))
    X[: n // 2, :4] = rng.random((n // 2, 4)) < 0.6
    X[n // 2:, 4:] = rng.random((n - n // 2, d - 4)) < 0.4
    for r in range(n):  # keep at most L items (the bound the sensitivity rests on)
        on = np.flatnonzero(X[r])
        X[r, on[L:]] = 0.0
    return X


# ----------------------------------------------------------------------------- plan and accounting


def test_item_count_noise_is_calibrated_alone_to_its_share():
    mp = dpgm.marginal_plan(P, 10)
    # a replaced record of at most L items moves the d counts by x' - x: ||.||^2 <= 2 L
    assert mp.sensitivity == pytest.approx(math.sqrt(2 * L)) and mp.noise.sensitivity == pytest.approx(math.sqrt(8))
    assert mp.noise.std >= math.sqrt(2 * L) / gdp_mu_for(0.2, 1e-5) * (1 - 1e-9)  # alone at (0.1 epsilon, delta)
    assert 0.19 < epsilon_of(mp.dp_event(), 1e-5) <= 0.2
    assert mp.noise_var == pytest.approx(mp.noise.std ** 2)
    # no row bound declared: a row of [0, 1]^d is at most sqrt(d) long; a declared bound above it is cut
    assert dpgm.marginal_plan(dataclasses.replace(P, row_bound=None), 10).sensitivity == pytest.approx(math.sqrt(20))
    assert dpgm.marginal_plan(dataclasses.replace(P, row_bound=9.0), 10).sensitivity == pytest.approx(math.sqrt(20))
    # a bound whose square is not an integer is used as it is (rows of a table are scaled onto it)
    assert dpgm.marginal_plan(dataclasses.replace(P, row_bound=2.5), 10).sensitivity == pytest.approx(2.5 * math.sqrt(2))


def test_the_release_composes_the_item_counts_event_and_dpsgd_gets_the_rest():
    plan = dpgm.plan_dpgm(P, n=600, d=10)
    events = [plan.kmeans.dp_event(), plan.lengths.dp_event(), plan.marginals.dp_event(), plan.dpsgd_event()]
    assert plan.dp_event() == compose(events)
    assert plan.epsilon_spent() <= 2.0
    none = dpgm.plan_dpgm(dataclasses.replace(P, marginal_share=0.0), n=600, d=10)
    assert none.marginals is None and plan.noise_multiplier > none.noise_multiplier
    # the protocol's recorded event (before any data) holds the same item counts event
    kplan, sigma = dpgm.calibrate_dpgm(P, 10)
    assert plan.marginals.dp_event() in dpgm.requested_event(P, kplan, sigma, 10).events
    with pytest.raises(ParameterError, match="give d"):
        dpgm.requested_event(dataclasses.replace(P, length_share=0.0), kplan, sigma)
    assert "item counts" in dpgm.accounting_note(P) and "item counts" not in dpgm.accounting_note(
        dataclasses.replace(P, marginal_share=0.0))
    assert plan.to_public_dict()["marginals"]["share_of_epsilon"] == 0.1


@pytest.mark.parametrize("change,match", [
    (dict(model="vae", length_share=0.0), "marginal_share.*rbm"),
    (dict(kmeans_share=0.5, length_share=0.3, marginal_share=0.2), "kmeans_share \\+ length_share \\+ marginal_share"),
    (dict(marginal_share=1.0), "marginal_share"),
    (dict(marginal_share=-0.1), "marginal_share"),
    (dict(marginal_samples=0), "marginal_samples"),
])
def test_bad_marginal_parameters_are_refused(change, match):
    with pytest.raises(ParameterError, match=match):
        dpgm.plan_dpgm(dataclasses.replace(P, **change), n=600, d=10)


# ----------------------------------------------------------------------------- closed forms of the shift


def test_shift_mixture_marginals_and_samples_closed_forms():
    c = np.array([100.0, -5.0, 0.0, 40.0])
    m = np.array([50.0, 10.0, 0.0, 40.0])
    v = np.array([4.0, 1.0, 0.0, 2.0])
    tau2, sigma2 = 0.25, 21.0
    lam = tau2 * m ** 2 / (tau2 * m ** 2 + sigma2 + v)  # 625/650, 25/47, 0, 400/423
    want = np.log((m + lam * (np.maximum(c, 0) - m) + 1) / (m + 1))  # a negative count is 0
    np.testing.assert_allclose(dpgm.marginal_shift(c, m, sigma2, v, tau2), want)
    assert want[0] == pytest.approx(math.log((50 + 50 * 625 / 650 + 1) / 51))
    assert want[2] == 0.0 and want[3] == 0.0  # an empty item, and an item the model already has
    # no model error: nothing moves; a model error far above the noises: the counts themselves
    np.testing.assert_array_equal(dpgm.marginal_shift(c, m, sigma2, v, 0.0), np.zeros(4))
    np.testing.assert_allclose(dpgm.marginal_shift(c, m, 0.0, 0.0, 1e12)[:2], np.log([101 / 51, 1 / 11]))
    with pytest.raises(ParameterError, match="noise_var and tau2"):
        dpgm.marginal_shift(c, m, -1.0, v, tau2)
    # tau^2 by the method of moments: sum((c - m)^2 - sigma^2 - v) / sum(m^2), at least 0
    excess = (50 ** 2 - 21 - 4) + (15 ** 2 - 21 - 1) + (0 - 21 - 0) + (0 - 21 - 2)  # the raw counts
    assert dpgm.model_error(c, m, sigma2, v) == pytest.approx(excess / (2500 + 100 + 0 + 1600))
    assert dpgm.model_error(m, m, sigma2, v) == 0.0
    # (s1 | s2) per cluster; w = (1, 3, 0) / 4; cluster 2 has no weight (and no samples): it adds nothing
    sums = np.array([[10.0, 0.0, 6.0, 0.0], [3.0, 6.0, 1.0, 2.0], [9.0, 9.0, 9.0, 9.0]])
    got, var = dpgm.mixture_marginals(sums, [20, 30, 0], [100.0, 300.0, -4.0], n=800)
    np.testing.assert_allclose(got, [800 * (0.25 * 10 / 20 + 0.75 * 3 / 30), 800 * (0.75 * 6 / 30)])
    var0 = (6.0 - 20 * 0.5 ** 2) / 19  # cluster 0, item 0: sample variance of its records' means
    var1 = [(1.0 - 30 * 0.1 ** 2) / 29, (2.0 - 30 * 0.2 ** 2) / 29]
    np.testing.assert_allclose(var, [800 ** 2 * (0.25 ** 2 * var0 / 20 + 0.75 ** 2 * var1[0] / 30),
                                     800 ** 2 * (0.75 ** 2 * var1[1] / 30)])
    mp = dpgm.marginal_plan(P, 10)
    assert mp.cluster_samples([100.0, 300.0, 0.0]).tolist() == [1000, 3000, 0]
    assert mp.cluster_samples([0.0, 0.0]).tolist() == [2000, 2000]  # no size left: uniform, as synthesis
    d, h = 3, 2
    gen = RBM(d, h, strata=(1,))
    thetas = np.arange(2 * gen.dim, dtype=float).reshape(2, gen.dim)
    out = dpgm.shift_visible_biases(thetas, np.array([1.0, 2.0, 3.0]), d, h)
    for j in range(2):
        W, b, cc = gen.unpack(out[j])
        W0, b0, c0 = gen.unpack(thetas[j])
        np.testing.assert_array_equal(W, W0)
        np.testing.assert_array_equal(cc, c0)
        np.testing.assert_array_equal(gen.offsets(out[j]), gen.offsets(thetas[j]))
        np.testing.assert_array_equal(b, b0 + [1.0, 2.0, 3.0])


def test_the_measured_marginals_and_the_shift_of_independent_models():
    """RBMs with W = 0 are independent Bernoullis, p_j = sigmoid(b_j): each record counts as its
    mean given its hidden units, exactly p_j, so the measured sums are ``S_j p_j`` (no sampling
    error left), and the shifted models' exact marginals are ``n sum_j w_j sigmoid(b_j + shift)``,
    closer to the counts than before."""
    d, n = 6, 10_000
    params = dataclasses.replace(P, length_share=0.0, hidden=2, marginal_samples=60_000)
    plan = dpgm.plan_dpgm(params, n=n, d=d)
    gen = dpgm._make_model(params, d)
    b = np.array([[-2.0, -1.0, 0.0, 1.0, -3.0, 0.5], [0.5, -2.0, -1.0, -1.5, -0.5, -4.0]])
    thetas = np.zeros((2, gen.dim))
    thetas[:, d * 2: d * 2 + d] = b
    sizes = np.array([2500.0, 7500.0])
    samples = plan.marginals.cluster_samples(sizes)
    assert samples.tolist() == [15_000, 45_000]
    sums = np.stack([dpgm.marginal_sums(plan, thetas[j], j, samples[j], 5, None) for j in range(2)])
    p = 1 / (1 + np.exp(-b))
    w = sizes / sizes.sum()
    for j in range(2):  # each record's mean given its hidden units is p_j: the sums are S_j p_j (and S_j p_j^2)
        np.testing.assert_allclose(sums[j], samples[j] * np.concatenate([p[j], p[j] ** 2]), rtol=1e-9)
    target = np.array([3000.0, 1500.0, 2500.0, 4000.0, 2000.0, 500.0])
    new, shift, public = dpgm.calibrate_marginals(plan, thetas, sums, sizes, target)
    m, v = dpgm.mixture_marginals(sums, samples, sizes, n)
    np.testing.assert_allclose(v, 0.0, atol=1e-6)  # no sampling variance left
    tau2 = dpgm.model_error(target, m, plan.marginals.noise_var, v)  # 6 items: one band
    np.testing.assert_allclose(shift, dpgm.marginal_shift(target, m, plan.marginals.noise_var, v, tau2))
    assert public["model_error"] == pytest.approx(math.sqrt(tau2)) and tau2 > 0.1
    exact_before = n * (w[:, None] * p).sum(axis=0)
    exact_after = n * (w[:, None] / (1 + np.exp(-(b + shift)))).sum(axis=0)
    # one step of log((c + s) / (m + s)) on the logits: exact for rare items, short of the target for
    # common ones (the logit is not the log of p there), never past it on these
    assert np.all(np.abs(exact_after - target) < np.abs(exact_before - target))
    assert np.abs(exact_after - target).sum() < 0.5 * np.abs(exact_before - target).sum()
    assert public["samples_per_cluster"] == [15_000, 45_000]
    assert public["gap_before"] == pytest.approx(np.abs(m - target).sum() / target.sum())


# ----------------------------------------------------------------------------- the release


def test_the_shift_trusts_the_counts_as_far_as_they_beat_the_models():
    """Items with true counts ``t = mu (1 + e)``, ``e ~ N(0, tau^2)``, noisy counts ``c = t + N(0,
    sigma^2)``, the models' marginals ``m = mu + N(0, v)``: ``tau`` is recovered by the method of
    moments, the shifted marginals ``m e^shift`` are closer to ``t`` than both the models' and the
    counts; and where the models already meet the counts (``tau = 0``) nothing moves."""
    rng = np.random.default_rng(4)
    d, sigma, v = 4000, 150.0, np.full(4000, 40.0 ** 2)
    mu = rng.uniform(500.0, 6000.0, d)
    for tau in (0.05, 0.0):
        t = mu * (1 + tau * rng.standard_normal(d))
        c = t + sigma * rng.standard_normal(d)
        m = mu + np.sqrt(v) * rng.standard_normal(d)
        tau2 = dpgm.model_error(c, m, sigma ** 2, v)
        shifted = m * np.exp(dpgm.marginal_shift(c, m, sigma ** 2, v, tau2))
        if tau > 0:
            assert math.sqrt(tau2) == pytest.approx(tau, rel=0.05)
            mse = lambda a: float(np.mean((a - t) ** 2))  # noqa: E731
            assert mse(shifted) < 0.8 * min(mse(m), mse(c)), (mse(shifted), mse(m), mse(c))
        else:
            assert tau2 < 2e-5  # the method of moments' spread at this d: about 1e-5
            assert np.abs(shifted / m - 1).max() < 0.02


def test_error_bands_and_the_banded_model_error():
    """Bands of equal size by marginal, the most common first; each item's tau^2 its band's method
    of moments. Simulated: common items off by 2 %, rare ones by 30 % (as the CDR models were): the
    bands recover both, and their shift is closer to the truth than one tau for all."""
    m = np.array([5.0, 50.0, 20.0, 20.0, 1.0] * 20)
    bands = dpgm.error_bands(m, bands=8, least=25)  # 100 items: 4 bands of 25
    assert [b.size for b in bands] == [25] * 4
    assert all(m[a].min() >= m[b].max() for a, b in zip(bands, bands[1:]))
    assert m[bands[0]].tolist() == [50.0] * 20 + [20.0] * 5 and np.all(m[bands[3]] <= 5.0)
    assert bands[1].tolist() == sorted(bands[1].tolist())  # ties in index order
    assert len(dpgm.error_bands(m[:30], bands=8, least=25)) == 1
    rng = np.random.default_rng(9)
    d, sigma = 4000, 200.0
    mu = np.concatenate([rng.uniform(40_000, 90_000, d // 2), rng.uniform(1_000, 4_000, d // 2)])
    tau = np.where(mu > 10_000, 0.02, 0.3)
    t = mu * (1 + tau * rng.standard_normal(d))
    c = t + sigma * rng.standard_normal(d)
    tau2, by_band = dpgm.banded_model_error(c, mu, sigma ** 2, 0.0, bands=2)
    assert [k for k, _ in by_band] == [2000, 2000]
    assert by_band[0][1] == pytest.approx(0.02, rel=0.1) and by_band[1][1] == pytest.approx(0.3, rel=0.1)
    np.testing.assert_allclose(np.sqrt(tau2), np.where(mu > 10_000, by_band[0][1], by_band[1][1]))
    one = dpgm.model_error(c, mu, sigma ** 2, 0.0)
    mse = lambda tt: float(np.mean((mu * np.exp(dpgm.marginal_shift(c, mu, sigma ** 2, 0.0, tt)) - t) ** 2))  # noqa: E731
    rare = mu < 10_000
    err_banded = np.abs(mu * np.exp(dpgm.marginal_shift(c, mu, sigma ** 2, 0.0, tau2)) - t)[rare].mean()
    err_one = np.abs(mu * np.exp(dpgm.marginal_shift(c, mu, sigma ** 2, 0.0, one)) - t)[rare].mean()
    assert err_banded < 0.6 * err_one and mse(tau2) <= mse(one)


def test_in_memory_release_adds_the_noise_to_the_exact_counts_and_shifts_the_models():
    """At epsilon 8 the models' marginals are off by more than the counts' noise (tau > 0)."""
    X = _records()
    model, plan = dpgm.fit_dpgm_array(X, dataclasses.replace(P, epsilon=8.0), seed=11)
    exact = X.sum(axis=0)  # the auditor's counts: the rows are within the bound, nothing is scaled
    np.testing.assert_allclose(model.item_counts, nz.add_noise(exact, plan.marginals.noise,
                                                               stream(11, dpgm.MARGINAL_STAGE)), atol=1e-9)
    # the same release without the shift: the models differ by exactly the shift in the visible biases
    d, h = 10, P.hidden
    shifted = dpgm.shift_visible_biases(np.zeros_like(model.thetas), model.marginal_shift, d, h)
    assert np.count_nonzero(shifted) == 2 * d and np.all(np.isfinite(model.marginal_shift))
    # the shift is the closed form of the sampled sums (recomputed from the unshifted models)
    unshifted = model.thetas - shifted
    samples = plan.marginals.cluster_samples(model.sizes)
    sums = np.stack([dpgm.marginal_sums(plan, unshifted[j], j, samples[j], 11, model.lengths) for j in range(2)])
    m, v = dpgm.mixture_marginals(sums, samples, model.sizes, X.shape[0])
    tau2, by_band = dpgm.banded_model_error(model.item_counts, m, plan.marginals.noise_var, v)
    assert len(by_band) == 1  # 10 items: one band
    np.testing.assert_allclose(model.marginal_shift,
                               dpgm.marginal_shift(model.item_counts, m, plan.marginals.noise_var, v, tau2),
                               rtol=1e-9, atol=1e-12)
    record = model.plan_public["marginal_calibration"]
    assert record["samples_per_cluster"] == samples.tolist()
    one = dpgm.model_error(model.item_counts, m, plan.marginals.noise_var, v)
    assert one > 0 and record["model_error"] == pytest.approx(math.sqrt(one))
    assert record["model_error_by_band"] == [{"items": 10, "tau": pytest.approx(math.sqrt(one))}]


def test_the_shift_is_reproduced_from_the_model_file_alone(tmp_path):
    """``model_sums`` (cluster ``j`` of a saved model, its length histograms and strata read from
    the file) draws the sums a release's training task drew, and ``calibration`` gives the
    release's shift and record from them: the plan-free path of ``calibrate_marginals``."""
    X = _records()
    model, plan = dpgm.fit_dpgm_array(X, dataclasses.replace(P, epsilon=8.0), seed=11)
    model.save(tmp_path / "m.npz")
    back = dpgm.DPGMModel.load(tmp_path / "m.npz")
    unshifted = dataclasses.replace(back, thetas=back.thetas - dpgm.shift_visible_biases(
        np.zeros_like(back.thetas), back.marginal_shift, 10, P.hidden))
    per = dpgm.cluster_samples(P.marginal_samples, back.sizes)
    np.testing.assert_array_equal(per, plan.marginals.cluster_samples(model.sizes))
    assert per.sum() >= P.marginal_samples and np.all(per > 0)
    for j in range(2):  # the same records as the plan's path on the same parameters
        np.testing.assert_array_equal(dpgm.model_sums(unshifted, j, per[j], 11),
                                      dpgm.marginal_sums(plan, unshifted.thetas[j], j, per[j], 11, model.lengths))
    sums = np.stack([dpgm.model_sums(unshifted, j, per[j], 11) for j in range(2)])
    shift, record = dpgm.calibration(back.item_counts, sums, per, back.sizes, X.shape[0], plan.marginals.noise_var)
    np.testing.assert_allclose(shift, model.marginal_shift, rtol=1e-7, atol=1e-10)
    want = model.plan_public["marginal_calibration"]
    assert record["samples_per_cluster"] == want["samples_per_cluster"]
    for key in ("gap_before", "model_error", "sampling_std_total"):
        assert record[key] == pytest.approx(want[key], rel=1e-7), key
    # another seed draws other records: the sums are the seed's, not a constant
    assert not np.array_equal(dpgm.model_sums(unshifted, 0, per[0], 12), sums[0])


def test_table_rows_longer_than_the_bound_are_counted_as_the_kmeans_scales_them():
    X = _records()
    X[:5] = 1.0  # 10 items, longer than the row bound sqrt(4): scaled onto it (norm 2)
    model, plan = dpgm.fit_dpgm_array(X, P, seed=4)
    norms = np.linalg.norm(X, axis=1)
    exact = (X * np.minimum(1.0, 2.0 / np.maximum(norms, 1e-12))[:, None]).sum(axis=0)
    np.testing.assert_allclose(model.item_counts, nz.add_noise(exact, plan.marginals.noise,
                                                               stream(4, dpgm.MARGINAL_STAGE)), atol=1e-9)


def test_the_shift_brings_the_synthetic_marginals_to_the_data():
    """Seeded: synthetic marginals of the same release with and without the calibration (the
    calibrated release spends a tenth of epsilon on the counts)."""
    X = _records(n=3000, seed=2)
    errs = []
    for share in (0.0, 0.1):
        params = dataclasses.replace(P, epsilon=4.0, marginal_share=share, marginal_samples=20_000)
        model, _ = dpgm.fit_dpgm_array(X, params, seed=3)
        S = dpgm.synthesize(model, 30_000, 1)
        errs.append(np.abs(S.mean(axis=0) * X.shape[0] - X.sum(axis=0)).sum() / X.sum())
    assert errs[1] < 0.8 * errs[0], errs


@pytest.mark.parametrize("quantile", [None, 0.5], ids=["declared-clip", "quantile-clip"])
def test_release_on_the_local_engine_equals_the_numpy_reference(monkeypatch, quantile):
    """The engine's tasks return the parameters, the final clip (quantile clipping) and the sampled
    sums in one vector: the release must take each where it is."""
    from sparkpriv.api import release_dpgm

    X = _records(n=300)
    # epsilon 16: the models' marginals are off by more than the counts' noise, so the shift moves
    kw = dict(P.public_dict(), epsilon=16.0, marginal_samples=2000, clip_quantile=quantile)
    monkeypatch.setattr(dpgm._mechanism, "new_secret_seed", lambda purpose: 77)
    rel = release_dpgm(X, **{k: v for k, v in kw.items() if v is not None})
    model, plan = dpgm.fit_dpgm_array(X, dpgm.DPGMParams(**kw), seed=77)
    np.testing.assert_allclose(rel.model.item_counts, model.item_counts, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(rel.model.marginal_shift, model.marginal_shift, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rel.model.thetas, model.thetas, rtol=1e-9, atol=1e-12)
    got, want = rel.model.plan_public["marginal_calibration"], model.plan_public["marginal_calibration"]
    assert want["model_error"] > 0 and np.any(model.marginal_shift != 0)
    for key in ("gap_before", "model_error", "sampling_std_total"):  # the sums, then the sums of squares
        assert got[key] == pytest.approx(want[key], rel=1e-9), key
    assert rel.epsilon == epsilon_of(rel.events, 1e-5) <= 16.0
    assert plan.marginals.dp_event() in rel.events.events
    assert rel.public["item_counts"]["share_of_epsilon"] == 0.1
    if quantile is not None:
        assert rel.model.plan_public["final_clips"]["values"] == pytest.approx(
            model.plan_public["final_clips"]["values"])


def test_the_model_file_keeps_the_counts_and_the_shift(tmp_path):
    X = _records(n=300)
    model, _ = dpgm.fit_dpgm_array(X, dataclasses.replace(P, marginal_samples=500), seed=1)
    model.save(tmp_path / "m.npz")
    back = dpgm.DPGMModel.load(tmp_path / "m.npz")
    np.testing.assert_array_equal(back.item_counts, model.item_counts)
    np.testing.assert_array_equal(back.marginal_shift, model.marginal_shift)
    np.testing.assert_array_equal(back.thetas, model.thetas)
    np.testing.assert_array_equal(dpgm.synthesize(back, 200, 3), dpgm.synthesize(model, 200, 3))
    plain, _ = dpgm.fit_dpgm_array(X, dataclasses.replace(P, marginal_share=0.0), seed=1)
    plain.save(tmp_path / "p.npz")
    assert dpgm.DPGMModel.load(tmp_path / "p.npz").item_counts is None
    bad = dataclasses.replace(model, item_counts=np.zeros(3))
    bad.save(tmp_path / "bad.npz")
    with pytest.raises(ParameterError, match="item counts"):
        dpgm.DPGMModel.load(tmp_path / "bad.npz")


def test_the_sampling_streams_are_their_own():
    """The records that measure the marginals come from their own keyed streams (batch by batch):
    a retried task draws the same sums, another seed other ones."""
    plan = dpgm.plan_dpgm(dataclasses.replace(P, length_share=0.0), n=600, d=10)
    theta = dpgm._make_model(plan.params, 10).init(np.random.default_rng(0))
    a = dpgm.marginal_sums(plan, theta, 1, 3000, 9, None)
    np.testing.assert_array_equal(a, dpgm.marginal_sums(plan, theta, 1, 3000, 9, None))
    assert not np.array_equal(a, dpgm.marginal_sums(plan, theta, 1, 3000, 10, None))
    assert not np.array_equal(a, dpgm.marginal_sums(plan, theta, 0, 3000, 9, None))
    assert len({dpgm.MARGINAL_STAGE, dpgm.MARGINAL_SAMPLE_STAGE, dpgm.LENGTH_STAGE, dpgm.CHAIN_STAGE,
                dpgm.SYNTH_STAGE}) == 5
