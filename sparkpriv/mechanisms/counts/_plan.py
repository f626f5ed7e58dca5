"""DP counts' plan, made from public parameters before any data is read, the noise on the lattice
and its uncertainty, and the in-memory counts (docs/math.md section 9)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.mechanisms.counts._keys import CountsParams, MAX_COUNT, MAX_KEYS, sensitivities


@dataclass(frozen=True)
class CountsPlan:
    """Everything public about a calibrated counts release (it holds no secret)."""

    params: CountsParams
    domain_size: int
    sensitivity: dict
    noise: object  # LaplaceNoise or GaussianNoise (grid g, scale in grid units)
    epsilon: float  # the accountant's epsilon of the recorded event at delta
    std: float  # per key, of the released value (the rounded one with round=True)
    half_width: float  # the stated interval is value -+ half_width (before the clamp)
    coverage: float  # the exact probability that the interval holds the true count

    def dp_event(self) -> dp_event.DpEvent:
        return self.noise.dp_event()

    @property
    def delta(self) -> float:
        return float(self.params.delta)

    def to_public_dict(self) -> dict:
        p = self.params
        return {
            "mechanism": "counts",
            "counted": p.counted,
            "params": p.to_public_dict(),
            "domain_size": self.domain_size,
            "neighbors": p.neighbors,
            "protects": ("one person added or removed" if p.neighbors == "add-remove"
                         else "one person replaced by another (the number of people is public)"),
            "sensitivity": {**self.sensitivity, "norm": "l1" if p.noise == "discrete_laplace" else "l2"},
            "noise": self.noise.to_public_dict(),
            "epsilon_accounted": self.epsilon,
            "delta": self.delta,
            "uncertainty": {"std": self.std, "half_width": self.half_width, "confidence": p.confidence,
                            "coverage_exact": self.coverage,
                            "covers": "the count of the BOUNDED contributions (each person at most max_items "
                                      "keys, and max_events_per_item events per key), not the raw count: "
                                      "people with more keys lost the rest before counting",
                            "note": "the same for every key; the interval is value -+ half_width "
                                    "(intersected with [0, inf) under clamp)"},
            "post_processing": {"clamp_at_zero": p.clamp, "round": p.round},
            "max_count_clamp": MAX_COUNT * p.value_cap,
        }


def plan_counts(params: CountsParams, domain_size: int, *, caller: str = "release_counts") -> CountsPlan:
    """Calibrate the noise of a counts release (reads no data, draws nothing)."""
    if not isinstance(params, CountsParams):
        raise ParameterError(f"{caller} needs CountsParams. Got {type(params).__name__}.")
    check_param("domain_size", domain_size, [Interval("integer", 1, None, "left")], caller)
    if domain_size > MAX_KEYS:
        raise ParameterError(
            f"The key domain of {caller} has {domain_size} keys, more than {MAX_KEYS} (key indices are "
            "32-bit integers): declare a smaller domain or split it into several releases.")
    sens = sensitivities(params.max_keys, params.value_cap, domain_size, params.neighbors)
    dim = sens["changed"]  # the coordinates one neighbour changes (grid rounding, samplers' slack)
    max_abs = None
    if params.noise == "discrete_laplace":
        nz = _noise.calibrate_laplace_noise(sensitivity=sens["l1"], epsilon=params.epsilon, dim=dim,
                                            max_abs=max_abs)
    else:
        nz = _noise.calibrate_gaussian_noise(sensitivity=sens["l2"], epsilon=params.epsilon, delta=params.delta,
                                             dim=dim, max_abs=max_abs)
    _check_grid(nz, caller)
    eps = float(epsilon_of(nz.dp_event(), float(params.delta)))
    std, hw, cov = uncertainty(nz, rounded=params.round, confidence=params.confidence)
    return CountsPlan(params, int(domain_size), sens, nz, eps, std, hw, cov)


def _check_grid(nz, caller: str) -> None:
    g = float(nz.grid)
    if g > 1.0 and float(nz.scale) * g > 2.0**40:
        raise ParameterError(f"The noise of {caller} has a scale of {float(nz.scale) * g:.3g} per key: "
                             "epsilon is too small for a useful release.")


def _grid_shift(g: float) -> int:
    """``s`` with ``g = 2^-s`` (negative for grids above 1)."""
    m, e = math.frexp(g)
    if m != 0.5:
        raise ParameterError(f"The noise grid must be a power of two. Got {g!r}.")
    return 1 - e


def _outside_prob(nz, lo: int, hi: int) -> float:
    """``P(N < lo or N > hi)`` for the integer noise ``N`` (lo <= 0 <= hi)."""
    if isinstance(nz, _noise.LaplaceNoise):
        # pmf (1-q)/(1+q) q^|x|: P(N >= m) = P(N <= -m) = q^m / (1+q) for m >= 1
        lq = -1.0 / float(nz.scale)
        l1q = math.log1p(math.exp(lq))
        return math.exp((hi + 1) * lq - l1q) + math.exp((-lo + 1) * lq - l1q)
    # discrete Gaussian at sigma >= 2^55 grid steps: its cdf is the continuous one at
    # half-integers up to a relative 1/sigma^2 (Euler-Maclaurin; e^{-2 pi^2 sigma^2} normaliser)
    s = float(nz.sigma)
    return float(stats.norm.sf((hi + 0.5) / s) + stats.norm.cdf((lo - 0.5) / s))


def uncertainty(nz, *, rounded: bool, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(std, half_width, coverage)`` of one released value (data units).

    Unrounded: the value is ``count + g N``; ``std`` is the noise's exact std
    and ``half_width = g k`` with the smallest integer ``k`` such that
    ``P(|N| <= k) >= confidence``. Rounded (``floor(count + g N + 1/2)``,
    noise ``Z = floor(g N + 1/2)``): ``half_width`` is the smallest integer
    ``K`` with ``P(|Z| <= K) >= confidence`` (``|Z| <= K`` iff ``N`` lies in
    ``[(-K - 1/2)/g, (K + 1/2)/g - 1]``), and ``std`` is Z's std (Sheppard:
    ``Var(gN) + 1/12`` up to a relative ``1e-10`` at the calibrated scales;
    summed exactly over Z's pmf when the noise is small). ``coverage`` is the
    exact probability of the stated interval.
    """
    g = float(nz.grid)
    alpha = 1.0 - float(confidence)
    std_n = float(nz.std)
    scale = float(nz.scale) if isinstance(nz, _noise.LaplaceNoise) else float(nz.sigma)
    if not rounded or g >= 1.0:
        # smallest k (grid units) with P(|N| > k) <= alpha: bisection on the monotone tail
        lo, hi = 0, 1
        while _outside_prob(nz, -hi, hi) > alpha:
            hi *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if _outside_prob(nz, -mid, mid) <= alpha:
                hi = mid
            else:
                lo = mid + 1
        k = lo
        return std_n, k * g, 1.0 - _outside_prob(nz, -k, k)
    s = _grid_shift(g)  # g = 2^-s, s >= 1: (K + 1/2)/g = (2K + 1) 2^(s-1) is an integer

    def out(K: int) -> float:
        h = (2 * K + 1) << (s - 1)
        return _outside_prob(nz, -h, h - 1)

    lo, hi = 0, 1
    while out(hi) > alpha:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if out(mid) <= alpha:
            hi = mid
        else:
            lo = mid + 1
    K = lo
    data_scale = scale * g
    if data_scale < 1000.0:  # Z's pmf summed exactly
        span = int(60 * data_scale) + 60
        ks = np.arange(-span, span + 1)
        cdf = 1.0 - _upper_tail(nz, (2.0 * ks + 1.0) * 2.0 ** (s - 1))  # P(Z <= k) = P(N < (k + 1/2)/g)
        pmf = np.diff(np.concatenate(([0.0], cdf)))
        std = math.sqrt(float(np.sum(pmf * ks.astype(float) ** 2)))
    else:  # Sheppard's correction, relative error below 1e-12 at these scales
        std = math.sqrt(std_n**2 + 1.0 / 12.0)
    return std, float(K), 1.0 - out(K)


