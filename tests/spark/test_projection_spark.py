"""The Spark projection release: Spark == numpy, keyed noise, receipts, secrets, errors."""

import json
import os
import struct

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sparkpriv.errors import InputError, OutputExistsError, ParameterError, SchemaError
from sparkpriv.api import release_projection
from sparkpriv.mechanisms.projection import _dense_row_map, draw_projection_matrix, project_rows
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.random import derive_seed
from sparkpriv.spark.engine import SparkEngine

pytestmark = pytest.mark.spark

D, K = 6, 3


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    rng = np.random.default_rng(5)
    n = 3000
    X = rng.normal(0, 1.5, size=(n, D))
    import pandas as pd

    pdf = pd.DataFrame(X, columns=[f"f{i}" for i in range(D)])
    pdf.insert(0, "person", [f"p{i:05d}" for i in range(n)])
    pdf["label"] = rng.integers(0, 2, n)
    path = str(tmp_path_factory.mktemp("in") / "t.parquet")
    spark.createDataFrame(pdf).repartition(3).write.parquet(path)
    df = spark.read.parquet(path)
    return df, path


def _cols():
    return [f"f{i}" for i in range(D)]


def _collect_sorted(df, key):
    rows = df.orderBy(key).collect()
    return rows


def _map_rows(df, columns, row_map, k, keep=()):
    """The mechanism's row map through the Spark engine's map_rows (what the release runs)."""
    eng = SparkEngine()
    src = eng.open(df, columns=columns, fill=None, caller="test")
    out, _ = eng.map_rows(src, row_map, [(f"z{i}", "double", False) for i in range(k)], keep=keep)
    return out


def test_spark_projection_equals_numpy_before_noise(spark, table):
    df, _ = table
    P = draw_projection_matrix(D, K, seed=99)
    bounds = Bounds(D, (-2.0,) * D, (2.0,) * D, row_bound=3.0)
    out = _map_rows(df, _cols(), _dense_row_map(P, bounds, None, 1), K, keep=["person"])
    got = out.toPandas().sort_values("person")
    src = df.toPandas().sort_values("person")
    Y, _ = project_rows(src[_cols()].to_numpy(), P, bounds)
    np.testing.assert_array_equal(got[[f"z{i}" for i in range(K)]].to_numpy(), Y)


def test_release_noise_is_keyed_and_reproducible(spark, table, test_seed):
    df, _ = table
    rel = release_projection(df, columns=_cols(), k=K, epsilon=1.0, row_bound=3.0,
                             keep_columns=["person"])
    a = rel.df.toPandas().sort_values("person").reset_index(drop=True)
    b = rel.df.toPandas().sort_values("person").reset_index(drop=True)
    pd_eq = (a.to_numpy() == b.to_numpy()).all()
    assert pd_eq, "recomputing the partitions must reproduce the same noise"
    # the noise is the planned noise: residual against the numpy projection
    P = draw_projection_matrix(D, K, derive_seed(test_seed, "projection-matrix#1"))
    src = df.toPandas().sort_values("person").reset_index(drop=True)
    Y, _ = project_rows(src[_cols()].to_numpy(), P, Bounds(D, row_bound=3.0))
    resid = a[[f"z{i}" for i in range(K)]].to_numpy() - Y
    var = rel.public["noise_variance_per_entry"]
    assert resid.var() == pytest.approx(var, rel=0.1)
    # on the grid
    g = rel.public["noise"]["grid"]
    q = a[[f"z{i}" for i in range(K)]].to_numpy() / g
    np.testing.assert_array_equal(q, np.round(q))
    # partitions draw independent noise: no two partitions share their noise sequence
    from pyspark.sql import functions as F

    part = rel.df.withColumn("_pid", F.spark_partition_id()).toPandas()  # rows in partition order
    srcmap = src.set_index("person")
    Yp, _ = project_rows(srcmap.loc[part["person"], _cols()].to_numpy(), P, Bounds(D, row_bound=3.0))
    noise_int = np.rint((part[[f"z{i}" for i in range(K)]].to_numpy() - Yp) / g)
    seqs = [noise_int[part["_pid"].to_numpy() == pid].ravel() for pid in sorted(part["_pid"].unique())]
    assert len(seqs) >= 2, "the test table must span several partitions"
    m = min(len(s_) for s_ in seqs)
    assert m >= 30
    for i in range(len(seqs)):
        for j in range(i + 1, len(seqs)):
            a_, b_ = seqs[i][:m], seqs[j][:m]
            assert np.mean(a_ == b_) < 0.5, "two partitions drew the same noise sequence"
            r = np.corrcoef(a_, b_)[0, 1]
            assert abs(r) < 5 / np.sqrt(m), f"partitions {i}, {j}: noise correlation {r:.3f}"


