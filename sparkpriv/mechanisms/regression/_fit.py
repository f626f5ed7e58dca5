"""The driver's noise on the sketch, the fits of a release with their sandwich intervals, and the
in-memory release (docs/math.md section 6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkpriv.errors import InputError, ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.bounds import ClipCounts
from sparkpriv.privacy.random import stream
from sparkpriv.mechanisms.regression._params import RegressionParams
from sparkpriv.mechanisms.regression._sketch import ADDITIVE_STAGE, NOISE_STAGE, pack_partial, partial_size, sketch_partial
from sparkpriv.mechanisms.regression._plan import (RegressionFacts, RegressionPlan, additive_noise_rows,
                                                   clip_regression_rows, plan_regression)


@dataclass(frozen=True)
class RegressionFit:
    """Coefficients of a fit on a release, with their standard errors and intervals."""

    coef: np.ndarray
    stderr: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    confidence: float
    ridge: float
    debias: bool
    eigenvalues_floored: int

    def to_public_dict(self, names=None) -> dict:
        names = list(names) if names is not None else [f"x{j}" for j in range(self.coef.size)]
        return {
            "coefficients": {nm: float(c) for nm, c in zip(names, self.coef)},
            "stderr": {nm: float(c) for nm, c in zip(names, self.stderr)},
            "confidence_intervals": {nm: [float(lo), float(hi)]
                                     for nm, lo, hi in zip(names, self.ci_low, self.ci_high)},
            "confidence": self.confidence,
            "ridge": self.ridge,
            "debias": self.debias,
            "eigenvalues_floored": self.eigenvalues_floored,
            "interval_method": "sandwich (M-estimation) over the released rows, Student t",
        }


@dataclass(frozen=True)
class RegressionRelease:
    """The released matrix (``m x p`` sketch or ``n x p`` noisy rows), its plan and noise, a fit."""

    R: np.ndarray
    plan: RegressionPlan
    noise: _noise.GaussianNoise
    sensitivity: float
    fit: RegressionFit
    clip_counts: ClipCounts | None = None
    release_df: Any = field(default=None, repr=False, compare=False)  # Spark, additive scheme: the noisy rows

    @property
    def noise_variance(self) -> float:
        return float(self.noise.variance)

    def epsilon(self, delta: float | None = None) -> float:
        return epsilon_of(self.plan.dp_event(), self.plan.delta if delta is None else delta)

    def to_public_dict(self) -> dict:
        out = self.plan.to_public_dict()
        out["sensitivity_value"] = self.sensitivity
        out["noise"] = self.noise.to_public_dict()
        out["noise_variance_per_entry"] = self.noise_variance
        out["model"] = self.fit.to_public_dict(self.plan.params.features or None)
        return out


def sketch_noise(plan: RegressionPlan, max_col_norm: float, max_row_l1: float) -> tuple[_noise.GaussianNoise, float]:
    """The sketch's noise for the realized column and row norms of ``S``, and the sensitivity."""
    B = float(plan.params.row_bound)
    sens = 2.0 * B * float(max_col_norm)
    if not sens > 0:
        raise InputError("The sketch has no columns: there is nothing to release.")
    nz = _noise.gaussian_noise_from_multiplier(sensitivity=sens, noise_multiplier=plan.noise_multiplier,
                                               dim=plan.m * plan.p, max_abs=max(B * float(max_row_l1), sens))
    return nz, sens


def finalize_sketch(total: np.ndarray, plan: RegressionPlan, rng: np.random.Generator | None = None,
                    *, slots: int = 1) -> RegressionRelease:
    """Driver step: unpack the summed partials, calibrate to the realized ``S``, add noise once, fit."""
    m, p = plan.m, plan.p
    total = np.asarray(total, np.float64)
    if total.shape != (partial_size(m, p, slots),):
        raise ValueError(f"sketch partial total has shape {total.shape}, expected ({partial_size(m, p, slots)},)")
    SM = total[: m * p].reshape(m, p)
    l1 = total[m * p: m * p + m]
    cmax = float(total[m * p + m:].max())
    nz, sens = sketch_noise(plan, cmax, float(l1.max()))
    if rng is None:
        rng = stream(plan.noise_seed, NOISE_STAGE, 0)
    R = _noise.add_noise(SM, nz, rng)
    fit = fit_from_release(R, nz.variance, ridge=plan.params.ridge, debias=plan.params.debias,
                           confidence=plan.params.confidence, gaussian_rows=True)
    return RegressionRelease(R, plan, nz, sens, fit)


