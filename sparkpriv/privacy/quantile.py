"""A differentially private row-norm bound (a DP quantile of the row norms).

Bounds computed from the data are not private. When the user asks for it (and
pays part of the budget), the row bound ``R`` is chosen as a DP quantile of the
row norms instead of being declared:

1. Candidates are a public geometric grid ``R_j = 2^j`` for ``j`` in a declared
   public range (default ``2^-10 .. 2^30``).
2. Each row falls in the bucket of the smallest candidate at least its norm
   (norms above the top candidate fall in an overflow bucket).
3. The bucket counts get discrete Laplace noise (a histogram: one record moves
   between two buckets under replace-one, so the L1 sensitivity is 2; 1 under
   add/remove), via :mod:`sparkpriv.privacy.noise`: pure ``epsilon_b``-DP,
   recorded as a LaplaceDpEvent.
4. ``R`` is the smallest candidate whose noisy cumulative count reaches
   ``quantile`` times the noisy total: post-processing, no further cost.

The per-row norm and the bucketing are numpy functions used by the Spark path
on each batch.
"""

from __future__ import annotations

import numpy as np

from sparkpriv._validation import Interval, check_param
from sparkpriv.privacy import noise as _noise

__all__ = [
    "candidate_bounds",
    "norm_bucket_counts",
    "histogram_noise",
    "choose_bound",
    "wide_histogram_noise",
    "DEFAULT_EXPONENTS",
]

DEFAULT_EXPONENTS = (-10, 30)


def candidate_bounds(exponents: tuple[int, int] = DEFAULT_EXPONENTS) -> np.ndarray:
    lo, hi = exponents
    if not (isinstance(lo, int) and isinstance(hi, int) and lo < hi and hi - lo <= 200):
        from sparkpriv.errors import ParameterError

        raise ParameterError(
            f"The bound search range must be two integers lo < hi (powers of two), at most 200 apart. "
            f"Got {exponents!r} instead."
        )
    return 2.0 ** np.arange(lo, hi + 1, dtype=np.float64)


def norm_bucket_counts(norms: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Counts per bucket (len(candidates) + 1, the last one is the overflow)."""
    idx = np.searchsorted(candidates, norms, side="left")
    return np.bincount(idx, minlength=candidates.size + 1).astype(np.float64)


def histogram_noise(*, epsilon: float, neighbors: str, buckets: int) -> "_noise.LaplaceNoise":
    check_param("epsilon", epsilon, [Interval("real", 0, None, "neither")], "histogram_noise")
    sens = 1.0 if neighbors == "add-remove" else 2.0
    return _noise.calibrate_laplace_noise(sensitivity=sens, epsilon=epsilon, dim=buckets)


def choose_bound(noisy_counts: np.ndarray, candidates: np.ndarray, quantile: float) -> float:
    """Smallest candidate whose noisy cumulative count reaches ``quantile`` of the noisy total."""
    c = np.maximum(np.asarray(noisy_counts, float), 0.0)
    total = c.sum()
    if total <= 0:
        return float(candidates[-1])
    cum = np.cumsum(c[:-1])
    hit = np.flatnonzero(cum >= quantile * total)
    return float(candidates[hit[0]]) if hit.size else float(candidates[-1])


def wide_histogram_noise(hist_noise: "_noise.LaplaceNoise") -> "_noise.LaplaceNoise":
    """The same Laplace noise (same event) on a grid holding counts up to 2^30 noise scales.

    The default grid holds only 2^22 scales: with a large epsilon a bucket of a
    few thousand rows would overflow it, and the release would fail because of
    the data. The coarser grid costs a factor ``1 + dim g / sensitivity`` (about
    ``1 + dim 2^-30``) in noise.
    """
    return _noise.calibrate_laplace_noise(
        sensitivity=hist_noise.sensitivity, epsilon=hist_noise.epsilon, dim=hist_noise.dim,
        max_abs=2.0**30 * hist_noise.sensitivity / hist_noise.epsilon)
