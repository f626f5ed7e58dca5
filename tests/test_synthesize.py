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
    params = dpgm.DPGMParams(epsilon=1.5, delta=1e-6, k=len(sizes), hidden=h, columns=COLS, length_strata=0)
    return dpgm.DPGMModel(params, d, thetas, np.asarray(sizes, float), np.zeros((len(sizes), d)))


def _closed_form_means(sizes=SIZES, biases=BIASES):
    w = np.asarray(sizes) / np.sum(sizes)
    return w @ (1.0 / (1.0 + np.exp(-np.asarray(biases))))


def _release_dir(path, model, *, sizes_in_receipt=None, mechanism="dpgm", columns=COLS):
    """A DPGM release directory: the model file and a receipt (the fields synthesize reads)."""
    os.makedirs(path)
    with open(os.path.join(path, dpgm.MODEL_FILE), "wb") as f:
        f.write(model.to_bytes())
    sizes = list(model.sizes) if sizes_in_receipt is None else sizes_in_receipt
    receipt = {"format": "sparkpriv.receipt/1", "mechanism": mechanism, "created_at": "2026-01-01T00:00:00+00:00",
               "guarantee": GUARANTEE, "input": {"columns": list(columns)} if columns else {}, "ledger": None,
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


# ----------------------------------------------------------------------------- event tables (items array / exploded)

from sparkpriv.mechanisms.event_columns import EventColumns  # noqa: E402
from sparkpriv.mechanisms.sparse import Vocabulary  # noqa: E402

EV_IDS = (130, 110, 120, 140, 105)  # declared ids, not sorted: the indices are NOT the ids' order
EV_BIASES = [[2.0, -1.0, 0.0, -3.0, 1.0], [-2.0, 1.5, 3.0, 0.5, -1.0]]
EV_SIZES = [2000.0, 1000.0]


def _event_model(vocabulary=EV_IDS, item_type="int", person="caller_id", item="tower_id"):
    m = _model(sizes=EV_SIZES, biases=EV_BIASES)
    params = dataclasses.replace(m.params, columns=None)
    voc = Vocabulary.parse(vocabulary) if isinstance(vocabulary, str) else Vocabulary.from_ids(vocabulary)
    return dataclasses.replace(m, params=params, events=EventColumns(person, item, item_type, voc))


@pytest.fixture
def event_release(tmp_path):
    return _release_dir(tmp_path / "evmodel", _event_model(), columns=None)


def _expected_items(X, ids):
    """The reference: each 0/1 row's visited items (>= 0.5) as the declared ids, sorted."""
    return [sorted(int(ids[j]) for j in range(X.shape[1]) if X[i, j] >= 0.5) for i in range(X.shape[0])]


def _reference_rows(model, rows, seed, partitions, batch_rows):
    """synthesize_part's records, partition after partition, batch after batch."""
    out = []
    for p in range(partitions):
        todo = rows // partitions + (1 if p < rows % partitions else 0)
        b = 0
        while todo > 0:
            m = min(todo, batch_rows)
            out.append(dpgm.synthesize_part(model, m, seed, p, b))
            todo, b = todo - m, b + 1
    return np.concatenate(out)


def _sorted_by_person(path):
    t = pq.read_table(str(path))
    return t.take(np.argsort(t.column(t.column_names[0]).to_numpy(), kind="stable"))


def test_event_model_header_round_trip_and_older_files(tmp_path):
    """Format 3 (and 4) keeps the event columns (ids or a range, string ids); table models have none;
    a format 2 file (types, no events) still loads as a table model; a vocabulary of the wrong
    size is refused."""
    import io

    for m in (_event_model(), _event_model(vocabulary="100..104", item_type="bigint"),
              _event_model(vocabulary=("b", "a", "c", "e", "d"), item_type="string")):
        back = dpgm.DPGMModel.load(io.BytesIO(m.to_bytes()))
        assert back.events == m.events and back.events.vocabulary.ids == m.events.vocabulary.ids
        np.testing.assert_array_equal(back.thetas, m.thetas)
    header = json.loads(bytes(np.load(io.BytesIO(_event_model().to_bytes()))["header"]).decode())
    assert dpgm.FORMAT_VERSION == 7 and header["format_version"] == 7 and header["lengths"] is None
    assert header["events"] == {"person_column": "caller_id", "item_column": "tower_id", "item_type": "int",
                                "vocabulary": {"ids": list(EV_IDS), "source": "declared list"}}
    assert dpgm.DPGMModel.load(io.BytesIO(_model().to_bytes())).events is None
    # format 2: written before the event columns
    m = _event_model()
    h2 = {"format": "sparkpriv-dpgm", "format_version": 2, "params": m.params.public_dict(), "d": m.d,
          "public": {}, "column_types": ["double"] * m.d}
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(json.dumps(h2).encode(), np.uint8), thetas=m.thetas, sizes=m.sizes,
             centers=m.centers)
    old = dpgm.DPGMModel.load(io.BytesIO(buf.getvalue()))
    assert old.events is None and old.types == ("double",) * 5
    # a vocabulary that does not match the model's columns
    bad = dataclasses.replace(m, events=EventColumns("p", "i", "int", Vocabulary.from_range(0, 4)))
    with pytest.raises(ParameterError, match="4 items for 5 model columns"):
        dpgm.DPGMModel.load(io.BytesIO(bad.to_bytes()))


