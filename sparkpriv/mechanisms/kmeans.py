"""DP k-means with noisy per-cluster sums (Acs et al., Alg. 2; docs/math.md section 4).

Two variants share one Lloyd loop:

* ``linear`` (DPLloyd / SuLQ, the baseline diffprivlib also implements): the
  features are the clipped input rows, ``||x||_2 <= C``;
* ``kernel``: random Fourier features of the RBF kernel
  ``exp(-||x - y||^2 / (2 s^2))``: ``W`` (D, d) with ``W_ij ~ N(0, 1/s^2)`` and
  the *paired* features ``z(x) = [cos(W x), sin(W x)] / sqrt(D)``, so that
  ``||z(x)||_2^2 = (1/D) sum_i (cos^2 + sin^2) = 1`` exactly: ``C = 1`` is a
  deterministic bound (the paper's single-cosine features are not bounded by 1;
  docs/math.md). We use ``C = 1 + 1e-12`` to cover float rounding in cos/sin.

Each iteration (:func:`cluster_stats` per batch, :func:`noisy_update` on the
driver): assign rows to the nearest current centre; per cluster the count
``n_j`` and the sum ``S_j`` of features, as ONE float64 vector of length
``k (D' + 1)`` laid out as a ``(k, D' + 1)`` matrix ``[n_j, S_j]``; partial
vectors of batches and partitions are summed; the driver adds Gaussian noise
ONCE and sets ``centre_j = noisy S_j / max(noisy n_j, 1)``.

Privacy
-------
Neighbours: replace-one (``n`` is public). Public: ``k``, ``d``, the bounds,
``T``, the kernel width, ``W`` (drawn independently of the data and released),
the initial centres (data-independent), ``n``. Secret: the noise seed.

Sensitivity of one iteration (record ``x`` replaced by ``x'``, features of
norm at most ``C``): if they fall in different clusters, the counts change by
``sqrt(2)`` (two entries by 1) and the sums by ``sqrt(||z||^2 + ||z'||^2) <=
sqrt(2) C``; in the same cluster the counts do not change and the sums change
by ``||z - z'|| <= 2 C``. With noise ``s_n`` on counts and ``s_S`` on sums the
iteration is a Gaussian mechanism on ``(n / s_n, S / s_S)`` with unit noise,
i.e. mu-GDP with

    mu^2 = max(2 / s_n^2 + 2 C^2 / s_S^2, 4 C^2 / s_S^2)
        <= 2 / s_n^2 + 4 C^2 / s_S^2            (docs/math.md's bound).

**Noise split between counts and sums.** We take ``s_n = s_S / C``: then both
cases give ``mu^2 = 4 C^2 / s_S^2`` -- the counts cost nothing beyond what the
same-cluster case of the sums already costs. Concretely the driver noises the
single vector ``v = (C n_j, S_j)_j`` with i.i.d. ``N(0, s_S^2)`` per entry;
its L2 sensitivity is ``2 C`` in both cases (``sqrt(2 C^2 + 2 C^2)`` and
``2 C``), so one call of :func:`sparkpriv.privacy.noise.add_noise` with
sensitivity ``2 C`` and noise multiplier ``1 / mu_iter`` releases the whole
iteration; noisy counts are ``v_n / C`` (std ``s_S / C``).

**Budget split.** ``mu_total = gdp_mu_for(epsilon, delta)`` (analytic
Gaussian, exact). Gaussian-DP composes exactly, also adaptively:
``mu_total^2 = T mu_iter^2 + mu_final^2``. ``kernel``: the last step releases
input-space centres as noisy per-cluster means of the clipped inputs
(sensitivity ``2 C_x``, ``C_x`` the input norm bound), with share
``final_share`` (default 0.1) of ``mu_total^2``; the T iterations share the
rest equally. ``linear``: the features ARE the clipped inputs, so the centres
of iteration T are the input-space release; no extra step (all of
``mu_total^2`` goes to the iterations). Splits round down
(:func:`~sparkpriv.privacy.calibration.split_mu`). Each noise addition is a
discrete Gaussian on a power-of-two grid and is recorded as a
``GaussianDpEvent`` whose multiplier is at least ``1 / mu`` (the grid rounding
is in its sensitivity, and the noise samplers' slack, docs/noise.md, in its
``mu``); the release's event is ``Composed[SelfComposed(iteration, T), final]``.
``mu_total`` is then lowered, if need be, until dp_accounting's epsilon of that
event is at most the requested epsilon (``fit_to_epsilon``: its PLD can state a
little more than the analytic value, e.g. 1.000000015 for epsilon 1).

**Grid.** :func:`~sparkpriv.privacy.noise.gaussian_noise_from_multiplier`
picks a grid about ``2^-56`` of sigma, which only admits values up to about
``64 sigma``; counts and sums reach ``n C``. The grid here is chosen from the
public cap ``MAX_ROWS C`` instead (data-independent, so the event is known
before any data is read), and ``n <= MAX_ROWS`` is checked.

Initial centres are data-independent: ``k`` uniform points of the declared
domain (box, else L2 ball), clipped and mapped through the feature map, or a
public sample given by the user. Assignments are never released.

**Post-processing** (free under DP: a function of the noisy outputs and public
bounds only; docs/kmeans.md, "Post-processing"). A cluster with (almost) no
rows has a centre ``noise / max(noisy n, 1)``: pure noise, far outside the
domain (norms of 10^3 to 3 x 10^4 were seen for MNIST rows in ``[0, 1]^784``).
So, after every noise addition:

* each centre is projected onto the declared domain: input-space centres (and
  the ``linear`` iteration centres) through the same clip as the rows (box
  clip, then scaling onto the row-bound ball), since a mean of clipped rows
  lies in their convex hull; ``kernel`` feature centres are scaled onto the
  unit ball (a mean of unit vectors). The next iteration uses the projected
  centres;
* released sizes are clamped at 0;
* a cluster is **unreliable** when a noisy size its released centres depend
  on is below ``reliability_stds`` (default 3) standard deviations of that
  size's noise: for ``linear`` the last iteration's size, for ``kernel`` the
  last iteration's (the feature centre ``predict`` uses) or the final step's
  (the input-space centre). The model and the receipt list them, and
  :meth:`~sparkpriv.mechanisms.kmeans_model.KMeansModel.predict` does not
  assign points to them unless asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from dp_accounting import dp_event

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.mechanisms import protocol as _p
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of, fit_to_epsilon
from sparkpriv.privacy.bounds import Bounds, ClipCounts, clip_rows
from sparkpriv.privacy.calibration import gdp_mu_for, split_mu
from sparkpriv.privacy.random import new_secret_seed, stream

__all__ = [
    "VARIANTS",
    "MAX_ROWS",
    "FeatureMap",
    "KMeansPlan",
    "KMeansParams",
    "KMeans",
    "draw_frequencies",
    "rff_features",
    "input_norm_bound",
    "max_clusters",
    "make_feature_map",
    "plan_kmeans",
    "calibrate_stats_noise",
    "assign_nearest",
    "cluster_stats",
    "noisy_update",
    "project_to_ball",
    "reliability_flags",
    "DEFAULT_RELIABILITY_STDS",
    "initial_centres",
    "clustering_accuracy",
]

VARIANTS = ("linear", "kernel")
MAX_ROWS = 2**34  # public cap on n that fixes the noise grid (see module docstring)
ITER_STAGE = 11  # public label of the driver noise stream of iteration t: (seed, ITER_STAGE, t)
FINAL_STAGE = 12
C_ROUNDING = 1.0 + 1e-12  # RFF norm bound covering float rounding of cos^2 + sin^2
DEFAULT_RELIABILITY_STDS = 3.0  # a cluster whose noisy size is below 3 noise stds is "unreliable"
_POS = Interval("real", 0, None, "neither")


# ----------------------------------------------------------------------------- feature maps


def draw_frequencies(d: int, frequencies: int, kernel_width: float, seed: int) -> np.ndarray:
    """``W`` (frequencies, d) with i.i.d. ``N(0, 1/kernel_width^2)`` entries (public)."""
    return stream(seed, 0).standard_normal((frequencies, d)) / float(kernel_width)


def rff_features(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Paired random Fourier features ``[cos(X W^T), sin(X W^T)] / sqrt(D)``, shape (n, 2D).

    Every row has L2 norm 1 (up to float rounding).
    """
    return _rff_of_projection(X @ W.T)


