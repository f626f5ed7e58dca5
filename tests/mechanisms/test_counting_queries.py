"""Counting queries (numpy): hand-computed answers, query groups, closed-form expectation after flips."""

import numpy as np
import pytest

from sparkpriv.mechanisms import counting_queries as cq
from sparkpriv.mechanisms.sparse import sparse_rows_from_lists

TRUE = [[0, 1], [2], [], [1, 3]]
RELEASE = [[0], [2, 3], [0], [1, 3]]


def _q(d, *sets):
    Q = np.zeros((d, len(sets)))
    for j, s in enumerate(sets):
        Q[list(s), j] = 1
    return Q


def test_hand_computed_example():
    Q = _q(4, {0}, {1, 2}, {3}, {0, 1, 2, 3})
    t = cq.answer_queries(*sparse_rows_from_lists(TRUE), Q)
    r = cq.answer_queries(*sparse_rows_from_lists(RELEASE), Q)
    np.testing.assert_array_equal(t, [1, 3, 1, 3])
    np.testing.assert_array_equal(r, [2, 2, 2, 4])
    np.testing.assert_allclose(cq.relative_errors(t, r, n=4), [1.0, 1 / 3, 1.0, 1 / 3])
    # the sanity bound: a query no one visited is measured against 0.001 n
    np.testing.assert_allclose(cq.relative_errors([0.0], [2.0], n=10_000), [2 / 10.0])


def test_query_groups_follow_the_paper():
    qs = cq.draw_queries(300, max_length=50, n_queries=1000, groups=5, seed=1)
    assert qs.size == 1000 and np.all(np.bincount(qs.group)[1:] == 200)
    np.testing.assert_array_equal(qs.matrix.sum(axis=0), qs.length)
    for g in range(1, 6):
        lens = qs.length[qs.group == g]
        assert lens.min() >= 1 and lens.max() <= g * 50 // 5
        assert lens.max() >= 0.8 * g * 50 // 5  # uniform up to the bound
    assert set(np.unique(qs.matrix)) <= {0.0, 1.0}


def test_flipped_release_matches_closed_form_expectation():
    rng = np.random.default_rng(7)
    n, d, p = 4000, 30, 0.03
    X = rng.random((n, d)) < 0.08
    lists = [np.flatnonzero(x) for x in X]
    off, idx = sparse_rows_from_lists(lists)
    qs = cq.draw_queries(d, max_length=10, n_queries=200, seed=2)
    flipped = X ^ (rng.random((n, d)) < p)
    off2, idx2 = sparse_rows_from_lists([np.flatnonzero(x) for x in flipped])
    got = cq.answer_queries(off2, idx2, qs.matrix)
    exp = cq.expected_answers_after_flips(off, idx, qs.matrix, p)
    # per query the answer is a sum of n independent Bernoullis: within 5 sd
    sd = np.sqrt(np.maximum(exp * (1 - exp / n), 1.0))
    assert np.all(np.abs(got - exp) < 5 * sd)
    # and the expected relative error is what the evaluator measures, on average
    t = cq.answer_queries(off, idx, qs.matrix)
    e_meas = cq.relative_errors(t, got, n).mean()
    e_exp = cq.relative_errors(t, exp, n).mean()
    assert e_meas == pytest.approx(e_exp, rel=0.1)
    assert e_exp > 0.01  # flips do bias the answers upwards
