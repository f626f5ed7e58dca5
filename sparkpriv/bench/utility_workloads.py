"""The workloads of ``sparkpriv bench utility``: union queries and co-occurrence counts.

Three query sets per table, fixed once per table (the same for every method and draw):

* ``uniform``: the paper's union queries (:func:`sparkpriv.mechanisms.counting_queries.draw_queries`):
  1,000 item sets in 5 length groups (group ``i``: lengths uniform in ``[1, i L_max / 5]``,
  ``L_max`` the longest record of the table), items uniform over the vocabulary; the
  answer of a set is the number of people with at least one of its items;
* ``popular``: the same, items drawn with probability proportional to a DP item
  popularity (``max(noisy count, 0) + 1``);
* ``pairs``: the 1,000 most popular item pairs by DP pair counts among the most popular
  items by DP counts; the answer is the number of people with both items.

The DP counts that choose ``popular`` and ``pairs`` are the workload's own release,
spent separately from (and not charged to) the methods compared: replace-one Gaussians
calibrated by the library (:func:`sparkpriv.privacy.noise.calibrate_gaussian_noise`,
analytic Gaussian: the exact privacy curve of one Gaussian), ``epsilon_w / 2`` and
``delta_w / 2`` each:

* item counts of each person's record capped at ``select_cap`` items (L2 sensitivity
  ``sqrt(2 L)``);
* pair counts among the ``candidates`` most popular items by those noisy counts, each
  person's pair vector scaled to unit L2 norm (a person holding ``m`` candidate items
  adds ``1 / sqrt(m (m - 1) / 2)`` to each of their pairs; sensitivity ``sqrt(2)``), so
  no cap is needed and heavy users do not drown the noise.

The truth is taken on the UNCAPPED table.

Error of a release (answers scaled to ``n`` people): ``|answer - truth| / max(truth, 0.001 n)``
per query, averaged over the 1,000 queries of a workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from sparkpriv.mechanisms.counting_queries import (QuerySet, answer_queries, draw_queries, group_summary,
                                                   relative_errors)

__all__ = ["WORKLOADS", "Workload", "make_workload", "pair_counts", "answers", "errors", "SANITY"]

WORKLOADS = ("uniform", "popular", "pairs")
SANITY = 0.001  # the paper's sanity bound: relative errors divide by max(truth, 0.001 n)


@dataclass(frozen=True)
class Workload:
    """The query sets of one table and their true answers (owner-side evaluation)."""

    n: int
    d: int
    uniform: QuerySet
    popular: QuerySet
    pairs: np.ndarray  # (P, 2) item indices a < b
    truth: dict = field(repr=False)  # workload name -> (queries,) true answers
    selection: dict = field(default_factory=dict)  # public description of the DP selection

    def queries(self, name: str) -> QuerySet:
        return {"uniform": self.uniform, "popular": self.popular}[name]


def pair_counts(X: sparse.spmatrix, pairs: np.ndarray) -> np.ndarray:
    """Per pair ``(a, b)``, the number of rows of the 0/1 matrix ``X`` holding both items (float64)."""
    Xc = sparse.csc_matrix(X)
    Xc.data = np.ones_like(Xc.data, dtype=np.float64)
    A = Xc[:, pairs[:, 0]]
    B = Xc[:, pairs[:, 1]]
    return np.asarray(A.multiply(B).sum(axis=0), dtype=np.float64).ravel()


def _selection_noise(sensitivity: float, epsilon: float, delta: float, dim: int, max_abs: float):
    from sparkpriv.privacy.noise import calibrate_gaussian_noise

    return calibrate_gaussian_noise(sensitivity=sensitivity, epsilon=epsilon, delta=delta, dim=max(1, int(dim)),
                                    max_abs=float(max_abs))


def make_workload(X: sparse.csr_matrix, *, seed: int, n_queries: int = 1000, n_pairs: int = 1000, groups: int = 5,
                  epsilon: float = 2.0, delta: float | None = None, select_cap: int = 16,
                  candidates: int = 1000) -> Workload:
    """The three query sets of the table ``X`` (people, items) and their truth (module docstring).

    ``epsilon``, ``delta`` (default ``1 / (10 n)``): the budget of the DP counts that choose
    the popular items and pairs (not charged to the methods); ``select_cap``: their
    per-person cap; ``candidates``: pairs are chosen among this many most popular items.
    """
    from sparkpriv.bench.utility_data import cap_rows
    from sparkpriv.privacy.noise import add_noise
    from sparkpriv.privacy.random import stream

    X = sparse.csr_matrix(X, dtype=np.float64)
    n, d = X.shape
    delta = 1.0 / (10.0 * n) if delta is None else float(delta)
    L = int(select_cap)
    Xc = cap_rows(X, L, np.random.default_rng([seed, 1]))
    longest = int(np.diff(X.indptr).max())
    item_noise = _selection_noise(np.sqrt(2.0 * L), epsilon / 2, delta / 2, min(2 * L, d), n)
    noisy_items = add_noise(np.asarray(Xc.sum(axis=0)).ravel(), item_noise, stream(seed, 2))
    uniform = draw_queries(d, max_length=longest, n_queries=n_queries, groups=groups, seed=seed)
    popular = draw_queries(d, max_length=longest, n_queries=n_queries, groups=groups, seed=seed + 1,
                           weights=np.maximum(noisy_items, 0.0) + 1.0)
    # pairs: among the most popular items by the noisy counts, the pairs of largest noisy weighted count
    M = int(min(d, candidates))
    top = np.argsort(-noisy_items, kind="stable")[:M]
    Xm = sparse.csr_matrix(X[:, top])
    m = np.diff(Xm.indptr).astype(np.float64)
    w = np.where(m >= 2, 1.0 / np.sqrt(np.maximum(m * (m - 1) / 2, 1.0)), 0.0)
    C = (Xm.T @ sparse.diags(w) @ Xm).toarray()
    ia, ib = np.triu_indices(M, 1)
    pair_noise = _selection_noise(np.sqrt(2.0), epsilon / 2, delta / 2, ia.size, n)
    noisy_pairs = add_noise(C[ia, ib], pair_noise, stream(seed, 3))
    P = int(min(n_pairs, ia.size))
    best = np.argsort(-noisy_pairs, kind="stable")[:P]
    a, b = top[ia[best]], top[ib[best]]
    pairs = np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)
    truth = {"uniform": answer_queries(X.indptr, X.indices, uniform.matrix),
             "popular": answer_queries(X.indptr, X.indices, popular.matrix),
             "pairs": pair_counts(X, pairs)}
    selection = {"epsilon": float(epsilon), "delta": delta, "select_cap": L, "candidates": M,
                 "item_noise_std": item_noise.std, "pair_noise_std": pair_noise.std,
                 "longest_record": longest, "neighbors": "replace-one",
                 "note": "DP counts that choose the popular items and pairs: the workload's own budget, "
                         "not charged to the methods compared"}
    return Workload(n, d, uniform, popular, pairs, truth, selection)


def answers(output, wl: Workload) -> dict:
    """The answers of one method's output to the three workloads, in people of the table.

    ``output``: a synthetic table (scipy sparse, ``(m, d)`` 0/1; its answers are
    scaled by ``n / m``) or a model with ``unions(Q)`` and ``pairs(pairs)`` (answers
    in people of the table, e.g. :class:`~sparkpriv.bench.utility_methods.IndependentItems`).
    """
    if sparse.issparse(output):
        S = sparse.csr_matrix(output)
        if S.shape[1] != wl.d:
            raise ValueError(f"a synthetic table of {S.shape[1]} columns for a table of {wl.d} items")
        m = S.shape[0]
        scale = wl.n / m if m else 0.0
        if m == 0:
            return {w: np.zeros_like(wl.truth[w]) for w in WORKLOADS}
        S.sum_duplicates()
        return {"uniform": answer_queries(S.indptr, S.indices, wl.uniform.matrix) * scale,
                "popular": answer_queries(S.indptr, S.indices, wl.popular.matrix) * scale,
                "pairs": pair_counts(S, wl.pairs) * scale}
    return {"uniform": np.asarray(output.unions(wl.uniform.matrix), float),
            "popular": np.asarray(output.unions(wl.popular.matrix), float),
            "pairs": np.asarray(output.pairs(wl.pairs), float)}


def errors(ans: dict, wl: Workload) -> dict:
    """Per workload: the mean relative error and, for the union workloads, the mean by length group."""
    out = {}
    for w in WORKLOADS:
        e = relative_errors(wl.truth[w], ans[w], wl.n, SANITY)
        out[w] = {"mean": float(e.mean())}
        if w != "pairs":
            out[w]["groups"] = [g["mean_relative_error"] for g in group_summary(e, wl.queries(w))]
    return out
