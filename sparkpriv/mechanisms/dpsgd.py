"""DP-SGD: Poisson sampling, per-example clipping, Gaussian noise (docs/math.md section 5).

One step on a data set of ``n`` records (one cluster of the DPGM mixture):

1. **Poisson sampling** at a public rate ``q``: each record is in the batch
   independently with probability ``q``, drawn from a keyed stream
   (``stream(seed, SAMPLE_STAGE, cluster, step)``), so a retried task samples
   the same batch.
2. **Per-example clipping** of the data-dependent part ``g_i`` of the gradient
   to ``||g_i||_2 <= C``: ``g_i min(1, C / ||g_i||)``. The norms are computed
   without materialising the per-example gradients where the layer allows it
   (a dense layer's per-example gradient is an outer product, whose Frobenius
   norm is the product of the two vectors' norms; a bias adds ``||delta_i||^2``);
   the clipped sum is then one matrix product with the clipping factors
   (the models in :mod:`~sparkpriv.mechanisms.rbm` and
   :mod:`~sparkpriv.mechanisms.vae`).
3. **Gaussian noise** of standard deviation ``sigma C`` on the clipped sum
   (``sigma`` = the DP-SGD noise multiplier), drawn ONCE per step as a
   discrete Gaussian on a power-of-two grid (docs/math.md section 7) from
   ``stream(seed, NOISE_STAGE, cluster, step)``. The update uses
   ``noisy sum / (q n_pub)`` with ``n_pub`` a public size (the noisy cluster
   size), plus any data-independent term (an RBM's negative phase).

An update may make ``m`` such steps at once (:func:`train`'s ``batches``, a
cluster's own rate ``m q``): each step ``u`` keeps its batch and noise (the
streams of ``u``) and the update uses the sum of the ``m`` noisy sums over
``m q n_pub``. The released noisy sums are those of the steps, so the privacy
event is theirs (post-processing; docs/math.md section 5).

Privacy
-------
Every event is normalised to the sensitivity of the declared neighbour
relation, as everywhere in the library (:mod:`sparkpriv.privacy.accounting`):
its PLD accountant runs in add/remove mode, where ``GaussianDpEvent(z)`` is a
shift by at most one sensitivity under noise ``z`` times it.

* add-remove: the clipped sum changes by at most ``C`` (the record's clipped
  gradient, if sampled). One step is ``PoissonSampledDpEvent(q,
  GaussianDpEvent(sigma))``, the standard analysis (Abadi et al. 2016).
* replace-one (the library's default; ``n`` is public): the noise is
  calibrated to the replace-one sensitivity ``2C`` and one step is recorded as
  ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma / 2))``, i.e. as an
  add/remove step whose sensitivity is ``2C``. Why this dominates: with the
  other records' coins fixed (a mixture with the same weights on both sides,
  so joint convexity applies), record ``x`` replaced by ``x'`` gives the pair
  ``P = (1-q) A + q B``, ``Q = (1-q) A + q B'`` with ``A = N(0, s^2)``,
  ``B = N(u, s^2)``, ``B' = N(u', s^2)``, ``||u||, ||u'|| <= C``. For every
  ``alpha >= 1``, writing ``alpha Q = (1-q) A + (alpha-1)(1-q) A + alpha q B'``,

      H_alpha(P || Q) = q H_alpha'(B || (1-b) B' + b A)
                     <= q [(1-b) H_alpha'(B || B') + b H_alpha'(B || A)]
                     <= q H_alpha'(N(2C, s^2) || N(0, s^2)),

  ``alpha' = 1 + (alpha - 1) / q``, ``b = (alpha - 1)(1 - q) / (q alpha')``
  (Balle, Barthe & Gaboardi 2018's advanced joint convexity, then joint
  convexity and ``||u - u'|| <= 2C``, ``||u|| <= C``). The right-hand side is
  exactly ``H_alpha`` of the add/remove ("remove") pair of a Poisson-sampled
  Gaussian of sensitivity ``2C``. So that pair dominates every step, and
  dominating pairs compose (Zhu, Dong & Wang 2022, Thm. 10): ``T`` steps are
  ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma/2)), T)``.
  At ``q = 1`` this is the Gaussian mechanism with sensitivity ``2C``, exact.
* The grid: the released vector is ``g (rint(sum / g) + N_Z(0, sigma_g^2))``;
  the integer centres of the three cases differ by at most ``Delta / g +
  sqrt(p)`` (``p`` parameters), which is the noise's ``grid_sensitivity``, and
  its ``dp_event()`` (multiplier at least the requested one, the samplers'
  slack included) is what is wrapped in the Poisson-sampled event.

Quantile (adaptive) clipping
----------------------------
Andrew, Thakkar, McMahan & Ramaswamy 2021: the clip ``C_t`` of step ``t`` is
chosen privately. Besides the noisy clipped sum, each step releases the noisy
count of sampled records whose gradient norm is at most ``C_t``,
``N_t + N_Z(0, sigma_b^2)`` (noise from ``stream(seed, COUNT_STAGE, cluster,
step)``), and the next clip is ``C_{t+1} = C_t exp(-eta (b_t - gamma))`` with
``b_t = noisy count / (q n_pub)`` (not clamped: unbiased, as in the paper) and ``C_t`` clamped to
``[C_0 / CLIP_RANGE, C_0 CLIP_RANGE]`` (post-processing of released counts;
``gamma`` the target quantile, ``eta`` the learning rate). The gradient noise
is ``sigma C_t``: one discrete Gaussian of std ``sigma`` on ``sum / C_t``, the
result multiplied by the public ``C_t``.

One step releases the pair (sum, count); a record contributes ``(g_i
min(1, C_t / ||g_i||), 1[||g_i|| <= C_t])``. In units of the noise (``sum /
(sigma C_t)``, ``count / sigma_b``: unit isotropic noise) a record's vector has
norm at most ``sqrt(1/sigma^2 + 1/sigma_b^2)``, a replaced record moves it by
at most ``sqrt(4/sigma^2 + 1/sigma_b^2)`` (sum: ``2C_t``; count: ``|b - b'| <=
1``, not 2), and when the two records fall in different DPGM clusters the two
clusters' vectors move by ``sqrt(2/sigma^2 + 2/sigma_b^2)`` together. The
replace-one argument above, run on the stacked vector with ``D`` the largest
of these, gives the step event ``PoissonSampled(q, Gaussian(z_eff))`` with
``z_eff = max(4/sigma^2 + 1/sigma_b^2, 2/sigma^2 + 2/sigma_b^2)^(-1/2)``
(:func:`quantile_step_multiplier`; docs/math.md section 5.1). ``sigma_b`` is
set from a public share ``s`` of the step's ``1/z_eff^2`` (:func:`count_noise_std`).

Calibration: :func:`calibrate_noise_multiplier` finds, by bisection, the
smallest multiplier (to a relative 1e-3, rounded up) whose event's epsilon by
dp_accounting's PLD accountant (the library's :func:`epsilon_of`) or RDP
accountant is at most the request. The recorded event uses the multiplier of
the actual discrete noise, which is at least that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sparkpriv._validation import Interval, check_param
from sparkpriv.privacy import noise as _noise
from sparkpriv.mechanisms.dpsgd_accounting import (  # the accounting lives there (module size)
    ACCOUNTANTS, MAX_COUNT_SHARE, NEIGHBORS, RDP_ORDERS, accounted_epsilon, calibrate_noise_multiplier,
    count_noise_std, dpsgd_event, quantile_event, quantile_step_multiplier, sensitivity_factor)

__all__ = [
    "NEIGHBORS",
    "ACCOUNTANTS",
    "SAMPLE_STAGE",
    "NOISE_STAGE",
    "sensitivity_factor",
    "dpsgd_event",
    "accounted_epsilon",
    "calibrate_noise_multiplier",
    "step_noise",
    "poisson_mask",
    "clip_factors",
    "noisy_sum",
    "Adam",
    "COUNT_STAGE",
    "CLIP_RANGE",
    "count_noise_std",
    "quantile_step_multiplier",
    "quantile_event",
    "count_noise",
    "gradient_noise",
    "clipped_sum_and_count",
    "update_clip",
    "QuantileClip",
    "dp_step_quantile",
    "MAX_FRACTION_NOISE",
    "clip_adapts",
    "updates",
    "MAX_COUNT_SHARE",
    "RDP_ORDERS",
]

SAMPLE_STAGE = 21  # public label: stream(seed, SAMPLE_STAGE, cluster, step) draws the batch
NOISE_STAGE = 22  # stream(seed, NOISE_STAGE, cluster, step) draws the step's noise
COUNT_STAGE = 24  # stream(seed, COUNT_STAGE, cluster, step) draws the noise of the step's clipped count
CLIP_RANGE = 1e6  # quantile clipping keeps C_t in [C_0 / CLIP_RANGE, C_0 CLIP_RANGE] (public)
# a data set's clip adapts only if the noise of its fraction estimate, sigma_b / (q n_pub), is at most
# this (public: from the noisy size); above it the clip is a random walk and stays at C_0
MAX_FRACTION_NOISE = 0.25
_POS = Interval("real", 0, None, "neither")
_RATE = Interval("real", 0, 1, "right")



def step_noise(*, clip: float, noise_multiplier: float, dim: int, neighbors: str = "replace-one",
               max_abs: float | None = None) -> _noise.GaussianNoise:
    """The discrete Gaussian noise of one step: std at least ``noise_multiplier * C``.

    Its ``dp_event()`` is normalised to the relation's sensitivity ``factor C``
    (multiplier at least ``noise_multiplier / factor``). ``max_abs`` is a
    PUBLIC bound on a coordinate of the clipped sum (e.g. ``n_pub C``).
    """
    caller = "step_noise"
    check_param("clip", clip, [_POS], caller)
    check_param("noise_multiplier", noise_multiplier, [_POS], caller)
    f = sensitivity_factor(neighbors)
    return _noise.gaussian_noise_from_multiplier(sensitivity=f * float(clip),
                                                 noise_multiplier=float(noise_multiplier) / f,
                                                 dim=int(dim), max_abs=max_abs)


def poisson_mask(n: int, q: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of a Poisson sample: each of ``n`` records independently with probability ``q``."""
    return rng.random(int(n)) < float(q)


