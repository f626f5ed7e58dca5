"""Counting queries over item sets: the paper's utility measure for CDR and
transit releases (docs/math.md section 5; Acs et al., section 6).

A query is a set ``q`` of items; its answer on a table is the number of people
who visited ANY item of ``q``. The relative error of a release ``D'`` is

    |q(D') - q(D)| / max(q(D), s),   s = 0.001 n  (n = people in D),

over 1,000 random queries in 5 groups: the lengths of group ``i`` (1..5) are
uniform in ``[1, i * max_length / 5]`` (``max_length`` = max ||x||_1 of the
source in the paper) and items are drawn uniformly from the vocabulary.

This is an owner-side evaluation: ``q(D)`` reads the private source. Any
release that can say, for each of its rows, which items it "visited" can be
evaluated: a sparse release (item indices per row) or a dense one (one column
per item, visited when the value is at least a threshold).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, check_param

__all__ = ["QuerySet", "draw_queries", "answer_queries", "answers_under_independence", "relative_errors",
           "group_summary", "expected_answers_after_flips"]


@dataclass(frozen=True)
class QuerySet:
    """``matrix`` (d, n_queries) float64 0/1 membership; ``group`` (n_queries,) 1..groups."""

    matrix: np.ndarray
    group: np.ndarray
    length: np.ndarray

    @property
    def size(self) -> int:
        return self.matrix.shape[1]


def draw_queries(d: int, *, max_length: int, n_queries: int = 1000, groups: int = 5, seed: int = 0,
                 weights=None) -> QuerySet:
    """Random item-set queries, ``n_queries // groups`` per group (the paper's protocol).

    ``weights`` (d,) positive: the items of a query are drawn without replacement with
    probabilities proportional to them (e.g. a released item popularity) instead of uniformly.
    """
    caller = "draw_queries"
    check_param("d", d, [Interval("integer", 1, None, "left")], caller)
    check_param("max_length", max_length, [Interval("integer", 1, None, "left")], caller)
    check_param("n_queries", n_queries, [Interval("integer", 1, None, "left")], caller)
    check_param("groups", groups, [Interval("integer", 1, None, "left")], caller)
    p = None
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (d,) or not np.all(np.isfinite(w)) or not np.all(w > 0):
            raise ValueError(f"{caller}: weights must be {d} finite positive numbers (one per item); add a "
                             "positive floor to released popularities")
        p = w / w.sum()
    rng = np.random.default_rng(seed)
    per = np.full(groups, n_queries // groups)
    per[: n_queries % groups] += 1
    Q = np.zeros((d, n_queries))
    grp = np.repeat(np.arange(1, groups + 1), per)
    lengths = np.empty(n_queries, np.int64)
    for j, g in enumerate(grp):
        hi = max(1, min(d, int(g * max_length // groups)))
        m = int(rng.integers(1, hi + 1))
        Q[rng.choice(d, m, replace=False, p=p), j] = 1.0
        lengths[j] = m
    return QuerySet(Q, grp, lengths)


def answer_queries(offsets: np.ndarray, indices: np.ndarray, Q: np.ndarray, *,
                   block_rows: int = 16_384) -> np.ndarray:
    """Per query, how many rows visited at least one of its items (float64, exact counts).

    The rows are answered ``block_rows`` at a time (memory ``block_rows x n_queries``)."""
    from scipy.sparse import csr_matrix

    offsets = np.asarray(offsets, np.int64)
    indices = np.asarray(indices)
    n = offsets.size - 1
    out = np.zeros(Q.shape[1])
    for s in range(0, n, block_rows):
        e = min(n, s + block_rows)
        X = csr_matrix((np.ones(int(offsets[e] - offsets[s])), indices[offsets[s]:offsets[e]],
                        offsets[s:e + 1] - offsets[s]), shape=(e - s, Q.shape[0]))
        out += (np.asarray(X @ Q) > 0).sum(axis=0)
    return out


def answers_under_independence(item_counts, n: float, Q: np.ndarray) -> np.ndarray:
    """Per query, ``n (1 - prod_{j in q} (1 - c_j / n))``: its answer if people visited
    items independently with the released per-item rates (docs/counts.md, "Counting
    queries from the counts").

    ``item_counts`` (d,) are released per-item counts of distinct people (noisy:
    post-processing of a counts release); each rate ``c_j / n`` is clipped to
    [0, 1]. ``n`` is the public number of people (the replace-one relation makes it
    public). This is the baseline a synthetic table must beat: it keeps every
    item's popularity and nothing of how items go together.
    """
    caller = "answers_under_independence"
    check_param("n", n, [Interval("real", 0, None, "neither")], caller)
    c = np.asarray(item_counts, float).ravel()
    if c.size != Q.shape[0]:
        raise ValueError(f"{caller}: {c.size} item counts for queries over {Q.shape[0]} items")
    if not np.all(np.isfinite(c)):
        raise ValueError(f"{caller}: the item counts must be finite")
    rate = np.clip(c / float(n), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        log_miss = np.log1p(-rate)  # -inf where every person visited the item
    miss = np.exp(np.asarray(Q, float).T @ np.where(np.isinf(log_miss), -1e300, log_miss))
    return float(n) * (1.0 - miss)


def relative_errors(true: np.ndarray, released: np.ndarray, n: int, sanity: float = 0.001) -> np.ndarray:
    """``|released - true| / max(true, sanity * n)``."""
    true = np.asarray(true, float)
    return np.abs(np.asarray(released, float) - true) / np.maximum(true, sanity * n)


def group_summary(errors: np.ndarray, qs: QuerySet) -> list[dict]:
    """Mean (and median, max) relative error and length range per group."""
    out = []
    for g in np.unique(qs.group):
        sel = qs.group == g
        e = errors[sel]
        out.append({"group": int(g), "queries": int(sel.sum()),
                    "length_min": int(qs.length[sel].min()), "length_max": int(qs.length[sel].max()),
                    "mean_relative_error": float(e.mean()), "median_relative_error": float(np.median(e)),
                    "max_relative_error": float(e.max())})
    return out


def expected_answers_after_flips(offsets, indices, Q: np.ndarray, p: float) -> np.ndarray:
    """E[q(D')] when every entry of the binary table D is flipped independently with
    probability ``p``: a row with ``a`` items in ``q`` and ``b`` outside answers 0
    with probability ``p^a (1-p)^b`` (closed form used to test the evaluator)."""
    offsets = np.asarray(offsets, np.int64)
    n = offsets.size - 1
    sizes = Q.sum(axis=0)
    from scipy.sparse import csr_matrix

    X = csr_matrix((np.ones(int(offsets[-1])), np.asarray(indices), offsets), shape=(n, Q.shape[0]))
    a = np.asarray(X @ Q)  # (n, nq) items of q the row visited
    zero = p ** a * (1 - p) ** (sizes[None, :] - a)
    return (1 - zero).sum(axis=0)
