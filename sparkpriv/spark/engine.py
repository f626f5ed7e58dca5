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
* ``key_blocks(source, block_fn, d, block, columns)``: a table over a public
  index domain too large for the driver, from the records' per-index totals
  (one JVM aggregation), one ``block_fn`` call per block of indices in the
  tasks (keyed by the block, not the partition);
* ``table(rows, schema)``, ``columns_table(columns)``: a small output table (one
  partition), from rows or from numpy columns through Arrow.

Blocks are ``(n, d)`` float64 matrices of the declared columns
(:func:`~sparkpriv.spark.batches.batch_matrix`: nulls filled or refused, naming
the column) for a table source, and
:class:`~sparkpriv.mechanisms.protocol.SparseRows` for bounded event records
(:func:`~sparkpriv.spark.events.bound_contributions`).

The sources (:class:`~sparkpriv.spark.sources.TableSource`,
:class:`~sparkpriv.spark.sources.RecordsSource`), the cached blocks and the
numbered table live in :mod:`sparkpriv.spark.sources`.

Closures are built from plain values (numpy arrays, numbers, accumulators): they
are pickled into the task binary; secrets never appear in a query plan.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from sparkpriv.local.engine import coerce_classes
from sparkpriv.mechanisms.protocol import SparseRows
from sparkpriv.mechanisms.sparse import rows_from_bytes, rows_to_bytes, stack_csr, take_rows
from sparkpriv.spark.batches import has_rdd, map_batches, owner_counters, spark_errors, sum_partials
from sparkpriv.spark.events import BoundedRecords, make_counters
from sparkpriv.spark.parquet_scan import ParquetInput, dataframe_of, parquet_scan, scan_rdd
from sparkpriv.spark.parquet_scan import aggregate as scan_aggregate
from sparkpriv.spark.parquet_scan import row_map as scan_row_map
from sparkpriv.spark.schema import check_numeric_columns
from sparkpriv.spark.sources import (TableSource, RecordsSource, CACHE_BLOCK_BYTES, _block, _blocks_schema,
                                     _block_bytes, _record_batch_bytes, _Cache, _Indexed)

__all__ = ["SparkEngine", "TableSource", "RecordsSource", "accepts"]

_log = logging.getLogger(__name__)

BOUNDING = "event bounding"  # the progress steps of the pass that bounds event records


def accepts(data: Any) -> bool:
    """True for the inputs this engine takes: Spark DataFrames and bounded event records."""
    if isinstance(data, (BoundedRecords, ParquetInput)):
        return True
    mod = type(data).__module__
    return mod.startswith("pyspark.")


def _out_array(batch, name: str, kind: str, values, label):
    """One output column of ``map_rows`` as Arrow (``as-input``/``label`` typed from the batch)."""
    if isinstance(values, pa.Array):
        return values
    if kind == "label":
        t = batch.column(label[0]).type
        return pa.array(list(label[1])).cast(t).take(pa.array(np.asarray(values, np.int64)))
    if kind == "as-input":
        t = batch.column(name).type
        if pa.types.is_integer(t):
            return pa.array(np.asarray(values).astype(np.int64)).cast(t)
        if pa.types.is_float32(t):
            return pa.array(values).cast(t)
        return pa.array(values, pa.float64())
    return pa.array(values)


_SLOT_KEYS: dict = {}


def slot_keys(spark, k: int) -> list:
    """``k`` bigint keys, key ``p`` sent to partition ``p`` by ``repartition(k, key)`` (Spark's
    hash partitioning, ``pmod(hash(key), k)``, computed by Spark itself on candidate keys 0, 1,
    ...: public, data-independent, cached per ``k``)."""
    k = int(k)
    if k not in _SLOT_KEYS:
        keys: dict = {}
        start = 0
        while len(keys) < k:  # SQL strings: the same call on a classic and a Connect session
            rows = spark.range(start, start + 64 * k).selectExpr("id", f"pmod(hash(id), {k}) AS p").collect()
            for r in rows:
                keys.setdefault(int(r["p"]), int(r["id"]))
            start += 64 * k
        _SLOT_KEYS[k] = [keys[p] for p in range(k)]
    return list(_SLOT_KEYS[k])


