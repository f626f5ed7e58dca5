"""DP counts per key on Spark (sparkpriv.spark.counts) against numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from sparkpriv.errors import ParameterError, SchemaError
from sparkpriv.mechanisms.counts import CountsParams, KeyDomain, finalize_counts, plan_counts
from sparkpriv.privacy import random as sprandom
from sparkpriv.privacy.random import insecure_fixed_seed, stream
from sparkpriv.spark.counts import OUTPUT_COLUMNS, bound_keys, key_totals

pytestmark = pytest.mark.spark


def _events(rng, people=300, towers=12, hours=24, max_keys=None, oov=True):
    """(person, tower, hour) events; every person visits at most ``max_keys`` towers when given."""
    rows = []
    for p in range(people):
        k = int(rng.integers(0, (max_keys or 7) + 1))
        ts = rng.choice(towers + (2 if oov else 0), k, replace=False)
        for t in ts:
            for _ in range(int(rng.integers(1, 5))):
                rows.append((p * 7919 + 3, int(t) + 100, int(rng.integers(0, hours))))
    return rows


def _df(spark, rows, partitions):
    return spark.createDataFrame(rows, "caller long, tower long, hour int").repartition(partitions)


def _ref_distinct(rows, index):
    """Distinct people per key (numpy, from the raw events)."""
    pairs = {(p, index(t, h)) for p, t, h in rows}
    keys = np.array([k for _, k in pairs if k >= 0], np.int64)
    return keys


def _ref_totals(rows, index, d, c=None):
    """Per-key totals (numpy, from the raw events): distinct people, or with ``c`` each person's
    events at a key capped at ``c`` (nobody above the key bound: no truncation)."""
    if c is None:
        return np.bincount(_ref_distinct(rows, index), minlength=d)
    ev = {}
    for p, t, h in rows:
        if index(t, h) >= 0:
            ev[(p, index(t, h))] = ev.get((p, index(t, h)), 0) + 1
    ref = np.zeros(d, np.int64)
    for (p, k), n in ev.items():
        ref[k] += min(n, c)
    return ref


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_totals_equal_numpy_reference_without_truncation(spark, partitions):
    rng = np.random.default_rng(partitions)
    rows = _events(rng, max_keys=3)
    dom = KeyDomain.product("tower", range(100, 112))
    # nobody has more than 3 towers: nothing truncated
    rec = bound_keys(_df(spark, rows, partitions), person="caller", domain=dom, max_keys=3)
    got = key_totals(rec, dom.size)
    ref = np.bincount(_ref_distinct(rows, lambda t, h: t - 100 if 100 <= t < 112 else -1), minlength=12)
    assert np.array_equal(got, ref)
    diag = rec.diagnostics()
    assert diag["people_truncated"] == 0
    assert diag["events_out_of_vocabulary"] == sum(1 for _, t, _h in rows if t >= 112)


def test_totals_with_truncation_same_for_every_partitioning(spark):
    rng = np.random.default_rng(11)
    rows = _events(rng, max_keys=9)
    dom = KeyDomain.product("tower", range(100, 112))
    totals = []
    for parts in (1, 4, 9):
        rec = bound_keys(_df(spark, rows, parts), person="caller", domain=dom, max_keys=2, seed=b"k" * 16)
        totals.append(key_totals(rec, dom.size))
    assert all(np.array_equal(totals[0], t) for t in totals[1:])
    full = np.bincount(_ref_distinct(rows, lambda t, h: t - 100 if 100 <= t < 112 else -1), minlength=12)
    per_person = {}
    for p, t, _h in rows:
        if 100 <= t < 112:
            per_person.setdefault(p, set()).add(t)
    assert totals[0].sum() == sum(min(len(s), 2) for s in per_person.values())
    assert np.all(totals[0] <= full)


def test_capped_event_counts_two_columns(spark):
    rng = np.random.default_rng(5)
    rows = _events(rng, max_keys=2, hours=4)
    dom = KeyDomain.product(("tower", "hour"), [range(100, 112), [0, 1, 2]])  # hour 3 is outside
    rec = bound_keys(_df(spark, rows, 3), person="caller", domain=dom, max_keys=24, max_events_per_key=2)
    got = key_totals(rec, dom.size)
    ev = {}
    for p, t, h in rows:
        if 100 <= t < 112 and h < 3:
            k = (t - 100) * 3 + h
            ev[(p, k)] = ev.get((p, k), 0) + 1
    ref = np.zeros(dom.size, np.int64)
    for (p, k), n in ev.items():
        ref[k] += min(n, 2)
    assert np.array_equal(got, ref)


def test_declared_pairs_with_strings(spark):
    rows = [(1, "a", "b"), (1, "a", "b"), (1, "b", "a"), (2, "a", "b"), (3, "c", "c"), (3, "a", "c")]
    df = spark.createDataFrame(rows, "card long, o string, d string")
    dom = KeyDomain.pairs(("o", "d"), [("a", "b"), ("b", "a"), ("a", "c"), ("x", "y")])
    rec = bound_keys(df, person="card", domain=dom, max_keys=3)
    assert list(key_totals(rec, dom.size)) == [2, 1, 1, 0]
    assert rec.diagnostics()["events_out_of_vocabulary"] == 1  # (c, c)



def test_item_pairs_recipe_counts_the_people_holding_both_items(spark):
    """docs/utility.md's recipe for pairs of items (a self-join of each person's distinct items,
    declared pairs, at most L pairs a person) against a brute-force count of who holds both."""
    from pyspark.sql import functions as F

    rng = np.random.default_rng(5)
    held = {p: set(rng.choice(9, int(rng.integers(0, 6)), replace=False).tolist()) for p in range(200)}
    rows = [(p, i) for p, items in held.items() for i in items for _ in range(int(rng.integers(1, 3)))]
    events = spark.createDataFrame(rows, "person long, item long").repartition(3)
    wanted = [(0, 1), (0, 8), (2, 5), (3, 4), (7, 8), (1, 0)]  # (1, 0): never formed (a < b)
    domain = KeyDomain.pairs(("item_a", "item_b"), wanted)
    e = events.select("person", "item").distinct()
    pairs = (e.alias("a").join(e.alias("b"), "person").where(F.col("a.item") < F.col("b.item"))
             .select("person", F.col("a.item").alias("item_a"), F.col("b.item").alias("item_b")))
    records = bound_keys(pairs, person="person", domain=domain, max_keys=15)  # 5 items: at most 10 pairs
    ref = [sum(a in items and b in items for items in held.values()) if a < b else 0 for a, b in wanted]
    assert list(key_totals(records, domain.size)) == ref
    assert ref[:5] != [0] * 5

def _release(records, **kw):
    """release_counts, recording the noise seed it draws (to recompute its noise in numpy)."""
    import sparkpriv.mechanisms.counts as mc
    from sparkpriv import release_counts

    seeds = {}
    real = sprandom.new_secret_seed

    def recording(purpose):
        s = real(purpose)
        seeds[purpose] = s
        return s

    mc._mechanism.new_secret_seed = recording
    try:
        rel = release_counts(records, **kw)
    finally:
        mc._mechanism.new_secret_seed = real
    return rel, seeds


@pytest.mark.parametrize("weights", ["people", "events"])
def test_every_key_once_and_the_noise_of_the_numpy_core(spark, weights):
    rng = np.random.default_rng(2)
    rows = _events(rng, max_keys=3)
    dom = KeyDomain.product(("tower", "hour"), [range(100, 112), range(0, 24)])
    c = None if weights == "people" else 2
    with insecure_fixed_seed(4):
        # <= 3 towers x 4 events: no truncation at 12 keys
        rec = bound_keys(_df(spark, rows, 3), person="caller", domain=dom, max_keys=12, max_events_per_key=c)
        rel, seeds = _release(rec, domain=dom, epsilon=1.0, round=True)
    pdf = rel.df.toPandas()
    assert list(pdf.columns) == ["tower", "hour", *OUTPUT_COLUMNS]
    assert len(pdf) == dom.size == 288
    assert not pdf.duplicated(["tower", "hour"]).any()
    tw, hr = dom.column_values()
    assert np.array_equal(pdf["tower"].to_numpy(), tw) and np.array_equal(pdf["hour"].to_numpy(), hr)

    def index(t, h):
        return (t - 100) * 24 + h if 100 <= t < 112 else -1

    ref = _ref_totals(rows, index, 288, c)
    assert (ref == 0).any()  # keys no one visited are there too
    plan = plan_counts(CountsParams(epsilon=1.0, max_keys=12, max_events_per_key=c, round=True), 288)
    expected = finalize_counts(ref, plan, stream(seeds["counts-noise"], 0))
    assert np.array_equal(pdf["noisy_count"].to_numpy(), expected.value)
    assert np.array_equal(pdf["ci_low"].to_numpy(), expected.ci_low)
    assert np.array_equal(pdf["ci_high"].to_numpy(), expected.ci_high)
    assert np.allclose(pdf["std"], plan.std)
    diag = rel.diagnostics()  # the bounding pass counts for the owner (it did not before)
    assert diag["people"] == len({p for p, _t, _h in rows}) and diag["events"] == len(rows)
    assert diag["events_out_of_vocabulary"] == sum(1 for _, t, _h in rows if index(t, _h) < 0)
    r = rel.receipt()
    assert r["mechanism"] == "counts" and r["guarantee"]["epsilon"] <= 1.0
    assert r["mechanism_details"]["sensitivity"]["l1"] == 12 * (c or 1)
    assert str(seeds["counts-noise"]) not in str(r) and "caller" not in str(r["mechanism_details"])


@pytest.mark.parametrize("weights", ["people", "events"])
def test_large_domain_path_noises_every_key_once_per_block(spark, weights, monkeypatch):
    """Above ``driver_domain_limit`` the totals are summed in the JVM and every block of keys is noised
    in a task from its own keyed stream: the output equals, block by block, the numpy totals
    plus the noise of ``stream(seed, 1, block)``, and does not depend on the partitioning."""
    import sparkpriv.mechanisms.counts as mc
    from sparkpriv.mechanisms.counts import noisy_values

    monkeypatch.setattr(mc._mechanism, "BLOCK_KEYS", 40)  # 288 keys: 7 blocks of 40 and one of 8
    rng = np.random.default_rng(3)
    rows = _events(rng, max_keys=3)
    dom = KeyDomain.product(("tower", "hour"), [range(100, 112), range(0, 24)])
    c = None if weights == "people" else 2

    def index(t, h):
        return (t - 100) * 24 + h if 100 <= t < 112 else -1

    ref = _ref_totals(rows, index, 288, c)
    plan = plan_counts(CountsParams(epsilon=1.0, max_keys=12, max_events_per_key=c, clamp=True), 288)
    outs = []
    for parts in (1, 5):
        with insecure_fixed_seed(9):
            rec = bound_keys(_df(spark, rows, parts), person="caller", domain=dom, max_keys=12,
                             max_events_per_key=c)
            rel, seeds = _release(rec, domain=dom, epsilon=1.0, clamp=True, driver_domain_limit=100)
        pdf = rel.df.toPandas()
        assert len(pdf) == 288 and not pdf.duplicated(["tower", "hour"]).any()
        k = dom.index(pdf["tower"].to_numpy(), pdf["hour"].to_numpy())
        assert sorted(k.tolist()) == list(range(288))
        pdf = pdf.iloc[np.argsort(k)]
        expected = np.concatenate([noisy_values(ref[b * 40:(b + 1) * 40], plan,
                                                stream(seeds["counts-noise"], 1, b)).value for b in range(8)])
        assert np.array_equal(pdf["noisy_count"].to_numpy(), expected)
        assert np.allclose(pdf["std"], plan.std)
        outs.append(pdf["noisy_count"].to_numpy())
        details = rel.receipt()["mechanism_details"]
        assert "tasks" in details["noise_drawn"] and str(seeds["counts-noise"]) not in str(rel.receipt())
        if parts == 5:
            diag = rel.diagnostics()
            assert diag["people"] == len({p for p, _t, _h in rows})
    assert np.array_equal(outs[0], outs[1])  # the same seed: the same release for any partitioning
    # the driver path draws other noise (one stream), at the same calibration
    with insecure_fixed_seed(9):
        rec = bound_keys(_df(spark, rows, 2), person="caller", domain=dom, max_keys=12, max_events_per_key=c)
        rel, seeds = _release(rec, domain=dom, epsilon=1.0, clamp=True)
    assert "driver" in rel.receipt()["mechanism_details"]["noise_drawn"]
    drv = rel.df.toPandas()["noisy_count"].to_numpy()
    assert np.array_equal(drv, noisy_values(ref, plan, stream(seeds["counts-noise"], 0)).value)


def test_large_domain_path_empty_input_and_unvisited_blocks(spark, tmp_path, monkeypatch):
    import sparkpriv.mechanisms.counts as mc
    from sparkpriv import release_counts

    monkeypatch.setattr(mc._mechanism, "BLOCK_KEYS", 3)
    dom = KeyDomain.product("tower", range(0, 10))
    df = spark.createDataFrame([], "caller long, tower long, hour int")
    rel = release_counts(bound_keys(df, person="caller", domain=dom, max_keys=2), domain=dom, epsilon=1.0,
                         driver_domain_limit=4)
    out = rel.write(str(tmp_path / "empty"))
    got = spark.read.parquet(out).toPandas()
    assert sorted(got["tower"]) == list(range(10))
    # one visitor in block 0 only: blocks 1..3 exist through their markers
    df = spark.createDataFrame([(1, 0, 0), (1, 1, 0), (2, 1, 5)], "caller long, tower long, hour int")
    rel = release_counts(bound_keys(df, person="caller", domain=dom, max_keys=2), domain=dom, epsilon=1.0,
                         driver_domain_limit=4)
    assert sorted(rel.df.toPandas()["tower"]) == list(range(10))


def test_empty_input_gives_noisy_zeros(spark, tmp_path):
    df = spark.createDataFrame([], "caller long, tower long, hour int")
    dom = KeyDomain.product("tower", range(0, 5))
    rec = bound_keys(df, person="caller", domain=dom, max_keys=2)
    assert np.array_equal(key_totals(rec, 5), np.zeros(5))
    from sparkpriv import release_counts

    rel = release_counts(rec, domain=dom, epsilon=1.0)
    out = rel.write(str(tmp_path / "out"))  # not refused: whether the table is empty is not public
    assert spark.read.parquet(out).count() == 5


def _poisoned(spark):
    """An event table whose reading fails: refusals must come before any read."""
    def boom(batches):
        raise RuntimeError("the data was read")
        yield  # noqa

    return spark.range(3).selectExpr("id as caller", "id as tower", "1 as hour").mapInArrow(
        boom, "caller long, tower long, hour int")


_T3 = KeyDomain.product("tower", range(3))


@pytest.mark.parametrize("bound,release,exc", [
    (dict(person="nobody", domain=_T3), {}, SchemaError),
    (dict(person="caller", domain=KeyDomain.product("missing", range(3))), {}, SchemaError),
    (dict(person="caller", domain=KeyDomain.product("caller", range(3))), {}, ParameterError),
    (dict(person="caller", domain=range(3)), {}, ParameterError),
    (dict(person="caller", domain=KeyDomain.product("tower", range(1 << 31))), {}, ParameterError),
    (dict(person="caller", domain=KeyDomain.product("std", range(3))), {}, SchemaError),
    (dict(person="caller", domain=_T3, max_keys=0), {}, ParameterError),
    (dict(person="caller", domain=_T3), dict(epsilon=0.0), ParameterError),
    (dict(person="caller", domain=_T3), dict(neighbors="element"), ParameterError),
    (dict(person="caller", domain=_T3), dict(noise="discrete_gaussian"), ParameterError),
    (dict(person="caller", domain=_T3), dict(domain=KeyDomain.product("tower", range(4))), ParameterError),
    (dict(person="caller", domain=_T3), dict(bogus=1), ParameterError),
])
def test_refusals_before_reading_data(spark, bound, release, exc):
    from sparkpriv import release_counts

    with pytest.raises(exc):
        rec = bound_keys(_poisoned(spark), **dict(dict(max_keys=2), **bound))
        release_counts(rec, **dict(dict(epsilon=1.0, domain=bound["domain"]), **release))


def test_empty_domain_refused():
    with pytest.raises(ParameterError):
        KeyDomain.product("tower", [])
    with pytest.raises(ParameterError, match="domain_size"):
        plan_counts(CountsParams(epsilon=1.0, max_keys=1), KeyDomain.pairs(("a", "b"), []).size)


def test_cli_release_counts(spark, tmp_path):
    import json

    from sparkpriv.cli import main

    rows = [(p, t) for p in range(200) for t in range(p % 4)] + [(7, 99)]  # tower 99 is outside
    src = str(tmp_path / "ev.parquet")
    spark.createDataFrame(rows, "caller long, tower long").write.parquet(src)
    out = str(tmp_path / "out")
    base = ["release", "counts", "--input", src, "--events", "--person-col", "caller", "--item-col", "tower",
            "--max-items", "3", "--vocabulary", "0..4", "--epsilon", "1", "--round", "--clamp"]
    assert main([*base, "--output", out]) == 0
    pdf = spark.read.parquet(out).toPandas().sort_values("tower")
    assert list(pdf["tower"]) == [0, 1, 2, 3, 4]  # every key once, tower 4 visited by no one
    assert (pdf["noisy_count"] >= 0).all() and (pdf["noisy_count"] == pdf["noisy_count"].round()).all()
    with open(f"{out}/_privacy_receipt.json") as f:
        r = json.load(f)
    assert r["mechanism"] == "counts" and r["mechanism_details"]["post_processing"] == {
        "clamp_at_zero": True, "round": True}
    assert r["mechanism_details"]["key_domain"]["columns"] == ["tower"]
    # refused before Spark reads anything: no --events, a bad noise, Gaussian without delta
    assert main([b for b in base if b != "--events"] + ["--output", str(tmp_path / "o2")]) == 2
    assert main([*base, "--output", str(tmp_path / "o3"), "--noise", "laplace"]) == 2
    assert main([*base, "--output", str(tmp_path / "o4"), "--noise", "discrete_gaussian"]) == 2
