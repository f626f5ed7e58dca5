"""Synthetic rows of a released DPGM model, generated in parallel on Spark (layer 1).

Partition ``p`` of ``P`` generates its slice of the ``rows`` records (``rows // P``,
plus one for the first ``rows % P`` partitions) in batches of at most
``batch_rows``, batch ``b`` from the keyed streams of ``(seed, p, b)``
(:func:`sparkpriv.mechanisms.dpgm.synthesize_part`): a retried task regenerates
the same rows, and nothing reaches the driver. The seed is a secret of the run:
it is shipped in the task closure only (never a literal of a query plan).
Post-processing of the released model: no data is read and no budget spent.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from sparkpriv.mechanisms.dpgm import DPGMModel, synthesize_part, synthetic_arrays
from sparkpriv.spark.batches import BatchMap

__all__ = ["synthetic_rows", "default_partitions", "slice_rows", "spark_type", "BATCH_ROWS"]

BATCH_ROWS = 65_536  # rows generated (and held) at once by a task
ROWS_PER_PARTITION = 1_000_000  # the default partitioning: at most this many rows per task ...
MIN_PARTITION_ROWS = 10_000  # ... and at least this many, up to the session's parallelism


def default_partitions(rows: int, parallelism: int) -> int:
    """A public number of partitions (output files) for ``rows`` synthetic rows."""
    rows = int(rows)
    return max(1, math.ceil(rows / ROWS_PER_PARTITION), min(int(parallelism), rows // MIN_PARTITION_ROWS))


def slice_rows(rows: int, partitions: int, pid: int) -> int:
    """The number of rows partition ``pid`` generates (the slices add up to ``rows``)."""
    base, extra = divmod(int(rows), int(partitions))
    return base + (1 if int(pid) < extra else 0)


def spark_type(t: str):
    """The Spark SQL type of a synthetic column type (``dpgm.SYNTHETIC_TYPES``)."""
    from pyspark.sql import types as T

    return {"boolean": T.BooleanType(), "tinyint": T.ByteType(), "smallint": T.ShortType(),
            "int": T.IntegerType(), "bigint": T.LongType(), "float": T.FloatType(), "double": T.DoubleType()}[t]


def synthetic_rows(spark, model: DPGMModel, rows: int, seed: int, columns, *, partitions: int,
                   batch_rows: int = BATCH_ROWS) -> BatchMap:
    """``rows`` synthetic records of ``model`` as a :class:`~sparkpriv.spark.batches.BatchMap`
    over ``partitions`` one-row partitions (the Arrow writer runs it in the Python tasks);
    one column per name in ``columns`` (``model.d`` of them) in the model's column type
    (``model.types``: the source's integer, boolean, float or double; values from ``[0, 1]``,
    rounded for integers and booleans)."""
    from pyspark.sql.types import StructField, StructType

    columns = [str(c) for c in columns]
    if len(columns) != model.d:
        raise ValueError(f"{len(columns)} column names for a model of {model.d} columns")
    rows, partitions, batch_rows, seed = int(rows), int(partitions), int(batch_rows), int(seed)
    types = list(model.types)
    schema = StructType([StructField(c, spark_type(t), False) for c, t in zip(columns, types)])

    def sparkpriv_synthesize(batches, pid):
        for _ in batches:  # the partition's index row: only its partition id matters
            pass
        todo = slice_rows(rows, partitions, pid)
        b = 0
        while todo > 0:
            m = min(todo, batch_rows)
            X = np.ascontiguousarray(synthesize_part(model, m, seed, pid, b))
            yield pa.RecordBatch.from_arrays(synthetic_arrays(X, types), columns)
            todo -= m
            b += 1

    source = spark.range(0, partitions, 1, numPartitions=partitions)
    return BatchMap(source, sparkpriv_synthesize, schema)
