"""DPGM on Spark: one task per cluster after a repartition by cluster (docs/dpgm.md).

:func:`train_clusters` is the Spark twin of
:func:`sparkpriv.mechanisms.dpgm.train_clusters`: the executors assign each
row of the declared columns to its nearest released centre (the assignment is
internal, never written), send each Arrow block's rows of cluster ``j`` to the
group of ``j`` (``groupBy("cluster").applyInPandas``: one function call per
cluster, clusters in parallel), and the call for ``j`` puts its rows in a
deterministic order (partition id, block number, row: the order of the
source, so a retried task samples the same batches), then runs the numpy
DP-SGD of that cluster alone (its keyed streams ``(seed, stage, j, step)``).
Only the ``k`` parameter vectors reach the driver. With a test seed the result
equals the numpy path on the same rows in the same order.

Not yet an engine call of the mechanism protocol (docs/dpgm.md, "What
remains"); it takes a DataFrame and its numeric columns with values in [0, 1].
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from sparkpriv.mechanisms import dpgm as _dpgm
from sparkpriv.spark.batches import batch_matrix, map_batches

__all__ = ["train_clusters"]


def _split_schema():
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    return StructType([StructField("cluster", LongType(), False), StructField("pid", LongType(), False),
                       StructField("block", LongType(), False), StructField("rows", LongType(), False),
                       StructField("z", BinaryType(), False)])


def _out_schema():
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    return StructType([StructField("cluster", LongType(), False), StructField("theta", BinaryType(), False)])


def train_clusters(df, columns: Sequence[str], centers: np.ndarray, sizes: np.ndarray,
                   plan: "_dpgm.DPGMPlan", seed: int, row_bound: float, *,
                   fill: float | None = None) -> np.ndarray:
    """``(k, dim)`` parameters: cluster ``j`` trained on the rows nearest ``centers[j]``.

    ``centers`` (k, d) and ``sizes`` (k,) are the released k-means centres and
    noisy sizes; rows are clipped to [0, 1] (the declared box) before use.
    """
    cols = list(columns)
    centres = np.asarray(centers, dtype=np.float64)
    k, d = centres.shape
    sizes = np.asarray(sizes, dtype=np.float64)

    def split(batches, pid):
        for b, batch in enumerate(batches):
            X = np.clip(batch_matrix(batch, cols, fill=fill), 0.0, 1.0)
            if X.shape[0] == 0:
                continue
            lab = _dpgm.assign_clusters(X, centres, row_bound)
            for j in np.unique(lab):
                rows = np.ascontiguousarray(X[lab == j])
                yield pa.RecordBatch.from_arrays(
                    [pa.array([int(j)], pa.int64()), pa.array([pid], pa.int64()), pa.array([b], pa.int64()),
                     pa.array([rows.shape[0]], pa.int64()), pa.array([rows.tobytes()], pa.binary())],
                    ["cluster", "pid", "block", "rows", "z"])

    def train(pdf):
        import pandas as pd

        j = int(pdf["cluster"].iloc[0])
        pdf = pdf.sort_values(["pid", "block"])
        X = np.concatenate([np.frombuffer(z, dtype=np.float64).reshape(-1, d) for z in pdf["z"]])
        labels = np.full(X.shape[0], j)
        theta = _dpgm.train_clusters(X, labels, sizes, centres, plan, seed, clusters=[j])[j]
        return pd.DataFrame({"cluster": [j], "theta": [theta.tobytes()]})

    parts = map_batches(df.select(*cols), split, _split_schema())
    out = parts.groupBy("cluster").applyInPandas(train, _out_schema()).collect()
    dim = _dpgm._make_model(plan.params, d).dim
    thetas = np.zeros((k, dim))
    seen = set()
    for row in out:
        seen.add(int(row["cluster"]))
        thetas[int(row["cluster"])] = np.frombuffer(row["theta"], dtype=np.float64)
    missing = [j for j in range(k) if j not in seen]
    if missing:  # clusters without rows: trained on nothing (noise only), as the numpy path does
        empty = np.zeros((0, d))
        thetas[missing] = _dpgm.train_clusters(empty, np.zeros(0, np.int64), sizes, centres, plan, seed,
                                               clusters=missing)[missing]
    return thetas
