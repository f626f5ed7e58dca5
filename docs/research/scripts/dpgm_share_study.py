"""The share of epsilon the DPGM's per-item counts take (``marginal_share``), in memory
(docs/research/dpgm.md, "Calibrating the marginals", "The share").

The people of ``sparkpriv generate cdr|transit --people N --seed 0`` capped at ``L`` items and the
paper's query protocol, as docs/research/scripts/dpgm_model_study.py has them. For each share: the plan at that
share (the models' noise multiplier is what the counts leave), the study's DPGM release pieces
(the DP k-means, the length histograms, the cluster sizes, the RBMs), the exact capped per-item
counts plus Gaussian noise at the plan's std, the release's shift towards them
(docs/research/scripts/dpgm_diagnose.py's ``shifted``: the release's ``calibrate_marginals`` on the trained
models), and the counting-query error of ``--synthetic`` people from the models unshifted and
shifted. Fixed test seeds: measurements, not private releases.

    python docs/research/scripts/dpgm_share_study.py --kind transit --people 1200000 --max-items 64 --shares 0.1,0.3
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dpgm_diagnose as diagnose  # noqa: E402
import dpgm_model_study as study  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="transit", choices=["cdr", "transit"])
    ap.add_argument("--people", type=int, default=1_200_000)
    ap.add_argument("--max-items", type=int, default=64)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--shares", default="0.1,0.3")
    ap.add_argument("--sampling-rate", type=float, default=None,
                    help="default: 880 / (n / k) per step (the library's default is 0.05)")
    ap.add_argument("--epochs", type=float, default=None, help="default: 400 steps")
    ap.add_argument("--synthetic", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cache", default=None, help="a .npz file: the generated table, made once and read after")
    ap.add_argument("--out", default=None, help="append one JSON line per result here")
    a = ap.parse_args(argv)

    from sparkpriv.mechanisms import counting_queries as cq
    from sparkpriv.mechanisms import dpgm

    Xfull, X, qs, truth = diagnose.table(a.kind, a.people, a.max_items, a.seed, a.cache)
    n, d = Xfull.shape
    Q = qs.matrix
    exact = np.asarray(X.sum(axis=0)).ravel()
    q = a.sampling_rate or min(1.0, 880.0 / (n / a.k))
    epochs = a.epochs or 400 * q
    S = a.synthetic
    for share in [float(v) for v in a.shares.split(",") if v.strip()]:
        t0 = time.time()
        params = dpgm.DPGMParams(epsilon=a.epsilon, delta=1.0 / n, k=a.k, sampling_rate=q, epochs=epochs,
                                 row_bound=math.sqrt(a.max_items), marginal_share=share)
        plan = dpgm.plan_dpgm(params, n=n, d=d, caller="study")
        centers, sizes, labels, kstd = study.kmeans(X, params, plan, d, a.seed, True)
        lengths = plan.lengths.release(np.stack([plan.lengths.histogram(X[labels == j]) for j in range(a.k)]),
                                       a.seed)
        sizes = dpgm.cluster_sizes(sizes, lengths, kstd, plan.lengths.noise.std)
        thetas = dpgm.train_clusters(X, labels, sizes, centers, plan, a.seed, masses=dpgm.visible_masses(plan, lengths),
                                     chain_lengths=dpgm.chain_lengths(plan, lengths, a.seed))
        model = dpgm._model(params, d, thetas, sizes, centers, plan.to_public_dict(), plan, lengths)
        train_s = time.time() - t0
        var = plan.marginals.noise_var
        counts = exact + np.random.default_rng(a.seed + 5).standard_normal(d) * math.sqrt(var)
        models = {"unshifted": model, "shifted": diagnose.shifted(model, counts, var, n, params.marginal_samples, a.seed)}
        for name, m in models.items():
            e = cq.relative_errors(truth, study.answers(diagnose.synthesize(m, S, 21), Q) * n / S, n)
            row = {"kind": a.kind, "people": n, "k": a.k, "share": share, "model": name, "synthetic": S,
                   "sigma": round(plan.noise_multiplier, 4), "count_std": round(math.sqrt(var), 1),
                   "error": round(float(e.mean()), 4),
                   "groups": [round(float(e[qs.group == g].mean()), 4) for g in range(1, 6)],
                   "train_s": round(train_s)}
            diagnose.emit(row, a.out)


if __name__ == "__main__":
    main()
