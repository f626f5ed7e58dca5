"""The one release path on the local engine: the same Release, receipt, ledger and atomic write."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkpriv.api import release, release_kmeans
from sparkpriv.errors import BudgetExceededError, InputError, OutputExistsError, ParameterError
from sparkpriv.mechanisms.protocol import get_mechanism, option_table


def _X(n=900, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3))


ARGS = dict(k=3, epsilon=1.0, delta=1e-5, iterations=2, variant="linear", row_bound=4.0)


def test_unknown_parameter_refused_in_one_place():
    with pytest.raises(ParameterError, match="unknown parameter 'iteration'"):
        release_kmeans(_X(), **dict(ARGS, iteration=3))


def test_refused_relation_names_the_reason():
    with pytest.raises(ParameterError, match="cannot be 'add-remove' for DP k-means: its public parameters include n"):
        release_kmeans(_X(), **dict(ARGS, neighbors="add-remove"))
    with pytest.raises(ParameterError, match="must be one of 'replace-one'"):
        release_kmeans(_X(), **dict(ARGS, neighbors="everyone"))


def test_pandas_and_arrow_inputs_give_the_array_result(test_seed):
    import pandas as pd

    from sparkpriv.privacy import random as sprandom

    X = _X()
    a = release_kmeans(X, **ARGS)
    sprandom.reset_test_counter()
    b = release_kmeans(pd.DataFrame(X, columns=list("abc")), columns=["a", "b", "c"], **ARGS)
    sprandom.reset_test_counter()
    c = release_kmeans(pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2]}), columns=["a", "b", "c"], **ARGS)
    np.testing.assert_array_equal(a.model.centers, b.model.centers)
    np.testing.assert_array_equal(a.model.centers, c.model.centers)
    assert a.engine == "local" and isinstance(a.df, pa.Table) and a.df.num_rows == 3


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
def test_nulls_and_non_finite_values_are_replaced_by_the_public_fill(bad):
    """Never an error (which would depend on one record): the same release as the table with the
    public replacement written in (0.0 without a box or a fill; the declared fill otherwise)."""
    from sparkpriv.privacy.random import insecure_fixed_seed

    def table(v):
        return pa.table({"a": pa.array([1.0, v] * 500, pa.float64()), "b": [0.0, 1.0] * 500})

    for fill, expect in ((None, 0.0), (2.5, 2.5)):
        extra = {} if fill is None else {"fill": fill}
        with insecure_fixed_seed(7):
            r = release_kmeans(table(bad), columns=["a", "b"], **extra, **ARGS)
        with insecure_fixed_seed(7):
            r0 = release_kmeans(table(expect), columns=["a", "b"], **ARGS)
        np.testing.assert_array_equal(r.model.centers, r0.model.centers)
        assert r.diagnostics()["missing_values_replaced"] == 500
        assert "replaced by " + repr(expect) in r.receipt()["input"]["missing_values"]
        assert r.public["parameters"]["fill"] == fill


def test_write_is_atomic_with_receipt_in_the_footer(tmp_path):
    r = release_kmeans(_X(), **ARGS)
    out = r.write(str(tmp_path / "rel"))
    files = set(os.listdir(tmp_path / "rel"))
    assert {"_privacy_receipt.json", "_kmeans_model.json", "_SUCCESS", "part-00000.parquet"} <= files
    rec = json.loads((tmp_path / "rel" / "_privacy_receipt.json").read_text())
    footer = json.loads(pq.read_metadata(tmp_path / "rel" / "part-00000.parquet").metadata[b"sparkpriv.receipt"])
    assert footer["events"] == rec["events"] and out == f"file:{tmp_path}/rel"
    assert rec["output"]["path"] == "rel" and rec["output"]["local"]  # never the absolute path
    assert [f["name"] for f in rec["output"]["schema"]] == ["cluster", "count", "reliable", "center",
                                                            "feature_center"]
    with pytest.raises(OutputExistsError):
        release_kmeans(_X(), **ARGS).write(str(tmp_path / "rel"))
    assert not [f for f in os.listdir(tmp_path) if "staging" in f]


def test_ledger_reserves_before_reading_and_commits(tmp_path):
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=1.1, delta=1e-4)
    r = release_kmeans(_X(), ledger=url, table_id="t", **ARGS)
    r.write(str(tmp_path / "rel"))
    # the second release would exceed the budget: refused before any value is read (a NaN in
    # the data would raise an InputError when read; the refusal comes first)
    X = _X()
    X[5, 1] = np.nan
    with pytest.raises(BudgetExceededError):
        release_kmeans(X, ledger=url, table_id="t", **ARGS)
    with open_ledger(url) as led:
        states = [e["state"] for e in led.status("t").entries]
    assert states == ["committed"]


def test_a_failed_run_is_charged(tmp_path, monkeypatch):
    """The issue's reproduction: an infinite value no longer fails the release (it is replaced); a run
    that fails after its reservation for any reason keeps the reservation spent (docs/privacy.md)."""
    from sparkpriv.ledger import open_ledger
    from sparkpriv.local.engine import LocalSource

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=5.0, delta=1e-4)
    X = _X()
    X[5, 1] = np.inf
    rel = release_kmeans(X, ledger=url, table_id="t", **ARGS)
    rel.write(str(tmp_path / "out"))
    with open_ledger(url) as led:
        spent_one = led.status("t").spent_epsilon
    assert spent_one > 0

    def boom(self, *a, **k):
        raise MemoryError("lost the executor")
        yield  # pragma: no cover

    monkeypatch.setattr(LocalSource, "blocks", boom)
    with pytest.raises(MemoryError):
        release_kmeans(_X(), ledger=url, table_id="t", **ARGS)
    with open_ledger(url) as led:
        st = led.status("t")
    assert [e["state"] for e in st.entries] == ["committed", "committed"]
    assert st.entries[1]["receipt_summary"]["failed"] == "kmeans failed: MemoryError"
    assert st.spent_epsilon > spent_one


def test_option_table_is_generated_from_the_params():
    table = option_table(get_mechanism("kmeans"))
    assert "| `--k` | `k` | int | required |" in table
    assert "| `--variant` | `variant` | linear, kernel | `kernel` |" in table
    assert "| `--neighbors` | `neighbors` | replace-one | `replace-one` |" in table
    assert "(Python only) | `init`" in table


def test_release_by_name_is_the_same_path(test_seed):
    from sparkpriv.privacy import random as sprandom

    a = release("kmeans", _X(), **ARGS)
    sprandom.reset_test_counter()
    b = release_kmeans(_X(), **ARGS)
    np.testing.assert_array_equal(a.model.centers, b.model.centers)
    assert a.events == b.event and a.epsilon == b.epsilon


def test_progress_steps_reach_the_caller_and_the_log(caplog):
    import io

    from sparkpriv.cli import ProgressBar

    caplog.set_level("INFO", logger="sparkpriv.kmeans")
    buf = io.StringIO()
    bar = ProgressBar(buf, width=10)
    release_kmeans(_X(), on_step=bar, **dict(ARGS, iterations=3))
    bar.close()
    frames = buf.getvalue().split("\r")[1:]
    assert [f.split("] ")[1].split(" ")[0] for f in frames] == ["1/3", "2/3", "3/3"]
    assert frames[-1].startswith("kmeans iteration [##########]") and buf.getvalue().endswith("\n")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kmeans iteration")]
    assert len(lines) == 3 and "release epsilon" in lines[-1]


def test_numpy_columns_named_in_the_recorded_parameters():
    r = release_kmeans(_X(), **ARGS)
    assert r.public["parameters"]["columns"] == ["x0", "x1", "x2"]
