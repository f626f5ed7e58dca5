"""Where each cluster's RBM starts (docs/research/dpgm.md, "The RBM's starting point"; docs/math.md section 5):
the released centre projected onto ``{p in [0, 1]^d : sum(p) <= s_j}``, ``s_j`` the mean length
synthesis draws from the cluster's released length histogram."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

from sparkpriv.mechanisms import dpgm, dpsgd

P = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, sampling_rate=0.1, epochs=1, hidden=4, accountant="rdp",
                    kmeans_iterations=3)


def _qp(c, mass):
    """The reference projection: min ||p - c||^2 over [0, 1]^d with sum(p) <= mass (SLSQP)."""
    res = minimize(lambda p: float(((p - c) ** 2).sum()), np.full(c.size, min(mass / c.size, 1.0)),
                   jac=lambda p: 2 * (p - c), bounds=[(0.0, 1.0)] * c.size, method="SLSQP",
                   constraints=[{"type": "ineq", "fun": lambda p: mass - p.sum(), "jac": lambda p: -np.ones(c.size)}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert res.success, res.message
    return res.x


@pytest.mark.parametrize("case", range(12))
def test_projection_against_a_qp_solver(case):
    rng = np.random.default_rng(case)
    d = 9
    c = rng.uniform(-0.6, 1.6, d)
    mass = [0.0, 0.4, 1.0, 2.5, 4.0, 20.0][case % 6]
    got = dpgm.project_capped(c, mass)
    np.testing.assert_allclose(got, _qp(c, mass), atol=2e-6)
    assert got.min() >= 0 and got.max() <= 1 and got.sum() <= mass + 1e-9


def test_projection_keeps_a_centre_inside_and_ties():
    c = np.array([0.2, -0.3, 1.4, 0.5])
    np.testing.assert_array_equal(dpgm.project_capped(c, 3.0), [0.2, 0.0, 1.0, 0.5])  # clip sum 1.7 <= 3
    # ties: equal entries lose the same amount, soft threshold lam = 0.25: 0.75 * 4 = 3
    np.testing.assert_allclose(dpgm.project_capped(np.full(4, 1.0), 3.0), np.full(4, 0.75), atol=1e-12)
    # closed form: c = (1.5, 0.6, 0.3, 0.1), mass 1.5: lam = 0.2 gives (1, 0.4, 0.1, 0), sum 1.5
    np.testing.assert_allclose(dpgm.project_capped(np.array([1.5, 0.6, 0.3, 0.1]), 1.5), [1.0, 0.4, 0.1, 0.0],
                               atol=1e-12)
    np.testing.assert_array_equal(dpgm.project_capped(np.array([0.4, 0.9]), 0.0), [0.0, 0.0])
    np.testing.assert_array_equal(dpgm.project_capped(np.array([0.4, 0.9]), -2.0), [0.0, 0.0])


def test_projection_is_closer_to_a_sparse_truth_than_the_box_clip():
    """The set is convex and holds the truth, so the projection is never further from it than the
    clipped centre; for a sparse truth under noise (a small cluster's centre) it is much closer."""
    rng = np.random.default_rng(4)
    d, ratios = 400, []
    for _ in range(200):
        truth = np.zeros(d)
        hot = rng.choice(d, 12, replace=False)
        truth[hot] = rng.uniform(0.2, 0.9, 12)
        mass = truth.sum() * rng.uniform(1.0, 1.5)  # any mass at least the truth's
        c = truth + rng.normal(0, 0.15, d)
        clip_err = np.linalg.norm(np.clip(c, 0, 1) - truth)
        proj_err = np.linalg.norm(dpgm.project_capped(c, mass) - truth)
        assert proj_err <= clip_err + 1e-12
        ratios.append(proj_err / clip_err)
    assert np.mean(ratios) < 0.6, np.mean(ratios)


def test_expected_length_is_the_synthetic_mean():
    edges = dpgm.length_edges(12)  # 0..7 one each, [8, 10), [10, 13)
    assert edges.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 13]
    h = np.zeros(edges.size - 1)
    h[2], h[8], h[9] = 100.0, 50.0, 15.0  # length 2; [8, 10): mean 8.5; 15 < 2 std: dropped
    assert dpgm.expected_length(h, edges, 10.0) == pytest.approx((100 * 2 + 50 * 8.5) / 150)
    assert dpgm.expected_length(np.full(edges.size - 1, 19.9), edges, 10.0) is None
    # the mean of the lengths synthesis draws
    lens = dpgm.synthetic_lengths(h, edges, 10.0, 200_000, np.random.default_rng(0))
    assert lens.mean() == pytest.approx(dpgm.expected_length(h, edges, 10.0), abs=0.03)


