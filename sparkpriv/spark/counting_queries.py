"""Owner-side evaluation of a release by counting queries (layer 2 over
:mod:`sparkpriv.mechanisms.counting_queries`).

The truth ``q(D)`` comes from the PRIVATE source event table (each person's
distinct in-vocabulary items, no cap); ``q(D')`` from a release table, which is
either

* sparse: an ``array<int>`` column of vocabulary indices per row (``items``,
  the format of :attr:`BoundedRecords.df`), or of item ids of the vocabulary
  (``item_ids``: the ``items`` of ``sparkpriv synthesize`` on a model released on
  event records), or
* an event table (``release_events``): one row per (person, item), e.g.
  ``sparkpriv synthesize --explode``; each person's distinct in-vocabulary items
  are its row, as for the source, or
* dense: one numeric column per vocabulary item, in vocabulary order (e.g. a
  reconstructed DPRP table); a row visited item ``j`` when its value is at
  least ``threshold`` (0.5 by default: thresholding to binary).

Answers are computed per Arrow batch (sparse rows times the 0/1 query matrix)
and summed by tree aggregation; only the ``n_queries`` answers reach the driver.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError, SchemaError
from sparkpriv.mechanisms import counting_queries as cq
from sparkpriv.mechanisms.sparse import Vocabulary
from sparkpriv.spark.batches import batch_matrix, spark_errors, sum_partials
from sparkpriv.spark.events import bound_contributions, read_item_lists

__all__ = ["evaluate_counting_queries", "answer_release"]

_log = logging.getLogger(__name__)


def _item_ids_to_indices(arr, vocabulary: Vocabulary, col: str):
    """``(offsets from 0, int32 vocabulary indices)`` of a list column of item ids (nulls = empty)."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        arr = arr.fill_null(pa.scalar([], arr.type))
    offs = arr.offsets.to_numpy().astype(np.int64)
    vals = arr.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
    if vals.null_count:
        raise ValueError(f"release column {col!r} holds a null item id")
    idx = vocabulary.index(vals.to_numpy(zero_copy_only=False))
    if idx.size and idx.min() < 0:
        raise ValueError(f"release column {col!r} holds an item id outside the vocabulary")
    return offs - offs[0], idx


def _answers_sparse(df, col: str, Q: np.ndarray, vocabulary: Vocabulary | None = None) -> np.ndarray:
    nq = Q.shape[1]

    def sparkpriv_counting_queries(batches, pid):
        acc = np.zeros(nq + 1)
        for b in batches:
            if vocabulary is not None:
                off, idx = _item_ids_to_indices(b.column(col), vocabulary, col)
            else:
                off, idx = read_item_lists(b.column(col))
            if idx.size and (idx.min() < 0 or idx.max() >= Q.shape[0]):
                raise ValueError(f"release item index outside [0, {Q.shape[0]})")
            acc[:nq] += cq.answer_queries(off, idx, Q)
            acc[nq] += off.size - 1
        return acc

    with spark_errors():
        return sum_partials(df.select(col), sparkpriv_counting_queries, nq + 1)


def _answers_dense(df, columns: Sequence[str], threshold: float, Q: np.ndarray) -> np.ndarray:
    nq = Q.shape[1]

    def sparkpriv_counting_queries_dense(batches, pid):
        acc = np.zeros(nq + 1)
        for b in batches:
            X = batch_matrix(b, columns) >= threshold
            r, c = np.nonzero(X)
            off = np.concatenate(([0], np.cumsum(np.bincount(r, minlength=X.shape[0]))))
            acc[:nq] += cq.answer_queries(off, c.astype(np.int32), Q)
            acc[nq] += X.shape[0]
        return acc

    with spark_errors():
        return sum_partials(df.select(*columns), sparkpriv_counting_queries_dense, nq + 1)


def answer_release(df, Q: np.ndarray, *, items_col: str = "items", columns: Sequence[str] | None = None,
                   threshold: float = 0.5, item_ids=None) -> tuple[np.ndarray, int]:
    """``(answers (n_queries,), rows)`` of a sparse or dense release table. ``item_ids``: the
    vocabulary (a :class:`~sparkpriv.mechanisms.sparse.Vocabulary` or its spec) when the sparse
    column holds item ids (``sparkpriv synthesize`` of an event model), not indices."""
    from pyspark.sql.types import ArrayType, IntegralType, StringType

    if columns:
        if len(columns) != Q.shape[0]:
            raise ParameterError(f"A dense release needs one column per vocabulary item ({Q.shape[0]}); "
                                 f"got {len(columns)} release columns.")
        a = _answers_dense(df, list(columns), threshold, Q)
        return a[:-1], int(a[-1])
    f = {x.name: x for x in df.schema.fields}.get(items_col)
    if item_ids is not None:
        voc = Vocabulary.parse(item_ids)
        if voc.size != Q.shape[0]:
            raise ParameterError(f"The vocabulary has {voc.size} items; the queries are over {Q.shape[0]}.")
        if f is None or not (isinstance(f.dataType, ArrayType) and
                             isinstance(f.dataType.elementType, (IntegralType, StringType))):
            raise SchemaError(f"The release has no array column {items_col!r} of item ids (array<int> or "
                              "array<string>; release_items_col).")
        a = _answers_sparse(df, items_col, Q, voc)
        return a[:-1], int(a[-1])
    if f is None or not (isinstance(f.dataType, ArrayType) and isinstance(f.dataType.elementType, IntegralType)):
        raise SchemaError(f"The release has no array<int> column {items_col!r} of item indices; for a dense "
                          "release (one column per item) give its columns (release_columns).")
    a = _answers_sparse(df, items_col, Q)
    return a[:-1], int(a[-1])


