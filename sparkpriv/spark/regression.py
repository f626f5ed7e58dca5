"""Private linear regression on Spark (layer 2 over :mod:`sparkpriv.mechanisms.regression`).

Shape of a sketch release (docs/math.md section 6, docs/regression.md):

1. Validate the public parameters (before any data is read).
2. Count pass: one small job returns the number of rows of each input
   partition. ``n`` is their sum (public under replace-one); partition ``q``'s
   rows have the GLOBAL row indices ``offset_q .. offset_q + count_q - 1``, with
   ``offset_q`` the sum of the counts of the partitions before it. The plan
   (``m``, the noise multiplier, the secret seeds) is fixed now.
3. Sketch pass: each partition clips its rows, generates ITS columns of ``S``
   from the keyed block streams of (secret seed, block of global row indices)
   (:func:`~sparkpriv.mechanisms.regression.sketch_partial`) and contributes
   ``S_part M_part`` (m x p), the row L1 norms of ``S_part`` (m) and the
   largest column norm of ``S_part`` (in its own slot). The partials are
   merged by tree aggregation (:func:`~sparkpriv.spark.batches.sum_partials`);
   the driver holds ``O(m p + partitions)`` floats. It calibrates the noise to
   the realized ``S`` and adds it ONCE, from the driver stream of the noise seed.

Why global row indices (the layout): the columns of ``S`` for a row depend only
on the secret seed, ``m`` and the row's position in the table, never on which
task read it or how the table is partitioned. So a retried task regenerates the
same columns, and the same ordered table gives the same sketch whatever its
partitioning (tested against the numpy path). The price is the count pass (one
extra scan of the selected columns). The input must be deterministic between
the two passes (a file scan is; a non-deterministic upstream plan must be
cached or checkpointed first): each task checks that it read as many rows as
the count pass said, and fails with an error otherwise, so no two rows can
share a column and no column outside ``0 .. n-1`` is used. Privacy does not
depend on the layout: the columns are i.i.d. whatever index a row gets, and
the noise scale is a symmetric function of them (docs/math.md section 6).

``S`` is never materialised whole, written, logged, or put in a query plan:
the seed reaches the executors in the task closure only.

The additive baseline (``scheme="additive"``) is a row map: each partition adds
noise to its clipped rows from the keyed stream of (noise seed, stage,
partition id) (a retried task redraws the same noise); the fit aggregates the
released rows' Gram matrix and, in a second pass, the interval moments.

:func:`release_regression` is the thinnest driver the tests and the benchmark
need; it reserves no budget and writes nothing (the release protocol adds the
ledger, receipt and writer).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from sparkpriv.errors import InputError, ParameterError, SchemaError
from sparkpriv.mechanisms import regression as _reg
from sparkpriv.mechanisms.regression import (
    RegressionFacts,
    RegressionParams,
    RegressionRelease,
    finalize_sketch,
    pack_partial,
    partial_size,
    plan_regression,
)
from sparkpriv.privacy.bounds import Bounds, clip_rows
from sparkpriv.privacy.noise import add_noise
from sparkpriv.privacy.random import stream
from sparkpriv.spark.batches import batch_matrix, map_batches, spark_errors, sum_partials, _marked

__all__ = ["partition_counts", "sketch_total", "release_regression", "additive_rows"]


def _columns(params: RegressionParams) -> list[str]:
    return list(params.features) + [params.target]


def _check_columns(df, params: RegressionParams, caller: str) -> None:
    """Every declared column is present and numeric (the schema is public), else a SchemaError."""
    from pyspark.sql.types import NumericType

    if not params.features or not params.target:
        raise ParameterError(f"{caller} needs feature columns (features=[...]) and a target column (target=...).")
    fields = {f.name: f for f in df.schema.fields}
    for c in _columns(params):
        role = "target" if c == params.target else "feature"
        if c not in fields:
            raise SchemaError(f"The {role} column {c!r} is not in the input. Available columns: "
                              f"{', '.join(fields)}.")
        if not isinstance(fields[c].dataType, NumericType):
            raise SchemaError(f"The {role} column {c!r} has type {fields[c].dataType.simpleString()}; "
                              "a regression needs numeric columns: cast it, or leave it out.")


def partition_counts(df) -> np.ndarray:
    """Rows per partition of ``df`` (index = partition id), by one small job."""
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("pid", LongType(), False), StructField("rows", LongType(), False)])

    def sparkpriv_regression_count(batches, pid):
        rows = 0
        for b in batches:
            rows += b.num_rows
        yield pa.RecordBatch.from_arrays([pa.array([pid], pa.int64()), pa.array([rows], pa.int64())],
                                         ["pid", "rows"])

    got = map_batches(df, sparkpriv_regression_count, schema).collect()
    size = max((int(r["pid"]) for r in got), default=-1) + 1
    counts = np.zeros(size, dtype=np.int64)
    for r in got:
        counts[int(r["pid"])] += int(r["rows"])
    return counts


def _sketch_fn(columns, row_bound, seed, m, offsets, counts, slots, fill):
    offsets = np.asarray(offsets, np.int64)
    counts = np.asarray(counts, np.int64)

    def sparkpriv_regression_sketch(batches, pid):
        start = int(offsets[pid]) if pid < offsets.size else -1
        p = len(columns)
        SM = np.zeros((m, p))
        l1 = np.zeros(m)
        cmax = 0.0
        pos = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if start < 0 or pos + batch.num_rows > counts[pid]:
                raise _marked("the input changed between the count pass and the sketch pass (a partition "
                              "has more rows than counted); cache or checkpoint a non-deterministic input "
                              "before the release")
            X = batch_matrix(batch, columns, fill=fill)
            Mc, _ = clip_rows(X, Bounds(p, row_bound=row_bound))
            a, b, c = _reg.sketch_partial(Mc, seed, m, start + pos)
            SM += a
            l1 += b
            cmax = max(cmax, c)
            pos += batch.num_rows
        if start >= 0 and pos != counts[pid]:
            raise _marked("the input changed between the count pass and the sketch pass (a partition "
                          "has fewer rows than counted); cache or checkpoint a non-deterministic input "
                          "before the release")
        return pack_partial(SM, l1, cmax, slot=min(pid, slots - 1), slots=slots)

    return sparkpriv_regression_sketch


def sketch_total(df, columns: Sequence[str], *, row_bound: float, seed: int, m: int,
                 counts: np.ndarray, fill: float | None = None) -> np.ndarray:
    """The summed sketch partials of ``df`` (layout of :func:`~sparkpriv.mechanisms.regression.pack_partial`
    with one max slot per partition)."""
    counts = np.asarray(counts, np.int64)
    slots = max(int(counts.size), 1)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]) if counts.size else np.zeros(0, np.int64)
    fn = _sketch_fn(list(columns), float(row_bound), int(seed), int(m), offsets, counts, slots, fill)
    return sum_partials(df, fn, partial_size(m, len(columns), slots))


def additive_rows(df, params: RegressionParams, plan, *, fill: float | None = None):
    """``M + W`` as a DataFrame (the additive baseline's release), noise from per-partition keyed streams."""
    from pyspark.sql.types import DoubleType, StructField, StructType

    columns = _columns(params)
    p = len(columns)
    schema = StructType([StructField(c, DoubleType(), False) for c in columns])
    nz = plan.additive_noise()
    seed = int(plan.noise_seed)
    row_bound = float(params.row_bound)

    def sparkpriv_regression_additive(batches, pid):
        rng = stream(seed, _reg.ADDITIVE_STAGE, pid)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            X = batch_matrix(batch, columns, fill=fill)
            Mc, _ = clip_rows(X, Bounds(p, row_bound=row_bound))
            R = add_noise(Mc, nz, rng)
            yield pa.RecordBatch.from_arrays([pa.array(np.ascontiguousarray(R[:, j])) for j in range(p)], columns)

    return map_batches(df.select(*columns), sparkpriv_regression_additive, schema)


def _gram_fn(columns):
    def sparkpriv_regression_gram(batches, pid):
        p = len(columns)
        G = np.zeros((p, p))
        for batch in batches:
            R = batch_matrix(batch, columns)
            G += R.T @ R
        return G.ravel()

    return sparkpriv_regression_gram


def _meat_fn(columns, x, s2, ridge, debias, rows):
    def sparkpriv_regression_meat(batches, pid):
        d = len(columns) - 1
        acc = np.zeros((d, d))
        for batch in batches:
            R = batch_matrix(batch, columns)
            acc += _reg.sandwich_moments(R, x, s2, ridge=ridge, debias=debias, rows=rows)
        return acc.ravel()

    return sparkpriv_regression_meat


def release_regression(df, params: RegressionParams, *, fill: float | None = None) -> RegressionRelease:
    """Private linear regression of ``df[features]`` on ``df[target]`` (thin driver; module docstring).

    Returns the :class:`~sparkpriv.mechanisms.regression.RegressionRelease` (the
    released sketch ``R`` as a numpy ``m x p`` array, or for the additive scheme
    ``R = None`` and the noisy rows in ``release_df``, the plan, noise and fit).
    """
    caller = "release_regression"
    params.validate(caller)
    _check_columns(df, params, caller)
    columns = _columns(params)
    sel = df.select(*columns)
    with spark_errors():
        counts = partition_counts(sel)
    n = int(counts.sum())
    if n == 0:
        raise InputError("The input table is empty: there is nothing to release.")
    plan = plan_regression(params, RegressionFacts(n), caller=caller)
    if plan.scheme == "sketch":
        with spark_errors():
            total = sketch_total(sel, columns, row_bound=params.row_bound, seed=plan.sketch_seed, m=plan.m,
                                 counts=counts, fill=fill)
        return finalize_sketch(total, plan, slots=max(int(counts.size), 1))
    rows_df = additive_rows(sel, params, plan, fill=fill).cache()
    try:
        s2 = plan.additive_noise().variance
        p = len(columns)
        with spark_errors():
            G = sum_partials(rows_df, _gram_fn(columns), p * p).reshape(p, p)
        x, _ = _reg.fit_from_moments(G, n, s2, ridge=params.ridge, debias=params.debias)
        with spark_errors():
            meat = sum_partials(rows_df, _meat_fn(columns, x, s2, params.ridge, params.debias, n),
                                (p - 1) ** 2).reshape(p - 1, p - 1)
        fit = _reg.fit_from_gram_and_meat(G, meat, x, n, s2, ridge=params.ridge, debias=params.debias,
                                          confidence=params.confidence)
    finally:
        rows_df.unpersist()
    return RegressionRelease(None, plan, plan.additive_noise(), 2.0 * float(params.row_bound), fit,
                             release_df=additive_rows(sel, params, plan, fill=fill))
