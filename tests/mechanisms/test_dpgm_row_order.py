"""A cluster's DP-SGD trains on its rows in an order fixed by their contents
(``canonical_order``, docs/research/dpgm.md "Row order"): the model does not depend on the order the
rows arrive in."""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.mechanisms import dpgm
from sparkpriv.mechanisms.dpgm import _train


def _rows(seed=0, n=3000, w=40):
    rng = np.random.default_rng(seed)
    X = (rng.random((n, w)) < 0.3).astype(float)
    X[::5] = X[2]  # many identical rows
    X[1::7, 0] = 0.5  # and fractional values
    return X


def test_canonical_order_is_a_permutation_fixed_by_the_rows_contents():
    X = _rows()
    o = dpgm.canonical_order(X)
    assert np.array_equal(np.sort(o), np.arange(X.shape[0]))
    rng = np.random.default_rng(1)
    for _ in range(3):
        p = rng.permutation(X.shape[0])
        Y = X[p]
        assert np.array_equal(Y[dpgm.canonical_order(Y)], X[o])
    idx = np.flatnonzero(rng.random(X.shape[0]) < 0.4)  # some rows, ordered without copying them
    assert np.array_equal(X[idx[dpgm.canonical_order(X, idx)]], X[idx][dpgm.canonical_order(X[idx])])
    assert dpgm.canonical_order(X[:1]).tolist() == [0]
    assert dpgm.canonical_order(X[:0]).size == 0


def test_the_salts_are_splitmix64():
    """Fixed integer arithmetic, not a generator's stream (which may change between NumPy
    versions): the first outputs of SplitMix64 from state 0, as its reference code gives them."""
    assert [int(v) for v in _train._ROW_HASH[:3]] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_distinct_sparse_binary_rows_get_distinct_hashes():
    """Rows of 0.0 and 1.0 (bits only in the top 12 of 64) over many columns: every distinct row
    its own hash, so the exact fallback is not the rule. A plain multiply-sum of the bits gave
    26,868 hashes for 60,000 distinct rows of this kind."""
    rng = np.random.default_rng(2)
    X = np.unique((rng.random((20000, 784)) < 0.02).astype(float), axis=0)
    h = _train._row_hashes(X.view(np.uint64), None)
    assert np.unique(h).size == X.shape[0]


def test_colliding_rows_fall_back_to_the_exact_order(monkeypatch):
    """With every salt 1 the hash is symmetric in the columns: rows (a, b) and (b, a)
    collide, and the order must still be one fixed by their contents (lexicographic)."""
    monkeypatch.setattr(_train, "_ROW_HASH", np.ones(4, dtype=np.uint64))
    X = np.array([[0.25, 1.0, 0.0], [1.0, 0.25, 0.0], [0.0, 0.0, 0.0], [1.0, 0.25, 0.0], [0.25, 1.0, 0.0]])
    want = X[np.lexsort(X.T[::-1])]  # non-negative floats: their bits order as their values
    for p in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [1, 0, 3, 2, 4]):
        Y = X[p]
        assert np.array_equal(Y[dpgm.canonical_order(Y)], want)
        Z = np.vstack([np.full((2, 3), 0.5), Y])  # the same rows picked out of a larger matrix
        rows = np.arange(2, 7)
        assert np.array_equal(Z[rows[dpgm.canonical_order(Z, rows)]], want)


@pytest.mark.parametrize("model", ["rbm", "vae"])
def test_a_clusters_model_does_not_depend_on_its_rows_order(monkeypatch, model):
    rng = np.random.default_rng(4)
    n, d = 400, 6
    X = (rng.random((n, d)) < np.where(np.arange(n)[:, None] % 2 == 0, 0.7, 0.1)).astype(float)
    params = dpgm.DPGMParams(epsilon=3.0, delta=1e-5, k=2, sampling_rate=0.1, epochs=1, hidden=3,
                             accountant="rdp", kmeans_iterations=2, chains=10, model=model,
                             **({"latent": 2} if model == "vae" else {}))
    plan = dpgm.plan_dpgm(params, n=n, d=d)
    centers = np.vstack([np.full(d, 0.7), np.full(d, 0.1)])
    sizes = np.array([200.0, 200.0])
    labels = dpgm.assign_clusters(X, centers, float(np.sqrt(d)))
    p = np.random.default_rng(5).permutation(n)
    ref = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=5)
    got = dpgm.train_clusters(X[p], labels[p], sizes, centers, plan, seed=5)
    np.testing.assert_array_equal(got, ref)
    # the power of the check: trained in the order given, the two orders give other models
    monkeypatch.setattr(_train, "canonical_order",
                        lambda Y, rows=None: np.arange(Y.shape[0] if rows is None else len(rows)))
    a = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=5)
    b = dpgm.train_clusters(X[p], labels[p], sizes, centers, plan, seed=5)
    assert not np.allclose(a, b)
