"""DP k-means on Spark: Spark == numpy before noise, noise once per iteration on the driver,
receipts/model, CLI, errors."""

import json
import os

import numpy as np
import pytest

from sparkpriv.errors import InputError, ParameterError, SchemaError
from sparkpriv.mechanisms import kmeans as km
from sparkpriv.privacy import noise as nz
from sparkpriv.mechanisms.kmeans_model import MODEL_FILE, KMeansModel
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.calibration import gdp_epsilon_delta, gdp_mu_for
from sparkpriv.api import release_kmeans
from sparkpriv.spark.engine import SparkEngine, _Cache
from sparkpriv.spark.kmeans import assign_clusters

pytestmark = pytest.mark.spark

D, K, N = 4, 3, 3000


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    import pandas as pd

    rng = np.random.default_rng(11)
    centres = rng.normal(0, 6, size=(K, D))
    y = rng.integers(0, K, N)
    X = centres[y] + rng.normal(0, 1, size=(N, D))
    pdf = pd.DataFrame(X, columns=[f"f{i}" for i in range(D)])
    pdf.insert(0, "person", np.arange(N))
    pdf["label"] = y
    path = str(tmp_path_factory.mktemp("in") / "t.parquet")
    spark.createDataFrame(pdf).repartition(3).write.parquet(path)
    return spark.read.parquet(path), path, X, y, pdf


def _cols():
    return [f"f{i}" for i in range(D)]


