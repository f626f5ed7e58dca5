"""The driver's noise on the sufficient statistics, AdaSSP's fit, the logistic model and the
parametric bootstrap of the intervals (docs/math.md section 6.1).

Everything after :func:`finalize_ssp` adds the noise is post-processing of the released noisy
statistics (:class:`SSPStatistics`), so :func:`fit_from_statistics` gives anyone who holds them
(the model file, ``_regression_model.json``) the same fit again, or another one.

Intervals: a parametric bootstrap over the released statistics (Ferrando, Wang & Sheldon 2022,
"Parametric bootstrap for differentially private confidence intervals", AISTATS; its OLS case).
In the bootstrap world the truth is the released fit ``theta^`` and the Gram matrix the released one
projected onto the positive semidefinite cone (``G^``); a sample redraws what a release would
redraw: the data's part of ``X^T y`` given ``X``, ``N(G^ theta^, s^2 G^)`` with the residual variance
``s^2 = RSS~ / (n - d')`` from the released ``y^T y`` (homoscedastic linear model), and the three
noise additions of the release at their public scales (the AdaSSP ridge recomputed from its noisy
eigenvalue). The intervals are ``theta^ - bias +- z_{(1+c)/2} sd`` with the bootstrap's mean shift
``bias`` (the ridge's shrinkage) and standard deviation ``sd``. They cover the coefficients of the
linear model that generated the data; coverage is tested (tests/mechanisms/test_regression_ssp.py).
The bootstrap's own draws use a public fixed seed: they are not noise of a release.

Logistic model: PASS-GLM's (Huggins, Adams & Broderick 2017) degree-2 Chebyshev approximation of the
logistic loss ``log(1 + e^{-t}) ~ b0 + b1 t + b2 t^2`` on ``[-r, r]`` (``r = 6``). With ``s = +-1``
the approximate log-likelihood is ``n b0 + b1 theta^T X^T s + b2 theta^T X^T X theta``, so its
sufficient statistics are those of least squares on ``s``, and its maximiser is ``kappa`` times the
least-squares coefficients, ``kappa = -b1 / (2 b2)``: one pass, the same noisy ``X^T X`` and ridge.
Its intervals are ``kappa`` times those of the least squares on ``s`` (conservative for the
approximate model: ``Var(X^T s | X) <= s^2 X^T X`` is not used, the plug-in residual variance is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from sparkpriv.mechanisms.regression._ssp import (EIGEN_STAGE, GRAM_STAGE, MOMENT_STAGE, RHO, SSPDomain,
                                                  SSPPlan, moment_weights)
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.random import stream

LOGISTIC_RADIUS = 6.0
BOOTSTRAP_SEED = 20180101  # public: the bootstrap's draws are post-processing, not released noise
_BOOTSTRAP_FLOPS = 2e10  # at most about this many flops of solves (wide models get fewer samples)


def chebyshev_logistic(radius: float = LOGISTIC_RADIUS) -> tuple[float, float, float]:
    """``(b0, b1, b2)``: the least-squares degree-2 fit of ``log(1 + e^{-t})`` at 400 Chebyshev nodes
    of ``[-radius, radius]`` (public constants)."""
    t = radius * np.cos(np.pi * (np.arange(400) + 0.5) / 400)
    b2, b1, b0 = np.polyfit(t, np.logaddexp(0.0, -t), 2)
    return float(b0), float(b1), float(b2)


def logistic_kappa(radius: float = LOGISTIC_RADIUS) -> float:
    """``-b1 / (2 b2)``: the logistic coefficients over the least-squares ones on ``s = +-1``."""
    _, b1, b2 = chebyshev_logistic(radius)
    return -b1 / (2.0 * b2)


@dataclass(frozen=True)
class SSPStatistics:
    """The released noisy statistics of an SSP release (public) and their noise variances.

    ``gram`` (d', d'): ``X~^T X~``; ``xy`` (d',): ``X~^T y~``; ``yy``; ``n`` (exact under replace-one,
    where it is public; noisy under add-remove); ``lambda_min``: the noisy smallest eigenvalue of
    the exact ``X~^T X~``; ``var_*``: the noise variance of each entry; ``names``: the rows of
    ``x~`` (the features, then ``"_intercept"``). ``domain`` holds the public centres.
    """

    names: tuple
    gram: np.ndarray
    xy: np.ndarray
    yy: float
    n: float
    lambda_min: float
    var_eigen: float
    var_gram: float
    var_xy: float
    var_yy: float
    var_n: float
    domain: SSPDomain = field(repr=False)

    @property
    def dz(self) -> int:
        return self.gram.shape[0]

    def to_public_dict(self) -> dict:
        return {"names": list(self.names), "gram": self.gram.tolist(), "xy": self.xy.tolist(), "yy": self.yy,
                "n": self.n, "lambda_min": self.lambda_min,
                "noise_variance": {"lambda_min": self.var_eigen, "gram": self.var_gram, "xy": self.var_xy,
                                   "yy": self.var_yy, "n": self.var_n},
                "domain": self.domain.to_public_dict(),
                "scale": "x~ = [clip(x) - centre, 1], y~ = clip(y) - target centre (logistic: s = +-1)"}

    @classmethod
    def from_public_dict(cls, doc: dict) -> "SSPStatistics":
        """Rebuild from the model file's ``statistics`` (anyone can refit)."""
        dd = doc["domain"]
        f, t = dd["features"], dd["target"]
        dom = SSPDomain(len(f["centre"]), bool(dd["intercept"]), None if f["lower"] is None else tuple(f["lower"]),
                        None if f["upper"] is None else tuple(f["upper"]), f["row_bound"], tuple(f["centre"]),
                        float(f["radius_sq"]), dd["model"],
                        None if dd["model"] == "logistic" else (t["lower"], t["upper"]),
                        float(t.get("positive", 1.0)) if dd["model"] == "logistic" else 1.0)
        v = doc["noise_variance"]
        return cls(tuple(doc["names"]), np.asarray(doc["gram"], float), np.asarray(doc["xy"], float),
                   float(doc["yy"]), float(doc["n"]), float(doc["lambda_min"]), float(v["lambda_min"]),
                   float(v["gram"]), float(v["xy"]), float(v["yy"]), float(v["n"]), dom)


