"""The fast (vectorized, floating-point-assisted) integer samplers of :mod:`sparkpriv.privacy.noise`.

The module docstring of ``noise`` and docs/noise.md state what they guarantee;
this module holds the machinery:

* ``_dlap_fill``: discrete Laplace as a signed geometric ``G = K M + R``;
* ``_dgauss_fill``: discrete Gaussian by a 128-bit cumulative table over
  coarse buckets of width ``W = 2^m`` plus a uniform offset inside the bucket,
  corrected by rejection, with an exact geometric-proposal tail branch
  (``_GaussTable``); ``_dgauss_fill_cks`` (CKS Algorithm 3) for small sigma.

Module constants are tuning knobs that the tests turn down to force the rare
paths (restarts, slow residues, tail branch, guide-cell collisions).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal, localcontext

import numpy as np

from sparkpriv.privacy import _compiled

_SUPPORT = 2**62  # every sample satisfies |x| < _SUPPORT

# Tuning of the fast samplers (module constants so tests can stress the rare paths).
_K_BITS = 8  # t / M in [2^_K_BITS, 2^(_K_BITS+1)): buckets of K at least 2^-9 wide in E
_E_RESTART = 12.0  # exponentials above this are redrawn as _E_RESTART + Exp(1)
_CHUNK = 1 << 15
_OVERSAMPLE = 1.35  # proposals per wanted CKS Gaussian sample (acceptance is about 0.76)
_TABLE_SIGMAS = 10.0  # the Gaussian table covers magnitudes below about this many sigma
_TABLE_MIN_SIGMA = 1.0  # below this sigma the CKS sampler is used
_GUIDE_BITS = 16  # at most this many bits of the proposal word index the branch guide
_DECIMAL_DIGITS = 60  # working precision of the table (199 bits)


@dataclass(frozen=True)
class _Plan:
    """Constants of the fast geometric ``G = K M + R`` for one scale t (module doc)."""

    t: float
    m: int
    ratio: float  # t / M, exact
    e_cap: float  # E above this could push G to 2^62: redrawn (support truncation)
    fast_vc: int  # R accepted at once when the word's spare bits are below this

    @classmethod
    def of(cls, t: float, k_bits: int | None = None) -> "_Plan":
        """The plan for scale ``t``; ``k_bits`` (default ``_K_BITS``) sets the width of K's buckets."""
        m = max(0, math.frexp(t)[1] - 1 - (_K_BITS if k_bits is None else k_bits))
        big_m = 2.0**m
        e_cap = (float(_SUPPORT) - 2.0 * big_m) / t * (1.0 - 1e-12)
        fast = math.floor(2.0 ** (63 - m) * math.exp(-big_m / t) * (1.0 - 2.0**-40)) if m else 0
        return cls(t, m, t / big_m, e_cap, int(fast))


class _Work:
    """Reusable chunk buffers (the samplers run on cache-sized chunks, in place)."""

    def __init__(self, n: int):
        self.e = np.empty(n)
        self.z = np.empty(n)
        self.u = np.empty(n)
        self.g = np.empty(n, dtype=np.int64)
        self.s = np.empty(n, dtype=np.int64)
        self.r = np.empty(n, dtype=np.int64)
        self.acc = np.empty(n, dtype=bool)
        self.slow = np.empty(n, dtype=np.int64)  # for the compiled word phase
        self.slow_vc = np.empty(n, dtype=np.int64)


_AUTO = _compiled.AUTO  # kern argument: the compiled kernels if in use, else numpy


def _exponentials(rng: np.random.Generator, e: np.ndarray, cap: float) -> None:
    """Fill ``e`` with standard exponentials conditioned on ``E <= cap``.

    Draws above _E_RESTART are replaced by ``_E_RESTART + Exp(1)``
    (memorylessness), repeatedly, so every ziggurat draw used lies where its
    resolution is fine (absolute 2^-46.8 or better). A total above ``cap`` is drawn
    afresh (the int64 support bound; ``cap = inf`` for acceptance tests).
    """
    rng.standard_exponential(out=e)
    if not e.size or e.max() <= _E_RESTART:
        return
    big = np.flatnonzero(e > _E_RESTART)
    base = np.full(big.size, _E_RESTART)
    todo = np.arange(big.size)
    while todo.size:
        x = rng.standard_exponential(todo.size)
        total = base[todo] + x
        more = x > _E_RESTART
        over = ~more & (total > cap)
        done = ~more & ~over
        e[big[todo[done]]] = total[done]
        base[todo[more]] += _E_RESTART
        base[todo[over]] = 0.0
        todo = todo[~done]


