"""The synthetic release's anchor strata (sparkpriv.mechanisms.synthetic._anchors; docs/math.md section
10, "Anchor strata"): the strata vector against a per-person reference, its sensitivity by brute force,
the first model's implied strata against Monte Carlo, the fit's constraints (lengths add up to the
released ones, every item's expected count the first model's), the model's closed forms against its
sampler, the file, and that the strata win where items go together."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import sparse

from sparkpriv.api import release
from sparkpriv.local.records import bound_items
from sparkpriv.mechanisms.auto_bound import length_edges
from sparkpriv.mechanisms.protocol import SparseRows
from sparkpriv.mechanisms.synthetic import SyntheticModel, SyntheticParams, plan_synthetic
from sparkpriv.mechanisms.synthetic._anchors import (ANCHOR_STDS, MIN_ANCHORS, Strata, _miss, choose_anchors,
                                                     fit_strata, implied_strata, strata_fn, strata_length_edges,
                                                     strata_size)
from sparkpriv.privacy.random import insecure_fixed_seed


def _block(rows, d):
    off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    idx = np.asarray([i for r in rows for i in r], np.int32)
    return SparseRows(off, idx, None, d)


def _reference(rows, rank, K, M, L, edges):
    """The strata vector person by person, from the definition (module docstring of _anchors)."""
    width = M + edges.size
    out = np.zeros((K + 1) * width)
    for r in rows:
        ranks = sorted(int(rank[i]) for i in r)
        s = ranks[0] if ranks and ranks[0] < K else K
        m = min(len(r), int(edges[-1]))
        out[s * width + M + int(np.searchsorted(edges, m, side="right") - 1)] += 1
        others = [k for k in ranks if k < M and k != s][:L - 1]
        for k in others:
            out[s * width + k] += 1
    return out


@pytest.mark.parametrize("edges", [length_edges(20), strata_length_edges(20)], ids=["histogram bins", "strata bins"])
def test_strata_vector_matches_a_per_person_reference(edges):
    rng = np.random.default_rng(0)
    d, K, M, L = 40, 5, 12, 4
    rank = rng.permutation(d)
    rows = [sorted(rng.choice(d, rng.integers(0, 21), replace=False).tolist()) for _ in range(300)]
    got = strata_fn(rank, K, M, L, edges)(_block(rows, d))
    assert got.size == strata_size(K, M, edges.size)
    np.testing.assert_array_equal(got, _reference(rows, rank, K, M, L, edges))
    assert got.reshape(K + 1, -1)[:, M:].sum() == 300  # every person in exactly one stratum's lengths


def test_strata_length_edges():
    assert strata_length_edges(256).tolist() == [0, 1, 2, 3, 5, 8, 13, 22, 40, 256]
    assert strata_length_edges(20).tolist() == [0, 1, 2, 3, 5, 8, 13, 20]
    assert strata_length_edges(3).tolist() == [0, 1, 2, 3]
    assert strata_length_edges(1).tolist() == [0, 1]


def test_strata_sensitivity_by_brute_force():
    """Every pair of records over 6 items (any length: the pass reads records at the length limit): the
    vector moves by at most sqrt(2 L) in L2 under replace-one and sqrt(L) under add-remove, attained."""
    d, K, M, L = 6, 2, 4, 3
    edges = strata_length_edges(d)  # the release's bins: [0, 1, 2, 3, 5, 6]
    rank = np.array([2, 0, 5, 1, 3, 4])
    fn = strata_fn(rank, K, M, L, edges)
    recs = [[i for i in range(d) if bits[i]] for bits in itertools.product((0, 1), repeat=d)]
    V = np.stack([fn(_block([r], d)) for r in recs])
    sq = (V ** 2).sum(axis=1)
    worst = math.sqrt(max(float(((V - v) ** 2).sum(axis=1).max()) for v in V))
    plan = plan_synthetic(SyntheticParams(epsilon=1.0, delta=1e-6), d, L, lengths_given=True, caller="t")
    assert worst == pytest.approx(plan.counts_sensitivity) == pytest.approx(math.sqrt(2 * L))
    assert math.sqrt(sq.max()) == pytest.approx(math.sqrt(L))


def test_implied_strata_match_monte_carlo_of_the_first_model():
    rng = np.random.default_rng(1)
    d, n = 30, 4000
    lengths = np.zeros(11)
    lengths[1:] = rng.random(10)
    counts = rng.gamma(0.7, 100.0, d)
    m = SyntheticModel(d, n, lengths, counts, counts)
    order = np.argsort(-m.profile, kind="stable")
    K = 4
    people, g = implied_strata(m.lengths, m.profile[order[:K]], n)
    rank = np.empty(d, np.int64)
    rank[order] = np.arange(d)
    stratum = []
    for s in range(40):
        off, idx = m.sample_sparse(n, 100 + s)
        best = np.full(n, d)
        np.minimum.at(best, np.repeat(np.arange(n), np.diff(off)), rank[idx])
        stratum.append(np.bincount(np.minimum(best, K), minlength=K + 1))
    mc = np.mean(stratum, axis=0)
    np.testing.assert_allclose(mc, people, rtol=0.03, atol=5)
    assert people.sum() == pytest.approx(n) and np.allclose(g.sum(axis=1), 1.0)


def test_choose_anchors_keeps_the_strata_above_the_threshold():
    lengths = np.array([0, 5, 3, 2, 1], float)
    profile = np.array([0.4, 0.3, 0.2, 0.06, 0.04])
    order = np.arange(5)
    people, _ = implied_strata(lengths, profile, 1000)
    seen = set()
    for std in np.geomspace(0.5, 100.0, 40):
        k = choose_anchors(lengths, profile, order, 1000, std, 5)
        ok = people[:5] >= ANCHOR_STDS * std
        run = 5 if ok.all() else int(np.argmin(ok))  # the longest run of top items above the threshold
        assert k == (run if run >= MIN_ANCHORS else 0)  # fewer than MIN_ANCHORS (4): none
        seen.add(run)
    assert {0, 1, 4, 5} <= seen  # both sides of MIN_ANCHORS were tried
    # when at most k_max < MIN_ANCHORS anchors are allowed, those that pass are kept
    assert choose_anchors(lengths, profile, order, 1000, 1.0, 2) == 2
    assert choose_anchors(lengths, profile, order, 1000, 1.0, 0) == 0


def _paired(n=8000, seed=0):
    """People in two kinds: kind A holds items 0 and 1 together, kind B items 2 and 3; everyone also
    holds a few of items 4..29 (uniform)."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in rng.integers(0, 2, n):
        base = [0, 1] if k == 0 else [2, 3]
        rows.append(sorted(set(base) | set(rng.choice(np.arange(4, 30), rng.integers(0, 4), replace=False).tolist())))
    off = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    return sparse.csr_matrix((np.ones(off[-1]), np.concatenate(rows), off), shape=(n, 30))


