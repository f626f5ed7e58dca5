"""Record lengths of the DPGM: the noisy per-cluster histograms, drawing lengths from them,
the clusters' sizes as trained and the persistent chains' lengths (docs/research/dpgm.md, "Record
lengths", "Cluster sizes")."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import fit_to_epsilon
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.random import stream
from sparkpriv.mechanisms.dpgm._params import (CHAIN_STAGE, DPGMParams, LENGTH_KEEP_STDS, LENGTH_STAGE,
                                               length_strata, max_length)

if TYPE_CHECKING:
    from sparkpriv.mechanisms.dpgm._plan import DPGMPlan


def length_edges(longest: int) -> np.ndarray:
    """Bin edges ``0 = e_0 < ... < e_B = longest + 1`` of record lengths: 0 .. 7 one bin each,
    then bins about 1.25x wider each (``[8, 10), [10, 13), [13, 17), ...``). Coarse where few
    records are, so a bin's noise is small against its count. Public (from the bounds)."""
    edges, a = [0], 0
    while a <= longest:
        a = min(a + 1 if a < 8 else max(a + 1, math.ceil(a * 1.25)), longest + 1)
        edges.append(a)
    return np.asarray(edges, dtype=np.int64)


@functools.lru_cache(maxsize=64)
def gaussian_alone(epsilon: float, delta: float, cells: int, sensitivity: float, caller: str) -> _noise.GaussianNoise:
    """The discrete Gaussian of a vector of ``cells`` counts of L2 ``sensitivity``, calibrated alone
    to ``(epsilon, delta)`` (``mu = gdp_mu_for(epsilon, delta)``, lowered until dp_accounting
    agrees): the length histograms' and the per-item counts' noise."""
    from sparkpriv.mechanisms.kmeans import calibrate_stats_noise

    mu = gdp_mu_for(epsilon, delta)

    def noise(r: float) -> _noise.GaussianNoise:
        return calibrate_stats_noise(sensitivity=float(sensitivity), mu=r * mu, dim=int(cells))

    return noise(fit_to_epsilon(lambda r: noise(r).dp_event(), epsilon=epsilon, delta=delta, caller=caller))


@dataclass(frozen=True)
class LengthPlan:
    """The per-cluster histograms of record lengths (docs/research/dpgm.md, "Record lengths"): ``k`` rows of
    counts of the records of each length bin (``edges``), a vector of ``k B`` counts released
    ONCE with discrete Gaussian noise (``noise``, drawn on the driver from ``stream(seed,
    LENGTH_STAGE)``). Replace-one moves one record out of one cell and into one: L2 sensitivity
    ``sqrt(2)``; the noise is calibrated alone to ``(length_share epsilon, delta)``. A record's length
    is its number of ones (the sum of its values, rounded, capped at the longest bin)."""

    edges: np.ndarray
    noise: _noise.GaussianNoise
    share: float

    @property
    def bins(self) -> int:
        return int(self.edges.size - 1)

    def dp_event(self) -> dp_event.DpEvent:
        return self.noise.dp_event()

    def bins_of(self, sums) -> np.ndarray:
        """The length bin of records whose values sum to ``sums``: the sum rounded, at most the
        longest bin."""
        m = np.rint(np.asarray(sums, dtype=np.float64).ravel()).astype(np.int64)
        m = np.clip(m, 0, int(self.edges[-1]) - 1)
        return np.searchsorted(self.edges, m, side="right") - 1

    def histogram(self, X) -> np.ndarray:
        """Counts of the rows of ``X`` (dense or scipy sparse) per length bin: ``(B,)`` float."""
        return np.bincount(self.bins_of(X.sum(axis=1)), minlength=self.bins).astype(np.float64)

    def release(self, hist: np.ndarray, seed: int) -> np.ndarray:
        """The noisy ``(k, B)`` histograms (once, on the driver)."""
        return _noise.add_noise(np.asarray(hist, dtype=np.float64), self.noise, stream(seed, LENGTH_STAGE))

    def to_public_dict(self) -> dict:
        return {"share_of_epsilon": self.share, "edges": [int(e) for e in self.edges],
                "sensitivity_l2": math.sqrt(2.0), "noise": self.noise.to_public_dict(), "std": self.noise.std,
                "synthesis": f"bins below {LENGTH_KEEP_STDS:g} noise stds count as empty; a record's length "
                             "is drawn from its cluster's bins, within a bin from an exponential shape whose "
                             "slope comes from the neighbouring bins' densities; a cluster with no bin "
                             "left keeps its model's own lengths"}


