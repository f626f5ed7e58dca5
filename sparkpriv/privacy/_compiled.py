"""Optional compiled (numba) kernels of the per-row hot path: the discrete
Laplace sampler's word phase, rounding to the grid and adding the noise, and
the sparse projection.

Each kernel is a loop-fused transcription of numpy code it stands in for
(``_fast_samplers._geometric`` / ``_dlap_fill``, the chunk loop of
``noise.add_noise``, ``mechanisms.sparse.project_sparse_rows``) and is
bit-identical to it: it draws the same 64-bit words from the same stream in
the same order and does the same IEEE double operations in the same order
(no fast-math, no reassociation, no fused multiply-add). The rare branches
(exponentials redrawn above ``_E_RESTART``, residues that the word's spare bits
do not decide, negative zeros) stay in numpy. Using the kernels or not
therefore changes no output bit and no privacy argument (docs/noise.md); they
only remove numpy's temporaries and passes over memory. The exponentials
themselves are still drawn by numpy's ``standard_exponential``.

The kernels are used when numba imports and a self-check passes in the
process (the first call compares every kernel with its numpy reference on
fixed public seeds, including slow residues and negative zeros); otherwise, or with the
environment variable ``SPARKPRIV_COMPILED=0``, everything runs in numpy.
numba comes with the ``fast`` extra (``pip install 'sparkpriv[fast]'``). The
compiled code is cached on disk by numba (``__pycache__`` beside this file, or
numba's user cache directory); it holds machine code only: every secret
(stream state, matrix) is an argument, never a compile-time constant.
"""

from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace

import numpy as np

_log = logging.getLogger(__name__)

ENV = "SPARKPRIV_COMPILED"

AUTO = object()  # a ``kern`` argument's default: the kernels if in use (kernels()), else numpy

_lock = threading.Lock()
_state: object = None  # None: not loaded yet; False: unavailable; a namespace: ready
_why: str = "not loaded yet"


def kernels():
    """The kernel namespace, or None (numba missing, disabled, or self-check failed)."""
    global _state, _why
    if _state is None:
        with _lock:
            if _state is None:
                _state = False  # while loading and checking, callers (the references) use numpy
                ns, why = _load()
                _state, _why = (ns if ns is not None else False), why
                (_log.debug if ns is not None else _log.info)("compiled kernels: %s", why)
    return _state or None


def status() -> str:
    """Why the kernels are (not) in use, for logs and benchmarks (no secrets)."""
    kernels()
    return _why


def _load():
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None, f"disabled by {ENV}"
    try:
        try:
            ns = _compile(cache=True)
        except ImportError:
            raise
        except Exception:  # e.g. no writable cache directory: compile in memory
            ns = _compile(cache=False)
    except Exception as exc:  # numba missing, or an unsupported numba/numpy pair
        return None, f"numba unavailable ({type(exc).__name__}); using numpy"
    try:
        bad = _self_check(ns)
    except Exception as exc:
        return None, f"self-check raised {type(exc).__name__}; using numpy"
    if bad:
        return None, f"self-check failed ({bad}); using numpy"
    import numba

    return ns, f"numba {numba.__version__}, self-check passed"


