"""docs/research/scripts/dpgm_model_study.py (docs/research/dpgm.md, "Training: a second study"): its helpers against
brute-force references, and one small run end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.sparse import csr_matrix

from tests.scripts import load_script


@pytest.fixture(scope="module")
def study():
    return load_script("dpgm_model_study")


def _table(seed=0, n=400, d=30):
    rng = np.random.default_rng(seed)
    return csr_matrix((rng.random((n, d)) < rng.uniform(0.02, 0.5, size=(n, 1))).astype(np.float32))


def test_cap_keeps_a_subset_of_at_most_L_items(study):
    X = _table()
    Y = study.cap(X, 5, seed=3)
    Xd, Yd = X.toarray() > 0, Y.toarray() > 0
    assert not (Yd & ~Xd).any()  # only items the person has
    lx, ly = Xd.sum(axis=1), Yd.sum(axis=1)
    np.testing.assert_array_equal(ly, np.minimum(lx, 5))
    # uniform subset: over many people with many items, every item position is kept alike
    Z = csr_matrix(np.ones((4000, 10), np.float32))
    kept = study.cap(Z, 3, seed=1).toarray().mean(axis=0)
    assert np.all(np.abs(kept - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 4000))


def test_answers_count_people_with_any_item_of_the_query(study):
    X = _table(1)
    rng = np.random.default_rng(2)
    Q = (rng.random((X.shape[1], 25)) < 0.1).astype(np.float64)
    want = ((X.toarray() @ Q) > 0).sum(axis=0)
    np.testing.assert_array_equal(study.answers(X, Q), want)


def test_a_small_run_writes_every_variant(study, tmp_path):
    out = tmp_path / "study.jsonl"
    study.main(["--people", "3000", "--max-items", "16", "--synthetic", "2000", "--k", "2",
                "--sampling-rate", "0.1", "--epochs", "2", "--out", str(out), "--save-model", str(tmp_path / "m"),
                "--variants", json.dumps([{"name": "defaults"}, {"name": "tail 0", "average_tail": 0.0},
                                          {"name": "oracle", "oracle": True}])])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["name"] for r in rows] == ["defaults", "tail 0", "oracle"]
    for r in rows:
        assert r["people"] == 3000 and r["steps"] == 20 and len(r["groups"]) == 5
        assert 0.0 < r["error"] < 1.5 and r["marginal_l1"] >= 0.0
    assert rows[0]["sigma"] == rows[1]["sigma"] > 0 and rows[2]["sigma"] is None
    assert rows[0]["error"] != rows[1]["error"]  # the tail mean is a different model
    from sparkpriv.mechanisms import dpgm

    saved = dpgm.DPGMModel.load(tmp_path / "m" / "defaults.npz")  # the oracle has no model to save
    assert saved.k == 2 and sorted(p.name for p in (tmp_path / "m").iterdir()) == ["defaults.npz", "tail 0.npz"]


def test_calibration_moves_the_mixtures_marginals_towards_the_target(study):
    """One calibration step shifts every cluster's visible biases by the same vector
    log((target + s) / (current + s)) and changes nothing else, and the synthetic marginals then
    meet a target far from the start better than before (by sampling; fixed test seeds)."""
    from sparkpriv.mechanisms import dpgm

    d, n = 12, 20_000
    rng = np.random.default_rng(5)
    X = (rng.random((n, d)) < 0.3).astype(np.float64)
    params = dpgm.DPGMParams(epsilon=1e4, delta=1e-5, k=2, sampling_rate=0.1, epochs=1.0, hidden=4,
                             length_share=0.0)
    model, _ = dpgm.fit_dpgm_array(X, params, seed=1)
    h = params.hidden
    current = np.full(d, 0.3 * n)
    target = np.linspace(0.1, 0.6, d) * n
    cal = study.calibrate_marginals(model, current, target, 1.0)
    shift = np.log((target + 1.0) / (current + 1.0))
    np.testing.assert_allclose(cal.thetas[:, d * h: d * h + d] - model.thetas[:, d * h: d * h + d],
                               np.broadcast_to(shift, (2, d)))
    untouched = np.ones(cal.thetas.shape[1], bool)
    untouched[d * h: d * h + d] = False
    np.testing.assert_array_equal(cal.thetas[:, untouched], model.thetas[:, untouched])
    before = dpgm.synthesize(model, n, seed=3).mean(axis=0)
    after = dpgm.synthesize(cal, n, seed=3).mean(axis=0)
    assert np.abs(after * n - target).sum() < 0.5 * np.abs(before * n - target).sum()


def test_exact_kmeans_gives_the_exact_clusters_and_their_sizes(study):
    """The non-private yardstick's clusters: two far-apart groups of records (items 0-3 and
    items 6-9), found exactly, with their real sizes and centres in [0, 1]."""
    from sparkpriv.mechanisms import dpgm

    rng = np.random.default_rng(5)
    a = (rng.random((700, 12)) < np.r_[[0.9] * 4, [0.0] * 8]).astype(np.float64)
    b = (rng.random((300, 12)) < np.r_[[0.0] * 6, [0.9] * 4, [0.0] * 2]).astype(np.float64)
    X = csr_matrix(np.vstack([a, b]))
    params = dpgm.DPGMParams(epsilon=1.0, delta=1e-5, k=2, row_bound=4.0)
    centers, sizes, labels, kstd = study.exact_kmeans(X, params, None, 12, 3)
    assert sorted(sizes.tolist()) == [300.0, 700.0] and kstd < 1e-3
    assert len(set(labels[:700])) == 1 and len(set(labels[700:])) == 1 and labels[0] != labels[-1]
    np.testing.assert_array_equal(np.bincount(labels, minlength=2), sizes)
    assert centers.shape == (2, 12) and centers.min() >= 0.0 and centers.max() <= 1.0
    big = centers[labels[0]]
    assert big[:4].min() > 0.8 and big[4:].max() == 0.0  # the centre of items 0-3's group


def test_a_small_run_with_exact_kmeans(study, tmp_path):
    out = tmp_path / "study.jsonl"
    study.main(["--people", "3000", "--max-items", "16", "--synthetic", "1000", "--k", "2",
                "--sampling-rate", "0.1", "--epochs", "1", "--out", str(out),
                "--variants", json.dumps([{"name": "exact", "exact_kmeans": True}])])
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["name"] == "exact" and sum(row["sizes"]) in range(2990, 3011)  # exact sizes as trained
    assert 0.0 < row["error"] < 1.5 and row["sigma"] > 0


def _shared(study, strata=(3, 6), k=3, d=9, hidden=4, seed=0):
    rng = np.random.default_rng(seed)
    chain_cluster = np.repeat(np.arange(k), 4)
    model = study.SharedRBM(d, hidden, k, strata, weights=np.array([0.5, 0.3, 0.2])[:k],
                            chain_cluster=chain_cluster, chain_lengths=rng.integers(1, d, chain_cluster.size))
    theta = 0.3 * rng.standard_normal(model.dim)
    V = (rng.random((40, d)) < 0.4).astype(np.float64)
    labels = rng.integers(0, k, V.shape[0])
    return model, theta, V, labels


@pytest.mark.parametrize("strata", [(3, 6), ()])
def test_shared_rbm_gradients_are_those_of_the_free_energy(study, strata):
    """Each record's materialised gradient against central finite differences of F(v) of its own
    cluster and stratum, and the clipped sum without per-example gradients against the
    materialised gradients clipped one by one."""
    model, theta, V, labels = _shared(study, strata)
    G = model.per_example_grads(V, labels, theta)
    eps = 1e-6
    for i in (0, 7, 23):
        num = np.empty(model.dim)
        for p in range(model.dim):
            e = np.zeros(model.dim)
            e[p] = eps
            num[p] = (model.free_energy(V[i:i + 1], labels[i:i + 1], theta + e)[0]
                      - model.free_energy(V[i:i + 1], labels[i:i + 1], theta - e)[0]) / (2 * eps)
        np.testing.assert_allclose(G[i], num, atol=1e-6)
    norms = np.linalg.norm(G, axis=1)
    for clip in (None, float(np.median(norms))):
        f = np.ones(V.shape[0]) if clip is None else np.minimum(1.0, clip / norms)
        Xb = np.hstack([V, (labels + 1.0)[:, None]])
        got, sq = model.clipped_sum(Xb, theta, clip)
        np.testing.assert_allclose(sq, norms ** 2, rtol=1e-10)
        np.testing.assert_allclose(got, (f[:, None] * G).sum(axis=0), atol=1e-10)
        if clip is not None:  # every record's share of the sum is within the clip
            assert np.all(np.linalg.norm(f[:, None] * G, axis=1) <= clip * (1 + 1e-12))


def test_shared_rbm_model_term_weighs_each_clusters_chains_by_its_share(study):
    """The negative phase is -sum_j w_j mean over cluster j's chains of grad F (chains after the
    sweep; unclipped here), and the chains keep their fixed lengths."""
    model, theta, _, _ = _shared(study)
    chains = model.init_state(np.random.default_rng(1), theta)
    np.testing.assert_array_equal(chains.sum(axis=1), model.chain_lengths)
    g, new = model.model_term(theta, chains, np.random.default_rng(2))
    np.testing.assert_array_equal(new.sum(axis=1), model.chain_lengths)
    G = model.per_example_grads(new, model.chain_cluster, theta)
    want = -sum(w * G[model.chain_cluster == j].mean(axis=0) for j, w in enumerate([0.5, 0.3, 0.2]))
    np.testing.assert_allclose(g, want, atol=1e-10)


def test_shared_rbm_cluster_thetas_are_rbms_of_the_same_free_energy(study):
    """Cluster j's RBM of cluster_thetas has, for every record, the shared model's free energy
    for cluster j (the library's RBM with the same strata reads it), with and without strata."""
    from sparkpriv.mechanisms.rbm import RBM

    for strata in ((3, 6), ()):
        model, theta, V, _ = _shared(study, strata)
        thetas = model.cluster_thetas(theta)
        rbm = RBM(model.d, model.hidden, strata=strata)
        assert thetas.shape == (model.k, rbm.dim)
        for j in range(model.k):
            np.testing.assert_allclose(rbm.free_energy(V, thetas[j]),
                                       model.free_energy(V, np.full(V.shape[0], j), theta), atol=1e-12)


def test_chains_are_shared_out_in_proportion_to_the_noisy_sizes(study):
    """allocate_chains: at least one chain a cluster, the rest in proportion to the clamped sizes
    (closed form on sizes whose shares of 1,000 are whole numbers), and equal shares when no
    cluster has people."""
    got = study.allocate_chains([600.0, 300.0, 100.0, 0.0, -5.0], 1000)
    np.testing.assert_array_equal(got, [600, 300, 100, 1, 1])
    np.testing.assert_array_equal(study.allocate_chains([0.0, 0.0], 10), [5, 5])
    assert study.allocate_chains([1e6, 1.0], 40).tolist() == [40, 1]


def test_a_small_run_with_one_shared_model(study, tmp_path):
    out = tmp_path / "study.jsonl"
    study.main(["--people", "3000", "--max-items", "16", "--synthetic", "2000", "--k", "3",
                "--sampling-rate", "0.1", "--epochs", "2", "--out", str(out),
                "--variants", json.dumps([{"name": "shared", "shared": True, "shared_rate": 0.05,
                                           "shared_steps": 30, "shared_chains": 5},
                                          {"name": "allocated", "shared": True, "shared_rate": 0.05,
                                           "shared_steps": 30, "shared_chains": 5, "shared_allocate": True}])])
    row, allocated = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["steps"] == 30 and len(row["groups"]) == 5 and 0.0 < row["error"] < 1.5
    assert allocated["sigma"] == row["sigma"] and 0.0 < allocated["error"] < 1.5  # the same privacy event
    # sigma calibrated again for (q, T) = (0.05, 30), the rest of the release as the plan's (0.1, 20)
    from sparkpriv.mechanisms import dpgm
    from sparkpriv.spark.generate_events import CDR_MODEL

    kw = dict(epsilon=1.0, delta=1 / 3000, k=3, row_bound=4.0)
    want = dpgm.plan_dpgm(dpgm.DPGMParams(sampling_rate=0.05, epochs=1.5, **kw), n=3000, d=CDR_MODEL.items)
    base = dpgm.plan_dpgm(dpgm.DPGMParams(sampling_rate=0.1, epochs=2.0, **kw), n=3000, d=CDR_MODEL.items)
    assert want.steps == 30 and row["sigma"] == want.noise_multiplier != base.noise_multiplier
