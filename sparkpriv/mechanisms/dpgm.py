"""DP mixture of generative models (Acs et al., Alg. 1 and 4; docs/math.md section 5).

1. DP k-means (:mod:`~sparkpriv.mechanisms.kmeans`, ``linear`` variant on the
   declared box ``[0, 1]^d`` and row bound) partitions the records: a model
   trains on its last round's cluster (the records nearest to the centres
   that round assigned with, :func:`last_round_centres`), whose noisy mean
   and count are the released centre and size. The assignment is internal
   (never released).
2. One generative model per cluster (:class:`~sparkpriv.mechanisms.rbm.RBM`
   for binary records, :class:`~sparkpriv.mechanisms.vae.VAE` for binary or
   continuous columns), trained with DP-SGD (:mod:`~sparkpriv.mechanisms.dpsgd`)
   at ONE public sampling rate ``q`` and ONE number of steps ``T`` for every
   cluster, normalised by the cluster's noisy size (public). An RBM starts from
   its cluster's released centre projected onto the box points of mass at most
   the cluster's released mean length (:func:`visible_init`; docs/dpgm.md,
   "The RBM's starting point"). With ``min_batch``
   a cluster makes ``m_j`` of its ``T`` steps at once (its own rate ``m_j q``,
   ``m_j`` from its noisy size; docs/dpgm.md, "Per-cluster sampling rates"):
   each step keeps its own batch and noise, so the event is the same.
3. Released: the k models' parameters, the noisy cluster sizes
   (:func:`cluster_sizes`), the k-means centres and (rbm, by default) each cluster's noisy
   histogram of record lengths (the number of ones of a record, in bins;
   :class:`LengthPlan`), which synthesis draws each record's length from, in a versioned ``.npz`` file
   (:meth:`DPGMModel.save`), with the source's column types (its schema,
   public). :func:`synthesize` samples a cluster by noisy size, then a record
   from that cluster's model (post-processing: no budget);
   :func:`synthesize_table` gives the records as a table in the source's
   column types.

Privacy (replace-one; ``n`` public)
-----------------------------------
The release is ``Composed[k-means event, lengths event, SelfComposed(PoissonSampled(q,
Gaussian(sigma / 2)), T)]``. The lengths event (when ``length_share > 0``) is one
Gaussian on the k histograms of record lengths, calibrated alone to ``length_share
epsilon``: a replaced record leaves one (cluster, length bin) cell and enters one,
L2 sensitivity ``sqrt(2)``. The k-means part is as in section 4. Training:
if the replaced record ``x`` and its replacement ``x'`` fall in the same
cluster, that cluster's training sees a replace-one change, dominated step by
step by a Poisson-sampled Gaussian of sensitivity ``2C`` (dpsgd module
docstring). If they fall in clusters ``a != b``, cluster ``a`` loses a record and
``b`` gains one; step ``t`` of both clusters together is one mechanism on the
pair of data sets whose output pair is ``P = (1-q) A + q B``, ``Q = (1-q) A +
q B'`` with ``A`` the product of the two clusters' outputs without the record,
``B`` with ``x`` sampled in ``a``, ``B'`` with ``x'`` sampled in ``b``:
``||B - B'|| <= sqrt(2) C``, ``||B - A|| <= C``. The same argument bounds it by
the sensitivity-``2C`` pair. Every cluster runs the same ``(q, sigma, T)``,
so either case is the event above: the "maximum over clusters" of
docs/math.md is attained by every cluster (parallel composition). A cluster
that makes ``m_j`` steps per update (``min_batch``) releases the same ``T``
noisy sums and adds them (post-processing); pairing step ``u`` of cluster ``a``
with step ``u`` of cluster ``b`` covers two clusters with different ``m``
(docs/math.md section 5, "Per-cluster rates as batches of base steps"). The
assignment depends on the data only through the centres the k-means' last
round assigned with (post-processing of its earlier rounds, or data-independent
for one round), and clusters never exchange anything.

The noise multiplier ``sigma`` is calibrated on the composition, so the
accountant's epsilon of the whole release is at most the request.

Quantile clipping (``clip_quantile``; docs/math.md section 5.1): each step also
releases the noisy count of unclipped gradients and the clip follows the
target quantile; the step event becomes ``PoissonSampled(q, Gaussian(z))``,
``z = max(4/sigma^2 + 1/sigma_b^2, 2/sigma^2 + 2/sigma_b^2)^(-1/2)`` (the
second term: the two records in different clusters), calibrated the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpsgd
from sparkpriv.mechanisms import protocol as _proto
from sparkpriv.mechanisms.column_types import SYNTHETIC_TYPES, synthetic_arrays, synthetic_type
from sparkpriv.mechanisms.event_columns import EventColumns
from sparkpriv.mechanisms.kmeans import (cluster_stats, fit_from_stats, initial_centres,
                                         make_feature_map, plan_kmeans, KMeansPlan)
from sparkpriv.mechanisms.rbm import RBM, STRATA_LR
from sparkpriv.mechanisms.vae import VAE
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import RunningEpsilon, compose, epsilon_of, fit_to_epsilon
from sparkpriv.privacy.calibration import gdp_mu_for
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.privacy.random import new_secret_seed, stream

__all__ = ["MODELS", "FORMAT_VERSION", "MODEL_FILE", "DPGMParams", "DPGMPlan", "DPGMModel", "calibrate_dpgm",
           "cluster_sizes", "requested_event", "plan_for_rows", "plan_dpgm", "fit_dpgm_array", "assign_clusters",
           "train_clusters", "assign_sparse", "synthesize", "synthesize_part", "synthesize_table", "synthetic_type",
           "synthetic_arrays", "SYNTHETIC_TYPES", "query_spread", "QuerySpread", "answer_dense",
           "DPGM", "DPGM_MECHANISM"]

MODELS = ("rbm", "vae")
# 7: each model trains on the k-means' last round's cluster (:func:`last_round_centres`), which the
# k-means' noisy count and the length histograms both count, and "sizes" are their inverse-variance
# mean (:func:`cluster_sizes`); the file's layout is that of 6;
# 6: "sizes" are the clusters' sizes as trained (:func:`cluster_sizes`: the length histograms' sums when
# released), and a length is drawn within its bin from an exponential shape (the header's lengths'
# "within_bin"); before, the k-means' counts and uniform (read as written: an older file's synthesis
# is unchanged);
# 5: the rbm's length strata (the params' "length_strata", resolved; thetas hold the offsets A);
# 4: the per-cluster noisy histograms of record lengths ("lengths", with the header's "length_edges");
# 3: the header holds the event columns of a release on event records (None for a table); 2: the
# source's column types; 1 (read as all double) had none
FORMAT_VERSION = 7
READ_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
MODEL_FILE = "_dpgm_model.npz"  # the released model, published with the release's table
SYNTH_STAGE = 31  # stream(seed, SYNTH_STAGE, j) samples cluster j's synthetic records
LENGTH_STAGE = 25  # stream(seed, LENGTH_STAGE): the noise of the length histograms, drawn once on the driver
CHAIN_STAGE = 26  # stream(seed, CHAIN_STAGE, j): the fixed lengths of cluster j's persistent chains (public draw)
# the rbm's default length strata (interior edges; docs/dpgm.md, "Length strata")
DEFAULT_LENGTH_STRATA = (3, 6, 13)
# a cluster trains its strata offsets when the noise of its averaged gradient is at most this
STRATA_NOISE_MAX = 0.03
# share of epsilon the histograms of record lengths are calibrated to (docs/dpgm.md, "Record lengths")
DEFAULT_LENGTH_SHARE = {"rbm": 0.1, "vae": 0.0}
LENGTH_KEEP_STDS = 2.0  # synthesis: a noisy bin below this many noise stds counts as empty
_POS = Interval("real", 0, None, "neither")
DEFAULT_LEARNING_RATE = {"rbm": 0.002, "vae": 0.01}  # docs/dpgm.md, "Training: a first study"
# the share of the last iterates each model is released as the mean of (docs/dpgm.md, "Training: a second
# study"; the vae's last iterate: "MNIST: samples and classifier accuracy")
DEFAULT_AVERAGE_TAIL = {"rbm": 0.5, "vae": 0.0}
# the rbm's default rate grows with the noise of a cluster's averaged gradient, tau = sigma C / (q n_j),
# from LR_NOISE_REF up, by at most LR_MAX_FACTOR (docs/dpgm.md, "Training: a first study")
LR_NOISE_REF = 0.03
LR_MAX_FACTOR = 5.0


@dataclass(frozen=True, kw_only=True)
class DPGMParams(_proto.Params):
    """Public parameters of a DPGM release (fields made with the protocol's ``option``)."""

    epsilon: float = _proto.option(help="the total epsilon of the release (k-means + DP-SGD)", constraints=[_POS])
    delta: float = _proto.option(help="the total delta of the release, in (0, 1) (at most 1/n is advised)",
                                 constraints=[Interval("real", 0, 1, "neither")])
    k: int = _proto.option(10, help="clusters of the DP k-means (2 .. floor(sqrt(rows)))",
                           constraints=[Interval("integer", 2, None, "left")])
    model: str = _proto.option("rbm", help="generative model per cluster: rbm (binary records) or vae",
                               constraints=[Options(MODELS)])
    kmeans_share: float = _proto.option(0.3, help="share of epsilon the k-means is calibrated to (DP-SGD "
                                        "gets the rest of the composition)",
                                        constraints=[Interval("real", 0, 1, "neither")])
    length_share: float | None = _proto.option(
        None, help="share of epsilon the per-cluster histograms of record lengths (number of ones) are "
        "calibrated to, in [0, 1); synthesis draws each record's length from them, then the model's record "
        "given it (rbm only; 0: none, the model's own lengths)", doc_default="rbm: 0.1; vae: 0",
        constraints=[Interval("real", 0, 1, "left")])
    length_strata: tuple | None = _proto.option(
        None, help="rbm with length histograms: interior edges e_1 < e_2 < ... (integers >= 1, at most the "
        "longest record L) of the record-length strata [0, e_1), [e_1, e_2), ..., [e_last, L]; each stratum "
        "adds its own offset to the visible biases and the model is trained given the lengths (docs/dpgm.md, "
        "'Length strata'); 0: none", doc_default="3,6,13 (rbm with length histograms); none otherwise",
        kind="floats")
    kmeans_iterations: int = _proto.option(8, help="Lloyd iterations of the k-means",
                                           constraints=[Interval("integer", 1, 1000, "both")])
    row_bound: float | None = _proto.option(None, help="declared L2 bound on a record (binary records with at "
                                            "most L items: sqrt(L))", doc_default="sqrt(d)", constraints=[_POS])
    clip: float = _proto.option(10.0, help="per-example gradient clip C of DP-SGD (with clip_quantile: the "
                                "starting clip C_0)", constraints=[_POS])
    clip_quantile: float | None = _proto.option(
        None, help="quantile clipping (Andrew et al. 2021): each cluster's clip follows this quantile of the "
        "gradient norms, in (0, 1), from private counts (accounted); unset: the declared clip",
        doc_default="declared clip", constraints=[Interval("real", 0, 1, "neither")])
    clip_lr: float = _proto.option(0.2, help="quantile clipping: learning rate eta of the geometric clip update "
                                   "C <- C exp(-eta (b - clip_quantile))",
                                   constraints=[Interval("real", 0, 10, "right")])
    clip_count_share: float = _proto.option(
        0.05, help="quantile clipping: share of each DP-SGD step's privacy (1/z^2) spent on the count of "
        "unclipped gradients, in (0, 1/3]", constraints=[Interval("real", 0, dpsgd.MAX_COUNT_SHARE, "right")])
    sampling_rate: float = _proto.option(0.05, help="Poisson sampling rate q of DP-SGD (every cluster)",
                                         constraints=[Interval("real", 0, 1, "right")])
    epochs: float = _proto.option(20.0, help="passes over the data: steps T = ceil(epochs / q)",
                                  constraints=[_POS])
    min_batch: int | None = _proto.option(
        None, help="per-cluster sampling rates: a cluster whose expected batch q n_j (n_j its noisy size) is "
        "below this makes m_j = ceil(min_batch / (q n_j)) of the T steps at once (at most T): rate m_j q, "
        "ceil(T / m_j) updates, the same privacy (docs/dpgm.md, 'Per-cluster sampling rates'); unset: every "
        "cluster at q", doc_default="every cluster at q", constraints=[Interval("integer", 1, None, "left")])
    learning_rate: float | None = _proto.option(
        None, help="Adam learning rate, every cluster; unset: for rbm 0.002, raised up to 0.01 for a noisy "
        "(small) cluster (docs/dpgm.md, 'Training: a first study'); for vae 0.01",
        doc_default="rbm: 0.002 .. 0.01 by cluster; vae: 0.01", constraints=[_POS])
    lr_schedule: str = _proto.option("constant", help="the learning rate over the steps: constant, or falling "
                                     "linearly or along a half cosine towards 0", constraints=[Options(dpsgd.SCHEDULES)])
    average_tail: float | None = _proto.option(
        None, help="release each model as the mean of its last ceil(average_tail T) iterates (Polyak-Ruppert; "
        "post-processing), in [0, 1); 0: the last iterate; unset: the model's default (docs/dpgm.md, "
        "'Training: a second study')", doc_default="rbm: 0.5; vae: 0",
        constraints=[Interval("real", 0, 1, "left")])
    hidden: int = _proto.option(64, help="hidden units (rbm) or hidden layer width (vae; the paper: 200)",
                                constraints=[Interval("integer", 1, 100_000, "both")])
    latent: int = _proto.option(2, help="vae latent dimension", constraints=[Interval("integer", 1, 1000, "both")])
    chains: int = _proto.option(100, help="rbm persistent chains",
                                constraints=[Interval("integer", 1, 1_000_000, "both")])
    gibbs_steps: int = _proto.option(1, help="rbm Gibbs sweeps per update",
                                     constraints=[Interval("integer", 1, 1000, "both")])
    accountant: str = _proto.option("pld", help="accountant used to calibrate the noise multiplier",
                                    constraints=[Options(dpsgd.ACCOUNTANTS)])
    neighbors: str = _proto.option("replace-one", help="neighbour relation: replace-one (n is public; the "
                                   "k-means rule k <= floor(sqrt(n)) uses it)", kind="neighbors")
    columns: tuple | None = _proto.option(None, help="numeric columns of the records, values in [0, 1] (binary "
                                          "for rbm; values outside are clipped to the declared box)", kind="strs")
    fill: float | None = _proto.option(None, help="public value that replaces nulls in the columns",
                                       constraints=[Interval("real", 0, 1, "both")])

    @property
    def steps(self) -> int:
        return int(math.ceil(self.epochs / self.sampling_rate))

    @property
    def lr(self) -> float:
        """The Adam learning rate used: ``learning_rate``, or the model's default when unset."""
        return float(self.learning_rate) if self.learning_rate is not None else DEFAULT_LEARNING_RATE[self.model]

    @property
    def tail(self) -> float:
        """The share of the last iterates averaged: ``average_tail`` or the model's default."""
        return float(self.average_tail) if self.average_tail is not None else DEFAULT_AVERAGE_TAIL[self.model]

    @property
    def lengths_share(self) -> float:
        """The share of epsilon of the length histograms used: ``length_share`` or the model's default."""
        return float(self.length_share) if self.length_share is not None else DEFAULT_LENGTH_SHARE[self.model]


def length_strata(params: DPGMParams, d: int, caller: str = "dpgm") -> tuple:
    """The rbm's interior strata edges as ints (``()``: none): ``length_strata``, or
    :data:`DEFAULT_LENGTH_STRATA` for an rbm with length histograms (edges above the longest record
    ``L`` dropped), none otherwise. Refuses edges that are not increasing integers in ``[1, L]``,
    and strata without length histograms. Public parameters only."""
    v = params.length_strata
    has_lengths = params.model == "rbm" and params.lengths_share > 0.0
    if v is None:
        if not has_lengths:
            return ()
        longest = max_length(params, d)
        return tuple(e for e in DEFAULT_LENGTH_STRATA if e <= longest)
    vals = (v,) if isinstance(v, (int, float)) else tuple(v)
    if not vals or (len(vals) == 1 and float(vals[0]) == 0.0):
        return ()
    if not has_lengths:
        raise ParameterError(f"The 'length_strata' parameter of {caller} applies to model='rbm' with length "
                             f"histograms (length_share > 0); got {v!r} with model={params.model!r}, "
                             f"length_share={params.lengths_share!r}. Remove it or set it to 0.")
    longest = max_length(params, d)
    if any(not float(e).is_integer() for e in vals) or any(float(e) < 1 for e in vals) \
            or any(float(b) <= float(a) for a, b in zip(vals, vals[1:])) or float(vals[-1]) > longest:
        raise ParameterError(f"The 'length_strata' parameter of {caller} must be increasing integers from 1 to "
                             f"the longest record L = {longest} (e.g. 3,6,13), or 0 for none; got {v!r}.")
    return tuple(int(e) for e in vals)


def max_length(params: DPGMParams, d: int) -> int:
    """The longest record (most ones) the declared bounds admit: ``floor(row_bound^2)`` (binary
    records with at most ``L`` items: ``L``), at most ``d``."""
    rb = math.sqrt(d) if params.row_bound is None else float(params.row_bound)
    return int(min(d, math.floor(rb * rb + 1e-6)))


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
def _length_noise(epsilon: float, delta: float, cells: int, caller: str) -> _noise.GaussianNoise:
    from sparkpriv.mechanisms.kmeans import calibrate_stats_noise

    mu = gdp_mu_for(epsilon, delta)

    def noise(r: float) -> _noise.GaussianNoise:
        return calibrate_stats_noise(sensitivity=math.sqrt(2.0), mu=r * mu, dim=int(cells))

    return noise(fit_to_epsilon(lambda r: noise(r).dp_event(), epsilon=epsilon, delta=delta, caller=caller))


@dataclass(frozen=True)
class LengthPlan:
    """The per-cluster histograms of record lengths (docs/dpgm.md, "Record lengths"): ``k`` rows of
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
    return LengthPlan(edges, _length_noise(float(share * params.epsilon), float(params.delta),
                                           int(params.k * (edges.size - 1)), caller), float(share))


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
    (post-processing of released values; docs/dpgm.md, "Cluster sizes"; docs/math.md section 5,
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


def last_round_centres(iteration_stats):
    """``(stats, seen)``: ``iteration_stats`` that keeps, in ``seen["centres"]``, the centres of its
    last call, i.e. the centres the k-means' last round assigned with. Its clusters (the people
    nearest to them) are the ones each model trains on: the released centre is their noisy mean
    and the k-means' released count their noisy size (docs/dpgm.md, "Cluster sizes"). Internal,
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


