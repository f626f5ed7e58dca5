"""The DPGM's plan: calibration of the noise multiplier, the accounted events, the per-cluster
rates (docs/research/dpgm.md, "Privacy in one paragraph"; docs/math.md section 5)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dp_accounting import dp_event

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import dpsgd
from sparkpriv.mechanisms import protocol as _proto
from sparkpriv.mechanisms.kmeans import make_feature_map, plan_kmeans, KMeansPlan
from sparkpriv.mechanisms.rbm import RBM, STRATA_LR
from sparkpriv.mechanisms.vae import VAE
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of
from sparkpriv.privacy.bounds import Bounds
from sparkpriv.mechanisms.dpgm._params import (DPGMParams, LR_MAX_FACTOR, LR_NOISE_REF, STRATA_NOISE_MAX,
                                               length_strata)
from sparkpriv.mechanisms.dpgm._lengths import LengthPlan, length_plan
from sparkpriv.mechanisms.dpgm._marginals import MarginalPlan, marginal_plan


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
    marginals: MarginalPlan | None = None  # the per-item counts (None: marginal_share 0)

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

    def base_events(self) -> list:
        """The events released before DP-SGD: the k-means, the length histograms, the per-item
        counts (those released)."""
        return _base_events(self.kmeans, self.lengths, self.marginals)

    def dp_event(self) -> dp_event.DpEvent:
        return compose(self.base_events() + [self.dpsgd_event()])

    def batches_for(self, n_pub: float) -> int:
        """``m``, the base steps a cluster of public (noisy) size ``n_pub`` makes at once (its
        rate ``m q``; docs/research/dpgm.md, "Per-cluster sampling rates"): 1 without ``min_batch``, else
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
        chains are free): there the offsets would be mostly noise (docs/research/dpgm.md, "Length strata").
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
            "marginals": None if self.marginals is None else self.marginals.to_public_dict(),
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


def _base_events(kplan: KMeansPlan, lplan: LengthPlan | None, mplan: MarginalPlan | None = None) -> list:
    """The events before DP-SGD's: the k-means, then the length histograms and the per-item
    counts (when released)."""
    return ([kplan.dp_event()] + ([] if lplan is None else [lplan.dp_event()])
            + ([] if mplan is None else [mplan.dp_event()]))


def accounting_note(params: DPGMParams) -> str:
    """The receipt's one-line statement of the accounting."""
    batches = ("" if params.min_batch is None else
               "; per-cluster rates (min_batch): a cluster makes m_j of its T steps at once (each step's own "
               "batch and noise, the noisy sums added: post-processing of the same T steps)")
    head = ("Composed[k-means, " + ("lengths, " if params.lengths_share > 0 else "")
            + ("item counts, " if params.marginals_share > 0 else ""))
    lengths = ("; lengths: one Gaussian on the k histograms of record lengths (L2 sensitivity sqrt(2): a "
               "replaced record leaves one cell and enters one), calibrated to length_share epsilon"
               if params.lengths_share > 0 else "")
    if params.marginals_share > 0:
        lengths += ("; item counts: one Gaussian on the d column sums of the bounded records (L2 sensitivity "
                    "sqrt(2) times the row bound), calibrated to marginal_share epsilon; the shift of the "
                    "visible biases towards them is post-processing")
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
    mplan = marginal_plan(params, d, caller)
    kplan = plan_kmeans(fmap, k=params.k, epsilon=params.kmeans_share * params.epsilon, delta=params.delta,
                        iterations=params.kmeans_iterations, caller=caller)
    share = None if params.clip_quantile is None else params.clip_count_share
    sigma = dpsgd.calibrate_noise_multiplier(
        epsilon=params.epsilon, delta=params.delta, sampling_rate=params.sampling_rate, steps=params.steps,
        neighbors="replace-one", accountant=params.accountant, base_event=compose(_base_events(kplan, lplan, mplan)),
        count_share=share, caller=caller)
    return kplan, float(sigma)


def requested_event(params: DPGMParams, kplan: KMeansPlan, sigma: float, d: int | None = None) -> dp_event.DpEvent:
    """The event of the release at the calibrated ``sigma``: what the protocol records before any
    data is read (the realized discrete noise has a multiplier at least ``sigma / 2``; with quantile
    clipping, the step event of :func:`dpsgd.quantile_event` at ``sigma`` and the count's
    ``sigma_b = count_noise_std(sigma, clip_count_share)``). ``d`` (the columns) is needed when
    the length histograms or the item counts are released (``length_share`` or ``marginal_share``
    above 0)."""
    if (params.lengths_share > 0 or params.marginals_share > 0) and d is None:
        raise ParameterError("requested_event: give d (the columns): the length histograms' and the item "
                             "counts' events depend on it.")
    base = _base_events(kplan, None if d is None else length_plan(params, int(d)),
                        None if d is None else marginal_plan(params, int(d)))
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
                    count_noise=cnoise, lengths=length_plan(params, d, caller),
                    marginals=marginal_plan(params, d, caller))
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
