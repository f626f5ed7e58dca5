"""The JL projection release of bounded person records from an event table
(layer 2 over :mod:`sparkpriv.mechanisms.sparse` and
:mod:`sparkpriv.mechanisms.projection`).

One pass, one Python stage: the grouped events are bounded
(:meth:`BoundedRecords.record_fn`) and projected as sparse records (the sum of
the rows of ``P`` at a person's items, :func:`project_sparse_rows`) in the same
``mapInArrow``, so a ``d``-wide record is never built. The records come in
the keyed layout (:attr:`BoundedRecords.layout`: partition and order by a
secret keyed pseudorandom function of the person, so which file and position
a row lands in says nothing about who is in the table); each task puts its
partition's people in that keyed order
(:func:`~sparkpriv.spark.events.in_person_hash_order`), so the keyed
per-partition noise stream meets the same people in the same order when a
task is retried or recomputed.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from sparkpriv._validation import Interval, check_param, refuse_row_level_add_remove
from sparkpriv.mechanisms.projection import NOISE_STAGE, clamp_projected, secret_matrix_and_seed
from sparkpriv.mechanisms.sparse import plan_sparse_projection, project_sparse_rows
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.random import stream
from sparkpriv.release import Release, reserve
from sparkpriv.spark.batches import BatchMap
from sparkpriv.spark.events import BoundedRecords, counters_dict, in_person_hash_order, make_counters

__all__ = ["release_sparse_projection"]

_log = logging.getLogger(__name__)


def _schema(k: int):
    from pyspark.sql.types import DoubleType, StructField, StructType

    return StructType([StructField(f"z{i}", DoubleType(), False) for i in range(k)])


def release_sparse_projection(
    records: BoundedRecords,
    *,
    k: int,
    epsilon: float,
    delta: float = 0.0,
    noise: str = "laplace",
    neighbors: str = "replace-one",
    matrix_key: bytes | None = None,
    ledger=None,
    table_id: str | None = None,
    source: str | None = None,
) -> Release:
    """Private JL projection of bounded person records (``release_projection(records, ...)``).

    Parameters
    ----------
    records : BoundedRecords
        From :func:`~sparkpriv.spark.events.bound_contributions`.
    k : int in [1, d]
        Output dimension; output columns ``z0 .. z{k-1}``, one row per person.
    epsilon, delta, noise, neighbors, matrix_key, ledger, table_id, source
        As for :func:`~sparkpriv.spark.projection.release_projection`.

    Privacy
    -------
    Neighbours: one PERSON replaced (``replace-one``, the number of people is
    public), with all of their events. ``add-remove`` is refused: the output
    has one row per person, so adding or removing one changes the row count.
    Sensitivity: every
    bounded record has ``||x||_1 <= L c`` and ``||x||_2 <= c sqrt(L)``
    (:class:`~sparkpriv.mechanisms.sparse.ItemCap`), enforced by the item cap;
    both give an exact sensitivity of ``x -> x P`` for the realized ``P``
    (doubled under replace-one) and the smaller one is used. Guarantee:
    ``epsilon``-DP (Laplace) or ``(epsilon, delta)``-DP (Gaussian). Public:
    the vocabulary, the cap, k, the noise scale. Secret: ``P``, the noise seed
    and the key of the item choice. The person key is not in the output.
    """
    caller = "release_projection"
    refuse_row_level_add_remove(neighbors, release="a projection release of event-table records",
                                caller=caller)
    d = records.d
    check_param("k", k, [Interval("integer", 1, d, "both")], caller)
    P, seed = secret_matrix_and_seed(d, k, matrix_key)
    plan = plan_sparse_projection(P, records.cap, epsilon=epsilon, delta=delta, noise=noise,
                                  neighbors=neighbors, caller=caller)
    event = plan.dp_event()
    eps = epsilon_of(event, plan.delta)
    params = {"k": k, "epsilon": float(epsilon), "delta": float(delta), "noise": noise,
              "neighbors": neighbors, "reusable_projection": matrix_key is not None,
              **records.to_public_dict()}
    hold = reserve(event=event, mechanism="projection", parameters=params, ledger=ledger,
                   table_id=table_id)
    counters = make_counters(records.grouped.sparkSession)
    fn = _sparse_batch_fn(P, records.record_fn(counters), plan.noise, seed, k, plan.value_bound)
    rows = BatchMap(records.layout, fn, _schema(k))
    out = rows.to_df()
    del P
    public = dict(plan.to_public_dict(), parameters=params, input_kind="event table (sparse person records)",
                  matrix_source="secret key (held outside the output)" if matrix_key is not None
                  else "OS entropy, discarded after the job")
    info = dict(records.input_info, source=source or records.input_info.get("source"))
    return Release(df=out, mechanism="projection", event=event, epsilon=eps, delta=plan.delta,
                   public=public, input_info=info, hold=hold,
                   diagnostics=lambda: counters_dict(counters), source_df=records.events,
                   rows=rows)


def _sparse_batch_fn(P, bound, noise, seed, k, value_bound=None):
    """Per-partition function from plain values (pickled). ``noise=None`` gives the
    projection before noise (tests compare it with the dense numpy path).
    ``value_bound``: the plan's public range; projected values are clamped to it."""
    P = np.ascontiguousarray(P)
    value_bound = None if value_bound is None else float(value_bound)
    names = [f"z{i}" for i in range(k)]

    def sparkpriv_sparse_projection(batches, pid):
        rng = stream(seed, NOISE_STAGE, pid)
        for batch in in_person_hash_order(batches):
            off, idx, vals = bound(batch)
            Y = project_sparse_rows(off, idx, vals, P)
            if value_bound is not None:
                clamp_projected(Y, value_bound)
            cols = _noise.transposed(Y) if noise is None else _noise.add_noise_transposed(Y, noise, rng)
            yield pa.RecordBatch.from_arrays([pa.array(c) for c in cols], names)

    return sparkpriv_sparse_projection