@dataclass(frozen=True)
class SSPFit:
    """A model fitted on the noisy statistics, in the input's units."""

    coef: np.ndarray
    intercept: float
    stderr: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    intercept_stderr: float
    intercept_ci: tuple
    confidence: float
    ridge: float
    model: str
    bootstrap: int
    eigenvalues_floored: int
    theta: np.ndarray = field(repr=False)  # coefficients on the released scale (x~, y~)
    logistic_steps: int = 0  # logistic: the noisy gradient passes after the statistics (docs/math.md 6.2)
    newton_ridge: float = 0.0  # logistic_steps > 0: the ridge of the last (Newton) step

    def decision_function(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float64) @ self.coef + self.intercept

    def to_public_dict(self, names=None) -> dict:
        names = list(names) if names is not None else [f"x{j}" for j in range(self.coef.size)]
        return {
            "model": self.model,
            "coefficients": {nm: float(c) for nm, c in zip(names, self.coef)},
            "intercept": self.intercept,
            "stderr": {nm: float(c) for nm, c in zip(names, self.stderr)},
            "intercept_stderr": self.intercept_stderr,
            "confidence_intervals": {nm: [float(lo), float(hi)]
                                     for nm, lo, hi in zip(names, self.ci_low, self.ci_high)},
            "intercept_confidence_interval": list(self.intercept_ci),
            "confidence": self.confidence,
            "ridge": self.ridge,
            "eigenvalues_floored": self.eigenvalues_floored,
            "interval_method": f"parametric bootstrap over the released statistics ({self.bootstrap} samples), "
                               "bias-corrected normal intervals",
            **({"logistic_approximation": f"degree-2 Chebyshev on [-{LOGISTIC_RADIUS:g}, {LOGISTIC_RADIUS:g}], "
                                          f"kappa = {logistic_kappa():.6g}"}
               if self.model == "logistic" and not self.logistic_steps else {}),
            **({"logistic_fit": f"the one-pass approximation refined by {self.logistic_steps} noisy gradient "
                                "passes (Bohning steps, the last a Newton step on the noisy Hessian)",
                "newton_ridge": self.newton_ridge} if self.logistic_steps else {}),
        }


