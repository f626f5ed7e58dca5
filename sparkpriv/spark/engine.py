"""The Spark engine (layer 1): the engine interface over Spark DataFrames.

A mechanism's per-block functions (:mod:`sparkpriv.mechanisms.protocol`) run in
the Python workers over Arrow batches; only merged partials reach the driver:

* ``aggregate(source, fn, size)``: ``fn(block) -> vector`` summed per partition
  and merged by tree aggregation (:func:`~sparkpriv.spark.batches.sum_partials`),
  or over Parquet row groups the workers read themselves when the source is a
  direct scan (:mod:`sparkpriv.spark.parquet_scan`);
* ``cache(source, fn, dim)``: ``fn(block) -> (rows, dim)`` feature blocks
  computed once and cached as raw float64 bytes, one record per batch (in a
  serialized RDD on classic Spark: the cheapest form that survives the
  iterations of an iterative mechanism, docs/kmeans.md; a cached DataFrame of
  blocks under Spark Connect), then ``cache.aggregate(fn2, size)`` per pass;
* ``map_rows(source, row_map, columns, keep=)``: a row-level output, one output
  batch per input batch, the row map opening its keyed noise stream from the
  partition id (a retried task reproduces the same noise);
* ``table(rows, schema)``: a small output table (one partition).

Blocks are ``(n, d)`` float64 matrices of the declared columns
(:func:`~sparkpriv.spark.batches.batch_matrix`: nulls filled or refused, naming
the column) for a table source, and
:class:`~sparkpriv.mechanisms.protocol.SparseRows` for bounded event records
(:func:`~sparkpriv.spark.events.bound_contributions`).

Closures are built from plain values (numpy arrays, numbers, accumulators): they
are pickled into the task binary; secrets never appear in a query plan.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from sparkpriv.mechanisms.protocol import InputFacts, SparseRows
from sparkpriv.spark.batches import batch_matrix, has_rdd, map_batches, owner_counters, spark_errors, sum_partials
from sparkpriv.spark.events import BoundedRecords, counters_dict, make_counters
from sparkpriv.spark.parquet_scan import aggregate as scan_aggregate
from sparkpriv.spark.parquet_scan import parquet_scan, scan_rdd
from sparkpriv.spark.schema import check_numeric_columns, schema_fingerprint

__all__ = ["SparkEngine", "TableSource", "RecordsSource", "accepts"]

_log = logging.getLogger(__name__)


def accepts(data: Any) -> bool:
    """True for the inputs this engine takes: Spark DataFrames and bounded event records."""
    if isinstance(data, BoundedRecords):
        return True
    mod = type(data).__module__
    return mod.startswith("pyspark.")


@dataclass
class TableSource:
    """One row per record: declared numeric columns of a DataFrame."""

    df: Any = field(repr=False)
    columns: tuple
    fill: float | None
    kind: str = "table"

    @property
    def facts(self) -> InputFacts:
        return InputFacts("table", len(self.columns), self.columns, names=tuple(self.df.columns))

    @property
    def spark(self):
        return self.df.sparkSession

    @property
    def source_df(self):
        """The input, for the writers' empty-input check (row-level outputs have no rows then)."""
        return self.df

    def public_params(self) -> dict:
        return {"columns": list(self.columns)}

    def input_info(self, source: str | None) -> dict:
        return {"source": source, "schema_fingerprint": schema_fingerprint(self.df.schema),
                "columns": list(self.columns), "fill_for_nulls": self.fill}

    def diagnostics(self) -> dict:
        return {}

    def batch_fn(self, fn):
        """Per-partition ``(batches, pid) -> iterator of fn(block)`` over this source's blocks."""
        columns, fill = list(self.columns), self.fill

        def blocks(batches):
            for batch in batches:
                yield fn(batch_matrix(batch, columns, fill=fill))

        return blocks


