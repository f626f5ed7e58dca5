"""Aggregates per key, numpy core: sensitivities by brute force over every record of small domains,
accounting against dp_accounting, partition selection against the exact tail and a simulation,
interval coverage, refusals (docs/aggregates.md; docs/math.md section 11)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event as ev
from dp_accounting.pld import pld_privacy_accountant

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.aggregates import (Bounding, add_group_noise, cells, group_sensitivity, key_totals,
                                             parse_aggregates, plan_aggregates, selected)
from sparkpriv.mechanisms.protocol import EventRows
from sparkpriv.privacy.random import stream

D, L, C, LO, HI, B = 3, 2, 2, 0.0, 4.0, 2
QUERY = "count_distinct, count, sum(v), variance(v), median(v)"


def _plan(neighbors="replace-one", noise="laplace", domain=D, delta=0.0, epsilon=1.0, query=QUERY, **kw):
    return plan_aggregates(aggregates=parse_aggregates(query), max_keys=L, max_events_per_key=C,
                           clamps={"v": (LO, HI)}, buckets=B, domain_size=domain, epsilon=epsilon, delta=delta,
                           noise=noise, neighbors=neighbors, **kw)


def _person(events, person_hash=7):
    """A block of one person: ``events`` a list of (key, value)."""
    keys = np.array([k for k, _ in events], np.int64)
    vals = np.array([[v] for _, v in events], np.float64).reshape(len(events), 1)
    return EventRows(np.array([0, len(events)], np.int64), keys, vals, np.array([person_hash], np.int64))


def _vector(plan, events, person_hash=7):
    if not events:
        return np.zeros((D, plan.width))
    b = Bounding(L, C, ("v",), (LO,), (HI,), B, plan.groups)
    totals, _ = key_totals(_person(events, person_hash), b, choice_key=11, domain_size=D)
    return totals


def _records():
    """Every record over D keys: each key absent, or with 1 or 3 events, each value 0, 1 or 4."""
    out = [[]]
    for per_key in itertools.product([0, 1, 3], repeat=D):
        if not any(per_key):
            continue
        slots = [(k, i) for k in range(D) for i in range(per_key[k])]
        if len(slots) > 5:  # values of the larger records: all low, all high, alternating
            patterns = [[LO] * len(slots), [HI] * len(slots), [LO if i % 2 else HI for i in range(len(slots))]]
        else:
            patterns = [list(p) for p in itertools.product([LO, 1.0, HI], repeat=len(slots))]
        for vals in patterns:
            out.append([(k, v) for (k, _), v in zip(slots, vals)])
    return out


@pytest.mark.parametrize("neighbors", ["replace-one", "add-remove"])
def test_sensitivities_hold_over_every_record_of_a_small_domain(neighbors):
    plan = _plan(neighbors)
    vecs = [_vector(plan, r, h) for r in _records() for h in (3, 9)]  # two keyed choices of the kept keys
    offs = plan.offsets()
    for cal in plan.calibrations:
        g = cal.group
        s = group_sensitivity(g, L=L, c=C, half=(HI - LO) / 2, d=D, neighbors=neighbors)
        o = offs[g.name]
        V = np.stack([v[:, o:o + g.width].ravel() for v in vecs])
        if neighbors == "add-remove":
            diffs = V
        else:
            diffs = (V[:, None, :] - V[None, :, :]).reshape(-1, V.shape[1])
        l1, l2 = np.abs(diffs).sum(axis=1).max(), np.sqrt((diffs ** 2).sum(axis=1)).max()
        assert l1 <= s["l1"] + 1e-9 and l2 <= s["l2"] + 1e-9, (g.name, l1, l2, s)
        assert l1 >= 0.5 * s["l1"], (g.name, l1, s)  # the bound is not loose by more than 2x here
        assert np.all(np.abs(V) <= cal.cap + 1e-9) or g.kind != "people"


def test_a_person_keeps_at_most_L_keys_and_c_events_worth_per_key():
    plan = _plan()
    v = _vector(plan, [(0, 1.0)] * 5 + [(1, 4.0)] + [(2, 0.0)] * 2)
    people = v[:, plan.offsets()["count_distinct"]]
    events = v[:, plan.offsets()["count"]]
    assert people.sum() == L and set(np.unique(people)) <= {0.0, 1.0}
    assert np.all(events <= C) and events.max() == C  # key 0's five events count as c


def _pure_epsilon(event) -> float:
    """The exact epsilon of a composition of Laplace and discrete Laplace events (their sum)."""
    if isinstance(event, ev.ComposedDpEvent):
        return sum(_pure_epsilon(e) for e in event.events)
    if isinstance(event, ev.SelfComposedDpEvent):
        return event.count * _pure_epsilon(event.event)
    if isinstance(event, ev.LaplaceDpEvent):
        return 1.0 / event.noise_multiplier
    if isinstance(event, ev.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity
    raise AssertionError(f"not a pure event: {event}")


def test_accounting_is_dp_accountings_composition():
    lap = _plan(epsilon=1.0)  # pure: the groups' epsilons sum to at most the request, nearly all of it
    assert 0.999 <= _pure_epsilon(lap.events) <= 1.0 + 1e-12
    assert lap.epsilon == pytest.approx(_pure_epsilon(lap.events), rel=1e-9)
    gau = _plan(noise="gaussian", delta=1e-6)
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(gau.events)
    assert acc.get_epsilon(1e-6) == pytest.approx(gau.epsilon, rel=1e-2) and gau.epsilon <= 1.0 + 1e-9
    # private keys: the selection's (0, delta_s) event is part of the composition, stated in the plan
    sel = _plan(domain=None, delta=1e-3, epsilon=1.0)
    assert sel.selection.delta == pytest.approx(1e-3) and sel.epsilon <= 1.0 + 1e-9


def test_private_key_selection_releases_a_key_one_person_holds_at_most_delta_over_L():
    plan = _plan(domain=None, delta=1e-3)
    sel = plan.selection
    assert sel.per_key_delta == pytest.approx(1e-3 / L)
    assert sel.tail_at_threshold <= sel.per_key_delta
    cal = plan.calibration("count_distinct")
    # the exact tail of the discrete Laplace noise at the threshold, independently: P(N >= m) for
    # P(N = k) proportional to exp(-|k| / t)
    nz = cal.noise.to_public_dict()  # discrete Laplace on a grid: P(N = k g) proportional to exp(-|k| / t)
    t, g = nz["scale"], nz["grid"]
    m = round((sel.threshold - 1.0) / g)  # a key one person holds is released iff N >= m g
    tail = math.exp(-m / t) / (1.0 + math.exp(-1.0 / t))  # P(N >= m g), closed form
    assert tail == pytest.approx(sel.tail_at_threshold, rel=1e-6)
    assert tail <= sel.per_key_delta
    assert math.exp(-(m - t * 1e-3) / t) / (1.0 + math.exp(-1.0 / t)) > sel.per_key_delta * (1 - 1e-2)  # tight
    # and a simulation with the library's sampler: 200,000 keys each held by one person
    totals = np.zeros((200_000, plan.width))
    totals[:, plan.offsets()["count_distinct"]] = 1.0
    noisy = add_group_noise(totals, plan, stream(5, 1))
    rate = selected(noisy, plan).mean()
    assert rate <= sel.per_key_delta + 4 * math.sqrt(sel.per_key_delta / 200_000) + 1e-6


@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
def test_intervals_cover_at_their_stated_rate(noise, delta):
    """Noise the same true totals 2,000 times; each cell's interval holds its noise-free value 95 %."""
    plan = _plan(noise=noise, delta=delta, epsilon=2.0, query="count_distinct, count, sum(v), mean(v)",
                 clamp=False)
    truth = np.zeros((D, plan.width))
    off = plan.offsets()
    truth[:, off["count_distinct"]] = [400, 900, 1500]
    truth[:, off["count"]] = [700, 1500, 2900]
    truth[:, off["sum(v)"]] = [-100.0, 250.0, 40.0]  # centred sums (values minus the clamp's midpoint)
    expected = {"count_distinct": truth[:, off["count_distinct"]], "count": truth[:, off["count"]],
                "sum_v": truth[:, off["sum(v)"]] + 2.0 * truth[:, off["count"]],
                "mean_v": 2.0 + truth[:, off["sum(v)"]] / truth[:, off["count"]]}
    hits = {k: 0 for k in expected}
    R = 2000
    rng = stream(17, 2)
    for _ in range(R):
        out = dict(cells(add_group_noise(truth, plan, rng), plan))
        for k, want in expected.items():
            hits[k] += np.sum((out[f"{k}_ci_low"] <= want) & (want <= out[f"{k}_ci_high"]))
    for k, h in hits.items():
        rate = h / (R * D)
        # counts: exact intervals of the discrete noise; sums and means combine two noises (conservative)
        assert 0.93 <= rate <= (0.97 if k.startswith("count") else 1.0), (k, rate)


