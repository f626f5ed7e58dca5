"""The local engine's aggregates and counts (sparkpriv.local.events, sparkpriv.local.records.bound_keys):

* before noise, every aggregate (count, count_distinct, sum, mean, variance, quantiles) and the counts
  equal an independent pandas reference of the bounding rule (at most L keys per person by the keyed
  choice, events weighted min(n, c) / n, values filled with the clamp's centre and clamped, keys outside
  the domain, null or malformed dropped), for blocks of any size;
* with the same secret seed the local and the Spark engine release the same table (public domain,
  private key selection, counts on the driver and in blocks) and the same owner diagnostics, on a
  table with a person above L keys and above c events per key, null and NaN values, null and
  out-of-domain keys, and (string persons) a null person.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sparkpriv import release_aggregates, release_counts
from sparkpriv.local.engine import LocalEngine
from sparkpriv.local.spark_hash import xxhash64
from sparkpriv.mechanisms.aggregates import AGGREGATES, AggregatesParams, Bounding, cells
from sparkpriv.mechanisms.aggregates._mechanism import _totals_fn
from sparkpriv.mechanisms.counts import KeyDomain
from sparkpriv.mechanisms.sparse import keyed_item_scores
from sparkpriv.privacy.random import derive_seed, insecure_fixed_seed
from sparkpriv.release import release

KEY = b"a secret key of the choice, 16+"
L, C, LO, HI, B, D = 2, 2, 0.0, 60.0, 16, 6
QUERY = "count_distinct, count, sum(dur), mean(dur), variance(dur), quantile(dur, 0.25, 0.5)"
PARAMS = dict(person="caller", by=("tower",), domain={"tower": f"0..{D - 1}"}, aggregates=QUERY,
              bounds={"dur": (LO, HI)}, max_keys=L, max_events_per_key=C, quantile_buckets=B, epsilon=1.0,
              bounding_key=KEY)


def _events(kind: str = "long", seed: int = 3) -> pa.Table:
    """About 150 people over towers 0..7 (6 and 7 outside the domain 0..5), 1-4 towers each (some above
    L) and 1-4 events per tower (some above c), durations in [-20, 80] (clamped to [0, 60]); one person
    at every tower with 6 events each; null and NaN durations, null towers; ``kind="string"``: string
    persons (a few null) and string towers (some padded, some malformed)."""
    rng = np.random.default_rng(seed)
    persons, towers, hours, durs = [], [], [], []
    for p in range(150):
        for t in rng.choice(8, int(rng.integers(1, 5)), replace=False):
            for _ in range(int(rng.integers(1, 5))):
                persons.append(p), towers.append(int(t)), hours.append(int(rng.integers(0, 2)))
                durs.append(float(rng.uniform(-20, 80)))
    for t in range(8):
        for _ in range(6):
            persons.append(999), towers.append(t), hours.append(t % 2), durs.append(float(rng.uniform(0, 60)))
    n = len(persons)
    null_towers = set(rng.choice(n, 15, replace=False).tolist())
    towers = [None if i in null_towers else v for i, v in enumerate(towers)]
    durs = np.array(durs)
    durs[rng.choice(n, 10, replace=False)] = np.nan
    dur = pa.array([None if i % 97 == 0 else v for i, v in enumerate(durs)], pa.float64())
    if kind == "long":
        return pa.table({"caller": pa.array(persons, pa.int64()), "tower": pa.array(towers, pa.int64()),
                         "hour": pa.array(hours, pa.int64()), "dur": dur})
    sp = [None if i % 113 == 5 else f"caller-{p:04d}" for i, p in enumerate(persons)]
    st = [None if t is None else (f" {t} " if i % 11 == 0 else ("x" if i % 53 == 0 else str(t)))
          for i, t in enumerate(towers)]
    return pa.table({"caller": pa.array(sp), "tower": pa.array(st), "hour": pa.array(hours, pa.int64()), "dur": dur})


def _tower_index(t: pa.Table) -> np.ndarray:
    """The reference key index: Spark's reading of a tower as an integer in 0..D-1, -1 otherwise."""
    out = []
    for v in t.column("tower").to_pylist():
        s = str(v).strip() if v is not None else ""
        ok = s.lstrip("+-").isdigit()
        out.append(int(s) if ok and 0 <= int(s) < D else -1)
    return np.array(out)


