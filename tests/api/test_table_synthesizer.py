"""DPTableSynthesizer: the synthetic person x item table release as a scikit-learn estimator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from sparkpriv.api import release_synthetic
from sparkpriv.errors import ParameterError
from sparkpriv.estimators import DPTableSynthesizer
from sparkpriv.ledger import open_ledger
from sparkpriv.mechanisms.synthetic import SyntheticParams
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.random import insecure_fixed_seed


def _X(n=3000, d=40, seed=3):
    """People of two kinds (items 0-9 or 10-19 popular), everyone a few of 20-39."""
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 2, n)
    p = np.full((n, d), 0.03)
    p[kind == 0, :10] = 0.4
    p[kind == 1, 10:20] = 0.4
    return (rng.random((n, d)) < p).astype(np.float64)


def test_defaults_are_the_mechanisms_and_clone_keeps_the_parameters():
    est = DPTableSynthesizer()
    params = est.get_params()
    defaults = {f.name: f.default for f in dataclasses.fields(SyntheticParams) if f.default is not dataclasses.MISSING}
    for name, value in params.items():
        if name in ("ledger", "table_id", "epsilon", "delta", "max_items"):
            continue
        assert value == defaults[name], name  # the release's own defaults, not a second copy that drifts
    assert set(defaults) <= set(params), sorted(set(defaults) - set(params))  # every release parameter settable
    assert params["max_items"] == "auto"
    c = clone(DPTableSynthesizer(epsilon=2.0, anchors=8))
    assert c.get_params()["epsilon"] == 2.0 and c.get_params()["anchors"] == 8
    assert c.set_params(anchor_share=0.3) is c and c.anchor_share == 0.3


def test_fit_is_the_release_and_sample_the_models_synthesis():
    X = sparse.csr_matrix(_X())
    est = DPTableSynthesizer(epsilon=2.0, delta=1e-6)
    with insecure_fixed_seed(5):
        assert est.fit(X) is est
    with insecure_fixed_seed(5):
        rel = release_synthetic(X, epsilon=2.0, delta=1e-6)
    # the same release: one path, the same (fixed) secrets
    np.testing.assert_array_equal(est.model_.counts, rel.model.counts)
    np.testing.assert_array_equal(est.model_.lengths, rel.model.lengths)
    assert est.epsilon_ == rel.epsilon <= 2.0 and est.delta_ == 1e-6
    assert est.max_items_ == rel.public["contribution_bound_estimation"]["chosen_max_items"]
    assert est.n_features_in_ == 40 and not hasattr(est, "feature_names_in_")
    S = est.sample(500, seed=1)
    assert sparse.isspmatrix_csr(S) and S.shape == (500, 40)
    np.testing.assert_array_equal(S.toarray(), rel.model.sample(500, 1).toarray())  # post-processing of model_
    np.testing.assert_array_equal(S.toarray(), est.sample(500, seed=1).toarray())
    assert (S != est.sample(500, seed=2)).nnz > 0
    assert est.sample(0, seed=1).shape == (0, 40)
    # fresh entropy by default: two unseeded samples differ
    assert (est.sample(500) != est.sample(500)).nnz > 0
    # the kinds of people come back: items 0-9 go together, and not with 10-19
    Y = est.sample(20000, seed=3).toarray()
    a, b = Y[:, :10].sum(axis=1) > 0, Y[:, 10:20].sum(axis=1) > 0
    assert Y[a, :10].mean() > 1.5 * Y[~a, :10].mean() and (a & b).mean() < a.mean() * b.mean() * 1.5


def test_numpy_and_pandas_tables_come_back_as_they_went_in():
    X = _X(n=2000)
    est = DPTableSynthesizer(epsilon=4.0, delta=1e-6)
    with insecure_fixed_seed(6):
        est.fit(X.astype(np.int8))
    S = est.sample(300, seed=1)
    assert isinstance(S, np.ndarray) and S.dtype == np.int8 and S.shape == (300, 40)
    assert set(np.unique(S)) <= {0, 1}
    np.testing.assert_array_equal(S, est.model_.sample(300, 1).toarray())
    cols = [f"item_{j}" for j in range(40)]
    df = pd.DataFrame(X.astype(bool), columns=cols)
    with insecure_fixed_seed(6):
        est.fit(df)
    assert list(est.feature_names_in_) == cols
    D = est.sample(200, seed=4)
    assert isinstance(D, pd.DataFrame) and list(D.columns) == cols and D.dtypes.iloc[0] == bool
    with insecure_fixed_seed(6):
        est.fit(X)  # refitting on an array forgets the names
    assert not hasattr(est, "feature_names_in_")


def test_refusals_name_the_parameter_before_any_data_is_read():
    with pytest.raises(NotFittedError):
        DPTableSynthesizer().sample(10)
    with pytest.raises(ParameterError, match="epsilon"):
        DPTableSynthesizer(epsilon=-1.0).fit(_X(n=50))
    with pytest.raises(ParameterError, match="anchor_share"):
        DPTableSynthesizer(anchor_share=1.5).fit(_X(n=50))
    with pytest.raises(ParameterError, match="max_items"):
        DPTableSynthesizer(max_items=0).fit(_X(n=50))
    with pytest.raises(ParameterError, match="2-D"):
        DPTableSynthesizer().fit(np.zeros((2, 3, 4)))
    with pytest.raises(ParameterError, match="person x item table"):
        DPTableSynthesizer().fit("events.parquet")
    est = DPTableSynthesizer(epsilon=4.0)
    with insecure_fixed_seed(1):
        est.fit(_X(n=500))
    for bad in (-1, 2.5, True):
        with pytest.raises(ParameterError, match="'n' parameter"):
            est.sample(bad)


def test_a_fit_with_a_ledger_records_its_spend(tmp_path):
    url = f"sqlite:///{tmp_path}/l.sqlite"
    with open_ledger(url) as led:
        led.set_budget("shop.baskets", epsilon=3.0, delta=1e-5)
    est = DPTableSynthesizer(epsilon=1.0, delta=1e-6, ledger=url, table_id="shop.baskets")
    est.fit(_X(n=1000))
    with open_ledger(url) as led:
        st = led.status("shop.baskets")
    # the ledger states the spend at the budget's delta (1e-5), the estimator at the release's (1e-6)
    assert len(st.entries) == 1
    assert st.entries[0]["epsilon"] == pytest.approx(epsilon_of(est.release_.event, 1e-5))
    assert st.entries[0]["parameters"]["contribution_bound"]["max_items"] == "auto"