# ----------------------------------------------------------------------------- the driver's noise


def exact_steps(total: np.ndarray, dom: SSPDomain) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact values of the three noise additions from the summed block statistics: ``[lambda_min]``,
    ``X~^T X~`` (its upper triangle is noised) and ``[X~^T y~, w_yy y~^T y~, w_n n]``."""
    dz = dom.dz
    k = dz + 1
    total = np.asarray(total, dtype=np.float64)
    C = total[:-1].reshape(k, k)
    C = 0.5 * (C + C.T)
    w_yy, w_n = moment_weights(dom)
    XX = C[:dz, :dz]
    lam = np.array([float(np.linalg.eigvalsh(XX)[0])])
    return lam, XX, np.concatenate([C[:dz, dz], [w_yy * C[dz, dz], w_n * float(total[-1])]])


def finalize_ssp(total: np.ndarray, plan: SSPPlan, dom: SSPDomain, seed: int, names: tuple
                 ) -> tuple[SSPStatistics, int]:
    """Driver step: clamp the exact statistics to the grids' public range, add the three noises once
    (streams ``(seed, stage)``), and return the released statistics and how many values were clamped."""
    dz = dom.dz
    n = float(np.asarray(total)[-1])
    w_yy, w_n = moment_weights(dom)
    n_eig, n_gram, n_mom = plan.noises(dom)
    clamped = 0
    vals = []
    for v, nz in zip(exact_steps(total, dom), (n_eig, n_gram, n_mom)):
        lim = nz.max_abs_value
        clamped += int(np.count_nonzero(np.abs(v) > lim))
        vals.append(np.clip(v, -lim, lim))
    lam_n = float(_noise.add_noise(vals[0], n_eig, stream(seed, EIGEN_STAGE))[0])
    gram_n = _noise.add_noise_symmetric(vals[1], n_gram, stream(seed, GRAM_STAGE))
    mom_n = _noise.add_noise(vals[2], n_mom, stream(seed, MOMENT_STAGE))
    n_public = plan.neighbors == "replace-one"
    st = SSPStatistics(tuple(names), gram_n, mom_n[:dz], float(mom_n[dz] / w_yy),
                       n if n_public else float(mom_n[dz + 1] / w_n), lam_n, n_eig.variance, n_gram.variance,
                       n_mom.variance, n_mom.variance / w_yy**2, 0.0 if n_public else n_mom.variance / w_n**2, dom)
    return st, clamped


# ----------------------------------------------------------------------------- AdaSSP's fit


def adassp_ridge(lambda_min_noisy: float, sd_eigen: float, sd_gram: float, dz: int, rho: float = RHO) -> float:
    """AdaSSP's ridge: ``max(0, sqrt(d' log(2 d'^2 / rho)) s_G - max(lambda_min~ - s_l z_{1-rho}, 0))``."""
    low = max(float(lambda_min_noisy) - float(sd_eigen) * float(stats.norm.ppf(1.0 - rho)), 0.0)
    return max(0.0, math.sqrt(dz * math.log(2.0 * dz * dz / rho)) * float(sd_gram) - low)


def _floor(w: np.ndarray) -> tuple[np.ndarray, int]:
    floor = 1e-9 * max(float(np.abs(w).max()), 1e-300)
    low = w < floor
    return np.where(low, floor, w), int(np.count_nonzero(low))


def ridge_solve(G: np.ndarray, b: np.ndarray, lam: float) -> tuple[np.ndarray, int]:
    """``(G + lam I)^{-1} b`` for a symmetric (noisy) ``G``; eigenvalues below a floor are raised to it
    (a noisy matrix need not be positive definite; the count is reported)."""
    H = 0.5 * (G + G.T) + lam * np.eye(G.shape[0])
    w, V = np.linalg.eigh(H)
    w, floored = _floor(w)
    return V @ ((V.T @ b) / w), floored


def fit_from_statistics(st: SSPStatistics, *, confidence: float = 0.95, bootstrap: int = 1000,
                        seed: int = BOOTSTRAP_SEED) -> SSPFit:
    """AdaSSP's coefficients (linear, or the logistic approximation) and bootstrap intervals from the
    released statistics: post-processing, no budget."""
    dom = st.domain
    dz = st.dz
    sd_e, sd_g, sd_xy = math.sqrt(st.var_eigen), math.sqrt(st.var_gram), math.sqrt(st.var_xy)
    lam = adassp_ridge(st.lambda_min, sd_e, sd_g, dz)
    theta, floored = ridge_solve(st.gram, st.xy, lam)
    samples = _bootstrap(st, theta, lam, sd_e, sd_g, sd_xy, bootstrap, seed)
    kappa = logistic_kappa() if dom.model == "logistic" else 1.0
    to_model = _to_model(dom, kappa)
    point = to_model(theta[None, :])[0]
    draws = to_model(samples)
    bias = draws.mean(axis=0) - point
    sd = draws.std(axis=0, ddof=1)
    q = float(stats.norm.ppf(0.5 + confidence / 2.0))
    centre = point - bias
    lo, hi = centre - q * sd, centre + q * sd
    d = dom.d
    icpt = float(point[d]) if dom.intercept else 0.0
    return SSPFit(point[:d], icpt, sd[:d], lo[:d], hi[:d], float(sd[d]) if dom.intercept else 0.0,
                  (float(lo[d]), float(hi[d])) if dom.intercept else (0.0, 0.0), float(confidence), float(lam),
                  dom.model, int(samples.shape[0]), floored, theta)


def _to_model(dom: SSPDomain, kappa: float):
    """Coefficients on the released scale -> ``[coef..., intercept]`` in the input's units."""
    d = dom.d
    c = np.asarray(dom.centre, dtype=np.float64)

    def to_model(T: np.ndarray) -> np.ndarray:
        T = np.asarray(T, dtype=np.float64)
        coef = kappa * T[:, :d]
        if dom.intercept:
            icpt = kappa * (T[:, d] - T[:, :d] @ c) + dom.target_centre
            return np.concatenate([coef, icpt[:, None]], axis=1)
        return coef

    return to_model


def _psd_root(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(G^, L)``: ``G`` projected onto the PSD cone and a root ``L L^T = G^``."""
    w, V = np.linalg.eigh(0.5 * (G + G.T))
    w = np.maximum(w, 0.0)
    return (V * w) @ V.T, V * np.sqrt(w)


def _bootstrap(st: SSPStatistics, theta: np.ndarray, lam: float, sd_e: float, sd_g: float, sd_xy: float,
               samples: int, seed: int) -> np.ndarray:
    """``(B, d')`` coefficients of releases redrawn in the bootstrap world (module docstring)."""
    dz = st.dz
    B = int(max(100, min(samples, _BOOTSTRAP_FLOPS // max(dz**3, 1))))
    rng = np.random.default_rng(seed)
    G_hat, L = _psd_root(st.gram)
    rss = st.yy - 2.0 * float(theta @ st.xy) + float(theta @ st.gram @ theta)
    s2 = max(rss, 0.0) / max(st.n - dz, 1.0)
    lam_min_hat = float(np.linalg.eigvalsh(G_hat)[0])
    mean_xy = G_hat @ theta
    iu = np.triu_indices(dz)
    out = np.empty((B, dz))
    step = max(1, int(2e8 // max(dz * dz * 8, 1)))  # batches of at most ~200 MB of matrices
    for lo in range(0, B, step):
        m = min(step, B - lo)
        E = np.zeros((m, dz, dz))
        E[:, iu[0], iu[1]] = rng.standard_normal((m, iu[0].size)) * sd_g
        E = E + np.triu(E, 1).transpose(0, 2, 1)
        xy = mean_xy + math.sqrt(s2) * rng.standard_normal((m, dz)) @ L.T + sd_xy * rng.standard_normal((m, dz))
        lam_b = np.array([adassp_ridge(lam_min_hat + sd_e * z, sd_e, sd_g, dz) for z in rng.standard_normal(m)])
        H = G_hat[None] + E + lam_b[:, None, None] * np.eye(dz)[None]
        try:
            out[lo:lo + m] = np.linalg.solve(H, xy[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:  # a singular draw: solve each with the eigenvalue floor
            for i in range(m):
                out[lo + i] = ridge_solve(H[i], xy[i], 0.0)[0]
    return out
