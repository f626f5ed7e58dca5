"""DPRP's per-batch work (bounding, the projected rows, the Gram matrices' partials, imputation)
and the driver's solve (noisy Gram matrices, reconstruction; docs/dprp.md)."""

from __future__ import annotations

import logging
import math
from typing import Sequence

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.bounds import ClipCounts, clip_rows
from sparkpriv.mechanisms.dprp._plan import AMPLIFICATION_WARN, DPRPPlan, _jsonable

_log = logging.getLogger("sparkpriv.mechanisms.dprp")  # one logger for the package

# ----------------------------------------------------------------------------- per-batch work


def fill_missing(X: np.ndarray, missing: np.ndarray | None, values: np.ndarray | None) -> np.ndarray:
    """Replace ``X[missing]`` by the per-column ``values`` (in place); returns ``X``."""
    if missing is not None and values is not None and missing.any():
        cols = np.nonzero(missing)[1]
        X[missing] = np.asarray(values, float)[cols]
    return X


def prepare_rows(X: np.ndarray, plan: DPRPPlan, codes: np.ndarray | None = None
                 ) -> tuple[np.ndarray, ClipCounts]:
    """Scale features to [0, 1], append the private label block, clip to the box and ball.

    ``X`` (n_samples, d) in the columns' units, already filled; ``codes`` the class
    index of each row (needed for private labels). Returns ``(X_prepared, counts)``
    of shape (n_samples, d_aug).
    """
    n, d = X.shape
    lo = np.asarray(plan.lower, float)
    inv_w = 1.0 / (np.asarray(plan.upper, float) - lo)
    out = np.empty((n, plan.d_aug), dtype=np.float64)
    np.subtract(X, lo, out=out[:, :d])
    out[:, :d] *= inv_w
    if plan.n_label_columns:
        out[:, d:] = 0.0
        out[np.arange(n), d + np.asarray(codes, np.int64)] = plan.label_scale
    return clip_rows(out, plan.unit_bounds, out=out)


def gram_partial(Xp: np.ndarray, groups: np.ndarray | None, n_groups: int) -> np.ndarray:
    """Per group: ``[count, upper triangle of Xp_g^T Xp_g (row-major)]``, float64.

    Shape ``(n_groups * (1 + d (d + 1) / 2),)``; summed over batches and
    partitions it gives every group's size and Gram matrix.
    """
    d = Xp.shape[1]
    iu = np.triu_indices(d)
    t = 1 + iu[0].size
    out = np.zeros(n_groups * t, dtype=np.float64)
    for g in range(n_groups):
        Xg = Xp if groups is None else Xp[groups == g]
        if Xg.shape[0] == 0:
            continue
        G = Xg.T @ Xg
        out[g * t] = Xg.shape[0]
        out[g * t + 1:(g + 1) * t] = G[iu]
    return out


