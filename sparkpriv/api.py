"""The public release functions: one per registered mechanism, each the one release path.

Each function takes the data (a Spark DataFrame or bounded event records for
the Spark engine; a numpy array, pandas DataFrame or pyarrow Table for the
local engine) and the mechanism's parameters as keywords, and returns a
:class:`~sparkpriv.release.Release` (the same type for every mechanism and
engine). The parameters, their defaults and meaning are the mechanism's
``Params`` class; docs/options.md has their tables (generated from it).
"""

from __future__ import annotations

from sparkpriv.release import Release, release

__all__ = ["release", "release_kmeans", "release_kmeans_array", "release_projection", "release_projection_array",
           "release_dprp", "release_dprp_array", "table_arrays", "release_regression", "release_counts",
           "release_dpgm", "release_dpgm_array", "release_synthetic", "release_aggregates", "Aggregates"]


def release_kmeans(data, *, ledger=None, table_id: str | None = None, source: str | None = None,
                   on_step=None, **params) -> Release:
    """Private k-means of ``data`` (docs/kmeans.md; docs/math.md section 4).

    Parameters are those of :class:`sparkpriv.mechanisms.kmeans.KMeansParams`:
    ``k``, ``epsilon``, ``delta`` (required), ``columns`` (required for a
    DataFrame or table; not for a numpy array or event records),
    ``iterations`` (10), ``variant`` ("kernel" or "linear"), the declared
    bounds ``row_bound``/``lower``/``upper``, ``kernel_width`` and
    ``frequencies`` (kernel), ``init`` (a PUBLIC sample of initial centres),
    ``final_share``, ``fill``, ``reliability_stds`` (3), ``neighbors``
    ("replace-one" only: n is public).

    Returns a :class:`~sparkpriv.release.Release` whose ``model`` is the
    public :class:`~sparkpriv.mechanisms.kmeans_model.KMeansModel`, ``df``
    the clusters table (cluster, count, reliable, center, feature_center),
    and ``extras`` the iteration times and raw noisy sizes per iteration
    (``iteration_seconds``, ``history``). ``write(path)`` publishes the table
    with the receipt and ``_kmeans_model.json``.

    Privacy: replace-one neighbours; per iteration one Gaussian noise addition
    to the vector ``(C n_j, S_j)`` of L2 sensitivity ``2C``; T iterations and
    the kernel variant's final step compose to at most ``(epsilon, delta)``.
    """
    return release("kmeans", data, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_kmeans", **params)


release_kmeans_array = release_kmeans  # the same function: in-memory data runs on the local engine


def release_projection(data, *, ledger=None, table_id: str | None = None, source: str | None = None,
                       on_step=None, **params) -> Release:
    """Private JL projection of ``data`` (docs/math.md section 2; event records: section 8).

    ``data``: a Spark DataFrame (one row per person), bounded event records
    (:func:`~sparkpriv.spark.events.bound_contributions`: one record per
    person, released as sparse records), or in-memory data (numpy array,
    pandas DataFrame, pyarrow Table; the local engine). Parameters are those
    of :class:`sparkpriv.mechanisms.projection.ProjectionParams`: ``k``,
    ``epsilon`` (required), ``columns`` (required for a DataFrame or table;
    not for a numpy array or event records), ``delta`` (0 for Laplace; in
    (0, 1) for ``noise="gaussian"``), ``noise``, ``neighbors``
    ("replace-one" or "element": ONE ATTRIBUTE, not a person; "add-remove"
    is refused, the output has one row per input row), the declared bounds
    ``row_bound``/``norm``/``lower``/``upper``/``element_bound``, or
    ``row_bound_quantile`` (a DP estimate of the row bound spending
    ``bound_epsilon_share`` of epsilon), ``keep_columns`` (input columns
    declared PUBLIC, copied unchanged), ``fill`` (public value for nulls),
    ``matrix_key`` (secret bytes from which ``P`` is derived, to reuse it).
    Event records take only ``k``, ``epsilon``, ``delta``, ``noise``,
    ``neighbors`` and ``matrix_key``: their bounds come from the item cap.

    Returns a :class:`~sparkpriv.release.Release`: ``df`` has the columns
    ``keep_columns + z0 .. z{k-1}`` (a lazy Spark DataFrame whose noise comes
    from keyed per-partition streams, or a pyarrow Table on the local engine);
    ``release.to_numpy()`` gives the ``z`` columns as a numpy array (a numpy
    input has no other columns; with ``keep_columns`` pass
    ``to_numpy([f"z{i}" for i in range(k)])``); ``release.plan`` is the public
    :class:`~sparkpriv.mechanisms.projection.ProjectionPlan` (noise,
    sensitivity, range); ``public["noise_variance_per_entry"]`` is what
    :func:`~sparkpriv.mechanisms.projection.recover_sq_distances` needs.
    ``write(path)`` publishes the table with its receipt.

    Privacy: the exact L1 (Laplace) or L2 (Gaussian) sensitivity of
    ``x -> clip(x) P`` for the realized secret ``P`` and the declared bounds,
    enforced by clipping; ``epsilon``-DP or ``(epsilon, delta)``-DP, every
    spend (the row-bound histogram included) reserved in the ledger before
    any data is read. Public: d, k, the bounds, the noise scale, n
    (replace-one), ``keep_columns``. Secret: ``P`` and the noise seeds.
    """
    return release("projection", data, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_projection", **params)


release_projection_array = release_projection  # the same function: in-memory data runs on the local engine


def release_dprp(data, y=None, *, ledger=None, table_id: str | None = None, source: str | None = None,
                 on_step=None, **params) -> Release:
    """DPRP private release of a table: the same columns, on the same scale (docs/dprp.md;
    docs/math.md section 3).

    ``data``: a Spark DataFrame (one row per person), bounded event records
    (:func:`~sparkpriv.spark.events.bound_contributions`: the output is one
    row per person, ``items array<int>``, the items whose reconstructed value
    is at least ``threshold``), or in-memory data on the local engine (a
    numpy array, a pandas DataFrame or a pyarrow Table). ``y``: labels of a
    numpy array (one per row), given with ``labels``; with public labels and
    no ``classes`` the classes are the values of ``y`` (public data).

    Parameters are those of :class:`sparkpriv.mechanisms.dprp.DPRPParams`:
    ``epsilon``, ``delta`` (required), ``columns`` (required for a DataFrame
    or table), ``lower``/``upper`` (the declared per-column bounds, required
    for a table), ``label``/``labels``/``classes`` (a label column: public,
    one run per class with the class sizes released, or private, one-hot
    scaled by ``label_scale`` and decoded by argmax), ``k1``/``k2``,
    ``row_bound``, ``budget_split``, ``fill`` (a public constant or
    ``"dp-mean"``, which spends ``impute_share``), ``keep_columns``,
    ``threshold`` (event records), ``integer_columns`` (in-memory float
    arrays), ``neighbors`` ("replace-one" only: a row-level release).

    Returns a :class:`~sparkpriv.release.Release`: ``df`` the private table
    (a lazy DataFrame on Spark, whose evaluations all give the same noise; a
    pyarrow Table on the local engine: :func:`table_arrays` gives ``X`` and
    ``y`` back as numpy arrays). The Gram pass runs inside this call (input
    errors such as NaN surface here); the budget is reserved before any data
    is read.

    Privacy: replace-one neighbours; the sensitivities are the exact suprema
    over the declared domain (``sqrt(d) s_max(R)`` for the projection with the
    realized secret ``R``, ``sqrt(d (d + 1) / 2)`` for the Gram's unique
    entries, at the default ``row_bound``, without labels; docs/dprp.md,
    "Sensitivity"); Gaussian noise composed exactly in Gaussian DP to
    (epsilon, delta). Public: the bounds, d, k1, k2, the noise scales, the
    classes, the class sizes with public labels, ``keep_columns``. Secret:
    ``R`` and the noise seed.
    """
    if y is not None:
        data, params = _with_labels(data, y, params)
    return release("dprp", data, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_dprp", **params)


release_dprp_array = release_dprp  # the same function: in-memory data runs on the local engine


def release_dpgm(data, *, ledger=None, table_id: str | None = None, source: str | None = None,
                 on_step=None, **params) -> Release:
    """DP mixture of generative models of ``data`` (docs/research/dpgm.md; docs/math.md section 5).

    ``data``: a Spark DataFrame or in-memory data (numpy array, pandas or
    Arrow table), one row per person, columns with values in the declared box
    ``[0, 1]`` (binary for ``model="rbm"``; values outside are clipped).
    Parameters are those of :class:`sparkpriv.mechanisms.dpgm.DPGMParams`:
    ``epsilon``, ``delta`` (required), ``columns`` (required for a DataFrame
    or table), ``k`` (10), ``model`` ("rbm" or "vae"), ``kmeans_share``,
    ``kmeans_iterations``, ``row_bound``, the DP-SGD ``clip``,
    ``sampling_rate``, ``epochs``, ``learning_rate``, the model sizes,
    ``accountant``, ``fill``, ``neighbors`` ("replace-one" only: n is public).

    Returns a :class:`~sparkpriv.release.Release` whose ``model`` is the
    public :class:`~sparkpriv.mechanisms.dpgm.DPGMModel` (sample it with
    :func:`~sparkpriv.mechanisms.dpgm.synthesize`), ``df`` one row per
    cluster (cluster, noisy size, k-means centre); ``write(path)`` publishes
    it with the receipt and ``_dpgm_model.npz``.

    Privacy: replace-one; DP k-means (linear) then DP-SGD per cluster at one
    public ``(q, sigma, T)`` (parallel composition); the event is fixed from
    the public parameters before any data is read.
    """
    return release("dpgm", data, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_dpgm", **params)


release_dpgm_array = release_dpgm  # the same function: in-memory data runs on the local engine


def _with_labels(X, y, params: dict):
    """A numpy ``X`` and its labels ``y`` as one Arrow table (NaN as nulls): columns, then the label."""
    import numpy as np
    import pyarrow as pa

    from sparkpriv.errors import ParameterError

    caller = "release_dprp"
    X = np.asarray(X)
    if X.ndim != 2:
        raise ParameterError(f"X must be a 2-D array (n_samples, n_features) when labels y are given. "
                             f"Got shape {X.shape}.")
    y = np.asarray(y)
    if y.shape != (X.shape[0],):
        raise ParameterError(f"y must have shape ({X.shape[0]},). Got {y.shape}.")
    if params.get("label") is not None:
        raise ParameterError(f"{caller} got both y and label: give the labels one way.")
    if params.get("labels") is None:
        raise ParameterError(
            f"{caller} got labels y: declare them labels='public' (released as they are, one run "
            "per class, class sizes released) or labels='private' (protected, decoded by argmax)."
        )
    names = list(params.get("columns") or [f"x{j}" for j in range(X.shape[1])])
    if len(names) != X.shape[1]:
        raise ParameterError(f"The 'columns' parameter of {caller} names {len(names)} columns; X has "
                             f"{X.shape[1]}.")
    label = "y" if "y" not in names else "label"
    if params.get("classes") is None and params["labels"] == "public":
        classes = tuple(np.unique(y).tolist())  # public labels are public data
        if len(classes) < 2:
            raise ParameterError(f"The label column has one class only ({classes[0]!r}): there is "
                                 "nothing to separate; release without labels.")
        params = dict(params, classes=classes)
    cols = {c: pa.array(X[:, j], from_pandas=True) for j, c in enumerate(names)}
    cols[label] = pa.array(y.tolist() if y.dtype == object else y)
    return pa.table(cols), dict(params, columns=names, label=label)


def table_arrays(rel: Release):
    """``(X, y)``: the released feature columns and label of a DPRP release made on the local
    engine, as numpy arrays (``y`` None without a label); ``X`` is float64 of shape
    ``(n_samples, n_features)``, in the order of ``columns`` (``x0``, ``x1``, ... for a numpy
    input)."""
    import numpy as np

    from sparkpriv.errors import ParameterError

    if rel.engine != "local":
        raise ParameterError("table_arrays takes a release made on the local engine (in-memory data); "
                             "a Spark release's df is a DataFrame: select its columns there.")
    params = rel.public.get("parameters", {})
    columns, label = params.get("columns"), params.get("label")
    if not columns:
        raise ParameterError("table_arrays takes a release of table columns (not event records).")
    t = rel.df
    X = np.column_stack([t.column(c).to_numpy().astype(np.float64) for c in columns]) if t.num_rows else \
        np.zeros((0, len(columns)))
    y = None if label is None else np.asarray(t.column(label).to_pylist())
    return X, y


def release_regression(data, *, ledger=None, table_id: str | None = None, source: str | None = None,
                       on_step=None, **params) -> Release:
    """Private linear or logistic regression (docs/regression.md; docs/math.md section 6).

    Parameters are those of :class:`sparkpriv.mechanisms.regression.RegressionParams`:
    ``columns`` (the features) and ``target``, ``epsilon``, ``delta`` (required), ``method`` and
    the method's bounds (none has a default; a release without them is refused, naming them):

    * ``method="ssp"`` (default): AdaSSP's noisy sufficient statistics. Features bounded by
      ``row_bound`` (L2 norm of the feature row) and/or ``lower``/``upper`` (per feature); the target
      by ``target_lower``/``target_upper`` or ``target_quantile`` (a DP range, spending
      ``target_epsilon_share``); ``model="logistic"`` for a binary target (``positive``: the value of
      the positive class, default 1); ``fit_intercept`` (True), ``budget_split``, ``bootstrap``,
      ``confidence``, ``fill``, ``neighbors`` ("replace-one" or "add-remove").
    * ``method="sketch"``: the sample-mixing sketch; ``row_bound`` bounds ``[features..., target]``;
      ``sketch_rows`` or ``sketch_rule``, ``ridge``, ``debias``, ``scheme`` ("additive": the baseline
      ``M + W``); replace-one only.

    Returns a :class:`~sparkpriv.release.Release` whose ``model`` is the fit (coefficients, intercept,
    standard errors, confidence intervals) and ``df`` the released table: the noisy cross-product
    matrix of the (centred) features and target (ssp; ``extras["statistics"]`` holds it with its
    noise variances, and :func:`~sparkpriv.mechanisms.regression.fit_from_statistics` refits it), or
    the private sketch (m rows; the noisy rows for the additive scheme). ``write(path)`` publishes it
    with the receipt and ``_regression_model.json``. No secret (seeds, the sketch matrix) is ever
    written or logged.
    """
    return release("regression", data, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_regression", **params)


def release_counts(data, *, ledger=None, table_id: str | None = None, source: str | None = None,
                   on_step=None, **params) -> Release:
    """DP counts per public key of bounded event records (docs/counts.md; docs/math.md section 9).

    ``data``: bounded event records, from
    :func:`sparkpriv.spark.counts.bound_keys` (keys of one or more declared
    columns over a :class:`~sparkpriv.mechanisms.counts.KeyDomain`; pass the
    same ``domain=``) or :func:`sparkpriv.spark.events.bound_contributions`
    (one item column); in memory (no Spark), from
    :func:`sparkpriv.local.records.bound_keys` (a pandas DataFrame or pyarrow
    Table, the same parameters). The bound comes from the records: at most ``L`` keys
    per person, each counting 1 (distinct people) or the person's events
    there capped at ``c``. Parameters are those of
    :class:`sparkpriv.mechanisms.counts.CountsReleaseParams`: ``epsilon``
    (required), ``noise`` ("discrete_laplace" or "discrete_gaussian"),
    ``delta``, ``neighbors`` ("add-remove" or "replace-one"), ``clamp``,
    ``round``, ``confidence``, ``domain``.

    Returns a :class:`~sparkpriv.release.Release` whose ``df`` has one row per
    key of the domain (including keys no one visited): the key columns,
    ``noisy_count``, ``std``, ``ci_low``, ``ci_high``; ``write(path)``
    publishes it with the receipt.

    Privacy: one discrete Laplace (L1 sensitivity ``L c``) or discrete
    Gaussian (L2 ``c sqrt(L)``) noise addition to the vector of per-key totals
    (twice ``L`` keys under replace-one), drawn once on the driver.
    """
    return release("counts", data, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_counts", **params)


def release_synthetic(data, *, max_items="auto", ledger=None, table_id: str | None = None,
                      source: str | None = None, on_step=None, **params) -> Release:
    """A DP synthetic person x item table (docs/utility.md; docs/math.md section 10).

    ``data``: bounded event records (:func:`sparkpriv.spark.events.bound_contributions` on Spark,
    :func:`sparkpriv.local.records.bound_items` in memory), or an in-memory 0/1 person x item matrix
    (``scipy.sparse`` or numpy), bounded here at ``max_items`` (default ``"auto"``: the cap chosen by
    the release's error estimate on a DP histogram of the items per person, in the same budget;
    docs/math.md section 10, "Automatic L"). Parameters are those of
    :class:`sparkpriv.mechanisms.synthetic.SyntheticParams`: ``epsilon``, ``delta`` (required),
    ``length_share``, ``length_limit``, ``shrink``, ``anchors``, ``anchor_share``, ``neighbors``.

    Returns a :class:`~sparkpriv.release.Release`: ``model`` (a
    :class:`~sparkpriv.mechanisms.synthetic.SyntheticModel`; ``model.sample(n, seed)`` gives a
    synthetic table, ``model.union_answers(Q)`` its expected counting-query answers), ``df`` the
    per-item noisy counts; ``write(path)`` publishes them with the receipt and the model file,
    which ``sparkpriv synthesize`` turns into synthetic tables of any size.

    Privacy: one Laplace histogram of items per person (``length_share`` of epsilon) and discrete
    Gaussian additions to the per-item counts of the bounded records and to the anchor strata (each
    L2 sensitivity ``sqrt(2 L)`` under replace-one), each drawn once on the driver; synthesis is
    post-processing.
    """
    from sparkpriv.local.records import LocalRecords, bound_items

    if not isinstance(data, LocalRecords) and (type(data).__module__.startswith("scipy.sparse")
                                               or isinstance(data, (list, tuple)) or _is_ndarray(data)):
        data = bound_items(data, max_items=max_items)
    return release("synthetic", data, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_synthetic", **params)


def _is_ndarray(x) -> bool:
    import numpy as np

    return isinstance(x, np.ndarray)


def release_aggregates(events, *, ledger=None, table_id: str | None = None, source: str | None = None,
                       on_step=None, **params) -> Release:
    """DP aggregates per key of an event table (docs/aggregates.md; docs/math.md section 11).

    ``events``: one row per event (call, trip): a Spark DataFrame (the Spark engine), or a pandas
    DataFrame or pyarrow Table in memory (the local engine; the same bounding, the same table for the
    same secrets: :mod:`sparkpriv.local.events`). Parameters are those of
    :class:`sparkpriv.mechanisms.aggregates.AggregatesParams`: ``person`` (the person-key column),
    ``by`` (the key columns), ``aggregates`` (e.g. ``"count_distinct, mean(duration),
    median(duration)"``), ``epsilon``, ``max_keys`` (``L``) and ``max_events_per_key`` (``c``; each an
    int or ``"auto"``), ``bounds`` (``{"duration": (0, 3600)}`` or ``"duration=0:3600"``; ``"auto"``
    for a DP choice), ``domain`` (a public domain per key column, a
    :class:`~sparkpriv.mechanisms.counts.KeyDomain`, or None for private key selection), ``delta``,
    ``noise`` ("laplace" or "gaussian"), ``neighbors``, ``split``, ``confidence``, ``clamp``,
    ``round``, ... :class:`Aggregates` builds the same call step by step.

    Returns a :class:`~sparkpriv.release.Release` whose ``df`` has one row per key (every key of a
    public domain; the selected keys otherwise): the key columns, then per aggregate its value,
    ``_std``, ``_ci_low`` and ``_ci_high``; ``write(path)`` publishes it with the receipt.

    Privacy: a person contributes at most ``L`` keys and, at a key, their events weighted ``min(n, c) /
    n``, with values clamped; each measured statistic (people, events, centred sums and squares,
    histograms) gets discrete Laplace or Gaussian noise once per key, calibrated to its sensitivity
    (docs/math.md section 11) with its share of the budget; private key selection adds the stated
    delta. Every spend is one dp_accounting event, reserved before any data is read.
    """
    return release("aggregates", events, ledger=ledger, table_id=table_id, source=source, on_step=on_step,
                   caller="release_aggregates", **params)


class Aggregates:
    """A DP aggregates query of an event table, built step by step (each step returns a new query).

    ::

        rel = (Aggregates(events, person="caller_id")
               .by("tower_id", "hour", domain={"tower_id": range(1303), "hour": range(24)})
               .count_distinct().count().sum("duration", 0, 3600).mean("duration", 0, 3600)
               .median("duration", 0, 3600)
               .bound(max_keys=16, max_events_per_key=4)
               .release(epsilon=1.0))

    Value bounds: ``lo, hi`` (public, declared), or ``"auto"`` (a DP quantile of the column,
    spending part of epsilon). A column's bounds must be the same in every aggregate that uses it.
    A key column's domain: anything a vocabulary accepts (a range, ``"0..23"``, a list of ids, a
    file of ids), a PUBLIC Spark DataFrame holding the column (its distinct values), or a whole
    :class:`~sparkpriv.mechanisms.counts.KeyDomain`; no domain: private key selection (give
    ``delta``). :meth:`params` shows the parameters :meth:`release` passes to
    :func:`release_aggregates`.
    """

    def __init__(self, events, *, person: str, _state: dict | None = None):
        self._events = events
        self._s = dict(_state or {"person": person, "by": (), "domain": None, "aggregates": (), "bounds": {},
                                  "max_keys": None, "max_events_per_key": None})

    def _with(self, **changes) -> "Aggregates":
        return Aggregates(self._events, person=self._s["person"], _state={**self._s, **changes})

    def by(self, *columns: str, domain=None) -> "Aggregates":
        """The key columns, and (optionally) their public domain: a mapping column -> vocabulary (or a
        public DataFrame holding the column), or a KeyDomain."""
        if len(columns) == 1 and isinstance(columns[0], (list, tuple)):
            columns = tuple(columns[0])
        return self._with(by=tuple(columns), domain=domain)

    def _agg(self, text: str, column: str | None, lo, hi) -> "Aggregates":
        from sparkpriv.errors import ParameterError

        bounds = dict(self._s["bounds"])
        if column is not None and not (lo is None and hi is None):
            b = "auto" if (isinstance(lo, str) and lo == "auto") else (lo, hi)
            if column in bounds and bounds[column] != b:
                raise ParameterError(f"The bounds of {column!r} are declared twice and differ: {bounds[column]!r} "
                                     f"and {b!r}. Declare one clamp per column.")
            bounds[column] = b
        return self._with(aggregates=self._s["aggregates"] + (text,), bounds=bounds)

    def count(self) -> "Aggregates":
        """Events per key (each person's events at a key weighted min(n, c) / n)."""
        return self._agg("count", None, None, None)

    def count_distinct(self) -> "Aggregates":
        """Distinct people per key."""
        return self._agg("count_distinct", None, None, None)

    def sum(self, column: str, lo=None, hi=None) -> "Aggregates":
        return self._agg(f"sum({column})", column, lo, hi)

    def mean(self, column: str, lo=None, hi=None) -> "Aggregates":
        return self._agg(f"mean({column})", column, lo, hi)

    def variance(self, column: str, lo=None, hi=None) -> "Aggregates":
        return self._agg(f"variance({column})", column, lo, hi)

    def quantile(self, column: str, ps, lo=None, hi=None) -> "Aggregates":
        ps = (ps,) if isinstance(ps, (int, float)) else tuple(ps)
        return self._agg(f"quantile({column}, {', '.join(repr(float(p)) for p in ps)})", column, lo, hi)

    def median(self, column: str, lo=None, hi=None) -> "Aggregates":
        return self.quantile(column, (0.5,), lo, hi)

    def bound(self, *, max_keys, max_events_per_key) -> "Aggregates":
        """``L`` keys per person and ``c`` events per key and person (ints, or ``"auto"``)."""
        return self._with(max_keys=max_keys, max_events_per_key=max_events_per_key)

    def params(self, **options) -> dict:
        """The parameters :meth:`release` passes to :func:`release_aggregates` (public domains read from
        public DataFrames here)."""
        s = self._s
        domain = s["domain"]
        from collections.abc import Mapping

        if isinstance(domain, Mapping):
            domain = {c: _vocabulary_of(v, c) for c, v in domain.items()}
        return {"person": s["person"], "by": s["by"], "aggregates": list(s["aggregates"]),
                "bounds": dict(s["bounds"]) or None, "domain": domain, "max_keys": s["max_keys"],
                "max_events_per_key": s["max_events_per_key"], **options}

    def release(self, *, epsilon: float, ledger=None, table_id: str | None = None, source: str | None = None,
                **options) -> Release:
        """Run the query: :func:`release_aggregates` with these parameters and ``options`` (``delta``,
        ``noise``, ``neighbors``, ``split``, ``confidence``, ``clamp``, ``round``, ...)."""
        return release_aggregates(self._events, ledger=ledger, table_id=table_id, source=source,
                                  **self.params(epsilon=epsilon, **options))

    def __repr__(self) -> str:
        s = self._s
        return (f"Aggregates(person={s['person']!r}, by={list(s['by'])!r}, aggregates={list(s['aggregates'])!r}, "
                f"bounds={s['bounds']!r}, max_keys={s['max_keys']!r}, max_events_per_key={s['max_events_per_key']!r})")


def _vocabulary_of(spec, column: str):
    """A key column's domain: a public DataFrame's distinct values of ``column``, or ``spec`` as is."""
    if type(spec).__module__.startswith("pyspark."):
        from sparkpriv.spark.aggregates import public_column_vocabulary

        return public_column_vocabulary(spec, column)
    return spec
