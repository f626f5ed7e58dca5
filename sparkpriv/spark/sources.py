"""The Spark engine's inputs (:class:`TableSource`, :class:`RecordsSource`) and what it keeps between
passes: feature blocks cached once (:class:`_Cache`) and a table numbered in table order (:class:`_Indexed`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from sparkpriv.local.engine import label_codes, missing_values_rule
from sparkpriv.mechanisms.protocol import InputFacts, SparseRows, TableRows
from sparkpriv.mechanisms.sparse import rows_count_of_bytes, rows_from_bytes
from sparkpriv.spark.batches import _marked, batch_matrix, map_batches, spark_errors, sum_partials
from sparkpriv.spark.events import BoundedRecords, counters_dict
from sparkpriv.spark.schema import schema_fingerprint


@dataclass
class TableSource:
    """One row per record: declared numeric columns of a DataFrame.

    ``input`` is what the caller gave: the DataFrame itself, or a
    :class:`~sparkpriv.spark.parquet_scan.ParquetInput` (``read_table(...,
    reader="arrow")``), whose passes the Python workers read from the Parquet
    row groups themselves; ``df`` is the DataFrame of that read.
    """

    df: Any = field(repr=False)
    columns: tuple
    fill: float | None
    kind: str = "table"
    labels: tuple | None = None  # (label column, declared classes coerced to its type)
    missing: bool = False  # blocks are TableRows with the null mask (nulls 0.0)
    keep: tuple = ()
    input: Any = field(default=None, repr=False)
    replaced: Any = field(default=None, repr=False)  # accumulator: nulls, NaN, inf replaced (owner)
    replaced_pass: bool = field(default=True, repr=False)  # the next pass built counts them (the first)

    def __post_init__(self):
        if self.input is None:
            self.input = self.df

    @property
    def facts(self) -> InputFacts:
        from pyspark.sql.types import IntegralType

        ints = tuple(j for j, c in enumerate(self.columns) if isinstance(self.df.schema[c].dataType, IntegralType))
        return InputFacts("table", len(self.columns), self.columns, integer_columns=ints,
                          classes=self.labels[1] if self.labels else (), names=tuple(self.df.columns),
                          types=tuple(self.df.schema[c].dataType.simpleString() for c in self.columns))

    @property
    def read_columns(self) -> list:
        """The input columns a block is made of (the declared ones, then the label column)."""
        return list(self.columns) + ([self.labels[0]] if self.labels else [])

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
        info = {"source": source, "schema_fingerprint": schema_fingerprint(self.df.schema),
                "columns": list(self.columns), "fill_for_nulls": self.fill,
                "missing_values": missing_values_rule(self.fill, self.missing)}
        if self.labels is not None:
            info["label"] = self.labels[0]
        if self.keep:
            info["kept_public_columns"] = list(self.keep)
        return info

    def diagnostics(self) -> dict:
        v = self.replaced.value if self.replaced is not None else 0
        return {"missing_values_replaced": v} if v else {}

    def block_fn(self):
        """``batch -> block`` (a matrix, or :class:`TableRows` when labels or the null mask were
        asked for), built from plain values (it is pickled into the tasks)."""
        columns, fill, labels, missing = list(self.columns), self.fill, self.labels, self.missing
        counter, self.replaced_pass = (self.replaced, False) if self.replaced_pass else (None, False)  # first pass only
        if labels is None and not missing:
            return lambda batch: batch_matrix(batch, columns, fill=fill, counter=counter)

        def block(batch):
            if missing:
                X, miss = batch_matrix(batch, columns, counter=counter, mask=True)
            else:
                X, miss = batch_matrix(batch, columns, fill=fill, counter=counter), None
            codes = None if labels is None else label_codes(batch.column(labels[0]), labels[1], labels[0], _marked)
            return TableRows(X, codes, miss)

        return block

    def batch_fn(self, fn):
        """Per-partition ``(batches, pid) -> iterator of fn(block)`` over this source's blocks."""
        block = self.block_fn()

        def blocks(batches):
            for batch in batches:
                yield fn(block(batch))

        return blocks


@dataclass
class RecordsSource:
    """Bounded person records of an event table (sparse, capped; public bounds from the cap)."""

    records: BoundedRecords = field(repr=False)
    counters: Any = field(default=None, repr=False)
    kind: str = "records"

    @property
    def facts(self) -> InputFacts:
        from sparkpriv.mechanisms.event_columns import EventColumns

        cap = self.records.cap
        return InputFacts("records", self.records.d, (), cap.value_cap, cap.l2_bound,
                          events=EventColumns.from_records(self.records),
                          length_histogram=self.records.auto is not None)

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

    @property
    def auto_cap(self):
        """The records' :class:`~sparkpriv.mechanisms.auto_bound.AutoCap` (``max_items='auto'``), or None."""
        return self.records.auto

    def set_max_items(self, max_items: int) -> None:
        self.records.set_max_items(max_items)

    def batch_fn(self, fn, *, counted: bool = True):
        bound = self.records.record_fn(self.counters if counted else None)
        d = self.records.d

        def blocks(batches):
            for batch in batches:
                yield fn(SparseRows(*bound(batch), d))

        return blocks


