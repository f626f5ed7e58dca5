"""Grid noise: sampler distributions against exact pmfs, grids, calibration, accounting.

Every distributional check compares with an independent computation (closed
forms or direct pmf sums), with fixed seeds and enough samples that a wrong
sampler fails by a wide margin (p-value thresholds 1e-6).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import special, stats

from sparkpriv.errors import ParameterError
from sparkpriv.privacy import _fast_samplers as fs
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.calibration import calibrate_analytic_gaussian
from sparkpriv.privacy.random import stream

SLACK = 4 * math.atanh(2.0**-36)  # ln((1+a)/(1-a)) twice, a = 2^-36: charged per coordinate

P_MIN = 1e-6


# ----------------------------------------------------------------------------- references


def dlap_pmf(t: float, x) -> np.ndarray:
    q = math.exp(-1.0 / t)
    return (1 - q) / (1 + q) * q ** np.abs(np.asarray(x, dtype=float))


def dlap_upper_tail(t: float, k: int) -> float:
    """P(X > k) for k >= 0."""
    q = math.exp(-1.0 / t)
    return q ** (k + 1) / (1 + q)


def dgauss_pmf(sigma: float, x) -> np.ndarray:
    r = np.arange(-int(60 * sigma) - 30, int(60 * sigma) + 31, dtype=float)
    z = np.exp(-(r * r) / (2 * sigma * sigma)).sum()
    x = np.asarray(x, dtype=float)
    return np.exp(-(x * x) / (2 * sigma * sigma)) / z


def chisquare_pvalue(x: np.ndarray, pmf) -> float:
    """Chi-square of integer samples against a symmetric pmf; tails pooled."""
    k = 0
    while pmf(np.array([k + 1]))[0] * x.size >= 20:
        k += 1
    ks = np.arange(-k, k + 1)
    p = pmf(ks)
    tail = max((1.0 - p.sum()) / 2.0, 0.0)
    counts = np.bincount(np.clip(x, -k - 1, k + 1) + k + 1, minlength=2 * k + 3)
    expected = np.concatenate([[tail], p, [tail]]) * x.size
    keep = expected > 0
    assert counts[~keep].sum() == 0, "samples where the pmf is zero"
    expected = expected[keep] * counts.sum() / expected[keep].sum()
    return float(stats.chisquare(counts[keep], expected).pvalue)


def dlap_var(t: float) -> float:
    ks = np.arange(-int(80 * t) - 50, int(80 * t) + 51)
    return float(np.sum(ks.astype(float) ** 2 * dlap_pmf(t, ks)))


def residues_balanced(x: np.ndarray, mod: int) -> bool:
    counts = np.bincount(np.mod(x, mod), minlength=mod)
    return stats.chisquare(counts).pvalue > P_MIN


# ----------------------------------------------------------------------------- fast samplers


@pytest.mark.parametrize("t", [0.7, 3.0, 50.0])
def test_fast_laplace_matches_pmf(t):
    x = nz.sample_discrete_laplace(np.random.default_rng(11), t, 200_000)
    assert x.dtype == np.int64 and x.shape == (200_000,)
    assert chisquare_pvalue(x, lambda k: dlap_pmf(t, k)) > P_MIN
    assert x.astype(float).var() == pytest.approx(dlap_var(t), rel=0.03)


@pytest.mark.parametrize("sigma", [0.4, 1.3, 40.0])
def test_fast_gaussian_matches_pmf(sigma):
    x = nz.sample_discrete_gaussian(np.random.default_rng(12), sigma, 200_000)
    assert x.dtype == np.int64
    assert chisquare_pvalue(x, lambda k: dgauss_pmf(sigma, k)) > P_MIN
    ks = np.arange(-int(60 * sigma) - 30, int(60 * sigma) + 31)
    var = float(np.sum(ks.astype(float) ** 2 * dgauss_pmf(sigma, ks)))
    assert x.astype(float).var() == pytest.approx(var, rel=0.03)


def test_fast_tails_match_exact_tail_probabilities():
    rng = np.random.default_rng(13)
    n = 1_000_000
    x = nz.sample_discrete_laplace(rng, 50.0, n)
    hits = int(np.count_nonzero(x > 250))  # P = q^251 / (1 + q), about 0.0033
    assert stats.binomtest(hits, n, dlap_upper_tail(50.0, 250)).pvalue > P_MIN
    y = nz.sample_discrete_gaussian(rng, 40.0, n)
    ks = np.arange(-3000, 3001)
    p_far = float(dgauss_pmf(40.0, ks)[np.abs(ks) >= 120].sum())  # about 0.0027
    hits = int(np.count_nonzero(np.abs(y) >= 120))
    assert stats.binomtest(hits, n, p_far).pvalue > P_MIN


def test_rare_paths_keep_the_pmf(monkeypatch):
    """Force the memoryless restarts and the residue slow path / folded residue."""
    monkeypatch.setattr(fs, "_E_RESTART", 0.3)
    monkeypatch.setattr(fs, "_K_BITS", 2)  # t = 50 -> M = 8, residues often rejected
    rng = np.random.default_rng(14)
    x = nz.sample_discrete_laplace(rng, 50.0, 200_000)
    assert chisquare_pvalue(x, lambda k: dlap_pmf(50.0, k)) > P_MIN
    y = nz.sample_discrete_gaussian(rng, 40.0, 200_000)
    assert chisquare_pvalue(y, lambda k: dgauss_pmf(40.0, k)) > P_MIN


def test_support_truncation(monkeypatch):
    monkeypatch.setattr(fs, "_SUPPORT", 2**9)
    monkeypatch.setattr(fs, "_E_RESTART", 2.0)
    x = nz.sample_discrete_laplace(np.random.default_rng(15), 50.0, 300_000)
    assert np.abs(x).max() < 2**9
    # conditioned on |x| <= 509 the pmf is unchanged (5 expected beyond)
    assert chisquare_pvalue(x, lambda k: dlap_pmf(50.0, k)) > P_MIN


@pytest.mark.parametrize("t", [2.0**40, nz.MAX_LAPLACE_SCALE])
def test_laplace_at_huge_scale(t):
    n = 500_000
    x = nz.sample_discrete_laplace(np.random.default_rng(16), t, n)
    assert x.dtype == np.int64 and np.abs(x).max() < 2**62
    var = 2 * math.exp(-1 / t) / (-math.expm1(-1 / t)) ** 2
    assert abs(x.astype(float).mean()) < 5 * math.sqrt(var / n)
    assert x.astype(float).var() == pytest.approx(var, rel=0.02)
    assert 0.495 < np.mean(x > 0) < 0.505 and np.mean(x < 0) > 0.495
    for mod in (2, 3, 8, 1024):
        assert residues_balanced(x, mod), mod


@pytest.mark.parametrize("sigma", [2.0**56 + 12345.0, nz.MAX_GAUSSIAN_SIGMA])
def test_gaussian_at_huge_scale(sigma):
    n = 500_000
    x = nz.sample_discrete_gaussian(np.random.default_rng(17), sigma, n)
    assert x.dtype == np.int64 and np.abs(x).max() < 2**62
    xf = x.astype(float)
    assert abs(xf.mean()) < 5 * sigma / math.sqrt(n)
    assert np.mean(xf * xf) == pytest.approx(sigma * sigma, rel=0.02)
    assert 0.495 < np.mean(x > 0) < 0.505
    for mod in (2, 3, 8, 1024):
        assert residues_balanced(x, mod), mod


def test_lattice_check_catches_the_naive_geometric():
    """The residue check above has power: floor(E t) at t = 2^56 leaves holes."""
    rng = np.random.default_rng(18)
    naive = np.floor(rng.standard_exponential(500_000) * 2.0**56).astype(np.int64)
    assert not residues_balanced(naive, 8)
    assert not residues_balanced(rng.geometric(2.0**-56, 500_000), 8)


# ----------------------------------------------------------------------------- Gaussian table sampler


def binned_chisquare_pvalue(x: np.ndarray, sigma: float, width: int) -> float:
    """Chi-square of integer samples in bins of ``width`` against the exact pmf."""
    half = int(6 * sigma) // width * width + width
    ks = np.arange(-half, half)
    p = dgauss_pmf(sigma, ks).reshape(-1, width).sum(axis=1)
    tail = max((1.0 - p.sum()) / 2.0, 0.0)
    expected = np.concatenate([[tail], p, [tail]]) * x.size
    idx = np.clip((x + half) // width, -1, p.size) + 1
    counts = np.bincount(idx, minlength=p.size + 2)
    keep = expected >= 5
    return float(stats.chisquare(counts[keep], expected[keep] * counts[keep].sum() / expected[keep].sum()).pvalue)


@pytest.mark.parametrize("sigma", [2.0**9 + 0.5, 3000.5, 2.0**56, nz.MAX_GAUSSIAN_SIGMA])
def test_gaussian_table_weights_give_the_target_pmf(sigma):
    """Independent float recomputation: branch probability / proposal weight is one constant.

    Bucket j's probability p_j (from the 128-bit edges) divided by
    W exp(-(jW)^2/(2 sigma^2)), and the tail's p_J (1 - rho) exp(a^2/(2 sigma^2)),
    must all equal the same constant: then every accepted value has probability
    proportional to exp(-y^2/(2 sigma^2)).
    """
    tab = fs._gauss_table(sigma)
    big_w, n_b = 2.0**tab.m, tab.n_buckets
    assert 256 <= sigma / big_w < 512 and abs(n_b * big_w - 10 * sigma) <= big_w / 2
    edges = [0] + [(int(h) << 64) | int(lo) for h, lo in zip(tab.edges_hi[:-1], tab.edges_lo[:-1])]
    edges.append(2**128)
    p = np.array([(b - a) / 2.0**128 for a, b in zip(edges[:-1], edges[1:])])
    j = np.arange(n_b)
    ratio = p[:-1] / (big_w * np.exp(-((j * big_w) ** 2) / (2 * sigma * sigma)))
    a = n_b * big_w
    tail = p[-1] * -math.expm1(-a / sigma**2) * math.exp(a * a / (2 * sigma * sigma))
    assert ratio == pytest.approx(np.full(n_b, ratio[0]), rel=1e-12)
    assert tail == pytest.approx(ratio[0], rel=1e-9)
    # the constant is 1 / (total proposal weight), and the acceptance rate is
    # constant * sum_{y >= 0} exp(-y^2 / (2 sigma^2)) = constant (sigma sqrt(pi/2) + 1/2)
    weight = big_w * np.exp(-((j * big_w) ** 2) / (2 * sigma * sigma)).sum()
    weight += math.exp(-a * a / (2 * sigma * sigma)) / -math.expm1(-a / sigma**2)
    assert ratio[0] == pytest.approx(1.0 / weight, rel=1e-12)
    assert 0.99 < ratio[0] * (sigma * math.sqrt(math.pi / 2) + 0.5) < 1.0
    # sure-accept thresholds are below (1 - z_max) 2^16 for every bucket
    z_max = (2 * j + 1) * big_w**2 / (2 * sigma * sigma)
    assert np.all(tab.sure_accept[:-1] + 1.0 <= (1.0 - z_max) * 2.0**16)


@pytest.mark.parametrize("sigma", [1.0, 1.0 + 1e-12, 1.0000001, 1.05, 1.4999, 10.51, 511.99, 512.0,
                                   512.000001, 2.0**55 + 1.0, nz.MAX_GAUSSIAN_SIGMA])
def test_gaussian_table_builds_with_a_precise_tail_at_every_scale(sigma):
    """The tail branch keeps at least 2^40 of the 2^128 units wherever J W is rounded (regression:
    rounding J up at sigma just above 1 left the tail below that and the sampler refused)."""
    tab = fs._gauss_table(sigma)
    last = (int(tab.edges_hi[tab.n_buckets - 1]) << 64) | int(tab.edges_lo[tab.n_buckets - 1])
    assert 2**128 - last >= 2**40
    assert abs(tab.n_buckets * 2.0**tab.m - 10 * sigma) <= 2.0**tab.m / 2
    x = nz.sample_discrete_gaussian(np.random.default_rng(33), sigma, 20_000)
    assert x.astype(float).var() == pytest.approx(sigma * sigma, rel=0.05)


@pytest.mark.parametrize("sigma", [2.0**9 + 0.5, 3000.5])
def test_gaussian_table_sampler_with_wide_buckets(sigma):
    x = nz.sample_discrete_gaussian(np.random.default_rng(31), sigma, 1_000_000)
    assert fs._gauss_table(sigma).m >= 1
    assert binned_chisquare_pvalue(x, sigma, 16) > P_MIN
    assert binned_chisquare_pvalue(x, sigma, 1) > P_MIN  # within-bucket shape too
    assert residues_balanced(x, 2) and residues_balanced(x, 8)


def test_gaussian_table_rare_paths(monkeypatch):
    """Narrow tables force the tail branch, crowded guide cells and frequent rejections."""
    rng = np.random.default_rng(32)
    monkeypatch.setattr(fs, "_K_BITS", 2)  # sigma = 40 -> W = 8, sigma / W = 5: z up to 2
    monkeypatch.setattr(fs, "_TABLE_SIGMAS", 0.8)  # tail branch |x| >= 32: about 43% of draws
    monkeypatch.setattr(fs, "_GUIDE_BITS", 3)  # eight guide cells: most draws search
    tab = fs._gauss_table(40.0)
    assert (tab.m, tab.n_buckets, tab.guide_bits) == (3, 4, 3)
    y = nz.sample_discrete_gaussian(rng, 40.0, 300_000)
    assert chisquare_pvalue(y, lambda k: dgauss_pmf(40.0, k)) > P_MIN
    ks = np.arange(-3000, 3001)
    p_far = float(dgauss_pmf(40.0, ks)[np.abs(ks) >= 100].sum())
    hits = int(np.count_nonzero(np.abs(y) >= 100))
    assert stats.binomtest(hits, y.size, p_far).pvalue > P_MIN
    monkeypatch.setattr(fs, "_K_BITS", 8)
    monkeypatch.setattr(fs, "_TABLE_SIGMAS", 1.0)  # W = 1, tail beyond 1 sigma
    z = nz.sample_discrete_gaussian(rng, 6.5, 300_000)
    assert chisquare_pvalue(z, lambda k: dgauss_pmf(6.5, k)) > P_MIN


class _ScriptedBits:
    """A stand-in Generator whose raw words are given in advance (branch search test)."""

    def __init__(self, *words):
        self.bit_generator = self
        self._words = list(words)

    def random_raw(self, size):
        out = np.asarray(self._words.pop(0), dtype=np.uint64)
        assert out.size == size
        return out


class _ScriptedGenerator(_ScriptedBits):
    def __init__(self, words, uniforms):
        super().__init__(*words)
        self._uniforms = list(uniforms)

    def random(self, size):
        out = np.asarray(self._uniforms.pop(0), dtype=np.float64)
        assert out.size == size
        return out


def test_bucket_acceptance_is_v_below_exp_minus_z():
    """Scripted words: the proposal is j W + R with the sign bit, accepted iff (v + U') 2^-16 < e^-z."""
    sigma = 3000.5
    tab = fs._gauss_table(sigma)
    m, big_w = tab.m, 2**tab.m
    free = np.flatnonzero(tab.guide >= 0)  # guide cells without an edge: no extra words
    cases = []
    for cell in (free[0], free[len(free) // 2], free[-1]):
        j = int(tab.guide[cell])
        for r in (0, 1, big_w - 1):
            z = r * (2 * j * big_w + r) / (2 * sigma * sigma)
            p16 = math.exp(-z) * 2**16
            for v in {int(tab.sure_accept[j]) - 1, int(tab.sure_accept[j]), int(p16) - 1, int(p16) + 1, 65535}:
                if 0 <= v < 2**16:
                    for sign in (0, 1):
                        cases.append((cell, j, r, v, sign, p16))
    k = len(cases)
    words = np.array([(sign << 63) | (int(cell) << m) | r for cell, _, r, _, sign, _ in cases], dtype=np.uint64)
    v = np.array([c[3] for c in cases] + [0] * (-k % 4), dtype=np.uint16).view(np.uint64)
    undecided = [i for i, c in enumerate(cases) if not c[3] < tab.sure_accept[c[1]]]
    rng = _ScriptedGenerator([words, v], [np.full(len(undecided), 0.5)])
    y = np.empty(k, dtype=np.int64)
    acc = fs._gauss_propose(rng, tab, y, fs._Work(k + 64)).copy()
    for i, (cell, j, r, v_i, sign, p16) in enumerate(cases):
        mag = j * big_w + r
        assert y[i] == (-mag if sign else mag)
        want = (v_i + 0.5) < p16 and not (mag == 0 and sign)
        assert acc[i] == want, (j, r, v_i, sign)
    assert any(acc) and not all(acc)


def test_branch_search_is_exact_at_edges_and_ties():
    tab = fs._gauss_table(3000.5)
    b, n_b = tab.guide_bits, tab.n_buckets
    edges = [(int(h) << 64) | int(lo) for h, lo in zip(tab.edges_hi[:-1], tab.edges_lo[:-1])]
    picks = [0, 1, n_b // 3, n_b // 2, n_b - 2, n_b - 1]
    us = []
    for i in picks:
        us += [edges[i] - 1, edges[i], edges[i] + 1]
    us += [0, 2**128 - 1]
    us = np.array(us, dtype=object)
    hi = np.array([int(u) >> 64 for u in us], dtype=np.uint64)
    lo = np.array([int(u) & (2**64 - 1) for u in us], dtype=np.uint64)
    prefix = (hi >> np.uint64(64 - b)).astype(np.int64)
    code = tab.guide[prefix].astype(np.int64)
    code = np.where(code < 0, code, -2 * code - 2)  # force the search even in edge-free cells
    expected = [sum(e <= int(u) for e in edges) for u in us]
    # raw word: its top 64 - b bits continue the prefix; ties draw the low word
    ties = [k for k, u in enumerate(us) if any((e >> 64) == (int(u) >> 64) for e in edges)]
    rng = _ScriptedBits(hi << np.uint64(b), lo[ties])
    got = fs._branch_slow(rng, tab, prefix, code)
    assert got.tolist() == expected


# ----------------------------------------------------------------------------- exact samplers


@pytest.mark.parametrize("t", [0.7, 3.0])
def test_exact_laplace_matches_pmf(t):
    x = nz.sample_discrete_laplace(np.random.default_rng(21), t, 200_000, exact=True)
    assert x.dtype == np.int64
    assert chisquare_pvalue(x, lambda k: dlap_pmf(t, k)) > P_MIN
    hits = int(np.count_nonzero(x > 5 * t))
    assert stats.binomtest(hits, x.size, dlap_upper_tail(t, int(5 * t))).pvalue > P_MIN


@pytest.mark.parametrize("sigma", [1.3, 6.5])
def test_exact_gaussian_matches_pmf(sigma):
    x = nz.sample_discrete_gaussian(np.random.default_rng(22), sigma, 200_000, exact=True)
    assert x.dtype == np.int64 and x.shape == (200_000,)
    assert chisquare_pvalue(x, lambda k: dgauss_pmf(sigma, k)) > P_MIN
    ks = np.arange(-400, 401)
    p_far = float(dgauss_pmf(sigma, ks)[np.abs(ks) > 2 * sigma].sum())
    hits = int(np.count_nonzero(np.abs(x) > 2 * sigma))
    assert stats.binomtest(hits, x.size, p_far).pvalue > P_MIN


def test_exact_bernoulli_exp_with_big_rationals():
    from sparkpriv.privacy._exact_samplers import bernoulli_exp

    rng = np.random.default_rng(23)
    n = 200_000
    for num, den in [(1, 3), (7, 2), (10**40 + 7, 3 * 10**39)]:
        hits = int(bernoulli_exp(rng, np.array([num] * n, dtype=object), den).sum())
        assert stats.binomtest(hits, n, math.exp(-num / den)).pvalue > P_MIN


def test_exact_mode_at_large_scale_and_shapes():
    rng = np.random.default_rng(24)
    x = nz.sample_discrete_laplace(rng, 2.0**40 + 0.5, (300, 10), exact=True)
    assert x.shape == (300, 10) and x.dtype == np.int64
    assert np.std(x) == pytest.approx(math.sqrt(2) * 2.0**40, rel=0.1)
    y = nz.sample_discrete_gaussian(rng, 2.0**56, 3000, exact=True)
    assert np.std(y.astype(float)) == pytest.approx(2.0**56, rel=0.1)


# ----------------------------------------------------------------------------- add_noise


def _small_laplace(grid=0.25, scale=3.0):
    return nz.LaplaceNoise(grid, scale, 1.0, 1.0 / grid + 1, (1.0 / grid + 1) / scale, 1)


def _small_gaussian(grid=0.5, sigma=3.0, dim=1):
    gs = 1.0 / grid + math.sqrt(dim)
    return nz.GaussianNoise(grid, sigma, 1.0, gs, math.nan, math.nan, dim)


@pytest.mark.parametrize("exact", [False, True])
def test_add_noise_is_grid_rounding_plus_discrete_noise(exact):
    noise = _small_laplace()
    g = noise.grid
    rng = np.random.default_rng(31)
    base = rng.integers(-1000, 1000, 150_000) * g
    values = base + rng.uniform(-0.49, 0.49, base.size) * g  # rounds back to base
    out = nz.add_noise(values, noise, np.random.default_rng(32), exact=exact)
    steps = out / g
    assert np.array_equal(steps, np.round(steps))
    n = np.rint((out - base) / g).astype(np.int64)
    assert chisquare_pvalue(n, lambda k: dlap_pmf(3.0, k)) > P_MIN


def test_add_noise_gaussian_residual_distribution():
    noise = _small_gaussian()
    values = np.linspace(-50, 50, 200_000)
    out = nz.add_noise(values, noise, np.random.default_rng(33))
    n = np.rint(out / noise.grid - np.rint(values / noise.grid)).astype(np.int64)
    assert chisquare_pvalue(n, lambda k: dgauss_pmf(3.0, k)) > P_MIN


def test_add_noise_output_on_grid_shape_and_reproducible():
    noise = nz.calibrate_gaussian_noise(sensitivity=2.0, epsilon=1.0, delta=1e-6, dim=12)
    values = np.random.default_rng(34).normal(size=(7, 12)) * 100
    before = values.copy()
    a = nz.add_noise(values, noise, stream(123, 4, 5))
    b = nz.add_noise(values, noise, stream(123, 4, 5))
    c = nz.add_noise(values, noise, stream(123, 4, 6))
    assert a.shape == values.shape and a.dtype == np.float64 and a is not values
    assert np.array_equal(values, before)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    steps = a / noise.grid
    assert np.all(np.isfinite(steps)) and np.array_equal(steps, np.floor(steps))
    scalar = nz.add_noise(3.0, _small_laplace(), np.random.default_rng(0))
    assert scalar.shape == () and float(scalar) / 0.25 == round(float(scalar) / 0.25)
    lap = nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=0.5, dim=3)
    d = nz.add_noise(np.arange(3.0), lap, np.random.default_rng(1))
    assert np.array_equal(d / lap.grid, np.round(d / lap.grid))


def test_add_noise_refuses_overflow_and_non_finite():
    noise = nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=1)
    ok = np.array([noise.max_abs_value, -noise.max_abs_value])
    assert np.all(np.isfinite(nz.add_noise(ok, noise, np.random.default_rng(0))))
    rng = np.random.default_rng(0)
    with pytest.raises(ParameterError, match="2\\^62"):
        nz.add_noise(np.array([0.0, noise.max_abs_value * 2.0]), noise, rng)
    with pytest.raises(ParameterError, match="finite"):
        nz.add_noise(np.array([0.0, np.nan]), noise, rng)
    with pytest.raises(ParameterError, match="finite"):
        nz.add_noise(np.array([np.inf]), noise, rng, exact=True)
    with pytest.raises(ParameterError, match="noise"):
        nz.add_noise(np.zeros(3), "laplace", rng)


def test_add_noise_variance_matches_closed_form():
    rng = np.random.default_rng(35)
    lap = nz.calibrate_laplace_noise(sensitivity=2.0, epsilon=0.7, dim=4)
    x = nz.add_noise(np.zeros(400_000), lap, rng)
    assert x.var() == pytest.approx(lap.variance, rel=0.03)
    assert lap.variance == pytest.approx(2 * (2.0 / 0.7) ** 2, rel=1e-9)  # b = Delta/eps
    gau = nz.calibrate_gaussian_noise(sensitivity=2.0, epsilon=0.7, delta=1e-6, dim=4)
    y = nz.add_noise(np.zeros(400_000), gau, rng)
    assert y.var() == pytest.approx(gau.variance, rel=0.02)
    # the analytic sigma, with mu = Delta / sigma lowered by the samplers' slack (4 coordinates)
    mu = 2.0 / calibrate_analytic_gaussian(sensitivity=2.0, epsilon=0.7, delta=1e-6)
    assert gau.std == pytest.approx(2.0 / (mu - 4 * 5.8207660913467407e-11), rel=1e-9)
    assert gau.std > calibrate_analytic_gaussian(sensitivity=2.0, epsilon=0.7, delta=1e-6)


def test_variance_closed_forms_against_pmf_sums():
    for t in (0.3, 3.0, 41.5):
        noise = nz.LaplaceNoise(0.5, t, 1.0, 3.0, 3.0 / t, 1)
        assert noise.variance == pytest.approx(0.25 * dlap_var(t), rel=1e-9)
    for s in (0.3, 1.3, 7.9, 8.0, 20.0):
        ks = np.arange(-3000, 3001).astype(float)
        var = float(np.sum(ks * ks * dgauss_pmf(s, ks)))
        assert _small_gaussian(grid=2.0, sigma=s).variance == pytest.approx(4 * var, rel=1e-9)


# ----------------------------------------------------------------------------- symmetric


def test_add_noise_symmetric_mirrors_one_draw_per_entry():
    d = 200
    noise = _small_gaussian(grid=0.5, sigma=3.0, dim=d * (d + 1) // 2)
    rng = np.random.default_rng(41)
    m = rng.integers(-50, 50, (d, d)) * 0.5
    m = np.triu(m) + np.triu(m, 1).T
    iu = np.triu_indices(d)
    diag, off = [], []
    for _ in range(20):
        out = nz.add_noise_symmetric(m, noise, rng)
        assert np.array_equal(out, out.T)
        r = (out - m) / noise.grid
        diag.append(np.diag(r))
        off.append(r[np.triu_indices(d, 1)])
    diag, off = np.concatenate(diag), np.concatenate(off)
    unit_var = noise.variance / noise.grid**2
    assert off.var() == pytest.approx(unit_var, rel=0.02)  # not 2x: one draw per pair
    assert diag.var() == pytest.approx(unit_var, rel=0.1)
    assert chisquare_pvalue(off.astype(np.int64), lambda k: dgauss_pmf(3.0, k)) > P_MIN
    assert abs(np.corrcoef(off[:-1], off[1:])[0, 1]) < 0.01
    assert iu[0].size == d * (d + 1) // 2


def test_add_noise_symmetric_reads_upper_triangle_and_validates():
    noise = _small_gaussian(dim=6)
    m = np.arange(9.0).reshape(3, 3)
    sym = np.triu(m) + np.triu(m, 1).T
    a = nz.add_noise_symmetric(m, noise, np.random.default_rng(5))
    b = nz.add_noise_symmetric(sym, noise, np.random.default_rng(5))
    assert np.array_equal(a, b)
    with pytest.raises(ParameterError, match="square"):
        nz.add_noise_symmetric(np.zeros((2, 3)), noise, np.random.default_rng(0))
    with pytest.raises(ParameterError, match="dim >= d\\(d\\+1\\)/2 = 10"):
        nz.add_noise_symmetric(np.zeros((4, 4)), noise, np.random.default_rng(0))


# ----------------------------------------------------------------------------- calibration


def test_grid_values():
    assert nz.laplace_grid(1.0, 1.0) == 2.0**-40
    assert nz.laplace_grid(3.0, 1.0) == 2.0**-38
    assert nz.laplace_grid(1.0, 2.0**-10) == 2.0**-30
    assert nz.gaussian_grid(1.0) == 2.0**-56
    assert nz.gaussian_grid(3.0) == 2.0**-54
    assert nz.gaussian_grid(2.0**-3) == 2.0**-59


@pytest.mark.parametrize(
    "sens,eps,dim", [(1.0, 1.0, 1), (3.7, 0.1, 10), (1e-3, 5.0, 1000), (250.0, 0.01, 3)]
)
def test_calibrate_laplace_noise(sens, eps, dim):
    noise = nz.calibrate_laplace_noise(sensitivity=sens, epsilon=eps, dim=dim)
    g = noise.grid
    assert math.frexp(g)[0] == 0.5  # a power of two
    assert 2.0**39 < sens / (eps * g) <= 2.0**40
    assert noise.grid_sensitivity >= sens / g + dim
    assert noise.grid_sensitivity == pytest.approx(sens / g + dim, rel=1e-15)
    # epsilon minus the samplers' slack (5.82e-11 per coordinate) pays for the grid sensitivity
    assert noise.scale == pytest.approx((sens / g + dim) / (eps - dim * SLACK), rel=1e-14)
    assert noise.epsilon == eps and noise.dim == dim and noise.sensitivity == sens
    ev = noise.dp_event()
    assert isinstance(ev, dp_event.LaplaceDpEvent)
    got = epsilon_of(ev, 0.0)
    assert 0.999999 * eps <= got <= eps
    assert epsilon_of(ev, 1e-6) <= eps
    pub = noise.to_public_dict()
    json.dumps(pub, allow_nan=False)
    assert pub["kind"] == "discrete_laplace" and pub["grid"] == g and pub["scale"] == noise.scale
    assert pub["variance"] == noise.variance and "sampler" in pub


@pytest.mark.parametrize(
    "sens,eps,delta,dim",
    [(1.0, 1.0, 1e-5, 1), (2.5, 0.3, 1e-6, 100), (0.01, 4.0, 1e-9, 7), (5.0, 12.0, 1e-6, 2)],
)
def test_calibrate_gaussian_noise(sens, eps, delta, dim):
    noise = nz.calibrate_gaussian_noise(sensitivity=sens, epsilon=eps, delta=delta, dim=dim)
    g = noise.grid
    sigma_data = calibrate_analytic_gaussian(sensitivity=sens, epsilon=eps, delta=delta)
    assert math.frexp(g)[0] == 0.5
    assert 2.0**55 < sigma_data / g <= 2.0**56
    assert noise.grid_sensitivity >= sens / g + math.sqrt(dim)
    assert noise.grid_sensitivity == pytest.approx(sens / g + math.sqrt(dim), rel=1e-15)
    # mu = grid_sensitivity / sigma is the analytic mu less the slack (and at most 1e-7 less
    # than that where the accountant needed it)
    mu = sens / sigma_data
    assert noise.sigma >= noise.grid_sensitivity / (mu - dim * SLACK)
    assert noise.sigma == pytest.approx(noise.grid_sensitivity / (mu - dim * SLACK), rel=1e-7)
    ev = noise.dp_event()
    assert isinstance(ev, dp_event.GaussianDpEvent)
    assert 1 / ev.noise_multiplier >= noise.grid_sensitivity / noise.sigma + dim * SLACK
    got = epsilon_of(ev, delta)
    assert eps * (1 - 1e-6) <= got <= eps
    pub = noise.to_public_dict()
    json.dumps(pub, allow_nan=False)
    assert pub["kind"] == "discrete_gaussian" and pub["sigma"] == noise.sigma
    assert pub["delta"] == delta


def test_gaussian_noise_from_multiplier():
    noise = nz.gaussian_noise_from_multiplier(sensitivity=3.0, noise_multiplier=2.0, dim=5)
    g = noise.grid
    assert noise.grid == nz.gaussian_grid(6.0)
    assert noise.grid_sensitivity == pytest.approx(3.0 / g + math.sqrt(5), rel=1e-15)
    assert noise.sigma >= noise.grid_sensitivity / (0.5 - 5 * SLACK)
    assert noise.sigma == pytest.approx(noise.grid_sensitivity / (0.5 - 5 * SLACK), rel=1e-15)
    z = noise.dp_event().noise_multiplier  # the slack included, still at least the request
    assert 2.0 <= z <= 2.0 * (1 + 1e-14)
    assert math.isnan(noise.epsilon) and math.isnan(noise.delta)
    pub = noise.to_public_dict()
    assert json.loads(json.dumps(pub, allow_nan=False))["epsilon"] is None


def test_max_abs_coarsens_the_grid():
    lap = nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=3, max_abs=1e9)
    assert lap.max_abs_value >= 1e9 and lap.max_abs_value < 2e9
    assert math.frexp(lap.grid)[0] == 0.5 and lap.scale >= 2.0**30
    assert 0.999999 <= epsilon_of(lap.dp_event(), 0.0) <= 1.0
    assert nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=3, max_abs=1.0) == (
        nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=3)
    )
    gau = nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=1.0, delta=1e-6, dim=3, max_abs=1e9)
    assert gau.max_abs_value >= 1e9 and gau.sigma >= 2.0**30
    assert gau.grid_sensitivity == pytest.approx(1.0 / gau.grid + math.sqrt(3), rel=1e-15)
    assert epsilon_of(gau.dp_event(), 1e-6) <= 1.0 + 1e-3
    out = nz.add_noise(np.array([9e8, -9e8]), gau, np.random.default_rng(0))
    assert np.array_equal(out / gau.grid, np.round(out / gau.grid))
    assert np.all(np.abs(out - [9e8, -9e8]) < 20 * gau.std)
    mult = nz.gaussian_noise_from_multiplier(
        sensitivity=1.0, noise_multiplier=3.0, dim=2, max_abs=1e6
    )
    assert mult.max_abs_value >= 1e6 and mult.dp_event().noise_multiplier >= 3.0
    with pytest.raises(ParameterError, match="'max_abs'"):
        nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=1.0, delta=1e-6, dim=3, max_abs=1e12)
    with pytest.raises(ParameterError, match="'max_abs'"):
        nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=3, max_abs=1e15)
    with pytest.raises(ParameterError, match="'max_abs'"):
        nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=3, max_abs=-1.0)


