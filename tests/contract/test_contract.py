"""The contract every registered mechanism passes, on both engines (issue: one release path).

For each mechanism of :func:`sparkpriv.mechanisms.protocol.registered` a CASE
below gives small data and parameters. A mechanism without a case fails
``test_every_registered_mechanism_has_a_case``: registering a mechanism makes
this suite fail until it is covered; nothing here is skipped.

Checked for each: the Spark and the local engine give the same release for the
same test seed (same noise draws: the results agree to float summation order);
the receipt states the mechanism, a guarantee no larger than the request, the
events and the parameters; bad parameters are refused before any value of the
input is read; the write is atomic; the ledger reserves before reading, commits
on a write and keeps the spend of a run that fails (docs/privacy.md, "Failures");
no secret (any
seed drawn by the release, as bytes or digits) is in the published files or
the logs; an audit test covers the mechanism.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pytest

from sparkpriv.api import release
from sparkpriv.errors import InputError, ParameterError
from sparkpriv.mechanisms.protocol import registered
from sparkpriv.privacy import random as sprandom
from tests.seeds import record_secret_seeds


@dataclass
class Case:
    data: Callable[[], np.ndarray]       # an (n, d) float array, the table's columns c0..c{d-1}
    params: dict                          # valid parameters (columns are added per engine)
    bad: dict                             # one invalid parameter value
    compare: Callable                     # (release_a, release_b) -> None: equal up to float order
    colparams: Callable | None = None     # X -> the column parameters (default: columns = every column)
    refused: str = "add-remove"           # a neighbour relation the mechanism refuses


def _blobs(n=1200, seed=1):
    rng = np.random.default_rng(seed)
    centres = np.array([[-6.0, 0.0, 1.0], [6.0, 1.0, -1.0], [0.0, 7.0, 0.0]])
    return centres[rng.integers(0, 3, n)] + rng.standard_normal((n, 3))


def _same_kmeans(a, b):
    np.testing.assert_allclose(a.model.centers, b.model.centers, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(a.model.counts, b.model.counts, rtol=1e-7, atol=1e-9)
    assert a.model.unreliable == b.model.unreliable


def _binary_records(n=400, seed=2):
    rng = np.random.default_rng(seed)
    p = np.where(np.arange(n)[:, None] % 2 == 0, 0.8, 0.1)
    return (rng.random((n, 6)) < p).astype(float)


def _same_dpgm(a, b):
    np.testing.assert_allclose(a.model.centers, b.model.centers, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(a.model.sizes, b.model.sizes, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(a.model.thetas, b.model.thetas, rtol=1e-6, atol=1e-9)
    assert a.files.keys() == b.files.keys() == {"_dpgm_model.npz"}




def _table_values(rel):
    t = rel.df if rel.engine == "local" else None
    if t is None:
        return rel.df.toPandas().to_numpy(dtype=float)
    return t.to_pandas().to_numpy(dtype=float)


def _same_table(a, b):
    np.testing.assert_allclose(_table_values(a), _table_values(b), rtol=1e-7, atol=1e-7)


def _box(n=900, d=4, seed=2):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (n, d))


def _linear(n=1200, seed=2):
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1, 1, (n, 3))
    return np.column_stack([A, A @ np.array([0.5, -0.3, 0.2]) + 0.1 * rng.standard_normal(n)])


def _same_regression(a, b):
    sa, sb = a.extras["statistics"], b.extras["statistics"]
    for f in ("gram", "xy", "yy", "n", "lambda_min"):
        np.testing.assert_allclose(getattr(sa, f), getattr(sb, f), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a.model.coef, b.model.coef, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(a.model.ci_low, b.model.ci_low, rtol=1e-6, atol=1e-9)


CASES = {
    "dpgm": Case(_binary_records, dict(k=2, epsilon=5.0, delta=1e-5, kmeans_iterations=2, sampling_rate=0.2,
                                       epochs=1.0, hidden=3, chains=10, accountant="rdp"),
                 {"k": 1}, _same_dpgm),
    "dprp": Case(_box, dict(epsilon=2.0, delta=1e-5, lower=[-1.0] * 4, upper=[1.0] * 4, k2=2),
                 {"budget_split": (0.5, 0.7)}, _same_table),
    "kmeans": Case(_blobs, dict(k=3, epsilon=2.0, delta=1e-5, iterations=3, variant="kernel",
                                lower=[-12.0] * 3, upper=[12.0] * 3, kernel_width=4.0, frequencies=8),
                   {"k": 1}, _same_kmeans),
    "projection": Case(_box, dict(k=2, epsilon=1.0, row_bound=2.0), {"k": 0}, _same_table),
    "regression": Case(_linear, dict(lower=-1.0, upper=1.0, target_lower=-2.0, target_upper=2.0, epsilon=2.0,
                                     delta=1e-5), {"bootstrap": 5}, _same_regression,
                       lambda X: {"columns": _cols(X)[:-1], "target": _cols(X)[-1]}, refused="element"),
}


def _cols(X):
    return [f"c{j}" for j in range(X.shape[1])]


def _colparams(case, X) -> dict:
    """The column parameters of a table input (Spark, Arrow)."""
    return case.colparams(X) if case.colparams else {"columns": _cols(X)}


def _local_colparams(case, X) -> dict:
    """The column parameters of a numpy input (default: none; the array's columns)."""
    return case.colparams(X) if case.colparams else {}


def _arrow(X):
    return pa.table({c: X[:, j] for j, c in enumerate(_cols(X))})


@dataclass
class RecordsCase:
    """A mechanism that takes bounded event records (Spark engine only: the local engine
    takes no event tables): ``events(spark)`` gives an event table, ``records(df)`` bounds it."""

    events: Callable                      # spark -> event DataFrame (person, key columns)
    records: Callable                     # event DataFrame -> BoundedRecords
    params: dict
    bad: dict


def _count_events(spark):
    rng = np.random.default_rng(3)
    rows = [(int(p), int(t)) for p in range(400) for t in rng.choice(6, rng.integers(1, 4), replace=False)]
    return spark.createDataFrame(rows, "caller long, tower long")


def _count_domain():
    from sparkpriv.mechanisms.counts import KeyDomain

    return KeyDomain.product("tower", range(0, 6))


def _count_records(df):
    from sparkpriv.spark.counts import bound_keys

    return bound_keys(df, person="caller", domain=_count_domain(), max_keys=2)


def _synthetic_records(df):
    from sparkpriv.spark.events import bound_contributions

    return bound_contributions(df, person="caller", item="tower", max_items=2, vocabulary="0..5")


def _aggregate_events(spark):
    rng = np.random.default_rng(4)
    rows = [(int(p), int(t), float(rng.uniform(0, 60))) for p in range(400)
            for t in rng.choice(6, rng.integers(1, 4), replace=False)]
    return spark.createDataFrame(rows, "caller long, tower long, duration double")


RECORD_CASES = {
    # aggregates read the raw event table (here on Spark; the local engine in tests/local): their
    # bounding is part of the release
    "aggregates": RecordsCase(_aggregate_events, lambda df: df,
                              dict(epsilon=1.0, person="caller", by=("tower",), domain={"tower": "0..5"},
                                   aggregates="count_distinct, count, mean(duration), median(duration)",
                                   bounds={"duration": (0.0, 60.0)}, max_keys=2, max_events_per_key=2),
                              {"aggregates": "count, nonsense(duration)"}),
    "counts": RecordsCase(_count_events, _count_records,
                          dict(epsilon=1.0, domain=_count_domain()), {"noise": "gaussian"}),
    "synthetic": RecordsCase(_count_events, _synthetic_records, dict(epsilon=1.0, delta=1e-5),
                             {"shrink": "median"}),
}

def _assert_no_seed(seeds, published, caplog, rel) -> None:
    """No drawn seed (bytes either order, decimal, hex) in the published files, the logs or the repr."""
    blobs = []
    for root, _, names in os.walk(published):
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                blobs.append(f.read())
    blobs.append("\n".join(r.getMessage() for r in caplog.records).encode())
    blobs.append(repr(rel).encode())
    for s in seeds:
        needles = [s.to_bytes(16, "little"), s.to_bytes(16, "big"), str(s).encode(), hex(s).encode()]
        for blob in blobs:
            for needle in needles:
                assert needle not in blob, "a secret seed appears in the output, the logs or the repr"


MECHANISMS = sorted(registered())
TABLE_MECHANISMS = sorted(CASES)


def test_every_registered_mechanism_has_a_case():
    assert sorted([*CASES, *RECORD_CASES]) == MECHANISMS, \
        "a registered mechanism has no contract case: add one to CASES (or RECORD_CASES)"


def test_every_registered_mechanism_is_audited():
    from tests.audit.test_coverage import CLI_MECHANISMS, FUNCTIONS

    for name in MECHANISMS:
        assert name in CLI_MECHANISMS and f"release_{name}" in FUNCTIONS, (
            f"{name}: tests/audit/test_coverage.py does not map it to its audited mechanisms")


@pytest.mark.parametrize("name", TABLE_MECHANISMS)
def test_spark_and_local_engines_agree(name, spark):
    case = CASES[name]
    X = case.data()
    df = spark.createDataFrame(_arrow(X).to_pandas()).coalesce(1)  # one partition: the local engine's
    with sprandom.insecure_fixed_seed(4242):
        a = release(name, _arrow(X), **_colparams(case, X), **case.params)
    with sprandom.insecure_fixed_seed(4242):
        b = release(name, df, **_colparams(case, X), **case.params)
    assert (a.engine, b.engine) == ("local", "spark")
    case.compare(a, b)
    assert a.events == b.events and a.epsilon == b.epsilon and a.delta == b.delta
    ra, rb = a.receipt(), b.receipt()
    for key in ("mechanism", "guarantee", "events"):
        assert json.dumps(ra[key], sort_keys=True) == json.dumps(rb[key], sort_keys=True)
    # the details hold the same facts (released values agree to float order, compared above)
    assert sorted(ra["mechanism_details"]) == sorted(rb["mechanism_details"])
    assert ra["mechanism_details"]["parameters"] == rb["mechanism_details"]["parameters"]
    assert ra["output"]["schema"] and [f["name"] for f in ra["output"]["schema"]] == \
        [f["name"] for f in rb["output"]["schema"]]


@pytest.mark.parametrize("name", TABLE_MECHANISMS)
def test_receipt_states_what_was_spent(name):
    case = CASES[name]
    X = case.data()
    rel = release(name, X, **_local_colparams(case, X), **case.params)
    r = rel.receipt()
    assert r["mechanism"] == name and r["guarantee"]["holds"] is True
    assert r["guarantee"]["epsilon"] <= case.params["epsilon"]
    assert r["guarantee"]["delta"] == case.params.get("delta", 0.0)
    assert r["guarantee"]["neighbors"] and r["guarantee"]["protects"]
    from sparkpriv.privacy.accounting import epsilon_of

    assert epsilon_of(rel.events, rel.delta) == pytest.approx(rel.epsilon, rel=1e-12)
    params = r["mechanism_details"]["parameters"]
    for k, v in case.params.items():
        if isinstance(v, (int, float, str)):
            assert params[k] == v


@pytest.mark.parametrize("name", TABLE_MECHANISMS)
def test_bad_parameters_refused_before_any_value_is_read(name, spark):
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    case = CASES[name]
    X = case.data()

    @F.udf(DoubleType())
    def explode(v):
        raise RuntimeError("a value of the input was read")

    df = spark.createDataFrame(_arrow(X).to_pandas())
    df = df.select(*[explode(F.col(c)).alias(c) for c in _cols(X)])
    for bad in (case.bad, {"no_such_parameter": 1}, {"neighbors": case.refused}, {"epsilon": -1.0}):
        with pytest.raises(ParameterError):
            release(name, df, **_colparams(case, X), **dict(case.params, **bad))
    Xn = X.copy()
    Xn[0, 0] = np.nan  # refusals of bad parameters come first; a NaN is replaced by the public fill
    with pytest.raises(ParameterError):
        release(name, Xn, **_local_colparams(case, X), **dict(case.params, **case.bad))
    rel = release(name, Xn, **_local_colparams(case, X), **case.params)
    assert rel.diagnostics()["missing_values_replaced"] == 1


@pytest.mark.parametrize("name", TABLE_MECHANISMS)
@pytest.mark.parametrize("engine", ["local", "spark"])
def test_ledger_atomic_write_and_no_secrets(name, engine, spark, tmp_path, caplog, monkeypatch):
    from sparkpriv.ledger import open_ledger

    case = CASES[name]
    X = case.data()
    data = X if engine == "local" else spark.createDataFrame(_arrow(X).to_pandas())
    extra = _local_colparams(case, X) if engine == "local" else _colparams(case, X)
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=100.0, delta=1e-3)
    seeds = record_secret_seeds(monkeypatch)
    caplog.set_level("DEBUG")

    # a run that fails after its reservation keeps its spend: whether it fails could depend on the
    # data (docs/privacy.md, "Failures"); here every value read raises
    if engine == "local":
        from sparkpriv.local.engine import LocalSource

        def boom(self, *a, **k):
            raise RuntimeError("a value of the input was read")
            yield  # pragma: no cover

        with monkeypatch.context() as m:
            m.setattr(LocalSource, "blocks", boom)
            with pytest.raises(RuntimeError):
                release(name, data, ledger=url, table_id="t", **extra, **case.params)
    else:
        from pyspark.sql import functions as F
        from pyspark.sql.types import DoubleType

        @F.udf(DoubleType())
        def explode(v):
            raise RuntimeError("a value of the input was read")

        cols = [c for c in data.columns]
        poisoned = data.select(*[explode(F.col(c)).alias(c) for c in cols])
        try:  # aggregate passes read in the release; a row-level release on Spark reads when written
            lazy = release(name, poisoned, ledger=url, table_id="t", **extra, **case.params)
        except Exception:
            pass
        else:
            with pytest.raises(Exception):
                lazy.write(str(tmp_path / "bad"))
            assert not (tmp_path / "bad").exists()
            lazy.abandon("the write failed")
    with open_ledger(url) as led:
        (failed,) = led.status("t").entries
    assert failed["state"] == "committed" and not failed["output_path"]
    assert "failed" in failed["receipt_summary"]

    rel = release(name, data, ledger=url, table_id="t", **extra, **case.params)
    out = tmp_path / "out"
    # a failed publish leaves nothing and keeps the reservation (counted): the table was computed,
    # so the same release may be written elsewhere, and is
    out.mkdir()
    (out / "keep.txt").write_text("an existing output")
    from sparkpriv.errors import OutputExistsError

    with pytest.raises(OutputExistsError):
        rel.write(str(out))
    assert os.listdir(out) == ["keep.txt"]
    with open_ledger(url) as led:
        assert [e["state"] for e in led.status("t").entries] == ["committed", "reserved"]
    written = rel.write(str(tmp_path / "published"))
    assert written.endswith("published")
    rel2 = rel
    with open_ledger(url) as led:
        entries = led.status("t").entries
    assert [e["state"] for e in entries] == ["committed", "committed"]
    assert entries[1]["output_path"].endswith("published")
    assert not [f for f in os.listdir(tmp_path) if "staging" in f]
    assert seeds, "the release drew no secret seed through new_secret_seed"
    _assert_no_seed(seeds, tmp_path / "published", caplog, rel2)


