"""The DPGM's per-item counts and the calibration of the mixture's marginals to them
(docs/research/dpgm.md, "Calibrating the marginals"; docs/math.md section 5.4).

With ``marginal_share > 0`` (rbm only) the release also noises, once on the driver, the vector of
the ``d`` column sums of the records as the k-means bounds them (for binary event records: the
number of people with each item), calibrated alone to ``(marginal_share epsilon, delta)``: a
replaced record ``x -> x'`` (both in ``[0, 1]^d`` with ``||x||_2 <= R``) moves the sums by
``x' - x``, ``||x' - x||_2^2 = ||x||^2 + ||x'||^2 - 2 x . x' <= 2 R^2``: L2 sensitivity
``sqrt(2) R`` (``sqrt(2 L)`` for records of at most ``L`` items).

After training, each cluster's task draws ``S_j`` records of its released model (as synthesis
draws them: a length from the cluster's released histogram, then the record given it), each
counted as its mean given its last hidden units and length (Rao-Blackwell), and returns their
sums and sums of squares; the driver forms the mixture's marginals ``m = n sum_j w_j s_j / S_j``
(``w`` the released sizes, normalised) with their sampling variance ``v``, estimates the models'
relative error ``tau`` from how far ``m`` is from the counts beyond the two noises (within bands
of items by marginal: the rarer items' models are further off), and shifts
every cluster's visible biases by one vector ``log((m + lambda (max(c, 0) - m) + 1) / (m + 1))``,
``lambda = tau^2 m^2 / (tau^2 m^2 + sigma^2 + v)`` (the counts are trusted as far as they are
more precise than the models: not at all where the models already meet them). Post-processing of
released values with randomness of its own: no further budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.random import stream
from sparkpriv.mechanisms.dpgm._params import (DEFAULT_LENGTH_SHARE, DEFAULT_MARGINAL_SHARE, DPGMParams,
                                               MARGINAL_SAMPLE_STAGE, MARGINAL_STAGE, max_length)
from sparkpriv.mechanisms.dpgm._lengths import draw_lengths, gaussian_alone

MARGINAL_BATCH_VALUES = 1 << 22  # a task samples at most this many values at once (32 MiB of float64)
ERROR_BANDS = 8  # the models' relative error is estimated within this many bands of items by marginal
BAND_ITEMS = 25  # ... of at least this many items each (fewer bands for fewer items)


@dataclass(frozen=True)
class MarginalPlan:
    """The per-item counts (docs/research/dpgm.md, "Calibrating the marginals"): the ``d`` column sums of
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
    def noise_var(self) -> float:
        """``sigma^2``: the variance of each noisy count (records squared)."""
        return float(self.noise.std) ** 2

    def dp_event(self) -> dp_event.DpEvent:
        return self.noise.dp_event()

    def release(self, sums: np.ndarray, seed: int) -> np.ndarray:
        """The noisy ``(d,)`` counts (once, on the driver; not clamped: unbiased)."""
        return _noise.add_noise(np.asarray(sums, dtype=np.float64), self.noise, stream(seed, MARGINAL_STAGE))

    def cluster_samples(self, sizes) -> np.ndarray:
        """:func:`cluster_samples` of this plan's ``samples``."""
        return cluster_samples(self.samples, sizes)

    def to_public_dict(self) -> dict:
        return {"share_of_epsilon": self.share, "sensitivity_l2": self.sensitivity, "row_bound": self.row_bound,
                "noise": self.noise.to_public_dict(), "std": self.noise.std,
                "synthetic_samples": self.samples,
                "calibration": "after training, every cluster's visible biases are shifted by one vector "
                               "log((m + lambda (max(c, 0) - m) + 1) / (m + 1)), c the noisy counts, m the "
                               "mixture's per-item marginals measured on synthetic_samples records of the "
                               "released models (variance v), lambda = tau^2 m^2 / (tau^2 m^2 + std^2 + v), "
                               "tau^2 the models' relative error estimated from c and m within bands of "
                               "items by m (post-processing: no budget)"}