def _solve(G: np.ndarray, rows: int, s2: float, ridge: float, debias: bool) -> tuple[np.ndarray, np.ndarray, int]:
    d = G.shape[0] - 1
    H = G[:d, :d].copy()
    if debias:
        H[np.diag_indices(d)] -= rows * s2
    if ridge:
        H[np.diag_indices(d)] += ridge
    H = 0.5 * (H + H.T)
    w, V = np.linalg.eigh(H)
    floor = max(1e-9 * max(float(np.abs(w).max()), 1e-300), rows * s2 * 1e-3 if debias else 0.0)
    floored = int(np.count_nonzero(w < floor))
    if floored:
        w = np.maximum(w, floor)
        H = (V * w) @ V.T
    x = V @ ((V.T @ G[:d, d]) / w)
    return x, H, floored


def fit_from_moments(G: np.ndarray, rows: int, s2: float, *, ridge: float = 0.0, debias: bool = True):
    """Coefficients from the released Gram matrix ``G = R^T R`` ((d+1) x (d+1)), ``rows`` released rows."""
    x, _, floored = _solve(np.asarray(G, np.float64), rows, s2, ridge, debias)
    return x, floored


def sandwich_moments(R: np.ndarray, x: np.ndarray, s2: float, *, ridge: float, debias: bool, rows: int) -> np.ndarray:
    """``sum_j psi_j psi_j^T`` over released rows ``R`` (a batch; sums over batches add up)."""
    A, b = R[:, :-1], R[:, -1]
    e = b - A @ x
    c = (s2 if debias else 0.0) * x - (ridge / rows) * x
    Psi = A * e[:, None] + c[None, :]
    return Psi.T @ Psi


def _intervals(x, H, meat, rows, confidence):
    from scipy import stats

    Hinv = np.linalg.inv(H)
    cov = Hinv @ meat @ Hinv * (rows / max(rows - x.size, 1))  # small-sample factor (HC1)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    df = max(rows - x.size, 1)
    q = float(stats.t.ppf(0.5 + confidence / 2.0, df))
    return se, x - q * se, x + q * se


