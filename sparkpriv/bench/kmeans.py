"""``sparkpriv bench kmeans``: seconds per Lloyd iteration, sparkpriv vs MLlib KMeans.

On one generated blobs table of ``--rows`` x ``--cols`` (Parquet under
``--data-dir``, reused across runs), on one SparkSession:

a. sparkpriv ``release_kmeans`` with ``variant="linear"`` and ``"kernel"``
   (``--frequencies`` defaults to cols/2, i.e. as many features as columns),
   ``--iterations`` iterations; the per-iteration cost is the median wall
   time of iterations 2..T (features cached once, before iteration 1);
b. ``pyspark.ml.clustering.KMeans`` on the cached assembled vectors,
   ``initMode="random"``, ``tol=0`` (no early stop), for each solver
   (``row``, ``block``): per-iteration = (time(maxIter=m+1) - time(maxIter=1)) / m;
   the faster solver is reported.

Prints a table and, as its last line, one JSON object with ``rows`` and
``iteration_ratio_vs_mllib`` (sparkpriv kernel seconds / MLlib seconds). A
benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time

__all__ = ["add_arguments", "run_from_args", "run"]

_log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table [default: 1000000]")
    parser.add_argument("--cols", type=int, default=64, help="feature columns [default: 64]")
    parser.add_argument("--k", type=int, default=10, help="clusters [default: 10]")
    parser.add_argument("--iterations", type=int, default=6, help="Lloyd iterations timed (m+1) [default: 6]")
    parser.add_argument("--frequencies", type=int, default=None, help="kernel frequencies [default: cols/2]")
    parser.add_argument("--data-dir", default="/tmp/sparkpriv-bench", help="where the table is generated")
    parser.add_argument("--master", default="local[2]", help="Spark master [default: local[2]]")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory [default: 6g]")


def run_from_args(args: argparse.Namespace) -> dict:
    from sparkpriv.errors import ParameterError

    for name in ("rows", "cols", "k", "iterations"):
        if getattr(args, name) < (2 if name in ("k", "iterations") else 1):
            raise ParameterError(f"--{name} is too small. Got {getattr(args, name)} instead.")
    return run(rows=args.rows, cols=args.cols, k=args.k, iterations=args.iterations,
               frequencies=args.frequencies or max(args.cols // 2, 1), data_dir=args.data_dir,
               master=args.master, driver_memory=args.driver_memory)


def run(*, rows: int, cols: int, k: int, iterations: int, frequencies: int, data_dir: str,
        master: str = "local[2]", driver_memory: str = "6g") -> dict:
    from sparkpriv.bench.projection import _ensure_table, _loadavg, _mllib_blas, _versions
    from sparkpriv.spark.session import get_spark

    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    spark = get_spark({"spark.driver.memory": driver_memory}, app_name="sparkpriv-bench-kmeans",
                      master=master)
    load_start = _loadavg()
    path = _ensure_table(spark, data_dir, rows, cols)
    columns = [f"f{j}" for j in range(cols)]
    df = spark.read.parquet(path)

    per_iter = {}
    for variant in ("linear", "kernel"):
        secs = _sparkpriv(df, columns, k, iterations, variant, frequencies)
        per_iter[f"sparkpriv_{variant}"] = statistics.median(secs[1:])
        _log.info("sparkpriv %s: iterations %s", variant, [round(s, 2) for s in secs])
    mllib = _mllib(spark, df, columns, k, iterations)
    best_solver = min(mllib, key=mllib.get)
    per_iter["mllib"] = mllib[best_solver]
    result = {
        "benchmark": "kmeans",
        "rows": rows, "cols": cols, "k": k, "iterations_timed": iterations, "frequencies": frequencies,
        "master": master,
        "seconds_per_iteration": {n: round(s, 3) for n, s in per_iter.items()},
        "mllib_by_solver": {n: round(s, 3) for n, s in mllib.items()},
        "mllib_solver": best_solver,
        "iteration_ratio_vs_mllib": round(per_iter["sparkpriv_kernel"] / per_iter["mllib"], 3),
        "linear_iteration_ratio_vs_mllib": round(per_iter["sparkpriv_linear"] / per_iter["mllib"], 3),
        "mllib_blas": _mllib_blas(spark),
        "cpus": os.cpu_count(),
        "loadavg_1m": [load_start, _loadavg()],
        "versions": _versions(spark),
    }
    print(f"k-means: {rows} rows x {cols} columns, k={k}, master {master}; seconds per Lloyd iteration")
    for n, s in per_iter.items():
        print(f"  {n:<20} {s:8.3f}")
    print(f"  MLlib by solver: {result['mllib_by_solver']}; MLlib BLAS: {result['mllib_blas']}")
    sys.stdout.flush()
    print(json.dumps(result))
    return result


def _sparkpriv(df, columns, k, iterations, variant, frequencies) -> list[float]:
    from sparkpriv.api import release_kmeans

    rel = release_kmeans(df, columns=columns, k=k, epsilon=1.0, delta=1e-6, iterations=iterations,
                         variant=variant, row_bound=50.0, kernel_width=8.0, frequencies=frequencies)
    return list(rel.iteration_seconds)


def _mllib(spark, df, columns, k, iterations) -> dict:
    from pyspark.ml.clustering import KMeans
    from pyspark.ml.feature import VectorAssembler

    vec = VectorAssembler(inputCols=list(columns), outputCol="features").transform(df).select("features")
    vec = vec.cache()
    vec.count()
    out = {}
    m = iterations - 1
    try:
        for solver in ("row", "block"):
            KMeans(k=k, maxIter=1, initMode="random", seed=1, solver=solver).fit(vec)  # warm-up
            times = {}
            for it in (1, m + 1):
                km = KMeans(k=k, maxIter=it, tol=0.0, initMode="random", seed=1, solver=solver)
                t0 = time.perf_counter()
                km.fit(vec)
                times[it] = time.perf_counter() - t0
            out[solver] = max(times[m + 1] - times[1], 1e-9) / m
            _log.info("mllib %s: %s", solver, times)
    finally:
        vec.unpersist()
    return out


def main(argv=None) -> int:
    """``python -m sparkpriv.bench.kmeans`` (the same as ``sparkpriv bench kmeans``)."""
    from sparkpriv.bench import module_main

    return module_main("kmeans", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
