"""The pair workload of ``sparkpriv bench utility`` on real tables: where the synthetic release's error
is, and what measuring pair counts directly would give (docs/research/pairs.md).

Run from the repository root::

    python docs/research/scripts/pairs_study.py bms_webview_2 bms_webview_1 groceries

    # the anchors sweep of pairs.md (variants of the release as benchmark methods)
    PYTHONPATH=docs/research/scripts sparkpriv bench utility --tables bms_webview_2,bms_webview_1 \\
        --epsilons 1 --draws 3 --plugin pairs_study:register_variants \\
        --methods "sample 10%,synthetic,syn[a=128,s=0.2],syn[a=256,s=0.2],syn[a=256,s=0.35],syn[a=512,s=0.35]"

Fixed seeds throughout: measurements, not private releases. The direct measurement is a
simulation: noisy pair counts with a Gaussian of the stated std, the std from an approximate
zCDP share of the release's (epsilon, delta) (``sqrt(rho) = sqrt(log(1/delta) + epsilon) -
sqrt(log(1/delta))``), replace-one sensitivity ``sqrt(m (m - 1))`` for people capped at ``m`` of
the measured items.
"""

from __future__ import annotations

import argparse
from math import log, sqrt

import numpy as np
from scipy import sparse

VARIANTS = [(128, 0.2), (256, 0.2), (256, 0.35), (512, 0.35)]


def register_variants():
    """``--plugin`` hook: the synthetic release with more anchors and a larger anchor share."""
    from sparkpriv.bench.utility_methods import default_methods, register, synthetic_defaults

    default_methods()
    for a, s in VARIANTS:
        register(f"syn[a={a},s={s}]", synthetic_defaults(anchors=a, anchor_share=s),
                 settings={"anchors": a, "anchor_share": s},
                 note=f"release synthetic with anchors={a}, anchor_share={s}")


def _capped(X: sparse.csr_matrix, m: int, rng) -> sparse.csr_matrix:
    """Each person's row cut to ``m`` of its items, chosen at random."""
    n = X.shape[0]
    lens = np.diff(X.indptr)
    rows = np.repeat(np.arange(n), lens)
    order = np.lexsort((rng.random(X.nnz), rows))
    rank = np.empty(X.nnz, int)
    rank[order] = np.arange(X.nnz) - np.repeat(X.indptr[:-1], lens)
    keep = rank < m
    return sparse.csr_matrix((np.ones(keep.sum()), (rows[keep], X.indices[keep])), shape=X.shape)


def study(name: str, epsilon: float = 1.0) -> None:
    from sparkpriv.api import release_synthetic
    from sparkpriv.privacy.random import insecure_fixed_seed
    from suite_tables import table_and_pairs

    X, wl, truth, den = table_and_pairs(name)
    n, d = X.shape
    delta = 1 / n ** 1.1
    with insecure_fixed_seed(3):
        rel = release_synthetic(sparse.csr_matrix(X), epsilon=epsilon, delta=delta)
    model = rel.model.pair_answers(wl.pairs, n)
    err = np.abs(model - truth) / den
    counts = np.asarray(X.sum(0)).ravel()
    indep = counts[wl.pairs[:, 0]] * counts[wl.pairs[:, 1]] / n
    err_i = np.abs(indep - truth) / den
    print(f"\n{name}: {n} people x {d} items, epsilon {epsilon}: model {err.mean():.3f}, exact counts under "
          f"independence {err_i.mean():.3f}")
    edges = [0, 1, 0.001 * n, 100, 200, 500, np.inf]
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (truth >= lo) & (truth < hi)
        if sel.any():
            print(f"  truth in [{lo:.0f}, {hi:.0f}): {sel.sum():4d} pairs, model error {err[sel].mean():.3f} "
                  f"({err[sel].sum() / err.sum():.0%} of the total), exact independence {err_i[sel].mean():.3f}, "
                  f"median model/truth {np.median(model[sel] / np.maximum(truth[sel], 1)):.2f}")
    L = log(1 / delta)
    rho = (sqrt(L + epsilon) - sqrt(L)) ** 2
    order = np.argsort(-counts)
    rng = np.random.default_rng(0)
    for M in sorted({min(256, d), min(1024, d)}):
        pos = -np.ones(d, int)
        pos[order[:M]] = np.arange(M)
        a, b = pos[wl.pairs[:, 0]], pos[wl.pairs[:, 1]]
        inside = (a >= 0) & (b >= 0)
        for m in (3, 5, 8):
            Xc = _capped(X[:, order[:M]].tocsr(), m, rng)
            C = (Xc.T @ Xc).toarray()
            for share in (0.3, 0.5):
                std = sqrt(m * (m - 1)) / sqrt(2 * rho * share)
                ans = model.copy()
                ans[inside] = np.maximum(C[a[inside], b[inside]] + rng.normal(0, std, inside.sum()), 0)
                e = np.abs(ans - truth) / den
                print(f"  measured pairs among the top {M} items, m={m}, share {share}: std {std:.1f}, "
                      f"{inside.mean():.0%} of the pairs inside, error {e.mean():.3f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tables", nargs="+")
    p.add_argument("--epsilon", type=float, default=1.0)
    args = p.parse_args(argv)
    for t in args.tables:
        study(t, args.epsilon)


if __name__ == "__main__":
    main()
