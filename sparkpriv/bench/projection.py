"""``sparkpriv bench projection``: the projection release against its baselines.

On one Parquet table of ``--rows`` Gaussian-blob rows (generated once under
``--data-dir`` and reused by later runs of the same size), in one run, on one
SparkSession and the same cores, it times these pipelines that each read the
table and write a Parquet table:

a. ``sparkpriv``: :func:`~sparkpriv.api.release_projection` with
   Laplace noise and a declared ``row_bound``, then ``Release.write``, on the
   table read with ``read_table(..., reader=--reader)`` (default ``arrow``: the
   Python workers read the row groups and write the part files, no row
   passes through the JVM; :mod:`sparkpriv.spark.parquet_scan`);
a'. ``sparkpriv_spark_reader``: the same release on ``spark.read.parquet``
   (Spark reads the rows and hands them to Python): the reader's effect,
   measured in the same run. The two releases are the same table;
b. ``mllib``: MLlib ``RowMatrix.multiply`` by a matrix of the same shape (no
   clipping, no noise), the rows built the fastest way found (see
   :data:`MLLIB_VARIANTS`), then the result written;
c. ``floor``: an identity ``mapInArrow`` over the same columns, then written:
   the cost of moving the rows through Python and back, with no work at all;
d. ``single_process``: the same release in one Python process with pyarrow and
   numpy (read by batches, clip, project, ``add_noise``, write).

It prints a table of rows/s and, as its last line, one JSON object. Besides
wall-clock time it records the CPU seconds each pipeline used (this process,
the JVM and the Python workers, from /proc): on a machine shared with other
jobs, wall-clock rates depend on their load and CPU seconds much less.
Every timed run writes to a fresh directory under ``--data-dir`` that is
deleted afterwards. A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import time
import uuid

from sparkpriv.bench._timing import TreeCpu

__all__ = ["add_arguments", "run_from_args", "run", "MLLIB_VARIANTS"]

_log = logging.getLogger(__name__)

#: How (b) builds its RowMatrix from the DataFrame and writes the product.
#: ``assembler``: VectorAssembler + MLUtils.convertVectorColumnsFromML, passed
#: to ``RowMatrix(DataFrame)`` (rows built in the JVM); the product's rows come
#: back to Python (``RowMatrix.rows``) and are written as z0..z{k-1}.
#: ``python-rdd``: ``RowMatrix(df.rdd.map(Vectors.dense))`` (rows built in
#: Python), product written the same way.
#: ``indexed``: VectorAssembler + ``IndexedRowMatrix(DataFrame of (id,
#: vector))``; the product stays in the JVM and is written as (index, vector)
#: through ``getIndexedRows``. ``IndexedRowMatrix.multiply`` is
#: ``RowMatrix.multiply`` zipped with the row indices, which reads the input
#: twice.
MLLIB_VARIANTS = ("assembler", "python-rdd", "indexed")
DEFAULT_MLLIB_VARIANT = "indexed"

METHODS = ("sparkpriv", "sparkpriv_spark_reader", "mllib", "floor", "single_process")
_LABELS = {
    "sparkpriv": "(a) sparkpriv release_projection + write",
    "sparkpriv_spark_reader": "(a') the same, read by Spark (mapInArrow)",
    "mllib": "(b) MLlib RowMatrix.multiply + write",
    "floor": "(c) floor: identity mapInArrow + write",
    "single_process": "(d) single process pyarrow + numpy release",
    "mllib_multiply_only": "    MLlib RowMatrix.multiply, count only",
}
_WARMUP_ROWS = 20_000
_SINGLE_BATCH = 65_536


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``sparkpriv bench projection`` to ``parser``."""
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table [default: 1000000]")
    parser.add_argument("--cols", type=int, default=64, help="feature columns [default: 64]")
    parser.add_argument("--k", type=int, default=16, help="projection dimension [default: 16]")
    parser.add_argument("--data-dir", default="./bench-data",
                        help="where the table and the timed outputs go [default: ./bench-data]")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each pipeline, best kept [default: 1]")
    parser.add_argument("--master", default="local[2]", help="Spark master [default: local[2]]")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of the release [default: 1.0]")
    parser.add_argument("--row-bound", type=float, default=10.0,
                        help="declared L2 bound of a row (rows are clipped to it) [default: 10.0]")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory [default: 4g]")
    parser.add_argument("--reader", choices=("arrow", "spark"), default="arrow",
                        help="reader of (a): arrow (the direct Parquet reader) or spark [default: arrow]")
    parser.add_argument("--mllib-variant", choices=MLLIB_VARIANTS, default=DEFAULT_MLLIB_VARIANT,
                        help=f"how (b) builds the RowMatrix and writes it [default: {DEFAULT_MLLIB_VARIANT}]")