def test_item_types_follow_the_source_item_column():
    ev = lambda t, voc: EventColumns("p", "i", t, Vocabulary.parse(voc)).synthetic_item_type  # noqa: E731
    assert ev("int", "0..9") == "int" and ev("smallint", "0..9") == "smallint" and ev("bigint", "0..9") == "bigint"
    assert ev("tinyint", "100..300") == "bigint"  # the declared ids do not fit the source's type
    assert ev("string", "0..9") == "string" and ev("int", ["a", "b"]) == "string"


def test_items_are_the_wide_rows_mapped_through_the_vocabulary(spark, event_release, tmp_path):
    """The default layout of an event model: person 0..N-1 and the sorted item ids of its 0/1
    record; the reference maps synthesize_part's records of the same seed through the declared
    ids itself. --wide under the same seed writes those 0/1 records; a fixed seed reproduces the
    table, another seed does not."""
    from sparkpriv.privacy.random import new_secret_seed
    from sparkpriv.spark.synthesize import BATCH_ROWS

    model, rows, parts = _event_model(), 2501, 3
    with insecure_fixed_seed(5):
        seed = new_secret_seed("dpgm-synthesis")
    X = _reference_rows(model, rows, seed, parts, BATCH_ROWS)
    assert X.shape == (rows, 5) and set(np.unique(X)) == {0.0, 1.0}
    outs = {}
    for name, fixed, kw in (("items", 5, {}), ("again", 5, {}), ("other", 6, {}), ("wide", 5, {"wide": True})):
        with insecure_fixed_seed(fixed):
            outs[name] = synthesize_dpgm(event_release, rows=rows, output=str(tmp_path / name), partitions=parts,
                                         spark=spark, **kw)
    res = outs["items"]
    assert res.layout == "items" and res.columns == ("person", "items") and res.types == ("bigint", "array<int>")
    t = _sorted_by_person(tmp_path / "items")
    assert t.column_names == ["person", "items"] and str(t.schema.field("items").type.value_type) == "int32"
    assert str(t.schema.field("person").type) == "int64"
    np.testing.assert_array_equal(t.column("person").to_numpy(), np.arange(rows))
    assert t.column("items").to_pylist() == _expected_items(X, EV_IDS)
    assert pq.read_table(str(tmp_path / "again")).equals(pq.read_table(str(tmp_path / "items")))
    assert not pq.read_table(str(tmp_path / "other")).equals(pq.read_table(str(tmp_path / "items")))
    np.testing.assert_array_equal(_read(tmp_path / "wide"), X)
    assert outs["wide"].columns == ("x0", "x1", "x2", "x3", "x4")
    prov = json.loads((tmp_path / "items" / "_privacy_receipt.json").read_text())
    assert prov["synthesis"]["layout"] == "items" and prov["synthesis"]["events"]["item_column"] == "tower_id"
    assert prov["output"]["schema"] == [{"name": "person", "type": "bigint"}, {"name": "items", "type": "array<int>"}]
    assert "seed" not in json.dumps(prov["synthesis"]["events"])


def test_explode_is_the_items_one_row_per_person_and_item(spark, event_release, tmp_path):
    """--explode: one row per (person, item) under the source's column names, the same records as
    the array form of the same seed (people without items have no row)."""
    for name, kw in (("items", {}), ("events", {"explode": True})):
        with insecure_fixed_seed(9):
            res = synthesize_dpgm(event_release, rows=1200, output=str(tmp_path / name), partitions=2,
                                  spark=spark, **kw)
    assert res.layout == "events" and res.columns == ("caller_id", "tower_id")
    items = _sorted_by_person(tmp_path / "items")
    ev = pq.read_table(str(tmp_path / "events"))
    assert ev.column_names == ["caller_id", "tower_id"] and str(ev.schema.field("tower_id").type) == "int32"
    got = sorted(zip(ev.column("caller_id").to_pylist(), ev.column("tower_id").to_pylist()))
    want = [(p, it) for p, its in zip(items.column("person").to_pylist(), items.column("items").to_pylist())
            for it in its]
    assert got == want and len(got) > 1200


