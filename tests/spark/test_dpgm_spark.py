"""DPGM on Spark: one task per cluster, the same models as the numpy path for a test seed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sparkpriv.mechanisms import dpgm
from sparkpriv.spark import dpgm as sdpgm

pytestmark = pytest.mark.spark


def test_spark_per_cluster_training_equals_numpy(spark):
    rng = np.random.default_rng(3)
    n, d = 600, 8
    X = (rng.random((n, d)) < np.where(np.arange(n)[:, None] % 2 == 0, 0.7, 0.1)).astype(float)
    params = dpgm.DPGMParams(epsilon=3.0, delta=1e-5, k=3, sampling_rate=0.1, epochs=1, hidden=3, accountant="rdp",
                             kmeans_iterations=2, chains=10)
    plan = dpgm.plan_dpgm(params, n=n, d=d)
    centers = np.vstack([np.full(d, 0.7), np.full(d, 0.1), np.full(d, 5.0)])  # cluster 2 gets no rows
    sizes = np.array([300.0, 300.0, 0.0])
    row_bound = float(np.sqrt(d))
    labels = dpgm.assign_clusters(X, centers, row_bound)
    assert set(np.unique(labels)) == {0, 1}
    ref = dpgm.train_clusters(X, labels, sizes, centers, plan, seed=5)
    cols = [f"c{j}" for j in range(d)]
    df = spark.createDataFrame(pd.DataFrame(X, columns=cols))  # partitions keep the row order
    got = sdpgm.train_clusters(df, cols, centers, sizes, plan, seed=5, row_bound=row_bound)
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12)
