"""``max_items="auto"``: the contribution bound chosen by a DP quantile (sparkpriv.mechanisms.auto_bound).

The choice against a brute-force rule; the histogram against numpy; for every mechanism that takes
bounded records, the release at any chosen L spends at most what was reserved at the limit; on Spark,
the bound chosen where every person has the same number of keys, the spend reserved before any
value is read and composed in one event, the receipt; the command line's ``--max-items auto``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.auto_bound import (AutoCap, choose_max_items, discount_event, dominates,
                                             items_histogram_fn, length_edges)
from sparkpriv.mechanisms.protocol import InputFacts, SparseRows, get_mechanism


def _brute_choice(noisy, q):
    """Single-length bins 0 .. len - 1: the first length whose cumulative count reaches q of the total
    (at least 1; the last bin means 'the limit or more')."""
    c = [float(v) for v in noisy]
    total = sum(c)
    if total <= 0:
        return max(1, len(c) - 1)
    for m in range(len(c)):
        if sum(c[:m + 1]) >= q * total:
            return max(1, m)
    return max(1, len(c) - 1)


def test_choice_matches_the_brute_force_rule():
    rng = np.random.default_rng(1)
    for _ in range(300):
        limit = int(rng.integers(1, 20))
        noisy = rng.normal(rng.integers(0, 50, limit + 1), 5.0)
        q = float(rng.uniform(0.05, 0.999))
        assert choose_max_items(noisy, q) == _brute_choice(noisy, q)
    assert choose_max_items(np.array([0.0, 0.0, 10.0, 0.0]), 0.5) == 2
    assert choose_max_items(np.array([-5.0, -1.0]), 0.9) == 1
    # noise in many empty buckets does not push the bound up: 300 people with 3 items, 250 empty buckets
    rng = np.random.default_rng(2)
    noisy = np.concatenate([[0.0, 0.0, 0.0, 300.0], np.zeros(250)]) + rng.laplace(0, 2.0, 254)
    assert choose_max_items(noisy, 0.95) == 3


def test_histogram_counts_people_by_items_capped_at_the_limit():
    lengths = np.array([0, 3, 1, 7, 7, 2, 12, 0])
    offsets = np.concatenate([[0], np.cumsum(np.minimum(lengths, 7))]).astype(np.int64)
    h = items_histogram_fn(7)(SparseRows(offsets, np.zeros(offsets[-1], np.int32), None, 20))
    np.testing.assert_array_equal(h, np.bincount(np.minimum(lengths, 7), minlength=8))
    # beyond 8 single lengths the bins grow by 1.25: a person with m items is in the last bin starting <= m
    assert length_edges(256).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 17, 22, 28, 35, 44, 55, 69, 87, 109,
                                          137, 172, 215, 256]
    lengths = np.array([9, 10, 12, 13, 300, 256, 255, 0])
    offsets = np.concatenate([[0], np.cumsum(np.minimum(lengths, 256))]).astype(np.int64)
    h = items_histogram_fn(256)(SparseRows(offsets, np.zeros(offsets[-1], np.int32), None, 400))
    want = np.zeros(24)
    for m in lengths:
        want[max(j for j, e in enumerate(length_edges(256)) if e <= min(m, 256))] += 1
    np.testing.assert_array_equal(h, want)


def test_choice_over_growing_bins_takes_the_bins_largest_length():
    e = length_edges(256)
    h = np.zeros(e.size)
    h[1], h[10] = 50.0, 50.0  # half the people hold 1 item, half 13..16
    assert choose_max_items(h, 0.4, 256) == 1
    assert choose_max_items(h, 0.9, 256) == 16  # the bin 13..16 fits them all
    h[-1] = 100.0
    assert choose_max_items(h, 0.9, 256) == 256


def test_auto_cap_parameters_are_checked():
    with pytest.raises(ParameterError, match="max_items_quantile"):
        AutoCap(quantile=1.0)
    with pytest.raises(ParameterError, match="max_items_share"):
        AutoCap(share=0.0)
    with pytest.raises(ParameterError, match="max_items_limit"):
        AutoCap(limit=0)


RECORD_PARAMS = {
    "counts": dict(epsilon=1.0),
    "projection": dict(k=2, epsilon=1.0),
    "dprp": dict(epsilon=1.0, delta=1e-5, k2=2),
    "kmeans": dict(k=2, epsilon=1.0, delta=1e-5, variant="kernel", kernel_width=1.0, frequencies=8, iterations=2),
    "synthetic": dict(epsilon=1.0, delta=1e-5),
    "dpgm": dict(k=2, epsilon=5.0, delta=1e-5, kmeans_iterations=2, sampling_rate=0.2, epochs=1.0, hidden=3,
                 chains=10),
}


def test_every_records_mechanism_is_covered():
    from sparkpriv.mechanisms.protocol import registered

    assert sorted(RECORD_PARAMS) == sorted(n for n, m in registered().items() if "records" in m.inputs)


@pytest.mark.parametrize("name", sorted(RECORD_PARAMS))
def test_the_release_at_any_bound_spends_at_most_what_the_limit_reserved(name):
    """The reservation (the limit's events, discounted) dominates the events at every L <= limit."""
    mech = get_mechanism(name)
    p = mech.Params.from_mapping(RECORD_PARAMS[name], "t")
    p.validate("t")
    limit, d = 64, 64

    def events(L):
        return mech.plan(p, InputFacts("records", d, (), 1.0, math.sqrt(L)), "t").events

    reserved = discount_event(events(limit))
    # every L; for DPGM (whose plan calibrates DP-SGD: seconds each) a sample holding L = 30, where a noise
    # multiplier came out one ulp below the limit's before the discount
    for L in (range(1, limit + 1) if name != "dpgm" else (1, 2, 7, 30, 63)):
        assert dominates(events(L), reserved), f"{name}: L = {L} spends more than the reservation"
    assert not dominates(reserved, events(limit))  # the check can fail: the discount is a real margin


# ----------------------------------------------------------------------------- Spark


def _events(spark, items_per_person=5, people=3000, d=40, seed=0, string_keys=False):
    rng = np.random.default_rng(seed)
    rows = [(p, int(s)) for p in range(people) for s in rng.choice(d, items_per_person, replace=False)]
    return spark.createDataFrame(rows, "card long, station long")


@pytest.mark.spark
def test_counts_auto_chooses_the_common_length_and_reserves_one_event(spark, tmp_path):
    from sparkpriv.api import release
    from sparkpriv.ledger import open_ledger
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.privacy.accounting import epsilon_of
    from sparkpriv.spark.events import bound_contributions

    df = _events(spark)
    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=10.0, delta=0.0)
    rec = bound_contributions(df, person="card", item="station", max_items="auto", vocabulary=range(40),
                              auto=AutoCap(quantile=0.9, share=0.5, limit=20))
    dom = KeyDomain.product("station", range(40))
    rel = release("counts", rec, epsilon=4.0, domain=dom, ledger=url, table_id="t")
    est = rel.public["contribution_bound_estimation"]
    assert est["chosen_max_items"] == 5 and est["epsilon"] == pytest.approx(2.0)
    assert rel.public["sensitivity"]["l1"] == 5.0  # add-remove, L = 5 distinct people per key
    # one event: the histogram's Laplace and the counts', accounted within the request
    assert [type(e).__name__ for e in rel.event.events] == ["LaplaceDpEvent", "LaplaceDpEvent"]
    assert rel.epsilon <= 4.0 and rel.epsilon == pytest.approx(epsilon_of(rel.event, 0.0))
    with open_ledger(url) as led:
        (entry,) = led.status("t").entries
    assert entry["epsilon"] == pytest.approx(rel.epsilon)
    assert entry["parameters"]["contribution_bound"]["max_items"] == "auto"
    assert entry["parameters"]["contribution_bound"]["quantile"] == 0.9  # reserved as it is done
    assert entry["parameters"]["contribution_bound"]["epsilon_share"] == 0.5
    rel.write(str(tmp_path / "out"))
    receipt = json.loads((tmp_path / "out" / "_privacy_receipt.json").read_text())
    assert receipt["mechanism_details"]["contribution_bound_estimation"]["chosen_max_items"] == 5
    assert receipt["guarantee"]["epsilon"] <= 4.0
    # the noise is that of L = 5: the counts' interval matches a declared L = 5 release's
    rec5 = bound_contributions(df, person="card", item="station", max_items=5, vocabulary=range(40))
    fixed = release("counts", rec5, epsilon=est["epsilon"] * (1 - 1e-6), domain=dom)
    assert rel.public["uncertainty"]["std"] == pytest.approx(fixed.public["uncertainty"]["std"], rel=1e-5)