def gram_from_partial(total: np.ndarray, d: int, n_groups: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(counts, [symmetric Gram (d, d) per group])`` from a summed :func:`gram_partial`."""
    iu = np.triu_indices(d)
    t = 1 + iu[0].size
    counts = np.empty(n_groups)
    grams = []
    for g in range(n_groups):
        v = total[g * t:(g + 1) * t]
        counts[g] = v[0]
        G = np.zeros((d, d))
        G[iu] = v[1:]
        G[iu[1], iu[0]] = v[1:]
        grams.append(G)
    return counts, grams


def impute_partial(X: np.ndarray, missing: np.ndarray, plan: DPRPPlan) -> np.ndarray:
    """``[sums of non-missing values on the [0, 1] scale (clipped), counts of non-missing, rows]``.

    Shape ``(2 d + 1,)``. Only the first ``2 d`` entries are noised; the row
    count (public under replace-one) sizes the noise grid.
    """
    lo = np.asarray(plan.lower, float)
    w = np.asarray(plan.upper, float) - lo
    U = np.clip((X - lo) / w, 0.0, 1.0)
    U[missing] = 0.0
    present = ~missing
    return np.concatenate([U.sum(axis=0), present.sum(axis=0).astype(np.float64), [float(X.shape[0])]])


def dp_column_means(total: np.ndarray, noise, rng: np.random.Generator | None, plan: DPRPPlan,
                    *, with_std: bool = False):
    """Column means in the columns' units from a summed :func:`impute_partial`.

    Noise is added once, on the driver (``noise=None``: exact means, for tests).
    ``with_std``: also their first-order std (:func:`fill_value_std`, from the
    noisy counts: post-processing), returned as ``(means, std)``.
    """
    d = plan.d
    noisy = total[:2 * d] if noise is None else _noise.add_noise(total[:2 * d], noise, rng)
    m = np.clip(noisy[:d] / np.maximum(noisy[d:], 1.0), 0.0, 1.0)
    lo = np.asarray(plan.lower, float)
    means = lo + m * (np.asarray(plan.upper, float) - lo)
    if with_std:
        return means, fill_value_std(m, noisy[d:], 0.0 if noise is None else noise.std, plan)
    return means


def fill_value_std(means01: np.ndarray, noisy_counts: np.ndarray, noise_std: float, plan: DPRPPlan) -> np.ndarray:
    """First-order (delta method) std of the DP column means, in the columns' units:
    ``sigma sqrt(1 + m^2) / max(count, 1) (upper - lower)``, ``m`` the mean on the [0, 1]
    scale, ``sigma`` the noise std of each sum and each count, ``count`` the noisy count of
    non-missing values (docs/dprp.md, "Uncertainty"; meaningful when the count is far above sigma)."""
    m = np.asarray(means01, float)
    w = np.asarray(plan.upper, float) - np.asarray(plan.lower, float)
    return float(noise_std) * np.sqrt(1.0 + m * m) / np.maximum(np.asarray(noisy_counts, float), 1.0) * w


def released_value_std(M: np.ndarray, noise, plan: DPRPPlan) -> np.ndarray:
    """Std of the noise in each released column, before the decode's clip: ``(e M)_j`` with ``e``
    i.i.d. of the row noise's variance, so ``std_j = s ||M[:, j]||_2``; feature columns are mapped
    to the columns' units (times ``upper - lower``); label-block columns stay on their scale."""
    s = math.sqrt(float(noise.variance))
    std = s * np.linalg.norm(np.asarray(M, float), axis=0)
    w = np.asarray(plan.upper, float) - np.asarray(plan.lower, float)
    std[:plan.d] *= w
    return std


def uncertainty_public(dplan: DPRPPlan, Ms: Sequence[np.ndarray], columns: Sequence[str], *,
                       fill_std=None, kind: str = "table") -> dict:
    """The receipt's ``uncertainty`` of a DPRP release (public: functions of the noisy Gram, the
    realized ``R`` and the public noise scale; docs/dprp.md, "Uncertainty")."""
    stds = [released_value_std(M, dplan.projection_noise, dplan) for M in Ms]
    if kind == "records":
        v = stds[0]  # bounds [0, c]: already in events (c (e M)_j)
        return {
            "value_std": {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())},
            "value_note": "std of the noise in each item's reconstructed value (in events) before the "
                          "threshold: an item is released when value >= threshold; the noise is Gaussian, "
                          "so an item whose noise-free value is t is released with probability "
                          "1 - Phi((threshold - t) / std)",
            "docs": "docs/dprp.md",
        }
    names = list(columns)

    def per_column(std):
        return {c: float(v) for c, v in zip(names, std[:dplan.d])}

    if dplan.label_mode == "public":
        value_std = {str(_jsonable(c)): per_column(sd) for c, sd in zip(dplan.classes, stds)}
    else:
        value_std = per_column(stds[0])
    out = {
        "value_std": value_std,
        "value_std_by": "class (labels are public: one run per class)" if dplan.label_mode == "public"
                        else "column",
        "value_note": "each released cell is the noise-free reconstruction (x R M of the prepared row) plus "
                      "Gaussian noise of this std, in the column's units, then clipped to [lower, upper]; "
                      "95%: value +- 1.96 std covers the clipped noise-free reconstruction (at least 95%: the "
                      "clip only moves a value closer); integer columns: add 0.5 (rounding). The "
                      "reconstruction's own error against the input (rank k2, the noisy Gram) is not in it",
        "docs": "docs/dprp.md",
    }
    if dplan.label_mode == "private":
        out["label_note"] = "private labels are decoded by argmax: no interval"
    if fill_std is not None:
        out["fill_value_std"] = {c: float(v) for c, v in zip(names, fill_std)}
        out["fill_note"] = ("first-order std of each DP column mean (dp_fill_values), from the noisy count "
                            "of non-missing values; 95%: fill +- 1.96 std")
    return out


