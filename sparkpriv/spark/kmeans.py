"""DP k-means on Spark DataFrames (layer 2 over :mod:`sparkpriv.mechanisms.kmeans`).

Shape of a release:

1. Validate, draw the public ``W`` (kernel) and the secret noise seed,
   calibrate every noise addition and :func:`~sparkpriv.release.reserve` the
   event -- before any data is read.
2. Features are computed once per Arrow batch (clip, then RFF for ``kernel``)
   and cached as blocks: one record per batch holding the ``(rows, D')``
   float64 matrix as raw bytes, in a serialized Python RDD when the RDD API
   exists (classic Spark), else in a cached DataFrame of blocks (Spark
   Connect). This is the cheapest form that survives the iterations
   (measured, see docs/kmeans.md): no per-row objects, the Python workers read
   each block with one ``np.frombuffer``, and the RDD's cached bytes reach
   them without the columnar-cache -> row -> Arrow conversions (3x less time
   per iteration than the DataFrame cache at 1M x 64). For a
   ``read_table(..., reader="arrow")`` input (direct Parquet reader) the
   blocks are computed from row groups the workers read themselves
   (:mod:`sparkpriv.spark.parquet_scan`), and so is the final pass.
3. Each iteration: the current centres are captured in the task closure
   (plain numpy copies); per partition, every block is assigned and its
   counts/sums vector accumulated (:func:`~sparkpriv.mechanisms.kmeans.cluster_stats`);
   partials are merged by tree aggregation (:func:`~sparkpriv.spark.batches.sum_partials`);
   only the ``k (D'+1)`` vector reaches the driver, which adds the noise ONCE
   (:func:`~sparkpriv.mechanisms.kmeans.noisy_update`, drawn from the driver
   stream of the secret seed) and logs a progress line.
4. ``kernel``: a last pass over the input releases input-space centres as
   noisy per-cluster means of the clipped inputs (accounted).
5. Post-processing on the driver (free): centres projected onto the declared
   domain, sizes clamped at 0, unreliable clusters (noisy size below
   ``reliability_stds`` noise standard deviations) flagged
   (:func:`~sparkpriv.mechanisms.kmeans.fit_from_stats`).
6. The :class:`KMeansRelease` holds a tiny DataFrame of the clusters
   (cluster, count, reliable, center, feature_center) which ``write``
   publishes with the receipt (the receipt embeds the model and lists the
   unreliable clusters) and ``_kmeans_model.json``.

Assignments are never part of the release; :func:`assign_clusters` computes
them from the public model inside a later job.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.io.inputs import check_numeric_columns, check_present_columns, schema_fingerprint
from sparkpriv.mechanisms.kmeans import (
    DEFAULT_RELIABILITY_STDS,
    VARIANTS,
    check_reliability_stds,
    check_k_for_n,
    cluster_input_sums_sparse,
    cluster_stats,
    assign_nearest,
    fit_from_stats,
    initial_centres,
    make_feature_map,
    plan_kmeans,
)
from sparkpriv.mechanisms.kmeans_model import MODEL_FILE, POSTPROCESSING, KMeansModel
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.release import Release, reserve
from sparkpriv.spark.batches import (
    batch_matrix,
    has_rdd,
    map_batches,
    owner_counters,
    spark_errors,
    sum_partials,
)
from sparkpriv.spark.events import BoundedRecords, counters_dict, make_counters
from sparkpriv.spark.parquet_scan import aggregate, dataframe_of, parquet_scan, scan_rdd

__all__ = ["release_kmeans", "assign_clusters", "KMeansRelease"]

_log = logging.getLogger(__name__)


@dataclass
class KMeansRelease(Release):
    """A :class:`~sparkpriv.release.Release` whose table is the released clusters.

    ``model`` is the public :class:`KMeansModel`; ``iteration_seconds`` the wall
    time of each Lloyd iteration (for benchmarks).
    """

    model: KMeansModel | None = None
    iteration_seconds: list | None = None

    def extra_files(self) -> dict[str, bytes]:
        return {MODEL_FILE: self.model.to_json().encode()}


def _blocks_schema():
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    return StructType([StructField("z", BinaryType(), False), StructField("rows", LongType(), False)])


def _block(Z: np.ndarray) -> pa.RecordBatch:
    """One block record: the ``(rows, D')`` float64 features as raw bytes, and the row count."""
    return pa.RecordBatch.from_arrays([pa.array([np.ascontiguousarray(Z).tobytes()], pa.binary()),
                                       pa.array([Z.shape[0]], pa.int64())], ["z", "rows"])


def _feature_blocks_fn(fmap, columns, fill, counters):
    """Per-partition function: each Arrow batch -> one block row (features as bytes)."""

    def sparkpriv_kmeans_features(batches, pid):
        for batch in batches:
            X = batch_matrix(batch, columns, fill=fill)
            Z, _, counts = fmap.features(X)
            if counters is not None:
                counters[0].add(counts.rows)
                counters[1].add(counts.box_clipped)
                counters[2].add(counts.norm_clipped)
            yield _block(Z)

    return sparkpriv_kmeans_features


def _block_stats_fn(centres, dim):
    """Per-partition counts/sums over cached feature blocks (closure of plain arrays)."""
    centres = np.array(centres, dtype=np.float64, copy=True)
    size = centres.shape[0] * (dim + 1)

    def sparkpriv_kmeans_iteration(batches, pid):
        acc = np.zeros(size, dtype=np.float64)
        for b in batches:
            col = b.column(0)
            for i in range(b.num_rows):
                Z = np.frombuffer(col[i].as_buffer(), dtype=np.float64).reshape(-1, dim)
                acc += cluster_stats(Z, centres)
        return acc

    return sparkpriv_kmeans_iteration


def _rdd_block_stats_fn(centres, dim):
    """Per-partition counts/sums over the cached RDD of block bytes (one vector per partition)."""
    centres = np.array(centres, dtype=np.float64, copy=True)
    size = centres.shape[0] * (dim + 1)

    def sparkpriv_kmeans_iteration(blocks):
        acc = np.zeros(size, dtype=np.float64)
        for buf in blocks:
            acc += cluster_stats(np.frombuffer(buf, dtype=np.float64).reshape(-1, dim), centres)
        yield acc

    return sparkpriv_kmeans_iteration


class _FeatureCache:
    """The feature blocks, cached once for every iteration (see the module doc, step 2)."""

    def __init__(self, blocks_df, dim: int, *, block_rdd=None):
        from pyspark import StorageLevel

        self.dim = dim
        self.rdd = self.df = None
        if block_rdd is not None or has_rdd(blocks_df):
            rdd = block_rdd if block_rdd is not None else blocks_df.rdd.map(_block_bytes)
            self.rdd = rdd.persist(StorageLevel.MEMORY_AND_DISK)
            width = 8 * dim
            self.rows = int(self.rdd.map(len).sum()) // width if dim else 0
        else:
            self.df = blocks_df.persist(StorageLevel.MEMORY_AND_DISK)
            self.rows = int(self.df.agg({"rows": "sum"}).collect()[0][0] or 0)

    def stats(self, centres: np.ndarray, size: int) -> np.ndarray:
        if self.rdd is not None:
            return self.rdd.mapPartitions(_rdd_block_stats_fn(centres, self.dim)).treeReduce(
                _add_vectors, depth=2)
        return sum_partials(self.df, _block_stats_fn(centres, self.dim), size)

    def release(self) -> None:
        (self.rdd if self.rdd is not None else self.df).unpersist()


def _block_bytes(row):
    return row[0]


def _record_batch_bytes(block):
    """The feature bytes of one block record batch (``_feature_blocks_fn``'s output)."""
    return block.column(0)[0].as_py()


def _add_vectors(a, b):
    return a + b


def _input_stats_fn(fmap, centres, columns, fill):
    """Per-partition counts and sums of clipped INPUTS, grouped by nearest feature centre."""
    centres = np.array(centres, dtype=np.float64, copy=True)
    size = centres.shape[0] * (fmap.d + 1)

    def sparkpriv_kmeans_final(batches, pid):
        acc = np.zeros(size, dtype=np.float64)
        for batch in batches:
            Z, Xc, _ = fmap.features(batch_matrix(batch, columns, fill=fill))
            acc += cluster_stats(Z, centres, Xc)
        return acc

    return sparkpriv_kmeans_final



def _tup(x):
    return None if x is None else tuple(float(v) for v in x)


def release_kmeans(
    df,
    *,
    columns: Sequence[str] | None = None,
    k: int,
    epsilon: float,
    delta: float,
    iterations: int = 10,
    variant: str = "kernel",
    row_bound: float | None = None,
    lower: Sequence[float] | None = None,
    upper: Sequence[float] | None = None,
    kernel_width: float | None = None,
    frequencies: int = 128,
    init=None,
    final_share: float | None = None,
    fill: float | None = None,
    neighbors: str = "replace-one",
    reliability_stds: float = DEFAULT_RELIABILITY_STDS,
    ledger=None,
    table_id: str | None = None,
    source: str | None = None,
) -> KMeansRelease:
    """Private k-means of the ``columns`` of a Spark DataFrame.

    Parameters
    ----------
    df : pyspark.sql.DataFrame or BoundedRecords
        One row per record (person), or the bounded person records of an event
        table (:func:`~sparkpriv.spark.events.bound_contributions`; kernel
        variant only; bounds from the item cap, features from the sparse
        records).
    columns : sequence of str
        Numeric feature columns (n_features = d); required for a DataFrame.
    k : int >= 2
        Number of clusters; at most ``floor(sqrt(n))`` (n is public under
        replace-one).
    epsilon, delta : float
        The total guarantee of the release; ``delta`` in (0, 1).
    iterations : int >= 1
        Lloyd iterations T.
    variant : {"kernel", "linear"}
        ``kernel``: random Fourier features of an RBF kernel (needs
        ``kernel_width``); ``linear``: DPLloyd on the clipped rows.
    row_bound, lower, upper
        Declared public bounds: L2 row norm and/or per-column box.
    kernel_width : float > 0
        RBF width ``s`` (kernel only).
    frequencies : int
        Number of random frequencies D (features 2D), kernel only.
    init : array of shape (k, d), optional
        A PUBLIC sample of initial centres; default: uniform points of the
        declared domain.
    final_share : float in (0, 1), optional
        Kernel only: share of the Gaussian-DP budget ``mu^2`` for the final
        input-space centres (default 0.1).
    fill : float, optional
        Public value replacing nulls.
    neighbors : {"replace-one"}
        Only replace-one: ``n`` is public (the rule ``k <= floor(sqrt(n))``
        uses it).
    reliability_stds : float >= 0
        Clusters whose noisy size is below this many standard deviations of
        the size noise are marked unreliable in the model and the receipt
        (their centres may be pure noise); ``model.predict``/``assign`` leave
        them out unless asked (default 3).
    ledger, table_id, source
        As for every release (reservation before any data is read).

    Returns
    -------
    KMeansRelease
        ``.model`` (public), ``.df`` the tiny clusters table,
        ``.write(path)`` publishes it with the receipt and the model JSON.

    Privacy
    -------
    Replace-one neighbours. Per iteration one Gaussian noise addition to the
    vector ``(C n_j, S_j)`` of L2 sensitivity ``2C`` (``C = 1`` for RFF, the
    input norm bound for ``linear``), enforced by clipping; T iterations and
    the final step compose exactly to ``(epsilon, delta)`` by Gaussian DP.
    Public: bounds, k, T, ``W``, kernel width, initial centres, n.
    Secret: the noise seed. See :mod:`sparkpriv.mechanisms.kmeans`.
    """
    caller = "release_kmeans"
    check_param("neighbors", neighbors, [Options(("replace-one",))], caller)
    check_param("variant", variant, [Options(VARIANTS)], caller)
    check_param("fill", fill, [None, Interval("real", None, None, "neither")], caller)
    check_reliability_stds(reliability_stds, caller)
    if isinstance(df, BoundedRecords):
        inp = _RecordsInput(df, variant, columns, lower, upper, row_bound, fill, caller)
    else:
        inp = _TableInput(df, columns, lower, upper, row_bound, fill, caller)
    d, bounds = inp.d, inp.bounds
    fmap = make_feature_map(variant, bounds, kernel_width=kernel_width, frequencies=frequencies,
                            caller=caller)
    plan = plan_kmeans(fmap, k=k, epsilon=epsilon, delta=delta, iterations=iterations,
                       final_share=final_share, caller=caller)
    init_rng = stream(new_secret_seed("kmeans-init"), 0)
    centres0 = initial_centres(fmap, k, init_rng, init, caller)
    seed = new_secret_seed("kmeans-noise")
    event = plan.dp_event()
    eps = plan.epsilon_spent()
    params = {
        **inp.public_params, "k": k, "epsilon": float(epsilon), "delta": float(delta),
        "iterations": iterations, "variant": variant, "kernel_width": kernel_width,
        "frequencies": frequencies if variant == "kernel" else None,
        "final_share": plan.final_share, "fill": fill, "neighbors": neighbors,
        "bounds": bounds.to_public_dict(), "init": "public sample" if init is not None else "domain",
        "reliability_stds": float(reliability_stds),
    }
    hold = reserve(event=event, mechanism="kmeans", parameters=params, ledger=ledger, table_id=table_id)
    spark = inp.spark
    counters = inp.make_counters()
    cache = None
    try:
        with spark_errors():
            cache = inp.feature_cache(fmap, counters, plan.dim)
            n = cache.rows
        if n == 0:
            raise InputError("The input table is empty: there is nothing to release.")
        check_k_for_n(k, n, caller)
        _log.info("kmeans: %s variant, k=%d, %d feature dims, %d iterations; features cached",
                  variant, k, plan.dim, plan.iterations)
        seconds: list[float] = []
        size = k * (plan.dim + 1)
        clock = [time.perf_counter()]

        def iteration_stats(c):
            with spark_errors():
                return cache.stats(c, size)

        def final_stats(c):
            with spark_errors():
                return inp.input_stats(fmap, c, k * (d + 1))

        def log(t, counts):
            now = time.perf_counter()
            seconds.append(now - clock[0])
            clock[0] = now
            _log.info("kmeans iteration %d/%d: %.2f s, %d cluster(s) with noisy count < 1",
                      t, plan.iterations, seconds[-1], int(np.sum(counts < 1)))

        model, _ = fit_from_stats(plan, fmap, centres0, iteration_stats, final_stats, seed, log,
                                  reliability_stds=reliability_stds)
    except BaseException as exc:
        hold.abort(f"k-means failed: {type(exc).__name__}")
        hold.close()
        raise
    finally:
        if cache is not None:
            cache.release()
    del seed
    if model.unreliable:
        _log.warning("kmeans: %d of %d cluster(s) unreliable (noisy size below %g noise stds): %s; "
                     "predict/assign leave them out", len(model.unreliable), k, reliability_stds,
                     list(model.unreliable))

    out = _clusters_df(spark, model)
    public = dict(plan.to_public_dict(), parameters=params, model=model.to_dict(),
                  unreliable_clusters=list(model.unreliable), postprocessing=POSTPROCESSING,
                  feature_map="W is public: drawn independently of the data and released")
    return KMeansRelease(df=out, mechanism="kmeans", event=event, epsilon=eps, delta=plan.delta,
                         public=public, input_info=inp.input_info(source), hold=hold,
                         diagnostics=lambda: inp.diagnostics(counters), source_df=inp.source_df,
                         model=model, iteration_seconds=seconds)


class _TableInput:
    """One row per record: declared numeric columns and bounds."""

    def __init__(self, df, columns, lower, upper, row_bound, fill, caller):
        if columns is None:
            raise ParameterError(f"The 'columns' parameter of {caller} is required for a table input: "
                                 "the numeric feature columns (--columns).")
        self.df, self.columns, self.fill = dataframe_of(df), list(columns), fill
        self.input = df  # a DataFrame, or a ParquetInput for the direct reader
        check_numeric_columns(df, self.columns)
        self.d = len(self.columns)
        self.bounds = Bounds(self.d, _tup(lower), _tup(upper), row_bound, "l2", None, _caller=caller)
        self.spark = df.sparkSession
        self.public_params = {"columns": self.columns}
        self.source_df = None

    def make_counters(self):
        return owner_counters(self.spark)

    def feature_cache(self, fmap, counters, dim: int) -> "_FeatureCache":
        fn = _feature_blocks_fn(fmap, self.columns, self.fill, counters)
        scan = parquet_scan(self.input, self.columns)
        if scan is not None:  # local Parquet from read_table: the workers read the row groups
            _log.info("kmeans features: direct Arrow scan of %d Parquet row group(s)", len(scan.pieces))
            rdd = scan_rdd(self.spark, scan, self.columns, fn).map(_record_batch_bytes)
            return _FeatureCache(None, dim, block_rdd=rdd)
        return _FeatureCache(map_batches(self.df.select(*self.columns), fn, _blocks_schema()), dim)

    def input_stats(self, fmap, centres, size):
        return aggregate(self.input, self.columns, _input_stats_fn(fmap, centres, self.columns, self.fill), size)

    def diagnostics(self, counters) -> dict:
        if counters is None:
            return {}
        return {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                "rows_norm_clipped": counters[2].value}

    def input_info(self, source) -> dict:
        return {"source": source, "schema_fingerprint": schema_fingerprint(self.df.schema),
                "columns": self.columns, "fill_for_nulls": self.fill}


class _RecordsInput:
    """Bounded person records from an event table (``bound_contributions``): sparse, capped.

    Bounds come from the cap: items in ``[0, c]``, row L2 norm ``c sqrt(L)``;
    the kernel features are computed from the sparse records (``X W^T`` as a
    sum of columns of ``W``), never densifying a ``d``-wide row.
    """

    def __init__(self, records, variant, columns, lower, upper, row_bound, fill, caller):
        given = [n for n, v in (("columns", columns), ("lower", lower), ("upper", upper),
                                ("row_bound", row_bound), ("fill", fill)) if v is not None]
        if given:
            raise ParameterError(
                f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                "bounded event records: the items are the vocabulary and the bounds come from "
                "the item cap (max_items, weights). Remove them."
            )
        if variant != "kernel":
            raise ParameterError(
                f"The 'variant' parameter of {caller} must be 'kernel' for bounded event records. "
                f"Got {variant!r}: the linear variant's features are the d = {records.d}-wide "
                "records themselves, which the iterations would cache densely (d floats per "
                "person); the kernel variant's features are computed from the sparse records."
            )
        self.records = records
        self.d = records.d
        c = records.cap.value_cap
        self.bounds = Bounds(self.d, (0.0,) * self.d, (c,) * self.d, records.cap.l2_bound, "l2", None,
                             _caller=caller)
        self.spark = records.grouped.sparkSession
        self.public_params = {"input": "event table (bounded person records)", **records.to_public_dict()}
        self.source_df = records.events

    def make_counters(self):
        return make_counters(self.spark)

    def feature_cache(self, fmap, counters, dim: int) -> "_FeatureCache":
        fn = _records_feature_blocks_fn(fmap, self.records.record_fn(counters))
        return _FeatureCache(map_batches(self.records.grouped, fn, _blocks_schema()), dim)

    def input_stats(self, fmap, centres, size):
        return sum_partials(self.records.grouped,
                            _records_input_stats_fn(fmap, centres, self.records.record_fn(None), self.d), size)

    def diagnostics(self, counters) -> dict:
        return counters_dict(counters)

    def input_info(self, source) -> dict:
        return dict(self.records.input_info, source=source or self.records.input_info.get("source"))


def _records_feature_blocks_fn(fmap, bound):
    """Per-partition: bounded records of each grouped batch -> one feature block."""

    def sparkpriv_kmeans_record_features(batches, pid):
        for batch in batches:
            yield _block(fmap.features_sparse(*bound(batch)))

    return sparkpriv_kmeans_record_features


def _records_input_stats_fn(fmap, centres, bound, d):
    """Per-partition counts and sums of the sparse records, grouped by nearest feature centre."""
    centres = np.array(centres, dtype=np.float64, copy=True)
    k = centres.shape[0]

    def sparkpriv_kmeans_record_final(batches, pid):
        acc = np.zeros(k * (d + 1), dtype=np.float64)
        for batch in batches:
            off, idx, vals = bound(batch)
            lab = assign_nearest(fmap.features_sparse(off, idx, vals), centres)
            acc += cluster_input_sums_sparse(lab, off, idx, vals, k, d)
        return acc

    return sparkpriv_kmeans_record_final


def _clusters_df(spark, model: KMeansModel):
    from pyspark.sql.types import (ArrayType, BooleanType, DoubleType, IntegerType, StructField,
                                   StructType)

    schema = StructType([
        StructField("cluster", IntegerType(), False),
        StructField("count", DoubleType(), False),
        StructField("reliable", BooleanType(), False),
        StructField("center", ArrayType(DoubleType(), False), False),
        StructField("feature_center", ArrayType(DoubleType(), False), True),
    ])
    fc = model.feature_centers
    ok = model.reliable
    rows = [(j, float(model.counts[j]), bool(ok[j]), [float(v) for v in model.centers[j]],
             None if fc is None else [float(v) for v in fc[j]]) for j in range(model.k)]
    return spark.createDataFrame(rows, schema).coalesce(1)


def assign_clusters(df, model: KMeansModel, *, columns: Sequence[str], keep_columns: Sequence[str] = (),
                    output_column: str = "cluster", fill: float | None = None,
                    include_unreliable: bool = False):
    """``keep_columns`` of ``df`` plus the nearest cluster of each row under ``model``.

    Only the model's reliable clusters are candidates unless
    ``include_unreliable`` (as :meth:`KMeansModel.predict`). The assignment
    is a function of the public model and the row; it is NOT private output:
    use it inside a job, never publish it as part of a release.
    """
    from pyspark.sql.types import IntegerType, StructField, StructType

    columns = list(columns)
    keep_columns = list(keep_columns)
    check_numeric_columns(df, columns)
    check_present_columns(df, keep_columns, role="kept")
    if len(columns) != model.centers.shape[1]:
        raise ParameterError(f"The model has {model.centers.shape[1]} features; got {len(columns)} columns.")
    idx = model.assignment_clusters(include_unreliable).astype(np.int32)
    fmap = model.feature_map()
    C = model.assignment_centers()[idx].copy()
    schema = StructType([df.schema[c] for c in keep_columns] + [StructField(output_column, IntegerType(), False)])
    names = keep_columns + [output_column]

    def sparkpriv_kmeans_assign(batches, pid):
        for batch in batches:
            Z, _, _ = fmap.features(batch_matrix(batch, columns, fill=fill))
            lab = idx[assign_nearest(Z, C)]
            yield pa.RecordBatch.from_arrays([batch.column(c) for c in keep_columns] + [pa.array(lab)], names)

    return map_batches(df.select(*keep_columns, *[c for c in columns if c not in keep_columns]),
                       sparkpriv_kmeans_assign, schema)