def test_write_receipt_and_no_secrets(spark, table, tmp_path, test_seed, caplog):
    df, path = table
    rel = release_projection(df, columns=_cols(), k=K, epsilon=1.5, row_bound=3.0,
                             lower=[-4.0] * D, upper=[4.0] * D, source=path)
    out = str(tmp_path / "release")
    written = rel.write(out)
    assert written.startswith("file:")
    files = sorted(os.listdir(out))
    assert "_privacy_receipt.json" in files and "_common_metadata" in files and "_SUCCESS" in files
    with open(os.path.join(out, "_privacy_receipt.json")) as f:
        r = json.load(f)
    assert r["mechanism"] == "projection"
    assert r["guarantee"]["epsilon"] == pytest.approx(1.5, rel=1e-9)
    assert r["guarantee"]["delta"] == 0.0
    assert r["guarantee"]["neighbors"] == "replace-one"
    assert r["events"]["class_name"] == "LaplaceDpEvent"
    assert r["mechanism_details"]["noise_variance_per_entry"] > 0
    assert r["mechanism_details"]["bounds"]["row_bound"] == 3.0
    assert r["input"]["source"] == os.path.basename(path) and r["input"]["schema_fingerprint"].startswith("sha256:")
    assert [c["name"] for c in r["output"]["schema"]] == [f"z{i}" for i in range(K)]
    assert r["library"]["name"] == "sparkpriv"
    assert r["insecure_test_seed"] is True
    details = json.dumps(r["mechanism_details"]).lower()
    for forbidden in ("count", "clipped", "seed\""):
        assert forbidden not in details
    # no data statistic: the table's row count (3000) is nowhere in the details
    import re

    assert not re.search(r"(?<![\d.])3000(?![\d.])", details)
    meta = pq.read_metadata(os.path.join(out, "_common_metadata")).metadata
    assert json.loads(meta[b"sparkpriv.receipt"])["guarantee"] == r["guarantee"]
    # the published table: only z columns, no person key
    back = spark.read.parquet(out)
    assert back.columns == [f"z{i}" for i in range(K)]
    assert back.count() == df.count()

    # secrets: the realized P (known here only through the test hook) and the seeds
    P = draw_projection_matrix(D, K, derive_seed(test_seed, "projection-matrix#1"))
    noise_seed = derive_seed(test_seed, "projection-noise#2")
    blobs = []
    for root, _, names in os.walk(out):
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                blobs.append(f.read())
    blobs.append(rel.df._jdf.queryExecution().toString().encode())
    blobs.append("\n".join(m.getMessage() for m in caplog.records).encode())
    needles = [noise_seed.to_bytes(16, "little"), str(noise_seed).encode()]
    for v in P.ravel():
        needles += [struct.pack("<d", v), struct.pack(">d", v), repr(float(v))[:10].encode()]
    for blob in blobs:
        for needle in needles:
            assert needle not in blob


def test_clipped_release_counts_go_to_owner_report_only(spark, table, tmp_path):
    df, _ = table
    rel = release_projection(df, columns=_cols(), k=K, epsilon=1.0, row_bound=0.5)
    report = tmp_path / "owner.json"
    out = rel.write(str(tmp_path / "r"), owner_report=str(report))
    diag = json.loads(report.read_text())["diagnostics"]
    assert diag["rows"] == 3000 and diag["rows_norm_clipped"] > 2500
    receipt = json.loads((tmp_path / "r" / "_privacy_receipt.json").read_text())
    keys, numbers = _keys_and_numbers(receipt)
    # the counts as values, not as digits of some float (a realized bound such as 0.93000025...
    # holds "3000" as a substring: a text search failed on it)
    assert "rows_norm_clipped" not in keys
    assert diag["rows"] not in numbers and diag["rows_norm_clipped"] not in numbers
    assert out


def _keys_and_numbers(obj, keys=None, numbers=None):
    """Every key and every number (not bool) anywhere in a parsed JSON document."""
    keys = set() if keys is None else keys
    numbers = [] if numbers is None else numbers
    if isinstance(obj, dict):
        for k, v in obj.items():
            keys.add(k)
            _keys_and_numbers(v, keys, numbers)
    elif isinstance(obj, list):
        for v in obj:
            _keys_and_numbers(v, keys, numbers)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        numbers.append(obj)
    return keys, numbers


def test_gaussian_variant(spark, table, tmp_path):
    df, _ = table
    rel = release_projection(df, columns=_cols(), k=K, epsilon=2.0, delta=1e-6, noise="gaussian",
                             row_bound=3.0)
    assert rel.event.__class__.__name__ == "GaussianDpEvent"
    assert rel.epsilon <= 2.0 * 1.002 and rel.delta == 1e-6
    z = [f"z{i}" for i in range(K)]
    got = rel.to_numpy(z)  # collected to the driver, in partition order
    assert got.shape == (3000, K) and got.dtype == np.float64
    np.testing.assert_array_equal(got, rel.df.select(*z).toPandas().to_numpy())