def test_batches_and_partitions_number_the_people(spark):
    """Several batches per partition: the person ids continue across batches and partitions, each
    batch from its own keyed streams (the reference computes them itself)."""
    from sparkpriv.spark.synthesize import synthetic_events

    model = _event_model(vocabulary="100..104", item_type="bigint")
    bm = synthetic_events(spark, model, 1000, seed=77, partitions=3, batch_rows=150)
    t = bm.to_df().toPandas().sort_values("person")
    X = _reference_rows(model, 1000, 77, 3, 150)
    np.testing.assert_array_equal(t["person"].to_numpy(), np.arange(1000))
    assert [list(v) for v in t["items"]] == _expected_items(X, range(100, 105))


def test_in_memory_events_are_synthesize_mapped():
    from sparkpriv.mechanisms.event_columns import synthesize_events

    model = _event_model()
    X = dpgm.synthesize(model, 300, seed=4)
    t = synthesize_events(model, 300, seed=4)
    assert t.column("items").to_pylist() == _expected_items(X, EV_IDS)
    e = synthesize_events(model, 300, seed=4, explode=True)
    assert e.column_names == ["caller_id", "tower_id"] and e.num_rows == int((X >= 0.5).sum())
    with pytest.raises(ParameterError, match="released on a table"):
        synthesize_events(_model(), 10, seed=1)


def test_explode_and_wide_refusals_leave_nothing(spark, release, event_release, tmp_path):
    out = tmp_path / "s"
    with pytest.raises(ParameterError, match=r"--explode.*released on a table"):
        synthesize_dpgm(release, rows=10, output=str(out), explode=True, spark=spark)
    with pytest.raises(ParameterError, match="--explode, --wide"):
        synthesize_dpgm(event_release, rows=10, output=str(out), explode=True, wide=True, spark=spark)
    with pytest.raises(ParameterError, match="'explode'"):
        synthesize_dpgm(event_release, rows=10, output=str(out), explode="yes", spark=spark)
    with pytest.raises(ParameterError, match="'wide'"):
        synthesize_dpgm(event_release, rows=10, output=str(out), wide=1, spark=spark)
    # a table model's output is always wide
    assert synthesize_dpgm(release, rows=10, output=str(out), wide=True, spark=spark).layout == "wide"
    # a receipt that records other event columns: the directory was altered
    altered = _release_dir(tmp_path / "altered", _event_model(), columns=None)
    rp = os.path.join(altered, "_privacy_receipt.json")
    receipt = json.loads(open(rp).read())
    receipt["mechanism_details"]["model"]["events"] = _event_model(vocabulary="0..4").events.to_public_dict()
    with open(rp, "w") as f:
        json.dump(receipt, f)
    with pytest.raises(InputError, match="event columns or vocabulary differ"):
        synthesize_dpgm(altered, rows=10, output=str(tmp_path / "s2"), spark=spark)
    assert not (tmp_path / "s2").exists()


def test_cli_explode_on_a_table_model_and_an_event_model(spark, release, event_release, tmp_path, capsys):
    from sparkpriv.cli import main

    cmd = ["synthesize", "--rows", "200", "--partitions", "2"]
    assert main(cmd + ["--model", release, "--output", str(tmp_path / "bad"), "--explode"]) == 2
    assert "--explode" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(cmd + ["--model", event_release, "--output", str(tmp_path / "ev"), "--explode", "--wide"]) == 2
    assert "--explode, --wide" in capsys.readouterr().err and not (tmp_path / "ev").exists()
    assert main(cmd + ["--model", event_release, "--output", str(tmp_path / "ev"), "--explode"]) == 0
    assert pq.read_table(str(tmp_path / "ev")).column_names == ["caller_id", "tower_id"]
    assert "one row per (person, item)" in capsys.readouterr().out


def _source_events(spark, ids=EV_IDS, people=400, seed=2):
    """A small private event table over the declared ids (repeated events, some outside them)."""
    rng = np.random.default_rng(seed)
    rows = [(int(p), int(ids[j])) for p in range(people) for j in range(len(ids)) if rng.random() < 0.4
            for _ in range(int(rng.integers(1, 3)))]
    rows += [(0, 999), (1, 999)]
    return spark.createDataFrame(rows, "caller_id long, tower_id int")


