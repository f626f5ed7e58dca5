"""Spark plumbing shared by every mechanism: Arrow batches <-> numpy.

The only Spark-specific helpers the mechanisms need:

* :func:`map_batches` runs a numpy function over the Arrow record batches of
  a DataFrame (``mapInArrow``), giving it the partition id so it can open its
  keyed noise stream.
* :func:`sum_partials` computes a per-partition float64 vector (a sufficient
  statistic such as a Gram matrix, or per-cluster counts and sums), and merges
  the partials by tree aggregation; only the merged vector reaches the driver.
* :func:`batch_matrix` turns declared numeric columns of a batch into an
  ``(n, d)`` float64 array, nulls and non-finite values replaced by a public
  fill (never an error); :func:`spark_errors` turns a marked
  :class:`InputError` raised inside a task back into the same error on the
  driver.

Secrets (projection matrices, noise seeds) reach the executors inside the task
closure, which Spark distributes once per stage through its own broadcast of
the task binary. We do not use ``SparkContext.broadcast``: PySpark writes the
pickled value to an unencrypted temporary file on the driver that stays until
the context stops, and SparkContext does not exist under Spark Connect. No
secret is ever a literal in a query plan (plans show only the function name).
Build closures from local numpy arrays, never from objects holding a
SparkSession.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from sparkpriv.errors import InputError

__all__ = [
    "ERROR_MARK",
    "batch_matrix",
    "map_batches",
    "BatchMap",
    "matrix_columns",
    "sum_partials",
    "spark_errors",
    "partition_id",
    "owner_counters",
    "has_rdd",
]

ERROR_MARK = "SPARKPRIV_INPUT_ERROR"
_MARK_RE = re.compile(ERROR_MARK + r"<<(.*?)>>", re.S)


def _marked(msg: str) -> InputError:
    return InputError(f"{ERROR_MARK}<<{msg}>>")


def batch_matrix(batch: pa.RecordBatch, columns: Sequence[str], *, fill=None, counter=None,
                 mask: bool = False):
    """Columns of ``batch`` as an ``(n_rows, len(columns))`` float64 array.

    Nulls, NaN and infinities are replaced by the public ``fill`` (one value or
    one per column; 0.0 when none is given), the same rule for every record, so
    no value of the data makes a release fail (docs/privacy.md, "Failures");
    ``counter`` (an accumulator, or None) counts the replaced values for the
    data owner. ``mask=True`` returns ``(X, missing)`` with those entries 0.0 and
    marked in the ``(n, d)`` bool mask instead (DPRP fills them itself).
    """
    from sparkpriv.local.engine import _filled

    n = batch.num_rows
    out = np.empty((len(columns), n), dtype=np.float64).T  # column-major fill, row-major use
    for j, name in enumerate(columns):
        arr = batch.column(name)
        if arr.null_count:  # nulls read as NaN, replaced below with the others
            arr = arr.cast(pa.float64()).fill_null(pa.scalar(float("nan"), type=pa.float64()))
        out[:, j] = arr.to_numpy(zero_copy_only=False)
    bad = ~np.isfinite(out)
    replaced = int(bad.sum()) if n else 0
    if replaced and counter is not None:
        counter.add(replaced)
    if mask:
        if replaced:
            out[bad] = 0.0
        return out, bad
    return _filled(out, bad, fill) if replaced else out


def matrix_columns(Z: np.ndarray, block_rows: int = 256) -> list[pa.Array]:
    """The columns of a 2-d float array as Arrow arrays.

    One transposed copy made a block of rows at a time (a block's source and
    destination both stay in cache: about 2 ns per value here, against 10 for
    ``np.ascontiguousarray(Z.T)``), then each column is a zero-copy view.
    """
    from sparkpriv.privacy.noise_draws import transposed

    return [pa.array(col) for col in transposed(Z, block_rows)]


def owner_counters(spark, n: int = 3):
    """``n`` accumulators for owner diagnostics (clipped rows, ...), or None.

    Spark Connect has no accumulators; the release then simply has no owner
    diagnostics. The values are never part of a release.
    """
    try:
        sc = spark.sparkContext
        return [sc.accumulator(0) for _ in range(n)]
    except Exception:
        return None


def partition_id() -> int:
    """The id of the partition the calling task is computing."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return int(ctx.partitionId()) if ctx is not None else 0


