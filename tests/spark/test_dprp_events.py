"""DPRP of bounded person records from an event table: sparse Gram and thresholded
reconstruction on Spark equal dense numpy before noise; the release, its receipt and
owner report; errors; the CLI and the counting-query evaluator on its output."""

import json
import math
import os

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import counting_queries as cq
from sparkpriv.mechanisms import dprp as core
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.mechanisms.sparse import densify_rows, sparse_rows_from_lists
from sparkpriv.privacy import random as sprandom
from sparkpriv.privacy.random import derive_seed
from sparkpriv.api import release_dprp
from sparkpriv.spark.engine import SparkEngine
from sparkpriv.spark.events import bound_contributions

pytestmark = pytest.mark.spark

D_VOC, L = 30, 4


@pytest.fixture(scope="module")
def events(spark):
    # 240 people over a 30-tower map in three areas; each event repeated 1-3 times (counts);
    # every 10th person visits three more towers: more than L distinct items, truncated
    rng = np.random.default_rng(4)
    rows = []
    for p in range(240):
        area = p % 3
        towers = rng.choice(np.arange(area * 10, area * 10 + 5), size=int(rng.integers(1, 4)), replace=False)
        if p % 10 == 0:
            towers = np.concatenate([towers, area * 10 + np.array([6, 7, 8])])
        for t in towers:
            rows += [(f"u{p:03d}", int(t), i) for i in range(int(rng.integers(1, 4)))]
    return spark.createDataFrame(rows, "caller string, tower int, t int").repartition(4)


def _records(events, weights="binary"):
    kw = {"max_events_per_item": 2} if weights == "counts" else {}
    return bound_contributions(events, person="caller", item="tower", max_items=L,
                               vocabulary=f"range:0:{D_VOC}", weights=weights, seed=b"k" * 16,
                               source="events", **kw)


def _rows(recs, R, M, noise, seed):
    """The release's row pass (the engine's keyed layout and the mechanism's row map) and its task function."""
    eng = SparkEngine()
    src = eng.open(recs, columns=None, fill=None, caller="t")
    return eng.map_rows(src, core._records_rows_fn(R, M, noise, seed, recs.cap, D_VOC, 0.5),
                        [("items", "array<int>", False)], count=False)


def _dense(recs):
    """The records as collected through ``recs.df`` (same keyed choice), densified in numpy."""
    rows = recs.df.collect()
    off, idx = sparse_rows_from_lists([r["items"] for r in rows])
    vals = None if recs.cap.weights == "binary" else np.concatenate([r["values"] for r in rows])
    return densify_rows(off, idx, vals, recs.d)