def _upper_tail(nz, m) -> np.ndarray:
    """``P(N >= m)`` for integer-valued ``m`` (array), noise ``N`` of ``nz``."""
    m = np.asarray(m, np.float64)
    pos = m >= 1
    mm = np.where(pos, m, 1.0 - m)  # P(N >= m) = 1 - P(N >= 1 - m) for m <= 0 (symmetry)
    if isinstance(nz, _noise.LaplaceNoise):
        lq = -1.0 / float(nz.scale)
        t = np.exp(mm * lq - math.log1p(math.exp(lq)))
    else:
        t = stats.norm.sf((mm - 0.5) / float(nz.sigma))
    return np.where(pos, t, 1.0 - t)


def count_keys(offsets, indices, values, d: int) -> np.ndarray:
    """Per-key totals of bounded records (the reference of the Spark aggregation).

    ``values`` None: each record counts 1 at each of its keys (distinct
    people); else the (capped) values. Returns int64 (d,).
    """
    idx = np.asarray(indices, np.int64)
    if values is None:
        return np.bincount(idx, minlength=d).astype(np.int64)
    return np.rint(np.bincount(idx, weights=np.asarray(values, np.float64), minlength=d)).astype(np.int64)


def noise_integers(plan: CountsPlan, rng: np.random.Generator, size: int | None = None,
                   *, exact: bool = False) -> np.ndarray:
    """The integer noise ``N`` of every key (int64; one draw per key, on the driver)."""
    nz = plan.noise
    n = plan.domain_size if size is None else size
    if isinstance(nz, _noise.LaplaceNoise):
        return _noise.sample_discrete_laplace(rng, nz.scale, n, exact=exact)
    return _noise.sample_discrete_gaussian(rng, nz.sigma, n, exact=exact)


