"""``sparkpriv bench regression``: the sketch release vs MLlib LinearRegression, and utility.

Timing (default): on one generated table of ``--rows`` x ``--cols`` (Parquet
under ``--data-dir``, reused across runs; the last column is the target), on
one SparkSession with the same cores:

a. sparkpriv's sketch release (:func:`sparkpriv.api.release_regression` on the Spark
   engine: count pass, sketch pass, driver noise and fit; nothing written),
   ``m = --sketch-rows``;
b. ``pyspark.ml.regression.LinearRegression(solver="normal")`` on the same
   table (VectorAssembler, fitIntercept=False, regParam=0), assembling included.

Every repeat is printed with its ratio (sparkpriv / MLlib wall seconds), and the
cost per row of the sketch pass. MLlib's BLAS (native or Java fallback) is
printed: here it has NO native BLAS. A benchmark, not a test: it asserts nothing.

Utility (``--utility``): relative objective error and test error against n and
epsilon, for the sketch (m by the 'log', 'linear', 'full' rules), the additive
baseline, AdaSSP (:mod:`sparkpriv.bench.adassp`), diffprivlib's
LinearRegression and the non-private fit, at the same (epsilon, delta), on the
paper's uniform data and MNIST 4 vs 9 (300 highest-energy pixels, 80/20 split,
read from ``../shared/datasets/mnist``). Prints Markdown tables (docs/regression.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import os
import sys
import time
import types
import warnings

import numpy as np

__all__ = ["add_arguments", "run_from_args", "run", "utility"]

_log = logging.getLogger(__name__)

MNIST_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "..",
                         "shared", "datasets", "mnist")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table [default: 1000000]")
    parser.add_argument("--cols", type=int, default=64, help="columns, the last is the target [default: 64]")
    parser.add_argument("--sketch-rows", type=int, default=None,
                        help="m, rows of the sketch [default: the 'log' rule]")
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats of each pipeline [default: 1]")
    parser.add_argument("--data-dir", default="/tmp/sparkpriv-bench", help="where the table is generated")
    parser.add_argument("--master", default="local[2]", help="Spark master [default: local[2]]")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory [default: 6g]")
    parser.add_argument("--utility", action="store_true",
                        help="run the utility study (numpy, no Spark) instead of the timing")
    parser.add_argument("--trials", type=int, default=5, help="utility: trials per setting [default: 5]")
    parser.add_argument("--json", default=None, help="utility: write every record to this JSON file")


def run_from_args(args: argparse.Namespace) -> dict:
    from sparkpriv.errors import ParameterError

    if args.utility:
        return utility(trials=args.trials, json_path=args.json)
    for name in ("rows", "cols", "repeats"):
        if getattr(args, name) < (2 if name == "cols" else 1):
            raise ParameterError(f"--{name} is too small. Got {getattr(args, name)} instead.")
    return run(rows=args.rows, cols=args.cols, sketch_rows=args.sketch_rows, repeats=args.repeats,
               data_dir=args.data_dir, master=args.master, driver_memory=args.driver_memory)


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


def run(*, rows: int, cols: int, sketch_rows: int | None, repeats: int, data_dir: str,
        master: str = "local[2]", driver_memory: str = "6g") -> dict:
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.regression import LinearRegression

    from sparkpriv.bench.projection import _loadavg, _mllib_blas, _versions
    from sparkpriv.api import release_regression
    from sparkpriv.spark.session import get_spark

    spark = get_spark({"spark.driver.memory": driver_memory}, app_name="sparkpriv-bench-regression",
                      master=master)
    path = _ensure_table(spark, data_dir, rows, cols)
    df = spark.read.parquet(path)
    features = tuple(c for c in df.columns if c != "y")
    params = dict(columns=list(features), target="y", row_bound=1.5, epsilon=1.0, delta=1e-6)
    if sketch_rows is not None:
        params["sketch_rows"] = sketch_rows
    load0 = _loadavg()
    runs = []
    for rep in range(repeats):
        t = time.perf_counter()
        rel = release_regression(df, **params)
        m = rel.public["sketch_rows"]
        t_sketch = time.perf_counter() - t
        t = time.perf_counter()
        data = VectorAssembler(inputCols=list(features), outputCol="features").transform(df)
        LinearRegression(featuresCol="features", labelCol="y", solver="normal", fitIntercept=False,
                         regParam=0.0, standardization=False).fit(data)
        t_mllib = time.perf_counter() - t
        r = {"repeat": rep, "sketch_seconds": round(t_sketch, 2), "mllib_seconds": round(t_mllib, 2),
             "ratio_vs_mllib": round(t_sketch / t_mllib, 3), "sketch_us_per_row": round(1e6 * t_sketch / rows, 3),
             "m": m}
        runs.append(r)
        print(f"repeat {rep}: sketch release (m={m}) {t_sketch:.1f} s, MLlib normal {t_mllib:.1f} s, "
              f"ratio {t_sketch / t_mllib:.2f}, {1e6 * t_sketch / rows:.2f} us/row", flush=True)
    result = {"rows": rows, "cols": cols, "m": runs[-1]["m"], "master": master, "runs": runs,
              "ratio_vs_mllib": min(r["ratio_vs_mllib"] for r in runs), "mllib_blas": _mllib_blas(spark),
              "cpus": os.cpu_count(), "loadavg_1m": [load0, _loadavg()], **_versions(spark)}
    print(f"MLlib BLAS: {result['mllib_blas']}")
    print(json.dumps(result))
    sys.stdout.flush()
    return result


# ----------------------------------------------------------------------------- utility


def read_idx(path: str) -> np.ndarray:
    """An MNIST idx file (gzip) as a uint8 array of its declared shape."""
    with gzip.open(path) as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_mnist_49(seed: int = 0):
    """MNIST training digits 4 and 9 (11,791 images), the 300 pixels of most energy, labels +-1;
    an 80/20 split. The pixel choice looks at the data (as the paper does): not private."""
    X = read_idx(os.path.join(MNIST_DIR, "train-images.idx3-ubyte.gz")).reshape(-1, 784) / 255.0
    y = read_idx(os.path.join(MNIST_DIR, "train-labels.idx1-ubyte.gz"))
    keep = (y == 4) | (y == 9)
    X, y = X[keep], np.where(y[keep] == 4, 1.0, -1.0)
    pix = np.argsort(-(X * X).sum(axis=0))[:300]
    X = X[:, pix]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    cut = int(0.8 * len(y))
    return X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]]


def uniform_data(n: int, d: int, rng: np.random.Generator, x0: np.ndarray | None = None):
    """Features i.i.d. U(-1, 1) / sqrt(d) (so ||a|| <= 1), target ``a . x0 + 0.1 N(0, 1)``, ``||x0|| = 1``
    (``x0`` drawn from ``rng`` unless given); returns ``(A, b, x0)``."""
    A = rng.uniform(-1, 1, (n, d)) / math.sqrt(d)
    if x0 is None:
        x0 = rng.standard_normal(d)
        x0 /= np.linalg.norm(x0)
    b = A @ x0 + 0.1 * rng.standard_normal(n)
    return A, b, x0


def _diffprivlib_lr():
    warnings.filterwarnings("ignore")
    stub = types.ModuleType("diffprivlib.models.forest")  # sklearn >= 1.9 lacks what its forests import
    stub.RandomForestClassifier = stub.DecisionTreeClassifier = None
    sys.modules.setdefault("diffprivlib.models.forest", stub)
    from diffprivlib.models import LinearRegression

    return LinearRegression


def _methods(A, b, *, eps, delta, B, rng, sketch_cap, lo, hi):
    """Coefficients of every method on (A, b) (rows already within the bound B)."""
    from sparkpriv.bench.adassp import adassp
    from sparkpriv.mechanisms.regression import RegressionParams, release_regression_array, sketch_rows_for

    n, d = A.shape
    out = {"non-private": np.linalg.lstsq(A, b, rcond=None)[0]}
    for rule in ("log", "linear", "full"):
        m = sketch_rows_for(rule, n, d + 1)
        if m * n > sketch_cap:
            continue
        rel = release_regression_array(A, b, RegressionParams(method="sketch", row_bound=B, epsilon=eps, delta=delta,
                                                              sketch_rule=rule))
        out[f"sketch {rule} (m={m})"] = rel.fit.coef
        if rule == "log":  # the paper's estimator: no debiasing (the noise acts as a ridge m s^2)
            out[f"sketch log, not debiased (m={m})"] = release_regression_array(A, b, RegressionParams(
                method="sketch", row_bound=B, epsilon=eps, delta=delta, sketch_rule=rule, debias=False)).fit.coef
    rel = release_regression_array(A, b, RegressionParams(method="sketch", row_bound=B, epsilon=eps, delta=delta, scheme="additive"))
    out["additive"] = rel.fit.coef
    out["additive, not debiased"] = release_regression_array(A, b, RegressionParams(
        method="sketch", row_bound=B, epsilon=eps, delta=delta, scheme="additive", debias=False)).fit.coef
    out["AdaSSP"] = adassp(A, b, epsilon=eps, delta=delta, bound_x=B, bound_y=B, rng=rng)
    LR = _diffprivlib_lr()
    lr = LR(epsilon=eps, bounds_X=(lo, hi), bounds_y=(-B, B), fit_intercept=False,
            random_state=int(rng.integers(2**31)))
    out["diffprivlib (pure eps)"] = lr.fit(A, b).coef_.ravel()
    return out


def _rel_obj(A, b, x, f_star):
    return (float(np.sum((A @ x - b) ** 2)) - f_star) / f_star


def utility(*, trials: int = 5, json_path: str | None = None, delta: float = 1e-6,
            uniform_ns=(1_000, 10_000, 100_000), uniform_eps=(0.5, 1.0, 2.0, 4.0, 8.0), uniform_n_fixed=10_000,
            mnist: bool = True,
            mnist_ns=(1_000, 3_000, None), mnist_eps=(1.0, 4.0), mnist_eps_fixed=1.0,
            sketch_cap: float = 4e8) -> dict:
    """Both studies; returns (and optionally writes) every record, prints Markdown tables."""
    logging.getLogger("sparkpriv").setLevel(logging.CRITICAL)
    records = _Records(json_path)
    d = 10
    B = math.sqrt(2.0)  # ||a|| <= 1 and |b| <= about 1 for the uniform data
    lo, hi = -1 / math.sqrt(d), 1 / math.sqrt(d)
    from sparkpriv.mechanisms.regression import clip_regression_rows

    grid = [(n, 1.0) for n in uniform_ns] + [(uniform_n_fixed, e) for e in uniform_eps if e != 1.0]
    for n, eps in grid:
        for t in range(trials):
            rng = np.random.default_rng(1000 * t + n)
            A, b, x0 = uniform_data(n, d, rng)
            M, _ = clip_regression_rows(A, b, B)
            A, b = M[:, :-1], M[:, -1]
            At, bt, _ = uniform_data(max(n // 4, 1000), d, np.random.default_rng(10**6 + t), x0)
            x_star = np.linalg.lstsq(A, b, rcond=None)[0]
            f_star = float(np.sum((A @ x_star - b) ** 2))
            t0 = time.perf_counter()
            for name, x in _methods(A, b, eps=eps, delta=delta, B=B, rng=rng, sketch_cap=sketch_cap,
                                    lo=lo, hi=hi).items():
                records.append({"data": "uniform", "n": n, "epsilon": eps, "trial": t, "method": name,
                                "rel_obj": _rel_obj(A, b, x, f_star),
                                "test_mse": float(np.mean((At @ x - bt) ** 2))})
            print(f"uniform n={n} eps={eps} trial={t}: {time.perf_counter() - t0:.1f} s", flush=True)
    if mnist and os.path.isdir(MNIST_DIR):
        Xtr, ytr, Xte, yte = load_mnist_49()
        Bm = 10.0
        for n, eps in [(n, mnist_eps_fixed) for n in mnist_ns] + [(None, e) for e in mnist_eps if e != mnist_eps_fixed]:
            for t in range(trials):
                rng = np.random.default_rng(77 + t)
                idx = rng.permutation(len(ytr))[: (n or len(ytr))]
                M, counts = clip_regression_rows(Xtr[idx], ytr[idx], Bm)
                A, b = M[:, :-1], M[:, -1]
                x_star = np.linalg.lstsq(A, b, rcond=None)[0]
                f_star = float(np.sum((A @ x_star - b) ** 2))
                t0 = time.perf_counter()
                for name, x in _methods(A, b, eps=eps, delta=delta, B=Bm, rng=rng, sketch_cap=sketch_cap,
                                        lo=0.0, hi=1.0).items():
                    records.append({"data": "mnist49", "n": len(idx), "epsilon": eps, "trial": t,
                                    "method": name, "rel_obj": _rel_obj(A, b, x, f_star),
                                    "test_error": float(np.mean(np.sign(Xte @ x) != yte)),
                                    "rows_clipped": int(counts.norm_clipped)})
                print(f"mnist n={len(idx)} eps={eps} trial={t}: {time.perf_counter() - t0:.1f} s", flush=True)
    _print_tables(records)
    return {"records": list(records)}


class _Records(list):
    """The records, each also appended to a JSON-lines file as it is made (a long run can be read
    before it ends: ``--json PATH``, then ``tables_from(PATH)``)."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def append(self, r):
        super().append(r)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(r) + "\n")


