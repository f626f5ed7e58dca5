"""scikit-learn estimators over the one release path (in-memory data, the local engine).

``DPKMeans``, ``DPLinearRegression``, ``DPLogisticRegression``, ``DPTableSynthesizer`` and
``DPGMSynthesizer`` follow
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
from sklearn.base import BaseEstimator, ClassifierMixin, ClusterMixin, RegressorMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from sparkpriv.api import release_kmeans, release_regression

__all__ = ["DPKMeans", "DPLinearRegression", "DPLogisticRegression", "DPTableSynthesizer", "DPGMSynthesizer"]


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


_REGRESSION_PARAMS = ("epsilon", "delta", "method", "row_bound", "lower", "upper", "fit_intercept", "budget_split",
                      "bootstrap", "confidence", "fill", "neighbors")


class _DPRegressionBase(BaseEstimator):
    """What the two regression estimators share: one release of the ``regression`` mechanism per ``fit``
    on the local engine (the data as an Arrow table ``x0..x{d-1}, y``)."""

    _model = "linear"

    def _release(self, X, y, extra: dict):
        import pyarrow as pa

        from sparkpriv.errors import ParameterError

        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y).ravel()
        if X.ndim != 2 or y.shape != (X.shape[0],):
            raise ParameterError(f"X must be 2-D (n_samples, n_features) and y of shape (n_samples,). Got "
                                 f"{X.shape} and {y.shape}.")
        if y.dtype == object or y.dtype.kind in "USO":
            raise ParameterError(f"{type(self).__name__}.fit: the target y must be numeric or boolean. Got "
                                 f"dtype {y.dtype}; encode the classes as numbers first.")
        names = [f"x{j}" for j in range(X.shape[1])]
        table = pa.table({**{c: X[:, j] for j, c in enumerate(names)}, "y": y.astype(np.float64)})
        params = {k: getattr(self, k, None) for k in _REGRESSION_PARAMS}
        params.update(extra)
        params = {k: v for k, v in params.items() if v is not None}
        return release_regression(table, columns=names, target="y", ledger=self.ledger, table_id=self.table_id,
                                  source=f"{type(self).__name__}.fit", **params)

    def _keep(self, rel, X):
        fit = rel.model
        self.release_ = rel
        self.coef_ = np.asarray(fit.coef, dtype=np.float64)
        self.intercept_ = float(getattr(fit, "intercept", 0.0))
        self.stderr_, self.ci_low_, self.ci_high_ = fit.stderr, fit.ci_low, fit.ci_high
        self.epsilon_, self.delta_ = rel.epsilon, rel.delta
        self.n_features_in_ = np.asarray(X).shape[1]


class DPLinearRegression(RegressorMixin, _DPRegressionBase):
    """Private linear regression (docs/regression.md) as a scikit-learn estimator.

    ``fit(X, y)`` is one release of the ``regression`` mechanism on the local engine, by default
    ``method="ssp"``: noisy sufficient statistics ``X^T X``, ``X^T y`` with AdaSSP's adaptive ridge,
    intervals from a parametric bootstrap. Bounds are declared, never computed from the data, and
    there is no default: the features need ``row_bound`` (a bound on each row's L2 norm) and/or
    ``lower``/``upper`` (per-feature box), the target ``target_lower``/``target_upper`` or
    ``target_quantile`` (a DP range that spends ``target_epsilon_share`` of epsilon); ``fit`` without
    them raises :class:`~sparkpriv.errors.ParameterError` naming the parameter, before reading ``X``.
    ``method="sketch"`` releases the sample-mixing sketch instead (``row_bound`` then bounds
    ``[x, y]``; ``sketch_rows``, ``sketch_rule``, ``ridge``, ``debias``; no intercept).

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    stderr_, ci_low_, ci_high_ : ndarray of shape (n_features,)
        Standard errors and ``confidence`` intervals of the coefficients.
    epsilon_, delta_ : float
        What the fit spent.
    release_ : Release
        The whole release (the noisy statistics or sketch, receipt; ``release_.write(path)``).
    n_features_in_ : int
    """

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-6, method: str = "ssp", row_bound=None,
                 lower=None, upper=None, target_lower=None, target_upper=None, target_quantile=None,
                 target_epsilon_share=None, fit_intercept: bool = True, budget_split=None, bootstrap=None,
                 confidence: float = 0.95, fill=None, neighbors=None, sketch_rows=None, sketch_rule=None,
                 ridge=None, debias=None, ledger=None, table_id=None):
        self.epsilon = epsilon
        self.delta = delta
        self.method = method
        self.row_bound = row_bound
        self.lower = lower
        self.upper = upper
        self.target_lower = target_lower
        self.target_upper = target_upper
        self.target_quantile = target_quantile
        self.target_epsilon_share = target_epsilon_share
        self.fit_intercept = fit_intercept
        self.budget_split = budget_split
        self.bootstrap = bootstrap
        self.confidence = confidence
        self.fill = fill
        self.neighbors = neighbors
        self.sketch_rows = sketch_rows
        self.sketch_rule = sketch_rule
        self.ridge = ridge
        self.debias = debias
        self.ledger = ledger
        self.table_id = table_id

    def fit(self, X, y):
        """Release private statistics (or a sketch) of ``[X, y]`` and fit on them (spends epsilon,
        delta); returns self."""
        extra = {k: getattr(self, k) for k in ("target_lower", "target_upper", "target_quantile",
                                                "target_epsilon_share", "sketch_rows", "sketch_rule", "ridge",
                                                "debias")}
        self._keep(self._release(X, y, extra), X)
        return self

    def predict(self, X):
        check_is_fitted(self, "coef_")
        return np.asarray(X, dtype=np.float64) @ self.coef_ + self.intercept_


class DPLogisticRegression(ClassifierMixin, _DPRegressionBase):
    """Private logistic regression for a binary target (docs/regression.md) as a scikit-learn estimator.

    ``fit(X, y)`` is one release of the ``regression`` mechanism with ``model="logistic"``: the same
    noisy sufficient statistics and AdaSSP ridge as :class:`DPLinearRegression`, on ``s = +1`` for
    ``y == positive`` and ``-1`` otherwise, and the logistic loss's degree-2 Chebyshev approximation
    (PASS-GLM) solved on them; then ``logistic_steps`` (default 5) more passes, each a noisy gradient of
    the logistic loss (Bohning steps; the last also a noisy Hessian, for a Newton step and the
    intervals). ``logistic_steps=0``: the one-pass approximation alone (least squares' decision
    boundary). ``y`` is numeric or boolean. The features need declared bounds (``row_bound`` and/or
    ``lower``/``upper``); there is no default.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    classes_ : ndarray of shape (2,)
        ``[negative, positive]`` as predicted: ``0`` or ``1`` (``positive`` when given).
    stderr_, ci_low_, ci_high_ : ndarray of shape (n_features,)
    epsilon_, delta_ : float
    release_ : Release
    n_features_in_ : int
    """

    _model = "logistic"

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-6, row_bound=None, lower=None, upper=None,
                 positive=None, logistic_steps=None, fit_intercept: bool = True, budget_split=None, bootstrap=None,
                 confidence: float = 0.95, fill=None, neighbors=None, ledger=None, table_id=None):
        self.epsilon = epsilon
        self.delta = delta
        self.row_bound = row_bound
        self.lower = lower
        self.upper = upper
        self.positive = positive
        self.logistic_steps = logistic_steps
        self.fit_intercept = fit_intercept
        self.budget_split = budget_split
        self.bootstrap = bootstrap
        self.confidence = confidence
        self.fill = fill
        self.neighbors = neighbors
        self.ledger = ledger
        self.table_id = table_id

    def fit(self, X, y):
        """Release private statistics of ``[X, y]`` and fit the logistic model (spends epsilon, delta);
        returns self."""
        self._keep(self._release(X, y, {"model": "logistic", "positive": self.positive,
                                        "logistic_steps": self.logistic_steps}), X)
        pos = 1.0 if self.positive is None else self.positive
        self.classes_ = np.array([0.0 if pos != 0 else 1.0, pos])
        return self

    def decision_function(self, X):
        check_is_fitted(self, "coef_")
        return np.asarray(X, dtype=np.float64) @ self.coef_ + self.intercept_

    def predict_proba(self, X):
        """``[P(negative), P(positive)]`` of the fitted logistic model (post-processing)."""
        p = 1.0 / (1.0 + np.exp(-np.clip(self.decision_function(X), -500, 500)))
        return np.column_stack([1.0 - p, p])

    def predict(self, X):
        return np.where(self.decision_function(X) > 0, self.classes_[1], self.classes_[0])


class DPTableSynthesizer(BaseEstimator):
    """The synthetic person x item table release (docs/utility.md, docs/math.md section 10) as an estimator.

    ``fit(X)`` is one release of the ``synthetic`` mechanism on the local engine
    (:func:`sparkpriv.api.release_synthetic`): ``X`` is a person x item table in memory, one row per
    person, a nonzero cell an item the person holds: a ``scipy.sparse`` matrix, a numpy array or a
    pandas DataFrame (its columns the items). Each person keeps at most ``max_items`` items
    (``"auto"``: chosen by the release from a DP histogram of the record lengths, in the same budget).
    ``sample(n)`` draws ``n`` synthetic people from the released model: post-processing, no budget.

    Parameters are those of :class:`sparkpriv.mechanisms.synthetic.SyntheticParams` with the same names
    and defaults (``length_share``, ``anchors``, ``anchor_share``, ...), and ``max_items``.
    ``ledger``/``table_id`` record the spend of each ``fit``. Bad parameters are refused by ``fit`` (a
    :class:`~sparkpriv.errors.ParameterError` naming the parameter), before any data is read.

    Attributes
    ----------
    model_ : SyntheticModel
        The released (public) model; ``model_.union_answers(Q)`` gives its expected answers to
        counting queries without sampling.
    max_items_ : int
        The contribution bound used (the chosen one with ``max_items="auto"``).
    epsilon_, delta_ : float
        What the fit spent (dp_accounting on the recorded events).
    release_ : Release
        The whole release (receipt, events; ``release_.write(path)`` publishes it with the model file,
        which ``sparkpriv synthesize`` reads).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        The items (only when fitted on a pandas DataFrame).
    """

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-6, max_items="auto", length_share: float = 0.15,
                 length_limit: int = 256, shrink: str = "eb", anchors: int = 64, anchor_share: float = 0.2,
                 neighbors: str = "replace-one", ledger=None, table_id=None):
        self.epsilon = epsilon
        self.delta = delta
        self.max_items = max_items
        self.length_share = length_share
        self.length_limit = length_limit
        self.shrink = shrink
        self.anchors = anchors
        self.anchor_share = anchor_share
        self.neighbors = neighbors
        self.ledger = ledger
        self.table_id = table_id

    _RELEASE_PARAMS = ("epsilon", "delta", "length_share", "length_limit", "shrink", "anchors", "anchor_share",
                       "neighbors")

    def fit(self, X, y=None):
        """Release a private model of the person x item table ``X`` (spends epsilon, delta); returns self."""
        from scipy import sparse

        from sparkpriv.api import release_synthetic
        from sparkpriv.errors import ParameterError

        kind = "sparse" if sparse.issparse(X) else _input_kind(X)
        if kind not in ("sparse", "numpy", "pandas"):
            raise ParameterError(f"DPTableSynthesizer.fit takes a person x item table in memory (a scipy.sparse "
                                 f"matrix, a numpy array or a pandas DataFrame); got {type(X).__name__}. For "
                                 "event tables on Spark use `sparkpriv release synthetic --events`.")
        names = None
        if kind == "pandas":
            names = np.asarray([str(c) for c in X.columns], dtype=object)
            X = X.to_numpy()
        if kind != "sparse":
            X = np.asarray(X)
            if X.ndim != 2:
                raise ParameterError(f"X must be a 2-D table (n_people, n_items). Got shape {X.shape}.")
            self._dtype = X.dtype
        params = {name: getattr(self, name) for name in self._RELEASE_PARAMS}
        rel = release_synthetic(X, max_items=self.max_items, ledger=self.ledger, table_id=self.table_id,
                                source="DPTableSynthesizer.fit", **params)
        self._kind = kind
        self.release_ = rel
        self.model_ = rel.model
        self.max_items_ = int(rel.model.public["max_items"])
        self.epsilon_, self.delta_ = rel.epsilon, rel.delta
        self.n_features_in_ = int(rel.model.d)
        if names is not None:
            self.feature_names_in_ = names
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return self

    def sample(self, n: int, seed: int | None = None):
        """``n`` synthetic people from the released model (post-processing: no budget), of the kind
        ``fit`` was given: a CSR matrix, a numpy array of the input's dtype (1 for a held item, 0
        else), or a pandas DataFrame with the items as columns. ``seed`` makes it reproducible; by
        default fresh OS entropy."""
        from sparkpriv.errors import ParameterError
        from sparkpriv.privacy.random import new_secret_seed

        check_is_fitted(self, "model_")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ParameterError(f"The 'n' parameter of DPTableSynthesizer.sample must be an integer >= 0. "
                                 f"Got {n!r} instead.")
        if seed is None:
            seed = new_secret_seed("synthetic-table-synthesis")  # fresh entropy, never kept
        S = self.model_.sample(int(n), int(seed) % 2**63)
        if self._kind == "sparse":
            return S
        A = S.toarray().astype(self._dtype if self._dtype != object else np.float64)
        if self._kind == "pandas":
            import pandas as pd

            return pd.DataFrame(A, columns=list(self.feature_names_in_))
        return A


class DPGMSynthesizer(BaseEstimator):
    """A private synthetic-data generator (the DPGM mixture, docs/research/dpgm.md) as an estimator.

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
                 min_cluster_share: float = 0.01,
                 hidden: int = 64, latent: int = 2, chains: int = 100, gibbs_steps: int = 1,
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
        model's 0/1 values; docs/research/dpgm.md). ``seed`` makes it reproducible; by default fresh OS
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
