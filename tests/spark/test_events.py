"""Event tables on Spark: contribution bounding, sparse projection release, generators."""

import json
import os

import numpy as np
import pytest

from sparkpriv.errors import ParameterError, SchemaError
from sparkpriv.mechanisms.projection import draw_projection_matrix
from sparkpriv.mechanisms.sparse import (
    ItemCap,
    cap_items,
    dedupe_rows,
    densify_rows,
    sparse_rows_from_lists,
)
from sparkpriv.privacy.random import derive_seed
from sparkpriv.spark.events import bound_contributions
from sparkpriv.api import release_projection
from sparkpriv.mechanisms.projection import _sparse_row_map
from sparkpriv.spark.engine import SparkEngine

pytestmark = pytest.mark.spark

# person -> items (tower ids); ids 100..119 are the vocabulary range, 999 is outside it
PEOPLE = {
    "alice": [100, 100, 101, 102, 999],          # 3 distinct in-vocabulary items, 1 OOV event
    "bob": list(range(103, 111)) * 2,            # 8 distinct items, each twice: truncated to L=3
    "carol": [111],                              # 1 item
    "dave": [999, 999],                          # only OOV events: an empty record
    "erin": list(range(112, 120)) + [112] * 4,   # 8 distinct, 112 five times
}
L = 3


@pytest.fixture(scope="module")
def events(spark):
    rows = [(p, it, i) for p, items in PEOPLE.items() for i, it in enumerate(items)]
    return spark.createDataFrame(rows, "person string, tower int, t int").repartition(3)


def _records(df):
    out = []
    for r in df.collect():
        vals = r["values"] if "values" in r.__fields__ else [1.0] * len(r["items"])
        out.append(tuple(zip(r["items"], vals)))
    return sorted(out)


def _map_records(recs, row_map, k):
    """The mechanism's records row map through the Spark engine (keyed layout, as the release)."""
    eng = SparkEngine()
    src = eng.open(recs, columns=None, fill=None, caller="test")
    out, _ = eng.map_rows(src, row_map, [(f"z{i}", "double", False) for i in range(k)])
    return out


def _task_fn(recs, row_map, k):
    """The Spark task function the engine builds for ``row_map`` (bounding, keyed order, noise)."""
    eng = SparkEngine()
    src = eng.open(recs, columns=None, fill=None, caller="test")
    _, rows = eng.map_rows(src, row_map, [(f"z{i}", "double", False) for i in range(k)])
    return rows.fn


def _owner(rec_items):
    """Which person a record (vocabulary indices) came from (item sets are disjoint)."""
    for p, items in PEOPLE.items():
        if set(100 + i for i in rec_items) <= set(items) and rec_items:
            return p
    return None


def test_bounding_keeps_at_most_L_items_of_the_person(spark, events):
    recs = bound_contributions(events, person="person", item="tower", max_items=L,
                               vocabulary="range:100:120", seed=b"k" * 16)
    got = _records(recs.df)
    assert len(got) == len(PEOPLE)  # one record per person, dave's empty
    owners = {}
    for r in got:
        items = [i for i, _ in r]
        assert len(items) <= L and items == sorted(items)
        owners[_owner(items)] = items
    assert owners["alice"] == [0, 1, 2] and owners["carol"] == [11] and owners[None] == []
    assert len(owners["bob"]) == L and len(owners["erin"]) == L
    d = recs.diagnostics()
    assert d["people"] == 5 and d["people_truncated"] == 2
    assert d["items_dropped"] == 10 and d["events"] == sum(map(len, PEOPLE.values()))
    assert d["events_out_of_vocabulary"] == 3 and d["people_without_vocabulary_items"] == 1
    assert "person" not in recs.df.columns and set(recs.df.columns) == {"items"}