@pytest.mark.parametrize("variant", ["linear", "kernel"])
def test_spark_counts_and_sums_equal_numpy_before_noise(spark, table, variant):
    df, _, _, _, pdf = table
    fmap = km.make_feature_map(variant, Bounds(D, (-8.0,) * D, (8.0,) * D, row_bound=12.0),
                               kernel_width=3.0, frequencies=8, seed=5)
    centres = km.initial_centres(fmap, K, np.random.default_rng(3))
    engine = SparkEngine()
    src = engine.open(df.select(*_cols()), columns=_cols(), fill=None, caller="t")
    # independent numpy: clip, features, explicit per-cluster loop on the whole table
    X = pdf[_cols()].to_numpy()
    Xc = np.clip(X, -8, 8)
    nrm = np.linalg.norm(Xc, axis=1, keepdims=True)
    Xc = np.where(nrm > 12, Xc * 12 / nrm, Xc)
    if variant == "kernel":
        P = Xc @ fmap.W.T
        Z = np.hstack([np.cos(P), np.sin(P)]) / np.sqrt(fmap.W.shape[0])
    else:
        Z = Xc
    lab = np.argmin(((Z[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    ref = np.zeros((K, fmap.dim + 1))
    for j in range(K):
        ref[j, 0] = np.sum(lab == j)
        ref[j, 1:] = Z[lab == j].sum(axis=0)
    # the iteration cache of a release: a serialized Python RDD of block bytes (classic Spark),
    # and the cached DataFrame of blocks (the Spark Connect path)
    cache = engine.cache(src, km._features_fn(fmap, None), fmap.dim)
    try:
        assert cache.rdd is not None and cache.rows == N
        via_cache = cache.aggregate(km._stats_fn(centres), K * (fmap.dim + 1))
        blocks_df = spark.createDataFrame(cache.rdd.map(lambda b: (b, len(b) // (8 * fmap.dim))),
                                          "z binary, rows long")
    finally:
        cache.release()
    df_cache = _Cache(fmap.dim, df=blocks_df)
    try:
        assert df_cache.rows == N
        got = df_cache.aggregate(km._stats_fn(centres), K * (fmap.dim + 1))
    finally:
        df_cache.release()
    for g in (got, via_cache):  # the DataFrame path (Spark Connect) and the RDD path
        g = g.reshape(K, -1)
        np.testing.assert_array_equal(g[:, 0], ref[:, 0])
        np.testing.assert_allclose(g[:, 1:], ref[:, 1:], rtol=1e-10, atol=1e-9)
    # the final step's input sums too
    fin = engine.aggregate(src, km._input_stats_fn(fmap, centres), K * (D + 1))
    ref_in = np.zeros((K, D + 1))
    for j in range(K):
        ref_in[j, 0] = np.sum(lab == j)
        ref_in[j, 1:] = Xc[lab == j].sum(axis=0)
    np.testing.assert_allclose(fin.reshape(K, -1), ref_in, rtol=1e-10, atol=1e-9)


def test_release_noise_once_per_iteration_on_the_driver(spark, table, monkeypatch, tmp_path, caplog,
                                                        test_seed):
    df, _, X, y, _ = table
    calls = []
    real = nz.add_noise

    def counting(values, noise, rng, **kw):
        calls.append(np.asarray(values).size)
        return real(values, noise, rng, **kw)

    monkeypatch.setattr(nz, "add_noise", counting)  # runs on the driver only
    caplog.set_level("INFO", logger="sparkpriv.kmeans")
    T = 4
    rel = release_kmeans(df, columns=_cols(), k=K, epsilon=4.0, delta=1e-5, iterations=T,
                             variant="kernel", row_bound=30.0, kernel_width=4.0, frequencies=16)
    assert calls == [K * (32 + 1)] * T + [K * (D + 1)]
    lines = [r.getMessage() for r in caplog.records if "kmeans iteration" in r.getMessage()]
    assert len(lines) == T and lines[-1].startswith(f"kmeans iteration {T}/{T}")
    # accounting: recorded events give the closed-form epsilon
    mu = gdp_mu_for(4.0, 1e-5)
    assert epsilon_of(rel.event, 1e-5) == pytest.approx(gdp_epsilon_delta(mu, 1e-5), rel=2e-3)
    assert rel.epsilon == pytest.approx(4.0, rel=2e-3)
    # utility sanity check; the seed is fixed because a random domain init can merge two blobs
    assert km.clustering_accuracy(y, rel.model.predict(X)) > 0.6


def test_release_write_model_receipt_and_determinism(spark, table, tmp_path, test_seed):
    df, path, X, _, _ = table
    args = dict(columns=_cols(), k=K, epsilon=2.0, delta=1e-5, iterations=2, variant="kernel",
                lower=[-20.0] * D, upper=[20.0] * D, kernel_width=4.0, frequencies=8, source=path)
    rel = release_kmeans(df, **args)
    from sparkpriv.privacy import random as sprandom

    sprandom.reset_test_counter()
    rel2 = release_kmeans(df, **args)
    np.testing.assert_array_equal(rel.model.centers, rel2.model.centers)
    np.testing.assert_array_equal(rel.model.feature_centers, rel2.model.feature_centers)
    out = rel.write(str(tmp_path / "rel"))
    files = set(os.listdir(tmp_path / "rel"))
    assert {"_privacy_receipt.json", MODEL_FILE, "_SUCCESS"} <= files
    r = json.loads((tmp_path / "rel" / "_privacy_receipt.json").read_text())
    assert r["mechanism"] == "kmeans" and r["guarantee"]["delta"] == 1e-5
    assert r["guarantee"]["epsilon"] == pytest.approx(2.0, rel=2e-3)
    assert r["events"]["class_name"] == "ComposedDpEvent"
    table_back = spark.read.parquet(out).orderBy("cluster").toPandas()
    assert list(table_back.columns) == ["cluster", "count", "reliable", "center", "feature_center"]
    m = KMeansModel.load(str(tmp_path / "rel"))
    assert r["mechanism_details"]["unreliable_clusters"] == list(m.unreliable) == list(rel.model.unreliable)
    assert table_back["reliable"].tolist() == m.reliable.tolist()
    np.testing.assert_allclose(np.vstack(table_back["center"]), m.centers)
    np.testing.assert_array_equal(m.W, rel.model.W)
    # nothing secret or per-record in the outputs: no noise seed, no raw rows
    from sparkpriv.privacy.random import derive_seed

    blob = "".join((tmp_path / "rel" / f).read_text() for f in ("_privacy_receipt.json", MODEL_FILE))
    for label in ("kmeans-noise#3", "kmeans-noise#6"):
        assert str(derive_seed(test_seed, label)) not in blob
    assert repr(float(X[0, 0]))[:12] not in blob
    # assign(df): the Spark assignment equals predict
    got = assign_clusters(df, m, columns=_cols(), keep_columns=["person"]).toPandas().sort_values("person")
    pdf = df.toPandas().sort_values("person")
    np.testing.assert_array_equal(got["cluster"].to_numpy(), m.predict(pdf[_cols()].to_numpy()))


def test_small_epsilon_release_projects_clamps_and_flags(spark, table, tmp_path, test_seed):
    # before the post-processing (seed of the test_seed fixture): centres far outside the box
    # [-8, 8]^4 and negative sizes; predict/assign used the noise centres
    df, _, X, _, _ = table
    k = 8
    rel = release_kmeans(df, columns=_cols(), k=k, epsilon=0.3, delta=1e-5, iterations=2,
                             variant="linear", lower=[-8.0] * D, upper=[8.0] * D)
    m = rel.model
    assert np.all(np.abs(m.centers) <= 8.0) and np.all(m.counts >= 0.0)
    # independent: the size noise std is 2 / mu_iter (sensitivity 2C on (C n_j, S_j), sizes / C)
    mu_iter = gdp_mu_for(0.3, 1e-5) / np.sqrt(2)
    flagged = np.flatnonzero(m.counts < 3 * 2 / mu_iter)
    assert 1 <= flagged.size < k
    lab = m.predict(X)
    assert not np.isin(lab, flagged).any()
    out = rel.write(str(tmp_path / "rel"))
    r = json.loads((tmp_path / "rel" / "_privacy_receipt.json").read_text())
    det = r["mechanism_details"]
    assert det["unreliable_clusters"] == flagged.tolist() == det["model"]["unreliable_clusters"]
    assert det["parameters"]["reliability_stds"] == 3.0 and "counts" in det["postprocessing"]
    assert det["model"]["noise_std"]["count"] == pytest.approx(2 / mu_iter, rel=1e-6)
    back = spark.read.parquet(out).orderBy("cluster").toPandas()
    assert back["reliable"].tolist() == [j not in flagged for j in range(k)]
    assert np.all(np.vstack(back["center"]) <= 8.0) and np.all(back["count"] >= 0)
    got = assign_clusters(df, m, columns=_cols(), keep_columns=["person"]).toPandas().sort_values("person")
    np.testing.assert_array_equal(got["cluster"].to_numpy(), lab)
    everything = assign_clusters(df, m, columns=_cols(), keep_columns=["person"], include_unreliable=True)
    np.testing.assert_array_equal(everything.toPandas().sort_values("person")["cluster"].to_numpy(),
                                  m.predict(X, include_unreliable=True))


def test_linear_release_and_cli(spark, table, tmp_path, monkeypatch):
    from sparkpriv.cli import main

    _, path, _, _, _ = table
    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/ledger.sqlite")
    out = tmp_path / "cli"
    rc = main(["release", "kmeans", "--input", path, "--output", str(out), "--columns", ",".join(_cols()),
               "--k", "3", "--epsilon", "1", "--delta", "1e-6", "--iterations", "2",
               "--variant", "linear", "--row-bound", "20"])
    assert rc == 0
    r = json.loads((out / "_privacy_receipt.json").read_text())
    assert r["mechanism_details"]["variant"] == "linear"
    assert r["mechanism_details"]["model"]["W"] is None
    assert KMeansModel.load(str(out)).centers.shape == (3, D)


@pytest.mark.parametrize("kw,err,msg", [
    ({"k": 1}, ParameterError, "'k' parameter"),
    ({"iterations": 0}, ParameterError, "'iterations' parameter"),
    ({"kernel_width": -1.0}, ParameterError, "'kernel_width' parameter"),
    ({"row_bound": None}, ParameterError, "declared public bounds"),
    ({"delta": 0.0}, ParameterError, "'delta' parameter"),
    ({"columns": ["f0", "nope"]}, SchemaError, "'nope' is not in the input"),
    ({"k": 60}, ParameterError, r"floor\(sqrt\(n\)\) = 54"),
    ({"reliability_stds": float("nan")}, ParameterError, "'reliability_stds' parameter"),
    ({"neighbors": "add-remove"}, ParameterError, "'neighbors' parameter"),
])
def test_errors(spark, table, kw, err, msg):
    df, _, _, _, _ = table
    args = dict(columns=_cols(), k=K, epsilon=1.0, delta=1e-5, iterations=2, variant="kernel",
                row_bound=10.0, kernel_width=1.0, frequencies=4)
    args.update(kw)
    with pytest.raises(err, match=msg):
        release_kmeans(df, **args)


def test_nan_input_is_replaced_and_counted(spark):
    from sparkpriv.privacy.random import insecure_fixed_seed

    kw = dict(columns=["a", "b"], k=2, epsilon=1.0, delta=1e-5, iterations=1, variant="linear", row_bound=3.0)
    df = spark.createDataFrame([(1.0, 1.0)] * 20 + [(float("nan"), 2.0)], "a double, b double").coalesce(1)
    ref = spark.createDataFrame([(1.0, 1.0)] * 20 + [(0.0, 2.0)], "a double, b double").coalesce(1)
    with insecure_fixed_seed(9):
        a = release_kmeans(df, **kw)
    with insecure_fixed_seed(9):
        b = release_kmeans(ref, **kw)
    np.testing.assert_array_equal(a.model.centers, b.model.centers)
    assert a.diagnostics().get("missing_values_replaced") == 1  # counted once, in the first pass
