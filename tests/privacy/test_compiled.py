"""The compiled (numba) kernels give the numpy code's exact bits, and consume the
stream exactly as it does, on the common and the rare branches.

The numpy paths are the references (their distributions are tested against
exact pmfs in test_noise.py); here every comparison is bit-for-bit, plus the
generator's state afterwards (the same words were drawn).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import sparse
from sparkpriv.privacy import _compiled
from sparkpriv.privacy import _fast_samplers as fs
from sparkpriv.privacy import noise as nz
from sparkpriv.privacy import noise_draws as nd
from sparkpriv.privacy.random import stream

HAS_NUMBA = importlib.util.find_spec("numba") is not None
needs_kernels = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (the 'fast' extra)")


@pytest.fixture(scope="module")
def kern():
    k = _compiled.kernels()
    assert k is not None, _compiled.status()
    return k


def gen(seed):
    """The generator of the releases (AES-128-CTR, ``random.stream``), keyed by a public seed."""
    return stream(seed, 0)


def same_position(a, b):
    """Two generators of the same key are at the same place: their next words agree."""
    return np.array_equal(a.bit_generator.random_raw(4), b.bit_generator.random_raw(4))


@pytest.mark.skipif(not HAS_NUMBA or os.environ.get(_compiled.ENV) == "0", reason="numba not installed or disabled")
def test_kernels_are_in_use_when_numba_is_installed():
    assert _compiled.kernels() is not None, _compiled.status()
    assert "self-check passed" in _compiled.status()


def _dlap_both(kern, plan, n, seed, make=None):
    make = make or gen
    a, b = make(seed), make(seed)
    out_a, out_b = np.empty(n, np.int64), np.empty(n, np.int64)
    fs._dlap_fill(a, plan, out_a, fs._Work(n + 64), kern=None)
    fs._dlap_fill(b, plan, out_b, fs._Work(n + 64), kern=kern)
    return out_a, out_b, same_position(a, b)


@needs_kernels
@pytest.mark.parametrize("t", [0.3, 0.75, 1.0, 5.5, 40.0, 1000.5, 2.0**20 + 0.5, 1.06e12, 2.0**56])
def test_discrete_laplace_is_bit_identical(kern, t):
    plan = fs._Plan.of(t)
    for n, seed in ((1, 1), (777, 2), (20000, 3)):
        a, b, same_state = _dlap_both(kern, plan, n, seed)
        assert np.array_equal(a, b), (t, n)
        assert same_state, (t, n)
    if t < 1.5:  # negative zeros were redrawn: P(0) = (1-q)/(1+q), not the magnitude's 1-q
        q = np.exp(-1.0 / t)
        p0 = (1 - q) / (1 + q)
        assert abs(np.mean(b == 0) - p0) < 6 * np.sqrt(p0 * (1 - p0) / b.size), (np.mean(b == 0), p0, 1 - q)


@needs_kernels
def test_streams_are_aes_and_kernels_match_on_other_generators_too(kern):
    """The releases' streams are randomgen's AESCounter, and numba reads its words
    through the bit generator's ctypes interface exactly as numpy does; numpy's own
    PCG64 (callers may pass any Generator) gives bit-identity as well."""
    assert type(gen(1).bit_generator).__name__ == "AESCounter"
    plan = fs._Plan.of(1000.5)
    for make in (gen, lambda s: np.random.Generator(np.random.PCG64(s))):
        a, b, same_state = _dlap_both(kern, plan, 20000, 4, make)
        assert np.array_equal(a, b) and same_state


@needs_kernels
@pytest.mark.parametrize("k_bits,restart", [(1, 0.3), (2, 12.0), (8, 0.3)])
def test_rare_branches_are_bit_identical(kern, monkeypatch, k_bits, restart):
    """Few bits of K make the residue's spare bits undecided often (the slow
    residue loop); a low restart threshold redraws most exponentials."""
    monkeypatch.setattr(fs, "_K_BITS", k_bits)
    monkeypatch.setattr(fs, "_E_RESTART", restart)
    for t in (0.6, 37.0, 5000.0):
        plan = fs._Plan.of(t)
        a, b, same_state = _dlap_both(kern, plan, 30000, 11)
        assert np.array_equal(a, b) and same_state, t


@needs_kernels
def test_support_truncation_is_bit_identical(kern, monkeypatch):
    monkeypatch.setattr(fs, "_SUPPORT", 2**9)
    monkeypatch.setattr(fs, "_E_RESTART", 2.0)
    plan = fs._Plan.of(40.0)
    a, b, same_state = _dlap_both(kern, plan, 30000, 5)
    assert np.array_equal(a, b) and same_state
    assert np.abs(a).max() < 2**9


def _laplace(grid, scale=9.0):
    return nz.LaplaceNoise(grid=grid, scale=scale, sensitivity=1.0, grid_sensitivity=2.0, epsilon=1.0, dim=1)


@needs_kernels
@pytest.mark.parametrize("shape", [(0,), (1,), (5000,), (40000,), (0, 4), (3000, 13), (600, 64)])
@pytest.mark.parametrize("grid", [2.0**-20, 0.75])
def test_add_noise_is_bit_identical(kern, shape, grid):
    rng = np.random.default_rng(3)
    y = rng.normal(scale=1e3, size=shape)
    if y.size > 3:
        y.flat[3] = 2.5 * grid  # a tie: rint rounds it to even
    noise = _laplace(grid)
    ref = nz.add_noise(y, noise, gen(9), kern=None)
    assert np.array_equal(ref, nz.add_noise(y, noise, gen(9), kern=kern))
    if len(shape) == 2:
        for k in (kern, None):
            zt = nz.add_noise_transposed(y, noise, gen(9), kern=k)
            assert zt.shape == (shape[1], shape[0])
            assert np.array_equal(zt, ref.T)
            assert all(row.flags.c_contiguous for row in zt)


@needs_kernels
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_transposed_noise_across_chunk_boundaries(kern, monkeypatch, chunk):
    """Chunks that end inside a row, at a row's end, or hold many rows."""
    monkeypatch.setattr(nd, "_CHUNK", chunk)  # the chunking of noise_draws (add_noise and its transposed form)
    y = np.random.default_rng(4).normal(scale=50.0, size=(301, 13))
    noise = _laplace(2.0**-10)
    ref = nz.add_noise(y, noise, gen(1), kern=None)
    assert np.array_equal(nz.add_noise_transposed(y, noise, gen(1), kern=kern), ref.T)
    assert np.array_equal(nz.add_noise(y, noise, gen(1), kern=kern), ref)