def _make_model(params: DPGMParams, d: int):
    if params.model == "rbm":
        return RBM(d, params.hidden, gibbs_steps=params.gibbs_steps, chains=params.chains,
                   strata=length_strata(params, d))
    length_strata(params, d)  # refuses strata for the vae
    return VAE(d, params.hidden, params.latent)


@dataclass(frozen=True)
class DPGMPlan:
    """Everything public about a calibrated DPGM release (no secrets, no data)."""

    params: DPGMParams
    n: int
    d: int
    kmeans: KMeansPlan
    noise_multiplier: float
    step_noise: _noise.GaussianNoise
    epsilon_accounted: float = math.nan  # epsilon_of(dp_event(), delta), computed once by plan_dpgm
    # True (the protocol's release): the recorded step event is Gaussian(sigma / 2) at the calibrated
    # sigma, fixed before n is known; the realized noise (grid from n) has a multiplier at least that
    requested_event: bool = False
    # quantile clipping (params.clip_quantile set): the noise of each step's clipped count; step_noise
    # is then dpsgd.gradient_noise, on the clipped sum over the public C_t (multiplier >= sigma)
    count_noise: _noise.GaussianNoise | None = None
    lengths: LengthPlan | None = None  # the length histograms (None: length_share 0)

    @property
    def steps(self) -> int:
        return self.params.steps

    @property
    def quantile(self) -> bool:
        return self.params.clip_quantile is not None

    def count_std(self) -> float:
        """The count noise's std in the recorded event: the calibrated ``sigma_b`` (requested) or
        the realized noise's multiplier (at least that)."""
        if self.requested_event or self.count_noise is None:
            return dpsgd.count_noise_std(self.noise_multiplier, self.params.clip_count_share)
        return float(self.count_noise.dp_event().noise_multiplier)

    def training_event(self, steps: int | None = None) -> dp_event.DpEvent:
        """The DP-SGD event of ``steps`` (default ``T``) steps of one cluster."""
        steps = self.steps if steps is None else int(steps)
        if self.quantile:
            return dpsgd.quantile_event(self.params.sampling_rate, self.noise_multiplier, self.count_std(), steps)
        step = None if self.requested_event else self.step_noise.dp_event()
        return dpsgd.dpsgd_event(self.params.sampling_rate, self.noise_multiplier, steps, step_event=step)

    def dpsgd_event(self) -> dp_event.DpEvent:
        return self.training_event()

    def adaptive(self) -> dpsgd.QuantileClip | None:
        """The quantile-clipping settings of :func:`dpsgd.train` (None: the declared clip)."""
        if not self.quantile:
            return None
        return dpsgd.QuantileClip(float(self.params.clip_quantile), float(self.params.clip_lr), self.step_noise,
                                  self.count_noise)

    def dp_event(self) -> dp_event.DpEvent:
        return compose(_base_events(self.kmeans, self.lengths) + [self.dpsgd_event()])

    def batches_for(self, n_pub: float) -> int:
        """``m``, the base steps a cluster of public (noisy) size ``n_pub`` makes at once (its
        rate ``m q``; docs/dpgm.md, "Per-cluster sampling rates"): 1 without ``min_batch``, else
        ``ceil(min_batch / (q max(n_pub, 1)))`` clamped to ``[1, T]``. Public: a function of the
        released size and declared parameters; the release's event does not depend on it."""
        p = self.params
        if p.min_batch is None:
            return 1
        want = float(p.min_batch) / (p.sampling_rate * max(float(n_pub), 1.0))
        return int(min(max(math.ceil(want - 1e-9), 1), self.steps))

    def batches(self, sizes) -> list:
        """Each cluster's ``m`` (:meth:`batches_for` of its noisy size): the model's record."""
        return [self.batches_for(max(float(s), 1.0)) for s in sizes]

    def learning_rate_for(self, n_pub: float) -> float:
        """Adam's rate for a cluster of public (noisy) size ``n_pub``: the declared
        ``learning_rate`` when set (every cluster), else the model's default; for the rbm the
        default grows with the per-coordinate noise of the averaged gradient of an update, ``tau
        = sigma C / (sqrt(m) q max(n_pub, 1))`` (``m`` = :meth:`batches_for`; 1 unless
        ``min_batch``): ``0.002 min(max(tau / LR_NOISE_REF, 1), LR_MAX_FACTOR)``. Adam
        divides each coordinate's step by its gradient's root mean square, so where noise
        dominates, the signal's step is about ``lr signal / tau``: a fixed rate that suits a
        large cluster (0.002; 0.01 makes the persistent chains diverge) barely moves a small,
        noisy one. Public: a function of released sizes and declared parameters."""
        p = self.params
        if p.learning_rate is not None or p.model != "rbm":
            return p.lr
        return p.lr * min(max(self.gradient_noise_for(n_pub) / LR_NOISE_REF, 1.0), LR_MAX_FACTOR)

    def gradient_noise_for(self, n_pub: float) -> float:
        """``tau = sigma C / (sqrt(m) q max(n_pub, 1))``: the per-coordinate noise of an update's
        averaged gradient for a cluster of public (noisy) size ``n_pub`` (``C`` the declared or
        starting clip). Public."""
        p = self.params
        m = self.batches_for(n_pub)
        return self.noise_multiplier * p.clip / (math.sqrt(m) * p.sampling_rate * max(float(n_pub), 1.0))

    def strata_for(self, n_pub: float) -> bool:
        """Whether a cluster of public size ``n_pub`` trains its length strata: the model has strata
        and the cluster's gradient noise ``tau`` (:meth:`gradient_noise_for`) is at most
        :data:`STRATA_NOISE_MAX`. A noisier cluster trains the plain RBM (its offsets stay 0, its
        chains are free): there the offsets would be mostly noise (docs/dpgm.md, "Length strata").
        Public: a function of released sizes and declared parameters."""
        return bool(length_strata(self.params, self.d)) and self.gradient_noise_for(n_pub) <= STRATA_NOISE_MAX

    def strata_trained(self, sizes) -> list:
        """Per cluster, :meth:`strata_for` of its noisy size: the model's record."""
        return [self.strata_for(max(float(s), 1.0)) for s in sizes]

    def learning_rates(self, sizes) -> list:
        """Each cluster's rate (:meth:`learning_rate_for` of its noisy size): the model's record."""
        return [self.learning_rate_for(max(float(s), 1.0)) for s in sizes]

    def epsilon_spent(self) -> float:
        if math.isnan(self.epsilon_accounted):
            return epsilon_of(self.dp_event(), self.params.delta)
        return self.epsilon_accounted

    def strata_public(self) -> dict | None:
        """The rbm's length strata as the model file states them (None: none)."""
        edges = length_strata(self.params, self.d)
        if not edges:
            return None
        return {"interior_edges": list(edges), "strata": len(edges) + 1, "offsets_learning_rate_factor": STRATA_LR,
                "chains": f"each cluster's {self.params.chains} persistent chains keep fixed lengths drawn from "
                          "its released length histogram (stream CHAIN_STAGE; post-processing)",
                "noisy_clusters": f"a cluster whose averaged gradient's noise sigma C / (sqrt(m) q n_j) exceeds "
                                  f"{STRATA_NOISE_MAX:g} trains the plain RBM (offsets 0, free chains); the "
                                  "model's strata_trained says which",
                "note": "each stratum's offsets A_s are added to the visible biases of records of its lengths; "
                        "they are parameters like the others: in the per-example gradient, clipped and noised "
                        "(no extra privacy cost)"}

    def to_public_dict(self) -> dict:
        out = {
            "mechanism": "dpgm", "neighbors": "replace-one", "n": self.n, "d": self.d,
            "params": self.params.public_dict(), "steps": self.steps,
            "learning_rate": (self.params.lr if self.params.learning_rate is not None or self.params.model != "rbm"
                              else f"by cluster: {self.params.lr} min(max(sigma C / (sqrt(m_j) q n_j) / "
                                   f"{LR_NOISE_REF}, 1), {LR_MAX_FACTOR:g}), n_j the noisy size, m_j the cluster's "
                                   "batches per update (the model's learning_rates)"),
            "batches_per_update": ("1 for every cluster" if self.params.min_batch is None else
                                   f"by cluster: m_j = min(max(ceil({self.params.min_batch} / (q n_j)), 1), T), "
                                   "n_j the noisy size; cluster j makes m_j of the T steps at once, each with its "
                                   "own batch and noise, their noisy sums added (the model's batches)"),
            "noise_multiplier": self.noise_multiplier,
            "step_noise": self.step_noise.to_public_dict(),
            "kmeans": self.kmeans.to_public_dict(),
            "lengths": None if self.lengths is None else self.lengths.to_public_dict(),
            "length_strata": self.strata_public(),
            "epsilon_spent": self.epsilon_spent(), "delta": self.params.delta,
            "accounting": accounting_note(self.params),
        }
        if self.quantile:
            out["quantile_clipping"] = {
                "count_noise_std": self.count_std(), "step_multiplier": dpsgd.quantile_step_multiplier(
                    self.noise_multiplier, self.count_std()),
                "count_noise": None if self.count_noise is None else self.count_noise.to_public_dict(),
                "step_noise": "step_noise above is added to the clipped sum divided by the step's clip C_t "
                              "(sensitivity 1), the result multiplied by C_t: std noise_multiplier * C_t"}
        return out