# ----------------------------------------------------------------------------- driver solve


def noisy_grams(grams: Sequence[np.ndarray], noise, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Add symmetric noise once per group (``noise=None``: no noise, for tests)."""
    if noise is None:
        return [np.array(G, float) for G in grams]
    return [_noise.add_noise_symmetric(G, noise, rng) for G in grams]


def reconstruction_matrix(C: np.ndarray, R: np.ndarray, k2: int) -> tuple[np.ndarray, float]:
    """``M = (V'^T R)^+ V'^T`` (k1, d) from the symmetric ``C`` (d, d); and ``s_min(V'^T R)``."""
    w, V = np.linalg.eigh(C)
    Vk = V[:, np.argsort(w)[::-1][:k2]]  # top-k2 eigenvectors, (d, k2)
    A = Vk.T @ R  # (k2, k1)
    U, s, Wt = np.linalg.svd(A, full_matrices=False)
    smin = float(s[-1])
    if smin <= s[0] * 1e-12:
        raise ParameterError("The matrix V'^T R is singular; increase k1.")  # probability 0
    M = (Wt.T / s) @ (U.T @ Vk.T)  # pinv(A) @ Vk.T
    return M, smin


def solve(grams_noisy: Sequence[np.ndarray], R: np.ndarray, k2: int, *, caller: str = "dprp") -> list[np.ndarray]:
    """Reconstruction matrices of every group; warns on bad conditioning (value not logged)."""
    Ms = []
    bad = 0
    for C in grams_noisy:
        M, smin = reconstruction_matrix(C, R, k2)
        bad += smin * AMPLIFICATION_WARN < 1.0
        Ms.append(M)
    if bad:
        _log.warning("%s: the realized V'^T R amplifies the projection noise by more than %.1fx "
                     "in %d of %d run(s); use a larger k1", caller, AMPLIFICATION_WARN, bad, len(Ms))
    return Ms


def reconstruct_rows(Xp: np.ndarray, R: np.ndarray, Ms: Sequence[np.ndarray], groups: np.ndarray | None,
                     noise, rng: np.random.Generator | None) -> np.ndarray:
    """``X' = (Xp R + noise) M_g`` row by row (``noise=None``: without noise, for tests)."""
    P = Xp @ R
    if noise is not None:
        P = _noise.add_noise(P, noise, rng)
    if groups is None or len(Ms) == 1:
        return P @ Ms[0]
    out = np.empty((Xp.shape[0], Ms[0].shape[1]))
    for g, M in enumerate(Ms):
        idx = np.flatnonzero(groups == g)
        if idx.size:
            out[idx] = P[idx] @ M
    return out


def decode_rows(Xr: np.ndarray, plan: DPRPPlan) -> tuple[np.ndarray, np.ndarray | None]:
    """Back to the columns' scale: clip to [0, 1], unscale, round integer columns.

    Returns ``(features (n, d), label codes (n,) or None)``; with private labels
    the code is the argmax of the reconstructed one-hot block.
    """
    d = plan.d
    lo = np.asarray(plan.lower, float)
    X = lo + np.clip(Xr[:, :d], 0.0, 1.0) * (np.asarray(plan.upper, float) - lo)
    if plan.integer_columns:
        ic = list(plan.integer_columns)
        X[:, ic] = np.clip(np.rint(X[:, ic]), np.ceil(lo[ic]), np.floor(np.asarray(plan.upper)[ic]))
    codes = np.argmax(Xr[:, d:], axis=1) if plan.n_label_columns else None
    return X, codes


def check_noise_multiplier(noise, mu: float) -> None:
    """Internal invariant: the recorded event of ``noise`` is at least as noisy as the
    plan's Gaussian-DP share ``mu`` (multiplier >= 1 / mu); raises RuntimeError if not."""
    m = noise.dp_event().noise_multiplier
    if not m >= 1.0 / mu:
        raise RuntimeError("noise multiplier below the planned one")