@dataclass
class RecordsSource:
    """Bounded person records of an event table (sparse, capped; public bounds from the cap)."""

    records: BoundedRecords = field(repr=False)
    counters: Any = field(default=None, repr=False)
    kind: str = "records"

    @property
    def facts(self) -> InputFacts:
        cap = self.records.cap
        return InputFacts("records", self.records.d, (), cap.value_cap, cap.l2_bound)

    @property
    def spark(self):
        return self.records.grouped.sparkSession

    @property
    def source_df(self):
        return self.records.events

    def public_params(self) -> dict:
        return {"input": "event table (bounded person records)", **self.records.to_public_dict()}

    def input_info(self, source: str | None) -> dict:
        return dict(self.records.input_info, source=source or self.records.input_info.get("source"))

    def diagnostics(self) -> dict:
        return counters_dict(self.counters)

    def batch_fn(self, fn, *, counted: bool = True):
        bound = self.records.record_fn(self.counters if counted else None)
        d = self.records.d

        def blocks(batches):
            for batch in batches:
                yield fn(SparseRows(*bound(batch), d))

        return blocks


def _block(Z: np.ndarray) -> pa.RecordBatch:
    """One cached block record: the ``(rows, dim)`` float64 matrix as raw bytes, and its row count."""
    return pa.RecordBatch.from_arrays([pa.array([np.ascontiguousarray(Z, dtype=np.float64).tobytes()],
                                                pa.binary()),
                                       pa.array([Z.shape[0]], pa.int64())], ["z", "rows"])


def _blocks_schema():
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    return StructType([StructField("z", BinaryType(), False), StructField("rows", LongType(), False)])


def _block_bytes(row):
    return row[0]


def _record_batch_bytes(block):
    return block.column(0)[0].as_py()


def _add_vectors(a, b):
    return a + b


class _Cache:
    """Feature blocks cached once for every pass of an iterative mechanism."""

    def __init__(self, dim: int, *, rdd=None, df=None):
        from pyspark import StorageLevel

        self.dim = dim
        self.rdd = self.df = None
        if rdd is not None:
            self.rdd = rdd.persist(StorageLevel.MEMORY_AND_DISK)
            with spark_errors():
                self.rows = int(self.rdd.map(len).sum()) // (8 * dim) if dim else 0
        else:
            self.df = df.persist(StorageLevel.MEMORY_AND_DISK)
            with spark_errors():
                self.rows = int(self.df.agg({"rows": "sum"}).collect()[0][0] or 0)

    def aggregate(self, fn, size: int) -> np.ndarray:
        dim = self.dim
        if self.rdd is not None:
            def sparkpriv_cached_pass(blocks):
                acc = np.zeros(size, dtype=np.float64)
                for buf in blocks:
                    acc += fn(np.frombuffer(buf, dtype=np.float64).reshape(-1, dim))
                yield acc

            with spark_errors():
                return self.rdd.mapPartitions(sparkpriv_cached_pass).treeReduce(_add_vectors, depth=2)

        def sparkpriv_cached_pass_df(batches, pid):
            acc = np.zeros(size, dtype=np.float64)
            for b in batches:
                col = b.column(0)
                for i in range(b.num_rows):  # one iteration per cached block, not per row
                    acc += fn(np.frombuffer(col[i].as_buffer(), dtype=np.float64).reshape(-1, dim))
            return acc

        with spark_errors():
            return sum_partials(self.df, sparkpriv_cached_pass_df, size)

    def release(self) -> None:
        (self.rdd if self.rdd is not None else self.df).unpersist()