@pytest.mark.parametrize("weights", ["binary", "counts"])
def test_spark_gram_of_records_equals_dense_numpy(spark, events, weights):
    recs = _records(events, weights)
    eng = SparkEngine()
    total = eng.aggregate(eng.open(recs, columns=None, fill=None, caller="t"),
                          core._records_gram_fn(recs.cap, D_VOC), 1 + D_VOC * (D_VOC + 1) // 2)
    sizes, (G,) = core.gram_from_partial(total, D_VOC, 1)
    X = _dense(recs) / recs.cap.value_cap  # [0, 1] scale (c = 2 for counts: every value dyadic)
    assert sizes[0] == X.shape[0] == 240
    assert np.linalg.norm(X, axis=1).max() <= math.sqrt(L) + 1e-12
    if weights == "counts":
        assert set(np.unique(X)) == {0.0, 0.5, 1.0}
    np.testing.assert_array_equal(G, X.T @ X)  # exact: integer / dyadic sums
    if weights == "counts":  # the release's Z is sqrt(L) on the [0, 1] scale, not c sqrt(L)
        rel = release_dprp(recs, epsilon=1.0, delta=1e-5, k2=4, k1=16)
        assert rel.public["row_bound"] == pytest.approx(math.sqrt(L))
        assert rel.public["sensitivity"]["gram_l2"] == pytest.approx(math.sqrt(L * (L + 1)), rel=1e-6)
        assert rel.public["parameters"]["contribution_bound"]["max_events_per_item"] == 2


def test_spark_reconstruction_of_records_equals_dense_numpy_before_noise(spark, events):
    recs = _records(events)
    X = _dense(recs)
    R = draw_projection_matrix(D_VOC, 64, 21)
    for M, exact in ((core.solve([X.T @ X], R, 6)[0], False), (np.linalg.pinv(R), True)):
        out, _ = _rows(recs, R, M, None, 1)
        assert out.schema.simpleString() == "struct<items:array<int>>"
        got = sorted(tuple(r["items"]) for r in out.collect())
        ref_vals = X @ R @ M  # independent dense numpy
        assert np.abs(ref_vals - 0.5).min() > 1e-9
        ref = sorted(tuple(np.flatnonzero(v >= 0.5).tolist()) for v in ref_vals)
        assert got == ref
        if exact:  # R M = I: the reconstruction is the records themselves
            assert got == sorted(tuple(np.flatnonzero(x).tolist()) for x in X)


def test_record_noise_does_not_depend_on_arrival_order(spark, events):
    """A shuffle partition's people arrive in any order and batch split; the keyed row noise
    must still go to the same people (the task function run directly, twice)."""
    import pyarrow as pa

    recs = _records(events)
    rng = np.random.default_rng(6)
    n = 3000
    ph = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    items = [sorted(rng.choice(D_VOC, int(rng.integers(1, L + 1)), replace=False).tolist()) for _ in range(n)]
    table = pa.table({"_ph": ph, "_items": pa.array(items, pa.list_(pa.int32())),
                      "_n": np.ones(n, np.int64)})
    R = draw_projection_matrix(D_VOC, 64, 22)
    plan = core.plan_dprp(R, d=D_VOC, epsilon=20.0, delta=1e-5, lower=(0.0,) * D_VOC, upper=(1.0,) * D_VOC,
                          k2=8, row_bound=math.sqrt(L), budget_split=(0.8, 0.2), labels=None, classes=None,
                          label_scale=1.0)
    M = np.linalg.pinv(R)

    def run(noise, t, size):
        fn = _rows(recs, R, M, noise, 77)[1].fn  # the task function of the rows pass
        return [tuple(x) for b in fn(iter(t.to_batches(max_chunksize=size)), 5)
                for x in b.column(0).to_pylist()]

    a = run(plan.projection_noise, table, 1000)
    b = run(plan.projection_noise, table.take(pa.array(rng.permutation(n))), 333)
    assert a == b  # the same people, in the same order, with the same noise
    order = np.argsort(ph, kind="stable")
    assert run(None, table, 1000) == [tuple(items[i]) for i in order]  # person-hash order; R M = I
    assert a != [tuple(items[i]) for i in order]  # the noise changed some records


def test_release_dprp_of_event_records(spark, events, tmp_path, test_seed):
    recs = _records(events)
    rel = release_dprp(recs, epsilon=4.0, delta=1e-5, source="cdr/2026-11-22")
    assert rel.df.schema.simpleString() == "struct<items:array<int>>"
    a = sorted(tuple(r["items"]) for r in rel.df.collect())
    assert len(a) == 240 and all(0 <= j < D_VOC for row in a for j in row)
    out = str(tmp_path / "rel")
    report = str(tmp_path / "owner.json")
    rel.write(out, owner_report=report)
    receipt = json.load(open(os.path.join(out, "_privacy_receipt.json")))
    assert receipt["mechanism"] == "dprp"
    assert receipt["guarantee"]["epsilon"] <= 4.0 * (1 + 1e-3) and receipt["guarantee"]["delta"] == 1e-5
    md = receipt["mechanism_details"]
    # defaults for records: k2 = min(d, 64) = 30 (not 0.6 d = 18), k1 = 4 k2
    assert (md["k2"], md["k1"]) == (30, 120)
    assert md["row_bound"] == pytest.approx(math.sqrt(L))
    assert md["parameters"]["contribution_bound"]["max_items"] == L
    assert md["parameters"]["threshold"] == 0.5
    R = draw_projection_matrix(D_VOC, 120, derive_seed(test_seed, "dprp-matrix#1"))
    # exact for records with at most L items (d >= 2 L): two people on disjoint items
    assert md["sensitivity"]["projection_l2"] == pytest.approx(math.sqrt(2 * L) * np.linalg.norm(R, 2), rel=1e-6)
    assert md["sensitivity"]["gram_l2"] == pytest.approx(math.sqrt(L * (L + 1)), rel=1e-6)
    assert receipt["input"]["source"] == "cdr/2026-11-22"
    text = json.dumps(receipt)
    assert "u000" not in text and "people_truncated" not in text
    diag = json.load(open(report))["diagnostics"]
    towers = {}
    for r in events.collect():
        towers.setdefault(r["caller"], set()).add(r["tower"])
    truncated = sum(len(t) > L for t in towers.values())
    assert truncated > 0
    assert diag["people"] == 240 and diag["people_truncated"] == truncated  # counted once (Gram pass)
    # writing recomputes every partition: the same noise is redrawn
    assert sorted(tuple(r["items"]) for r in spark.read.parquet(out).collect()) == a
    # a fixed seed reproduces the release
    sprandom.reset_test_counter()
    again = release_dprp(_records(events), epsilon=4.0, delta=1e-5)
    assert sorted(tuple(r["items"]) for r in again.df.collect()) == a
    # and another seed does not
    other = release_dprp(_records(events), epsilon=4.0, delta=1e-5)
    assert sorted(tuple(r["items"]) for r in other.df.collect()) != a


def test_event_records_errors(spark, events):
    recs = _records(events)
    base = dict(epsilon=1.0, delta=1e-5)
    for kw, name in (({"columns": ["tower"]}, "'columns'"), ({"lower": [0.0]}, "'lower'"),
                     ({"row_bound": 2.0}, "'row_bound'"), ({"label": "t", "labels": "public"}, "'label', 'labels'"),
                     ({"keep_columns": ["caller"]}, "'keep_columns'"), ({"fill": "dp-mean"}, "'fill'")):
        with pytest.raises(ParameterError, match=f"{name}.* do not apply to bounded event records"):
            release_dprp(recs, **base, **kw)
    with pytest.raises(ParameterError, match="'threshold' parameter of release_dprp"):
        release_dprp(recs, **base, threshold=0.0)
    with pytest.raises(ParameterError, match="'k1' parameter of release_dprp must be at least k2"):
        release_dprp(recs, **base, k2=8, k1=4)
    with pytest.raises(ParameterError, match="'threshold' parameter of release_dprp applies to bounded event"):
        release_dprp(events, columns=["tower"], lower=[0], upper=[30], threshold=0.5, **base)
    with pytest.raises(ParameterError, match="'columns' parameter of release_dprp is required"):
        release_dprp(events, lower=[0], upper=[30], **base)


def test_cli_release_dprp_of_generated_cdr_and_counting_queries(spark, tmp_path, capsys):
    from sparkpriv.cli import main
    from sparkpriv.spark.counting_queries import answer_release
    from sparkpriv.spark.generate_events import generate_cdr

    src = str(tmp_path / "cdr.parquet")
    generate_cdr(spark, people=2000, seed=3, partitions=2).write.parquet(src)
    out = str(tmp_path / "out")
    base = ["release", "dprp", "--input", src, "--events", "--person-col", "caller_id", "--item-col",
            "tower_id", "--max-items", "32", "--vocabulary", "0..1302", "--epsilon", "1", "--delta", "1e-6",
            "--k2", "16", "--k1", "64"]
    assert main([*base, "--output", out]) == 0
    rel = spark.read.parquet(out)
    rows = [r["items"] for r in rel.collect()]
    assert rel.schema.simpleString() == "struct<items:array<int>>"
    assert len(rows) == 2000  # every generated person has at least one event
    assert all(0 <= j < 1303 for r in rows for j in r)
    receipt = json.load(open(os.path.join(out, "_privacy_receipt.json")))
    assert (receipt["mechanism_details"]["k2"], receipt["mechanism_details"]["k1"]) == (16, 64)
    # the counting-query evaluator reads the items column: its answers equal a numpy count
    qs = cq.draw_queries(1303, max_length=40, n_queries=20, groups=5, seed=1)
    got, n = answer_release(rel, qs.matrix, items_col="items")
    off, idx = sparse_rows_from_lists(rows)
    memb = densify_rows(off, idx, None, 1303) > 0
    assert n == len(rows)
    np.testing.assert_array_equal(got, [(memb[:, qs.matrix[:, j] > 0].any(axis=1)).sum() for j in range(20)])
    capsys.readouterr()
    assert main(["evaluate", "counting-queries", "--source", src, "--person-col", "caller_id", "--item-col",
                 "tower_id", "--vocabulary", "0..1302", "--release", out, "--release-items-col", "items",
                 "--queries", "50"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["release_rows"] == len(rows) and res["queries"] == 50
    # table-only options are refused with --events; --threshold without --events
    assert main([*base, "--output", str(tmp_path / "o2"), "--columns", "tower_id"]) == 2
    assert main([*base, "--output", str(tmp_path / "o3"), "--lower", "0"]) == 2
    assert main(["release", "dprp", "--input", src, "--output", str(tmp_path / "o4"), "--columns", "tower_id",
                 "--lower", "0", "--upper", "1302", "--epsilon", "1", "--delta", "1e-6", "--threshold", "1"]) == 2