CACHE_BLOCK_BYTES = 8 << 20  # the largest cached feature record (bytes)


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
    """Feature blocks cached once for every pass of an iterative mechanism: ``(rows, dim)``
    float64 matrices as raw bytes, or (``sparse``) blocks of sparse records
    (:func:`~sparkpriv.mechanisms.sparse.rows_to_bytes`), which ``aggregate`` gives to ``fn`` as
    :class:`SparseRows`."""

    def __init__(self, dim: int, *, rdd=None, df=None, sparse: bool = False):
        from pyspark import StorageLevel

        self.dim = dim
        self.sparse = sparse
        self.rdd = self.df = None
        if rdd is not None:
            self.rdd = rdd.persist(StorageLevel.MEMORY_AND_DISK)
            with spark_errors():
                if sparse:
                    self.rows = int(self.rdd.map(rows_count_of_bytes).sum())
                else:
                    self.rows = int(self.rdd.map(len).sum()) // (8 * dim) if dim else 0
        else:
            self.df = df.persist(StorageLevel.MEMORY_AND_DISK)
            with spark_errors():
                self.rows = int(self.df.agg({"rows": "sum"}).collect()[0][0] or 0)

    def aggregate(self, fn, size: int) -> np.ndarray:
        dim = self.dim
        sparse = self.sparse

        def decode(buf):
            if sparse:
                return rows_from_bytes(buf)
            return np.frombuffer(buf, dtype=np.float64).reshape(-1, dim)

        if self.rdd is not None:
            def sparkpriv_cached_pass(blocks):
                acc = np.zeros(size, dtype=np.float64)
                for buf in blocks:
                    acc += fn(decode(buf))
                yield acc

            with spark_errors():
                return self.rdd.mapPartitions(sparkpriv_cached_pass).treeReduce(_add_vectors, depth=2)

        def sparkpriv_cached_pass_df(batches, pid):
            acc = np.zeros(size, dtype=np.float64)
            for b in batches:
                col = b.column(0)
                for i in range(b.num_rows):  # one iteration per cached block, not per row
                    acc += fn(decode(col[i].as_buffer()))
            return acc

        with spark_errors():
            return sum_partials(self.df, sparkpriv_cached_pass_df, size)

    def release(self) -> None:
        (self.rdd if self.rdd is not None else self.df).unpersist()


def _jvm_partition_counts(frame):
    """Rows per partition of ``frame``, counted in the JVM (no column goes to Python; a Parquet
    scan reads none), when its plan has no shuffle: its partitions are then its scan's, the
    same whatever columns are selected. None otherwise (or without a JVM: Spark Connect), and
    the count runs in the Python tasks over the same frame as the data pass. The data pass
    checks every partition's count either way."""
    try:
        plan = frame._jdf.queryExecution().executedPlan()
        leaves = plan.collectLeaves()
        scans = all(leaves.apply(i).getClass().getName().endswith("FileSourceScanExec")
                    for i in range(leaves.size()))
        text = plan.toString()
    except Exception:
        return None
    # file scans only: a local relation's projection is evaluated on the driver (every row in
    # partition 0), and a shuffle's partitions may depend on the columns (adaptive coalescing)
    if not scans or "Exchange" in text or "ShuffleRead" in text:
        return None
    from pyspark.sql import functions as F

    return frame.select(F.spark_partition_id().alias("pid")).groupBy("pid").agg(
        F.count(F.lit(1)).alias("rows")).collect()


class _Indexed:
    """Rows numbered in table order (:meth:`SparkEngine.index`): a count pass gives each partition
    its offset; every task checks it reads as many rows as counted (else the input is not
    deterministic between the passes: cache or checkpoint it), so no index is used twice."""

    def __init__(self, source: TableSource):
        from pyspark.sql.types import LongType, StructField, StructType

        self.frame = source.df.select(*source.columns)
        self.columns, self.fill = list(source.columns), source.fill
        self.counter, source.replaced_pass = (source.replaced, False) if source.replaced_pass else (None, False)
        schema = StructType([StructField("pid", LongType(), False), StructField("rows", LongType(), False)])

        def sparkpriv_count(batches, pid):
            rows = 0
            for b in batches:
                rows += b.num_rows
            yield pa.RecordBatch.from_arrays([pa.array([pid], pa.int64()), pa.array([rows], pa.int64())],
                                             ["pid", "rows"])

        with spark_errors():
            got = _jvm_partition_counts(self.frame)
            if got is None:
                got = map_batches(self.frame, sparkpriv_count, schema).collect()
        counts = np.zeros(max((int(r["pid"]) for r in got), default=-1) + 1, dtype=np.int64)
        for r in got:
            counts[int(r["pid"])] += int(r["rows"])
        self.counts = counts
        self.offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.rows = int(counts.sum())

    def aggregate(self, fn, size: int) -> np.ndarray:
        from sparkpriv.spark.batches import _marked

        columns, fill, offsets, counts, counter = self.columns, self.fill, self.offsets, self.counts, self.counter
        self.counter = None  # the first pass counts the replaced values
        changed = ("the input changed between the count pass and the data pass; cache or checkpoint a "
                   "non-deterministic input before the release")

        def sparkpriv_indexed_partial(batches, pid):
            acc = np.zeros(size, dtype=np.float64)
            pos = 0
            for b in batches:
                if b.num_rows == 0:
                    continue
                if pid >= counts.size or pos + b.num_rows > counts[pid]:
                    raise _marked(changed)
                acc += fn(batch_matrix(b, columns, fill=fill, counter=counter), int(offsets[pid]) + pos)
                pos += b.num_rows
            if pid < counts.size and pos != counts[pid]:
                raise _marked(changed)
            return acc

        with spark_errors():
            return sum_partials(self.frame, sparkpriv_indexed_partial, size)
