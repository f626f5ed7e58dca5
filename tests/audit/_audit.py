"""Shared machinery of the empirical privacy audit (tests/audit/README.md).

Every audit is a distinguishing game with a KNOWN secret: the auditor knows the
projection matrix (or the mechanism has none), the two worst-case neighbouring
inputs ``D`` and ``D'``, and the noise distribution, so it knows the exact
centres ``u = rint(f(D) / g)`` and ``u' = rint(f(D') / g)`` of the released
integers on the power-of-two grid ``g``. It runs the mechanism ``n`` times on
``D`` and ``n`` times on ``D'`` and applies a test fixed BEFORE the trials:

* discrete Laplace (pure epsilon): the event "the exact log-likelihood ratio
  ``sum_j (|o_j - u'_j| - |o_j - u_j|) / t`` reaches its maximum
  ``||u - u'||_1 / t``" (every coordinate on the far side of both centres);
  on that event ``p_D(o) = e^{eps} p_D'(o)`` exactly, so it is the test that
  can reach the claimed epsilon;
* discrete Gaussian: the exact log-likelihood ratio is a linear statistic,
  ``T = <o - u', u - u'> / (||u - u'|| sigma)`` (``N(mu, 1)`` under ``D``,
  ``N(0, 1)`` under ``D'`` up to the lattice), thresholded at ``c``.

Estimators (Jagielski et al. 2020, Nasr et al. 2021): with one-sided
Clopper-Pearson bounds at level ``alpha / 2`` on each of the two rates (so both
hold at once with probability at least ``1 - alpha``; ``ALPHA`` below is 1e-3, 99.9 %),

    pure:        eps_lb = log( TPR_lb / FPR_ub )
    (eps,delta): eps_lb = log( (TPR_lb - delta) / FPR_ub )
    mu-GDP:      mu_lb  = Phi^{-1}(TPR_lb) - Phi^{-1}(FPR_ub)

where ``TPR = P_D(event)``, ``FPR = P_D'(event)``. Any mechanism that meets its
claim has ``eps_lb <= eps`` (resp. ``mu_lb <= mu``) except with probability 5 %.
Seeds are fixed, so every run gives the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

ALPHA = 1e-3  # the pair of Clopper-Pearson bounds holds with probability >= 1 - ALPHA (README: why not 0.05)
CONTROL_FACTOR = 0.7  # positive controls: the noise scale deliberately cut by 30 %
N_LAPLACE = 400_000  # trials per side of a pure-epsilon (discrete Laplace) game
N_GAUSS = 1_000_000  # trials per side of an (epsilon, delta) / Gaussian-DP game

# every audit result of the session, printed as a table at the end (conftest.py)
RESULTS: list["AuditResult"] = []


# ----------------------------------------------------------------------------- estimators


def cp_upper(k: int, n: int, alpha: float = ALPHA / 2) -> float:
    """One-sided Clopper-Pearson upper bound on a rate with ``k`` hits in ``n``."""
    return 1.0 if k >= n else float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))


def cp_lower(k: int, n: int, alpha: float = ALPHA / 2) -> float:
    """One-sided Clopper-Pearson lower bound on a rate with ``k`` hits in ``n``."""
    return 0.0 if k <= 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def eps_lower_bound(hits_d: int, hits_dp: int, n: int, delta: float = 0.0) -> float:
    """``log((TPR_lb - delta) / FPR_ub)`` (``-inf`` if ``TPR_lb <= delta``)."""
    tpr = cp_lower(hits_d, n) - delta
    fpr = cp_upper(hits_dp, n)
    return math.log(tpr / fpr) if tpr > 0 else -math.inf


def mu_lower_bound(hits_d: int, hits_dp: int, n: int) -> float:
    """``Phi^{-1}(TPR_lb) - Phi^{-1}(FPR_ub)``: a lower bound on the Gaussian-DP ``mu``."""
    tpr = cp_lower(hits_d, n)
    fpr = cp_upper(hits_dp, n)
    if tpr <= 0:
        return -math.inf
    return float(stats.norm.ppf(tpr) - stats.norm.ppf(fpr))


def expected_eps_lb(mu: float, c: float, n: int, delta: float) -> float:
    """The estimator's value at the expected hit counts (threshold ``c``, Gaussian ``mu``)."""
    hd = int(round(stats.norm.sf(c - mu) * n))
    hdp = int(round(stats.norm.sf(c) * n))
    return eps_lower_bound(hd, hdp, n, delta)


