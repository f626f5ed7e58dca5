"""Declared clip against quantile clipping for DPGM (the table of docs/research/dpgm.md, "Quantile clipping").

Three binary clusters (4,000 records of 20 columns, column probabilities uniform in
[0.05, 0.9] per cluster, numpy seed 0), an RBM with 8 hidden units per cluster, epsilon 1,
delta 1e-5, q = 0.05, 10 epochs, k = 3; per setting and seed 1..3 (``insecure`` fixed
seeds: a measurement, not a release), a synthetic table of 4,000 records. Prints the mean
absolute error of the one-way marginals and of the pairwise co-occurrence rates (mean of
the seeds) and the final clips of seed 3.

Usage::

    python docs/research/scripts/dpgm_quantile_clip.py
"""

from __future__ import annotations

import numpy as np

from sparkpriv.mechanisms import dpgm
from sparkpriv.mechanisms.dpgm import synthesize

SETTINGS = [("declared clip 10", dict(clip=10.0)), ("declared clip 1", dict(clip=1.0)),
            ("declared clip 0.3", dict(clip=0.3)), ("quantile 0.5 from 10", dict(clip=10.0, clip_quantile=0.5)),
            ("quantile 0.5 from 0.3", dict(clip=0.3, clip_quantile=0.5)),
            ("quantile 0.9 from 10", dict(clip=10.0, clip_quantile=0.9))]


def main() -> None:
    rng = np.random.default_rng(0)
    n, d = 4000, 20
    P = np.array([rng.uniform(0.05, 0.9, d) for _ in range(3)])
    X = (rng.random((n, d)) < P[rng.integers(0, 3, n)]).astype(float)
    pairs = np.triu_indices(d, 1)

    def errors(S):
        m1 = np.abs(S.mean(0) - X.mean(0)).mean()
        return m1, np.abs((X.T @ X) / n - (S.T @ S) / len(S))[pairs].mean()

    for name, kw in SETTINGS:
        res, clips = [], None
        for seed in (1, 2, 3):
            p = dpgm.DPGMParams(epsilon=1.0, delta=1e-5, k=3, hidden=8, sampling_rate=0.05, epochs=10,
                                learning_rate=0.01, **kw)
            model, _ = dpgm.fit_dpgm_array(X, p, seed=seed)
            res.append(errors(synthesize(model, n, seed)))
            clips = model.plan_public.get("final_clips")
        m1, m2 = np.mean(res, axis=0)
        print(f"{name}: marginal error {m1:.4f}, pairwise error {m2:.4f}, final clips (seed 3) {clips}")


if __name__ == "__main__":
    main()