def length_plan(params: DPGMParams, d: int, caller: str = "dpgm") -> LengthPlan | None:
    """The length histograms' plan from public parameters and ``d`` (None: ``length_share`` 0)."""
    share = params.lengths_share
    if share <= 0.0:
        return None
    if params.model != "rbm":
        raise ParameterError(f"The 'length_share' parameter of {caller} applies to model='rbm' (binary "
                             f"records) only; got {params.length_share!r} with model={params.model!r}. "
                             "Remove it or set it to 0.")
    if params.kmeans_share + share >= 1.0:
        raise ParameterError(f"kmeans_share + length_share of {caller} must be below 1 (DP-SGD needs the "
                             f"rest of epsilon); got {params.kmeans_share!r} + {share!r}. Lower either.")
    edges = length_edges(max_length(params, d))
    return LengthPlan(edges, gaussian_alone(float(share * params.epsilon), float(params.delta),
                                            int(params.k * (edges.size - 1)), math.sqrt(2.0), caller), float(share))


def _kept_bins(noisy: np.ndarray, std: float) -> np.ndarray:
    """A noisy histogram's bins as synthesis uses them: below ``LENGTH_KEEP_STDS`` noise stds, 0."""
    noisy = np.asarray(noisy, dtype=np.float64)
    return np.where(noisy >= LENGTH_KEEP_STDS * float(std), noisy, 0.0)


WITHIN_BIN = ("exponential", "uniform")  # how a length is drawn within its bin; "uniform": model files
# before format 6
SLOPE_MAX = 1.0  # |beta| at most 1: within a bin, neighbouring lengths' weights differ by at most e


