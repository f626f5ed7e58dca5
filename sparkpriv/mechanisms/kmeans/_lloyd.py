"""One Lloyd iteration of DP k-means: per-batch statistics, the driver's noisy update and its
post-processing, initial centres, the in-memory fit (docs/math.md section 4)."""

from __future__ import annotations

import numpy as np

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.random import stream
from sparkpriv.mechanisms.kmeans._features import (DEFAULT_RELIABILITY_STDS, FINAL_STAGE, FeatureMap, ITER_STAGE,
                                                   MAX_ROWS)
from sparkpriv.mechanisms.kmeans._plan import KMeansPlan, max_clusters


def assign_nearest(Z: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Index of the nearest centre (squared L2) for each row of ``Z`` (n, D'); ties -> lowest."""
    if Z.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    cn = np.einsum("ij,ij->i", centres, centres)
    dist = cn[None, :] - 2.0 * (Z @ centres.T)
    return np.argmin(dist, axis=1)


def cluster_stats(Z: np.ndarray, centres: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
    """Per-cluster counts and sums of one batch as ONE float64 vector of length ``k (p + 1)``.

    Rows of ``Z`` (n, D') are assigned to the nearest of ``centres`` (k, D');
    the sums are of ``values`` (n, p) (default ``Z``). Layout: the
    ``(k, p + 1)`` matrix ``[n_j, S_j]`` flattened row-major. The vectors of
    batches add up to the vector of their union.
    """
    k = centres.shape[0]
    V = Z if values is None else values
    p = V.shape[1]
    out = np.zeros((k, p + 1), dtype=np.float64)
    if Z.shape[0] == 0:
        return out.ravel()
    lab = assign_nearest(Z, centres)
    out[:, 0] = np.bincount(lab, minlength=k)
    onehot = np.zeros((k, Z.shape[0]), dtype=np.float64)
    onehot[lab, np.arange(Z.shape[0])] = 1.0
    out[:, 1:] = onehot @ V
    return out.ravel()


def cluster_input_sums_sparse(labels: np.ndarray, offsets, indices, values, k: int, d: int) -> np.ndarray:
    """Per-cluster counts and sums of sparse input records, in the layout of
    :func:`cluster_stats` with ``values`` = the dense records: ``k (d + 1)`` floats."""
    offsets = np.asarray(offsets, np.int64)
    labels = np.asarray(labels, np.int64)
    out = np.zeros((k, d + 1), dtype=np.float64)
    out[:, 0] = np.bincount(labels, minlength=k)
    owner = np.repeat(labels, np.diff(offsets))  # the cluster of each stored item
    w = None if values is None else np.asarray(values, np.float64)
    out[:, 1:] = np.bincount(owner * d + np.asarray(indices, np.int64), weights=w,
                             minlength=k * d).reshape(k, d)
    return out.ravel()


def noisy_update(stats: np.ndarray, noise: _noise.GaussianNoise, bound: float, k: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Driver step: noise ``(bound * n_j, S_j)`` ONCE, return ``(centres, noisy counts)``.

    ``centres_j = noisy S_j / max(noisy n_j, 1)``.
    """
    M = np.asarray(stats, dtype=np.float64).reshape(k, -1).copy()
    M[:, 0] *= bound
    noisy = _noise.add_noise(M, noise, rng)
    counts = noisy[:, 0] / bound
    centres = noisy[:, 1:] / np.maximum(counts, 1.0)[:, None]
    return centres, counts


def reliability_flags(counts: np.ndarray, count_std: float, reliability_stds: float) -> np.ndarray:
    """``True`` where a noisy size is below ``reliability_stds`` standard deviations of its noise.

    Such a cluster may be empty: its centre is (mostly) noise. A function of
    the noisy sizes and the public noise scale only (post-processing).
    """
    return np.asarray(counts, dtype=np.float64) < float(reliability_stds) * float(count_std)


def initial_centres(fmap: FeatureMap, k: int, rng: np.random.Generator,
                    init: np.ndarray | None = None, caller: str = "release_kmeans") -> np.ndarray:
    """Data-independent initial centres in feature space, shape (k, D').

    ``init`` (k, d) is a PUBLIC sample (never rows of the private table);
    otherwise ``k`` uniform points of the declared box (or, without a box, of
    the L2 ball of radius ``row_bound``). Either is clipped and mapped
    through the feature map.
    """
    d = fmap.d
    if init is not None:
        P = np.asarray(init, dtype=np.float64)
        if P.shape != (k, d) or not np.all(np.isfinite(P)):
            raise ParameterError(
                f"The 'init' parameter of {caller} must be a finite public sample of shape "
                f"(k, d) = ({k}, {d}). Got shape {P.shape} instead."
            )
    elif fmap.bounds.has_box:
        lo = np.asarray(fmap.bounds.lower, float)
        hi = np.asarray(fmap.bounds.upper, float)
        P = lo + (hi - lo) * rng.random((k, d))
    else:
        R = float(fmap.bounds.row_bound)
        g = rng.standard_normal((k, d))
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        P = g * (R * rng.random((k, 1)) ** (1.0 / d))
    Pc, _ = fmap.clip(P)
    return fmap.from_clipped(Pc)


def check_k_for_n(k: int, n: int, caller: str) -> None:
    if n > MAX_ROWS:
        raise ParameterError(f"{caller} supports at most 2^34 rows (the noise grid's cap). Got {n}.")
    if k > max_clusters(n):
        raise ParameterError(
            f"The 'k' parameter of {caller} must be at most floor(sqrt(n)) = {max_clusters(n)} for "
            f"n = {n} rows (smaller clusters are swamped by the noise). Got {k} instead: use fewer "
            "clusters or more data."
        )


def check_reliability_stds(reliability_stds, caller: str) -> None:
    check_param("reliability_stds", reliability_stds, [Interval("real", 0, 1e6, "both")], caller)


def fit_from_stats(plan: KMeansPlan, fmap: FeatureMap, centres: np.ndarray, iteration_stats,
                   final_stats, seed: int, log=None,
                   reliability_stds: float = DEFAULT_RELIABILITY_STDS):
    """The driver loop shared by the numpy and the Spark paths.

    ``iteration_stats(centres)`` returns the exact ``k (D'+1)`` vector over the
    whole table; ``final_stats(centres)`` the ``k (d+1)`` vector of clipped
    inputs grouped by the nearest feature centre (``kernel`` only). Noise is
    added here, once per call, from the driver stream ``(seed, stage, t)``.
    Every noisy centre is projected onto its declared domain before it is used
    or released, sizes are clamped at 0 and unreliable clusters are flagged
    (post-processing, see the module docstring). ``history`` holds the raw
    noisy sizes of each iteration (owner diagnostics).
    """
    from sparkpriv.mechanisms.kmeans_model import KMeansModel

    k = plan.k
    history = []
    counts = None
    for t in range(1, plan.iterations + 1):
        stats = iteration_stats(centres)
        raw, counts = noisy_update(stats, plan.iter_noise, plan.feature_bound, k,
                                   stream(seed, ITER_STAGE, t))
        centres = fmap.project(raw)
        history.append(counts)
        if log is not None:
            log(t, counts)
    feature_centres, feature_counts = centres, counts
    iter_sum_std = plan.iter_noise.std
    iter_count_std = plan.count_std
    unreliable = reliability_flags(feature_counts, iter_count_std, reliability_stds)
    if plan.final_noise is not None:
        stats = final_stats(feature_centres)
        raw, counts = noisy_update(stats, plan.final_noise, plan.input_bound, k,
                                   stream(seed, FINAL_STAGE, 0))
        centres = fmap.clip(raw)[0]
        sum_std = plan.final_noise.std
        count_std = plan.final_noise.std / plan.input_bound
        unreliable |= reliability_flags(counts, count_std, reliability_stds)
    else:
        sum_std, count_std = iter_sum_std, iter_count_std
    kernel = plan.variant == "kernel"
    model = KMeansModel(
        variant=plan.variant, centers=centres, counts=np.maximum(counts, 0.0),
        bounds=fmap.bounds.to_public_dict(), W=fmap.W, kernel_width=fmap.kernel_width,
        feature_centers=feature_centres if kernel else None,
        feature_counts=np.maximum(feature_counts, 0.0) if kernel else None,
        unreliable=tuple(int(j) for j in np.flatnonzero(unreliable)),
        reliability_stds=float(reliability_stds),
        count_std=float(count_std), sum_std=float(sum_std),
        feature_count_std=float(iter_count_std) if kernel else None,
        feature_sum_std=float(iter_sum_std) if kernel else None,
    )
    return model, history


def _tuple(x):
    if x is None:
        return None
    return tuple(float(v) for v in np.atleast_1d(np.asarray(x, dtype=float)))


def clustering_accuracy(labels_true, labels_pred) -> float:
    """ACC: the best one-to-one cluster-to-label matching (Hungarian), as a fraction.

    ``scipy.optimize.linear_sum_assignment`` on the negated contingency table.
    """
    from scipy.optimize import linear_sum_assignment

    t = np.asarray(labels_true)
    p = np.asarray(labels_pred)
    if t.shape != p.shape or t.size == 0:
        raise ParameterError("labels_true and labels_pred must be non-empty and of the same shape.")
    _, ti = np.unique(t, return_inverse=True)
    _, pi = np.unique(p, return_inverse=True)
    table = np.zeros((pi.max() + 1, ti.max() + 1), dtype=np.int64)
    np.add.at(table, (pi, ti), 1)
    r, c = linear_sum_assignment(-table)
    return float(table[r, c].sum()) / t.size