@pytest.mark.spark
def test_auto_bound_is_reserved_before_any_value_is_read(spark, tmp_path):
    from pyspark.sql import functions as F

    from sparkpriv.api import release
    from sparkpriv.errors import BudgetExceededError
    from sparkpriv.ledger import open_ledger
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.events import bound_contributions

    @F.udf("long")
    def explode(v):
        raise RuntimeError("a value of the input was read")

    df = _events(spark, people=50).select("card", explode("station").alias("station"))
    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=0.5, delta=0.0)
    rec = bound_contributions(df, person="card", item="station", max_items="auto", vocabulary=range(40))
    with pytest.raises(BudgetExceededError):
        release("counts", rec, epsilon=1.0, domain=KeyDomain.product("station", range(40)), ledger=url,
                table_id="t")


@pytest.mark.spark
def test_command_line_max_items_auto(spark, tmp_path, monkeypatch, capsys):
    from sparkpriv.cli import main

    path = str(tmp_path / "events.parquet")
    _events(spark, items_per_person=3, people=2000).write.parquet(path)
    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/ledger.sqlite")
    assert main(["ledger", "set-budget", "--table-id", "transit", "--epsilon", "5", "--delta", "0"]) == 0
    out = tmp_path / "counts"
    rc = main(["release", "counts", "--input", path, "--output", str(out), "--events", "--person-col", "card",
               "--item-col", "station", "--vocabulary", "0..39", "--max-items", "auto", "--max-items-share",
               "0.3", "--epsilon", "2", "--table-id", "transit"])
    assert rc == 0, capsys.readouterr().err
    r = json.loads((out / "_privacy_receipt.json").read_text())
    est = r["mechanism_details"]["contribution_bound_estimation"]
    assert est["chosen_max_items"] == 3 and est["epsilon"] == pytest.approx(0.6)
    assert r["guarantee"]["epsilon"] <= 2.0