# ---- bad input: a clear error, nothing written -------------------------------------------

def _no_output(tmp_path):
    return not any(p.name.startswith("out") or "staging" in p.name for p in tmp_path.iterdir())


def test_missing_column_lists_available(spark, table):
    df, _ = table
    with pytest.raises(SchemaError, match="'f9' is not in the input. Available columns: person, f0"):
        release_projection(df, columns=["f0", "f9"], k=1, epsilon=1.0, row_bound=1.0)


def test_non_numeric_column(spark, table):
    df, _ = table
    with pytest.raises(SchemaError, match="'person' has type string"):
        release_projection(df, columns=["f0", "person"], k=1, epsilon=1.0, row_bound=1.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None])
def test_nulls_and_non_finite_values_take_the_public_fill(spark, tmp_path, bad):
    """Never an error: the release equals that of the table with the public fill written in
    (the declared fill, else 0.0, the centre of the norm ball)."""
    from sparkpriv.privacy.random import insecure_fixed_seed

    def frame(v):
        return spark.createDataFrame([(1.0, 1.0), (2.0, 2.0), (v, 3.0)], "a double, b double").coalesce(1)

    for fill, expect in ((None, 0.0), (0.25, 0.25)):
        kw = dict(columns=["a", "b"], k=1, epsilon=1.0, row_bound=1.0, **({} if fill is None else {"fill": fill}))
        with insecure_fixed_seed(3):
            a = release_projection(frame(bad), **kw)
            a_rows = a.df.toPandas()
        with insecure_fixed_seed(3):
            b_rows = release_projection(frame(expect), **kw).df.toPandas()
        pd.testing.assert_frame_equal(a_rows, b_rows)


def test_empty_input(spark, tmp_path):
    df = spark.createDataFrame([], "a double, b double")
    rel = release_projection(df, columns=["a", "b"], k=1, epsilon=1.0, row_bound=1.0)
    with pytest.raises(InputError, match="empty"):
        rel.write(str(tmp_path / "out"))
    assert _no_output(tmp_path)


@pytest.mark.parametrize("kw,msg", [
    ({"k": 0}, "'k' parameter"),
    ({"k": 7}, "'k' parameter"),
    ({"epsilon": 0.0}, "'epsilon'"),
    ({"noise": "gaussian", "delta": 1.5}, "'delta'"),
    ({"noise": "gaussian"}, "Gaussian noise"),
    ({"row_bound": None}, "declared public bounds"),
])
def test_bad_parameters(spark, table, kw, msg):
    df, _ = table
    args = dict(columns=_cols(), k=K, epsilon=1.0, row_bound=1.0)
    args.update(kw)
    with pytest.raises(ParameterError, match=msg):
        release_projection(df, **args)