def _rff_of_projection(P: np.ndarray) -> np.ndarray:
    """``[cos(P), sin(P)] / sqrt(D)`` for the projections ``P = X W^T`` (n, D)."""
    D = P.shape[1]
    Z = np.empty((P.shape[0], 2 * D), dtype=np.float64)
    np.cos(P, out=Z[:, :D])
    np.sin(P, out=Z[:, D:])
    Z *= 1.0 / math.sqrt(D)
    return Z


def input_norm_bound(bounds: Bounds) -> float:
    """L2 bound ``C_x`` on a clipped row: min(row_bound, the box's largest norm).

    An L1 row bound also bounds the L2 norm. After the box clip and the norm
    clip (which only shrinks a row) both bounds hold.
    """
    c = math.inf
    if bounds.row_bound is not None:
        c = float(bounds.row_bound)
    if bounds.has_box:
        far = np.maximum(np.abs(np.asarray(bounds.lower, float)), np.abs(np.asarray(bounds.upper, float)))
        c = min(c, float(np.sqrt(np.sum(far * far))) * (1.0 + 1e-12))
    return c


@dataclass(frozen=True)
class FeatureMap:
    """The public map from an input row to its Lloyd feature vector."""

    variant: str
    bounds: Bounds
    W: np.ndarray | None = None  # (D, d), kernel only
    kernel_width: float | None = None

    @property
    def d(self) -> int:
        return self.bounds.dim

    @property
    def dim(self) -> int:
        """Feature dimension ``D'`` (d for linear, 2D for kernel)."""
        return self.d if self.W is None else 2 * self.W.shape[0]

    @property
    def feature_bound(self) -> float:
        """``C``: the L2 bound on one feature vector."""
        return input_norm_bound(self.bounds) if self.variant == "linear" else C_ROUNDING

    def clip(self, X: np.ndarray) -> tuple[np.ndarray, ClipCounts]:
        return clip_rows(X, self.bounds)

    def from_clipped(self, Xc: np.ndarray) -> np.ndarray:
        return Xc if self.W is None else rff_features(Xc, self.W)

    def project(self, centres: np.ndarray) -> np.ndarray:
        """Feature-space centres (k, D') projected onto the feature domain (post-processing).

        ``linear``: the rows' own clip (box, then row-bound ball), so a centre
        lies where a clipped row can; ``kernel``: scaled onto the ball of
        radius 1 that holds every mean of unit feature vectors.
        """
        if self.W is None:
            return self.clip(centres)[0]
        return project_to_ball(centres, 1.0)

    def features(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, ClipCounts]:
        """``(Z, Xc, counts)``: features, clipped inputs and clipping counts of ``X`` (n, d)."""
        Xc, counts = self.clip(X)
        return self.from_clipped(Xc), Xc, counts

    def features_sparse(self, offsets, indices, values) -> np.ndarray:
        """Kernel features of sparse records (CSR parts; ``values`` None = binary), never
        densified: ``X W^T`` is the (weighted) sum of the columns of ``W`` at each
        record's items. The records must already satisfy the bounds (capped records do)."""
        from sparkpriv.mechanisms.sparse import project_sparse_rows

        if self.W is None:
            raise ParameterError("Sparse records have kernel features only (variant='kernel').")
        return _rff_of_projection(project_sparse_rows(offsets, indices, values, self.W.T))