def _base_events(kplan: KMeansPlan, lplan: LengthPlan | None) -> list:
    """The events before DP-SGD's: the k-means, then the length histograms (when released)."""
    return [kplan.dp_event()] + ([] if lplan is None else [lplan.dp_event()])


def accounting_note(params: DPGMParams) -> str:
    """The receipt's one-line statement of the accounting."""
    batches = ("" if params.min_batch is None else
               "; per-cluster rates (min_batch): a cluster makes m_j of its T steps at once (each step's own "
               "batch and noise, the noisy sums added: post-processing of the same T steps)")
    head = "Composed[k-means, lengths, " if params.lengths_share > 0 else "Composed[k-means, "
    lengths = ("; lengths: one Gaussian on the k histograms of record lengths (L2 sensitivity sqrt(2): a "
               "replaced record leaves one cell and enters one), calibrated to length_share epsilon"
               if params.lengths_share > 0 else "")
    if params.clip_quantile is None:
        return (head + "SelfComposed(PoissonSampled(q, Gaussian(sigma/2)), T)]: every cluster "
                "trains with the same (q, sigma, T) (parallel composition); replace-one is dominated by an "
                "add/remove step of sensitivity 2C" + lengths + batches)
    return (head + "SelfComposed(PoissonSampled(q, Gaussian(z)), T)], quantile clipping: each step "
            "releases the clipped sum (noise sigma C_t) and the count of unclipped gradients (noise sigma_b), "
            "z = max(4/sigma^2 + 1/sigma_b^2, 2/sigma^2 + 2/sigma_b^2)^(-1/2) (replace-one, records in the "
            "same or in different clusters); every cluster trains with the same (q, sigma, sigma_b, T) "
            "(parallel composition); C_t is post-processing of released counts (docs/math.md section 5.1)" + lengths
            + batches)


class _Relations:
    """What DPGM declares (the protocol's ``resolve_neighbors`` reads it)."""

    title = "DPGM"
    neighbors = (_proto.REPLACE_ONE,)
    refused_neighbors = {"add-remove": "its k-means takes n as public (k <= floor(sqrt(n)) and the noise "
                                       "grid's cap), and one DP-SGD rate and step count for every cluster "
                                       "is calibrated for replace-one"}
    row_level = False


