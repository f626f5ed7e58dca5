"""The DPGM's per-item counts and the calibration of the mixture's marginals to them
(docs/dpgm.md, "Calibrating the marginals"; docs/math.md section 5.4).

With ``marginal_share > 0`` (rbm only) the release also noises, once on the driver, the vector of
the ``d`` column sums of the records as the k-means bounds them (for binary event records: the
number of people with each item), calibrated alone to ``(marginal_share epsilon, delta)``: a
replaced record ``x -> x'`` (both in ``[0, 1]^d`` with ``||x||_2 <= R``) moves the sums by
``x' - x``, ``||x' - x||_2^2 = ||x||^2 + ||x'||^2 - 2 x . x' <= 2 R^2``: L2 sensitivity
``sqrt(2) R`` (``sqrt(2 L)`` for records of at most ``L`` items).

After training, each cluster's task samples ``S_j`` records of its released model (as synthesis
draws them: a length from the cluster's released histogram, then the record given it) and sums
them; the driver forms the mixture's marginals ``m = n sum_j w_j s_j / S_j`` (``w`` the released
sizes, normalised) and shifts every cluster's visible biases by one vector
``log((max(c, 0) + s) / (m + s))``, ``c`` the noisy counts and ``s = MARGINAL_SHRINK_STDS`` noise
stds (a small, noisy count moves its item little). Post-processing of released values with
randomness of its own: no further budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.random import stream
from sparkpriv.mechanisms.dpgm._params import (DPGMParams, MARGINAL_SAMPLE_STAGE, MARGINAL_SHRINK_STDS,
                                               MARGINAL_STAGE)
from sparkpriv.mechanisms.dpgm._lengths import draw_lengths, gaussian_alone

MARGINAL_BATCH_VALUES = 1 << 22  # a task samples at most this many values at once (32 MiB of float64)


@dataclass(frozen=True)
class MarginalPlan:
    """The per-item counts (docs/dpgm.md, "Calibrating the marginals"): the ``d`` column sums of
    the bounded records, released ONCE with discrete Gaussian noise (``noise``, drawn on the
    driver from ``stream(seed, MARGINAL_STAGE)``), L2 sensitivity ``sqrt(2) row_bound``, the noise
    calibrated alone to ``(share epsilon, delta)``; ``samples`` synthetic records measure the
    mixture's marginals for the shift."""

    noise: _noise.GaussianNoise
    share: float
    row_bound: float
    samples: int

    @property
    def sensitivity(self) -> float:
        return math.sqrt(2.0) * self.row_bound

    @property
    def shrink(self) -> float:
        """``s``: the shift's shrinkage, ``MARGINAL_SHRINK_STDS`` noise stds (in records)."""
        return MARGINAL_SHRINK_STDS * float(self.noise.std)

    def dp_event(self) -> dp_event.DpEvent:
        return self.noise.dp_event()

    def release(self, sums: np.ndarray, seed: int) -> np.ndarray:
        """The noisy ``(d,)`` counts (once, on the driver; not clamped: unbiased)."""
        return _noise.add_noise(np.asarray(sums, dtype=np.float64), self.noise, stream(seed, MARGINAL_STAGE))

    def cluster_samples(self, sizes) -> np.ndarray:
        """``S_j = ceil(samples w_j)`` records per cluster, ``w`` the released sizes normalised
        (uniform when all are 0). Public: a function of released sizes and ``samples``."""
        w = _weights(sizes)
        return np.where(w > 0, np.ceil(self.samples * w - 1e-9), 0).astype(np.int64)

    def to_public_dict(self) -> dict:
        return {"share_of_epsilon": self.share, "sensitivity_l2": self.sensitivity, "row_bound": self.row_bound,
                "noise": self.noise.to_public_dict(), "std": self.noise.std, "shrink": self.shrink,
                "synthetic_samples": self.samples,
                "calibration": "after training, every cluster's visible biases are shifted by one vector "
                               "log((max(c, 0) + s) / (m + s)), c the noisy counts, m the mixture's "
                               "per-item marginals measured on synthetic_samples records of the released "
                               "models, s = shrink (post-processing: no budget)"}


def marginal_plan(params: DPGMParams, d: int, caller: str = "dpgm") -> MarginalPlan | None:
    """The per-item counts' plan from public parameters and ``d`` (None: ``marginal_share`` 0)."""
    share = float(params.marginal_share)
    if share <= 0.0:
        return None
    if params.model != "rbm":
        raise ParameterError(f"The 'marginal_share' parameter of {caller} applies to model='rbm' (binary "
                             f"records) only; got {params.marginal_share!r} with model={params.model!r}. "
                             "Remove it or set it to 0.")
    if params.kmeans_share + params.lengths_share + share >= 1.0:
        raise ParameterError(f"kmeans_share + length_share + marginal_share of {caller} must be below 1 "
                             f"(DP-SGD needs the rest of epsilon); got {params.kmeans_share!r} + "
                             f"{params.lengths_share!r} + {share!r}. Lower one of them.")
    # the k-means' bound on a record (_bounds: default sqrt(d)); a record in [0, 1]^d is never longer
    row_bound = min(math.sqrt(d) if params.row_bound is None else float(params.row_bound), math.sqrt(d))
    noise = gaussian_alone(float(share * params.epsilon), float(params.delta), int(d),
                           float(math.sqrt(2.0) * row_bound), caller)
    return MarginalPlan(noise, share, float(row_bound), int(params.marginal_samples))