def _geometric(rng: np.random.Generator, plan: _Plan, n: int, ws: _Work, accept_residue=True, kern=_AUTO):
    """n magnitudes G = K M + R and signs s in {0, -1}, in ``ws``; returns (G, s, R).

    With ``accept_residue`` R was accepted with probability exp(-R/t), so
    ``P(G >= j) = exp(-j/t)``. Without it R is uniform on [0, M) and the
    caller must fold exp(-R/t) into its own acceptance test. R is None if M = 1.
    ``kern``: the compiled kernels (bit-identical word phase) or None for numpy.
    """
    e = ws.e[:n]
    _exponentials(rng, e, plan.e_cap)
    if kern is _AUTO:
        kern = _compiled.kernels()
    if kern is not None and accept_residue:
        g, s, r = ws.g[:n], ws.s[:n], ws.r[:n]
        ns = kern.geo_words(rng, e, plan.ratio, plan.m, plan.fast_vc, g, s, r, ws.slow, ws.slow_vc)
        if ns:  # as below: the slow residues are finished after all n words, in index order
            sl = ws.slow[:ns].copy()
            new = _residue_slow(rng, plan, r[sl], ws.slow_vc[:ns].copy())
            g[sl] += new - r[sl]
            r[sl] = new
        return g, s, (r if plan.m else None)
    e *= plan.ratio
    g = ws.g[:n]
    np.copyto(g, e, casting="unsafe")  # truncation = floor (e >= 0)
    w = rng.bit_generator.random_raw(n).view(np.int64)
    s = ws.s[:n]
    np.right_shift(w, 63, out=s)
    if not plan.m:
        return g, s, None
    r = ws.r[:n]
    np.bitwise_and(w, (1 << plan.m) - 1, out=r)
    if accept_residue:
        np.right_shift(w, plan.m, out=w)
        np.bitwise_and(w, (1 << (63 - plan.m)) - 1, out=w)
        slow = np.flatnonzero(w >= plan.fast_vc)
        if slow.size:
            r[slow] = _residue_slow(rng, plan, r[slow], w[slow])
    np.left_shift(g, plan.m, out=g)
    g += r
    return g, s, r


def _residue_slow(rng, plan: _Plan, r: np.ndarray, vc: np.ndarray) -> np.ndarray:
    """Finish Bernoulli(exp(-R/t)) where the word's spare bits did not decide it.

    The spare bits ``vc`` are the top bits of a uniform ``V = (vc + U)/2^c``;
    accept iff ``V < exp(-R/t)``, else redraw ``R`` and ``vc`` from a fresh word.
    """
    c = 63 - plan.m
    todo = np.arange(r.size)
    while todo.size:
        v = (vc[todo].astype(np.float64) + rng.random(todo.size)) * 2.0**-c
        todo = todo[v >= np.exp(-r[todo].astype(np.float64) / plan.t)]
        if todo.size:
            w = rng.bit_generator.random_raw(todo.size).view(np.int64)
            r[todo] = w & ((1 << plan.m) - 1)
            vc[todo] = (w >> plan.m) & ((1 << c) - 1)
            todo = todo[vc[todo] >= plan.fast_vc]
    return r


def _dlap_fill(rng: np.random.Generator, plan: _Plan, out: np.ndarray, ws: _Work, kern=_AUTO) -> None:
    """Fill the 1-d int64 ``out`` with discrete Laplace(t) draws."""
    if kern is _AUTO:
        kern = _compiled.kernels()
    g, s, _ = _geometric(rng, plan, out.size, ws, kern=kern)
    if kern is not None:
        if not kern.sign_apply(g, s, out):
            return
    else:
        np.bitwise_xor(g, s, out=out)
        out -= s  # s = -1 negates (two's complement)
        if g.all():
            return
    todo = np.flatnonzero((g == 0) & (s != 0))  # negative zero: reject (CKS)
    while todo.size:
        g, s, _ = _geometric(rng, plan, todo.size, ws, kern=kern)
        out[todo] = (g ^ s) - s
        todo = todo[(g == 0) & (s != 0)]


