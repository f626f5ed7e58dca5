"""The numpy core of DP counts per key (sparkpriv.mechanisms.counts).

Every check compares against an independent reference: sensitivities against
an exhaustive search over all bounded records of small domains, intervals
against pmf sums, the lattice output against exact rational arithmetic, the
noise scale against the closed forms.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import counts as C
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy.accounting import epsilon_of
from sparkpriv.privacy.calibration import calibrate_analytic_gaussian
from sparkpriv.privacy.random import stream


# ----------------------------------------------------------------------------- sensitivity, brute force

def _records(d: int, L: int, c: int):
    """Every bounded record: at most L non-zero keys, each value in 1..c."""
    out = [np.zeros(d)]
    for m in range(1, min(L, d) + 1):
        for keys in itertools.combinations(range(d), m):
            for vals in itertools.product(range(1, c + 1), repeat=m):
                x = np.zeros(d)
                x[list(keys)] = vals
                out.append(x)
    return np.array(out)


@pytest.mark.parametrize("d", [1, 2, 3, 5])
@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("c", [1, 2])
def test_sensitivity_brute_force(d, L, c):
    X = _records(d, L, c)
    # add-remove: the record added or removed (the others unchanged)
    ar = C.sensitivities(L, c, d, "add-remove")
    assert ar["l1"] == pytest.approx(np.abs(X).sum(1).max())
    assert ar["l2"] == pytest.approx(np.sqrt((X * X).sum(1)).max())
    assert ar["changed"] == (X != 0).sum(1).max()
    # replace-one: every pair of records
    D = X[:, None, :] - X[None, :, :]
    ro = C.sensitivities(L, c, d, "replace-one")
    assert ro["l1"] == pytest.approx(np.abs(D).sum(2).max())
    assert ro["l2"] == pytest.approx(np.sqrt((D * D).sum(2)).max())
    assert ro["changed"] == (D != 0).sum(2).max()


def test_noise_uses_the_sensitivity_of_the_relation():
    for rel, l1, l2 in (("add-remove", 8 * 3, 3 * math.sqrt(8)), ("replace-one", 16 * 3, 3 * math.sqrt(16))):
        lap = C.plan_counts(C.CountsParams(epsilon=0.5, max_keys=8, max_events_per_key=3, neighbors=rel), 1000)
        assert lap.noise.sensitivity == pytest.approx(l1)
        # the scale in data units is the textbook L1 / epsilon, up to the grid-rounding term
        assert lap.noise.scale * lap.noise.grid == pytest.approx(l1 / 0.5, rel=1e-8)
        gau = C.plan_counts(C.CountsParams(epsilon=0.5, max_keys=8, max_events_per_key=3, neighbors=rel,
                                           noise="discrete_gaussian", delta=1e-6), 1000)
        assert gau.noise.sensitivity == pytest.approx(l2)
        sigma = calibrate_analytic_gaussian(sensitivity=l2, epsilon=0.5, delta=1e-6)
        assert gau.noise.sigma * gau.noise.grid == pytest.approx(sigma, rel=1e-4)
        assert gau.noise.sigma * gau.noise.grid >= sigma * (1 - 1e-9)


@pytest.mark.parametrize("kw", [
    dict(epsilon=1.0, max_keys=32),
    dict(epsilon=0.1, max_keys=4, max_events_per_key=7, neighbors="replace-one"),
    dict(epsilon=1.0, max_keys=32, noise="discrete_gaussian", delta=1e-6),
    dict(epsilon=3.0, max_keys=2, noise="discrete_gaussian", delta=1e-9, neighbors="replace-one", round=True),
    dict(epsilon=0.3, max_keys=5, max_events_per_key=2, noise="discrete_gaussian", delta=1e-5),
])
def test_accounted_epsilon_within_request(kw):
    plan = C.plan_counts(C.CountsParams(**kw), 1303)
    assert plan.epsilon <= kw["epsilon"]
    assert epsilon_of(plan.dp_event(), kw.get("delta", 0.0)) <= kw["epsilon"]
    assert plan.epsilon > 0.99 * kw["epsilon"]  # not wastefully over-noised


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("kw,word", [
    (dict(epsilon=1.0, max_keys=0), "max_keys"),
    (dict(epsilon=0.0, max_keys=3), "epsilon"),
    (dict(epsilon=1.0, max_keys=3, max_events_per_key=0), "max_events_per_key"),
    (dict(epsilon=1.0, max_keys=3, noise="laplace"), "noise"),
    (dict(epsilon=1.0, max_keys=3, neighbors="element"), "neighbors"),
    (dict(epsilon=1.0, max_keys=3, noise="discrete_gaussian"), "delta"),
    (dict(epsilon=1.0, max_keys=3, delta=1e-6), "delta"),
    (dict(epsilon=1.0, max_keys=3, clamp=1), "clamp"),
    (dict(epsilon=1.0, max_keys=3, confidence=1.0), "confidence"),
    (dict(epsilon=1.0, max_keys=True), "max_keys"),
])
def test_bad_parameters_refused(kw, word):
    with pytest.raises(ParameterError, match=word):
        C.CountsParams(**kw)


def test_domain_size_refused():
    p = C.CountsParams(epsilon=1.0, max_keys=2)
    with pytest.raises(ParameterError, match="domain_size"):
        C.plan_counts(p, 0)
    with pytest.raises(ParameterError, match="32-bit"):
        C.plan_counts(p, C.MAX_KEYS + 1)
    # above what the driver noises, a plan is fine (the tasks noise it, in blocks)
    assert C.plan_counts(p, C.MAX_DRIVER_KEYS + 1).domain_size == C.MAX_DRIVER_KEYS + 1


@pytest.mark.parametrize("domain", [
    lambda: C.KeyDomain.product(("tower", "hour"), [[10, 20, 30], "0..23"]),
    lambda: C.KeyDomain.product(("cell", "day", "hour"), [["x", "b", "a"], range(5, 12), range(0, 24)]),
    lambda: C.KeyDomain.product("tower", range(100, 1403)),
    lambda: C.KeyDomain.pairs(("o", "d"), [(1, 2), (2, 1), (3, 3), (7, 1)]),
])
def test_values_range_is_a_slice_of_the_whole_domain(domain):
    dom = domain()
    whole = dom.column_values()
    n = dom.size
    for start, stop in [(0, n), (0, 1), (n - 1, n), (n // 3, n // 2 + 1), (5 % n, 5 % n)]:
        got = dom.values_range(start, stop)
        assert len(got) == len(whole)
        for g, w in zip(got, whole):
            assert g.tolist() == w[start:stop].tolist()
        # and each block's values map back to their indices
        if stop > start:
            assert dom.index(*got).tolist() == list(range(start, stop))
    with pytest.raises(ParameterError, match="start"):
        dom.values_range(0, n + 1)


def test_noisy_values_of_blocks_are_the_noise_of_their_streams():
    """A block's values are its totals plus g N, N drawn in order from the block's own stream
    (independently re-drawn here from the sampler), whatever the block's length."""
    from sparkpriv.privacy import noise as nz
    from sparkpriv.privacy.random import stream

    plan = C.plan_counts(C.CountsParams(epsilon=0.7, max_keys=5), 10_000)
    totals = np.arange(37, dtype=np.int64) * 3
    res = C.noisy_values(totals, plan, stream(123, 1, 4))
    N = nz.sample_discrete_laplace(stream(123, 1, 4), plan.noise.scale, 37)
    assert np.array_equal(res.value, totals + N * plan.noise.grid)
    assert np.array_equal(res.ci_high - res.value, np.full(37, plan.half_width))