def test_parameter_errors_use_the_template():
    template = "The 'sensitivity' parameter of calibrate_laplace_noise must be"
    with pytest.raises(ParameterError, match=template):
        nz.calibrate_laplace_noise(sensitivity=0.0, epsilon=1.0, dim=1)
    with pytest.raises(ParameterError, match="'epsilon'.*Got -1"):
        nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=-1, dim=1)
    with pytest.raises(ParameterError, match="'dim'"):
        nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=1.0, delta=1e-6, dim=0)
    with pytest.raises(ParameterError, match="'dim'"):
        nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=2.0)
    with pytest.raises(ParameterError, match="'delta'"):
        nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=1.0, delta=1.0, dim=1)
    with pytest.raises(ParameterError, match="'noise_multiplier'"):
        nz.gaussian_noise_from_multiplier(sensitivity=1.0, noise_multiplier=0.0, dim=1)
    with pytest.raises(ParameterError, match="too small for dim=100000000000000000"):
        nz.calibrate_laplace_noise(sensitivity=1.0, epsilon=1.0, dim=10**17)  # slack 5.8e6
    with pytest.raises(ParameterError, match="too small for dim=10000000000"):
        nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=0.001, delta=1e-6, dim=10**10)
    with pytest.raises(ParameterError, match="'noise_multiplier'.*too large"):
        nz.gaussian_noise_from_multiplier(sensitivity=1.0, noise_multiplier=1e3, dim=10**10)
    rng = np.random.default_rng(0)
    for bad in (0.0, -1.0, math.nan, math.inf, 2.0**57):
        with pytest.raises(ParameterError, match="'scale'"):
            nz.sample_discrete_laplace(rng, bad, 3)
    with pytest.raises(ParameterError, match="'sigma'"):
        nz.sample_discrete_gaussian(rng, 2.0**58, 3, exact=True)
    with pytest.raises(ParameterError, match="'size'"):
        nz.sample_discrete_gaussian(rng, 1.0, -1)


