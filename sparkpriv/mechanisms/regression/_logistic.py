"""Logistic regression refined by noisy gradient passes (``model="logistic"``, ``logistic_steps = K > 0``;
docs/math.md section 6.2): the driver's noise on each pass, the iteration, its bootstrap intervals and
the refit from a model file.

The one-pass approximation (:mod:`._ssp_fit`, PASS-GLM's degree-2 fit of the logistic loss) has the
decision boundary of least squares on ``s = +-1``. From its coefficients ``theta_0`` (the released
scale ``x~``), ``K`` more passes over the data each release one noisy gradient of the logistic loss

    g_j = sum_i -s_i sigma(-s_i theta_j . x~_i) x~_i + N(0, s_g^2 I)      (j = 0 .. K-1)

(sensitivity ``B_X``, or ``2 B_X`` under replace-one: :func:`~._ssp.gradient_sensitivity`) at the
public ``theta_j``. The first ``K - 1`` updates are Bohning's steps (the logistic Hessian is at most
``X~^T X~ / 4``, so the noisy Gram matrix of the first pass with AdaSSP's ridge is a fixed curvature
bound): ``theta_{j+1} = theta_j - 4 (G~ + lambda I)^{-1} g_j``. The last pass also releases the noisy
Hessian ``H~ = sum_i p_i (1 - p_i) x~_i x~_i^T + E`` at ``theta_{K-1}`` (:func:`~._ssp.hessian_sensitivity`)
and the last update is a Newton step ``theta_K = theta_{K-1} - (H~ + lambda_H I)^{-1} g_{K-1}`` with
``lambda_H = sqrt(d' log(2 d'^2 / rho)) s_H`` (AdaSSP's bound on the noise's spectral norm). Every
``theta_j`` is a function of released values (post-processing), so the passes compose adaptively:
``K + 1`` Gaussian events after the first pass's three, accounted together (dp_accounting's PLD).

Intervals: a parametric bootstrap of the whole iteration in the quadratic model of the log-likelihood
around the released ``theta_K`` (the truth of the bootstrap world), with the PSD part of ``H~`` as its
Hessian: one data draw per sample, ``eta ~ N(0, H^)`` (the score of a fresh table), gradients
``H^ (theta - theta_K) - eta`` plus their noise, the Gram matrix's and the Hessian's noise redrawn (and
AdaSSP's ridge from a redrawn eigenvalue), ``theta_0`` the released one. Bias-corrected normal intervals
from the samples, as for the linear model. They cover the coefficients of the logistic model that
generated the data (tests/mechanisms/test_regression_logistic.py); they rest on the quadratic model,
so on a small table whose noise dominates (the ridges large) they are wide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from sparkpriv.mechanisms.regression._ssp import GRADIENT_STAGE, HESSIAN_STAGE, RHO, SSPDomain, SSPPlan
from sparkpriv.mechanisms.regression._ssp_fit import (_BOOTSTRAP_FLOPS, BOOTSTRAP_SEED, SSPFit, SSPStatistics,
                                                      _psd_root, _to_model, adassp_ridge, fit_from_statistics,
                                                      logistic_kappa, ridge_solve)
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.random import stream


@dataclass(frozen=True)
class LogisticSteps:
    """The released values of the logistic passes (public): ``gradients`` ``(K, d')``, the noisy
    ``hessian`` ``(d', d')`` of the last pass, their noise variances per entry."""

    gradients: np.ndarray
    hessian: np.ndarray
    var_gradient: float
    var_hessian: float

    @property
    def k(self) -> int:
        return int(self.gradients.shape[0])

    def to_public_dict(self) -> dict:
        return {"gradients": self.gradients.tolist(), "hessian": self.hessian.tolist(),
                "noise_variance": {"gradient": self.var_gradient, "hessian": self.var_hessian}}

    @classmethod
    def from_public_dict(cls, doc: dict) -> "LogisticSteps":
        v = doc["noise_variance"]
        return cls(np.asarray(doc["gradients"], float), np.asarray(doc["hessian"], float), float(v["gradient"]),
                   float(v["hessian"]))


# ----------------------------------------------------------------------------- the driver's noise


def finalize_logistic_pass(total: np.ndarray, plan: SSPPlan, dom: SSPDomain, seed: int, step: int,
                           hessian: bool) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Driver step of pass ``step``: clamp the exact gradient (and Hessian) to the grids' public range,
    add their noise once (streams ``(seed, GRADIENT_STAGE, step)``, ``(seed, HESSIAN_STAGE)``)."""
    ng, nh = plan.step_noises(dom)
    dz = dom.dz
    total = np.asarray(total, dtype=np.float64)
    g = total[:dz]
    clamped = int(np.count_nonzero(np.abs(g) > ng.max_abs_value))
    g = _noise.add_noise(np.clip(g, -ng.max_abs_value, ng.max_abs_value), ng, stream(seed, GRADIENT_STAGE, step))
    H = None
    if hessian:
        H = total[dz:].reshape(dz, dz)
        H = 0.5 * (H + H.T)
        clamped += int(np.count_nonzero(np.abs(H[np.triu_indices(dz)]) > nh.max_abs_value))
        H = _noise.add_noise_symmetric(np.clip(H, -nh.max_abs_value, nh.max_abs_value), nh,
                                       stream(seed, HESSIAN_STAGE))
    return g, H, clamped


# ----------------------------------------------------------------------------- the iteration


def initial_theta(st: SSPStatistics) -> tuple[np.ndarray, float]:
    """``(theta_0, lambda)``: the one-pass approximation's coefficients (released scale) and AdaSSP's ridge."""
    lam = adassp_ridge(st.lambda_min, math.sqrt(st.var_eigen), math.sqrt(st.var_gram), st.dz)
    theta, _ = ridge_solve(st.gram, st.xy, lam)
    return logistic_kappa() * theta, lam


def bohning_step(st: SSPStatistics, lam: float, theta: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """``theta - 4 (G~ + lambda I)^{-1} g``: the logistic Hessian is at most ``X~^T X~ / 4``."""
    return np.asarray(theta, float) - ridge_solve(st.gram, 4.0 * np.asarray(gradient, float), lam)[0]


def newton_ridge(var_hessian: float, dz: int, rho: float = RHO) -> float:
    """``sqrt(d' log(2 d'^2 / rho)) s_H``: a bound on the Hessian noise's spectral norm (AdaSSP's)."""
    return math.sqrt(dz * math.log(2.0 * dz * dz / rho)) * math.sqrt(var_hessian)


def newton_step(theta: np.ndarray, gradient: np.ndarray, hessian: np.ndarray, var_hessian: float) -> np.ndarray:
    dz = hessian.shape[0]
    return np.asarray(theta, float) - ridge_solve(hessian, np.asarray(gradient, float),
                                                  newton_ridge(var_hessian, dz))[0]


def logistic_path(st: SSPStatistics, steps: LogisticSteps) -> np.ndarray:
    """``(K + 1, d')``: ``theta_0 .. theta_K`` from the released values (post-processing; the release's
    own path, replayed)."""
    theta, lam = initial_theta(st)
    path = [theta]
    for j in range(steps.k - 1):
        theta = bohning_step(st, lam, theta, steps.gradients[j])
        path.append(theta)
    path.append(newton_step(theta, steps.gradients[-1], steps.hessian, steps.var_hessian))
    return np.array(path)


# ----------------------------------------------------------------------------- fit and intervals


def fit_logistic_steps(st: SSPStatistics, steps: LogisticSteps, *, confidence: float = 0.95,
                       bootstrap: int = 1000, seed: int = BOOTSTRAP_SEED) -> SSPFit:
    """The refined logistic model and its bootstrap intervals from the released values (no budget)."""
    dom = st.domain
    path = logistic_path(st, steps)
    theta = path[-1]
    _, lam = initial_theta(st)
    samples = _bootstrap_steps(st, steps, lam, path[0], theta, bootstrap, seed)
    to_model = _to_model(dom, 1.0)
    point = to_model(theta[None, :])[0]
    draws = to_model(samples)
    bias = draws.mean(axis=0) - point
    sd = draws.std(axis=0, ddof=1)
    q = float(stats.norm.ppf(0.5 + confidence / 2.0))
    centre = point - bias
    lo, hi = centre - q * sd, centre + q * sd
    d = dom.d
    floored = int(np.count_nonzero(np.linalg.eigvalsh(0.5 * (steps.hessian + steps.hessian.T))
                                   + newton_ridge(steps.var_hessian, st.dz) <= 0))
    return SSPFit(point[:d], float(point[d]) if dom.intercept else 0.0, sd[:d], lo[:d], hi[:d],
                  float(sd[d]) if dom.intercept else 0.0,
                  (float(lo[d]), float(hi[d])) if dom.intercept else (0.0, 0.0), float(confidence), float(lam),
                  dom.model, int(samples.shape[0]), floored, theta, logistic_steps=steps.k,
                  newton_ridge=newton_ridge(steps.var_hessian, st.dz))


def _sym_noise(rng, m: int, dz: int, sd: float) -> np.ndarray:
    iu = np.triu_indices(dz)
    E = np.zeros((m, dz, dz))
    E[:, iu[0], iu[1]] = rng.standard_normal((m, iu[0].size)) * sd
    return E + np.triu(E, 1).transpose(0, 2, 1)


def _solve(H: np.ndarray, b: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(H, b[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:  # a singular draw: each with the eigenvalue floor
        return np.array([ridge_solve(H[i], b[i], 0.0)[0] for i in range(H.shape[0])])


def _bootstrap_steps(st: SSPStatistics, steps: LogisticSteps, lam: float, theta0: np.ndarray, theta: np.ndarray,
                     samples: int, seed: int) -> np.ndarray:
    """``(B, d')`` final coefficients of the iteration redrawn in the bootstrap world (module docstring)."""
    dz, K = st.dz, steps.k
    B = int(max(100, min(samples, _BOOTSTRAP_FLOPS // max((K + 1) * dz**3, 1))))
    rng = np.random.default_rng(seed)
    G_hat, _ = _psd_root(st.gram)
    lam_min_hat = float(np.linalg.eigvalsh(G_hat)[0])
    H_hat, L = _psd_root(steps.hessian)
    sd_e, sd_g = math.sqrt(st.var_eigen), math.sqrt(st.var_gram)
    sd_grad, sd_h = math.sqrt(steps.var_gradient), math.sqrt(steps.var_hessian)
    lam_h = newton_ridge(steps.var_hessian, dz)
    eye = np.eye(dz)[None]
    out = np.empty((B, dz))
    step = max(1, int(2e8 // max(dz * dz * 8 * 2, 1)))  # batches of at most ~200 MB of matrices
    for lo in range(0, B, step):
        m = min(step, B - lo)
        eta = rng.standard_normal((m, dz)) @ L.T  # the score of a fresh table at the truth
        lam_b = np.array([adassp_ridge(lam_min_hat + sd_e * z, sd_e, sd_g, dz) for z in rng.standard_normal(m)])
        Gb = G_hat[None] + _sym_noise(rng, m, dz, sd_g) + lam_b[:, None, None] * eye
        th = np.broadcast_to(theta0, (m, dz)).copy()
        for _ in range(K - 1):
            g = (th - theta) @ H_hat - eta + sd_grad * rng.standard_normal((m, dz))
            th = th - 4.0 * _solve(Gb, g)
        g = (th - theta) @ H_hat - eta + sd_grad * rng.standard_normal((m, dz))
        Hb = H_hat[None] + _sym_noise(rng, m, dz, sd_h) + lam_h * eye
        out[lo:lo + m] = th - _solve(Hb, g)
    return out


# ----------------------------------------------------------------------------- refit


def fit_from_released(st: SSPStatistics, steps: LogisticSteps | None = None, *, confidence: float = 0.95,
                      bootstrap: int = 1000, seed: int = BOOTSTRAP_SEED) -> SSPFit:
    """The model of a release from its released values: the statistics, and the logistic passes if any."""
    if steps is None:
        return fit_from_statistics(st, confidence=confidence, bootstrap=bootstrap, seed=seed)
    return fit_logistic_steps(st, steps, confidence=confidence, bootstrap=bootstrap, seed=seed)


def refit_model_file(model: dict, *, bootstrap: int = 1000) -> SSPFit:
    """The fit again from ``_regression_model.json`` of an SSP release (post-processing, no budget)."""
    st = SSPStatistics.from_public_dict(model["statistics"])
    steps = model.get("logistic_steps")
    return fit_from_released(st, None if steps is None else LogisticSteps.from_public_dict(steps),
                             confidence=float(model["confidence"]), bootstrap=bootstrap)


__all__ = ["LogisticSteps", "finalize_logistic_pass", "initial_theta", "bohning_step", "newton_step", "newton_ridge",
           "logistic_path", "fit_logistic_steps", "fit_from_released", "refit_model_file"]