def test_transposed_noise_gaussian_and_numpy_path():
    y = np.random.default_rng(5).normal(size=(50, 7))
    g = nz.calibrate_gaussian_noise(sensitivity=1.0, epsilon=1.0, delta=1e-6, dim=7)
    assert np.array_equal(nz.add_noise_transposed(y, g, gen(2)), nz.add_noise(y, g, gen(2)).T)
    lap = _laplace(2.0**-8)
    assert np.array_equal(nz.add_noise_transposed(y, lap, gen(2), kern=None),
                          nz.add_noise(y, lap, gen(2), kern=None).T)
    with pytest.raises(ParameterError, match="2-d array"):
        nz.add_noise_transposed(y[0], lap, gen(2))


@pytest.mark.parametrize("use_kernels", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e30])
def test_out_of_range_values_are_refused_on_both_paths(use_kernels, bad):
    if use_kernels and not HAS_NUMBA:
        pytest.skip("numba is not installed")
    k = _compiled.kernels() if use_kernels else None
    y = np.zeros((100, 5))
    y[77, 3] = bad
    noise = _laplace(2.0**-20)
    match = "finite" if not np.isfinite(bad) else "overflow int64"
    with pytest.raises(ParameterError, match=match):
        nz.add_noise(y, noise, gen(1), kern=k)
    with pytest.raises(ParameterError, match=match):
        nz.add_noise_transposed(y, noise, gen(1), kern=k)