# ----------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("t,sens", [(20, 5), (8, 1), (3, 2)])
def test_discrete_laplace_pld_is_no_worse_than_the_recorded_event(t, sens):
    """The recorded continuous Laplace event dominates the discrete mechanism."""
    noise = nz.LaplaceNoise(1.0, float(t), float(sens), float(sens), sens / t, 1)
    recorded = epsilon_of(noise.dp_event(), 1e-6)
    discrete_pld = pld.from_discrete_laplace_mechanism(1.0 / t, sensitivity=sens)
    discrete = discrete_pld.get_epsilon_for_delta(1e-6)
    assert discrete <= recorded + 1e-4  # PLD value discretization
    assert epsilon_of(noise.dp_event(), 0.0) == pytest.approx(sens / t + SLACK, rel=1e-12)


@pytest.mark.parametrize("sigma,sens", [(5.0, 1), (20.0, 3), (40.0, 1)])
def test_discrete_gaussian_curve_within_documented_bound(sigma, sens):
    """delta_discrete(eps) <= delta_continuous(eps) + (1 + e^eps) / (8 sigma^2)."""
    cont = pld.from_gaussian_mechanism(sigma, sensitivity=sens)
    disc = pld.from_discrete_gaussian_mechanism(sigma, sensitivity=sens)
    eps_c = cont.get_epsilon_for_delta(1e-6)
    d_disc = disc.get_delta_for_epsilon(eps_c)
    assert d_disc <= 1e-6 + (1 + math.exp(eps_c)) / (8 * sigma**2)
    assert abs(disc.get_epsilon_for_delta(1e-6) - eps_c) < 5e-3


