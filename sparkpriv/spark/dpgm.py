"""DPGM on Spark: one task per cluster (docs/research/dpgm.md).

The release (``sparkpriv.api.release_dpgm``) runs the mechanism of
:mod:`sparkpriv.mechanisms.dpgm` through the engine interface; its per-cluster
training is the Spark engine's ``train_groups`` call
(:meth:`sparkpriv.spark.engine.SparkEngine.train_groups`): the executors assign
each row of the declared columns to its cluster of the k-means' last round
(nearest to the centres that round assigned with; internal, never written),
the rows of cluster ``j`` go to their own partition (``repartition(k, key)``,
one task per cluster, largest noisy size first, clusters in parallel), a
table's rows there in their canonical order (sorted by their contents:
``canonical_order``, docs/research/dpgm.md "Row order", so a retried task samples the
same batches whatever order the source gives), and the numpy DP-SGD of that
cluster runs alone (its keyed streams ``(seed, stage, j, step)``). Only the
``k`` parameter vectors reach the driver.

:func:`train_clusters` is that step alone, given the centres and sizes: the
Spark twin of :func:`sparkpriv.mechanisms.dpgm.train_clusters` (equal to it
for a test seed).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sparkpriv.mechanisms import dpgm as _dpgm

__all__ = ["train_clusters"]


def train_clusters(df, columns: Sequence[str], centers: np.ndarray, sizes: np.ndarray,
                   plan: "_dpgm.DPGMPlan", seed: int, row_bound: float, *,
                   fill: float | None = None, masses=None, chain_lengths=None,
                   assign_centers: np.ndarray | None = None) -> np.ndarray:
    """``(k, dim)`` parameters: cluster ``j`` trained on the rows nearest ``assign_centers[j]``
    (default ``centers[j]``; the release passes the centres of the k-means' last round:
    :func:`sparkpriv.mechanisms.dpgm.last_round_centres`).

    ``centers`` (k, d) and ``sizes`` (k,) are the released k-means centres (an rbm starts from
    them) and noisy sizes; rows are clipped to [0, 1] (the declared box) before use.
    ``masses``, ``chain_lengths``: the rbm's starting masses and chain lengths (as in the numpy
    ``train_clusters``).
    """
    from sparkpriv.spark.engine import SparkEngine

    engine = SparkEngine()
    source = engine.open(df, columns=list(columns), fill=fill, caller="train_clusters")
    centres = np.asarray(centers, dtype=np.float64)
    k, d = centres.shape
    dim = _dpgm._make_model(plan.params, d).dim
    # the train function appends the final clip (quantile clipping)
    width = dim + int(plan.quantile)
    assign = centres if assign_centers is None else np.asarray(assign_centers, dtype=np.float64)
    out = engine.train_groups(source, _dpgm._group_fn(assign, row_bound),
                              _dpgm._train_fn(plan, np.asarray(sizes, dtype=np.float64), centres, seed, masses,
                                              chain_lengths),
                              k, width, d, order=_dpgm.training_order(sizes))
    return np.ascontiguousarray(np.asarray(out, dtype=np.float64)[:, :dim])
