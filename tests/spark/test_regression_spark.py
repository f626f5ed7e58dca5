"""Private regression on Spark (the protocol's Spark engine): the Spark sketch equals the numpy
sketch for a test seed, for any partitioning of the same ordered table; the indexed pass numbers
rows in table order and fails if the input changes between its passes; errors."""

import logging

import numpy as np
import pytest

from sparkpriv.api import release_regression
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms import regression as reg
from sparkpriv.mechanisms.regression import RegressionParams, release_regression_array
from sparkpriv.privacy.random import insecure_fixed_seed

pytestmark = pytest.mark.spark

N = 2500
FEATURES = ["f0", "f1", "f2"]
KW = dict(method="sketch", columns=FEATURES, target="y", row_bound=1.5, epsilon=2.0, delta=1e-6, sketch_rows=40)


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


def test_spark_sketch_equals_numpy_sketch_for_any_partitioning(spark):
    A, b = _arrays()
    with insecure_fixed_seed(4242):
        ref = release_regression_array(A, b, RegressionParams(**{k: v for k, v in KW.items() if k != "columns"}))
    for parts in (1, 3, 7):
        with insecure_fixed_seed(4242):
            got = release_regression(_table(spark, parts), **KW)
        assert got.engine == "spark"
        np.testing.assert_allclose(got.extras["sketch"], ref.R, rtol=1e-9, atol=1e-9 * np.abs(ref.R).max())
        assert got.public["sensitivity_value"] == pytest.approx(ref.sensitivity, rel=1e-12)
        np.testing.assert_allclose(got.model.coef, ref.fit.coef, rtol=1e-6)
        assert [r for r in got.df.collect()] and got.df.columns == FEATURES + ["y"]
    # and the numpy sketch is S M for the S of the keyed streams, plus noise of the stated size
    with insecure_fixed_seed(4242):
        plan = reg.plan_regression(RegressionParams(**{k: v for k, v in KW.items() if k != "columns"}),
                                   reg.RegressionFacts(N), d=3)
    M, _ = reg.clip_regression_rows(A, b, 1.5)
    S = reg.sketch_matrix(plan.sketch_seed, plan.m, N)
    W = ref.R - S @ M
    assert np.abs(W).max() < 8 * ref.noise.std
    assert W.std() == pytest.approx(ref.noise.std, rel=0.2)


