"""AdaSSP (Wang 2018, "Revisiting differentially private linear regression", Alg. 2): a
BASELINE for docs/regression.md, not a product feature (floats from numpy's
generator, not the library's grid samplers; nothing here is released).

Sufficient statistics perturbation with an adaptive ridge: with ``||x_i|| <= B_x``
and ``|y_i| <= B_y``, release noisy ``lambda_min(X^T X)``, ``X^T X`` and
``X^T y``, each with a third of the budget, and solve
``(noisy X^T X + lam I) theta = noisy X^T y`` with
``lam = max(0, sqrt(d log(2 d^2 / rho)) s_XX - noisy lambda_min)``.

Calibration here (so that the comparison is at the same (epsilon, delta) and
neighbour relation as the sketch): replace-one, Gaussian-DP split of
``mu = gdp_mu_for(epsilon, delta)`` into three equal parts ``mu / sqrt(3)``
(exact composition), sensitivities ``B_x^2`` for ``lambda_min`` (Weyl: one
rank-one PSD term of norm at most ``B_x^2`` removed, one added),
``sqrt(2) B_x^2`` for ``X^T X`` in Frobenius norm (``||x x^T - x' x'^T||_F^2 =
||x||^4 + ||x'||^4 - 2 (x . x')^2``; symmetric noise on the upper triangle) and
``2 B_x B_y`` for ``X^T y``. The noisy ``lambda_min`` is lowered by
``z_{1 - rho} s_lambda`` (a high-probability lower bound) and clamped at 0.
Wang's paper uses the classic Gaussian calibration under add/remove; the
analytic one here gives AdaSSP slightly LESS noise than the paper's.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from sparkpriv.privacy.calibration import gdp_mu_for

__all__ = ["adassp", "adassp_from_moments"]


def adassp(X: np.ndarray, y: np.ndarray, *, epsilon: float, delta: float, bound_x: float, bound_y: float,
           rng: np.random.Generator, rho: float = 0.05) -> np.ndarray:
    """AdaSSP coefficients for rows already inside the bounds (clip first)."""
    X = np.asarray(X, np.float64)
    y = np.asarray(y, np.float64)
    return adassp_from_moments(X.T @ X, X.T @ y, epsilon=epsilon, delta=delta, bound_x=bound_x,
                               bound_y=bound_y, rng=rng, rho=rho)


def adassp_from_moments(XX: np.ndarray, Xy: np.ndarray, *, epsilon: float, delta: float, bound_x: float,
                        bound_y: float, rng: np.random.Generator, rho: float = 0.05) -> np.ndarray:
    """AdaSSP from the exact moments ``X^T X`` and ``X^T y`` of rows inside the bounds (a table too
    large for memory: the moments come from one pass)."""
    XX = np.asarray(XX, np.float64)
    Xy = np.asarray(Xy, np.float64)
    d = XX.shape[0]
    mu3 = gdp_mu_for(epsilon, delta) / math.sqrt(3.0)
    s_lam = bound_x**2 / mu3
    s_xx = math.sqrt(2.0) * bound_x**2 / mu3
    s_xy = 2.0 * bound_x * bound_y / mu3
    lam_min = float(np.linalg.eigvalsh(XX)[0])
    lam_t = max(lam_min + s_lam * rng.standard_normal() - s_lam * float(stats.norm.ppf(1 - rho)), 0.0)
    lam = max(0.0, math.sqrt(d * math.log(2.0 * d * d / rho)) * s_xx - lam_t)
    E = rng.standard_normal((d, d)) * s_xx
    E = np.triu(E) + np.triu(E, 1).T
    XXn = XX + E
    Xyn = Xy + s_xy * rng.standard_normal(d)
    return np.linalg.solve(XXn + lam * np.eye(d), Xyn)
