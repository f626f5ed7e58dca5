"""scikit-learn estimators over the one release path (in-memory data, the local engine).

``DPKMeans``, ``DPLinearRegression`` and ``DPGMSynthesizer`` follow
scikit-learn's API (``get_params``/``set_params`` from the constructor,
``fit`` returns ``self``, fitted attributes end in ``_``, usable
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
from sklearn.base import BaseEstimator, ClusterMixin, RegressorMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from sparkpriv.api import release_kmeans, release_regression

__all__ = ["DPKMeans", "DPLinearRegression", "DPGMSynthesizer"]


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


class DPLinearRegression(RegressorMixin, BaseEstimator):
    """Private linear regression on a sample-mixing sketch (docs/regression.md) as an estimator.

    ``fit(X, y)`` is one release of the ``regression`` mechanism on the local
    engine: the rows ``[x, y]`` are clipped to the declared L2 bound
    ``row_bound`` (public: declare it, never compute it from the data), the
    sketch ``S [X y] + W`` is released, and the coefficients are fitted on it
    (post-processing). There is no intercept term: add a constant column to
    ``X`` (it counts in ``row_bound``). ``row_bound`` has no default: a fit
    without it is refused (a bound from the data is not private).

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    stderr_, ci_low_, ci_high_ : ndarray of shape (n_features,)
        Standard errors and ``confidence`` intervals of the coefficients.
    epsilon_, delta_ : float
        What the fit spent.
    release_ : Release
        The whole release (the private sketch, receipt; ``release_.write(path)``).
    n_features_in_ : int
    """

    def __init__(self, *, row_bound: float | None = None, epsilon: float = 1.0, delta: float = 1e-6,
                 sketch_rows=None, sketch_rule: str = "log", ridge: float = 0.0, debias: bool = True,
                 confidence: float = 0.95, ledger=None, table_id=None):
        self.row_bound = row_bound
        self.epsilon = epsilon
        self.delta = delta
        self.sketch_rows = sketch_rows
        self.sketch_rule = sketch_rule
        self.ridge = ridge
        self.debias = debias
        self.confidence = confidence
        self.ledger = ledger
        self.table_id = table_id

    def fit(self, X, y):
        """Release a private sketch of ``[X, y]`` and fit on it (spends epsilon, delta); returns self."""
        import pyarrow as pa

        from sparkpriv.errors import ParameterError

        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).ravel()
        if X.ndim != 2 or y.shape != (X.shape[0],):
            raise ParameterError(f"X must be 2-D (n_samples, n_features) and y of shape (n_samples,). Got "
                                 f"{X.shape} and {y.shape}.")
        names = [f"x{j}" for j in range(X.shape[1])]
        table = pa.table({**{c: X[:, j] for j, c in enumerate(names)}, "y": y})
        rel = release_regression(
            table, columns=names, target="y", row_bound=self.row_bound, epsilon=self.epsilon,
            delta=self.delta, sketch_rows=self.sketch_rows, sketch_rule=self.sketch_rule, ridge=self.ridge,
            debias=self.debias, confidence=self.confidence, ledger=self.ledger, table_id=self.table_id,
            source="DPLinearRegression.fit")
        fit = rel.model
        self.release_ = rel
        self.coef_ = np.asarray(fit.coef, dtype=np.float64)
        self.stderr_, self.ci_low_, self.ci_high_ = fit.stderr, fit.ci_low, fit.ci_high
        self.epsilon_, self.delta_ = rel.epsilon, rel.delta
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X):
        check_is_fitted(self, "coef_")
        return np.asarray(X, dtype=np.float64) @ self.coef_


class DPGMSynthesizer(BaseEstimator):
    """A private synthetic-data generator (the DPGM mixture, docs/dpgm.md) as an estimator.

    ``fit(X)`` is one release of the ``dpgm`` mechanism on the local engine
    (:func:`sparkpriv.api.release_dpgm`): DP k-means, then one generative model
    per cluster trained with DP-SGD. ``X`` is in-memory data (a numpy array, a
    pandas DataFrame or a pyarrow Table), one row per person, values in the
    declared box ``[0, 1]`` (binary for ``model="rbm"``). ``sample(n)`` draws
    synthetic rows from the released model: post-processing, no budget.

    Parameters are those of :class:`sparkpriv.mechanisms.dpgm.DPGMParams`
    with the same names and defaults (``k`` clusters, ``model``, the DP-SGD
    ``clip`` or quantile clipping ``clip_quantile``, ``sampling_rate``,
    ``epochs``, ...). ``columns``: the columns of a table to model (default:
    all of them; a numpy array is modelled whole).
    ``ledger``/``table_id`` record the spend of each ``fit``. Bad parameters
    are refused by ``fit`` (a :class:`~sparkpriv.errors.ParameterError`
    naming the parameter), before any data is read.

    Attributes
    ----------
    model_ : DPGMModel
        The released (public) model.
    cluster_sizes_ : ndarray of shape (k,)
        The noisy cluster sizes (clamped at 0).
    cluster_centers_ : ndarray of shape (k, n_features)
        The DP k-means centres.
    epsilon_, delta_ : float
        What the fit spent (dp_accounting on the recorded events).
    release_ : Release
        The whole release (receipt, events; ``release_.write(path)`` publishes
        it with ``_dpgm_model.npz``, which ``sparkpriv synthesize`` reads).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        The modelled columns (only when fitted on a pandas or Arrow table).
    """

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-6, k: int = 10, model: str = "rbm",
                 kmeans_share: float = 0.3, length_share=None, length_strata=None, marginal_share=None,
                 marginal_samples: int = 20_000, kmeans_iterations: int = 8,
                 row_bound=None,
                 clip: float = 10.0, clip_quantile=None, clip_lr: float = 0.2, clip_count_share: float = 0.05,
                 sampling_rate: float = 0.05, epochs: float = 20.0, min_batch=None, learning_rate=None,
                 lr_schedule: str = "constant", average_tail=None, reliability_stds: float = 3.0,
                 min_cluster_share: float = 0.01, hidden: int = 64, latent: int = 2, chains: int = 100, gibbs_steps: int = 1,
                 accountant: str = "pld", fill=None, columns=None, ledger=None, table_id=None):
        self.epsilon = epsilon
        self.delta = delta
        self.k = k
        self.model = model
        self.kmeans_share = kmeans_share
        self.length_share = length_share
        self.length_strata = length_strata
        self.marginal_share = marginal_share
        self.marginal_samples = marginal_samples
        self.kmeans_iterations = kmeans_iterations
        self.row_bound = row_bound
        self.clip = clip
        self.clip_quantile = clip_quantile
        self.clip_lr = clip_lr
        self.clip_count_share = clip_count_share
        self.sampling_rate = sampling_rate
        self.epochs = epochs
        self.min_batch = min_batch
        self.learning_rate = learning_rate
        self.lr_schedule = lr_schedule
        self.average_tail = average_tail
        self.reliability_stds = reliability_stds
        self.min_cluster_share = min_cluster_share
        self.hidden = hidden
        self.latent = latent
        self.chains = chains
        self.gibbs_steps = gibbs_steps
        self.accountant = accountant
        self.fill = fill
        self.columns = columns
        self.ledger = ledger
        self.table_id = table_id

    _RELEASE_PARAMS = ("epsilon", "delta", "k", "model", "kmeans_share", "length_share", "length_strata",
                       "marginal_share", "marginal_samples",
                       "kmeans_iterations", "row_bound", "clip",
                       "clip_quantile", "clip_lr", "clip_count_share", "sampling_rate", "epochs", "min_batch", "learning_rate",
                       "lr_schedule", "average_tail", "reliability_stds", "min_cluster_share", "hidden", "latent", "chains", "gibbs_steps",
                       "accountant", "fill")

    def fit(self, X, y=None):
        """Release a private generative model of ``X`` (spends epsilon, delta); returns self."""
        from sparkpriv.api import release_dpgm
        from sparkpriv.errors import ParameterError

        kind = _input_kind(X)
        if kind is None:
            raise ParameterError(f"DPGMSynthesizer.fit takes in-memory data (a numpy array, a pandas DataFrame or "
                                 f"a pyarrow Table); got {type(X).__name__}. For a Spark DataFrame use "
                                 "sparkpriv.api.release_dpgm and `sparkpriv synthesize`.")
        columns, dtype = self.columns, None
        if kind == "numpy":
            X = np.asarray(X)
            if X.ndim != 2:
                raise ParameterError(f"X must be a 2-D array (n_samples, n_features). Got shape {X.shape}.")
            dtype = X.dtype
        elif columns is None:  # every column of the table (its schema: public)
            columns = [str(c) for c in X.columns] if kind == "pandas" else list(X.column_names)
        params = {name: getattr(self, name) for name in self._RELEASE_PARAMS}
        rel = release_dpgm(X, columns=columns, ledger=self.ledger, table_id=self.table_id,
                           source="DPGMSynthesizer.fit", **params)
        self._kind, self._dtype = kind, dtype
        self.release_ = rel
        self.model_ = rel.model
        self.cluster_sizes_ = np.asarray(rel.model.sizes, dtype=np.float64)
        self.reliable_clusters_ = np.asarray(rel.model.reliable, dtype=bool)
        self.cluster_centers_ = np.asarray(rel.model.centers, dtype=np.float64)
        self.epsilon_, self.delta_ = rel.epsilon, rel.delta
        self.n_features_in_ = int(rel.model.d)
        if kind != "numpy":
            self.feature_names_in_ = np.asarray([str(c) for c in columns], dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return self

    def sample(self, n: int, seed: int | None = None):
        """``n`` synthetic rows from the released model (post-processing: no budget), of the type
        ``fit`` was given: a numpy array (the input's dtype), a pandas DataFrame or a pyarrow Table
        with the modelled columns in their source types (integer and boolean columns get the
        model's 0/1 values; docs/dpgm.md). ``seed`` makes it reproducible; by default fresh OS
        entropy."""
        from sparkpriv.errors import ParameterError
        from sparkpriv.mechanisms.dpgm import synthesize, synthesize_table
        from sparkpriv.privacy.random import new_secret_seed

        check_is_fitted(self, "model_")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ParameterError(f"The 'n' parameter of DPGMSynthesizer.sample must be an integer >= 0. "
                                 f"Got {n!r} instead.")
        if seed is None:
            seed = new_secret_seed("dpgm-synthesis")  # fresh entropy for the synthesis, never kept
        if self._kind == "numpy":
            S = np.clip(synthesize(self.model_, int(n), int(seed)), 0.0, 1.0)  # the declared box, as
            return _cast_numpy(S, self._dtype)  # synthesize_table and `sparkpriv synthesize` give
        table = synthesize_table(self.model_, int(n), int(seed))  # the source's column types
        return table.to_pandas() if self._kind == "pandas" else table


def _input_kind(X) -> str | None:
    if isinstance(X, (np.ndarray, list)):
        return "numpy"
    mod = type(X).__module__
    if mod.startswith("pandas.") and hasattr(X, "columns"):
        return "pandas"
    if mod.startswith("pyarrow.") and hasattr(X, "column_names"):
        return "arrow"
    return None


def _cast_numpy(S: np.ndarray, dtype) -> np.ndarray:
    """Synthetic values in [0, 1] as the input's dtype: booleans ``>= 0.5``, integers rounded."""
    dtype = np.dtype(dtype)
    if dtype == bool:
        return S >= 0.5
    if np.issubdtype(dtype, np.integer):
        return np.floor(S + 0.5).astype(dtype)
    return S.astype(dtype) if np.issubdtype(dtype, np.floating) else S