def clip_factors(sq_norms: np.ndarray, clip: float) -> np.ndarray:
    """``min(1, C / ||g_i||)`` from the squared per-example norms (1 for a zero gradient)."""
    norms = np.sqrt(np.maximum(np.asarray(sq_norms, dtype=np.float64), 0.0))
    out = np.ones_like(norms)
    big = norms > clip
    out[big] = clip / norms[big]
    return out


def noisy_sum(clipped_sum: np.ndarray, noise: _noise.GaussianNoise, rng: np.random.Generator) -> np.ndarray:
    """The released ``g (rint(sum / g) + N)`` of the clipped sum (flat vector)."""
    return _noise.add_noise(np.asarray(clipped_sum, dtype=np.float64), noise, rng)


@dataclass
class Adam:
    """Adam on the (noisy) gradient estimates: post-processing of released vectors."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    m: np.ndarray | None = None
    v: np.ndarray | None = None
    t: int = 0

    def step(self, theta: np.ndarray, grad: np.ndarray) -> np.ndarray:
        if self.m is None:
            self.m = np.zeros_like(theta)
            self.v = np.zeros_like(theta)
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1 - self.beta2) * grad * grad
        mh = self.m / (1 - self.beta1**self.t)
        vh = self.v / (1 - self.beta2**self.t)
        return theta - self.lr * mh / (np.sqrt(vh) + self.eps)


MODEL_STAGE = 23  # stream(seed, MODEL_STAGE, cluster, step): the model's own randomness (VAE eps, chains)


def _batch(X, sampling_rate: float, seed: int, cluster: int, u: int):
    """Base step ``u``'s Poisson batch of the rows of ``X`` (dense; event records: only the batch is
    made dense), from ``stream(seed, SAMPLE_STAGE, cluster, u)``."""
    from sparkpriv.privacy.random import stream

    Xb = X[poisson_mask(X.shape[0], sampling_rate, stream(seed, SAMPLE_STAGE, cluster, u))]
    return Xb.toarray() if hasattr(Xb, "toarray") else Xb


def _base_steps(step: int, base_steps) -> tuple:
    bs = (int(step),) if base_steps is None else tuple(int(u) for u in base_steps)
    if not bs:
        raise ValueError("a DP-SGD step needs at least one base step")
    return bs


def dp_step(model, X: np.ndarray, theta: np.ndarray, state, *, clip: float, sampling_rate: float,
            noise: _noise.GaussianNoise | None, n_pub: float, seed: int, cluster: int, step: int,
            base_steps=None):
    """One DP-SGD gradient estimate: ``(grad, new_state, batch_size)``.

    ``X``: the cluster's rows, a dense array or a scipy CSR matrix (event records: only the
    sampled batch is made dense). ``model`` has ``clipped_sum(Xb, theta, clip, rng) -> (sum, sq_norms)`` and
    ``model_term(theta, state, rng, clip) -> (grad, state)`` (data-independent).
    The batch is a Poisson sample of the rows of ``X`` from ``stream(seed,
    SAMPLE_STAGE, cluster, step)``; the noise is drawn from ``stream(seed,
    NOISE_STAGE, cluster, step)``; ``grad = noisy sum / (q n_pub) + model
    term``. ``noise=None``: the non-private step (the exact clipped sum over the
    realised batch size; the benchmark's reference).

    ``base_steps`` (per-cluster rates; :func:`train`'s ``batches``): the indices ``u`` of the
    ``m`` base steps this step makes at once (default ``(step,)``). Each ``u`` draws its own
    batch and noise from the streams of ``u``, exactly as the step ``u`` of rate ``q`` would; the
    ``m`` released noisy sums are added (post-processing) and ``grad = sum / (m q n_pub) + model
    term``: one step at rate ``m q`` (a record may be drawn more than once) with noise std
    ``sqrt(m) sigma C`` on the sum. The model's randomness comes from ``stream(seed,
    MODEL_STAGE, cluster, step)``.
    """
    from sparkpriv.privacy.random import stream

    bs = _base_steps(step, base_steps)
    mrng = stream(seed, MODEL_STAGE, cluster, step)
    total, rows = None, 0
    for u in bs:
        Xb = _batch(X, sampling_rate, seed, cluster, u)
        s, _ = model.clipped_sum(Xb, theta, clip, mrng)
        if noise is not None:
            s = noisy_sum(s, noise, stream(seed, NOISE_STAGE, cluster, u))
        total = s if total is None else total + s
        rows += int(Xb.shape[0])
    if noise is None:
        g = total / max(rows, 1)
    else:
        g = total / (len(bs) * sampling_rate * float(n_pub))
    t, state = model.model_term(theta, state, mrng, clip)
    return g + t, state, rows


def train(model, X: np.ndarray, theta: np.ndarray, *, clip: float, sampling_rate: float, steps: int,
          noise: _noise.GaussianNoise | None, n_pub: float, seed: int, cluster: int = 0,
          lr: float = 1e-3, state=None, init_rng: np.random.Generator | None = None, on_step=None,
          adaptive: QuantileClip | None = None, info: dict | None = None, schedule: str = "constant",
          average: float = 0.0, batches: int = 1):
    """``steps`` DP-SGD base steps with Adam (post-processing); returns the final ``theta``, or
    with ``average`` the mean of the last iterates.

    ``batches`` (``m``, a cluster's own sampling rate ``m q``; docs/research/dpgm.md, "Per-cluster
    sampling rates"): each update makes ``m`` base steps at once (:func:`dp_step`'s
    ``base_steps``): ``ceil(steps / m)`` updates, update ``t`` over base steps ``(t - 1) m + 1
    .. min(t m, steps)``. The released noisy sums are those of the ``steps`` base steps of rate
    ``q``, whatever ``m``: the privacy event does not depend on it. ``m = 1``: one base step per
    update (the same draws as before ``m`` existed).

    ``schedule``: the learning rate of update ``t`` of ``T`` is ``lr`` (``constant``), ``lr (1 - (t - 1) /
    T)`` (``linear``) or ``lr (1 + cos(pi (t - 1) / T)) / 2`` (``cosine``). ``average`` in [0, 1):
    return the mean of the iterates of the last ``ceil(average T)`` updates instead of the last one
    (Polyak-Ruppert tail averaging). Both are functions of public step counts and of the released
    gradients: post-processing.

    A ``model`` with ``lr_scales()`` (the RBM with length strata) scales each parameter's rate by
    it (a choice of the optimiser on released gradients: post-processing).

    ``on_step(u, steps)`` is called after each update, ``u`` the base steps made so far
    (progress; public counts only).
    ``adaptive``: quantile clipping (:func:`dp_step_quantile`) starting at ``C_0 = clip``
    (``noise`` is then not used; the clip moves only where :func:`clip_adapts` for the update's
    ``m`` batches, else every update runs at ``C_0``); ``info`` (a dict), when given, receives
    ``"clips"``, the clips ``C_1 .. C_T`` of the updates, and ``"clip"``, the clip after the last
    one: both are post-processing of the released counts.

    ``X`` is one cluster's rows (a Spark task's partition); everything random
    is keyed by ``(seed, stage, cluster, step)``, so a retried task reproduces
    the same model. ``state`` (RBM chains) starts data-independently.
    """
    from sparkpriv.privacy.random import stream

    check_param("batches", batches, [Interval("integer", 1, None, "left")], "train")
    if state is None:
        state = model.init_state(init_rng if init_rng is not None else stream(seed, MODEL_STAGE, cluster, 0),
                                 theta)
    opt = Adam(lr=lr)
    # a model may scale its parameters' rates (the RBM's strata offsets): a choice of the optimiser
    scales = model.lr_scales() if hasattr(model, "lr_scales") else None
    c, clips = float(clip), []
    base, m = int(steps), int(batches)
    adapts = adaptive is not None and clip_adapts(adaptive.count_noise.std, sampling_rate, n_pub, m)
    T = updates(base, m)
    tail = int(math.ceil(float(average) * T)) if average else 0
    avg = None
    for t in range(1, T + 1):
        opt.lr = lr * lr_factor(schedule, t, T)
        if scales is not None:
            opt.lr = opt.lr * scales
        bs = range((t - 1) * m + 1, min(t * m, base) + 1)
        if adaptive is None:
            g, state, _ = dp_step(model, X, theta, state, clip=clip, sampling_rate=sampling_rate, noise=noise,
                                  n_pub=n_pub, seed=seed, cluster=cluster, step=t, base_steps=bs)
        else:
            clips.append(c)
            g, state, _, cnt = dp_step_quantile(model, X, theta, state, clip=c, sampling_rate=sampling_rate,
                                                adaptive=adaptive, n_pub=n_pub, seed=seed, cluster=cluster,
                                                step=t, base_steps=bs)
            if adapts:
                c = update_clip(c, cnt, sampling_rate=len(bs) * sampling_rate, n_pub=n_pub,
                                quantile=adaptive.quantile, lr=adaptive.lr, clip0=clip)
        theta = opt.step(theta, g)
        if t > T - tail:
            avg = theta.copy() if avg is None else avg + (theta - avg) / (t - (T - tail))
        if on_step is not None:
            on_step(bs[-1], base)
    if info is not None:
        info["clips"] = np.asarray(clips if adaptive is not None else [float(clip)] * T)
        info["clip"] = c
    return theta if avg is None else avg


def updates(steps: int, batches: int) -> int:
    """The updates :func:`train` makes for ``steps`` base steps taken ``batches`` at a time."""
    return -(-int(steps) // int(batches))


SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(schedule: str, t: int, steps: int) -> float:
    """The learning rate's factor at step ``t`` of ``steps`` (1-based) under ``schedule``
    (:func:`train`): 1 at the first step, then constant, or falling linearly or along a half
    cosine towards 0 (``1 / steps`` and about ``(pi / steps)^2 / 4`` at the last step)."""
    x = (int(t) - 1) / max(int(steps), 1)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - x
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * x))
    raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")


# ----------------------------------------------------------------------------- quantile clipping


def gradient_noise(*, noise_multiplier: float, dim: int, max_rows: int) -> _noise.GaussianNoise:
    """The discrete Gaussian noise of quantile clipping, applied to the clipped sum divided by the
    public clip, ``sum / C_t`` (a record moves it by at most 1, a replacement by 2): std at least
    ``noise_multiplier``, event normalised to sensitivity 1 (multiplier at least
    ``noise_multiplier``: a one-sided change costs at most ``1/sigma`` in mu and a replacement
    ``2/sigma``; docs/math.md section 5.1); the grid holds ``max_rows``. One noise (one sampler
    table) serves every step: the release is ``C_t g (rint(sum / (C_t g)) + N)``."""
    caller = "gradient_noise"
    check_param("max_rows", max_rows, [Interval("integer", 1, None, "left")], caller)
    return _noise.gaussian_noise_from_multiplier(sensitivity=1.0, noise_multiplier=float(noise_multiplier),
                                                 dim=int(dim), max_abs=float(max_rows))


def count_noise(*, count_std: float, max_rows: int) -> _noise.GaussianNoise:
    """The discrete Gaussian noise on a step's clipped count (sensitivity 1, one coordinate):
    std at least ``count_std``, event multiplier at least ``count_std``; the grid holds ``max_rows``."""
    caller = "count_noise"
    check_param("count_std", count_std, [_POS], caller)
    check_param("max_rows", max_rows, [Interval("integer", 1, None, "left")], caller)
    return _noise.gaussian_noise_from_multiplier(sensitivity=1.0, noise_multiplier=float(count_std), dim=1,
                                                 max_abs=float(max_rows))


def clipped_sum_and_count(model, Xb: np.ndarray, theta: np.ndarray, clip: float, rng=None):
    """``(clipped sum, count)`` of a batch: the count is the number of records whose gradient norm
    is at most ``clip`` (exactly those :func:`clip_factors` leaves unscaled)."""
    s, sq = model.clipped_sum(Xb, theta, clip, rng)
    norms = np.sqrt(np.maximum(np.asarray(sq, dtype=np.float64), 0.0))
    return s, int(np.count_nonzero(norms <= clip))


def update_clip(clip: float, noisy_count: float, *, sampling_rate: float, n_pub: float, quantile: float,
                lr: float, clip0: float) -> float:
    """Andrew et al.'s geometric update: ``C exp(-lr (b - quantile))``, ``b = noisy_count / (q n_pub)``
    (not clamped to ``[0, 1]``: a clamp biases ``E b`` when the count's noise is large, and a
    high quantile then drifts to the cap); the result clamped to ``[clip0 / CLIP_RANGE, clip0
    CLIP_RANGE]``. Post-processing of a released count (public). :func:`train` applies it only
    where :func:`clip_adapts`."""
    b = float(noisy_count) / (float(sampling_rate) * float(n_pub))
    c = float(clip) * math.exp(-float(lr) * (b - float(quantile)))
    return min(max(c, float(clip0) / CLIP_RANGE), float(clip0) * CLIP_RANGE)


def clip_adapts(count_std: float, sampling_rate: float, n_pub: float, batches: int = 1) -> bool:
    """Whether quantile clipping moves a data set's clip: the fraction estimate's noise
    ``sigma_b / (sqrt(m) q n_pub)`` is at most :data:`MAX_FRACTION_NOISE` (public facts only;
    ``m`` = ``batches``, the steps an update makes at once: :func:`train`). A cluster with a
    small expected batch keeps ``C_0``: its count would be mostly noise (a 53-row cluster at ``q =
    0.05`` and ``sigma_b = 13``: fraction noise 3.7, its clip walked to the cap)."""
    m = int(batches)
    return float(count_std) / (math.sqrt(m) * float(sampling_rate) * max(float(n_pub), 1e-300)) \
        <= MAX_FRACTION_NOISE


@dataclass(frozen=True)
class QuantileClip:
    """Public settings of quantile clipping: the target ``quantile`` (gamma), the update's ``lr``
    (eta), the noise of ``sum / C_t`` (:func:`gradient_noise`: std ``sigma``, so ``sigma C_t`` on
    the sum) and the count's (:func:`count_noise`)."""

    quantile: float
    lr: float
    gradient_noise: _noise.GaussianNoise
    count_noise: _noise.GaussianNoise


