"""The DPRP release on Spark: Gram == numpy, reconstruction == numpy, keyed noise, labels,
receipts, secrets, errors, and the CLI in-process."""

import json
import math
import os
import struct

import numpy as np
import pandas as pd
import pytest

from sparkpriv.errors import InputError, ParameterError, SchemaError
from sparkpriv.mechanisms import dprp as core
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.api import release_dprp
from sparkpriv.privacy.random import derive_seed
from sparkpriv.spark.batches import spark_errors
from sparkpriv.spark.engine import SparkEngine

pytestmark = pytest.mark.spark

D = 4
COLS = ["a", "b", "c", "age"]
LOWER = [0.0, -2.0, 0.0, 18.0]
UPPER = [1.0, 2.0, 10.0, 90.0]


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    rng = np.random.default_rng(5)
    n = 1500
    pdf = pd.DataFrame({
        "person": [f"p{i:05d}" for i in range(n)],
        "a": rng.random(n),
        "b": rng.normal(0, 1.5, n),  # partly outside [-2, 2]: clipped
        "c": rng.uniform(0, 10, n),
        "age": rng.integers(18, 91, n).astype("int32"),
    })
    pdf["y"] = (pdf.a > 0.4).astype("int32")
    path = str(tmp_path_factory.mktemp("in") / "t.parquet")
    spark.createDataFrame(pdf).repartition(3).write.parquet(path)
    return spark.read.parquet(path), path, pdf


def _plan(labels=None, classes=None, k2=None, k1=None):
    v = core.validate_params(d=D, epsilon=2.0, delta=1e-5, lower=LOWER, upper=UPPER, k1=k1, k2=k2,
                             row_bound=None, budget_split=(0.8, 0.2), labels=labels, classes=classes,
                             label_scale=1.0, fill=None, impute_share=0.05, neighbors="replace-one",
                             caller="t")
    R = draw_projection_matrix(D + v["n_label_columns"], v["k1"], 77)
    plan = core.plan_dprp(R, d=D, epsilon=2.0, delta=1e-5, lower=v["lower"], upper=v["upper"], k2=v["k2"],
                          row_bound=v["row_bound"], budget_split=v["budget_split"], labels=labels,
                          classes=classes, label_scale=1.0, integer_columns=[3])
    return plan, R