@pytest.mark.parametrize("value,msg", [("0", "positive integer or 'auto'"), ("x", "must be an integer or auto"),
                                       ("-3", "positive integer or 'auto'")])
def test_bad_max_items_is_refused_before_spark_starts(tmp_path, monkeypatch, capsys, value, msg):
    import sparkpriv.spark.session as session
    from sparkpriv.cli import main

    def no_spark(*a, **k):
        raise AssertionError("Spark must not start for a parameter error")

    monkeypatch.setattr(session, "get_spark", no_spark)
    rc = main(["release", "counts", "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "o"),
               "--events", "--person-col", "p", "--item-col", "i", "--vocabulary", "0..9", "--max-items", value,
               "--epsilon", "1"])
    assert rc == 2
    assert msg in capsys.readouterr().err


@pytest.mark.spark
def test_truncation_warns_the_owner_and_never_the_receipt(spark, tmp_path, caplog):
    """Cards visiting 12 stations with max_items 8: every person truncated. The owner sees a WARNING in
    the log and the owner report; the receipt says what the interval covers, and nothing of the data."""
    from sparkpriv.api import release
    from sparkpriv.mechanisms.counts import KeyDomain
    from sparkpriv.spark.events import bound_contributions

    df = _events(spark, items_per_person=12, people=400)
    rec = bound_contributions(df, person="card", item="station", max_items=8, vocabulary=range(40))
    caplog.set_level("WARNING", logger="sparkpriv.release")
    rel = release("counts", rec, epsilon=1.0, domain=KeyDomain.product("station", range(40)))
    warned = [r.getMessage() for r in caplog.records if "owner warning" in r.getMessage()]
    assert len(warned) == 1 and "400 of 400 people (100%)" in warned[0]
    report = tmp_path / "owner.json"
    rel.write(str(tmp_path / "out"), owner_report=str(report))
    assert "400 of 400 people" in json.loads(report.read_text())["warnings"][0]
    receipt = (tmp_path / "out" / "_privacy_receipt.json").read_text()
    assert "400 of 400" not in receipt and "people_truncated" not in receipt
    assert "BOUNDED contributions" in json.loads(receipt)["mechanism_details"]["uncertainty"]["covers"]
    # under the threshold: no warning
    caplog.clear()
    rec = bound_contributions(df, person="card", item="station", max_items=12, vocabulary=range(40))
    release("counts", rec, epsilon=1.0, domain=KeyDomain.product("station", range(40)))
    assert not [r for r in caplog.records if "owner warning" in r.getMessage()]
