"""A direct Arrow scan of Parquet files for the aggregate passes (sufficient statistics).

An aggregate pass (DPRP's Gram matrix and DP column means; k-means' feature
cache and final input-space sums) needs nothing from Spark SQL but the rows
of a few numeric columns. When the input is a Parquet dataset read by
:func:`sparkpriv.io.inputs.read_table` and not transformed since, the Python
workers can read its row groups themselves with ``pyarrow.parquet``, which
skips Spark's columnar -> row -> Arrow conversion (the dominant cost of a
``mapInArrow`` pass over a wide numeric table, measured in docs/dprp.md).
The pass is still a Spark job: one task per group of row groups, per-partition
partials merged by tree aggregation, nothing but the ``size``-vector reaching
the driver.

The scan is used only when all of these hold, else the caller falls back to
``mapInArrow`` (:func:`sparkpriv.spark.batches.sum_partials`):

* the DataFrame object is one that ``read_table`` returned for a Parquet
  source (any transformation -- filter, select, join -- gives a new object that
  is not registered, so the scan never ignores a filter);
* classic Spark (the RDD API; not Spark Connect);
* every input file is on a ``file:`` path (a local or shared POSIX filesystem
  that the executors see at the same path; ``hdfs:``/``s3a:`` keep Spark's
  reader and its Hadoop configuration);
* every requested column is a physical column of the files (of at least one;
  it reads as nulls where missing, as in Spark) with an integer or floating
  type in each (a label column may also be a string): not a partition
  directory column, and spelled exactly as in the files.

Semantics match Spark's reader for such columns: the same files
(``DataFrame.inputFiles()``), the same values converted to float64 by the same
batch functions, and a column missing from one file reads as nulls.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import unquote, urlparse

import numpy as np

__all__ = ["register_parquet_source", "parquet_scan", "ParquetScan", "scan_partials", "aggregate",
           "scan_rdd"]

_log = logging.getLogger(__name__)

_SOURCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BATCH_ROWS = 65_536
_MAX_TASKS = 4096


def register_parquet_source(df, source: str) -> None:
    """Mark ``df`` (exactly this object, untransformed) as a Parquet read of ``source``."""
    try:
        _SOURCES[df] = source
    except TypeError:  # not weak-referenceable: no direct scan
        pass


@dataclass(frozen=True)
class ParquetScan:
    """Row groups to read: ``(local path, row group index)`` pairs, in file order."""

    pieces: tuple


def _local_path(uri: str) -> str | None:
    u = urlparse(uri)
    if u.scheme not in ("file", ""):
        return None
    return unquote(u.path)


def parquet_scan(df, columns: Sequence[str], *, strings: Sequence[str] = ()) -> ParquetScan | None:
    """A direct scan of ``columns`` of ``df``, or None when it does not apply (module doc)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkpriv.spark.batches import has_rdd

    if df not in _SOURCES or not has_rdd(df):
        return None
    try:
        paths = [_local_path(u) for u in df.inputFiles()]
        if not paths or any(p is None for p in paths):
            return None
        pieces, types = [], {}
        for p in paths:
            meta = pq.read_metadata(p)
            for field in meta.schema.to_arrow_schema():
                types.setdefault(field.name, []).append(field.type)
            pieces += [(p, g) for g in range(meta.num_row_groups)]
        for c in columns:
            if c not in types:  # a partition column, or spelled differently than in the files
                return None
            for t in types[c]:
                ok = pa.types.is_integer(t) or pa.types.is_floating(t)
                if c in strings:
                    ok = ok or pa.types.is_string(t) or pa.types.is_large_string(t)
                if not ok:
                    return None
    except Exception as exc:  # unreadable footer etc.: let Spark's reader report it
        _log.debug("direct Parquet scan not used: %s", exc)
        return None
    return ParquetScan(tuple(pieces))


def _read_pieces(pieces, columns):
    """Arrow record batches of ``columns`` from row groups; missing columns read as nulls."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path, group in pieces:
        f = pq.ParquetFile(path)
        have = [c for c in columns if c in f.schema_arrow.names]
        for b in f.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], columns=have,
                                use_threads=False):
            if len(have) < len(columns):
                arrays = [b.column(c) if c in have else pa.nulls(b.num_rows, pa.float64())
                          for c in columns]
                b = pa.RecordBatch.from_arrays(arrays, list(columns))
            yield b


def aggregate(df, columns: Sequence[str], partial, size: int, *, strings: Sequence[str] = ()) -> np.ndarray:
    """Sum a per-partition ``partial(batches, index)`` over ``columns`` of ``df``: a direct
    scan when :func:`parquet_scan` applies, else ``mapInArrow`` + tree aggregation
    (:func:`~sparkpriv.spark.batches.sum_partials`)."""
    from sparkpriv.spark.batches import sum_partials

    scan = parquet_scan(df, columns, strings=strings)
    if scan is not None:
        _log.info("aggregate pass: direct Arrow scan of %d Parquet row group(s)", len(scan.pieces))
        return scan_partials(df.sparkSession, scan, columns, partial, size)
    return sum_partials(df.select(*columns), partial, size)


def scan_rdd(spark, scan: ParquetScan, columns: Sequence[str], fn):
    """An RDD of whatever ``fn(batches, index)`` yields per task, over the scan's row groups."""
    columns = list(columns)
    pieces = list(scan.pieces)

    def sparkpriv_scan(index, items):
        yield from fn(_read_pieces(list(items), columns), index)

    return spark.sparkContext.parallelize(pieces, max(min(len(pieces), _MAX_TASKS), 1)).mapPartitionsWithIndex(
        sparkpriv_scan)


def scan_partials(spark, scan: ParquetScan, columns: Sequence[str], partial, size: int) -> np.ndarray:
    """Like :func:`~sparkpriv.spark.batches.sum_partials`, over the scan's row groups."""
    columns = list(columns)
    pieces = list(scan.pieces)
    if not pieces:
        return partial(iter(()), 0)
    n_tasks = min(len(pieces), _MAX_TASKS)

    def sparkpriv_scan_partial(index, items):
        v = np.ascontiguousarray(partial(_read_pieces(list(items), columns), index), dtype=np.float64)
        if v.shape != (size,):
            raise RuntimeError(f"partial has shape {v.shape}, expected ({size},)")
        yield v

    rdd = spark.sparkContext.parallelize(pieces, n_tasks)
    return rdd.mapPartitionsWithIndex(sparkpriv_scan_partial).treeReduce(_add, depth=2)


def _add(a, b):
    return a + b
