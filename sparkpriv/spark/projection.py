"""The JL projection release on Spark DataFrames (layer 2 over
:mod:`sparkpriv.mechanisms.projection`).

Every Arrow batch is clipped and projected by the same numpy function as the
in-memory path (:func:`~sparkpriv.mechanisms.projection.project_rows`), so the
two agree exactly before noise. Row noise comes from the stream keyed by
(secret job seed, projection stage, partition id): a retried or recomputed
task reproduces the same noise.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import pyarrow as pa

from sparkpriv._validation import Interval, check_param, refuse_row_level_add_remove
from sparkpriv.errors import ParameterError
from sparkpriv.spark.schema import check_numeric_columns, check_present_columns, schema_fingerprint
from sparkpriv.mechanisms.projection import (
    NOISE_STAGE,
    plan_projection,
    project_rows,
    secret_matrix_and_seed,
)
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of
from sparkpriv.privacy.bounds import Bounds, ClipCounts, broadcast_box, clip_rows, row_norms
from sparkpriv.privacy.calibration import split_epsilon
from sparkpriv.privacy.quantile import (
    DEFAULT_EXPONENTS,
    candidate_bounds,
    choose_bound,
    histogram_noise,
    norm_bucket_counts,
)
from sparkpriv.privacy.random import new_secret_seed, stream
from sparkpriv.release import Release, reserve
from sparkpriv.spark.batches import (
    BatchMap,
    batch_matrix,
    owner_counters,
    spark_errors,
    sum_partials,
)

__all__ = ["release_projection", "projected_schema"]

_log = logging.getLogger(__name__)


def projected_schema(df, k: int, keep_columns: Sequence[str]):
    from pyspark.sql.types import DoubleType, StructField, StructType

    fields = [df.schema[c] for c in keep_columns]
    fields += [StructField(f"z{i}", DoubleType(), False) for i in range(k)]
    return StructType(fields)



def release_projection(
    df,
    *,
    columns: Sequence[str] | None = None,
    k: int,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "laplace",
    neighbors: str = "replace-one",
    row_bound: float | None = None,
    norm: str = "l2",
    lower: Sequence[float] | None = None,
    upper: Sequence[float] | None = None,
    element_bound: float | None = None,
    keep_columns: Sequence[str] = (),
    fill: float | None = None,
    matrix_key: bytes | None = None,
    row_bound_quantile: float | None = None,
    bound_epsilon_share: float = 0.1,
    bound_search: tuple[int, int] = DEFAULT_EXPONENTS,
    ledger=None,
    table_id: str | None = None,
    source: str | None = None,
) -> Release:
    """Private JL projection of the ``columns`` of a Spark DataFrame.

    Parameters
    ----------
    df : pyspark.sql.DataFrame or BoundedRecords
        One row per record (person); or the bounded person records of an event
        table (:func:`~sparkpriv.spark.events.bound_contributions`), released
        as sparse records (see
        :func:`~sparkpriv.spark.sparse_projection.release_sparse_projection`;
        ``columns`` and the bounds then come from the records).
    columns : sequence of str
        The numeric columns ``x`` (n_features = d of them; DataFrame input).
    k : int in [1, d]
        Output dimension; the output has columns ``z0 .. z{k-1}``.
    epsilon : float > 0
    delta : float
        0 for Laplace noise (pure epsilon-DP); in (0, 1) for Gaussian noise.
    noise : {"laplace", "gaussian"}
    neighbors : {"replace-one", "element"}
        ``"element"`` is the paper's element-wise relation: it protects ONE
        ATTRIBUTE of a record, not a person; it needs ``lower``/``upper``
        and/or ``element_bound`` and cannot be combined with ``row_bound`` or
        ``row_bound_quantile`` (a norm clip rescales the whole row).
        ``"add-remove"`` is refused: the output has one row per input row.
    row_bound, norm : float, {"l2", "l1"}
        Declared bound on each row's norm (rows are clipped to it).
    lower, upper : float or sequence of float
        Declared per-column box (values are clipped to it): one value per
        column, or a single value for every column.
    element_bound : float
        Largest change of one attribute (element-wise relation only).
    row_bound_quantile : float in (0, 1], optional
        Instead of declaring ``row_bound``, estimate it as this DP quantile of
        the row norms (after the box clip), spending ``bound_epsilon_share`` of
        ``epsilon`` on a Laplace histogram over the public candidates
        ``2^j, j in bound_search`` (:mod:`sparkpriv.privacy.quantile`). The
        chosen bound is released in the receipt.
    keep_columns : sequence of str
        Input columns declared PUBLIC, copied to the output unchanged. Nothing
        else of the input (person keys included) is copied.
    fill : float, optional
        Public value that replaces nulls in ``columns``.
    matrix_key : bytes, optional
        Secret key from which ``P`` is derived, so later releases can use the
        same ``P``; default: fresh OS entropy.
    ledger, table_id
        Budget ledger (URL or :class:`~sparkpriv.ledger.Ledger`) and the logical
        table id the spend is recorded against. The reservation is made before
        any data is read; :meth:`Release.write` commits it.
    source : str, optional
        Where the input came from (recorded in the receipt).

    Returns
    -------
    Release
        ``release.df`` is the lazy private DataFrame; ``release.write(path)``
        publishes it with its receipt.

    Privacy
    -------
    Neighbours: ``neighbors``. Sensitivity: exact L1 (Laplace) or L2 (Gaussian)
    sensitivity of ``x -> x P`` for the realized secret ``P`` and the declared
    bounds, enforced by clipping each row before projecting. Guarantee:
    ``epsilon``-DP (Laplace) or ``(epsilon, delta)``-DP (Gaussian), one
    dp_accounting event. Public: d, k, bounds, the noise scale, n under
    replace-one, and ``keep_columns``. Secret: ``P`` and the noise seed, which
    never leave the job.
    """
    caller = "release_projection"
    refuse_row_level_add_remove(neighbors, release="a projection release", caller=caller)
    from sparkpriv.spark.events import BoundedRecords

    if isinstance(df, BoundedRecords):
        given = {n: v for n, v in (("columns", columns), ("row_bound", row_bound), ("lower", lower),
                                   ("upper", upper), ("element_bound", element_bound),
                                   ("row_bound_quantile", row_bound_quantile), ("fill", fill))
                 if v is not None}
        if given or keep_columns:
            raise ParameterError(
                f"{caller}: {', '.join(sorted(given) or ['keep_columns'])} cannot be given with event-table "
                "records: their bounds come from the item cap (max_items) and they have no public columns."
            )
        from sparkpriv.spark.sparse_projection import release_sparse_projection

        return release_sparse_projection(df, k=k, epsilon=epsilon, delta=delta, noise=noise,
                                         neighbors=neighbors, matrix_key=matrix_key, ledger=ledger,
                                         table_id=table_id, source=source)
    columns = list(columns or ())
    keep_columns = list(keep_columns)
    check_numeric_columns(df, columns)
    check_present_columns(df, keep_columns, role="kept (public)")
    overlap = set(columns) & set(keep_columns)
    if overlap:
        raise ParameterError(
            f"Column {sorted(overlap)[0]!r} is both a feature column and a kept public column; "
            "a released column cannot be both private input and public output."
        )
    d = len(columns)
    check_param("k", k, [Interval("integer", 1, d, "both")], caller)
    lower = broadcast_box(lower, d, "lower", caller)
    upper = broadcast_box(upper, d, "upper", caller)
    check_param("fill", fill, [None, Interval("real", None, None, "neither")], caller)
    dp_bound = row_bound_quantile is not None
    if dp_bound:
        check_param("row_bound_quantile", row_bound_quantile, [Interval("real", 0, 1, "right")], caller)
        check_param("bound_epsilon_share", bound_epsilon_share, [Interval("real", 0, 1, "neither")], caller)
        if row_bound is not None:
            raise ParameterError(
                f"{caller}: row_bound_quantile estimates the row bound; it cannot be combined with a "
                "declared row_bound. Give one or the other."
            )
        if neighbors == "element":
            raise ParameterError(
                f"The 'row_bound_quantile' parameter of {caller} cannot be combined with "
                "neighbors='element': clipping a row onto the norm ball rescales the whole row, so a "
                "change of one attribute becomes a change of every coordinate and the element-wise "
                "sensitivity no longer bounds it. Declare a per-column box (lower/upper) and/or "
                "element_bound instead, or use neighbors='replace-one'."
            )
        candidates = candidate_bounds(tuple(bound_search))
        eps_bound, eps_release = split_epsilon(epsilon, bound_epsilon_share)  # sum <= epsilon
        hist_noise = _wide_grid(histogram_noise(epsilon=eps_bound, neighbors=neighbors,
                                                buckets=candidates.size + 1))
        bounds = Bounds(d, _tup(lower), _tup(upper), float(candidates[-1]), norm, None, _caller=caller)
    else:
        eps_release = epsilon
        bounds = Bounds(d, _tup(lower), _tup(upper), row_bound, norm, element_bound, _caller=caller)

    P, seed = secret_matrix_and_seed(d, k, matrix_key)
    plan = plan_projection(P, bounds, epsilon=eps_release, delta=delta, noise=noise,
                           neighbors=neighbors, caller=caller)
    # The event depends on epsilon (and delta) only, not on the bound: it is known
    # before the data is read, even when the bound itself comes from the data.
    event = compose([hist_noise.dp_event(), plan.dp_event()]) if dp_bound else plan.dp_event()
    eps = epsilon_of(event, plan.delta)
    params = {
        "columns": columns, "k": k, "epsilon": float(epsilon), "delta": float(delta),
        "noise": noise, "neighbors": neighbors, "keep_columns": keep_columns, "fill": fill,
        "bounds": bounds.to_public_dict() if not dp_bound else {
            "lower": bounds.to_public_dict()["lower"], "upper": bounds.to_public_dict()["upper"],
            "row_bound": f"DP quantile {row_bound_quantile}", "norm": norm},
        "reusable_projection": matrix_key is not None,
    }
    hold = reserve(event=event, mechanism="projection", parameters=params, ledger=ledger,
                   table_id=table_id)
    bound_info = None
    if dp_bound:
        try:
            R = _dp_row_bound(df, columns, bounds, fill, candidates, hist_noise, row_bound_quantile)
        except BaseException as exc:
            hold.abort(f"estimating the row bound failed: {type(exc).__name__}")
            hold.close()
            raise
        bounds = Bounds(d, _tup(lower), _tup(upper), R, norm, None, _caller=caller)
        plan = plan_projection(P, bounds, epsilon=eps_release, delta=delta, noise=noise,
                               neighbors=neighbors, caller=caller)
        bound_info = {
            "method": "DP quantile of row norms (Laplace histogram over public power-of-two candidates)",
            "quantile": row_bound_quantile, "epsilon": epsilon * bound_epsilon_share,
            "candidates": [float(candidates[0]), float(candidates[-1])],
            "histogram_noise": hist_noise.to_public_dict(), "chosen_row_bound": R,
        }
        _log.info("DP row bound: %.6g (quantile %g)", R, row_bound_quantile)
    public = plan.to_public_dict()
    if bound_info is not None:
        public["row_bound_estimation"] = bound_info

    schema = projected_schema(df, k, keep_columns)
    counters = owner_counters(df.sparkSession)
    fn = _batch_fn(P, bounds, plan.noise, seed, columns, keep_columns, k, fill, counters, plan.value_bound)
    rows = BatchMap(df.select(*keep_columns, *columns), fn, schema)
    out = rows.to_df()
    del P

    def diagnostics() -> dict:
        if counters is None:
            return {}
        return {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                "rows_norm_clipped": counters[2].value}

    input_info = {
        "source": source,
        "schema_fingerprint": schema_fingerprint(df.schema),
        "columns": columns,
        "kept_public_columns": keep_columns,
        "fill_for_nulls": fill,
    }
    public = dict(public, parameters=params, matrix_source="secret key (held outside the output)"
                  if matrix_key is not None else "OS entropy, discarded after the job")
    return Release(df=out, mechanism="projection", event=event, epsilon=eps, delta=plan.delta,
                   public=public, input_info=input_info, hold=hold, diagnostics=diagnostics,
                   source_df=df, rows=rows)


def _dp_row_bound(df, columns, bounds, fill, candidates, hist_noise, quantile) -> float:
    """Pass over the data: noisy histogram of row norms; noise drawn once on the driver."""
    box = Bounds(bounds.dim, bounds.lower, bounds.upper)
    norm = bounds.norm
    size = candidates.size + 1

    def sparkpriv_norm_histogram(batches, pid):
        acc = np.zeros(size)
        for batch in batches:
            X, _ = clip_rows(batch_matrix(batch, columns, fill=fill), box)
            acc += norm_bucket_counts(row_norms(X, norm), candidates)
        return acc

    with spark_errors():
        counts = sum_partials(df.select(*columns), sparkpriv_norm_histogram, size)
    # clamping each count (a public range) never increases the sensitivity; the
    # grid holds 2^30 noise scales, so this only acts on astronomically large tables
    _clamp = hist_noise.max_abs_value
    np.clip(counts, -_clamp, _clamp, out=counts)
    rng = stream(new_secret_seed("bound-histogram-noise"), 0)
    noisy = _noise.add_noise(counts, hist_noise, rng)
    return choose_bound(noisy, candidates, quantile)


def _wide_grid(hist_noise):
    """The same Laplace noise (same event) on a grid holding counts up to 2^30 noise scales.

    The default grid holds only 2^22 scales: with a large epsilon a bucket of a
    few thousand rows would overflow it, and the release would fail because of
    the data. The coarser grid costs a factor ``1 + dim g / sensitivity`` (about
    ``1 + dim 2^-30``) in noise.
    """
    return _noise.calibrate_laplace_noise(
        sensitivity=hist_noise.sensitivity, epsilon=hist_noise.epsilon, dim=hist_noise.dim,
        max_abs=2.0**30 * hist_noise.sensitivity / hist_noise.epsilon)


def _tup(x):
    return None if x is None else tuple(float(v) for v in x)


def _batch_fn(P, bounds, noise, seed, columns, keep_columns, k, fill, counters, value_bound=None):
    """Build the per-partition function from plain values only (it is pickled).

    ``noise=None`` gives the projection before noise (used to test that the
    Spark path equals the numpy path exactly). ``value_bound``: the plan's
    public range, projected values are clamped to it (as on the numpy path).
    """
    value_bound = None if value_bound is None else float(value_bound)
    P = np.ascontiguousarray(P)
    names = list(keep_columns) + [f"z{i}" for i in range(k)]

    def sparkpriv_projection(batches, pid):
        rng = stream(seed, NOISE_STAGE, pid)
        tot = ClipCounts()
        for batch in batches:
            X = batch_matrix(batch, columns, fill=fill)
            Y, counts = project_rows(X, P, bounds, value_bound)
            cols = _noise.transposed(Y) if noise is None else _noise.add_noise_transposed(Y, noise, rng)
            tot = tot + counts
            arrays = [batch.column(c) for c in keep_columns]
            arrays += [pa.array(c) for c in cols]
            yield pa.RecordBatch.from_arrays(arrays, names)
        if counters is not None:
            counters[0].add(tot.rows)
            counters[1].add(tot.box_clipped)
            counters[2].add(tot.norm_clipped)

    return sparkpriv_projection