def bin_slopes(w: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per bin, the slope ``beta_b`` of the log density within it (docs/math.md section 5.2,
    "Within a bin"): with ``d_b = w_b / width_b`` and bin centres ``c_b``, the central difference
    ``(log d_{b+1} - log d_{b-1}) / (c_{b+1} - c_{b-1})``; one-sided with the bin itself where one
    neighbour is empty; 0 where both are, for a bin of width 1 and for an empty bin; clipped to
    ``[-SLOPE_MAX, SLOPE_MAX]``. ``w``: kept bin counts (:func:`_kept_bins`), >= 0."""
    w = np.asarray(w, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.float64)
    width = np.diff(edges)
    centre = (edges[:-1] + edges[1:] - 1.0) / 2.0
    with np.errstate(divide="ignore"):
        logd = np.where(w > 0, np.log(np.where(w > 0, w, 1.0) / width), np.nan)
    beta = np.zeros(w.size)
    for b in np.flatnonzero((w > 0) & (width > 1)):
        left = logd[b - 1] if b > 0 else np.nan
        right = logd[b + 1] if b + 1 < w.size else np.nan
        if np.isfinite(left) and np.isfinite(right):
            beta[b] = (right - left) / (centre[b + 1] - centre[b - 1])
        elif np.isfinite(left):
            beta[b] = (logd[b] - left) / (centre[b] - centre[b - 1])
        elif np.isfinite(right):
            beta[b] = (right - logd[b]) / (centre[b + 1] - centre[b])
    return np.clip(beta, -SLOPE_MAX, SLOPE_MAX)


def _within_cdfs(w: np.ndarray, edges: np.ndarray, within: str) -> list:
    """Per bin, the cumulative distribution of ``length - lo`` within it: ``exp(beta i)``
    normalised (``within="exponential"``), or flat (``"uniform"``)."""
    if within not in WITHIN_BIN:
        raise ParameterError(f"within must be one of {', '.join(WITHIN_BIN)}; got {within!r}.")
    edges = np.asarray(edges, dtype=np.int64)
    beta = bin_slopes(w, edges) if within == "exponential" else np.zeros(edges.size - 1)
    out = []
    for b in range(edges.size - 1):
        p = np.exp(beta[b] * np.arange(int(edges[b + 1] - edges[b])))
        c = np.cumsum(p / p.sum())
        c[-1] = 1.0
        out.append(c)
    return out


def expected_length(noisy: np.ndarray, edges: np.ndarray, std: float, within: str = "exponential") -> float | None:
    """The mean length of the records :func:`synthetic_lengths` draws from this noisy histogram
    (a bin by its kept noisy count, a length within it by :func:`bin_slopes`' exponential shape,
    or uniform: ``(lo + hi - 1) / 2``); None when no bin is left. Post-processing of the
    released histogram."""
    w = _kept_bins(noisy, std)
    if not np.any(w > 0):
        return None
    edges = np.asarray(edges, dtype=np.int64)
    means = [float(edges[b]) + float(np.dot(np.diff(c, prepend=0.0), np.arange(c.size)))
             for b, c in enumerate(_within_cdfs(w, edges, within))]
    return float(np.dot(w, means) / w.sum())


def synthetic_lengths(noisy: np.ndarray, edges: np.ndarray, std: float, n: int,
                      rng: np.random.Generator, within: str = "exponential") -> np.ndarray | None:
    """``n`` record lengths from one cluster's noisy histogram (post-processing): bins below
    ``LENGTH_KEEP_STDS`` noise stds are empty, a bin by its noisy count, a length within its bin
    by the exponential shape of :func:`bin_slopes` (``within="uniform"``: uniform, as model files
    before format 6). None when no bin is left (the model keeps its own lengths)."""
    w = _kept_bins(noisy, std)
    if not np.any(w > 0):
        return None
    edges = np.asarray(edges, dtype=np.int64)
    b = rng.choice(w.size, size=int(n), p=w / w.sum())
    u = rng.random(int(n))
    cdfs = _within_cdfs(w, edges, within)
    out = np.empty(int(n), dtype=np.int64)
    for k in np.unique(b):
        sel = b == k
        i = np.searchsorted(cdfs[k], u[sel], side="right")
        out[sel] = edges[k] + np.minimum(i, cdfs[k].size - 1)
    return out


def draw_lengths(noisy: np.ndarray, edges: np.ndarray, std: float, j: int, n: int, rng: np.random.Generator,
                 longest: int | None = None, within: str = "exponential") -> np.ndarray | None:
    """``n`` lengths for cluster ``j`` from the released ``(k, B)`` histograms (post-processing):
    :func:`synthetic_lengths` of its own; with ``longest`` (a model with length strata, which needs
    lengths), when it has no bin left, of the sum of the k histograms (noise std ``sqrt(k)`` times),
    then ``longest`` for every record. None: no bin left and no ``longest``."""
    noisy = np.asarray(noisy, dtype=np.float64)
    own = synthetic_lengths(noisy[j], edges, std, int(n), rng, within)
    if own is not None or longest is None:
        return own
    pooled = synthetic_lengths(noisy.sum(axis=0), edges, float(std) * math.sqrt(noisy.shape[0]), int(n), rng,
                               within)
    return pooled if pooled is not None else np.full(int(n), int(longest), dtype=np.int64)


def cluster_sizes(kmeans_counts, noisy_lengths: np.ndarray | None, kmeans_std: float = 0.0,
                  lengths_std: float = 0.0) -> np.ndarray:
    """The public size of each cluster as its model trains on it: ``(k,)``, clamped at 0
    (post-processing of released values; docs/research/dpgm.md, "Cluster sizes"; docs/math.md section 5,
    "Which ``n_j``").

    A model trains on the k-means' last round's cluster (:func:`last_round_centres`), which the
    k-means' noisy count ``K_j`` (std ``kmeans_std``) counts. With the length histograms, the sum
    ``H_j`` of row ``j`` is a second noisy count of the same people (std ``sqrt(B) lengths_std``,
    about 3x ``kmeans_std``, independent noise), so the size is their inverse-variance weighted
    mean ``(K_j / v_K + H_j / v_H) / (1 / v_K + 1 / v_H)``, the least-variance unbiased
    combination. Without the histograms (``length_share`` 0, the vae): ``K``. Used as DP-SGD's
    ``n_pub`` (a size off by a factor ``r`` weighs the data part of the RBM's gradient by ``1 /
    r`` against the chains' part) and as the mixture weight of synthesis."""
    K = np.asarray(kmeans_counts, dtype=np.float64)
    if noisy_lengths is None:
        return np.maximum(K, 0.0)
    H = np.asarray(noisy_lengths, dtype=np.float64).sum(axis=1)
    vk, vh = float(kmeans_std) ** 2, np.asarray(noisy_lengths).shape[1] * float(lengths_std) ** 2
    if vk == 0.0 or vh == 0.0:  # one count is exact: it alone (both exact: they agree)
        return np.maximum(K if vk == 0.0 else H, 0.0)
    return np.maximum((K / vk + H / vh) / (1.0 / vk + 1.0 / vh), 0.0)


def cluster_size_std(kmeans_std: float, bins: int = 0, lengths_std: float = 0.0) -> float:
    """The noise std of :func:`cluster_sizes` (before the clamp): ``kmeans_std`` alone, or the
    inverse-variance mean's ``sqrt(1 / (1 / v_K + 1 / v_H))`` with the length histograms."""
    vk, vh = float(kmeans_std) ** 2, int(bins) * float(lengths_std) ** 2
    if vk == 0.0 or vh == 0.0:
        return math.sqrt(vk if vh == 0.0 else vh)
    return math.sqrt(1.0 / (1.0 / vk + 1.0 / vh))


def reliable_clusters(sizes, size_std: float, n: int, reliability_stds: float, min_share: float) -> np.ndarray:
    """``(k,)`` bool: cluster ``j`` is reliable when its noisy size is at least ``reliability_stds``
    noise stds AND at least ``min_share`` of the ``n`` people (docs/research/dpgm.md, "Unreliable clusters").

    A public rule on released sizes and public parameters (post-processing). Below it a cluster's
    size is indistinguishable from noise, or its model trains on so few records (an expected batch
    of ``q n_j``) that DP-SGD leaves noise: "a mixture of 10 models" whose mass sits in one cluster is
    one model, and the flags say so. Synthesis skips unreliable clusters (their weight goes to the
    others in proportion); when none is reliable, every cluster is used.
    """
    s = np.asarray(sizes, dtype=np.float64)
    ok = (s >= float(reliability_stds) * float(size_std)) & (s >= float(min_share) * float(n))
    return ok


def last_round_centres(iteration_stats):
    """``(stats, seen)``: ``iteration_stats`` that keeps, in ``seen["centres"]``, the centres of its
    last call, i.e. the centres the k-means' last round assigned with. Its clusters (the people
    nearest to them) are the ones each model trains on: the released centre is their noisy mean
    and the k-means' released count their noisy size (docs/research/dpgm.md, "Cluster sizes"). Internal,
    never released: with one k-means round they are the data-independent initial centres."""
    seen: dict = {}

    def stats(c):
        seen["centres"] = np.array(c, dtype=np.float64, copy=True)
        return iteration_stats(c)

    return stats, seen


def chain_lengths(plan: "DPGMPlan", noisy_lengths: np.ndarray | None, seed: int) -> np.ndarray | None:
    """``(k, chains)`` fixed lengths of each cluster's persistent chains for an rbm with length
    strata (None otherwise): :func:`draw_lengths` from ``stream(seed, CHAIN_STAGE, j)``, like the
    lengths synthesis draws. Post-processing of the released histograms: public."""
    params, lp = plan.params, plan.lengths
    if not length_strata(params, plan.d) or lp is None or noisy_lengths is None:
        return None
    longest = max_length(params, plan.d)
    return np.stack([draw_lengths(noisy_lengths, lp.edges, lp.noise.std, j, params.chains,
                                  stream(seed, CHAIN_STAGE, j), longest) for j in range(params.k)])