def marginal_plan(params: DPGMParams, d: int, caller: str = "dpgm") -> MarginalPlan | None:
    """The per-item counts' plan from public parameters and ``d`` (None: ``marginal_share`` 0)."""
    share = params.marginals_share
    if share <= 0.0:
        return None
    if params.model != "rbm":
        raise ParameterError(f"The 'marginal_share' parameter of {caller} applies to model='rbm' (binary "
                             f"records) only; got {params.marginal_share!r} with model={params.model!r}. "
                             "Remove it or set it to 0.")
    if params.kmeans_share + params.lengths_share + share >= 1.0:
        raise ParameterError(f"kmeans_share + length_share + marginal_share of {caller} must be below 1 "
                             f"(DP-SGD needs the rest of epsilon); got {params.kmeans_share!r} + "
                             f"{params.lengths_share!r} + {share!r} (for the rbm length_share defaults to "
                             f"{DEFAULT_LENGTH_SHARE['rbm']} and marginal_share to {DEFAULT_MARGINAL_SHARE['rbm']}). "
                             "Lower one of them.")
    # the k-means' bound on a record (_bounds: default sqrt(d)); a record in [0, 1]^d is never longer
    row_bound = min(math.sqrt(d) if params.row_bound is None else float(params.row_bound), math.sqrt(d))
    noise = gaussian_alone(float(share * params.epsilon), float(params.delta), int(d),
                           float(math.sqrt(2.0) * row_bound), caller)
    return MarginalPlan(noise, share, float(row_bound), int(params.marginal_samples))


def cluster_samples(samples: int, sizes) -> np.ndarray:
    """``S_j = ceil(samples w_j)`` records per cluster, ``w`` the released sizes normalised
    (uniform when all are 0). Public: a function of released sizes and ``samples``."""
    w = _weights(sizes)
    return np.where(w > 0, np.ceil(int(samples) * w - 1e-9), 0).astype(np.int64)


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


def strata_longest(gen, params: DPGMParams, d: int) -> int | None:
    """The longest record a model with length strata samples (:func:`max_length`, the
    ``longest`` of :func:`sample_records`); None for a model without strata."""
    return max_length(params, d) if getattr(gen, "strata", ()) else None


def sample_records(gen, theta: np.ndarray, n: int, rng: np.random.Generator, *, j: int = 0, lengths=None,
                   edges=None, std: float = math.nan, longest: int | None = None,
                   within: str = "exponential", means: bool = False) -> np.ndarray:
    """``n`` records of one cluster's model ``theta`` as synthesis draws them: with the released
    ``(k, B)`` length histograms, each record's length from cluster ``j``'s (:func:`draw_lengths`;
    ``longest`` for a model with length strata), then the record given it; else the model's own.
    ``means`` (rbm): each record's mean given its last hidden units and length instead
    (:meth:`RBM.sample`)."""
    drawn = None
    if lengths is not None:
        drawn = draw_lengths(lengths, edges, std, int(j), int(n), rng, longest, within)
    extra = {"means": True} if means else {}
    if drawn is None:
        return gen.sample(theta, int(n), rng, **extra)
    return gen.sample(theta, int(n), rng, lengths=drawn, **extra)


