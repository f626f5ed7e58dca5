"""AdaSSP regression (method="ssp") on the Spark engine: the aggregated statistics equal numpy's
before noise for any partitioning, nulls are replaced there too, the command line writes the noisy
statistics with the receipt and the model, and a target of the wrong type is named."""

import json

import numpy as np
import pytest

from sparkpriv.api import release_regression
from sparkpriv.errors import SparkPrivError
from sparkpriv.mechanisms import regression as reg
from sparkpriv.mechanisms.regression import RegressionParams
from sparkpriv.privacy.random import insecure_fixed_seed

pytestmark = pytest.mark.spark

N = 3000
FEATURES = ["f0", "f1", "f2"]
KW = dict(columns=FEATURES, target="y", lower=-1.0, upper=1.0, target_lower=-1.0, target_upper=1.0, epsilon=1.0,
          delta=1e-6)


def _table(spark, parts, null_at=None):
    """Rows i = 0..N-1 in order (spark.range keeps it); f1 is null at row ``null_at``."""
    from pyspark.sql import functions as F

    df = spark.range(0, N, numPartitions=parts)
    i = F.col("id").cast("double")
    f1 = F.cos(i * 1.3)
    if null_at is not None:
        f1 = F.when(F.col("id") == null_at, F.lit(None).cast("double")).otherwise(f1)
    df = df.select(F.sin(i * 0.37).alias("f0"), f1.alias("f1"), (F.sin(i * 0.11) * 1.5).alias("f2"))
    return df.withColumn("y", 0.5 * F.col("f0") - 0.2 * F.coalesce(F.col("f1"), F.lit(0.0))
                         + 0.1 * F.sin(F.col("f2") * 7.0))


def _arrays(null_at=None):
    i = np.arange(N, dtype=float)
    A = np.stack([np.sin(i * 0.37), np.cos(i * 1.3), np.sin(i * 0.11) * 1.5], axis=1)
    b = 0.5 * A[:, 0] - 0.2 * A[:, 1] + 0.1 * np.sin(A[:, 2] * 7.0)
    if null_at is not None:
        A[null_at, 1] = 0.0  # the box's centre replaces the null; y used 0 for it too
        b[null_at] = 0.5 * A[null_at, 0] + 0.1 * np.sin(A[null_at, 2] * 7.0)
    return A, b


def _reference(A, b):
    """numpy, written out: the box [-1, 1] (f2 clipped), centre 0, [u, 1, clip(y, -1, 1)]."""
    Z = np.column_stack([np.clip(A, -1, 1), np.ones(len(A)), np.clip(b, -1, 1)])
    return np.concatenate([(Z.T @ Z).ravel(), [len(A)]])


@pytest.mark.parametrize("parts", [1, 3, 7])
def test_statistics_equal_numpy_for_any_partitioning(spark, parts):
    from sparkpriv.spark.engine import SparkEngine

    p = RegressionParams(**KW)
    p.validate("test")
    dom = reg.ssp_domain(p, 3, "test")
    eng = SparkEngine()
    src = eng.open(_table(spark, parts, null_at=17), columns=FEATURES + ["y"], fill=None, caller="t", missing=True)
    counters = eng.counters(reg.COUNTERS)
    got = eng.aggregate(src, reg.statistics_fn(dom, counters), reg.stats_size(dom))
    np.testing.assert_allclose(got, _reference(*_arrays(null_at=17)), rtol=1e-9, atol=1e-9)
    counts = dict(zip(reg.COUNTERS, (c.value for c in counters)))
    assert counts["rows"] == N and counts["values_replaced"] == 1 and counts["rows_box_clipped"] > 0


def test_spark_release_is_the_local_release(spark):
    """Same secrets, same statistics (to float order), same released values and fit."""
    import pyarrow as pa

    A, b = _arrays()
    with insecure_fixed_seed(31):
        ref = release_regression(pa.table({"f0": A[:, 0], "f1": A[:, 1], "f2": A[:, 2], "y": b}), **KW)
    with insecure_fixed_seed(31):
        got = release_regression(_table(spark, 3), **KW)
    assert got.engine == "spark" and ref.engine == "local"
    np.testing.assert_allclose(got.extras["statistics"].gram, ref.extras["statistics"].gram, rtol=1e-9)
    np.testing.assert_allclose(got.model.coef, ref.model.coef, rtol=1e-6)
    np.testing.assert_allclose(got.model.coef, [0.5, -0.2, 0.0], atol=0.05)


def test_a_nan_is_replaced_on_spark(spark):
    from pyspark.sql import functions as F

    df = _table(spark, 2).withColumn("f1", F.when(F.col("f0") > 0.99, F.lit(float("nan"))).otherwise(F.col("f1")))
    assert release_regression(df, **KW).diagnostics()["missing_values_replaced"] > 0


