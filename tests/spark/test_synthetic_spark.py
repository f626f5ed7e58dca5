"""The synthetic table release on Spark: the same release as the local engine before noise (same
test seed), the command line's release and synthesis of an event table."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import sparse

from sparkpriv.api import release
from sparkpriv.local.records import bound_items
from sparkpriv.privacy.random import insecure_fixed_seed
from sparkpriv.spark.events import bound_contributions

pytestmark = pytest.mark.spark


def _events(spark, people=2000, d=30, seed=0):
    rng = np.random.default_rng(seed)
    rows = [(p, int(s)) for p in range(people) for s in rng.choice(d, rng.integers(1, 7), replace=False)]
    return rows, spark.createDataFrame(rows, "card long, station long").repartition(3)


@pytest.mark.parametrize("max_items", [6, "auto"])
def test_spark_and_local_engines_give_the_same_release(spark, max_items):
    """No person holds more than 6 items, so the keyed choices (by person hash on Spark, by row in
    memory) keep everything: the same bounded records, hence the same noisy counts and lengths."""
    rows, df = _events(spark)
    p = np.array([r[0] for r in rows])
    s = np.array([r[1] for r in rows])
    X = sparse.csr_matrix((np.ones(p.size), (p, s)), shape=(2000, 30))
    kw = dict(epsilon=4.0, delta=1e-5)  # at 2,000 people epsilon 4 gives the anchor strata room
    with insecure_fixed_seed(11):
        a = release("synthetic", bound_contributions(df, person="card", item="station", max_items=max_items,
                                                     vocabulary="0..29"), **kw)
    with insecure_fixed_seed(11):
        b = release("synthetic", bound_items(X, max_items=max_items), **kw)
    assert (a.engine, b.engine) == ("spark", "local") and a.event == b.event
    np.testing.assert_allclose(a.model.noisy_counts, b.model.noisy_counts, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.model.lengths, b.model.lengths, rtol=0, atol=1e-12)
    assert a.model.n == b.model.n == 2000
    # the anchor strata: the same pass over the records at the length limit, the same noise
    assert a.model.strata is not None and b.model.strata is not None
    for k, v in b.model.strata.arrays().items():
        np.testing.assert_allclose(a.model.strata.arrays()[k], v, rtol=0, atol=1e-9, err_msg=k)
    np.testing.assert_allclose(a.df.toPandas()["noisy_count"].to_numpy(), b.df.column("noisy_count").to_numpy())


def test_command_line_release_and_synthesis(spark, tmp_path, monkeypatch, capsys):
    from sparkpriv.cli import main

    _, df = _events(spark, people=3000)
    path = str(tmp_path / "input")
    df.write.parquet(path)
    monkeypatch.setenv("SPARKPRIV_LEDGER", f"sqlite:///{tmp_path}/ledger.sqlite")
    assert main(["ledger", "set-budget", "--table-id", "trips", "--epsilon", "3", "--delta", "1e-5"]) == 0
    rc = main(["release", "synthetic", "--input", path, "--output", str(tmp_path / "rel"), "--events",
               "--person-col", "card", "--item-col", "station", "--vocabulary", "0..29", "--max-items", "auto",
               "--epsilon", "1", "--delta", "1e-6", "--table-id", "trips"])
    out = capsys.readouterr().out
    assert rc == 0 and "max_items" in out
    receipt = json.loads((tmp_path / "rel" / "_privacy_receipt.json").read_text())
    assert receipt["mechanism"] == "synthetic" and receipt["guarantee"]["epsilon"] <= 1.0
    assert receipt["mechanism_details"]["model"]["n_people"] == 3000
    for layout, extra in (("items", []), ("events", ["--explode"])):
        rc = main(["synthesize", "--model", str(tmp_path / "rel"), "--rows", "4000", "--output",
                   str(tmp_path / layout), "--seed", "5", *extra])
        assert rc == 0, capsys.readouterr().err
    items = pq.read_table(tmp_path / "items")
    assert items.column_names == ["person", "items"] and items.num_rows == 4000
    ev = pq.read_table(tmp_path / "events")
    assert ev.column_names == ["card", "station"]
    per = [sorted(x) for x in items.column("items").to_pylist()]
    assert sum(len(x) for x in per) == ev.num_rows  # the same people, one row per (person, item)
    assert all(0 <= i < 30 for x in per for i in x)
    syn = json.loads((tmp_path / "items" / "_privacy_receipt.json").read_text())
    assert syn["spent"] == {"epsilon": 0.0, "delta": 0.0} and syn["synthesis"]["seed"] == 5
