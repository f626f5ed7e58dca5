"""docs/research/scripts/dpgm_diagnose.py (docs/research/dpgm.md, "Where the model's error is"): the raking, the weighted
answers and the pair counts against brute-force references, and one small run end to end."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import numpy as np
import pytest
from scipy.sparse import csr_matrix

from tests.scripts import load_script


@pytest.fixture(scope="module")
def diag():
    return load_script("dpgm_diagnose")


def _records(seed=0, n=3000, d=12):
    rng = np.random.default_rng(seed)
    return csr_matrix((rng.random((n, d)) < rng.uniform(0.05, 0.5, size=d)).astype(np.float64))


def test_raking_meets_feasible_targets_with_exponential_weights(diag):
    V = _records()
    n, d = V.shape
    rng = np.random.default_rng(1)
    # a feasible target: the column sums under a known tilt of the rows
    lam = rng.normal(0.0, 0.4, d)
    t = np.exp(V @ lam)
    target = V.T @ (n * t / t.sum())
    w = diag.rake(V, target, float(n), reg=1e-9)
    np.testing.assert_allclose(V.T @ w, target, rtol=2e-3)
    assert abs(w.sum() - n) < 1e-6 * n
    # maximum entropy: log w is affine in the row (log w = v . lam + const), checked by least squares
    A = np.column_stack([V.toarray(), np.ones(n)])
    coef, *_ = np.linalg.lstsq(A, np.log(w), rcond=None)
    np.testing.assert_allclose(A @ coef, np.log(w), atol=1e-6)
    np.testing.assert_allclose(coef[:d], lam, atol=5e-3)  # the tilt's own coefficients


def test_raking_to_the_rows_own_sums_leaves_every_weight_one(diag):
    V = _records(2)
    w = diag.rake(V, np.asarray(V.sum(axis=0)).ravel(), float(V.shape[0]), reg=1e-9)
    np.testing.assert_allclose(w, 1.0, atol=1e-3)


def test_weighted_answers_count_weighted_people_with_any_item(diag):
    V = _records(3, n=400)
    rng = np.random.default_rng(4)
    Q = (rng.random((V.shape[1], 20)) < 0.2).astype(np.float64)
    w = rng.uniform(0.2, 3.0, V.shape[0])
    Vd = V.toarray() > 0
    want = [sum(w[i] for i in range(V.shape[0]) if (Vd[i] & (Q[:, q] > 0)).any()) for q in range(Q.shape[1])]
    np.testing.assert_allclose(diag.weighted_answers(V, Q, w), want)


def test_pair_mass_counts_each_persons_pairs_by_distance(diag):
    V = _records(5, n=200, d=8)
    rng = np.random.default_rng(6)
    xy = rng.uniform(0, 30, (8, 2))
    D = np.linalg.norm(xy[:, None] - xy[None], axis=2)
    want = np.zeros(len(diag.DISTANCE_BANDS) - 1)
    for row in V.toarray() > 0:
        for i, j in itertools.combinations(np.flatnonzero(row), 2):
            want[np.searchsorted(diag.DISTANCE_BANDS, D[i, j], side="right") - 1] += 1
    np.testing.assert_allclose(diag.pair_mass(V, D), want)


def test_a_small_run_reports_the_oracles_the_model_and_its_pairs(diag, tmp_path):
    from sparkpriv.mechanisms import dpgm

    study = load_script("dpgm_model_study")
    X = study.cap(study.people("transit", 3000), 16, 7)
    params = dpgm.DPGMParams(epsilon=1e4, delta=1e-5, k=2, sampling_rate=0.1, epochs=1.0, hidden=4,
                             row_bound=math.sqrt(16))
    model, _ = dpgm.fit_dpgm_array(X.toarray(), params, seed=1)
    path = tmp_path / "model.npz"
    model.save(path)
    out = tmp_path / "diag.jsonl"
    diag.main(["--kind", "transit", "--people", "3000", "--max-items", "16", "--synthetic", "1500",
               "--oracle-ks", "1,2", "--length-bins", "1,3,6", "--model", str(path), "--count-epsilons", "1",
               "--shift-epsilons", "exact,1",
               "--marginal-samples", "500", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["name"] for r in rows] == [
        "real sample", "oracle k=1 by length", "oracle k=1 by length raked to the exact counts",
        "oracle k=2 by length", "oracle k=2 by length raked to the exact counts", "model",
        "model raked to the exact counts (oracle)",
        "model raked to Gaussian counts at epsilon 1", "model shifted to counts at exact",
        "model shifted to counts at 1", "pair mass, model over real sample"]
    for r in rows[:-1]:
        assert 0.0 < r["error"] < 1.5 and len(r["groups"]) == len(r["bias"]) == 5
        assert all(abs(b) <= g + 1e-4 for b, g in zip(r["bias"], r["groups"]))  # |mean| <= mean |.|
    pairs = rows[-1]
    assert len(pairs["ratio"]) == len(pairs["real_share"]) == 6
    assert abs(sum(pairs["real_share"]) - 1.0) < 1e-3 and all(v >= 0 for v in pairs["ratio"])


def test_oracle_mixture_draws_each_clusters_items_given_a_real_length(diag):
    """Two clusters that hold fixed item sets ({0, 1} for 600 people, {3, 4, 5} for 400): every
    synthetic record is one of the two sets, in about the clusters' proportions, and one cluster
    (k = 1) mixes their items at the pooled marginals, each record with a real length."""
    rows = [[0, 1]] * 600 + [[3, 4, 5]] * 400
    X = csr_matrix((np.ones(sum(map(len, rows))), np.concatenate(rows),
                    np.concatenate(([0], np.cumsum([len(r) for r in rows])))), shape=(1000, 6))
    V = diag.oracle_mixture(X, 2, 5000, seed=3).toarray()
    sets = {tuple(np.flatnonzero(r)) for r in V}
    assert sets == {(0, 1), (3, 4, 5)}
    share = float((V[:, 0] > 0).mean())
    assert abs(share - 0.6) < 4 * math.sqrt(0.24 / 5000)
    W = diag.oracle_mixture(X, 1, 5000, seed=3).toarray()
    assert set(W.sum(axis=1).astype(int)) == {2, 3}
    assert {tuple(np.flatnonzero(r)) for r in W} > sets  # mixed records too


def test_oracle_mixture_by_length_keeps_each_lengths_own_items(diag):
    """One cluster whose short records (1 item) hold item 0 or 1 and whose long records (3 items)
    hold items of {2, ..., 5}: with length bins [1, 2), [2, inf) every synthetic record of length 1
    is {0} or {1}, every record of length 3 is within {2, ..., 5}, at the pooled lengths' shares;
    without the bins the pooled marginals put items 0 and 1 into long records too."""
    rng = np.random.default_rng(8)
    rows = [[int(rng.integers(0, 2))] for _ in range(700)] + [sorted(rng.choice(np.arange(2, 6), 3, replace=False))
                                                               for _ in range(300)]
    X = csr_matrix((np.ones(sum(map(len, rows))), np.concatenate(rows),
                    np.concatenate(([0], np.cumsum([len(r) for r in rows])))), shape=(1000, 6))
    V = diag.oracle_mixture(X, 1, 6000, seed=4, length_bins=[1, 2]).toarray()
    lens = V.sum(axis=1).astype(int)
    assert set(lens) == {1, 3}
    assert V[lens == 1][:, 2:].sum() == 0 and V[lens == 3][:, :2].sum() == 0
    assert abs(float((lens == 1).mean()) - 0.7) < 4 * math.sqrt(0.21 / 6000)
    W = diag.oracle_mixture(X, 1, 6000, seed=4).toarray()
    assert W[W.sum(axis=1) == 3][:, :2].sum() > 0
    with pytest.raises(ValueError, match="increasing"):
        diag.oracle_mixture(X, 1, 10, seed=4, length_bins=[2, 2])
    with pytest.raises(ValueError, match="shortest record"):
        diag.oracle_mixture(X, 1, 10, seed=4, length_bins=[2, 3])


def test_the_shift_moves_a_models_marginals_to_exact_counts(diag):
    """``shifted`` with exact counts (no noise) moves a model whose marginals are far off towards
    them: its synthetic marginals are closer to the counts than the model's own (fixed seeds)."""
    from sparkpriv.mechanisms import dpgm

    rng = np.random.default_rng(7)
    n, d = 4000, 8
    X = (rng.random((n, d)) < 0.3).astype(np.float64)
    params = dpgm.DPGMParams(epsilon=1e4, delta=1e-5, k=2, sampling_rate=0.1, epochs=1.0, hidden=2,
                             length_share=0.0, marginal_share=0.0)
    model, _ = dpgm.fit_dpgm_array(X, params, seed=1)
    target = np.linspace(0.05, 0.6, d) * n
    before = diag.synthesize(model, n, 3).toarray().sum(axis=0)
    after = diag.synthesize(diag.shifted(model, target, 0.0, n, 4000, 2), n, 3).toarray().sum(axis=0)
    assert np.abs(after - target).sum() < 0.5 * np.abs(before - target).sum()


