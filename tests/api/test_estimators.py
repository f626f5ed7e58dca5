"""DPKMeans follows scikit-learn's estimator conventions and is the one k-means release."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

from sparkpriv.estimators import DPKMeans
from sparkpriv.mechanisms.kmeans import clustering_accuracy
from sparkpriv.privacy.calibration import gdp_mu_for


def _blobs(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[-20.0, 0.0], [20.0, 0.0], [0.0, 25.0]])
    y = rng.integers(0, 3, n)
    return centres[y] + rng.standard_normal((n, 2)), y


def test_params_clone_and_set_params():
    est = DPKMeans(3, epsilon=2.0, delta=1e-5, variant="linear", row_bound=40.0)
    p = est.get_params()
    assert p["n_clusters"] == 3 and p["epsilon"] == 2.0 and p["variant"] == "linear"
    c = clone(est)
    assert c is not est and c.get_params() == p
    assert est.set_params(iterations=4) is est and est.iterations == 4


def test_fit_returns_self_and_clusters_in_a_pipeline(test_seed):
    X, y = _blobs()
    pipe = Pipeline([("scale", FunctionTransformer(lambda Z: Z / 10.0)),  # a PUBLIC constant, not fitted
                     ("km", DPKMeans(3, epsilon=2.0, delta=1e-5, iterations=5, variant="linear",
                                     row_bound=4.0, init=np.array([[-2.0, 0.5], [2.0, 0.5], [0.0, 2.0]])))])
    assert pipe.fit(X) is pipe
    km = pipe.named_steps["km"]
    assert km.cluster_centers_.shape == (3, 2) and km.n_features_in_ == 2
    assert clustering_accuracy(y, pipe.predict(X)) > 0.95
    np.testing.assert_array_equal(km.labels_, pipe.predict(X))
    assert pipe.transform(X).shape == (len(X), 3)
    # the fit is a release: its receipt states what was spent, at most the request
    assert km.epsilon_ <= 2.0 and km.delta_ == 1e-5
    r = km.release_.receipt()
    assert r["mechanism"] == "kmeans" and r["guarantee"]["epsilon"] == km.epsilon_
    # independent: the GDP calibration of the request, split over 5 iterations (linear: no final step)
    mu = gdp_mu_for(2.0, 1e-5)
    assert r["mechanism_details"]["gdp"]["mu_per_iteration"] == pytest.approx(mu / np.sqrt(5), rel=1e-4)


def test_unfitted_predict_is_refused():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        DPKMeans(3).predict(np.zeros((2, 2)))


def test_linear_regression_estimator_recovers_the_coefficients(test_seed):
    from sparkpriv.estimators import DPLinearRegression

    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (20000, 3)) / 2.0
    w = np.array([0.5, -0.3, 0.2])
    y = X @ w + 0.01 * rng.standard_normal(len(X))
    for est, tol in ((DPLinearRegression(lower=-0.5, upper=0.5, target_lower=-1.0, target_upper=1.0, epsilon=1.0,
                                         delta=1e-6), 0.02),
                     (DPLinearRegression(method="sketch", row_bound=1.5, epsilon=50.0, delta=1e-6, sketch_rows=2000),
                      0.1)):
        assert clone(est).get_params() == est.get_params()
        assert est.fit(X, y) is est
        np.testing.assert_allclose(est.coef_, w, atol=tol)  # independent: the generating coefficients
        assert np.all(est.ci_low_ <= est.coef_) and np.all(est.coef_ <= est.ci_high_)
        assert est.score(X, y) > 0.8 and est.epsilon_ <= est.epsilon
        assert est.predict(X[:5]).shape == (5,)
