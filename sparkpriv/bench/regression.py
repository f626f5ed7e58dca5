"""``sparkpriv bench regression``: the AdaSSP release against MLlib's LinearRegression at scale, and utility.

Timing (default): on one generated table of ``--rows`` x ``--cols`` (Parquet under ``--data-dir``,
reused across runs; ``cols - 1`` features ``U(-1, 1) / sqrt(cols - 1)``, the last column the target
``a . x0 + 0.1 N(0, 1)``), on one SparkSession with the same cores, each repeat back to back:

a. sparkpriv's release, ``release_regression(method="ssp")`` at ``--epsilon`` (delta 1e-6) on the
   Spark engine, the table read by the direct Parquet reader (``read_table(reader="auto")``, the
   command line's default): one aggregation pass of the sufficient statistics, the driver's noise,
   AdaSSP's solve and the bootstrap intervals (nothing written); the declared bounds are the
   generator's box ``+-1 / sqrt(cols - 1)`` and the target range ``[-1.5, 1.5]``;
b. ``pyspark.ml.regression.LinearRegression(solver="normal")`` on the same table (VectorAssembler,
   fitIntercept=True, regParam=0, standardization=False), assembling included;
c. with ``--with-sketch``: the sketch release (``method="sketch"``, ``m`` by ``--sketch-rows`` or the log rule).

Every repeat is printed with its ratio (sparkpriv / MLlib wall seconds). Then, untimed, the relative
objective error ``(f(x) - f(x*)) / f(x*)`` of every repeat's coefficients (and MLlib's) on the whole
table, ``f`` the residual sum of squares from the table's exact Gram matrix (one owner-side pass).
MLlib's BLAS (native or Java fallback) is printed: here it has NO native BLAS. The driver holds
``O(p^2)`` numbers. A benchmark, not a test: it asserts nothing.

``--utility``: the utility study on real tables and MNIST against diffprivlib, DP-SGD and the
non-private models (:mod:`sparkpriv.bench.regression_utility`). ``--sketch-study``: the sketch's
study (:mod:`sparkpriv.bench.regression_sketch`; docs/research/regression-sketch.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time

import numpy as np

from sparkpriv.bench.regression_sketch import read_idx  # noqa: F401  (the MNIST reader other studies import)

__all__ = ["add_arguments", "run_from_args", "run", "read_idx"]

_log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table [default: 1000000]")
    parser.add_argument("--cols", type=int, default=64, help="columns, the last is the target [default: 64]")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of the releases [default: 1]")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each pipeline [default: 3]")
    parser.add_argument("--with-sketch", action="store_true", help="also time the sketch release")
    parser.add_argument("--sketch-rows", type=int, default=None,
                        help="with --with-sketch: m, rows of the sketch [default: the 'log' rule]")
    parser.add_argument("--data-dir", default="/tmp/sparkpriv-bench", help="where the table is generated")
    parser.add_argument("--master", default="local[2]", help="Spark master [default: local[2]]")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory [default: 6g]")
    parser.add_argument("--utility", action="store_true",
                        help="run the utility study (real tables, MNIST; no Spark) instead of the timing")
    parser.add_argument("--tasks", default=None, help="--utility: comma-separated tasks [default: all]")
    parser.add_argument("--trials", type=int, default=5, help="--utility: trials per setting [default: 5]")
    parser.add_argument("--mnist-trials", type=int, default=3, help="--utility: trials per MNIST setting [default: 3]")
    parser.add_argument("--sketch-study", action="store_true", help="run the sketch's study instead "
                        "(docs/research/regression-sketch.md)")
    parser.add_argument("--json", default=None, help="--utility, --sketch-study: write every record to this file")


def run_from_args(args: argparse.Namespace) -> dict:
    from sparkpriv.errors import ParameterError

    if args.utility:
        from sparkpriv.bench.regression_utility import TASKS, utility

        tasks = TASKS if args.tasks is None else tuple(t for t in args.tasks.split(",") if t)
        return utility(tasks=tasks, trials=args.trials, mnist_trials=args.mnist_trials, json_path=args.json)
    if args.sketch_study:
        from sparkpriv.bench.regression_sketch import sketch_study

        return sketch_study(trials=args.trials, json_path=args.json)
    for name in ("rows", "cols", "repeats"):
        if getattr(args, name) < (2 if name == "cols" else 1):
            raise ParameterError(f"--{name} is too small. Got {getattr(args, name)} instead.")
    return run(rows=args.rows, cols=args.cols, epsilon=args.epsilon, repeats=args.repeats,
               with_sketch=args.with_sketch, sketch_rows=args.sketch_rows, data_dir=args.data_dir,
               master=args.master, driver_memory=args.driver_memory)


# ----------------------------------------------------------------------------- timing


def _ensure_table(spark, data_dir: str, rows: int, cols: int) -> str:
    """A linear-model table: ``cols - 1`` features ~ U(-1, 1) / sqrt(d), target = A x0 + noise."""
    import shutil
    import uuid

    from pyspark.sql import functions as F

    path = os.path.join(data_dir, f"regression-{rows}x{cols}.parquet")
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return path
    shutil.rmtree(path, ignore_errors=True)
    d = cols - 1
    df = spark.range(0, rows, numPartitions=max(2, rows // 500_000))
    feats = [((F.rand(seed=j) * 2 - 1) / math.sqrt(d)).alias(f"f{j}") for j in range(d)]
    df = df.select(*feats)
    x0 = np.random.default_rng(0).standard_normal(d)
    x0 /= np.linalg.norm(x0)
    y = sum(F.col(f"f{j}") * float(x0[j]) for j in range(d)) + F.randn(seed=d + 1) * 0.1
    staging = os.path.join(data_dir, f".regression-{rows}x{cols}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        df.withColumn("y", y).write.parquet(staging)
        os.rename(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def run(*, rows: int, cols: int, repeats: int, data_dir: str, epsilon: float = 1.0, with_sketch: bool = False,
        sketch_rows: int | None = None, master: str = "local[2]", driver_memory: str = "6g") -> dict:
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.regression import LinearRegression

    from sparkpriv.api import release_regression
    from sparkpriv.bench.projection import _loadavg, _mllib_blas, _versions
    from sparkpriv.io.inputs import read_table
    from sparkpriv.spark.session import get_spark

    spark = get_spark({"spark.driver.memory": driver_memory}, app_name="sparkpriv-bench-regression",
                      master=master)
    path = _ensure_table(spark, data_dir, rows, cols)
    df = spark.read.parquet(path)
    source = read_table(spark, path, reader="auto")
    features = [c for c in df.columns if c != "y"]
    d = len(features)
    box = 1.0 / math.sqrt(d)
    params = dict(columns=features, target="y", lower=-box, upper=box, target_lower=-1.5, target_upper=1.5,
                  epsilon=epsilon, delta=1e-6)
    sketch = dict(columns=features, target="y", method="sketch", row_bound=1.5, epsilon=epsilon, delta=1e-6,
                  **({"sketch_rows": sketch_rows} if sketch_rows is not None else {}))
    load0 = _loadavg()
    runs, coefs = [], []
    for rep in range(repeats):
        t = time.perf_counter()
        rel = release_regression(source, **params)
        t_ssp = time.perf_counter() - t
        coefs.append(("sparkpriv ssp", np.append(rel.model.coef, rel.model.intercept)))
        t = time.perf_counter()
        data = VectorAssembler(inputCols=features, outputCol="features").transform(df)
        lr = LinearRegression(featuresCol="features", labelCol="y", solver="normal", fitIntercept=True,
                              regParam=0.0, standardization=False).fit(data)
        t_mllib = time.perf_counter() - t
        if rep == 0:
            coefs.append(("MLlib (non-private)", np.append(lr.coefficients.toArray(), lr.intercept)))
        r = {"repeat": rep, "ssp_seconds": round(t_ssp, 2), "mllib_seconds": round(t_mllib, 2),
             "ratio_vs_mllib": round(t_ssp / t_mllib, 3), "ssp_us_per_row": round(1e6 * t_ssp / rows, 3)}
        line = (f"repeat {rep}: sparkpriv ssp release {t_ssp:.1f} s, MLlib normal {t_mllib:.1f} s, "
                f"ratio {t_ssp / t_mllib:.2f}, {1e6 * t_ssp / rows:.2f} us/row")
        if with_sketch:
            t = time.perf_counter()
            srel = release_regression(source, **sketch)
            t_sk = time.perf_counter() - t
            r.update({"sketch_seconds": round(t_sk, 2), "sketch_ratio_vs_mllib": round(t_sk / t_mllib, 3),
                      "m": srel.public["sketch_rows"]})
            line += f"; sketch (m={srel.public['sketch_rows']}) {t_sk:.1f} s, ratio {t_sk / t_mllib:.2f}"
            coefs.append(("sparkpriv sketch", np.append(srel.model.coef, 0.0)))
        runs.append(r)
        print(line, flush=True)
    load1 = _loadavg()
    G = _exact_gram(spark, source, features)
    errors = {}
    for name, x in coefs:
        errors.setdefault(name, []).append(_relative_objective_error(G, x))
    for name, errs in errors.items():
        print(f"relative objective error at epsilon {epsilon:g}, {name}: " + ", ".join(f"{e:.3g}" for e in errs))
    result = {"rows": rows, "cols": cols, "epsilon": epsilon, "master": master, "runs": runs,
              "ratio_vs_mllib": [r["ratio_vs_mllib"] for r in runs], "relative_objective_error": errors,
              "mllib_blas": _mllib_blas(spark), "cpus": os.cpu_count(), "loadavg_1m": [load0, load1],
              **_versions(spark)}
    print(f"ratios (sparkpriv ssp / MLlib): {', '.join(f'{v:.2f}' for v in result['ratio_vs_mllib'])}")
    print(f"MLlib BLAS: {result['mllib_blas']}; load average (1 min) {load0} -> {load1} on {os.cpu_count()} CPUs")
    print(json.dumps(result))
    sys.stdout.flush()
    return result


def _exact_gram(spark, source, features) -> np.ndarray:
    """The exact Gram matrix of ``[x, 1, y]`` over the whole table (owner side, one pass; not a release)."""
    from sparkpriv.spark.engine import SparkEngine

    eng = SparkEngine()
    src = eng.open(source, columns=list(features) + ["y"], fill=None, caller="bench regression")
    k = len(features) + 2

    def gram(X):
        Z = np.column_stack([X[:, :-1], np.ones(X.shape[0]), X[:, -1]])
        return (Z.T @ Z).ravel()

    return eng.aggregate(src, gram, k * k).reshape(k, k)


def _relative_objective_error(G: np.ndarray, x: np.ndarray) -> float:
    """``(f(x) - f(x*)) / f(x*)``, ``f(v) = ||Z v - y||^2`` from the Gram matrix of ``[Z, y]``."""
    k = G.shape[0] - 1
    A, c, bb = G[:k, :k], G[:k, k], G[k, k]
    x_star = np.linalg.solve(A, c)

    def f(v):
        return float(v @ A @ v - 2 * v @ c + bb)

    return (f(np.asarray(x, float)) - f(x_star)) / f(x_star)


def main(argv=None) -> int:
    from sparkpriv.bench import module_main

    return module_main("regression", argv)


if __name__ == "__main__":
    raise SystemExit(main())