def test_the_share_study_runs_each_share_unshifted_and_shifted(tmp_path):
    """docs/research/scripts/dpgm_share_study.py (docs/research/dpgm.md, "The share"): a small run, each share's plan
    (a larger share of the counts leaves the models more noise, the counts less)."""
    share = load_script("dpgm_share_study")
    out = tmp_path / "share.jsonl"
    share.main(["--kind", "transit", "--people", "3000", "--max-items", "16", "--k", "2", "--synthetic", "1500",
                "--sampling-rate", "0.1", "--epochs", "2", "--shares", "0.1,0.3", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["share"], r["model"]) for r in rows] == [(0.1, "unshifted"), (0.1, "shifted"),
                                                        (0.3, "unshifted"), (0.3, "shifted")]
    assert rows[2]["sigma"] > rows[0]["sigma"] and rows[2]["count_std"] < rows[0]["count_std"]
    assert all(0.0 < r["error"] < 1.5 and len(r["groups"]) == 5 for r in rows)


def test_oracle_half_builds_the_cells_from_half_the_people(diag, tmp_path):
    out = tmp_path / "half.jsonl"
    diag.main(["--kind", "transit", "--people", "3000", "--max-items", "16", "--synthetic", "1500",
               "--oracle-ks", "2", "--length-bins", "1,3,6", "--oracle-half", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["name"] for r in rows] == [
        "real sample", "oracle k=2 by length, cells from half the people",
        "oracle k=2 by length, cells from half the people raked to the exact counts"]
    assert all(0.0 < r["error"] < 1.5 for r in rows)


def test_oracle_half_passes_a_random_half_of_the_capped_people(diag, monkeypatch, tmp_path):
    """--oracle-half gives oracle_mixture n // 2 distinct people of the capped table (and the
    whole table without it)."""
    study = load_script("dpgm_model_study")
    X = study.cap(study.people("transit", 3000), 16, 7)
    seen = []
    real = diag.oracle_mixture

    def spy(Xs, *args, **kw):
        seen.append(Xs)
        return real(Xs, *args, **kw)

    monkeypatch.setattr(diag, "oracle_mixture", spy)
    common = ["--kind", "transit", "--people", "3000", "--max-items", "16", "--synthetic", "500",
              "--oracle-ks", "1", "--out", str(tmp_path / "o.jsonl")]
    diag.main(common + ["--oracle-half"])
    diag.main(common)
    half, whole = seen
    assert half.shape == (1500, X.shape[1]) and whole.shape == X.shape
    # the half's rows are rows of the capped table, each once: match them by their item sets
    def key(M):
        return [tuple(M.indices[M.indptr[i]:M.indptr[i + 1]]) for i in range(M.shape[0])]

    assert not Counter(key(half)) - Counter(key(X))
    assert (whole != X).nnz == 0