def _compile(cache: bool):
    import numba
    from numba.np.random.generator_core import next_uint64

    jit = numba.njit(cache=cache, nogil=True, error_model="numpy")

    @jit
    def geo_words(rng, e, ratio, m, fast_vc, g, s, r, slow, slow_vc):
        """After ``e`` holds the exponentials: one 64-bit word per entry, as
        ``_geometric``: ``s = w >> 63``, ``R = w & (M-1)``, spare bits
        ``(w >> m) & (2^(63-m) - 1)`` (``slow`` lists the entries where they do not
        decide R, with their spare bits), ``G = (floor(e ratio) << m) + R``.
        Returns the number of slow entries."""
        bg = rng.bit_generator
        n = e.shape[0]
        ns = 0
        if m == 0:
            for i in range(n):
                w = np.int64(next_uint64(bg))
                s[i] = w >> 63
                g[i] = np.int64(e[i] * ratio)
            return 0
        mask = (np.int64(1) << m) - 1
        mask2 = (np.int64(1) << (63 - m)) - 1
        for i in range(n):
            w = np.int64(next_uint64(bg))
            s[i] = w >> 63
            ri = w & mask
            vc = (w >> m) & mask2
            r[i] = ri
            g[i] = (np.int64(e[i] * ratio) << m) + ri
            if vc >= fast_vc:
                slow[ns] = i
                slow_vc[ns] = vc
                ns += 1
        return ns

    @jit
    def sign_apply(g, s, out):
        """``out = (g ^ s) - s``; returns whether some entry is a negative zero."""
        neg0 = False
        for i in range(g.shape[0]):
            out[i] = (g[i] ^ s[i]) - s[i]
            if g[i] == 0 and s[i] != 0:
                neg0 = True
        return neg0

    @jit
    def _noisy(v, nz, inv, grid, use_inv, lim):
        """``(ok, float(rint(v / g) + N) * g)``; ok is False if ``|rint(v / g)| > lim`` or NaN."""
        u = np.rint(v * inv) if use_inv else np.rint(v / grid)
        if not (u >= -lim and u <= lim):
            return False, 0.0
        return True, np.float64(np.int64(u) + nz) * grid

    @jit
    def round_add(y, inv, grid, use_inv, lim, noise, out):
        """``out = float(rint(y / g) + N) * g`` as ``add_noise``; False (and ``out``
        unspecified) if some ``|rint(y / g)| > lim`` or is NaN."""
        for i in range(y.shape[0]):
            ok, out[i] = _noisy(y[i], noise[i], inv, grid, use_inv, lim)
            if not ok:
                return False
        return True

    @jit
    def _round_add_t_flat(y, f, hi, lo, inv, grid, use_inv, lim, noise, zt):
        """Entries ``f .. hi-1`` of ``round_add_t`` one at a time (the parts of rows
        that a chunk boundary cuts)."""
        k = y.shape[1]
        while f < hi:
            i = f // k
            ok, zt[f - i * k, i] = _noisy(y[i, f - i * k], noise[f - lo], inv, grid, use_inv, lim)
            if not ok:
                return False
            f += 1
        return True

    @jit
    def round_add_t(y, lo, inv, grid, use_inv, lim, noise, zt):
        """``round_add`` of the flat entries ``lo ..`` of the C-order (n, k) ``y``,
        written transposed: entry (i, c) goes to ``zt[c, i]``. Whole rows are done
        8 at a time: computed in row order into a small buffer (a loop without
        branches), then copied out column by column, so each write fills a cache line."""
        k = y.shape[1]
        hi = lo + noise.shape[0]
        f = min(hi, -(-lo // k) * k)  # the end of a row begun in the previous chunk
        if not _round_add_t_flat(y, lo, f, lo, inv, grid, use_inv, lim, noise, zt):
            return False
        i0, i1 = f // k, hi // k
        tmp = np.empty(8 * k)
        yf = y.reshape(-1)  # C-contiguous (add_noise_transposed)
        for b in range(i0, i1, 8):
            b1 = min(b + 8, i1)
            base = b * k - lo
            bad = False
            for j in range((b1 - b) * k):
                v = yf[b * k + j]
                u = np.rint(v * inv) if use_inv else np.rint(v / grid)
                ok = u >= -lim and u <= lim  # False for NaN
                bad |= not ok
                u = u if ok else 0.0
                tmp[j] = np.float64(np.int64(u) + noise[base + j]) * grid
            if bad:
                return False
            for c in range(k):
                for i in range(b1 - b):
                    zt[c, b + i] = tmp[i * k + c]
        # a row that the next chunk finishes
        return _round_add_t_flat(y, max(f, i1 * k), hi, lo, inv, grid, use_inv, lim, noise, zt)

    @jit
    def project(off, idx, vals, weighted, P, Y):
        """``Y[i] = sum_j v_j P[idx_j]`` over the record's entries, in entry order
        (scipy's CSR product: ``y += v x`` from zero, ``v = 1.0`` unweighted).
        Returns False, before writing, if an offset or an item index is out of range."""
        k, d = P.shape[1], P.shape[0]
        n = off.shape[0] - 1
        if off[0] != 0 or off[n] > idx.shape[0] or (weighted and off[n] > vals.shape[0]):
            return False
        for i in range(n):
            if off[i + 1] < off[i]:
                return False
        for jj in range(off[n]):
            if idx[jj] < 0 or idx[jj] >= d:
                return False
        for i in range(n):
            for c in range(k):
                Y[i, c] = 0.0
            for jj in range(off[i], off[i + 1]):
                j = idx[jj]
                v = vals[jj] if weighted else 1.0
                for c in range(k):
                    Y[i, c] += v * P[j, c]
        return True

    return SimpleNamespace(geo_words=geo_words, sign_apply=sign_apply, round_add=round_add,
                           round_add_t=round_add_t, project=project)


def _self_check(ns) -> str:
    """Compare every kernel with its numpy reference on fixed public inputs;
    returns what differed ("" if nothing). Covers m = 0 and m > 0, slow
    residues, negative zeros, both rounding modes, a chunk ending inside a
    row, a range error, and weighted and unweighted projections. (Exponential
    restarts happen in numpy before the word phase; tests/privacy/test_compiled.py
    forces them.) Changes no module state."""
    from sparkpriv.privacy import _fast_samplers as fs
    from sparkpriv.privacy import noise as nz
    from sparkpriv.privacy.random import stream

    def gen(seed):  # the generator the releases use (AES-CTR), keyed by a public seed
        return stream(seed, 0)

    def same_rng(a, b):  # same key, same next words: the same position in the stream
        return np.array_equal(a.bit_generator.random_raw(4), b.bit_generator.random_raw(4))

    for t in (0.75, 40.0, 1000.5, 3.0e6):
        plan = fs._Plan.of(t)
        for n in (1, 257, 5000):
            a, b = gen(n + int(t)), gen(n + int(t))
            ws_a, ws_b = fs._Work(n + 64), fs._Work(n + 64)
            out_a, out_b = np.empty(n, np.int64), np.empty(n, np.int64)
            fs._dlap_fill(a, plan, out_a, ws_a, kern=None)
            fs._dlap_fill(b, plan, out_b, ws_b, kern=ns)
            if not (np.array_equal(out_a, out_b) and same_rng(a, b)):
                return f"discrete Laplace, t = {t}, n = {n}"
    # slow residues often (one bit of K: about a third of the draws); the plan is built
    # here, not by changing module constants that other threads may be sampling with
    plan = fs._Plan.of(37.0, k_bits=1)
    a, b = gen(7), gen(7)
    out_a, out_b = np.empty(3000, np.int64), np.empty(3000, np.int64)
    fs._dlap_fill(a, plan, out_a, fs._Work(3100), kern=None)
    fs._dlap_fill(b, plan, out_b, fs._Work(3100), kern=ns)
    if not (np.array_equal(out_a, out_b) and same_rng(a, b)):
        return "discrete Laplace, slow residues"
    rs = np.random.default_rng(1)
    y = rs.normal(scale=50.0, size=(2600, 13))  # 33,800 entries: a chunk (2^15) ends inside a row
    y[3, 4] = 0.5 * 2.0 ** -3  # a tie, rounded to even
    for grid in (2.0 ** -3, 0.75):  # 0.75: divide, not multiply
        noise = nz.LaplaceNoise(grid=grid, scale=7.0, sensitivity=1.0, grid_sensitivity=2.0, epsilon=1.0, dim=1)
        ref = nz.add_noise(y, noise, gen(3), kern=None)
        got = nz.add_noise(y, noise, gen(3), kern=ns)
        got_t = nz.add_noise_transposed(y, noise, gen(3), kern=ns)
        if not (np.array_equal(ref, got) and np.array_equal(ref.T, got_t)):
            return f"add_noise, grid = {grid}"
    bad = y.copy()
    bad[50, 2] = np.nan
    for fn in (nz.add_noise, nz.add_noise_transposed):
        try:
            fn(bad, noise, gen(3), kern=ns)
            return "add_noise accepted NaN"
        except nz.ParameterError:
            pass
    from scipy.sparse import csr_matrix

    # the sparse projection against its numpy path (mechanisms.sparse.project_sparse_rows
    # without the kernel: scipy's CSR product), built here so that the privacy core does
    # not import the mechanisms layer
    off = np.array([0, 0, 3, 4, 9], np.int64)
    idx = np.array([5, 1, 5, 0, 2, 3, 4, 6, 1], np.int32)
    P = rs.normal(size=(7, 5))
    vals = rs.uniform(0.0, 3.0, size=9)
    for v in (None, vals):
        weights = np.ones(idx.size) if v is None else v
        ref = np.asarray(csr_matrix((weights, idx, off), shape=(off.size - 1, P.shape[0])) @ P)
        got = np.empty((off.size - 1, P.shape[1]))
        ok = ns.project(off, idx, np.empty(0) if v is None else v, v is not None, np.ascontiguousarray(P), got)
        if not ok or not np.array_equal(ref, got):
            return "sparse projection"
    return ""
