"""The direct Parquet scan of the aggregate passes: only for the explicit direct reader
(read_table(..., reader="arrow")), and the same sums and errors as the mapInArrow path and
as an independent numpy computation."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkpriv.errors import InputError
from sparkpriv.io.inputs import read_table
from sparkpriv.mechanisms import dprp as core
from sparkpriv.spark.batches import spark_errors
from sparkpriv.api import release_dprp
from sparkpriv.spark.engine import SparkEngine
from sparkpriv.spark.parquet_scan import parquet_scan

pytestmark = pytest.mark.spark

COLS = ["a", "b", "n"]
LOWER, UPPER = [0.0, -3.0, 0.0], [1.0, 3.0, 50.0]


def _write_dataset(path, frames, row_group_size):
    path.mkdir()
    for i, f in enumerate(frames):
        pq.write_table(pa.Table.from_pandas(f, preserve_index=False), path / f"part-{i}.parquet",
                       row_group_size=row_group_size)
    return str(path)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(8)
    frames = []
    for i, n in enumerate((700, 1300, 1)):
        frames.append(pd.DataFrame({
            "a": rng.random(n), "b": rng.normal(0, 2, n), "n": rng.integers(0, 60, n).astype("int32"),
            "y": rng.choice(["p", "q"], n), "k": rng.integers(0, 2, n),
        }))
    path = _write_dataset(tmp_path_factory.mktemp("scan") / "t", frames, row_group_size=128)
    return path, pd.concat(frames, ignore_index=True)


def _plan(labels=None, classes=None):
    v = core.validate_params(d=3, epsilon=2.0, delta=1e-5, lower=LOWER, upper=UPPER, k1=None, k2=None,
                             row_bound=None, budget_split=(0.8, 0.2), labels=labels, classes=classes,
                             label_scale=1.0, fill=None, impute_share=0.05, neighbors="replace-one",
                             caller="t")
    R = np.random.default_rng(1).standard_normal((3 + v["n_label_columns"], v["k1"]))
    return core.plan_dprp(R, d=3, epsilon=2.0, delta=1e-5, lower=v["lower"], upper=v["upper"], k2=v["k2"],
                          row_bound=v["row_bound"], budget_split=v["budget_split"], labels=labels,
                          classes=classes, label_scale=1.0)


def gram_pass(df, plan, columns, label, fill_values):
    """The release's Gram pass: the engine's aggregate of the DPRP Gram partial."""
    eng = SparkEngine()
    src = eng.open(df, columns=columns, fill=None, caller="t", missing=fill_values is not None,
                   labels=(label, plan.classes) if label else None)
    return eng.aggregate(src, core._gram_fn(plan, fill_values), plan.n_groups * (1 + plan.d_aug * (plan.d_aug + 1) // 2))


def means_pass(df, plan, columns):
    eng = SparkEngine()
    return eng.aggregate(eng.open(df, columns=columns, fill=None, caller="t", missing=True), core._impute_fn(plan),
                         2 * len(columns) + 1)


def test_scan_applies_only_to_the_explicit_direct_reader(spark, dataset, tmp_path):
    path, pdf = dataset
    df = read_table(spark, path, reader="arrow")
    scan = parquet_scan(df, COLS)
    assert scan is not None
    n_groups = sum(pq.read_metadata(f"{path}/part-{i}.parquet").num_row_groups for i in range(3))
    assert len(scan.pieces) == n_groups == 6 + 11 + 1
    with pytest.raises(AttributeError, match="cannot be transformed"):
        df.filter("a > 0.5")  # a filter must never be skipped: a ParquetInput has none
    assert parquet_scan(df.df.filter("a > 0.5"), COLS) is None  # a DataFrame is read by Spark
    assert parquet_scan(df.df, COLS) is None
    assert parquet_scan(read_table(spark, path), COLS) is None  # the default reader is Spark's
    assert parquet_scan(spark.read.parquet(path), COLS) is None
    with pytest.raises(InputError, match="column 'y' has the Parquet type string"):
        parquet_scan(df, [*COLS, "y"])  # a string column only where declared
    assert parquet_scan(df, [*COLS, "y"], strings=["y"]) is not None
    with pytest.raises(InputError, match="column 'A' is not a column of the Parquet files"):
        parquet_scan(df, ["A", "b"])  # Spark resolves case-insensitively; the files do not
    assert parquet_scan(read_table(spark, path, reader="auto"), ["A", "b"]) is None  # auto: Spark reads
    csv = tmp_path / "t.csv"
    pdf.to_csv(csv, index=False)
    assert parquet_scan(read_table(spark, str(csv), reader="auto"), COLS) is None
    hive = tmp_path / "hive"
    spark.createDataFrame(pdf).write.partitionBy("k").parquet(str(hive))
    assert parquet_scan(read_table(spark, str(hive), reader="auto"), ["a", "k"]) is None  # partition column


@pytest.mark.parametrize("labels", [None, "public"])
def test_gram_direct_equals_mapinarrow_and_numpy(spark, dataset, labels):
    path, pdf = dataset
    classes = ("p", "q") if labels else None
    plan = _plan(labels, classes)
    label = "y" if labels else None
    df = read_table(spark, path, reader="arrow")
    with spark_errors():
        direct = gram_pass(df, plan, COLS, label, None)
        arrow = gram_pass(df.df, plan, COLS, label, None)  # a DataFrame: mapInArrow
    np.testing.assert_allclose(direct, arrow, rtol=1e-12)
    counts, grams = core.gram_from_partial(direct, plan.d_aug, plan.n_groups)
    U = np.clip((pdf[COLS].to_numpy(float) - LOWER) / (np.array(UPPER) - LOWER), 0, 1)
    groups = [U] if labels is None else [U[pdf["y"].to_numpy() == c] for c in classes]
    for g, Ug in enumerate(groups):
        assert counts[g] == len(Ug)
        np.testing.assert_allclose(grams[g], Ug.T @ Ug, rtol=1e-12)


def test_nulls_and_missing_columns_behave_as_in_spark(spark, tmp_path):
    rng = np.random.default_rng(2)
    f1 = pd.DataFrame({"a": rng.random(50), "b": rng.random(50), "n": rng.integers(0, 9, 50)})
    f1.loc[3, "b"] = None
    f2 = pd.DataFrame({"a": rng.random(40), "n": rng.integers(0, 9, 40)})  # no column b
    path = _write_dataset(tmp_path / "t", [f1, f2], row_group_size=16)
    df = read_table(spark, path, reader="arrow")
    assert parquet_scan(df, COLS) is not None
    plan = _plan()
    # nulls (and the missing column, read as nulls) are replaced by the public fill, 0.0 by default:
    # the direct scan and mapInArrow agree
    with spark_errors():
        direct0, arrow0 = (gram_pass(frame, plan, COLS, None, None) for frame in (df, df.df))
    np.testing.assert_allclose(direct0, arrow0, rtol=1e-12)
    assert direct0[0] == 90
    fill = np.array([0.5, 1.0, 2.0])
    direct = gram_pass(df, plan, COLS, None, fill)
    arrow = gram_pass(df.df, plan, COLS, None, fill)
    np.testing.assert_allclose(direct, arrow, rtol=1e-12)
    assert direct[0] == 90
    # the DP-means pass goes through the same dispatch
    tot_d = means_pass(df, plan, COLS)
    tot_a = means_pass(df.df, plan, COLS)
    np.testing.assert_allclose(tot_d, tot_a, rtol=1e-12)


def test_release_is_the_same_whichever_pass_reads_the_input(spark, dataset, test_seed):
    path, _ = dataset
    df = read_table(spark, path, reader="arrow")
    kw = dict(columns=COLS, epsilon=2.0, delta=1e-5, lower=LOWER, upper=UPPER, keep_columns=["k"])
    a = release_dprp(df, **kw).df.toPandas()
    from sparkpriv.privacy import random as sprandom

    sprandom.reset_test_counter()
    b = release_dprp(df.df, **kw).df.toPandas()
    # same second pass (same partitions, same keyed noise); only the Gram's summation order differs
    assert len(a) == len(b) == 2001
    np.testing.assert_allclose(a[COLS].to_numpy(float), b[COLS].to_numpy(float), rtol=1e-6, atol=1e-6)


def test_kmeans_feature_cache_and_final_pass_scan_directly(spark, dataset, caplog):
    from sparkpriv.mechanisms import kmeans as km
    from sparkpriv.privacy.bounds import Bounds
    from sparkpriv.spark.engine import SparkEngine

    path, pdf = dataset
    df = read_table(spark, path, reader="arrow")
    fmap = km.make_feature_map("linear", Bounds(3, tuple(LOWER), tuple(UPPER), 60.0))
    centres = km.initial_centres(fmap, 3, np.random.default_rng(6))
    size, size_in = 3 * (fmap.dim + 1), 3 * (3 + 1)
    caplog.set_level("INFO", logger="sparkpriv.spark.engine")
    engine = SparkEngine()
    direct = engine.open(df, columns=COLS, fill=None, caller="t")
    arrow = engine.open(df.df, columns=COLS, fill=None, caller="t")
    got = {}
    for name, src in (("direct", direct), ("arrow", arrow)):
        cache = engine.cache(src, km._features_fn(fmap, None), fmap.dim)
        try:
            assert cache.rows == len(pdf)
            got[name] = (cache.aggregate(km._stats_fn(centres), size),
                         engine.aggregate(src, km._input_stats_fn(fmap, centres), size_in))
        finally:
            cache.release()
    assert any("features: direct Arrow scan" in r.getMessage() for r in caplog.records)
    for a, b in zip(got["direct"], got["arrow"]):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # independent numpy: clip to the box (norms stay below 51: the bound 60 does not bind)
    X = np.clip(pdf[COLS].to_numpy(float), LOWER, UPPER)
    lab = np.argmin(((X[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    stats = got["direct"][0].reshape(3, -1)
    for j in range(3):
        assert stats[j, 0] == np.sum(lab == j)
        np.testing.assert_allclose(stats[j, 1:], X[lab == j].sum(axis=0), rtol=1e-12, atol=1e-9)