def best_gaussian_threshold(mu: float, n: int, delta: float) -> float:
    """The threshold ``c`` fixed before the trials: the one whose expected estimate is
    largest for the mechanism's own ``mu`` (known: the auditor knows the noise and
    the centres). Choosing it from the trials themselves would bias the bound."""
    grid = np.arange(0.0, 8.0, 0.05)
    vals = [expected_eps_lb(mu, c, n, delta) for c in grid]
    return float(grid[int(np.argmax(vals))])


# ----------------------------------------------------------------------------- statistics


def grid_integers(O: np.ndarray, g: float) -> np.ndarray:
    """The released integers ``O / g`` (int64); asserts every value sits on the grid."""
    O = np.asarray(O, dtype=np.float64)
    q = O / g  # exact: g is a power of two
    ints = np.rint(q)
    assert np.array_equal(ints, q), "a released value is not a multiple of the grid g"
    return ints.astype(np.int64)


def laplace_saturation(I: np.ndarray, u: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Boolean per trial: the Laplace log-likelihood ratio of ``D`` over ``D'`` is maximal.

    ``sum_j |o_j - u'_j| - |o_j - u_j| == ||u - u'||_1`` (integers, exact).
    """
    I = np.asarray(I, np.int64).reshape(len(I), -1)
    u = np.asarray(u, np.int64).ravel()
    up = np.asarray(up, np.int64).ravel()
    s = np.abs(I - up).sum(axis=1) - np.abs(I - u).sum(axis=1)
    return s == int(np.abs(u - up).sum())


def gaussian_statistic(I: np.ndarray, u: np.ndarray, up: np.ndarray, sigma: float) -> tuple[np.ndarray, float]:
    """``(T, mu)``: ``T = <o - u', u - u'> / (||u - u'|| sigma)`` per trial and ``mu = ||u - u'|| / sigma``."""
    I = np.asarray(I, np.int64).reshape(len(I), -1)
    u = np.asarray(u, np.int64).ravel()
    up = np.asarray(up, np.int64).ravel()
    diff = (u - up).astype(np.float64)
    norm = float(np.linalg.norm(diff))
    T = ((I - up).astype(np.float64) @ diff) / (norm * sigma)
    return T, norm / sigma


# ----------------------------------------------------------------------------- results


@dataclass
class AuditResult:
    """One audit: the claim and the measured lower bounds."""

    name: str
    trials: int
    eps_claim: float
    eps_lb: float
    delta: float = 0.0
    mu_claim: float | None = None
    mu_lb: float | None = None
    control: bool = False
    notes: str = ""
    extra: dict = field(default_factory=dict)
    control_kind: str = "noise x0.7"

    @property
    def ratio(self) -> float:
        return self.eps_lb / self.eps_claim

    def row(self) -> str:
        mu = "" if self.mu_claim is None else f"{self.mu_lb:.3f} / {self.mu_claim:.3f}"
        kind = f"control ({self.control_kind})" if self.control else "mechanism"
        lb = f"{self.eps_lb:.3f}" if self.eps_lb > 0 else "<= 0"
        ratio = f"{self.ratio:.2f}" if self.eps_lb > 0 else "0"
        return (f"| {self.name} | {kind} | {self.trials} | {lb} | {self.eps_claim:.3f} | "
                f"{ratio} | {self.delta:g} | {mu} |")


def record(res: AuditResult) -> AuditResult:
    RESULTS.append(res)
    return res


def check(res: AuditResult, *, margin: float = 0.0) -> None:
    """Assert the audit's verdict: a mechanism stays at or below its claim, a
    positive control exceeds it (by ``margin`` in epsilon, relative)."""
    record(res)
    if res.control:
        assert res.eps_lb > res.eps_claim * (1.0 + margin), (
            f"{res.name}: the positive control (noise x{CONTROL_FACTOR}) was NOT detected: "
            f"eps_lb = {res.eps_lb:.4f} <= claim {res.eps_claim:.4f}; the audit has no power")
        if res.mu_claim is not None:
            assert res.mu_lb > res.mu_claim, (
                f"{res.name}: control not detected in mu: {res.mu_lb:.4f} <= {res.mu_claim:.4f}")
    else:
        assert res.eps_lb <= res.eps_claim, (
            f"{res.name}: measured eps lower bound {res.eps_lb:.4f} EXCEEDS the claim {res.eps_claim:.4f}")
        if res.mu_claim is not None:
            assert res.mu_lb <= res.mu_claim, (
                f"{res.name}: measured mu lower bound {res.mu_lb:.4f} exceeds the claim {res.mu_claim:.4f}")


# ----------------------------------------------------------------------------- the two games


def laplace_game(name: str, I_d: np.ndarray, I_dp: np.ndarray, u: np.ndarray, up: np.ndarray,
                 eps_claim: float, *, control: bool = False, notes: str = "") -> AuditResult:
    """Pure-epsilon audit of discrete Laplace outputs (integers on the grid)."""
    n = len(I_d)
    assert len(I_dp) == n
    hd = int(laplace_saturation(I_d, u, up).sum())
    hdp = int(laplace_saturation(I_dp, u, up).sum())
    return AuditResult(name, n, float(eps_claim), eps_lower_bound(hd, hdp, n), 0.0, control=control,
                       notes=notes, extra={"hits_D": hd, "hits_D'": hdp})


def gaussian_game(name: str, I_d: np.ndarray, I_dp: np.ndarray, u: np.ndarray, up: np.ndarray,
                  sigma: float, eps_claim: float, delta: float, mu_claim: float, *,
                  control: bool = False, notes: str = "") -> AuditResult:
    """(epsilon, delta) and Gaussian-DP audit of discrete Gaussian outputs.

    The threshold of the (epsilon, delta) test is fixed from the mechanism's own
    ``mu`` before looking at the trials; the mu-GDP test thresholds at ``mu / 2``.
    """
    n = len(I_d)
    assert len(I_dp) == n
    T_d, mu = gaussian_statistic(I_d, u, up, sigma)
    T_dp, _ = gaussian_statistic(I_dp, u, up, sigma)
    c = best_gaussian_threshold(mu, n, delta)
    eps_lb = eps_lower_bound(int((T_d >= c).sum()), int((T_dp >= c).sum()), n, delta)
    m = mu / 2.0
    mu_lb = mu_lower_bound(int((T_d >= m).sum()), int((T_dp >= m).sum()), n)
    return AuditResult(name, n, float(eps_claim), eps_lb, float(delta), float(mu_claim), mu_lb,
                       control=control, notes=notes, extra={"mu_true": mu, "threshold": c})


def trials_of(values: np.ndarray, n: int) -> np.ndarray:
    """``n`` copies of one exact answer (a row of the stacked input of ``n`` trials)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    return np.broadcast_to(v, (n, v.size)).copy()


# ----------------------------------------------------------------------------- positive controls


def _scaled(noise, factor: float):
    import dataclasses

    from sparkpriv.privacy import noise as nz

    if isinstance(noise, nz.LaplaceNoise):
        return dataclasses.replace(noise, scale=noise.scale * factor)
    return dataclasses.replace(noise, sigma=noise.sigma * factor)


def weaken_noise(monkeypatch, factor: float = CONTROL_FACTOR) -> None:
    """Positive control: every noise calibration of the library returns its noise
    with the scale multiplied by ``factor`` (the grid, the recorded sensitivity
    and the claimed epsilon stay as they were: the bug a control must catch)."""
    import sparkpriv.mechanisms.kmeans as km
    from sparkpriv.privacy import noise as nz

    def wrap(fn):
        def weakened(*args, **kwargs):
            return _scaled(fn(*args, **kwargs), factor)

        return weakened

    for name in ("calibrate_laplace_noise", "calibrate_gaussian_noise", "gaussian_noise_from_multiplier"):
        monkeypatch.setattr(nz, name, wrap(getattr(nz, name)))
    # the k-means plan calls it in its own module; DPGM's length noise imports it from the package
    weakened_stats = wrap(km.calibrate_stats_noise)
    monkeypatch.setattr(km, "calibrate_stats_noise", weakened_stats)
    monkeypatch.setattr(km._plan, "calibrate_stats_noise", weakened_stats)


def sign_vectors(k: int) -> np.ndarray:
    """All of {+-1}^k as rows (2^k, k): the auditor's own enumeration."""
    idx = np.arange(1 << k)[:, None]
    return 1.0 - 2.0 * ((idx >> np.arange(k)[None, :]) & 1)


def gaussian_step_claim(event, delta: float) -> tuple[float, float]:
    """``(epsilon at delta, mu)`` of a recorded ``GaussianDpEvent``."""
    from sparkpriv.privacy.accounting import epsilon_of

    return float(epsilon_of(event, delta)), 1.0 / float(event.noise_multiplier)
