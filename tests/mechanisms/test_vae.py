"""VAE: per-example ELBO gradients against finite differences, clipping bounds, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.mechanisms.vae import VAE
from sparkpriv.privacy.random import stream


def _setup(likelihood, d=4, H=3, L=2, n=3, seed=0):
    rng = np.random.default_rng(seed)
    model = VAE(d, H, L, likelihood=likelihood, obs_std=0.7)
    theta = rng.normal(0, 0.6, model.dim)
    X = rng.random((n, d)) if likelihood == "gaussian" else (rng.random((n, d)) < 0.5).astype(float)
    eps = rng.standard_normal((n, L))
    return model, theta, X, eps


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_per_example_gradient_matches_finite_differences(likelihood):
    model, theta, X, eps = _setup(likelihood)
    G = model.per_example_grads(X, theta, eps=eps)
    h = 1e-6
    for i in range(X.shape[0]):
        fd = np.empty(model.dim)
        for k in range(model.dim):
            e = np.zeros(model.dim)
            e[k] = h
            fd[k] = (model.loss(X[i:i + 1], theta + e, eps[i:i + 1])[0]
                     - model.loss(X[i:i + 1], theta - e, eps[i:i + 1])[0]) / (2 * h)
        np.testing.assert_allclose(G[i], fd, rtol=1e-5, atol=1e-7)


def test_loss_is_the_negative_elbo_closed_form():
    """rec + KL written out independently for one record."""
    model, theta, X, eps = _setup("bernoulli", n=1)
    W1, b1, W2, b2, W3, b3, W4, b4 = model.unpack(theta)
    x = X[0]
    h1 = np.tanh(x @ W1 + b1)
    mu, lv = (h1 @ W2 + b2)[:2], (h1 @ W2 + b2)[2:]
    z = mu + np.exp(lv / 2) * eps[0]
    p = 1 / (1 + np.exp(-(np.tanh(z @ W3 + b3) @ W4 + b4)))
    rec = -np.sum(x * np.log(p) + (1 - x) * np.log(1 - p))
    kl = 0.5 * np.sum(mu**2 + np.exp(lv) - lv - 1)
    assert model.loss(X, theta, eps)[0] == pytest.approx(rec + kl, rel=1e-12)


@pytest.mark.parametrize("clip", [None, 0.3, 2.0])
def test_clipped_sum_and_norms_without_materialising(clip):
    model, theta, X, eps = _setup("bernoulli", d=6, H=5, L=2, n=11, seed=1)
    G = model.per_example_grads(X, theta, eps=eps)
    s, sq = model.clipped_sum(X, theta, clip, eps=eps)
    norms = np.linalg.norm(G, axis=1)
    np.testing.assert_allclose(sq, norms**2, rtol=1e-12)
    f = np.ones(len(norms)) if clip is None else np.minimum(1.0, clip / norms)
    np.testing.assert_allclose(s, (G * f[:, None]).sum(axis=0), rtol=1e-11, atol=1e-12)


def test_one_record_moves_the_clipped_sum_by_at_most_C():
    model, theta, X, eps = _setup("bernoulli", d=12, H=6, L=2, n=40, seed=2)
    C = 0.5
    full, _ = model.clipped_sum(X, theta, C, eps=eps)
    worst = 0.0
    for i in range(X.shape[0]):
        rest, _ = model.clipped_sum(np.delete(X, i, 0), theta, C, eps=np.delete(eps, i, 0))
        worst = max(worst, np.linalg.norm(full - rest))
        Y = X.copy()
        Y[i] = 1 - Y[i]
        rep, _ = model.clipped_sum(Y, theta, C, eps=eps)
        assert np.linalg.norm(full - rep) <= 2 * C * (1 + 1e-12)
    assert 0.99 * C < worst <= C * (1 + 1e-12)


def test_default_architecture_and_reproducible_sampling():
    model = VAE(10)
    assert (model.hidden, model.latent) == (200, 2)
    theta = model.init(stream(3, 0))
    a = model.sample(theta, 50, stream(3, 1))
    assert np.array_equal(a, model.sample(theta, 50, stream(3, 1)))
    assert set(np.unique(a)) <= {0.0, 1.0}
    assert not np.array_equal(a, model.sample(theta, 50, stream(3, 2)))
