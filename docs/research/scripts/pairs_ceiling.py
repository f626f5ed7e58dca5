"""How low can any release go on the suite's pair workload at epsilon 1? (docs/research/pairs.md,
"The ceiling").

Run from the repository root (about two minutes a table on 2 cores)::

    python docs/research/scripts/pairs_ceiling.py bms_webview_2 bms_webview_1

Two optimistic bounds, both with information no release has:

* model families fitted to the EXACT statistics (no noise at all): independence, anchor strata
  (a person's stratum: their most popular of the ``K`` most popular items), co-occurrence groups
  (the 1,024 most popular items clustered by their exact co-occurrence, spectral clustering; a
  person's stratum: the group holding most of their items) and k-means clusters of the people
  (rows scaled to unit norm); each answers a pair by ``sum_s c_sa c_sb / n_s`` (independence
  within a stratum);
* the workload's own 1,000 pairs counted directly (the selection is free here), the whole
  epsilon spent on them: each person keeps ``c`` of their pairs at random (L2 sensitivity
  ``sqrt(2 c)`` replace-one, ``sqrt(c)`` add-remove), the library's discrete Gaussian
  calibration, noisy counts clamped at 0; "rescaled" divides by the true kept share of the
  pairs' holders (a figure no release knows).

Fixed seeds; measurements, not private releases.
"""

from __future__ import annotations

import sys

import numpy as np
from scipy import sparse


def stratum_answers(X, comp, S, pairs):
    """Pair answers of a model with independent items within each stratum (exact counts)."""
    n = X.shape[0]
    P = sparse.csr_matrix((np.ones(n), (comp, np.arange(n))), shape=(S, n))
    C = (P @ X).toarray()
    ns = np.maximum(np.asarray(P.sum(1)).ravel(), 1)
    return (C[:, pairs[:, 0]] * C[:, pairs[:, 1]] / ns[:, None]).sum(0)


def anchor_strata(X, order, K):
    rank = np.empty(X.shape[1], int)
    rank[order] = np.arange(X.shape[1])
    Xc = X.tocoo()
    best = np.full(X.shape[0], 10**9)
    np.minimum.at(best, Xc.row, rank[Xc.col])
    return np.where(best < K, best, K), K + 1


def group_strata(X, top, G):
    from sklearn.cluster import SpectralClustering

    Xt = X[:, top].tocsr()
    C = (Xt.T @ Xt).toarray().astype(float)
    c = np.diag(C).copy()
    A = C / np.sqrt(np.outer(c, c) + 1e-9)
    np.fill_diagonal(A, 0)
    lab = SpectralClustering(G, affinity="precomputed", random_state=0,
                             assign_labels="cluster_qr").fit_predict(A + 1e-6)
    H = (Xt @ sparse.csr_matrix((np.ones(len(top)), (np.arange(len(top)), lab)), shape=(len(top), G))).toarray()
    comp = np.argmax(H, axis=1)
    comp[H.max(1) == 0] = G
    return comp, G + 1


def people_kmeans(X, k):
    from sklearn.cluster import MiniBatchKMeans

    Xn = sparse.diags(1 / np.sqrt(np.maximum(np.diff(X.indptr), 1))) @ X
    return MiniBatchKMeans(k, random_state=0, n_init=3, batch_size=4096).fit_predict(Xn), k


def direct_counts(X, pairs, c, epsilon, delta, neighbors, rng):
    """The workload's pairs counted with each person cut to ``c`` of them, Gaussian noise."""
    from sparkpriv.privacy.noise import calibrate_gaussian_noise

    H = X[:, pairs[:, 0]].multiply(X[:, pairs[:, 1]]).tocsr()
    per = np.diff(H.indptr)
    rows = np.repeat(np.arange(X.shape[0]), per)
    order = np.lexsort((rng.random(H.nnz), rows))
    rank = np.empty(H.nnz, int)
    rank[order] = np.arange(H.nnz) - np.repeat(H.indptr[:-1], per)
    keep = rank < c
    kept = np.bincount(H.indices[keep], minlength=len(pairs)).astype(float)
    sens = np.sqrt((2.0 if neighbors == "replace-one" else 1.0) * c)
    std = calibrate_gaussian_noise(sensitivity=sens, epsilon=epsilon, delta=delta, dim=len(pairs)).std
    est = np.maximum(kept + rng.normal(0.0, std, len(pairs)), 0.0)
    return est, est * H.nnz / max(kept.sum(), 1.0), std, kept.sum() / H.nnz


def main(name: str, epsilon: float = 1.0) -> None:
    from suite_tables import table_and_pairs

    X, wl, truth, den = table_and_pairs(name)
    n, d = X.shape

    def err(a):
        return float(np.mean(np.abs(a - truth) / den))

    counts = np.asarray(X.sum(0)).ravel()
    order = np.argsort(-counts, kind="stable")
    print(f"\n{name}: {n} people x {d} items, the workload's 1,000 pairs")
    print(f"  exact statistics: independence {err(stratum_answers(X, np.zeros(n, int), 1, wl.pairs)):.3f}")
    for K in (64, 256):
        print(f"  exact statistics: anchor strata K={K} {err(stratum_answers(X, *anchor_strata(X, order, K), wl.pairs)):.3f}")
    for G in (64, 128):
        comp, S = group_strata(X, order[:min(1024, d)], G)
        print(f"  exact statistics: co-occurrence groups G={G} {err(stratum_answers(X, comp, S, wl.pairs)):.3f}")
    for k in (64, 256):
        print(f"  exact statistics: k-means of people k={k} {err(stratum_answers(X, *people_kmeans(X, k), wl.pairs)):.3f}")
    rng = np.random.default_rng(0)
    delta = 1 / (10 * n)
    for neighbors in ("replace-one", "add-remove"):
        for c in (4, 8, 16, 32, 64):
            est, scaled, std, share = direct_counts(X, wl.pairs, c, epsilon, delta, neighbors, rng)
            print(f"  direct counts, epsilon {epsilon:g} on these pairs alone, {neighbors}, c={c}: kept {share:.2f} of "
                  f"the holders, std {std:.1f}: {err(est):.3f}, rescaled {err(scaled):.3f}")
    sample = rng.random(n) < 0.1
    Xs = X[sample]
    answers = np.asarray(Xs[:, wl.pairs[:, 0]].multiply(Xs[:, wl.pairs[:, 1]]).sum(0)).ravel() * n / sample.sum()
    print(f"  a real 10 % sample: {err(answers):.3f}")


if __name__ == "__main__":
    for table in sys.argv[1:] or ["bms_webview_2", "bms_webview_1"]:
        main(table)