def run_from_args(args: argparse.Namespace) -> dict:
    """Run the benchmark with parsed arguments; prints the table and the JSON line."""
    from sparkpriv.errors import ParameterError

    for name in ("rows", "cols", "k", "repeats"):
        v = getattr(args, name)
        if v < 1:
            raise ParameterError(f"--{name} must be a positive integer. Got {v} instead.")
    if args.k > args.cols:
        raise ParameterError(f"--k must be at most --cols ({args.cols}). Got {args.k} instead.")
    return run(rows=args.rows, cols=args.cols, k=args.k, data_dir=args.data_dir, repeats=args.repeats,
               master=args.master, epsilon=args.epsilon, row_bound=args.row_bound,
               driver_memory=args.driver_memory, mllib_variant=args.mllib_variant, reader=args.reader)


def run(*, rows: int, cols: int, k: int, data_dir: str, repeats: int = 1, master: str = "local[2]",
        epsilon: float = 1.0, row_bound: float = 10.0, driver_memory: str = "4g",
        mllib_variant: str = DEFAULT_MLLIB_VARIANT, reader: str = "arrow") -> dict:
    """Time (a)-(d) on a table of ``rows`` x ``cols``; return the JSON-ready result."""
    import numpy as np

    from sparkpriv.spark.session import get_spark

    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # keep the JSON line last
    # the Python daemon forks workers with sparkpriv's modules and compiled kernels loaded
    # (sparkpriv.spark.daemon): a worker started after an idle minute does not pay ~2 CPU s again
    spark = get_spark({"spark.driver.memory": driver_memory, "spark.python.daemon.module": "sparkpriv.spark.daemon"},
                      app_name="sparkpriv-bench-projection", master=master)
    load_start = _loadavg()
    table = _ensure_table(spark, data_dir, rows, cols)
    small = _ensure_table(spark, data_dir, min(rows, _WARMUP_ROWS), cols)
    columns = [f"f{j}" for j in range(cols)]
    # the same-shaped matrix for MLlib (its values do not change the work done)
    P = np.random.default_rng(0).standard_normal((cols, k)) / np.sqrt(k)
    pipelines = {
        "sparkpriv": lambda src, out: _run_sparkpriv(spark, src, out, columns, k, epsilon, row_bound, reader),
        "sparkpriv_spark_reader": lambda src, out: _run_sparkpriv(spark, src, out, columns, k, epsilon, row_bound,
                                                                  "spark"),
        "mllib": lambda src, out: _run_mllib(spark, src, out, columns, P, mllib_variant),
        "floor": lambda src, out: _run_floor(spark, src, out, columns),
        "single_process": lambda src, out: _run_single_process(src, out, columns, k, epsilon, row_bound),
    }
    # untimed warm-up of every pipeline on a small table (JVM classes, JIT, Python workers)
    _log.info("warm-up on %s", small)
    for name, fn in pipelines.items():
        _timed(data_dir, f"warmup-{name}", lambda out, fn=fn: fn(small, out))
    _timed(data_dir, "warmup-mllib-count", lambda out: _run_mllib_count(spark, small, columns, P))
    _warm_page_cache(table)
    pipelines["mllib_multiply_only"] = lambda src, out: _run_mllib_count(spark, src, columns, P)

    best: dict[str, float] = {}
    times: dict[str, list] = {name: [] for name in pipelines}
    cpu: dict[str, float | None] = {}
    breakdown: dict = {}
    for rep in range(repeats):
        # rotate the order every repeat; sparkpriv runs first (least warm) in the first
        order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)] + ("mllib_multiply_only",)
        for name in order:
            _log.info("repeat %d/%d: %s", rep + 1, repeats, name)
            secs, cpu_s, res = _timed(data_dir, name, lambda out, name=name: pipelines[name](table, out))
            if name == "single_process" and secs < best.get(name, float("inf")):
                breakdown = res
            best[name] = min(secs, best.get(name, float("inf")))
            times[name].append(round(secs, 3))
            cpu[name] = None if cpu_s is None else min(cpu_s, cpu.get(name) or float("inf"))
            _log.info("%s: %.2f s (%.3g rows/s), %s CPU s, load %s", name, secs, rows / secs,
                      "?" if cpu_s is None else f"{cpu_s:.1f}", _loadavg())

    rate = {name: rows / secs for name, secs in best.items()}
    have_cpu = all(v for v in cpu.values())
    result = {
        "benchmark": "projection",
        "rows": rows,
        "cols": cols,
        "k": k,
        "master": master,
        "repeats": repeats,
        "reader": reader,
        "python_daemon": spark.conf.get("spark.python.daemon.module", "pyspark.daemon"),
        "sparkpriv_rows_per_s": round(rate["sparkpriv"]),
        "sparkpriv_spark_reader_rows_per_s": round(rate["sparkpriv_spark_reader"]),
        "mllib_rows_per_s": round(rate["mllib"]),
        "floor_rows_per_s": round(rate["floor"]),
        "single_process_rows_per_s": round(rate["single_process"]),
        "mllib_multiply_only_rows_per_s": round(rate["mllib_multiply_only"]),
        "ratio_vs_mllib": round(rate["sparkpriv"] / rate["mllib"], 3),
        "ratio_vs_floor": round(rate["sparkpriv"] / rate["floor"], 3),
        "ratio_vs_single_process": round(rate["sparkpriv"] / rate["single_process"], 3),
        "ratio_vs_spark_reader": round(rate["sparkpriv"] / rate["sparkpriv_spark_reader"], 3),
        "times_s": times,
        "seconds": {name: round(s, 3) for name, s in best.items()},
        "cpu_seconds": {name: (None if c is None else round(c, 2)) for name, c in cpu.items()},
        "cpu_ratio_vs_mllib": round(cpu["mllib"] / cpu["sparkpriv"], 3) if have_cpu else None,
        "cpu_ratio_vs_floor": round(cpu["floor"] / cpu["sparkpriv"], 3) if have_cpu else None,
        "single_process_breakdown_s": {n: round(s, 3) for n, s in breakdown.items()},
        "mllib_variant": mllib_variant,
        "mllib_blas": _mllib_blas(spark),
        "noise": "laplace",
        "epsilon": epsilon,
        "row_bound": row_bound,
        "cpus": os.cpu_count(),
        "loadavg_1m": [load_start, _loadavg()],
        "versions": _versions(spark),
    }
    _print_table(result, best, cpu)
    print(json.dumps(result, sort_keys=False))
    return result


