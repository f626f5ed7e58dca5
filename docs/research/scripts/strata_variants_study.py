"""Variants of the synthetic release's anchor strata (docs/research/synthesizer.md, "Three more
variants of the strata").

Run from the repository root::

    # the anchor threshold as benchmark methods, paired with the defaults (the suite's seeds)
    PYTHONPATH=docs/research/scripts sparkpriv bench utility --plugin strata_variants_study:register_variants \\
        --methods "synthetic,syn[stds=5],syn[stds=3]" --draws 5

    # reassigning people to the strata (exact statistics, or noise of a given std per cell)
    python docs/research/scripts/strata_variants_study.py bms_webview_2 --anchors 256
    python docs/research/scripts/strata_variants_study.py bms_webview_2 --anchors 22 --std 35

The strata count of at most ``c`` items a person was a patch of the release (the strata's
sensitivity ``sqrt(2 c)`` and ``strata_fn``'s cut at ``c - 1`` other items), not kept.
Fixed seeds: measurements, not private releases.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import sparse


def register_variants():
    """``--plugin`` hook: the release with a lower anchor threshold (``ANCHOR_STDS``)."""
    import sparkpriv.mechanisms.synthetic._anchors as anchors
    from sparkpriv.bench.utility_methods import default_methods, register, synthetic_defaults

    default_methods()
    for stds in (5.0, 3.0):
        base = synthetic_defaults()

        def fn(X, *, epsilon, delta, seed, _stds=stds, _base=base):
            old = anchors.ANCHOR_STDS
            anchors.ANCHOR_STDS = _stds
            try:
                return _base(X, epsilon=epsilon, delta=delta, seed=seed)
            finally:
                anchors.ANCHOR_STDS = old

        register(f"syn[stds={stds:g}]", fn, settings={"anchor_stds": stds},
                 note=f"release synthetic, anchors need {stds:g} noise stds of people")


def reassign(name: str, K: int, std: float, steps: int = 6) -> None:
    """Anchor strata, then people reassigned to the nearest stratum profile (cosine), pairs' error of
    the model with independent items within a stratum; ``std``: Gaussian noise per cell, clamped."""
    from suite_tables import table_and_pairs

    X, wl, truth, den = table_and_pairs(name)
    n, d = X.shape
    rng = np.random.default_rng(0)
    counts = np.asarray(X.sum(0)).ravel()
    order = np.argsort(-counts, kind="stable")
    rank = np.empty(d, int)
    rank[order] = np.arange(d)
    top = order[:min(1024, d)]
    S = K + 1

    def profiles(comp):
        P = sparse.csr_matrix((np.ones(n), (comp, np.arange(n))), shape=(S, n))
        C, ns = (P @ X).toarray(), np.asarray(P.sum(1)).ravel().astype(float)
        if std > 0:
            C = np.maximum(C + rng.normal(0, std, C.shape), 0)
            ns = ns + rng.normal(0, std, S)
        return C, np.maximum(ns, 1)

    def error(C, ns):
        a = (C[:, wl.pairs[:, 0]] * C[:, wl.pairs[:, 1]] / ns[:, None]).sum(0)
        return float(np.mean(np.abs(a - truth) / den))

    Xc = X.tocoo()
    best = np.full(n, 10**9)
    np.minimum.at(best, Xc.row, rank[Xc.col])
    C, ns = profiles(np.where(best < K, best, K))
    print(f"{name}, K = {K}, noise std {std:g}: anchor strata {error(C, ns):.3f}")
    Xt = X[:, top].tocsr()
    Xn = sparse.diags(1 / np.sqrt(np.maximum(np.diff(Xt.indptr), 1))) @ Xt
    for step in range(steps):
        cen = C[:, top] / ns[:, None]
        cen = cen / np.maximum(np.linalg.norm(cen, axis=1, keepdims=True), 1e-9)
        comp = np.asarray((Xn @ cen.T).argmax(1)).ravel()
        comp[np.diff(Xt.indptr) == 0] = K
        C, ns = profiles(comp)
        print(f"  cosine step {step + 1}: {error(C, ns):.3f} (largest stratum {np.bincount(comp).max()})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("tables", nargs="*", default=["bms_webview_2", "bms_webview_1"])
    ap.add_argument("--anchors", type=int, default=256)
    ap.add_argument("--std", type=float, default=0.0)
    a = ap.parse_args()
    for t in a.tables:
        reassign(t, a.anchors, a.std)
