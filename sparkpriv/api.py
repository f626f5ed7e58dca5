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

__all__ = ["release", "release_kmeans", "release_kmeans_array", "release_projection", "release_projection_array"]


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