# ----------------------------------------------------------------------------- data


def _ensure_table(spark, data_dir: str, rows: int, cols: int) -> str:
    """The blobs table of ``rows`` x ``cols`` under ``data_dir``: reused if complete, else generated."""
    from sparkpriv.spark.generate import generate_blobs

    path = os.path.join(data_dir, f"blobs-{rows}x{cols}.parquet")
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        _log.info("reusing the table %s", path)
        return path
    if os.path.exists(path):
        shutil.rmtree(path)  # an incomplete earlier generation
    staging = os.path.join(data_dir, f".blobs-{rows}x{cols}.{uuid.uuid4().hex[:8]}.tmp")
    _log.info("generating %d x %d rows into %s", rows, cols, path)
    t0 = time.perf_counter()
    try:
        generate_blobs(spark, rows=rows, cols=cols, seed=0).write.parquet(staging)
        os.rename(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _log.info("generated in %.1f s", time.perf_counter() - t0)
    return path


def _warm_page_cache(path: str) -> None:
    """Read every file of the table once so no pipeline pays for the first disk read."""
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def _parquet_files(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path)
                  if f.endswith(".parquet") and not f.startswith(("_", ".")))


def _timed(data_dir: str, name: str, fn):
    """Run ``fn(out_dir)`` with a fresh output directory, then delete it.

    Returns ``(wall seconds, CPU seconds, result)``; CPU seconds are those of
    this process and all its descendants (the JVM, Python workers, those that
    end meanwhile included: :class:`sparkpriv.bench._timing.TreeCpu`), or None
    where /proc is not available.
    """
    runs = os.path.join(data_dir, "runs")
    os.makedirs(runs, exist_ok=True)
    out = os.path.join(runs, f"{name}-{uuid.uuid4().hex[:12]}")
    try:
        with TreeCpu() as own:
            t0 = time.perf_counter()
            res = fn(out)
            wall = time.perf_counter() - t0
        return wall, own.seconds, res
    finally:
        shutil.rmtree(out, ignore_errors=True)