def _kernel_width_required(caller: str) -> ParameterError:
    return ParameterError(
        f"The 'kernel_width' parameter of {caller} is required for variant='kernel': give the "
        "public RBF width s of exp(-||x-y||^2 / (2 s^2)) (--kernel-width), e.g. about the "
        "typical distance between two points of one cluster."
    )


def make_feature_map(variant: str, bounds: Bounds, *, kernel_width=None, frequencies: int = 128,
                     seed: int | None = None, caller: str = "release_kmeans") -> FeatureMap:
    check_param("variant", variant, [Options(VARIANTS)], caller)
    if variant == "linear":
        return FeatureMap("linear", bounds)
    if kernel_width is None:
        raise _kernel_width_required(caller)
    check_param("kernel_width", kernel_width, [_POS], caller)
    check_param("frequencies", frequencies, [Interval("integer", 1, 100_000, "both")], caller)
    seed = new_secret_seed("kmeans-frequencies") if seed is None else seed
    W = draw_frequencies(bounds.dim, frequencies, kernel_width, seed)
    return FeatureMap("kernel", bounds, W, float(kernel_width))


# ----------------------------------------------------------------------------- calibration


def max_clusters(n: int) -> int:
    """The largest ``k`` allowed for ``n`` rows: ``floor(sqrt(n))``.

    With fewer than about ``sqrt(n)`` rows per cluster on average, the noisy
    sums swamp the centres at any useful epsilon (``n`` is public under
    replace-one, so the rule may depend on it).
    """
    return max(int(math.isqrt(max(int(n), 0))), 0)


def calibrate_stats_noise(*, sensitivity: float, mu: float, dim: int) -> _noise.GaussianNoise:
    """Discrete Gaussian noise of multiplier ``>= 1/mu`` for a vector of ``dim`` stats.

    Same construction as :func:`~sparkpriv.privacy.noise.gaussian_noise_from_multiplier`
    (grid sensitivity ``sensitivity/g + sqrt(dim)``, sigma rounded up so that the
    recorded event, with the samplers' slack, has multiplier ``>= 1/mu``) but on
    the grid ``g = 2^ceil(log2(MAX_ROWS * sensitivity / 2^62))``, which admits
    values up to ``MAX_ROWS * sensitivity / 2`` (>= ``n C``). It depends only on
    public quantities.
    """
    caller = "calibrate_stats_noise"
    check_param("sensitivity", sensitivity, [_POS], caller)
    check_param("mu", mu, [_POS], caller)
    m = 1.0 / float(mu)
    g = max(_noise.gaussian_grid(m * sensitivity),
            _noise._pow2_ceil(math.ldexp(float(MAX_ROWS) * float(sensitivity), -62)))
    gs = _noise._round_up(Fraction(float(sensitivity)) / Fraction(g) + _noise._sqrt_up(int(dim)))
    sigma = _noise._sigma_for_multiplier(m, gs, int(dim), caller)  # the samplers' slack included
    _noise._check_sigma(sigma, caller)
    return _noise.GaussianNoise(g, sigma, float(sensitivity), gs, math.nan, math.nan, int(dim))