def _kept(df: pd.DataFrame, choice: int):
    """``(person's events, kept keys)`` of every person: at most L keys, the L smallest keyed scores."""
    for (_, ph), ev in df.groupby(["person", "ph"], sort=False):
        keys = np.unique(ev.key.to_numpy())
        if keys.size > L:
            s = keyed_item_scores(np.array([ph]), np.array([0, keys.size]), keys, choice)
            keys = keys[np.argsort(s)[:L]]
        yield ev, keys


def _frame(t: pa.Table) -> pd.DataFrame:
    """The events inside the domain: the person's value (nulls one person), its hash, key, value."""
    df = pd.DataFrame({"person": ["<null>" if v is None else v for v in t.column("caller").to_pylist()],
                       "ph": xxhash64(t.column("caller")), "key": _tower_index(t),
                       "x": t.column("dur").to_numpy(zero_copy_only=False)})
    return df[df.key >= 0]


def _reference(t: pa.Table, choice: int, c: int = C) -> dict:
    """Per key of 0..D-1: people, events, sum, mean, variance and the weighted quantile of the bounded
    data, by pandas and a loop over people (independent of the engine and the core's totals)."""
    mid = (LO + HI) / 2
    rows, people = [], np.zeros(D, np.int64)
    for ev, keys in _kept(_frame(t), choice):
        people[keys] += 1
        for k in keys:
            x = ev.x[ev.key == k].to_numpy(np.float64)
            x = np.clip(np.where(np.isfinite(x), x, mid), LO, HI)
            rows.extend((k, x_i, min(x.size, c) / x.size) for x_i in x)
    r = pd.DataFrame(rows, columns=["key", "x", "w"])
    out = {}
    for k in range(D):
        e = r[r.key == k]
        events = e.w.sum()
        mean = (e.w * e.x).sum() / events
        o = np.argsort(e.x.to_numpy(), kind="stable")
        xs, cw = e.x.to_numpy()[o], np.cumsum(e.w.to_numpy()[o])
        out[k] = {"people": people[k], "events": events, "sum": (e.w * e.x).sum(), "mean": mean,
                  "variance": (e.w * (e.x - mean) ** 2).sum() / events,
                  "quantile": lambda p, xs=xs, cw=cw: xs[np.searchsorted(cw, p * cw[-1] - 1e-9)]}
    return out


def _local_cells(t: pa.Table, block_rows: int):
    """The cells of every aggregate before noise: the local engine's per-key totals, post-processed."""
    p = AggregatesParams(**PARAMS)
    p.validate("test")
    eng = LocalEngine(block_rows=block_rows)
    src = eng.open(t, caller="test", **AGGREGATES.open_args(p))
    plan = AGGREGATES.plan(p, src.facts, "test")
    ap, q = plan.state.plan, plan.state.query
    b = Bounding(ap.max_keys, ap.max_events_per_key, tuple(q.columns), (LO,), (HI,), ap.buckets, ap.groups)
    totals = eng.aggregate(src, _totals_fn(b, plan.secrets["choice"], D, None), D * b.width).reshape(D, b.width)
    return dict(cells(totals, ap))


@pytest.mark.parametrize("kind", ["long", "string"])
@pytest.mark.parametrize("block_rows", [1, 7, 65_536])
def test_every_aggregate_equals_a_pandas_reference_before_noise(kind, block_rows):
    t = _events(kind)
    got = _local_cells(t, block_rows)
    ref = _reference(t, derive_seed(KEY, "contribution-bounding"))
    assert any(np.unique(_tower_index(t)[np.array(t.column("caller").to_pylist()) == v]).size > L
               for v in set(t.column("caller").to_pylist()) if v is not None)  # someone is above L
    width = (HI - LO) / B
    for k in range(D):
        r = ref[k]
        assert got["count_distinct"][k] == r["people"]
        assert got["count"][k] == pytest.approx(r["events"], rel=1e-12)
        assert got["sum_dur"][k] == pytest.approx(r["sum"], rel=1e-9)
        assert got["mean_dur"][k] == pytest.approx(r["mean"], rel=1e-9)
        assert got["variance_dur"][k] == pytest.approx(r["variance"], rel=1e-9)
        for p, name in ((0.25, "p25_dur"), (0.5, "p50_dur")):
            assert abs(got[name][k] - r["quantile"](p)) <= width + 1e-9, (k, p)


def _same_tables(local, spark_df, keys) -> None:
    a = local.to_pandas().sort_values(keys).reset_index(drop=True)
    b = spark_df.toPandas().sort_values(keys).reset_index(drop=True)
    assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0
    for c in a.columns:
        if c in keys:
            assert a[c].tolist() == b[c].tolist(), c
        else:
            np.testing.assert_allclose(a[c].to_numpy(np.float64), b[c].to_numpy(np.float64), rtol=1e-9, atol=1e-9,
                                       err_msg=c)


