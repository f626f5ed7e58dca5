"""Parameters and constants of the DP mixture of generative models (docs/research/dpgm.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass


from sparkpriv._validation import Interval, Options
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpsgd
from sparkpriv.mechanisms import protocol as _proto


MODELS = ("rbm", "vae")
# 7: each model trains on the k-means' last round's cluster (:func:`last_round_centres`), which the
# k-means' noisy count and the length histograms both count, and "sizes" are their inverse-variance
# mean (:func:`cluster_sizes`); the file's layout is that of 6, with two optional arrays since
# 2026-11-29 ("item_counts", "marginal_shift": marginal_share > 0; the shift is in the thetas, so a
# reader that ignores them synthesizes the same);
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
MARGINAL_STAGE = 27  # stream(seed, MARGINAL_STAGE): the noise of the per-item counts, drawn once on the driver
MARGINAL_SAMPLE_STAGE = 28  # stream(seed, MARGINAL_SAMPLE_STAGE, j, b): batch b of cluster j's records that
# measure the mixture's marginals (docs/research/dpgm.md, "Calibrating the marginals")
DEFAULT_MARGINAL_SAMPLES = 20_000
# the rbm's default length strata (interior edges; docs/research/dpgm.md, "Length strata")
DEFAULT_LENGTH_STRATA = (3, 6, 13)
# a cluster trains its strata offsets when the noise of its averaged gradient is at most this
STRATA_NOISE_MAX = 0.03
# share of epsilon the histograms of record lengths are calibrated to (docs/research/dpgm.md, "Record lengths")
DEFAULT_LENGTH_SHARE = {"rbm": 0.1, "vae": 0.0}
DEFAULT_MARGINAL_SHARE = {"rbm": 0.3, "vae": 0.0}  # the per-item counts (docs/research/dpgm.md, "Calibrating the marginals")
LENGTH_KEEP_STDS = 2.0  # synthesis: a noisy bin below this many noise stds counts as empty
_POS = Interval("real", 0, None, "neither")
DEFAULT_LEARNING_RATE = {"rbm": 0.002, "vae": 0.01}  # docs/research/dpgm.md, "Training: a first study"
# the share of the last iterates each model is released as the mean of (docs/research/dpgm.md, "Training: a second
# study"; the vae's last iterate: "MNIST: samples and classifier accuracy")
DEFAULT_AVERAGE_TAIL = {"rbm": 0.5, "vae": 0.0}
# the rbm's default rate grows with the noise of a cluster's averaged gradient, tau = sigma C / (q n_j),
# from LR_NOISE_REF up, by at most LR_MAX_FACTOR (docs/research/dpgm.md, "Training: a first study")
LR_NOISE_REF = 0.03
LR_MAX_FACTOR = 5.0


@dataclass(frozen=True, kw_only=True)
class DPGMParams(_proto.Params):
    """Public parameters of a DPGM release (fields made with the protocol's ``option``)."""

    epsilon: float = _proto.option(help="the total epsilon of the release (k-means + DP-SGD)", constraints=[_POS])
    delta: float = _proto.option(help="the total delta of the release, in (0, 1) (at most 1/n is advised)",
                                 constraints=[Interval("real", 0, 1, "neither")])
    k: int = _proto.option(10, help="clusters of the DP k-means (2 .. floor(sqrt(rows))); for millions of "
                           "rows 20-30, with sampling_rate near 880 k / rows (docs/dpgm.md, 'Choosing k')",
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
    marginal_share: float | None = _proto.option(
        None, help="share of epsilon the per-item counts (the column sums of the bounded records) are calibrated "
        "to, in [0, 1); after training every cluster's visible biases are shifted so that the mixture's "
        "per-item marginals move towards them, as far as the counts are more precise than the models (rbm "
        "only; docs/research/dpgm.md, 'Calibrating the marginals'); 0: none", doc_default="rbm: 0.3; vae: 0",
        constraints=[Interval("real", 0, 1, "left")])
    marginal_samples: int = _proto.option(
        DEFAULT_MARGINAL_SAMPLES, help="with marginal_share: synthetic records (over all clusters, by noisy "
        "size) that measure the mixture's marginals before the shift (each counted as its mean given its hidden "
        "units and length)", constraints=[Interval("integer", 1, None, "left")])
    length_strata: tuple | None = _proto.option(
        None, help="rbm with length histograms: interior edges e_1 < e_2 < ... (integers >= 1, at most the "
        "longest record L) of the record-length strata [0, e_1), [e_1, e_2), ..., [e_last, L]; each stratum "
        "adds its own offset to the visible biases and the model is trained given the lengths (docs/research/dpgm.md, "
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
    reliability_stds: float = _proto.option(
        3.0, help="a cluster whose noisy size is below this many standard deviations of its noise, or below "
        "min_cluster_share of the people, is unreliable: flagged, and synthesis skips it",
        constraints=[Interval("real", 0, 1e6, "both")])
    min_cluster_share: float = _proto.option(
        0.01, help="clusters with fewer than this share of the people are unreliable (their model trains on "
        "too few records to be more than noise): flagged, and synthesis skips them",
        constraints=[Interval("real", 0, 0.5, "both")])
    min_batch: int | None = _proto.option(
        None, help="per-cluster sampling rates: a cluster whose expected batch q n_j (n_j its noisy size) is "
        "below this makes m_j = ceil(min_batch / (q n_j)) of the T steps at once (at most T): rate m_j q, "
        "ceil(T / m_j) updates, the same privacy (docs/research/dpgm.md, 'Per-cluster sampling rates'); unset: every "
        "cluster at q", doc_default="every cluster at q", constraints=[Interval("integer", 1, None, "left")])
    learning_rate: float | None = _proto.option(
        None, help="Adam learning rate, every cluster; unset: for rbm 0.002, raised up to 0.01 for a noisy "
        "(small) cluster (docs/research/dpgm.md, 'Training: a first study'); for vae 0.01",
        doc_default="rbm: 0.002 .. 0.01 by cluster; vae: 0.01", constraints=[_POS])
    lr_schedule: str = _proto.option("constant", help="the learning rate over the steps: constant, or falling "
                                     "linearly or along a half cosine towards 0", constraints=[Options(dpsgd.SCHEDULES)])
    average_tail: float | None = _proto.option(
        None, help="release each model as the mean of its last ceil(average_tail T) iterates (Polyak-Ruppert; "
        "post-processing), in [0, 1); 0: the last iterate; unset: the model's default (docs/research/dpgm.md, "
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
    def marginals_share(self) -> float:
        """The share of epsilon of the per-item counts used: ``marginal_share`` or the model's default."""
        return float(self.marginal_share) if self.marginal_share is not None else DEFAULT_MARGINAL_SHARE[self.model]

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