def dp_step_quantile(model, X, theta: np.ndarray, state, *, clip: float, sampling_rate: float,
                     adaptive: QuantileClip, n_pub: float, seed: int, cluster: int, step: int, base_steps=None):
    """One quantile-clipping DP-SGD step at the public clip ``C_t = clip``:
    ``(grad, new_state, batch_size, noisy_count)``.

    The batch, the model's randomness and the gradient noise's stream are those of
    :func:`dp_step`; ``adaptive.gradient_noise`` is added to ``sum / C_t`` and the result
    multiplied by ``C_t`` (public; post-processing of the noisy integers); the count of batch
    records with norm at most ``C_t`` gets ``adaptive.count_noise`` from
    ``stream(seed, COUNT_STAGE, cluster, step)``. ``noisy_count`` is released (the next clip
    is :func:`update_clip` of it). ``base_steps``: as in :func:`dp_step`, each base step ``u``
    with its own batch, gradient noise and count noise (streams of ``u``); the noisy sums and
    the noisy counts are added.
    """
    from sparkpriv.privacy.random import stream

    bs = _base_steps(step, base_steps)
    mrng = stream(seed, MODEL_STAGE, cluster, step)
    c = float(clip)
    total, noisy_count, rows = None, 0.0, 0
    for u in bs:
        Xb = _batch(X, sampling_rate, seed, cluster, u)
        s, cnt = clipped_sum_and_count(model, Xb, theta, clip, mrng)
        s = c * noisy_sum(np.asarray(s, dtype=np.float64).ravel() / c, adaptive.gradient_noise,
                          stream(seed, NOISE_STAGE, cluster, u))
        total = s if total is None else total + s
        noisy_count += float(_noise.add_noise(np.array([float(cnt)]), adaptive.count_noise,
                                              stream(seed, COUNT_STAGE, cluster, u))[0])
        rows += int(Xb.shape[0])
    g = total / (len(bs) * sampling_rate * float(n_pub))
    t, state = model.model_term(theta, state, mrng, clip)
    return g + t, state, rows, noisy_count