def test_bounding_is_reproducible_keyed_and_equals_numpy(spark, events):
    a = bound_contributions(events, person="person", item="tower", max_items=L,
                            vocabulary=range(100, 120), seed=b"x" * 16)
    b = bound_contributions(events.repartition(2), person="person", item="tower", max_items=L,
                            vocabulary=range(100, 120), seed=b"x" * 16)
    assert _records(a.df) == _records(b.df)
    # the numpy core with the same public person hashes and key gives the same records
    from pyspark.sql import functions as F

    hashes = dict(spark.createDataFrame([(p,) for p in PEOPLE], "person string")
                  .select("person", F.xxhash64("person").alias("h")).collect())
    lists = [[t - 100 for t in PEOPLE[p] if 100 <= t < 120] for p in PEOPLE]
    off, idx = sparse_rows_from_lists(lists)
    off, idx, _ = dedupe_rows(off, idx)
    ph = np.array([hashes[p] for p in PEOPLE], np.int64)
    o, i, _, _ = cap_items(off, idx, None, ph, ItemCap(L), derive_seed(b"x" * 16, "contribution-bounding"))
    expect = sorted(tuple((int(x), 1.0) for x in i[o[r]:o[r + 1]]) for r in range(len(lists)))
    assert _records(a.df) == expect
    # another key chooses differently for some truncated person (bob or erin), over a few keys
    keys = [bytes([j]) * 16 for j in range(1, 6)]
    outs = {tuple(_records(bound_contributions(events, person="person", item="tower", max_items=L,
                                               vocabulary=range(100, 120), seed=k).df)) for k in keys}
    assert len(outs) > 1


def test_bounding_choice_is_not_the_first_L(spark):
    # 400 people with the same 10 items; keep 2: every item is kept ~ 80 times
    rows = [(f"p{p}", 100 + it) for p in range(400) for it in range(10)]
    ev = spark.createDataFrame(rows, "person string, tower int")
    recs = bound_contributions(ev, person="person", item="tower", max_items=2, vocabulary="100..109",
                               seed=b"y" * 16)
    freq = np.zeros(10)
    for r in recs.df.collect():
        freq[r["items"]] += 1
    assert freq.sum() == 800 and freq.min() > 40 and freq.max() < 125


def test_vocabulary_ids_strings_file_and_counts(spark, tmp_path):
    rows = [("a", "T1"), ("a", "T1"), ("a", "T1"), ("a", "T2"), ("a", "X"), ("b", "T3"), ("b", "T3")]
    ev = spark.createDataFrame(rows, "person string, tower string")
    f = tmp_path / "vocab.txt"
    f.write_text("T3\nT2\nT1\n")
    recs = bound_contributions(ev, person="person", item="tower", max_items=5, vocabulary=str(f),
                               weights="counts", max_events_per_item=2)
    got = _records(recs.df)
    # indices follow the file order: T3 -> 0, T2 -> 1, T1 -> 2
    assert got == sorted([((0, 2.0),), ((1, 1.0), (2, 2.0))])
    d = recs.diagnostics()
    assert d["events_out_of_vocabulary"] == 1 and d["events_capped"] == 1 and d["people_truncated"] == 0
    ints = spark.createDataFrame([("a", 7), ("a", 9), ("b", 8)], "person string, tower long")
    r2 = bound_contributions(ints, person="person", item="tower", max_items=5, vocabulary=[9, 7])
    assert _records(r2.df) == sorted([((0, 1.0), (1, 1.0)), ()])
    with pytest.raises(SchemaError, match="'cell' is not in the event table"):
        bound_contributions(ev, person="person", item="cell", max_items=2, vocabulary=[1])
    with pytest.raises(ParameterError, match="max_events_per_item.*required"):
        bound_contributions(ev, person="person", item="tower", max_items=2, vocabulary=[1], weights="counts")


