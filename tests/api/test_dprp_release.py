"""DPRP on the one release path, local engine: numpy, pandas and Arrow inputs give the same
Release; labels decoded by the engine; the budget reserved before reading and released on
failure; the DP-means pass planned (and reserved) with the others; the atomic write."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkpriv.api import release_dprp, release_dprp_array, table_arrays
from sparkpriv.errors import BudgetExceededError, InputError, ParameterError
from sparkpriv.mechanisms import dprp as core
from sparkpriv.privacy import random as sprandom
from sparkpriv.privacy.accounting import epsilon_of

D = 3
ARGS = dict(epsilon=2.0, delta=1e-5, lower=[0.0] * D, upper=[10.0] * D)


def _X(n=600, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(0, 10, n), rng.uniform(0, 10, n), rng.integers(0, 11, n)]).astype(float)


def test_numpy_pandas_and_arrow_inputs_give_the_same_release(test_seed):
    X = _X()
    y = np.where(X[:, 0] > 5, "hi", "lo")
    a = release_dprp(X, y, labels="private", classes=["lo", "hi"], **ARGS)
    sprandom.reset_test_counter()
    t = pa.table({"x0": X[:, 0], "x1": X[:, 1], "x2": X[:, 2], "y": y})
    b = release_dprp(t, columns=["x0", "x1", "x2"], label="y", labels="private", classes=["lo", "hi"], **ARGS)
    sprandom.reset_test_counter()
    c = release_dprp_array(t.to_pandas(), columns=["x0", "x1", "x2"], label="y", labels="private",
                           classes=["lo", "hi"], **ARGS)
    assert a.engine == b.engine == c.engine == "local" and isinstance(a.df, pa.Table)
    assert a.df.equals(b.df) and b.df.equals(c.df)
    Xa, ya = table_arrays(a)
    assert Xa.shape == X.shape and set(ya) <= {"lo", "hi"}
    assert (Xa >= 0).all() and (Xa <= 10).all()
    assert a.public["labels"] == "private" and "class_sizes" not in a.public
    assert a.epsilon <= 2.0 * (1 + 1e-3) and a.event == b.event


def test_integer_columns_keep_their_type_and_labels_are_decoded_to_the_classes(test_seed):
    X = _X()
    t = pa.table({"a": X[:, 0], "b": X[:, 1], "n": pa.array(X[:, 2].astype(np.int32)),
                  "k": pa.array(np.arange(600)), "lab": pa.array((X[:, 0] > 5).astype(np.int16))})
    r = release_dprp(t, columns=["a", "b", "n"], label="lab", labels="public", classes=["0", "1"],
                     keep_columns=["k"], **ARGS)
    assert r.df.column_names == ["k", "a", "b", "n", "lab"]
    assert r.df.schema.field("n").type == pa.int32() and r.df.schema.field("lab").type == pa.int16()
    assert r.df.column("k").equals(t.column("k"))  # declared public: copied unchanged
    assert r.df.column("lab").equals(t.column("lab"))  # public labels are released as they are
    n1 = int((X[:, 0] > 5).sum())
    assert r.public["class_sizes"] == {"0": 600 - n1, "1": n1}
    assert r.public["parameters"]["classes"] == [0, 1]  # coerced to the column's type
    assert r.public["integer_columns_rounded"] == [2]


def test_label_errors_name_the_column():
    t = pa.table({"a": [1.0, 2.0] * 50, "lab": ["u", "v"] * 50})
    with pytest.raises(InputError, match="label column 'lab' holds a value that is not a declared class"):
        release_dprp(t, columns=["a"], label="lab", labels="private", classes=["u", "w"], **dict(ARGS, lower=[0],
                                                                                                 upper=[3]))
    with pytest.raises(ParameterError, match="declared classes .* do not match the type int64"):
        release_dprp(t.set_column(1, "lab", pa.array([0, 1] * 50)), columns=["a"], label="lab", labels="private",
                     classes=["u", "w"], **dict(ARGS, lower=[0], upper=[3]))
    with pytest.raises(ParameterError, match="label column 'nope' is not in the input"):
        release_dprp(t, columns=["a"], label="nope", labels="private", classes=["u", "v"],
                     **dict(ARGS, lower=[0], upper=[3]))


def test_dp_mean_pass_is_planned_and_reserved_and_infinities_are_missing_values(tmp_path):
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=2.05, delta=1e-4)
    X = _X()
    X[::9, 1] = np.nan
    r = release_dprp(X, fill="dp-mean", ledger=url, table_id="t", **ARGS)
    # three Gaussian steps: DP means, projection, Gram; the receipt's epsilon is that of the events
    assert len(r.event.events) == 3 and r.epsilon == pytest.approx(epsilon_of(r.event, 1e-5))
    mu = core.split_budget(2.0, 1e-5, core.DEFAULT_BUDGET_SPLIT, core.DEFAULT_IMPUTE_SHARE)
    assert [e.noise_multiplier for e in r.event.events] == [1 / mu["impute"], 1 / mu["projection"], 1 / mu["gram"]]
    Xo, _ = table_arrays(r)
    assert np.isfinite(Xo).all()
    r.write(str(tmp_path / "rel"))
    rec = json.loads((tmp_path / "rel" / "_privacy_receipt.json").read_text())
    assert rec["mechanism"] == "dprp" and rec["mechanism_details"]["parameters"]["fill"] == "dp-mean"
    assert rec["mechanism_details"]["impute_noise"]["kind"] == "discrete_gaussian"
    assert pq.read_table(tmp_path / "rel").num_rows == 600
    # the budget left is too little (the ledger composes both releases): refused before any value is read (the
    # infinite value would be an InputError when read; the refusal comes first)
    X[3, 0] = np.inf
    with pytest.raises(BudgetExceededError):
        release_dprp(X, fill="dp-mean", ledger=url, table_id="t", **ARGS)
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=10.0, delta=1e-4)
    # within the budget the infinite value is a missing value like a null: filled by the DP means
    r = release_dprp(X, fill="dp-mean", ledger=url, table_id="t", **ARGS)
    assert np.isfinite(table_arrays(r)[0]).all()
    assert r.diagnostics()["missing_values_replaced"] == int((~np.isfinite(X)).sum())  # the nulls and the inf
    r.write(str(tmp_path / "rel2"))
    with open_ledger(url) as led:
        assert [e["state"] for e in led.status("t").entries] == ["committed", "committed"]


def test_event_record_options_are_refused_for_a_table_and_table_options_need_bounds():
    with pytest.raises(ParameterError, match="'threshold' parameter of release_dprp applies to bounded event"):
        release_dprp(_X(), threshold=0.5, **ARGS)
    with pytest.raises(ParameterError, match="needs declared public per-column bounds"):
        release_dprp(_X(), epsilon=1.0, delta=1e-5)
    with pytest.raises(ParameterError, match="'lower' parameter of release_dprp must have one value, or one per"):
        release_dprp(_X(), **dict(ARGS, lower=[0.0, 0.0]))
    with pytest.raises(ParameterError, match="unknown parameter 'k3'"):
        release_dprp(_X(), k3=2, **ARGS)