# ----------------------------------------------------------------------------- the pipelines


def _run_sparkpriv(spark, src, out, columns, k, epsilon, row_bound, reader):
    from sparkpriv.io.inputs import read_table
    from sparkpriv.api import release_projection

    df = read_table(spark, src, "parquet", reader=reader)
    release = release_projection(df, columns=columns, k=k, epsilon=epsilon, row_bound=row_bound)
    release.write(out)


def _vector_df(spark, src, columns, keep=()):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.mllib.util import MLUtils

    df = spark.read.parquet(src)
    vec = VectorAssembler(inputCols=list(columns), outputCol="features").transform(df)
    return MLUtils.convertVectorColumnsFromML(vec.select(*keep, "features"), "features")


def _row_matrix(spark, src, columns, variant):
    from pyspark.mllib.linalg import Vectors
    from pyspark.mllib.linalg.distributed import RowMatrix

    d = len(columns)
    if variant == "python-rdd":
        rdd = spark.read.parquet(src).select(*columns).rdd.map(lambda r: Vectors.dense(r))
        return RowMatrix(rdd, 0, d)
    return RowMatrix(_vector_df(spark, src, columns), 0, d)


def _dense_matrix(P):
    from pyspark.mllib.linalg import DenseMatrix

    d, k = P.shape
    return DenseMatrix(d, k, P.ravel(order="F").tolist())  # column-major


def _run_mllib(spark, src, out, columns, P, variant):
    k = P.shape[1]
    M = _dense_matrix(P)
    if variant == "indexed":
        from pyspark.mllib.common import callMLlibFunc
        from pyspark.mllib.linalg.distributed import IndexedRowMatrix

        irm = IndexedRowMatrix(_vector_df(spark, src, columns, keep=("id",)), 0, len(columns)).multiply(M)
        callMLlibFunc("getIndexedRows", irm._java_matrix_wrapper._java_model).write.parquet(out)
        return
    product = _row_matrix(spark, src, columns, variant).multiply(M)
    names = [f"z{i}" for i in range(k)]
    product.rows.map(lambda v: v.toArray().tolist()).toDF(names).write.parquet(out)


def _run_mllib_count(spark, src, columns, P):
    """MLlib multiply with the fastest input and no write: the rows are only counted (in the JVM)."""
    product = _row_matrix(spark, src, columns, "assembler").multiply(_dense_matrix(P))
    return product._java_matrix_wrapper._java_model.rows().count()


def _run_floor(spark, src, out, columns):
    df = spark.read.parquet(src).select(*columns)

    def sparkpriv_bench_identity(batches):
        yield from batches

    df.mapInArrow(sparkpriv_bench_identity, df.schema).write.parquet(out)


