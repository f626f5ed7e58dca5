"""Audit of aggregates per key (sparkpriv.mechanisms.aggregates): the per-key totals of two worst-case
neighbours go through the core's bounding (``key_totals``: at most ``L`` keys, ``c`` events' worth per
key, values clamped and centred) and the release's noise (``add_group_noise``, drawn as the release
draws it); the game reads the released lattice integers of one group.

Worst-case neighbours (the auditor's choice; tests/mechanisms/test_aggregates.py's brute force finds
nothing larger):

* ``sum(v)``, replace-one: one person with ``c`` events at the top of the clamp on ``L`` keys replaced
  by the same person at the bottom: each of the ``L`` keys moves by ``2 c h`` (L1 ``2 L c h``);
* ``count_distinct``, add-remove: one person with more than ``L`` keys added (the bounding keeps ``L``).

* ``count``, ``sumsq(v)`` (the variance's group) and ``histogram(v)`` (the quantiles' group): the pair
  is found by search over persons with ``c`` events on ``L`` keys at the clamp's ends and centre
  (replace-one and add-remove), the largest change of the group's totals, and the test asserts that it
  attains the plan's sensitivity;
* the Gaussian path (``noise="gaussian"``): the ``count`` group's discrete Gaussian against its own
  ``mu`` (its share of the release's Gaussian-DP budget) and the epsilon of its event at the delta.

Positive control: the same release with the group's noise scale cut by 30 % (the claim unchanged).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sparkpriv.mechanisms.aggregates import Bounding, add_group_noise, key_totals, parse_aggregates, plan_aggregates
from sparkpriv.mechanisms.protocol import EventRows
from sparkpriv.privacy.random import stream

from ._audit import (CONTROL_FACTOR, N_GAUSS, N_LAPLACE, _scaled, check, gaussian_game, gaussian_step_claim,
                     laplace_game)

pytestmark = pytest.mark.audit

D, L, C, LO, HI = 4, 2, 2, 0.0, 4.0
EPS = 1.0
KEY = 0x0A66


def _totals(plan, people):
    """Per-key totals of ``people`` (lists of (key, value) events) through the core's bounding."""
    offs = np.cumsum([0] + [len(p) for p in people]).astype(np.int64)
    keys = np.array([k for p in people for k, _ in p], np.int64)
    vals = np.array([v for p in people for _, v in p], np.float64).reshape(-1, 1)
    ph = np.arange(len(people), dtype=np.int64) * 7919 + 1
    b = Bounding(L, C, ("v",), (LO,), (HI,), 2, plan.groups)
    totals, _ = key_totals(EventRows(offs, keys, vals, ph), b, choice_key=KEY, domain_size=D)
    return totals


BASE = [[(0, 1.0), (1, 3.0)], [(1, 2.0), (1, 4.0), (2, 0.0)], [(3, 4.0)]]


def _cols(plan, group):
    """The columns of ``group`` in the totals (a histogram has one per bucket)."""
    o = plan.offsets()[group]
    return slice(o, o + plan.calibration(group).group.width)


def _game(plan, group, t_d, t_dp, eps_claim, control, name):
    cal, sl = plan.calibration(group), _cols(plan, group)
    if control:
        cal = dataclasses.replace(cal, noise=_scaled(cal.noise, CONTROL_FACTOR))
        plan = dataclasses.replace(plan, calibrations=tuple(cal if c.group.name == group else c
                                                             for c in plan.calibrations))
    g = cal.noise.grid

    def released(t, seed):
        big = np.tile(t, (N_LAPLACE, 1))
        noisy = add_group_noise(big, plan, stream(seed, 0))[:, sl].reshape(N_LAPLACE, -1)
        return np.rint(noisy / g).astype(np.int64)

    u, up = np.rint(t_d[:, sl] / g).astype(np.int64).ravel(), np.rint(t_dp[:, sl] / g).astype(np.int64).ravel()
    assert np.array_equal(u * g, t_d[:, sl].ravel())  # the totals sit on the grid
    return laplace_game(name, released(t_d, 301), released(t_dp, 302), u, up, eps_claim, control=control)


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
def test_sum_replace_one(control):
    plan = plan_aggregates(aggregates=parse_aggregates("sum(v)"), max_keys=L, max_events_per_key=C,
                           clamps={"v": (LO, HI)}, buckets=2, domain_size=D, epsilon=EPS, delta=0.0,
                           noise="laplace", neighbors="replace-one")
    high = [(k, HI) for k in (0, 2) for _ in range(C)]
    low = [(k, LO) for k in (0, 2) for _ in range(C)]
    t_d, t_dp = _totals(plan, BASE + [high]), _totals(plan, BASE + [low])
    o = plan.offsets()["sum(v)"]
    cal = plan.calibration("sum(v)")
    assert np.abs(t_d[:, o] - t_dp[:, o]).sum() == cal.sensitivity["l1"]  # the pair attains the sensitivity
    check(_game(plan, "sum(v)", t_d, t_dp, cal.share, control, "aggregates sum, Laplace, replace-one"))


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
def test_count_distinct_add_remove(control):
    plan = plan_aggregates(aggregates=parse_aggregates("count_distinct"), max_keys=L, max_events_per_key=C,
                           clamps={}, buckets=2, domain_size=D, epsilon=EPS, delta=0.0, noise="laplace",
                           neighbors="add-remove")
    added = [(k, 1.0) for k in (0, 1, 3) for _ in range(3)]  # 3 keys > L: the bounding keeps 2
    t_d, t_dp = _totals(plan, BASE), _totals(plan, BASE + [added])
    o = plan.offsets()["count_distinct"]
    cal = plan.calibration("count_distinct")
    assert np.abs(t_d[:, o] - t_dp[:, o]).sum() == cal.sensitivity["l1"]
    check(_game(plan, "count_distinct", t_d, t_dp, cal.share, control,
                "aggregates count_distinct, Laplace, add-remove"))


