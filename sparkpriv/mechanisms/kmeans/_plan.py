"""DP k-means' noise on the per-cluster statistics and its plan, made from public parameters before
any data is read (docs/math.md section 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dp_accounting import dp_event

from sparkpriv._validation import Interval, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy import noise as _noise
from sparkpriv.privacy.accounting import compose, epsilon_of, fit_to_epsilon
from sparkpriv.privacy.calibration import gdp_mu_for, split_mu
from sparkpriv.mechanisms.kmeans._features import FeatureMap, MAX_ROWS, _POS, input_norm_bound


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