def test_counting_queries_read_the_synthetic_items_and_events(spark, event_release, tmp_path):
    """evaluate counting-queries answers the synthetic items (ids, --release-item-ids) and the
    exploded events (--release-events) like the 0/1 wide table of the same seed (the dense path);
    the source given as an event-table release answers exactly (error 0)."""
    from sparkpriv.spark.counting_queries import answer_release, evaluate_counting_queries

    for name, kw in (("items", {}), ("events", {"explode": True}), ("wide", {"wide": True})):
        with insecure_fixed_seed(3):
            synthesize_dpgm(event_release, rows=500, output=str(tmp_path / name), partitions=2, spark=spark, **kw)
    src = _source_events(spark)
    voc = list(EV_IDS)
    # the release stands for 500 synthetic people (an exploded event table has no row for one without items)
    common = dict(source=src, person="caller_id", item="tower_id", vocabulary=voc, n_queries=60, groups=3, seed=1,
                  release_people=500)
    read = lambda n: spark.read.parquet(str(tmp_path / n))  # noqa: E731
    wide = evaluate_counting_queries(spark, release=read("wide"), release_columns=[f"x{j}" for j in range(5)],
                                     **common)
    items = evaluate_counting_queries(spark, release=read("items"), release_item_ids=True, **common)
    events = evaluate_counting_queries(spark, release=read("events"), release_events=True, **common)
    assert items["groups"] == wide["groups"] and events["groups"] == wide["groups"]
    assert items["release_rows"] == wide["release_rows"] == 500 and events["release_rows"] <= 500
    assert wide["people"] < 400 and wide["scale"] == events["scale"] == pytest.approx(wide["people"] / 500)
    assert wide["mean_relative_error"] > 0
    exact = evaluate_counting_queries(spark, release=src.withColumnRenamed("tower_id", "t"), release_events=True,
                                      release_item="t", **dict(common, release_people=None))
    assert exact["mean_relative_error"] == 0.0
    # the ids read as indices are refused (130 is outside [0, 5)), not silently miscounted
    with pytest.raises(Exception, match="outside"):
        answer_release(read("items"), np.eye(5))
    with pytest.raises(Exception, match="outside the vocabulary"):
        answer_release(read("items"), np.eye(5), item_ids=[130, 110, 120, 140, 106])
    with pytest.raises(ParameterError, match="release_events"):
        evaluate_counting_queries(spark, release=read("events"), release_item="tower_id", **common)


def test_a_release_on_event_records_synthesizes_its_events(spark, tmp_path):
    """End to end: bounded event records -> release_dpgm -> written model (format 3, the declared
    vocabulary and the source's column names and item type) -> the synthetic people's items."""
    from sparkpriv.api import release_dpgm
    from sparkpriv.spark.events import bound_contributions

    rng = np.random.default_rng(4)
    rows = [(f"p{p}", 200 + it) for p in range(240) for it in range(6)
            if rng.random() < (0.8 if (it < 3) == (p % 2 == 0) else 0.1)]
    events = spark.createDataFrame(rows, "who string, cell smallint")
    with insecure_fixed_seed(4):
        rec = bound_contributions(events, person="who", item="cell", max_items=3, vocabulary="200..205")
        rel = release_dpgm(rec, epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=1, hidden=3, chains=10,
                           kmeans_iterations=2, accountant="rdp")
        rel.write(str(tmp_path / "rel"))
    ev = rel.model.events
    assert (ev.person, ev.item, ev.item_type, ev.vocabulary.start, ev.vocabulary.stop) == \
        ("who", "cell", "smallint", 200, 206)
    assert rel.receipt()["mechanism_details"]["model"]["events"] == ev.to_public_dict()
    back = dpgm.DPGMModel.load(str(tmp_path / "rel" / dpgm.MODEL_FILE))
    assert back.events == ev
    res = synthesize_dpgm(str(tmp_path / "rel"), rows=300, output=str(tmp_path / "s"), spark=spark)
    t = pq.read_table(str(tmp_path / "s"))
    assert res.types == ("bigint", "array<smallint>") and str(t.schema.field("items").type.value_type) == "int16"
    items = t.column("items").to_pylist()
    assert all(its == sorted(set(its)) and set(its) <= set(range(200, 206)) for its in items)
    assert sum(map(len, items)) > 0


def test_a_public_seed_reproduces_the_table_and_is_recorded(spark, release, tmp_path):
    """--seed: post-processing of a public model, so a public seed is allowed; the same seed gives the
    same table, another seed another one, and the receipt records it."""
    a = synthesize_dpgm(release, rows=1500, output=str(tmp_path / "a"), partitions=2, spark=spark, seed=7)
    b = synthesize_dpgm(release, rows=1500, output=str(tmp_path / "b"), partitions=2, spark=spark, seed=7)
    c = synthesize_dpgm(release, rows=1500, output=str(tmp_path / "c"), partitions=2, spark=spark, seed=8)
    np.testing.assert_array_equal(_read(a.output), _read(b.output))
    assert not np.array_equal(_read(a.output), _read(c.output))
    receipt = json.loads((tmp_path / "a" / "_privacy_receipt.json").read_text())
    assert "7" in json.dumps(receipt) and receipt["guarantee"]["epsilon"] > 0
    with pytest.raises(ParameterError, match="'seed'"):
        synthesize_dpgm(release, rows=10, output=str(tmp_path / "d"), spark=spark, seed=-1)