def evaluate_counting_queries(
    spark,
    *,
    source,
    release,
    person: str,
    item: str,
    vocabulary,
    release_columns: Sequence[str] | None = None,
    release_items_col: str = "items",
    release_item_ids: bool = False,
    release_events: bool = False,
    release_person: str | None = None,
    release_item: str | None = None,
    threshold: float = 0.5,
    n_queries: int = 1000,
    groups: int = 5,
    max_length: int | None = None,
    sanity: float = 0.001,
    seed: int = 0,
    release_people: int | None = None,
) -> dict:
    """Relative errors of counting queries on ``release`` against the private ``source``.

    A release of another size than the source (a synthetic table of ``sparkpriv synthesize
    --rows N``) answers for its own people: its answers are scaled by ``n / release_people``
    (``n`` the source's people, public under replace-one), as the paper's protocol compares a
    synthetic table's proportions. ``release_people`` defaults to the release's rows (one per
    person); an event-table release has no row for a person without items, so give it the number
    of people it was made for (the ``--rows`` of the synthesis). A release of ``n`` people is not
    scaled.

    Parameters
    ----------
    source : DataFrame
        The private event table (owner side).
    release : DataFrame
        The released table (sparse ``release_items_col`` or dense ``release_columns``).
    release_item_ids : bool
        The sparse column holds item ids of ``vocabulary`` (``sparkpriv synthesize`` of a model
        released on event records), not vocabulary indices.
    release_events : bool
        The release is an event table, one row per (person, item) (``sparkpriv synthesize
        --explode``): columns ``release_person`` and ``release_item`` (default ``person`` and
        ``item``); each person's distinct in-vocabulary items are its row, as for the source.
        A person without items has no row there, so ``release_rows`` counts people with items.
    person, item, vocabulary
        As for :func:`~sparkpriv.spark.events.bound_contributions`.
    max_length : int, optional
        Longest query of the last group; default: the largest number of
        distinct items of a person in the source (the paper's max ||x||_1).
    release_people : int, optional
        The number of people the release stands for (default: its rows); its answers are
        scaled by ``n / release_people``.

    Returns
    -------
    dict
        ``people``, ``release_rows``, ``release_people``, ``scale`` (the factor on the release's
        answers), ``max_length``, ``queries``, per-group summaries and the overall mean relative
        error.
    """
    from pyspark.sql import functions as F

    if release_people is not None:
        check_param("release_people", release_people, [Interval("integer", 1, None, "left")],
                    "evaluate_counting_queries")

    if release_events and (release_columns or release_item_ids):
        raise ParameterError("release_events reads an event table: release_columns and release_item_ids do not "
                             "apply to it (--release-events with --release-columns / --release-prefix / "
                             "--release-item-ids).")
    if not release_events and (release_person or release_item):
        raise ParameterError("release_person and release_item name the columns of an event-table release: give "
                             "release_events too (--release-events).")
    truth = bound_contributions(source, person=person, item=item, max_items=1 << 30,
                                vocabulary=vocabulary).df.persist()
    try:
        d = Vocabulary.parse(vocabulary).size
        if max_length is None:
            max_length = int(truth.select(F.max(F.size("items"))).first()[0] or 1)
        qs = cq.draw_queries(d, max_length=max(1, max_length), n_queries=n_queries, groups=groups, seed=seed)
        true_a, n = answer_release(truth, qs.matrix, items_col="items")
    finally:
        truth.unpersist()
    if release_events:
        release = bound_contributions(release, person=release_person or person, item=release_item or item,
                                      max_items=1 << 30, vocabulary=vocabulary).df
        rel_a, n_rel = answer_release(release, qs.matrix, items_col="items")
    else:
        rel_a, n_rel = answer_release(release, qs.matrix, items_col=release_items_col, columns=release_columns,
                                      threshold=threshold, item_ids=vocabulary if release_item_ids else None)
    people = int(release_people) if release_people is not None else int(n_rel)
    scale = float(n) / people if people > 0 else 1.0  # an empty release answers 0 at any scale
    err = cq.relative_errors(true_a, rel_a * scale, n, sanity)
    return {"people": n, "release_rows": n_rel, "release_people": people, "scale": scale,
            "vocabulary_size": d, "max_length": max_length,
            "queries": qs.size, "sanity_bound": sanity * n, "seed": seed,
            "groups": cq.group_summary(err, qs), "mean_relative_error": float(err.mean())}


def format_table(result: dict) -> str:
    """The per-group table printed by ``sparkpriv evaluate counting-queries``."""
    scale = result.get("scale", 1.0)
    scaled = "" if scale == 1.0 else (f" (answers scaled by {result['people']} / {result['release_people']} "
                                      f"= {scale:.6g})")
    lines = [f"counting queries: {result['queries']} queries, {result['people']} people in the source, "
             f"{result['release_rows']} release rows{scaled}, sanity bound {result['sanity_bound']:.6g}",
             f"{'group':>5} {'lengths':>11} {'queries':>8} {'mean rel. err':>14} {'median':>10} {'max':>10}"]
    for g in result["groups"]:
        lines.append(f"{g['group']:>5} {str(g['length_min']) + '-' + str(g['length_max']):>11} {g['queries']:>8} "
                     f"{g['mean_relative_error']:>14.5f} {g['median_relative_error']:>10.5f} "
                     f"{g['max_relative_error']:>10.5f}")
    lines.append(f"{'all':>5} {'':>11} {result['queries']:>8} {result['mean_relative_error']:>14.5f}")
    return "\n".join(lines)