class SparkEngine:
    """The engine interface (docs/architecture.md) over Spark DataFrames."""

    name = "spark"

    def open(self, data, *, columns: Sequence[str] | None, fill: float | None, caller: str,
             labels: tuple | None = None, missing: bool = False, keep: Sequence[str] = (), events=None):
        """A source, schema only. ``labels``, ``missing``, ``keep``: as the local engine's ``open``
        (ignored for bounded event records: the mechanism refuses them by name). ``events``: an
        :class:`~sparkpriv.mechanisms.aggregates.EventSpec`: the DataFrame is an event table, grouped by
        person into :class:`~sparkpriv.mechanisms.protocol.EventRows` blocks (aggregates)."""
        from sparkpriv.errors import ParameterError
        from sparkpriv.spark.schema import check_present_columns

        if events is not None:
            from sparkpriv.spark.aggregates import EventsSource

            if isinstance(data, (BoundedRecords, ParquetInput)):
                raise ParameterError(f"{caller} takes the event table itself (a DataFrame of events), not "
                                     f"{type(data).__name__}.")
            self._spark = data.sparkSession
            return EventsSource(data, events)
        if isinstance(data, BoundedRecords):
            self._spark = data.grouped.sparkSession
            return RecordsSource(data, make_counters(self._spark))
        self._spark = data.sparkSession
        given, data = data, dataframe_of(data)
        if columns is None:
            raise ParameterError(f"The 'columns' parameter of {caller} is required for a table input: "
                                 "the numeric feature columns (--columns).")
        columns = tuple(columns)
        check_numeric_columns(data, columns)
        check_present_columns(data, list(keep), role="kept (public)")
        if labels is not None:
            from pyspark.sql.types import BooleanType, FractionalType, IntegralType, StringType

            col, classes = labels
            check_present_columns(data, [col], role="label")
            t = data.schema[col].dataType
            kind = ("integer" if isinstance(t, IntegralType) else "fractional" if isinstance(t, FractionalType)
                    else "string" if isinstance(t, StringType) else "boolean" if isinstance(t, BooleanType)
                    else "other")
            labels = (col, coerce_classes(classes, kind, col, t.simpleString()))
        (replaced,) = owner_counters(self._spark, 1) or (None,)
        return TableSource(data, columns, fill, labels=labels, missing=missing, keep=tuple(keep), input=given,
                           replaced=replaced)

    def __init__(self) -> None:
        self._spark = None  # the session of the opened source
        self.progress = None  # (what, i, n, message) of the running release (release() sets it)

    def watch(self, what: str, units: tuple | None = None):
        """A context reporting the task progress of the Spark jobs run inside it as ``what``
        steps to :attr:`progress` (nothing when there is none): :class:`~sparkpriv.spark.progress.TaskProgress`
        (``units``: its ``(label, total, counter)``)."""
        from sparkpriv.spark.progress import TaskProgress

        return TaskProgress(self._spark, what, self.progress, units=units)

    def counters(self, names: Sequence[str]):
        """Accumulators for owner diagnostics (None under Spark Connect: no diagnostics)."""
        return owner_counters(self._spark, len(names))

    def aggregate(self, source, fn, size: int, *, count: bool = False) -> np.ndarray:
        """``count``: event records add this pass to the owner counters (people, truncated: count
        them in one pass only)."""

        def sparkpriv_partial(batches, pid):
            acc = np.zeros(size, dtype=np.float64)
            for v in blocks(batches):
                acc += v
            return acc

        with spark_errors():
            if source.kind == "events":  # aggregates: the groupBy(person) and the core's bounding run here
                blocks = source.batch_fn(fn)
                with self.watch(BOUNDING):
                    return sum_partials(source.grouped, sparkpriv_partial, size)
            if source.kind == "records":  # the event bounding pass (groupBy person, cap) runs here
                blocks = source.batch_fn(fn, counted=count)
                with self.watch(BOUNDING):
                    return sum_partials(source.records.grouped, sparkpriv_partial, size)
            blocks = source.batch_fn(fn)
            strings = [source.labels[0]] if source.labels else []
            return scan_aggregate(source.input, source.read_columns, sparkpriv_partial, size, strings=strings)

    def cache(self, source, fn, dim: int, *, sparse: bool = False) -> _Cache:
        """``fn(block)`` of every block, cached for every pass: ``(rows, dim)`` float64 matrices, or
        with ``sparse`` the :class:`SparseRows` blocks ``fn`` returns (bounded event records kept
        sparse: a person costs their items, not ``dim`` floats)."""
        # cached records of at most CACHE_BLOCK_BYTES: the JVM holds each as one byte array (a
        # 65,536-row batch of 256 kernel features is 134 MB: a 1 GB default heap ran out)
        step = max(1, CACHE_BLOCK_BYTES // (8 * max(dim, 1)))

        def sparkpriv_features(batches, pid):
            for Z in blocks(batches):
                for i in range(0, max(Z.shape[0], 1), step):
                    yield _block(Z[i:i + step])

        def sparkpriv_sparse_features(batches, pid):
            for R in blocks(batches):
                yield pa.RecordBatch.from_arrays([pa.array([rows_to_bytes(R)], pa.binary()),
                                                  pa.array([R.n], pa.int64())], ["z", "rows"])

        blocks = source.batch_fn(fn)
        if sparse:
            if source.kind != "records":
                raise ValueError("cache(sparse=True) is for bounded event records")
            blocks_df = map_batches(source.records.grouped, sparkpriv_sparse_features, _blocks_schema())
            with self.watch(BOUNDING):
                if has_rdd(blocks_df):
                    return _Cache(dim, rdd=blocks_df.rdd.map(_block_bytes), sparse=True)
                return _Cache(dim, df=blocks_df, sparse=True)
        if source.kind == "table":
            scan = parquet_scan(source.input, list(source.columns))
            if scan is not None:  # local Parquet from read_table: the workers read the row groups
                _log.info("features: direct Arrow scan of %d Parquet row group(s)", len(scan.pieces))
                rdd = scan_rdd(source.spark, scan, list(source.columns), sparkpriv_features)
                return _Cache(dim, rdd=rdd.map(_record_batch_bytes))
            frame = source.df.select(*source.columns)
        else:
            frame = source.records.grouped
        blocks_df = map_batches(frame, sparkpriv_features, _blocks_schema())
        # the cache is filled by its row count; for event records that job is the bounding pass
        with self.watch(BOUNDING) if source.kind == "records" else contextlib.nullcontext():
            if has_rdd(blocks_df):
                return _Cache(dim, rdd=blocks_df.rdd.map(_block_bytes))
            return _Cache(dim, df=blocks_df)

    def index(self, source) -> "_Indexed":
        """The table's rows numbered in table order: ``.rows`` (a count pass) and
        ``.aggregate(fn, size)`` summing ``fn(block, start)``, ``start`` the block's first global row
        index (partition offset + position; the same under any partitioning of the same ordered
        table and under retries). Tables only."""
        if source.kind != "table":
            from sparkpriv.errors import ParameterError

            raise ParameterError("indexed passes need a table input (one row per person).")
        return _Indexed(source)

    def train_groups(self, source, group_fn, train_fn, k: int, dim: int, width: int, *,
                     on_train=None, what: str = "training", order=None) -> np.ndarray:
        """``(k, dim)``: row ``j`` is ``train_fn(j, rows of group j)``, one Spark task per group.

        ``group_fn(block) -> (groups, rows)`` runs per Arrow batch in the Python workers (each
        row's group in ``[0, k)``, the ``(n, width)`` float64 rows); the rows of group ``j`` go
        to one call of ``train_fn``, in source order (partition id, batch number, row), so a
        retried task of a deterministic source sees the same rows in the same order (DPGM's
        ``train_fn`` then sorts a table's rows by their contents: ``canonical_order``, for
        sources whose partitions may come back in another order). Each group is its own
        partition of ``repartition(k, key)`` (a ``groupBy`` hashes groups into the configured shuffle
        partitions, where they collide, and adaptive execution coalesces them: several groups in
        one task, trained one after another): group ``j`` gets the key that Spark's hash
        partitioning sends to partition ``slot(j)`` (:func:`slot_keys`), and the slots follow
        ``order`` (a public permutation of ``range(k)``, e.g. largest noisy size first: tasks
        start in slot order, so the longest start first; default ``0 .. k-1``). A partition that
        still holds several groups trains each of them. A group without rows gets
        ``train_fn(j, (0, width) matrix)`` on the driver. Only the ``k`` vectors reach the driver;
        the grouping is never written. Progress: the groups train in Spark tasks, so ``on_train``
        (per DP-SGD step, in-process engines) is not called; the job's completed / total tasks are
        reported as ``what`` steps to the release's progress (:class:`~sparkpriv.spark.progress.TaskProgress`).
        Event records are read in the keyed person layout (``BoundedRecords.layout``, each task in
        ``_pk`` order, as ``map_rows`` does), so their source order is a function of the
        secret-keyed layout and the same on a retry; their ``group_fn`` returns the rows as the
        :class:`SparseRows` it got (they travel sparse) and ``train_fn`` gets a scipy CSR matrix.
        """
        from pyspark.sql.types import BinaryType, BooleanType, LongType, StructField, StructType

        from sparkpriv.spark.events import in_person_hash_order

        k, dim, width = int(k), int(dim), int(width)
        sparse_groups = source.kind == "records"  # group_fn keeps event records as SparseRows
        if source.kind == "records":  # read in the keyed person layout, each task in _pk order
            bound, d = source.records.record_fn(None), source.records.d
            frame = source.records.layout

            def blocks_of(batches):
                for b in in_person_hash_order(batches):
                    yield SparseRows(*bound(b), d)
        else:
            make_block = source.block_fn()
            frame = source.df.select(*source.read_columns)

            def blocks_of(batches):
                for b in batches:
                    if b.num_rows:
                        yield make_block(b)
        order = list(range(k)) if order is None else [int(j) for j in order]
        if sorted(order) != list(range(k)):
            raise ValueError(f"train_groups: order must be a permutation of 0..{k - 1}")
        keys = slot_keys(frame.sparkSession, k)  # Spark's hash partitioning sends keys[p] to partition p
        key_of = np.zeros(k, dtype=np.int64)
        for p, j in enumerate(order):
            key_of[j] = keys[p]
        split_schema = StructType([StructField("key", LongType(), False), StructField("group", LongType(), False),
                                   StructField("pid", LongType(), False), StructField("block", LongType(), False),
                                   StructField("z", BinaryType(), False)])
        out_schema = StructType([StructField("group", LongType(), False), StructField("theta", BinaryType(), False),
                                 StructField("empty", BooleanType(), False)])
        slot_group = [int(j) for j in order]  # partition p trains group order[p]

        def sparkpriv_groups(batches, pid):
            for b, block in enumerate(blocks_of(batches)):
                g, X = group_fn(block)
                g = np.asarray(g, dtype=np.int64)
                sparse = isinstance(X, SparseRows)
                if not sparse:
                    X = np.asarray(X, dtype=np.float64).reshape(-1, width)
                for j in np.unique(g):
                    if sparse:  # event records travel sparse: a person's items, not width floats
                        z = rows_to_bytes(take_rows(X, np.flatnonzero(g == j)))
                    else:
                        z = np.ascontiguousarray(X[g == j]).tobytes()
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([int(key_of[j])], pa.int64()), pa.array([int(j)], pa.int64()),
                         pa.array([pid], pa.int64()), pa.array([b], pa.int64()), pa.array([z], pa.binary())],
                        ["key", "group", "pid", "block", "z"])

        trained = None  # clusters trained, for the progress (public: a count of the k groups)
        if self.progress is not None:
            try:
                trained = frame.sparkSession.sparkContext.accumulator(0)
            except Exception:  # Spark Connect: no accumulators, and no progress either
                trained = None

        def sparkpriv_train_slot(batches, pid):
            got: dict = {}
            for rb in batches:  # normally one group per partition; any group found trains here
                for g, p_, b_, z in zip(*(rb.column(i).to_pylist() for i in range(1, 5))):
                    got.setdefault(int(g), []).append((p_, b_, z))
            for j, items in sorted(got.items()):
                items.sort(key=lambda t: (t[0], t[1]))  # source order: partition id, block
                zs = [t[2] for t in items]
                del items
                if sparse_groups:  # one CSR matrix of the cluster's records; DP-SGD densifies a batch only
                    X = stack_csr([rows_from_bytes(z) for z in zs], width)
                else:
                    X = np.concatenate([np.frombuffer(z, dtype=np.float64).reshape(-1, width) for z in zs])
                del zs
                theta = np.asarray(train_fn(j, X), dtype=np.float64)
                if trained is not None:
                    trained.add(1)
                yield _theta_batch(j, theta, False)
            own = slot_group[pid] if pid < k else None
            if own is not None and own not in got:
                # the partition's group has no rows: it trains here on an empty matrix, as the local
                # engine does (noise only), side by side with the others instead of after them on the
                # driver; if Spark's hashing ever sent its rows elsewhere, that result wins (below)
                theta = np.asarray(train_fn(own, np.zeros((0, width))), dtype=np.float64)
                if trained is not None:
                    trained.add(1)
                yield _theta_batch(own, theta, True)

        def _theta_batch(j, theta, empty):
            return pa.RecordBatch.from_arrays(
                [pa.array([int(j)], pa.int64()), pa.array([theta.tobytes()], pa.binary()),
                 pa.array([bool(empty)], pa.bool_())], ["group", "theta", "empty"])

        parts = map_batches(frame, sparkpriv_groups, split_schema).repartition(k, "key")
        units = None if trained is None else ("models trained (one Spark task each)", k, trained)
        with spark_errors(), self.watch(what, units):
            rows = map_batches(parts, sparkpriv_train_slot, out_schema).collect()
        thetas = np.zeros((k, dim))
        seen = set()
        for r in sorted(rows, key=lambda r: bool(r["empty"])):  # a group trained on its rows wins
            j = int(r["group"])
            if j not in seen:
                seen.add(j)
                thetas[j] = np.frombuffer(r["theta"], dtype=np.float64)
        for j in range(k):
            if j not in seen:  # no task made it (not expected): the same call on the driver
                thetas[j] = train_fn(j, np.zeros((0, width)))
        return thetas

    def map_rows(self, source, row_map, columns: Sequence[tuple], *, keep: Sequence[str] = (),
                 count: bool = True):
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
        keyed person layout (``BoundedRecords.layout``, in ``_pk`` order);
        ``count=False`` leaves them out of the owner counters (counted by an
        earlier pass). Column type ``"as-input"``: the type of the input
        column of that name (integer and float types kept, others double);
        ``"label"``: the row map gives class codes, the output holds the
        declared classes in the label column's type.
        """
        from pyspark.sql.types import StructField, StructType

        from sparkpriv.spark.batches import BatchMap
        from sparkpriv.spark.events import in_person_hash_order

        keep = list(keep)
        kept = [source.df.schema[c] for c in keep]
        out = StructType(kept + [StructField(n, self._out_type(source, n, t), nb) for n, t, nb in columns])
        names = keep + [n for n, _, _ in columns]
        kinds = [t for _, t, _ in columns]
        label = source.labels if getattr(source, "labels", None) else None
        if source.kind == "records":
            bound = source.records.record_fn(source.counters if count else None)
            d = source.records.d
            frame = source.records.layout

            def decode_all(batches):
                for b in in_person_hash_order(batches):
                    yield b, SparseRows(*bound(b), d)
        else:
            make_block = source.block_fn()
            read = [*keep, *[c for c in source.read_columns if c not in keep]]
            passthrough = keep + ([label[0]] if label else [])

            def decode_all(batches):
                for b in batches:
                    yield b, make_block(b)

        def sparkpriv_rows(batches, pid):
            current = []

            def blocks():
                for b, block in decode_all(batches):
                    current[:] = [b]
                    yield block

            for outcols in row_map(pid, blocks()):
                b = current[0]
                arrays = [b.column(c) for c in keep] + [_out_array(b, n, k, c, label)
                                                        for n, k, c in zip(names[len(keep):], kinds, outcols)]
                yield pa.RecordBatch.from_arrays(arrays, names)

        if source.kind == "records":
            rows = BatchMap(frame, sparkpriv_rows, out)
        else:  # a DataFrame, or the direct Parquet reader (same partition indices and batches)
            rows = scan_row_map(source.input, read, sparkpriv_rows, out, passthrough=passthrough)
        return rows.to_df(), rows

    def _out_type(self, source, name: str, t: str):
        from pyspark.sql.types import DoubleType, FloatType, IntegralType

        if t == "label":
            return source.df.schema[source.labels[0]].dataType
        if t == "as-input":
            it = source.df.schema[name].dataType
            return it if isinstance(it, (IntegralType, FloatType, DoubleType)) else DoubleType()
        return self._type(t)

    @staticmethod
    def _type(t: str):
        from pyspark.sql.types import ArrayType, BooleanType, DoubleType, IntegerType, LongType, StringType

        return {"int": IntegerType(), "long": LongType(), "double": DoubleType(), "bool": BooleanType(),
                "array<double>": ArrayType(DoubleType(), False), "array<int>": ArrayType(IntegerType(), False),
                "string": StringType()}[t]

    def key_blocks(self, source, block_fn, d: int, block: int, columns: Sequence[tuple]):
        """A table over the PUBLIC index domain ``0..d-1`` of bounded event records, built in the tasks.

        The per-index totals of the records (the bounding pass, then one
        aggregation in the JVM: ``groupBy(index)`` of the records' (index,
        value) pairs) are cut into blocks of ``block`` consecutive indices;
        ``block_fn(b, totals)`` gets block ``b``'s dense totals (int64, zeros
        for indices no record holds; the last block may be shorter) and
        returns its output columns, one value per index, in index order. Every
        block is computed exactly once, in one task (a marker row per block
        makes blocks no record reaches exist too); open the noise stream from
        ``b``, never from the partition id, so a retried or rescheduled task
        redraws the same noise. Neither the totals nor the output pass
        through the driver. ``columns``: the output schema ``(name, type)``.
        Returns the lazy DataFrame.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.types import IntegerType, LongType, StructField, StructType

        if source.kind != "records":
            raise TypeError("key_blocks needs bounded event records")
        bound = source.records.record_fn(source.counters)
        counts_mode = source.records.cap.weights == "counts"
        pairs_schema = StructType([StructField("_k", IntegerType(), False), StructField("_v", LongType(), False)])

        def sparkpriv_key_pairs(batches, pid):
            for b in batches:
                off, idx, vals = bound(b)
                v = (np.rint(np.asarray(vals, np.float64)).astype(np.int64) if counts_mode and vals is not None
                     else np.ones(np.asarray(idx).shape[0], np.int64))
                yield pa.RecordBatch.from_arrays([pa.array(np.asarray(idx, np.int32)), pa.array(v)],
                                                 ["_k", "_v"])

        nb = -(-int(d) // int(block))
        spark = self._spark
        pairs = map_batches(source.records.grouped, sparkpriv_key_pairs, pairs_schema)
        totals = (pairs.groupBy("_k").agg(F.sum("_v").alias("_v"))
                  .withColumn("_b", (F.col("_k") / F.lit(int(block))).cast("int")))
        markers = spark.range(nb).select(F.lit(-1).cast("int").alias("_k"), F.lit(0).cast("long").alias("_v"),
                                         F.col("id").cast("int").alias("_b"))
        shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
        parts = totals.unionByName(markers).repartition(max(1, min(nb, shuffle)), "_b") \
            .sortWithinPartitions("_b", "_k")
        out_schema = StructType([StructField(n, self._type(t), False) for n, t in columns])
        names = [n for n, _ in columns]
        rows_per_batch = 1 << 16
        d, block = int(d), int(block)

        def emit(b, keys, vals):
            size = min(block, d - b * block)
            dense = np.zeros(size, np.int64)
            if keys:
                k = np.concatenate(keys) - b * block
                dense[k] = np.concatenate(vals)
            cols = block_fn(b, dense)
            for i in range(0, size, rows_per_batch):
                yield pa.RecordBatch.from_arrays([pa.array(c[i:i + rows_per_batch]) for c in cols], names)

        def sparkpriv_key_blocks(batches, pid):
            cur, keys, vals = None, [], []
            for batch in batches:
                if not batch.num_rows:
                    continue
                bs = batch.column("_b").to_numpy()
                ks = batch.column("_k").to_numpy().astype(np.int64)
                vs = batch.column("_v").to_numpy()
                cuts = np.flatnonzero(np.diff(bs)) + 1
                for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, bs.shape[0]]):
                    b = int(bs[lo])
                    if b != cur:
                        if cur is not None:
                            yield from emit(cur, keys, vals)
                        cur, keys, vals = b, [], []
                    real = ks[lo:hi] >= 0
                    keys.append(ks[lo:hi][real])
                    vals.append(vs[lo:hi][real])
            if cur is not None:
                yield from emit(cur, keys, vals)

        return map_batches(parts, sparkpriv_key_blocks, out_schema)

    def key_table(self, source, partial_fn, width: int, finish_fn, columns: Sequence[tuple]):
        """A table over keys found in the data (private key selection; an ``events`` source), built in
        the tasks: ``partial_fn(block) -> (key ids (u,), totals (u, width))`` per block of people; the
        totals are summed per key id in the JVM (``groupBy``), joined to the key columns' values, and
        each key is given its noise partition ``pid = pmod(murmur3(key id), P)`` with ``P`` the session's
        ``spark.sql.shuffle.partitions`` (a PUBLIC number; Spark's hash partitioning of the key id, which
        the local engine computes too), the rows repartitioned by it and sorted by (pid, key id).
        ``finish_fn(pid, totals (k, width)) -> (released (k,) bool, columns of the released keys)``
        runs once per noise partition on its keys in that order: open its noise stream from ``pid`` (a
        retried task sees the same keys in the same order and redraws the same noise; adaptive execution
        may put several noise partitions in one task, which changes nothing). ``columns``: the output
        columns after the key columns, ``(name, type)``. Returns the lazy DataFrame; nothing passes
        through the driver."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import DoubleType, LongType, StructField, StructType

        from sparkpriv.spark.aggregates import KEY_ID, event_rows

        if source.kind != "events":
            raise TypeError("key_table needs an event table source")
        W = int(width)
        nv = len(source.spec.values)
        by = list(source.spec.by)
        pairs_schema = StructType([StructField(KEY_ID, LongType(), False)]
                                  + [StructField(f"_s{j}", DoubleType(), False) for j in range(W)])
        names = [KEY_ID] + [f"_s{j}" for j in range(W)]

        def sparkpriv_key_partials(batches, pid):
            for b in batches:
                if not b.num_rows:
                    continue
                ids, tot = partial_fn(event_rows(b, nv))
                if len(ids):
                    yield pa.RecordBatch.from_arrays([pa.array(np.asarray(ids, np.int64))]
                                                     + [pa.array(tot[:, j]) for j in range(W)], names)

        pairs = map_batches(source.grouped, sparkpriv_key_partials, pairs_schema)
        totals = pairs.groupBy(KEY_ID).agg(*[F.sum(f"_s{j}").alias(f"_s{j}") for j in range(W)])
        keyed = totals.join(source.key_values, KEY_ID)
        parts = int(self._spark.conf.get("spark.sql.shuffle.partitions"))
        # each key's noise partition is a column, pmod(murmur3(key id), parts): Spark's hash partitioning
        # of the key id. The stream is opened from it, not from the task's partition id: a repartition by
        # the key id alone is dropped by the optimizer after the join (already partitioned by it), and
        # adaptive execution then coalesces the join's partitions by data size (all keys of a small
        # table in one task), which would make the streams depend on the data's size
        keyed = keyed.withColumn("_pid", F.expr(f"pmod(hash(`{KEY_ID}`), {parts})").cast("int"))
        ordered = keyed.repartition(parts, "_pid").sortWithinPartitions("_pid", KEY_ID)
        key_fields = [StructField(c, t, True) for c, t in zip(by, source.key_types())]
        out_schema = StructType(key_fields + [StructField(n, self._type(t), False) for n, t in columns])
        out_names = by + [n for n, _ in columns]

        def sparkpriv_key_finish(batches, _task):
            bs = [b for b in batches if b.num_rows]
            if not bs:
                return
            t = pa.Table.from_batches(bs)
            tot = np.column_stack([t.column(f"_s{j}").to_numpy() for j in range(W)]) if W else np.zeros((t.num_rows, 0))
            pids = t.column("_pid").to_numpy()
            cuts = np.flatnonzero(np.diff(pids)) + 1
            for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, pids.size]):  # one noise partition after another
                keep, cols = finish_fn(int(pids[lo]), tot[lo:hi])
                idx = pa.array(lo + np.flatnonzero(keep))
                if len(idx):
                    arrays = [t.column(c).take(idx).combine_chunks() for c in by] + \
                        [pa.array(np.asarray(v)) for v in cols]
                    yield pa.RecordBatch.from_arrays(arrays, out_names)

        return map_batches(ordered, sparkpriv_key_finish, out_schema)

    def columns_table(self, columns: Sequence[tuple]):
        """A table built on the driver from ``(name, type, values)`` columns (numpy arrays), through
        Arrow (no Python row objects: a domain of millions of keys takes seconds, not minutes)."""
        from pyspark.sql.types import StructField, StructType

        st = StructType([StructField(n, self._type(t), False) for n, t, _ in columns])
        arrays = [pa.array(np.asarray(v).astype(str) if t == "string" else np.asarray(v)) for _, t, v in columns]
        tbl = pa.Table.from_arrays(arrays, [n for n, _, _ in columns])
        import pyspark

        if int(pyspark.__version__.split(".")[0]) >= 4:  # an Arrow table directly
            df = self._spark.createDataFrame(tbl, st)
        else:  # PySpark 3.5: through pandas, with Arrow on for the call
            conf = self._spark.conf
            key = "spark.sql.execution.arrow.pyspark.enabled"
            before = conf.get(key)
            conf.set(key, "true")
            try:
                df = self._spark.createDataFrame(tbl.to_pandas(), st)
            finally:
                conf.set(key, before)
        return df.coalesce(1)

    def table(self, rows: list[tuple], schema: Sequence[tuple]):
        from pyspark.sql.types import StructField, StructType

        st = StructType([StructField(n, self._type(t), nullable) for n, t, nullable in schema])
        return self._spark.createDataFrame(rows, st).coalesce(1)

    @staticmethod
    def schema_of(table) -> list[dict]:
        return [{"name": f.name, "type": f.dataType.simpleString()} for f in table.schema.fields]