def test_masses_own_pooled_and_the_bound():
    params = dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=3, row_bound=math.sqrt(12), sampling_rate=0.1, epochs=1,
                             accountant="rdp")
    plan = dpgm.plan_dpgm(params, n=1000, d=20)
    lp = plan.lengths
    std = lp.noise.std
    assert lp.edges.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 13]
    H = np.zeros((3, lp.bins))
    H[0, 3] = 5 * std  # cluster 0: all of length 3
    H[1, 6] = 1.5 * std  # cluster 1: below 2 std alone -> the pooled histogram
    H[2, 6] = 1.5 * std
    # pooled: bin 3 has 5 std, bin 6 has 3 std; the threshold is 2 sqrt(3) std = 3.46 std: bin 3 only
    got = dpgm.visible_masses(plan, H)
    np.testing.assert_allclose(got, [3.0, 3.0, 3.0])
    H[1, 6] = H[2, 6] = 3.0 * std  # pooled bin 6: 6 std, kept; each cluster's own too
    np.testing.assert_allclose(dpgm.visible_masses(plan, H), [3.0, 6.0, 6.0])
    H[2] = 0.0
    H[1] = 0.0
    H[0] = 0.0  # nothing anywhere: the longest record the bounds admit
    np.testing.assert_allclose(dpgm.visible_masses(plan, H), [12.0, 12.0, 12.0])
    np.testing.assert_allclose(dpgm.visible_masses(plan, None), [12.0, 12.0, 12.0])
    no_lengths = dpgm.plan_dpgm(dpgm.DPGMParams(**{**params.public_dict(), "length_share": 0.0}), n=1000, d=20)
    np.testing.assert_allclose(dpgm.visible_masses(no_lengths, None), [12.0, 12.0, 12.0])


def _two_groups(n=600, d=10, seed=0):
    rng = np.random.default_rng(seed)
    X = np.zeros((n, d))
    X[: n // 2, :3] = rng.random((n // 2, 3)) < 0.9
    X[n // 2:, 3:] = rng.random((n - n // 2, d - 3)) < 0.7
    return X


def test_each_rbm_starts_at_its_projected_centre(monkeypatch):
    """The in-memory release: the histograms are released before training, each cluster's RBM
    starts at the logits of its centre projected (the QP reference) onto its mass (worked out
    here from the released histogram), and the model file records the masses."""
    starts = {}
    real = dpsgd.train

    def spy(gen, Xj, theta0, **kw):
        starts[kw["cluster"]] = np.array(theta0, copy=True)
        return real(gen, Xj, theta0, **kw)

    monkeypatch.setattr(dpsgd, "train", spy)
    X = _two_groups()
    model, plan = dpgm.fit_dpgm_array(X, P, seed=11)
    lp, d, h = plan.lengths, X.shape[1], P.hidden
    assert sorted(starts) == [0, 1]
    bound = 0
    for j in range(2):
        w = np.where(model.lengths[j] >= 2 * lp.noise.std, model.lengths[j], 0.0)
        mid = (lp.edges[:-1] + lp.edges[1:] - 1) / 2
        mass = (w * mid).sum() / w.sum()
        assert model.plan_public["start_masses"][j] == pytest.approx(mass)
        p = np.clip(_qp(np.asarray(model.centers[j]), mass), 1e-3, 1 - 1e-3)
        np.testing.assert_allclose(starts[j][d * h: d * h + d], np.log(p / (1 - p)), atol=2e-3)
        bound += np.clip(model.centers[j], 0, 1).sum() > mass + 0.1  # the projection moved this centre
    assert bound >= 1


def test_vae_records_no_start_masses():
    X = _two_groups()
    model, _ = dpgm.fit_dpgm_array(X, dpgm.DPGMParams(**{**P.public_dict(), "model": "vae"}), seed=2)
    assert "start_masses" not in model.plan_public


def test_length_pass_of_sparse_and_dense_blocks():
    """The pre-training pass's histograms (``_lengths_fn``) of sparse blocks (binary, or with values)
    and of dense rows are those of the same rows' ``LengthPlan.histogram``."""
    from sparkpriv.mechanisms.protocol import SparseRows

    plan = dpgm.plan_dpgm(dpgm.DPGMParams(epsilon=2.0, delta=1e-5, k=2, row_bound=math.sqrt(12), sampling_rate=0.1,
                                          epochs=1, accountant="rdp"), n=1000, d=20)
    lp = plan.lengths
    centers = np.zeros((2, 20))
    centers[0, :10] = 0.6
    centers[1, 10:] = 0.6
    rng = np.random.default_rng(5)
    X = np.zeros((50, 20))
    for r in range(50):
        X[r, rng.choice(20, int(rng.integers(0, 13)), replace=False)] = 1.0
    labels = dpgm.assign_clusters(X, centers, math.sqrt(12))
    want = np.stack([lp.histogram(X[labels == j]) for j in range(2)]).ravel()
    fn = dpgm._lengths_fn(centers, math.sqrt(12), lp)
    np.testing.assert_array_equal(fn(X), want)
    rows, cols = np.nonzero(X)
    off = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=50))]).astype(np.int64)
    np.testing.assert_array_equal(fn(SparseRows(off, cols.astype(np.int32), None, 20)), want)
    # with values: a record's length is the sum of its values, rounded (halves: 6 x 0.5 is 3)
    vals = np.ones(cols.size)
    vals[off[0]: off[1]] = 0.5
    X[0] *= 0.5
    labels = dpgm.assign_clusters(X, centers, math.sqrt(12))
    want = np.stack([lp.histogram(X[labels == j]) for j in range(2)]).ravel()
    np.testing.assert_array_equal(fn(SparseRows(off, cols.astype(np.int32), vals, 20)), want)
    assert fn(SparseRows(np.zeros(1, np.int64), np.zeros(0, np.int32), None, 20)).tolist() == [0.0] * (2 * lp.bins)