# ----------------------------------------------------------------------------- event-records mechanisms


@pytest.mark.parametrize("name", sorted(RECORD_CASES))
def test_records_receipt_refusals_ledger_and_no_secrets(name, spark, tmp_path, caplog, monkeypatch):
    """The same contract for a mechanism of bounded event records (Spark engine)."""
    from pyspark.sql import functions as F

    from sparkpriv.ledger import open_ledger
    from sparkpriv.privacy.accounting import epsilon_of

    case = RECORD_CASES[name]
    df = case.events(spark)
    # bad parameters: refused before any value of the events is read
    cols = df.columns

    @F.udf("long")
    def explode(v):
        raise RuntimeError("a value of the input was read")

    poisoned = df.select(*[explode(F.col(c)).alias(c) for c in cols])
    for bad in (case.bad, {"no_such_parameter": 1}, {"neighbors": "element"}, {"epsilon": -1.0}):
        with pytest.raises(ParameterError):
            release(name, case.records(poisoned), **dict(case.params, **bad))
    # receipt
    rel = release(name, case.records(df), **case.params)
    r = rel.receipt()
    assert r["mechanism"] == name and r["guarantee"]["holds"] is True
    assert r["guarantee"]["epsilon"] <= case.params["epsilon"]
    assert r["guarantee"]["neighbors"] and r["guarantee"]["protects"]
    assert epsilon_of(rel.events, rel.delta) == pytest.approx(rel.epsilon, rel=1e-12)
    assert r["mechanism_details"]["parameters"]["epsilon"] == case.params["epsilon"]
    # ledger: reserve before reading, a failed run charged, commit on a write; atomic; no secrets
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=100.0, delta=1e-3)
    seeds = record_secret_seeds(monkeypatch)
    caplog.set_level("DEBUG")
    with pytest.raises(Exception):
        release(name, case.records(poisoned), ledger=url, table_id="t", **case.params)
    rel = release(name, case.records(df), ledger=url, table_id="t", **case.params)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an existing output")
    from sparkpriv.errors import OutputExistsError

    with pytest.raises(OutputExistsError):
        rel.write(str(out))
    assert os.listdir(out) == ["keep.txt"]
    rel.write(str(tmp_path / "published"))  # the failed publish kept the reservation: written elsewhere
    rel2 = rel
    with open_ledger(url) as led:
        entries = led.status("t").entries
    # the failed run is charged (committed without an output), the release committed once written
    assert [e["state"] for e in entries] == ["committed", "committed"]
    assert not entries[0]["output_path"] and "failed" in entries[0]["receipt_summary"]
    assert entries[1]["output_path"].endswith("published")
    assert seeds
    _assert_no_seed(seeds, tmp_path / "published", caplog, rel2)
