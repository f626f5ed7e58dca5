"""The RBM with length strata (docs/research/dpgm.md, "Length strata"): the energy, the clipped sum across
strata, chains of fixed lengths, the strata rates, and that training learns what a record's length
says about its items. Per-example gradients against finite differences and the clipped sum against
the materialised gradients: test_rbm.py, parametrized over strata."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparkpriv.mechanisms import dpsgd
from sparkpriv.mechanisms.rbm import RBM, STRATA_LR
from sparkpriv.privacy.random import stream

STRATA = (2, 4)  # strata [0, 2), [2, 4), [4, inf)


def _setup(d=6, m=3, n=8, seed=0):
    rng = np.random.default_rng(seed)
    model = RBM(d, m, strata=STRATA, chains=5, chain_lengths=(1, 2, 3, 4, 5))
    theta = rng.normal(0, 0.7, model.dim)
    V = (rng.random((n, d)) < 0.5).astype(float)
    V[0] = 0.0  # length 0: stratum 0
    V[1, :] = 1.0  # length d: the last stratum
    return model, theta, V


def test_layout_and_energy_closed_form():
    model, theta, V = _setup()
    d, m = 6, 3
    assert model.n_strata == 3 and model.dim == d * m + d + m + 3 * d
    W = theta[: d * m].reshape(d, m)
    b = theta[d * m: d * m + d]
    c = theta[d * m + d: d * m + d + m]
    A = theta[d * m + d + m:].reshape(3, d)
    for v in V:
        s = 0 if v.sum() < 2 else 1 if v.sum() < 4 else 2
        F = -(b + A[s]) @ v - np.sum(np.log1p(np.exp(c + v @ W)))
        assert model.free_energy(v[None, :], theta)[0] == pytest.approx(F, rel=1e-12)
    np.testing.assert_array_equal(model.stratum([0, 1, 2, 3, 4, 40]), [0, 0, 1, 1, 2, 2])


def test_one_record_moves_the_clipped_sum_by_at_most_C_across_strata():
    """Replacing a record by one of another length moves two strata's offsets: still at most 2 C."""
    model, theta, V = _setup(d=20, m=5, n=40, seed=2)
    C = 0.8
    full, _ = model.clipped_sum(V, theta, C)
    rng = np.random.default_rng(3)
    worst = 0.0
    for i in range(V.shape[0]):
        W = V.copy()
        W[i] = (rng.random(20) < (0.9 if V[i].sum() < 10 else 0.05)).astype(float)
        rep, _ = model.clipped_sum(W, theta, C)
        worst = max(worst, np.linalg.norm(full - rep))
    assert C < worst <= 2 * C * (1 + 1e-12)  # more than one stratum moved, never more than 2 C


def test_chains_keep_their_lengths_and_the_negative_phase_is_their_mean_gradient():
    model, theta, _ = _setup()
    state = model.init_state(stream(9, 0), theta)
    assert isinstance(state, tuple)
    np.testing.assert_array_equal(state[0].sum(axis=1), [1, 2, 3, 4, 5])
    g, (chains, lengths) = model.model_term(theta, state, stream(9, 1))
    np.testing.assert_array_equal(chains.sum(axis=1), [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(lengths, [1, 2, 3, 4, 5])
    np.testing.assert_allclose(g, -model.per_example_grads(chains, theta).mean(axis=0), rtol=1e-12)
    with pytest.raises(ValueError, match="chain_lengths"):
        dataclasses.replace(model, chain_lengths=None).init_state(stream(9, 0), theta)
    with pytest.raises(ValueError, match="one length per chain"):
        dataclasses.replace(model, chain_lengths=(1, 2)).init_state(stream(9, 0), theta)
    with pytest.raises(ValueError, match="pass lengths"):
        model.sample(theta, 3, stream(9, 2))


def test_sampling_given_lengths_uses_each_strata_bias():
    """W = 0: given its length m, a record is the conditional Bernoulli of b + A_s(m); with b = 0 and
    one stratum's offsets favouring items 0..1, length-1 records there pick item 0 or 1 with
    probability e^3 / (2 e^3 + 4) each (closed form)."""
    d = 6
    model = RBM(d, 2, strata=(2,))
    theta = np.zeros(model.dim)
    A = model.offsets(theta)
    A[0, :2] = 3.0  # stratum [0, 2): items 0, 1 favoured
    A[1, 4:] = 3.0  # stratum [2, inf): items 4, 5
    n = 40_000
    S = model.sample(theta, n, stream(1, 2), burn_in=2, lengths=np.full(n, 1))
    p = np.exp(3) / (2 * np.exp(3) + 4)
    assert np.all(S.sum(axis=1) == 1)
    assert np.all(np.abs(S.mean(axis=0)[:2] - p) < 5 * np.sqrt(p * (1 - p) / n))
    L = model.sample(theta, 2000, stream(1, 3), burn_in=2, lengths=np.full(2000, 2))
    assert L[:, 4:].sum(axis=1).mean() > 1.5  # the other stratum's offsets


def test_the_strata_offsets_move_at_STRATA_LR_times_the_rate():
    """Adam's first step moves every coordinate with a nonzero gradient by its rate: the offsets by
    STRATA_LR times the others' (the rate is a choice of the optimiser on released gradients)."""
    model, theta, V = _setup(d=6, m=3, n=30, seed=4)
    lr = 1e-3
    out = dpsgd.train(model, V, theta.copy(), clip=100.0, sampling_rate=1.0, steps=1, noise=None, n_pub=30.0,
                      seed=1, lr=lr)
    step = np.abs(out - theta)
    k = 6 * 3 + 6 + 3
    moved = step > 0
    np.testing.assert_allclose(step[:k][moved[:k]], lr, rtol=1e-4)
    np.testing.assert_allclose(step[k:][moved[k:]], STRATA_LR * lr, rtol=1e-4)
    assert moved[k:].sum() >= 6


def _two_kinds(n, rng):
    """Length-1 records pick item 0 or 1; length-3 records pick 3 of items 2..7 (uniformly)."""
    X = np.zeros((n, 8))
    short = rng.random(n) < 0.5
    X[np.flatnonzero(short), rng.integers(0, 2, short.sum())] = 1.0
    for i in np.flatnonzero(~short):
        X[i, 2 + rng.choice(6, 3, replace=False)] = 1.0
    return X


def test_training_learns_what_the_length_says_about_the_items():
    """Non-private training on records whose items depend on their length: with strata, length-1
    samples keep to items 0..1 as the data do; the same RBM without strata, sampled given the same
    lengths, spreads them over the items (the test's positive control)."""
    X = _two_kinds(4000, np.random.default_rng(0))
    lengths = np.tile([1, 3], 50)
    out = {}
    for strata in ((2,), ()):
        model = RBM(8, 4, chains=100, strata=strata, chain_lengths=tuple(lengths) if strata else None)
        theta0 = model.init(stream(3, 0))
        theta0[32:40] = np.log(0.25 / 0.75)  # the data's mean item rate
        theta = dpsgd.train(model, X, theta0, clip=1e6, sampling_rate=0.05, steps=600, noise=None, n_pub=4000.0,
                            seed=5, lr=0.02, average=0.5)
        S = model.sample(theta, 4000, stream(3, 1), lengths=np.full(4000, 1))
        out[strata] = S[:, :2].sum(axis=1).mean()  # share of length-1 samples on items 0..1
    assert out[(2,)] > 0.95
    assert out[()] < 0.8  # 0.59 here: its hidden units learn part of it, given the lengths
