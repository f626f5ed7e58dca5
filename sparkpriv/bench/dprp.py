"""``sparkpriv bench dprp``: the DPRP Gram step against MLlib, and the whole release.

On one Parquet table of ``--rows`` Gaussian-blob rows x ``--cols`` features
(generated once under ``--data-dir`` and reused), in one run, on one
SparkSession and the same cores:

a. ``sparkpriv_gram``: the Gram pass of :func:`~sparkpriv.api.release_dprp`
   on the table as :func:`~sparkpriv.io.inputs.read_table` (``reader="arrow"``) returns it (read the
   columns, per Arrow batch scale to [0, 1], clip and compute the upper
   triangle of ``X^T X`` in float64 numpy, merge by tree aggregation); for a
   local Parquet table the workers read the row groups directly
   (:mod:`sparkpriv.spark.parquet_scan`);
   a2. ``sparkpriv_gram_mapinarrow``: the same pass forced through
   ``mapInArrow`` (what any other DataFrame gets);
b. ``mllib_gram``: MLlib ``RowMatrix.computeGramianMatrix`` on the same columns
   (VectorAssembler + ``MLUtils.convertVectorColumnsFromML``, rows built in the
   JVM; MLlib uses native BLAS only when netlib finds one, which this machine
   may not have: the JSON says which);
c. ``release``: the whole DPRP release Parquet -> Parquet (Gram pass, driver
   solve, second pass ``P' = X R + noise``, ``X' = P' M``, decode, write).

It prints a table and, as its last line, one JSON object with ``rows``,
``gram_ratio_vs_mllib`` (a / b throughput) and ``release_rows_per_s``.
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from sparkpriv.bench.projection import (
    _WARMUP_ROWS,
    _ensure_table,
    _loadavg,
    _mllib_blas,
    _timed,
    _versions,
    _warm_page_cache,
)

__all__ = ["add_arguments", "run_from_args", "run"]

_log = logging.getLogger(__name__)
_LABELS = {
    "sparkpriv_gram": "(a) sparkpriv Gram pass (numpy + tree aggregation)",
    "sparkpriv_gram_mapinarrow": "(a2) same, forced through mapInArrow",
    "mllib_gram": "(b) MLlib RowMatrix.computeGramianMatrix",
    "release": "(c) whole DPRP release, Parquet -> Parquet",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``sparkpriv bench dprp`` to ``parser``."""
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table [default: 1000000]")
    parser.add_argument("--cols", type=int, default=64, help="feature columns [default: 64]")
    parser.add_argument("--data-dir", default="./bench-data",
                        help="where the table and the timed outputs go [default: ./bench-data]")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each step, best kept [default: 1]")
    parser.add_argument("--master", default="local[2]", help="Spark master [default: local[2]]")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of the release [default: 1.0]")
    parser.add_argument("--delta", type=float, default=1e-6, help="delta of the release [default: 1e-6]")
    parser.add_argument("--bound", type=float, default=8.0,
                        help="declared per-column bounds [-bound, bound] [default: 8]")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory [default: 4g]")
    parser.add_argument("--skip-release", action="store_true", help="time only (a) and (b)")


def run_from_args(args: argparse.Namespace) -> dict:
    from sparkpriv.errors import ParameterError

    for name in ("rows", "cols", "repeats"):
        v = getattr(args, name)
        if v < 1:
            raise ParameterError(f"--{name} must be a positive integer. Got {v} instead.")
    return run(rows=args.rows, cols=args.cols, data_dir=args.data_dir, repeats=args.repeats,
               master=args.master, epsilon=args.epsilon, delta=args.delta, bound=args.bound,
               driver_memory=args.driver_memory, skip_release=args.skip_release)