class SparkEngine:
    """The engine interface (docs/architecture.md) over Spark DataFrames."""

    name = "spark"

    def open(self, data, *, columns: Sequence[str] | None, fill: float | None, caller: str):
        from sparkpriv.errors import ParameterError

        if isinstance(data, BoundedRecords):
            self._spark = data.grouped.sparkSession
            return RecordsSource(data, make_counters(self._spark))
        self._spark = data.sparkSession
        if columns is None:
            raise ParameterError(f"The 'columns' parameter of {caller} is required for a table input: "
                                 "the numeric feature columns (--columns).")
        columns = tuple(columns)
        check_numeric_columns(data, columns)
        return TableSource(data, columns, fill)

    def __init__(self) -> None:
        self._spark = None  # the session of the opened source

    def counters(self, names: Sequence[str]):
        """Accumulators for owner diagnostics (None under Spark Connect: no diagnostics)."""
        return owner_counters(self._spark, len(names))

    def aggregate(self, source, fn, size: int) -> np.ndarray:
        def sparkpriv_partial(batches, pid):
            acc = np.zeros(size, dtype=np.float64)
            for v in blocks(batches):
                acc += v
            return acc

        with spark_errors():
            if source.kind == "records":
                blocks = source.batch_fn(fn, counted=False)
                return sum_partials(source.records.grouped, sparkpriv_partial, size)
            blocks = source.batch_fn(fn)
            return scan_aggregate(source.df, list(source.columns), sparkpriv_partial, size)

    def cache(self, source, fn, dim: int) -> _Cache:
        def sparkpriv_features(batches, pid):
            for Z in blocks(batches):
                yield _block(Z)

        blocks = source.batch_fn(fn)
        if source.kind == "table":
            scan = parquet_scan(source.df, list(source.columns))
            if scan is not None:  # local Parquet from read_table: the workers read the row groups
                _log.info("features: direct Arrow scan of %d Parquet row group(s)", len(scan.pieces))
                rdd = scan_rdd(source.spark, scan, list(source.columns), sparkpriv_features)
                return _Cache(dim, rdd=rdd.map(_record_batch_bytes))
            frame = source.df.select(*source.columns)
        else:
            frame = source.records.grouped
        blocks_df = map_batches(frame, sparkpriv_features, _blocks_schema())
        if has_rdd(blocks_df):
            return _Cache(dim, rdd=blocks_df.rdd.map(_block_bytes))
        return _Cache(dim, df=blocks_df)

    def map_rows(self, source, row_map, columns: Sequence[tuple], *, keep: Sequence[str] = ()):
        """A row-level output: ``row_map(pid, blocks)`` yields one list of output columns per block.

        ``row_map`` is a generator function built from plain values: it gets
        the partition id (open the keyed noise stream ``stream(seed, stage,
        pid)`` from it, so a retried task reproduces the same noise) and an
        iterator of blocks, and yields, for each block in order, the output
        columns (1-D arrays of the block's length). ``columns`` is the output
        schema ``(name, type, nullable)``; ``keep`` names input columns copied
        unchanged in front (declared public). Returns ``(df, rows)``: the lazy
        DataFrame and the :class:`~sparkpriv.spark.batches.BatchMap` the
        Arrow writer runs in the Python tasks. Event records are read in the
        keyed person layout (``BoundedRecords.layout``, in ``_pk`` order).
        """
        from pyspark.sql.types import StructField, StructType

        from sparkpriv.spark.batches import BatchMap
        from sparkpriv.spark.events import in_person_hash_order

        keep = list(keep)
        kept = [source.df.schema[c] for c in keep]
        out = StructType(kept + [StructField(n, self._type(t), nb) for n, t, nb in columns])
        names = keep + [n for n, _, _ in columns]
        if source.kind == "records":
            bound = source.records.record_fn(source.counters)
            d = source.records.d
            frame = source.records.layout

            def decode_all(batches):
                for b in in_person_hash_order(batches):
                    yield b, SparseRows(*bound(b), d)
        else:
            cols, fill = list(source.columns), source.fill
            frame = source.df.select(*keep, *[c for c in cols if c not in keep])

            def decode_all(batches):
                for b in batches:
                    yield b, batch_matrix(b, cols, fill=fill)

        def sparkpriv_rows(batches, pid):
            current = []

            def blocks():
                for b, block in decode_all(batches):
                    current[:] = [b]
                    yield block

            for outcols in row_map(pid, blocks()):
                b = current[0]
                arrays = [b.column(c) for c in keep] + [pa.array(c) for c in outcols]
                yield pa.RecordBatch.from_arrays(arrays, names)

        rows = BatchMap(frame, sparkpriv_rows, out)
        return rows.to_df(), rows

    @staticmethod
    def _type(t: str):
        from pyspark.sql.types import ArrayType, BooleanType, DoubleType, IntegerType, LongType, StringType

        return {"int": IntegerType(), "long": LongType(), "double": DoubleType(), "bool": BooleanType(),
                "array<double>": ArrayType(DoubleType(), False), "array<int>": ArrayType(IntegerType(), False),
                "string": StringType()}[t]

    def table(self, rows: list[tuple], schema: Sequence[tuple]):
        from pyspark.sql.types import StructField, StructType

        st = StructType([StructField(n, self._type(t), nullable) for n, t, nullable in schema])
        return self._spark.createDataFrame(rows, st).coalesce(1)

    @staticmethod
    def schema_of(table) -> list[dict]:
        return [{"name": f.name, "type": f.dataType.simpleString()} for f in table.schema.fields]