def test_sparse_projection_on_spark_equals_dense_projection_before_noise(spark, events):
    recs = bound_contributions(events, person="person", item="tower", max_items=L,
                               vocabulary="range:100:120", seed=b"k" * 16)
    d, k = recs.d, 4
    rng = np.random.default_rng(0)
    for P in (rng.integers(-512, 512, (d, k)) / 256.0, draw_projection_matrix(d, k, seed=2)):
        out = _map_records(recs, _sparse_row_map(P, None, 1), k)
        Y = np.array(sorted(map(tuple, out.toPandas().to_numpy())))
        rows = [r for r in recs.df.collect()]
        off, idx = sparse_rows_from_lists([r["items"] for r in rows])
        X = densify_rows(off, idx, None, d)
        ref = np.array(sorted(map(tuple, X @ P)))
        if np.all(P * 256 == np.round(P * 256)):
            np.testing.assert_array_equal(Y, ref)
        else:
            np.testing.assert_allclose(Y, ref, rtol=1e-13, atol=1e-13)


def test_sparse_release_noise_does_not_depend_on_arrival_order(spark, events):
    """A shuffle partition's groups arrive in any order and any batch split; the keyed
    noise must still go to the same people (run the task function directly, twice)."""
    import pyarrow as pa

    from sparkpriv.mechanisms.sparse import plan_sparse_projection

    recs = bound_contributions(events, person="person", item="tower", max_items=L,
                               vocabulary="range:100:120", seed=b"k" * 16)
    rng = np.random.default_rng(4)
    n = 3000
    ph = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    items = [sorted(rng.choice(20, rng.integers(1, L + 1), replace=False).tolist()) for _ in range(n)]
    table = pa.table({"_ph": ph, "_items": pa.array(items, pa.list_(pa.int32())),
                      "_n": np.ones(n, np.int64)})
    P = draw_projection_matrix(recs.d, 4, seed=3)
    plan = plan_sparse_projection(P, recs.cap, epsilon=1.0, delta=0.0, noise="laplace",
                                  neighbors="replace-one", caller="test")
    fn = _task_fn(recs, _sparse_row_map(P, plan.noise, 77), 4)
    ref_fn = _task_fn(recs, _sparse_row_map(P, None, 77), 4)

    def run(f, t, sizes):
        out = pa.Table.from_batches(list(f(iter(t.to_batches(max_chunksize=sizes)), 5)))
        return np.column_stack([out.column(i).to_numpy() for i in range(4)])

    exact = run(ref_fn, table, 1000)
    a = run(fn, table, 1000)
    perm = rng.permutation(n)
    b = run(fn, table.take(pa.array(perm)), 333)
    # the same people, in the same order, get the same noise
    np.testing.assert_array_equal(a, b)
    assert np.all(a != exact)  # noise was added everywhere
    # ... and the order is the person-hash order
    X = densify_rows(*sparse_rows_from_lists([items[i] for i in np.argsort(ph, kind="stable")]), None, recs.d)
    np.testing.assert_allclose(exact, X @ P, rtol=1e-12, atol=1e-12)


def test_release_projection_of_event_records(spark, events, tmp_path, test_seed):
    recs = bound_contributions(events, person="person", item="tower", max_items=L,
                               vocabulary="range:100:120", source="events")
    rel = release_projection(recs, k=4, epsilon=1.0)
    out = str(tmp_path / "rel")
    report = str(tmp_path / "owner.json")
    rel.write(out, owner_report=report)
    import pyarrow.parquet as pq

    t = pq.read_table(out)
    assert t.column_names == [f"z{i}" for i in range(4)] and t.num_rows == len(PEOPLE)
    receipt = json.load(open(os.path.join(out, "_privacy_receipt.json")))
    text = json.dumps(receipt)
    for p in PEOPLE:
        assert p not in text
    assert "people_truncated" not in text and "events_out_of_vocabulary" not in text
    det = receipt["mechanism_details"]
    assert det["parameters"]["contribution_bound"]["max_items"] == L
    assert det["bounds"]["row_bound"] == {"l1": L, "l2": L ** 0.5}[det["bounds"]["norm"]]
    for name in os.listdir(out):
        data = open(os.path.join(out, name), "rb").read()
        assert b"alice" not in data and b"bob" not in data
    owner = json.load(open(report))["diagnostics"]
    assert owner["people_truncated"] == 2 and owner["events_out_of_vocabulary"] == 3
    with pytest.raises(ParameterError, match="row_bound cannot be given with event-table"):
        release_projection(recs, k=4, epsilon=1.0, row_bound=3.0)