def lattice_values(counts: np.ndarray, N: np.ndarray, grid: float) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact lattice output ``count + g N`` as ``(A, r, s)``: ``A + r 2^-s`` with
    ``A`` int64 and ``0 <= r < 2^s`` (``s <= 0``: ``r = 0``). No rounding anywhere."""
    c = np.asarray(counts, np.int64)
    N = np.asarray(N, np.int64)
    s = _grid_shift(float(grid))
    if s <= 0:
        return c + (N << (-s)), np.zeros_like(N), s
    return c + (N >> s), N & ((1 << s) - 1), s


@dataclass(frozen=True)
class CountsResult:
    """The released columns of every key (domain order): value, std, ci_low, ci_high."""

    value: np.ndarray
    std: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray


def finalize_counts(counts: np.ndarray, plan: CountsPlan, rng: np.random.Generator, *,
                    exact: bool = False) -> CountsResult:
    """Noise the per-key totals of the whole domain once and post-process (driver).

    ``counts``: int64 (domain_size,) exact totals after bounding (every key,
    zeros for keys no one visited). Values above the public ``MAX_COUNT c``
    are clamped to it first (never reached by real data; a per-coordinate
    clamp cannot raise a sensitivity).
    """
    c = np.asarray(counts)
    if c.shape != (plan.domain_size,):
        raise ParameterError(f"finalize_counts needs one total per key of the domain ({plan.domain_size}). "
                             f"Got shape {c.shape}.")
    return noisy_values(c, plan, rng, exact=exact)


def noisy_values(counts: np.ndarray, plan: CountsPlan, rng: np.random.Generator, *,
                 exact: bool = False) -> CountsResult:
    """The released columns of consecutive keys (all of them, or one block of a large domain):
    one noise draw per key from ``rng``, in order, then the post-processing."""
    p = plan.params
    c = np.asarray(counts)
    if c.ndim != 1:
        raise ParameterError(f"noisy_values needs a 1-d array of totals. Got shape {c.shape}.")
    c = np.clip(c.astype(np.int64), 0, MAX_COUNT * p.value_cap)
    N = noise_integers(plan, rng, c.shape[0], exact=exact)
    A, r, s = lattice_values(c, N, plan.noise.grid)
    if p.round and s > 0:
        value = (A + (r >> (s - 1))).astype(np.float64)  # floor(v + 1/2): r g >= 1/2 iff r >= 2^(s-1)
    elif s > 0:
        value = A.astype(np.float64) + r.astype(np.float64) * plan.noise.grid
    else:
        value = A.astype(np.float64)
    lo = value - plan.half_width
    hi = value + plan.half_width
    if p.clamp:
        value = np.maximum(value, 0.0)
        lo = np.maximum(lo, 0.0)
        hi = np.maximum(hi, 0.0)
    return CountsResult(value, np.full(value.shape, plan.std), lo, hi)
