"""DPRP of sparse event records (docs/math.md section 8; the mechanism, whose records
branch runs these functions per block on the Spark engine, is :mod:`sparkpriv.mechanisms.dprp`).

A person's bounded record is a sparse vector over a public vocabulary of
``d`` items with values in ``[0, c]`` (``c = 1`` binary) and
``||x||_2 <= c sqrt(L)``. Divided by ``c`` it is a prepared row with the box
``[0, 1]`` and ``Z = sqrt(L)``, so the sensitivities of
:mod:`sparkpriv.mechanisms.dprp` hold unchanged (the cap bounds the record; the Spark
mechanism still applies ``clip_sparse_rows``, which changes nothing on capped
records). On that domain they are ``sqrt(min(2 L, d)) s_max(R)`` (two
records on disjoint items) and, for ``d >= 2 L``, ``sqrt(L (L + 1))`` for
the Gram's unique entries: exact, checked against every pair of binary
records for small ``d`` (docs/dprp.md, "Sensitivity"). ``X^T X`` is a sparse product and ``X R`` the sum of the
rows of ``R`` at a record's items. ``X' = P' M`` is dense (``d`` values per
person), so it is released thresholded: the items with ``c X'_j >=
threshold``, computed a chunk of rows at a time. DPRP's defaults
(``k2 = 0.6 d``) are made for small dense tables: for records ``k2 = min(d, 64)`` (and ``k1 = 4 k2``),
because every person costs ``k1`` noise draws and ``k1 d`` multiply-adds;
without noise a larger ``k2`` keeps more of the records, with noise the
per-item noise grows with ``k2`` (docs/cdr.md measures both).
"""

from __future__ import annotations

import numpy as np

from sparkpriv.mechanisms.sparse import _csr, project_sparse_rows
from sparkpriv.privacy import noise as _noise

__all__ = ["default_k2_records", "gram_partial_sparse", "reconstruct_sparse_items",
           "RECORDS_MAX_K2", "RECONSTRUCT_CHUNK_ROWS"]

RECORDS_MAX_K2 = 64  # default k2 of event records: min(d, RECORDS_MAX_K2) (module docstring)
RECONSTRUCT_CHUNK_ROWS = 2048  # rows of P' M (n x d) held at once by reconstruct_sparse_items


def default_k2_records(d: int) -> int:
    """``min(d, 64)``: the default for sparse event records, whose ``d`` (a
    vocabulary) is large; ``0.6 d`` would cost ``4 k2`` noise draws and
    ``4 k2 d`` multiply-adds per person (module docstring)."""
    return max(1, min(int(d), RECORDS_MAX_K2))


def gram_partial_sparse(offsets, indices, values, d: int, value_cap: float = 1.0) -> np.ndarray:
    """:func:`gram_partial` (one group) of sparse records scaled to ``[0, 1]``.

    ``offsets, indices, values`` are CSR parts of ``n`` records over ``d`` items
    (``values`` None: binary; :mod:`sparkpriv.mechanisms.sparse`); the rows are
    divided by ``value_cap`` (the cap ``c`` of counts records, 1 for binary).
    ``X^T X`` is the scipy CSR product, so a ``d``-wide row is never built.
    Returns ``[n, upper triangle of X^T X (row-major)]``, shape
    ``(1 + d (d + 1) / 2,)``, the same vector as ``gram_partial(X / c, None, 1)``
    for the densified rows (equal in every bit when the products and sums are
    exact, e.g. binary records or a power-of-two ``c``; tested).
    """
    offsets = np.asarray(offsets, np.int64)
    n = offsets.size - 1
    out = np.zeros(1 + d * (d + 1) // 2, dtype=np.float64)
    out[0] = n
    if n <= 0 or offsets[-1] == 0:
        return out
    v = np.ones(int(offsets[-1])) if values is None else np.asarray(values, np.float64)
    if value_cap != 1.0:
        v = v / float(value_cap)
    X = _csr(offsets, indices, v, d)
    G = (X.T @ X).tocoo()
    G.sum_duplicates()
    keep = G.row <= G.col
    i = G.row[keep].astype(np.int64)
    j = G.col[keep].astype(np.int64)
    # start of row i of the row-major upper triangle: sum_{r < i} (d - r)
    out[1 + i * d - i * (i - 1) // 2 + (j - i)] = G.data[keep]
    return out


def reconstruct_sparse_items(offsets, indices, values, R: np.ndarray, M: np.ndarray, noise,
                             rng: np.random.Generator | None, *, value_cap: float = 1.0,
                             threshold: float = 0.5, chunk_rows: int = RECONSTRUCT_CHUNK_ROWS):
    """Thresholded reconstruction of sparse records: the items where ``X' >= threshold``.

    ``P' = (X / c) R + noise`` (the sum of the rows of ``R`` at a record's
    items, :func:`~sparkpriv.mechanisms.sparse.project_sparse_rows`, never
    densified), then ``X' = c P' M`` (``c = value_cap``, back in the records'
    units) is computed ``chunk_rows`` rows at a time, so at most
    ``chunk_rows x d`` doubles of the dense reconstruction exist at once.
    ``noise=None`` gives the reconstruction without noise (tests).

    Returns
    -------
    offsets : int64 (n + 1,)
    items : int32 (nnz,)
        Per record, the sorted item indices ``j`` with ``c (P' M)_j >= threshold``.
    """
    offsets = np.asarray(offsets, np.int64)
    n = offsets.size - 1
    v = None if values is None else np.asarray(values, np.float64) / float(value_cap)
    if values is None and value_cap != 1.0:
        v = np.full(int(offsets[-1]), 1.0 / float(value_cap))
    P = project_sparse_rows(offsets, indices, v, R)
    if noise is not None and n > 0:
        P = _noise.add_noise(P, noise, rng)
    cut = float(threshold) / float(value_cap)
    sizes = np.zeros(n, np.int64)
    parts = []
    for s in range(0, n, int(chunk_rows)):
        Xr = P[s:s + int(chunk_rows)] @ M
        r, c = np.nonzero(Xr >= cut)  # row-major: items sorted within a row
        sizes[s:s + Xr.shape[0]] = np.bincount(r, minlength=Xr.shape[0])
        parts.append(c.astype(np.int32))
        del Xr
    out_off = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    items = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return out_off, items
