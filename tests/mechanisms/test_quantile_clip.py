"""Quantile (adaptive) clipping of DP-SGD (Andrew et al. 2021; docs/math.md section 5.1):
the combined step event against closed forms and dp_accounting, calibration, the clip update
against the true quantile of known norms, each record's effect on the released vector, DPGM."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event as ev
from dp_accounting.pld import pld_privacy_accountant

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpgm, dpsgd
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.calibration import gdp_epsilon_delta, gdp_mu_for
from sparkpriv.privacy.random import stream
from tests.dpsgd_models import Identity


def _dp_accounting_eps(event, delta):
    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4)
    acc.compose(event)
    return acc.get_epsilon(delta)


# ----------------------------------------------------------------------------- (a) the step event


@pytest.mark.parametrize("sigma,sigma_b", [(3.0, 5.0), (3.0, 2.0)], ids=["same-cluster-binds", "two-clusters-bind"])
def test_full_batch_event_is_the_effective_gaussian(sigma, sigma_b):
    """q = 1: T steps of one Gaussian with mu^2 = T max(4/s^2 + 1/sb^2, 2/s^2 + 2/sb^2), i.e. the
    larger of the two compositions of the sum's and the count's Gaussians (one record replaced
    in a data set: Gaussian(s/2) and Gaussian(sb); records in two clusters: Gaussian(s/sqrt 2)
    and Gaussian(sb/sqrt 2)), each accounted by dp_accounting itself."""
    T, delta = 9, 1e-5
    e = dpsgd.quantile_event(1.0, sigma, sigma_b, T)
    mu = math.sqrt(T * max(4 / sigma**2 + 1 / sigma_b**2, 2 / sigma**2 + 2 / sigma_b**2))
    assert dpsgd.quantile_step_multiplier(sigma, sigma_b) == pytest.approx(math.sqrt(T) / mu, rel=1e-12)
    ours = epsilon_of(e, delta)
    assert ours == pytest.approx(gdp_epsilon_delta(mu, delta), rel=2e-3)
    assert ours >= gdp_epsilon_delta(mu, delta) - 1e-9
    same = ev.SelfComposedDpEvent(ev.ComposedDpEvent([ev.GaussianDpEvent(sigma / 2),
                                                      ev.GaussianDpEvent(sigma_b)]), T)
    split = ev.SelfComposedDpEvent(ev.ComposedDpEvent([ev.GaussianDpEvent(sigma / math.sqrt(2)),
                                                       ev.GaussianDpEvent(sigma_b / math.sqrt(2))]), T)
    theirs = max(_dp_accounting_eps(same, delta), _dp_accounting_eps(split, delta))
    assert ours == pytest.approx(theirs, rel=2e-3)


def test_count_share_sets_the_split():
    """share s <= 1/3: 1/sb^2 = s / z^2 and 4/s^2 = (1 - s) / z^2, so z = sigma sqrt(1 - s) / 2."""
    for s in (0.01, 0.05, 0.2, 1 / 3):
        sb = dpsgd.count_noise_std(2.0, s)
        z = dpsgd.quantile_step_multiplier(2.0, sb)
        assert z == pytest.approx(2.0 * math.sqrt(1 - s) / 2, rel=1e-12)
        assert (1 / sb**2) * z**2 == pytest.approx(s, rel=1e-12)
    with pytest.raises(ParameterError, match="count_share"):
        dpsgd.count_noise_std(2.0, 0.5)


def test_sampled_event_is_poisson_sampled_effective_gaussian():
    z = dpsgd.quantile_step_multiplier(1.7, 9.0)
    assert dpsgd.quantile_event(0.03, 1.7, 9.0, 50) == ev.SelfComposedDpEvent(
        ev.PoissonSampledDpEvent(0.03, ev.GaussianDpEvent(z)), 50)


# ----------------------------------------------------------------------------- (b) calibration


def test_calibration_meets_the_request_and_is_tight():
    eps, delta, q, T, s = 1.0, 1e-5, 0.02, 300, 0.05
    sig = dpsgd.calibrate_noise_multiplier(epsilon=eps, delta=delta, sampling_rate=q, steps=T, count_share=s)
    sb = dpsgd.count_noise_std(sig, s)
    assert epsilon_of(dpsgd.quantile_event(q, sig, sb, T), delta) <= eps
    lower = sig / 1.01
    assert epsilon_of(dpsgd.quantile_event(q, lower, dpsgd.count_noise_std(lower, s), T), delta) > eps
    # against the declared clip: the gradient noise grows by 1 / sqrt(1 - s)
    sig0 = dpsgd.calibrate_noise_multiplier(epsilon=eps, delta=delta, sampling_rate=q, steps=T)
    assert sig / sig0 == pytest.approx(1 / math.sqrt(1 - s), rel=3e-3)


def test_calibration_full_batch_closed_form():
    """q = 1: z_eff = sqrt(T) / mu(eps, delta) and sigma = 2 z_eff / sqrt(1 - s)."""
    T, s = 16, 0.1
    sig = dpsgd.calibrate_noise_multiplier(epsilon=2.0, delta=1e-5, sampling_rate=1.0, steps=T, count_share=s)
    assert sig == pytest.approx(2 * math.sqrt(T) / gdp_mu_for(2.0, 1e-5) / math.sqrt(1 - s), rel=2e-3)


def test_calibration_refuses_add_remove():
    with pytest.raises(ParameterError, match="replace-one"):
        dpsgd.calibrate_noise_multiplier(epsilon=1, delta=1e-5, sampling_rate=0.1, steps=10,
                                         neighbors="add-remove", count_share=0.05)


# ----------------------------------------------------------------------------- (c) the clip update


@pytest.mark.parametrize("quantile,start", [(0.5, 100.0), (0.5, 0.01), (0.9, 100.0), (0.2, 0.01)])
def test_clip_follows_the_quantile_of_known_norms(quantile, start):
    """Known norms (log-normal, median 1): with tiny noise the clip goes to the gamma-quantile,
    where a fraction gamma of the norms is at most C (the update's fixed point)."""
    rng = np.random.default_rng(4)
    n = 4000
    norms = np.exp(rng.normal(0.0, 1.0, n))
    X = np.zeros((n, 2))
    X[:, 0] = norms
    cnoise = dpsgd.count_noise(count_std=1e-3, max_rows=n)
    ad = dpsgd.QuantileClip(quantile, 0.2, dpsgd.gradient_noise(noise_multiplier=1e-3, dim=2, max_rows=n), cnoise)
    info: dict = {}
    dpsgd.train(Identity(2), X, np.zeros(2), clip=start, sampling_rate=0.5, steps=300, noise=None, n_pub=n,
                seed=5, adaptive=ad, info=info)
    truth = float(np.quantile(norms, quantile))
    tail = info["clips"][-100:]
    assert abs(math.log(info["clip"] / truth)) < 0.15
    assert abs(math.log(np.exp(np.log(tail).mean()) / truth)) < 0.08
    assert abs(np.mean(norms <= info["clip"]) - quantile) < 0.05
    assert info["clips"][0] == start


def test_update_clip_closed_form_and_clamp():
    c = dpsgd.update_clip(2.0, 30.0, sampling_rate=0.5, n_pub=100, quantile=0.5, lr=0.2, clip0=2.0)
    assert c == pytest.approx(2.0 * math.exp(-0.2 * (0.6 - 0.5)))
    # b is not clamped to [0, 1] (unbiased): a negative noisy count raises the clip more
    assert dpsgd.update_clip(2.0, -50.0, sampling_rate=0.5, n_pub=100, quantile=0.5, lr=0.2, clip0=2.0) == \
        pytest.approx(2.0 * math.exp(-0.2 * (-1.0 - 0.5)))
    assert dpsgd.update_clip(1e-6, 1e9, sampling_rate=0.5, n_pub=100, quantile=0.5, lr=100.0, clip0=1.0) == \
        pytest.approx(1.0 / dpsgd.CLIP_RANGE)


# ----------------------------------------------------------------------------- (d) one record's effect


def _mean_of(model, theta, sigma, sigma_b, clip):
    """X -> the released vector's mean in noise units (full batch): (sum / (sigma C), count / sigma_b)."""

    def mean(X):
        s, c = dpsgd.clipped_sum_and_count(model, X, theta, clip)
        return np.concatenate([np.ravel(s) / (sigma * clip), [c / sigma_b]])

    return mean


def test_record_effect_is_within_the_analytic_bound():
    """Replace one record (RBM gradients, random records): the released vector's mean moves by at
    most sqrt(4/s^2 + 1/sb^2); adding one by at most sqrt(1/s^2 + 1/sb^2); the bounds are attained
    (identity model: a record of norm exactly C, counted, against one clipped from -5C, not counted)."""
    from sparkpriv.mechanisms.rbm import RBM

    sigma, sigma_b, C = 1.3, 4.0, 0.7
    rbm = RBM(6, 3)
    m = _mean_of(rbm, rbm.init(stream(1, 2)) * 5, sigma, sigma_b, C)
    rng = np.random.default_rng(2)
    X = (rng.random((40, 6)) < 0.5).astype(float)
    base = m(X)
    rep_bound = math.sqrt(4 / sigma**2 + 1 / sigma_b**2)
    add_bound = math.sqrt(1 / sigma**2 + 1 / sigma_b**2)
    worst = 0.0
    for i in range(200):
        Xp = X.copy()
        Xp[i % 40] = (rng.random(6) < rng.random()).astype(float)
        worst = max(worst, float(np.linalg.norm(m(Xp) - base)))
        assert np.linalg.norm(m(X[np.arange(40) != i % 40]) - base) \
            <= add_bound * (1 + 1e-12)
    assert worst <= rep_bound * (1 + 1e-12)
    # attained: identity model
    m = _mean_of(Identity(3), np.zeros(3), sigma, sigma_b, C)
    rest = np.zeros((5, 3))
    x, xp = np.array([C, 0, 0]), np.array([-5 * C, 0, 0])
    d = m(np.vstack([rest, x])) - \
        m(np.vstack([rest, xp]))
    assert np.linalg.norm(d) == pytest.approx(rep_bound, rel=1e-12)
    # two clusters: x counted and clipped in cluster a, x' in cluster b (stacked vectors)
    a = m(np.vstack([rest, x])) - m(rest)
    b = m(rest) - m(np.vstack([rest, x]))
    two = math.sqrt(float(a @ a + b @ b))
    assert two == pytest.approx(math.sqrt(2 / sigma**2 + 2 / sigma_b**2), rel=1e-12)
    assert dpsgd.quantile_step_multiplier(sigma, sigma_b) == pytest.approx(1 / max(rep_bound, two), rel=1e-12)


def test_step_noises_cover_the_calibrated_multipliers():
    """The noise of sum / C_t (event relative to 1) has multiplier >= sigma: a one-sided change (1)
    costs at most 1/sigma in mu and a replacement (2) at most 2/sigma; the count's >= sigma_b."""
    g = dpsgd.gradient_noise(noise_multiplier=1.3, dim=500, max_rows=10**6)
    assert g.dp_event().noise_multiplier >= 1.3
    assert g.std == pytest.approx(1.3, rel=1e-3) and g.std >= 1.3 * (1 - 1e-12)
    one = (1 / g.grid + math.sqrt(500)) / g.sigma + nz.sampler_slack(500)
    two = (2 / g.grid + math.sqrt(500)) / g.sigma + nz.sampler_slack(500)
    assert one <= 1 / 1.3 and two <= 2 / 1.3
    assert g.max_abs_value >= 1e6
    c = dpsgd.count_noise(count_std=7.5, max_rows=10**6)
    assert c.dp_event().noise_multiplier >= 7.5 and c.max_abs_value >= 1e6


def test_dp_step_quantile_matches_the_auditors_computation():
    C, q, n = 0.7, 0.6, 6
    X = np.vstack([np.zeros((5, 3)), [[3.0, 0, 0]]])
    gn = dpsgd.gradient_noise(noise_multiplier=2.0, dim=3, max_rows=n)
    ad = dpsgd.QuantileClip(0.5, 0.2, gn, dpsgd.count_noise(count_std=3.0, max_rows=n))
    g, _, b, cnt = dpsgd.dp_step_quantile(Identity(3), X, np.zeros(3), None, clip=C, sampling_rate=q, adaptive=ad,
                                          n_pub=6.0, seed=9, cluster=2, step=4)
    mask = dpsgd.poisson_mask(n, q, stream(9, dpsgd.SAMPLE_STAGE, 2, 4))
    s = np.array([1.0, 0, 0]) * mask[-1]  # the clipped sum over C: the canary clipped to C e1
    assert np.array_equal(g, C * nz.add_noise(s, gn, stream(9, dpsgd.NOISE_STAGE, 2, 4)) / (q * 6.0))
    mine = nz.add_noise(np.array([float(mask[:5].sum())]), ad.count_noise, stream(9, dpsgd.COUNT_STAGE, 2, 4))[0]
    assert cnt == mine and b == int(mask.sum())


# ----------------------------------------------------------------------------- (f) DPGM


def _binary(n=400, d=10, seed=0):
    rng = np.random.default_rng(seed)
    p = np.where(np.arange(n)[:, None] < n // 2, 0.8, 0.15)
    return (rng.random((n, d)) < p).astype(float)


def test_dpgm_with_quantile_clipping_meets_the_request():
    params = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, hidden=4, sampling_rate=0.5, epochs=3, clip=10.0,
                             clip_quantile=0.5)
    model, plan = dpgm.fit_dpgm_array(_binary(), params, seed=3)
    assert plan.epsilon_spent() <= 2.0
    kplan, sigma = dpgm.calibrate_dpgm(params, 10)
    assert epsilon_of(dpgm.requested_event(params, kplan, sigma, 10), 1e-5) <= 2.0
    assert plan.dpsgd_event() == dpsgd.quantile_event(0.5, plan.noise_multiplier, plan.count_std(), plan.steps)
    assert plan.count_std() >= dpsgd.count_noise_std(sigma, params.clip_count_share)
    clips = model.plan_public["final_clips"]["values"]
    assert len(clips) == 2 and all(c < 10.0 for c in clips)  # RBM positive-phase norms are well below 10
    assert model.plan_public["final_clips"]["adapted"] == [True, True]
    # at q = 0.1 the expected batches (about 20) are too small for the count's noise: the clip stays
    small = dataclasses.replace(params, sampling_rate=0.1)
    m2, p2 = dpgm.fit_dpgm_array(_binary(), small, seed=3)
    assert not any(dpsgd.clip_adapts(p2.count_noise.std, 0.1, s) for s in m2.sizes)
    assert not dpsgd.clip_adapts(p2.count_noise.std, 0.1, 200.0)  # nor at the clusters' true sizes
    assert m2.plan_public["final_clips"] == dict(model.plan_public["final_clips"], values=[10.0, 10.0],
                                                 adapted=[False, False])
    assert model.plan_public["quantile_clipping"]["count_noise_std"] == plan.count_std()
    assert np.all(np.isfinite(model.thetas))
    # reproducible from the seed
    model2, _ = dpgm.fit_dpgm_array(_binary(), params, seed=3)
    assert np.array_equal(model.thetas, model2.thetas)


@pytest.mark.parametrize("name,value", [("clip_quantile", 1.0), ("clip_quantile", 0.0), ("clip_quantile", -0.5),
                                        ("clip_count_share", 0.5), ("clip_lr", 0.0)])
def test_bad_values_name_the_parameter(name, value):
    params = dpgm.DPGMParams(epsilon=1.0, delta=1e-5, **dict({"clip_quantile": 0.5}, **{name: value}))
    with pytest.raises(ParameterError, match=name):
        dpgm.plan_dpgm(params, n=400, d=10)


_RELEASE = dict(k=2, epsilon=5.0, delta=1e-5, kmeans_iterations=2, sampling_rate=0.2, epochs=1.0, hidden=3,
                chains=10, clip_quantile=0.5, clip_lr=0.3)


def _arrow_of(X):
    import pyarrow as pa

    return pa.table({f"c{j}": X[:, j] for j in range(X.shape[1])})


def test_release_dpgm_with_quantile_clipping_in_memory():
    """The release path (local engine): the receipt records the quantile event and the options;
    the model states each cluster's final clip."""
    from sparkpriv.api import release

    from sparkpriv.privacy import random as sprandom

    X = _binary(200, 6, seed=2)
    with sprandom.insecure_fixed_seed(4243):  # fixed: an unlucky k-means can leave a cluster too small to adapt
        rel = release("dpgm", X, **_RELEASE)
    assert rel.epsilon <= 5.0
    params = dpgm.DPGMParams(**_RELEASE)
    kplan, sigma = dpgm.calibrate_dpgm(params, 6)
    assert rel.events == dpgm.requested_event(params, kplan, sigma, 6)
    details = rel.receipt()["mechanism_details"]
    assert details["parameters"]["clip_quantile"] == 0.5 and details["parameters"]["clip_count_share"] == 0.05
    assert details["quantile_clipping"]["count_noise_std"] == pytest.approx(
        dpsgd.count_noise_std(sigma, 0.05))
    final = rel.model.plan_public["final_clips"]
    clips, adapted = final["values"], final["adapted"]
    assert len(clips) == 2 and len(adapted) == 2 and any(adapted)
    # a cluster whose noisy size is too small for its count keeps the initial clip (10); the others moved
    assert all((0 < c < 10.0) if a else c == 10.0 for c, a in zip(clips, adapted))
    assert rel.model.thetas.shape == (2, dpgm._make_model(params, 6).dim)


def test_release_dpgm_with_quantile_clipping_spark_equals_local(spark):
    from sparkpriv.api import release
    from sparkpriv.privacy import random as sprandom

    X = _binary(200, 6, seed=2)
    cols = [f"c{j}" for j in range(6)]
    df = spark.createDataFrame(_arrow_of(X).to_pandas()).coalesce(1)
    with sprandom.insecure_fixed_seed(4243):
        a = release("dpgm", _arrow_of(X), columns=cols, **_RELEASE)
    with sprandom.insecure_fixed_seed(4243):
        b = release("dpgm", df, columns=cols, **_RELEASE)
    assert (a.engine, b.engine) == ("local", "spark")
    np.testing.assert_allclose(a.model.thetas, b.model.thetas, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(a.model.plan_public["final_clips"]["values"],
                               b.model.plan_public["final_clips"]["values"], rtol=1e-9)
    assert a.events == b.events and a.epsilon == b.epsilon


def test_high_quantile_with_a_noisy_count_does_not_drift():
    """quantile 0.9, batch 100, count noise std 20 (b's std about 0.2): b is not clamped to
    [0, 1], so E b is the fraction below C and the clip stays at the 0.9-quantile (a clamp made
    E min(b, 1) < 0.9 there, and the clip settled near the 0.97-quantile, or at the cap)."""
    rng = np.random.default_rng(8)
    n = 1000
    norms = np.exp(rng.normal(0.0, 1.0, n))
    X = np.zeros((n, 2))
    X[:, 0] = norms
    ad = dpsgd.QuantileClip(0.9, 0.2, dpsgd.gradient_noise(noise_multiplier=1e-3, dim=2, max_rows=n),
                            dpsgd.count_noise(count_std=20.0, max_rows=n))
    info: dict = {}
    dpsgd.train(Identity(2), X, np.zeros(2), clip=30.0, sampling_rate=0.1, steps=600, noise=None, n_pub=n,
                seed=6, adaptive=ad, info=info)
    truth = float(np.quantile(norms, 0.9))
    tail = np.log(info["clips"][-400:])
    assert abs(tail.mean() - math.log(truth)) < 0.25
    assert info["clip"] < 3 * truth


def test_a_small_expected_batch_keeps_the_declared_clip():
    """sigma_b / (q n_pub) above MAX_FRACTION_NOISE (public facts): the clip stays at C_0 (the
    count would be mostly noise: a random walk to the cap); just below it, it adapts."""
    n, q, cstd = 60, 0.05, 13.0
    assert not dpsgd.clip_adapts(cstd, q, n)
    assert dpsgd.clip_adapts(cstd, q, cstd / (q * dpsgd.MAX_FRACTION_NOISE))
    X = np.zeros((n, 2))
    X[:, 0] = 1.0
    ad = dpsgd.QuantileClip(0.5, 0.2, dpsgd.gradient_noise(noise_multiplier=1.0, dim=2, max_rows=n),
                            dpsgd.count_noise(count_std=cstd, max_rows=n))
    info: dict = {}
    dpsgd.train(Identity(2), X, np.zeros(2), clip=10.0, sampling_rate=q, steps=50, noise=None, n_pub=n, seed=1,
                adaptive=ad, info=info)
    assert info["clip"] == 10.0 and np.all(info["clips"] == 10.0)


def test_estimator_passes_quantile_clipping():
    from sparkpriv.estimators import DPGMSynthesizer

    est = DPGMSynthesizer(epsilon=5.0, delta=1e-5, k=2, kmeans_iterations=2, sampling_rate=0.5, epochs=1.0,
                          hidden=3, chains=10, clip_quantile=0.5, clip_count_share=0.1)
    est.fit(_binary(200, 6, seed=2))
    assert est.release_.receipt()["mechanism_details"]["parameters"]["clip_count_share"] == 0.1
    assert len(est.model_.plan_public["final_clips"]["values"]) == 2


def test_cli_offers_the_options(capsys):
    from sparkpriv.cli import main

    with pytest.raises(SystemExit):
        main(["release", "dpgm", "--help"])
    out = capsys.readouterr().out
    for opt in ("--clip-quantile", "--clip-lr", "--clip-count-share"):
        assert opt in out
