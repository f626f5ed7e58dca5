"""The two engines implement the same interface: the same results on the same rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sparkpriv.local.engine import LocalEngine
from sparkpriv.mechanisms.protocol import SparseRows


def _doubling(pid, blocks):
    for X in blocks:
        yield [X[:, 0] * 2.0, X.sum(axis=1)]


def _table(n=2500, seed=4):
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(n), "a": rng.standard_normal(n), "b": rng.standard_normal(n)})


COLS = [("twice_a", "double", False), ("row_sum", "double", False)]


def test_local_engine_aggregate_cache_and_row_map():
    t = _table()
    X = np.column_stack([t["a"].to_numpy(), t["b"].to_numpy()])
    eng = LocalEngine(block_rows=1000)  # three blocks
    src = eng.open(t, columns=["a", "b"], fill=None, caller="t")
    assert src.facts.d == 2 and src.facts.kind == "table"
    np.testing.assert_allclose(eng.aggregate(src, lambda B: B.sum(axis=0), 2), X.sum(axis=0))
    cache = eng.cache(src, lambda B: B * 3.0, 2)
    assert cache.rows == len(X)
    np.testing.assert_allclose(cache.aggregate(lambda Z: Z.sum(axis=0), 2), 3 * X.sum(axis=0))
    out, rows = eng.map_rows(src, _doubling, COLS, keep=["id"])
    assert rows is None and out.column_names == ["id", "twice_a", "row_sum"]
    np.testing.assert_array_equal(out["id"].to_numpy(), np.arange(len(X)))
    np.testing.assert_allclose(out["twice_a"].to_numpy(), 2 * X[:, 0])
    np.testing.assert_allclose(out["row_sum"].to_numpy(), X.sum(axis=1))


def test_spark_engine_matches_the_local_engine(spark):
    from sparkpriv.spark.engine import SparkEngine

    t = _table()
    df = spark.createDataFrame(t.to_pandas()).repartition(3)
    eng = SparkEngine()
    src = eng.open(df, columns=["a", "b"], fill=None, caller="t")
    leng = LocalEngine(block_rows=700)
    lsrc = leng.open(t, columns=["a", "b"], fill=None, caller="t")
    np.testing.assert_allclose(eng.aggregate(src, lambda B: B.sum(axis=0), 2),
                               leng.aggregate(lsrc, lambda B: B.sum(axis=0), 2), rtol=1e-12)
    cache = eng.cache(src, lambda B: B * 3.0, 2)
    try:
        assert cache.rows == t.num_rows
        np.testing.assert_allclose(cache.aggregate(lambda Z: Z.sum(axis=0), 2),
                                   3 * leng.aggregate(lsrc, lambda B: B.sum(axis=0), 2), rtol=1e-12)
    finally:
        cache.release()
    out, rows = eng.map_rows(src, _doubling, COLS, keep=["id"])
    assert rows is not None and out.columns == ["id", "twice_a", "row_sum"]
    got = out.toPandas().sort_values("id")
    ref = leng.map_rows(lsrc, _doubling, COLS, keep=["id"])[0].to_pandas()
    np.testing.assert_allclose(got["twice_a"].to_numpy(), ref["twice_a"].to_numpy())
    np.testing.assert_allclose(got["row_sum"].to_numpy(), ref["row_sum"].to_numpy())
    small = eng.table([(1, 2.0)], [("i", "int", False), ("x", "double", False)])
    assert small.collect()[0]["x"] == 2.0


def test_sparse_rows_block():
    s = SparseRows(np.array([0, 2, 3]), np.array([1, 4, 0]), None, 5)
    assert s.n == 2 and s.d == 5


def test_local_engine_refuses_what_it_cannot_read():
    from sparkpriv.errors import ParameterError

    eng = LocalEngine()
    with pytest.raises(ParameterError, match="2-D array"):
        eng.open(np.zeros(3), columns=None, fill=None, caller="t")
    with pytest.raises(ParameterError, match="'columns' parameter of t is required"):
        eng.open(_table(), columns=None, fill=None, caller="t")
    with pytest.raises(ParameterError, match="not a number"):
        eng.open(pa.table({"s": ["x"]}), columns=["s"], fill=None, caller="t")
