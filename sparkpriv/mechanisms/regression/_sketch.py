"""The sketch's layout, per-batch partials and sensitivity (docs/math.md section 6); its parameters
are :class:`~sparkpriv.mechanisms.regression._params.RegressionParams` with ``method="sketch"``."""

from __future__ import annotations

import math

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms.regression._params import (NEIGHBORS_OK, SCHEMES, SKETCH_RULES, RegressionParams,
                                                     check_neighbors)
from sparkpriv.privacy.random import stream


SKETCH_STAGE = 21  # public label of the sketch's column streams: (seed, SKETCH_STAGE, block)
NOISE_STAGE = 22  # driver noise of the sketch: (noise seed, NOISE_STAGE, 0)
ADDITIVE_STAGE = 23  # row noise of the additive scheme: (noise seed, ADDITIVE_STAGE, partition)
_BLOCK_VALUES = 2**18  # about this many normals per column block (2 MB)


def sketch_rows_for(rule: str, n: int, p: int) -> int:
    """``m`` for a rule (public: depends on ``n`` and ``p`` only); always in ``[1, n]``."""
    log_m = max(p + 10, math.ceil(10.0 * math.log(max(n, 2))))
    if rule == "log":
        m = log_m
    elif rule == "linear":
        m = max(log_m, math.ceil(n / 10.0))
    elif rule == "full":
        m = n
    else:
        raise ParameterError(f"The 'sketch_rule' must be one of {SKETCH_RULES!r}. Got {rule!r} instead.")
    return int(max(1, min(m, n)))


def block_rows(m: int) -> int:
    """Records per column block of ``S`` (a function of ``m`` only)."""
    return max(1, _BLOCK_VALUES // int(m))


def _block(seed: int, m: int, k: int) -> np.ndarray:
    """Block ``k`` of ``S^T``: ``(block_rows(m), m)``, row ``j`` = column ``k block_rows + j`` of ``S``."""
    rng = stream(seed, SKETCH_STAGE, int(k))
    G = rng.standard_normal((block_rows(m), m))
    G *= 1.0 / math.sqrt(m)
    return G


def sketch_columns(seed: int, m: int, start: int, stop: int):
    """Yield ``(lo, hi, C)`` covering global rows ``[start, stop)``: ``C`` is ``(hi - lo, m)``,
    its row ``t`` the column ``lo + t`` of ``S``. Whole blocks are generated, parts used."""
    br = block_rows(m)
    lo = int(start)
    while lo < stop:
        k = lo // br
        hi = min(stop, (k + 1) * br)
        G = _block(seed, m, k)
        yield lo, hi, G[lo - k * br: hi - k * br]
        lo = hi


def sketch_matrix(seed: int, m: int, n: int) -> np.ndarray:
    """The whole ``S`` (m x n). TESTS AND SMALL REFERENCES ONLY: engines never build it."""
    S = np.empty((m, n))
    for lo, hi, C in sketch_columns(seed, m, 0, n):
        S[:, lo:hi] = C.T
    return S


def partial_size(m: int, p: int, slots: int = 1) -> int:
    """Length of a sketch partial: ``vec(S M)`` (m p), row L1 norms of ``S`` (m), ``slots`` maxima."""
    return m * p + m + slots


def sketch_partial(Mc: np.ndarray, seed: int, m: int, start: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(S_part M_part, row L1 norms of S_part, max column norm of S_part)`` for clipped rows
    ``Mc`` (k, p) with global indices ``start .. start + k - 1``."""
    k, p = Mc.shape
    SM = np.zeros((m, p))
    l1 = np.zeros(m)
    cmax = 0.0
    for lo, hi, C in sketch_columns(seed, m, start, start + k):
        rows = Mc[lo - start: hi - start]
        SM += C.T @ rows
        l1 += np.abs(C).sum(axis=0)
        cmax = max(cmax, float(np.sqrt(np.einsum("ij,ij->i", C, C).max())))
    return SM, l1, cmax


def pack_partial(SM: np.ndarray, l1: np.ndarray, cmax: float, slot: int = 0, slots: int = 1) -> np.ndarray:
    """One float64 vector of a partial; column-norm maxima go to their own slot, so that sums
    of partials (tree aggregation) keep every partition's maximum."""
    m, p = SM.shape
    v = np.zeros(partial_size(m, p, slots))
    v[: m * p] = SM.ravel()
    v[m * p: m * p + m] = l1
    v[m * p + m + int(slot)] = cmax
    return v


def sketch_sensitivity(S: np.ndarray, row_bound: float) -> float:
    """``2 B max_i ||S_{:,i}||_2`` (replace-one; exact for the realized ``S``)."""
    return 2.0 * float(row_bound) * float(np.sqrt(np.einsum("ij,ij->j", S, S).max()))
