"""Event records kept sparse through the DPGM (docs/research/dpgm.md "Event tables"): the blocks' byte
layout, row selection and stacking against dense references built by hand, the sparse
assignment and Lloyd statistics against the dense functions, and DP-SGD on a CSR matrix against
the same steps on the dense matrix (the same bits)."""

import numpy as np
import pytest

from sparkpriv.mechanisms import dpsgd
from sparkpriv.mechanisms.dpgm import _records_stats_fn, assign_sparse
from sparkpriv.mechanisms.kmeans import assign_nearest, cluster_stats
from sparkpriv.mechanisms.protocol import SparseRows
from sparkpriv.mechanisms.rbm import RBM
from sparkpriv.mechanisms.sparse import rows_count_of_bytes, rows_from_bytes, rows_to_bytes, stack_csr, take_rows


def _records(n, d, max_items, seed, values=False):
    """Random sparse records and their dense matrix, built row by row (the reference)."""
    rng = np.random.default_rng(seed)
    lists = [np.sort(rng.choice(d, size=rng.integers(0, max_items + 1), replace=False)) for _ in range(n)]
    vals = [rng.uniform(0.1, 1.0, size=len(x)) for x in lists] if values else None
    dense = np.zeros((n, d))
    for i, x in enumerate(lists):
        dense[i, x] = 1.0 if vals is None else vals[i]
    off = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    idx = np.concatenate(lists).astype(np.int32) if n else np.zeros(0, np.int32)
    v = np.concatenate(vals) if values else None
    return SparseRows(off, idx, v, d), dense


def _dense_of(block):
    X = np.zeros((block.n, block.d))
    off = np.asarray(block.offsets)
    for i in range(block.n):
        a, b = off[i], off[i + 1]
        X[i, np.asarray(block.indices)[a:b]] = 1.0 if block.values is None else np.asarray(block.values)[a:b]
    return X


@pytest.mark.parametrize("values", [False, True])
def test_take_rows_and_bytes_round_trip(values):
    block, dense = _records(50, 17, 6, 1, values)
    rows = np.array([7, 3, 3, 49, 0, 12])
    sub = take_rows(block, rows)
    np.testing.assert_array_equal(_dense_of(sub), dense[rows])
    back = rows_from_bytes(rows_to_bytes(sub))
    assert rows_count_of_bytes(rows_to_bytes(sub)) == 6 and back.d == 17
    np.testing.assert_array_equal(_dense_of(back), dense[rows])
    assert (back.values is None) == (not values)
    # a block whose offsets do not start at 0 (a slice of a larger one) is stored from 0
    sliced = SparseRows(block.offsets[10:21], block.indices, block.values, block.d)
    np.testing.assert_array_equal(_dense_of(rows_from_bytes(rows_to_bytes(sliced))), dense[10:20])
    empty = take_rows(block, np.zeros(0, np.int64))
    assert rows_from_bytes(rows_to_bytes(empty)).n == 0


def test_stack_csr_is_the_dense_rows_in_order():
    parts = [_records(n, 11, 4, s) for s, n in enumerate((5, 0, 9, 1))]
    X = stack_csr([b for b, _ in parts], 11)
    np.testing.assert_array_equal(X.toarray(), np.vstack([dn for _, dn in parts]))
    assert stack_csr([], 11).shape == (0, 11)


def test_sparse_assignment_and_lloyd_stats_equal_the_dense_functions():
    block, dense = _records(400, 30, 5, 2)
    centers = np.random.default_rng(3).uniform(0, 1, (6, 30))
    np.testing.assert_array_equal(assign_sparse(block, centers), assign_nearest(dense, centers))
    np.testing.assert_allclose(_records_stats_fn(centers)(block), cluster_stats(dense, centers), rtol=0, atol=1e-12)
    assert assign_sparse(take_rows(block, np.zeros(0, np.int64)), centers).shape == (0,)


def test_dpsgd_on_a_csr_matrix_equals_the_dense_matrix():
    """Only the Poisson-sampled batch is made dense: the same batches, the same model, bit for bit."""
    block, dense = _records(300, 20, 4, 4)
    X = stack_csr([block], 20)
    model = RBM(20, 5, chains=10)
    noise = dpsgd.step_noise(clip=2.0, noise_multiplier=1.5, dim=model.dim, max_abs=600.0)
    theta0 = model.init(np.random.default_rng(5))
    kw = dict(clip=2.0, sampling_rate=0.1, steps=6, noise=noise, n_pub=300.0, seed=77, cluster=1, lr=0.01)
    a = dpsgd.train(model, X, theta0.copy(), **kw)
    b = dpsgd.train(model, dense, theta0.copy(), **kw)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, theta0)


def test_local_engine_trains_sparse_groups_on_their_rows():
    """The local engine's train_groups with sparse rows gives each group its rows in order, as the
    dense path does (a source of two sparse blocks)."""
    from sparkpriv.local.engine import LocalEngine

    b1, d1 = _records(30, 9, 3, 6)
    b2, d2 = _records(20, 9, 3, 7)

    class _Source:
        kind = "records"

        def blocks(self, block_rows):
            yield b1
            yield b2

    dense = np.vstack([d1, d2])
    g = (dense.sum(axis=1) % 3).astype(int)  # a grouping of the rows

    def group_fn(block):
        return (np.diff(np.asarray(block.offsets)) % 3), block

    seen = {}

    def train_fn(j, Xj):
        seen[j] = Xj.toarray() if hasattr(Xj, "toarray") else np.asarray(Xj)
        return np.full(2, float(j))

    out = LocalEngine().train_groups(_Source(), group_fn, train_fn, 3, 2, 9)
    np.testing.assert_array_equal(out, [[0, 0], [1, 1], [2, 2]])
    for j in range(3):
        np.testing.assert_array_equal(seen[j], dense[g == j])