def _bounds(params: DPGMParams, d: int, caller: str) -> Bounds:
    """The declared domain of the k-means: the box [0, 1]^d and the row bound (default sqrt(d))."""
    row_bound = math.sqrt(d) if params.row_bound is None else float(params.row_bound)
    return Bounds(d, (0.0,) * d, (1.0,) * d, row_bound, "l2", None, _caller=caller)


def calibrate_dpgm(params: DPGMParams, d: int, caller: str = "dpgm") -> tuple[KMeansPlan, float]:
    """The k-means plan and the DP-SGD noise multiplier ``sigma`` from public parameters and ``d``
    only (no row count): the accounting of the release is fixed by them (docs/math.md section 5)."""
    params.validate(caller)
    _proto.resolve_neighbors(params.neighbors, _Relations, caller)
    check_param("d", d, [Interval("integer", 1, None, "left")], caller)
    fmap = make_feature_map("linear", _bounds(params, d, caller), caller=caller)
    lplan = length_plan(params, d, caller)
    kplan = plan_kmeans(fmap, k=params.k, epsilon=params.kmeans_share * params.epsilon, delta=params.delta,
                        iterations=params.kmeans_iterations, caller=caller)
    share = None if params.clip_quantile is None else params.clip_count_share
    sigma = dpsgd.calibrate_noise_multiplier(
        epsilon=params.epsilon, delta=params.delta, sampling_rate=params.sampling_rate, steps=params.steps,
        neighbors="replace-one", accountant=params.accountant, base_event=compose(_base_events(kplan, lplan)),
        count_share=share, caller=caller)
    return kplan, float(sigma)


def requested_event(params: DPGMParams, kplan: KMeansPlan, sigma: float, d: int | None = None) -> dp_event.DpEvent:
    """The event of the release at the calibrated ``sigma``: what the protocol records before any
    data is read (the realized discrete noise has a multiplier at least ``sigma / 2``; with quantile
    clipping, the step event of :func:`dpsgd.quantile_event` at ``sigma`` and the count's
    ``sigma_b = count_noise_std(sigma, clip_count_share)``). ``d`` (the columns) is needed when
    the length histograms are released (``length_share > 0``)."""
    if params.lengths_share > 0 and d is None:
        raise ParameterError("requested_event: give d (the columns): the length histograms' event depends on it.")
    base = _base_events(kplan, None if d is None else length_plan(params, int(d)))
    if params.clip_quantile is not None:
        return compose(base + [dpsgd.quantile_event(
            params.sampling_rate, sigma, dpsgd.count_noise_std(sigma, params.clip_count_share), params.steps)])
    return compose(base + [dpsgd.dpsgd_event(params.sampling_rate, sigma, params.steps)])


def plan_for_rows(params: DPGMParams, kplan: KMeansPlan, sigma: float, *, n: int, d: int, caller: str = "dpgm",
                  requested: bool = False, accounted: float | None = None) -> DPGMPlan:
    """The DPGM plan for ``n`` rows (public under replace-one): the k rule and the step noise, whose
    grid holds a coordinate of a clipped sum of at most ``n`` rows (``n C``). ``requested``: record
    the calibrated multiplier (the protocol's release), not the realized noise's; ``accounted``: its
    epsilon, when already computed (``epsilon_of(requested_event(...), delta)``)."""
    check_param("n", n, [Interval("integer", 1, None, "left")], caller)
    from sparkpriv.mechanisms.kmeans import check_k_for_n

    check_k_for_n(params.k, n, caller)
    dim = _make_model(params, d).dim
    cnoise = None
    if params.clip_quantile is None:
        noise = dpsgd.step_noise(clip=params.clip, noise_multiplier=sigma, dim=dim, max_abs=float(n) * params.clip)
        low = noise.dp_event().noise_multiplier < sigma / 2
    else:  # the noise of sum / C_t (std sigma; sigma C_t on the sum) and the count's
        noise = dpsgd.gradient_noise(noise_multiplier=sigma, dim=dim, max_rows=int(n))
        cstd = dpsgd.count_noise_std(sigma, params.clip_count_share)
        cnoise = dpsgd.count_noise(count_std=cstd, max_rows=int(n))
        low = noise.dp_event().noise_multiplier < sigma or cnoise.dp_event().noise_multiplier < cstd
    if low:  # cannot happen: the discrete noise is rounded up
        raise ParameterError(f"{caller}: the step noise is below the calibrated multiplier.")
    plan = DPGMPlan(params, int(n), int(d), kplan, float(sigma), noise, requested_event=requested,
                    count_noise=cnoise, lengths=length_plan(params, d, caller))
    eps = plan.epsilon_spent() if accounted is None or not requested else float(accounted)
    plan = dataclasses.replace(plan, epsilon_accounted=eps)
    if plan.epsilon_spent() > params.epsilon:  # the discrete noise's multiplier is >= sigma: cannot happen
        raise ParameterError(f"{caller}: calibration failed to meet epsilon={params.epsilon!r}.")
    return plan


def plan_dpgm(params: DPGMParams, *, n: int, d: int, caller: str = "dpgm") -> DPGMPlan:
    """Validate and calibrate (public facts only: ``n`` rows, ``d`` columns)."""
    params.validate(caller)
    _proto.resolve_neighbors(params.neighbors, _Relations, caller)
    check_param("n", n, [Interval("integer", 1, None, "left")], caller)
    from sparkpriv.mechanisms.kmeans import check_k_for_n

    check_k_for_n(params.k, n, caller)
    kplan, sigma = calibrate_dpgm(params, d, caller)
    return plan_for_rows(params, kplan, sigma, n=n, d=d, caller=caller)


