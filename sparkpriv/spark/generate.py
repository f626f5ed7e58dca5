"""Sample tables generated in parallel by Spark (never on the driver).

``generate_blobs``: Gaussian blobs, the dense table of the projection paper's
experiments. Each partition generates its own rows from a stream keyed by
(seed, partition), so the table is reproducible for a given seed and
partition count, and any size can be generated.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkpriv._validation import Interval, check_param
from sparkpriv.privacy.random import stream

__all__ = ["generate_blobs", "blob_centers"]


def blob_centers(cols: int, clusters: int, separation: float, seed: int) -> np.ndarray:
    """Cluster centres: random directions scaled so neighbouring centres are ``separation`` apart."""
    rng = stream(seed, 0)
    C = rng.standard_normal((clusters, cols))
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    if clusters == 1:
        return C * 0.0
    dmin = min(np.linalg.norm(C[i] - C[j]) for i in range(clusters) for j in range(i))
    return C * (separation / dmin)


def generate_blobs(
    spark,
    *,
    rows: int,
    cols: int,
    clusters: int = 2,
    separation: float = 4.0,
    cluster_std: float = 1.0,
    seed: int = 0,
    partitions: int | None = None,
):
    """A DataFrame of ``rows`` Gaussian-blob rows: ``id``, ``f0..f{cols-1}``, ``label``.

    Parameters
    ----------
    rows, cols : int
        Table size (rows x feature columns).
    clusters : int
        Number of blobs; ``label`` is the blob of each row.
    separation : float
        Distance between the closest two blob centres.
    cluster_std : float
        Standard deviation of each feature around its centre.
    seed : int
        Public seed of the synthetic data (this is sample data, not a secret).
    partitions : int, optional
        Number of Spark partitions (default: one per 1M rows, at least the
        default parallelism).
    """
    caller = "generate_blobs"
    check_param("rows", rows, [Interval("integer", 1, None, "left")], caller)
    check_param("cols", cols, [Interval("integer", 1, 100_000, "both")], caller)
    check_param("clusters", clusters, [Interval("integer", 1, 10_000, "both")], caller)
    check_param("cluster_std", cluster_std, [Interval("real", 0, None, "left")], caller)
    check_param("separation", separation, [Interval("real", 0, None, "left")], caller)
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StructField, StructType

    if partitions is None:
        try:
            par = spark.sparkContext.defaultParallelism
        except Exception:
            par = 2
        partitions = max(par, -(-rows // 1_000_000))
    centers = blob_centers(cols, clusters, separation, seed)
    schema = StructType(
        [StructField("id", LongType(), False)]
        + [StructField(f"f{j}", DoubleType(), False) for j in range(cols)]
        + [StructField("label", IntegerType(), False)]
    )
    names = schema.fieldNames()

    block = 4096

    def gen(batches):
        # rows are a function of their id alone (one stream per aligned block of
        # ids), so the table is the same whatever the partitioning
        for b in batches:
            ids = b.column(0).to_numpy()
            if ids.size == 0:
                continue
            lab = np.empty(ids.size, dtype=np.int64)
            X = np.empty((ids.size, cols))
            blocks = ids // block
            for blk in np.unique(blocks):
                sel = np.flatnonzero(blocks == blk)
                rng = stream(seed, 1, int(blk))
                lab_b = rng.integers(0, clusters, size=block)
                noise_b = rng.standard_normal((block, cols))
                off = ids[sel] - blk * block
                lab[sel] = lab_b[off]
                X[sel] = centers[lab_b[off]] + cluster_std * noise_b[off]
            arrays = [pa.array(ids)] + [pa.array(X[:, j]) for j in range(cols)]
            arrays.append(pa.array(lab.astype(np.int32)))
            yield pa.RecordBatch.from_arrays(arrays, names)

    gen.__name__ = "sparkpriv_generate_blobs"
    base = spark.range(0, rows, 1, numPartitions=partitions)
    return base.mapInArrow(gen, schema)