def test_refusals_name_the_parameter():
    with pytest.raises(ParameterError, match="aggregate"):
        parse_aggregates("count, frobnicate(v)")
    with pytest.raises(ParameterError, match="selection_delta"):
        _plan(domain=None, delta=1e-3, noise="gaussian", selection_delta=1e-3)


@pytest.mark.parametrize("noise,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
def test_quantile_intervals_and_rank_error_cover_at_their_stated_rate(noise, delta):
    """Noise the histograms of three keys' values 1,500 times: each quantile's interval holds the true
    quantile of the values (the smallest value with at least p of the weight at or below it), and the
    stated rank error bound holds the distance from p T to the true cumulative weight of the released
    value's bucket, each at least at the stated confidence (the simultaneous band: conservative)."""
    from sparkpriv.mechanisms.aggregates import bucket_of
    from sparkpriv.mechanisms.aggregates._mechanism import _uncertainty_statement

    lo_c, hi_c, buckets, ps = 0.0, 16.0, 16, (0.1, 0.5, 0.9)
    plan = plan_aggregates(aggregates=parse_aggregates("quantile(v, 0.1, 0.5, 0.9)"), max_keys=1,
                           max_events_per_key=1, clamps={"v": (lo_c, hi_c)}, buckets=buckets, domain_size=3,
                           epsilon=0.05, delta=delta, noise=noise, neighbors="add-remove")
    rng = np.random.default_rng(8)
    values = [np.clip(rng.uniform(0, 16, 300), lo_c, hi_c), np.clip(rng.exponential(3.0, 800), lo_c, hi_c),
              np.clip(rng.normal(9.0, 2.0, 2000), lo_c, hi_c)]
    truth = np.stack([np.bincount(bucket_of(x, lo_c, hi_c, buckets), minlength=buckets) for x in values])
    cum = np.concatenate([np.zeros((3, 1)), np.cumsum(truth, axis=1)], axis=1)  # weight at or below each edge
    true_q = {p: np.array([np.sort(x)[int(np.ceil(p * x.size)) - 1] for x in values]) for p in ps}
    bound = {p: _uncertainty_statement(plan)["quantile_rank_error"][f"quantile(v, {p:g})"]["rank_error_bound"]
             for p in ps}
    names = dict(zip(ps, parse_aggregates("quantile(v, 0.1, 0.5, 0.9)")[0].output_names()))
    width = (hi_c - lo_c) / buckets
    hits = {p: 0 for p in ps}
    rank_hits = {p: 0 for p in ps}
    control = {p: 0 for p in ps}  # positive control: the released value's own bucket as the interval
    rank_control = {p: 0 for p in ps}  # and a quarter of the stated rank error bound
    R = 1500
    noise_rng = stream(23, 4)
    for _ in range(R):
        out = dict(cells(add_group_noise(truth.astype(np.float64), plan, noise_rng), plan))
        for p in ps:
            v, low, high = out[names[p]], out[f"{names[p]}_ci_low"], out[f"{names[p]}_ci_high"]
            hits[p] += int(np.sum((low <= true_q[p]) & (true_q[p] <= high)))
            b_lo = lo_c + np.floor((v - lo_c) / width) * width
            control[p] += int(np.sum((b_lo <= true_q[p]) & (true_q[p] <= b_lo + width)))
            # the released value's bucket (either one at an edge): the distance of p T to its true weights
            pT = p * cum[:, -1]
            best = np.full(3, np.inf)
            for j in (np.floor((v - lo_c) / width), np.ceil((v - lo_c) / width) - 1):
                j = np.clip(j, 0, buckets - 1).astype(int)
                left, right = cum[np.arange(3), j], cum[np.arange(3), j + 1]
                best = np.minimum(best, np.maximum(0.0, np.maximum(left - pT, pT - right)))
            rank_hits[p] += int(np.sum(best <= bound[p]))
            rank_control[p] += int(np.sum(best <= bound[p] / 4))
    for p in ps:
        assert hits[p] / (3 * R) >= 0.94, (p, hits[p] / (3 * R))
        assert rank_hits[p] / (3 * R) >= 0.94, (p, rank_hits[p] / (3 * R))
        assert control[p] / (3 * R) < 0.9, (p, control[p] / (3 * R))  # the noise does move the quantile
    # the rank error bound is conservative (the band holds every bucket at once; measured 0.99-1.0),
    # yet a quarter of it falls short: the check has power
    assert min(rank_control.values()) / (3 * R) < 0.94, rank_control
