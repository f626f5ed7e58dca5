"""The projection mechanism on the one release path (local engine): the same noise as the former
numpy release for a test seed, the DP row bound's spend reserved before any value is read, refusals
from the schema only, the CLI's key file."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from sparkpriv.api import release_projection, release_projection_array
from sparkpriv.errors import BudgetExceededError, InputError, ParameterError, SchemaError
from sparkpriv.mechanisms.projection import NOISE_STAGE, draw_projection_matrix, plan_projection, project_rows
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.random import derive_seed, stream


def _X(n=2000, d=5, seed=0):
    return np.random.default_rng(seed).normal(0, 1.0, size=(n, d))


def test_same_matrix_and_noise_as_the_former_numpy_release(test_seed):
    """The n-th secret of a purpose is derive_seed(seed, purpose#n): P first, then the noise
    seed; one partition (0) on the local engine. The reference is computed here from the core
    functions, as the former release_projection_array did (whole matrix, one stream)."""
    X = _X()
    X_before = X.copy()
    rel = release_projection_array(X, k=3, epsilon=1.0, row_bound=2.0)
    np.testing.assert_array_equal(X, X_before)  # the engine reads the user's rows, never writes them
    P = draw_projection_matrix(5, 3, derive_seed(test_seed, "projection-matrix#1"))
    plan = plan_projection(P, Bounds(5, row_bound=2.0), epsilon=1.0)
    Y, _ = project_rows(X, P, plan.bounds, plan.value_bound)
    ref = nz.add_noise(Y, plan.noise, stream(derive_seed(test_seed, "projection-noise#2"), NOISE_STAGE, 0))
    np.testing.assert_array_equal(rel.to_numpy(), ref)
    assert rel.df.column_names == ["z0", "z1", "z2"] and rel.engine == "local"
    assert rel.public["noise"] == plan.noise.to_public_dict()
    assert rel.epsilon == epsilon_of(plan.dp_event(), 0.0) and rel.event == plan.dp_event()
    assert rel.plan.noise == plan.noise  # the public calibration
    assert rel.diagnostics() == {"rows": 2000, "rows_box_clipped": 0,
                                 "rows_norm_clipped": int((np.linalg.norm(X, axis=1) > 2.0).sum())}


def test_numpy_pandas_and_arrow_give_the_same_release(test_seed):
    import pandas as pd

    from sparkpriv.privacy import random as sprandom

    X = _X(300, 3)
    a = release_projection(X, k=2, epsilon=1.0, lower=-2.0, upper=2.0)
    sprandom.reset_test_counter()
    b = release_projection(pd.DataFrame(X, columns=list("abc")), columns=list("abc"), k=2, epsilon=1.0,
                           lower=-2.0, upper=2.0)
    sprandom.reset_test_counter()
    t = pa.table({"id": np.arange(300), "a": X[:, 0], "b": X[:, 1], "c": X[:, 2]})
    c = release_projection(t, columns=list("abc"), keep_columns=["id"], k=2, epsilon=1.0, lower=-2.0, upper=2.0)
    np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
    np.testing.assert_array_equal(a.to_numpy(), c.to_numpy(["z0", "z1"]))
    assert c.df.column_names == ["id", "z0", "z1"] and c.df.column("id").to_pylist() == list(range(300))


def test_row_bound_quantile_spend_is_reserved_before_reading(tmp_path):
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("t", epsilon=1.5, delta=0.0)
    X = _X(4000, 4)
    X *= (3.0 / np.linalg.norm(X, axis=1))[:, None]  # every row has norm 3 -> candidate 4
    rel = release_projection(X, k=2, epsilon=1.0, row_bound_quantile=0.9, bound_epsilon_share=0.25,
                             ledger=url, table_id="t")
    assert rel.public["row_bound_estimation"]["chosen_row_bound"] == 4.0
    assert rel.public["bounds"]["row_bound"] == 4.0
    assert rel.public["parameters"]["bounds"]["row_bound"] == "DP quantile 0.9"
    assert rel.event.__class__.__name__ == "ComposedDpEvent" and rel.epsilon <= 1.0
    with open_ledger(url) as led:
        (entry,) = led.status("t").entries
    assert entry["state"] == "reserved"
    assert entry["epsilon"] == pytest.approx(1.0, rel=1e-9)  # histogram + projection, not 0.75
    rel.write(str(tmp_path / "out"))
    # 0.5 left: the next release (histogram included) is refused before any value is read
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(BudgetExceededError):
        release_projection(bad, k=2, epsilon=0.6, row_bound_quantile=0.9, ledger=url, table_id="t")
    # within the budget, the NaN is replaced by the public fill (0.0: no box): released and charged
    rel = release_projection(bad, k=2, epsilon=0.4, row_bound_quantile=0.9, ledger=url, table_id="t")
    assert rel.diagnostics()["missing_values_replaced"] == 1
    rel.write(str(tmp_path / "out2"))
    with open_ledger(url) as led:
        assert [e["state"] for e in led.status("t").entries] == ["committed", "committed"]


def test_refusals_come_from_the_schema_and_parameters_only():
    t = pa.table({"id": [1, 2], "a": [np.nan, 1.0], "b": [1.0, 2.0]})  # a NaN: reading it would fail
    with pytest.raises(SchemaError, match="kept \\(public\\) column 'nope' is not in the input"):
        release_projection(t, columns=["a", "b"], keep_columns=["nope"], k=1, epsilon=1.0, row_bound=1.0)
    with pytest.raises(ParameterError, match="both a feature column and a kept public column"):
        release_projection(t, columns=["a", "b"], keep_columns=["a"], k=1, epsilon=1.0, row_bound=1.0)
    with pytest.raises(ParameterError, match="'k' parameter"):
        release_projection(t, columns=["a", "b"], k=3, epsilon=1.0, row_bound=1.0)
    with pytest.raises(ParameterError, match="keep_columns needs a pandas or Arrow table"):
        release_projection(np.ones((3, 2)), keep_columns=["x0"], k=1, epsilon=1.0, row_bound=1.0)
    with pytest.raises(ParameterError, match="unknown parameter 'rowbound'"):
        release_projection(t, columns=["a", "b"], k=1, epsilon=1.0, rowbound=1.0)
    with pytest.raises(InputError, match="empty"):
        release_projection(np.ones((0, 2)), k=1, epsilon=1.0, row_bound=1.0)


def test_the_matrix_key_is_never_shown(tmp_path):
    key = b"S3cr3t-Pr0jection-Key-0123456789"
    with pytest.raises(ParameterError) as e:
        release_projection(_X(10, 2), k=1, epsilon=1.0, row_bound=1.0, matrix_key=key[:10])
    assert key[:10].decode() not in str(e.value)
    rel = release_projection(_X(10, 2), k=1, epsilon=1.0, row_bound=1.0, matrix_key=key)
    rel.write(str(tmp_path / "r"))
    receipt = json.loads((tmp_path / "r" / "_privacy_receipt.json").read_text())
    assert "matrix_key" not in receipt["mechanism_details"]["parameters"]
    assert receipt["mechanism_details"]["reusable_projection"] is True
    from sparkpriv.mechanisms.projection import ProjectionParams

    assert key.decode() not in repr(ProjectionParams(k=1, epsilon=1.0, matrix_key=key))
    for p in (tmp_path / "r").iterdir():
        assert key not in p.read_bytes()


def test_cli_key_file_is_the_matrix_key(tmp_path):
    from sparkpriv.config import build_config
    from sparkpriv.runner import MECHANISMS, options_for

    key = tmp_path / "k.bin"
    key.write_bytes(b"k" * 32)
    base = {"input": "x", "output": "y", "columns": "a,b", "k": "1", "epsilon": "1", "row_bound": "1"}
    spec = MECHANISMS["projection"]
    spec.precheck(build_config("projection", options_for("projection"), None,
                               dict(base, matrix_key_file=str(key))))
    key.write_bytes(b"short")
    with pytest.raises(ParameterError, match="at least 16 bytes"):
        spec.precheck(build_config("projection", options_for("projection"), None,
                                   dict(base, matrix_key_file=str(key))))
    with pytest.raises(ParameterError, match="Gaussian noise needs a delta"):
        spec.precheck(build_config("projection", options_for("projection"), None, dict(base, noise="gaussian")))
    with pytest.raises(ParameterError, match="do not apply to --events"):
        spec.precheck(build_config("projection", options_for("projection"), None, dict(base, events=True)))
