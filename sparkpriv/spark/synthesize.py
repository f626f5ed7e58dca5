"""Synthetic rows of a released DPGM model, generated in parallel on Spark (layer 1).

Partition ``p`` of ``P`` generates its slice of the ``rows`` records (``rows // P``,
plus one for the first ``rows % P`` partitions) in batches of at most
``batch_rows``, batch ``b`` from the keyed streams of ``(seed, p, b)``
(:func:`sparkpriv.mechanisms.dpgm.synthesize_part`): a retried task regenerates
the same rows, and nothing reaches the driver. The seed is a secret of the run:
it is shipped in the task closure only (never a literal of a query plan).
Post-processing of the released model: no data is read and no budget spent.

A model released on event records (``model.events``) can also give its records as
events (:func:`synthetic_events`): one row per synthetic person (``person``,
``items``: the sorted item ids of the person's 0/1 row), or one row per (person,
item) under the source's column names. Synthetic person ids are ``0 .. rows-1``:
partition ``p`` numbers its rows from the slices before it.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from sparkpriv.mechanisms.dpgm import DPGMModel, synthesize_part, synthetic_arrays
from sparkpriv.mechanisms.event_columns import ITEMS, PERSON, exploded_arrays, item_arrays
from sparkpriv.spark.batches import BatchMap

__all__ = ["synthetic_rows", "synthetic_events", "sparse_synthetic_events", "default_partitions", "slice_rows", "first_row", "spark_type",
           "batch_rows_for", "BATCH_ROWS"]

BATCH_ROWS = 65_536  # rows generated (and held) at once by a task
ROWS_PER_PARTITION = 1_000_000  # the default partitioning: at most this many rows per task ...
MIN_PARTITION_ROWS = 10_000  # ... and at least this many, up to the session's parallelism
BATCH_VALUES = 1 << 23  # a model on event records: a batch holds at most this many values (64 MiB)


def batch_rows_for(model: DPGMModel) -> int:
    """The rows of a generation batch: ``BATCH_ROWS``; for a model on event records (a column per
    vocabulary item) at most ``BATCH_VALUES / d`` (at least 1,024). A function of the public model
    only, the same for every layout, so the layouts of one seed hold the same records."""
    if getattr(model, "events", None) is None:
        return BATCH_ROWS
    return int(min(BATCH_ROWS, max(1024, BATCH_VALUES // max(int(model.d), 1))))


def default_partitions(rows: int, parallelism: int) -> int:
    """A public number of partitions (output files) for ``rows`` synthetic rows."""
    rows = int(rows)
    return max(1, math.ceil(rows / ROWS_PER_PARTITION), min(int(parallelism), rows // MIN_PARTITION_ROWS))


def slice_rows(rows: int, partitions: int, pid: int) -> int:
    """The number of rows partition ``pid`` generates (the slices add up to ``rows``)."""
    base, extra = divmod(int(rows), int(partitions))
    return base + (1 if int(pid) < extra else 0)


def first_row(rows: int, partitions: int, pid: int) -> int:
    """The index of partition ``pid``'s first row (the rows of the partitions before it)."""
    base, extra = divmod(int(rows), int(partitions))
    return int(pid) * base + min(int(pid), extra)


def spark_type(t: str):
    """The Spark SQL type of a synthetic column type (``dpgm.SYNTHETIC_TYPES``, ``string``)."""
    from pyspark.sql import types as T

    return {"boolean": T.BooleanType(), "tinyint": T.ByteType(), "smallint": T.ShortType(),
            "int": T.IntegerType(), "bigint": T.LongType(), "float": T.FloatType(), "double": T.DoubleType(),
            "string": T.StringType()}[t]


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


def synthetic_events(spark, model: DPGMModel, rows: int, seed: int, *, partitions: int, explode: bool = False,
                     batch_rows: int | None = None) -> BatchMap:
    """``rows`` synthetic people of a model released on event records (``model.events``) as a
    :class:`~sparkpriv.spark.batches.BatchMap`: one row per person, ``person`` (bigint, ``0 ..
    rows-1``) and ``items`` (array of the item ids in the source item column's type, sorted), or
    with ``explode`` one row per (person, item) under the source's person and item column names
    (a person without items has no row). The records are :func:`synthetic_rows`'s for the same
    ``seed``, ``partitions`` and ``batch_rows`` (default :func:`batch_rows_for`)."""
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    ev = model.events
    if ev is None:
        raise ValueError("the model was not released on event records")
    rows, partitions, seed = int(rows), int(partitions), int(seed)
    batch_rows = batch_rows_for(model) if batch_rows is None else int(batch_rows)
    item_type = spark_type(ev.synthetic_item_type)
    if explode:
        names = [ev.person, ev.item]
        schema = StructType([StructField(ev.person, LongType(), False), StructField(ev.item, item_type, False)])
        arrays = exploded_arrays
    else:
        names = [PERSON, ITEMS]
        schema = StructType([StructField(PERSON, LongType(), False),
                             StructField(ITEMS, ArrayType(item_type, False), False)])
        arrays = item_arrays

    def sparkpriv_synthesize_events(batches, pid):
        for _ in batches:  # the partition's index row: only its partition id matters
            pass
        todo, start = slice_rows(rows, partitions, pid), first_row(rows, partitions, pid)
        b = 0
        while todo > 0:
            m = min(todo, batch_rows)
            X = synthesize_part(model, m, seed, pid, b)
            yield pa.RecordBatch.from_arrays(arrays(X, ev, start), names)
            start += m
            todo -= m
            b += 1

    source = spark.range(0, partitions, 1, numPartitions=partitions)
    return BatchMap(source, sparkpriv_synthesize_events, schema)


def sparse_synthetic_events(spark, model, rows: int, seed: int, *, partitions: int, explode: bool = False,
                            batch_rows: int = BATCH_ROWS) -> BatchMap:
    """``rows`` synthetic people of a :class:`~sparkpriv.mechanisms.synthetic.SyntheticModel` released on
    event records, as :func:`synthetic_events` lays them out (``person``, ``items``; or with ``explode``
    one row per (person, item) under the source's names). Partition ``p``'s batch ``b`` is
    ``model.sample_sparse(m, seed, p, b)``: sparse end to end (a person costs their items, not ``d``)."""
    from pyspark.sql.types import ArrayType, LongType, StructField, StructType

    ev = model.events
    if ev is None:
        raise ValueError("the model was not released on event records")
    rows, partitions, seed, batch_rows = int(rows), int(partitions), int(seed), int(batch_rows)
    item_type = spark_type(ev.synthetic_item_type)
    if explode:
        names = [ev.person, ev.item]
        schema = StructType([StructField(ev.person, LongType(), False), StructField(ev.item, item_type, False)])
        arrays = exploded_arrays
    else:
        names = [PERSON, ITEMS]
        schema = StructType([StructField(PERSON, LongType(), False),
                             StructField(ITEMS, ArrayType(item_type, False), False)])
        arrays = item_arrays

    def sparkpriv_synthesize_items(batches, pid):
        for _ in batches:  # the partition's index row: only its partition id matters
            pass
        todo, start = slice_rows(rows, partitions, pid), first_row(rows, partitions, pid)
        b = 0
        while todo > 0:
            m = min(todo, batch_rows)
            yield pa.RecordBatch.from_arrays(arrays(model.sample_sparse(m, seed, pid, b), ev, start), names)
            start += m
            todo -= m
            b += 1

    source = spark.range(0, partitions, 1, numPartitions=partitions)
    return BatchMap(source, sparkpriv_synthesize_items, schema)