@dataclass
class DPGMModel:
    """The released mixture: per-cluster parameters and noisy sizes (public)."""

    params: DPGMParams
    d: int
    thetas: np.ndarray  # (k, dim)
    sizes: np.ndarray  # (k,) noisy sizes of the clusters as trained (cluster_sizes), clamped at 0
    centers: np.ndarray  # (k, d) k-means centres
    plan_public: dict = field(default_factory=dict)
    # the synthetic type of each column (SYNTHETIC_TYPES; from the source's schema), None: all double
    column_types: tuple | None = None
    # released on event records: the public EventColumns (person and item columns, item type, the
    # declared vocabulary: column j is item vocabulary[j]); None for a table
    events: "EventColumns | None" = None
    # the noisy (k, B) histograms of record lengths, their bin edges and noise std (LengthPlan); None:
    # not released (length_share 0, or a model of format version < 4)
    lengths: np.ndarray | None = None
    length_edges: np.ndarray | None = None
    length_std: float = math.nan
    # how synthesis draws a length within its bin (WITHIN_BIN): "uniform" for files before format 6
    length_within: str = "exponential"

    def __post_init__(self):
        dim = self.generator().dim
        if np.ndim(self.thetas) != 2 or np.shape(self.thetas)[1] != dim:
            raise ParameterError(f"The model's parameters have shape {np.shape(self.thetas)}; its params "
                                 f"(model={self.params.model!r}, hidden={self.params.hidden}, length strata "
                                 f"{list(length_strata(self.params, self.d))}) need {dim} per cluster.")

    @property
    def k(self) -> int:
        return self.thetas.shape[0]

    def sample_cluster(self, gen, j: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` records of cluster ``j``'s model; with the length histograms, each record's length
        drawn from cluster ``j``'s (:func:`synthetic_lengths`; a model with length strata falls back
        to the pooled histogram, then ``L``: :func:`draw_lengths`), then the record given it."""
        lengths = None
        if self.lengths is not None:
            longest = max_length(self.params, self.d) if getattr(gen, "strata", ()) else None
            lengths = draw_lengths(self.lengths, self.length_edges, self.length_std, j, int(n), rng, longest,
                                   self.length_within)
        if lengths is None:
            return gen.sample(self.thetas[j], int(n), rng)
        return gen.sample(self.thetas[j], int(n), rng, lengths=lengths)

    @property
    def types(self) -> tuple:
        """The type of each synthetic column (``double`` for all when none was recorded)."""
        return tuple(self.column_types) if self.column_types else ("double",) * self.d

    @property
    def column_names(self) -> tuple:
        """The released column names (``x0, x1, ...`` for a numpy input)."""
        return tuple(str(c) for c in self.params.columns) if self.params.columns else \
            tuple(f"x{j}" for j in range(self.d))

    def generator(self):
        return _make_model(self.params, self.d)

    def query_spread(self, queries, n: int, *, repeats: int = 199, confidence: float = 0.95,
                     threshold: float = 0.5, seed: int | None = None) -> "QuerySpread":
        """The spread of counting queries over ``repeats`` syntheses of ``n`` records
        (:func:`query_spread`; post-processing, no budget; docs/dpgm.md, "Uncertainty")."""
        return query_spread(self, queries, n, repeats=repeats, confidence=confidence, threshold=threshold,
                            seed=seed)

    def save(self, path) -> None:
        """A ``.npz`` with the arrays and a JSON header (``format_version``)."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())

    def to_bytes(self) -> bytes:
        """The ``.npz`` file's bytes (:meth:`save`; a release publishes them as ``MODEL_FILE``)."""
        header = {"format": "sparkpriv-dpgm", "format_version": FORMAT_VERSION,
                  "params": self.params.public_dict(), "d": self.d,
                  # resolved (the default may change): the file says which strata its thetas hold
                  "length_strata": list(length_strata(self.params, self.d)), "public": self.plan_public,
                  "column_types": list(self.types),
                  "events": None if self.events is None else self.events.to_header(),
                  "lengths": None if self.lengths is None else
                  {"edges": [int(e) for e in self.length_edges], "std": float(self.length_std),
                   "within_bin": self.length_within}}
        arrays = {} if self.lengths is None else {"lengths": np.asarray(self.lengths, dtype=np.float64)}
        buf = io.BytesIO()
        np.savez(buf, header=np.frombuffer(json.dumps(header, default=float).encode(), np.uint8),
                 thetas=self.thetas, sizes=self.sizes, centers=self.centers, **arrays)
        return buf.getvalue()

    @classmethod
    def load(cls, path) -> "DPGMModel":
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            version = header.get("format_version")
            if header.get("format") != "sparkpriv-dpgm" or version not in READ_VERSIONS:
                raise ParameterError(
                    f"{path} is not a sparkpriv DPGM model of format version "
                    f"{' or '.join(map(str, READ_VERSIONS))} (found {header.get('format')!r} version {version!r}).")
            d = int(header["d"])
            types = None  # version 1: no types recorded, every synthetic column is double
            if version >= 2:
                types = tuple(str(t) for t in header.get("column_types") or ())
                if len(types) != d or any(t not in SYNTHETIC_TYPES for t in types):
                    raise ParameterError(f"{path}: the model's column types {list(types)!r} are not {d} of "
                                         f"{', '.join(SYNTHETIC_TYPES)}: not a released model.")
            events = None  # versions 1 and 2: tables only (event records were read as tables)
            if version >= 3 and header.get("events") is not None:
                events = EventColumns.from_header(header["events"], d, str(path))
            lengths = edges = None  # versions 1 to 3: no length histograms
            std, within = math.nan, "exponential"
            if version >= 4 and header.get("lengths") is not None:
                within = str(header["lengths"].get("within_bin", "uniform"))  # before 6: uniform
                if within not in WITHIN_BIN:
                    raise ParameterError(f"{path}: the model's lengths are drawn {within!r} within a bin, "
                                         f"not one of {', '.join(WITHIN_BIN)}: not a released model.")
                edges = np.asarray(header["lengths"]["edges"], dtype=np.int64)
                lengths, std = np.asarray(z["lengths"], dtype=np.float64), float(header["lengths"]["std"])
                if lengths.shape != (z["thetas"].shape[0], edges.size - 1) or np.any(np.diff(edges) <= 0):
                    raise ParameterError(f"{path}: the model's length histograms {lengths.shape} do not match "
                                         f"its {z['thetas'].shape[0]} clusters and {edges.size - 1} bins.")
            params = dict(header["params"])
            params.setdefault("average_tail", 0.0)  # written before the tail mean: the last iterate
            if version < 5:
                params["length_strata"] = 0  # written before the length strata: none
            elif tuple(length_strata(DPGMParams(**params), d)) != tuple(header.get("length_strata") or ()):
                params["length_strata"] = list(header.get("length_strata") or ()) or 0
            return cls(DPGMParams(**params), d, z["thetas"], z["sizes"], z["centers"],
                       header.get("public", {}), types, events, lengths, edges, std, within)


INIT_FLOOR = 1e-3  # an RBM's starting visible probabilities lie in [INIT_FLOOR, 1 - INIT_FLOOR]


def project_capped(c: np.ndarray, mass: float) -> np.ndarray:
    """The Euclidean projection of ``c`` onto ``{p in [0, 1]^d : sum(p) <= mass}``.

    It is ``clip(c - lam, 0, 1)`` with the least ``lam >= 0`` that meets the mass (soft
    thresholding, then the box). The set is convex, so for any ``p`` in it ``||project(c) - p||
    <= ||c - p||``: when the cluster's true mean record lies in it, the projected centre is at
    least as close to it as ``c``. docs/math.md section 5, "The RBM's starting point"."""
    c = np.asarray(c, dtype=np.float64)
    mass = max(float(mass), 0.0)
    p = np.clip(c, 0.0, 1.0)
    if p.sum() <= mass:
        return p
    # f(lam) = sum clip(c - lam, 0, 1) is continuous and non-increasing, f(0) > mass >= f(max c) = 0;
    # bisect for the bracket, then solve the linear piece it lies on exactly
    lo, hi = 0.0, float(c.max())
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if np.clip(c - mid, 0.0, 1.0).sum() > mass:
            lo = mid
        else:
            hi = mid
    free = (c - hi > 0.0) & (c - hi < 1.0)
    if np.any(free):  # on this piece f(lam) = sum_free (c_i - lam) + #(c_i - lam >= 1)
        lam = (c[free].sum() + np.count_nonzero(c - hi >= 1.0) - mass) / np.count_nonzero(free)
        if lo <= lam <= hi:
            hi = lam
    return np.clip(c - hi, 0.0, 1.0)


def visible_masses(plan: DPGMPlan, noisy_lengths: np.ndarray | None) -> np.ndarray:
    """Each cluster's expected record length, the mass its RBM starts from (:func:`visible_init`):
    the mean length synthesis draws from the cluster's released histogram (:func:`expected_length`);
    for a cluster with no bin left, that of the sum of the k histograms (noise std ``sqrt(k)``
    times); with neither (or no histograms), the longest record ``L`` the bounds admit. At most
    ``L``. Post-processing of released histograms and public bounds."""
    k, longest = plan.params.k, float(max_length(plan.params, plan.d))
    lp = plan.lengths
    if lp is None or noisy_lengths is None:
        return np.full(k, longest)
    noisy_lengths = np.asarray(noisy_lengths, dtype=np.float64)
    pooled = expected_length(noisy_lengths.sum(axis=0), lp.edges, lp.noise.std * math.sqrt(k))
    out = []
    for j in range(k):
        own = expected_length(noisy_lengths[j], lp.edges, lp.noise.std)
        out.append(min(longest, own if own is not None else pooled if pooled is not None else longest))
    return np.asarray(out, dtype=np.float64)


def visible_init(centre: np.ndarray, mass: float) -> np.ndarray:
    """An RBM's starting visible biases: the logits of the released centre projected onto
    ``{p in [0, 1]^d : sum(p) <= mass}`` (:func:`project_capped`), kept within
    ``[INIT_FLOOR, 1 - INIT_FLOOR]``. A noisy centre clipped to the box keeps every positive
    noise, which at small clusters puts most of its mass on items nobody in the cluster has;
    the projection removes it (docs/dpgm.md, "The RBM's starting point")."""
    p = np.clip(project_capped(centre, mass), INIT_FLOOR, 1.0 - INIT_FLOOR)
    return np.log(p / (1.0 - p))


def fit_dpgm_array(X, params: DPGMParams, *, seed: int | None = None, log=None) -> tuple[DPGMModel, DPGMPlan]:
    """In-memory DPGM release of ``X`` (n, d) with entries in [0, 1] (binary for ``rbm``).

    ``seed`` (tests only) fixes every secret; by default they come from OS entropy.
    """
    caller = "fit_dpgm_array"
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ParameterError(f"X must be a non-empty 2-D array (records, columns). Got shape {X.shape}.")
    if not np.all(np.isfinite(X)) or X.min() < 0 or X.max() > 1:
        raise ParameterError("X must have finite values in [0, 1]: map columns with public bounds first.")
    n, d = X.shape
    plan = plan_dpgm(params, n=n, d=d, caller=caller)
    seed = new_secret_seed("dpgm") if seed is None else int(seed)
    # 1. DP k-means (linear), the library's driver loop
    fmap = make_feature_map("linear", _bounds(params, d, caller), caller=caller)
    centres0 = initial_centres(fmap, params.k, stream(seed, 1), None, caller)
    Z, Xc, _ = fmap.features(X)
    iteration_stats, seen = last_round_centres(lambda c: cluster_stats(Z, c))
    kmodel, _ = fit_from_stats(plan.kmeans, fmap, centres0, iteration_stats,
                               lambda c: cluster_stats(Z, c, Xc), seed)
    centers = np.asarray(kmodel.centers, float)
    # 2. internal: the last round's clusters, whose noisy means and counts the k-means released
    labels = assign_clusters(X, seen["centres"], _bounds(params, d, caller).row_bound)
    # 3. the length histograms of the same clusters, noised once (they also set where each rbm starts,
    # and their sums the size of each cluster as trained)
    lengths = None
    if plan.lengths is not None:
        lengths = plan.lengths.release(np.stack([plan.lengths.histogram(X[labels == j]) for j in range(params.k)]),
                                       seed)
    sizes = cluster_sizes(kmodel.counts, lengths, kmodel.count_std, plan.lengths.noise.std if plan.lengths else 0.0)
    masses = visible_masses(plan, lengths)
    chains = chain_lengths(plan, lengths, seed)
    # 4. one model per cluster, same (q, sigma, T)
    clips: dict = {}
    thetas = train_clusters(X, labels, sizes, centers, plan, seed, log=log, clips=clips, masses=masses,
                            chain_lengths=chains)
    public = model_public(plan, sizes, [clips[j] for j in range(params.k)], masses, kmodel)
    return _model(params, d, thetas, sizes, centers, public, plan, lengths), plan


def _model(params, d, thetas, sizes, centers, public, plan: DPGMPlan, lengths, column_types=None,
           events=None) -> DPGMModel:
    lp = plan.lengths
    return DPGMModel(params, d, thetas, sizes, centers, public, column_types, events, lengths,
                     None if lp is None else lp.edges, math.nan if lp is None else float(lp.noise.std))


def training_order(sizes) -> list:
    """The clusters' training order on an engine that trains them in parallel: largest noisy
    size first (a larger cluster draws larger batches over the same steps, so it trains
    longest; starting it first shortens the slowest executor's queue). Public: a function of
    the released noisy sizes only."""
    return [int(j) for j in np.argsort(-np.asarray(sizes, dtype=np.float64), kind="stable")]


def model_public(plan: DPGMPlan, sizes, clips=None, masses=None, kmeans=None) -> dict:
    """The model file's public record: the plan's, each cluster's learning rate and batches per
    update ``m_j`` (functions of the noisy sizes), the rbm's starting masses (:func:`visible_masses`),
    with quantile clipping each cluster's final ``clips`` (:func:`final_clips_public`), and
    ``kmeans`` (the k-means model): its noisy counts and their std, which :func:`cluster_sizes` read."""
    out = plan.to_public_dict()
    if kmeans is not None:
        out["kmeans_sizes"] = {"values": [float(v) for v in kmeans.counts], "count_std": float(kmeans.count_std),
                               "note": "the k-means' noisy counts of its last round's clusters, which the "
                                       "models train on; with the length histograms the sizes are the "
                                       "inverse-variance mean of these and the histograms' sums "
                                       "(cluster_sizes)"}
        out["training_clusters"] = ("the k-means' last round's clusters: each record trains the model of "
                                    "the centre nearest to it among those that round assigned with (internal, "
                                    "never released); the released centre and count are that cluster's noisy "
                                    "mean and size")
    if plan.params.model == "rbm" and masses is not None:
        out["start_masses"] = [float(v) for v in masses]
    out["learning_rates"] = plan.learning_rates(sizes)
    out["average_tail"] = plan.params.tail  # the share of the last iterates each model is the mean of
    if length_strata(plan.params, plan.d):
        out["strata_trained"] = plan.strata_trained(sizes)
    out["batches"] = plan.batches(sizes)
    out["updates"] = [dpsgd.updates(plan.steps, m) for m in out["batches"]]
    if plan.quantile:
        out["final_clips"] = final_clips_public(clips, plan, sizes)
    return out


def final_clips_public(clips, plan: DPGMPlan, sizes) -> dict:
    """The model's public record of each cluster's last clip under quantile clipping."""
    adapted = [dpsgd.clip_adapts(plan.count_noise.std, plan.params.sampling_rate, max(float(s), 1.0),
                                 plan.batches_for(max(float(s), 1.0))) for s in sizes]
    return {"values": [float(c) for c in clips], "adapted": adapted,
            "note": "each cluster's clip after its last update: a function of the released noisy counts "
                    "(post-processing, covered by the release's epsilon), not of the data otherwise; "
                    "adapted false: the cluster's expected batch is too small for its count "
                    "(count noise std / (m q noisy size) > %g, m its batches per update), its clip stayed "
                    "at clip" % dpsgd.MAX_FRACTION_NOISE}


def assign_clusters(X: np.ndarray, centers: np.ndarray, row_bound: float) -> np.ndarray:
    """The nearest of ``centers`` to each row after the k-means clip (box [0, 1], then the
    row bound): internal, never released. The Spark path calls the same function per block."""
    from sparkpriv.mechanisms.kmeans import assign_nearest, project_to_ball

    Xc = project_to_ball(np.clip(np.asarray(X, dtype=np.float64), 0.0, 1.0), float(row_bound))
    return assign_nearest(Xc, np.asarray(centers, dtype=np.float64))


def train_clusters(X: np.ndarray, labels: np.ndarray, sizes: np.ndarray, centers: np.ndarray,
                   plan: DPGMPlan, seed: int, clusters=None, log=None, on_step=None,
                   clips: dict | None = None, masses=None, chain_lengths=None) -> np.ndarray:
    """DP-SGD of every cluster's model on its own rows (a Spark task per cluster does the same
    for one ``j``): ``(k, dim)`` parameters. Cluster ``j`` sees only ``X[labels == j]``, the
    public ``sizes[j]``, ``centers[j]``, ``masses[j]`` and its own streams ``(seed, stage, j, step)``.
    ``masses``: the rbm's starting mass per cluster (:func:`visible_masses` of the released length
    histograms; None: the longest record the bounds admit, for every cluster).
    ``chain_lengths`` (k, chains): the fixed lengths of each cluster's persistent chains for an rbm
    with length strata (:func:`chain_lengths` of the released histograms). None: no cluster trains
    its strata (the plain RBM, offsets 0): a stratum without chains would have no model term, and
    its offsets would only climb.
    ``on_step(j, t, steps)``: called after DP-SGD step ``t`` of cluster ``j`` (progress).
    ``clips`` (a dict), when given, receives cluster ``j``'s final clip (quantile clipping: a
    function of released counts; else the declared clip)."""
    params, d = plan.params, plan.d
    gen = _make_model(params, d)
    clusters = range(params.k) if clusters is None else clusters
    masses = visible_masses(plan, None) if masses is None else np.asarray(masses, dtype=np.float64)
    strata = params.model == "rbm" and bool(gen.strata)
    thetas = np.zeros((params.k, gen.dim))
    for j in clusters:
        Xj = X[labels == j]
        n_pub = max(float(sizes[j]), 1.0)
        gj = gen
        if strata:  # with its strata and chains of fixed lengths; a noisy cluster, or no chain lengths:
            # the plain RBM, offsets 0
            gj = dataclasses.replace(gen, chain_lengths=tuple(int(v) for v in chain_lengths[j])) \
                if chain_lengths is not None and plan.strata_for(n_pub) else dataclasses.replace(gen, strata=())
        theta0 = gj.init(stream(seed, 2, j))
        if params.model == "rbm":  # start at the cluster's released centre, its noise projected away
            theta0[d * params.hidden: d * params.hidden + d] = visible_init(centers[j], masses[j])
        info = {}
        thetas[j, : gj.dim] = dpsgd.train(gj, Xj, theta0, clip=params.clip, sampling_rate=params.sampling_rate,
                                          steps=plan.steps, noise=plan.step_noise, n_pub=n_pub,
                                          seed=seed, cluster=j, lr=plan.learning_rate_for(n_pub),
                                          on_step=None if on_step is None else (lambda t, T, j=j: on_step(j, t, T)),
                                          adaptive=plan.adaptive(), info=info, schedule=params.lr_schedule,
                                          average=params.tail, batches=plan.batches_for(n_pub))
        if clips is not None:
            clips[j] = float(info["clip"])
        if log is not None:
            log(j, Xj.shape[0])
    return thetas


def synthesize(model: DPGMModel, n: int, seed: int) -> np.ndarray:
    """``n`` synthetic records (n, d): cluster ``j`` with probability noisy ``n_j / sum``, then
    its model's sampler; reproducible from ``seed`` (post-processing: no budget)."""
    check_param("n", n, [Interval("integer", 0, None, "left")], "synthesize")
    w = np.asarray(model.sizes, float)
    if not np.any(w > 0):
        w = np.ones_like(w)
    counts = stream(seed, SYNTH_STAGE, model.k).multinomial(int(n), w / w.sum())
    gen = model.generator()
    parts = [model.sample_cluster(gen, j, int(c), stream(seed, SYNTH_STAGE, j))
             for j, c in enumerate(counts) if c > 0]
    out = np.concatenate(parts) if parts else np.zeros((0, model.d))
    return out[stream(seed, SYNTH_STAGE, model.k + 1).permutation(out.shape[0])]


def synthesize_table(model: DPGMModel, n: int, seed: int):
    """:func:`synthesize`'s ``n`` records as a pyarrow Table: the released column names and the
    source's column types (``model.types``: integer and boolean columns get the model's 0/1
    values, rounded; float columns stay float; all double for a model of format version 1)."""
    import pyarrow as pa

    X = np.clip(synthesize(model, n, seed), 0.0, 1.0)
    return pa.Table.from_arrays(synthetic_arrays(X, model.types), names=list(model.column_names))


def synthesize_part(model: DPGMModel, n: int, seed: int, *key: int) -> np.ndarray:
    """``n`` synthetic records (n, d) of one slice of a large table: :func:`synthesize`'s
    mixture (cluster ``j`` with probability noisy ``n_j / sum``, then its model's sampler, rows
    shuffled) from the keyed streams ``stream(seed, SYNTH_STAGE, *key, ...)``, values clipped to
    the declared box ``[0, 1]``. A Spark task passes its ``(partition, batch)`` as ``key``: a
    retried task regenerates the same rows, and distinct keys give independent slices.
    Post-processing of the released model: no budget."""
    check_param("n", n, [Interval("integer", 0, None, "left")], "synthesize")
    key = tuple(int(v) for v in key)
    w = np.asarray(model.sizes, float)
    if not np.any(w > 0):
        w = np.ones_like(w)
    counts = stream(seed, SYNTH_STAGE, *key, model.k).multinomial(int(n), w / w.sum())
    gen = model.generator()
    parts = [model.sample_cluster(gen, j, int(c), stream(seed, SYNTH_STAGE, *key, j))
             for j, c in enumerate(counts) if c > 0]
    out = np.concatenate(parts).astype(np.float64, copy=False) if parts else np.zeros((0, model.d))
    out = out[stream(seed, SYNTH_STAGE, *key, model.k + 1).permutation(out.shape[0])]
    return np.clip(out, 0.0, 1.0)


# ----------------------------------------------------------------------------- uncertainty of synthetic counts

DEFAULT_SPREAD_REPEATS = 199  # with confidence 0.95: the 5th and 195th of 199 answers, exactly 95%
SPREAD_METHOD = ("R independent syntheses of n records from the released model (post-processing, no "
                 "budget); per counting query the mean, the std and the central interval between order "
                 "statistics r = floor((R + 1) (1 - confidence) / 2) and R + 1 - r of the R answers, which "
                 "holds the answer of another independent synthesis with probability at least "
                 "1 - 2 r / (R + 1) >= confidence (exactly, for answers without ties)")


@dataclass(frozen=True)
class QuerySpread:
    """Per counting query, the spread of its answer over repeated syntheses (arrays of length
    ``n_queries``); :func:`query_spread`."""

    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    repeats: int
    confidence: float
    coverage: float  # 1 - 2 r / (R + 1): the interval's coverage of a fresh synthesis (at least)


def _query_matrix(queries, d: int) -> np.ndarray:
    Q = np.asarray(getattr(queries, "matrix", queries), dtype=np.float64)
    if Q.ndim == 1:
        Q = Q[:, None]
    if Q.ndim != 2 or Q.shape[0] != d:
        raise ParameterError(f"query_spread: queries must be a QuerySet or a (d, n_queries) 0/1 matrix with "
                             f"d = {d} rows (one per column of the records). Got shape {Q.shape}.")
    return Q


def answer_dense(records: np.ndarray, Q: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Per query (a column of ``Q``), the number of records with a value ``>= threshold`` in any of
    its columns (the counting queries of :mod:`~sparkpriv.mechanisms.counting_queries` on a dense
    table)."""
    visited = (np.asarray(records) >= threshold).astype(np.float64)
    return ((visited @ (np.asarray(Q) > 0).astype(np.float64)) > 0).sum(axis=0).astype(np.float64)


def _spread_seed(seed: int, i: int) -> int:
    """The seed of synthesis ``i`` of :func:`query_spread` (independent streams per ``i``)."""
    from sparkpriv.privacy.random import derive_seed

    return derive_seed(int(seed), f"query-spread/{int(i)}")


def query_spread(model: "DPGMModel", queries, n: int, *, repeats: int = DEFAULT_SPREAD_REPEATS,
                 confidence: float = 0.95, threshold: float = 0.5, seed: int | None = None) -> QuerySpread:
    """How much counting queries on a synthetic table of ``n`` records move between syntheses.

    ``repeats`` (R) independent syntheses from the same released ``model``
    (post-processing: no budget); ``queries``: a
    :class:`~sparkpriv.mechanisms.counting_queries.QuerySet` or a ``(d, n_queries)``
    0/1 matrix, answered as "records with a value ``>= threshold`` in any of
    the query's columns". Per query: the mean and std of the R answers and
    the central interval between order statistics ``r`` and ``R + 1 - r``,
    ``r = floor((R + 1)(1 - confidence) / 2)``: another independent synthesis
    answers inside it with probability at least ``coverage = 1 - 2 r / (R + 1)``
    (exchangeability; exactly 0.95 at the default R = 199). It is the spread
    of the synthesis only: the noise in the released model and the model's
    error against the real data are not in it (docs/dpgm.md, "Uncertainty").
    ``seed`` makes it reproducible; by default fresh OS entropy.
    """
    caller = "query_spread"
    check_param("n", n, [Interval("integer", 1, None, "left")], caller)
    check_param("repeats", repeats, [Interval("integer", 1, None, "left")], caller)
    check_param("confidence", confidence, [Interval("real", 0, 1, "neither")], caller)
    r = int(math.floor((repeats + 1) * (1.0 - confidence) / 2.0))
    if r < 1:
        need = int(math.ceil(2.0 / (1.0 - confidence))) - 1
        raise ParameterError(f"The 'repeats' parameter of {caller} must be at least {need} for a "
                             f"{confidence:g} interval (the interval lies between two of the answers). "
                             f"Got {repeats}.")
    Q = _query_matrix(queries, model.d)
    if seed is None:
        seed = new_secret_seed("dpgm-query-spread")  # not a secret: fresh entropy for the syntheses
    answers = np.stack([answer_dense(synthesize(model, n, _spread_seed(seed, i)), Q, threshold)
                        for i in range(repeats)])
    srt = np.sort(answers, axis=0)
    return QuerySpread(mean=answers.mean(axis=0), std=answers.std(axis=0, ddof=1) if repeats > 1 else
                       np.zeros(Q.shape[1]), low=srt[r - 1], high=srt[repeats - r], repeats=int(repeats),
                       confidence=float(confidence), coverage=1.0 - 2.0 * r / (repeats + 1))


def uncertainty_public(kplan: KMeansPlan) -> dict:
    """The receipt's ``uncertainty`` of a DPGM release: public parameters only, no data-derived number."""
    return {
        "cluster_size_std": float(kplan.count_std),
        "cluster_size_note": "each released cluster size is the k-means count plus Gaussian noise of this "
                             "std (before the clamp at 0); 95%: size +- 1.96 std",
        "synthetic_queries": {
            "accessor": "model.query_spread(queries, n, repeats=199, confidence=0.95)",
            "method": SPREAD_METHOD,
            "default_repeats": DEFAULT_SPREAD_REPEATS,
            "covers": "the answer of another synthesis from the same model: the spread of the synthesis "
                      "only, not the noise in the model nor its error against the real data",
            "docs": "docs/dpgm.md",
        },
    }


# ----------------------------------------------------------------------------- the mechanism (protocol)


@dataclass
class _DPGMState:
    params: DPGMParams
    d: int
    kplan: KMeansPlan
    sigma: float
    column_types: tuple = ()
    events: "EventColumns | None" = None  # event records: the public EventColumns (the synthetic event tables)


def dense_rows(block) -> np.ndarray:
    """A block as a dense float64 matrix: a table block as it is, bounded event records
    (:class:`~sparkpriv.mechanisms.protocol.SparseRows`, binary) as their 0/1 rows over the
    vocabulary (a person's DPGM record)."""
    if isinstance(block, _proto.SparseRows):
        off = np.asarray(block.offsets, np.int64)
        n = off.shape[0] - 1
        X = np.zeros((n, int(block.d)), dtype=np.float64)
        rows = np.repeat(np.arange(n), np.diff(off))
        vals = 1.0 if block.values is None else np.asarray(block.values, np.float64)
        X[rows, np.asarray(block.indices, np.int64)] = vals
        return X
    return np.asarray(block, dtype=np.float64)


def _dense_features_fn(fmap, counters):
    """Block -> the linear k-means features (the clipped rows) of a table block."""
    from sparkpriv.mechanisms.kmeans import _features_fn

    inner = _features_fn(fmap, counters)

    def features(block):
        return inner(dense_rows(block))

    return features


def _records_fn(counters):
    """Bounded event records -> themselves (sparse; the engine caches them as they are). They
    already satisfy the k-means bounds: binary, at most ``L`` items, so inside the box and the row
    bound ``sqrt(L)`` (nothing is clipped); the rows are counted for the owner."""

    def records(block):
        if counters is not None:
            counters[0].add(int(block.n))
        return block

    return records


def assign_sparse(block, centers: np.ndarray) -> np.ndarray:
    """The nearest centre of each sparse record (:class:`~sparkpriv.mechanisms.protocol.SparseRows`
    within the box and the row bound, as bounded records are): ``argmin_j ||c_j||^2 - 2 x . c_j``,
    the dense :func:`~sparkpriv.mechanisms.kmeans.assign_nearest` without densifying (``x . c_j``
    is the sum of ``c_j`` at the record's items); internal, never released."""
    from sparkpriv.mechanisms.sparse import project_sparse_rows

    if block.n == 0:
        return np.zeros(0, dtype=np.int64)
    centers = np.asarray(centers, dtype=np.float64)
    cn = np.einsum("ij,ij->i", centers, centers)
    scores = project_sparse_rows(block.offsets, block.indices, block.values, np.ascontiguousarray(centers.T))
    return np.argmin(cn[None, :] - 2.0 * scores, axis=1)


def _records_stats_fn(centers: np.ndarray):
    """Sparse records -> one Lloyd iteration's counts and sums, in
    :func:`~sparkpriv.mechanisms.kmeans.cluster_stats`'s layout (the linear features are the rows)."""
    from sparkpriv.mechanisms.kmeans import cluster_input_sums_sparse

    centers = np.array(centers, dtype=np.float64, copy=True)
    k = centers.shape[0]

    def stats(block):
        return cluster_input_sums_sparse(assign_sparse(block, centers), block.offsets, block.indices,
                                         block.values, k, block.d)

    return stats


def _group_fn(centers: np.ndarray, row_bound: float):
    """Block -> (each row's nearest of ``centers``, the last round's: :func:`last_round_centres`;
    the rows clipped to the box [0, 1]); internal.
    Bounded event records stay sparse (the engine ships them so, and a cluster trains on a CSR
    matrix whose sampled batches alone are made dense)."""
    centers = np.array(centers, dtype=np.float64, copy=True)

    def group(block):
        if isinstance(block, _proto.SparseRows):
            return assign_sparse(block, centers), block
        X = np.clip(dense_rows(block), 0.0, 1.0)
        return assign_clusters(X, centers, row_bound), X

    return group


def _lengths_fn(centers: np.ndarray, row_bound: float, lplan: LengthPlan):
    """Block -> the ``k B`` exact length histograms of its rows by nearest of ``centers`` (the
    rows and assignment training uses: :func:`_group_fn`), summed over blocks and noised once on
    the driver."""
    group_fn, k, bins = _group_fn(centers, row_bound), int(np.asarray(centers).shape[0]), lplan.bins

    def hist(block):
        from sparkpriv.mechanisms.sparse import _csr

        g, X = group_fn(block)
        if isinstance(X, _proto.SparseRows):  # the same rows as scipy CSR: LengthPlan.histogram's sums
            X = _csr(X.offsets, X.indices, X.values, X.d)
        return np.bincount(np.asarray(g, dtype=np.int64) * bins + lplan.bins_of(X.sum(axis=1)),
                           minlength=k * bins).astype(np.float64)

    return hist


def _train_fn(plan: DPGMPlan, sizes: np.ndarray, centers: np.ndarray, seed: int, masses=None, chains=None):
    """(j, rows of cluster j in source order[, report]) -> cluster j's DP-SGD parameters (its own
    streams); ``report(t, steps)`` after each step, where the engine trains in-process.
    ``masses``, ``chains``: the rbm's starting masses and chain lengths (:func:`train_clusters`)."""
    sizes = np.array(sizes, dtype=np.float64, copy=True)
    centers = np.array(centers, dtype=np.float64, copy=True)
    masses = None if masses is None else np.array(masses, dtype=np.float64, copy=True)
    chains = None if chains is None else np.array(chains, dtype=np.int64, copy=True)

    def train(j, Xj, report=None):
        labels = np.full(Xj.shape[0], int(j))
        on_step = None if report is None else (lambda _j, t, steps: report(t, steps))
        clips: dict = {}
        theta = train_clusters(Xj, labels, sizes, centers, plan, seed, clusters=[int(j)], on_step=on_step,
                               clips=clips, masses=masses, chain_lengths=chains)[int(j)]
        # quantile clipping: the final clip (post-processing of released counts) rides after theta
        return np.concatenate([theta, [clips[int(j)]]]) if plan.quantile else theta

    return train


TRAINING_CHUNKS = 10  # in-process training reports each cluster's DP-SGD in at most this many steps


def _training_progress(progress, dplan: DPGMPlan, reserved: float):
    """``on_train(j, t, steps)`` for an engine that trains in-process: a step of ``progress`` at
    each chunk boundary of cluster ``j``'s DP-SGD (``TRAINING_CHUNKS`` per cluster, ``k`` clusters,
    in order), with the privacy spent so far.

    The whole release's epsilon is reserved before any data is read. Training composes: while the
    first cluster trains, the spend so far is at most ``epsilon(k-means + t steps)``; every cluster
    runs the same ``(q, sigma, T)`` on disjoint rows (parallel composition), so once one cluster has
    made its ``T`` steps the whole reserved epsilon counts as spent (docs/dpgm.md "Progress").
    """
    k, steps = dplan.params.k, dplan.steps
    chunks = min(steps, TRAINING_CHUNKS)
    reported: dict = {}  # cluster -> chunks reported (a cluster with m_j > 1 may pass several at once)
    first: list = [None]  # the first cluster trained: the one whose steps add to the spend
    done = [0]  # steps reported so far
    # the spend after t steps, composed step chunk by chunk (t rises); an upper bound each time
    running = [None, 0]  # RunningEpsilon, steps composed into it

    def spent(t: int) -> float:
        if t >= steps:
            return reserved
        try:
            if running[0] is None:
                final = compose([dplan.kmeans.dp_event(), dplan.training_event()])
                running[0] = RunningEpsilon(final, dplan.params.delta).add(dplan.kmeans.dp_event())
            if t > running[1]:
                running[0].add(dplan.training_event(t - running[1]))
                running[1] = t
            eps = running[0].epsilon()
        except ValueError:  # a leaf RunningEpsilon does not build: the accountant, from the start
            eps = epsilon_of(compose([dplan.kmeans.dp_event(), dplan.training_event(t)]), dplan.params.delta)
        return min(eps, reserved)

    def on_train(j: int, t: int, total: int) -> None:
        # chunk c ends at base step ceil(c steps / chunks): those <= t are the first floor(t chunks / steps)
        c = min(int(t) * chunks // steps, chunks)
        if c <= reported.get(j, 0):
            return
        done[0] += c - reported.get(j, 0)
        reported[j] = c
        if first[0] is None:
            first[0] = j
        so_far = spent(t) if j == first[0] else reserved
        progress.step("dpgm training", done[0], k * chunks,
                      f"cluster {j + 1}/{k}, DP-SGD step {t}/{total}; epsilon spent so far at most "
                      f"{so_far:.4g} of the reserved {reserved:.4g}")

    return on_train


def _column_types(facts: _proto.InputFacts) -> tuple:
    """The synthetic type of each declared column, from the input's schema (public)."""
    types = tuple(getattr(facts, "types", ()) or ())
    return tuple(synthetic_type(t) for t in types) if len(types) == facts.d else ()


class DPGM(_proto.Mechanism):
    """DP mixture of generative models: DP k-means (linear), then DP-SGD per cluster (docs/dpgm.md)."""

    name = "dpgm"
    title = "DPGM"
    summary = ("DP mixture of generative models: DP k-means, then one RBM or VAE per cluster trained with "
               "DP-SGD; releases the model file")
    Params = DPGMParams
    neighbors = (_proto.REPLACE_ONE,)
    refused_neighbors = dict(_Relations.refused_neighbors,
                             element="it protects whole records (people), not single attributes")
    row_level = False
    inputs = ("table", "records")

    def plan(self, params: DPGMParams, facts: _proto.InputFacts, caller: str) -> _proto.Plan:
        d = facts.d
        if facts.kind == "records":
            given = [n for n in ("columns", "row_bound", "fill") if getattr(params, n, None) is not None]
            if given:
                raise ParameterError(
                    f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                    "bounded event records: the items are the vocabulary (one 0/1 column per item) and the "
                    "row bound is sqrt(max_items) from the item cap. Remove them.")
            if float(facts.value_cap) != 1.0:
                raise ParameterError(
                    f"{caller} models binary event records (the set of items of a person): bound the "
                    "events with weights='binary' (no max_events_per_item).")
            params = dataclasses.replace(params, row_bound=float(facts.l2_bound))
        kplan, sigma = calibrate_dpgm(params, d, caller)
        event = requested_event(params, kplan, sigma, d)
        eps = epsilon_of(event, params.delta)
        if eps > params.epsilon:  # the calibration checks its own accountant; PLD is the recorded one
            raise ParameterError(
                f"{caller}: the release's epsilon by the library's accountant is {eps:.6g}, above the "
                f"request epsilon={params.epsilon!r} (accountant={params.accountant!r}); use accountant='pld'.")
        bounds = _bounds(params, d, caller)
        public = {
            "bounds": bounds.to_public_dict(), "kmeans": kplan.to_public_dict(), "steps": params.steps,
            "noise_multiplier": sigma, "sampling_rate": params.sampling_rate,
            "uncertainty": uncertainty_public(kplan),
            "accounting": accounting_note(params) + ": at the calibrated sigma, fixed before the data is read "
                          "(the step noise's grid comes from the public n; its multiplier is at least sigma/2) "
                          "(docs/math.md section 5)",
        }
        lplan = length_plan(params, d, caller)
        if lplan is not None:
            public["lengths"] = lplan.to_public_dict()
        if params.clip_quantile is not None:
            cstd = dpsgd.count_noise_std(sigma, params.clip_count_share)
            public["accounting"] = accounting_note(params) + ": at the calibrated sigma and sigma_b, fixed " \
                "before the data is read (the realized noises' multipliers are at least those)"
            public["quantile_clipping"] = {"count_noise_std": cstd, "step_multiplier":
                                           dpsgd.quantile_step_multiplier(sigma, cstd)}
        return _proto.Plan(events=event, epsilon=eps, delta=float(params.delta), public=public,
                           neighbors=_proto.REPLACE_ONE,
                           state=_DPGMState(params, d, kplan, sigma, _column_types(facts),
                                            getattr(facts, "events", None) if facts.kind == "records" else None),
                           secrets=new_secret_seed("dpgm"))

    def run(self, engine, source, plan: _proto.Plan, progress) -> _proto.Outcome:
        from sparkpriv.errors import InputError
        from sparkpriv.mechanisms.kmeans import _stats_fn

        st: _DPGMState = plan.state
        params, d, kplan, seed = st.params, st.d, st.kplan, plan.secrets
        bounds = _bounds(params, d, progress.caller)
        fmap = make_feature_map("linear", bounds, caller=progress.caller)
        k, dim = params.k, fmap.dim
        counters = engine.counters(("rows", "rows_box_clipped", "rows_norm_clipped"))
        records = source.kind == "records"  # kept sparse: d floats per person would not fit at scale
        if records:
            cache = engine.cache(source, _records_fn(counters), dim, sparse=True)
            stats_fn = _records_stats_fn
        else:
            cache = engine.cache(source, _dense_features_fn(fmap, counters), dim)
            stats_fn = _stats_fn
        try:
            n = cache.rows
            if n == 0:
                raise InputError("The input table is empty: there is nothing to release.")
            dplan = plan_for_rows(params, kplan, st.sigma, n=n, d=d, caller=progress.caller, requested=True,
                                  accounted=plan.epsilon)
            if dplan.dp_event() != plan.events:  # the model file states the recorded event's epsilon
                raise RuntimeError("dpgm: the run's event differs from the recorded one")
            progress.log("dpgm: k-means (linear), k=%d, %d iterations; features cached", k, kplan.iterations)
            centres0 = initial_centres(fmap, k, stream(seed, 1), None, progress.caller)

            def log(t, counts):
                progress.step("kmeans iteration", t, kplan.iterations)

            iteration_stats, seen = last_round_centres(lambda c: cache.aggregate(stats_fn(c), k * (dim + 1)))
            kmodel, history = fit_from_stats(kplan, fmap, centres0, iteration_stats, None, seed, log)
            centers = np.asarray(kmodel.centers, float)
            train_centres = seen["centres"]  # the last round's: internal, never released
            lengths = None
            if dplan.lengths is not None:  # the exact (k, B) histograms in one pass, noised here once
                lp, size = dplan.lengths, k * dplan.lengths.bins
                progress.log("dpgm: histograms of record lengths, %d clusters x %d bins (one pass)", k, lp.bins)
                lfn = _lengths_fn(train_centres, bounds.row_bound, lp)
                # event records: the cached records are the training rows; a table's cache holds its
                # features (rows also scaled onto the row-bound ball), so its histograms read the source
                exact = cache.aggregate(lfn, size) if records else engine.aggregate(source, lfn, size)
                lengths = lp.release(np.asarray(exact, dtype=np.float64).reshape(k, lp.bins), seed)
            sizes = cluster_sizes(kmodel.counts, lengths, kmodel.count_std,
                                  dplan.lengths.noise.std if dplan.lengths else 0.0)
            masses = visible_masses(dplan, lengths)
            chains = chain_lengths(dplan, lengths, seed)
        finally:
            cache.release()
        progress.log("dpgm: training %d %s model(s), %d DP-SGD steps each", k, params.model, dplan.steps)
        gen_dim = _make_model(params, d).dim
        thetas = engine.train_groups(source, _group_fn(train_centres, bounds.row_bound),
                                     _train_fn(dplan, sizes, centers, seed, masses, chains), k,
                                     gen_dim + int(dplan.quantile), d,
                                     on_train=_training_progress(progress, dplan, plan.epsilon),
                                     what="dpgm training", order=training_order(sizes))
        thetas = np.asarray(thetas, float)
        # quantile clipping: each cluster's final clip rides after its theta
        public_record = model_public(dplan, sizes, thetas[:, gen_dim] if dplan.quantile else None, masses, kmodel)
        thetas = np.ascontiguousarray(thetas[:, :gen_dim])
        model = _model(params, d, thetas, sizes, centers, public_record, dplan, lengths, st.column_types or None,
                       st.events)
        rows = [(j, float(sizes[j]), [float(v) for v in centers[j]]) for j in range(k)]
        table = engine.table(rows, [("cluster", "int", False), ("size", "double", False),
                                    ("center", "array<double>", False)])
        diagnostics = {}
        if counters is not None:
            diagnostics = {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                           "rows_norm_clipped": counters[2].value}
        return _proto.Outcome(
            table=table, model=model,
            public={"model": {"file": MODEL_FILE, "format_version": FORMAT_VERSION, "n": n,
                              "steps": dplan.steps, "step_noise": dplan.step_noise.to_public_dict(),
                              "cluster_sizes": [float(v) for v in sizes],
                              "column_types": list(model.types),
                              "events": None if st.events is None else st.events.to_public_dict()}},
            files={MODEL_FILE: model.to_bytes()},
            extras={"history": history, "diagnostics": diagnostics})


DPGM_MECHANISM = _proto.register(DPGM())
