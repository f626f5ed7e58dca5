"""Assigning rows of a Spark DataFrame to the clusters of a released k-means model.

The release itself runs through the one release path
(:func:`sparkpriv.release.release` with the ``kmeans`` mechanism of
:mod:`sparkpriv.mechanisms.kmeans`, on the Spark engine
:mod:`sparkpriv.spark.engine`); :func:`sparkpriv.api.release_kmeans` is its
public entry point. Assignments are never part of a release:
:func:`assign_clusters` computes them from the public model inside a later job.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.kmeans import assign_nearest
from sparkpriv.mechanisms.kmeans_model import KMeansModel
from sparkpriv.spark.batches import batch_matrix, map_batches
from sparkpriv.spark.schema import check_numeric_columns, check_present_columns

__all__ = ["assign_clusters"]


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
