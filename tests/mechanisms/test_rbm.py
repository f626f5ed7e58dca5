"""RBM: per-example gradients against finite differences, clipping bounds, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.mechanisms.rbm import RBM
from sparkpriv.privacy.random import stream


def _setup(d=5, m=3, n=4, seed=0, strata=()):
    """``strata``: the RBM with length strata (test_rbm_strata.py); two rows of lengths 0 and d."""
    rng = np.random.default_rng(seed)
    model = RBM(d, m, strata=strata)
    theta = rng.normal(0, 0.7, model.dim)
    V = (rng.random((n, d)) < 0.5).astype(float)
    if strata:
        V[0] = 0.0  # length 0: the first stratum
        V[1, :] = 1.0  # length d: the last stratum
    return model, theta, V


STRATA = ((), (2, 4))  # without, and with strata [0, 2), [2, 4), [4, inf)


@pytest.mark.parametrize("strata", STRATA)
def test_per_example_gradient_matches_finite_differences(strata):
    model, theta, V = _setup(n=8 if strata else 4, strata=strata)
    G = model.per_example_grads(V, theta)
    h = 1e-6
    for i in range(V.shape[0]):
        fd = np.empty(model.dim)
        for k in range(model.dim):
            e = np.zeros(model.dim)
            e[k] = h
            fd[k] = (model.free_energy(V[i:i + 1], theta + e)[0] - model.free_energy(V[i:i + 1], theta - e)[0]) / (2 * h)
        np.testing.assert_allclose(G[i], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("strata", STRATA)
@pytest.mark.parametrize("clip", [None, 0.5, 1.5])
def test_clipped_sum_and_norms_without_materialising(clip, strata):
    model, theta, V = _setup(d=7, m=4, n=9, seed=1, strata=strata)
    G = model.per_example_grads(V, theta)
    s, sq = model.clipped_sum(V, theta, clip)
    norms = np.linalg.norm(G, axis=1)
    np.testing.assert_allclose(sq, norms**2, rtol=1e-12)
    f = np.ones(len(norms)) if clip is None else np.minimum(1.0, clip / norms)
    np.testing.assert_allclose(s, (G * f[:, None]).sum(axis=0), rtol=1e-12, atol=1e-12)
    if clip is not None:
        assert np.all(np.linalg.norm(G * f[:, None], axis=1) <= clip * (1 + 1e-12))


def test_one_record_moves_the_clipped_sum_by_at_most_C():
    model, theta, V = _setup(d=30, m=8, n=50, seed=2)
    C = 0.8
    full, _ = model.clipped_sum(V, theta, C)
    rng = np.random.default_rng(3)
    worst_remove = worst_replace = 0.0
    for i in range(V.shape[0]):
        rest, _ = model.clipped_sum(np.delete(V, i, axis=0), theta, C)
        worst_remove = max(worst_remove, np.linalg.norm(full - rest))
        W = V.copy()
        W[i] = (rng.random(30) < 0.9).astype(float)
        rep, _ = model.clipped_sum(W, theta, C)
        worst_replace = max(worst_replace, np.linalg.norm(full - rep))
    assert worst_remove <= C * (1 + 1e-12)
    assert worst_replace <= 2 * C * (1 + 1e-12)
    assert worst_remove > 0.99 * C  # records are clipped: the bound is attained


def test_negative_phase_is_minus_mean_chain_gradient_and_data_free():
    model = RBM(6, 3, chains=40, gibbs_steps=2)
    theta = np.random.default_rng(4).normal(0, 0.5, model.dim)
    chains0 = model.init_state(stream(9, 0))
    g, chains = model.model_term(theta, chains0, stream(9, 1))
    chains_again = model.gibbs(theta, chains0, 2, stream(9, 1))
    np.testing.assert_array_equal(chains, chains_again)
    np.testing.assert_allclose(g, -model.per_example_grads(chains, theta).mean(axis=0), rtol=1e-12)


def test_sampling_closed_form_and_reproducible():
    """W = 0: visible units are independent Bernoulli(sigmoid(b))."""
    model = RBM(4, 3)
    theta = np.zeros(model.dim)
    b = np.array([-2.0, -0.5, 0.0, 1.5])
    theta[12:16] = b
    S = model.sample(theta, 40_000, stream(1, 2), burn_in=3)
    p = 1 / (1 + np.exp(-b))
    assert np.all(np.abs(S.mean(axis=0) - p) < 5 * np.sqrt(p * (1 - p) / 40_000))
    np.testing.assert_array_equal(model.sample(theta, 100, stream(1, 2)), model.sample(theta, 100, stream(1, 2)))
    assert not np.array_equal(model.sample(theta, 100, stream(1, 2)), model.sample(theta, 100, stream(1, 3)))
