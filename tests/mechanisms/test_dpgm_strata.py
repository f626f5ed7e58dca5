"""The DPGM's length strata (docs/research/dpgm.md, "Length strata"): the parameter, the chains' public
lengths, the model file, and a release that learns what a record's length says about its items."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpgm
from sparkpriv.mechanisms.rbm import RBM


def _params(**kw):
    base = dict(epsilon=2.0, delta=1e-5, k=2, row_bound=4.0, sampling_rate=0.1, epochs=2, hidden=3, chains=20)
    base.update(kw)
    return dpgm.DPGMParams(**base)


def test_the_default_strata_and_none():
    assert dpgm.length_strata(_params(), d=30) == (3, 6, 13)  # L = 16
    assert dpgm.length_strata(_params(row_bound=2.5), d=30) == (3, 6)  # L = 6: 13 dropped
    assert dpgm.length_strata(_params(length_strata=0), d=30) == ()
    assert dpgm.length_strata(_params(length_strata=()), d=30) == ()
    assert dpgm.length_strata(_params(length_strata=(2, 5)), d=30) == (2, 5)
    assert dpgm.length_strata(_params(length_share=0), d=30) == ()  # no histograms: no strata
    assert dpgm.length_strata(_params(model="vae", length_share=None), d=30) == ()
    plan = dpgm.plan_dpgm(_params(), n=1000, d=30)
    assert plan.to_public_dict()["length_strata"]["interior_edges"] == [3, 6, 13]
    assert plan.step_noise.dim == RBM(30, 3, strata=(3, 6, 13)).dim == 30 * 3 + 30 + 3 + 4 * 30
    assert dpgm.plan_dpgm(_params(length_strata=0), n=1000, d=30).to_public_dict()["length_strata"] is None


@pytest.mark.parametrize("value,match", [
    ((3, 3), "increasing"), ((5, 2), "increasing"), ((0.5,), "integers"), ((2.5, 4), "integers"),
    ((3, 17), "L = 16"), ((-1,), "increasing"),
])
def test_bad_strata_are_refused_before_any_data(value, match):
    with pytest.raises(ParameterError, match="length_strata") as e:
        dpgm.plan_dpgm(_params(length_strata=value), n=1000, d=30)
    assert match in str(e.value)


def test_strata_need_length_histograms():
    with pytest.raises(ParameterError, match="length_strata.*length_share"):
        dpgm.plan_dpgm(_params(length_strata=(3,), length_share=0), n=1000, d=30)
    with pytest.raises(ParameterError, match="length_strata"):
        dpgm.plan_dpgm(_params(length_strata=(3,), model="vae", length_share=None), n=1000, d=30)


def test_chain_lengths_are_drawn_from_the_kept_bins_with_the_fallbacks():
    plan = dpgm.plan_dpgm(_params(chains=400), n=1000, d=30)
    lp = plan.lengths
    std = lp.noise.std
    H = np.zeros((2, lp.bins))
    H[0, 2] = 1e4  # cluster 0: only length 2 survives
    H[0, 5] = 0.5 * std  # below 2 stds: empty
    got = dpgm.chain_lengths(plan, H, seed=3)
    assert got.shape == (2, 400)
    assert np.all(got[0] == 2)
    assert np.all(got[1] == 2)  # no bin left: the pooled histogram's
    np.testing.assert_array_equal(got, dpgm.chain_lengths(plan, H, seed=3))  # keyed: reproducible
    assert np.all(dpgm.chain_lengths(plan, np.zeros_like(H), seed=3) == 16)  # nothing at all: L
    assert dpgm.chain_lengths(dpgm.plan_dpgm(_params(length_strata=0), n=1000, d=30), H, seed=3) is None


def test_a_model_file_states_its_strata(monkeypatch):
    gen = RBM(30, 3, strata=(3, 6, 13))
    thetas = np.stack([gen.init(np.random.default_rng(j)) for j in range(2)])
    thetas[:, -30:] = 0.25
    lp = dpgm.plan_dpgm(_params(), n=1000, d=30).lengths
    H = np.zeros((2, lp.bins))
    H[:, 4] = 1e4
    m = dpgm.DPGMModel(_params(), 30, thetas, np.array([600.0, 400.0]), np.zeros((2, 30)), lengths=H,
                       length_edges=lp.edges, length_std=lp.noise.std)
    header = json.loads(bytes(np.load(io.BytesIO(m.to_bytes()))["header"]).decode())
    assert header["format_version"] == dpgm.FORMAT_VERSION == 7 and header["length_strata"] == [3, 6, 13]
    back = dpgm.DPGMModel.load(io.BytesIO(m.to_bytes()))
    assert back.params == m.params and back.generator().strata == (3, 6, 13)
    np.testing.assert_array_equal(dpgm.synthesize(back, 300, 4), dpgm.synthesize(m, 300, 4))
    # the file's resolved strata win over a default that has changed since
    written = m.to_bytes()
    monkeypatch.setattr(dpgm._params, "DEFAULT_LENGTH_STRATA", (2,))
    assert dpgm.length_strata(_params(), 30) == (2,)
    assert dpgm.DPGMModel.load(io.BytesIO(written)).generator().strata == (3, 6, 13)
    # parameters that do not match the thetas are named
    with pytest.raises(ParameterError, match="length strata"):
        dpgm.DPGMModel(_params(length_strata=0), 30, thetas, m.sizes, m.centers)


def _by_length(n, rng):
    """Two regions of 6 items (0..5, 6..11), a person in one: length 1 picks one of the region's first
    two items, length 4 four of its six (uniformly)."""
    X = np.zeros((n, 12))
    region = 6 * rng.integers(0, 2, n)
    short = rng.random(n) < 0.5
    X[np.flatnonzero(short), region[short] + rng.integers(0, 2, short.sum())] = 1.0
    for i in np.flatnonzero(~short):
        X[i, region[i] + rng.choice(6, 4, replace=False)] = 1.0
    return X


def test_a_release_learns_what_the_length_says_about_the_items():
    """At a large epsilon (k-means finds the regions), the release with strata synthesizes length-1
    people on their region's first two items as the data have them; without strata (the positive
    control) fewer are."""
    X = _by_length(6000, np.random.default_rng(0))
    share = {}
    for strata in (None, 0):
        model, _ = dpgm.fit_dpgm_array(X, _params(epsilon=200.0, k=2, row_bound=2.0, sampling_rate=0.05, epochs=20,
                                                  hidden=4, chains=100, length_strata=strata), seed=11)
        S = dpgm.synthesize(model, 6000, seed=2)
        one = S.sum(axis=1) == 1
        assert 0.4 < one.mean() < 0.6
        share[strata] = (S[one][:, [0, 1, 6, 7]]).sum(axis=1).mean()
    print(share)
    assert share[None] > 0.9
    assert share[0] < 0.75


def test_a_noisy_cluster_trains_the_plain_rbm_and_a_quiet_one_its_strata():
    """The rule is public (the noisy size): a cluster whose averaged gradient's noise is above
    STRATA_NOISE_MAX is trained exactly as without strata, its offsets 0; a quieter one trains them."""
    rng = np.random.default_rng(5)
    X = _by_length(3000, rng)
    labels = (np.arange(3000) % 2).astype(int)
    params = _params(epsilon=1.0, k=2, row_bound=2.0, sampling_rate=0.1, epochs=2, hidden=3, chains=20)
    plan = dpgm.plan_dpgm(params, n=3000, d=12)
    quiet = plan.noise_multiplier * params.clip / (params.sampling_rate * dpgm.STRATA_NOISE_MAX) * 1.01
    sizes = np.array([quiet, 1500.0])  # cluster 1's noise is far above the threshold
    assert plan.strata_trained(sizes) == [True, False]
    centers = np.full((2, 12), 0.15)
    chains = np.tile(np.array([1, 4] * 10), (2, 1))
    with_strata = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=3, chain_lengths=chains)
    plain_plan = dpgm.plan_dpgm(_params(epsilon=1.0, k=2, row_bound=2.0, sampling_rate=0.1, epochs=2, hidden=3,
                                        chains=20, length_strata=0), n=3000, d=12)
    assert plain_plan.noise_multiplier == plan.noise_multiplier
    plain = dpgm.train_clusters(X, labels, sizes, centers, plain_plan, seed=3)
    k = plain.shape[1]
    np.testing.assert_array_equal(with_strata[1, :k], plain[1])
    assert np.all(with_strata[1, k:] == 0.0)
    assert np.any(with_strata[0, k:] != 0.0) and not np.array_equal(with_strata[0, :k], plain[0])
    # without chains of released lengths no cluster trains its strata (a stratum with no chain would
    # have no model term)
    no_chains = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=3)
    np.testing.assert_array_equal(no_chains[:, :k], plain)
    assert np.all(no_chains[:, k:] == 0.0)