def test_output_exists_needs_overwrite(spark, table, tmp_path):
    df, _ = table
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("previous")
    rel = release_projection(df, columns=_cols(), k=K, epsilon=1.0, row_bound=1.0)
    with pytest.raises(OutputExistsError, match="--overwrite"):
        rel.write(str(out))
    assert (out / "keep.txt").read_text() == "previous"
    rel = release_projection(df, columns=_cols(), k=K, epsilon=1.0, row_bound=1.0)
    rel.write(str(out), overwrite=True)
    assert not (out / "keep.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_failed_write_leaves_nothing(spark, tmp_path):
    from pyspark.sql import functions as F

    @F.udf("double")
    def explode(v):
        raise RuntimeError("a task fails")

    df = spark.createDataFrame([(1.0, 2.0)] * 10, "a double, b double").select("a", explode("b").alias("b"))
    rel = release_projection(df, columns=["a", "b"], k=1, epsilon=1.0, row_bound=1.0)
    with pytest.raises(Exception, match="a task fails"):
        rel.write(str(tmp_path / "out"))
    assert list(tmp_path.iterdir()) == []


def test_dp_row_bound_quantile(spark, tmp_path):
    rng = np.random.default_rng(11)
    X = rng.standard_normal((4000, 4))
    X *= (3.0 / np.linalg.norm(X, axis=1))[:, None]  # every row has norm 3 -> bucket 4
    df = spark.createDataFrame([tuple(map(float, r)) for r in X], "a double, b double, c double, d double")
    rel = release_projection(df, columns=["a", "b", "c", "d"], k=2, epsilon=2.0,
                             row_bound_quantile=0.9, bound_epsilon_share=0.25)
    est = rel.public["row_bound_estimation"]
    assert est["chosen_row_bound"] == 4.0
    assert est["epsilon"] == pytest.approx(0.5)
    assert rel.public["bounds"]["row_bound"] == 4.0
    # histogram (0.5) + release (1.5) compose to the requested 2.0, never more
    assert rel.epsilon == pytest.approx(2.0, rel=1e-9) and rel.epsilon <= 2.0 * (1 + 1e-12)
    assert rel.event.__class__.__name__ == "ComposedDpEvent"
    rel.write(str(tmp_path / "q"))
    with pytest.raises(ParameterError, match="either|one or the other"):
        release_projection(df, columns=["a", "b"], k=1, epsilon=1.0, row_bound=1.0, row_bound_quantile=0.9)


# ------------------------------------------------------------------ privacy-audit fixes

class _Untouchable:
    """A stand-in DataFrame that fails the test if anything reads it."""

    def __getattr__(self, name):
        raise AssertionError(f"the input was read ({name})")


def test_add_remove_refused_before_the_input_is_read():
    with pytest.raises(ParameterError, match=r"'add-remove'.*number of output rows.*replace-one"):
        release_projection(_Untouchable(), columns=["a"], k=1, epsilon=1.0, row_bound=1.0,
                           neighbors="add-remove")
    with pytest.raises(ParameterError, match=r"'add-remove'.*event-table records.*replace-one"):
        release_projection(_Untouchable(), k=1, epsilon=1.0, neighbors="add-remove")


def test_add_remove_refused_by_dprp_rows(spark, table):
    from sparkpriv.api import release_dprp

    df, _ = table
    with pytest.raises(ParameterError, match=r"'add-remove'.*DPRP.*number of output rows"):
        release_dprp(df, columns=_cols(), epsilon=1.0, delta=1e-6, lower=[-3.0] * D, upper=[3.0] * D,
                     neighbors="add-remove")


@pytest.mark.parametrize("kw", [{"row_bound": 1.0}, {"row_bound": 1.0, "lower": -2.0, "upper": 2.0},
                                {"row_bound_quantile": 0.9, "element_bound": 1.0}])
def test_element_with_a_row_clip_is_refused(spark, table, kw):
    df, _ = table
    with pytest.raises(ParameterError, match=r"neighbors='element'.*whole row"):
        release_projection(df, columns=_cols(), k=K, epsilon=1.0, neighbors="element", **kw)


def test_single_lower_upper_value_on_spark(spark, table):
    df, _ = table
    rel = release_projection(df, columns=_cols(), k=K, epsilon=1.0, lower=-2.0, upper=2.0)
    assert rel.public["bounds"]["lower"] == [-2.0] * D and rel.public["bounds"]["upper"] == [2.0] * D


def test_spark_clamps_like_numpy_before_noise(spark):
    # element_bound alone: no declared range, so huge values are clamped to the public range
    X = np.array([[1.0, 2.0, 3.0], [1e300, -1.0, 0.5], [-5.0, 1e30, 0.0]])
    df = spark.createDataFrame([tuple(map(float, r)) for r in X], "a double, b double, c double").coalesce(1)
    P = draw_projection_matrix(3, 2, seed=4)
    bounds = Bounds(3, element_bound=1.0)
    M = 1e6
    got = _map_rows(df, ["a", "b", "c"], _dense_row_map(P, bounds, None, 1, M), 2).toPandas().to_numpy()
    Y, _ = project_rows(X, P, bounds, M)
    np.testing.assert_array_equal(got, Y)  # one batch of the same rows: the same bits
    assert np.abs(got).max() <= M and np.abs(got[0]).max() < 10


@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
def test_huge_value_does_not_fail_the_release(spark, tmp_path, noise, delta):
    df = spark.createDataFrame([(1.0, 2.0), (1e300, -1.0), (0.5, 0.25)], "a double, b double")
    rel = release_projection(df, columns=["a", "b"], k=1, epsilon=1.0, delta=delta, noise=noise,
                             neighbors="element", element_bound=1.0)
    rel.write(str(tmp_path / "out"))
    z = np.array([r["z0"] for r in spark.read.parquet(str(tmp_path / "out")).collect()])
    assert z.size == 3 and np.isfinite(z).all()
    rng = rel.public["projected_value_range"]
    assert np.abs(z).max() <= rng["bound"] * 1.01


def test_dp_row_bound_with_a_large_epsilon_does_not_fail_on_the_counts(spark, tmp_path):
    # eps 5e5 for the histogram: its default grid held counts up to 32 only, so a
    # bucket of 200 rows made the release fail after the budget was reserved
    X = np.zeros((200, 2))
    X[:, 0] = 3.0
    df = spark.createDataFrame([tuple(map(float, r)) for r in X], "a double, b double")
    rel = release_projection(df, columns=["a", "b"], k=1, epsilon=1e6, row_bound_quantile=0.5,
                             bound_epsilon_share=0.5)
    assert rel.public["row_bound_estimation"]["chosen_row_bound"] == 4.0
    assert rel.epsilon <= 1e6 * (1 + 1e-12)