def _dgauss_fill_cks(rng: np.random.Generator, sigma: float, out: np.ndarray, ws: _Work) -> None:
    """Fill the 1-d int64 ``out`` with discrete Gaussian draws (CKS Algorithm 3).

    Used for ``sigma < _TABLE_MIN_SIGMA`` (the table sampler's tail weight would
    underflow its 128-bit table there); about 3x slower than the table sampler.

    Proposal ``y = K M + R`` (discrete Laplace magnitude, ``t = floor(sigma) + 1``)
    with R left uniform, so the residue's factor exp(-R/t) joins the CKS
    acceptance: accept iff ``E > (y - sigma^2/t)^2 / (2 sigma^2) + R/t`` with
    ``E ~ Exp(1)``, i.e. with probability exactly the product of both
    Bernoulli(exp(-.)) tests. Proposals are drawn in batches and the first
    accepted ones kept, in order: the accepted proposals of an i.i.d. sequence
    are i.i.d. from the target.
    """
    sigma = max(sigma, 1e-300)  # below, N_Z(0, sigma^2) is 0 but for mass < e^{-1e599}
    t = math.floor(sigma) + 1.0
    plan = _Plan.of(t)
    c1, c2 = sigma * sigma / t, 1.0 / (math.sqrt(2.0) * sigma)
    filled, n = 0, out.size
    while filled < n:
        k = min(int((n - filled) * _OVERSAMPLE) + 32, ws.g.size)
        g, s, r = _geometric(rng, plan, k, ws, accept_residue=False)
        z = ws.z[:k]
        np.subtract(g, c1, out=z)
        z *= c2
        with np.errstate(over="ignore"):  # z = inf (never accepted) is intended
            np.square(z, out=z)  # z = (|y| - sigma^2/t)^2 / (2 sigma^2), never NaN
        if r is not None:
            rt = ws.u[:k]
            np.multiply(r, 1.0 / t, out=rt)
            z += rt
        e = ws.e[:k]
        _exponentials(rng, e, math.inf)
        acc = ws.acc[:k]
        np.greater(e, z, out=acc)
        if not g.all():
            acc &= (g != 0) | (s == 0)  # negative zero rejected, as in the proposal
        np.bitwise_xor(g, s, out=g)
        g -= s
        take = np.flatnonzero(acc)[: n - filled]
        out[filled : filled + take.size] = g[take]
        filled += take.size


# ----------------------------------------------------------------------------- Gaussian table


@dataclass(frozen=True, eq=False)
class _GaussTable:
    """Branch table of the discrete Gaussian sampler for one sigma (``_gauss_table``).

    Magnitudes ``|x|`` are proposed from branches ``j = 0 .. J``: branch ``j < J``
    is the bucket ``[j W, (j+1) W)``, ``W = 2^m``, with weight
    ``W exp(-(j W)^2 / (2 sigma^2))`` (the bucket's largest density times its
    width); branch ``J`` is the tail ``|x| >= a = J W`` with weight
    ``exp(-a^2 / (2 sigma^2)) / (1 - exp(-a / sigma^2))``. A uniform ``U`` in
    ``[0, 1)`` picks branch ``#{i : E_i <= U}`` for the edges
    ``E_i = floor(2^128 (w_0 + ... + w_i) / S) / 2^128`` (``i < J``, ``S`` the
    total weight), computed in 60-digit decimal arithmetic: every branch
    probability is exact to 2^-128 absolute, 2^-55 relative for the buckets and
    2^-40 or better for the tail.

    The first ``b`` bits of ``U`` index ``guide``: ``start``, the number of edges
    below the cell, when no edge lies in the cell; otherwise
    ``-(2 start + many) - 1``, ``many`` set when more than one edge lies in it
    or the tail can be reached from it. Only then are more bits of ``U`` drawn.
    """

    sigma: float
    m: int  # W = 2^m
    n_buckets: int  # J
    edges_hi: np.ndarray  # uint64, J + 1: top words of E_i 2^128 (last: 2^64 - 1 sentinel)
    edges_lo: np.ndarray  # uint64, J + 1: low words
    guide: np.ndarray  # int32, 2^b
    guide_bits: int  # b
    inv_two_sigma2: float  # 1 / (2 sigma^2)
    sure_accept: np.ndarray  # uint16, J + 1: v < this accepts bucket j whatever R (see _gauss_propose)
    tail: _Plan  # geometric proposal of the tail branch, t = sigma^2 / a


def _gauss_table(sigma: float) -> _GaussTable:
    return _gauss_table_cached(float(sigma), _K_BITS, _TABLE_SIGMAS, _GUIDE_BITS, _SUPPORT)