MID = (LO + HI) / 2


def _persons():
    """Candidate persons: ``c`` events on each of ``L`` keys (every pair of keys, and more keys than ``L``),
    all at one value of the clamp's ends or centre."""
    import itertools

    out = []
    for keys in [*itertools.combinations(range(D), L), tuple(range(D))]:
        for v in (LO, MID, HI):
            out.append([(k, v) for k in keys for _ in range(C)])
    return out


def _worst_pair(plan, group, relation):
    """The neighbouring pair (over :func:`_persons`) with the largest L1 change of ``group``'s totals."""
    o = _cols(plan, group)
    base = _totals(plan, BASE)
    best, pair = -1.0, None
    cands = _persons()
    if relation == "add-remove":
        for q in cands:
            t = _totals(plan, BASE + [q])
            gap = float(np.abs(t[:, o] - base[:, o]).sum())
            if gap > best:
                best, pair = gap, (base, t)
    else:
        tots = [_totals(plan, BASE + [q]) for q in cands]
        for a in tots:
            for b in tots:
                gap = float(np.abs(a[:, o] - b[:, o]).sum())
                if gap > best:
                    best, pair = gap, (a, b)
    return pair, best


def _plan(aggs, relation, noise="laplace", delta=0.0):
    return plan_aggregates(aggregates=parse_aggregates(aggs), max_keys=L, max_events_per_key=C,
                           clamps={"v": (LO, HI)}, buckets=2, domain_size=D, epsilon=EPS, delta=delta,
                           noise=noise, neighbors=relation)


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
@pytest.mark.parametrize("aggs,group,relation", [
    ("count", "count", "replace-one"),
    ("count", "count", "add-remove"),
    ("variance(v)", "sumsq(v)", "replace-one"),
    ("median(v)", "histogram(v)", "replace-one"),
    ("median(v)", "histogram(v)", "add-remove"),
], ids=["count-replace", "count-add", "variance-replace", "quantile-replace", "quantile-add"])
def test_group_at_its_worst_pair(aggs, group, relation, control):
    plan = _plan(aggs, relation)
    (t_d, t_dp), gap = _worst_pair(plan, group, relation)
    cal = plan.calibration(group)
    assert gap == cal.sensitivity["l1"]  # the search attains the plan's sensitivity: no larger pair exists here
    check(_game(plan, group, t_d, t_dp, cal.share, control, f"aggregates {group}, Laplace, {relation}"))


@pytest.mark.parametrize("control", [False, True], ids=["mechanism", "control"])
def test_count_gaussian_replace_one(control):
    delta = 1e-3  # the (epsilon, delta) test reaches the tail of a million trials at this delta (as tests/audit/test_counts.py)
    plan = _plan("count", "replace-one", noise="gaussian", delta=delta)
    cal = plan.calibration("count")
    (t_d, t_dp), _ = _worst_pair(plan, "count", "replace-one")
    o = _cols(plan, "count")
    assert np.linalg.norm(t_d[:, o] - t_dp[:, o]) == pytest.approx(cal.sensitivity["l2"])
    eps_claim, mu_claim = gaussian_step_claim(cal.noise.dp_event(), delta)
    assert mu_claim == pytest.approx(cal.share, rel=1e-6)  # the group's share of the Gaussian-DP budget
    if control:
        cal = dataclasses.replace(cal, noise=_scaled(cal.noise, CONTROL_FACTOR))
        plan = dataclasses.replace(plan, calibrations=(cal,))
    g = cal.noise.grid

    def released(t, seed):
        big = np.tile(t, (N_GAUSS, 1))
        noisy = add_group_noise(big, plan, stream(seed, 0))[:, o].reshape(N_GAUSS, D)
        return np.rint(noisy / g).astype(np.int64)

    u, up = np.rint(t_d[:, o] / g).astype(np.int64).ravel(), np.rint(t_dp[:, o] / g).astype(np.int64).ravel()
    res = gaussian_game("aggregates count, discrete Gaussian, replace-one", released(t_d, 401), released(t_dp, 402),
                        u, up, cal.noise.sigma, eps_claim, delta, mu_claim, control=control)
    check(res)
