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

__all__ = ["release", "release_kmeans", "release_kmeans_array", "release_counts"]


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


def release_counts(data, *, ledger=None, table_id: str | None = None, source: str | None = None,
                   on_step=None, **params) -> Release:
    """DP counts per public key of bounded event records (docs/counts.md; docs/math.md section 9).

    ``data``: bounded event records, from
    :func:`sparkpriv.spark.counts.bound_keys` (keys of one or more declared
    columns over a :class:`~sparkpriv.mechanisms.counts.KeyDomain`; pass the
    same ``domain=``) or :func:`sparkpriv.spark.events.bound_contributions`
    (one item column). The bound comes from the records: at most ``L`` keys
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
