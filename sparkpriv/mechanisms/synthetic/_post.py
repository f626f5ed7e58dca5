"""Post-processing of the synthesizer's noisy statistics (no budget; docs/math.md section 10).

* :func:`pooled_lengths`: the noisy histogram of items per person, cut where its tail holds no
  more than noise (before the first bin beyond the mode whose suffix sum, the people in that bin
  or later ones, is within ``TAIL_STDS`` standard deviations of the noise summed over those
  bins), then made
  non-increasing beyond its mode (isotonic regression, which averages neighbouring bins where
  the noise breaks the order) and clamped at 0. Clamping each empty bin's noise at 0 instead
  puts spurious mass at long lengths (people with hundreds of items) and every union query then
  counts too many people: on the real tables the mean length was off by 1-3 items, against
  0.2-1 after the cut (docs/research/synthesizer.md).
* :func:`shrunk_counts`: the posterior mean of each item's count given its noisy count
  (Gaussian noise of known std), under a prior over counts fitted to all the noisy counts
  themselves (empirical Bayes; the nonparametric maximum-likelihood prior on a grid, by EM).
  Rare items, whose noisy counts are mostly noise, go towards the counts such items have;
  counts well above the noise stay where they are.
* :func:`calibrate`: the model's number of draws per person and its item profile, raked so that
  the model's expected number of holders of every well-measured item (noisy count at least
  ``CALIBRATE_STDS`` noise stds) equals its shrunk count, every other item keeping the expected
  count the uncalibrated model gives it. A synthetic person draws items with replacement and
  keeps the distinct ones, and the released length histogram's mean is itself noisy (its tail
  cut): uncalibrated, the model's total of items was 7-13 % short on groceries at epsilon
  0.5-1, which every union query inherits (docs/research/small-tables.md). Only when the cap
  ``L`` keeps at least 97 % of the items (by the released lengths).
* :func:`max_items_error`, :func:`choose_max_items_error`: the automatic ``L`` of the synthetic
  release, the minimiser of an error estimate on the post-processed histogram.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pooled_lengths", "shrunk_counts", "expand_bins", "calibrate", "shifted_draws", "uncapped_ratio",
           "max_items_error", "choose_max_items_error", "TAIL_STDS", "CALIBRATE_STDS",
           "CALIBRATE_LOSS"]

TAIL_STDS = 2.0
GRID = 120
EM_STEPS = 150
CALIBRATE_STDS = 4.0  # an item's shrunk count is a raking target when its noisy count is this many noise stds
CALIBRATE_LOSS = 0.03  # calibrate only when the cap L loses at most this share of the items (released lengths)
CALIBRATE_ROUNDS = 4
CALIBRATE_STEPS = 12


def pooled_lengths(noisy: np.ndarray, std: float, k: float = TAIL_STDS) -> np.ndarray:
    """``(limit + 1,)`` nonnegative people per length (see the module docstring)."""
    from sklearn.isotonic import IsotonicRegression

    h = np.asarray(noisy, dtype=np.float64)
    suffix = np.cumsum(h[::-1])[::-1]
    bins = np.arange(h.size, 0, -1, dtype=np.float64)
    real = suffix > float(k) * float(std) * np.sqrt(bins)
    mode = int(np.argmax(h))
    # the tail ends before the first bin beyond the mode whose suffix is within the noise: the
    # largest bin passing the test instead is, in about one release in 10 on groceries at epsilon
    # 0.5, a later excursion of the noise alone (over some 30 empty bins), which put people at
    # up to 168 items
    within = np.flatnonzero(~real[mode:])
    top = max(mode, mode + int(within[0]) - 1) if within.size else h.size - 1
    out = np.zeros_like(h)
    head = h[:top + 1]
    out[:mode + 1] = head[:mode + 1]
    if top > mode:
        out[mode:top + 1] = IsotonicRegression(increasing=False).fit_transform(
            np.arange(top + 1 - mode, dtype=np.float64), head[mode:])
    return np.maximum(out, 0.0)


def shrunk_counts(noisy: np.ndarray, std: float, *, grid: int = GRID, steps: int = EM_STEPS) -> np.ndarray:
    """Posterior means of the counts (see the module docstring); ``(d,)``, nonnegative."""
    c = np.asarray(noisy, dtype=np.float64)
    if c.size == 0:
        return c.copy()
    std = float(std)
    if std <= 0:
        return np.maximum(c, 0.0)
    top = max(float(c.max()), 1.0)
    g = np.concatenate([[0.0], np.geomspace(min(0.5, top), top * 1.1 + std, grid - 1)])
    # bin the noisy counts (the likelihood depends on them only): at most 4,096 distinct values
    edges = np.linspace(c.min(), c.max() + 1e-9, min(c.size, 4096) + 1)
    b = np.clip(np.searchsorted(edges, c, side="right") - 1, 0, edges.size - 2)
    centre = (edges[:-1] + edges[1:]) / 2.0
    used = np.unique(b)
    weight = np.bincount(b, minlength=centre.size)[used].astype(np.float64)
    x = centre[used]
    loglik = -0.5 * ((x[:, None] - g[None, :]) / std) ** 2
    loglik -= loglik.max(axis=1, keepdims=True)
    lik = np.exp(loglik)
    w = np.full(g.size, 1.0 / g.size)
    for _ in range(steps):
        post = lik * w[None, :]
        post /= post.sum(axis=1, keepdims=True) + 1e-300
        w = (weight[:, None] * post).sum(axis=0) / weight.sum()
    post = lik * w[None, :]
    post /= post.sum(axis=1, keepdims=True) + 1e-300
    mean_used = post @ g
    # within a bin the posterior mean moves with the noisy count: interpolate between bin centres
    return np.maximum(np.interp(c, x, mean_used), 0.0)


def expand_bins(binned: np.ndarray, edges: np.ndarray, limit: int, shape: np.ndarray | None = None) -> np.ndarray:
    """People per single length ``0 .. limit`` from people per bin (bin ``j`` covers lengths
    ``edges[j] .. edges[j + 1] - 1``; the last bin is ``limit``), each bin's mass spread evenly, or
    in proportion to ``shape`` (``(limit + 1,)``, e.g. a released length distribution) where
    ``shape`` has mass in the bin."""
    out = np.zeros(int(limit) + 1)
    b = np.asarray(binned, dtype=np.float64)
    w = None if shape is None else np.maximum(np.asarray(shape, dtype=np.float64), 0.0)
    for j, lo in enumerate(np.asarray(edges, dtype=np.int64)):
        hi = int(edges[j + 1]) if j + 1 < len(edges) else int(limit) + 1
        mass = 0.0 if w is None else float(w[lo:hi].sum())
        out[lo:hi] = b[j] * w[lo:hi] / mass if mass > 0 else b[j] / (hi - lo)
    return out


def shifted_draws(lengths: np.ndarray, shift: float) -> np.ndarray:
    """The length distribution with ``shift`` more draws per person: for ``shift >= 0`` every
    length moved up by ``shift`` (linear between whole shifts; the last bin holds everything
    beyond), for ``shift < 0`` every length ``m`` scaled to ``m (1 + shift / mean)`` (linear
    between neighbouring lengths), so the mean moves by ``shift`` either way."""
    lam = np.asarray(lengths, dtype=np.float64)
    lam = lam / max(lam.sum(), 1e-300)
    w = lam.size
    m = np.arange(w, dtype=np.float64)
    if shift >= 0:
        to = np.minimum(m + float(shift), w - 1)
    else:
        mean = float((lam * m).sum())
        to = m * float(np.clip(1.0 + shift / max(mean, 1e-300), 0.0, 1.0))
    lo = np.floor(to).astype(np.int64)
    f = to - lo
    hi = np.minimum(lo + 1, w - 1)
    out = np.bincount(lo, weights=lam * (1.0 - f), minlength=w) + np.bincount(hi, weights=lam * f, minlength=w)
    return out / max(out.sum(), 1e-300)


def uncapped_ratio(lengths: np.ndarray, L) -> np.ndarray:
    """``E[m] / E[min(m, L)]`` of a length distribution (people per length ``0 .. limit``) for each
    ``L`` (array): non-increasing in ``L``, 1 from the longest length on."""
    lam = np.asarray(lengths, dtype=np.float64)
    m = np.arange(lam.size, dtype=np.float64)
    Ls = np.atleast_1d(np.asarray(L, dtype=np.float64))
    capped = (lam[None, :] * np.minimum(m[None, :], Ls[:, None])).sum(axis=1)
    return float((lam * m).sum()) / np.maximum(capped, 1e-300)


def calibrate(lengths: np.ndarray, counts: np.ndarray, noisy: np.ndarray, std: float, n: float, L: int,
              k: float = CALIBRATE_STDS) -> tuple[np.ndarray, np.ndarray]:
    """``(draws (limit + 1,), profile (d,))``: the model's distribution of draws per person and its
    item profile, raked (see the module docstring). The counts are of records bounded at ``L``
    items (a uniformly random subset of each person's): a target is its count scaled by the
    released lengths' ``E[m] / E[min(m, L)]``. When that ratio exceeds ``1 + CALIBRATE_LOSS``
    the model is left as it is (``lengths``, the counts' shares): the scaling assumes the items
    the cap drops are like the ones it keeps, and on tables with long records of rare items (web
    crawlers) it overstates the popular items. Post-processing of the released statistics."""
    from sparkpriv.mechanisms.synthetic._anchors import _miss, _rest_bins

    lam = np.asarray(lengths, dtype=np.float64)
    lam = lam / max(lam.sum(), 1e-300)
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0)
    if c.sum() <= 0 or lam[1:].sum() <= 0:
        return lam, (c / c.sum() if c.sum() > 0 else np.full(c.size, 1.0 / max(c.size, 1)))
    p = c / c.sum()
    n = float(n)
    uncap = float(uncapped_ratio(lam, L)[0])
    if uncap > 1.0 + CALIBRATE_LOSS:
        return lam, p
    base = n * (1.0 - _miss(lam, p))
    target = np.where(np.asarray(noisy, dtype=np.float64) >= float(k) * float(std), c * uncap, base)
    want = float(target.sum())
    mean = float((lam * np.arange(lam.size)).sum())
    draws = lam
    for _ in range(CALIBRATE_ROUNDS):
        for _ in range(CALIBRATE_STEPS):
            e = n * (1.0 - _miss(draws, p))
            p = p * np.where(e > 0, target / np.maximum(e, 1e-300), 1.0)
            p = p / max(p.sum(), 1e-300)
        _, centre, size = _rest_bins(p, 400)  # the total over items, items grouped by probability
        lo, hi = -mean, float(lam.size)
        for _ in range(40):
            mid = (lo + hi) / 2.0
            e = n * float(((1.0 - _miss(shifted_draws(lam, mid), centre)) * size).sum())
            lo, hi = (mid, hi) if e < want else (lo, mid)
        draws = shifted_draws(lam, (lo + hi) / 2.0)
    return draws, p


def max_items_error(lengths: np.ndarray, L, d: int, multiplier: float, factor: float) -> np.ndarray:
    """The error estimate the synthetic release's automatic ``L`` minimises, for each ``L`` (array):

        (1 - S(L) / S(limit))^2 + (sigma(L) / (S(L) / d))^2,   S(L) = sum_m lengths[m] min(m, L),

    the truncation loss (the share of the items people hold that a cap at ``L`` drops) squared,
    plus the squared noise of an item held by the mean number of people of the capped records
    (``sigma(L) = multiplier sqrt(factor L)``, the per-item counts' noise std at ``L``) relative to
    that number. ``lengths``: people per length ``0 .. limit``."""
    lam = np.maximum(np.asarray(lengths, dtype=np.float64), 0.0)
    L = np.atleast_1d(np.asarray(L, dtype=np.int64))
    m = np.arange(lam.size)
    # S(L) for every L at once: sum_m lam[m] min(m, L) = sum_{k < L} (people with more than k items)
    above = lam.sum() - np.cumsum(lam)  # above[k]: people with more than k items
    S_all = np.concatenate([[0.0], np.cumsum(above)])  # S_all[L] = S(L), L = 0 .. limit + 1
    S = S_all[np.minimum(L, lam.size - 1)]
    total = float((lam * m).sum())
    sigma = float(multiplier) * np.sqrt(float(factor) * L)
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = np.where(total > 0, 1.0 - S / max(total, 1e-300), 1.0)
        noise = np.where(S > 0, sigma * float(d) / S, np.inf)
    return loss ** 2 + noise ** 2


def choose_max_items_error(noisy_hist: np.ndarray, hist_std: float, edges: np.ndarray, limit: int, d: int,
                           multiplier: float, factor: float) -> int:
    """``L`` in ``1 .. limit`` minimising :func:`max_items_error` on the length distribution
    post-processed from the noisy histogram (:func:`pooled_lengths`, :func:`expand_bins`); the
    smallest such ``L`` on ties; ``limit`` when no ``L`` has a finite estimate. Post-processing of
    the histogram and public facts only."""
    lam = expand_bins(pooled_lengths(noisy_hist, hist_std), edges, limit)
    Ls = np.arange(1, int(limit) + 1)
    err = max_items_error(lam, Ls, d, multiplier, factor)
    if not np.isfinite(err).any():
        return int(limit)
    return int(Ls[int(np.argmin(np.where(np.isfinite(err), err, np.inf)))])
