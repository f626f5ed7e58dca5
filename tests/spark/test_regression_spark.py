"""Private regression on Spark: the Spark sketch equals the numpy sketch for a test seed, for
any partitioning of the same ordered table; S is never in a plan or an output; errors."""

import logging

import numpy as np
import pytest

from sparkpriv.errors import InputError, ParameterError, SchemaError
from sparkpriv.mechanisms import regression as reg
from sparkpriv.mechanisms.regression import RegressionParams, release_regression_array
from sparkpriv.privacy.random import insecure_fixed_seed, reset_test_counter
from sparkpriv.spark import regression as sreg

pytestmark = pytest.mark.spark

N, D = 2500, 3
FEATURES = ("f0", "f1", "f2")


def _table(spark, parts):
    """Rows i = 0..N-1 in order, from spark.range (its partitions keep the order)."""
    from pyspark.sql import functions as F

    df = spark.range(0, N, numPartitions=parts)
    i = F.col("id").cast("double")
    df = df.select(F.sin(i * 0.37).alias("f0"), F.cos(i * 1.3).alias("f1"),
                   (F.sin(i * 0.11) * F.cos(i * 0.05)).alias("f2"))
    return df.withColumn("y", 0.5 * F.col("f0") - 0.2 * F.col("f1") + 0.1 * F.sin(F.col("f2") * 7.0))


def _arrays():
    i = np.arange(N, dtype=float)
    A = np.stack([np.sin(i * 0.37), np.cos(i * 1.3), np.sin(i * 0.11) * np.cos(i * 0.05)], axis=1)
    b = 0.5 * A[:, 0] - 0.2 * A[:, 1] + 0.1 * np.sin(A[:, 2] * 7.0)
    return A, b


PARAMS = RegressionParams(features=FEATURES, target="y", row_bound=1.5, epsilon=2.0, delta=1e-6, sketch_rows=40)


def test_spark_sketch_equals_numpy_sketch_for_any_partitioning(spark):
    A, b = _arrays()
    with insecure_fixed_seed(4242):
        ref = release_regression_array(A, b, PARAMS)
        for parts in (1, 3, 7):
            reset_test_counter()
            got = sreg.release_regression(_table(spark, parts), PARAMS)
            np.testing.assert_allclose(got.R, ref.R, rtol=1e-9, atol=1e-9 * np.abs(ref.R).max())
            assert got.sensitivity == pytest.approx(ref.sensitivity, rel=1e-12)
            np.testing.assert_allclose(got.fit.coef, ref.fit.coef, rtol=1e-6)
    # and the numpy sketch itself is S M for the S of the keyed streams (before noise)
    with insecure_fixed_seed(4242):
        plan = reg.plan_regression(PARAMS, reg.RegressionFacts(N))
    M, _ = reg.clip_regression_rows(A, b, 1.5)
    S = reg.sketch_matrix(plan.sketch_seed, plan.m, N)
    assert np.abs(ref.R - S @ M).max() < 8 * ref.noise.std
    assert (ref.R - S @ M).std() == pytest.approx(ref.noise.std, rel=0.2)


def test_spark_partials_sum_to_s_times_m(spark):
    """Before noise, per partitioning: the merged partial is S M and the max column norm of S."""
    A, b = _arrays()
    M, _ = reg.clip_regression_rows(A, b, 1.5)
    m, seed = 30, 77
    S = reg.sketch_matrix(seed, m, N)
    for parts in (2, 5):
        df = _table(spark, parts)
        counts = sreg.partition_counts(df.select(*FEATURES, "y"))
        assert counts.sum() == N
        total = sreg.sketch_total(df.select(*FEATURES, "y"), list(FEATURES) + ["y"], row_bound=1.5, seed=seed,
                                  m=m, counts=counts)
        np.testing.assert_allclose(total[: m * 4].reshape(m, 4), S @ M, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(total[m * 4: m * 5], np.abs(S).sum(axis=1), rtol=1e-9)
        assert total[m * 5:].max() == pytest.approx(np.linalg.norm(S, axis=0).max(), rel=1e-12)


def test_no_secret_in_logs_or_public_facts(spark, caplog):
    with insecure_fixed_seed(99):
        plan = reg.plan_regression(PARAMS, reg.RegressionFacts(N))
    df = _table(spark, 2)
    caplog.set_level(logging.DEBUG)
    with insecure_fixed_seed(99):
        sreg.release_regression(df, PARAMS)
    text = caplog.text + repr(plan.to_public_dict())
    for secret in (plan.sketch_seed, plan.noise_seed):
        assert str(secret) not in text


def test_additive_scheme_on_spark(spark):
    A, b = _arrays()
    params = RegressionParams(features=FEATURES, target="y", row_bound=1.5, epsilon=50.0, delta=1e-6,
                              scheme="additive")
    with insecure_fixed_seed(5):
        rel = sreg.release_regression(_table(spark, 3), params)
        rows = np.array(rel.release_df.collect())
        rows2 = np.array(rel.release_df.collect())  # recomputation redraws the SAME noise
    np.testing.assert_array_equal(rows, rows2)
    M, _ = reg.clip_regression_rows(A, b, 1.5)
    diff = rows - M
    assert diff.std() == pytest.approx(rel.noise.std, rel=0.05)
    xs = np.linalg.lstsq(M[:, :3], M[:, 3], rcond=None)[0]
    assert np.all(np.abs(rel.fit.coef - xs) < 5 * rel.fit.stderr)


def test_errors(spark):
    df = _table(spark, 2)
    with pytest.raises(SchemaError, match="'nope'"):
        sreg.release_regression(df, RegressionParams(features=("f0", "nope"), target="y", row_bound=1.0))
    with pytest.raises(ParameterError, match="at most the number of rows n = 2500"):
        sreg.release_regression(df, RegressionParams(features=FEATURES, target="y", row_bound=1.0,
                                                     sketch_rows=N + 1))
    from pyspark.sql import functions as F

    bad = df.withColumn("f1", F.when(F.col("f0") > 0.9, F.lit(float("nan"))).otherwise(F.col("f1")))
    with pytest.raises(InputError, match="'f1'"):
        sreg.release_regression(bad, RegressionParams(features=FEATURES, target="y", row_bound=1.0))