def test_fit_keeps_the_first_models_lengths_and_item_counts():
    """Exact strata (tiny noise): the strata's lengths add up to the released distribution, and every
    item's expected count under the strata equals the first model's (the rake)."""
    X = _paired()
    n, d = X.shape
    counts = np.asarray(X.sum(axis=0)).ravel()
    lengths = np.bincount(np.diff(X.indptr), minlength=31).astype(float)[:31]
    profile = counts / counts.sum()
    order = np.argsort(-profile, kind="stable")
    rank = np.empty(d, np.int64)
    rank[order] = np.arange(d)
    edges = strata_length_edges(30)
    K, M, L = 4, 30, 8
    V = strata_fn(rank, K, M, L, edges)(_block([X.indices[X.indptr[i]:X.indptr[i + 1]].tolist() for i in range(n)], d))
    V = V.reshape(K + 1, -1)
    st = fit_strata(counts_noisy=V[:, :M], lengths_noisy=V[:, M:], std=1e-3, anchors_K=K, order=order,
                    profile=profile, lengths=lengths, n=n, L=L, edges=edges)
    model = SyntheticModel(d, n, lengths, counts, counts, strata=st)
    first = SyntheticModel(d, n, lengths, counts, counts)
    every = np.eye(d)
    others = np.setdiff1d(np.arange(d), order[:K])
    got, want = model.union_answers(every), first.union_answers(every)
    np.testing.assert_allclose(got[others], want[others], rtol=2e-3, atol=0.5)
    # an anchor is held by its whole stratum: at least the measured stratum (items 0 and 2, here exact)
    # where the first model, drawing items with replacement, is low for items half the people hold
    np.testing.assert_allclose(got[[0, 2]], counts[[0, 2]], rtol=0.01)
    assert np.all(want[:4] < 0.9 * counts[:4]) and np.all(got[[1, 3]] >= want[[1, 3]] * (1 - 1e-2))
    # stratum sizes from the exact vector: people whose most popular item is each anchor
    best = np.full(n, d)
    np.minimum.at(best, np.repeat(np.arange(n), np.diff(X.indptr)), rank[X.indices])
    truth = np.bincount(np.minimum(best, K), minlength=K + 1)
    np.testing.assert_allclose(st.weights * n, truth, rtol=0.02, atol=5)
    # and the pairs that go together are there: item 1 only with 0, never 0 with 2
    p = model.pair_answers(np.array([[0, 1], [0, 2]]))
    assert p[0] == pytest.approx(got[1], rel=0.02)
    assert p[1] < 0.05 * p[0]
    assert first.pair_answers(np.array([[0, 2]]))[0] > 0.2 * p[0]  # the first model alone cannot tell


def _strata_model(seed=2):
    rng = np.random.default_rng(seed)
    d, K, M = 25, 3, 10
    top = rng.permutation(d)[:M]
    anchors = top[:K]
    draws = np.zeros((K + 1, 9))
    draws[:, :] = rng.random((K + 1, 9))
    draws[:K, 8] = 0.0
    tp = rng.gamma(0.8, 1.0, (K + 1, M))
    for s in range(K):
        tp[s, :s + 1] = 0.0
    tp[K, :K] = 0.0
    rest = np.zeros(d)
    others = np.setdiff1d(np.arange(d), top)
    rest[others] = rng.random(others.size)
    rest /= rest.sum()
    share = rng.uniform(0.2, 0.6, K + 1)
    tp = tp / tp.sum(axis=1, keepdims=True) * (1 - share)[:, None]
    st = Strata(anchors, rng.dirichlet(np.ones(K + 1)), draws / draws.sum(axis=1, keepdims=True), top, tp, share,
                rest)
    return SyntheticModel(d, 3000, np.ones(9), np.ones(d), np.ones(d), strata=st)