@needs_kernels
def test_sparse_projection_is_bit_identical(kern):
    rng = np.random.default_rng(6)
    n, d, k = 500, 40, 17
    sizes = rng.integers(0, 9, n)  # includes empty records
    off = np.concatenate(([0], np.cumsum(sizes)))
    idx = rng.integers(0, d, off[-1]).astype(np.int32)  # repeated items too
    vals = rng.uniform(0.0, 5.0, off[-1])
    P = rng.normal(size=(d, k))
    for v in (None, vals):
        ref = np.asarray(sparse._csr(off, idx, v, d) @ P)  # scipy
        for p in (P, np.asfortranarray(P)):
            got = sparse.project_sparse_rows(off, idx.astype(np.int64), v, p, kern=kern)
            assert np.array_equal(got, ref)
            assert np.array_equal(sparse.project_sparse_rows(off, idx, v, p, kern=kern), ref)
    assert sparse.project_sparse_rows(np.array([0]), idx[:0], None, P, kern=kern).shape == (0, k)


@needs_kernels
@pytest.mark.parametrize("off,idx", [([0, 2, 1], [0, 1]), ([1, 2], [0, 1]), ([0, 3], [0, 1]),
                                     ([0, 2], [0, 40]), ([0, 2], [-1, 3])])
def test_malformed_records_are_refused(kern, off, idx):
    P = np.ones((40, 3))
    with pytest.raises(ParameterError, match="malformed"):
        sparse.project_sparse_rows(np.array(off), np.array(idx, np.int32), None, P, kern=kern)


@needs_kernels
def test_self_check_catches_a_kernel_that_differs(kern):
    """A kernel that sums a record's rows in another order, or lets negative zeros
    through, differs in some bits: the self-check must refuse it."""
    assert _compiled._self_check(kern) == ""

    def reversed_project(off, idx, vals, weighted, P, Y):
        n = off.size - 1
        for i in range(n):
            rows = P[idx[off[i]:off[i + 1]][::-1]]
            w = vals[off[i]:off[i + 1]][::-1, None] if weighted else 1.0
            Y[i] = np.sum(rows * w, axis=0) if rows.size else 0.0
        return True

    def leaky_sign(g, s, out):
        out[:] = (g ^ s) - s
        return False

    wrong = SimpleNamespace(**vars(kern))
    wrong.project = reversed_project
    assert _compiled._self_check(wrong) == "sparse projection"
    wrong = SimpleNamespace(**vars(kern))
    wrong.sign_apply = leaky_sign
    assert _compiled._self_check(wrong).startswith("discrete Laplace")


def test_environment_variable_turns_the_kernels_off():
    code = "from sparkpriv.privacy import _compiled; print(_compiled.kernels() is None, _compiled.status())"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **{_compiled.ENV: "0"}),
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("True disabled by SPARKPRIV_COMPILED"), out


@needs_kernels
def test_gaussian_tail_branch_is_bit_identical(kern, monkeypatch):
    """The discrete Gaussian's tail branch draws its geometric proposal through the
    same word phase: forced often here, with and without the kernels."""
    monkeypatch.setattr(fs, "_K_BITS", 2)
    monkeypatch.setattr(fs, "_TABLE_SIGMAS", 0.8)  # tail branch: about 43% of draws
    calls = []
    words = kern.geo_words
    monkeypatch.setattr(kern, "geo_words", lambda *a: calls.append(1) or words(*a))
    with_kernels = nz.sample_discrete_gaussian(gen(8), 40.0, 50_000)
    assert calls  # the kernel did run
    monkeypatch.setattr(_compiled, "kernels", lambda: None)
    assert np.array_equal(nz.sample_discrete_gaussian(gen(8), 40.0, 50_000), with_kernels)
