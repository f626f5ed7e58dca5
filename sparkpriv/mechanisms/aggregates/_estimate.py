"""From the per-key totals to the released cells: the noise (once per group and key), then the
estimates with their std and interval (post-processing; docs/math.md section 11).

Every interval holds the true value of the *bounded* data (at most ``L`` keys per person, events
weighted ``min(n, c) / n``, values clamped) with probability at least the stated confidence:

* ``count``, ``count_distinct``: ``value -+ half_width`` of the noise (exact coverage);
* ``sum = S + mid N``: the box of ``S`` and ``N`` each at ``sqrt(confidence)`` (two independent
  noises: both hold with probability ``confidence``), ``S -+ h_S + |mid| (N -+ h_N)``;
* ``mean = mid + S / N``: the range of ``S / N`` over that box (``[lo, hi]`` when ``N`` may be 0);
* ``variance = Q / N - (S / N)^2``: its range over the box of ``Q``, ``S``, ``N`` each at
  ``confidence^(1/3)`` (in ``t = 1 / N`` it is a concave quadratic: the maximum at the vertex or an
  end, the minimum at an end);
* ``quantile(p)``: from the noisy cumulative histogram ``C_j``, the differences ``D_j = C_j - p
  C_{B-1}`` lie within ``z s_j`` of their true values for every ``j`` at once with probability at
  least the confidence (:func:`~sparkpriv.mechanisms.aggregates._plan.quantile_band`); the true
  quantile lies above every bucket end whose ``D_j < -z s_j`` and at or below every one whose ``D_j >
  z s_j``. The estimate interpolates linearly inside the first bucket where ``D_j >= 0``.

Every interval is intersected with the range the true value must lie in (a mean in ``[lo, hi]``, a
variance in ``[0, h^2]``, a count at least 0 under ``clamp``): that never lowers its coverage. The
std of a count or sum is the noise's exact std; of a mean or variance a first-order (delta-method)
approximation at the estimate; of a quantile ``(ci_high - ci_low) / 3.92``.
"""

from __future__ import annotations

import numpy as np

from sparkpriv.privacy import noise as _noise

__all__ = ["add_group_noise", "cells", "selected"]

_Z975 = 1.959963984540054


def add_group_noise(totals: np.ndarray, plan, rng) -> np.ndarray:
    """``totals`` (keys, W) with each group's noise (its public cap first), drawn from ``rng`` group
    after group, key after key (one draw per coordinate)."""
    out = np.empty(totals.shape, np.float64)
    o = 0
    for cal in plan.calibrations:
        w = cal.group.width
        vals = np.clip(totals[:, o:o + w], -cal.cap, cal.cap)
        out[:, o:o + w] = _noise.add_noise(vals, cal.noise, rng)
        o += w
    return out


def _slice(noisy, plan, name):
    off = plan.offsets()[name]
    cal = plan.calibration(name)
    return noisy[:, off:off + cal.group.width], cal


def selected(noisy: np.ndarray, plan) -> np.ndarray | None:
    """The keys released under private key selection (noisy people at least the threshold), or None."""
    if plan.selection is None:
        return None
    P, _ = _slice(noisy, plan, "count_distinct")
    return P[:, 0] >= plan.selection.threshold


