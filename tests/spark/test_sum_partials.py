"""sum_partials: the merge tree is planned without running the input's shuffle."""

from __future__ import annotations

import numpy as np
from pyspark.sql import functions as F

from sparkpriv.spark.batches import partition_estimate, sum_partials


def _jobs_run_by(spark, fn):
    sc = spark.sparkContext
    sc.setJobGroup("sparkpriv-test-estimate", "partition estimate")
    try:
        out = fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return out, list(sc.statusTracker().getJobIdsForGroup("sparkpriv-test-estimate"))


def test_partition_count_of_a_shuffled_frame_runs_no_job(spark):
    grouped = (spark.range(0, 20_000).withColumn("person", F.col("id") % 997)
               .groupBy("person").agg(F.sum("id").alias("s")))
    n, jobs = _jobs_run_by(spark, lambda: partition_estimate(grouped))
    assert jobs == []  # df.rdd.getNumPartitions() runs the groupBy's map stage here under AQE
    assert n == int(spark.conf.get("spark.sql.shuffle.partitions"))
    scan = spark.range(0, 1000, numPartitions=7)
    assert partition_estimate(scan) == 7


def test_sum_over_a_shuffled_frame_equals_numpy(spark):
    rows = np.arange(20_000)
    grouped = (spark.range(0, rows.size).withColumn("person", F.col("id") % 997)
               .groupBy("person").agg(F.sum("id").cast("double").alias("s")))

    def partial(batches, pid):
        acc = np.zeros(2)
        for b in batches:
            s = b.column("s").to_numpy()
            acc += [s.sum(), s.size]
        return acc

    total = sum_partials(grouped, partial, 2, fanout=2)  # several merge levels
    np.testing.assert_array_equal(total, [float(rows.sum()), 997.0])
