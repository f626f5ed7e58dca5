"""Exact discrete Laplace and Gaussian samplers (Canonne, Kamath & Steinke 2020).

Algorithms 1-3 of CKS, on exact rationals: the scale's float value is taken as
the fraction it exactly is, every Bernoulli is decided by comparing exact
uniform integers, and no floating point touches the distribution. Draws are
vectorized over the pending ones (a numpy array of indices per rejection
round); arithmetic that can outgrow int64 uses Python ints in object arrays.
Private module: inputs are validated by :mod:`sparkpriv.privacy.noise`.

Samples are conditioned on ``|x| < 2^62`` (int64 headroom), like the fast ones.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["discrete_laplace", "discrete_gaussian", "bernoulli_exp"]

_SUPPORT = 2**62
_INT64_SAFE = 2**62


def _uniform_below(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """Exactly uniform integers in ``[0, n)`` (int64 if n fits, else Python ints)."""
    if n < 2**63:
        return rng.integers(0, n, size=size, dtype=np.int64)  # exact (bounded rejection)
    bits = n.bit_length()
    words = -(-bits // 64)
    drop = 64 * words - bits
    out = np.empty(size, dtype=object)
    todo = np.arange(size)
    while todo.size:
        raw = rng.bit_generator.random_raw((todo.size, words))
        x = raw[:, 0].astype(object)
        for j in range(1, words):
            x = x + (raw[:, j].astype(object) << (64 * j))
        x = x >> drop
        ok = x < n
        out[todo[ok]] = x[ok]
        todo = todo[~ok]
    return out


def _bernoulli_exp_unit(rng: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for ``0 <= num <= den`` (CKS Algorithm 1, gamma <= 1).

    ``K = 1``; while Bernoulli(gamma / K) succeeds, ``K += 1``; output ``K`` odd.
    Bernoulli(num / (den K)) is ``[X == 0] and [Y < num]`` with ``X`` uniform on
    ``[0, K)`` and ``Y`` uniform on ``[0, den)``: no product is ever formed.
    """
    k = np.ones(num.size, dtype=np.int64)
    active = np.arange(num.size)
    while active.size:
        first = rng.integers(0, k[active]) == 0
        hit = np.zeros(active.size, dtype=bool)
        cand = active[first]
        if cand.size:
            hit[first] = _uniform_below(rng, den, cand.size) < num[cand]
        active = active[hit]
        k[active] += 1
    return (k & 1) == 1


def _count_exp1_successes(rng: np.random.Generator, size: int) -> np.ndarray:
    """Number of successes of Bernoulli(exp(-1)) before the first failure."""
    v = np.zeros(size, dtype=np.int64)
    active = np.arange(size)
    while active.size:
        ok = _bernoulli_exp_unit(rng, np.ones(active.size, dtype=np.int64), 1)
        active = active[ok]
        v[active] += 1
    return v


def bernoulli_exp(rng: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for ``num >= 0`` (CKS Algorithm 1, any gamma).

    ``floor(gamma)`` Bernoulli(exp(-1)) trials must all succeed, then one
    Bernoulli(exp(-(gamma - floor(gamma)))).
    """
    num = np.asarray(num)
    whole = num // den
    frac = num - whole * den
    result = np.ones(num.size, dtype=bool)
    remaining = whole.copy()
    alive = np.flatnonzero(remaining > 0)
    while alive.size:
        ok = _bernoulli_exp_unit(rng, np.ones(alive.size, dtype=np.int64), 1)
        result[alive[~ok]] = False
        alive = alive[ok]
        remaining[alive] -= 1
        alive = alive[remaining[alive] > 0]
    idx = np.flatnonzero(result)
    if idx.size:
        result[idx] = _bernoulli_exp_unit(rng, frac[idx], den)
    return result


def _laplace_rational(rng: np.random.Generator, p: int, q: int, n: int) -> np.ndarray:
    """Discrete Laplace with pmf ``prop. to exp(-|x| q / p)`` (CKS Algorithm 2, s=q, t=p)."""
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        u = _uniform_below(rng, p, todo.size)
        d = _bernoulli_exp_unit(rng, u, p)  # U + t V is geometric(e^{-1/t})
        idx, u = todo[d], u[d]
        v = _count_exp1_successes(rng, idx.size)
        x = u.astype(object) + v.astype(object) * p
        y = x // q
        neg = rng.integers(0, 2, size=idx.size) == 1
        ok = ~(neg & (y == 0)) & (y < _SUPPORT)
        val = np.where(neg, -y, y)[ok].astype(np.int64)
        out[idx[ok]] = val
        keep = np.ones(todo.size, dtype=bool)
        keep[np.flatnonzero(d)[ok]] = False
        todo = todo[keep]
    return out


def discrete_laplace(rng: np.random.Generator, scale: float, shape: tuple[int, ...]) -> np.ndarray:
    """Exact discrete Laplace, pmf ``prop. to exp(-|x|/scale)``, scale as an exact fraction."""
    fr = Fraction(scale)
    n = math.prod(shape)
    return _laplace_rational(rng, fr.numerator, fr.denominator, n).reshape(shape)


def discrete_gaussian(rng: np.random.Generator, sigma: float, shape: tuple[int, ...]) -> np.ndarray:
    """Exact discrete Gaussian (CKS Algorithm 3), ``sigma^2`` as an exact fraction.

    With ``t = floor(sigma) + 1`` and ``sigma^2 = a/b``: propose ``Y ~ DLap(t)``,
    accept with probability ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))
    = exp(-(|Y| t b - a)^2 / (2 a b t^2))``.
    """
    fr = Fraction(sigma)
    s2 = fr * fr
    a, b = s2.numerator, s2.denominator
    t = math.floor(fr) + 1
    den = 2 * a * b * t * t
    n = math.prod(shape)
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        y = _laplace_rational(rng, t, 1, todo.size)
        num = (np.abs(y).astype(object) * (t * b) - a) ** 2
        ok = bernoulli_exp(rng, num, den)
        out[todo[ok]] = y[ok]
        todo = todo[~ok]
    return out.reshape(shape)
