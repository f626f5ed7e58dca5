"""DPGMSynthesizer: the DPGM release as a scikit-learn estimator over in-memory data."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.base import clone

from sparkpriv.errors import ParameterError
from sparkpriv.estimators import DPGMSynthesizer
from sparkpriv.mechanisms import dpgm
from sparkpriv.privacy.random import insecure_fixed_seed

FAST = dict(epsilon=4.0, delta=1e-5, k=2, sampling_rate=0.2, epochs=1, hidden=3, chains=10,
            kmeans_iterations=2, accountant="rdp")


def _X(n=300, d=5, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.random((n, d)) < np.where(np.arange(n)[:, None] % 2 == 0, 0.8, 0.1)).astype(np.float64)


def test_defaults_are_the_mechanisms_and_clone_keeps_the_parameters():
    est = DPGMSynthesizer()
    params = est.get_params()
    defaults = {f.name: f.default for f in dataclasses.fields(dpgm.DPGMParams)
                if f.default is not dataclasses.MISSING}
    for name, value in params.items():
        if name in ("ledger", "table_id", "epsilon", "delta"):
            continue
        assert value == defaults[name], name  # the release's own defaults, not a second copy that drifts
    # and every release parameter can be set (neighbors: DPGM offers replace-one only)
    assert set(defaults) - set(params) <= {"neighbors"}, sorted(set(defaults) - set(params))
    est = DPGMSynthesizer(**FAST)
    c = clone(est)
    assert c is not est and c.get_params() == est.get_params()
    assert est.set_params(k=3) is est and est.k == 3 and est.get_params()["k"] == 3


def test_fit_sample_numpy_shapes_dtype_and_reproducible_seed():
    X = _X()
    est = DPGMSynthesizer(**FAST)
    with insecure_fixed_seed(5):
        assert est.fit(X) is est
    assert est.n_features_in_ == 5 and est.cluster_sizes_.shape == (2,) and est.cluster_centers_.shape == (2, 5)
    assert not hasattr(est, "feature_names_in_")
    S = est.sample(400, seed=1)
    assert isinstance(S, np.ndarray) and S.shape == (400, 5) and S.dtype == np.float64
    assert set(np.unique(S)) <= {0.0, 1.0}  # the RBM's binary records
    np.testing.assert_array_equal(S, est.sample(400, seed=1))
    assert not np.array_equal(S, est.sample(400, seed=2))
    assert est.sample(0, seed=1).shape == (0, 5)
    # the sample is the released model's synthesis (post-processing of model_ only)
    np.testing.assert_array_equal(S, dpgm.synthesize(est.model_, 400, 1))
    # an integer array gives integer rows
    est_i = DPGMSynthesizer(**FAST).fit(X.astype(np.int32))
    Si = est_i.sample(50, seed=1)
    assert Si.dtype == np.int32 and set(np.unique(Si)) <= {0, 1}


def test_pandas_and_arrow_keep_their_type_and_column_names():
    X = _X()
    names = ["tower_a", "tower_b", "tower_c", "tower_d", "tower_e"]
    df = pd.DataFrame(X, columns=names)
    est = DPGMSynthesizer(**FAST).fit(df)
    S = est.sample(123, seed=4)
    assert isinstance(S, pd.DataFrame) and list(S.columns) == names and S.shape == (123, 5)
    assert list(est.feature_names_in_) == names
    pd.testing.assert_frame_equal(S, est.sample(123, seed=4))
    table = pa.table({c: X[:, j] for j, c in enumerate(names)}).append_column("other", pa.array(["x"] * len(X)))
    est_t = DPGMSynthesizer(columns=names[:3], **FAST).fit(table)
    T = est_t.sample(10, seed=4)
    assert isinstance(T, pa.Table) and T.column_names == names[:3] and T.num_rows == 10
    assert est_t.n_features_in_ == 3


def test_the_fit_is_release_dpgm_for_the_same_test_seed():
    """The estimator's release IS release_dpgm: the same model for the same (fixed, test-only) secrets."""
    from sparkpriv.api import release_dpgm

    X = _X()
    with insecure_fixed_seed(9):
        est = DPGMSynthesizer(**FAST).fit(X)
    with insecure_fixed_seed(9):
        rel = release_dpgm(X, **FAST)
    np.testing.assert_array_equal(est.model_.thetas, rel.model.thetas)
    np.testing.assert_array_equal(est.model_.sizes, rel.model.sizes)
    np.testing.assert_array_equal(est.model_.centers, rel.model.centers)
    assert est.epsilon_ == rel.epsilon and est.delta_ == rel.delta
    with insecure_fixed_seed(10):  # and another seed gives another model (the comparison can fail)
        other = DPGMSynthesizer(**FAST).fit(X)
    assert not np.array_equal(other.model_.thetas, rel.model.thetas)


def test_receipt_states_at_most_the_request_and_the_ledger_records_the_fit(tmp_path):
    from sparkpriv.ledger import open_ledger

    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("people", epsilon=10.0, delta=1e-4)
    est = DPGMSynthesizer(ledger=url, table_id="people", **FAST).fit(_X())
    r = est.release_.receipt()
    assert r["mechanism"] == "dpgm" and r["guarantee"]["epsilon"] == est.epsilon_ <= FAST["epsilon"]
    assert r["guarantee"]["delta"] <= FAST["delta"]
    with open_ledger(url) as led:
        entries = led.status("people").entries
    assert len(entries) == 1
    est.release_.write(str(tmp_path / "rel"))
    assert (tmp_path / "rel" / dpgm.MODEL_FILE).exists()


@pytest.mark.parametrize("change,name", [
    (dict(k=1), "'k'"), (dict(model="gan"), "'model'"), (dict(clip=-1.0), "'clip'"),
    (dict(sampling_rate=0.0), "'sampling_rate'"), (dict(epsilon=0.0), "'epsilon'"),
    (dict(kmeans_share=1.5), "'kmeans_share'"), (dict(length_share=1.0), "'length_share'"),
    (dict(model="vae", length_share=0.1), "'length_share'"),
])
def test_bad_parameters_are_refused_naming_them(change, name):
    est = DPGMSynthesizer(**{**FAST, **change})
    with pytest.raises(ParameterError, match=name):
        est.fit(_X())
    assert not hasattr(est, "model_")


def test_unfitted_sample_and_bad_inputs_are_refused():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        DPGMSynthesizer().sample(5)
    with pytest.raises(ParameterError, match="in-memory"):
        DPGMSynthesizer(**FAST).fit({"a": [0, 1]})
    est = DPGMSynthesizer(**FAST).fit(_X())
    for bad in (-1, 2.5, True):
        with pytest.raises(ParameterError, match="'n'"):
            est.sample(bad)


def test_sample_keeps_the_source_column_types():
    """A pandas table of int, boolean and double columns gives synthetic rows of those dtypes."""
    X = _X()
    df = pd.DataFrame({"i": X[:, 0].astype(np.int32), "b": X[:, 1] > 0.5, "x": X[:, 2], "l": X[:, 3].astype(np.int64)})
    est = DPGMSynthesizer(**FAST).fit(df)
    S = est.sample(200, seed=3)
    assert list(S.columns) == ["i", "b", "x", "l"]
    assert [str(t) for t in S.dtypes] == ["int32", "bool", "float64", "int64"]
    assert set(S["i"].unique()) <= {0, 1} and set(S["l"].unique()) <= {0, 1}
    t = DPGMSynthesizer(**FAST).fit(pa.Table.from_pandas(df, preserve_index=False)).sample(5, seed=3)
    assert [str(f.type) for f in t.schema] == ["int32", "bool", "double", "int64"]