def test_spark_gram_equals_numpy(spark, table):
    df, _, pdf = table
    plan, _ = _plan(labels="public", classes=(0, 1))
    size = 2 * (1 + D * (D + 1) // 2)
    eng = SparkEngine()
    src = eng.open(df, columns=COLS, fill=None, caller="t", labels=("y", (0, 1)))
    with spark_errors():
        total = eng.aggregate(src, core._gram_fn(plan, None), size)
    counts, grams = core.gram_from_partial(total, D, 2)
    X = pdf[COLS].to_numpy(float)
    y = pdf["y"].to_numpy()
    # independent reference: scale and clip by hand, then X^T X per class
    lo, hi = np.array(LOWER), np.array(UPPER)
    U = np.clip((X - lo) / (hi - lo), 0, 1)
    for g in (0, 1):
        Ug = U[y == g]
        assert counts[g] == len(Ug)
        np.testing.assert_allclose(grams[g], Ug.T @ Ug, rtol=1e-12)


def test_spark_reconstruction_equals_numpy_before_noise(spark, table):
    df, _, pdf = table
    plan, R = _plan(labels="private", classes=(0, 1))
    rng = np.random.default_rng(0)
    A = rng.standard_normal((30, plan.d_aug))
    Ms = core.solve([A.T @ A], R, plan.k2)
    eng = SparkEngine()
    src = eng.open(df, columns=COLS, fill=None, caller="t", labels=("y", ("0", "1")), keep=["person"])
    fn = core._rows_fn(plan, R, Ms, None, 1, None, None, True)
    out, _ = eng.map_rows(src, fn, [(c, "as-input", True) for c in COLS] + [("y", "label", True)], keep=["person"])
    assert out.columns == ["person", *COLS, "y"]
    got = out.toPandas().sort_values("person").reset_index(drop=True)
    src = pdf.sort_values("person").reset_index(drop=True)
    codes = src["y"].to_numpy()
    Xp, _ = core.prepare_rows(src[COLS].to_numpy(float), plan, codes)
    ref, ref_codes = core.decode_rows(core.reconstruct_rows(Xp, R, Ms, None, None, None), plan)
    np.testing.assert_allclose(got[COLS].to_numpy(float), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got["y"].to_numpy(), np.array([0, 1])[ref_codes])
    assert str(got["age"].dtype) == "int32" and str(got["y"].dtype) == "int32"


def test_spark_release_equals_the_local_engine_for_a_test_seed(spark, test_seed):
    """The same mechanism on both engines: one Spark partition (partition id 0, one Arrow batch)
    and the local engine draw the same secrets, the same Gram noise and the same keyed row noise,
    so the released tables agree (noise included) up to floating-point summation order."""
    from sparkpriv.privacy import random as sprandom

    rng = np.random.default_rng(11)
    n = 800
    pdf = pd.DataFrame({"a": rng.random(n), "b": rng.normal(0, 1.5, n), "c": rng.uniform(0, 10, n),
                        "age": rng.integers(18, 91, n).astype("int32"), "y": rng.choice(["u", "v"], n)})
    kw = dict(columns=COLS, label="y", labels="private", classes=["u", "v"], epsilon=2.0, delta=1e-5,
              lower=LOWER, upper=UPPER)
    on_spark = release_dprp(spark.createDataFrame(pdf).coalesce(1), **kw)
    got = on_spark.df.toPandas()
    sprandom.reset_test_counter()
    local = release_dprp(pdf, **kw)
    ref = local.df.to_pandas()
    assert on_spark.engine == "spark" and local.engine == "local"
    assert list(got.columns) == list(ref.columns) == [*COLS, "y"]
    np.testing.assert_allclose(got[COLS].to_numpy(float), ref[COLS].to_numpy(float), rtol=1e-9, atol=1e-9)
    assert (got["y"] == ref["y"]).all() and str(got["age"].dtype) == str(ref["age"].dtype) == "int32"
    assert on_spark.event == local.event
    # and it is noisy: far from the noise-free reconstruction of the same rows
    assert np.abs(got["a"].to_numpy() - pdf["a"].to_numpy()).mean() > 0.05


def test_release_exact_reconstruction_path_and_keyed_noise(spark, table, test_seed):
    df, _, pdf = table
    rel = release_dprp(df, columns=COLS, epsilon=2.0, delta=1e-5, lower=LOWER, upper=UPPER,
                       keep_columns=["person"])
    a = rel.df.toPandas().sort_values("person").reset_index(drop=True)
    b = rel.df.toPandas().sort_values("person").reset_index(drop=True)
    assert a.equals(b), "recomputing the partitions must reproduce the same noise"
    assert list(a.columns) == ["person", *COLS]
    assert (a["b"] >= -2).all() and (a["b"] <= 2).all() and (a["age"] >= 18).all() and (a["age"] <= 90).all()
    assert rel.epsilon <= 2.0 * (1 + 1e-3) and rel.delta == 1e-5
    assert rel.event.events[0].noise_multiplier == pytest.approx(1 / rel.public["budget"]["mu_projection"])


def test_public_labels_receipt_secrets(spark, table, tmp_path, test_seed, caplog):
    df, path, pdf = table
    rel = release_dprp(df, columns=COLS, label="y", labels="public", classes=[0, 1], epsilon=4.0,
                       delta=1e-4, lower=LOWER, upper=UPPER, source=path)
    out = str(tmp_path / "rel")
    rel.write(out)
    with open(os.path.join(out, "_privacy_receipt.json")) as f:
        r = json.load(f)
    assert r["mechanism"] == "dprp"
    assert r["guarantee"]["epsilon"] <= 4.0 * (1 + 1e-3) and r["guarantee"]["delta"] == 1e-4
    assert [e["class_name"] for e in r["events"]["events"]] == ["GaussianDpEvent"] * 2
    md = r["mechanism_details"]
    n1 = int((pdf.y == 1).sum())
    assert md["class_sizes"] == {"0": len(pdf) - n1, "1": n1}
    assert "released" in md["class_sizes_note"]
    assert md["k2"] == core.default_k2(D) and md["k1"] == 4 * md["k2"]
    assert md["budget"]["projection_share"] == 0.8
    assert md["gram_noise"]["kind"] == "discrete_gaussian"
    assert md["integer_columns_rounded"] == [3]
    assert [c["name"] for c in r["output"]["schema"]] == [*COLS, "y"]
    back = spark.read.parquet(out).toPandas()
    assert len(back) == len(pdf) and "person" not in back.columns
    assert sorted(back["y"].tolist()) == sorted(pdf["y"].tolist())  # public labels unchanged
    # secrets: R (known here only through the test hook) and the noise seed appear nowhere
    R = draw_projection_matrix(D, md["k1"], derive_seed(test_seed, "dprp-matrix#1"))
    seed = derive_seed(test_seed, "dprp-noise#2")
    # exact on the box (public labels: D features in [0, 1]): sqrt(D) s_max(R) and sqrt(D (D + 1) / 2)
    assert np.linalg.norm(R, 2) * math.sqrt(D) == pytest.approx(md["sensitivity"]["projection_l2"], rel=1e-6)
    assert md["sensitivity"]["gram_l2"] == pytest.approx(math.sqrt(D * (D + 1) / 2), rel=1e-6)
    blobs = []
    for root, _, names in os.walk(out):
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                blobs.append(f.read())
    blobs.append(rel.df._jdf.queryExecution().toString().encode())
    blobs.append("\n".join(m.getMessage() for m in caplog.records).encode())
    needles = [seed.to_bytes(16, "little"), str(seed).encode()]
    for v in R.ravel():
        needles += [struct.pack("<d", v), repr(float(v))[:10].encode()]
    for blob in blobs:
        for needle in needles:
            assert needle not in blob


def test_private_labels_and_dp_mean_fill(spark, tmp_path):
    rng = np.random.default_rng(3)
    n = 600
    pdf = pd.DataFrame({"x1": rng.random(n), "x2": rng.random(n), "lab": rng.choice(["u", "v", "w"], n)})
    pdf.loc[::5, "x2"] = None
    df = spark.createDataFrame(pdf)
    # without a fill the nulls take the centre of the declared box (never an error)
    plain = release_dprp(df, columns=["x1", "x2"], epsilon=1.0, delta=1e-5, lower=[0, 0], upper=[1, 1])
    assert plain.df.count() == n and plain.diagnostics()["missing_values_replaced"] == 120
    rel = release_dprp(df, columns=["x1", "x2"], label="lab", labels="private", classes=["u", "v", "w"],
                       epsilon=1.0, delta=1e-5, lower=[0, 0], upper=[1, 1], fill="dp-mean")
    out = rel.df.toPandas()
    assert set(out["lab"]) <= {"u", "v", "w"} and out[["x1", "x2"]].notna().all().all()
    assert len(rel.event.events) == 3 and rel.epsilon <= 1.0 * (1 + 1e-3)
    assert "class_sizes" not in rel.public  # private labels: nothing about the classes is released
    assert rel.public["impute_noise"]["kind"] == "discrete_gaussian"


def test_label_errors(spark, table):
    df, _, _ = table
    base = dict(columns=COLS, epsilon=1.0, delta=1e-5, lower=LOWER, upper=UPPER)
    one = df.filter("y = 1")
    with pytest.raises(InputError, match="one class only"):
        release_dprp(one, label="y", labels="public", classes=[0, 1], **base)
    with pytest.raises(ParameterError, match="at least two distinct"):
        release_dprp(df, label="y", labels="public", classes=[1], **base)
    with pytest.raises(ParameterError, match="'classes' parameter of release_dprp is required"):
        release_dprp(df, label="y", labels="public", **base)
    with pytest.raises(ParameterError, match="declare labels='public'"):
        release_dprp(df, label="y", classes=[0, 1], **base)
    with pytest.raises(InputError, match="not a declared class"):
        release_dprp(df.selectExpr(*COLS, "y + 5 as y"), label="y", labels="public", classes=[0, 1], **base)
    with pytest.raises(SchemaError, match="'person' has type string"):
        release_dprp(df, **{**base, "columns": ["a", "person"], "lower": [0, 0], "upper": [1, 1]})


@pytest.mark.parametrize("kw,msg", [
    ({"delta": 0.0}, "must be in \\(0, 1\\)"),
    ({"k2": 5}, "'k2'"),
    ({"k1": 1, "k2": 2}, "at least k2"),
    ({"lower": None}, "declared public per-column bounds"),
    ({"budget_split": (0.9, 0.2)}, "'budget_split'"),
])
def test_bad_parameters(spark, table, kw, msg):
    df, _, _ = table
    args = dict(columns=COLS, epsilon=1.0, delta=1e-5, lower=LOWER, upper=UPPER)
    args.update(kw)
    with pytest.raises(ParameterError, match=msg):
        release_dprp(df, **args)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None])
