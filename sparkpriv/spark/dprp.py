"""The DPRP private table release on Spark DataFrames (layer 2 over
:mod:`sparkpriv.mechanisms.dprp`).

Passes over the input (each reads only the declared columns):

0. with ``fill="dp-mean"`` only: per-column sums and counts of non-missing
   values (:func:`~sparkpriv.mechanisms.dprp.impute_partial`), tree-aggregated;
   the driver adds noise once (a third, cheap read of the input);
1. per batch, the prepared rows' Gram matrix (upper triangle, float64) and row
   count per group (:func:`~sparkpriv.mechanisms.dprp.gram_partial`), merged by
   tree aggregation (:func:`~sparkpriv.spark.parquet_scan.aggregate`: a direct Parquet scan for an
   untransformed local Parquet :func:`~sparkpriv.io.inputs.read_table`, see
   :mod:`sparkpriv.spark.parquet_scan`, else ``mapInArrow`` and
   :func:`~sparkpriv.spark.batches.sum_partials`); the driver
   adds the symmetric noise once per group, takes ``eigh`` and builds the
   ``k1 x d`` reconstruction matrix per group;
2. per batch, ``P' = X R + keyed row noise`` and ``X' = P' M``
   (:func:`~sparkpriv.mechanisms.dprp.reconstruct_rows`), decoded back to the
   columns' scale and types, written by :meth:`Release.write`.

Bounded person records of an event table (:class:`~sparkpriv.spark.events.BoundedRecords`)
are released by :mod:`sparkpriv.spark.dprp_records` (sparse passes, thresholded
``items array<int>`` output); :func:`release_dprp` dispatches to it.

Only ``d x d`` Gram matrices and ``k1 x d`` reconstruction matrices (one per
class with public labels) reach the driver. Row noise comes from the stream
keyed by (secret job seed, row-noise stage, partition id): a retried or
recomputed task reproduces the same noise. ``R``, ``M`` and the seed reach the
executors inside the task closure (see :mod:`sparkpriv.spark.batches`); none is
written, logged or put in a plan.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpriv.errors import InputError, ParameterError, SchemaError
from sparkpriv.spark.schema import check_numeric_columns, check_present_columns, schema_fingerprint
from sparkpriv.mechanisms import dprp as core
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import ClipCounts
from sparkpriv.privacy.random import stream
from sparkpriv.release import Release, reserve
from sparkpriv.spark.batches import (
    BatchMap,
    _marked,
    batch_matrix,
    owner_counters,
    spark_errors,
)
from sparkpriv.spark.parquet_scan import aggregate

__all__ = ["release_dprp", "dprp_schema"]

_log = logging.getLogger(__name__)


def dprp_schema(df, columns: Sequence[str], label: str | None, keep_columns: Sequence[str]):
    """Output schema: kept public columns, the feature columns (integer and float
    types kept, other numeric types as double), then the label column."""
    from pyspark.sql.types import DoubleType, FloatType, IntegralType, StructField, StructType

    fields = [df.schema[c] for c in keep_columns]
    for c in columns:
        t = df.schema[c].dataType
        fields.append(StructField(c, t if isinstance(t, (IntegralType, FloatType, DoubleType)) else DoubleType(),
                                  True))
    if label is not None:
        fields.append(StructField(label, df.schema[label].dataType, True))
    return StructType(fields)


def _coerce_classes(classes, field) -> tuple:
    from pyspark.sql.types import BooleanType, FractionalType, IntegralType, StringType

    t = field.dataType
    try:
        if isinstance(t, IntegralType):
            out = []
            for c in classes:
                f = float(c)
                if not f.is_integer():
                    raise ValueError
                out.append(int(f))
        elif isinstance(t, FractionalType):
            out = [float(c) for c in classes]
        elif isinstance(t, StringType):
            out = [str(c) for c in classes]
        elif isinstance(t, BooleanType):
            out = [c if isinstance(c, bool) else str(c).lower() in ("true", "1") for c in classes]
        else:
            raise SchemaError(f"The label column {field.name!r} has type {t.simpleString()}; use an integer, "
                              "string or boolean label column.")
    except (TypeError, ValueError):
        raise ParameterError(
            f"The declared classes {list(classes)!r} do not match the type {t.simpleString()} of the label "
            f"column {field.name!r}."
        ) from None
    return tuple(out)



def release_dprp(
    df,
    *,
    columns: Sequence[str] | None = None,
    label: str | None = None,
    labels: str | None = None,
    classes: Sequence | None = None,
    epsilon: float,
    delta: float,
    lower: Sequence[float] | None = None,
    upper: Sequence[float] | None = None,
    k1: int | None = None,
    k2: int | None = None,
    row_bound: float | None = None,
    budget_split=core.DEFAULT_BUDGET_SPLIT,
    fill: float | str | None = None,
    impute_share: float = core.DEFAULT_IMPUTE_SHARE,
    label_scale: float = 1.0,
    neighbors: str = "replace-one",
    keep_columns: Sequence[str] = (),
    threshold: float | None = None,
    ledger=None,
    table_id: str | None = None,
    source: str | None = None,
) -> Release:
    """DPRP private release of a table: the same columns, on the same scale.

    Parameters
    ----------
    df : pyspark.sql.DataFrame or BoundedRecords
        One row per record (person); or the bounded person records of an event
        table (:func:`~sparkpriv.spark.events.bound_contributions`), released
        as ``items array<int>`` (see
        :func:`~sparkpriv.spark.dprp_records.release_dprp_records`: the bounds
        come from the item cap, and ``columns``, ``lower``, ``upper``,
        ``row_bound``, ``label``, ``labels``, ``classes``, ``fill`` and
        ``keep_columns`` are refused).
    columns : sequence of str
        Numeric feature columns (n_features = d); required for a DataFrame.
        Integer columns are rounded back to integers in the output.
    label : str, optional
        Label column (integer, string or boolean); ``labels`` says how it is treated.
    labels : {"public", "private"}
        ``"public"``: the label is public data, released as it is; one run per
        class (parallel composition); the class sizes are released.
        ``"private"``: the label is protected: a scaled one-hot block inside the
        row bound, decoded by argmax.
    classes : sequence
        The declared label values (at least two). Declared, not read from the
        data, so the input is read only twice.
    epsilon : float > 0
    delta : float in (0, 1)
    lower, upper : sequence of float
        Declared public per-column bounds (features are mapped to [0, 1] by them).
    k1, k2 : int, optional
        Projection dimension and eigenvectors kept (defaults ``4 k2`` and
        ``round(0.6 d)``; see :mod:`sparkpriv.mechanisms.dprp`).
    row_bound : float, optional
        ``Z``, the L2 bound of a prepared row (default: the largest norm the
        box allows, so no row is norm-clipped).
    budget_split : (float, float)
        Shares of the Gaussian-DP budget for (projection, Gram), summing to 1.
    fill : float or "dp-mean", optional
        Public constant replacing nulls in ``columns``, or ``"dp-mean"``: a DP
        column mean spending ``impute_share`` of the budget (one more, cheap,
        read of the input). Never a plain data mean.
    impute_share : float in (0, 1)
    label_scale : float > 0
        Value of the one-hot label entry (private labels).
    keep_columns : sequence of str
        Input columns declared PUBLIC, copied unchanged.
    threshold : float > 0, optional
        Event records only: a released person visited an item when its
        reconstructed value is at least this (default 0.5).
    ledger, table_id, source
        As :func:`~sparkpriv.spark.projection.release_projection`: the budget is
        reserved before any data is read.

    Returns
    -------
    Release
        ``release.df`` is the lazy private DataFrame. The Gram pass runs inside
        this call (so input errors such as NaN surface here).

    Privacy
    -------
    Replace-one neighbours; sensitivities are the exact suprema over the
    declared domain (docs/dprp.md, "Sensitivity"): ``sqrt(d) s_max(R)``
    (projection, for the realized secret ``R``; ``sqrt(d + 2) s_max(R)`` with
    private labels) and ``sqrt(d (d + 1) / 2)`` (Gram's unique entries;
    ``sqrt(d (d + 1) / 2 + d + 2)`` with private labels) at the default
    ``Z``, enforced by the [0, 1] box and the ``Z`` clip; Gaussian noise composed exactly in Gaussian DP to
    (epsilon, delta). Public: bounds, d, k1, k2, noise scales, classes, class
    sizes with public labels, ``keep_columns``. Secret: ``R`` and the seeds.
    """
    caller = "release_dprp"
    from sparkpriv.spark.events import BoundedRecords

    if isinstance(df, BoundedRecords):
        given = [n for n, val in (("columns", columns), ("lower", lower), ("upper", upper),
                                  ("row_bound", row_bound), ("label", label), ("labels", labels),
                                  ("classes", classes), ("fill", fill),
                                  ("keep_columns", list(keep_columns) or None),
                                  ("label_scale", None if label_scale == 1.0 else label_scale),
                                  ("impute_share", None if impute_share == core.DEFAULT_IMPUTE_SHARE
                                   else impute_share)) if val is not None]
        if given:
            raise ParameterError(
                f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                "bounded event records: the items are the vocabulary, the bounds come from the item "
                "cap (max_items, weights), and an event table has no label or public columns. "
                "Remove them."
            )
        from sparkpriv.spark.dprp_records import release_dprp_records

        return release_dprp_records(df, epsilon=epsilon, delta=delta, k1=k1, k2=k2,
                                    budget_split=budget_split, threshold=threshold, neighbors=neighbors,
                                    ledger=ledger, table_id=table_id, source=source)
    if columns is None:
        raise ParameterError(f"The 'columns' parameter of {caller} is required for a table input: "
                             "the numeric feature columns (--columns).")
    if threshold is not None:
        raise ParameterError(
            f"The 'threshold' parameter of {caller} applies to bounded event records only: a table "
            "release keeps its columns and scale (threshold the released columns afterwards)."
        )
    columns = list(columns)
    keep_columns = list(keep_columns)
    check_numeric_columns(df, columns)
    check_present_columns(df, keep_columns, role="kept (public)")
    if label is not None:
        check_present_columns(df, [label], role="label")
        if label in columns or label in keep_columns:
            raise ParameterError(f"The label column {label!r} must not also be a feature or kept column.")
        if labels is None:
            raise ParameterError(
                f"{caller} got label={label!r}: declare labels='public' (released as they are, one run "
                "per class, class sizes released) or labels='private' (protected, decoded by argmax)."
            )
        if classes is None:
            raise ParameterError(
                f"The 'classes' parameter of {caller} is required with a label column: declare the "
                "label values (e.g. classes=[0, 1] / --classes 0,1)."
            )
        classes = _coerce_classes(classes, df.schema[label])
    elif labels is not None:
        raise ParameterError(f"The 'labels' parameter of {caller} is {labels!r} but no label column was given.")
    overlap = set(columns) & set(keep_columns)
    if overlap:
        raise ParameterError(
            f"Column {sorted(overlap)[0]!r} is both a feature column and a kept public column; "
            "a released column cannot be both private input and public output."
        )
    from pyspark.sql.types import IntegralType

    d = len(columns)
    v = core.validate_params(d=d, epsilon=epsilon, delta=delta, lower=lower, upper=upper, k1=k1, k2=k2,
                             row_bound=row_bound, budget_split=budget_split, labels=labels,
                             classes=classes, label_scale=label_scale, fill=fill,
                             impute_share=impute_share, neighbors=neighbors, caller=caller)
    int_cols = [j for j, c in enumerate(columns) if isinstance(df.schema[c].dataType, IntegralType)]
    R, seed = core.draw_secrets(d + v["n_label_columns"], v["k1"])
    plan = core.plan_dprp(R, d=d, epsilon=epsilon, delta=delta, lower=v["lower"], upper=v["upper"],
                          k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"],
                          labels=labels, classes=classes, label_scale=label_scale,
                          integer_columns=int_cols, fill=fill, impute_share=impute_share,
                          neighbors=neighbors)
    event = plan.dp_event()
    eps = epsilon_of(event, plan.delta)
    params = {
        "columns": columns, "label": label, "labels": labels,
        "classes": [core._jsonable(c) for c in plan.classes], "epsilon": float(epsilon),
        "delta": float(delta), "k1": plan.k1, "k2": plan.k2, "row_bound": plan.row_bound,
        "budget_split": list(plan.budget_split), "fill": fill,
        "impute_share": plan.impute_share, "label_scale": plan.label_scale,
        "lower": list(plan.lower), "upper": list(plan.upper), "keep_columns": keep_columns,
        "neighbors": neighbors,
    }
    hold = reserve(event=event, mechanism="dprp", parameters=params, ledger=ledger, table_id=table_id)
    try:
        Ms, extra = _driver_passes(df, plan, R, seed, columns, label, caller)
    except BaseException as exc:
        hold.abort(f"release failed before publishing: {type(exc).__name__}")
        hold.close()
        raise

    schema = dprp_schema(df, columns, label, keep_columns)
    counters = owner_counters(df.sparkSession)
    fill_values = extra.pop("_fill_values")
    fn = _batch_fn(plan, R, Ms, plan.projection_noise, seed, columns, label, keep_columns, fill_values,
                   counters)
    sel = [*keep_columns, *columns] + ([label] if label is not None else [])
    rows = BatchMap(df.select(*sel), fn, schema)
    out = rows.to_df()
    del R, Ms

    def diagnostics() -> dict:
        if counters is None:
            return {}
        return {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                "rows_norm_clipped": counters[2].value}

    public = dict(plan.to_public_dict(), **extra, parameters=params,
                  matrix_source="OS entropy, discarded after the job",
                  events_note="GaussianDpEvent(1/mu_i) per step; the noise objects' own multipliers "
                              "are at least these (checked)")
    input_info = {
        "source": source,
        "schema_fingerprint": schema_fingerprint(df.schema),
        "columns": columns,
        "label": label,
        "kept_public_columns": keep_columns,
        "fill_for_nulls": fill,
    }
    return Release(df=out, mechanism="dprp", event=event, epsilon=eps, delta=plan.delta, public=public,
                   input_info=input_info, hold=hold, diagnostics=diagnostics, source_df=None, rows=rows)


def gram_pass(df, plan, columns: Sequence[str], label: str | None, fill_values) -> np.ndarray:
    """The summed :func:`~sparkpriv.mechanisms.dprp.gram_partial` of the whole input."""
    lab = [label] if label is not None else []
    size = plan.n_groups * (1 + plan.d_aug * (plan.d_aug + 1) // 2)
    return aggregate(df, [*columns, *lab], _gram_fn(plan, columns, label, fill_values), size, strings=lab)


def _driver_passes(df, plan, R, seed, columns, label, caller):
    """Pass 0 (DP means, optional) and pass 1 (Gram), then the driver solve."""
    d = plan.d
    extra: dict = {}
    fill_values = None
    with spark_errors():
        if plan.fill == "dp-mean":
            tot = aggregate(df, columns, _impute_fn(plan, columns), 2 * d + 1)
            n = int(tot[-1])
            if n == 0:
                raise InputError("The input table is empty: there is nothing to release.")
            noise = plan.impute_noise(n)
            core.check_noise_multiplier(noise, plan.mu["impute"])
            fill_values = core.dp_column_means(tot, noise, stream(seed, core.IMPUTE_NOISE_STAGE), plan)
            extra["impute_noise"] = noise.to_public_dict()
        elif plan.fill is not None:
            fill_values = np.full(d, float(plan.fill))
        total = gram_pass(df, plan, columns, label, fill_values)
    sizes, grams = core.gram_from_partial(total, plan.d_aug, plan.n_groups)
    if sizes.sum() == 0:
        raise InputError("The input table is empty: there is nothing to release.")
    if plan.label_mode == "public":
        if np.count_nonzero(sizes) < 2:
            raise InputError(
                f"The label column {label!r} has one class only in the data: there is nothing to "
                "separate; release without a label column."
            )
        extra["class_sizes"] = {str(core._jsonable(c)): int(s) for c, s in zip(plan.classes, sizes)}
        extra["class_sizes_note"] = ("labels are declared public: every row's label is released as it "
                                     "is, the classes are released by separate runs (parallel "
                                     "composition), and these class sizes are released")
    gnoise = plan.gram_noise(int(sizes.max()))
    core.check_noise_multiplier(gnoise, plan.mu["gram"])
    core.check_noise_multiplier(plan.projection_noise, plan.mu["projection"])
    extra["gram_noise"] = gnoise.to_public_dict()
    Cs = core.noisy_grams(grams, gnoise, stream(seed, core.GRAM_NOISE_STAGE))
    Ms = core.solve(Cs, R, plan.k2, caller=caller)
    extra["_fill_values"] = fill_values
    if plan.fill == "dp-mean":
        extra["dp_fill_values"] = [float(x) for x in fill_values]
    return Ms, extra


def _read_batch(batch, columns, fill_values):
    """``(X, missing)``: nulls filled by ``fill_values`` (missing is None without fill)."""
    if fill_values is None:
        return batch_matrix(batch, columns), None
    X = batch_matrix(batch, columns, fill=0.0)
    missing = np.zeros(X.shape, dtype=bool)
    for j, c in enumerate(columns):
        col = batch.column(c)
        if col.null_count:
            missing[:, j] = col.is_null().to_numpy(zero_copy_only=False)
    core.fill_missing(X, missing, fill_values)
    return X, missing


def _label_codes(batch, label, classes_arr):
    col = batch.column(label)
    if col.null_count:
        raise _marked(f"the label column {label!r} has null values; remove those rows or give them a class")
    idx = pc.index_in(col, value_set=classes_arr)
    if idx.null_count:
        bad = col.filter(pc.is_null(idx))[0].as_py()
        raise _marked(f"the label column {label!r} holds a value that is not a declared class "
                      f"(e.g. {bad!r}); declare every class (classes / --classes)")
    return idx.to_numpy(zero_copy_only=False).astype(np.int64)


def _impute_fn(plan, columns):
    def sparkpriv_dprp_means(batches, pid):
        acc = np.zeros(2 * plan.d + 1)
        for batch in batches:
            X = batch_matrix(batch, columns, fill=0.0)
            missing = np.zeros(X.shape, dtype=bool)
            for j, c in enumerate(columns):
                col = batch.column(c)
                if col.null_count:
                    missing[:, j] = col.is_null().to_numpy(zero_copy_only=False)
            acc += core.impute_partial(X, missing, plan)
        return acc

    return sparkpriv_dprp_means


def _gram_fn(plan, columns, label, fill_values):
    """Per-partition Gram partial, built from plain values only (it is pickled)."""
    classes_arr = pa.array(list(plan.classes)) if label is not None else None
    public = plan.label_mode == "public"
    size = plan.n_groups * (1 + plan.d_aug * (plan.d_aug + 1) // 2)

    def sparkpriv_dprp_gram(batches, pid):
        acc = np.zeros(size)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            X, _ = _read_batch(batch, columns, fill_values)
            codes = _label_codes(batch, label, classes_arr.cast(batch.column(label).type)) if label else None
            Xp, _ = core.prepare_rows(X, plan, codes)
            acc += core.gram_partial(Xp, codes if public else None, plan.n_groups)
        return acc

    return sparkpriv_dprp_gram


def _batch_fn(plan, R, Ms, noise, seed, columns, label, keep_columns, fill_values, counters):
    """Per-partition release function, built from plain values only (it is pickled).

    ``noise=None`` gives the reconstruction without noise (used to test that the
    Spark path equals the numpy path).
    """
    R = np.ascontiguousarray(R)
    Ms = [np.ascontiguousarray(M) for M in Ms]
    classes_list = list(plan.classes)
    public = plan.label_mode == "public"
    names = list(keep_columns) + list(columns) + ([label] if label is not None else [])

    def sparkpriv_dprp(batches, pid):
        rng = stream(seed, core.ROW_NOISE_STAGE, pid)
        tot = ClipCounts()
        for batch in batches:
            X, _ = _read_batch(batch, columns, fill_values)
            codes = None
            if label is not None:
                cls = pa.array(classes_list).cast(batch.column(label).type)
                codes = _label_codes(batch, label, cls)
            Xp, counts = core.prepare_rows(X, plan, codes)
            tot = tot + counts
            Xr = core.reconstruct_rows(Xp, R, Ms, codes if public else None, noise, rng)
            Xo, out_codes = core.decode_rows(Xr, plan)
            arrays = [batch.column(c) for c in keep_columns]
            for j, c in enumerate(columns):
                t = batch.column(c).type
                if pa.types.is_integer(t):
                    arrays.append(pa.array(Xo[:, j].astype(np.int64)).cast(t))
                elif pa.types.is_float32(t):
                    arrays.append(pa.array(Xo[:, j]).cast(t))
                else:
                    arrays.append(pa.array(Xo[:, j]))
            if label is not None:
                arrays.append(batch.column(label) if public else cls.take(pa.array(out_codes)))
            yield pa.RecordBatch.from_arrays(arrays, names)
        if counters is not None:
            counters[0].add(tot.rows)
            counters[1].add(tot.box_clipped)
            counters[2].add(tot.norm_clipped)

    return sparkpriv_dprp