def test_key_domain():
    d = C.KeyDomain.product(("tower", "hour"), [[10, 20, 30], "0..23"])
    assert d.size == 72
    tw, hr = d.column_values()
    assert np.array_equal(d.index(tw, hr), np.arange(72))  # every key once, in index order
    assert list(d.index(np.array([20, 40, 30]), np.array([5, 1, 24]))) == [29, -1, -1]
    p = C.KeyDomain.pairs(("o", "d"), [(1, 2), (2, 1), (3, 3)])
    assert list(p.index(np.array([2, 3, 1, 1]), np.array([1, 3, 2, 3]))) == [1, 2, 0, -1]
    with pytest.raises(ParameterError, match="twice"):
        C.KeyDomain.pairs(("o", "d"), [(1, 2), (1, 2)])
    with pytest.raises(ParameterError, match="distinct"):
        C.KeyDomain.product(("a", "a"), [range(2), range(2)])
    assert "keys_sha256" in p.to_public_dict()


def test_count_keys_reference():
    rng = np.random.default_rng(3)
    lists = [sorted(rng.choice(9, rng.integers(0, 4), replace=False)) for _ in range(200)]
    off = np.concatenate(([0], np.cumsum([len(x) for x in lists])))
    idx = np.array([i for x in lists for i in x], np.int32)
    ref = np.zeros(9, np.int64)
    for x in lists:
        for i in x:
            ref[i] += 1
    assert np.array_equal(C.count_keys(off, idx, None, 9), ref)
    vals = rng.integers(1, 4, idx.size).astype(float)
    ref2 = np.zeros(9, np.int64)
    for i, v in zip(idx, vals):
        ref2[i] += int(v)
    assert np.array_equal(C.count_keys(off, idx, vals, 9), ref2)


# ----------------------------------------------------------------------------- lattice output

@pytest.mark.parametrize("kw", [dict(epsilon=1.0, max_keys=3),
                                dict(epsilon=1.0, max_keys=3, noise="discrete_gaussian", delta=1e-6),
                                dict(epsilon=1e-6, max_keys=64, max_events_per_key=1000)])
