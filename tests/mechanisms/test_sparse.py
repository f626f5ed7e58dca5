"""Sparse person records (numpy): vocabulary, keyed item cap, sparse projection, sensitivities."""

import itertools

import numpy as np
import pytest
from scipy import stats

from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.mechanisms.sparse import (
    ItemCap,
    Vocabulary,
    cap_items,
    clip_sparse_rows,
    dedupe_rows,
    densify_rows,
    plan_sparse_projection,
    project_sparse_rows,
    sparse_rows_from_lists,
)


# ---------------------------------------------------------------- vocabulary

def test_vocabulary_range_and_ids(tmp_path):
    v = Vocabulary.parse("range:10:15")
    np.testing.assert_array_equal(v.index([9, 10, 14, 15, 12]), [-1, 0, 4, -1, 2])
    assert Vocabulary.parse("10..14") == v and Vocabulary.parse(range(10, 15)) == v
    ids = Vocabulary.from_ids([30, 10, 20])
    np.testing.assert_array_equal(ids.index([10, 20, 30, 40]), [1, 2, 0, -1])
    s = Vocabulary.from_ids(["T9", "T1"])
    np.testing.assert_array_equal(s.index(["T1", "x", "T9"]), [1, -1, 0])
    f = tmp_path / "towers.csv"
    f.write_text("tower_id,x,y\n7,0.1,0.2\n3,0.5,0.5\n# comment\n\n5,1,1\n")
    fv = Vocabulary.parse(str(f))
    assert fv.ids == (7, 3, 5) and fv.size == 3
    assert fv.to_public_dict()["ids_sha256"] == Vocabulary.from_ids([7, 3, 5]).to_public_dict()["ids_sha256"]
    with pytest.raises(ParameterError, match="twice"):
        Vocabulary.from_ids([1, 2, 1])
    with pytest.raises(ParameterError, match="Cannot read"):
        Vocabulary.parse(str(tmp_path / "missing.txt"))
    with pytest.raises(ParameterError, match="declared"):
        Vocabulary.parse(None)


def test_item_cap_bounds_and_errors():
    b = ItemCap(9)
    assert (b.l1_bound, b.l2_bound) == (9, 3)
    c = ItemCap(4, "counts", 5)
    assert (c.l1_bound, c.l2_bound) == (20, 10)
    with pytest.raises(ParameterError, match="max_events_per_item.*required"):
        ItemCap(4, "counts")
    with pytest.raises(ParameterError, match="only applies"):
        ItemCap(4, "binary", 3)
    with pytest.raises(ParameterError, match="'max_items' parameter .* must be an int"):
        ItemCap(0)


# ---------------------------------------------------------------- dedupe and cap

def test_dedupe_rows_matches_python():
    rng = np.random.default_rng(1)
    lists = [list(rng.integers(0, 8, rng.integers(0, 12))) for _ in range(200)]
    off, idx = sparse_rows_from_lists(lists)
    o2, i2, c2 = dedupe_rows(off, idx)
    for r, lst in enumerate(lists):
        u, cnt = np.unique(lst, return_counts=True) if lst else (np.array([]), np.array([]))
        np.testing.assert_array_equal(i2[o2[r]:o2[r + 1]], u)
        np.testing.assert_array_equal(c2[o2[r]:o2[r + 1]], cnt)


def _capped(lists, L, key, ph=None, counts=None, cap=None):
    off, idx = sparse_rows_from_lists(lists)
    ph = np.arange(len(lists), dtype=np.int64) * 7919 if ph is None else ph
    return cap_items(off, idx, counts, ph, cap or ItemCap(L), key)


def test_cap_keeps_at_most_L_sorted_subsets_and_reports_truncation():
    rng = np.random.default_rng(2)
    lists = [sorted(rng.choice(50, rng.integers(0, 20), replace=False)) for _ in range(500)]
    off, idx, vals, t = _capped(lists, 5, key=123)
    assert vals is None
    sizes = np.diff(off)
    np.testing.assert_array_equal(sizes, np.minimum([len(x) for x in lists], 5))
    for r, lst in enumerate(lists):
        kept = idx[off[r]:off[r + 1]]
        assert set(kept) <= set(lst) and list(kept) == sorted(kept)
    assert t.people == 500
    assert t.people_truncated == sum(len(x) > 5 for x in lists)
    assert t.items_dropped == sum(max(len(x) - 5, 0) for x in lists)


def test_cap_is_reproducible_and_keyed():
    lists = [list(range(30))] * 50
    a = _capped(lists, 4, key=1)
    b = _capped(lists, 4, key=1)
    c = _capped(lists, 4, key=2)
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])
    # different people with the same items keep different subsets
    assert len({tuple(a[1][a[0][r]:a[0][r + 1]]) for r in range(50)}) > 40


