"""`sparkpriv synthesize` / synthesize_dpgm: synthetic tables of a released DPGM model on Spark.

The model of most tests is built by hand: RBMs with zero weights, whose Gibbs chains
sample every visible unit as an independent Bernoulli(sigmoid(visible bias)), so the
mixture's column means have a closed form, sum_j n_j / n * sigmoid(b_j).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from sparkpriv.errors import InputError, OutputExistsError, ParameterError
from sparkpriv.io.synthesize import synthesize_dpgm
from sparkpriv.mechanisms import dpgm
from sparkpriv.mechanisms.rbm import RBM
from sparkpriv.privacy.random import insecure_fixed_seed

COLS = ("a", "b", "c")
SIZES = [3000.0, 1000.0, 0.0]
BIASES = [[2.0, -1.0, 0.0], [-2.0, 1.5, 3.0], [20.0, 20.0, 20.0]]
GUARANTEE = {"holds": True, "epsilon": 1.5, "delta": 1e-6, "neighbors": "replace-one"}


def _model(sizes=SIZES, biases=BIASES):
    d, h = len(biases[0]), 2
    gen = RBM(d, h)
    thetas = np.zeros((len(sizes), gen.dim))
    for j, b in enumerate(biases):
        thetas[j, d * h: d * h + d] = b
    params = dpgm.DPGMParams(epsilon=1.5, delta=1e-6, k=len(sizes), hidden=h, columns=COLS)
    return dpgm.DPGMModel(params, d, thetas, np.asarray(sizes, float), np.zeros((len(sizes), d)))


def _closed_form_means(sizes=SIZES, biases=BIASES):
    w = np.asarray(sizes) / np.sum(sizes)
    return w @ (1.0 / (1.0 + np.exp(-np.asarray(biases))))


def _release_dir(path, model, *, sizes_in_receipt=None, mechanism="dpgm"):
    """A DPGM release directory: the model file and a receipt (the fields synthesize reads)."""
    os.makedirs(path)
    with open(os.path.join(path, dpgm.MODEL_FILE), "wb") as f:
        f.write(model.to_bytes())
    sizes = list(model.sizes) if sizes_in_receipt is None else sizes_in_receipt
    receipt = {"format": "sparkpriv.receipt/1", "mechanism": mechanism, "created_at": "2026-01-01T00:00:00+00:00",
               "guarantee": GUARANTEE, "input": {"columns": list(COLS)}, "ledger": None,
               "mechanism_details": {"model": {"file": dpgm.MODEL_FILE, "cluster_sizes": sizes}}}
    with open(os.path.join(path, "_privacy_receipt.json"), "w") as f:
        json.dump(receipt, f)
    return str(path)


@pytest.fixture
def release(tmp_path):
    return _release_dir(tmp_path / "model", _model())


def _read(path) -> np.ndarray:
    t = pq.read_table(str(path))
    return np.column_stack([t.column(c).to_numpy() for c in t.column_names])


def test_rows_schema_bounds_and_provenance(spark, release, tmp_path):
    out = tmp_path / "synthetic"
    steps = []
    res = synthesize_dpgm(release, rows=3001, output=str(out), partitions=3, spark=spark,
                          on_step=lambda *a: steps.append(a))
    t = pq.read_table(str(out))
    assert t.num_rows == 3001 and res.rows == 3001 and res.partitions == 3
    assert t.column_names == list(COLS) and all(str(f.type) == "double" for f in t.schema)
    X = _read(out)
    assert set(np.unique(X)) <= {0.0, 1.0}  # binary records in the declared box [0, 1]
    assert len([f for f in os.listdir(out) if f.startswith("part-")]) == 3
    prov = json.loads((out / "_privacy_receipt.json").read_text())
    model_receipt = os.path.join(release, "_privacy_receipt.json")
    assert prov["post_processing"] is True and prov["spent"] == {"epsilon": 0.0, "delta": 0.0}
    assert prov["post_processing_of"]["receipt"].endswith(model_receipt)
    with open(model_receipt, "rb") as f:
        assert prov["post_processing_of"]["receipt_sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert prov["guarantee"] == GUARANTEE and (res.epsilon, res.delta) == (1.5, 1e-6)
    assert prov["synthesis"]["cluster_sizes"] == SIZES and "ledger" not in prov
    assert prov["synthesis"]["seed"].startswith("fresh OS entropy")  # the seed itself is never written
    assert steps and steps[-1][0] == "synthesis" and steps[-1][1] == steps[-1][2]


def test_deterministic_under_a_fixed_seed_and_fresh_otherwise(spark, release, tmp_path):
    runs = []
    for i, seed in enumerate((7, 7, 8)):
        with insecure_fixed_seed(seed):
            synthesize_dpgm(release, rows=2000, output=str(tmp_path / f"s{i}"), partitions=2, spark=spark)
        runs.append(_read(tmp_path / f"s{i}"))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    assert json.loads((tmp_path / "s0" / "_privacy_receipt.json").read_text())["insecure_test_seed"] is True
    synthesize_dpgm(release, rows=2000, output=str(tmp_path / "os"), partitions=2, spark=spark)
    assert not np.array_equal(_read(tmp_path / "os"), runs[0])


def test_marginals_follow_the_mixture(spark, release, tmp_path):
    """Column means against the closed form of the mixture, and the numpy synthesize()
    reference against the same closed form; the zero-size cluster (all ones) never appears,
    and the first two clusters come in the ratio of their noisy sizes."""
    n = 40_000
    synthesize_dpgm(release, rows=n, output=str(tmp_path / "s"), partitions=4, spark=spark)
    X = _read(tmp_path / "s")
    ref = dpgm.synthesize(_model(), n, seed=11)
    mu = _closed_form_means()
    tol = 5 * np.sqrt(mu * (1 - mu) / n) + 5 * np.sqrt(0.25 / n)  # cluster draw + Bernoulli draws
    np.testing.assert_array_less(np.abs(X.mean(axis=0) - mu), tol)
    np.testing.assert_array_less(np.abs(ref.mean(axis=0) - mu), tol)
    # a record with a = 1 and c = 0 comes from cluster 0 only: P = 0.75 sigmoid(2) (1 - 1/2)
    p = 0.75 * (1 / (1 + np.exp(-2.0))) * 0.5
    got = np.mean((X[:, 0] == 1) & (X[:, 2] == 0))
    assert abs(got - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_a_trained_release_written_by_the_library_is_synthesized(spark, tmp_path):
    """A real DPGM release (local engine, written by Release.write) is read back."""
    from sparkpriv.api import release_dpgm

    rng = np.random.default_rng(3)
    X = (rng.random((200, 4)) < np.where(np.arange(200)[:, None] % 2 == 0, 0.8, 0.1)).astype(float)
    with insecure_fixed_seed(3):
        rel = release_dpgm(X, epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=1, hidden=3, chains=10,
                           kmeans_iterations=2, accountant="rdp")
        rel.write(str(tmp_path / "rel"))
    res = synthesize_dpgm(str(tmp_path / "rel"), rows=500, output=str(tmp_path / "s"), spark=spark)
    t = pq.read_table(str(tmp_path / "s"))
    assert t.num_rows == 500 and t.column_names == ["x0", "x1", "x2", "x3"]
    assert res.epsilon == rel.epsilon


@pytest.mark.parametrize("rows", [0, -3, 2.5, True])
def test_bad_rows_refused_before_anything(spark, release, tmp_path, rows):
    with pytest.raises(ParameterError, match="'rows'"):
        synthesize_dpgm(release, rows=rows, output=str(tmp_path / "s"), spark=spark)
    assert os.listdir(tmp_path) == ["model"]


def test_missing_altered_or_foreign_models_leave_nothing(spark, tmp_path):
    out = tmp_path / "s"
    with pytest.raises(InputError, match="model file .* is missing"):
        synthesize_dpgm(str(tmp_path / "nowhere"), rows=10, output=str(out), spark=spark)
    altered = _release_dir(tmp_path / "altered", _model(), sizes_in_receipt=[1.0, 2.0, 3.0])
    with pytest.raises(InputError, match="does not match its receipt"):
        synthesize_dpgm(altered, rows=10, output=str(out), spark=spark)
    kmeans = _release_dir(tmp_path / "kmeans", _model(), mechanism="kmeans")
    with pytest.raises(InputError, match="not a DPGM one"):
        synthesize_dpgm(kmeans, rows=10, output=str(out), spark=spark)
    assert not out.exists()
    assert not [f for f in os.listdir(tmp_path) if "staging" in f]


def test_existing_output_is_refused_and_kept(spark, release, tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(OutputExistsError):
        synthesize_dpgm(release, rows=10, output=str(out), spark=spark)
    assert os.listdir(out) == ["keep"]


def test_cli_exit_codes_and_one_log_line_per_step(release, tmp_path):
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SPARKPRIV_INSECURE_TEST_SEED", None)
    base = [sys.executable, "-m", "sparkpriv.cli", "synthesize", "--model", release, "--output"]
    r = subprocess.run(base + [str(tmp_path / "bad"), "--rows", "0"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "'rows'" in r.stderr and not (tmp_path / "bad").exists()
    r = subprocess.run(base + [str(tmp_path / "s"), "--rows", "300", "--partitions", "2"], env=env,
                       capture_output=True, text=True)  # stderr is a pipe: no terminal
    assert r.returncode == 0, r.stderr
    assert pq.read_table(str(tmp_path / "s")).num_rows == 300
    lines = [ln for ln in r.stderr.splitlines() if "sparkpriv.synthesize: synthesis " in ln]
    i, n = lines[-1].split("synthesis ")[1].split(":")[0].split("/")
    assert i == n and int(n) >= 2
    assert all("no budget spent" in ln for ln in lines) and "\r" not in r.stderr
    assert "synthetic table:" in r.stdout and "no budget spent" in r.stdout


# ----------------------------------------------------------------------------- the source's column types

TYPED_COLS = ["i", "b", "x", "l", "f"]
TYPED_ARROW = ["int32", "bool", "double", "int64", "float"]  # pyarrow's names of the Parquet columns read back
TYPED_PARAMS = dict(epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=1, hidden=3, chains=10,
                    kmeans_iterations=2, accountant="rdp")


def _typed_pandas(n=300, seed=3):
    import pandas as pd

    rng = np.random.default_rng(seed)
    hi = np.arange(n) % 2 == 0
    return pd.DataFrame({"i": (rng.random(n) < np.where(hi, 0.8, 0.1)).astype(np.int32),
                         "b": rng.random(n) < np.where(hi, 0.7, 0.2),
                         "x": (rng.random(n) < np.where(hi, 0.9, 0.1)).astype(np.float64),
                         "l": (rng.random(n) < 0.5).astype(np.int64),
                         "f": (rng.random(n) < 0.5).astype(np.float32)})


def _check_typed_table(path, rows):
    t = pq.read_table(str(path))
    assert t.num_rows == rows and t.column_names == TYPED_COLS
    assert [str(t.schema.field(c).type) for c in TYPED_COLS] == TYPED_ARROW
    for c in TYPED_COLS:  # every value is one of the model's 0/1 records, in the column's type
        assert set(np.unique(t.column(c).to_numpy(zero_copy_only=False).astype(np.float64))) <= {0.0, 1.0}
    assert set(t.column("b").to_pylist()) == {True, False}
    return json.loads((path / "_privacy_receipt.json").read_text())


@pytest.mark.parametrize("engine,writer", [("local", "spark"), ("spark", "auto")])
def test_a_release_of_int_boolean_and_double_columns_synthesizes_those_types(spark, tmp_path, engine, writer):
    """The source's column types (its schema) are in the released model; the synthetic Parquet
    table has them (int, boolean, double, bigint, float), from a release on either engine."""
    from sparkpriv.api import release_dpgm

    pdf = _typed_pandas()
    data = pdf if engine == "local" else spark.createDataFrame(pdf)
    if engine == "spark":
        assert [f.dataType.simpleString() for f in data.schema] == ["int", "boolean", "double", "bigint", "float"]
    with insecure_fixed_seed(3):
        rel = release_dpgm(data, columns=TYPED_COLS, **TYPED_PARAMS)
        rel.write(str(tmp_path / "rel"))
    assert rel.model.types == ("int", "boolean", "double", "bigint", "float")
    res = synthesize_dpgm(str(tmp_path / "rel"), rows=2000, output=str(tmp_path / "s"), partitions=2,
                          writer=writer, spark=spark)
    prov = _check_typed_table(tmp_path / "s", 2000)
    assert res.types == rel.model.types
    assert prov["output"]["schema"] == [{"name": c, "type": t} for c, t in zip(TYPED_COLS, rel.model.types)]
    # otherwise the provenance is as for any synthesis
    assert prov["format"] == "sparkpriv.synthesis/1" and prov["post_processing"] is True
    assert prov["spent"] == {"epsilon": 0.0, "delta": 0.0}
    assert prov["synthesis"]["columns"] == TYPED_COLS and prov["synthesis"]["values"] == "in the declared box [0, 1]"
    # the in-memory synthesis gives the same types
    t = dpgm.synthesize_table(rel.model, 10, seed=1)
    assert [str(t.schema.field(c).type) for c in TYPED_COLS] == TYPED_ARROW


def test_a_format_1_model_file_still_synthesizes_doubles(spark, tmp_path):
    """A release written before the column types were recorded (model file format 1) is read
    and synthesized as before: every column double."""
    import io

    m = _model()
    header = {"format": "sparkpriv-dpgm", "format_version": 1, "params": m.params.public_dict(), "d": m.d,
              "public": {}}
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(json.dumps(header).encode(), np.uint8), thetas=m.thetas, sizes=m.sizes,
             centers=m.centers)
    rel = _release_dir(tmp_path / "old", m)
    with open(os.path.join(rel, dpgm.MODEL_FILE), "wb") as f:
        f.write(buf.getvalue())
    res = synthesize_dpgm(rel, rows=500, output=str(tmp_path / "s"), partitions=2, spark=spark)
    t = pq.read_table(str(tmp_path / "s"))
    assert t.column_names == list(COLS) and all(str(f.type) == "double" for f in t.schema)
    assert res.types == ("double",) * 3
    assert set(np.unique(_read(tmp_path / "s"))) <= {0.0, 1.0}


def test_column_types_that_differ_from_the_receipt_are_refused(spark, tmp_path):
    m = dataclasses.replace(_model(), column_types=("int", "boolean", "double"))
    rel = _release_dir(tmp_path / "typed", m)
    receipt = json.loads(open(os.path.join(rel, "_privacy_receipt.json")).read())
    receipt["mechanism_details"]["model"]["column_types"] = ["double", "boolean", "double"]
    with open(os.path.join(rel, "_privacy_receipt.json"), "w") as f:
        json.dump(receipt, f)
    with pytest.raises(InputError, match="column types differ"):
        synthesize_dpgm(rel, rows=10, output=str(tmp_path / "s"), spark=spark)
    assert not (tmp_path / "s").exists()


def test_boolean_columns_read_as_0_1_on_spark_with_a_fill():
    """Spark's blocks read a boolean source column as 0/1 (as the local engine does), nulls
    filled with the public fill."""
    import pyarrow as pa

    from sparkpriv.spark.batches import batch_matrix

    b = pa.record_batch([pa.array([True, None, False]), pa.array([1, 0, 1], pa.int32())], ["b", "i"])
    np.testing.assert_array_equal(batch_matrix(b, ["b", "i"], fill=1.0), [[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