def tables_from(path: str) -> None:
    """Print the Markdown tables of a JSON-lines file written by :func:`utility`."""
    with open(path) as f:
        _print_tables([json.loads(line) for line in f if line.strip()])


def _print_tables(records):
    import collections

    groups = collections.defaultdict(list)
    for r in records:
        groups[(r["data"], r["n"], r["epsilon"], r["method"])].append(r)
    for data, metric in (("uniform", "rel_obj"), ("uniform", "test_mse"), ("mnist49", "rel_obj"),
                         ("mnist49", "test_error")):
        keys = sorted({(k[1], k[2]) for k in groups if k[0] == data})
        methods = sorted({k[3] for k in groups if k[0] == data}, key=_method_order)
        if not keys:
            continue
        print(f"\n{data}: {metric} (median over trials)\n")
        print("| method | " + " | ".join(f"n={n}, eps={e:g}" for n, e in keys) + " |")
        print("|---|" + "---|" * len(keys))
        for m in methods:
            cells = []
            for n, e in keys:
                g = groups.get((data, n, e, m))
                cells.append(f"{np.median([r[metric] for r in g]):.3g}" if g else "-")
            print(f"| {m} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


def _method_order(name: str):
    order = ["non-private", "sketch log", "sketch linear", "sketch full", "additive", "AdaSSP", "diffprivlib"]
    for i, o in enumerate(order):
        if name.startswith(o):
            return (i, name)
    return (len(order), name)


def main(argv=None) -> int:
    from sparkpriv.bench import module_main

    return module_main("regression", argv)


if __name__ == "__main__":
    raise SystemExit(main())