def test_generators_match_their_targets(spark):
    from pyspark.sql import functions as F

    from sparkpriv.spark.generate_events import (
        CDR_MODEL,
        TRANSIT_MODEL,
        expected_mean_distinct,
        generate_cdr,
        generate_transit,
    )

    for gen, model, paper_mean, n in ((generate_cdr, CDR_MODEL, 11.42, 12_288),
                                      (generate_transit, TRANSIT_MODEL, 5.26, 12_288)):
        ev = gen(spark, people=n, seed=1, partitions=3)
        per = (ev.groupBy(model.person_col)
               .agg(F.countDistinct(model.item_col).alias("m"), F.count(F.lit(1)).alias("e"),
                    F.min(model.item_col).alias("lo"), F.max(model.item_col).alias("hi"))
               .toPandas())
        assert len(per) == n
        assert per["lo"].min() >= 0 and per["hi"].max() < model.items
        assert abs(expected_mean_distinct(model) - paper_mean) < 0.03 * paper_mean
        assert per["m"].mean() == pytest.approx(paper_mean, rel=0.05)
        assert per["m"].max() >= 3 * per["m"].median()  # heavy tail
        assert per["e"].mean() / per["m"].mean() == pytest.approx(model.events_per_item, rel=0.05)
        # Zipf-like popularity: the top 10% of items get far more than 10% of the visits
        pop = ev.groupBy(model.item_col).count().toPandas()["count"].sort_values(ascending=False)
        assert pop.iloc[: model.items // 10].sum() > 0.35 * pop.sum()
    # reproducible whatever the partitioning
    a = generate_transit(spark, people=300, seed=4, partitions=1).orderBy("card_id", "station_id", "ts").collect()
    b = generate_transit(spark, people=300, seed=4, partitions=4).orderBy("card_id", "station_id", "ts").collect()
    assert a == b


def test_counting_queries_evaluator_on_spark_vs_hand_computation(spark, tmp_path):
    from sparkpriv.mechanisms import counting_queries as cq
    from sparkpriv.mechanisms.sparse import sparse_rows_from_lists
    from sparkpriv.spark.counting_queries import evaluate_counting_queries

    truth = {"p0": [0, 1], "p1": [2], "p2": [], "p3": [1, 3]}   # p2 only has an OOV event
    release = [[0], [2, 3], [0], [1, 3]]                        # two flips on, one off
    rows = [(p, 10 + i) for p, items in truth.items() for i in items] + [("p2", 99)]
    ev = spark.createDataFrame(rows, "person string, cell int")
    dense = spark.createDataFrame([tuple(float(j in r) for j in range(4)) for r in release],
                                  "x0 double, x1 double, x2 double, x3 double")
    sparse = spark.createDataFrame([(r,) for r in release], "items array<int>")
    # the same queries as the evaluator draws (seed 3), answered by hand-coded sets
    qs = cq.draw_queries(4, max_length=2, n_queries=50, groups=5, seed=3)
    t = cq.answer_queries(*sparse_rows_from_lists(list(truth.values())), qs.matrix)
    r = cq.answer_queries(*sparse_rows_from_lists(release), qs.matrix)
    expect = cq.relative_errors(t, r, n=4)
    for kw in ({"release": sparse}, {"release": dense, "release_columns": ["x0", "x1", "x2", "x3"]}):
        res = evaluate_counting_queries(spark, source=ev, person="person", item="cell", vocabulary="10..13",
                                        n_queries=50, groups=5, seed=3, **kw)
        assert res["people"] == 4 and res["release_rows"] == 4 and res["max_length"] == 2
        assert res["mean_relative_error"] == pytest.approx(expect.mean(), rel=1e-12)
        for g in res["groups"]:
            assert g["mean_relative_error"] == pytest.approx(expect[qs.group == g["group"]].mean(), rel=1e-12)


def test_counting_queries_of_a_release_of_another_size_are_scaled_to_the_source(spark, capsys):
    """A release of 2n rows (each of the hand-made release's rows twice) answers for 2n people: scaled
    by n / 2n it has the hand-made release's errors; ``release_people`` overrides the rows (an event
    table has no row for a person without items), and a bad one is refused before anything is read."""
    from sparkpriv.errors import ParameterError
    from sparkpriv.mechanisms import counting_queries as cq
    from sparkpriv.mechanisms.sparse import sparse_rows_from_lists
    from sparkpriv.spark.counting_queries import evaluate_counting_queries, format_table

    truth = {"p0": [0, 1], "p1": [2], "p2": [3], "p3": [1, 3]}
    release = [[0], [2, 3], [0], [1, 3]]
    ev = spark.createDataFrame([(p, 10 + i) for p, items in truth.items() for i in items], "person string, cell int")
    qs = cq.draw_queries(4, max_length=2, n_queries=50, groups=5, seed=3)
    t = cq.answer_queries(*sparse_rows_from_lists(list(truth.values())), qs.matrix)
    r = cq.answer_queries(*sparse_rows_from_lists(release), qs.matrix)
    expect = cq.relative_errors(t, r, n=4)
    common = dict(source=ev, person="person", item="cell", vocabulary="10..13", n_queries=50, groups=5, seed=3)
    twice = spark.createDataFrame([(x,) for x in release + release], "items array<int>")
    res = evaluate_counting_queries(spark, release=twice, **common)
    assert res["release_rows"] == res["release_people"] == 8 and res["scale"] == 0.5
    assert res["mean_relative_error"] == pytest.approx(expect.mean(), rel=1e-12)
    assert "answers scaled by 4 / 8 = 0.5" in format_table(res)
    # the same 2n people as an event table where one of them has no items: 7 rows, 8 people declared
    events = spark.createDataFrame([(f"s{i}", 10 + j) for i, x in enumerate(release + release[:3] + [[]])
                                    for j in x], "person string, cell int")
    unscaled = evaluate_counting_queries(spark, release=events, release_events=True, **common)
    assert unscaled["release_rows"] == 7 and unscaled["scale"] == pytest.approx(4 / 7)
    declared = evaluate_counting_queries(spark, release=events, release_events=True, release_people=8, **common)
    want = cq.relative_errors(t, cq.answer_queries(*sparse_rows_from_lists(release + release[:3] + [[]]),
                                                   qs.matrix) * 0.5, n=4)
    assert declared["scale"] == 0.5 and declared["mean_relative_error"] == pytest.approx(want.mean(), rel=1e-12)
    same = evaluate_counting_queries(spark, release=spark.createDataFrame([(x,) for x in release], "items array<int>"),
                                     **common)
    assert same["scale"] == 1.0 and "scaled" not in format_table(same)
    for bad in (0, -3, 2.5):
        with pytest.raises(ParameterError, match="release_people"):
            evaluate_counting_queries(spark, release=twice, release_people=bad, **dict(common, source=None))


def test_cli_release_projection_from_events(spark, tmp_path):
    from sparkpriv.cli import main

    rows = [(f"c{p}", t) for p in range(60) for t in range(p % 7, p % 7 + 5)]
    src = str(tmp_path / "ev.parquet")
    spark.createDataFrame(rows, "caller string, tower int").write.parquet(src)
    voc = tmp_path / "towers.txt"
    voc.write_text("\n".join(str(i) for i in range(12)) + "\n")
    out = str(tmp_path / "out")
    rc = main(["release", "projection", "--input", src, "--output", out, "--events", "--person-col", "caller",
               "--item-col", "tower", "--max-items", "3", "--vocabulary", str(voc), "--k", "4",
               "--epsilon", "1"])
    assert rc == 0
    assert spark.read.parquet(out).count() == 60
    rc = main(["release", "projection", "--input", src, "--output", str(tmp_path / "o2"), "--events",
               "--person-col", "caller", "--item-col", "tower", "--k", "4", "--epsilon", "1"])
    assert rc == 2  # --max-items and --vocabulary missing
