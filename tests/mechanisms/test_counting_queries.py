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


# --------------------------------------------------------------------------- independence baseline


def test_independence_answers_equal_enumeration_over_all_visit_patterns():
    """The closed form against a sum over all 2^d visit patterns of independent items."""
    import itertools

    p = np.array([0.1, 0.5, 0.03, 0.9])
    n = 1000.0
    Q = np.array([[1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], float).T  # (d, nq)
    want = np.zeros(Q.shape[1])
    for pattern in itertools.product([0, 1], repeat=p.size):
        x = np.array(pattern)
        prob = np.prod(np.where(x == 1, p, 1 - p))
        want += prob * ((x @ Q) > 0)
    np.testing.assert_allclose(cq.answers_under_independence(n * p, n, Q), n * want, rtol=1e-12)


def test_independence_answers_match_a_table_of_independent_visits():
    rng = np.random.default_rng(3)
    n, d = 200_000, 30
    p = rng.uniform(0.001, 0.2, d)
    X = rng.random((n, d)) < p
    rows, cols = np.nonzero(X)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
    qs = cq.draw_queries(d, max_length=10, n_queries=200, seed=1)
    true = cq.answer_queries(offsets, cols, qs.matrix)
    est = cq.answers_under_independence(X.sum(axis=0), n, qs.matrix)
    # the rates are the realized ones, so only the finite-sample dependence is left
    assert np.max(np.abs(est - true) / np.maximum(true, 100)) < 0.02


def test_independence_misses_items_that_go_together_and_clips_noisy_counts():
    n = 100.0
    Q = np.array([[1.0], [1.0]])  # q = {a, b}
    # a and b always visited together by the same 30 people: truth 30, independence 51
    np.testing.assert_allclose(cq.answers_under_independence([30, 30], n, Q), [n * (1 - 0.7 ** 2)])
    # noisy counts below 0 or above n are rates 0 and 1
    np.testing.assert_allclose(cq.answers_under_independence([-5, 0], n, Q), [0.0])
    np.testing.assert_allclose(cq.answers_under_independence([250, 3], n, Q), [n])
    with pytest.raises(ValueError, match="3 item counts for queries over 2 items"):
        cq.answers_under_independence([1, 2, 3], n, Q)