def gaussian_meat(R: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``Var(sum_j psi_j)`` for i.i.d. zero-mean Gaussian rows (the sketch's), by Isserlis:
    ``r (s_e^2 Sigma_AA + c c^T)`` with ``e = b~ - A~ x``, ``s_e^2 = mean(e^2)``, ``c = mean(a~ e)``,
    ``Sigma_AA = A~^T A~ / r``."""
    A, b = R[:, :-1], R[:, -1]
    r = R.shape[0]
    e = b - A @ x
    c = A.T @ e / r
    return (float(e @ e) / r) * (A.T @ A) + r * np.outer(c, c)


def fit_from_release(R: np.ndarray, s2: float, *, ridge: float = 0.0, debias: bool = True,
                     confidence: float = 0.95, gaussian_rows: bool = False) -> RegressionFit:
    """Least-squares (or ridge) coefficients and sandwich intervals from a released matrix ``R``."""
    R = np.asarray(R, np.float64)
    rows = R.shape[0]
    x, H, floored = _solve(R.T @ R, rows, s2, ridge, debias)
    if gaussian_rows:
        meat = gaussian_meat(R, x)
    else:
        meat = sandwich_moments(R, x, s2, ridge=ridge, debias=debias, rows=rows)
    se, lo, hi = _intervals(x, H, meat, rows, confidence)
    return RegressionFit(x, se, lo, hi, float(confidence), float(ridge), bool(debias), floored)


def fit_from_gram_and_meat(G: np.ndarray, meat: np.ndarray, x: np.ndarray, rows: int, s2: float, *,
                           ridge: float, debias: bool, confidence: float) -> RegressionFit:
    """The fit when ``G`` and the sandwich ``meat`` were aggregated by an engine (two passes)."""
    _, H, floored = _solve(G, rows, s2, ridge, debias)
    se, lo, hi = _intervals(x, H, meat, rows, confidence)
    return RegressionFit(np.asarray(x), se, lo, hi, float(confidence), float(ridge), bool(debias), floored)


def _check_arrays(A, b, features: int | None = None):
    A = np.asarray(A)
    b = np.asarray(b)
    if A.ndim != 2:
        raise InputError(f"A must be a 2-D array (n_samples, n_features). Got shape {A.shape}.")
    if b.ndim != 1 or b.shape[0] != A.shape[0]:
        raise InputError(f"b must be a 1-D array with one value per row of A ({A.shape[0]}). Got shape {b.shape}.")
    for name, X in (("A", A), ("b", b)):
        if np.iscomplexobj(X) or not np.issubdtype(X.dtype, np.number):
            raise InputError(f"{name} must hold real numbers. Got dtype {X.dtype}.")
    if A.shape[0] == 0:
        raise InputError("A is empty: there is nothing to release.")
    A = A.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(A).all(axis=0))
    if bad.size:
        raise InputError(f"A has NaN or infinite values in column index {int(bad[0])}; replace them with a "
                         "public value first.")
    if not np.isfinite(b).all():
        raise InputError("b has NaN or infinite values; replace them with a public value first.")
    return A, b


def release_regression_array(A, b, params: RegressionParams) -> RegressionRelease:
    """Private regression of an in-memory ``(A, b)`` (the single-machine reference path).

    Parameters
    ----------
    A : ndarray (n, d); b : ndarray (n,)
    params : RegressionParams
        ``features`` may be empty here (names default to ``x0..``).

    Returns
    -------
    RegressionRelease
        ``R`` is the released ``m x p`` sketch (or ``n x p`` noisy rows for the
        additive scheme); ``fit`` the coefficients with intervals.
    """
    caller = "release_regression_array"
    if params.method != "sketch":
        raise ParameterError(f"{caller} is the sketch's in-memory reference: give method='sketch' (method='ssp' "
                             "releases through sparkpriv.api.release_regression, which takes numpy arrays too).")
    params.validate(caller)
    A = np.asarray(A)
    d = A.shape[1] if A.ndim == 2 else 0
    if params.features and len(params.features) != d:
        raise ParameterError(f"{caller}: {len(params.features)} feature names for {d} columns of A.")
    n = A.shape[0] if A.ndim == 2 else 0
    if n == 0:
        raise InputError("A is empty: there is nothing to release.")
    plan = plan_regression(params, RegressionFacts(int(n)), d=d, caller=caller)
    A, b = _check_arrays(A, b)
    Mc, counts = clip_regression_rows(A, b, params.row_bound)
    if plan.scheme == "sketch":
        SM, l1, cmax = sketch_partial(Mc, plan.sketch_seed, plan.m, 0)
        rel = finalize_sketch(pack_partial(SM, l1, cmax), plan)
        return RegressionRelease(rel.R, plan, rel.noise, rel.sensitivity, rel.fit, counts)
    nz = plan.additive_noise()
    R = additive_noise_rows(Mc, plan, stream(plan.noise_seed, ADDITIVE_STAGE, 0))
    fit = fit_from_release(R, nz.variance, ridge=params.ridge, debias=params.debias, confidence=params.confidence)
    return RegressionRelease(R, plan, nz, 2.0 * float(params.row_bound), fit, counts)


def relative_objective_error(A: np.ndarray, b: np.ndarray, x_hat: np.ndarray) -> float:
    """``(||A x^ - b||^2 - ||A x* - b||^2) / ||A x* - b||^2`` with ``x*`` the least-squares solution."""
    A = np.asarray(A, np.float64)
    b = np.asarray(b, np.float64)
    x_star = np.linalg.lstsq(A, b, rcond=None)[0]
    f_star = float(np.sum((A @ x_star - b) ** 2))
    f_hat = float(np.sum((A @ x_hat - b) ** 2))
    return (f_hat - f_star) / f_star
