"""Turn a privacy budget into a noise scale (docs/math.md section 1).

* Laplace: ``b = Delta_1 / epsilon`` gives pure epsilon-DP.
* Gaussian: the analytic Gaussian mechanism of Balle & Wang (2018), valid for
  every epsilon (the classic ``sqrt(2 ln(1.25/delta)) / epsilon`` formula is only
  proven for epsilon < 1 and fails for large epsilon). The computation is
  dp_accounting's ``get_sigma_gaussian`` (a bisection on the exact privacy
  curve of the Gaussian mechanism with sensitivity 1), scaled by the
  sensitivity.
* Splitting one Gaussian budget over several Gaussian steps is exact in
  Gaussian-DP: ``mu_total^2 = sum mu_i^2`` (Dong, Roth & Su 2019). A step with
  share ``w_i`` (shares sum to 1) gets ``mu_i = sqrt(w_i) mu_total``. Splits are
  rounded *down* (never spend more than the whole).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from sparkpriv._validation import Interval, check_param

__all__ = [
    "calibrate_laplace",
    "calibrate_analytic_gaussian",
    "gaussian_delta",
    "gdp_mu_for",
    "gdp_epsilon_delta",
    "split_mu",
    "split_epsilon",
]

_POS = Interval("real", 0, None, closed="neither")
_DELTA_OPEN = Interval("real", 0, 1, closed="neither")


def calibrate_laplace(*, sensitivity: float, epsilon: float) -> float:
    """Laplace scale ``b`` that gives pure ``epsilon``-DP for L1 ``sensitivity``."""
    check_param("sensitivity", sensitivity, [_POS], "calibrate_laplace")
    check_param("epsilon", epsilon, [_POS], "calibrate_laplace")
    return float(sensitivity) / float(epsilon)


def gaussian_delta(sigma_over_sensitivity: float, epsilon: float) -> float:
    """Exact delta(epsilon) of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

    ``delta = Phi(-eps s + 1/(2s)) - e^eps Phi(-eps s - 1/(2s))`` with ``s`` the
    noise standard deviation divided by the L2 sensitivity.
    """
    s = float(sigma_over_sensitivity)
    a = -epsilon * s + 1.0 / (2.0 * s)
    b = -epsilon * s - 1.0 / (2.0 * s)
    # e^eps Phi(b) computed in log space to stay finite for large epsilon
    return float(special.ndtr(a) - math.exp(epsilon + special.log_ndtr(b)))


def calibrate_analytic_gaussian(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest Gaussian standard deviation meeting (epsilon, delta)-DP.

    Parameters
    ----------
    sensitivity : float
        L2 sensitivity of the query under the release's neighbour relation.
    epsilon : float in (0, inf)
    delta : float in (0, 1)

    Returns
    -------
    sigma : float
        Rounded up by a relative 1e-9 so that the achieved delta never exceeds
        the target (bisection tolerance is on the safe side).
    """
    caller = "calibrate_analytic_gaussian"
    check_param("sensitivity", sensitivity, [_POS], caller)
    check_param("epsilon", epsilon, [_POS], caller)
    check_param("delta", delta, [_DELTA_OPEN], caller)

    def f(log_s: float) -> float:
        return gaussian_delta(math.exp(log_s), epsilon) - delta

    lo, hi = math.log(1e-6), math.log(1e6)
    if f(lo) < 0:  # absurdly weak requirement: noise can be tiny
        return float(sensitivity) * math.exp(lo)
    log_s = optimize.brentq(f, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500)
    s = math.exp(log_s) * (1.0 + 1e-9)
    assert gaussian_delta(s, epsilon) <= delta  # internal invariant, not user input
    return float(sensitivity) * s


def gdp_mu_for(epsilon: float, delta: float) -> float:
    """The largest Gaussian-DP ``mu`` whose (epsilon, delta) curve meets the target.

    mu-GDP is the Gaussian mechanism with ``sigma / sensitivity = 1 / mu``.
    """
    s = calibrate_analytic_gaussian(sensitivity=1.0, epsilon=epsilon, delta=delta)
    return 1.0 / s


def gdp_epsilon_delta(mu: float, delta: float) -> float:
    """Epsilon of mu-GDP at the given delta (inverse of :func:`gdp_mu_for`)."""
    s = 1.0 / float(mu)

    def f(eps: float) -> float:
        return gaussian_delta(s, eps) - delta

    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-12))


def split_epsilon(epsilon: float, share: float) -> tuple[float, float]:
    """Split a pure epsilon into ``(share * epsilon, rest)`` whose float sum is at most ``epsilon``.

    ``epsilon * share + epsilon * (1 - share)`` can round one ulp above
    ``epsilon``; the rest is lowered until the sum (as the accountant adds it)
    does not exceed the whole.
    """
    first = float(epsilon) * float(share)
    rest = float(epsilon) - first
    while first + rest > epsilon:
        rest = math.nextafter(rest, 0.0)
    return first, rest


def split_mu(mu_total: float, shares: "list[float] | tuple[float, ...]") -> list[float]:
    """Split a Gaussian-DP budget exactly: ``mu_i = sqrt(w_i) mu_total``.

    Shares must be positive and sum to at most 1; each part is rounded down by a
    relative 1e-12 so that ``sum mu_i^2 <= mu_total^2`` holds in floating point.
    """
    w = np.asarray(shares, dtype=float)
    if w.ndim != 1 or w.size == 0 or np.any(w <= 0) or w.sum() > 1.0 + 1e-12:
        from sparkpriv.errors import ParameterError

        raise ParameterError(
            f"Budget shares must be positive and sum to at most 1. Got {list(shares)!r} instead."
        )
    parts = [float(mu_total) * math.sqrt(x) * (1.0 - 1e-12) for x in w]
    return parts
