"""Audit of the noise samplers and of the power-of-two grid.

1. Goodness of fit: the discrete Laplace and discrete Gaussian samplers (fast
   numpy, compiled kernel through ``add_noise``, exact rational) against their
   exact pmfs, by a chi-square test on bins of equal probability under the
   exact pmf (with extra tail bins). Power: the same sampler run at 0.7x and
   1.3x of the scale must be rejected against the pmf of the scale.
2. Low bits (Mironov 2012): a distinguishing test that looks only at the
   floating-point representation of one released value (its 2-adic valuation,
   i.e. where its lowest set bit is) for two neighbouring answers. Textbook
   float noise (``a + rng.laplace(0, b)``, ``a + rng.normal(0, s)``) leaks the
   answer through these bits and must be detected (eps_lb far above the
   claim); the library's outputs ``g * integer`` must not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.calibration import calibrate_analytic_gaussian

from ._audit import AuditResult, check, cp_lower, cp_upper, grid_integers

pytestmark = pytest.mark.audit

N_FAST = 200_000
N_EXACT = 20_000
P_ACCEPT = 1e-5  # the right sampler must not be rejected at this level (about 1e-3 over the ~30 cases)
P_REJECT = 1e-12 # a sampler at 0.7x or 1.3x of the scale must be rejected at this level


# ----------------------------------------------------------------------------- exact cdfs


def dlap_cdf(x: np.ndarray, t: float) -> np.ndarray:
    """``P(X <= x)`` of the discrete Laplace ``p(x) = (1-q)/(1+q) q^|x|``, ``q = e^{-1/t}``."""
    x = np.asarray(x, dtype=np.float64)
    one_plus_q = 1.0 + math.exp(-1.0 / t)
    return np.where(x >= 0, 1.0 - np.exp(-(x + 1.0) / t) / one_plus_q, np.exp(x / t) / one_plus_q)


def dgauss_cdf(x: np.ndarray, sigma: float) -> np.ndarray:
    """``P(X <= x)`` of the discrete Gaussian: summed exactly for ``sigma <= 200``;
    above, ``Phi((x + 1/2) / sigma)`` (Euler-Maclaurin / Poisson summation: the
    error is below 1e-12, far under what 2e5 draws can see)."""
    x = np.asarray(x, dtype=np.float64)
    if sigma > 200:
        return stats.norm.cdf((x + 0.5) / sigma)
    m = int(60 * sigma) + 20
    k = np.arange(-m, m + 1, dtype=np.float64)
    w = np.exp(-(k * k) / (2.0 * sigma * sigma))
    c = np.cumsum(w) / w.sum()
    idx = np.clip(x + m, -1, 2 * m).astype(np.int64)
    return np.where(idx < 0, 0.0, c[np.maximum(idx, 0)])


def chi2_pvalue(samples: np.ndarray, cdf, approx_quantile) -> float:
    """Chi-square goodness of fit on bins ``(c_{i-1}, c_i]`` of about equal exact probability."""
    p = np.concatenate(([1e-4, 1e-3], np.arange(1, 64) / 64.0, [1 - 1e-3, 1 - 1e-4]))
    cuts = np.unique(np.floor(approx_quantile(p)))
    F = cdf(cuts)
    probs = np.diff(np.concatenate(([0.0], F, [1.0])))
    obs = np.bincount(np.searchsorted(cuts, samples, side="left"), minlength=cuts.size + 1).astype(float)
    n = samples.size
    # merge bins whose expected count is below 5 into their neighbour
    e_m, o_m = [], []
    acc_e = acc_o = 0.0
    for e, o in zip(probs * n, obs):
        acc_e += e
        acc_o += o
        if acc_e >= 5:
            e_m.append(acc_e)
            o_m.append(acc_o)
            acc_e = acc_o = 0.0
    if acc_e > 0 or acc_o > 0:
        if e_m:
            e_m[-1] += acc_e
            o_m[-1] += acc_o
        else:
            e_m.append(acc_e)
            o_m.append(acc_o)
    e_m, o_m = np.array(e_m), np.array(o_m)
    if e_m.size < 2:
        return 1.0
    chi = float(np.sum((o_m - e_m) ** 2 / e_m))
    return float(stats.chi2.sf(chi, e_m.size - 1))


def laplace_quantile(t):
    return lambda p: np.where(p < 0.5, t * np.log(2 * p), -t * np.log(2 * (1 - p)))


def gauss_quantile(s):
    return lambda p: s * stats.norm.ppf(p)


# ----------------------------------------------------------------------------- samplers under test


def draw(kind: str, path: str, scale: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if path == "add_noise" or path == "add_noise_numpy":  # the release path: noise on zeros, grid 1
        noise = (nz.LaplaceNoise(1.0, scale, 1.0, 2.0, 1.0, 1) if kind == "laplace"
                 else nz.GaussianNoise(1.0, scale, 1.0, 2.0, 1.0, 1e-6, 1))
        kern = {} if path == "add_noise" else {"kern": None}
        return grid_integers(nz.add_noise(np.zeros(n), noise, rng, **kern), 1.0)
    f = nz.sample_discrete_laplace if kind == "laplace" else nz.sample_discrete_gaussian
    return f(rng, scale, n, exact=(path == "exact"))


SAMPLER_CASES = (
    [("laplace", "fast", t) for t in (0.3, 3.0, 50.0, 2.0**20, 2.0**40)]
    + [("laplace", "add_noise", t) for t in (7.5, 2.0**40)]
    + [("laplace", "add_noise_numpy", t) for t in (7.5, 2.0**40)]
    + [("laplace", "exact", t) for t in (0.3, 3.0, 50.0)]
    + [("gaussian", "fast", s) for s in (0.5, 3.0, 40.0, 2.0**20, 2.0**55)]
    + [("gaussian", "add_noise", s) for s in (12.5, 2.0**55)]
    + [("gaussian", "exact", s) for s in (0.5, 3.0, 40.0)]
)


@pytest.mark.parametrize("kind,path,scale", SAMPLER_CASES, ids=lambda v: str(v))
def test_sampler_matches_exact_pmf(kind, path, scale):
    n = N_EXACT if path == "exact" else N_FAST
    cdf = (lambda x: dlap_cdf(x, scale)) if kind == "laplace" else (lambda x: dgauss_cdf(x, scale))
    q = laplace_quantile(scale) if kind == "laplace" else gauss_quantile(scale)
    seed = 1000 + SAMPLER_CASES.index((kind, path, scale))
    p_ok = chi2_pvalue(draw(kind, path, scale, n, seed), cdf, q)
    assert p_ok > P_ACCEPT, f"{kind} {path} sampler at scale {scale} rejected: p = {p_ok:.3g}"
    # power: the same sampler at 0.7x and 1.3x of the scale is rejected against this pmf
    for factor in (0.7, 1.3):
        p_bad = chi2_pvalue(draw(kind, path, scale * factor, n, seed + 7), cdf, q)
        assert p_bad < P_REJECT, (f"{kind} {path}: a sampler at {factor}x of scale {scale} was NOT "
                                  f"rejected (p = {p_bad:.3g}): the test has no power")


# ----------------------------------------------------------------------------- low bits


def two_adic_valuation(o: np.ndarray) -> np.ndarray:
    """``v`` with ``o = odd * 2^v`` for each nonzero float (zero -> 2000)."""
    o = np.asarray(o, dtype=np.float64)
    m, e = np.frexp(o)
    M = np.abs(np.ldexp(m, 53)).astype(np.int64)  # the 53-bit integer mantissa, exact
    tz = np.zeros(M.shape, dtype=np.int64)
    low = M & -M  # lowest set bit
    nzm = M != 0
    tz[nzm] = np.log2(low[nzm]).astype(np.int64)
    v = e.astype(np.int64) - 53 + tz
    return np.where(nzm, v, 2000)


def lowbit_audit(name: str, O_d: np.ndarray, O_dp: np.ndarray, eps_claim: float, *, delta: float = 0.0,
                 control: bool = False) -> AuditResult:
    """Distinguish ``D`` from ``D'`` by the lowest set bit of one output.

    Events ``{v < j}`` and ``{v >= j}`` for every threshold ``j`` seen, in both
    directions; the best one is chosen on the first half of the trials and its
    Clopper-Pearson bound is computed on the second half (no selection bias).
    """
    n = len(O_d) // 2
    vd, vdp = two_adic_valuation(O_d), two_adic_valuation(O_dp)
    sel_d, sel_dp, ev_d, ev_dp = vd[:n], vdp[:n], vd[n:2 * n], vdp[n:2 * n]
    best, best_val = None, -math.inf
    for j in np.unique(np.concatenate([sel_d, sel_dp])):
        a, b = np.count_nonzero(sel_d < j), np.count_nonzero(sel_dp < j)
        for hit_pos, hit_neg, event in ((a, b, ("<", j, 0)), (n - a, n - b, (">=", j, 0)),
                                        (b, a, ("<", j, 1)), (n - b, n - a, (">=", j, 1))):
            val = math.log((hit_pos + 1) / (hit_neg + 1))
            if val > best_val:
                best_val, best = val, event
    op, j, flip = best
    pos, neg = (ev_dp, ev_d) if flip else (ev_d, ev_dp)
    hp = int(np.count_nonzero(pos < j if op == "<" else pos >= j))
    hn = int(np.count_nonzero(neg < j if op == "<" else neg >= j))
    tpr, fpr = cp_lower(hp, n) - delta, cp_upper(hn, n)
    eps_lb = math.log(tpr / fpr) if tpr > 0 else -math.inf
    return AuditResult(name, n, eps_claim, eps_lb, delta, control=control,
                       notes=f"event v {op} {j}", extra={"hits": (hp, hn)})


N_LOWBIT = 200_000  # per side: half chooses the event, half measures it
PAIRS = [(0.0, 1.0), (0.1, 1.1)]  # neighbouring answers at distance 1 = the sensitivity


@pytest.mark.parametrize("a,ap", PAIRS)
@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_grid_outputs_carry_nothing_in_low_bits(kind, a, ap):
    """The library's noise: every output is g times an integer and its low bits
    do not tell the two answers apart (eps_lb at most the claim)."""
    eps, delta = (1.0, 0.0) if kind == "laplace" else (1.0, 1e-3)
    noise = (nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=eps, dim=1) if kind == "laplace"
             else nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=eps, delta=delta, dim=1))
    O_d = nz.add_noise(np.full(2 * N_LOWBIT, a), noise, np.random.default_rng(21))
    O_dp = nz.add_noise(np.full(2 * N_LOWBIT, ap), noise, np.random.default_rng(22))
    grid_integers(O_d, noise.grid)  # on the power-of-two grid
    grid_integers(O_dp, noise.grid)
    check(lowbit_audit(f"low bits, grid {kind} ({a} vs {ap})", O_d, O_dp, eps, delta=delta))


@pytest.mark.parametrize("a,ap", PAIRS)
@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_textbook_float_noise_leaks_through_low_bits(kind, a, ap):
    """Positive control (Mironov 2012): textbook float noise at the same claimed
    epsilon is detected by the same test, far above the claim."""
    eps, delta = (1.0, 0.0) if kind == "laplace" else (1.0, 1e-3)
    rng = np.random.default_rng(23)
    if kind == "laplace":
        O_d = a + rng.laplace(0.0, 1.0 / eps, 2 * N_LOWBIT)
        O_dp = ap + rng.laplace(0.0, 1.0 / eps, 2 * N_LOWBIT)
    else:
        s = calibrate_analytic_gaussian(sensitivity=1.0, epsilon=eps, delta=delta)
        O_d = a + rng.normal(0.0, s, 2 * N_LOWBIT)
        O_dp = ap + rng.normal(0.0, s, 2 * N_LOWBIT)
    res = lowbit_audit(f"low bits, textbook float {kind} ({a} vs {ap})", O_d, O_dp, eps, delta=delta,
                       control=True)
    res.control_kind = "textbook float noise"
    check(res, margin=1.0)  # detected with a large margin: eps_lb > 2 eps