@pytest.mark.parametrize("sigma", [1.0, 2.0, 5.0, 40.0, 200.0])
def test_tv_between_discrete_and_rounded_gaussian(sigma):
    """tau(sigma) = TV(N_Z(0, s^2), round(N(0, s^2))) <= 1/(8 s^2), the module's bound."""
    k = np.arange(-int(40 * sigma) - 20, int(40 * sigma) + 21).astype(float)
    w = np.exp(-k * k / (2 * sigma * sigma))
    rounded = special.ndtr((k + 0.5) / sigma) - special.ndtr((k - 0.5) / sigma)
    tv = 0.5 * np.abs(w / w.sum() - rounded).sum()
    assert tv <= 1 / (8 * sigma**2)
    assert tv >= 0.01 / sigma**2  # the bound is not vacuous


# ----------------------------------------------------------------------------- layering


def test_noise_module_does_not_import_pyspark():
    code = (
        "import sys\n"
        "import sparkpriv.privacy.noise, sparkpriv.privacy._exact_samplers, sparkpriv.bench.noise\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'pyspark']\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_benchmark_smoke():
    import io

    from sparkpriv.bench import noise as bench

    buf = io.StringIO()
    res = bench.run(samples=20_000, repeats=1, exact=True, out=buf)
    last = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert last == json.loads(json.dumps(res))
    for key in (
        "samples",
        "laplace_samples_per_s",
        "gaussian_samples_per_s",
        "numpy_laplace_samples_per_s",
        "numpy_gaussian_samples_per_s",
        "ratio_vs_numpy_laplace",
        "ratio_vs_numpy_gaussian",
        "exact_gaussian_s40_samples_per_s",
        "laplace_compiled_vs_numpy_path",
    ):
        assert key in last and last[key] > 0
    assert isinstance(last["compiled_kernels"], str)
    import argparse

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--samples", "5", "--repeats", "2", "--exact"])
    assert (args.samples, args.repeats, args.exact) == (5, 2, True)


@pytest.mark.parametrize("first", ["sparkpriv.privacy.noise_draws", "sparkpriv.privacy.noise",
                                   "sparkpriv.spark.batches"])
def test_the_noise_modules_import_in_either_order(first):
    """noise_draws imports noise's classes and noise serves noise_draws' names: a fresh process
    (an executor) that imports either first gets both (no circular-import error)."""
    code = (f"import {first}\nfrom sparkpriv.privacy.noise import add_noise, sample_discrete_gaussian\n"
            "from sparkpriv.privacy.noise_draws import add_noise as a, transposed\nassert a is add_noise")
    subprocess.run([sys.executable, "-c", code], check=True)
