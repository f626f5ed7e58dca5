"""Exact sensitivities of linear maps ``v -> v P`` (docs/math.md section 2).

``P`` is a realized ``(d, k)`` matrix drawn independently of the data, so a
mechanism calibrated to the sensitivity of *this* ``P`` is private conditional
on every ``P``, hence unconditionally, with no failure probability.

For a change ``v`` of one record (``v = x - x'`` under replace-one, ``v = x``
under add/remove, ``v = L e_i`` for one attribute under the element-wise
relation), the L1 sensitivity is ``sup_v ||v P||_1`` over the allowed ``v``:

* ``||v||_1 <= r``: the sup of a convex function over the cross-polytope is
  at a vertex ``r e_i``: ``r max_i ||P_i||_1`` (exact).
* one attribute changes by at most ``w_i`` (element-wise): ``max_i w_i ||P_i||_1``.
  This bounds ``v -> v P`` only if the change stays in one coordinate after
  clipping: true for a box clip (coordinate by coordinate, ``w_i = min(L,
  upper_i - lower_i)``), false for a row norm clip, which rescales every
  coordinate (refused by :meth:`sparkpriv.privacy.bounds.Bounds.change_constraints`).
* ``||v||_2 <= r``: ``||v P||_1 = max_{s in {+-1}^k} <v, P s>`` so the sup is
  ``r max_s ||P s||_2 = r ||P||_{2->1}`` (exact). Enumerating ``s`` and ``-s``
  together needs ``2^(k-1)`` sign vectors, done for ``k <= 20``; above that the
  bound ``r sqrt(k) s_max(P)`` (``||u||_1 <= sqrt(k) ||u||_2``) is used.
* a box ``|v_i| <= w_i``: ``sup_v max_s <v, P s> = max_s sum_i w_i |(P s)_i|``
  (exact by the same enumeration); above ``k = 20`` the smaller of the two
  valid bounds ``sum_i w_i ||P_i||_1`` and ``||w||_2 sqrt(k) s_max(P)``.

L2 sensitivities (Gaussian noise): ``||v||_2 <= r`` gives ``r s_max(P)``
(exact); element-wise ``max_i w_i ||P_i||_2`` (exact); a box gives the bound
``min(||w||_2 s_max(P), sum_i w_i ||P_i||_2)``; ``||v||_1 <= r`` gives
``r max_i ||P_i||_2`` (exact, vertices of the cross-polytope).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "EXACT_SIGN_ENUMERATION_MAX_K",
    "row_l1_norms",
    "norm_2_to_1",
    "box_l1_sensitivity",
    "l1_sensitivity",
    "l2_sensitivity",
]

EXACT_SIGN_ENUMERATION_MAX_K = 20
_CHUNK = 1 << 14


def row_l1_norms(P: np.ndarray) -> np.ndarray:
    return np.abs(P).sum(axis=1)


def _sign_chunks(k: int):
    """Yield ``(k, m)`` float matrices whose columns run over half of {+-1}^k.

    The last coordinate is fixed to +1 (``s`` and ``-s`` give the same norm).
    """
    total = 1 << (k - 1)
    bits = np.arange(k - 1, dtype=np.int64)
    for start in range(0, total, _CHUNK):
        idx = np.arange(start, min(start + _CHUNK, total), dtype=np.int64)
        S = np.ones((k, idx.size))
        if k > 1:
            S[: k - 1] = 1.0 - 2.0 * ((idx[None, :] >> bits[:, None]) & 1)
        yield S


def _max_weighted_abs(P: np.ndarray, w: np.ndarray | None, squared_l2: bool) -> float:
    best = 0.0
    for S in _sign_chunks(P.shape[1]):
        Y = P @ S  # (d, m)
        if squared_l2:
            vals = np.einsum("ij,ij->j", Y, Y)
        else:
            vals = w @ np.abs(Y)
        best = max(best, float(vals.max()))
    return float(np.sqrt(best)) if squared_l2 else best


def norm_2_to_1(P: np.ndarray) -> tuple[float, bool]:
    """``||P||_{2->1} = max_{||v||_2 <= 1} ||v P||_1``; returns ``(value, exact)``."""
    k = P.shape[1]
    if k <= EXACT_SIGN_ENUMERATION_MAX_K:
        return _max_weighted_abs(P, None, squared_l2=True), True
    return float(np.sqrt(k) * np.linalg.norm(P, 2)), False


def box_l1_sensitivity(P: np.ndarray, widths: np.ndarray) -> tuple[float, bool]:
    """``sup_{|v_i| <= w_i} ||v P||_1``; returns ``(value, exact)``."""
    w = np.asarray(widths, dtype=float)
    k = P.shape[1]
    if k <= EXACT_SIGN_ENUMERATION_MAX_K:
        return _max_weighted_abs(P, w, squared_l2=False), True
    b1 = float(w @ row_l1_norms(P))
    b2 = float(np.linalg.norm(w) * np.sqrt(k) * np.linalg.norm(P, 2))
    return min(b1, b2), False


def l1_sensitivity(
    P: np.ndarray,
    *,
    l2_radius: float | None = None,
    l1_radius: float | None = None,
    box_widths: np.ndarray | None = None,
    element_widths: np.ndarray | None = None,
) -> tuple[float, str]:
    """The L1 sensitivity of ``v -> v P`` for the given constraints on ``v``.

    Several constraints may hold at once (e.g. a box and a row norm); each
    gives a valid bound and the smallest is returned with a label of how it
    was obtained. ``element_widths`` (element-wise relation) is exclusive.
    """
    if element_widths is not None:
        w = np.asarray(element_widths, dtype=float)
        return float(np.max(w * row_l1_norms(P))), "exact: max_i w_i ||P_i||_1 (element-wise)"
    cands: list[tuple[float, str]] = []
    if l1_radius is not None:
        cands.append((float(l1_radius) * float(row_l1_norms(P).max()), "exact: r max_i ||P_i||_1"))
    if l2_radius is not None:
        v, exact = norm_2_to_1(P)
        label = "exact: r ||P||_{2->1} by sign enumeration" if exact else "bound: r sqrt(k) s_max(P)"
        cands.append((float(l2_radius) * v, label))
    if box_widths is not None:
        v, exact = box_l1_sensitivity(P, box_widths)
        label = "exact: max_s sum_i w_i |(P s)_i| (box)" if exact else "bound: box, min of two bounds"
        cands.append((v, label))
    if not cands:
        raise ValueError("no constraint on the change of a record was given")
    return min(cands, key=lambda c: c[0])


def l2_sensitivity(
    P: np.ndarray,
    *,
    l2_radius: float | None = None,
    l1_radius: float | None = None,
    box_widths: np.ndarray | None = None,
    element_widths: np.ndarray | None = None,
) -> tuple[float, str]:
    """The L2 sensitivity of ``v -> v P`` (see module docstring)."""
    row_l2 = np.linalg.norm(P, axis=1)
    if element_widths is not None:
        w = np.asarray(element_widths, dtype=float)
        return float(np.max(w * row_l2)), "exact: max_i w_i ||P_i||_2 (element-wise)"
    cands: list[tuple[float, str]] = []
    smax = None
    if l2_radius is not None:
        smax = float(np.linalg.norm(P, 2))
        cands.append((float(l2_radius) * smax, "exact: r s_max(P)"))
    if l1_radius is not None:
        cands.append((float(l1_radius) * float(row_l2.max()), "exact: r max_i ||P_i||_2"))
    if box_widths is not None:
        w = np.asarray(box_widths, dtype=float)
        smax = float(np.linalg.norm(P, 2)) if smax is None else smax
        cands.append((min(float(np.linalg.norm(w)) * smax, float(w @ row_l2)), "bound: box"))
    if not cands:
        raise ValueError("no constraint on the change of a record was given")
    return min(cands, key=lambda c: c[0])
