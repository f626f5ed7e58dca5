"""Float-safe Laplace and Gaussian noise on a power-of-two grid (docs/math.md section 7).

Textbook noise (``x + rng.laplace(0, b)``) leaks through the low bits of the
floating-point result: Mironov (2012) showed that the set of doubles a
float Laplace sample can produce depends on ``x``, so one output can reveal
the exact input. Here the answer is first rounded to a public power-of-two grid
``g``, *integer* noise is added, and the output is ``g * (u + N)``:

1. ``u = rint(a / g)`` as int64 (``a / g`` is exact, ``g`` being a power of two);
2. ``N`` is discrete Laplace (pmf ``prop. to exp(-|x|/t)``) or discrete Gaussian
   (pmf ``prop. to exp(-x^2 / (2 sigma^2))``) on the integers (Canonne, Kamath &
   Steinke 2020, "CKS" below);
3. the release is ``float64(u + N) * g``, a deterministic function of the noisy
   integer ``u + N``: its low bits carry nothing beyond that integer (above
   2^53 the conversion rounds, which is post-processing too).

Grid sensitivity
----------------
Rounding moves each coordinate by at most ``g/2``. For neighbouring answers
``a, a'`` with ``||a - a'||_p <= Delta_p`` and rounding errors
``e = u - a/g``, ``e' = u' - a'/g`` (``|e_j|, |e'_j| <= 1/2``)::

    ||u - u'||_p <= ||a - a'||_p / g + ||e - e'||_p <= Delta_p / g + ||1||_p

since ``|e_j - e'_j| <= 1``. So the integer vectors differ by at most
``Delta_1/g + dim`` in L1 and ``Delta_2/g + sqrt(dim)`` in L2, where ``dim`` is
the number of coordinates one neighbour can change. docs/math.md's ``+1`` is the
scalar case. Both are rounded up in floating point.

Guarantees and accounting
-------------------------
* Discrete Laplace, scale ``t``: integer vectors at L1 distance at most
  ``D = grid_sensitivity`` have product-pmf log-ratios at most ``D / t``, so
  pure ``epsilon = D / t`` holds exactly for the ideal pmf. The event is
  ``LaplaceDpEvent(m)`` with ``1/m = D/t + sampler_slack(dim)`` (rounded up; the
  fast samplers' error, below); with delta > 0 the PLD accountant uses the continuous Laplace curve, never
  better than the discrete one beyond PLD discretisation (tested against
  dp_accounting's discrete-Laplace PLD).
* Discrete Gaussian, ``sigma``: the event is the continuous
  ``GaussianDpEvent(m)``, ``1/m = D/sigma + sampler_slack(dim)`` (rounded up),
  ``D = Delta_2/g + sqrt(dim)``; for ``D/sigma``: (a) Same
  Renyi/zCDP bound: by Poisson summation ``E exp(lam X) <= exp(lam^2 sigma^2 / 2)``
  for ``X ~ N_Z(0, sigma^2)`` (CKS Sec. 2, concentrated DP, incl. multivariate),
  so each Renyi divergence is at most the continuous one. (b) Same privacy
  curve up to a negligible term: rounding a continuous Gaussian mechanism run on
  the integer ``u`` is post-processing, so ``round(N(0, sigma^2))`` noise has
  exactly the continuous curve ``delta_c``; coupling it per coordinate with
  ``N_Z(0, sigma^2)`` (total variation ``tau``) gives
  ``delta(eps) <= delta_c(eps) + (1 + e^eps) dim tau``. With
  ``P(round = k) / phi_sigma(k) = int_{-1/2}^{1/2} exp(-(k s + s^2/2) / sigma^2) ds``
  and the Poisson-summation normaliser ``sum_k phi_sigma(k) = 1 + 2 sum_{j>=1}
  exp(-2 pi^2 j^2 sigma^2)``, ``tau <= 1/(8 sigma^2)`` (numerically
  ``0.0202 / sigma^2``; tested). At our grid ``sigma >= 2^55``:
  ``(1 + e^eps) dim tau <= 2^-113 (1 + e^eps) dim < 1e-15`` for ``eps <= 20``,
  ``dim <= 10^9``. (At small sigma the gap is real: sigma = 2 costs 1% more
  epsilon than the continuous curve; the grid keeps us far from that.)

Samplers
--------
Fast (default, vectorized numpy; error analysis: docs/research/noise-samplers.md):

* Discrete Laplace = ``s G``, negative zero rejected (CKS). ``G = K M + R``,
  ``M = 2^m``, ``t/M in [2^8, 2^9)``: ``K = floor(E t/M)`` (E exponential) and R
  uniform on ``[0, M)`` from raw bits, accepted with probability ``exp(-R/t)``.
  Every integer stays reachable at ``t = 2^57`` (``floor(log(U)/log1p(-p))``
  and numpy's ``geometric`` are not: at ``p = 2^-56`` numpy returns multiples of
  8 three times out of four). Exponentials above 12 are redrawn as ``12 + E'``.
* Discrete Gaussian (sigma >= 1): a 128-bit cumulative table over buckets
  ``[jW, (j+1)W)``, ``sigma/W in [256, 512)``, weighted ``W exp(-(jW)^2/(2 sigma^2))``,
  plus a tail branch beyond about 10 sigma (geometric proposal); inside a bucket
  ``y = jW + R``, ``R`` uniform, accepted with probability
  ``exp(-(y^2 - (jW)^2)/(2 sigma^2))`` (about 0.999). Below sigma 1: CKS
  Algorithm 3 (``DLap(floor(sigma) + 1)`` proposals, about 1.32 per sample).
* Floating point only decides the K buckets (E-intervals at least 2^-9 wide,
  resolved to about 2^-47), the residue test, the rare undecided Gaussian
  acceptances (``(v + U') 2^-16 < exp(-z)``, relative 2^-52) and the tail and
  CKS acceptances (relative ``2^-47 + z 2^-51``); the Gaussian branch
  probabilities are exact to 2^-128. Sampled pmfs are within a relative 2^-36
  (1.5e-11) of the ideal on the whole support: a release that changes ``k``
  coordinates may lose about ``2.9e-11 k`` more than the ideal mechanism. Every
  recorded event is charged ``sampler_slack(k) = 5.82e-11 k`` for it (on a
  Laplace event's epsilon and a Gaussian event's ``mu``; docs/noise.md,
  "Accounting for the samplers' error", and docs/research/noise-samplers.md
  have the proof obligation and its check), and the calibrations leave room for it, so the accountant's epsilon
  of the recorded events covers the samplers. (``exact=True`` would not need
  the charge; it is made anyway.)
* Support: ``|x| < 2^62`` (int64 headroom); this conditioning moves the
  distribution by total variation at most ``2 exp(-2^62 / t)`` (< 1e-27 for
  ``t <= 2^56``, nil at the calibrated ``t ~ 2^40``).

Exact (``exact=True``, ``sparkpriv.privacy._exact_samplers``): CKS Algorithms
1-3 on the exact rational value of the float scale, vectorized over pending
draws with Python ints where int64 could overflow; about 40-150x slower; no
floating point touches the distribution; no scale within the limits is refused.

Randomness and limits
---------------------
``rng`` comes from ``sparkpriv.privacy.random.stream``: AES-128 in counter
mode (randomgen's ``AESCounter``), keyed through HMAC-SHA256 by a secret seed
from OS entropy and a public path, so the noise of rows an attacker knows does
not predict the noise of other rows (a statistical generator such as PCG64
could be reconstructed from such outputs). The noise is only as secret as the
seed. The lattice output removes the float side channel (Mironov 2012); it
does not protect against a leaked seed, timing, or a caller who releases the
unrounded value too. Values must satisfy ``|a / g| <= 2^62`` (see
``max_abs_value``): about ``2^22`` Laplace scales but only about ``90 sigma``
for the Gaussian grid (57 bits below ``2 sigma``). Larger values raise
:class:`ParameterError`; since that error depends on the data, callers should
check public bounds against ``max_abs_value`` first, or pass the public bound
as ``max_abs`` to the calibration functions, which coarsen the grid (keeping
the scale at least 2^30 grid steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from fractions import Fraction

import numpy as np
from dp_accounting import dp_event

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy.accounting import fit_to_epsilon
from sparkpriv.privacy.calibration import calibrate_analytic_gaussian

__all__ = [
    "LAPLACE_GRID_BITS",
    "GAUSSIAN_GRID_BITS",
    "MAX_LAPLACE_SCALE",
    "MAX_GAUSSIAN_SIGMA",
    "MAX_GRID_INTEGER",
    "SAMPLER_RELATIVE_ERROR",
    "SAMPLER_SLACK_PER_COORDINATE",
    "sampler_slack",
    "laplace_grid",
    "gaussian_grid",
    "LaplaceNoise",
    "GaussianNoise",
    "calibrate_laplace_noise",
    "calibrate_gaussian_noise",
    "gaussian_noise_from_multiplier",
    "sample_discrete_laplace",
    "sample_discrete_gaussian",
    "add_noise",
    "add_noise_transposed",
    "add_noise_symmetric",
]

LAPLACE_GRID_BITS = 40
GAUSSIAN_GRID_BITS = 57
MAX_LAPLACE_SCALE = 2.0**56
MAX_GAUSSIAN_SIGMA = 2.0**57
MAX_GRID_INTEGER = 2**62  # |values / g| must not exceed this
# The fast samplers' pmfs are within a relative 2^-36 of the ideal ones (module doc):
# per changed coordinate the log-ratio of output probabilities can exceed the ideal
# one by ln((1 + 2^-36) / (1 - 2^-36)); every recorded event charges twice that
# (docs/noise.md, "Accounting for the samplers' error").
SAMPLER_RELATIVE_ERROR = 2.0**-36
SAMPLER_SLACK_PER_COORDINATE = math.nextafter(4.0 * math.atanh(SAMPLER_RELATIVE_ERROR), math.inf)

# The receipts' description of where the noise bits come from (sparkpriv.privacy.random)
# (no word "count" in it: receipts are scanned for row counts)
GENERATOR = ("AES-128-CTR (randomgen), one stream per stage and partition, its key "
             "HMAC-SHA256 of the secret job seed and the public stream path")
_POS = Interval("real", 0, None, closed="neither")
_DELTA = Interval("real", 0, 1, closed="neither")
_DIM = Interval("integer", 1, None, closed="left")


# ----------------------------------------------------------------------------- grids


def _pow2_ceil(x: float) -> float:
    """Smallest power of two >= x (exact, via frexp)."""
    mant, exp = math.frexp(x)
    return math.ldexp(1.0, exp - 1 if mant == 0.5 else exp)


def laplace_grid(sensitivity: float, epsilon: float) -> float:
    """Grid ``g = 2^ceil(log2(Delta / (epsilon 2^40)))``: the scale is about 2^40 grid steps."""
    check_param("sensitivity", sensitivity, [_POS], "laplace_grid")
    check_param("epsilon", epsilon, [_POS], "laplace_grid")
    return _pow2_ceil(math.ldexp(float(sensitivity) / float(epsilon), -LAPLACE_GRID_BITS))


def gaussian_grid(sigma: float) -> float:
    """Grid ``g = 2^ceil(log2(2 sigma / 2^57))``: sigma is 2^55..2^56 grid steps."""
    check_param("sigma", sigma, [_POS], "gaussian_grid")
    return _pow2_ceil(math.ldexp(2.0 * float(sigma), -GAUSSIAN_GRID_BITS))


def _round_up(x: Fraction) -> float:
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


def _div_down(a: float, b: float) -> float:
    """``a / b`` rounded toward zero (a, b > 0): a conservative noise multiplier."""
    exact = Fraction(a) / Fraction(b)
    f = float(exact)
    return math.nextafter(f, 0.0) if Fraction(f) > exact else f


def _sqrt_up(n: int) -> Fraction:
    r = math.isqrt(n)
    return Fraction(r) if r * r == n else Fraction(math.nextafter(math.sqrt(n), math.inf))


def sampler_slack(dim: int) -> float:
    """The extra privacy loss charged for the fast samplers' error: ``dim`` times
    ``SAMPLER_SLACK_PER_COORDINATE`` (about 5.8e-11), rounded up.

    A Laplace event's epsilon and a Gaussian event's ``mu = 1 / multiplier`` are
    increased by this much (docs/noise.md).
    """
    return math.nextafter(SAMPLER_SLACK_PER_COORDINATE * int(dim), math.inf)


def _laplace_event_multiplier(scale: float, grid_sensitivity: float, dim: int) -> float:
    """``m`` with ``1 / m >= grid_sensitivity / scale + sampler_slack(dim)`` in floating point."""
    eps = _round_up(Fraction(grid_sensitivity) / Fraction(scale) + Fraction(sampler_slack(dim)))
    m = _div_down(1.0, eps)
    while 1.0 / m < eps:
        m = math.nextafter(m, 0.0)
    return m


def _gaussian_event_multiplier(sigma: float, grid_sensitivity: float, dim: int) -> float:
    """``m`` with ``1 / m >= grid_sensitivity / sigma + sampler_slack(dim)`` (Gaussian-DP mu)."""
    return _laplace_event_multiplier(sigma, grid_sensitivity, dim)  # the same arithmetic on 1/m


def _jsonable(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def _max_abs(grid: float) -> float:
    return grid * float(MAX_GRID_INTEGER)


# ----------------------------------------------------------------------------- noise specs


@dataclass(frozen=True)
class LaplaceNoise:
    """Discrete Laplace noise on a grid: pure ``epsilon``-DP for L1 ``sensitivity``.

    ``scale`` is ``t`` in grid units (pmf ``prop. to exp(-|x|/t)``);
    ``grid_sensitivity = sensitivity/grid + dim`` bounds the L1 distance of
    neighbouring rounded integer vectors. ``epsilon`` is the calibration target:
    ``grid_sensitivity / scale + sampler_slack(dim) <= epsilon`` (the recorded event).
    """

    grid: float
    scale: float
    sensitivity: float
    grid_sensitivity: float
    epsilon: float
    dim: int

    @property
    def variance(self) -> float:
        """Per-entry noise variance in data units: ``g^2 2 q / (1-q)^2``, ``q = e^{-1/t}``."""
        q = math.exp(-1.0 / self.scale)
        one_minus_q = -math.expm1(-1.0 / self.scale)
        return self.grid**2 * 2.0 * q / one_minus_q**2

    @property
    def std(self) -> float:
        return math.sqrt(self.variance)

    @property
    def max_abs_value(self) -> float:
        """Largest ``|value|`` that :func:`add_noise` accepts (``2^62`` grid steps)."""
        return _max_abs(self.grid)

    def dp_event(self) -> dp_event.DpEvent:
        """``LaplaceDpEvent(m)`` with ``1/m >= grid_sensitivity / scale + sampler_slack(dim)``.

        The nominal pure epsilon of the discrete Laplace plus the fast samplers'
        slack (:func:`sampler_slack`), rounded up.
        """
        return dp_event.LaplaceDpEvent(_laplace_event_multiplier(self.scale, self.grid_sensitivity, self.dim))

    def to_public_dict(self) -> dict:
        """JSON-safe public description (no secrets: the seed is not part of it)."""
        return {
            "kind": "discrete_laplace",
            "grid": self.grid,
            "scale": self.scale,
            "scale_data_units": self.scale * self.grid,
            "variance": self.variance,
            "std": self.std,
            "sensitivity": self.sensitivity,
            "grid_sensitivity": self.grid_sensitivity,
            "epsilon": _jsonable(self.epsilon),
            "dim": self.dim,
            "sampler": "discrete Laplace on a power-of-two grid (CKS 2020)",
            "generator": GENERATOR,
        }


@dataclass(frozen=True)
class GaussianNoise:
    """Discrete Gaussian noise on a grid for L2 ``sensitivity``.

    ``sigma`` is in grid units; ``grid_sensitivity = sensitivity/grid + sqrt(dim)``.
    ``epsilon``/``delta`` are the calibration target (NaN when built from a
    noise multiplier).
    """

    grid: float
    sigma: float
    sensitivity: float
    grid_sensitivity: float
    epsilon: float
    delta: float
    dim: int

    @property
    def variance(self) -> float:
        """Per-entry noise variance in data units, ``g^2 Var(N_Z(0, sigma^2))``.

        Equal to ``g^2 sigma^2`` up to a relative ``e^{-1200}`` for ``sigma >= 8``
        (Poisson summation); summed exactly below that.
        """
        s = self.sigma
        if s >= 8.0:
            return self.grid**2 * s * s
        k = np.arange(-int(40 * s) - 10, int(40 * s) + 11, dtype=np.float64)
        w = np.exp(-(k * k) / (2.0 * s * s))
        return self.grid**2 * float(np.sum(k * k * w) / np.sum(w))

    @property
    def std(self) -> float:
        return math.sqrt(self.variance)

    @property
    def max_abs_value(self) -> float:
        """Largest ``|value|`` that :func:`add_noise` accepts (``2^62`` grid steps)."""
        return _max_abs(self.grid)

    def dp_event(self) -> dp_event.DpEvent:
        """``GaussianDpEvent(m)`` with ``1/m >= grid_sensitivity / sigma + sampler_slack(dim)``.

        The nominal Gaussian-DP ``mu`` of the discrete Gaussian plus the fast
        samplers' slack (:func:`sampler_slack`), rounded up.
        """
        return dp_event.GaussianDpEvent(_gaussian_event_multiplier(self.sigma, self.grid_sensitivity, self.dim))

    def to_public_dict(self) -> dict:
        """JSON-safe public description (NaN epsilon/delta become None)."""
        return {
            "kind": "discrete_gaussian",
            "grid": self.grid,
            "scale": self.sigma,
            "sigma": self.sigma,
            "sigma_data_units": self.sigma * self.grid,
            "variance": self.variance,
            "std": self.std,
            "sensitivity": self.sensitivity,
            "grid_sensitivity": self.grid_sensitivity,
            "epsilon": _jsonable(self.epsilon),
            "delta": _jsonable(self.delta),
            "dim": self.dim,
            "sampler": "discrete Gaussian on a power-of-two grid (128-bit table sampler; CKS 2020 Alg. 3 below sigma 1)",
            "generator": GENERATOR,
        }


def calibrate_laplace_noise(
    *, sensitivity: float, epsilon: float, dim: int, max_abs: float | None = None
) -> LaplaceNoise:
    """Discrete Laplace noise giving pure ``epsilon``-DP for L1 ``sensitivity``.

    Parameters
    ----------
    sensitivity : float in (0, inf)
        L1 sensitivity of the released vector (data units).
    epsilon : float in (0, inf)
    dim : int >= 1
        Number of coordinates one neighbour can change (usually the vector length).
    max_abs : float in (0, inf), optional
        A public bound on ``|value|``: the grid is coarsened (if needed) so that
        :func:`add_noise` accepts it (``max_abs_value >= max_abs``). The scale
        must stay >= 2^30 grid steps; the noise grows by ``1 + dim g/sensitivity``.

    Returns
    -------
    LaplaceNoise
        ``grid = laplace_grid(sensitivity, epsilon)``,
        ``scale = (sensitivity/grid + dim) / epsilon`` (rounded up so that the
        recorded event never exceeds ``epsilon``).
    """
    caller = "calibrate_laplace_noise"
    check_param("sensitivity", sensitivity, [_POS], caller)
    check_param("epsilon", epsilon, [_POS], caller)
    check_param("dim", dim, [_DIM], caller)
    eps = float(epsilon)
    g = _grid_for(laplace_grid(sensitivity, eps), max_abs, caller)
    gs = _round_up(Fraction(float(sensitivity)) / Fraction(g) + int(dim))
    slack = sampler_slack(dim)
    if not eps > 2.0 * slack:
        raise ParameterError(
            f"The 'epsilon' parameter of {caller} is too small for dim={dim!r}: the samplers' "
            f"error alone is charged {slack:.3g} (docs/noise.md). Got {epsilon!r}; split the release."
        )
    t = _round_up(Fraction(gs) / (Fraction(eps) - Fraction(slack)))
    while 1.0 / _laplace_event_multiplier(t, gs, dim) > eps:  # the accountant computes 1 / multiplier
        t = math.nextafter(t, math.inf)
    _check_min_sigma(t, max_abs, caller)
    if t > MAX_LAPLACE_SCALE:
        raise ParameterError(
            f"The Laplace noise of {caller} needs a scale of {t:.3g} grid steps, above the "
            f"sampler limit 2^56: dim={dim!r} is too large for epsilon={epsilon!r}. "
            "Split the release into smaller vectors."
        )
    return LaplaceNoise(g, t, float(sensitivity), gs, eps, int(dim))


def calibrate_gaussian_noise(
    *, sensitivity: float, epsilon: float, delta: float, dim: int, max_abs: float | None = None
) -> GaussianNoise:
    """Discrete Gaussian noise meeting (``epsilon``, ``delta``) for L2 ``sensitivity``.

    The grid is chosen from the analytic-Gaussian sigma of ``sensitivity``; sigma
    in grid units is then recalibrated (analytic Gaussian) for the grid
    sensitivity ``sensitivity/grid + sqrt(dim)``. The default grid holds values
    up to about 90 sigma only: pass a public bound ``max_abs`` to coarsen it
    (sigma must stay >= 2^30 grid steps, i.e. ``max_abs`` <= about 4e9 sigma).
    """
    caller = "calibrate_gaussian_noise"
    check_param("sensitivity", sensitivity, [_POS], caller)
    check_param("epsilon", epsilon, [_POS], caller)
    check_param("delta", delta, [_DELTA], caller)
    check_param("dim", dim, [_DIM], caller)
    sigma_data = calibrate_analytic_gaussian(sensitivity=sensitivity, epsilon=epsilon, delta=delta)
    g = _grid_for(gaussian_grid(sigma_data), max_abs, caller)
    gs = _round_up(Fraction(float(sensitivity)) / Fraction(g) + _sqrt_up(int(dim)))
    # mu of the recorded event = gs / sigma + slack: start from the analytic mu, then
    # shrink until the accountant's epsilon of the recorded event is within epsilon
    mu = 1.0 / calibrate_analytic_gaussian(sensitivity=1.0, epsilon=epsilon, delta=delta)
    slack = sampler_slack(dim)
    if not mu > 2.0 * slack:
        raise ParameterError(
            f"The 'epsilon' parameter of {caller} is too small for dim={dim!r}: the samplers' "
            f"error alone is charged {slack:.3g} in mu (docs/noise.md). Got {epsilon!r}; split the release."
        )

    def sigma_for(r: float) -> float:
        return _round_up(Fraction(gs) / (Fraction(r * mu) - Fraction(slack)))

    def event_for(r: float):
        return dp_event.GaussianDpEvent(_gaussian_event_multiplier(sigma_for(r), gs, dim))

    r = fit_to_epsilon(event_for, epsilon=float(epsilon), delta=float(delta), caller=caller)
    sigma = sigma_for(r)
    _check_sigma(sigma, caller)
    _check_min_sigma(sigma, max_abs, caller)
    return GaussianNoise(g, sigma, float(sensitivity), gs, float(epsilon), float(delta), int(dim))


def gaussian_noise_from_multiplier(
    *, sensitivity: float, noise_multiplier: float, dim: int, max_abs: float | None = None
) -> GaussianNoise:
    """Discrete Gaussian noise with ``sigma >= noise_multiplier * grid_sensitivity``.

    For mechanisms that calibrate in Gaussian DP themselves: the recorded
    event is ``GaussianDpEvent(m)`` with ``m >= noise_multiplier``.
    ``epsilon`` and ``delta`` are NaN. ``max_abs`` as in
    :func:`calibrate_gaussian_noise`.
    """
    caller = "gaussian_noise_from_multiplier"
    check_param("sensitivity", sensitivity, [_POS], caller)
    check_param("noise_multiplier", noise_multiplier, [_POS], caller)
    check_param("dim", dim, [_DIM], caller)
    g = _grid_for(gaussian_grid(float(noise_multiplier) * float(sensitivity)), max_abs, caller)
    gs = _round_up(Fraction(float(sensitivity)) / Fraction(g) + _sqrt_up(int(dim)))
    sigma = _sigma_for_multiplier(float(noise_multiplier), gs, int(dim), caller)
    _check_sigma(sigma, caller)
    _check_min_sigma(sigma, max_abs, caller)
    return GaussianNoise(g, sigma, float(sensitivity), gs, math.nan, math.nan, int(dim))


def _sigma_for_multiplier(noise_multiplier: float, gs: float, dim: int, caller: str) -> float:
    """Sigma (grid units) whose recorded event (slack included) has multiplier >= ``noise_multiplier``."""
    mu, slack = 1.0 / noise_multiplier, sampler_slack(dim)
    if not mu > 2.0 * slack:
        raise ParameterError(
            f"The 'noise_multiplier' parameter of {caller} is too large for dim={dim!r}: the "
            f"samplers' error alone is charged {slack:.3g} in mu = 1/multiplier (docs/noise.md). "
            f"Got {noise_multiplier!r}."
        )
    sigma = _round_up(Fraction(gs) / (Fraction(mu) - Fraction(slack)))
    while _gaussian_event_multiplier(sigma, gs, dim) < noise_multiplier:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def _grid_for(grid: float, max_abs: float | None, caller: str) -> float:
    """``grid``, coarsened to a power of two with ``2^62 g >= max_abs`` if needed."""
    if max_abs is None:
        return grid
    check_param("max_abs", max_abs, [_POS, None], caller)
    return max(grid, _pow2_ceil(math.ldexp(float(max_abs), -62)))


# With max_abs, the scale must stay >= 2^30 grid steps: for the Gaussian this keeps
# (1 + e^eps) dim tau (tau <= 1/(8 sigma^2)) below 2^-63 (1 + e^eps) dim.
_MIN_SCALE = 2.0**30


def _check_min_sigma(scale: float, max_abs: float | None, caller: str) -> None:
    if max_abs is not None and scale < _MIN_SCALE:
        raise ParameterError(
            f"The 'max_abs' parameter of {caller} is too large for this noise: the grid it "
            f"needs leaves a scale of {scale:.3g} grid steps, below 2^30. Got {max_abs!r}; "
            "rescale the values or give a tighter public bound."
        )


def _check_sigma(sigma: float, caller: str) -> None:
    if sigma > MAX_GAUSSIAN_SIGMA:
        raise ParameterError(
            f"The Gaussian noise of {caller} needs sigma = {sigma:.3g} grid steps, above the "
            "sampler limit 2^57: 'dim' is too large for this budget. Split the release."
        )


# the samplers and the adding of noise live in noise_draws (module size), which imports the classes
# above; its names are served here on first use (PEP 562), so either module can be imported first
if TYPE_CHECKING:  # the same names for readers and type checkers
    from sparkpriv.privacy.noise_draws import (add_noise, add_noise_symmetric, add_noise_transposed,
                                               sample_discrete_gaussian, sample_discrete_laplace)

_DRAWS = frozenset({"add_noise", "add_noise_symmetric", "add_noise_transposed", "sample_discrete_gaussian",
                    "sample_discrete_laplace"})


def __getattr__(name: str):
    if name in _DRAWS:
        from sparkpriv.privacy import noise_draws

        value = getattr(noise_draws, name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