def test_target_of_the_wrong_type_is_named(spark):
    from pyspark.sql import functions as F

    df = _table(spark, 2).withColumn("y", F.lit("a"))
    with pytest.raises(SparkPrivError, match="'y'"):
        release_regression(df, **KW)


def test_target_quantile_on_spark(spark):
    kw = dict(KW, target_lower=None, target_upper=None, target_quantile=0.98, epsilon=2.0)
    with insecure_fixed_seed(11):  # a statistical check: fixed noise (it once drew fresh noise every run)
        rel = release_regression(_table(spark, 3), **kw)
    lo, hi = rel.public["target_range"]["lower"], rel.public["target_range"]["upper"]
    assert lo < -0.4 and hi > 0.4 and hi - lo <= 4.0
    assert rel.epsilon <= 2.0


def test_cli_release_writes_statistics_receipt_and_model(spark, tmp_path, monkeypatch):
    from sparkpriv.cli import main

    path = str(tmp_path / "in.parquet")
    _table(spark, 2).write.parquet(path)
    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/ledger.sqlite")
    out = tmp_path / "out"
    rc = main(["release", "regression", "--input", path, "--output", str(out), "--columns", "f0,f1,f2",
               "--target", "y", "--lower", "-1", "--upper", "1", "--target-lower", "-1", "--target-upper", "1",
               "--epsilon", "1", "--delta", "1e-6"])
    assert rc == 0
    r = json.loads((out / "_privacy_receipt.json").read_text())
    assert r["mechanism"] == "regression" and r["guarantee"]["epsilon"] <= 1.0
    assert r["mechanism_details"]["method"] == "ssp" and len(r["events"]["events"]) == 3
    model = json.loads((out / reg.MODEL_FILE).read_text())
    assert sorted(model["coefficients"]) == FEATURES and model["target"] == "y" and "intercept" in model
    st = reg.SSPStatistics.from_public_dict(model["statistics"])
    fit = reg.fit_from_statistics(st)
    assert fit.coef.tolist() == [model["coefficients"][c] for c in FEATURES]
    table = spark.read.parquet(str(out)).toPandas()
    assert table["statistic"].tolist() == FEATURES + ["_intercept", "y"]
    np.testing.assert_allclose(table[FEATURES].to_numpy()[:3], st.gram[:3, :3])


@pytest.mark.parametrize("parts", [1, 4])
def test_logistic_pass_equals_numpy_for_any_partitioning(spark, parts):
    from pyspark.sql import functions as F
    from scipy.special import expit

    from sparkpriv.spark.engine import SparkEngine

    p = RegressionParams(**dict(KW, model="logistic", target_lower=None, target_upper=None))
    p.validate("test")
    dom = reg.ssp_domain(p, 3, "test")
    theta = np.array([0.8, -0.4, 0.3, 0.1])
    df = _table(spark, parts).withColumn("y", (F.col("y") > 0).cast("double"))
    src = SparkEngine().open(df, columns=FEATURES + ["y"], fill=None, caller="t", missing=True)
    got = SparkEngine().aggregate(src, reg.logistic_pass_fn(dom, theta, True), reg.logistic_pass_size(dom, True))
    A, b = _arrays()
    Z = np.column_stack([np.clip(A, -1, 1), np.ones(N)])
    s = np.where(b > 0, 1.0, -1.0)
    m = Z @ theta
    w = expit(m) * (1 - expit(m))
    ref = np.concatenate([Z.T @ (-s * expit(-s * m)), ((Z * w[:, None]).T @ Z).ravel()])
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)


def test_logistic_release_on_spark_is_the_local_release(spark):
    """Same secrets: the same statistics, passes and model on both engines (to float order)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    kw = dict(KW, model="logistic", target_lower=None, target_upper=None, logistic_steps=3)
    A, b = _arrays()
    with insecure_fixed_seed(8):
        ref = release_regression(pa.table({"f0": A[:, 0], "f1": A[:, 1], "f2": A[:, 2], "y": (b > 0) * 1.0}), **kw)
    with insecure_fixed_seed(8):
        got = release_regression(_table(spark, 3).withColumn("y", (F.col("y") > 0).cast("double")), **kw)
    np.testing.assert_allclose(got.model.coef, ref.model.coef, rtol=1e-6)
    np.testing.assert_allclose(got.model.ci_low, ref.model.ci_low, rtol=1e-6)
    assert len(json.loads(got.files[reg.MODEL_FILE])["logistic_steps"]["gradients"]) == 3
