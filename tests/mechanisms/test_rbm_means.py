"""The RBM's record means (Rao-Blackwell) behind the DPGM's marginal calibration: the exact
inclusion probabilities of the conditional Bernoulli, and ``RBM.sample(means=True)`` against the
model's marginals by enumeration (docs/research/dpgm.md, "Calibrating the marginals"; docs/math.md 5.4)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sparkpriv.mechanisms.rbm import RBM, conditional_bernoulli, inclusion_probabilities


def _enumerated(L: np.ndarray, m: int) -> np.ndarray:
    """``P(v_i = 1 | |v| = m)`` over every subset of size m, ``P(S) ∝ exp(sum_{i in S} L_i)``."""
    d = L.size
    num, total = np.zeros(d), 0.0
    for s in itertools.combinations(range(d), m):
        w = np.exp(L[list(s)].sum())
        total += w
        num[list(s)] += w
    return num / total if total > 0 else num


def test_inclusion_probabilities_against_enumeration():
    rng = np.random.default_rng(0)
    d = 9
    L = rng.normal(0.0, 2.5, (8, d))
    L[6] = np.linspace(-30.0, 30.0, d)  # probabilities at the ends of the float range
    L[7, :3] = 40.0
    m = np.array([0, 1, 2, 4, 5, 8, 3, 9])
    want = np.stack([_enumerated(L[r], int(m[r])) if 0 < m[r] < d else np.full(d, float(m[r] >= d))
                     for r in range(8)])
    for table in (None, 10 * (d + 1)):  # whole rows at once, and one row per table (chunks by length)
        got = inclusion_probabilities(L, m) if table is None else inclusion_probabilities(L, m, table_values=table)
        np.testing.assert_allclose(got, want, atol=1e-12)
        np.testing.assert_allclose(got.sum(axis=1), m, atol=1e-10)


def test_rows_beyond_the_float_range_take_the_fallback_never_a_nan():
    L = np.full((3, 10), -5.0)
    L[:2, :6] = 800.0  # six items at sigmoid = 1.0: P(|v| = 3) and P(|v| = 5) underflow
    m = np.array([3, 5, 2])
    with pytest.raises(FloatingPointError, match="pass a fallback"):
        inclusion_probabilities(L, m)
    rng = np.random.default_rng(1)
    asked = []

    def draw(rows):
        asked.extend(rows.tolist())
        return conditional_bernoulli(L[rows], m[rows], rng)

    pi = inclusion_probabilities(L, m, fallback=draw)
    assert sorted(asked) == [0, 1] and np.isfinite(pi).all()
    assert pi[:2].sum(axis=1).tolist() == [3.0, 5.0] and set(np.unique(pi[:2])) <= {0.0, 1.0}
    np.testing.assert_allclose(pi[2], np.full(10, 0.2))  # the other rows exact


def test_inclusion_probabilities_are_the_means_of_the_sampler():
    """At a realistic width (no enumeration): the mean of many conditional Bernoulli draws."""
    rng = np.random.default_rng(1)
    d, n = 300, 10_000
    L = rng.normal(-4.0, 1.5, d)
    pi = inclusion_probabilities(np.tile(L, (3, 1)), np.array([1, 12, 40]))
    for r, m in enumerate((1, 12, 40)):
        V = conditional_bernoulli(np.tile(L, (n, 1)), np.full(n, m), np.random.default_rng(m))
        sd = np.sqrt(pi[r] * (1 - pi[r]) / n) + 1e-12
        assert np.all(np.abs(V.mean(axis=0) - pi[r]) < 5 * sd), m
        assert pi[r].sum() == pytest.approx(m)


def _states(d: int) -> np.ndarray:
    return np.array(list(itertools.product([0.0, 1.0], repeat=d)))


def _exact_marginals(model: RBM, theta: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
    """The model's mean record by enumeration of its 2^d visible states (``P(v) ∝ exp(-F(v))``),
    given each record's length (then averaged over the lengths), or free."""
    V = _states(model.d)
    logp = -model.free_energy(V, theta)
    size = V.sum(axis=1)
    if lengths is None:
        p = np.exp(logp - logp.max())
        return p @ V / p.sum()
    out = np.zeros(model.d)
    for m, count in zip(*np.unique(lengths, return_counts=True)):
        sel = size == m
        p = np.exp(logp[sel] - logp[sel].max())
        out += count * (p @ V[sel]) / p.sum()
    return out / lengths.size


@pytest.mark.parametrize("strata,given", [((), False), ((), True), ((3,), True)])
def test_sampled_means_have_the_models_marginals_with_less_spread(strata, given):
    """``sample(means=True)`` averages to the model's exact marginals (the records' own target), and
    its rows vary less than the records' (the variance of the last draw is gone)."""
    d, n = 8, 20_000
    model = RBM(d, 3, strata=strata)
    rng = np.random.default_rng(7)
    theta = np.zeros(model.dim)
    theta[: d * 3] = rng.normal(0.0, 1.2, d * 3)
    theta[d * 3: d * 3 + d] = rng.normal(-1.0, 1.0, d)
    theta[d * 3 + d: d * 3 + d + 3] = rng.normal(0.0, 0.5, 3)
    if strata:
        theta[d * 3 + d + 3:] = rng.normal(0.0, 1.0, 2 * d)
    lengths = np.random.default_rng(8).integers(1, 6, n) if given else None
    exact = _exact_marginals(model, theta, lengths)
    R = model.sample(theta, n, np.random.default_rng(9), burn_in=30, lengths=lengths)
    M = model.sample(theta, n, np.random.default_rng(10), burn_in=30, lengths=lengths, means=True)
    assert M.shape == (n, d) and np.all((M >= 0) & (M <= 1))
    if given:
        np.testing.assert_allclose(M.sum(axis=1), lengths, atol=1e-9)
    for S in (R, M):
        sd = S.std(axis=0) / np.sqrt(n) + 1e-9
        assert np.all(np.abs(S.mean(axis=0) - exact) < 5 * sd), (S.mean(axis=0), exact)
    assert np.all(M.var(axis=0) < R.var(axis=0))
