"""Uncertainty of DPGM releases: the spread of counting queries over repeated syntheses.

The claim (docs/research/dpgm.md, "Uncertainty"): the interval of ``query_spread`` (R syntheses from the
released model) holds the answer of ANOTHER, independent synthesis from the same model with
probability at least ``coverage = 1 - 2 r / (R + 1)`` (exactly 0.95 for R = 39 or 199 at 95%,
for answers without ties). The simulation draws exactly that: a fresh spread and a fresh
synthesis per trial, with independent seeds; the truth is the fresh synthesis's answer
(counted independently of ``answer_dense``).
"""


import numpy as np
import pytest

from sparkpriv.api import release_dpgm
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpgm
from sparkpriv.mechanisms.counting_queries import QuerySet, answer_queries
from sparkpriv.privacy.random import stream

D = 16


def _model():
    """A released-model stand-in: two VAE clusters with fixed parameters (binary records, fast to sample)."""
    params = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, hidden=8, model="vae", latent=2)
    gen = dpgm._make_model(params, D)
    thetas = np.stack([gen.init(stream(1, 2, j)) for j in range(2)])
    return dpgm.DPGMModel(params, D, thetas, np.array([300.0, 100.0]), np.full((2, D), 0.5))


def _queries():
    """16 one-column queries and 16 two-column queries (answers far from 0 and n: few ties)."""
    Q = np.zeros((D, 32))
    Q[np.arange(D), np.arange(D)] = 1
    Q[np.arange(D), D + np.arange(D)] = 1
    Q[(np.arange(D) + 5) % D, D + np.arange(D)] = 1
    return Q


def _answers_reference(X, Q):
    """Independent count: the sparse evaluator of counting_queries on the visited items."""
    V = X >= 0.5
    offsets = np.concatenate([[0], np.cumsum(V.sum(1))])
    return answer_queries(offsets, np.nonzero(V)[1], Q)


def test_interval_holds_a_fresh_synthesis_95_percent_by_simulation():
    m, Q = _model(), _queries()
    n, trials, hits = 1000, 200, np.zeros(Q.shape[1])
    for t in range(trials):
        s = m.query_spread(Q, n, repeats=39, confidence=0.95, seed=t)
        assert s.coverage == pytest.approx(0.95) and s.repeats == 39
        fresh = _answers_reference(dpgm.synthesize(m, n, 10**6 + t), Q)
        hits += (s.low <= fresh) & (fresh <= s.high)
    cov = hits / trials
    # 6,400 events (queries of one trial share its syntheses): the pooled rate
    assert 0.93 <= cov.mean() <= 0.97, cov
    assert cov.min() >= 0.88, cov


def test_spread_matches_closed_forms_and_order_statistics():
    m, Q = _model(), _queries()
    s = dpgm.query_spread(m, Q, 500, repeats=199, confidence=0.95, seed=3)
    # the same syntheses, recomputed here: the interval is the 5th and 195th of the 199 sorted answers
    A = np.stack([_answers_reference(dpgm.synthesize(m, 500, dpgm._spread_seed(3, i)), Q) for i in range(199)])
    srt = np.sort(A, axis=0)
    np.testing.assert_array_equal(s.low, srt[4])
    np.testing.assert_array_equal(s.high, srt[194])
    np.testing.assert_allclose(s.mean, A.mean(0))
    np.testing.assert_allclose(s.std, A.std(0, ddof=1))
    assert s.coverage == pytest.approx(1 - 2 * 5 / 200)
    # a one-column query is Binomial(n, p): its spread is sqrt(n p (1 - p)) within sampling error
    p = s.mean[:D] / 500
    np.testing.assert_allclose(s.std[:D], np.sqrt(500 * p * (1 - p)), rtol=0.25)
    # a QuerySet is accepted; repeats too small for the level is refused, naming the minimum
    qs = QuerySet(Q, np.ones(Q.shape[1], int), Q.sum(0).astype(int))
    np.testing.assert_array_equal(m.query_spread(qs, 500, repeats=199, seed=3).low, s.low)
    with pytest.raises(ParameterError, match="at least 39"):
        m.query_spread(Q, 500, repeats=20)
    with pytest.raises(ParameterError, match="d = 16"):
        m.query_spread(Q[:5], 500, repeats=39)


def test_release_states_the_method_not_data(test_seed):
    rng = np.random.default_rng(0)
    X = (rng.random((400, 6)) < 0.3).astype(float)
    rel = release_dpgm(X, epsilon=2.0, delta=1e-5, k=2, hidden=4, epochs=1, sampling_rate=0.1,
                       kmeans_iterations=2, accountant="rdp")
    u = rel.uncertainty()
    assert u == rel.receipt()["mechanism_details"]["uncertainty"]
    assert u["cluster_size_std"] == pytest.approx(rel.public["kmeans"]["iteration_count_std"], rel=1e-12)
    sq = u["synthetic_queries"]
    assert sq["default_repeats"] == 199 and "query_spread" in sq["accessor"]
    # no number derived from the data (only the public size std and the default repeats)
    assert {k for k, v in sq.items() if isinstance(v, float)} == set()
    s = rel.model.query_spread(np.eye(6)[:, :2], 200, repeats=39, seed=1)
    assert s.low.shape == (2,) and np.all(s.low <= s.high)