@functools.lru_cache(maxsize=64)
def _gauss_table_cached(sigma, k_bits, table_sigmas, guide_bits, support) -> _GaussTable:
    m = max(0, math.frexp(sigma)[1] - 1 - k_bits)
    w = 2**m
    s1 = sigma / w  # exact (power-of-two division): sigma in bucket units
    n_buckets = max(1, round(table_sigmas * s1))  # a = J W within W/2 of 10 sigma
    a = n_buckets * w
    with localcontext() as ctx:
        ctx.prec = _DECIMAL_DIGITS
        c = 1 / (2 * Decimal(s1) * Decimal(s1))  # bucket j's weight is W exp(-j^2 c)
        weights = []
        a_j, b_j, d = Decimal(1), (-c).exp(), (-2 * c).exp()
        for _ in range(n_buckets):  # exp(-(j+1)^2 c) = exp(-j^2 c) exp(-(2j+1) c)
            weights.append(a_j)
            a_j *= b_j
            b_j *= d
        # a_j = exp(-J^2 c) = exp(-a^2 / (2 sigma^2)) now; the tail weight in units of W:
        one_minus_rho = 1 - (-Decimal(a) / (Decimal(sigma) * Decimal(sigma))).exp()
        tail_w = a_j / (one_minus_rho * w)
        scale = Decimal(2**128) / (sum(weights) + tail_w)
        edges, acc = [], Decimal(0)
        for wj in weights:
            acc += wj
            edges.append(int(acc * scale))
    if 2**128 - edges[-1] < 2**40:  # the tail branch keeps a relative precision of 2^-40
        raise AssertionError(f"Gaussian table: tail weight underflows at sigma={sigma!r}")
    hi = np.array([e >> 64 for e in edges] + [2**64 - 1], dtype=np.uint64)
    lo = np.array([e & (2**64 - 1) for e in edges] + [2**64 - 1], dtype=np.uint64)
    b = min(guide_bits, 63 - m)
    cell_lo = np.arange(2**b, dtype=np.uint64) << np.uint64(64 - b)
    starts = np.searchsorted(hi[:-1], cell_lo, "left").astype(np.int64)  # edges below the cell
    inside = np.append(starts[1:], n_buckets) - starts  # edges within the cell
    inside[int(hi[n_buckets - 1]) >> (64 - b):] = 2  # cells from which the tail is reachable
    # start (no edge in the cell), else -(2 start + [more than one edge]) - 1
    guide = np.where(inside == 0, starts, -(2 * starts + (inside > 1)) - 1).astype(np.int32)
    # z <= z_max(j) = ((j+1)^2 - j^2) W^2 / (2 sigma^2) in bucket j; (v + 1) 2^-16 <= 1 - z_max
    # <= exp(-z) whenever v < floor((1 - z_max) 2^16) - 1 (the -1 absorbs rounding).
    z_max = (2.0 * np.arange(n_buckets + 1) + 1.0) / (2.0 * s1 * s1)
    sure = np.floor((1.0 - np.minimum(z_max, 1.0)) * 2.0**16) - 1.0
    sure = np.clip(sure, 0, 2**16 - 1).astype(np.uint16)
    return _GaussTable(sigma, m, n_buckets, hi, lo, guide, b, 1.0 / (2.0 * sigma * sigma),
                       sure, _Plan.of(sigma * sigma / a))


def _branch_slow(rng: np.random.Generator, tab: _GaussTable, prefix: np.ndarray,
                 code: np.ndarray) -> np.ndarray:
    """Exact branch ``#{i : E_i <= U}`` given the first ``b`` bits of ``U`` and their guide code.

    The top word of ``U`` is the prefix followed by fresh bits. A cell with one
    edge compares with it; a cell with more, or a tie of top words (probability
    about 2^-64 per edge, then the low word of ``U`` is drawn), searches the table.
    """
    b, n_b = tab.guide_bits, tab.n_buckets
    u_hi = prefix.astype(np.uint64) << np.uint64(64 - b)
    u_hi |= rng.bit_generator.random_raw(prefix.size) >> np.uint64(b)
    code = -code - 1
    j = code >> 1
    eh = tab.edges_hi[j]
    j += u_hi > eh
    hard = np.flatnonzero((code & 1).astype(bool) | (eh == u_hi))
    if hard.size:
        uh = u_hi[hard]
        jh = np.searchsorted(tab.edges_hi[:-1], uh, "left").astype(np.int64)  # #{E_hi < U_hi}
        todo = np.flatnonzero((jh < n_b) & (tab.edges_hi[jh] == uh))
        if todo.size:
            u_lo = rng.bit_generator.random_raw(todo.size)
            while todo.size:
                jt = jh[todo]
                step = (jt < n_b) & (tab.edges_hi[jt] == uh[todo]) & (tab.edges_lo[jt] <= u_lo)
                jh[todo[step]] += 1
                todo, u_lo = todo[step], u_lo[step]
        j[hard] = jh
    return j