def test_indexed_pass_numbers_rows_in_table_order(spark):
    """Before noise, for several partitionings: the summed partial is S M, the row L1 norms of S
    and (over the slots) the largest column norm of S."""
    from sparkpriv.spark.engine import SparkEngine

    A, b = _arrays()
    M, _ = reg.clip_regression_rows(A, b, 1.5)
    m, seed = 30, 77
    S = reg.sketch_matrix(seed, m, N)
    for parts in (2, 5):
        eng = SparkEngine()
        src = eng.open(_table(spark, parts), columns=FEATURES + ["y"], fill=None, caller="test")
        idx = eng.index(src)
        assert idx.rows == N
        slots = reg.sketch_slots(N, m)
        total = idx.aggregate(reg.indexed_sketch_fn(seed, m, N, 1.5), reg.partial_size(m, 4, slots))
        np.testing.assert_allclose(total[: m * 4].reshape(m, 4), S @ M, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(total[m * 4: m * 5], np.abs(S).sum(axis=1), rtol=1e-9)
        assert total[m * 5:].max() == pytest.approx(np.linalg.norm(S, axis=0).max(), rel=1e-12)


def test_input_that_changes_between_passes_is_refused(spark):
    """A non-deterministic input (rows dropped at random) cannot reuse an index: the task fails."""
    from pyspark.sql import functions as F

    coin = F.udf(lambda: __import__("os").urandom(1)[0] / 256.0, "double").asNondeterministic()
    df = _table(spark, 3).where(coin() < 0.5)
    with pytest.raises(InputError, match="changed between the count pass"):
        release_regression(df, **KW)


def test_no_secret_in_logs_or_receipt(spark, caplog, monkeypatch):
    from tests.seeds import record_secret_seeds

    seeds = record_secret_seeds(monkeypatch)
    caplog.set_level(logging.DEBUG)
    rel = release_regression(_table(spark, 2), **KW)
    text = caplog.text + repr(rel.receipt()) + repr(rel.public)
    assert len(seeds) == 2
    for s in seeds:
        assert str(s) not in text and hex(s)[2:] not in text


def test_errors(spark):
    df = _table(spark, 2)
    with pytest.raises(Exception, match="'nope'"):
        release_regression(df, **dict(KW, columns=["f0", "nope"]))
    with pytest.raises(ParameterError, match="at most the number of rows n = 2500"):
        release_regression(df, **dict(KW, sketch_rows=N + 1))
    with pytest.raises(ParameterError, match="also listed as a feature"):
        release_regression(df, **dict(KW, columns=["f0", "y"]))
    with pytest.raises(ParameterError, match="realized columns"):
        release_regression(df, **dict(KW, neighbors="add-remove"))
    from pyspark.sql import functions as F

    bad = df.withColumn("f1", F.when(F.col("f0") > 0.9, F.lit(float("nan"))).otherwise(F.col("f1")))
    rel = release_regression(bad, **KW)  # NaN is replaced by the public fill (never an error)
    assert rel.diagnostics()["missing_values_replaced"] > 0


def test_cli_release_writes_sketch_receipt_and_model(spark, tmp_path, monkeypatch):
    import json

    from sparkpriv.cli import main

    path = str(tmp_path / "in.parquet")
    _table(spark, 2).write.parquet(path)
    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/ledger.sqlite")
    out = tmp_path / "out"
    rc = main(["release", "regression", "--input", path, "--output", str(out), "--columns", "f0,f1,f2",
               "--target", "y", "--method", "sketch", "--row-bound", "1.5", "--epsilon", "1", "--delta", "1e-6",
               "--sketch-rows", "30"])
    assert rc == 0
    r = json.loads((out / "_privacy_receipt.json").read_text())
    assert r["mechanism"] == "regression" and r["guarantee"]["epsilon"] <= 1.0
    assert r["mechanism_details"]["sketch_rows"] == 30
    model = json.loads((out / reg.MODEL_FILE).read_text())
    assert sorted(model["coefficients"]) == FEATURES and model["target"] == "y"
    assert set(model["confidence_intervals"]) == set(FEATURES)
    sketch = spark.read.parquet(str(out))
    assert sketch.count() == 30 and sketch.columns == FEATURES + ["y"]


@pytest.mark.parametrize("parts", [1, 3])
def test_additive_baseline_on_spark(spark, parts, tmp_path):
    """The additive baseline through the release path on Spark: each partition's rows get the
    noise of its keyed stream (numpy reference per partition), the model is the fit of exactly the
    released rows, and the written table is those rows."""
    import json

    from sparkpriv.privacy.random import stream

    A, b = _arrays()
    kw = dict(KW, scheme="additive")
    kw.pop("sketch_rows")
    df = _table(spark, parts)
    sizes = df.rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()
    with insecure_fixed_seed(77):
        rel = release_regression(df, **kw)
    with insecure_fixed_seed(77):
        plan = reg.plan_regression(RegressionParams(**{k: v for k, v in kw.items() if k != "columns"}),
                                   reg.RegressionFacts(N), d=3)
    M, _ = reg.clip_regression_rows(A, b, 1.5)
    nz = plan.additive_noise()
    ref, start = [], 0
    for pid, size in enumerate(sizes):
        ref.append(reg.additive_noise_rows(M[start:start + size], plan, stream(plan.noise_seed,
                                                                              reg.ADDITIVE_STAGE, pid)))
        start += size
    ref = np.concatenate(ref)
    out = rel.write(str(tmp_path / f"add{parts}"))
    got = spark.read.parquet(out).toPandas()[FEATURES + ["y"]].to_numpy()
    # the same rows (file order is not public, compare as sets of rows)
    def rows(X):
        X = np.ascontiguousarray(X)
        return X[np.lexsort(X.T[::-1])]

    # equal up to the last bits of the inputs (the JVM's sin/cos against numpy's, as above)
    np.testing.assert_allclose(rows(got), rows(ref), rtol=1e-12, atol=1e-12)
    fit = reg.fit_from_release(ref, nz.variance, confidence=0.95)
    np.testing.assert_allclose(rel.model.coef, fit.coef, rtol=1e-9)
    np.testing.assert_allclose(rel.model.stderr, fit.stderr, rtol=1e-9)
    model = json.loads((tmp_path / f"add{parts}" / reg.MODEL_FILE).read_text())
    assert model["scheme"] == "additive" and model["coefficients"]["f0"] == pytest.approx(fit.coef[0])
    r = json.loads((tmp_path / f"add{parts}" / "_privacy_receipt.json").read_text())
    assert r["mechanism_details"]["scheme"] == "additive" and r["guarantee"]["epsilon"] <= 2.0
    assert rel.diagnostics()["rows"] == N


def test_jvm_partition_counts_only_for_file_scans(spark, tmp_path):
    """The index's count pass runs in the JVM for a file scan (no column sent to Python) and gives
    the same per-partition counts as the Python count; other plans (a local relation, whose
    projection the optimizer evaluates on the driver; a shuffle) keep the Python count."""
    import pandas as pd

    from sparkpriv.spark.engine import SparkEngine
    from sparkpriv.spark.sources import _jvm_partition_counts

    path = str(tmp_path / "t.parquet")
    _table(spark, 4).write.parquet(path)
    df = spark.read.parquet(path)
    got = _jvm_partition_counts(df.select(*FEATURES))
    assert got is not None
    jvm = {int(r["pid"]): int(r["rows"]) for r in got}
    py = dict(enumerate(df.rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()))
    assert {k: v for k, v in py.items() if v} == jvm and sum(jvm.values()) == N
    eng = SparkEngine()
    idx = eng.index(eng.open(df, columns=FEATURES + ["y"], fill=None, caller="test"))
    assert idx.rows == N
    local = spark.createDataFrame(pd.DataFrame({"a": [1.0, 2.0, 3.0]}))
    assert _jvm_partition_counts(local) is None
    assert _jvm_partition_counts(df.repartition(3)) is None
    assert _jvm_partition_counts(_table(spark, 2)) is None  # spark.range: not a file scan
