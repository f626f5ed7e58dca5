"""Drawing and adding the grid noise of :mod:`sparkpriv.privacy.noise`: the discrete samplers
(``sample_discrete_laplace``, ``sample_discrete_gaussian``) and ``add_noise``,
``add_noise_transposed``, ``add_noise_symmetric`` (docs/math.md section 7; the grid, the
guarantees and the accounting are in :mod:`sparkpriv.privacy.noise`'s docstring, which also
re-exports every public name here)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy import _compiled
from sparkpriv.privacy._fast_samplers import _AUTO, _CHUNK, _OVERSAMPLE, _Plan, _Work, _dgauss_fill, _dlap_fill
from sparkpriv.privacy.noise import (MAX_GAUSSIAN_SIGMA, MAX_GRID_INTEGER, MAX_LAPLACE_SCALE, GaussianNoise,
                                     LaplaceNoise)

__all__ = ["sample_discrete_laplace", "sample_discrete_gaussian", "add_noise", "add_noise_transposed",
           "add_noise_symmetric", "transposed"]


# ----------------------------------------------------------------------------- public samplers


def _check_size(size, caller: str) -> tuple[int, ...]:
    shape = (size,) if isinstance(size, numbers.Integral) else tuple(size)
    if not all(isinstance(d, numbers.Integral) and d >= 0 for d in shape):
        raise ParameterError(
            f"The 'size' parameter of {caller} must be a non-negative int or a tuple of them. "
            f"Got {size!r} instead."
        )
    return tuple(int(d) for d in shape)


def _work(n: int) -> _Work:
    return _Work(int(min(n, _CHUNK) * _OVERSAMPLE) + 64)


def _fill(sampler, rng, param, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype=np.int64)
    flat = out.reshape(-1)
    ws = _work(flat.size)
    for lo in range(0, flat.size, _CHUNK):
        sampler(rng, param, flat[lo : lo + _CHUNK], ws)
    return out


def sample_discrete_laplace(
    rng: np.random.Generator, scale: float, size, *, exact: bool = False
) -> np.ndarray:
    """Discrete Laplace draws, pmf ``prop. to exp(-|x| / scale)`` on the integers.

    Parameters
    ----------
    rng : numpy.random.Generator
    scale : float in (0, 2^56]
        ``t`` in grid units.
    size : int or tuple of int
    exact : bool, default False
        Use the exact rational sampler (CKS Algorithms 1-2; about 40x slower at t = 50).

    Returns
    -------
    ndarray of int64, shape ``size``; every value has ``|x| < 2^62``.
    """
    caller = "sample_discrete_laplace"
    check_param("scale", scale, [Interval("real", 0, MAX_LAPLACE_SCALE, closed="right")], caller)
    shape = _check_size(size, caller)
    if exact:
        from sparkpriv.privacy import _exact_samplers

        return _exact_samplers.discrete_laplace(rng, float(scale), shape)
    return _fill(_dlap_fill, rng, _Plan.of(float(scale)), shape)


def sample_discrete_gaussian(
    rng: np.random.Generator, sigma: float, size, *, exact: bool = False
) -> np.ndarray:
    """Discrete Gaussian draws, pmf ``prop. to exp(-x^2 / (2 sigma^2))`` on the integers.

    Parameters
    ----------
    rng : numpy.random.Generator
    sigma : float in (0, 2^57]
    size : int or tuple of int
    exact : bool, default False
        Use the exact rational sampler (CKS Algorithms 1-3; about 90x slower at sigma = 40).

    Returns
    -------
    ndarray of int64, shape ``size``.
    """
    caller = "sample_discrete_gaussian"
    check_param("sigma", sigma, [Interval("real", 0, MAX_GAUSSIAN_SIGMA, closed="right")], caller)
    shape = _check_size(size, caller)
    if exact:
        from sparkpriv.privacy import _exact_samplers

        return _exact_samplers.discrete_gaussian(rng, float(sigma), shape)
    return _fill(_dgauss_fill, rng, float(sigma), shape)


# ----------------------------------------------------------------------------- adding noise


def _noise_sampler(noise, caller: str):
    if isinstance(noise, LaplaceNoise):
        return _dlap_fill, _Plan.of(noise.scale), sample_discrete_laplace, noise.scale
    if isinstance(noise, GaussianNoise):
        return _dgauss_fill, noise.sigma, sample_discrete_gaussian, noise.sigma
    raise ParameterError(
        f"The 'noise' parameter of {caller} must be a LaplaceNoise or GaussianNoise. "
        f"Got {type(noise).__name__} instead."
    )


def _range_error(caller: str, vals: np.ndarray, grid: float) -> ParameterError:
    if not np.all(np.isfinite(vals)):
        bad = int(np.size(vals) - np.count_nonzero(np.isfinite(vals)))
        return ParameterError(
            f"The 'values' parameter of {caller} must be finite. Got {bad} NaN or infinite "
            "value(s); fill or drop them (with public rules) before adding noise."
        )
    return ParameterError(
        f"The 'values' parameter of {caller} must satisfy |value| <= 2^62 grid steps "
        f"= {grid * float(MAX_GRID_INTEGER):.6g} (grid {grid!r}). Got max |value| = "
        f"{float(np.max(np.abs(vals))):.6g}: the noisy integer would overflow int64. "
        "Check declared bounds (clip) or release a rescaled quantity."
    )


def add_noise(
    values: np.ndarray,
    noise: LaplaceNoise | GaussianNoise,
    rng: np.random.Generator,
    *,
    exact: bool = False,
    kern=_AUTO,
) -> np.ndarray:
    """Release ``g * (rint(values / g) + N)`` with integer noise ``N`` of ``noise``.

    Parameters
    ----------
    values : array_like of float, any shape
        Exact answers (converted to float64). Every entry gets independent noise.
    noise : LaplaceNoise or GaussianNoise
        From :func:`calibrate_laplace_noise`, :func:`calibrate_gaussian_noise` or
        :func:`gaussian_noise_from_multiplier`.
    rng : numpy.random.Generator
        Secret-seeded stream (:func:`sparkpriv.privacy.random.stream`).
    exact : bool, default False
        Use the exact rational samplers.
    kern : internal
        The compiled kernels (:mod:`sparkpriv.privacy._compiled`; default: when
        in use) or None for numpy. Both give the same bits (discrete Laplace;
        the Gaussian samplers are numpy only).

    Returns
    -------
    ndarray of float64, same shape as ``values`` (a new array); each entry is
    ``g`` times an integer.

    Raises
    ------
    ParameterError
        If a value is NaN/infinite or ``|value / g| > 2^62`` (int64 headroom).
    """
    caller = "add_noise"
    sampler, param, public_sampler, scale = _noise_sampler(noise, caller)
    vals = np.asarray(values, dtype=np.float64)
    g = float(noise.grid)
    inv = 1.0 / g
    exact_inv = math.isfinite(inv) and inv * g == 1.0
    lim = float(MAX_GRID_INTEGER)
    out = np.empty(vals.shape, dtype=np.float64)
    flat_in = vals.reshape(-1)
    flat_out = out.reshape(-1)
    if exact:
        u = np.rint(flat_in * inv if exact_inv else flat_in / g)
        if not (u.size == 0 or (u.min() >= -lim and u.max() <= lim)):
            raise _range_error(caller, vals, g)
        n = public_sampler(rng, scale, u.size, exact=True)
        np.multiply(u.astype(np.int64) + n, g, out=flat_out)
        return out
    kern = _laplace_kernels(noise, kern)
    ws = _work(flat_in.size)
    ubuf = np.empty(min(_CHUNK, flat_in.size))
    ibuf = np.empty(min(_CHUNK, flat_in.size), dtype=np.int64)
    nbuf = np.empty_like(ibuf)
    for lo in range(0, flat_in.size, _CHUNK):
        chunk = flat_in[lo : lo + _CHUNK]
        if kern is not None:  # the same steps fused; the range is checked after the draws
            nb = nbuf[: chunk.size]
            sampler(rng, param, nb, ws, kern)
            if not kern.round_add(chunk, inv, g, exact_inv, lim, nb, flat_out[lo : lo + _CHUNK]):
                raise _range_error(caller, vals, g)
            continue
        u = ubuf[: chunk.size]
        np.multiply(chunk, inv, out=u) if exact_inv else np.divide(chunk, g, out=u)
        np.rint(u, out=u)
        if not (u.min() >= -lim and u.max() <= lim):  # NaN fails both comparisons
            raise _range_error(caller, vals, g)
        nb = nbuf[: chunk.size]
        if isinstance(noise, LaplaceNoise):
            sampler(rng, param, nb, ws, None)
        else:
            sampler(rng, param, nb, ws)
        ib = ibuf[: chunk.size]
        np.copyto(ib, u, casting="unsafe")
        nb += ib  # |u| <= 2^62 and |N| < 2^62: no overflow
        np.multiply(nb, g, out=flat_out[lo : lo + _CHUNK])
    return out


def _laplace_kernels(noise, kern):
    if not isinstance(noise, LaplaceNoise):
        return None
    return _compiled.kernels() if kern is _AUTO else kern


def transposed(Z: np.ndarray, block_rows: int = 256) -> np.ndarray:
    """``Z.T`` as a new C-contiguous array, copied a block of rows at a time (a
    block's source and destination both stay in cache: about 2 ns a value here,
    against 10 for ``np.ascontiguousarray(Z.T)``)."""
    Z = np.asarray(Z)
    n, k = Z.shape
    Zt = np.empty((k, n), dtype=Z.dtype)
    for lo in range(0, n, block_rows):
        Zt[:, lo: lo + block_rows] = Z[lo: lo + block_rows].T
    return Zt


def add_noise_transposed(
    values: np.ndarray,
    noise: LaplaceNoise | GaussianNoise,
    rng: np.random.Generator,
    *,
    kern=_AUTO,
) -> np.ndarray:
    """``add_noise(values, noise, rng).T``, each row contiguous (a column of ``values``).

    The same draws in the same order (row by row of ``values``), the same
    output bits; for writing the columns of a release as Arrow arrays without
    a transposing copy. With the compiled kernels the noisy values are written
    transposed as they are made.

    Parameters
    ----------
    values : array_like of float, shape (n, k)
    noise, rng
        As for :func:`add_noise`.

    Returns
    -------
    ndarray of float64, shape ``(k, n)``; its rows are C-contiguous (the array
    may be a view of a wider buffer).
    """
    caller = "add_noise_transposed"
    vals = np.asarray(values, dtype=np.float64)
    if vals.ndim != 2:
        raise ParameterError(f"The 'values' parameter of {caller} must be a 2-d array. Got shape {vals.shape!r}.")
    kern = _laplace_kernels(noise, kern)
    if kern is None:
        return transposed(add_noise(vals, noise, rng, kern=None))
    sampler, param, _, _ = _noise_sampler(noise, caller)
    vals = np.ascontiguousarray(vals)
    n, k = vals.shape
    g = float(noise.grid)
    inv = 1.0 / g
    exact_inv = math.isfinite(inv) and inv * g == 1.0
    lim = float(MAX_GRID_INTEGER)
    # rows a whole number of cache lines apart, but not a multiple of 4 KiB (writing
    # down a column would otherwise keep hitting the same cache sets)
    width = -(-n // 8) * 8
    if width % 512 == 0:
        width += 8
    buf = np.empty((k, width), dtype=np.float64)
    zt = buf[:, :n]
    total = n * k
    ws = _work(total)
    nbuf = np.empty(min(_CHUNK, total), dtype=np.int64)
    for lo in range(0, total, _CHUNK):
        nb = nbuf[: min(_CHUNK, total - lo)]
        sampler(rng, param, nb, ws, kern)
        if not kern.round_add_t(vals, lo, inv, g, exact_inv, lim, nb, zt):
            raise _range_error(caller, vals, g)
    return zt


def add_noise_symmetric(
    matrix: np.ndarray,
    noise: GaussianNoise | LaplaceNoise,
    rng: np.random.Generator,
    *,
    exact: bool = False,
) -> np.ndarray:
    """Noise a symmetric ``(d, d)`` matrix once per upper-triangle entry, mirrored.

    The upper triangle including the diagonal (``d (d+1) / 2`` entries) is
    noised with :func:`add_noise` and copied to the lower triangle, so each
    off-diagonal pair shares one draw (no double noise). Only the upper
    triangle of ``matrix`` is read. ``noise.dim`` must be at least
    ``d (d+1) / 2`` (the grid-rounding term counts every noised entry).

    Returns
    -------
    ndarray of float64, shape ``(d, d)``, exactly symmetric.
    """
    caller = "add_noise_symmetric"
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ParameterError(
            f"The 'matrix' parameter of {caller} must be a square 2-d array. "
            f"Got shape {m.shape!r} instead."
        )
    d = m.shape[0]
    _noise_sampler(noise, caller)
    need = d * (d + 1) // 2
    if noise.dim < need:
        raise ParameterError(
            f"The 'noise' parameter of {caller} must be calibrated with dim >= d(d+1)/2 = "
            f"{need} for a {d}x{d} matrix. Got dim={noise.dim} instead."
        )
    iu = np.triu_indices(d)
    noisy = add_noise(m[iu], noise, rng, exact=exact)
    out = np.empty((d, d), dtype=np.float64)
    out[iu] = noisy
    out[iu[1], iu[0]] = noisy
    return out