def _tail_magnitudes(rng: np.random.Generator, tab: _GaussTable, n: int):
    """One tail-branch proposal each: ``a + G`` and whether it is accepted.

    ``G`` is geometric with ``P(G >= g) = exp(-g a / sigma^2)``, accepted with
    probability ``exp(-G^2 / (2 sigma^2))``, so an accepted ``x = a + G`` has
    probability ``(1 - rho) exp(a^2/(2 sigma^2)) exp(-x^2/(2 sigma^2))``; with
    the tail's branch weight this is ``exp(-x^2/(2 sigma^2))`` per unit of
    proposal weight, as for the buckets. A rejection restarts the whole proposal.
    """
    ws = _Work(n)
    g, _, _ = _geometric(rng, tab.tail, n, ws)
    mag = g + (tab.n_buckets << tab.m)  # g < 2^62 and a < 2^61: no overflow
    e = ws.e[:n]
    _exponentials(rng, e, math.inf)
    gf = g.astype(np.float64)
    return mag, (e > gf * gf * tab.inv_two_sigma2) & (mag < _SUPPORT)


def _gauss_propose(rng: np.random.Generator, tab: _GaussTable, y: np.ndarray, ws: _Work) -> np.ndarray:
    """One proposal per entry of the int64 ``y`` (written in place); returns acceptance.

    The proposal word ``w`` gives the sign (bit 63), ``R`` (its low ``m`` bits)
    and the first ``b`` bits of the branch uniform (bits ``m .. m+b-1``).
    Bucket ``j``: ``y = j W + R`` accepted with probability
    ``p = exp(-z)``, ``z = R (2 j W + R) / (2 sigma^2)``, decided as ``V < p`` for
    ``V = (v + U') 2^-16`` uniform (``v`` a 16-bit quarter of a raw word, ``U'``
    drawn only when ``v`` is not below ``sure_accept[j]``, i.e. ``(v + 1) 2^-16``
    is not already below ``1 - z_max(j) <= p``: about 0.3% of proposals).
    """
    k, m, b = y.size, tab.m, tab.guide_bits
    w = rng.bit_generator.random_raw(k).view(np.int64)
    s = ws.s[:k]
    np.right_shift(w, 63, out=s)  # 0 or -1
    j = ws.g[:k]
    np.right_shift(w, m, out=j)
    j &= (1 << b) - 1
    gv = tab.guide[j]
    np.copyto(j, gv)
    slow = np.flatnonzero(gv < 0)
    if slow.size:
        j[slow] = _branch_slow(rng, tab, (w[slow] >> m) & ((1 << b) - 1), gv[slow])
    np.left_shift(j, m, out=y)  # j W
    acc = ws.acc[:k]
    if m:
        v = rng.bit_generator.random_raw(-(-k // 4)).view(np.uint16)[:k]
        np.less(v, tab.sure_accept[j], out=acc)
        w &= (1 << m) - 1  # R
        y |= w
        undecided = np.flatnonzero(~acc)
        if undecided.size:  # p = exp(-z) with V = (v + U') 2^-16
            r = w[undecided].astype(np.float64)
            z = r * (2.0 * (j[undecided] << m).astype(np.float64) + r) * tab.inv_two_sigma2
            big_v = (v[undecided] + rng.random(undecided.size)) * 2.0**-16
            acc[undecided] = big_v < np.exp(-z)
    else:
        acc.fill(True)
    if slow.size:
        tail = slow[j[slow] == tab.n_buckets]
        if tail.size:
            y[tail], acc[tail] = _tail_magnitudes(rng, tab, tail.size)
    if not y.all():
        acc &= (y != 0) | (s == 0)  # negative zero rejected (CKS)
    y ^= s
    y -= s
    return acc


def _dgauss_fill(rng: np.random.Generator, sigma: float, out: np.ndarray, ws: _Work) -> None:
    """Fill the 1-d int64 ``out`` with discrete Gaussian draws (table sampler).

    Each entry is its own rejection sampler: one proposal per entry
    (``_gauss_propose``), and entries whose proposal was rejected (about 0.1%
    with ``sigma / W >= 256``) propose again until accepted. An accepted
    magnitude ``y`` has probability ``exp(-y^2 / (2 sigma^2)) / S`` per
    proposal in every branch, so the output is the discrete Gaussian, entries
    independent.
    """
    if sigma < _TABLE_MIN_SIGMA:
        _dgauss_fill_cks(rng, sigma, out, ws)
        return
    tab = _gauss_table(sigma)
    acc = _gauss_propose(rng, tab, out, ws)
    todo = np.flatnonzero(~acc)
    while todo.size:
        y = np.empty(todo.size, dtype=np.int64)
        acc = _gauss_propose(rng, tab, y, ws)
        out[todo[acc]] = y[acc]
        todo = todo[~acc]