def _weights(sizes) -> np.ndarray:
    w = np.maximum(np.asarray(sizes, dtype=np.float64), 0.0)
    if not np.any(w > 0):
        w = np.ones_like(w)
    return w / w.sum()


def column_sums(block) -> np.ndarray:
    """The ``(d,)`` column sums of a block of bounded records: dense rows, or sparse records
    (``offsets``, ``indices``, ``values``, ``d``: the protocol's ``SparseRows``)."""
    if hasattr(block, "offsets"):
        vals = None if block.values is None else np.asarray(block.values, dtype=np.float64)
        return np.bincount(np.asarray(block.indices, dtype=np.int64), weights=vals,
                           minlength=int(block.d)).astype(np.float64)
    return np.asarray(block, dtype=np.float64).sum(axis=0)


def sample_records(gen, theta: np.ndarray, n: int, rng: np.random.Generator, *, j: int = 0, lengths=None,
                   edges=None, std: float = math.nan, longest: int | None = None,
                   within: str = "exponential") -> np.ndarray:
    """``n`` records of one cluster's model ``theta`` as synthesis draws them: with the released
    ``(k, B)`` length histograms, each record's length from cluster ``j``'s (:func:`draw_lengths`;
    ``longest`` for a model with length strata), then the record given it; else the model's own."""
    drawn = None
    if lengths is not None:
        drawn = draw_lengths(lengths, edges, std, int(j), int(n), rng, longest, within)
    if drawn is None:
        return gen.sample(theta, int(n), rng)
    return gen.sample(theta, int(n), rng, lengths=drawn)


def synthetic_sums(gen, theta: np.ndarray, j: int, count: int, seed: int, d: int, *, lengths=None, edges=None,
                   std: float = math.nan, longest: int | None = None) -> np.ndarray:
    """The ``(d,)`` column sums of ``count`` records of cluster ``j``'s released model
    (:func:`sample_records`), in batches of at most ``MARGINAL_BATCH_VALUES`` values, batch ``b``
    from ``stream(seed, MARGINAL_SAMPLE_STAGE, j, b)``: a retried task draws the same records.
    Post-processing of the released model (no data)."""
    out = np.zeros(int(d))
    batch = max(1, MARGINAL_BATCH_VALUES // max(int(d), 1))
    for b, start in enumerate(range(0, int(count), batch)):
        m = min(batch, int(count) - start)
        V = sample_records(gen, theta, m, stream(seed, MARGINAL_SAMPLE_STAGE, int(j), b), j=j, lengths=lengths,
                           edges=edges, std=std, longest=longest)
        out += np.clip(V, 0.0, 1.0).sum(axis=0)
    return out


def mixture_marginals(sums, counts, sizes, n: int) -> np.ndarray:
    """``m = n sum_j w_j s_j / S_j`` (records): the per-item marginals of the mixture synthesis
    draws (cluster ``j`` with probability ``w_j``, the released sizes normalised), from each
    cluster's ``S_j = counts[j]`` sampled records' sums ``s_j`` (a cluster without samples adds
    nothing: its weight is 0)."""
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    w = _weights(sizes)
    frac = np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0)
    return float(n) * (w[:, None] * frac).sum(axis=0)


def marginal_shift(noisy_counts, marginals, shrink: float) -> np.ndarray:
    """``log((max(c, 0) + s) / (m + s))``: the one vector every cluster's visible biases move by
    (a Newton step of the exponential tilt the length-conditioned sampler makes; docs/math.md
    section 5.4)."""
    if not float(shrink) > 0.0:
        raise ParameterError(f"marginal_shift: shrink must be positive; got {shrink!r}.")
    c = np.maximum(np.asarray(noisy_counts, dtype=np.float64), 0.0)
    m = np.maximum(np.asarray(marginals, dtype=np.float64), 0.0)
    return np.log((c + float(shrink)) / (m + float(shrink)))


def shift_visible_biases(thetas: np.ndarray, shift: np.ndarray, d: int, hidden: int) -> np.ndarray:
    """A copy of the rbm parameters ``(k, dim)`` with every cluster's visible biases ``b``
    (``theta[d h : d h + d]``, :meth:`RBM.unpack`) plus ``shift``; the weights, hidden biases and
    strata offsets unchanged."""
    out = np.array(thetas, dtype=np.float64, copy=True)
    out[:, int(d) * int(hidden): int(d) * int(hidden) + int(d)] += np.asarray(shift, dtype=np.float64)
    return out