@pytest.mark.parametrize("kind", ["long", "string"])
def test_local_and_spark_release_the_same_aggregates(spark, kind):
    t = _events(kind)
    with insecure_fixed_seed(77):
        loc = release("aggregates", t, engine=LocalEngine(block_rows=37), **PARAMS)
    with insecure_fixed_seed(77):
        sp = release_aggregates(spark.createDataFrame(t).repartition(3), **PARAMS)
    _same_tables(loc.df, sp.df, ["tower"])
    assert loc.diagnostics() == sp.diagnostics()
    assert loc.diagnostics()["people_truncated"] > 0 and loc.diagnostics()["events_outside_domain"] > 0


def test_local_and_spark_select_the_same_private_keys(spark):
    t = _events("long")
    params = dict(PARAMS, by=("tower", "hour"), domain=None, aggregates="count_distinct, mean(dur), median(dur)",
                  delta=1e-3, epsilon=3.0, max_keys=3)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    with insecure_fixed_seed(78):
        loc = release("aggregates", t, engine=LocalEngine(block_rows=50, key_partitions=partitions), **params)
    with insecure_fixed_seed(78):
        sp = release_aggregates(spark.createDataFrame(t).repartition(2), **params)
    _same_tables(loc.df, sp.df, ["tower", "hour"])
    assert 0 < loc.df.num_rows < 16  # some keys selected, some not (towers 0..7 x hours 0..1)


@pytest.mark.parametrize("c", [None, C])
def test_counts_equal_a_pandas_reference_and_the_spark_engine(spark, c):
    from sparkpriv.local.records import bound_keys as local_bound_keys
    from sparkpriv.mechanisms.counts import _totals_fn as counts_totals
    from sparkpriv.spark.counts import bound_keys as spark_bound_keys

    t = _events("string")
    dom = KeyDomain.product("tower", range(0, D))
    rec = local_bound_keys(t, person="caller", domain=dom, max_keys=L, max_events_per_key=c, seed=KEY)
    totals = LocalEngine(block_rows=11).aggregate(rec, counts_totals(D), D)
    choice = derive_seed(KEY, "contribution-bounding")
    want = np.zeros(D)
    for ev, keys in _kept(_frame(t), choice):
        for k in keys:
            want[k] += 1 if c is None else min(int((ev.key == k).sum()), c)
    np.testing.assert_array_equal(totals, want)
    sdf = spark.createDataFrame(t).repartition(3)
    for limit in (1 << 21, 4):  # on the driver, and in blocks of keys
        with insecure_fixed_seed(79):
            rec = local_bound_keys(t, person="caller", domain=dom, max_keys=L, max_events_per_key=c, seed=KEY)
            loc = release_counts(rec, domain=dom, epsilon=1.0, driver_domain_limit=limit)
        with insecure_fixed_seed(79):
            srec = spark_bound_keys(sdf, person="caller", domain=dom, max_keys=L, max_events_per_key=c, seed=KEY)
            sp = release_counts(srec, domain=dom, epsilon=1.0, driver_domain_limit=limit)
        _same_tables(loc.df, sp.df, ["tower"])
        assert loc.diagnostics() == sp.diagnostics(), limit


def test_truncation_owner_warning_is_logged_once_and_names_the_aggregates_caps(caplog, tmp_path):
    """A table where most people hold more keys than max_keys: one owner warning per release, naming
    max_keys (not the counts' max_items), with the share of people truncated by the reference count."""
    import logging

    events = _events()
    held = events.group_by(["caller"]).aggregate([("tower", "count_distinct")]).to_pandas()
    # the bounding drops null and out-of-domain towers first: the reference counts domain towers only
    df = events.to_pandas()
    in_domain = df[df.tower.notna() & (df.tower < D)]
    over = int((in_domain.groupby("caller").tower.nunique() > 1).sum())
    people = int(held.caller.nunique())
    assert over / people > 0.05  # the warning's threshold
    caplog.set_level(logging.INFO, logger="sparkpriv.release")  # that logger's level (a CLI test may set it)
    rel = release_aggregates(events, **dict(PARAMS, max_keys=1))
    rel.write(str(tmp_path / "out"))
    warned = [r.getMessage() for r in caplog.records if "had more than" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"{over} of {people} people" in warned[0] and "max_keys keys" in warned[0]
    assert "max_items" not in warned[0]
