"""scikit-learn estimators over the one release path (in-memory data, the local engine).

``DPKMeans`` follows scikit-learn's API (``get_params``/``set_params`` from the
constructor, ``fit`` returns ``self``, fitted attributes end in ``_``, usable
in a :class:`sklearn.pipeline.Pipeline` and with :func:`sklearn.base.clone`),
as diffprivlib's estimators do. Each ``fit`` is one release of the mechanism:
it spends ``(epsilon, delta)`` of the data it is given (and records it in a
ledger when ``table_id`` is set), and keeps the whole
:class:`~sparkpriv.release.Release` as ``release_`` (receipt, events, ``write``).

Do not fit a scaler on the private data in front of it: bounds learned from
the data are not private. Declare the bounds (``lower``/``upper``/
``row_bound``), or scale with constants (``FunctionTransformer``).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from sparkpriv.api import release_kmeans

__all__ = ["DPKMeans"]


class DPKMeans(ClusterMixin, TransformerMixin, BaseEstimator):
    """Differentially private k-means (docs/kmeans.md) as a scikit-learn estimator.

    Parameters are those of :func:`sparkpriv.api.release_kmeans` with
    scikit-learn's name ``n_clusters`` for ``k``; ``ledger``/``table_id``
    record the spend of each ``fit``.

    Attributes
    ----------
    model_ : KMeansModel
        The released (public) model.
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Its noisy centres in input space.
    labels_ : ndarray of shape (n_samples,)
        The nearest reliable released cluster of each row given to ``fit``:
        a function of the public model and YOUR data, so NOT private output
        (for your own analysis; never publish it).
    epsilon_, delta_ : float
        What the fit spent (dp_accounting on the recorded events).
    release_ : Release
        The whole release (receipt, events; ``release_.write(path)``).
    n_features_in_ : int
    """

    def __init__(self, n_clusters: int = 8, *, epsilon: float = 1.0, delta: float = 1e-6, iterations: int = 10,
                 variant: str = "kernel", row_bound=None, lower=None, upper=None, kernel_width=None,
                 frequencies: int = 128, init=None, final_share=None, reliability_stds: float = 3.0,
                 ledger=None, table_id=None):
        self.n_clusters = n_clusters
        self.epsilon = epsilon
        self.delta = delta
        self.iterations = iterations
        self.variant = variant
        self.row_bound = row_bound
        self.lower = lower
        self.upper = upper
        self.kernel_width = kernel_width
        self.frequencies = frequencies
        self.init = init
        self.final_share = final_share
        self.reliability_stds = reliability_stds
        self.ledger = ledger
        self.table_id = table_id

    def fit(self, X, y=None):
        """Release a private clustering of ``X`` (spends epsilon, delta); returns self."""
        rel = release_kmeans(
            X, k=self.n_clusters, epsilon=self.epsilon, delta=self.delta, iterations=self.iterations,
            variant=self.variant, row_bound=self.row_bound, lower=self.lower, upper=self.upper,
            kernel_width=self.kernel_width, frequencies=self.frequencies, init=self.init,
            final_share=self.final_share, reliability_stds=self.reliability_stds, ledger=self.ledger,
            table_id=self.table_id, source="DPKMeans.fit")
        self.release_ = rel
        self.model_ = rel.model
        self.cluster_centers_ = rel.model.centers
        self.epsilon_, self.delta_ = rel.epsilon, rel.delta
        self.n_features_in_ = rel.model.centers.shape[1]
        self.labels_ = rel.model.predict(np.asarray(X, dtype=np.float64))
        return self

    def predict(self, X):
        """The nearest reliable released cluster of each row (post-processing of the model)."""
        check_is_fitted(self, "model_")
        return self.model_.predict(np.asarray(X, dtype=np.float64))

    def transform(self, X):
        """Euclidean distances of each row to every released centre, shape (n_samples, n_clusters)."""
        check_is_fitted(self, "model_")
        X = np.asarray(X, dtype=np.float64)
        C = self.cluster_centers_
        d2 = (X * X).sum(1)[:, None] - 2 * X @ C.T + (C * C).sum(1)[None, :]
        return np.sqrt(np.maximum(d2, 0.0))
