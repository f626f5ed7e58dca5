"""The DPRP release of bounded person records from an event table (layer 2
over :mod:`sparkpriv.mechanisms.dprp` and :mod:`sparkpriv.mechanisms.sparse`;
``release_dprp(records, ...)`` calls it).

Two passes over the grouped events, each running the ``groupBy(person)``
shuffle of :func:`~sparkpriv.spark.events.bound_contributions` (the keyed item
choice makes both passes see identical records):

1. per Arrow batch, the records are bounded (:meth:`BoundedRecords.record_fn`)
   and their Gram matrix taken as a sparse product
   (:func:`~sparkpriv.mechanisms.dprp_records.gram_partial_sparse`), merged by tree
   aggregation (:func:`~sparkpriv.spark.batches.sum_partials`); the driver
   adds the symmetric noise once, takes ``eigh`` and builds the ``k1 x d``
   reconstruction matrix. This pass runs inside the release call and counts
   the truncation diagnostics (once).
2. per Arrow batch, ``P' = (X / c) R + keyed row noise`` from the sparse
   records and ``X' = P' M`` thresholded, a chunk of rows at a time
   (:func:`~sparkpriv.mechanisms.dprp_records.reconstruct_sparse_items`): the output is
   ``items array<int>``, the vocabulary indices where the reconstructed value
   is at least ``threshold``. The rows pass reads the keyed layout
   (:attr:`~sparkpriv.spark.events.BoundedRecords.layout`) and each task puts its
   partition's people in the keyed order
   (:func:`~sparkpriv.spark.events.in_person_hash_order`, as in
   :mod:`sparkpriv.spark.sparse_projection`), so the keyed per-partition
   noise stream meets the same people in the same order when a task is
   retried or recomputed.

No ``d``-wide row is built except the chunked reconstruction. ``R``, ``M``
and the noise seed travel in the task closures, never in a plan.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import InputError
from sparkpriv.mechanisms import dprp as core
from sparkpriv.mechanisms import dprp_records as rcore
from sparkpriv.mechanisms.sparse import clip_sparse_rows
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.random import stream
from sparkpriv.release import Release, reserve
from sparkpriv.spark.batches import BatchMap, spark_errors, sum_partials
from sparkpriv.spark.events import BoundedRecords, counters_dict, in_person_hash_order, make_counters

__all__ = ["release_dprp_records", "items_schema", "DEFAULT_THRESHOLD"]

_log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 0.5


def items_schema():
    """The output: one row per person, ``items array<int>`` (sorted vocabulary indices)."""
    from pyspark.sql.types import ArrayType, IntegerType, StructField, StructType

    return StructType([StructField("items", ArrayType(IntegerType(), False), False)])


def release_dprp_records(
    records: BoundedRecords,
    *,
    epsilon: float,
    delta: float,
    k1: int | None = None,
    k2: int | None = None,
    budget_split=core.DEFAULT_BUDGET_SPLIT,
    threshold: float | None = None,
    neighbors: str = "replace-one",
    ledger=None,
    table_id: str | None = None,
    source: str | None = None,
) -> Release:
    """DPRP release of bounded person records (``release_dprp(records, ...)``).

    Parameters
    ----------
    records : BoundedRecords
        From :func:`~sparkpriv.spark.events.bound_contributions`.
    epsilon : float > 0
    delta : float in (0, 1)
    k1, k2 : int, optional
        Projection dimension and eigenvectors kept; defaults ``k2 = min(d, 64)``
        and ``k1 = 4 k2`` (the table defaults, ``0.6 d``, cost ``4 k2`` noise
        draws and ``4 k2 d`` multiply-adds per person: far too many for a
        vocabulary of ``d = 1303`` towers).
    budget_split : (float, float)
        Shares of the Gaussian-DP budget for (projection, Gram).
    threshold : float > 0, optional
        A released person visited item ``j`` when the reconstructed value, in
        the records' units (1 for binary, events for counts), is at least this
        (default 0.5).
    neighbors, ledger, table_id, source
        As :func:`~sparkpriv.spark.dprp.release_dprp`.

    Returns
    -------
    Release
        ``release.df``: one row per person, ``items array<int>`` (the format
        ``sparkpriv evaluate counting-queries --release-items-col items`` reads).
        The Gram pass runs inside this call.

    Privacy
    -------
    Neighbours: one PERSON replaced, with all of their events (``n`` public).
    Each bounded record divided by the public value cap ``c`` lies in
    ``[0, 1]^d`` with ``||x||_2 <= sqrt(L)`` (enforced by the item cap; a
    record that broke it would be clipped by ``clip_sparse_rows``), so with
    ``Z = sqrt(L)`` the sensitivities are those of the table release on that
    domain: ``sqrt(min(2 L, d)) s_max(R)`` for the realized ``R`` and
    ``sqrt(L (L + 1))`` for the Gram when ``d >= 2 L`` (exact: two records on
    disjoint items; docs/dprp.md, "Sensitivity");
    Gaussian noise composed in Gaussian DP to ``(epsilon, delta)``. The
    threshold is post-processing. Public: the vocabulary, the cap, k1, k2,
    threshold, the noise scales. Secret: ``R``, the noise seed and the key of
    the item choice. The person key is not in the output.
    """
    caller = "release_dprp"
    d = records.d
    cap = records.cap
    c = cap.value_cap
    if threshold is None:
        threshold = DEFAULT_THRESHOLD
    check_param("threshold", threshold, [Interval("real", 0, None, "neither")], caller)
    z = cap.l2_bound / c  # sqrt(L): the row bound on the [0, 1] scale
    v = core.validate_params(d=d, epsilon=epsilon, delta=delta, lower=(0.0,) * d, upper=(c,) * d, k1=k1,
                             k2=rcore.default_k2_records(d) if k2 is None else k2, row_bound=z,
                             budget_split=budget_split, labels=None, classes=None, label_scale=1.0,
                             fill=None, impute_share=core.DEFAULT_IMPUTE_SHARE, neighbors=neighbors,
                             caller=caller)
    R, seed = core.draw_secrets(d, v["k1"])
    plan = core.plan_dprp(R, d=d, epsilon=epsilon, delta=delta, lower=v["lower"], upper=v["upper"],
                          k2=v["k2"], row_bound=v["row_bound"], budget_split=v["budget_split"],
                          labels=None, classes=None, label_scale=1.0, neighbors=neighbors)
    event = plan.dp_event()
    eps = epsilon_of(event, plan.delta)
    params = {"epsilon": float(epsilon), "delta": float(delta), "k1": plan.k1, "k2": plan.k2,
              "budget_split": list(plan.budget_split), "threshold": float(threshold),
              "neighbors": neighbors, **records.to_public_dict()}
    hold = reserve(event=event, mechanism="dprp", parameters=params, ledger=ledger, table_id=table_id)
    counters = make_counters(records.grouped.sparkSession)
    try:
        M, gnoise = _driver_pass(records, plan, R, seed, counters, caller)
    except BaseException as exc:
        hold.abort(f"release failed before publishing: {type(exc).__name__}")
        hold.close()
        raise

    fn = _records_batch_fn(R, M, plan.projection_noise, seed, records.record_fn(None), cap, d,
                           float(threshold))
    rows = BatchMap(records.layout, fn, items_schema())
    out = rows.to_df()
    del R, M

    public = plan.to_public_dict()
    public["feature_bounds"] = {"per_item": [0.0, c], "scaled_to": [0.0, 1.0],
                                "row_bound_formula": "sqrt(max_items) on the [0, 1] scale"}
    for key in ("integer_columns_rounded", "labels", "classes", "label_scale", "fill_for_nulls"):
        public.pop(key, None)
    public.update(gram_noise=gnoise.to_public_dict(), parameters=params,
                  input_kind="event table (sparse person records)",
                  output="items array<int>: vocabulary indices where the reconstructed value >= threshold",
                  matrix_source="OS entropy, discarded after the job",
                  events_note="GaussianDpEvent(1/mu_i) per step; the noise objects' own multipliers "
                              "are at least these (checked)")
    info = dict(records.input_info, source=source or records.input_info.get("source"))
    return Release(df=out, mechanism="dprp", event=event, epsilon=eps, delta=plan.delta, public=public,
                   input_info=info, hold=hold, diagnostics=lambda: counters_dict(counters),
                   source_df=records.events, rows=rows)


def gram_pass_records(records: BoundedRecords, counters=None) -> np.ndarray:
    """The summed :func:`~sparkpriv.mechanisms.dprp_records.gram_partial_sparse` of all records."""
    d = records.d
    return sum_partials(records.grouped, _records_gram_fn(records.record_fn(counters), records.cap, d),
                        1 + d * (d + 1) // 2)


def _driver_pass(records, plan, R, seed, counters, caller):
    """Pass 1 (Gram) and the driver solve: ``(M, gram noise)``."""

    with spark_errors():
        total = gram_pass_records(records, counters)
    sizes, grams = core.gram_from_partial(total, plan.d, 1)
    if sizes.sum() == 0:
        raise InputError("The input table is empty: there is nothing to release.")
    gnoise = plan.gram_noise(int(sizes.max()))
    core.check_noise_multiplier(gnoise, plan.mu["gram"])
    core.check_noise_multiplier(plan.projection_noise, plan.mu["projection"])
    Cs = core.noisy_grams(grams, gnoise, stream(seed, core.GRAM_NOISE_STAGE))
    (M,) = core.solve(Cs, R, plan.k2, caller=caller)
    _log.info("dprp of event records: Gram of %d people, d = %d, k1 = %d, k2 = %d",
              int(sizes[0]), plan.d, plan.k1, plan.k2)
    return M, gnoise


def _records_gram_fn(bound, cap, d):
    """Per-partition Gram partial of the bounded records (built from plain values: it is pickled)."""
    c = cap.value_cap
    size = 1 + d * (d + 1) // 2

    def sparkpriv_dprp_records_gram(batches, pid):
        acc = np.zeros(size)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            off, idx, vals = bound(batch)
            vals, _ = clip_sparse_rows(off, idx, vals, cap, d)  # a no-op on capped records
            acc += rcore.gram_partial_sparse(off, idx, vals, d, c)
        return acc

    return sparkpriv_dprp_records_gram


def _records_batch_fn(R, M, noise, seed, bound, cap, d, threshold):
    """Per-partition release function from plain values (pickled). ``noise=None``
    gives the thresholded reconstruction without noise (tests)."""
    R = np.ascontiguousarray(R)
    M = np.ascontiguousarray(M)
    c = cap.value_cap

    def sparkpriv_dprp_records(batches, pid):
        rng = stream(seed, core.ROW_NOISE_STAGE, pid)
        for batch in in_person_hash_order(batches):
            off, idx, vals = bound(batch)
            vals, _ = clip_sparse_rows(off, idx, vals, cap, d)
            o, items = rcore.reconstruct_sparse_items(off, idx, vals, R, M, noise, rng, value_cap=c,
                                                     threshold=threshold)
            arr = pa.ListArray.from_arrays(pa.array(o.astype(np.int32)), pa.array(items, pa.int32()))
            yield pa.RecordBatch.from_arrays([arr], ["items"])

    return sparkpriv_dprp_records