def run(*, rows: int, cols: int, data_dir: str, repeats: int = 1, master: str = "local[2]",
        epsilon: float = 1.0, delta: float = 1e-6, bound: float = 8.0, driver_memory: str = "4g",
        skip_release: bool = False) -> dict:
    from sparkpriv.spark.session import get_spark

    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    spark = get_spark({"spark.driver.memory": driver_memory}, app_name="sparkpriv-bench-dprp", master=master)
    load_start = _loadavg()
    table = _ensure_table(spark, data_dir, rows, cols)
    small = _ensure_table(spark, data_dir, min(rows, _WARMUP_ROWS), cols)
    columns = [f"f{j}" for j in range(cols)]
    steps = {
        "sparkpriv_gram": lambda src, out: _run_gram(spark, src, columns, bound),
        "sparkpriv_gram_mapinarrow": lambda src, out: _run_gram(spark, src, columns, bound, direct=False),
        "mllib_gram": lambda src, out: _run_mllib_gram(spark, src, columns),
    }
    if not skip_release:
        steps["release"] = lambda src, out: _run_release(spark, src, out, columns, bound, epsilon, delta)
    _log.info("warm-up on %s", small)
    for name, fn in steps.items():
        _timed(data_dir, f"warmup-{name}", lambda out, fn=fn: fn(small, out))
    _warm_page_cache(table)
    best: dict[str, float] = {}
    for rep in range(repeats):
        names = list(steps)
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            secs, _, _ = _timed(data_dir, name, lambda out, name=name: steps[name](table, out))
            best[name] = min(secs, best.get(name, float("inf")))
            _log.info("%s: %.2f s (%.3g rows/s)", name, secs, rows / secs)
    rate = {k: rows / s for k, s in best.items()}
    result = {
        "benchmark": "dprp",
        "rows": rows,
        "cols": cols,
        "master": master,
        "repeats": repeats,
        "sparkpriv_gram_rows_per_s": round(rate["sparkpriv_gram"]),
        "mllib_gram_rows_per_s": round(rate["mllib_gram"]),
        "gram_ratio_vs_mllib": round(rate["sparkpriv_gram"] / rate["mllib_gram"], 3),
        "mapinarrow_gram_ratio_vs_mllib": round(rate["sparkpriv_gram_mapinarrow"] / rate["mllib_gram"], 3),
        "release_rows_per_s": round(rate["release"]) if "release" in rate else None,
        "seconds": {k: round(s, 3) for k, s in best.items()},
        "mllib_blas": _mllib_blas(spark),
        "epsilon": epsilon,
        "delta": delta,
        "cpus": os.cpu_count(),
        "loadavg_1m": [load_start, _loadavg()],
        "versions": _versions(spark),
    }
    print(f"DPRP: {rows} rows x {cols} columns, master {master}, best of {repeats}")
    print(f"{'step':<52} {'seconds':>9} {'rows/s':>12}")
    for name, secs in best.items():
        print(f"{_LABELS[name]:<52} {secs:>9.2f} {rows / secs:>12,.0f}")
    print(f"Gram ratio vs MLlib {result['gram_ratio_vs_mllib']:.3f}; MLlib BLAS: {result['mllib_blas']}")
    sys.stdout.flush()
    print(json.dumps(result))
    return result


def _plan(cols: int, bound: float, epsilon: float, delta: float):
    from sparkpriv.mechanisms import dprp as core

    v = core.validate_params(d=cols, epsilon=epsilon, delta=delta, lower=[-bound] * cols, upper=[bound] * cols,
                             k1=None, k2=None, row_bound=None, budget_split=core.DEFAULT_BUDGET_SPLIT,
                             labels=None, classes=None, label_scale=1.0, fill=None, impute_share=0.05,
                             neighbors="replace-one", caller="bench")
    R, _ = core.draw_secrets(cols, v["k1"])
    return core.plan_dprp(R, d=cols, epsilon=epsilon, delta=delta, lower=v["lower"], upper=v["upper"],
                          k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"], labels=None,
                          classes=None, label_scale=1.0)


def _run_gram(spark, src, columns, bound, direct=True):
    from sparkpriv.io.inputs import read_table
    from sparkpriv.mechanisms import dprp as core
    from sparkpriv.spark.engine import SparkEngine

    plan = _plan(len(columns), bound, 1.0, 1e-6)
    df = read_table(spark, src, "parquet", reader="arrow")
    # the release's own Gram pass (the engine's aggregate of the mechanism's Gram partial); the
    # DataFrame of the same read (df.df) is read by Spark (mapInArrow)
    eng = SparkEngine()
    source = eng.open(df if direct else df.df, columns=columns, fill=None, caller="bench")
    return eng.aggregate(source, core._gram_fn(plan, None), 1 + plan.d_aug * (plan.d_aug + 1) // 2)


def _run_mllib_gram(spark, src, columns):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.mllib.linalg.distributed import RowMatrix
    from pyspark.mllib.util import MLUtils

    df = spark.read.parquet(src)
    vec = VectorAssembler(inputCols=list(columns), outputCol="features").transform(df).select("features")
    return RowMatrix(MLUtils.convertVectorColumnsFromML(vec, "features"), 0, len(columns)).computeGramianMatrix()


def _run_release(spark, src, out, columns, bound, epsilon, delta):
    from sparkpriv.api import release_dprp

    d = len(columns)
    from sparkpriv.io.inputs import read_table

    rel = release_dprp(read_table(spark, src, "parquet", reader="arrow"), columns=columns, epsilon=epsilon, delta=delta,
                       lower=[-bound] * d, upper=[bound] * d)
    rel.write(out)


def main(argv=None) -> int:
    """``python -m sparkpriv.bench.dprp`` (the same as ``sparkpriv bench dprp``)."""
    from sparkpriv.bench import module_main

    return module_main("dprp", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