def test_strata_answers_match_monte_carlo_of_the_sampler():
    m = _strata_model()
    rng = np.random.default_rng(3)
    Q = sparse.csr_matrix((rng.random((40, m.d)) < 0.12).astype(float))
    pairs = np.array([(int(m.strata.anchors[0]), int(m.strata.top[5])), (int(m.strata.top[4]), int(m.strata.top[7])),
                      (0, 1), (int(m.strata.anchors[1]), int(m.strata.anchors[2]))])
    reps = [m.sample(m.n, seed=s) for s in range(60)]
    mc = np.mean([np.asarray(((Y @ Q.T) > 0).sum(axis=0)).ravel() for Y in reps], axis=0)
    np.testing.assert_allclose(mc, m.union_answers(Q), rtol=0.03, atol=3.0)
    mcp = np.mean([np.asarray(Y[:, pairs[:, 0]].multiply(Y[:, pairs[:, 1]]).sum(axis=0)).ravel() for Y in reps],
                  axis=0)
    np.testing.assert_allclose(mcp, m.pair_answers(pairs), rtol=0.06, atol=2.0)
    # every synthetic person of an anchor stratum holds the anchor; rows distinct and sorted
    off, idx = m.sample_sparse(500, 9, 1)
    assert all(np.all(np.diff(idx[off[r]:off[r + 1]]) > 0) for r in range(500))


def test_strata_samples_hold_each_item_close_to_the_model():
    # balanced within each stratum: the holders' spread over seeds is a fraction of what
    # independent people give (Binomial: sd sqrt(h (1 - h / n))), and their mean is the model's
    m = _strata_model()
    d = m.d
    counts = np.array([np.bincount(m.sample_sparse(m.n, s, 0)[1], minlength=d) for s in range(40)])
    expected = m.union_answers(sparse.identity(d, format="csr"))
    np.testing.assert_allclose(counts.mean(axis=0), expected, rtol=0.03, atol=3.0)
    big = expected > 200
    ratio = counts.std(axis=0)[big] / np.sqrt(expected * (1 - expected / m.n))[big]  # independent: median 0.99
    assert big.sum() >= 10 and np.median(ratio) < 0.5


def test_miss_is_the_probability_generating_function():
    draws = np.array([0.1, 0.2, 0.3, 0.4])
    q = np.array([0.0, 0.25, 1.0])
    want = np.array([sum(draws[m] * (1 - x) ** m for m in range(4)) for x in q])
    np.testing.assert_allclose(_miss(draws, q), want)
    D = np.stack([draws, draws[::-1]])
    np.testing.assert_allclose(_miss(D, np.stack([q, q]))[1], [sum(draws[::-1][m] * (1 - x) ** m for m in range(4))
                                                            for x in q])


def test_release_with_strata_round_trips_and_wins_on_pairs(tmp_path):
    X = _paired(n=20000, seed=4)
    with insecure_fixed_seed(7):
        rel = release("synthetic", bound_items(X, max_items="auto"), epsilon=2.0, delta=1e-6)
    with insecure_fixed_seed(7):
        flat = release("synthetic", bound_items(X, max_items="auto"), epsilon=2.0, delta=1e-6, anchors=0)
    m = rel.model
    assert m.strata is not None and rel.public["model"]["anchors"]["chosen"] >= 2
    assert rel.public["strata"]["sensitivity_l2"] == pytest.approx(rel.public["counts"]["sensitivity_l2"])
    pairs = np.array([[0, 1], [2, 3], [0, 2], [1, 3]])
    truth = np.array([float(X[:, a].multiply(X[:, b]).sum()) for a, b in pairs])
    err = np.abs(m.pair_answers(pairs) - truth).mean()
    err_flat = np.abs(flat.model.pair_answers(pairs) - truth).mean()
    assert err < 0.25 * err_flat
    rel.write(str(tmp_path / "rel"))
    again = SyntheticModel.load(tmp_path / "rel" / "_synthetic_model.npz")
    for k, v in m.strata.arrays().items():
        np.testing.assert_array_equal(again.strata.arrays()[k], v)
    np.testing.assert_array_equal(again.sample_sparse(100, 3)[1], m.sample_sparse(100, 3)[1])


def test_a_format_1_model_file_still_loads(tmp_path):
    import io
    import json

    header = {"format_version": 1, "d": 3, "n": 10, "public": {}, "events": None}
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), lengths=np.array([0, 1.0]),
             counts=np.ones(3), noisy_counts=np.ones(3))
    (tmp_path / "m.npz").write_bytes(buf.getvalue())
    m = SyntheticModel.load(tmp_path / "m.npz")
    assert m.strata is None and m.sample(5, 1).shape == (5, 3)