def map_batches(df, fn: Callable[[Iterator[pa.RecordBatch], int], Iterable[pa.RecordBatch]], schema):
    """``df.mapInArrow`` with ``fn(batches, partition_id)``.

    ``fn`` must be built from plain values (numpy arrays, numbers): it is
    pickled into the task closure.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from fn(batches, partition_id())

    run.__name__ = getattr(fn, "__name__", "sparkpriv_batches")
    return df.mapInArrow(run, schema)


@dataclass(frozen=True)
class BatchMap:
    """A DataFrame defined as ``fn`` over the Arrow batches of ``source``.

    What :func:`map_batches` builds, kept as its parts so that a writer can
    run ``fn`` itself: :func:`sparkpriv.io.writer.publish` writes the part
    files from the Python workers with pyarrow instead of sending every batch
    back through Spark's Arrow -> row -> Parquet path. Both give the same rows
    in the same partitions (``fn`` sees the same batches and partition ids).
    """

    source: Any
    fn: Callable[[Iterator[pa.RecordBatch], int], Iterable[pa.RecordBatch]]
    schema: Any

    def to_df(self):
        return map_batches(self.source, self.fn, self.schema)


def sum_partials(
    df,
    partial: Callable[[Iterator[pa.RecordBatch], int], np.ndarray],
    size: int,
    *,
    fanout: int = 16,
) -> np.ndarray:
    """Sum per-partition float64 vectors of length ``size`` by tree aggregation.

    ``partial(batches, partition_id)`` returns a 1-D float64 array of length
    ``size`` for its partition. The partials are merged in Spark, level by
    level (``fanout`` partials per merge task), until at most ``fanout`` remain;
    those are summed on the driver. The driver never holds more than
    ``fanout * size`` floats.
    """
    from pyspark.sql.types import BinaryType, StructField, StructType

    schema = StructType([StructField("v", BinaryType(), False)])

    def first(batches, pid):
        v = np.ascontiguousarray(partial(batches, pid), dtype=np.float64)
        if v.shape != (size,):
            raise RuntimeError(f"partial has shape {v.shape}, expected ({size},)")
        yield pa.RecordBatch.from_arrays([pa.array([v.tobytes()], pa.binary())], ["v"])

    def merge(batches, pid):
        acc = np.zeros(size, dtype=np.float64)
        for b in batches:
            for buf in b.column(0).to_pylist():
                acc += np.frombuffer(buf, dtype=np.float64)
        yield pa.RecordBatch.from_arrays([pa.array([acc.tobytes()], pa.binary())], ["v"])

    first.__name__ = "sparkpriv_partial"
    merge.__name__ = "sparkpriv_merge"
    parts = map_batches(df, first, schema)
    if has_rdd(df):
        n = max(partition_estimate(df), 1)
        while n > fanout:
            n = -(-n // fanout)
            parts = map_batches(parts.repartition(n), merge, schema)
    else:  # Spark Connect: the partition count is unknown; one merge level into `fanout` tasks
        parts = map_batches(parts.repartition(fanout), merge, schema)
    total = np.zeros(size, dtype=np.float64)
    for row in parts.toLocalIterator():
        total += np.frombuffer(row["v"], dtype=np.float64)
    return total


def partition_estimate(df) -> int:
    """The partition count of ``df`` without running a job (classic Spark).

    ``df.rdd.getNumPartitions()`` is free on a scan, but on a plan with a
    shuffle under adaptive query execution it runs the shuffle's map stage to
    learn the final count (a whole ``groupBy(person)`` pass, run again by the
    job that follows). There the count is at most ``spark.sql.shuffle.partitions``
    (adaptive execution only coalesces), which is what the merge tree needs.
    """
    try:
        plan = df._jdf.queryExecution().executedPlan().toString()  # planned (adaptive: not run)
    except Exception:  # not a classic DataFrame
        plan = ""
    if "Exchange" in plan:
        return int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return df.rdd.getNumPartitions()


def has_rdd(df) -> bool:
    """Whether ``df`` offers the RDD API (classic Spark; not Spark Connect)."""
    try:
        df.rdd  # noqa: B018 - Spark Connect DataFrames have no RDD
        return True
    except Exception:
        return False


@contextlib.contextmanager
def spark_errors():
    """Re-raise a task failure caused by a marked input error as that error.

    The message on the driver is the one the task raised (it names the column),
    without the Java stack trace.
    """
    try:
        yield
    except InputError:
        raise
    except Exception as exc:  # Py4JJavaError, PythonException, SparkConnect errors
        m = _MARK_RE.search(str(exc))
        if m:
            raise InputError(m.group(1)) from None
        raise