def test_cap_choice_does_not_depend_on_the_order_of_a_persons_items():
    """Binary records skip the sort (collect_set gives distinct items in any order)."""
    rng = np.random.default_rng(6)
    lists = [rng.choice(60, rng.integers(1, 25), replace=False).tolist() for _ in range(300)]
    off, idx = sparse_rows_from_lists(lists)
    shuffled = [rng.permutation(x).tolist() for x in lists]
    off2, idx2 = sparse_rows_from_lists(shuffled)
    ph = rng.integers(-2**63, 2**63 - 1, len(lists), dtype=np.int64)
    cap = ItemCap(6)
    a = cap_items(off, idx, None, ph, cap, 99)
    b = cap_items(off2, idx2, None, ph, cap, 99)
    np.testing.assert_array_equal(a[0], b[0])
    for r in range(len(lists)):
        assert set(a[1][a[0][r]:a[0][r + 1]]) == set(b[1][b[0][r]:b[0][r + 1]])
    assert a[3].people_truncated == b[3].people_truncated == sum(len(x) > 6 for x in lists)


@pytest.mark.parametrize("L", [1, 4, 9])
def test_cap_keeps_the_L_smallest_keyed_scores_person_by_person(L):
    # independent reference: score each truncated person's items on their own
    from sparkpriv.mechanisms.sparse import keyed_item_scores

    rng = np.random.default_rng(L)
    lists = [rng.choice(300, rng.integers(0, 40), replace=False).tolist() for _ in range(400)]
    off, idx = sparse_rows_from_lists(lists)
    ph = rng.integers(-2**63, 2**63 - 1, len(lists), dtype=np.int64)
    o, i, _, t = cap_items(off, idx, None, ph, ItemCap(L), 4242)
    for r, lst in enumerate(lists):
        got = set(i[o[r]:o[r + 1]].tolist())
        if len(lst) <= L:
            assert got == set(lst)
            continue
        s = keyed_item_scores(ph[r:r + 1], np.array([0, len(lst)]), np.array(lst, np.int32), 4242)
        assert got == {lst[j] for j in np.argsort(s)[:L]}
    assert t.people_truncated == sum(len(x) > L for x in lists)


def test_cap_choice_is_uniform_not_the_first_L():
    # 20,000 people, each with the same 10 items; keep 3: every item is kept
    # with probability 3/10. A "first L" rule keeps items 0,1,2 always.
    m, L, n = 10, 3, 20_000
    lists = [list(range(m))] * n
    ph = np.random.default_rng(3).integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    off, idx, _, _ = _capped(lists, L, key=987654321, ph=ph)
    freq = np.bincount(idx, minlength=m)
    assert freq.sum() == n * L
    chi2 = stats.chisquare(freq).pvalue
    assert chi2 > 1e-4, freq
    assert freq[:L].sum() < 0.4 * n * L
    # pairs are uniform too (a uniform L-subset): each of the 45 pairs ~ n*C(8,1)/C(10,3)
    pairs = np.zeros((m, m))
    for r in range(2000):
        s = idx[off[r]:off[r + 1]]
        for i, j in itertools.combinations(s, 2):
            pairs[i, j] += 1
    obs = pairs[np.triu_indices(m, 1)]
    assert stats.chisquare(obs).pvalue > 1e-4


def test_counts_mode_caps_counts_and_reports_events():
    # person 0: item 1 x5, item 2 x1, item 3 x2 ; L=2, c=3
    lists = [[1, 1, 1, 1, 1, 2, 3, 3], [4, 4, 4, 4]]
    off, idx = sparse_rows_from_lists(lists)
    off, idx, cnt = dedupe_rows(off, idx)
    cap = ItemCap(2, "counts", 3)
    o, i, v, t = cap_items(off, idx, cnt, np.array([11, 12], np.int64), cap, key=5)
    kept0 = dict(zip(i[o[0]:o[1]], v[o[0]:o[1]]))
    assert len(kept0) == 2 and v.dtype == np.float64
    full = {1: 5, 2: 1, 3: 2}
    assert all(kept0[k] == min(full[k], 3) for k in kept0)
    dropped = (set(full) - set(kept0)).pop()
    assert t.events_dropped == full[dropped]
    assert t.events_capped == max(full.get(1, 0) - 3, 0) * (1 in kept0) + 1  # person 1: 4 -> 3
    np.testing.assert_array_equal(i[o[1]:o[2]], [4])
    np.testing.assert_array_equal(v[o[1]:o[2]], [3.0])