def cells(noisy: np.ndarray, plan) -> list:
    """``[(column name, float64 array), ...]``: per aggregate (and quantile level) the value, ``_std``,
    ``_ci_low`` and ``_ci_high`` of every key (row of ``noisy``)."""
    k = noisy.shape[0]
    out = []
    released_mean = {}

    def add(name, value, std, lo, hi):
        out.extend([(name, value), (f"{name}_std", np.broadcast_to(np.asarray(std, np.float64), (k,)).copy()),
                    (f"{name}_ci_low", lo), (f"{name}_ci_high", hi)])

    for a in plan.aggregates:
        if a.kind in ("count", "count_distinct"):
            v, cal = _slice(noisy, plan, a.kind)
            v = v[:, 0]
            if plan.round:
                value, std, hw = np.floor(v + 0.5), cal.rounded_std, cal.rounded_half_width
            else:
                value, std, hw = v.copy(), cal.std, cal.half_width
            lo, hi = value - hw, value + hw
            if plan.clamp:
                value, lo, hi = np.maximum(value, 0.0), np.maximum(lo, 0.0), np.maximum(hi, 0.0)
            add(a.kind, value, std, lo, hi)
            continue
        if a.kind == "quantile":
            for p, cols in zip(a.ps, _quantiles(noisy, plan, a.column, a.ps)):
                add(a.output_names()[a.ps.index(p)], *cols)
            continue
        lo_c, hi_c = plan.clamps[a.column]
        mid, h = (lo_c + hi_c) / 2.0, (hi_c - lo_c) / 2.0
        N, cn = _slice(noisy, plan, "count")
        S, cs = _slice(noisy, plan, f"sum({a.column})")
        N, S = N[:, 0], S[:, 0]
        if a.kind == "sum":
            value = S + mid * N
            std = np.sqrt(cs.std**2 + mid**2 * cn.std**2)
            hw = cs.half_width if mid == 0 else cs.half_width_pair + abs(mid) * cn.half_width_pair
            lo, hi = value - hw, value + hw
            if plan.clamp:  # the sum of values in [lo_c, hi_c] has their sign when they share one
                if lo_c >= 0:
                    value, lo, hi = np.maximum(value, 0.0), np.maximum(lo, 0.0), np.maximum(hi, 0.0)
                elif hi_c <= 0:
                    value, lo, hi = np.minimum(value, 0.0), np.minimum(lo, 0.0), np.minimum(hi, 0.0)
            add(a.output_names()[0], value, std, lo, hi)
            continue
        if a.kind == "mean":
            safe = np.where(N > 0, N, 1.0)
            mc = np.where(N > 0, S / safe, 0.0)
            if plan.clamp:
                mc = np.clip(mc, -h, h)
            value = mid + mc
            std = np.sqrt(cs.std**2 + mc**2 * cn.std**2) / np.maximum(N, 1.0)
            n_lo, n_hi = N - cn.half_width_pair, N + cn.half_width_pair
            s_lo, s_hi = S - cs.half_width_pair, S + cs.half_width_pair
            ok = n_lo > 0
            nl = np.where(ok, n_lo, 1.0)
            lo = np.where(ok, np.where(s_lo < 0, s_lo / nl, s_lo / n_hi), -h)
            hi = np.where(ok, np.where(s_hi > 0, s_hi / nl, s_hi / n_hi), h)
            add(a.output_names()[0], value, std, mid + np.clip(lo, -h, h), mid + np.clip(hi, -h, h))
            released_mean[a.column] = (value, N)
            continue
        # variance
        Q, cq = _slice(noisy, plan, f"sumsq({a.column})")
        Q = Q[:, 0]
        safe = np.where(N > 0, N, 1.0)
        v = np.where(N > 0, Q / safe - (S / safe) ** 2, h * h / 2.0)
        if plan.clamp:
            v = np.clip(v, 0.0, h * h)
        n_ = np.maximum(N, 1.0)
        std = np.sqrt((cq.std / n_) ** 2 + (2 * S * cs.std / n_**2) ** 2
                      + ((-Q / n_**2 + 2 * S**2 / n_**3) * cn.std) ** 2)
        add(a.output_names()[0], v, std, *_variance_interval(N, S, Q, cn, cs, cq, h))
    # consistency: the released sum of a column whose mean is released too is mean x events
    for a in plan.aggregates:
        if a.kind == "sum" and a.column in released_mean:
            mean, N = released_mean[a.column]
            name = a.output_names()[0]
            i = next(j for j, (n, _) in enumerate(out) if n == name)
            out[i] = (name, np.where(N > 0, mean * N, out[i][1]))
    return out


def _variance_interval(N, S, Q, cn, cs, cq, h):
    n_lo, n_hi = N - cn.half_width_triple, N + cn.half_width_triple
    s_lo, s_hi = S - cs.half_width_triple, S + cs.half_width_triple
    q_lo, q_hi = Q - cq.half_width_triple, Q + cq.half_width_triple
    ok = n_lo > 0
    t_lo = 1.0 / np.where(ok, n_hi, 1.0)
    t_hi = 1.0 / np.where(ok, n_lo, 1.0)
    s2min = np.where((s_lo <= 0) & (s_hi >= 0), 0.0, np.minimum(s_lo**2, s_hi**2))
    s2max = np.maximum(s_lo**2, s_hi**2)

    def f(q, s2, t):
        return q * t - s2 * t * t

    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.where(s2min > 0, q_hi / (2.0 * np.where(s2min > 0, s2min, 1.0)), t_hi)
    t_star = np.clip(vertex, t_lo, t_hi)
    hi = np.maximum(np.maximum(f(q_hi, s2min, t_lo), f(q_hi, s2min, t_hi)), f(q_hi, s2min, t_star))
    lo = np.minimum(f(q_lo, s2max, t_lo), f(q_lo, s2max, t_hi))
    lo = np.where(ok, np.clip(lo, 0.0, h * h), 0.0)
    hi = np.where(ok, np.clip(hi, 0.0, h * h), h * h)
    return lo, hi


def _quantiles(noisy, plan, column, ps):
    H, cal = _slice(noisy, plan, f"histogram({column})")
    lo_c, hi_c = plan.clamps[column]
    B = H.shape[1]
    w = (hi_c - lo_c) / B
    C = np.cumsum(H, axis=1)
    T = C[:, -1]
    j = np.arange(B)
    rows = np.arange(H.shape[0])
    out = []
    for p in ps:
        z = plan.bands[(column, p)]
        s = cal.std * np.sqrt((j + 1) * (1 - p) ** 2 + (B - 1 - j) * p**2)
        D = C - p * T[:, None]
        cross = D >= 0
        jp = np.where(cross.any(axis=1), np.argmax(cross, axis=1), B - 1)
        prev = np.where(jp > 0, C[rows, np.maximum(jp - 1, 0)], 0.0)
        step = C[rows, jp] - prev
        frac = np.where(step > 0, np.clip((p * T - prev) / np.where(step > 0, step, 1.0), 0.0, 1.0), 0.5)
        below = D < -z * s
        above = D > z * s
        a = np.where(below.any(axis=1), B - np.argmax(below[:, ::-1], axis=1), 0)  # 1 + last below
        b = np.where(above.any(axis=1), np.argmax(above, axis=1), B - 1)
        lo = lo_c + np.minimum(a, b) * w
        hi = np.minimum(lo_c + (np.maximum(a, b) + 1) * w, hi_c)
        value = np.clip(lo_c + (jp + frac) * w, lo, hi)
        out.append((value, (hi - lo) / (2 * _Z975), lo, hi))
    return out