@dataclass(frozen=True)
class KMeansPlan:
    """Everything public about a calibrated k-means release (no secrets)."""

    variant: str
    k: int
    d: int
    dim: int
    iterations: int
    epsilon: float
    delta: float
    final_share: float
    mu_total: float
    mu_iter: float
    mu_final: float | None
    feature_bound: float
    input_bound: float
    iter_noise: _noise.GaussianNoise
    final_noise: _noise.GaussianNoise | None

    def iteration_event(self) -> dp_event.DpEvent:
        return self.iter_noise.dp_event()

    def dp_event(self) -> dp_event.DpEvent:
        """``Composed[SelfComposed(iteration, T), final]`` (final only for ``kernel``)."""
        events = [dp_event.SelfComposedDpEvent(self.iteration_event(), self.iterations)]
        if self.final_noise is not None:
            events.append(self.final_noise.dp_event())
        return compose(events)

    def epsilon_spent(self) -> float:
        return epsilon_of(self.dp_event(), self.delta)

    def epsilon_after(self, t: int) -> float:
        """The epsilon (at the release's delta) of the first ``t`` iterations alone: what a
        release stopped there would have spent (progress reports; the whole is reserved)."""
        return epsilon_of(dp_event.SelfComposedDpEvent(self.iteration_event(), int(t)), self.delta)

    @property
    def count_std(self) -> float:
        """Std of one noisy count in an iteration (``s_S / C``)."""
        return self.iter_noise.std / self.feature_bound

    def to_public_dict(self) -> dict:
        d = {
            "variant": self.variant, "k": self.k, "d": self.d, "feature_dim": self.dim,
            "iterations": self.iterations, "neighbors": "replace-one",
            "protects": "one record (person) replaced by another; n is public",
            "gdp": {"mu_total": self.mu_total, "mu_per_iteration": self.mu_iter,
                    "mu_final": self.mu_final, "final_share": self.final_share},
            "sensitivity": {
                "feature_bound_C": self.feature_bound, "input_bound_C_x": self.input_bound,
                "iteration": "vector (C n_j, S_j): L2 2C (same cluster: sums 2C; different: "
                             "counts sqrt(2) -> sqrt(2) C after scaling, sums sqrt(2) C)",
            },
            "iteration_noise": self.iter_noise.to_public_dict(),
            "iteration_sum_std": self.iter_noise.std,
            "iteration_count_std": self.count_std,
        }
        if self.final_noise is not None:
            d["final_noise"] = self.final_noise.to_public_dict()
            d["final_sum_std"] = self.final_noise.std
            d["final_count_std"] = self.final_noise.std / self.input_bound
        return d


def plan_kmeans(
    fmap: FeatureMap,
    *,
    k: int,
    epsilon: float,
    delta: float,
    iterations: int,
    final_share: float | None = None,
    caller: str = "release_kmeans",
) -> KMeansPlan:
    """Validate the privacy parameters and calibrate every noise addition (no data)."""
    check_param("k", k, [Interval("integer", 2, None, "left")], caller)
    check_param("iterations", iterations, [Interval("integer", 1, 10_000, "both")], caller)
    check_param("epsilon", epsilon, [_POS], caller)
    check_param("delta", delta, [Interval("real", 0, 1, "neither")], caller)
    if fmap.variant == "linear":
        if final_share not in (None, 0, 0.0):
            raise ParameterError(
                f"The 'final_share' parameter of {caller} must be None for variant='linear': its "
                "features are the inputs, so the last iteration's centres are the release. "
                f"Got {final_share!r} instead."
            )
        final_share = 0.0
    else:
        final_share = 0.1 if final_share is None else final_share
        check_param("final_share", final_share, [Interval("real", 0, 1, "neither")], caller)
    bounds = fmap.bounds
    bounds.require_any(caller)
    cx = input_norm_bound(bounds)
    if not math.isfinite(cx):
        raise ParameterError(
            f"{caller} needs an L2 bound on the rows: give row_bound (--row-bound) or per-column "
            "lower/upper bounds (the final centres are noisy means of clipped inputs)."
        )
    T = int(iterations)
    C = fmap.feature_bound
    dim = fmap.dim

    def plan(mu_total: float) -> KMeansPlan:
        if final_share > 0:
            mu_iter, mu_final = split_mu(mu_total, [(1.0 - final_share) / T, final_share])
        else:
            mu_iter, mu_final = split_mu(mu_total, [1.0 / T])[0], None
        iter_noise = calibrate_stats_noise(sensitivity=2.0 * C, mu=mu_iter, dim=k * (dim + 1))
        final_noise = None
        if mu_final is not None:
            final_noise = calibrate_stats_noise(sensitivity=2.0 * cx, mu=mu_final, dim=k * (fmap.d + 1))
        return KMeansPlan(fmap.variant, int(k), fmap.d, dim, T, float(epsilon), float(delta),
                          float(final_share), float(mu_total), float(mu_iter),
                          None if mu_final is None else float(mu_final), float(C), float(cx),
                          iter_noise, final_noise)

    # the accountant's epsilon of the recorded events (grid rounding and the samplers'
    # slack included) must not exceed the request: lower mu_total until it does not
    mu_total = gdp_mu_for(epsilon, delta)
    r = fit_to_epsilon(lambda r: plan(r * mu_total).dp_event(), epsilon=float(epsilon), delta=float(delta),
                       caller=caller)
    return plan(r * mu_total)


# ----------------------------------------------------------------------------- Lloyd step