def synthetic_sums(gen, theta: np.ndarray, j: int, count: int, seed: int, d: int, *, lengths=None, edges=None,
                   std: float = math.nan, longest: int | None = None) -> np.ndarray:
    """The ``(2 d,)`` column sums and sums of squares of ``count`` records of cluster ``j``'s
    released model: each record drawn as :func:`sample_records` draws it, but counted as its mean
    given its last hidden units and its length (``means``; Rao-Blackwell: the same expectation,
    without the variance of the last draw), in batches of at most ``MARGINAL_BATCH_VALUES`` values, batch ``b``
    from ``stream(seed, MARGINAL_SAMPLE_STAGE, j, b)``: a retried task draws the same records.
    Post-processing of the released model (no data)."""
    out = np.zeros(2 * int(d))
    batch = max(1, MARGINAL_BATCH_VALUES // max(int(d), 1))
    for b, start in enumerate(range(0, int(count), batch)):
        m = min(batch, int(count) - start)
        V = sample_records(gen, theta, m, stream(seed, MARGINAL_SAMPLE_STAGE, int(j), b), j=j, lengths=lengths,
                           edges=edges, std=std, longest=longest, means=True)
        V = np.clip(V, 0.0, 1.0)
        out[: int(d)] += V.sum(axis=0)
        out[int(d):] += np.einsum("ij,ij->j", V, V)
    return out


def mixture_marginals(sums, counts, sizes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(m, v)``: ``m = n sum_j w_j s_j / S_j`` (records), the per-item marginals of the mixture
    synthesis draws (cluster ``j`` with probability ``w_j``, the released sizes normalised), from
    each cluster's ``S_j = counts[j]`` sampled records' sums ``s_j`` (``sums[j, :d]``), and ``v =
    n^2 sum_j w_j^2 var_j / S_j`` its sampling variance, ``var_j`` the sample variance of cluster
    ``j``'s records (from the sums of squares ``sums[j, d:]``; 0 for a cluster of fewer than two).
    A cluster without samples adds nothing: its weight is 0."""
    sums = np.asarray(sums, dtype=np.float64)
    d = sums.shape[1] // 2
    s1, s2 = sums[:, :d], sums[:, d:]
    S = np.asarray(counts, dtype=np.float64)[:, None]
    w = _weights(sizes)[:, None]
    mean = np.divide(s1, S, out=np.zeros_like(s1), where=S > 0)
    var = np.divide(s2 - S * mean ** 2, S - 1.0, out=np.zeros_like(s1), where=S > 1)
    v = (w ** 2 * np.divide(np.maximum(var, 0.0), S, out=np.zeros_like(s1), where=S > 1)).sum(axis=0)
    return float(n) * (w * mean).sum(axis=0), float(n) ** 2 * v


def model_error(noisy_counts, marginals, noise_var: float, sampling_var) -> float:
    """``tau^2``: the models' relative error in their marginals, by the method of moments. With
    ``c_i = t_i + N(0, sigma^2)`` (the noisy count of the true ``t_i``), ``m_i`` measured with
    variance ``v_i`` and ``t_i = mu_i (1 + e_i)``, ``E e_i^2 = tau^2`` (``mu_i`` the mixture's
    marginal), ``E (c_i - m_i)^2 = tau^2 mu_i^2 + sigma^2 + v_i``, so
    ``tau^2 = max(0, sum_i ((c_i - m_i)^2 - sigma^2 - v_i) / sum_i m_i^2)`` (docs/math.md section
    5.4). A function of released values."""
    c = np.asarray(noisy_counts, dtype=np.float64)
    m = np.maximum(np.asarray(marginals, dtype=np.float64), 0.0)
    excess = ((c - m) ** 2 - float(noise_var) - np.asarray(sampling_var, dtype=np.float64)).sum()
    scale = float((m ** 2).sum())
    return max(0.0, float(excess) / scale) if scale > 0 else 0.0


def error_bands(marginals, bands: int = ERROR_BANDS, least: int = BAND_ITEMS) -> list:
    """The items in bands by marginal, the most common first: ``min(bands, d // least)`` (at least
    one) groups of (nearly) equal size of the items sorted by ``m`` (ties by index). Public: a
    function of released values."""
    m = np.asarray(marginals, dtype=np.float64)
    count = max(1, min(int(bands), m.size // max(int(least), 1)))
    return np.array_split(np.argsort(-m, kind="stable"), count)


def banded_model_error(noisy_counts, marginals, noise_var: float, sampling_var,
                       bands: int = ERROR_BANDS) -> tuple[np.ndarray, list]:
    """``(tau2, by_band)``: each item's ``tau^2``, :func:`model_error` within its band of
    :func:`error_bands` (the models' relative error grows as the items get rarer: at 4.4 M CDR
    people 1.6 % for the 50 most common towers, 12-48 % below the 150th; one ``tau`` for all is
    set by the common items and trusts the counts of the others too little), and per band (most
    common first) ``(items, tau)``."""
    c = np.asarray(noisy_counts, dtype=np.float64)
    m = np.asarray(marginals, dtype=np.float64)
    v = np.broadcast_to(np.asarray(sampling_var, dtype=np.float64), m.shape)
    tau2 = np.zeros(m.shape)
    by_band = []
    for idx in error_bands(m, bands):
        t = model_error(c[idx], m[idx], noise_var, v[idx])
        tau2[idx] = t
        by_band.append((int(idx.size), math.sqrt(t)))
    return tau2, by_band


def marginal_shift(noisy_counts, marginals, noise_var: float, sampling_var, tau2) -> np.ndarray:
    """``log((m + lambda (max(c, 0) - m) + 1) / (m + 1))``, ``lambda = tau^2 m^2 / (tau^2 m^2 +
    sigma^2 + v)``: the one vector every cluster's visible biases move by, towards the posterior
    mean of each true count given the models' marginal ``m`` (prior: relative error ``tau``, one
    per item or one for all: :func:`banded_model_error`) and
    the noisy count ``c`` (noise ``sigma^2 + v``; one record added above and below keeps an empty
    item finite). A Newton step of the exponential tilt the length-conditioned sampler makes
    (docs/math.md section 5.4); ``tau = 0`` moves nothing."""
    tau2 = np.asarray(tau2, dtype=np.float64)
    if not (float(noise_var) >= 0.0 and np.all(tau2 >= 0.0)):
        low = float(np.min(tau2)) if tau2.size else 0.0  # the lowest, not d values in the message
        raise ParameterError(f"marginal_shift: noise_var and tau2 must be >= 0; got noise_var={noise_var!r}, "
                             f"lowest tau2={low!r}.")
    c = np.maximum(np.asarray(noisy_counts, dtype=np.float64), 0.0)
    m = np.maximum(np.asarray(marginals, dtype=np.float64), 0.0)
    prior = tau2 * m ** 2
    denom = prior + float(noise_var) + np.asarray(sampling_var, dtype=np.float64)
    lam = np.divide(prior, denom, out=np.zeros_like(prior), where=denom > 0)
    return np.log((m + lam * (c - m) + 1.0) / (m + 1.0))


def shift_visible_biases(thetas: np.ndarray, shift: np.ndarray, d: int, hidden: int) -> np.ndarray:
    """A copy of the rbm parameters ``(k, dim)`` with every cluster's visible biases ``b``
    (``theta[d h : d h + d]``, :meth:`RBM.unpack`) plus ``shift``; the weights, hidden biases and
    strata offsets unchanged."""
    out = np.array(thetas, dtype=np.float64, copy=True)
    out[:, int(d) * int(hidden): int(d) * int(hidden) + int(d)] += np.asarray(shift, dtype=np.float64)
    return out


def calibration(item_counts, sums, samples_per_cluster, sizes, n: int, noise_var: float) -> tuple:
    """``(shift, public)``: the driver's part of the calibration (docs/research/dpgm.md, "Calibrating the
    marginals"). ``(m, v)`` the mixture's marginals and their sampling variance from each cluster's
    sampled sums (:func:`mixture_marginals`; ``samples_per_cluster[j]`` records of cluster ``j``),
    ``tau^2`` each item's (:func:`banded_model_error`), ``shift = marginal_shift(c, m, sigma^2, v,
    tau^2)``, and the model file's public record of it. Post-processing of released values."""
    samples_per_cluster = np.asarray(samples_per_cluster, dtype=np.int64)
    m, v = mixture_marginals(sums, samples_per_cluster, sizes, n)
    tau2, by_band = banded_model_error(item_counts, m, noise_var, v)
    shift = marginal_shift(item_counts, m, noise_var, v, tau2)
    c = np.maximum(np.asarray(item_counts, dtype=np.float64), 0.0)
    public = {"samples_per_cluster": [int(x) for x in samples_per_cluster],
              "gap_before": float(np.abs(m - c).sum() / max(c.sum(), 1.0)),
              "model_error": math.sqrt(model_error(item_counts, m, noise_var, v)),
              "model_error_by_band": [{"items": k, "tau": t} for k, t in by_band],
              "sampling_std_total": float(np.sqrt(v.sum())),
              "note": "gap_before: sum |m - c| / sum c, the mixture's per-item marginals m (measured on "
                      "samples_per_cluster synthetic records, total sampling std sampling_std_total) "
                      "against the noisy counts c; model_error: tau, the models' relative error in "
                      "their marginals estimated from c and m over all items, model_error_by_band within "
                      "bands of items by m (the most common first), each item's tau its band's; every "
                      "cluster's visible biases then moved by log((m + lambda (max(c, 0) - m) + 1) / (m + "
                      "1)), lambda = tau^2 m^2 / (tau^2 m^2 + std^2 + v) (the file's marginal_shift; "
                      "post-processing)"}
    return shift, public


def model_sums(model, j: int, count: int, seed: int) -> np.ndarray:
    """:func:`synthetic_sums` of cluster ``j`` of a released model (a ``DPGMModel``: its generator,
    length histograms and strata), ``count`` records from ``stream(seed, MARGINAL_SAMPLE_STAGE, j,
    b)``: what a release's training task computes for cluster ``j`` after training, from the model
    file alone. Post-processing."""
    gen = model.generator()
    longest = strata_longest(gen, model.params, model.d)
    return synthetic_sums(gen, np.asarray(model.thetas[int(j)], dtype=np.float64), int(j), int(count), seed,
                          model.d, lengths=model.lengths, edges=model.length_edges, std=model.length_std,
                          longest=longest)