def test_clip_sparse_rows_enforces_both_norms():
    cap = ItemCap(4, "counts", 2)
    off, idx = sparse_rows_from_lists([[0, 1], [0, 1, 2, 3, 4, 5]])
    vals = np.array([5.0, 1.0, 2, 2, 2, 2, 2, 2])
    v, counts = clip_sparse_rows(off, idx, vals, cap, d=6)
    assert counts.rows == 2 and counts.box_clipped == 1 and counts.norm_clipped == 1
    np.testing.assert_array_equal(v[:2], [2.0, 1.0])
    r1 = v[2:]
    assert r1.sum() <= cap.l1_bound + 1e-12 and np.linalg.norm(r1) <= cap.l2_bound + 1e-12
    with pytest.raises(InputError, match=r"\[0, 6\)"):
        clip_sparse_rows(off, idx + 1, vals, cap, d=6)


# ---------------------------------------------------------------- sparse projection

def test_sparse_projection_equals_dense_exactly_and_python_sum():
    rng = np.random.default_rng(4)
    d, k = 40, 7
    lists = [sorted(rng.choice(d, rng.integers(0, 9), replace=False)) for _ in range(300)]
    off, idx = sparse_rows_from_lists(lists)
    vals = rng.integers(1, 4, idx.size).astype(float)
    # dyadic P: every partial sum is exact, so any summation order gives the same bits
    Pd = rng.integers(-512, 512, (d, k)) / 256.0
    for v in (None, vals):
        Y = project_sparse_rows(off, idx, v, Pd)
        X = densify_rows(off, idx, v, d)
        np.testing.assert_array_equal(Y, X @ Pd)
        ref = np.array([sum(((1.0 if v is None else v[j]) * Pd[idx[j]] for j in range(off[r], off[r + 1])),
                            np.zeros(k)) for r in range(len(lists))])
        np.testing.assert_array_equal(Y, ref)
    P = draw_projection_matrix(d, k, seed=3)
    np.testing.assert_allclose(project_sparse_rows(off, idx, vals, P), densify_rows(off, idx, vals, d) @ P,
                               rtol=1e-13, atol=1e-13)
    assert densify_rows(off, idx, None, d).sum() == idx.size


def _records(d, L, c):
    """Every record with at most L items and values in {1..c} (binary: c = 1)."""
    out = [np.zeros(d)]
    for m in range(1, L + 1):
        for S in itertools.combinations(range(d), m):
            for vals in itertools.product(range(1, c + 1), repeat=m):
                x = np.zeros(d)
                x[list(S)] = vals
                out.append(x)
    return np.array(out)


@pytest.mark.parametrize("L,c", [(1, 1), (2, 1), (3, 1), (1, 3), (2, 2)])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_sensitivity_from_item_cap_vs_brute_force(L, c, noise):
    d, k = 6, 3
    P = draw_projection_matrix(d, k, seed=10 + L + c)
    cap = ItemCap(L) if c == 1 else ItemCap(L, "counts", c)
    X = _records(d, L, c)
    Y = X @ P
    ordp = 1 if noise == "laplace" else 2
    delta = 0.0 if noise == "laplace" else 1e-6
    for neighbors in ("add-remove", "replace-one"):
        plan = plan_sparse_projection(P, cap, epsilon=1.0, delta=delta, noise=noise, neighbors=neighbors)
        if neighbors == "add-remove":
            brute = np.linalg.norm(Y, ord=ordp, axis=1).max()
        else:
            brute = max(np.linalg.norm(Y - y, ord=ordp, axis=1).max() for y in Y)
        assert brute <= plan.sensitivity * (1 + 1e-12)
        # the smaller of the two norm bounds of the cap, computed independently
        if noise == "laplace":
            from tests.mechanisms.test_projection import _brute_l1

            f = 2.0 if neighbors == "replace-one" else 1.0
            expect = min(f * cap.l1_bound * np.abs(P).sum(axis=1).max(), _brute_l1(P, f * cap.l2_bound))
        else:
            f = 2.0 if neighbors == "replace-one" else 1.0
            expect = min(f * cap.l1_bound * np.linalg.norm(P, axis=1).max(),
                         f * cap.l2_bound * np.linalg.svd(P, compute_uv=False)[0])
        assert plan.sensitivity == pytest.approx(expect, rel=1e-12)
        if L == 1 and neighbors == "add-remove":
            assert plan.sensitivity == pytest.approx(brute, rel=1e-12)  # tight: one item at full value


def test_sparse_plan_rejects_element_neighbours():
    P = draw_projection_matrix(5, 2, seed=1)
    with pytest.raises(ParameterError, match="protects the whole person"):
        plan_sparse_projection(P, ItemCap(2), epsilon=1.0, neighbors="element")