def assign_nearest(Z: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Index of the nearest centre (squared L2) for each row of ``Z`` (n, D'); ties -> lowest."""
    if Z.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    cn = np.einsum("ij,ij->i", centres, centres)
    dist = cn[None, :] - 2.0 * (Z @ centres.T)
    return np.argmin(dist, axis=1)


def cluster_stats(Z: np.ndarray, centres: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
    """Per-cluster counts and sums of one batch as ONE float64 vector of length ``k (p + 1)``.

    Rows of ``Z`` (n, D') are assigned to the nearest of ``centres`` (k, D');
    the sums are of ``values`` (n, p) (default ``Z``). Layout: the
    ``(k, p + 1)`` matrix ``[n_j, S_j]`` flattened row-major. The vectors of
    batches add up to the vector of their union.
    """
    k = centres.shape[0]
    V = Z if values is None else values
    p = V.shape[1]
    out = np.zeros((k, p + 1), dtype=np.float64)
    if Z.shape[0] == 0:
        return out.ravel()
    lab = assign_nearest(Z, centres)
    out[:, 0] = np.bincount(lab, minlength=k)
    onehot = np.zeros((k, Z.shape[0]), dtype=np.float64)
    onehot[lab, np.arange(Z.shape[0])] = 1.0
    out[:, 1:] = onehot @ V
    return out.ravel()


def cluster_input_sums_sparse(labels: np.ndarray, offsets, indices, values, k: int, d: int) -> np.ndarray:
    """Per-cluster counts and sums of sparse input records, in the layout of
    :func:`cluster_stats` with ``values`` = the dense records: ``k (d + 1)`` floats."""
    offsets = np.asarray(offsets, np.int64)
    labels = np.asarray(labels, np.int64)
    out = np.zeros((k, d + 1), dtype=np.float64)
    out[:, 0] = np.bincount(labels, minlength=k)
    owner = np.repeat(labels, np.diff(offsets))  # the cluster of each stored item
    w = None if values is None else np.asarray(values, np.float64)
    out[:, 1:] = np.bincount(owner * d + np.asarray(indices, np.int64), weights=w,
                             minlength=k * d).reshape(k, d)
    return out.ravel()


def noisy_update(stats: np.ndarray, noise: _noise.GaussianNoise, bound: float, k: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Driver step: noise ``(bound * n_j, S_j)`` ONCE, return ``(centres, noisy counts)``.

    ``centres_j = noisy S_j / max(noisy n_j, 1)``.
    """
    M = np.asarray(stats, dtype=np.float64).reshape(k, -1).copy()
    M[:, 0] *= bound
    noisy = _noise.add_noise(M, noise, rng)
    counts = noisy[:, 0] / bound
    centres = noisy[:, 1:] / np.maximum(counts, 1.0)[:, None]
    return centres, counts


def project_to_ball(centres: np.ndarray, radius: float) -> np.ndarray:
    """Rows of ``centres`` whose L2 norm exceeds ``radius`` scaled onto the ball (a copy)."""
    P = np.array(centres, dtype=np.float64, copy=True)
    norms = np.linalg.norm(P, axis=1)
    over = norms > radius
    P[over] *= (radius / norms[over])[:, None]
    return P


def reliability_flags(counts: np.ndarray, count_std: float, reliability_stds: float) -> np.ndarray:
    """``True`` where a noisy size is below ``reliability_stds`` standard deviations of its noise.

    Such a cluster may be empty: its centre is (mostly) noise. A function of
    the noisy sizes and the public noise scale only (post-processing).
    """
    return np.asarray(counts, dtype=np.float64) < float(reliability_stds) * float(count_std)


def initial_centres(fmap: FeatureMap, k: int, rng: np.random.Generator,
                    init: np.ndarray | None = None, caller: str = "release_kmeans") -> np.ndarray:
    """Data-independent initial centres in feature space, shape (k, D').

    ``init`` (k, d) is a PUBLIC sample (never rows of the private table);
    otherwise ``k`` uniform points of the declared box (or, without a box, of
    the L2 ball of radius ``row_bound``). Either is clipped and mapped
    through the feature map.
    """
    d = fmap.d
    if init is not None:
        P = np.asarray(init, dtype=np.float64)
        if P.shape != (k, d) or not np.all(np.isfinite(P)):
            raise ParameterError(
                f"The 'init' parameter of {caller} must be a finite public sample of shape "
                f"(k, d) = ({k}, {d}). Got shape {P.shape} instead."
            )
    elif fmap.bounds.has_box:
        lo = np.asarray(fmap.bounds.lower, float)
        hi = np.asarray(fmap.bounds.upper, float)
        P = lo + (hi - lo) * rng.random((k, d))
    else:
        R = float(fmap.bounds.row_bound)
        g = rng.standard_normal((k, d))
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        P = g * (R * rng.random((k, 1)) ** (1.0 / d))
    Pc, _ = fmap.clip(P)
    return fmap.from_clipped(Pc)


# ----------------------------------------------------------------------------- driver loop


def check_k_for_n(k: int, n: int, caller: str) -> None:
    if n > MAX_ROWS:
        raise ParameterError(f"{caller} supports at most 2^34 rows (the noise grid's cap). Got {n}.")
    if k > max_clusters(n):
        raise ParameterError(
            f"The 'k' parameter of {caller} must be at most floor(sqrt(n)) = {max_clusters(n)} for "
            f"n = {n} rows (smaller clusters are swamped by the noise). Got {k} instead: use fewer "
            "clusters or more data."
        )


def check_reliability_stds(reliability_stds, caller: str) -> None:
    check_param("reliability_stds", reliability_stds, [Interval("real", 0, 1e6, "both")], caller)


def fit_from_stats(plan: KMeansPlan, fmap: FeatureMap, centres: np.ndarray, iteration_stats,
                   final_stats, seed: int, log=None,
                   reliability_stds: float = DEFAULT_RELIABILITY_STDS):
    """The driver loop shared by the numpy and the Spark paths.

    ``iteration_stats(centres)`` returns the exact ``k (D'+1)`` vector over the
    whole table; ``final_stats(centres)`` the ``k (d+1)`` vector of clipped
    inputs grouped by the nearest feature centre (``kernel`` only). Noise is
    added here, once per call, from the driver stream ``(seed, stage, t)``.
    Every noisy centre is projected onto its declared domain before it is used
    or released, sizes are clamped at 0 and unreliable clusters are flagged
    (post-processing, see the module docstring). ``history`` holds the raw
    noisy sizes of each iteration (owner diagnostics).
    """
    from sparkpriv.mechanisms.kmeans_model import KMeansModel

    k = plan.k
    history = []
    counts = None
    for t in range(1, plan.iterations + 1):
        stats = iteration_stats(centres)
        raw, counts = noisy_update(stats, plan.iter_noise, plan.feature_bound, k,
                                   stream(seed, ITER_STAGE, t))
        centres = fmap.project(raw)
        history.append(counts)
        if log is not None:
            log(t, counts)
    feature_centres, feature_counts = centres, counts
    iter_sum_std = plan.iter_noise.std
    iter_count_std = plan.count_std
    unreliable = reliability_flags(feature_counts, iter_count_std, reliability_stds)
    if plan.final_noise is not None:
        stats = final_stats(feature_centres)
        raw, counts = noisy_update(stats, plan.final_noise, plan.input_bound, k,
                                   stream(seed, FINAL_STAGE, 0))
        centres = fmap.clip(raw)[0]
        sum_std = plan.final_noise.std
        count_std = plan.final_noise.std / plan.input_bound
        unreliable |= reliability_flags(counts, count_std, reliability_stds)
    else:
        sum_std, count_std = iter_sum_std, iter_count_std
    kernel = plan.variant == "kernel"
    model = KMeansModel(
        variant=plan.variant, centers=centres, counts=np.maximum(counts, 0.0),
        bounds=fmap.bounds.to_public_dict(), W=fmap.W, kernel_width=fmap.kernel_width,
        feature_centers=feature_centres if kernel else None,
        feature_counts=np.maximum(feature_counts, 0.0) if kernel else None,
        unreliable=tuple(int(j) for j in np.flatnonzero(unreliable)),
        reliability_stds=float(reliability_stds),
        count_std=float(count_std), sum_std=float(sum_std),
        feature_count_std=float(iter_count_std) if kernel else None,
        feature_sum_std=float(iter_sum_std) if kernel else None,
    )
    return model, history


def _tuple(x):
    if x is None:
        return None
    return tuple(float(v) for v in np.atleast_1d(np.asarray(x, dtype=float)))


# ----------------------------------------------------------------------------- metric


def clustering_accuracy(labels_true, labels_pred) -> float:
    """ACC: the best one-to-one cluster-to-label matching (Hungarian), as a fraction.

    ``scipy.optimize.linear_sum_assignment`` on the negated contingency table.
    """
    from scipy.optimize import linear_sum_assignment

    t = np.asarray(labels_true)
    p = np.asarray(labels_pred)
    if t.shape != p.shape or t.size == 0:
        raise ParameterError("labels_true and labels_pred must be non-empty and of the same shape.")
    _, ti = np.unique(t, return_inverse=True)
    _, pi = np.unique(p, return_inverse=True)
    table = np.zeros((pi.max() + 1, ti.max() + 1), dtype=np.int64)
    np.add.at(table, (pi, ti), 1)
    r, c = linear_sum_assignment(-table)
    return float(table[r, c].sum()) / t.size


# ----------------------------------------------------------------------------- the mechanism (protocol)


@dataclass(frozen=True, kw_only=True)
class KMeansParams(_p.Params):
    """Public parameters of DP k-means (docs/kmeans.md; docs/math.md section 4)."""

    epsilon: float = _p.option(help="the total epsilon of the release", constraints=[_POS])
    delta: float = _p.option(help="the total delta of the release, in (0, 1) (Gaussian noise)",
                             constraints=[Interval("real", 0, 1, "neither")])
    k: int = _p.option(help="number of clusters (2 .. floor(sqrt(rows)))",
                       constraints=[Interval("integer", 2, None, "left")])
    columns: tuple = _p.option(None, help="numeric feature columns (one row per person); not with "
                               "event records", kind="strs")
    iterations: int = _p.option(10, help="Lloyd iterations", constraints=[Interval("integer", 1, 10_000, "both")])
    variant: str = _p.option("kernel", help="kernel (RBF random Fourier features) or linear (DPLloyd)",
                             constraints=[Options(VARIANTS)])
    row_bound: float | None = _p.option(None, help="declared bound on each row's L2 norm (rows are "
                                        "clipped to it)", constraints=[_POS])
    lower: tuple | None = _p.option(None, help="declared per-column lower bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    upper: tuple | None = _p.option(None, help="declared per-column upper bounds (one value for all "
                                    "columns, or one per column)", kind="floats")
    kernel_width: float | None = _p.option(None, help="RBF kernel width s, exp(-||x-y||^2/(2 s^2)) "
                                           "(kernel variant)", constraints=[_POS])
    frequencies: int = _p.option(128, help="random Fourier frequencies D (2D features; kernel variant)",
                                 constraints=[Interval("integer", 1, 100_000, "both")])
    final_share: float | None = _p.option(None, help="kernel: share of the budget (mu^2) for the "
                                          "input-space centres", doc_default="0.1",
                                          constraints=[Interval("real", 0, 1, "neither")])
    fill: float | None = _p.option(None, help="public value that replaces nulls in the feature columns",
                                   constraints=[Interval("real", None, None, "neither")])
    reliability_stds: float = _p.option(DEFAULT_RELIABILITY_STDS, help="clusters whose noisy size is "
                                        "below this many noise standard deviations are marked unreliable",
                                        constraints=[Interval("real", 0, 1e6, "both")])
    neighbors: str = _p.option("replace-one", help="neighbour relation: replace-one (n is public: the "
                               "rule k <= floor(sqrt(n)) uses it)", kind="neighbors")
    init: object = _p.option(None, help="a PUBLIC sample of k initial centres, array (k, d) (default: "
                             "uniform points of the declared domain)", kind="object")
    feature_seed: int | None = _p.option(None, help="seed of the public frequencies W (default: fresh "
                                         "entropy); not recorded", kind="object", recorded=False)

    def check(self, caller: str) -> None:
        if self.variant == "linear" and self.final_share not in (None, 0, 0.0):
            raise ParameterError(
                f"The 'final_share' parameter of {caller} must be None for variant='linear': its "
                "features are the inputs, so the last iteration's centres are the release. "
                f"Got {self.final_share!r} instead."
            )
        if self.variant == "kernel" and self.kernel_width is None:  # a public rule: before Spark starts
            raise _kernel_width_required(caller)


@dataclass
class _KMeansState:
    fmap: FeatureMap
    kplan: KMeansPlan
    centres0: np.ndarray


def _per_column(values, d: int, name: str, caller: str):
    if values is None:
        return None
    values = _tuple(values)
    if len(values) == 1:
        return values * d
    if len(values) != d:
        raise ParameterError(f"The {name!r} parameter of {caller} must have one value, or one per "
                             f"column ({d}). Got {len(values)}.")
    return values


class KMeans(_p.Mechanism):
    """DP k-means (kernel or linear) with noisy per-cluster sums; releases the clusters."""

    name = "kmeans"
    title = "DP k-means"
    summary = "DP k-means (kernel: random Fourier features; linear: DPLloyd); releases noisy centres"
    Params = KMeansParams
    neighbors = (_p.REPLACE_ONE,)
    refused_neighbors = {
        "add-remove": "its public parameters include n (k <= floor(sqrt(n)) and the noise grid's cap)",
        "element": "it protects whole records (people), not single attributes",
    }
    inputs = ("table", "records")

    def plan(self, params: KMeansParams, facts: _p.InputFacts, caller: str) -> _p.Plan:
        if facts.kind == "records":
            given = [n for n in ("columns", "lower", "upper", "row_bound", "fill")
                     if getattr(params, n) is not None]
            if given:
                raise ParameterError(
                    f"The {', '.join(repr(g) for g in given)} parameter(s) of {caller} do not apply to "
                    "bounded event records: the items are the vocabulary and the bounds come from "
                    "the item cap (max_items, weights). Remove them."
                )
            if params.variant != "kernel":
                raise ParameterError(
                    f"The 'variant' parameter of {caller} must be 'kernel' for bounded event records. "
                    f"Got {params.variant!r}: the linear variant's features are the d = {facts.d}-wide "
                    "records themselves, which the iterations would cache densely (d floats per "
                    "person); the kernel variant's features are computed from the sparse records."
                )
            c = facts.value_cap
            bounds = Bounds(facts.d, (0.0,) * facts.d, (c,) * facts.d, facts.l2_bound, "l2", None,
                            _caller=caller)
        else:
            d = facts.d
            bounds = Bounds(d, _per_column(params.lower, d, "lower", caller),
                            _per_column(params.upper, d, "upper", caller), params.row_bound, "l2", None,
                            _caller=caller)
        fmap = make_feature_map(params.variant, bounds, kernel_width=params.kernel_width,
                                frequencies=params.frequencies, seed=params.feature_seed, caller=caller)
        kplan = plan_kmeans(fmap, k=params.k, epsilon=params.epsilon, delta=params.delta,
                            iterations=params.iterations, final_share=params.final_share, caller=caller)
        centres0 = initial_centres(fmap, params.k, stream(new_secret_seed("kmeans-init"), 0), params.init,
                                   caller)
        event = kplan.dp_event()
        public = dict(kplan.to_public_dict(), bounds=bounds.to_public_dict(),
                      init="public sample" if params.init is not None else "domain",
                      reliability_stds=float(params.reliability_stds),
                      feature_map="W is public: drawn independently of the data and released")
        return _p.Plan(events=event, epsilon=kplan.epsilon_spent(), delta=kplan.delta, public=public,
                       neighbors=_p.REPLACE_ONE, state=_KMeansState(fmap, kplan, centres0),
                       secrets=new_secret_seed("kmeans-noise"))

    def run(self, engine, source, plan: _p.Plan, progress) -> _p.Outcome:
        import time

        from sparkpriv.errors import InputError
        from sparkpriv.mechanisms.kmeans_model import MODEL_FILE, POSTPROCESSING

        st: _KMeansState = plan.state
        fmap, kplan = st.fmap, st.kplan
        k, dim, d = kplan.k, kplan.dim, fmap.d
        counters = engine.counters(("rows", "rows_box_clipped", "rows_norm_clipped")) \
            if source.kind == "table" else None
        cache = engine.cache(source, _features_fn(fmap, counters), dim)
        try:
            n = cache.rows
            if n == 0:
                raise InputError("The input table is empty: there is nothing to release.")
            check_k_for_n(k, n, progress.caller)
            progress.log("kmeans: %s variant, k=%d, %d feature dims, %d iterations; features cached",
                         kplan.variant, k, dim, kplan.iterations)
            seconds: list[float] = []
            clock = [time.perf_counter()]

            def log(t, counts):
                now = time.perf_counter()
                seconds.append(now - clock[0])
                clock[0] = now
                spent = kplan.epsilon_after(t)  # after the clock: not part of the iteration's time
                progress.step("kmeans iteration", t, kplan.iterations,
                              f"{seconds[-1]:.2f} s, {int(np.sum(counts < 1))} cluster(s) with noisy count < 1, "
                              f"epsilon spent so far {spent:.4g} of {plan.epsilon:.4g}")
                clock[0] = time.perf_counter()

            model, history = fit_from_stats(
                kplan, fmap, st.centres0,
                lambda c: cache.aggregate(_stats_fn(c), k * (dim + 1)),
                lambda c: engine.aggregate(source, _input_stats_fn(fmap, c), k * (d + 1)),
                plan.secrets, log, reliability_stds=plan.public["reliability_stds"])
        finally:
            cache.release()
        if model.unreliable:
            progress.warn("kmeans: %d of %d cluster(s) unreliable (noisy size below %g noise stds): %s; "
                          "predict/assign leave them out", len(model.unreliable), k,
                          plan.public["reliability_stds"], list(model.unreliable))
        fc = model.feature_centers
        ok = model.reliable
        rows = [(j, float(model.counts[j]), bool(ok[j]), [float(v) for v in model.centers[j]],
                 None if fc is None else [float(v) for v in fc[j]]) for j in range(model.k)]
        table = engine.table(rows, [("cluster", "int", False), ("count", "double", False),
                                    ("reliable", "bool", False), ("center", "array<double>", False),
                                    ("feature_center", "array<double>", True)])
        diagnostics = {}
        if counters is not None:
            diagnostics = {"rows": counters[0].value, "rows_box_clipped": counters[1].value,
                           "rows_norm_clipped": counters[2].value}
        unc = model.uncertainty()
        uncertainty = {
            "count_std": unc["count_std"], "sum_std": float(model.sum_std),
            "center_std": unc["center_std"].tolist(),
            "intervals": "95%: value +- 1.96 std. Sizes: exact (Gaussian noise). Centre coordinates: "
                         "first order in the size noise, before the projection onto the domain; "
                         "meaningful for reliable clusters only",
        }
        return _p.Outcome(table=table, model=model,
                          public={"model": model.to_dict(), "unreliable_clusters": list(model.unreliable),
                                  "postprocessing": POSTPROCESSING, "uncertainty": uncertainty},
                          files={MODEL_FILE: model.to_json().encode()},
                          extras={"iteration_seconds": seconds, "history": history,
                                  "diagnostics": diagnostics})


def _features_fn(fmap: FeatureMap, counters):
    """Block -> feature matrix (dense rows are clipped, and counted for the owner)."""

    def features(block):
        if isinstance(block, _p.SparseRows):
            return fmap.features_sparse(block.offsets, block.indices, block.values)
        Z, _, counts = fmap.features(block)
        if counters is not None:
            counters[0].add(counts.rows)
            counters[1].add(counts.box_clipped)
            counters[2].add(counts.norm_clipped)
        return Z

    return features


def _stats_fn(centres):
    """Feature block -> per-cluster counts and sums (one Lloyd iteration's partial)."""
    centres = np.array(centres, dtype=np.float64, copy=True)

    def stats(Z):
        return cluster_stats(Z, centres)

    return stats


def _input_stats_fn(fmap: FeatureMap, centres):
    """Block -> counts and sums of the clipped INPUTS by nearest feature centre (final step)."""
    centres = np.array(centres, dtype=np.float64, copy=True)
    k = centres.shape[0]

    def stats(block):
        if isinstance(block, _p.SparseRows):
            lab = assign_nearest(fmap.features_sparse(block.offsets, block.indices, block.values), centres)
            return cluster_input_sums_sparse(lab, block.offsets, block.indices, block.values, k, block.d)
        Z, Xc, _ = fmap.features(block)
        return cluster_stats(Z, centres, Xc)

    return stats


KMEANS = _p.register(KMeans())