def test_non_finite_values_take_the_centre_of_the_box(spark, bad):
    from sparkpriv.privacy.random import insecure_fixed_seed

    kw = dict(columns=["a", "b"], epsilon=1.0, delta=1e-5, lower=[0, 0], upper=[1, 2])
    df = spark.createDataFrame([(0.1, 0.2), (bad, 0.3)], "a double, b double").coalesce(1)
    ref = spark.createDataFrame([(0.1, 0.2), (0.5, 0.3)], "a double, b double").coalesce(1)
    with insecure_fixed_seed(11):
        a = release_dprp(df, **kw).df.toPandas()
    with insecure_fixed_seed(11):
        b = release_dprp(ref, **kw).df.toPandas()
    pd.testing.assert_frame_equal(a, b)


def test_cli_release_dprp_in_process(spark, table, tmp_path, capsys, monkeypatch):
    from sparkpriv.cli import main

    _, path, _ = table
    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/ledger.sqlite")
    out = tmp_path / "cli-out"
    rc = main(["release", "dprp", "--input", path, "--output", str(out), "--columns", ",".join(COLS),
               "--lower", ",".join(map(str, LOWER)), "--upper", ",".join(map(str, UPPER)),
               "--label", "y", "--labels", "private", "--classes", "0,1", "--epsilon", "2",
               "--delta", "1e-5", "--k2", "3", "--log-level", "WARNING"])
    assert rc == 0, capsys.readouterr().err
    receipt = json.loads((out / "_privacy_receipt.json").read_text())
    assert receipt["mechanism"] == "dprp" and receipt["mechanism_details"]["k2"] == 3
    assert receipt["mechanism_details"]["labels"] == "private"
    assert receipt["guarantee"]["epsilon"] <= 2.0 * (1 + 1e-3)
    back = spark.read.parquet(str(out))
    assert back.columns == [*COLS, "y"]
    assert main(["release", "dprp", "--input", path, "--output", str(tmp_path / "x"), "--columns", "a",
                 "--lower", "0", "--upper", "1", "--epsilon", "1"]) == 2
    assert "needs a delta" in capsys.readouterr().err