def _run_single_process(src, out, columns, k, epsilon, row_bound) -> dict:
    """The release in one process: pyarrow batches -> clip, project, noise -> pyarrow writer.

    BLAS is limited to one thread, as in Spark's Python workers (OMP_NUM_THREADS=1):
    this baseline uses one core. Returns seconds spent per step (read, to_numpy,
    project, noise, write).
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return _single_process(src, out, columns, k, epsilon, row_bound)


def _single_process(src, out, columns, k, epsilon, row_bound) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkpriv.mechanisms.projection import NOISE_STAGE, plan_projection, project_rows, secret_matrix_and_seed
    from sparkpriv.privacy.bounds import Bounds
    from sparkpriv.privacy.noise import add_noise
    from sparkpriv.privacy.random import stream

    d = len(columns)
    P, seed = secret_matrix_and_seed(d, k, None)
    plan = plan_projection(P, Bounds(d, row_bound=row_bound), epsilon=epsilon)
    rng = stream(seed, NOISE_STAGE, 0)
    schema = pa.schema([pa.field(f"z{i}", pa.float64(), nullable=False) for i in range(k)])
    spent = dict.fromkeys(("read", "to_numpy", "project", "noise", "write"), 0.0)
    os.makedirs(out)
    clock = time.perf_counter
    with pq.ParquetWriter(os.path.join(out, "part-00000.parquet"), schema) as writer:
        for path in _parquet_files(src):
            batches = pq.ParquetFile(path).iter_batches(batch_size=_SINGLE_BATCH, columns=columns)
            while True:
                t0 = clock()
                batch = next(batches, None)
                t1 = clock()
                spent["read"] += t1 - t0
                if batch is None:
                    break
                X = np.empty((d, batch.num_rows)).T
                for j, name in enumerate(columns):
                    X[:, j] = batch.column(name).to_numpy()
                t2 = clock()
                Y, _ = project_rows(X, P, plan.bounds)
                t3 = clock()
                Z = add_noise(Y, plan.noise, rng)
                t4 = clock()
                ZT = np.ascontiguousarray(Z.T)
                writer.write_batch(pa.RecordBatch.from_arrays([pa.array(c) for c in ZT], schema=schema))
                t5 = clock()
                spent["to_numpy"] += t2 - t1
                spent["project"] += t3 - t2
                spent["noise"] += t4 - t3
                spent["write"] += t5 - t4
    return spent


# ----------------------------------------------------------------------------- reporting


def _mllib_blas(spark) -> str:
    """Which BLAS MLlib uses here (native through JNI, or its Java fallback)."""
    try:
        jvm = spark._jvm
        blas = jvm.dev.ludovic.netlib.blas
        try:
            native = blas.NativeBLAS.getInstance().getClass().getName()
            return f"native BLAS ({native})"
        except Exception:
            java = blas.JavaBLAS.getInstance().getClass().getName()
            return f"no native BLAS: Java fallback ({java})"
    except Exception as exc:  # Spark Connect: no JVM to ask
        return f"unknown ({type(exc).__name__})"


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _versions(spark) -> dict:
    import numpy as np
    import pyarrow as pa

    return {"spark": spark.version, "python": platform.python_version(), "numpy": np.__version__,
            "pyarrow": pa.__version__}


def _print_table(result: dict, best: dict, cpu: dict) -> None:
    rows = result["rows"]
    print(f"projection release: {rows} rows x {result['cols']} columns -> k={result['k']}, "
          f"master {result['master']}, best of {result['repeats']}, load average (1 min) "
          f"{result['loadavg_1m'][0]} -> {result['loadavg_1m'][1]} on {result['cpus']} CPUs")
    print(f"{'pipeline':<46} {'seconds':>9} {'rows/s':>12} {'CPU s':>8} {'rows/CPU s':>12}")
    for name in (*METHODS, "mllib_multiply_only"):
        secs, c = best[name], cpu.get(name)
        cpu_cols = f"{c:>8.1f} {rows / c:>12,.0f}" if c else f"{'-':>8} {'-':>12}"
        print(f"{_LABELS[name]:<46} {secs:>9.2f} {rows / secs:>12,.0f} {cpu_cols}")
    print(f"ratio vs MLlib {result['ratio_vs_mllib']:.3f}, vs floor {result['ratio_vs_floor']:.3f}, "
          f"vs single process {result['ratio_vs_single_process']:.3f}, vs Spark's reader "
          f"{result['ratio_vs_spark_reader']:.3f} (wall clock, best of {result['repeats']}); "
          f"CPU-time ratios: vs MLlib {result['cpu_ratio_vs_mllib']}, vs floor {result['cpu_ratio_vs_floor']}")
    print(f"MLlib BLAS: {result['mllib_blas']}; reader of (a): {result['reader']}")
    print("every repeat (s): " + "; ".join(f"{n} {v}" for n, v in result["times_s"].items()))
    sys.stdout.flush()


def main(argv=None) -> int:
    """``python -m sparkpriv.bench.projection`` (the same as ``sparkpriv bench projection``)."""
    from sparkpriv.bench import module_main

    return module_main("projection", argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