@pytest.mark.parametrize("rounded", [False, True])
def test_values_are_exact_post_processing_of_the_lattice(kw, rounded):
    plan = C.plan_counts(C.CountsParams(**kw, round=rounded), 500)
    g = Fraction(plan.noise.grid)
    counts = np.random.default_rng(0).integers(0, 2**33, 500)
    counts[:5] = [0, 1, 2**33, 7, 3]
    N = C.noise_integers(plan, stream(5, 1))
    res = C.finalize_counts(counts, plan, stream(5, 1))
    for c, n, v in zip(counts, N, res.value):
        exact = Fraction(int(c)) + g * int(n)
        if rounded:
            assert v == math.floor(exact + Fraction(1, 2))
        else:
            assert abs(Fraction(v) - exact) <= abs(exact) * Fraction(2.0**-52) + g


def test_counts_above_the_public_cap_are_clamped():
    plan = C.plan_counts(C.CountsParams(epsilon=1.0, max_keys=1, round=True), 2)
    res = C.finalize_counts(np.array([2**40, 0]), plan, stream(9, 0))
    assert abs(res.value[0] - 2**33) < 100


# ----------------------------------------------------------------------------- uncertainty

def _dlap_pmf(t: float, support: np.ndarray) -> np.ndarray:
    q = math.exp(-1.0 / t)
    return (1 - q) / (1 + q) * q ** np.abs(support)


def _dgauss_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    w = np.exp(-support.astype(float) ** 2 / (2 * sigma**2))
    return w / w.sum()


@pytest.mark.parametrize("kind,scale,grid", [("lap", 3.0, 1.0), ("lap", 37.5, 0.25), ("lap", 900.0, 2.0**-6),
                                             ("gau", 300.0, 0.125), ("gau", 2000.0, 2.0**-7)])
@pytest.mark.parametrize("rounded", [False, True])
def test_interval_and_std_match_pmf_sums(kind, scale, grid, rounded):
    span = int(60 * scale) + 100
    support = np.arange(-span, span + 1)
    if kind == "lap":
        noise = nz.LaplaceNoise(grid, scale, 1.0, 1.0, 1.0, 1)
        pmf = _dlap_pmf(scale, support)
    else:
        noise = nz.GaussianNoise(grid, scale, 1.0, 1.0, 1.0, 1e-6, 1)
        pmf = _dgauss_pmf(scale, support)
    std, hw, cov = C.uncertainty(noise, rounded=rounded, confidence=0.95)
    if rounded and grid < 1:
        z = np.floor(support * grid + 0.5)  # the rounded noise
        zs = np.arange(z.min(), z.max() + 1)
        zp = np.bincount((z - z.min()).astype(int), weights=pmf)
    else:
        zs, zp = support * grid, pmf
    ref_std = math.sqrt(float(np.sum(zp * zs**2)))
    assert std == pytest.approx(ref_std, rel=1e-5)
    inside = lambda h: float(zp[np.abs(zs) <= h + 1e-12].sum())  # noqa: E731
    step = 1.0 if (rounded and grid < 1) else grid
    assert inside(hw) >= 0.95 - 1e-9
    assert inside(hw - step) < 0.95  # the smallest such interval
    assert cov == pytest.approx(inside(hw), abs=1e-5)


@pytest.mark.parametrize("kw", [dict(epsilon=0.5, max_keys=4),
                                dict(epsilon=0.5, max_keys=4, round=True, clamp=True),
                                dict(epsilon=1.0, max_keys=2, noise="discrete_gaussian", delta=1e-6, round=True),
                                dict(epsilon=1.0, max_keys=2, noise="discrete_gaussian", delta=1e-6)])
def test_interval_coverage_simulated(kw):
    d = 200_000
    plan = C.plan_counts(C.CountsParams(**kw), d)
    truth = np.random.default_rng(1).integers(0, 30, d)
    res = C.finalize_counts(truth, plan, stream(77, 3))
    hits = int(np.sum((res.ci_low <= truth) & (truth <= res.ci_high)))
    # the exact coverage (or more under the clamp), 5 binomial standard deviations
    sd = math.sqrt(d * plan.coverage * (1 - plan.coverage))
    if kw.get("clamp"):
        assert hits >= d * plan.coverage - 5 * sd
        assert np.all(res.value >= 0) and np.all(res.ci_low >= 0)
    else:
        assert abs(hits - d * plan.coverage) <= 5 * sd
        err = res.value - truth
        assert abs(err.mean()) < 5 * plan.std / math.sqrt(d)
        assert err.std() == pytest.approx(plan.std, rel=0.01)
    assert np.all(res.std == plan.std)


def test_public_dict_has_no_secret_and_states_post_processing():
    plan = C.plan_counts(C.CountsParams(epsilon=1.0, max_keys=3, clamp=True), 10)
    d = plan.to_public_dict()
    assert d["post_processing"] == {"clamp_at_zero": True, "round": False}
    assert d["epsilon_accounted"] <= 1.0 and d["sensitivity"]["l1"] == 3.0
    assert d["uncertainty"]["std"] == pytest.approx(math.sqrt(2) * 3, rel=1e-9)
    assert stats.norm  # noqa: used above
