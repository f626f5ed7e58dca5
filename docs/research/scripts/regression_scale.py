"""The regression sketch at scale on Spark: relative objective error at 10 M rows
(docs/research/regression-sketch.md; the AdaSSP release's own figure is printed by
``sparkpriv bench regression``).

On the benchmark's generated table (``sparkpriv bench regression --rows N --cols 64`` writes it:
63 features ~ U(-1, 1) / sqrt(63), target ``a . x0 + 0.1 N(0, 1)``), for each epsilon:

* the sketch release on Spark (``release_regression``, the ``log`` rule for ``m``);
* the additive baseline ``M + W`` on Spark (``scheme="additive"``; ``--additive-epsilons``);
* AdaSSP from the exact moments of the clipped rows (one pass, then the driver);

scored by the relative objective error ``(||A x - b||^2 - ||A x* - b||^2) / ||A x* - b||^2`` on
the whole table, from its exact Gram matrix (one owner-side pass). The linear and full sketch
rules are not run at this size: ``m = n / 10`` columns of S per row would be 10^13 normals.
Fixed test seeds: measurements, not private releases.

    python docs/research/scripts/regression_scale.py --table /tmp/sparkpriv-bench/regression-10000000x64.parquet
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np


def moments(spark, df, columns, target, bound):
    """One pass: the Gram matrix of the raw rows [A b] and of the rows clipped to ``bound``."""
    from sparkpriv.privacy.bounds import Bounds, clip_rows
    from sparkpriv.spark.engine import SparkEngine

    p = len(columns) + 1
    eng = SparkEngine()
    src = eng.open(df, columns=list(columns) + [target], fill=None, caller="regression_scale")

    def grams(X):
        X = np.asarray(X, np.float64)
        Xc, _ = clip_rows(X, Bounds(p, row_bound=bound, _caller="regression_scale"))
        return np.concatenate([(X.T @ X).ravel(), (Xc.T @ Xc).ravel()])

    g = eng.aggregate(src, grams, 2 * p * p)
    return g[: p * p].reshape(p, p), g[p * p:].reshape(p, p)


def rel_error(G, x):
    d = G.shape[0] - 1
    A, c, bb = G[:d, :d], G[:d, d], G[d, d]
    x_star = np.linalg.solve(A, c)
    f = lambda v: float(v @ A @ v - 2 * v @ c + bb)  # noqa: E731
    return (f(x) - f(x_star)) / f(x_star)


def main(argv=None):
    from sparkpriv.api import release_regression
    from sparkpriv.bench.adassp import adassp_from_moments
    from sparkpriv.privacy.random import insecure_fixed_seed
    from sparkpriv.spark.session import get_spark

    ap = argparse.ArgumentParser()
    ap.add_argument("--table", required=True)
    ap.add_argument("--epsilons", default="0.5,1,2")
    ap.add_argument("--additive-epsilons", default="1")
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--row-bound", type=float, default=1.5)
    ap.add_argument("--adassp-seeds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    spark = get_spark({"spark.driver.memory": "6g"}, app_name="regression-scale")
    df = spark.read.parquet(args.table)
    target = "y"
    columns = [c for c in df.columns if c != target]
    t0 = time.perf_counter()
    G, Gc = moments(spark, df, columns, target, args.row_bound)
    n = None
    print(f"moments of {len(columns)} features + target in {time.perf_counter() - t0:.0f} s", flush=True)
    d = len(columns)
    out = {"table": args.table, "delta": args.delta, "row_bound": args.row_bound, "runs": []}
    for eps in [float(e) for e in args.epsilons.split(",")]:
        kw = dict(columns=columns, target=target, method="sketch", row_bound=args.row_bound, epsilon=eps,
                  delta=args.delta)
        t = time.perf_counter()
        with insecure_fixed_seed(int(1000 * eps)):
            rel = release_regression(df, **kw)
        n = rel.public["n"]
        rec = {"epsilon": eps, "method": f"sketch (log rule, m = {rel.public['sketch_rows']})",
               "relative_objective_error": rel_error(G, np.asarray(rel.model.coef)),
               "seconds": round(time.perf_counter() - t, 1)}
        out["runs"].append(rec)
        print(rec, flush=True)
        errs = []
        for s in range(args.adassp_seeds):
            x = adassp_from_moments(Gc[:d, :d], Gc[:d, d], epsilon=eps, delta=args.delta, bound_x=args.row_bound,
                                    bound_y=args.row_bound, rng=np.random.default_rng(s))
            errs.append(rel_error(G, x))
        rec = {"epsilon": eps, "method": f"AdaSSP (mean of {args.adassp_seeds} seeds)",
               "relative_objective_error": float(np.mean(errs)), "min": float(np.min(errs)),
               "max": float(np.max(errs))}
        out["runs"].append(rec)
        print(rec, flush=True)
        if eps in {float(e) for e in args.additive_epsilons.split(",") if e.strip()}:
            t = time.perf_counter()
            with insecure_fixed_seed(int(1000 * eps) + 1):
                rel = release_regression(df, scheme="additive", **kw)
            rec = {"epsilon": eps, "method": "additive baseline M + W",
                   "relative_objective_error": rel_error(G, np.asarray(rel.model.coef)),
                   "seconds": round(time.perf_counter() - t, 1)}
            out["runs"].append(rec)
            print(rec, flush=True)
    out["n"] = n
    out["objective_at_x_star"] = float(G[d, d] - G[:d, d] @ np.linalg.solve(G[:d, :d], G[:d, d]))
    out["noise_free_objective_per_row"] = out["objective_at_x_star"] / n if n else math.nan
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
